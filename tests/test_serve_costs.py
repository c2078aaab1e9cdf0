"""Serving cost model against hand-derived values (model cards: layers,
heads, widths; the engines' memory rules as documented in
docs/serving_costs.md)."""

from __future__ import annotations

import math

import numpy as np

import pytest

from pipesearch.catalog import resolve
from pipesearch.profiles.transformer import load_transformer
from pipesearch.serve.costs import ServeCosts
from pipesearch.serve.dtypes import weight_format
from pipesearch.serve.engine import default_split, engine_spec
from pipesearch.serve.pipeline import ServePipeline
from pipesearch.serve.split import max_pool_split, stage_capacities
from pipesearch.types import DeviceSpec, Link

GIB = 2**30
NVLINK = Link(300e9, 5e-6)


def device(memory_bytes=24 * GIB):
    return DeviceSpec("test-24gib", memory_bytes, 121e12, 30e12, 300e9, 0.5)


def costs(model, tp=1, weights="bf16", kv=2.0, engine="vllm", **eng):
    cfg = load_transformer(resolve("model", model))
    return ServeCosts(cfg, device(), tp, weight_format(weights), kv, engine_spec(engine, **eng), NVLINK, GIB)


def test_kv_bytes_per_token_llama2_70b():
    # 80 layers x 2 (K and V) x 8 KV heads x head dim 128 x 2 bytes (bf16)
    c = costs("llama2-70b")
    assert c.kv_bytes_per_token_layer * c.num_layers == 2 * 8 * 128 * 2 * 80 == 327_680


def test_kv_heads_split_then_replicated_past_the_kv_heads():
    # tp 8: one KV head per rank (8 ranks x 1 head = 8 heads, the whole cache once)
    assert costs("llama2-70b", tp=8).kv_bytes_per_token_layer * 8 == 2 * 8 * 128 * 2
    # tp 16 > 8 KV heads: every rank still holds one whole head (vLLM replicates)
    c16 = costs("llama2-70b", tp=16)
    assert c16.kv_heads_per_rank == 1
    assert c16.kv_bytes_per_token_layer == 2 * 1 * 128 * 2
    # fp8 KV halves it
    assert costs("llama2-70b", kv=1.0).kv_bytes_per_token_layer == 2 * 8 * 128 * 1


def test_kv_projections_replicated_past_the_kv_heads():
    """Llama-2-70B (h 8192, 64 query heads, 8 KV heads of 128, no biases),
    bf16. At tp 8 a rank holds 1/8 of every GEMM; at tp 16 its query, output
    and MLP shares halve again, but its K and V projections stay one whole
    head, 2 x 8192 x 128 parameters, where an even split would give half a
    head: 2 x 8192 x 128 / 2 = 1,048,576 parameters (2 MiB in bf16) more
    per block than an even split by 16."""
    gemm = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    norms = 2 * 8192 * 2
    assert costs("llama2-70b", tp=8).block_weight_bytes == gemm / 8 * 2 + norms
    assert costs("llama2-70b", tp=16).block_weight_bytes == gemm / 16 * 2 + 2 * 8192 * 128 // 2 * 2 + norms


def test_stage_weights_llama3_70b_fp8():
    # a block: q, k, v, o = 8192*8192 + 2*8192*1024 + 8192*8192; MLP 3*8192*28672;
    # two RMSNorm weights 2*8192 (16-bit); fp8 GEMM weights 1 byte each
    gemm = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    assert gemm == 855_638_016
    block = gemm * 1 + 2 * 8192 * 2
    emb = 128256 * 8192 * 2  # 128256 = 2004 * 64: no padding rows; embedding stays 16-bit
    c = costs("llama3-70b", weights="fp8")
    assert c.block_weight_bytes == block
    assert c.stage_weight_bytes(10, True, False) == 10 * block + emb
    assert c.stage_weight_bytes(10, False, False) == 10 * block
    assert c.stage_weight_bytes(10, False, True) == 10 * block + emb + 8192 * 2  # LM head + final norm
    assert c.stage_weight_bytes(80, True, True) == 80 * block + 2 * emb + 8192 * 2
    # tp 4 splits GEMMs and vocabulary rows, not the norms
    c4 = costs("llama3-70b", weights="fp8", tp=4)
    assert c4.block_weight_bytes == gemm / 4 + 2 * 8192 * 2
    assert c4.embedding_bytes == 128256 // 4 * 8192 * 2


