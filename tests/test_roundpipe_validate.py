"""``pipesearch validate`` of hand-edited RoundPipe and Mobius plan files:
every refusal names the field path, the value found and the value expected,
and exits 2 without a traceback; ``pipesearch simulate`` of an edited file
replays it and warns, naming the file and both times.

Each test writes a real plan with ``pipesearch plan -o``, checks that it
validates, edits one field, and reads the first problem line. Expected
values are derived here from the file's own numbers and the 1x8-rtx4090-pcie4
``[host]`` table (PCIe 4.0 at 25 GB/s per GPU and per switch uplink, two
switches of four GPUs, CPU Adam at 1e9 parameters/s), never read from the
checker.
"""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from helpers import written_plan
from pipesearch.cli import main
from pipesearch.schedules import roundpipe_tasks

BW = 25e9  # min(host_to_device, switch_uplink) of 1x8-rtx4090-pcie4, bytes/s
ADAM = 1e9  # its CPU Adam, parameters/s
COMMON = ["plan", "-q", "--model", "qwen3-1.7b", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048"]


def _plan(tmp_path_factory, name, flags):
    return written_plan(tmp_path_factory, name, COMMON + flags)


@pytest.fixture(scope="module")
def roundpipe_doc(tmp_path_factory):
    """pp 2 (GPUs 0 and 1, one switch), vp 2: 4 groups, 8 micro-batches."""
    return _plan(tmp_path_factory, "rp", ["--schedule", "roundpipe", "--pp", "2", "-b", "16", "--top", "1"])


@pytest.fixture(scope="module")
def roundpipe_delayed_doc(tmp_path_factory):
    return _plan(tmp_path_factory, "rpd", ["--schedule", "roundpipe", "--pp", "2", "-b", "16", "--top", "1",
                                           "--delayed-optimizer-step"])


@pytest.fixture(scope="module")
def mobius_doc(tmp_path_factory):
    """Mobius with activations in host memory on some stages: the plan of
    the file with the most ranks and an act-host stage is the one edited."""
    return _plan(tmp_path_factory, "mob", ["--schedule", "mobius", "-b", "64", "--activation-offload", "--top", "5",
                                           "--pp", "4", "--tp", "2"])  # the unpinned search's rank 1, in 1/15 the time


def _act_plan(doc) -> int:
    ks = [k for k, p in enumerate(doc["plans"]) if any(p["options"]["mobius"].get("act_host") or ())
          and p["parallelism"]["dp"] == 1]
    assert ks, "no Mobius plan with an act-host stage and dp 1"
    return ks[0]


def _refusal(tmp_path, doc, edit, field):
    """Edit a copy of ``doc``; validate it; return the first problem line,
    after checking exit 2, no traceback, and ``field`` named in it."""
    bad = copy.deepcopy(doc)
    edit(bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    first = r.output.strip().splitlines()[0]
    assert first.startswith(f"{path}: {field}:"), (field, first)
    return first


def _set(path, value):
    def edit(doc):
        obj = doc
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return edit


# ------------------------------------------------------------------ RoundPipe


def test_roundpipe_file_validates_and_its_copies_follow_the_host_table(roundpipe_doc):
    """The oracle of the checks below, on the unedited file: each copy is
    bytes over 25 GB/s, two pool GPUs under one switch double it, the CPU
    step is weights / 2 B / 1e9 per second. Qwen3-1.7B ties its embedding
    and LM head: the last group also uploads the tied matrix, 151936 x 2048
    parameters x 2 B (its ``tied_copy`` holds those weights and their
    gradient, twice that)."""
    p = roundpipe_doc["plans"][0]
    info, st = p["options"]["roundpipe"], p["stages"]
    assert info["pcie_scale"] == [2.0, 2.0]
    tied = 151936 * 2048 * 2
    assert st[-1]["memory_breakdown_bytes"]["tied_copy"] == 2 * tied
    for g, s in enumerate(st):
        extra = tied if g == len(st) - 1 else 0
        assert info["weights_in_s"][g] == pytest.approx((s["memory_breakdown_bytes"]["weights"] + extra) / BW,
                                                        rel=1e-12)
        assert s["host_step_s"] == pytest.approx(s["memory_breakdown_bytes"]["weights"] / 2 / ADAM, rel=1e-12)
        if g + 1 < len(st):
            assert info["act_copy_s"][g] == pytest.approx(s["send_bytes"] / BW, rel=1e-12)


def test_roundpipe_options_missing(tmp_path, roundpipe_doc):
    line = _refusal(tmp_path, roundpipe_doc, lambda d: d["plans"][0]["options"].pop("roundpipe"),
                    "plans[0].options.roundpipe")
    assert "null found" in line and "expected" in line


def test_roundpipe_copy_list_of_the_wrong_length(tmp_path, roundpipe_doc):
    line = _refusal(tmp_path, roundpipe_doc, lambda d: d["plans"][0]["options"]["roundpipe"]["act_copy_s"].pop(),
                    "plans[0].options.roundpipe.act_copy_s")
    assert "2 entries found, 3 numbers >= 0 (one per boundary) expected" in line


def test_roundpipe_negative_copy(tmp_path, roundpipe_doc):
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "options", "roundpipe", "weights_in_s", 1], -1.0),
                    "plans[0].options.roundpipe.weights_in_s[1]")
    assert "-1.0 found, a number >= 0 expected" in line


