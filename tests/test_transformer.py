"""Tests of pipesearch.profiles.transformer: configs, loaders, parameter counts,
FLOPs and activation memory against the published closed forms.

Right-hand sides are computed independently of the module: by inline
arithmetic from the papers' formulas (Narayanan et al. SC'21 eq. 2 and 3,
Korthikanti et al. 2022 Table 2) or from published parameter counts.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.errors import InputError
from pipesearch.profiles.transformer import (
    TransformerConfig,
    forward_flops,
    is_transformer_toml,
    layer_table,
    load_hf_config,
    load_transformer,
    load_transformer_toml,
    megatron_flops_eq3,
    megatron_params_eq2,
    padded_vocab_size,
    parameter_count,
    tied_embedding_param_bytes,
    tied_layers,
)
from pipesearch.types import DeviceSpec, Link

CATALOG = Path(__file__).resolve().parent.parent / "cost_models"

A100 = DeviceSpec(
    name="a100-80gb",
    memory_bytes=80 * 2**30,
    peak_fp16_flops=312e12,
    peak_fp32_flops=19.5e12,
    hbm_bandwidth_bytes_per_s=2.039e12,
    achieved_fraction=0.5,
)
NVLINK = Link(bandwidth_bytes_per_s=300e9, latency_s=5e-6)


def gpt(l: int, h: int, a: int, V: int = 51200, s: int = 2048, name: str = "gpt") -> TransformerConfig:
    """A GPT-3-style config as SC'21 and Korthikanti et al. assume it."""
    return TransformerConfig(
        name=name, num_layers=l, hidden_size=h, num_attention_heads=a, ffn_hidden_size=4 * h,
        vocab_size=V, seq_len=s, kind="decoder", tied_embeddings=True,
        position_embedding="learned", norm="layernorm", bias=True, dropout=True,
    )


def blocks(profile):
    return [x for x in profile.layers if x.name.startswith("block_")]


# --------------------------------------------------------------------------- #
# SC'21 Table 1 rows: parameters (eq. 2) and FLOPs (eq. 3)

SC21_ROWS = [  # (billions as printed in Table 1, l, h, a)
    (1.7, 24, 2304, 24),
    (39.1, 48, 8192, 64),
    (1008, 128, 25600, 160),
]


@pytest.mark.parametrize("billions,l,h,a", SC21_ROWS)
def test_eq2_reproduces_sc21_table1(billions, l, h, a):
    p = megatron_params_eq2(l, h, 51200, 2048)
    # inline: 12 l h^2 + 13 l h + (V + s) h
    assert p == pytest.approx(12 * l * h * h + 13 * l * h + (51200 + 2048) * h, rel=1e-12)
    digits = 0 if billions >= 1000 else 1
    assert round(p / 1e9, digits) == billions


@pytest.mark.parametrize("billions,l,h,a", SC21_ROWS)
def test_parameter_count_agrees_with_eq2(billions, l, h, a):
    cfg = gpt(l, h, a)
    eq2 = 12 * l * h**2 * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * l * h))
    assert parameter_count(cfg) == pytest.approx(eq2, rel=0.005)
    # the only difference is the final LayerNorm (2h), which eq. 2 leaves out
    assert parameter_count(cfg) - eq2 == pytest.approx(2 * h, abs=1e-3 * h)


@pytest.mark.parametrize("billions,l,h,a", SC21_ROWS)
def test_layer_table_flops_match_eq3(billions, l, h, a):
    """Summed FLOPs of the table (tp=1, full recomputation, batch 1) vs eq. 3.
    Eq. 3 counts the GEMMs only (ignores element-wise work: norms, softmax,
    GeLU, dropout, and bias additions); the table counts the same GEMMs, so it
    agrees to rounding; the 1% tolerance is the paper's own approximation
    level should element-wise terms ever be added."""
    s, V = 2048, 51200
    prof = layer_table(gpt(l, h, a), seq_len=s, device=A100, recompute="full")
    total = sum(x.flops for x in prof.layers)
    eq3 = 96 * 1 * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert total == pytest.approx(eq3, rel=0.01)
    assert total == pytest.approx(megatron_flops_eq3(1, s, l, h, V), rel=1e-9)
    # without recomputation: 3 passes of everything, 72 B s l h^2 (1 + s/6h + V/(12 l h))
    prof = layer_table(gpt(l, h, a), seq_len=s, device=A100, recompute="none")
    total = sum(x.flops for x in prof.layers)
    assert total == pytest.approx(72 * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h)), rel=1e-9)


def test_flops_are_split_by_tp():
    cfg = gpt(24, 2304, 24)
    one = layer_table(cfg, seq_len=2048, device=A100, recompute="full")
    eight = layer_table(cfg, seq_len=2048, device=A100, recompute="full", tp=8, tp_link=NVLINK)
    assert sum(x.flops for x in eight.layers) * 8 == pytest.approx(sum(x.flops for x in one.layers), rel=1e-12)


# --------------------------------------------------------------------------- #
# Korthikanti et al. 2022 Table 2, 22B configuration

S, H, A, T = 2048, 6144, 64, 8
K22 = gpt(48, H, A, s=S, name="22b")


def _saved(**kw):
    prof = layer_table(K22, seq_len=S, device=A100, tp_link=NVLINK, **kw)
    values = {x.saved_bytes for x in blocks(prof)}
    assert len(values) == 1  # every block the same
    return values.pop()


def test_saved_no_parallelism():
    assert _saved(tp=1) == pytest.approx(2048 * 6144 * (34 + 5 * 64 * 2048 / 6144), rel=1e-12)


def test_saved_tensor_parallel():
    expect = 2048 * 6144 * (10 + 24 / 8 + 5 * 64 * 2048 / (6144 * 8))
    assert _saved(tp=T) == pytest.approx(expect, rel=1e-12)


def test_saved_tensor_and_sequence_parallel():
    expect = 2048 * 6144 * (34 / 8 + 5 * 64 * 2048 / (6144 * 8))
    assert _saved(tp=T, sequence_parallel=True) == pytest.approx(expect, rel=1e-12)


