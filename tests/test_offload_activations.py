"""Activation offload as a per-stage memory option
(pipesearch.stage_options.activation_host_options, --activation-offload).

Oracles: copy times written out by hand from the host table (fair share of
a switch's uplink, full duplex), schedules traced by hand, and the time
model (pipesearch.timemodel.iteration_time_s) replaying every split x every
per-stage option with stage times and bytes derived here from the layer
table, independently of the cost model.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from helpers import all_splits, pcie_host, tiny_cluster
from pipesearch.costs import build_pipeline_costs
from pipesearch.errors import InfeasibleError
from pipesearch.search import search
from pipesearch.point_plan import simulate_plan
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, iteration_time_s
from pipesearch.types import Job, Layer, ModelProfile

GB = 1e9


def _profile(fwd, bwd, params, saved, ckpt=None) -> ModelProfile:
    ckpt = ckpt or [None] * len(fwd)
    return ModelProfile(name="act", layers=tuple(
        Layer(name=f"l{k}", fwd_s=fwd[k], bwd_s=bwd[k], param_bytes=params[k], output_bytes=0.0,
              saved_bytes=saved[k], recompute_saved_bytes=ckpt[k]) for k in range(len(fwd))),
        profiled_batch_size=1, bytes_per_param=2.0)


def _hand_profile(saved1=1 * GB):
    """Layer 0: 0.25e9 parameters (16 B each: 4 GB of state), 6 GB saved per
    micro-batch, F 0.2 s, B 0.4 s; layer 1 the same with ``saved1``."""
    return _profile([0.2, 0.2], [0.4, 0.4], [0.5e9, 0.5e9], [6 * GB, saved1])


#: a hand-profile stage's optimizer step on the GPU: 0.25e9 parameters x 28 B (mixed-precision Adam) at 0.8 x
#: tiny_device's 1e12 B/s
STEP_S = 0.25e9 * 28 / 0.8e12


def _search(prof, cluster, pp, m, schedule, **job_kw):
    job = Job(global_batch_size=m, memory_reserve_bytes=0, activation_offload=True, **job_kw)
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=(schedule,), top=1)
    return search([ModelVariant(prof)], cluster, job, opts).plans[0]


# ------------------------------------------------------------- (a) the hand case


def test_a_stage_that_fits_only_with_its_activations_on_the_host():
    """GPipe, pp 2, m = 6 (every stage holds 6 micro-batches), 24 GB GPUs 0
    and 1 under one switch of 25 GB/s: 12.5 GB/s each.

    Stage 0 (layer 0): on the device 4 + 6 x 6 = 40 GB (no); offloaded it
    keeps 3 micro-batches (computing, leaving, arriving): 4 + 3 x 6 = 22 GB.
    Its copy of 6 GB takes 6 / 12.5 = 0.48 s each way, longer than its
    forward (0.2 s) and backward (0.4 s): each action lasts 0.48 s. Stage 1
    (layer 1): 4 + 6 x 1 = 10 GB, on the device, F 0.2, B 0.4.

    Trace: stage 0's forwards end at 0.48 k (k = 1..6), stage 1's at 0.48 k
    + 0.2, the last at 3.08; stage 1's six backwards run back to back from
    3.08, the first ending at 3.48; stage 0's backwards, 0.48 s each (slower
    than stage 1's 0.4 s), start at 3.48 and run back to back: 3.48 + 6 x
    0.48 = 6.36 s, then its optimizer step: 0.25e9 parameters x 28 B at 0.8
    x 1e12 B/s = 8.75 ms (stage 1's ends earlier). Host: 6 micro-batches x
    6 GB = 36 GB; PCIe 2 x 6 x 6 GB = 72 GB per iteration."""
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB), host=pcie_host())
    plan = _search(_hand_profile(), cluster, 2, 6, "gpipe")
    assert [st.memory_option for st in plan.stages] == ["act-host", "on-device"]
    assert plan.predicted.iteration_time_s == pytest.approx(6.36 + STEP_S)
    s0, s1 = plan.stages
    assert s0.fwd_s == pytest.approx(0.48) and s0.compute_s == pytest.approx(0.96)
    assert s1.fwd_s == pytest.approx(0.2) and s1.compute_s == pytest.approx(0.6)
    assert s0.memory_bytes == pytest.approx(22 * GB) and s1.memory_bytes == pytest.approx(10 * GB)
    host = dict(plan.extra)["host"]
    assert host["activation_host_memory_bytes"] == pytest.approx([36 * GB, 0.0])
    assert host["activation_pcie_bytes_per_iteration"] == pytest.approx([72 * GB, 0.0])
    assert host["host_memory_bytes"] == pytest.approx([36 * GB, 0.0])
    # the trace, replayed by the time model from the hand stage times
    hand = StageTimes(fwd_s=np.array([0.48, 0.2]), bwd_s=np.array([0.48, 0.4]), bwd_input_s=np.array([0.24, 0.2]),
                      p2p_s=np.zeros(1), allreduce_s=np.full(2, STEP_S))
    assert iteration_time_s("gpipe", 2, 6, 1, hand) == pytest.approx(6.36 + STEP_S)
    # without the flag stage 0 cannot fit
    with pytest.raises(InfeasibleError):
        opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("gpipe",), top=1)
        search([ModelVariant(_hand_profile())], cluster, Job(global_batch_size=6, memory_reserve_bytes=0), opts)


def test_simulate_counts_only_the_resident_micro_batches_of_an_offloading_stage():
    """The hand case's plan replayed by ``pipesearch simulate``'s path: GPipe
    holds all 6 micro-batches of stage 0 at its peak, but an offloading stage
    keeps 3 of them on the GPU: 3 x 6 GB = 18 GB of activations on rank 0
    (the plan's 22 GB less its 4 GB of state); stage 1 keeps its 6 x 1 GB."""
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB), host=pcie_host())
    plan = _search(_hand_profile(), cluster, 2, 6, "gpipe")
    _, tl = simulate_plan(plan)
    assert tl.peak_in_flight == (6, 6)
    assert tl.peak_act_bytes == pytest.approx((18 * GB, 6 * GB))


