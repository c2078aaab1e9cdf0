"""Training state by component and its sharding (pipesearch.memory), and the
memory a plan charges per stage, against figures from the papers and the
runtimes' documentation, derived by hand."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.errors import InputError
from pipesearch.hardware import load_cluster
from pipesearch.memory import ParamState, from_totals, param_state_of, preset, usable_memory_bytes
from pipesearch.profiles.transformer import TransformerConfig, layer_table
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job

GB = 1e9


@pytest.mark.parametrize("sharding,total_GB", [
    ("none", 120.0),    # (2 + 2 + 12) Psi
    ("zero1", 31.4),    # 4 Psi + 12 Psi / Nd
    ("zero2", 16.6),    # 2 Psi + 14 Psi / Nd
    ("zero3", 1.9),     # 16 Psi / Nd
    ("fsdp", 1.9),
])
def test_zero_figure_1(sharding, total_GB):
    """Rajbhandari et al. SC'20 Fig. 1: Psi = 7.5B parameters, Nd = 64,
    mixed-precision Adam (K = 12): 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per
    device (printed to one decimal)."""
    state = preset("mixed-adam", sharding)
    assert 7.5e9 * state.bytes_per_param(64) / GB == pytest.approx(total_GB, abs=0.05)


def test_megatron_distributed_optimizer_table():
    """Megatron Core user guide, "Distributed Optimizer": "float16 param,
    fp32 grads" 18 bytes per parameter without the distributed optimizer,
    6 + 12/d with it; "fp32 param, fp32 grads" 16 and 8 + 8/d."""
    meg = preset("megatron")
    assert meg.total_bytes == 18
    assert meg.bytes_per_param(8) == 18
    dist = preset("megatron", "zero1")
    for d in (1, 2, 8, 48):
        assert dist.bytes_per_param(d) == pytest.approx(6 + 12 / d)
    parts = dist.breakdown_per_param(4)
    assert parts == {"weights": 2.0, "grads": 0.0, "main_grads": 4.0, "master_weights": 1.0,
                     "optimizer_moments": 2.0}
    for d in (1, 4, 64):
        assert preset("fp32-adam", "zero1").bytes_per_param(d) == pytest.approx(8 + 8 / d)
    # the floor of a sharded state: what no dp removes
    assert dist.floor_bytes_per_param() == 6
    assert preset("megatron", "zero2").floor_bytes_per_param() == 2
    assert preset("megatron", "zero3").floor_bytes_per_param() == 0


def test_older_totals_map_onto_components():
    """--optimizer-bytes-per-param N with --zero1 kept N - 12 (1 - 1/dp)."""
    job = Job(64, state_bytes_per_param=20.0, zero1=True)
    state = param_state_of(job)
    assert state.total_bytes == 20 and state.sharding == "zero1"
    assert state.bytes_per_param(4) == pytest.approx(20 - 12 * (1 - 1 / 4))
    assert param_state_of(Job(64)) == preset("mixed-adam")
    # fewer bytes than an optimizer's 12: all of it counts as optimizer state
    assert from_totals(8.0, 12.0, "zero1").bytes_per_param(2) == pytest.approx(4.0)
    with pytest.raises(InputError, match="sharding"):
        ParamState(sharding="zero4")
    with pytest.raises(InputError, match="optimizer state"):
        preset("adafactor")


def test_headroom_and_reserve():
    """80 GiB, 5% headroom, 1 GiB reserve: 76 GiB - 1 GiB = 75 GiB usable."""
    job = Job(8, memory_headroom_fraction=0.05)
    assert usable_memory_bytes(job, 80 * 2**30) == pytest.approx(75 * 2**30)


def _gpt22b(tied: bool = True) -> TransformerConfig:
    return TransformerConfig(name="gpt-22b", num_layers=48, hidden_size=6144, num_attention_heads=64,
                             ffn_hidden_size=4 * 6144, vocab_size=51200, seq_len=2048, tied_embeddings=tied)


def test_stage_memory_by_component_follows_korthikanti_table2():
    """22B GPT (h 6144, a 64, s 2048, V 51200), tp 8 with sequence
    parallelism, selective recompute, pp 2, 1F1B, micro-batch 1, Megatron
    state (18 B/param), split pinned at 25 | 25 layers (embedding + 24
    blocks | 24 blocks + head). Last stage, by hand:

    * activations, 1 micro-batch in flight (1F1B, last stage): 24 blocks x
      Korthikanti Table 2 "selective, tp + sp" 34 s b h / t, plus the head's
      final-norm and LM-head inputs 2 x 2 s b h / t and fp32 softmax
      4 s b V / t;
    * state: per block 12 h^2 / t GEMM weights + 7h / t column-parallel biases
      + 6h row-parallel biases and LayerNorms, plus the final LayerNorm 2h,
      times 18 bytes (2 weights + 4 main grads + 4 master + 8 moments);
    * tied copy of the word embedding: V h / t parameters x 18 bytes.
    """
    s, b, h, t, V = 2048, 1, 6144, 8, 51200
    cl = load_cluster("2x8-a100-80gb")
    prof = layer_table(_gpt22b(), device=cl.device_spec(0), tp=t, sequence_parallel=True, recompute="selective",
                       tp_link=cl.intra_node)
    job = Job(16, param_state=preset("megatron"))
    plan = search([ModelVariant(prof, tp=t, recompute="selective")], cl, job, SearchOptions(
        pp=2, dp=1, micro_batch_size=1, schedules=("1f1b",), split=(25, 25), top=1)).plans[0]
    last = plan.stages[-1]
    parts = dict(last.memory_breakdown)
    acts = 24 * 34 * s * b * h / t + 2 * 2 * s * b * h / t + 4 * s * b * V / t
    assert parts["activations"] == pytest.approx(acts, rel=1e-12)
    params = 24 * (12 * h * h / t + 7 * h / t + 6 * h) + 2 * h
    assert parts["weights"] == pytest.approx(2 * params, rel=1e-12)
    assert parts["main_grads"] == pytest.approx(4 * params, rel=1e-12)
    assert parts["master_weights"] + parts["optimizer_moments"] == pytest.approx(12 * params, rel=1e-12)
    assert parts["tied_copy"] == pytest.approx(18 * V * h / t, rel=1e-12)
    assert sum(parts.values()) == pytest.approx(last.memory_bytes, rel=1e-12)
    # the first stage holds 2 micro-batches (1F1B, pp 2) and no copy
    first = dict(plan.stages[0].memory_breakdown)
    emb_saved = 8 * b * s + b * s * h / t  # token ids, dropout mask (1 byte, sequence-sharded)
    assert first["activations"] == pytest.approx(2 * (24 * 34 * s * b * h / t + emb_saved), rel=1e-12)
    assert first["tied_copy"] == 0
    # untied: no copy
    untied = layer_table(_gpt22b(tied=False), device=cl.device_spec(0), tp=t, sequence_parallel=True,
                         recompute="selective", tp_link=cl.intra_node)
    assert untied.tied_param_bytes == 0


def test_zero3_keeps_a_shard_and_two_gathered_units():
    """ZeRO-3 / FSDP over dp = 4 without a pipeline: 16 / 4 bytes of state
    per parameter, plus the gathered bf16 weights of two units (computing
    and prefetched), the largest layer's: here a block, 12 h^2 / t + 7 h / t
    + 6 h = 56.66M parameters at tp 8 (the embedding has V h / t + P h =
    51.9M). In a pipeline of 2 the stage keeps what ZeRO-1 keeps (the
    pipeline runtimes reduce and reshard after the last micro-batch only):
    2 + 2 bytes of weights and gradients per parameter whole, 12 / 4 of
    optimizer state, nothing gathered."""
    s, h, t, V = 2048, 6144, 8, 51200
    cl = load_cluster("2x8-a100-80gb", nodes=8)
    prof = layer_table(_gpt22b(), device=cl.device_spec(0), tp=t, sequence_parallel=True, recompute="full",
                       tp_link=cl.intra_node)
    job = Job(64, param_state=preset("mixed-adam", "zero3"))
    alone = search([ModelVariant(prof, tp=t, recompute="full")], cl, job, SearchOptions(
        pp=1, dp=4, micro_batch_size=1, schedules=("1f1b",), top=1)).plans[0]
    parts = dict(alone.stages[0].memory_breakdown)
    block_params = 12 * h * h / t + 7 * h / t + 6 * h
    assert block_params > V * h / t + s * h
    assert parts["gathered_weights"] == pytest.approx(2 * 2 * block_params, rel=1e-12)
    params = sum(x.param_bytes for x in prof.layers) / 2
    assert parts["weights"] == pytest.approx(2 / 4 * params, rel=1e-12)
    assert parts["master_weights"] + parts["optimizer_moments"] == pytest.approx(12 / 4 * params, rel=1e-12)
    piped = search([ModelVariant(prof, tp=t, recompute="full")], cl, job, SearchOptions(
        pp=2, dp=4, micro_batch_size=1, schedules=("1f1b",), split=(25, 25), top=1)).plans[0]
    parts = dict(piped.stages[0].memory_breakdown)
    first = prof.layers[0].param_bytes / 2 + sum(x.param_bytes for x in prof.layers[1:25]) / 2
    assert parts["gathered_weights"] == 0
    assert parts["weights"] == pytest.approx(2 * first, rel=1e-12)
    assert parts["grads"] == pytest.approx(2 * first, rel=1e-12)
    assert parts["master_weights"] + parts["optimizer_moments"] == pytest.approx(12 / 4 * first, rel=1e-12)


def _cli(*args):
    return CliRunner().invoke(main, ["plan", "--quiet", "--json", *args])


def test_cli_state_options(tmp_path):
    base = ["--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "32", "--tp", "2", "--pp", "2",
            "--schedule", "1f1b", "--top", "1", "--recompute", "selective"]
    import json

    meg = json.loads(_cli(*base, "--optimizer-state", "megatron", "--sharding", "zero1").output)
    job = meg["inputs"]["job"]
    assert job["optimizer_state"]["name"] == "megatron" and job["optimizer_state"]["sharding"] == "zero1"
    assert job["memory_headroom_fraction"] == 0.05
    legacy = json.loads(_cli(*base, "--zero1").output)
    assert legacy["inputs"]["job"]["optimizer_state"]["sharding"] == "zero1"
    assert legacy["inputs"]["job"]["state_bytes_per_param"] == 16
    stage = meg["plans"][0]["stages"][0]
    assert sum(stage["memory_breakdown_bytes"].values()) == pytest.approx(stage["memory_bytes"])
    pred = meg["plans"][0]["predicted"]
    assert pred["tokens_per_s"] == pytest.approx(32 * 2048 / pred["iteration_time_s"])
    assert pred["tokens_per_s_per_device"] == pytest.approx(pred["tokens_per_s"] / 8)
    assert 0 < pred["mfu"] < 1
    # sequence parallelism off keeps the replicated regions on every rank: more activations
    on = meg["plans"][0]["stages"][0]["saved_bytes"]
    off = json.loads(_cli(*base, "--optimizer-state", "megatron", "--no-sequence-parallel").output)
    assert off["plans"][0]["options"]["sequence_parallel"] is False
    assert off["plans"][0]["stages"][0]["saved_bytes"] > on
    bad = _cli(*base, "--optimizer-state", "megatron", "--optimizer-bytes-per-param", "16")
    assert bad.exit_code == 2 and "give one" in bad.output
    bad = _cli(*base, "--zero1", "--sharding", "zero3")
    assert bad.exit_code == 2 and "disagree" in bad.output


@pytest.mark.parametrize("total,dp,expected", [
    # total B/param -> (weights, grads, master, moments) per parameter on one rank
    (4.0, 2, (2.0, 2.0, 0.0, 0.0)),     # fp16 weights + grads, nothing for --zero1 to shard
    (8.0, 2, (2.0, 2.0, 2 / 3, 4 / 3)),  # 4 B optimizer state, halved by --zero1 over dp 2
    (16.0, 2, (2.0, 2.0, 2.0, 4.0)),    # mixed-precision Adam: 12 B optimizer, halved
])
def test_optimizer_bytes_total_puts_weights_and_grads_first(total, dp, expected):
    """--optimizer-bytes-per-param T: the first 2 B are fp16 weights, the
    next 2 gradients, the rest, at most 12, optimizer state (1:2 master and
    moments, as Adam's 4 + 8), which --zero1 divides by dp; beyond 16 half
    weights, half gradients. Totals outside 4 to 16 are refused (below 4
    there are no gradients to reduce; above 16 the reduce's bytes would not
    follow)."""
    args = ["--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "32", "--pp", "1", "--tp", "1",
            "--dp", str(dp), "--top", "1", "--optimizer-bytes-per-param", str(total), "--zero1"]
    res = _cli(*args)
    assert res.exit_code == 0, res.output
    stage = json.loads(res.output)["plans"][0]["stages"][0]
    parts = stage["memory_breakdown_bytes"]
    params = parts["weights"] / expected[0]  # every case has weights
    assert params == pytest.approx(1.3e9, rel=0.1)  # the model's parameter count, about 1.3B
    got = (parts["weights"], parts["grads"], parts["master_weights"], parts["optimizer_moments"])
    assert got == pytest.approx(tuple(params * e for e in expected))


@pytest.mark.parametrize("total", ["0", "2", "3.5", "17", "20"])
def test_optimizer_bytes_total_outside_4_to_16_is_refused(total):
    res = _cli("--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "32", "--optimizer-bytes-per-param", total)
    assert res.exit_code == 2 and "--optimizer-bytes-per-param" in res.output and "4<=x<=16" in res.output


def test_headroom_refuses_what_only_fits_without_it():
    """4 layers of 1 MiB state each on one 10 MiB device (no reserve), 1F1B
    with pp 1: 4 MiB state + 1 micro-batch x 4 x 1 MiB activations = 8 MiB.
    It fits 10 MiB with no headroom, not with 25% (7.5 MiB usable)."""
    from helpers import tiny_cluster, tiny_profile

    MiB = 2**20
    prof = tiny_profile([1e-3] * 4, params=[MiB / 4] * 4, saved=[MiB] * 4)
    opts = SearchOptions(pp=1, dp=1, micro_batch_size=1, schedules=("1f1b",), top=1)
    cl = tiny_cluster(1, 1, memory_bytes=10 * MiB)
    plan = search([ModelVariant(prof)], cl, Job(1, memory_reserve_bytes=0), opts).plans[0]
    assert plan.predicted.peak_memory_bytes == pytest.approx(8 * MiB)
    with pytest.raises(Exception, match="no plan fits"):
        search([ModelVariant(prof)], cl, Job(1, memory_reserve_bytes=0, memory_headroom_fraction=0.25), opts)


def test_split_makes_room_for_the_tied_copy_on_the_last_stage():
    """5 layers of 1 MiB state each, times 2, 1, 1, 1, 1 ms, pp 2, 3.5 MiB per
    device, no activations. Untied, the best split is (2, 3) (bottleneck 3 ms,
    3 MiB per stage). With a tied matrix of 1 MiB of state the last stage of
    (2, 3) would need 4 MiB, so the split must be (3, 2): 3 MiB and 2 + 1 MiB,
    bottleneck 4 ms."""
    from dataclasses import replace

    from helpers import tiny_cluster, tiny_profile

    MiB = 2**20
    prof = tiny_profile([2e-3, 1e-3, 1e-3, 1e-3, 1e-3], params=[MiB / 4] * 5)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=8, schedules=("1f1b",), top=1)
    cl = tiny_cluster(1, 2, memory_bytes=3.5 * MiB)
    job = Job(8, memory_reserve_bytes=0)
    assert search([ModelVariant(prof)], cl, job, opts).plans[0].layers_per_stage == (2, 3)
    tied = search([ModelVariant(replace(prof, tied_param_bytes=MiB / 4))], cl, job, opts).plans[0]
    assert tied.layers_per_stage == (3, 2)
    last = dict(tied.stages[-1].memory_breakdown)
    assert last["tied_copy"] == pytest.approx(MiB)
    assert tied.stages[-1].memory_bytes == pytest.approx(3 * MiB)


def test_zero3_in_a_pipeline_keeps_what_zero1_keeps():
    """Two layers of 1 MB and 100 MB of 16-bit weights, mixed-precision Adam
    sharded ZeRO-3 over dp 2. One stage (pp 1): 16 B / 2 per parameter and
    two gathered copies of the largest unit (FSDP's computing and
    prefetched), 2 x 100 MB. pp 2: each stage keeps its 16-bit weights and
    gradients whole through the iteration (the pipeline reduces and
    reshards after its last micro-batch) and 12 B / 2 of optimizer state:
    (2 + 2 + 6) B per parameter, nothing gathered."""
    from helpers import tiny_cluster, tiny_profile
    from pipesearch.memory import preset
    from pipesearch.search import search
    from pipesearch.search_options import ModelVariant, SearchOptions
    from pipesearch.types import Job

    prof = tiny_profile([1e-3, 1e-3], params=[1e6, 100e6], bytes_per_param=2.0)
    job = Job(4, memory_reserve_bytes=0, param_state=preset("mixed-adam", "zero3"))

    def stages(pp, split):
        plan = search([ModelVariant(prof)], tiny_cluster(1, 4), job,
                      SearchOptions(pp=pp, dp=2, micro_batch_size=1, schedules=("1f1b",), split=split)).plans[0]
        return [dict(st.memory_breakdown) for st in plan.stages]

    def state(parts):
        return sum(v for k, v in parts.items() if k not in ("gathered_weights", "tied_copy", "activations"))

    alone = stages(1, (2,))
    assert alone[0]["gathered_weights"] == pytest.approx(200e6)
    assert state(alone[0]) == pytest.approx(50.5e6 * 16 / 2)
    piped = stages(2, (1, 1))
    assert [p["gathered_weights"] for p in piped] == [0, 0]
    assert [state(p) for p in piped] == pytest.approx([0.5e6 * 10, 50e6 * 10])


def test_data_parallel_reduce_moves_the_gradients_the_state_keeps():
    """A 16-bit profile trained in fp32 (``fp32-adam``: 4-byte weights and
    gradients) all-reduces 4 bytes a parameter, twice mixed-adam's 2; with
    Megatron's fp32 main gradients, 4 as well; a pinned figure wins."""
    from dataclasses import replace as dc_replace

    from pipesearch.costs import dp_reduce_bytes_per_param
    from pipesearch.types import Job

    job = Job(global_batch_size=8)
    assert dp_reduce_bytes_per_param(job, preset("mixed-adam"), 2.0) == 2.0
    assert dp_reduce_bytes_per_param(job, preset("fp32-adam"), 2.0) == 4.0
    assert dp_reduce_bytes_per_param(job, preset("megatron"), 2.0) == 4.0
    assert dp_reduce_bytes_per_param(dc_replace(job, grad_bytes_per_param=1.0), preset("fp32-adam"), 2.0) == 1.0