def test_saved_selective_recompute():
    assert _saved(tp=T, sequence_parallel=True, recompute="selective") == pytest.approx(
        2048 * 6144 * 34 / 8, rel=1e-12)
    assert _saved(tp=T, recompute="selective") == pytest.approx(2048 * 6144 * (10 + 24 / 8), rel=1e-12)
    assert _saved(tp=1, recompute="selective") == pytest.approx(2048 * 6144 * 34, rel=1e-12)


def test_saved_full_recompute():
    assert _saved(tp=T, recompute="full") == pytest.approx(2 * 2048 * 6144, rel=1e-12)
    assert _saved(tp=1, recompute="full") == pytest.approx(2 * 2048 * 6144, rel=1e-12)
    # with sequence parallelism the kept block input is the sequence shard
    assert _saved(tp=T, sequence_parallel=True, recompute="full") == pytest.approx(2 * 2048 * 6144 / 8)


def test_saved_bytes_scale_with_micro_batch():
    one = layer_table(K22, seq_len=S, device=A100, tp=T, tp_link=Link(300e9, 0.0))
    four = layer_table(K22, seq_len=S, device=A100, tp=T, tp_link=Link(300e9, 0.0), micro_batch_size=4)
    assert four.profiled_batch_size == 4
    for x, y in zip(one.layers, four.layers):
        # every term is linear in b (latency 0 here: per-message latency is not)
        for attr in ("fwd_s", "bwd_s", "bwd_input_s", "output_bytes", "saved_bytes", "flops"):
            assert getattr(y, attr) == pytest.approx(4 * getattr(x, attr), rel=1e-12), (x.name, attr)
        assert y.param_bytes == x.param_bytes


def test_embedding_and_head_saved_bytes():
    prof = layer_table(K22, seq_len=S, device=A100, tp=T, tp_link=NVLINK)
    V = 51200
    head = prof.layers[-1]
    assert head.name == "head"
    assert head.saved_bytes == pytest.approx(2 * 2 * S * H + 4 * S * V / T)
    assert prof.layers[0].saved_bytes == pytest.approx(S * H + 8 * S)  # dropout mask, int64 ids
    sp = layer_table(K22, seq_len=S, device=A100, tp=T, tp_link=NVLINK, sequence_parallel=True)
    assert sp.layers[-1].saved_bytes == pytest.approx((2 * 2 * S * H + 4 * S * V) / T)


# --------------------------------------------------------------------------- #
# the rest of the table


def test_layer_names_and_profile_fields():
    prof = layer_table(K22, seq_len=S, device=A100)
    names = [x.name for x in prof.layers]
    assert names[0] == "embedding" and names[-1] == "head"
    assert names[1:-1] == [f"block_{i:02d}" for i in range(48)]
    assert prof.profiled_batch_size == 1
    assert prof.profiled_device == "a100-80gb"
    assert prof.bytes_per_param == 2
    assert "tied_with=head:embedding" in prof.source
    big = layer_table(gpt(128, 2560, 20, s=2048), device=A100)
    assert big.layers[1].name == "block_000" and big.layers[-2].name == "block_127"


def test_times_single_device():
    s, h, V = S, H, 51200
    prof = layer_table(K22, seq_len=s, device=A100)
    rate = 312e12 * 0.5
    block_fwd = 24 * s * h * h + 4 * s * s * h
    b0 = prof.layers[1]
    assert b0.fwd_s == pytest.approx(block_fwd / rate, rel=1e-12)
    assert b0.bwd_s == pytest.approx(2 * block_fwd / rate, rel=1e-12)
    # input gradient: weight GEMMs once, attention core (no weights) twice
    assert b0.bwd_input_s == pytest.approx((24 * s * h * h + 2 * 4 * s * s * h) / rate, rel=1e-12)
    head = prof.layers[-1]
    assert head.fwd_s == pytest.approx(2 * s * h * V / rate, rel=1e-12)
    assert head.bwd_input_s == pytest.approx(head.fwd_s, rel=1e-12)
    assert prof.layers[0].fwd_s == 0 and prof.layers[0].bwd_s == 0
    full = layer_table(K22, seq_len=s, device=A100, recompute="full").layers[1]
    assert full.bwd_s == pytest.approx(3 * block_fwd / rate, rel=1e-12)
    sel = layer_table(K22, seq_len=s, device=A100, recompute="selective").layers[1]
    assert sel.bwd_s == pytest.approx((2 * block_fwd + 4 * s * s * h) / rate, rel=1e-12)
    assert sel.flops == pytest.approx(3 * block_fwd + 4 * s * s * h, rel=1e-12)


