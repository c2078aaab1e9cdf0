"""``pipesearch validate`` of hand-edited plans that keep state in host
memory: ZeRO-offload (``--optimizer-offload``) and Mobius plans, checked
against ``inputs.cluster.host``.

Each test writes a real plan, edits one field, and reads the first problem
line (exit 2, no traceback). Expected values are derived here by hand from
the file's own stage bytes and the 1x8-rtx4090-pcie4 ``[host]`` table: PCIe
4.0 at 25 GB/s per GPU and per switch uplink, two switches of GPUs 0-3 and
4-7, CPU Adam at 1e9 parameters/s, 800 GB of host memory; mixed-precision
Adam keeps 4 + 8 + 4 = 16 B per parameter on the host under offload
(ZeRO-Offload Fig. 2: fp32 master weights, moments, gradients), Mobius 2 B
more (its 16-bit copy).
"""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from helpers import written_plan
from pipesearch.cli import main

COMMON = ["plan", "-q", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "--top", "1"]


def _plan(tmp_path_factory, name, flags):
    return written_plan(tmp_path_factory, name, COMMON + flags)


@pytest.fixture(scope="module")
def offload_doc(tmp_path_factory):
    """Qwen3-32B, batch 32, the optimizer offloaded: pp 2 x tp 4 (GPUs 0-3, 4-7)."""
    doc = _plan(tmp_path_factory, "off", ["--model", "qwen3-32b", "-b", "32", "--optimizer-offload"])
    assert doc["plans"][0]["parallelism"] == {"pp": 2, "dp": 1, "tp": 4, "vp": 1}
    assert [st["memory_option"] for st in doc["plans"][0]["stages"]] == ["offload", "offload"]
    return doc


@pytest.fixture(scope="module")
def mobius_doc(tmp_path_factory):
    doc = _plan(tmp_path_factory, "mob", ["--model", "llama3.1-8b", "-b", "32", "--schedule", "mobius"])
    assert doc["plans"][0]["parallelism"]["dp"] == 1
    return doc


