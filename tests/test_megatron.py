"""Transformer planning checked against published runs: Megatron-LM SC'21
Table 1 (A100), Megatron-Core's H100 weak-scaling table, and Korthikanti et
al. 2022 Tables 2 and 4 (rows in tests/data/published/, provenance in its
README). One calibration per device type (hardware/devices/*.toml) serves
every row; benchmarks/published_rows.py prints the same comparison."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import sys

from pipesearch.hardware import load_cluster
from pipesearch.memory import preset
from pipesearch.profiles.transformer import (TransformerConfig, layer_table, megatron_flops_eq3, megatron_params_eq2,
                                             palm_model_flops)
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job

DATA = Path(__file__).parent / "data" / "published"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published_rows  # noqa: E402  (the rows' planning, shared with the benchmark table)
ROWS = list(csv.DictReader(open(DATA / "megatron_sc21_table1_sample.csv")))
H100_ROWS = list(csv.DictReader(open(DATA / "megatron_core_h100_sample.csv")))
SEQ, VOCAB = 2048, 51200
HEADROOM = 0.05  # the CLI's default --memory-headroom


def gpt(row, vocab: int = VOCAB, seq: int = SEQ) -> TransformerConfig:
    h = int(row["hidden_size"])
    return TransformerConfig(name=f"gpt-{row['params_billion']}b", num_layers=int(row["num_layers"]), hidden_size=h,
                             num_attention_heads=int(row["attention_heads"]), ffn_hidden_size=4 * h,
                             vocab_size=vocab, seq_len=seq)


def cluster_for(row):
    return load_cluster("2x8-a100-80gb", nodes=int(row["num_gpus"]) // 8)


def predicted_tflops(row, plan) -> float:
    """SC'21 eq. 3 FLOPs / (GPUs x predicted iteration time), TFLOP/s per GPU."""
    flops = megatron_flops_eq3(int(row["global_batch_size"]), SEQ, int(row["num_layers"]),
                               int(row["hidden_size"]), VOCAB)
    return flops / (int(row["num_gpus"]) * plan.predicted.iteration_time_s) / 1e12


def pinned(row):
    """The paper's tp, pp, GPU count and batch, Megatron's even split, full
    recompute, no sequence parallelism, the backward's tensor-parallel
    collectives charged in full (SC'21 describes no overlap of them),
    Megatron's 18 B/param state, its fp16 gradient all-reduce after the
    backward (benchmarks/published_rows.py, the same rows' table)."""
    return published_rows.predict_sc21(row)[1]


def h100_pinned(row):
    """A Megatron-Core H100 row as it ran: published tp, pp, dp and batch,
    Megatron's even split; Megatron state with the distributed optimizer
    (ZeRO-1), the overlap those runs had on; sequence parallelism with tp;
    recompute, micro-batch size and schedule searched."""
    return published_rows.predict_h100(row)[1]


def test_megatron_even_split_by_hand():
    """84 blocks in 2 x 2 chunks: 21 each, the embedding on the first and
    the head on the last; 128 blocks in 64 x 2 chunks: one each; 26 blocks
    do not divide into 4."""
    assert published_rows.megatron_even_split(84, 4) == (22, 21, 21, 22)
    assert published_rows.megatron_even_split(128, 128) == (2,) + (1,) * 126 + (2,)
    assert published_rows.megatron_even_split(26, 4) is None


@pytest.mark.parametrize("row", ROWS, ids=[r["params_billion"] for r in ROWS])
def test_eq2_matches_published_parameter_count(row):
    """SC'21 eq. 2 reproduces the parameter column to the printed precision
    (one decimal: 1.652e9 prints as 1.7)."""
    p = megatron_params_eq2(int(row["num_layers"]), int(row["hidden_size"]), VOCAB, SEQ)
    assert abs(p / 1e9 - float(row["params_billion"])) <= 0.05


@pytest.mark.parametrize("row", ROWS, ids=[r["params_billion"] for r in ROWS])
def test_layer_table_parameters_agree_with_eq2(row):
    """Summed parameters of the layer table (tp=1) within 0.5% of eq. 2."""
    cl = cluster_for(row)
    prof = layer_table(gpt(row), seq_len=SEQ, device=cl.device_spec(0), tp=1, recompute="full")
    params = sum(lay.param_bytes for lay in prof.layers) / prof.bytes_per_param
    assert params == pytest.approx(megatron_params_eq2(int(row["num_layers"]), int(row["hidden_size"]), VOCAB, SEQ),
                                   rel=0.005)