def test_tensor_parallel_communication():
    s, h, t = S, H, T
    rate = 312e12 * 0.5
    bw, lat = NVLINK.bandwidth_bytes_per_s, NVLINK.latency_s
    msg = s * h * 2
    allreduce = 2 * (t - 1) / t * msg / bw + 2 * (t - 1) * lat
    block_fwd = (24 * s * h * h + 4 * s * s * h) / t / rate
    # the weight gradients of the column-parallel GEMMs, QKV (6 s h^2 FLOPs) and fc1 (8 s h^2), each under
    # which Megatron's async reduction of that GEMM's input gradient runs: 0.37 and 0.50 ms here, more than one
    # all-reduce (0.22 ms): hidden when overlapped
    qkv, fc1 = 6 * s * h * h / t / rate, 8 * s * h * h / t / rate
    assert min(qkv, fc1) > allreduce
    for sp in (False, True):
        prof = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=NVLINK, sequence_parallel=sp,
                           overlap_tp_backward=False)
        b0 = prof.layers[1]
        assert b0.fwd_s == pytest.approx(block_fwd + 2 * allreduce, rel=1e-12)
        assert b0.output_bytes == pytest.approx(msg / (t if sp else 1))
        full = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=NVLINK, sequence_parallel=sp,
                           recompute="full", overlap_tp_backward=False).layers[1]
        # with sp, each column-parallel GEMM (QKV, fc1) also gathers its sequence-sharded saved input for its
        # weight gradient: two all-gathers of a block's input, one all-reduce's time
        gathers = allreduce if sp else 0.0
        assert b0.bwd_s == pytest.approx(2 * block_fwd + 2 * allreduce + gathers, rel=1e-12)
        assert full.bwd_s == pytest.approx(3 * block_fwd + 4 * allreduce + gathers, rel=1e-12)
        # default: each reduction under its GEMM's weight gradient; with sp the all-gathers of the output
        # gradients of the row-parallel GEMMs (out proj, fc2: half an all-reduce each) come before those GEMMs'
        # backward and stay exposed
        exposed = allreduce if sp else 0.0
        ov = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=NVLINK, sequence_parallel=sp).layers[1]
        assert ov.fwd_s == b0.fwd_s
        assert ov.bwd_s == pytest.approx(2 * block_fwd + exposed, rel=1e-12)
        assert ov.bwd_input_s == b0.bwd_input_s  # the zero-bubble I pass cannot hide them
        ov_full = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=NVLINK, sequence_parallel=sp,
                              recompute="full").layers[1]
        assert ov_full.bwd_s == pytest.approx(3 * block_fwd + 2 * allreduce + exposed, rel=1e-12)
        # Transformer Engine's userbuffers (--tp-comm-overlap) pipeline those all-gathers with the row-parallel
        # GEMMs' input gradients (out proj 2 s h^2, fc2 8 s h^2 FLOPs): hidden too
        if sp:
            te = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=NVLINK, sequence_parallel=sp,
                             overlap_tp_forward=True).layers[1]
            assert 2 * s * h * h / t / rate > allreduce / 2
            assert te.bwd_s == pytest.approx(2 * block_fwd, rel=1e-12)
    # on a slow link only what each weight-gradient GEMM cannot cover is exposed
    from pipesearch.types import Link
    slow = Link(bw / 20, lat)
    ar_slow = 2 * (t - 1) / t * msg / slow.bandwidth_bytes_per_s + 2 * (t - 1) * lat
    b_slow = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=slow).layers[1]
    assert ar_slow > fc1 > qkv
    assert b_slow.bwd_s == pytest.approx(2 * block_fwd + (ar_slow - qkv) + (ar_slow - fc1), rel=1e-12)
    # the LM head is a column-parallel GEMM too: its input gradient's all-reduce runs under its weight gradient
    # (2 s h V / t FLOPs, V padded to 51200 for tp 8), hidden; charged in full it adds one all-reduce
    V = padded_vocab_size(K22, t)
    head_gemm = 2 * s * h * V / t / rate
    assert head_gemm > allreduce
    head = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=NVLINK).layers[-1]
    head_full = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=NVLINK, overlap_tp_backward=False).layers[-1]
    assert head.bwd_s == pytest.approx(2 * head_gemm, rel=1e-12)
    assert head_full.bwd_s == pytest.approx(2 * head_gemm + allreduce, rel=1e-12)
    # no sp: the embedding all-reduces its output in forward only
    emb = layer_table(K22, seq_len=s, device=A100, tp=t, tp_link=NVLINK).layers[0]
    assert emb.fwd_s == pytest.approx(allreduce) and emb.bwd_s == 0


def test_param_bytes_per_device():
    cfg = gpt(24, 2304, 24)
    h, V = 2304, 51200
    one = layer_table(cfg, seq_len=2048, device=A100)
    assert sum(x.param_bytes for x in one.layers) == pytest.approx(2 * parameter_count(cfg))
    assert one.layers[1].param_bytes == 2 * (12 * h * h + 13 * h)
    assert one.layers[0].param_bytes == 2 * (V + 2048) * h  # tied: word + position embeddings
    assert one.layers[-1].param_bytes == 2 * 2 * h  # final LayerNorm only
    t = 8
    eight = layer_table(cfg, seq_len=2048, device=A100, tp=t, tp_link=NVLINK)
    # weights and column-parallel biases split; 2 LayerNorms (4h) and 2 row-parallel biases replicated
    assert eight.layers[1].param_bytes == pytest.approx(2 * ((12 * h * h + 7 * h) / t + 6 * h))
    assert eight.layers[0].param_bytes == pytest.approx(2 * (V * h / t + 2048 * h))
    assert tied_layers(cfg) == {"head": "embedding"}
    assert tied_embedding_param_bytes(cfg, tp=t) == pytest.approx(2 * V * h / t)
    fp32 = layer_table(cfg, seq_len=2048, device=A100, dtype_bytes=4)
    assert fp32.bytes_per_param == 4
    assert fp32.layers[1].param_bytes == 2 * one.layers[1].param_bytes


def test_vocab_padding():
    cfg = load_transformer(CATALOG / "gpt3-175b.toml")
    assert cfg.vocab_size == 50257
    assert padded_vocab_size(cfg, 1) == 50304
    assert padded_vocab_size(cfg, 8) == 51200  # SC'21's V
    one = layer_table(cfg, device=A100)
    assert one.layers[0].param_bytes == 2 * (50304 + 2048) * 12288
    llama = load_transformer(CATALOG / "llama2-7b.toml")
    assert padded_vocab_size(llama, 1) == 32000 and padded_vocab_size(llama, 8) == 32768


def test_gqa_and_gated_mlp_flops():
    cfg = load_transformer(CATALOG / "llama3-8b.toml")
    s, h, f, kv = 8192, 4096, 14336, 1024
    fwd = forward_flops(cfg)
    qkvo = 2 * s * h * h + 2 * 2 * s * h * kv + 2 * s * h * h
    assert fwd["block_00"] == pytest.approx(qkvo + 4 * s * s * h + 3 * 2 * s * h * f, rel=1e-12)
    assert fwd["head"] == pytest.approx(2 * s * h * 128256, rel=1e-12)
    assert fwd["embedding"] == 0


# --------------------------------------------------------------------------- #
# catalog entries and published parameter counts