def test_roundpipe_tasks_of_the_wrong_length(tmp_path, roundpipe_doc):
    line = _refusal(tmp_path, roundpipe_doc, lambda d: d["plans"][0]["options"]["roundpipe"]["tasks"].pop(),
                    "plans[0].options.roundpipe.tasks")
    assert "6 entries found, 7 tasks" in line


def test_roundpipe_task_off_the_round_robin(tmp_path, roundpipe_doc):
    want = [list(t) for t in roundpipe_tasks(4, 2)]
    assert want[2] == ["F", 2, 0]  # group 2's forward on GPU 0 (2 mod 2)
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "options", "roundpipe", "tasks", 2], ["F", 2, 1]),
                    "plans[0].options.roundpipe.tasks[2]")
    assert '["F", 2, 1] found, ["F", 2, 0] expected' in line


def test_roundpipe_pcie_scale(tmp_path, roundpipe_doc):
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "options", "roundpipe", "pcie_scale", 0], 1.0),
                    "plans[0].options.roundpipe.pcie_scale[0]")
    assert "1.0 found, 2.0 expected" in line and "2 of the pool's GPUs" in line


def test_roundpipe_activation_copy(tmp_path, roundpipe_doc):
    st = roundpipe_doc["plans"][0]["stages"][1]
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "options", "roundpipe", "act_copy_s", 1], 0.5),
                    "plans[0].options.roundpipe.act_copy_s[1]")
    assert f"0.5 found, {st['send_bytes'] / BW!r} expected" in line and "stages[1].send_bytes" in line


def test_roundpipe_send_bytes_edited_names_the_host_memory_it_changes(tmp_path, roundpipe_doc):
    """Stage 0's output is group 1's saved input, m micro-batches of it in
    host memory: doubling send_bytes is refused at group 1's host bytes
    (the memory recheck runs before the copies' check)."""
    p = roundpipe_doc["plans"][0]
    st, m = p["stages"][0], p["schedule"]["num_micro_batches"]
    held = p["options"]["host"]["host_memory_bytes"][1]
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "stages", 0, "send_bytes"], 2 * st["send_bytes"]),
                    "plans[0].options.host.host_memory_bytes[1]")
    assert f"{held!r} B" in line and f"{held + m * st['send_bytes']!r} B" in line


@pytest.mark.parametrize("key,part", [("weights_in_s", "weights"), ("grads_out_s", "gradients")])
def test_roundpipe_weight_and_gradient_copies(tmp_path, roundpipe_doc, key, part):
    b = roundpipe_doc["plans"][0]["stages"][2]["memory_breakdown_bytes"][part]
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "options", "roundpipe", key, 2], 0.25),
                    f"plans[0].options.roundpipe.{key}[2]")
    assert f"0.25 found, {b / BW!r} expected" in line and f"memory_breakdown_bytes.{part}" in line


def test_roundpipe_stage_comm_s(tmp_path, roundpipe_doc):
    copy_s = roundpipe_doc["plans"][0]["options"]["roundpipe"]["act_copy_s"][1]
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "stages", 1, "comm_s"], 0.125),
                    "plans[0].stages[1].comm_s")
    assert f"0.125 found, {copy_s!r} expected" in line


def test_roundpipe_last_group_sends_nothing(tmp_path, roundpipe_doc):
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "stages", 3, "comm_s"], 0.125),
                    "plans[0].stages[3].comm_s")
    assert "0.125 found, 0.0 expected" in line


def test_roundpipe_host_step(tmp_path, roundpipe_doc):
    w = roundpipe_doc["plans"][0]["stages"][1]["memory_breakdown_bytes"]["weights"]
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "stages", 1, "host_step_s"], 9.0),
                    "plans[0].stages[1].host_step_s")
    assert f"9.0 found, {w / 2 / ADAM!r} expected" in line


def test_roundpipe_allreduce_is_the_host_step(tmp_path, roundpipe_doc):
    step = roundpipe_doc["plans"][0]["stages"][1]["host_step_s"]
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "stages", 1, "allreduce_s"], 9.0),
                    "plans[0].stages[1].allreduce_s")
    assert f"9.0 found, {step!r} expected" in line


