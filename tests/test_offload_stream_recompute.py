"""Streamed weights with recompute levels, per stage
(pipesearch.stage_options.mixed_stream_options, pipesearch.option_search).

Oracles: stage times and bytes written out by hand from the layer tables
(a streamed layer takes max(fwd, w / bw) forward and max(bwd, 2 w / bw)
backward, ZeRO-Infinity sec. 5-6; a recomputed layer re-runs its forward in
backward, Chen et al. 2016 sec. 3; two layers' 16-bit weights and gradients
on the GPU, 2 + 16 B per parameter on the host), a 1F1B timeline traced by
hand, and the discrete-event simulator replaying every split x every
per-stage option (each recompute level on the device and streamed).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from helpers import all_splits, tiny_cluster
from pipesearch.costs import build_pipeline_costs
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, simulate_times
from pipesearch.types import HostSpec, Job, Layer, ModelProfile

GB = 1e9


def _host(**kw) -> HostSpec:
    base = dict(memory_bytes=800 * GB, pcie_generation=4, pcie_lanes_per_gpu=16,
                host_to_device_bytes_per_s=25 * GB, switch_uplink_bytes_per_s=25 * GB,
                pcie_switches=((0, 1, 2, 3), (4, 5, 6, 7)), cpu_adam_params_per_s=1e10)
    base.update(kw)
    return HostSpec(**base)


def _profile(fwd, bwd, params, saved, ckpt=None, name="s") -> ModelProfile:
    return ModelProfile(name=name, layers=tuple(
        Layer(name=f"l{k}", fwd_s=fwd[k], bwd_s=bwd[k], param_bytes=params[k], output_bytes=0.0,
              saved_bytes=saved[k], recompute_saved_bytes=None if ckpt is None else ckpt[k])
        for k in range(len(fwd))), profiled_batch_size=1, bytes_per_param=2.0)


# ------------------------------------------------------------- the hand case


def _hand_case():
    """Two layers (pp 2, one split), each 2e9 weight bytes (1e9 parameters),
    forward 0.2 s, backward 0.4 s, 8 GB saved per micro-batch, 1 GB when
    recomputed; 20 GB GPUs 0 and 1 under one 25 GB/s switch (12.5 GB/s
    each); 1F1B, m = 4: stage 0 holds 2 micro-batches, stage 1 one."""
    prof = _profile([0.2, 0.2], [0.4, 0.4], [2 * GB, 2 * GB], [8 * GB, 8 * GB], [1 * GB, 1 * GB])
    cluster = replace(tiny_cluster(1, 8, memory_bytes=20 * GB), host=_host())
    return prof, cluster


def test_hand_case_needs_one_stage_streamed_plain_and_one_streamed_recomputed():
    """Device memory (16 B per parameter on the device; streamed: 2 layers x
    (weights + gradients) = 4 x 2e9 = 8 GB of buffers):

    stage 0 (2 in flight): none 16 + 2 x 8 = 32, full 16 + 2 x 1 + 8 = 26,
    none+stream 8 + 16 = 24 GB: none fits 20 GB; full+stream 8 + 2 x 1 + 8
    (the recomputed layer's activations) = 18 GB fits.
    stage 1 (1 in flight): none 24, full 16 + 1 + 8 = 25, none+stream 8 + 8
    = 16 GB fits.

    Times (copy of a layer 2e9 / 12.5e9 = 0.16 s): stage 0 forward max(0.2,
    0.16) = 0.2 s, backward max(0.4 + 0.2, 0.32) = 0.6 s; stage 1 forward
    0.2 s, backward max(0.4, 0.32) = 0.4 s; CPU Adam 1e9 parameters x 2
    GPUs / 1e10 = 0.2 s after each stage's last backward.

    1F1B traced: stage 0 F1 [0, .2] F2 [.2, .4]; stage 1 F1 [.2, .4] B1
    [.4, .8]; stage 0 B1 [.8, 1.4]; stage 1 F2 [.8, 1] B2 [1, 1.4]; stage 0
    F3 [1.4, 1.6] B2 [1.6, 2.2]; stage 1 F3 [1.6, 1.8] B3 [1.8, 2.2]; stage 0
    F4 [2.2, 2.4] B3 [2.4, 3]; stage 1 F4 [2.4, 2.6] B4 [2.6, 3]; stage 0 B4
    [3, 3.6], its step to 3.8 s; stage 1 ends at 3.2 s. Iteration 3.8 s.
    With both stages on full+stream stage 1's backward is 0.6 s (slower);
    without the levels (plain streaming only) stage 0 fits nothing."""
    prof, cluster = _hand_case()
    job = Job(global_batch_size=4, memory_reserve_bytes=0, weight_streaming=True)
    costs = build_pipeline_costs(prof, cluster, job, pp=2, dp=1, micro_batch_size=1, num_micro_batches=4,
                                 schedule="1f1b", placement=np.array([[0], [1]]), weight_streaming=True)
    assert costs.options.names[2::3] == ("none+stream", "full+stream")
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=4, schedules=("1f1b",), top=1)
    plan = search([ModelVariant(prof)], cluster, job, opts).plans[0]
    assert [st.memory_option for st in plan.stages] == ["full+stream", "none+stream"]
    assert [st.fwd_s for st in plan.stages] == pytest.approx([0.2, 0.2])
    assert [st.compute_s for st in plan.stages] == pytest.approx([0.8, 0.6])  # forward + backward
    assert [st.host_step_s for st in plan.stages] == pytest.approx([0.2, 0.2])
    assert [st.memory_bytes for st in plan.stages] == pytest.approx([18 * GB, 16 * GB])
    assert plan.predicted.iteration_time_s == pytest.approx(3.8)


def test_stream_level_terms_by_hand():
    """The same point's options, stage by stage: stage 0's first fitting
    option is full+stream (index 5 of none, none+stream (bound),
    none+stream, full, full+stream (bound), full+stream), stage 1's
    none+stream; the relaxed chain's bound of none is, layer by layer, the
    least of none streamed and full on the device (0.2 s forward, backward
    min(0.4, 0.6) = 0.4 s) with no host step, and at the last level it is
    full streamed with its step."""
    from pipesearch.stage_options import RELAXED

    prof, cluster = _hand_case()
    job = Job(global_batch_size=4, memory_reserve_bytes=0, weight_streaming=True)
    costs = build_pipeline_costs(prof, cluster, job, pp=2, dp=1, micro_batch_size=1, num_micro_batches=4,
                                 schedule="1f1b", placement=np.array([[0], [1]]), weight_streaming=True)
    assert costs.options.names == ("none", "none+stream (bound)", "none+stream", "full", "full+stream (bound)",
                                   "full+stream")
    assert costs.option_name(0, 0, 1) == "full+stream" and costs.option_name(1, 1, 2) == "none+stream"
    relaxed = replace(costs, options=costs.options.with_policies((RELAXED, RELAXED)))
    assert relaxed.option_name(1, 1, 2) == "none+stream (bound)"
    assert relaxed.bwd_s(1, 1, 2) == pytest.approx(0.4) and relaxed.host_step_s(1, 1, 2) == 0.0
    assert relaxed.option_name(0, 0, 1) == "full+stream (bound)"
    assert relaxed.bwd_s(0, 0, 1) == pytest.approx(0.6) and relaxed.host_step_s(0, 0, 1) == pytest.approx(0.2)


# ------------------------------------------------------------- brute force


#: a GPU's optimizer step per parameter: 28 B (mixed-precision Adam) at 0.8 x tiny_device's 1e12 B/s
GPU_STEP_S_PER_PARAM = 28 / 0.8e12


def _step_s_per_param(streamed: bool, host_s_per_param: float) -> float:
    """A stage's optimizer step per parameter: on the host when its weights
    stream (the CPU's Adam, never timed below the GPU's own step, which the
    per-stage options' chain needs), else on the GPU."""
    return max(host_s_per_param, GPU_STEP_S_PER_PARAM) if streamed else GPU_STEP_S_PER_PARAM


def _stream_brute_force(levels, pp, m, capacity, bw, host_share, adam_rate, recomputed_transient):
    """Every split x every per-stage option (each level of ``levels``, a
    list of ``(name, fwd, bwd, saved)`` per-layer lists, on the device or
    streamed), with the parameters ``levels[0][4]``; times and bytes by
    hand, simulated with 1F1B. ``recomputed_transient[r]``: per layer, the
    bytes level ``r``'s backward re-creates (0 when it keeps them all)."""
    params = levels[0][4]
    in_flight = [min(m, pp - s) for s in range(pp)]
    options = [(r, st) for r in range(len(levels)) for st in (False, True)]
    L = len(params)
    best, arg = np.inf, []
    for bounds in all_splits(L, pp):
        for choice in itertools.product(options, repeat=pp):
            F, B, I, R, ok = [], [], [], [], True
            for s, (i, j) in enumerate(zip(bounds[:-1], bounds[1:])):
                r, st = choice[s]
                _, fwd, bwd, saved, _ = levels[r]
                f = [max(fwd[x], params[x] / bw) if st else fwd[x] for x in range(i, j)]
                b = [max(bwd[x], 2 * params[x] / bw) if st else bwd[x] for x in range(i, j)]
                F.append(sum(f))
                B.append(sum(b))
                I.append(sum(b) / 2)
                n = sum(params[i:j]) / 2
                R.append(n * _step_s_per_param(st, pp / adam_rate))
                act = sum(saved[i:j]) * in_flight[s] + max(recomputed_transient[r][i:j])
                dev = act + (2 * 2 * max(params[i:j]) if st else 16 * n)
                ok &= dev <= capacity and (n * 18 <= host_share if st else True)
            if ok:
                t = simulate_times("1f1b", pp, m, 1, StageTimes(np.array(F), np.array(B), np.array(I),
                                                               np.zeros(pp - 1), np.array(R)))[0]
                if t < best * (1 - 1e-12):
                    best, arg = t, [(bounds, tuple(f"{levels[r][0]}{'+stream' if st else ''}"
                                                   for r, st in choice))]
    return best, arg


def _random_layers(seed, L):
    rng = np.random.default_rng(40 + seed)
    params = (rng.uniform(0.2, 0.8, L) * GB * 2).tolist()
    saved = (rng.uniform(0.5, 2.0, L) * GB).tolist()
    fwd, bwd = rng.uniform(0.1, 0.4, L).tolist(), rng.uniform(0.2, 0.8, L).tolist()
    return params, saved, fwd, bwd


def _cluster3(capacity):
    host = _host(pcie_switches=((0, 1, 2),), memory_bytes=300 * GB)
    return replace(tiny_cluster(1, 3, memory_bytes=capacity), host=host)


@pytest.mark.parametrize("seed,capacity_gb", [(0, 10), (1, 8), (2, 12), (3, 9)])
def test_three_recompute_tables_streamed_equal_brute_force(seed, capacity_gb):
    """none / selective / full tables (selective: backward + 0.3 x forward,
    half the saved bytes; full: backward + forward, 0.1 of them), each on
    the device or streamed, per stage: 3 GPUs under one switch (25 / 3
    GB/s each), pp 3, m 4, 1F1B; the search's best equals the least
    simulated time over every split x every per-stage option."""
    L, pp, m = 6, 3, 4
    params, saved, fwd, bwd = _random_layers(seed, L)
    sel_bwd = [b + 0.3 * f for f, b in zip(fwd, bwd)]
    full_bwd = [b + f for f, b in zip(fwd, bwd)]
    levels = [("none", fwd, bwd, saved, params), ("selective", fwd, sel_bwd, [x / 2 for x in saved], params),
              ("full", fwd, full_bwd, [x / 10 for x in saved], params)]
    tables = tuple((name, _profile(f, b, params, sv, name=name)) for name, f, b, sv, _ in levels)
    best, arg = _stream_brute_force(levels, pp, m, capacity_gb * GB, 25 * GB / 3, 100 * GB, 1e10,
                                    [[0.0] * L] * 3)
    assert np.isfinite(best) and any("+stream" in o for o in arg[0][1])
    cluster = _cluster3(capacity_gb * GB)
    job = Job(global_batch_size=m, memory_reserve_bytes=0, weight_streaming=True)
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("1f1b",), top=1)
    variant = ModelVariant(tables[0][1], recompute="per-stage", stage_tables=tables)
    plan = search([variant], cluster, job, opts).plans[0]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    assert dict(plan.extra)["split_search"]["exact"]


@pytest.mark.parametrize("seed,capacity_gb", [(0, 10), (1, 10), (1, 16), (2, 8)])
def test_recompute_column_profile_streamed_equals_brute_force(seed, capacity_gb):
    """A profile with recompute columns (none and full: the full level keeps
    0.1 of the saved bytes and re-creates a layer's full activations while
    its backward runs), each on the device or streamed, per stage: the
    search's best equals the brute force."""
    L, pp, m = 6, 3, 4
    params, saved, fwd, bwd = _random_layers(10 + seed, L)
    ckpt = [x / 10 for x in saved]
    levels = [("none", fwd, bwd, saved, params), ("full", fwd, [b + f for f, b in zip(fwd, bwd)], ckpt, params)]
    best, arg = _stream_brute_force(levels, pp, m, capacity_gb * GB, 25 * GB / 3, 100 * GB, 1e10,
                                    [[0.0] * L, saved])
    assert np.isfinite(best) and any("+stream" in o for o in arg[0][1])
    cluster = _cluster3(capacity_gb * GB)
    job = Job(global_batch_size=m, memory_reserve_bytes=0, weight_streaming=True)
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("1f1b",), top=1)
    plan = search([ModelVariant(_profile(fwd, bwd, params, saved, ckpt))], cluster, job, opts).plans[0]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)