def _first(tmp_path, doc, edit, command=("validate",)):
    bad = copy.deepcopy(doc)
    edit(bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    r = CliRunner().invoke(main, [*command, str(path)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    return r.output.strip().splitlines()[0].removeprefix(f"{path}: ")


def _host(doc):
    return doc["inputs"]["cluster"]["host"]


# ------------------------------------------------------------- ZeRO-offload


def test_offload_host_memory_over_the_node_is_refused(tmp_path, offload_doc):
    """Bug: validate ignored ``[host]`` memory for an offload plan. 100 GB
    cannot hold the 2 stages' 16 B per parameter: far more than 100e9 B."""
    def edit(d):
        _host(d)["memory_bytes"] = 100e9
    line = _first(tmp_path, offload_doc, edit)
    assert line.startswith("plans[0].options.host.host_memory_bytes:") and "1e+11 B" in line, line


@pytest.mark.parametrize("edit", [
    lambda d: _host(d).update(memory_bytes=-1),
    lambda d: d["inputs"]["cluster"].pop("host"),
    lambda d: _host(d).update(pcie_switches=[[0, 1, 2]]),
])
def test_offload_malformed_host_table_is_refused(tmp_path, offload_doc, edit):
    """Bug: a negative, deleted or incomplete ``[host]`` table passed
    (``[[0, 1, 2]]`` leaves GPUs 3-7 under no switch)."""
    line = _first(tmp_path, offload_doc, edit)
    assert line.startswith("inputs.cluster.host"), line


def test_offload_stage_host_bytes_recomputed(tmp_path, offload_doc):
    """Bug: ``options.host.host_memory_bytes[0]`` = 1 passed. Expected: the
    stage's 16-bit weights per GPU ``w`` (2 B per parameter) x 16 B / 2 B x
    4 GPUs (tp 4)."""
    w = offload_doc["plans"][0]["stages"][0]["memory_breakdown_bytes"]["weights"]
    line = _first(tmp_path, offload_doc, lambda d: d["plans"][0]["options"]["host"]["host_memory_bytes"]
                  .__setitem__(0, 1))
    assert line.startswith(f"plans[0].options.host.host_memory_bytes[0]: 1 found, {w * 8 * 4!r} expected"), line


def test_offload_total_pcie_bytes_recomputed(tmp_path, offload_doc):
    """Bug: ``total_pcie_bytes_per_iteration`` = 1 passed. Expected: per
    stage 2 x w x 4 GPUs (gradients out, weights back), summed."""
    stages = offload_doc["plans"][0]["stages"]
    want = sum(2 * st["memory_breakdown_bytes"]["weights"] * 4 for st in stages)
    line = _first(tmp_path, offload_doc, lambda d: d["plans"][0]["options"]["host"]
                  .__setitem__("total_pcie_bytes_per_iteration", 1))
    assert line.startswith("plans[0].options.host.total_pcie_bytes_per_iteration: 1 found"), line
    assert abs(float(line.split(", ")[1].split(" ")[0]) - want) <= 1e-9 * want, line


def test_offload_host_step_recomputed(tmp_path, offload_doc):
    """Bug: the CPU step was never rechecked. Stage 0 on GPUs 0-3: the 4 of
    switch 0 share its 25 GB/s (6.25e9 B/s each); 8 GPUs share the CPU:
    ``w / 2 x ((2 + 2) / 6.25e9 + 8 / 1e9)`` seconds."""
    w = offload_doc["plans"][0]["stages"][0]["memory_breakdown_bytes"]["weights"]
    want = w / 2 * (4 / 6.25e9 + 8 / 1e9)
    line = _first(tmp_path, offload_doc, lambda d: d["plans"][0]["stages"][0].__setitem__("host_step_s", 1.0))
    assert line.startswith("plans[0].stages[0].host_step_s: 1.0 found"), line
    assert abs(float(line.split(", ")[1].split(" ")[0]) - want) <= 1e-9 * want, line


def test_device_option_with_host_state_is_refused(tmp_path, offload_doc):
    """Bug (finding 4): stage 0 set to ``none`` passed although options.host
    still holds its optimizer and its host step runs 34 s."""
    line = _first(tmp_path, offload_doc, lambda d: d["plans"][0]["stages"][0].__setitem__("memory_option", "none"))
    assert line.startswith("plans[0].stages[0].memory_option: 'none' keeps the stage's state on the device"), line


# ------------------------------------------------------------------- Mobius


def _mobius_rank0(doc):
    """Stage 0's parameter bytes per GPU ``p`` (swapped_buffers holds 2 B
    of weights and gradients per parameter byte) and how many of rank 0's
    GPUs sit under one switch (tp consecutive GPUs from its first device,
    switches 0-3 and 4-7)."""
    plan = doc["plans"][0]
    st, tp = plan["stages"][0], plan["parallelism"]["tp"]
    gpus = [d + t for d in st["devices"] for t in range(tp)]
    copies = max(sum(g // 4 == s for g in gpus) for s in (0, 1))
    return st["memory_breakdown_bytes"]["swapped_buffers"] / 2, copies


def test_mobius_copies_follow_the_host_link(tmp_path, mobius_doc):
    """Bug (finding 2): host_to_device and uplink at 1e9 B/s left
    ``swap_in_s[0]`` at its 25 GB/s value. Expected ``p x copies / 1e9``."""
    p, copies = _mobius_rank0(mobius_doc)
    line = _first(tmp_path, mobius_doc, lambda d: _host(d).update(host_to_device_bytes_per_s=1e9,
                                                                  switch_uplink_bytes_per_s=1e9))
    assert line.startswith("plans[0].options.mobius.swap_in_s[0]:"), line
    assert f", {p * copies / 1e9!r} expected" in line, line


def test_mobius_cpu_step_follows_the_cpu(tmp_path, mobius_doc):
    """Bug: cpu_adam 1e6/s left the host step at its 1e9/s value. Expected
    ``p / 2 B x GPUs of the plan on the node / 1e6``."""
    p, _ = _mobius_rank0(mobius_doc)
    plan = mobius_doc["plans"][0]
    tp = plan["parallelism"]["tp"]
    node = len({d + t for st in plan["stages"] for d in st["devices"] for t in range(tp)})
    line = _first(tmp_path, mobius_doc, lambda d: _host(d).update(cpu_adam_params_per_s=1e6))
    assert line.startswith("plans[0].stages[0].host_step_s:"), line
    want = p / 2 * node / 1e6
    assert abs(float(line.split(", ")[1].split(" ")[0]) - want) <= 1e-9 * want, line


def test_mobius_host_memory_over_the_node_is_refused(tmp_path, mobius_doc):
    """Bug: 100 GB of host memory against the plan's 18 B per parameter of
    an 8B model (over 144e9 B) passed."""
    line = _first(tmp_path, mobius_doc, lambda d: _host(d).update(memory_bytes=100e9))
    assert line.startswith("plans[0].options.host.host_memory_bytes:") and "1e+11 B" in line, line


def test_mobius_edited_swap_in_is_named(tmp_path, mobius_doc):
    """Bug (finding 6): ``swap_in_s[3]`` = 0 was reported as swap_out_s[3]."""
    line = _first(tmp_path, mobius_doc, lambda d: d["plans"][0]["options"]["mobius"]["swap_in_s"].__setitem__(3, 0))
    assert line.startswith("plans[0].options.mobius.swap_in_s[3]: 0 found"), line


def test_mobius_edited_host_step_is_named(tmp_path, mobius_doc):
    """Bug (finding 6): stage 3's ``host_step_s`` = 0 was reported as its allreduce_s."""
    line = _first(tmp_path, mobius_doc, lambda d: d["plans"][0]["stages"][3].__setitem__("host_step_s", 0))
    assert line.startswith("plans[0].stages[3].host_step_s: 0 found"), line