def test_int4_weight_size():
    # 4 bits + one fp16 scale and one 4-bit zero per group of 128
    assert weight_format("int4").gemm_bytes_per_param == pytest.approx(0.5 + 2.5 / 128)


def test_tied_embeddings_on_both_end_stages():
    c = costs("gpt3-1.3b")  # tied input / output embeddings
    assert c.cfg.tied_embeddings
    only = c.stage_weight_bytes(1, True, True) - c.block_weight_bytes
    first = c.stage_weight_bytes(1, True, False) - c.block_weight_bytes
    last = c.stage_weight_bytes(1, False, True) - c.block_weight_bytes
    assert first == c.embedding_bytes
    assert last == c.head_matrix_bytes + c.final_norm_bytes  # the last stage keeps its own copy
    assert only == c.embedding_bytes + c.final_norm_bytes  # one copy when one stage holds both


def _vllm_budget(last):
    """0.9 x 24 GiB, less the 1 GiB reserve and the activation peak of a
    2048-token profiling pass: 2048 x 2 B x (2 x 8192 + 3 x 28672); the last
    stage also keeps 256 x 128256 fp32 logits."""
    act = 2048 * 2 * (2 * 8192 + 3 * 28672)
    assert act == 419_430_400
    out = 0.9 * 24 * GIB - GIB - act
    return out - 256 * 128256 * 4 if last else out


def _kv_tokens(free, blocks):
    per_block = 16 * blocks * 2 * 8 * 128 * 2  # 16-token blocks, bf16 KV
    return math.floor(free / per_block) * 16


def test_pool_even_vs_uneven_llama3_70b_fp8_on_8x24gib():
    block = 855_638_016 + 2 * 8192 * 2
    emb = 128256 * 8192 * 2
    head = emb + 8192 * 2
    c = costs("llama3-70b", weights="fp8")
    pipe = ServePipeline(c, 8, (NVLINK,) * 7)
    cap = stage_capacities(pipe)

    def by_hand(split):
        out = []
        for s, n in enumerate(split):
            extra = (emb if s == 0 else 0) + (head if s == 7 else 0)
            out.append(_kv_tokens(_vllm_budget(s == 7) - n * block - extra, n))
        return out

    even = (10,) * 8
    uneven = (9, 11, 10, 10, 10, 10, 11, 9)
    even_kv = by_hand(even)
    uneven_kv = by_hand(uneven)
    assert even_kv == [269_568, 320_864, 320_864, 320_864, 320_864, 320_864, 320_864, 266_352]
    assert uneven_kv[0] == 322_720 and uneven_kv[1] == 272_704 and uneven_kv[-1] == 319_168
    assert [int(cap[s, n]) for s, n in enumerate(even)] == even_kv
    assert [int(cap[s, n]) for s, n in enumerate(uneven)] == uneven_kv
    # the engine's pool is the minimum: even 266,352 < uneven 272,704
    assert min(even_kv) == 266_352 < min(uneven_kv) == 272_704
    # vLLM's default for 80 layers on 8 stages is the even split; the best
    # pool any split reaches is at least the uneven one's
    assert default_split("vllm", 80, 8) == even
    pool, split = max_pool_split(pipe)
    assert pool >= 272_704 and sum(split) == 80


def test_pool_llama2_70b_bf16_on_8x24gib_even_beats_moving_end_layers():
    """Llama-2's 32,000-row embedding (0.52 GB) is lighter than the budget
    over (n + 1) layers, so moving a layer off each end stage onto a middle
    one shrinks the pool: the even split's pool is the larger here."""
    block = 855_638_016 * 2 + 2 * 8192 * 2
    emb = 32000 * 8192 * 2
    head = emb + 8192 * 2
    c = costs("llama2-70b", engine="sglang", memory_fraction=1.0)  # budget: 24 GiB, token granularity
    pipe = ServePipeline(c, 8, (NVLINK,) * 7)
    cap = stage_capacities(pipe)
    per_token = 2 * 8 * 128 * 2

    def tokens(s, n):
        extra = (emb if s == 0 else 0) + (head if s == 7 else 0)
        return math.floor((24 * GIB - n * block - extra) / (n * per_token))

    assert tokens(0, 10) == 198_545 and tokens(3, 10) == 211_345 and tokens(7, 10) == 198_545
    assert tokens(1, 11) == 154_150
    for split in ((10,) * 8, (9, 11, 10, 10, 10, 10, 11, 9)):
        assert [int(cap[s, n]) for s, n in enumerate(split)] == [tokens(s, n) for s, n in enumerate(split)]
    assert min(tokens(s, 10) for s in range(8)) == 198_545 > 154_150


