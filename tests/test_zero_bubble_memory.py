"""ZB-H1 activation memory: what a micro-batch holds between its input- and
weight-gradient steps is per layer (Layer.wgrad_saved_bytes), so each stage
peaks at its own mix of saved and held bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import tiny_cluster
from pipesearch.cli import main
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.schedules import build, simultaneous_in_flight, wgrad_states
from pipesearch.types import Job, Layer, Link, ModelProfile


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_states_give_the_walked_peak_for_any_held_share(p):
    """For every held share h = H / S (below and above 1), the peak
    max_q (a S + b H) over a stage's states equals the walk of its action
    list with h (schedules.simultaneous_in_flight) times S."""
    rng = np.random.default_rng(p)
    for m in range(p, 2 * p + 3):
        actions = build("zb-h1", p, m, 1)
        states = wgrad_states(actions)
        for _ in range(5):
            S, H = rng.exponential(1.0), rng.exponential(3.0)
            walked = simultaneous_in_flight(actions, H / S)
            for k in range(p):
                assert max(a * S + b * H for a, b in states[k]) == pytest.approx(walked[k] * S, rel=1e-12)


def test_wgrad_states_refuse_ranks_with_several_stages():
    with pytest.raises(Exception, match="one stage per rank"):
        wgrad_states(build("interleaved-1f1b", 2, 4, 2))


def _profile():
    """Four layers: 'blocks' saving 1 MB and holding 16 MB until W (full
    recompute: the recomputed GEMM inputs wait for the weight gradient), and
    a 'head' saving 50 MB that holds those 50 MB (its output gradient)."""
    mb = 1e6
    layers = [Layer(f"b{k}", 1e-3, 2e-3, 1e6, mb, mb, bwd_input_s=1e-3, wgrad_saved_bytes=16 * mb) for k in range(3)]
    layers.append(Layer("head", 1e-3, 2e-3, 1e6, mb, 50 * mb, bwd_input_s=1e-3, wgrad_saved_bytes=50 * mb))
    return ModelProfile("zb", tuple(layers), profiled_batch_size=1, wgrad_saved_fraction=1.0)


def test_each_stage_peaks_at_its_own_held_share():
    """Split [3 | 1] on 2 stages, ZB-H1, m = 4: stage 0 (blocks) holds 3 MB
    before I and 48 MB after it per micro-batch, share 16; stage 1 (head)
    50 and 50, share 1. Each stage's activation memory is the walk of its
    own list with its own share: a model-wide share (16 or 1) is wrong for
    one of them."""
    prof = _profile()
    costs = build_pipeline_costs(prof, tiny_cluster(1, 2), Job(4, memory_reserve_bytes=0), pp=2, dp=1,
                                 micro_batch_size=1, num_micro_batches=4, schedule="gpipe",
                                 placement=pipeline_placement(2, 1), wgrad_window=True,
                                 in_flight=np.array(simultaneous_in_flight(build("zb-h1", 2, 4, 1))))
    walked0 = simultaneous_in_flight(build("zb-h1", 2, 4, 1), 16.0)[0] * 3e6
    walked1 = simultaneous_in_flight(build("zb-h1", 2, 4, 1), 1.0)[1] * 50e6
    assert costs.activation_bytes(0, 3e6, 0, 3) == pytest.approx(walked0)
    assert costs.activation_bytes(1, 50e6, 3, 4) == pytest.approx(walked1)
    wrong = simultaneous_in_flight(build("zb-h1", 2, 4, 1), 16.0)[1] * 50e6
    assert wrong > walked1  # what a model-wide share of 16 would charge the head


def test_full_recompute_keeps_no_more_than_selective_or_none_under_zb_h1():
    """GPT-3 1.3B on 2 A100, split 13,13, micro-batch 4, ZB-H1: recomputing
    more never raises what a stage keeps (the head is never recomputed);
    on top of it a block recomputing in its backward holds what it
    recomputes once (Chen et al. 2016; Korthikanti et al. 2022 Table 2,
    s 2048, b 4, h 2048, a 16, sbh = 16,777,216): under full recomputation
    the whole block but its attention core, 34 sbh = 570,425,344 B (the
    recomputed forward runs fused attention, whose 5 a s^2 b = 1,342,177,280
    B of scores are never whole); under selective nothing (the core is
    recomputed tile by tile, as FlashAttention's backward does). (So the
    peak with full recomputation can exceed selective's where few
    micro-batches are in flight.)"""
    kept, transient = {}, {}
    for rc in ("none", "selective", "full"):
        res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                        "--pp", "2", "--dp", "1", "--tp", "1", "--split", "13,13",
                                        "--micro-batch-size", "4", "--schedule", "zb-h1", "--recompute", rc, "--json"])
        assert res.exit_code == 0, res.output
        stages = json.loads(res.output)["plans"][0]["stages"]
        parts = [st["memory_breakdown_bytes"] for st in stages]
        transient[rc] = [p.get("recompute_transient", 0.0) for p in parts]
        kept[rc] = [st["memory_bytes"] - t for st, t in zip(stages, transient[rc])]
    assert all(f <= s <= n for f, s, n in zip(kept["full"], kept["selective"], kept["none"]))
    assert transient["none"] == [0.0, 0.0]
    assert transient["selective"] == [0.0, 0.0]
    assert transient["full"] == [570_425_344.0] * 2


def test_weight_gradient_bytes_gemm_by_gemm():
    """What a block keeps between I and W: each GEMM's input and output
    gradient, 2 bytes an element. GPT-3 1.3B (s 2048, h 2048, f 4h, b 1; in
    units of sbh = s b h bytes, a 16-bit s x b x h tensor being 2 sbh): inputs of QKV,
    projection, fc1, fc2 = 2 + 2 + 2 + 8 sbh, output gradients 6 + 2 + 8 + 2
    sbh (Qi et al. 2023 Table 1: 32 sbh). With tp 2 and no sequence
    parallelism the column-parallel inputs (QKV, fc1) and the row-parallel
    output gradients (projection, fc2) are whole on every rank: 2 + 2 + 2 +
    2 = 8 sbh, the rest halved: (2 + 8 + 6 + 8) / 2 = 12; 20 sbh in all.
    Llama-3-8B (h 4096, q 4096, 8 KV heads of 128, f 14336, no dropout,
    tp 1; in units of s b bytes): inputs 2h + 2q + 2h + 2f, output gradients
    2(q + 2 kv) + 2h + 4f + 2h, all of what the block saved outside the
    attention core."""
    from pipesearch.catalog import resolve
    from pipesearch.hardware import load_device
    from pipesearch.profiles.transformer import layer_table, load_transformer

    dev = load_device("a100-80gb")
    gpt = load_transformer(resolve("model", "gpt3-1.3b"))
    sbh = 2048 * 1 * 2048
    table = layer_table(gpt, seq_len=2048, device=dev, tp=2, tp_link=Link(300e9, 1e-6))
    block = next(x for x in table.layers if x.name.startswith("block"))
    assert block.wgrad_saved_bytes == pytest.approx(20 * sbh)
    llama = load_transformer(resolve("model", "llama3-8b"))
    s, h, q, kv, f = 8192, 4096, 4096, 1024, 14336
    block = next(x for x in layer_table(llama, seq_len=s, device=dev).layers if x.name.startswith("block"))
    need = s * (2 * h + 2 * q + 2 * h + 2 * f + 2 * (q + 2 * kv) + 2 * h + 4 * f + 2 * h)
    assert block.wgrad_saved_bytes == pytest.approx(need)