def _transformer_stream_brute_force(tables, pp, m, capacity, bw, adam_rate):
    """Every split x every per-stage option of the none / selective / full
    transformer tables, each on the device or streamed (times and bytes
    from each table's layers as in :func:`_stream_brute_force`, the
    input-gradient part the table's, scaled with the streamed backward)."""
    in_flight = [min(m, pp - s) for s in range(pp)]
    L = tables[0][1].num_layers
    options = [(r, st) for r in range(len(tables)) for st in (False, True)]
    best, arg = np.inf, []
    for bounds in all_splits(L, pp):
        for choice in itertools.product(options, repeat=pp):
            F, B, I, R, ok = [], [], [], [], True
            for s, (i, j) in enumerate(zip(bounds[:-1], bounds[1:])):
                r, st = choice[s]
                lay = tables[r][1].layers[i:j]
                c = [x.param_bytes / bw if st else 0.0 for x in lay]
                f = [max(x.fwd_s, cx) for x, cx in zip(lay, c)]
                b = [max(x.bwd_s, 2 * cx) for x, cx in zip(lay, c)]
                bi = [(x.bwd_s / 2 if x.bwd_input_s is None else x.bwd_input_s) * (bx / x.bwd_s if x.bwd_s else 1.0)
                      for x, bx in zip(lay, b)]
                F.append(sum(f))
                B.append(sum(b))
                I.append(sum(bi))
                n = sum(x.param_bytes for x in lay) / 2
                R.append(n * _step_s_per_param(st, pp / adam_rate))
                # in flight, plus what the recomputing block holds once more in its backward (its whole
                # activations under full recomputation, the attention core under selective)
                act = sum(x.saved_bytes for x in lay) * in_flight[s] + max(
                    x.backward_transient_bytes or 0.0 for x in lay)
                ok &= act + (4 * max(x.param_bytes for x in lay) if st else 16 * n) <= capacity
            if ok:
                t = simulate_times("1f1b", pp, m, 1, StageTimes(np.array(F), np.array(B), np.array(I),
                                                               np.zeros(pp - 1), np.array(R)))[0]
                if t < best * (1 - 1e-12):
                    best, arg = t, [(bounds, tuple(tables[r][0] + ("+stream" if st else "") for r, st in choice))]
    return best, arg


