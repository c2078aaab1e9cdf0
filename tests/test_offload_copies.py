"""What an offloaded optimizer step moves over PCIe and runs on the host
(ZeRO-Offload, Ren et al. ATC'21 Fig. 2): the gradients the device keeps go
out and the updated weights come back in the device's dtypes, for every
parameter the device trains, the tied embedding copy included.

Oracles by hand: GPT-3 13B (hidden 5120, vocabulary 50,257 padded to a
multiple of 128 x tp = 256: 50,432) at tp 2 on the RTX 3090 box
(hardware/clusters/1x8-rtx3090-pcie3.toml: a 12.4 GB/s switch uplink shared
by the 4 GPUs under it, 3.1 GB/s each; CPU Adam 1e9 parameters/s for the
node's 8 GPUs); the copies per parameter of each optimizer state by its
dtypes: mixed-adam 2 B gradients out and 2 B weights in, fp32-adam 4 + 4,
Megatron-LM's (fp32 main gradients, bf16 weights) 4 + 2.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main

ARGS = ["plan", "-q", "--json", "--model", "gpt3-13b", "--cluster", "1x8-rtx3090-pcie3", "-b", "32", "--pp", "4",
        "--tp", "2", "--schedule", "1f1b", "--optimizer-offload", "--split", "10,10,11,11", "--recompute", "full"]
PER_GPU_BW = 12.4e9 / 4


def _plan(*extra):
    res = CliRunner().invoke(main, ARGS + list(extra))
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["plans"][0]


@pytest.mark.parametrize("state,out_b,in_b", [("mixed-adam", 2, 2), ("fp32-adam", 4, 4), ("megatron", 4, 2)])
def test_offloaded_step_copies_the_state_dtypes(state, out_b, in_b):
    """Stage 1 (10 blocks, no tied copy): parameters per GPU ``n`` = its
    weights over the device's weight bytes per parameter; PCIe per
    iteration ``n (out + in) tp``; the gradients' copy ``n out / 3.1 GB/s``.
    Every state used to be charged 2 + 2 B."""
    plan = _plan("--optimizer-state", state)
    host, st = plan["options"]["host"], plan["stages"][1]
    weight_b = 4 if state == "fp32-adam" else 2
    n = st["memory_breakdown_bytes"]["weights"] / weight_b
    assert n == pytest.approx(1.5733504e9, rel=1e-3)  # 10 blocks of 12 h^2 + 13 h parameters over tp 2
    assert host["pcie_bytes_per_iteration"][1] == pytest.approx(n * (out_b + in_b) * 2, rel=1e-12)
    assert host["optimizer_copy_s"][1] == pytest.approx(n * out_b / PER_GPU_BW, rel=1e-12)
    # the step: the gradients out, Adam at 1e9 / 8 parameters per second per GPU, the weights in
    assert st["host_step_s"] == pytest.approx(n * ((out_b + in_b) / PER_GPU_BW + 8 / 1e9), rel=1e-12)


def test_offloaded_tied_copy_steps_on_the_host():
    """The last stage's tied output embedding, 50,432 x 5120 / 2 =
    129,105,920 parameters per GPU, keeps 4 B each on the GPU (weights and
    gradients, 516,423,680 B) and moves the rest to the host with the
    stage's own state: 16 B each there (fp32 weights, gradients, moments),
    2 + 2 B each over PCIe, and its Adam step on the CPU. Stages 1 and 3
    hold 10 blocks each; stage 3 also the final LayerNorm (2 x 5120
    parameters, under 1e-4 of the tied copy)."""
    plan = _plan()
    host, stages = plan["options"]["host"], plan["stages"]
    tied = 50432 * 5120 // 2
    assert stages[3]["memory_breakdown_bytes"]["tied_copy"] == 4 * tied == 516_423_680
    assert stages[1]["memory_breakdown_bytes"]["tied_copy"] == 0
    tp = 2
    assert host["host_memory_bytes"][3] - host["host_memory_bytes"][1] == pytest.approx(16 * tied * tp, rel=1e-4)
    assert host["pcie_bytes_per_iteration"][3] - host["pcie_bytes_per_iteration"][1] == pytest.approx(
        4 * tied * tp, rel=1e-4)
    step = stages[3]["host_step_s"] - stages[1]["host_step_s"]
    assert step == pytest.approx(tied * (4 / PER_GPU_BW + 8 / 1e9), rel=1e-4)


def test_offloaded_zero3_plans_validate(tmp_path):
    """ZeRO-3 with the optimizer offloaded: each replica keeps 1 / dp of the
    weights, and the plan file's host figures are over the unsharded
    parameters (16 B of state each, over the dp replicas); validate used
    to recompute them from the sharded weights, dp times too small, and
    refused the tool's own file."""
    from pipesearch.cli import main

    out = tmp_path / "z3.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-6.7b", "--cluster", "1x8-rtx4090-pcie4", "-b", "16",
                                    "--pp", "2", "--dp", "2", "--tp", "1", "--schedule", "1f1b", "--optimizer-offload",
                                    "--sharding", "zero3", "--micro-batch-size", "1", "--recompute", "full",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["validate", str(out)])
    assert res.exit_code == 0, res.output