def test_copies_shorter_than_compute_cost_nothing():
    """The hand case with 20 GB/s per GPU alone and a 100 GB/s uplink:
    min(20, 100 / 2) = 20 GB/s, 6 / 20 = 0.3 s: exposed in the forward
    (0.3 > 0.2), hidden in the backward (0.4 > 0.3)."""
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB),
                      host=pcie_host(host_to_device_bytes_per_s=20 * GB, switch_uplink_bytes_per_s=100 * GB))
    plan = _search(_hand_profile(), cluster, 2, 6, "gpipe")
    assert plan.stages[0].fwd_s == pytest.approx(0.3)
    assert plan.stages[0].compute_s - plan.stages[0].fwd_s == pytest.approx(0.4)


# ------------------------------------------------------------- (c) host memory


def test_host_memory_overflow_is_refused_with_its_reason():
    """The hand case on a host of 60 GB: each of the plan's 2 GPUs may fill
    30 GB (27.9 GiB), stage 0 needs 36 GB (33.5 GiB): no plan, and the
    message says that host memory is why."""
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB), host=pcie_host(memory_bytes=60 * GB))
    with pytest.raises(InfeasibleError) as err:
        _search(_hand_profile(), cluster, 2, 6, "gpipe")
    text = str(err.value)
    assert "host memory: stage 0" in text and "act-host" in text
    assert "33.5 GiB" in text and "27.9 GiB share" in text and "\n" not in text
    # 72 GB of host memory (36 GB each) is enough
    cluster = replace(cluster, host=pcie_host(memory_bytes=72 * GB))
    assert _search(_hand_profile(), cluster, 2, 6, "gpipe").stages[0].memory_option == "act-host"


def test_gib_pair_shows_the_digits_that_tell_need_from_capacity():
    """27.53e9 B against 27.5e9 B are both 25.6 GiB at one decimal: two
    decimals tell them apart (25.639..., 25.611...); values apart at one
    decimal keep one; equal values keep one."""
    from pipesearch.units import format_gib_pair

    assert format_gib_pair(27.53e9, 27.5e9) == ("25.64 GiB", "25.61 GiB")
    assert format_gib_pair(36 * GB, 30 * GB) == ("33.5 GiB", "27.9 GiB")
    assert format_gib_pair(2**31, 2**31) == ("2.0 GiB", "2.0 GiB")
    assert format_gib_pair(2**31 + 1000, 2**31) == ("2,147,484,648 B", "2,147,483,648 B")  # apart below 1e-4 GiB