PUBLISHED = {  # name -> (parameters, rel tolerance)
    "llama2-7b": (6.74e9, 0.005),
    "llama3-8b": (8.03e9, 0.005),
    "llama2-13b": (13_015_864_320, 1e-9),
    "llama2-70b": (68_976_648_192, 1e-9),
    "llama3-70b": (70_553_706_496, 1e-9),
    "gpt3-1.3b": (1.3e9, 0.02),
    "gpt3-2.7b": (2.7e9, 0.02),
    "gpt3-6.7b": (6.7e9, 0.02),
    "gpt3-13b": (13.0e9, 0.02),
    "gpt3-175b": (175.0e9, 0.01),
    "t5-3b": (2.85e9, 0.01),
    "t5-11b": (11.3e9, 0.01),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_parameter_counts(name):
    path = CATALOG / f"{name}.toml"
    assert is_transformer_toml(path)
    cfg = load_transformer(path)
    assert cfg.name == name
    count, rel = PUBLISHED[name]
    assert parameter_count(cfg) == pytest.approx(count, rel=rel)


def test_llama2_7b_exact_published_count():
    assert parameter_count(load_transformer(CATALOG / "llama2-7b.toml")) == 6_738_415_616
    assert parameter_count(load_transformer(CATALOG / "llama3-8b.toml")) == 8_030_261_248


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_tables_build(name):
    cfg = load_transformer(CATALOG / f"{name}.toml")
    for tp, sp, rc in ((1, False, "none"), (8, True, "selective"), (8, False, "full")):
        prof = layer_table(cfg, device=A100, tp=tp, sequence_parallel=sp, recompute=rc, tp_link=NVLINK)
        assert prof.num_layers == cfg.total_blocks + 2
        for x in prof.layers:
            assert x.fwd_s >= 0 and x.bwd_s >= 0 and x.param_bytes > 0 and x.saved_bytes > 0
            assert 0 <= x.bwd_input_s <= x.bwd_s + 1e-15


def test_t5_layout():
    cfg = load_transformer(CATALOG / "t5-3b.toml")
    assert cfg.is_encoder_decoder and cfg.num_decoder_layers == 24 and cfg.q_dim == 4096
    s, h, q, f = 512, 1024, 4096, 16384
    fwd = forward_flops(cfg)
    enc = 2 * s * h * q * 4 + 4 * s * s * q + 2 * 2 * s * h * f
    dec = enc + 2 * s * h * q * 4 + 4 * s * s * q  # plus cross-attention
    assert fwd["block_00"] == pytest.approx(enc, rel=1e-12)
    assert fwd["block_24"] == pytest.approx(dec, rel=1e-12)
    prof = layer_table(cfg, device=A100)
    assert all(x.output_bytes == 2 * (512 + 512) * 1024 for x in prof.layers[:-1])
    short = layer_table(cfg, device=A100, decoder_seq_len=128)
    assert short.layers[25].output_bytes == 2 * (512 + 128) * 1024


def test_t5_decoder_length_from_the_config(tmp_path):
    """A TOML's decoder_seq_len sets the decoder's tokens: T5-3B's decoder
    block at 512 encoder and 114 decoder tokens (span corruption) by hand,
    self-attention over the 114, cross-attention's query and output over
    the 114 and its key and value projections over the encoder's 512."""
    text = (CATALOG / "t5-3b.toml").read_text().replace('kind = "encoder-decoder"',
                                                         'kind = "encoder-decoder"\ndecoder_seq_len = 114')
    (tmp_path / "t5.toml").write_text(text)
    cfg = load_transformer(tmp_path / "t5.toml")
    assert cfg.decoder_seq_len == 114
    s, sd, h, q, f = 512, 114, 1024, 4096, 16384
    self_attn = 2 * sd * h * q * 4 + 4 * sd * sd * q
    cross = 2 * sd * h * q * 2 + 2 * s * h * q * 2 + 4 * sd * s * q
    fwd = forward_flops(cfg)
    assert fwd["block_24"] == pytest.approx(self_attn + cross + 2 * 2 * sd * h * f, rel=1e-12)
    assert fwd["block_00"] == forward_flops(load_transformer(CATALOG / "t5-3b.toml"))["block_00"]  # the encoder's
    assert layer_table(cfg, device=A100).layers[25].output_bytes == 2 * (512 + 114) * 1024
    # the argument wins over the config
    assert layer_table(cfg, device=A100, decoder_seq_len=128).layers[25].output_bytes == 2 * (512 + 128) * 1024


def test_decoder_length_refused_for_a_decoder_only_model(tmp_path):
    text = (CATALOG / "gpt3-1.3b.toml").read_text().replace("[transformer]", "[transformer]\ndecoder_seq_len = 64")
    (tmp_path / "g.toml").write_text(text)
    with pytest.raises(InputError, match=r"key 'transformer.decoder_seq_len' = 64: expected no key for kind = 'decoder'"):
        load_transformer(tmp_path / "g.toml")


# --------------------------------------------------------------------------- #
# HuggingFace configs


def _write(tmp_path, data, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


LLAMA2_7B_HF = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "rms_norm_eps": 1e-05,
    "torch_dtype": "float16",
}


def test_hf_llama_equals_catalog(tmp_path):
    hf = load_hf_config(_write(tmp_path, LLAMA2_7B_HF))
    cat = load_transformer(CATALOG / "llama2-7b.toml")
    assert parameter_count(hf) == parameter_count(cat) == 6_738_415_616
    for kw in ({}, {"tp": 8, "sequence_parallel": True, "recompute": "selective", "tp_link": NVLINK},
               {"tp": 4, "recompute": "full", "tp_link": NVLINK}):
        a = layer_table(hf, device=A100, **kw)
        b = layer_table(cat, device=A100, **kw)
        assert a.layers == b.layers
        assert a.profiled_batch_size == b.profiled_batch_size and a.bytes_per_param == b.bytes_per_param
    # via the dispatcher, with a sequence length
    short = load_transformer(_write(tmp_path, LLAMA2_7B_HF, "llama.json"), seq_len=2048)
    assert short.seq_len == 2048


def test_an_unknown_model_type_read_by_its_keys_is_noted(tmp_path):
    """A LLaMA-style config.json labelled model_type "mamba" planned without
    a word: it is read by its keys (as documented), now with a warning that
    names the file and the value; known types (and none at all) get none."""
    from pipesearch.profiles.transformer import guessed_family_note

    odd = _write(tmp_path, LLAMA2_7B_HF | {"model_type": "mamba"}, "odd.json")
    assert load_hf_config(odd).gated_mlp  # still read as LLaMA-style by its keys
    note = guessed_family_note(odd)
    assert str(odd) in note and "model_type 'mamba'" in note and "LLaMA-style" in note
    for known in ("llama", "qwen2", "qwen3", "mistral"):
        assert guessed_family_note(_write(tmp_path, LLAMA2_7B_HF | {"model_type": known}, f"{known}.json")) is None
    plain = dict(LLAMA2_7B_HF)
    del plain["model_type"]
    assert guessed_family_note(_write(tmp_path, plain, "plain.json")) is None


def test_hf_gpt2_small(tmp_path):
    cfg = load_hf_config(_write(tmp_path, {
        "model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None,
        "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "resid_pdrop": 0.1,
    }))
    assert cfg.ffn_hidden_size == 3072 and cfg.seq_len == 1024 and cfg.tied_embeddings
    assert parameter_count(cfg) == 124_439_808  # GPT-2 small as released


def test_hf_gpt_neox(tmp_path):
    cfg = load_hf_config(_write(tmp_path, {  # Pythia-160M
        "model_type": "gpt_neox", "num_hidden_layers": 12, "hidden_size": 768,
        "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 50304,
        "max_position_embeddings": 2048, "tie_word_embeddings": False,
    }))
    assert not cfg.gated_mlp and cfg.position_embedding == "rotary"
    assert parameter_count(cfg) == 162_322_944


def test_hf_t5_equals_catalog(tmp_path):
    hf = load_hf_config(_write(tmp_path, {
        "model_type": "t5", "d_model": 1024, "d_ff": 16384, "d_kv": 128, "num_heads": 32,
        "num_layers": 24, "vocab_size": 32128, "n_positions": 512, "dropout_rate": 0.1,
        "feed_forward_proj": "relu", "relative_attention_num_buckets": 32,
    }))
    cat = load_transformer(CATALOG / "t5-3b.toml")
    assert layer_table(hf, device=A100).layers == layer_table(cat, device=A100).layers
    gated = load_hf_config(_write(tmp_path, {
        "model_type": "t5", "d_model": 512, "d_ff": 1024, "d_kv": 64, "num_heads": 6,
        "num_layers": 8, "num_decoder_layers": 8, "vocab_size": 32128,
        "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
    }, "t5v11.json"), seq_len=256)
    assert gated.gated_mlp and not gated.tied_embeddings and gated.seq_len == 256


def test_zero_decoder_blocks_are_refused_not_replaced(tmp_path):
    """An encoder-decoder file that gives 0 decoder blocks (HF's T5Config
    keeps a 0; only a missing key means num_layers) is refused with the
    file, key and value; it was planned with num_layers decoder blocks."""
    t5 = {"model_type": "t5", "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8, "num_layers": 2,
          "vocab_size": 32128, "n_positions": 512}
    path = _write(tmp_path, t5 | {"num_decoder_layers": 0}, "t5zero.json")
    with pytest.raises(InputError, match=r"t5zero\.json.*'num_decoder_layers'.*0.*at least 1 decoder block"):
        load_hf_config(path)
    assert load_hf_config(_write(tmp_path, t5, "t5none.json")).num_decoder_layers == 2  # no key: num_layers
    toml = (CATALOG / "t5-3b.toml").read_text().replace("num_decoder_layers = 24", "num_decoder_layers = 0")
    (tmp_path / "t5.toml").write_text(toml)
    with pytest.raises(InputError, match=r"t5\.toml.*'transformer\.num_decoder_layers'.*0"):
        load_transformer(tmp_path / "t5.toml")


# --------------------------------------------------------------------------- #
# bad inputs


def _toml(tmp_path, body, name="bad.toml"):
    p = tmp_path / name
    p.write_text(body)
    return p


GOOD = """[transformer]
num_layers = 2
hidden_size = 64
num_attention_heads = 4
ffn_hidden_size = 256
vocab_size = 1000
seq_len = 32
"""


def test_good_minimal_toml(tmp_path):
    cfg = load_transformer_toml(_toml(tmp_path, GOOD, "tiny.toml"))
    assert cfg.name == "tiny" and cfg.num_kv_heads == 4 and cfg.head_dim == 16


@pytest.mark.parametrize("edit,key,value", [
    (("num_layers = 2\n", ""), "num_layers", None),
    (("hidden_size = 64", "hidden_size = 0"), "hidden_size", "0"),
    (("seq_len = 32", "seq_len = -5"), "seq_len", "-5"),
    (("hidden_size = 64", "hidden_size = 66"), "hidden_size", "66"),
    (("ffn_hidden_size = 256", "ffn_hidden_size = 256\nnum_kv_heads = 3"), "num_kv_heads", "3"),
    (("vocab_size = 1000", "vocab_size = 1000.5"), "vocab_size", "1000.5"),
    (("seq_len = 32", "seq_len = 32\nkind = 'encoder'"), "kind", "encoder"),
    (("seq_len = 32", "seq_len = 32\nhiden = 3"), "hiden", None),
    (("seq_len = 32", "seq_len = 32\nnorm = 'batchnorm'"), "norm", "batchnorm"),
    (("seq_len = 32", "seq_len = 32\ntied_embeddings = 1"), "tied_embeddings", "1"),
])
def test_bad_toml(tmp_path, edit, key, value):
    p = _toml(tmp_path, GOOD.replace(*edit))
    with pytest.raises(InputError) as e:
        load_transformer(p)
    msg = str(e.value)
    assert str(p) in msg and key in msg
    if value is not None:
        assert value in msg


def test_bad_toml_structure(tmp_path):
    with pytest.raises(InputError, match=r"no \[transformer\] table"):
        load_transformer(_toml(tmp_path, "num_layers = 2\n"))
    with pytest.raises(InputError, match="syntax"):
        load_transformer(_toml(tmp_path, "[transformer\n"))
    with pytest.raises(InputError, match="cannot read"):
        load_transformer(tmp_path / "missing.toml")
    with pytest.raises(InputError, match="expected a .toml"):
        load_transformer(tmp_path / "x.yaml")
    assert not is_transformer_toml(_toml(tmp_path, "a = 1\n", "other.toml"))


@pytest.mark.parametrize("change,key,value", [
    ({"n_head": 7}, "n_head", "7"),
    ({"n_embd": -768}, "n_embd", "-768"),
    ({"n_layer": None}, "n_layer", None),
    # a dropout rate that is not a probability (a string read as no dropout: less memory than planned)
    ({"resid_pdrop": "0.1"}, "resid_pdrop", "'0.1'"),
    ({"attn_pdrop": 1.5}, "attn_pdrop", "1.5"),
])
def test_bad_hf_gpt2(tmp_path, change, key, value):
    data = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
            "n_positions": 1024, "vocab_size": 50257}
    data.update(change)
    p = _write(tmp_path, data)
    with pytest.raises(InputError) as e:
        load_hf_config(p)
    msg = str(e.value)
    assert str(p) in msg and key in msg
    if value is not None:
        assert value in msg