@pytest.mark.parametrize("capacity_mib", [90, 120, 150, 250])
def test_transformer_tables_streamed_equal_brute_force(tmp_path, capacity_mib):
    """A 6-block decoder's none / selective / full tables
    (``--recompute per-stage``), each on the device or streamed, per stage,
    on 3 GPUs under one switch whose share copies a block's weights in
    about its forward time: the search's best equals the brute force."""
    from test_recompute_per_stage import TINY

    from pipesearch.models import load_model_source

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    plain = tiny_cluster(1, 3, memory_bytes=capacity_mib * 2**20)
    src = load_model_source(str(path), plain, tp=1, recompute="per-stage")
    (variant,) = src.variants
    tables = variant.stage_tables
    blocks = [x for x in tables[0][1].layers if x.fwd_s > 0]
    bw = float(np.mean([x.param_bytes for x in blocks]) / np.mean([x.fwd_s for x in blocks]))
    host = _host(pcie_switches=((0, 1, 2),), memory_bytes=300 * GB, host_to_device_bytes_per_s=3 * bw,
                 switch_uplink_bytes_per_s=3 * bw, cpu_adam_params_per_s=1e12)
    cluster = replace(plain, host=host)
    best, arg = _transformer_stream_brute_force(tables, 3, 6, capacity_mib * 2**20, bw, 1e12)
    assert np.isfinite(best) and any("+stream" in o for o in arg[0][1])
    job = Job(global_batch_size=6, memory_reserve_bytes=0, weight_streaming=True)
    opts = SearchOptions(pp=3, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("1f1b",), top=1)
    plan = search(list(src.variants), cluster, job, opts, profiled_device=src.profiled_device).plans[0]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)


