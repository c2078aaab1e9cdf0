"""Hypothesis mutates valid plan files (stage bounds dropped or shifted,
devices, degrees, schedule, the inputs' layer, device and batch counts,
numbers set to NaN, inf, negative or huge) and
checks that each is either valid, and then simulates and exports, or refused
by every command with exit status 2 and one line on stderr, never a crash
(a mutation the file's digests name validates with status 2 and exports to
a one-line refusal, and still simulates)."""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipesearch.cli import main
from pipesearch.cli.validate_cmd import replay_problems
from pipesearch.plan import document_problems
from pipesearch.schema.digests import digest_problems
from pipesearch.types import SCHEDULES

CSV = ("# pipesearch profile v1\n# batch_size: 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
       + "".join(f"l{k},{1 + k % 3},{2 + k % 2},{1000 * (k + 1)},4096\n" for k in range(8)))

STAGE_NUMBERS = ("fwd_s", "compute_s", "comm_s", "allreduce_s", "memory_bytes", "send_bytes", "saved_bytes",
                 "bwd_input_s")
PREDICTED = ("iteration_time_s", "analytic_iteration_time_s", "samples_per_s", "bubble_fraction",
             "peak_memory_bytes", "memory_capacity_bytes")
BAD_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf, -1, -1e-9, 0, 1e300, 10**400, "1", None, True])


def invoke(args, cwd: Path):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(old)
    return result


@pytest.fixture(scope="module")
def base_docs(tmp_path_factory):
    """Valid plan files to mutate: pp 2 x dp 2 (gpipe) and pp 2 x vp 2
    (interleaved 1F1B) of an 8-layer model on 4 devices."""
    tmp = tmp_path_factory.mktemp("mutations")
    (tmp / "tiny.csv").write_text(CSV)
    docs = []
    for extra in (["--pp", "2", "--dp", "2", "--schedule", "gpipe"],
                  ["--pp", "2", "--schedule", "interleaved-1f1b", "--vp", "2", "--top", "2"]):
        out = tmp / f"p{len(docs)}.json"
        result = invoke(["plan", "--model", "tiny.csv", "--cluster", "1x4-v100-pcie", "-b", "8", *extra,
                         "-q", "-o", out], tmp)
        assert result.exit_code == 0, result.stderr
        docs.append(json.loads(out.read_text()))
    return docs


def shift_bound(plan, data):
    stages = plan["stages"]
    k = data.draw(st.integers(0, len(stages) - 1))
    side = data.draw(st.integers(0, 1))
    stages[k]["layers"][side] += data.draw(st.integers(-3, 3))


def move_boundary(plan, data):
    """Move one stage boundary and its layer names consistently (stays valid
    when both stages keep a layer)."""
    stages = plan["stages"]
    if len(stages) < 2:
        return
    k = data.draw(st.integers(0, len(stages) - 2))
    delta = data.draw(st.integers(-2, 2))
    names = stages[k]["layer_names"] + stages[k + 1]["layer_names"]
    cut = stages[k]["layers"][1] + delta
    first = stages[k]["layers"][0]
    stages[k]["layers"][1] = stages[k + 1]["layers"][0] = cut
    stages[k]["layer_names"], stages[k + 1]["layer_names"] = names[:max(cut - first, 0)], names[max(cut - first, 0):]


def drop_stage(plan, data):
    if plan["stages"]:
        del plan["stages"][data.draw(st.integers(0, len(plan["stages"]) - 1))]


def change_devices(plan, data):
    k = data.draw(st.integers(0, len(plan["stages"]) - 1))
    plan["stages"][k]["devices"] = data.draw(st.lists(st.integers(-1, 6), max_size=3))


def change_degree(plan, data):
    key = data.draw(st.sampled_from(["pp", "dp", "tp", "vp"]))
    plan["parallelism"][key] = data.draw(st.one_of(st.integers(-1, 5), BAD_NUMBERS))


def change_schedule(plan, data):
    key = data.draw(st.sampled_from(["name", "micro_batch_size", "num_micro_batches"]))
    if key == "name":
        plan["schedule"]["name"] = data.draw(st.sampled_from(list(SCHEDULES) + ["bogus"]))
    else:
        plan["schedule"][key] = data.draw(st.one_of(st.integers(-1, 20), BAD_NUMBERS))


def change_number(plan, data):
    if data.draw(st.booleans()):
        k = data.draw(st.integers(0, len(plan["stages"]) - 1))
        plan["stages"][k][data.draw(st.sampled_from(STAGE_NUMBERS))] = data.draw(
            st.one_of(BAD_NUMBERS, st.floats(0, 10)))
    else:
        plan["predicted"][data.draw(st.sampled_from(PREDICTED))] = data.draw(st.one_of(BAD_NUMBERS, st.floats(0, 1)))


def change_inputs(plan, data, doc):
    table, key = data.draw(st.sampled_from([("model", "num_layers"), ("cluster", "devices"),
                                             ("job", "global_batch_size")]))
    doc["inputs"][table][key] = data.draw(st.one_of(st.integers(-1, 20), BAD_NUMBERS))


MUTATIONS = [shift_bound, move_boundary, drop_stage, change_devices, change_degree, change_schedule, change_number,
             change_inputs]


def one_line_refusal(result) -> bool:
    lines = result.stderr.strip().splitlines()
    return (result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
            and "Traceback" not in result.output + result.stderr)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_plan_is_valid_and_runs_or_refused(base_docs, data):
    doc = copy.deepcopy(data.draw(st.sampled_from(base_docs)))
    index = data.draw(st.integers(0, len(doc["plans"]) - 1))
    plan = doc["plans"][index]
    for mutate in data.draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3)):
        if not plan["stages"]:
            break
        mutate(plan, data, doc) if mutate is change_inputs else mutate(plan, data)
    rank = plan.get("rank", 1) if isinstance(plan.get("rank"), int) and plan.get("rank", 0) >= 1 else 1
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = tmp / "m.json"
        path.write_text(json.dumps(doc))  # NaN and Infinity as Python's json module writes them
        written = json.loads(path.read_text())
        valid = not document_problems(written)
        # a valid file whose predicted times are not its replay, or whose split, devices or inputs were edited
        # after planning (its digests): validate says so, simulate still runs it
        replays = valid and not replay_problems(written) and not digest_problems(written)
        event("valid" if replays else "valid, edited or not its replay" if valid else "refused")
        checked = invoke(["validate", path], tmp)
        sim = invoke(["simulate", path, "--rank", rank], tmp)
        exp = invoke(["export", path, "--rank", rank, "--format", "gpipe"], tmp)
        if valid:
            assert checked.exit_code == (0 if replays else 2), checked.output
            assert sim.exit_code == 0, (sim.output, sim.stderr)
            assert exp.exit_code == 0 or one_line_refusal(exp), (exp.output, exp.stderr)
        else:
            assert checked.exit_code == 2, checked.output
            assert one_line_refusal(sim), (sim.exit_code, sim.output, sim.stderr)
            assert one_line_refusal(exp), (exp.exit_code, exp.output, exp.stderr)
        assert sorted(p.name for p in tmp.iterdir()) == ["m.json"]