def test_default_splits_follow_the_engines_rules():
    # vLLM: L // p each, the remainder one each to the stages before the last
    assert default_split("vllm", 61, 4) == (15, 15, 16, 15)
    assert default_split("vllm", 62, 4) == (15, 16, 16, 15)
    assert default_split("vllm", 63, 4) == (16, 16, 16, 15)
    # SGLang (get_pp_indices since 2025): L // p each, one more each on the last L mod p stages
    assert default_split("sglang", 63, 4) == (15, 16, 16, 16)
    assert default_split("sglang", 61, 4) == (15, 15, 15, 16)
    assert default_split("sglang", 26, 8) == (3, 3, 3, 3, 3, 3, 4, 4)
    assert default_split("vllm", 80, 1) == (80,)


def test_llama3_70b_bf16_on_catalog_l4_default_pool_vs_planned():
    """8 x L4 (nvidia-smi: 23034 MiB), vLLM defaults, bf16 weights and KV.
    Budget 0.9 x 23034 MiB less 1 GiB, the 2048-token activation peak and
    (last stage) 256 x 128256 fp32 logits; blocks of 16 tokens."""
    from pipesearch.hardware import load_cluster
    from pipesearch.serve.pipeline import Workload
    from pipesearch.serve.search import ServeJob, search_serving

    memory = 23034 * 2**20
    act = 2048 * 2 * (2 * 8192 + 3 * 28672)
    mid_budget = 0.9 * memory - GIB - act
    last_budget = mid_budget - 256 * 128256 * 4
    block = 855_638_016 * 2 + 2 * 8192 * 2
    head = 128256 * 8192 * 2 + 8192 * 2
    kv_token_layer = 2 * 8 * 128 * 2
    # vLLM's 10 x 8: the last stage (10 blocks + LM head) limits the pool
    default_last = math.floor((last_budget - 10 * block - head) / (16 * 10 * kv_token_layer)) * 16
    assert default_last == 21_936
    # an 11-block middle stage of the planned split
    eleven = math.floor((mid_budget - 11 * block) / (16 * 11 * kv_token_layer)) * 16
    assert eleven == 31_504
    cfg = load_transformer(resolve("model", "llama3-70b"))
    r = search_serving(cfg, load_cluster("1x8-l4"), ServeJob(Workload(1024, 256)), engine=engine_spec("vllm"),
                       weights=weight_format("bf16"), kv_bytes=2.0, tp=1, pp=8)
    plan = r.plans[0]
    assert plan.default_pool_tokens == default_last
    assert plan.pool_tokens >= eleven > default_last
    assert plan.total_output_tokens_per_s > plan.default_total_output_tokens_per_s


def test_fp8_weight_gemms_at_the_fp8_peak_where_there_is_one():
    from pipesearch.hardware import load_device

    cfg = load_transformer(resolve("model", "llama3-70b"))
    l4, a10 = load_device("l4-24gb"), load_device("a10-24gb")  # FP8 tensor cores: L4 yes (242.5 dense), A10 no

    def layer(dev, weights):
        c = ServeCosts(cfg, dev, 1, weight_format(weights), 2.0, engine_spec("vllm"), NVLINK, GIB)
        return c.layer_s(0, 0.0, 2048, 2048)

    # a 2048-token prompt in one step: compute-bound; GEMMs 2 x 2048 x 855,638,016 FLOPs,
    # attention 4 x 8192 x 2048 x 2048 / 2 FLOPs at the 16-bit rate; achieved fraction 0.5
    gemm, attn = 2 * 2048 * 855_638_016, 4 * 8192 * 2048 * 2048 / 2
    assert layer(l4, "fp8") == pytest.approx(gemm / (242.5e12 * 0.5) + attn / (121e12 * 0.5), rel=1e-12)
    assert layer(l4, "bf16") == pytest.approx((gemm + attn) / (121e12 * 0.5), rel=1e-12)
    assert layer(a10, "fp8") == pytest.approx((gemm + attn) / (125e12 * 0.5), rel=1e-12)