@pytest.mark.parametrize("row", ROWS, ids=[r["params_billion"] for r in ROWS])
def test_sc21_pinned_throughput_within_5_percent_of_published(row):
    """SC'21 Table 1 (A100 80 GB): predicted TFLOP/s per GPU (eq. 3 FLOPs)
    within 5% of the published figure, one A100 calibration for all rows."""
    got = predicted_tflops(row, pinned(row))
    assert got == pytest.approx(float(row["achieved_tflops_per_gpu"]), rel=0.05)


def megatron_model_tflops(row, plan) -> float:
    """Megatron-LM's model FLOPs (no recompute term),
    72 B s l h^2 (1 + s/(6h) + V/(12 l h)), per GPU per second."""
    B, s, l, h, V = (int(row[k]) for k in ("global_batch_size", "seq_len", "num_layers", "hidden_size", "vocab"))
    flops = 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    return flops / (int(row["num_gpus"]) * plan.predicted.iteration_time_s) / 1e12


@pytest.mark.parametrize("row", H100_ROWS, ids=[r["params_billion"] for r in H100_ROWS])
def test_h100_pinned_throughput_within_5_percent_of_published(row):
    """Megatron-Core r0.8.0 on H100 80 GB: predicted model TFLOP/s per GPU
    within 5% of the published figure, one H100 calibration for all rows.
    Those runs overlapped the data-parallel reduce-scatter with the last
    backward, the parameter all-gather with the first forward and the
    tensor-parallel collectives with the GEMMs; the plans model that overlap
    (pipesearch.overlap) and the H100 curve was fitted with it on."""
    plan = h100_pinned(row)
    assert megatron_model_tflops(row, plan) == pytest.approx(float(row["achieved_tflops_per_gpu"]), rel=0.05)
    # the plan's MFU (PaLM's model FLOPs over the dense peak) is the same figure over 989.4 TFLOP/s
    assert plan.predicted.mfu == pytest.approx(megatron_model_tflops(row, plan) / 989.4, rel=1e-9)
    assert plan.predicted.peak_memory_bytes <= 80 * 2**30 * (1 - HEADROOM) - 2**30


def test_palm_model_flops_equal_megatron_count():
    """PaLM's 6N + 12 L H Q T per token (N = 12 l h^2 + V h GEMM parameters)
    is Megatron's 72 s l h^2 (1 + s/(6h) + V/(12 l h)) per sample; for the
    1.7B H100 row (l 24, h 2048, s 4096, V 131072): 6N = 6 (12*24*2048^2 +
    131072*2048) = 8.858e9 and 12 l h s = 2.416e9 per token."""
    cfg = gpt(H100_ROWS[0], 131072, 4096)
    per_token = 6 * (12 * 24 * 2048**2 + 131072 * 2048) + 12 * 24 * 2048 * 4096
    assert palm_model_flops(cfg, 4096) / 4096 == pytest.approx(per_token, rel=1e-12)


#: Korthikanti et al. 2022 Table 4, one layer of the 22B GPT, ms: (sp, recompute) -> (forward, backward)
TABLE4_MS = {
    (False, "none"): (7.7, 11.9),
    (True, "none"): (7.2, 11.8),
    (False, "full"): (7.7, 19.5),
    (False, "selective"): (7.7, 13.2),
    (True, "selective"): (7.2, 13.1),
}


