"""`pipesearch validate` (and every plan load) refuses plans whose own numbers
contradict each other: memory over the device, a peak that is no stage's, a
throughput that is not batch / time, ranks out of time order, layer names
that differ between plans, and (validate only) a predicted time that is not
the replay of the plan's stage terms."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main

CSV = "# pipesearch profile v1\n# batch_size: 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n" + "".join(
    f"l{k},{1 + k % 3},{2 + k % 2},{1_000_000 * (1 + k % 3)},409600\n" for k in range(8))


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v")
    (tmp / "t.csv").write_text(CSV)
    res = CliRunner().invoke(main, ["plan", "--model", str(tmp / "t.csv"), "--cluster", "1x4-v100-pcie", "-b", "8",
                                    "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["plans"]) == 3
    return out


def _validate(tmp_path, doc, edit, redigest: bool = False):
    """``validate`` of ``doc`` after ``edit``; ``redigest``: with its digests
    written for the edited values (a file pipesearch could have written with
    them: the record checks alone decide)."""
    d = copy.deepcopy(doc)
    edit(d)
    if redigest:
        from pipesearch.schema.digests import planned_digests

        d["digests"] = planned_digests(d)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    res = CliRunner().invoke(main, ["validate", str(path)])
    return res.exit_code, res.output


def test_the_search_writes_a_consistent_file(tmp_path, doc):
    code, out = _validate(tmp_path, doc, lambda d: None)
    assert code == 0 and "valid" in out


def _set_memory(stage, value):
    """Set a stage's memory, its breakdown's activations taking the difference."""
    parts = stage["memory_breakdown_bytes"]
    parts["activations"] += value - stage["memory_bytes"]
    stage["memory_bytes"] = value


def _usable(d):
    job, cap = d["inputs"]["job"], d["inputs"]["cluster"]["memory_bytes_per_device"]["v100-pcie-16gb"]
    return cap * (1 - job["memory_headroom_fraction"]) - job["memory_reserve_bytes"]


def _edit_point(d, time_s=None, rate=None):
    """Give the first listed point of status 'ok' another time (and the
    throughput that goes with it) or another throughput."""
    table = d["search"]["points"]
    cols, vals = table["columns"], table["values"]
    r = vals[cols.index("status")].index("ok")
    if time_s is not None:
        vals[cols.index("iteration_time_s")][r] = time_s
        vals[cols.index("samples_per_s")][r] = d["inputs"]["job"]["global_batch_size"] / time_s
    if rate is not None:
        vals[cols.index("samples_per_s")][r] = rate


@pytest.mark.parametrize("what,edit,words", [
    ("a listed point faster than plan 1 (validate passed a points table edited so)",
     lambda d: _edit_point(d, time_s=d["plans"][0]["predicted"]["iteration_time_s"] / 2),
     ["search.points.values", "faster than plan 1"]),
    ("a listed point's throughput that is not batch / time",
     lambda d: _edit_point(d, rate=1e9), ["search.points.values", "samples_per_s 1000000000.0", "global batch 8"]),
    ("memory above the usable 14.2 GiB of a 16 GiB V100",
     lambda d: _set_memory(d["plans"][0]["stages"][0], _usable(d) * 1.001),
     ["plans[0].stages[0].memory_bytes", "does not fit"]),
    ("a device memory edited to 0: the capacity is named, not a stage (it said 'more than the -1.07e9 B')",
     lambda d: d["inputs"]["cluster"]["memory_bytes_per_device"].update({"v100-pcie-16gb": 0}),
     ["inputs.cluster.memory_bytes_per_device.v100-pcie-16gb: 0 B", "leaves nothing"]),
    ("memory that is not the sum of its breakdown",
     lambda d: d["plans"][0]["stages"][0].update(memory_bytes=1e3),
     ["plans[0].stages[0].memory_bytes", "add up to"]),
    ("a peak below the largest stage",
     lambda d: d["plans"][0]["predicted"].update(peak_memory_bytes=1),
     ["plans[0].predicted.peak_memory_bytes", "largest stage"]),
    ("a throughput that is not batch / time",
     lambda d: d["plans"][0]["predicted"].update(samples_per_s=1e9),
     ["plans[0].predicted.samples_per_s", "global batch 8"]),
    ("rank 1 and rank 3 swapped",
     lambda d: (d["plans"][0].update(rank=3), d["plans"][2].update(rank=1)),
     ["ranks follow the iteration time"]),
    ("a layer renamed in one plan",
     lambda d: d["plans"][0]["stages"][0]["layer_names"].__setitem__(0, "zzz"),
     ["layer 0 is 'zzz'", "'l0'"]),
    ("compute_s edited below forward plus input gradient: the stage and all three fields are named, and a fix",
     lambda d: d["plans"][0]["stages"][0].update(compute_s=d["plans"][0]["stages"][0]["fwd_s"]
                                                 + d["plans"][0]["stages"][0]["bwd_input_s"] / 2),
     ["plans[0].stages[0]:", "bwd_input_s", "compute_s - fwd_s", "restore the file or plan again"]),
    ("a predicted time that is not the replay",
     lambda d: d["plans"][0]["predicted"].update(iteration_time_s=d["plans"][0]["predicted"]["iteration_time_s"] / 2,
                                                 samples_per_s=d["plans"][0]["predicted"]["samples_per_s"] * 2),
     ["plans[0].predicted.iteration_time_s", "replay"]),
])
def test_contradictions_are_refused(tmp_path, doc, what, edit, words):
    code, out = _validate(tmp_path, doc, edit)
    assert code == 2, what
    for w in words:
        assert w in out, (what, out)


def test_a_rounding_excess_of_the_input_gradient_is_accepted_and_replays(tmp_path, doc):
    """bwd_input_s one ulp above compute_s - fwd_s (sums written to 17
    digits) is rounding, not a contradiction: the file loads and replays."""
    # schedules that never split the backward into I and W: their time does not depend on bwd_input_s
    whole = [p for p in doc["plans"] if p["schedule"]["name"] in ("gpipe", "1f1b", "interleaved-1f1b")]
    assert whole

    def edit(d):
        for p in d["plans"]:
            if p["rank"] == whole[0]["rank"]:
                for st in p["stages"]:
                    st["bwd_input_s"] = (st["compute_s"] - st["fwd_s"]) * (1 + 2e-16)
    code, out = _validate(tmp_path, doc, edit, redigest=True)
    assert code == 0, out
    path = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["simulate", str(path), "--rank", str(whole[0]["rank"])])
    assert res.exit_code == 0, res.output


def test_memory_exactly_at_the_usable_limit_fits(tmp_path, doc):
    one = next(p for p in doc["plans"] if p["parallelism"]["pp"] == 1) if any(
        p["parallelism"]["pp"] == 1 for p in doc["plans"]) else None
    if one is None:
        pytest.skip("no single-stage plan in the fixture")
    k = doc["plans"].index(one)
    code, out = _validate(tmp_path, doc, lambda d: (_set_memory(d["plans"][k]["stages"][0], _usable(d)),
                                                    d["plans"][k]["predicted"].update(peak_memory_bytes=_usable(d))),
                          redigest=True)
    assert code == 0, out


def test_interleaved_stages_of_one_device_fit_together(tmp_path):
    """GPT-3 1.3B interleaved (pp 2, vp 2): stages 0 and 2 share devices.
    Each alone at 0.6 of the usable memory fits; together (1.2) they do not."""
    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                    "--schedule", "interleaved-1f1b", "--pp", "2", "--vp", "2", "--top", "1",
                                    "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    cap = d["inputs"]["cluster"]["memory_bytes_per_device"]["a100-80gb"]
    job = d["inputs"]["job"]
    usable = cap * (1 - job["memory_headroom_fraction"]) - job["memory_reserve_bytes"]

    def edit(doc):
        plan = doc["plans"][0]
        for k in (0, 2):
            _set_memory(plan["stages"][k], 0.6 * usable)
        plan["predicted"]["peak_memory_bytes"] = max(
            sum(st["memory_bytes"] for st in plan["stages"][r::2]) for r in range(2))
    code, out = _validate(tmp_path, d, edit)
    assert code == 2 and "stages 0,2 of devices" in out, out