def test_pinned_full_recompute_streamed_holds_the_recomputed_block():
    """``--stream-weights --recompute full`` (one recompute level, the
    ``on-device, stream`` chain) holds what a fully recomputed stage holds
    on the device: the checkpoints of its blocks in flight and, during a
    block's backward, that block's whole activations (Chen et al. 2016).
    Qwen3-32B, tp 2 with sequence parallelism, micro-batch 4 of 2048
    tokens, 1F1B pp 4: stage 0 (embedding + 14 blocks) keeps 4 micro-batches
    of checkpoints, 14 x 2 s b h / tp = 14 x 2 x 2048 x 4 x 5120 / 2 B each
    (by hand: 2,348,810,240 B), plus the recomputed block's activations,
    which the optimizer offload's full-recompute stage (a separate path,
    weights on the host as well) and the per-stage choice ``full+stream``
    count alike. Streaming used to leave that block out."""
    import json

    from click.testing import CliRunner

    from pipesearch.cli import main

    def stage0(*extra):
        res = CliRunner().invoke(main, ["plan", "-q", "--json", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4",
                                        "-b", "32", "--seq-len", "2048", "--pp", "4", "--tp", "2", "--schedule", "1f1b",
                                        "--micro-batch-size", "4", "--split", "15,17,17,17", *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)["plans"][0]["stages"][0]["memory_breakdown_bytes"]

    checkpoints = 4 * 14 * 2 * 2048 * 4 * 5120 / 2
    assert checkpoints == 2_348_810_240
    streamed = stage0("--stream-weights", "--recompute", "full")["activations"]
    offloaded = stage0("--optimizer-offload", "--recompute", "full")["activations"]
    per_stage = stage0("--stream-weights", "--recompute", "per-stage")["activations"]
    block = streamed - checkpoints
    # the whole activations of one block at 4 x 2048 tokens but for the attention core (fused attention: the
    # scores are never whole), tp 2 without sp: QKV and fc1 inputs whole, 2 x 2 x 8192 x 5120 B; Q, K, V and
    # out-proj inputs 2 x 8192 x (8192 + 1024 + 1024 + 8192) B and gate, up, fc2 inputs 3 x 2 x 8192 x 25600 B,
    # halved (by hand: 947,912,704 B, and the norms' statistics)
    assert block == pytest.approx(2 * 2 * 8192 * 5120 + (2 * 8192 * 18432 + 3 * 2 * 8192 * 25600) / 2, rel=1e-3)
    assert streamed == pytest.approx(offloaded, rel=1e-12) and streamed == pytest.approx(per_stage, rel=1e-12)


def test_one_stage_streams_a_tied_matrix_for_its_head_too(tmp_path):
    """Qwen3-1.7B (tied embeddings) streamed on one RTX 4090: the head
    multiplies by the embedding matrix, which a streamed stage holding
    both copies in for each (forward in, backward in, gradient out, per
    micro-batch). PCIe bytes per iteration = 3 m (stage weights + tied
    matrix), the tied matrix 151,936 x 2048 bf16 = 622,329,856 B; it was
    counted once (3 m x stage weights, 18% short). Stage weights by hand:
    28 blocks of attention 2048 x (2048 + 2 x 1024) + 2048 x 2048, MLP
    3 x 2048 x 6144, norms 2 x 2048 and QK-norms 2 x 128, the 151,936 x
    2048 embedding and the final norm: 1,720,574,976 parameters, bf16 (the
    cost model leaves the 7,168 QK-norm weights out: within 1e-5)."""
    import json

    from click.testing import CliRunner

    from pipesearch.cli import main

    cluster = ('name = "one"\nnodes = 1\ndevices_per_node = 1\ndevice = "rtx4090-24gb"\n'
               "[intra_node]\nbandwidth_GBps = 12.5\nlatency_us = 20\n[inter_node]\nbandwidth_GBps = 12.5\n"
               "latency_us = 20\n[host]\nmemory_GB = 64\npcie_generation = 4\npcie_lanes_per_gpu = 16\n"
               "host_to_device_GBps = 25\nswitch_uplink_GBps = 25\npcie_switches = [[0]]\n"
               "cpu_adam_params_per_s = 1e9\n")
    (tmp_path / "c.toml").write_text(cluster)
    r = CliRunner().invoke(main, ["plan", "--model", "qwen3-1.7b", "--cluster", str(tmp_path / "c.toml"), "-b", "16",
                                  "--seq-len", "2048", "--stream-weights", "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    tied = 151936 * 2048 * 2
    block = 2048 * (2048 + 2 * 1024) + 2048 * 2048 + 3 * 2048 * 6144 + 2 * 2048 + 2 * 128
    weights = 2 * (28 * block + 151936 * 2048 + 2048)
    for plan in json.loads(r.output)["plans"]:
        assert len(plan["stages"]) == 1
        m = plan["schedule"]["num_micro_batches"]
        assert plan["options"]["host"]["total_pcie_bytes_per_iteration"] == pytest.approx(3 * m * (weights + tied),
                                                                                          rel=1e-5)