@pytest.mark.parametrize("sp,recompute", list(TABLE4_MS), ids=[f"{r}{'-sp' if sp else ''}" for sp, r in TABLE4_MS])
def test_22b_layer_times_within_10_percent_of_korthikanti_table4(sp, recompute):
    """h 6144, a 64, s 2048, micro-batch 4, tp 8 on DGX A100: forward and
    backward of one block within 10% of Table 4 (backward 1.55x forward, not
    2x plus collectives: they run under the weight-gradient GEMMs)."""
    cl = load_cluster("1x8-a100-80gb")
    cfg = TransformerConfig(name="gpt-22b", num_layers=48, hidden_size=6144, num_attention_heads=64,
                            ffn_hidden_size=4 * 6144, vocab_size=51200, seq_len=2048)
    block = layer_table(cfg, device=cl.device_spec(0), tp=8, sequence_parallel=sp, recompute=recompute,
                        tp_link=cl.intra_node, micro_batch_size=4).layers[1]
    fwd, bwd = TABLE4_MS[(sp, recompute)]
    assert block.fwd_s * 1e3 == pytest.approx(fwd, rel=0.10)
    assert block.bwd_s * 1e3 == pytest.approx(bwd, rel=0.10)


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS[:2], ids=[r["params_billion"] for r in ROWS[:2]])
def test_unpinned_search_at_least_matches_pinned(row):
    """Free search (tp, pp, dp, micro-batch, schedule, recompute) on the same
    GPUs predicts at least the pinned configuration's throughput and fits in
    80 GB per GPU. (The 1T row is checked pinned only: its free search is the
    benchmark's job.)"""
    cl = cluster_for(row)
    base = pinned(row)
    variants = []
    for tp in (1, 2, 4, 8):
        for mode in ("none", "selective", "full"):
            prof = layer_table(gpt(row), seq_len=SEQ, device=cl.device_spec(0), tp=tp, sequence_parallel=tp > 1,
                               recompute=mode, tp_link=cl.intra_node, overlap_tp_backward=False)
            variants.append(ModelVariant(prof, tp=tp, recompute=mode))
    job = Job(int(row["global_batch_size"]), param_state=preset("megatron"), memory_headroom_fraction=HEADROOM,
              grad_bytes_per_param=published_rows.SC21_GRAD_BYTES)
    free = search(variants, cl, job, SearchOptions(top=1)).plans[0]
    assert free.predicted.samples_per_s >= base.predicted.samples_per_s * (1 - 1e-9)
    assert free.predicted.peak_memory_bytes <= 80 * 2**30


def test_heavy_head_gets_fewer_blocks_on_last_stage():
    """A model whose LM head costs 3 blocks, pp=4.

    Layers: embedding (about 0), 12 blocks (1 unit each), head (3 units).
    The runtime's even split (Megatron: 12 blocks / 4 = 3 per stage, the
    embedding with the first, the head with the last) is (4, 3, 3, 4) layers
    costing 3, 3, 3, 6 units: bottleneck 6. 15 units over 4 stages need a
    bottleneck of at least 15/4, so 4 whole units: e.g. [emb + 4 | 4 | 3 |
    1 + head]. The best split therefore keeps at most one block with the head,
    and with m = 64 micro-batches its time is about 4/6 of the even split's.
    """
    h, s, a = 1024, 1024, 16
    # block forward FLOPs ~ 24*s*h^2 + 4*s^2*h; head 2*s*h*V -> V = 3 * block / (2 s h)
    block = 24 * s * h * h + 4 * s * s * h
    V = int(3 * block / (2 * s * h))
    cfg = TransformerConfig(name="heavy-head", num_layers=12, hidden_size=h, num_attention_heads=a,
                            ffn_hidden_size=4 * h, vocab_size=V, seq_len=s, tied_embeddings=False)
    cl = load_cluster("1x8-a100-80gb")
    prof = layer_table(cfg, seq_len=s, device=cl.device_spec(0), recompute="none")
    names = [lay.name for lay in prof.layers]
    assert names[0] == "embedding" and names[-1] == "head"
    head = prof.layers[-1]
    blk = prof.layers[1]
    assert (head.fwd_s + head.bwd_s) / (blk.fwd_s + blk.bwd_s) == pytest.approx(3.0, rel=0.05)
    opts = SearchOptions(pp=4, dp=1, micro_batch_size=1, schedules=("1f1b",), top=1)
    job = Job(global_batch_size=64)
    best = search([ModelVariant(prof)], cl, job, opts).plans[0]
    blocks_last = sum(1 for n in best.stages[-1].layer_names if n.startswith("block_"))
    assert blocks_last <= 1
    even = (4, 3, 3, 4)  # embedding + 3 blocks | 3 | 3 | 3 blocks + head
    even_plan = search([ModelVariant(prof)], cl, job, SearchOptions(
        pp=4, dp=1, micro_batch_size=1, schedules=("1f1b",), top=1, split=even)).plans[0]
    assert best.predicted.iteration_time_s < even_plan.predicted.iteration_time_s * 0.8