def test_roundpipe_delayed_step_leaves_no_allreduce(tmp_path, roundpipe_delayed_doc):
    assert all(s["allreduce_s"] == 0 for s in roundpipe_delayed_doc["plans"][0]["stages"])
    line = _refusal(tmp_path, roundpipe_delayed_doc, _set(["plans", 0, "stages", 0, "allreduce_s"], 9.0),
                    "plans[0].stages[0].allreduce_s")
    assert "9.0 found, 0.0 expected" in line and "delayed" in line


def test_roundpipe_analytic_time(tmp_path, roundpipe_doc):
    t = roundpipe_doc["plans"][0]["predicted"]["iteration_time_s"]
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "predicted", "analytic_iteration_time_s"], 2 * t),
                    "plans[0].predicted.analytic_iteration_time_s")
    assert f"{2 * t!r} found, {t!r} expected" in line


def _busy(plan) -> list[float]:
    """Each GPU's compute: m micro-batches of its tasks (forward: fwd_s;
    backward and the fused last task: compute_s), by hand."""
    pp, st, m = plan["parallelism"]["pp"], plan["stages"], plan["schedule"]["num_micro_batches"]
    busy = [0.0] * pp
    for kind, g, d in roundpipe_tasks(len(st), pp):
        busy[d] += m * (st[g]["fwd_s"] if kind == "F" else st[g]["compute_s"])
    return busy


def test_roundpipe_bubble_fraction(tmp_path, roundpipe_doc):
    p = roundpipe_doc["plans"][0]
    expected = 1 - max(_busy(p)) / p["predicted"]["iteration_time_s"]
    assert p["predicted"]["bubble_fraction"] == pytest.approx(expected, rel=1e-9)
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "predicted", "bubble_fraction"], 0.75),
                    "plans[0].predicted.bubble_fraction")
    assert "0.75 found" in line and "expected" in line


def test_roundpipe_forward_time_of_the_busiest_gpu_moves_the_bubble(tmp_path, roundpipe_doc):
    p = roundpipe_doc["plans"][0]
    d = max(range(2), key=lambda x: _busy(p)[x])
    g = d  # group d's forward runs on GPU d

    def edit(doc):
        doc["plans"][0]["stages"][g]["fwd_s"] *= 1.5

    line = _refusal(tmp_path, roundpipe_doc, edit, "plans[0].predicted.bubble_fraction")
    assert f"GPU {d} runs" in line and f"stages {g}," in line


def _retime(doc, k, factor):
    """Scale plan k's iteration time and keep every figure derived from it
    consistent (samples/s, analytic time, bubble): only the replay disagrees."""
    pred = doc["plans"][k]["predicted"]
    busy = 1 - pred["bubble_fraction"]
    for key in ("iteration_time_s", "analytic_iteration_time_s"):
        if key in pred:
            pred[key] *= factor
    pred["samples_per_s"] /= factor
    pred["bubble_fraction"] = 1 - busy / factor
    if "tokens_per_s" in pred:
        pred["tokens_per_s"] /= factor
        pred["tokens_per_s_per_device"] /= factor
    if pred.get("mfu"):  # model FLOPs over time and peak: derived from the time too
        pred["mfu"] /= factor


def _expected_s(line: str) -> float:
    import re
    return float(re.search(r"found, ([0-9.e+-]+) s expected", line).group(1))


def test_roundpipe_prediction_against_the_replay(tmp_path, roundpipe_doc):
    t = roundpipe_doc["plans"][0]["predicted"]["iteration_time_s"]
    line = _refusal(tmp_path, roundpipe_doc, lambda d: _retime(d, 0, 1.25), "plans[0].predicted.iteration_time_s")
    assert f"{1.25 * t!r} s found" in line and "options.roundpipe" in line and "replay in" not in line
    assert _expected_s(line) == pytest.approx(t, rel=1e-9)  # the stages are untouched: they replay to the old time


def test_roundpipe_memory_option(tmp_path, roundpipe_doc):
    line = _refusal(tmp_path, roundpipe_doc, _set(["plans", 0, "stages", 2, "memory_option"], "swap"),
                    "plans[0].stages[2].memory_option")
    assert "'swap' under schedule roundpipe: expected 'roundpipe'" in line


# ------------------------------------------------------------------ Mobius


def test_mobius_options_missing(tmp_path, mobius_doc):
    line = _refusal(tmp_path, mobius_doc, lambda d: d["plans"][0]["options"].pop("mobius"), "plans[0].options.mobius")
    assert "null found" in line and "swap_in_s" in line