def test_host_overflow_of_the_optimizer_alone_suggests_no_more_offload(tmp_path):
    """qwen3-1.7b with its optimizer offloaded keeps 16 B per parameter on
    the host (fp32 master weights, gradients, momentum and variance, as
    docs/offload.md counts) and 4 on the GPU. Its 1.7206e9 parameters (28 blocks of 2048 x (2048 + 2 x 1024
    + 2048) attention and 3 x 2048 x 6144 MLP weights plus norms, and a
    tied 151,936 x 2048 embedding) need 27.53e9 B = 25.64 GiB; 27.5e9 B
    is 25.61 GiB. The message gives both
    figures apart (not "25.6 GiB against 25.6 GiB"), does not suggest the
    flags that keep more on the host, nor fewer micro-batches (no
    activations are offloaded)."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    cluster = tmp_path / "c.toml"
    cluster.write_text('name = "one"\nnodes = 1\ndevices_per_node = 1\ndevice = "rtx4090-24gb"\n'
                       "[intra_node]\nbandwidth_GBps = 12.5\nlatency_us = 20\n"
                       "[inter_node]\nbandwidth_GBps = 12.5\nlatency_us = 20\n"
                       "[host]\nmemory_GB = 27.5\npcie_generation = 4\npcie_lanes_per_gpu = 16\n"
                       "host_to_device_GBps = 25\nswitch_uplink_GBps = 25\npcie_switches = [[0]]\n"
                       "cpu_adam_params_per_s = 1e9\n")
    result = CliRunner().invoke(main, ["plan", "--model", "qwen3-1.7b", "--cluster", str(cluster), "-b", "16",
                                       "--seq-len", "2048", "--optimizer-offload"])
    assert result.exit_code == 2, result.output
    text = result.output
    assert "host memory: stage 0" in text and "25.64 GiB in host memory per GPU against its 25.61 GiB share" in text
    assert "--activation-offload" not in text and "--stream-weights" not in text
    assert "offloaded activations" not in text and "fewer micro-batches" not in text


def test_cli_flag_needs_a_host_table_and_records_the_job():
    from click.testing import CliRunner

    from pipesearch.cli import main

    r = CliRunner().invoke(main, ["plan", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--activation-offload"])
    assert r.exit_code == 2
    assert "--activation-offload" in r.output and "[host]" in r.output


# ------------------------------------------------------------- (d) PCIe contention


def _two_offloading_stages(devices):
    """Both layers save 6 GB: each stage needs 4 + 36 GB on the device, so
    both offload, on GPUs ``devices``."""
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB), host=pcie_host())
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True)
    costs = build_pipeline_costs(_hand_profile(6 * GB), cluster, job, pp=2, dp=1, micro_batch_size=1,
                                 num_micro_batches=6, schedule="gpipe", placement=np.array([[d] for d in devices]))
    bounds = np.array([0, 1, 2])
    return costs, iteration_time_s("gpipe", 2, 6, 1, costs.stage_times(bounds))


def test_two_gpus_under_one_switch_offloading_take_longer_than_one():
    """GPUs 0 and 1 share switch 0's 25 GB/s uplink: 12.5 GB/s each, 0.48 s
    per copy, F = B = 0.48 s on both stages: GPipe (6 + 1) x (0.48 + 0.48)
    = 6.72 s. GPUs 0 and 4 under different switches: 25 GB/s, 0.24 s: F
    0.24, B 0.4: (6 + 1) x 0.64 = 4.48 s; each then adds stage 0's optimizer
    step, ``STEP_S``."""
    shared, t_shared = _two_offloading_stages((0, 1))
    apart, t_apart = _two_offloading_stages((0, 4))
    for costs in (shared, apart):
        assert [costs.option_name(s, s, s + 1) for s in range(2)] == ["act-host", "act-host"]
    assert shared.fwd_s(0, 0, 1) == pytest.approx(0.48) and shared.bwd_s(1, 1, 2) == pytest.approx(0.48)
    assert apart.fwd_s(0, 0, 1) == pytest.approx(0.24) and apart.bwd_s(1, 1, 2) == pytest.approx(0.4)
    assert t_shared == pytest.approx(6.72 + STEP_S) and t_apart == pytest.approx(4.48 + STEP_S)
    assert t_shared > t_apart


def test_delayed_optimizer_step_shares_the_link_with_the_activations():
    """With the optimizer offloaded and its step delayed, the step's copies
    run beside the activation copies of the next iteration: each gets half
    of the GPU's 12.5 GB/s, so 6 GB takes 0.96 s (an act-host+offload
    stage), against 0.48 s for an act-host stage on the device. On 20 GB
    GPUs stage 0 fits only as act-host+offload: on the device 4 + 36 GB,
    act-host 4 + 18 = 22 GB, on-device+offload 1 + 36 GB, act-host+offload
    1 + 18 = 19 GB."""
    cluster = replace(tiny_cluster(1, 8, memory_bytes=20 * GB), host=pcie_host())
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True, optimizer_offload=True,
              delayed_optimizer_step=True)
    costs = build_pipeline_costs(_hand_profile(), cluster, job, pp=2, dp=1, micro_batch_size=1,
                                 num_micro_batches=6, schedule="gpipe", placement=np.array([[0], [1]]),
                                 optimizer_offload=True)
    from pipesearch.option_search import with_policies
    from pipesearch.stage_options import OFFLOAD_FIRST

    c = with_policies(costs, (OFFLOAD_FIRST, OFFLOAD_FIRST))
    assert c.option_name(0, 0, 1) == "act-host+offload"
    assert c.fwd_s(0, 0, 1) == pytest.approx(0.96)
    # the step: 0.25e9 params x (4 B / 6.25 GB/s + 2 / 1e9 s Adam shared by 2 GPUs) = 0.66 s
    assert c.host_step_s(0, 0, 1) == pytest.approx(0.25e9 * (4 / 6.25e9 + 2 / 1e9))


# ------------------------------------------------------------- (b) brute force


def _by_hand(prof, bounds, options, in_flight, capacity, host_share, bw, step_s_per_param, wgrad=False):
    """``(fits, StageTimes)`` of a split with per-stage options, from the
    layer table: 16 B per parameter on the GPU (4 B with the optimizer
    offloaded, 16 B then on the host); full recompute keeps each
    recomputable layer's checkpoint per micro-batch plus one layer's
    activations; an act-host stage keeps 3 micro-batches' kept bytes, the
    host all in flight, and each action lasts max(compute, kept / bw); the
    optimizer steps on the host when offloaded, else on the GPU (28 B per
    parameter at 0.8 TB/s)."""
    fwd, bwd, bin_, after, ok = [], [], [], [], True
    for s, (i, j) in enumerate(zip(bounds[:-1], bounds[1:])):
        lay = prof.layers[i:j]
        opt = options[s]
        full, off, act = opt.startswith("full"), opt.endswith("+offload"), "act-host" in opt
        rc = [x.recompute_saved_bytes is not None for x in lay]
        extra = sum(x.fwd_s for x, r in zip(lay, rc) if r) if full else 0.0
        n = sum(x.param_bytes for x in lay) / 2
        keep = sum((x.recompute_saved_bytes if full and r else x.saved_bytes) for x, r in zip(lay, rc))
        transient = max((x.saved_bytes for x, r in zip(lay, rc) if full and r), default=0.0)
        dev = n * (4 if off else 16) + keep * (min(in_flight[s], 3) if act else in_flight[s]) + transient
        host = (n * 16 if off else 0.0) + (keep * in_flight[s] if act else 0.0)
        ok &= dev <= capacity and host <= host_share
        f, b = sum(x.fwd_s for x in lay), sum(x.bwd_s for x in lay) + extra
        i_part = sum(x.bwd_s for x in lay) / 2 + extra
        x = keep / bw if act else 0.0
        if wgrad:  # zero bubble: input- and weight-gradient actions each wait for their copy
            fwd.append(max(f, x))
            bwd.append(max(i_part, x) + max(b - i_part, x))
            bin_.append(max(i_part, x))
        else:
            fwd.append(max(f, x))
            bwd.append(max(b, x))
            bin_.append(i_part * max(b, x) / b)
        after.append(n * step_s_per_param if off else n * 28 / 0.8e12)  # on the GPU: STEP_S's rate
    S = len(fwd)
    return ok, StageTimes(fwd_s=np.array(fwd), bwd_s=np.array(bwd), bwd_input_s=np.array(bin_),
                          p2p_s=np.zeros(S - 1), allreduce_s=np.array(after))


CASES = [  # (seed, layers, pp, m, schedule, capacity GB, optimizer offload)
    (0, 5, 2, 5, "gpipe", 20, False), (1, 6, 3, 4, "gpipe", 17, False), (1, 6, 3, 4, "gpipe", 19, False),
    (3, 5, 2, 5, "gpipe", 16, True), (3, 5, 2, 5, "gpipe", 19, True), (4, 6, 3, 4, "gpipe", 14, True),
    (5, 6, 4, 6, "1f1b", 8, True), (5, 6, 4, 6, "1f1b", 9, True),
]


@pytest.mark.parametrize("seed,L,pp,m,schedule,cap,offload", CASES)
def test_search_equals_brute_force_over_splits_and_option_combinations(seed, L, pp, m, schedule, cap, offload):
    """Random layers on ``pp`` GPUs under one switch (25 / pp GB/s each):
    every split x every per-stage option of (none, full, full+act-host),
    with the optimizer offload also their +offload, times and bytes by hand,
    replayed by the time model; the search's best equals the least, and the
    least needs activation offload somewhere."""
    rng = np.random.default_rng(seed)
    fwd = rng.uniform(0.1, 0.5, L).round(3).tolist()
    bwd = (np.array(fwd) * rng.uniform(1.5, 2.5, L)).round(3).tolist()
    params = (rng.uniform(0.05, 0.25, L) * 2 * GB).tolist()
    saved = (rng.uniform(0.5, 3.0, L) * GB).tolist()
    ckpt = [None if rng.random() < 0.3 else float(rng.uniform(0.3, 0.7)) * s for s in saved]
    prof = _profile(fwd, bwd, params, saved, ckpt)
    adam = 1e9
    host = pcie_host(cpu_adam_params_per_s=adam, pcie_switches=((0, 1, 2, 3, 4, 5, 6, 7),))
    bw = 25 * GB / pp
    step = 4 / bw + pp / adam
    in_flight = [min(m, pp - s) for s in range(pp)] if schedule == "1f1b" else [m] * pp
    names = ("none", "full", "full+act-host") + (("none+offload", "full+offload", "full+act-host+offload")
                                                  if offload else ())
    best, arg = np.inf, []
    for bounds in all_splits(L, pp):
        for options in itertools.product(names, repeat=pp):
            ok, times = _by_hand(prof, bounds, options, in_flight, cap * GB, 800 * GB / pp, bw, step)
            if ok:
                t = iteration_time_s(schedule, pp, m, 1, times)
                if t < best - 1e-9:
                    best, arg = t, [(bounds, options)]
                elif t <= best + 1e-9:
                    arg.append((bounds, options))
    assert np.isfinite(best)
    assert all(any("act-host" in o for o in opts) for _, opts in arg)  # the case needs the option
    cluster = replace(tiny_cluster(1, 8, memory_bytes=cap * GB), host=host)
    plan = _search(prof, cluster, pp, m, schedule, optimizer_offload=offload)
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    got = ((0,) + tuple(int(x) for x in np.cumsum(plan.layers_per_stage)),
           tuple(st.memory_option for st in plan.stages))
    assert got in arg


def test_zero_bubble_input_and_weight_gradients_each_wait_for_a_copy():
    """ZB-H1, pp 4 on GPUs 0-3 under one 25 GB/s switch (6.25 GB/s each):
    stage 0's 6 GB take 0.96 s each way. Its backward is two actions, the
    input gradient (0.2 s, half the backward) and the weight gradient (0.2
    s), each carrying at most one copy: F = I = W = 0.96 s, the backward
    1.92 s. Memory: stage 0's ZB-H1 count states are (3 whole, 1 waiting
    for its weight gradient) and (4, 0); with 2 GB held for the weight
    gradient, on the device max(3 x 6 + 2, 4 x 6) = 24 GB + 4 GB of state =
    28 GB; offloaded at most 3 whole ones, max(3 x 6 + 2, 3 x 6) + 4 = 24
    GB, within 25 GB."""
    prof = _profile([0.2] * 4, [0.4] * 4, [0.5e9] * 4, [6 * GB] + [0.1 * GB] * 3)
    prof = replace(prof, layers=(replace(prof.layers[0], wgrad_saved_bytes=2 * GB),) + prof.layers[1:])
    cluster = replace(tiny_cluster(1, 8, memory_bytes=25 * GB), host=pcie_host())
    job = Job(global_batch_size=8, memory_reserve_bytes=0, activation_offload=True)
    costs = build_pipeline_costs(prof, cluster, job, pp=4, dp=1, micro_batch_size=1, num_micro_batches=8,
                                 schedule="gpipe", placement=np.arange(4)[:, None], wgrad_window=True)
    assert costs.option_name(0, 0, 1) == "act-host" and costs.option_name(1, 1, 2) == "on-device"
    assert costs.fwd_s(0, 0, 1) == pytest.approx(0.96)
    assert costs.bwd_input_s(0, 0, 1) == pytest.approx(0.96)
    assert costs.bwd_s(0, 0, 1) == pytest.approx(1.92)
    assert costs.bwd_s(1, 1, 2) == pytest.approx(0.4) and costs.bwd_input_s(1, 1, 2) == pytest.approx(0.2)
    assert costs.memory_bytes(0, 0, 1) == pytest.approx(24 * GB)