def _hf_config(tmp_path, **over):
    """A small Qwen2-style config.json (h 896, 14 heads, 2 KV heads of 64,
    4 blocks), written to tmp_path."""
    import json

    cfg = {"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
           "num_hidden_layers": 4, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
           "max_position_embeddings": 32768, "tie_word_embeddings": True, "rope_theta": 1000000.0,
           "rms_norm_eps": 1e-06} | over
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_hf_config_flags_build_the_same_model_in_megatron(tmp_path):
    """Qwen2's attention has Q/K/V biases (no config key says so) and no
    other linear biases: --disable-bias-linear --add-qkv-bias; its rotary
    base and norm epsilon are passed (Megatron's defaults are 10000 and
    1e-5); 4 x (896 + 2 x 2 x 64) = 4,608 more parameters than without the
    biases. Qwen3 adds --qk-layernorm. A Llama config with attention_bias
    and mlp_bias has every linear biased (no --disable-bias-linear)."""
    from dataclasses import asdict, replace

    from pipesearch.errors import InputError
    from pipesearch.export.megatron import model_args
    from pipesearch.profiles.transformer import load_transformer, parameter_count

    cfg = load_transformer(_hf_config(tmp_path), seq_len=2048)
    assert cfg.qkv_bias and not cfg.bias and not cfg.qk_norm
    assert parameter_count(cfg) - parameter_count(replace(cfg, qkv_bias=False)) == 4 * (896 + 2 * 2 * 64)
    args, _ = model_args(asdict(cfg), 2048)
    joined = " ".join(args)
    assert "--disable-bias-linear --add-qkv-bias" in joined
    assert "--rotary-base 1000000" in joined and "--norm-epsilon 1e-06" in joined and "--qk-layernorm" not in args
    q3 = load_transformer(_hf_config(tmp_path, model_type="qwen3", head_dim=128), seq_len=2048)
    assert "--qk-layernorm" in model_args(asdict(q3), 2048)[0] and not q3.qkv_bias
    biased = load_transformer(_hf_config(tmp_path, model_type="llama", attention_bias=True, mlp_bias=True),
                              seq_len=2048)
    flags = model_args(asdict(biased), 2048)[0]
    assert "--disable-bias-linear" not in flags and "--add-qkv-bias" not in flags
    # MLP biases alone: every linear biased (Megatron cannot bias the MLP alone), none lost
    mlp_only = load_transformer(_hf_config(tmp_path, model_type="llama", mlp_bias=True), seq_len=2048)
    assert mlp_only.bias and "--disable-bias-linear" not in model_args(asdict(mlp_only), 2048)[0]
    # Megatron-LM's --rotary-base is an integer: a fractional base is rounded, and a note says so
    frac = load_transformer(_hf_config(tmp_path, rope_theta=1000000.7), seq_len=2048)
    args, notes = model_args(asdict(frac), 2048)
    assert "--rotary-base 1000001" in " ".join(args) and any("rounded" in n or "written as" in n for n in notes)
    with pytest.raises(InputError, match="attention_bias"):
        load_transformer(_hf_config(tmp_path, model_type="llama", attention_bias="false"), seq_len=2048)


def test_llama31_rope_scaling_reaches_the_megatron_flags(tmp_path):
    """Llama 3.1's config scales its rotary frequencies (``rope_scaling``:
    ``rope_type`` llama3, factor 8); Megatron-LM builds that model only with
    ``--use-rope-scaling --rope-scaling-factor 8`` (its llama3 scaling, with
    Llama 3.1's low / high frequency factors 1 and 4 and 8192 original
    positions): the export dropped it, training another model. From a
    HuggingFace config and from the catalog's llama3.1-8b alike; Llama 3
    (no scaling) gets neither flag, and another kind of scaling a note."""
    from dataclasses import asdict

    from pipesearch.catalog import resolve
    from pipesearch.export.megatron import model_args
    from pipesearch.profiles.transformer import load_transformer

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    hf = load_transformer(_hf_config(tmp_path, model_type="llama", rope_scaling=scaling), seq_len=2048)
    catalog = load_transformer(resolve("model", "llama3.1-8b"))
    for cfg in (hf, catalog):
        assert (cfg.rope_scaling_type, cfg.rope_scaling_factor) == ("llama3", 8.0)
        args = model_args(asdict(cfg), 2048)[0]
        at = args.index("--use-rope-scaling")
        assert args[at + 1:at + 3] == ["--rope-scaling-factor", "8"]
    plain = model_args(asdict(load_transformer(resolve("model", "llama3-8b"))), 2048)[0]
    assert "--use-rope-scaling" not in plain and "--rope-scaling-factor" not in plain
    yarn = load_transformer(_hf_config(tmp_path, model_type="llama", rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                            seq_len=2048)
    args, notes = model_args(asdict(yarn), 2048)
    assert "--use-rope-scaling" not in args and any("'yarn'" in n for n in notes)
    # an integer linear factor: Megatron divides the positions by it
    lin = load_transformer(_hf_config(tmp_path, model_type="llama", rope_scaling={"rope_type": "linear", "factor": 4}),
                           seq_len=2048)
    args = model_args(asdict(lin), 2048)[0]
    at = args.index("--rotary-seq-len-interpolation-factor")
    assert args[at + 1] == "4" and "--use-rope-scaling" not in args
