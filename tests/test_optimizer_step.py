"""The optimizer step on the GPU: the bytes Adam streams per parameter, a
stage's step in its iteration time, the plan's ``optimizer_step_s`` and
its check by ``validate``. Every expected value is worked out by hand
below, from the profile's numbers and the device's memory bandwidth."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.memory import PRESETS, ParamState, from_total_bytes


@pytest.mark.parametrize("state, expected", [
    # grad read + master and moments read and written + weights written (read too without a master copy)
    (PRESETS["mixed-adam"], 2 + 2 * (4 + 8) + 2),
    (PRESETS["megatron"], 4 + 2 * (4 + 8) + 2),  # the fp32 main gradient is read, not the (absent) bf16 one
    (PRESETS["fp32-adam"], 4 + 2 * 8 + 2 * 4),
    (from_total_bytes(4), 2 + 0 + 2 * 2),  # weights and gradients only (SGD): w -= lr g
])
def test_step_bytes_per_param(state: ParamState, expected: float):
    assert state.step_bytes_per_param == expected


DEVICE = """name = "toy"
memory_GB = 100
peak_fp16_TFLOPS = 100
peak_fp32_TFLOPS = 10
hbm_bandwidth_GBps = 1000
"""

CLUSTER = """name = "toy-{n}"
nodes = 1
devices_per_node = {n}
device = "toy.toml"
[intra_node]
bandwidth_GBps = 100
latency_us = 0
[inter_node]
bandwidth_GBps = 100
latency_us = 0
"""

# two layers of 10 ms forward + 20 ms backward; 1e9 and 3e9 parameter bytes at 2 bytes each
PROFILE = """# batch_size: 1
# bytes_per_param: 2
# device: toy
name,fwd_ms,bwd_ms,param_bytes,output_bytes
a,10,20,1000000000,1000
b,10,20,3000000000,1000
"""


def _plan(tmp_path, n: int, *args) -> dict:
    (tmp_path / "toy.toml").write_text(DEVICE)
    (tmp_path / f"toy-{n}.toml").write_text(CLUSTER.format(n=n))
    (tmp_path / "p.csv").write_text(PROFILE)
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--model", str(tmp_path / "p.csv"), "--cluster",
                                  str(tmp_path / f"toy-{n}.toml"), "--memory-reserve", "0", "-o", str(out),
                                  "--top", "1", *args])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
    return json.loads(out.read_text())


def test_one_device_iteration_adds_its_step(tmp_path):
    """pp 1, dp 1, 4 micro-batches of 1: 4 x 2 layers x (10 + 20) ms of
    compute, then the step over (1e9 + 3e9) / 2 = 2e9 parameters x 28
    bytes at 0.8 x 1000 GB/s = 70 ms: 310 ms."""
    doc = _plan(tmp_path, 1, "-b", "4", "--num-micro-batches", "4")
    plan = doc["plans"][0]
    step = 2e9 * 28 / (0.8 * 1000e9)
    assert plan["stages"][0]["optimizer_step_s"] == pytest.approx(step, rel=1e-12)
    assert plan["stages"][0]["allreduce_s"] == pytest.approx(step, rel=1e-12)  # dp 1: no reduce, the step alone
    assert plan["predicted"]["iteration_time_s"] == pytest.approx(4 * 0.060 + step, rel=1e-12)
    assert doc["inputs"]["cluster"]["groups"][0]["hbm_bandwidth_bytes_per_s"] == 1000e9


def test_each_stage_steps_its_own_parameters(tmp_path):
    """pp 2 (one layer each), GPipe, 2 micro-batches: stage 1 steps 1.5e9
    parameters (52.5 ms), stage 0 0.5e9 (17.5 ms). With p = 10 ns (1000
    bytes at 100 GB/s): stage 1's forwards run 10 + p .. 30 + p ms, its
    backwards to 70 + p, stage 0's backwards 50 + 2p .. 90 + 2p; stage 1
    ends at 70 + p + 52.5 = 122.5 ms + p, stage 0 at 107.5 ms + 2p: the
    iteration takes 122.5 ms + p (without the steps stage 0's 90 ms + 2p
    would end it)."""
    doc = _plan(tmp_path, 2, "-b", "2", "--num-micro-batches", "2", "--pp", "2", "--schedule", "gpipe")
    stages = doc["plans"][0]["stages"]
    assert [s["layers"] for s in stages] == [[0, 1], [1, 2]]
    steps = [0.5e9 * 28 / 0.8e12, 1.5e9 * 28 / 0.8e12]
    assert [s["optimizer_step_s"] for s in stages] == pytest.approx(steps, rel=1e-12)
    p2p = 1000 / 100e9
    assert doc["plans"][0]["predicted"]["iteration_time_s"] == pytest.approx(0.070 + p2p + steps[1], rel=1e-9)


def test_a_sharded_optimizer_steps_its_share(tmp_path):
    """dp 2 with ZeRO-1: each replica steps half of the 2e9 parameters
    (35 ms), after its data-parallel communication (no overlap: all of
    ``dp_comm_s`` runs after the last backward)."""
    doc = _plan(tmp_path, 2, "-b", "2", "--num-micro-batches", "1", "--pp", "1", "--dp", "2",
                "--sharding", "zero1")
    st = doc["plans"][0]["stages"][0]
    assert st["optimizer_step_s"] == pytest.approx(2e9 / 2 * 28 / 0.8e12, rel=1e-12)
    assert st["allreduce_s"] == pytest.approx(st["dp_comm_s"] + st["optimizer_step_s"], rel=1e-12)


def test_validate_names_an_edited_step(tmp_path):
    doc = _plan(tmp_path, 1, "-b", "4", "--num-micro-batches", "4")
    doc["plans"][0]["stages"][0]["optimizer_step_s"] *= 0.5
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["validate", str(edited)])
    assert r.exit_code == 2 and "plans[0].stages[0].optimizer_step_s" in r.output and "28 bytes" in r.output


def test_an_offloaded_optimizer_steps_on_the_host_only(tmp_path):
    """20 GB devices: 2e9 parameters' 16 bytes of state do not fit, the
    4 bytes of weights and gradients do: the stage offloads its optimizer,
    whose step runs on the CPU (host_step_s), none on the GPU."""
    host = ("\n[host]\nmemory_GB = 800\npcie_generation = 4\npcie_lanes_per_gpu = 16\nhost_to_device_GBps = 25\n"
            "switch_uplink_GBps = 25\npcie_switches = [[0]]\ncpu_adam_params_per_s = 1e9\n")
    (tmp_path / "toy.toml").write_text(DEVICE.replace("memory_GB = 100", "memory_GB = 20"))
    (tmp_path / "toy-1.toml").write_text(CLUSTER.format(n=1) + host)
    (tmp_path / "p.csv").write_text(PROFILE)
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--model", str(tmp_path / "p.csv"), "--cluster",
                                  str(tmp_path / "toy-1.toml"), "--memory-reserve", "0", "-o", str(out), "--top", "1",
                                  "-b", "4", "--num-micro-batches", "4", "--optimizer-offload"])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
    st = json.loads(out.read_text())["plans"][0]["stages"][0]
    assert "offload" in st["memory_option"] and st["optimizer_step_s"] == 0.0
    assert st["host_step_s"] >= 2e9 / 1e9 and st["allreduce_s"] == pytest.approx(st["host_step_s"], rel=1e-12)