def test_mobius_copy_list_of_the_wrong_length(tmp_path, mobius_doc):
    n = len(mobius_doc["plans"][0]["stages"])
    line = _refusal(tmp_path, mobius_doc, lambda d: d["plans"][0]["options"]["mobius"]["swap_in_s"].pop(),
                    "plans[0].options.mobius.swap_in_s")
    assert f"{n - 1} entries found, {n} numbers >= 0 (one per stage) expected" in line


def test_mobius_negative_queue(tmp_path, mobius_doc):
    line = _refusal(tmp_path, mobius_doc, _set(["plans", 0, "options", "mobius", "pcie_queue", 0], -1),
                    "plans[0].options.mobius.pcie_queue[0]")
    assert "-1 found, a number >= 0 expected" in line


def test_mobius_queue_is_the_switch_of_the_rank(tmp_path, mobius_doc):
    """Rank r's queue is its first GPU's switch: GPUs 0-3 switch 0, 4-7 switch 1."""
    k = _act_plan(mobius_doc)
    p = mobius_doc["plans"][k]
    for r in range(p["parallelism"]["pp"]):
        assert p["options"]["mobius"]["pcie_queue"][r] == p["stages"][r]["devices"][0] // 4
    r = p["parallelism"]["pp"] - 1
    want = p["stages"][r]["devices"][0] // 4
    line = _refusal(tmp_path, mobius_doc, _set(["plans", k, "options", "mobius", "pcie_queue", r], 7),
                    f"plans[{k}].options.mobius.pcie_queue[{r}]")
    assert f"7 found, {want} expected" in line


def test_mobius_copy_out_takes_as_long_as_in(tmp_path, mobius_doc):
    s_in = mobius_doc["plans"][0]["options"]["mobius"]["swap_in_s"][1]
    line = _refusal(tmp_path, mobius_doc, _set(["plans", 0, "options", "mobius", "swap_out_s", 1], 3.0),
                    "plans[0].options.mobius.swap_out_s[1]")
    assert f"3.0 found, {s_in!r} expected" in line


def test_mobius_act_host_of_the_wrong_shape(tmp_path, mobius_doc):
    k = _act_plan(mobius_doc)
    line = _refusal(tmp_path, mobius_doc, _set(["plans", k, "options", "mobius", "act_host"], [True]),
                    f"plans[{k}].options.mobius.act_host")
    assert "[true] found" in line and "expected" in line


def test_mobius_act_host_against_the_memory_option(tmp_path, mobius_doc):
    k = _act_plan(mobius_doc)
    act = mobius_doc["plans"][k]["options"]["mobius"]["act_host"]
    s = act.index(True)

    def edit(doc):
        doc["plans"][k]["options"]["mobius"]["act_host"][s] = False

    line = _refusal(tmp_path, mobius_doc, edit, f"plans[{k}].options.mobius.act_host[{s}]")
    assert "False found, True expected" in line and "'swap+act-host'" in line


def test_mobius_allreduce_is_the_host_step_at_dp_1(tmp_path, mobius_doc):
    k = _act_plan(mobius_doc)
    step = mobius_doc["plans"][k]["stages"][1]["host_step_s"]
    line = _refusal(tmp_path, mobius_doc, _set(["plans", k, "stages", 1, "allreduce_s"], 9.0),
                    f"plans[{k}].stages[1].allreduce_s")
    assert f"9.0 found, {step!r} expected" in line


def test_mobius_prediction_against_the_replay(tmp_path, mobius_doc):
    t = mobius_doc["plans"][0]["predicted"]["iteration_time_s"]

    def edit(doc):
        _retime(doc, 0, 1.25)
        for p in doc["plans"][1:]:  # ranks follow the time: keep plan 0 first
            _retime(doc, doc["plans"].index(p), 2.0)

    line = _refusal(tmp_path, mobius_doc, edit, "plans[0].predicted.iteration_time_s")
    assert f"{1.25 * t!r} s found" in line and "options.mobius" in line
    assert _expected_s(line) == pytest.approx(t, rel=1e-9)


def test_mobius_memory_option(tmp_path, mobius_doc):
    line = _refusal(tmp_path, mobius_doc, _set(["plans", 0, "stages", 0, "memory_option"], "roundpipe"),
                    "plans[0].stages[0].memory_option")
    assert "'roundpipe' under schedule mobius" in line


@pytest.mark.parametrize("host", [None, {"memory_bytes": 1e15}, [1]])
def test_roundpipe_without_a_readable_host_table(tmp_path, roundpipe_doc, host):
    def edit(doc):
        if host is None:
            doc["inputs"]["cluster"].pop("host")
        else:
            doc["inputs"]["cluster"]["host"] = host

    line = _refusal(tmp_path, roundpipe_doc, edit, "inputs.cluster.host")
    assert f"{json.dumps(host)} found" in line and "[host] table expected" in line  # a missing table: null