def test_hf_keys_that_would_be_misread_are_refused(tmp_path):
    """A key given twice (json keeps the last silently), a T5 dropout_rate
    that is not a number (read as no dropout), a GPT-NeoX config with fewer
    key/value heads than heads (GPT-NeoX has no grouped-query attention:
    ignored): one line each, naming the key."""
    p = tmp_path / "dup.json"
    p.write_text('{"model_type": "llama", "hidden_size": 4096, "hidden_size": 2048}')
    with pytest.raises(InputError, match="key 'hidden_size' appears twice"):
        load_hf_config(p)
    t5 = {"model_type": "t5", "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8, "num_layers": 6,
          "vocab_size": 32128, "n_positions": 512, "dropout_rate": "x"}
    with pytest.raises(InputError, match="key 'dropout_rate' = 'x': expected a dropout probability"):
        load_hf_config(_write(tmp_path, t5))
    neox = {"model_type": "gpt_neox", "hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 512}
    with pytest.raises(InputError, match="num_key_value_heads' = 2: expected no key, or num_attention_heads"):
        load_hf_config(_write(tmp_path, neox))
    assert load_hf_config(_write(tmp_path, dict(neox, num_key_value_heads=8))).num_layers == 2


def test_bad_hf_llama(tmp_path):
    data = dict(LLAMA2_7B_HF, num_key_value_heads=5)
    p = _write(tmp_path, data)
    with pytest.raises(InputError, match="num_key_value_heads' = 5") as e:
        load_hf_config(p)
    assert str(p) in str(e.value)
    data = dict(LLAMA2_7B_HF)
    del data["intermediate_size"]
    with pytest.raises(InputError, match="missing key 'intermediate_size'"):
        load_hf_config(_write(tmp_path, data))
    data = dict(LLAMA2_7B_HF)
    del data["max_position_embeddings"]
    with pytest.raises(InputError, match="pass --seq-len"):
        load_hf_config(_write(tmp_path, data))
    assert load_hf_config(_write(tmp_path, data), seq_len=128).seq_len == 128
    with pytest.raises(InputError, match="mixture-of-experts"):
        load_hf_config(_write(tmp_path, dict(LLAMA2_7B_HF, num_local_experts=8)))
    with pytest.raises(InputError, match="unrecognised"):
        load_hf_config(_write(tmp_path, {"model_type": "resnet"}))
    with pytest.raises(InputError, match="JSON"):
        load_hf_config(_toml(tmp_path, "{", "c.json"))


def test_bad_layer_table_options(tmp_path):
    cfg = load_transformer(CATALOG / "llama2-70b.toml")
    with pytest.raises(InputError, match="tp = 16 does not divide num_kv_heads = 8"):
        layer_table(cfg, device=A100, tp=16, tp_link=NVLINK)
    with pytest.raises(InputError, match="tp_link"):
        layer_table(cfg, device=A100, tp=8)
    with pytest.raises(InputError, match="recompute"):
        layer_table(cfg, device=A100, recompute="some")
    with pytest.raises(InputError, match="divisible by tp"):
        layer_table(cfg, device=A100, seq_len=4097, tp=8, sequence_parallel=True, tp_link=NVLINK)
    with pytest.raises(InputError, match="decoder_seq_len"):
        layer_table(cfg, device=A100, decoder_seq_len=10)
    gpt3 = load_transformer(CATALOG / "gpt3-1.3b.toml")
    with pytest.raises(InputError, match="learned position table"):
        layer_table(gpt3, device=A100, seq_len=4096)
    with pytest.raises(InputError, match=r"'seq_len \(--seq-len\)' = 4096 exceeds 'transformer.max_position_embeddings'"):
        load_transformer(CATALOG / "gpt3-1.3b.toml", seq_len=4096)  # named as the option that gave it
    assert load_transformer(CATALOG / "gpt3-1.3b.toml", seq_len=1024).max_position_embeddings == 2048
    # without max_position_embeddings the table has seq_len's 2048 rows: the refusal cites seq_len, the key given
    text = (CATALOG / "gpt3-1.3b.toml").read_text()
    bare = tmp_path / "bare.toml"
    bare.write_text("\n".join(x for x in text.splitlines() if not x.startswith("max_position_embeddings")))
    with pytest.raises(InputError, match=r"exceeds 'transformer.seq_len \(the learned position table's rows"):
        load_transformer(bare, seq_len=4096)
    with pytest.raises(InputError, match="heads"):
        replace(gpt3, num_attention_heads=24)


# --------------------------------------------------------------------------- #
# properties over random shapes


@settings(max_examples=60, deadline=None)
@given(
    l=st.integers(1, 4), heads=st.sampled_from([4, 8, 16]), group=st.sampled_from([1, 2, 4]),
    d=st.sampled_from([16, 32]), ffn_mult=st.integers(1, 5), gated=st.booleans(),
    tied=st.booleans(), dropout=st.booleans(), s=st.sampled_from([16, 64, 128]),
    tp=st.sampled_from([1, 2, 4]), recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_table_properties(l, heads, group, d, ffn_mult, gated, tied, dropout, s, tp, recompute):
    h = heads * d
    cfg = TransformerConfig(
        name="r", num_layers=l, hidden_size=h, num_attention_heads=heads,
        num_kv_heads=heads // group, ffn_hidden_size=ffn_mult * 4 * tp, vocab_size=997,
        seq_len=s, gated_mlp=gated, tied_embeddings=tied, dropout=dropout,
        position_embedding="rotary", norm="rmsnorm", bias=False,
    )
    if (heads // group) % tp:
        return
    kw = dict(device=A100, tp=tp, tp_link=NVLINK, recompute=recompute)
    plain = layer_table(cfg, **kw)
    sp = layer_table(cfg, sequence_parallel=True, **kw)
    no_overlap = dict(kw, overlap_tp_backward=False)
    plain_full, sp_full = layer_table(cfg, **no_overlap), layer_table(cfg, sequence_parallel=True, **no_overlap)
    # with sp each column-parallel GEMM also gathers its sequence-sharded input for its weight gradient: one
    # all-gather of a block's input (b s h bytes, half an all-reduce's time) per sub-layer, and one of the LM head's
    msg = s * h * 2
    gather = 0.0 if tp == 1 else (tp - 1) / tp * msg / NVLINK.bandwidth_bytes_per_s + (tp - 1) * NVLINK.latency_s
    for k, (x, y, xf, yf) in enumerate(zip(plain.layers, sp.layers, plain_full.layers, sp_full.layers)):
        assert 0 <= x.bwd_input_s <= x.bwd_s and 0 <= y.bwd_input_s <= y.bwd_s
        assert y.saved_bytes <= x.saved_bytes + 1e-9
        # sp turns each all-reduce into all-gather + reduce-scatter (the embedding's forward one, the head's
        # backward one: each split between forward and backward): the same time, charged in full, plus the
        # input gathers
        gathers = 2 * gather if x.name.startswith("block") else (gather if x.name == "head" else 0.0)
        assert yf.fwd_s + yf.bwd_s == pytest.approx(xf.fwd_s + xf.bwd_s + gathers, rel=1e-12)
        if x.name.startswith("block"):
            assert y.fwd_s == pytest.approx(x.fwd_s, rel=1e-12)
        # overlapped, a block's backward exposes at least as much with sp (the output-gradient gathers of its
        # row-parallel GEMMs wait), never more than in full
        if x.name.startswith("block"):
            assert x.bwd_s <= y.bwd_s * (1 + 1e-12) and y.bwd_s <= yf.bwd_s * (1 + 1e-12)
        assert y.flops == x.flops
        assert x.param_bytes == y.param_bytes
    if tp == 1:
        # all parameters on one device
        assert sum(x.param_bytes for x in plain.layers) == 2 * parameter_count(
            cfg, vocab_size=padded_vocab_size(cfg, 1))
        base = sum(forward_flops(cfg, vocab_size=padded_vocab_size(cfg, 1)).values())
        extra = sum(x.flops for x in plain.layers) - 3 * base
        assert extra >= -1e-6 * base
        if recompute == "none":
            assert extra == pytest.approx(0, abs=1e-9 * base)
        assert not math.isnan(extra)


def test_t5_blocks_differ_where_their_parameters_do():
    """T5-3B (24 encoder + 24 decoder blocks, relative attention): block 0
    and the first decoder block hold the relative-position buckets (32 x 32
    heads more parameters), the last encoder block the final encoder norm
    (h more), decoder blocks a cross-attention; the rest of each kind are
    alike. Every block's bytes equal the parameters counted by hand for its
    index (a table that shared one block's terms across kinds would not)."""
    cfg = load_transformer(CATALOG / "t5-3b.toml")
    h, f, a, dk = 1024, 16384, 32, 128  # the catalog file's sizes (RMS norms of h weights, no biases)
    n, buckets = 24, 32
    att = 4 * h * a * dk  # q, k, v and output projections
    mlp = 2 * h * f  # ReLU MLP: in and out
    blocks = layer_table(cfg, seq_len=512, device=A100).layers[1:-1]
    assert len(blocks) == 2 * n
    for i, lay in enumerate(blocks):
        decoder = i >= n
        params = (2 if decoder else 1) * att + mlp + (3 if decoder else 2) * h  # a norm per sub-layer
        params += buckets * a if i in (0, n) else 0
        params += h if i == n - 1 else 0
        assert lay.param_bytes == 2 * params, (i, lay.name)
        assert lay.name == f"block_{i:02d}"


def test_a_config_of_too_many_blocks_is_refused(tmp_path):
    """More than 100,000 blocks (every layer table holds a row per block):
    one line naming the key and the value."""
    text = (CATALOG / "llama3-8b.toml").read_text()
    path = tmp_path / "deep.toml"
    import re
    path.write_text(re.sub(r"(?m)^num_layers = .*$", "num_layers = 100001", text))
    with pytest.raises(InputError, match=r"num_layers' = 100001 makes 100001 blocks, more than the 100000"):
        load_transformer(path)


# ------------------------------------------------------------ HuggingFace model types read by family

GEMMA_7B = {"architectures": ["GemmaForCausalLM"], "attention_bias": False, "head_dim": 256, "hidden_act": "gelu",
            "hidden_size": 3072, "intermediate_size": 24576, "max_position_embeddings": 8192, "model_type": "gemma",
            "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0, "vocab_size": 256000}
PHI_2 = {"architectures": ["PhiForCausalLM"], "hidden_act": "gelu_new", "hidden_size": 2560,
         "intermediate_size": 10240, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "model_type": "phi",
         "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
         "resid_pdrop": 0.1, "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": 51200}


def _hf(tmp_path, config: dict):
    from pipesearch.profiles.transformer import load_transformer

    return load_transformer(_write(tmp_path, config))


def test_gemma_is_tied_when_its_config_leaves_the_key_out(tmp_path):
    """Gemma-7B's config has no tie_word_embeddings (HF's GemmaConfig
    defaults it to true): its published 8,537,680,896 parameters count the
    256,000 x 3,072 embedding once; untied was 9.2% over."""
    from pipesearch.profiles.transformer import parameter_count

    assert parameter_count(_hf(tmp_path, GEMMA_7B)) == 8_537_680_896


def test_phi_2_is_read_as_a_neox_style_decoder(tmp_path):
    """Phi-2 (2.78B parameters, its model card): a two-matrix GELU MLP,
    LayerNorm and biases, GPT-NeoX's family; read as LLaMA-style (gated,
    no biases) it counted 3.62B (+30%)."""
    from pipesearch.profiles.transformer import parameter_count

    cfg = _hf(tmp_path, PHI_2)
    assert (cfg.gated_mlp, cfg.norm, cfg.bias) == (False, "layernorm", True)
    assert parameter_count(cfg) == pytest.approx(2_779_683_840, rel=1e-4)


@pytest.mark.parametrize("model_type, why", [("bert", "encoder-only"), ("roberta", "encoder-only"),
                                             ("falcon", "multi-query attention")])
def test_architectures_no_family_reads_are_refused_by_name(tmp_path, model_type, why):
    config = dict(GEMMA_7B, model_type=model_type)
    with pytest.raises(InputError, match=f"model_type '{model_type}': .*{why}.*transformer TOML"):
        _hf(tmp_path, config)


def test_an_unknown_type_missing_a_key_is_told_to_use_a_toml(tmp_path):
    """OPT names its MLP width ffn_dim: the refusal said "missing key
    'intermediate_size'", as if adding it would read the model right."""
    config = {"model_type": "opt", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
              "ffn_dim": 8192, "vocab_size": 50272, "max_position_embeddings": 2048}
    with pytest.raises(InputError, match="model_type 'opt' is not one pipesearch reads.*transformer TOML"):
        _hf(tmp_path, config)


def test_a_sliding_window_shorter_than_the_sequence_is_warned(tmp_path):
    """Mistral-7B-v0.1 attends over a 4096-token window; at 32768 tokens
    full causal attention counts the attention core 8x too long: a
    warning says so, and none at 4096."""
    from pipesearch.profiles.transformer import sliding_window_note

    path = _write(tmp_path, dict(GEMMA_7B, model_type="mistral", sliding_window=4096))
    note = sliding_window_note(path, 32768)
    assert note is not None and "sliding_window 4096 < sequence length 32768" in note and "--seq-len 4096" in note
    assert sliding_window_note(path, 4096) is None
    # Qwen2's configs carry a window they do not use (use_sliding_window false: DeepSeek-R1-Distill-Qwen-7B)
    path = _write(tmp_path, dict(GEMMA_7B, model_type="qwen2", sliding_window=4096, use_sliding_window=False))
    assert sliding_window_note(path, 32768) is None


@pytest.mark.parametrize("model_type,keys,needle", [
    ("gpt_bigcode", {"n_layer": 4, "n_embd": 256, "n_head": 8, "n_positions": 1024, "vocab_size": 1000,
                     "multi_query": True}, "multi-query attention"),
    ("starcoder2", {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
                    "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 1024,
                    "hidden_act": "gelu_pytorch_tanh", "use_bias": True}, "non-gated GELU MLP"),
])
def test_model_types_no_family_reads_are_refused_by_name(tmp_path, model_type, keys, needle):
    """StarCoder's multi-query attention read as GPT-2 costed 48 KV heads
    where it has one (a KV cache 48x too large in serve); StarCoder2's
    non-gated GELU MLP read as LLaMA costed a third more weights: both are
    refused, naming the model type and why, as Falcon is."""
    with pytest.raises(InputError, match=f"model_type '{model_type}': .*{needle}"):
        _hf(tmp_path, dict(keys, model_type=model_type))


def test_a_config_under_another_name_is_no_checkpoint_folder(tmp_path):
    """serve exported ``vllm serve <folder>`` for cfgs/llama3_8b.json, a
    folder without a config.json: only a folder's config.json names it as
    the checkpoint; another name gives none (the commands then say to
    replace the model name)."""
    from pipesearch.profiles.transformer import hf_checkpoint

    (tmp_path / "m").mkdir()
    named = tmp_path / "m" / "config.json"
    named.write_text(json.dumps(GEMMA_7B))
    other = tmp_path / "m" / "gemma.json"
    other.write_text(json.dumps(GEMMA_7B))
    assert hf_checkpoint(named) == str((tmp_path / "m").resolve()) and hf_checkpoint(other) is None
    other.write_text(json.dumps(dict(GEMMA_7B, _name_or_path="google/gemma-7b")))
    assert hf_checkpoint(other) == "google/gemma-7b"


def test_full_recomputation_of_a_long_context_block_holds_no_attention_scores():
    """Llama-3 8B at 131,072 tokens, tp 8 with sequence parallelism, full
    recomputation: a block recomputing in its backward holds its whole
    activations once (Chen et al. 2016) but not the attention scores, which
    the fused attention kernel of the recomputed forward never materialises:
    34 s b h / t (attention: norm input 2, QKV input 2, Q 2, K 0.5, V 0.5,
    out-proj input 2; MLP: norm input 2, fc1 input 2, gate, up and fc2
    input 3 x 7; in units of s b h bytes at 2 bytes an element) =
    2,281,701,376 B, and the plan fits an 80 GB H100. With the scores (a s^2
    b x 2 B / t, 137 GB) it was refused as out of memory."""
    res = CliRunner().invoke(main, ["plan", "-q", "--json", "--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes",
                                    "1", "-b", "8", "--seq-len", "131072", "--recompute", "full", "--tp", "8",
                                    "--pp", "1"])
    assert res.exit_code == 0, res.output
    stage = json.loads(res.stdout)["plans"][0]["stages"][0]
    assert stage["memory_breakdown_bytes"]["recompute_transient"] == 34 * 131072 * 1 * 4096 / 8
    assert stage["memory_bytes"] < 80e9


def test_a_context_extended_after_pretraining_trains_at_the_pretraining_length_by_default(tmp_path):
    """Llama 3.1's config.json: max_position_embeddings 131072, reached by
    rope scaling from rope_scaling.original_max_position_embeddings 8192.
    Without --seq-len the plan trains at 8192 (at 131072 no plan of Llama
    3.1 8B fit eight H100s: a new user's config was refused); the context
    (what serving checks) stays 131072, and a given seq_len is kept."""
    from pipesearch.profiles.transformer import load_transformer

    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 131072,
           "rope_theta": 500000.0, "tie_word_embeddings": False,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    c = load_transformer(path)
    assert (c.seq_len, c.max_position_embeddings) == (8192, 131072)
    assert load_transformer(path, seq_len=65536).seq_len == 65536
    del cfg["rope_scaling"]["original_max_position_embeddings"]  # no pre-training length given: the context
    path.write_text(json.dumps(cfg))
    assert load_transformer(path).seq_len == 131072


def test_a_config_whose_aliases_disagree_is_refused(tmp_path):
    """GPT-2's n_layer and num_hidden_layers are one setting to transformers
    (GPT2Config.attribute_map): 12 and 22 in one file planned 12 layers
    without a word; equal values are fine."""
    from pipesearch.profiles.transformer import load_transformer

    cfg = {"model_type": "gpt2", "n_layer": 12, "num_hidden_layers": 22, "n_embd": 768, "n_head": 12,
           "vocab_size": 50257, "n_positions": 1024}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="key 'n_layer' = 12 and its alias 'num_hidden_layers' = 22 disagree"):
        load_transformer(path)
    path.write_text(json.dumps(dict(cfg, num_hidden_layers=12)))
    assert load_transformer(path).num_layers == 12
