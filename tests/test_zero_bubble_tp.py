"""Zero-bubble plans under tensor parallelism: the input-gradient pass waits
for its tensor-parallel collectives (its GEMMs' weight gradients, which the
whole backward of 1F1B hides them under, run later), so a ZB-H1 stage's
backward is the 1F1B stage's plus the collectives 1F1B hides: on a fast
link every one of them (Qi et al. 2023; docs/transformer_costs.md)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main

# GPT-3 1.3B (h 2048, s 2048), tp 2 without sequence parallelism on one DGX A100 node (NVLink 300 GB/s, 5 us)
H, S, TP, BW, LAT = 2048, 2048, 2, 300e9, 5e-6


def _stage0(schedule: str, tp: int, sp: bool = False) -> dict:
    result = CliRunner().invoke(main, [
        "plan", "-q", "--json", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "16", "--tp", str(tp),
        "--pp", "2", "--schedule", schedule, "--recompute", "none", "--split", "13,13", "--micro-batch-size", "1",
        "--top", "1", *(["--no-sequence-parallel"] if tp > 1 and not sp else [])])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plans"][0]["stages"][0]


@pytest.mark.parametrize("sp", [False, True])
def test_zero_bubble_backward_pays_the_collectives_the_1f1b_backward_hides(sp):
    """Without sp a block's two all-reduces; with sp its two reduce-scatters and the two gathers of the
    column-parallel GEMMs' saved inputs (the weight pass's, hidden under the input gradients in 1F1B; the
    output-gradient all-gathers wait in both): two all-reduces' time either way."""
    zb, one = _stage0("zb-h1", TP, sp), _stage0("1f1b", TP, sp)
    assert zb["fwd_s"] == pytest.approx(one["fwd_s"], rel=1e-12)
    # ring all-reduce of one block input (b s h bf16 bytes) over tp ranks; a block's backward has two (one per
    # column-parallel GEMM's input gradient), each shorter than its GEMM's weight gradient here: hidden in 1F1B
    msg = S * H * 2
    allreduce = 2 * (TP - 1) / TP * msg / BW + 2 * (TP - 1) * LAT
    blocks = 12  # stage 0 of 13 layers: the embedding (no overlap either way) and 12 blocks
    extra = (zb["compute_s"] - zb["fwd_s"]) - (one["compute_s"] - one["fwd_s"])
    assert extra == pytest.approx(blocks * 2 * allreduce, rel=1e-9)
    # the input pass is the same: it never hid them
    assert zb["bwd_input_s"] == pytest.approx(one["bwd_input_s"], rel=1e-12)


def test_without_tensor_parallelism_both_backwards_agree():
    zb, one = _stage0("zb-h1", 1), _stage0("1f1b", 1)
    assert zb["compute_s"] == pytest.approx(one["compute_s"], rel=1e-12)
    assert zb["bwd_input_s"] == pytest.approx(one["bwd_input_s"], rel=1e-12)