def test_replicated_kv_heads_carry_their_qkv_biases():
    """A Qwen2-style block (Q/K/V biases, no other bias): past the KV heads
    a rank holds whole K and V heads with their biases, ``2 (h + 1) d``
    parameters each; counted from ``bias`` alone they had none. By hand:
    h 4096, 32 query heads, 4 KV heads of 128, MLP 11008 (gated), tp 8:
    half a KV head more per rank than an even split."""
    from pipesearch.profiles.transformer import TransformerConfig

    cfg = TransformerConfig(name="qwen-like", num_layers=2, hidden_size=4096, num_attention_heads=32,
                            ffn_hidden_size=11008, vocab_size=32000, seq_len=4096, num_kv_heads=4, gated_mlp=True,
                            position_embedding="rotary", norm="rmsnorm", bias=False, qkv_bias=True, dropout=False,
                            tied_embeddings=False)
    c = ServeCosts(cfg, device(), 8, weight_format("bf16"), 2.0, engine_spec("vllm"), NVLINK, GIB)
    split = 4096 * 4096 * 2 + 2 * 4096 * 512 + 3 * 4096 * 11008 + (4096 + 2 * 512)  # GEMMs and the Q/K/V biases
    replicas = 0.5 * 2 * (4096 + 1) * 128  # one whole KV head per rank where 4 / 8 would be half of one
    assert c.block_weight_bytes == (split / 8 + replicas) * 2 + 2 * 4096 * 2  # bf16, the two norms whole


def test_engines_all_reduce_over_nvswitch_by_hand():
    """On NVSwitch (every pair of GPUs linked) the engines' own all-reduce:
    one-shot ``lat + (t-1) x / bw`` for a decode step's 16 KiB at t = 8
    (under 256 KiB), two-shot ``2 lat + 2 (t-1)/t x / bw`` for 1 MiB, and
    two switch hops too from 8 MiB on and at t = 3 (what takes them there:
    FlashInfer, symmetric memory, NCCL over the switch); NCCL's ring ``2
    (t-1)/t x / bw + 2 (t-1) lat`` without NVSwitch; t = 2 is one-shot up to
    8 MiB."""
    from pipesearch.serve.costs import allreduce_s
    from pipesearch.types import Link

    bw, lat = 300e9, 5e-6
    switch, ring_only = Link(bw, lat, nvswitch=True), Link(bw, lat)

    def ring(x, t):
        return 2 * (t - 1) / t * x / bw + 2 * (t - 1) * lat

    kib, mib = 2**10, 2**20
    assert allreduce_s(16 * kib, 8, switch) == pytest.approx(lat + 7 * 16 * kib / bw, rel=1e-12)
    assert allreduce_s(1 * mib, 8, switch) == pytest.approx(2 * lat + 2 * 7 / 8 * mib / bw, rel=1e-12)
    assert allreduce_s(300 * kib, 4, switch) == pytest.approx(lat + 3 * 300 * kib / bw, rel=1e-12)  # < 512 KiB
    assert allreduce_s(8 * mib, 8, switch) == pytest.approx(2 * lat + 2 * 7 / 8 * 8 * mib / bw, rel=1e-12)
    assert allreduce_s(16 * kib, 3, switch) == pytest.approx(2 * lat + 2 * 2 / 3 * 16 * kib / bw, rel=1e-12)
    assert allreduce_s(16 * kib, 8, ring_only) == pytest.approx(ring(16 * kib, 8), rel=1e-12)
    assert allreduce_s(4 * mib, 2, switch) == pytest.approx(lat + 4 * mib / bw, rel=1e-12)
    arr = allreduce_s(np.array([16 * kib, 1 * mib, 8 * mib]), 8, switch)
    assert arr == pytest.approx([lat + 7 * 16 * kib / bw, 2 * lat + 2 * 7 / 8 * mib / bw,
                                 2 * lat + 2 * 7 / 8 * 8 * mib / bw], rel=1e-12)
