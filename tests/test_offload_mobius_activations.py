"""Mobius with activations in host memory: every micro-batch's kept
activations copied out after its forward and back before its backward, on
the PCIe queues the weight swaps use (pipesearch.timemodel.mobius_graph
with act, pipesearch.stage_options.swap_options).

Oracles: a timeline traced by hand (copies as link occupancy, one FIFO
queue per switch and direction), copy times derived by hand from the bytes
and the link, and every split of a small model replayed in the time model.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from helpers import all_splits, mobius_gpus_fit, mobius_profile, pcie_host, tiny_cluster
from pipesearch.errors import InfeasibleError
from pipesearch.search import search
from pipesearch.point_plan import simulate_plan
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, iteration_time_s, simulate_times
from pipesearch.types import HostSpec, Job, Layer, ModelProfile

GB = 1e9


def _times(act=None, allreduce=(0.0, 0.0)):
    return StageTimes(fwd_s=np.ones(2), bwd_s=np.full(2, 2.0), bwd_input_s=np.ones(2), p2p_s=np.zeros(1),
                      allreduce_s=np.array(allreduce), swap_in_s=np.full(2, 0.5), swap_out_s=np.full(2, 0.5),
                      swap_queue=(0, 0), act_copy_s=None if act is None else np.full(2, act))


def test_two_gpus_one_switch_traced_by_hand():
    """pp 2, vp 1, m 2, both GPUs under one switch (one queue each way): F
    1 s, B 2 s, weights in and gradients out 0.5 s, activation copies 0.4 s.

    Weights in: stage 0 [0, .5], stage 1 [.5, 1] (one queue). F(0,0) [.5,
    1.5], F(0,1) [1.5, 2.5]; F(1,0) [1.5, 2.5], F(1,1) [2.5, 3.5].
    Out (device to host, micro-batch by micro-batch, rank 0 first): (0,0)
    [1.5, 1.9], (1,0) [2.5, 2.9], (0,1) [2.9, 3.3], (1,1) [3.5, 3.9].
    In (host to device, after the weights, last rank first, backwards from
    m - 1): (1,1) [3.9, 4.3], (0,1) [4.3, 4.7], (1,0) [4.7, 5.1], (0,0)
    [5.1, 5.5]. B(1,1) [4.3, 6.3], B(1,0) [6.3, 8.3]; B(0,1) [6.3, 8.3],
    B(0,0) [8.3, 10.3]. Gradients out: stage 1 [8.3, 8.8], stage 0 [10.3,
    10.8]: T = 10.8 s, against 10 s without the copies (B(1,1) at 3.5)."""
    assert iteration_time_s("mobius", 2, 2, 1, _times()) == pytest.approx(10.0)
    assert iteration_time_s("mobius", 2, 2, 1, _times(0.4)) == pytest.approx(10.8)
    t, tl = simulate_times("mobius", 2, 2, 1, _times(0.4))
    assert t == pytest.approx(10.8)
    start = {(r.kind, r.stage, r.microbatch): r.start_s for r in tl.records}
    assert start[("B", 1, 1)] == pytest.approx(4.3) and start[("B", 0, 1)] == pytest.approx(6.3)
    assert start[("B", 0, 0)] == pytest.approx(8.3)
    # zero-time copies leave this case as it was
    assert iteration_time_s("mobius", 2, 2, 1, _times(0.0)) == pytest.approx(10.0)


def test_forwards_wait_for_the_copy_out_two_before():
    """One GPU (pp 1, vp 1), m 3, F 1 s, copies out 3 s: F(0) [.5, 1.5],
    F(1) [1.5, 2.5], out(0) [1.5, 4.5], so F(2) waits for it: [4.5, 5.5]
    (the GPU holds the micro-batch computing and the one leaving); out(1)
    [4.5, 7.5], out(2) [7.5, 10.5]. Ins: (2) [10.5, 13.5], (1) [13.5,
    16.5]; B(2) [13.5, 15.5]; (0) needs B(2) done and the queue: [16.5,
    19.5]; B(1) [16.5, 18.5], B(0) [19.5, 21.5], gradients out [21.5, 22]."""
    one = StageTimes(fwd_s=np.ones(1), bwd_s=np.full(1, 2.0), bwd_input_s=np.ones(1), p2p_s=np.zeros(0),
                     allreduce_s=np.zeros(1), swap_in_s=np.full(1, 0.5), swap_out_s=np.full(1, 0.5),
                     swap_queue=(0,), act_copy_s=np.full(1, 3.0))
    t, tl = simulate_times("mobius", 1, 3, 1, one)
    assert t == pytest.approx(22.0)
    start = {(r.kind, r.microbatch): r.start_s for r in tl.records}
    assert start[("F", 2)] == pytest.approx(4.5) and start[("B", 0)] == pytest.approx(19.5)


# ------------------------------------------------------------- through the search


def _host(**kw) -> HostSpec:
    return pcie_host(**{"pcie_switches": ((0, 1),), "cpu_adam_params_per_s": 1e10, **kw})


def _two_layers():
    """Each layer: F 1 s, B 2 s, 12.5e9 weight bytes, 10 GB saved per micro-batch."""
    return ModelProfile(name="mob", layers=tuple(
        Layer(name=f"l{k}", fwd_s=1.0, bwd_s=2.0, bwd_input_s=1.0, param_bytes=12.5 * GB, output_bytes=0.0,
              saved_bytes=10 * GB) for k in range(2)), profiled_batch_size=1, bytes_per_param=2.0)


def _plan(m, capacity_gb, act=True):
    cluster = replace(tiny_cluster(1, 2, memory_bytes=capacity_gb * GB), host=_host())
    job = Job(global_batch_size=m, memory_reserve_bytes=0, activation_offload=act)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("mobius",), vps=(1,),
                         top=1)
    return search([ModelVariant(_two_layers())], cluster, job, opts).plans[0]


def test_activations_stay_on_the_gpu_where_they_fit():
    """The hand-traced case from a layer table (weights in 12.5e9 / 25e9 =
    0.5 s, activations 10e9 / 25e9 = 0.4 s) on 50 GB GPUs: m = 2 keeps
    min(2, 3) = 2 micro-batches either way, 2 x 10 + 25 = 45 GB, so no
    stage needs the host: no copies, T = 10 s of the trace + the CPU Adam
    step 6.25e9 parameters x 2 GPUs / 1e10 = 1.25 s after the last
    gradients = 11.25 s (12.05 s with both stages' copies)."""
    plan = _plan(2, 50)
    assert [st.memory_option for st in plan.stages] == ["swap"] * 2
    info = dict(plan.extra)
    assert info["mobius"]["act_copy_s"] == [0.0, 0.0] and info["mobius"]["act_host"] == [False, False]
    assert "activation_pcie_bytes_per_iteration" not in info["host"]
    assert plan.predicted.iteration_time_s == pytest.approx(11.25)
    assert simulate_plan(plan)[0] == pytest.approx(11.25)


def test_copy_times_and_bytes_by_hand():
    """m = 6 on 60 GB GPUs: keeping needs 6 x 10 + 25 = 85 GB, offloaded 3
    x 10 + 25 = 55 GB on both: copies 0.4 s each way; host: all 6
    micro-batches, 60 GB per stage; PCIe 2 x 6 x 10 = 120 GB per stage."""
    plan = _plan(6, 60)
    assert [st.memory_option for st in plan.stages] == ["swap+act-host"] * 2
    info = dict(plan.extra)
    assert info["mobius"]["act_copy_s"] == pytest.approx([0.4, 0.4])
    assert info["mobius"]["swap_in_s"] == pytest.approx([0.5, 0.5])
    assert info["mobius"]["device_peak_bytes"] == pytest.approx([55 * GB, 55 * GB])
    assert info["host"]["activation_host_memory_bytes"] == pytest.approx([60 * GB, 60 * GB])
    assert info["host"]["activation_pcie_bytes_per_iteration"] == pytest.approx([120 * GB, 120 * GB])
    assert simulate_plan(plan)[0] == pytest.approx(plan.predicted.iteration_time_s)


def test_only_the_stage_whose_gpu_needs_it_offloads_traced_by_hand():
    """The case of test_two_gpus_one_switch_traced_by_hand with the copies
    of one stage only (StageTimes.act_host).

    Stage 0 alone: out (0,0) [1.5, 1.9], (0,1) [2.5, 2.9]; in, after the
    weights (queue free at 1): (0,1) [2.9, 3.3], (0,0) [3.3, 3.7]. Rank 1
    runs as without copies: B(1,1) [3.5, 5.5], B(1,0) [5.5, 7.5]; B(0,1)
    [5.5, 7.5], B(0,0) [7.5, 9.5], gradients out stage 1 [7.5, 8], stage 0
    [9.5, 10]: T = 10 s, the copies hide.
    Stage 1 alone: out (1,0) [2.5, 2.9], (1,1) [3.5, 3.9]; in (1,1) [3.9,
    4.3], (1,0) [4.3, 4.7]; B(1,1) [4.3, 6.3], B(1,0) [6.3, 8.3], B(0,1)
    [6.3, 8.3], B(0,0) [8.3, 10.3], stage 0 out [10.3, 10.8]: T = 10.8 s."""
    only0 = replace(_times(0.4), act_host=np.array([True, False]))
    only1 = replace(_times(0.4), act_host=np.array([False, True]))
    assert iteration_time_s("mobius", 2, 2, 1, only0) == pytest.approx(10.0)
    assert iteration_time_s("mobius", 2, 2, 1, only1) == pytest.approx(10.8)
    t, tl = simulate_times("mobius", 2, 2, 1, only1)
    start = {(r.kind, r.stage, r.microbatch): r.start_s for r in tl.records}
    assert t == pytest.approx(10.8) and start[("B", 1, 1)] == pytest.approx(4.3)
    # several splits at once with different offloading stages: each its own graph
    both = StageTimes(**{**{f: np.stack([getattr(only0, f)] * 3) for f in ("fwd_s", "bwd_s", "bwd_input_s",
                                                                             "allreduce_s", "swap_in_s", "swap_out_s",
                                                                             "act_copy_s")},
                         "p2p_s": np.zeros((3, 1)), "swap_queue": (0, 0),
                         "act_host": np.array([[True, False], [False, True], [True, True]])})
    assert iteration_time_s("mobius", 2, 2, 1, both) == pytest.approx([10.0, 10.8, 10.8])


def _uneven_layers():
    """Layer 0 as in _two_layers (10 GB saved per micro-batch), layer 1
    saving 2 GB."""
    a, b = _two_layers().layers
    return replace(_two_layers(), layers=(a, replace(b, saved_bytes=2 * GB)))


def test_only_the_stage_that_needs_the_host_offloads_through_the_search():
    """m = 6 on 60 GB GPUs: stage 0 keeping would need 6 x 10 + 25 = 85 GB
    (offloaded 3 x 10 + 25 = 55 GB), stage 1 keeps 6 x 2 + 25 = 37 GB.
    Only stage 0's copies (0.4 s each way) are nodes: 6 out and 6 in,
    60 GB on the host, 120 GB over PCIe; the plan's time is the time model's
    for those hand stage times (F 1, B 2, weights 0.5 s, Adam 1.25 s)."""
    cluster = replace(tiny_cluster(1, 2, memory_bytes=60 * GB), host=_host())
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("mobius",), vps=(1,),
                         top=1)
    plan = search([ModelVariant(_uneven_layers())], cluster, job, opts).plans[0]
    assert [st.memory_option for st in plan.stages] == ["swap+act-host", "swap"]
    info = dict(plan.extra)
    assert info["mobius"]["act_copy_s"] == pytest.approx([0.4, 0.0])
    assert info["mobius"]["act_host"] == [True, False]
    assert info["mobius"]["device_peak_bytes"] == pytest.approx([55 * GB, 37 * GB])
    assert info["host"]["activation_host_memory_bytes"] == pytest.approx([60 * GB, 0.0])
    assert info["host"]["activation_pcie_bytes_per_iteration"] == pytest.approx([120 * GB, 0.0])
    hand = replace(_times(0.4, allreduce=(1.25, 1.25)), act_host=np.array([True, False]))
    assert plan.predicted.iteration_time_s == pytest.approx(iteration_time_s("mobius", 2, 6, 1, hand))
    assert simulate_plan(plan)[0] == pytest.approx(plan.predicted.iteration_time_s)


def test_offloaded_activations_let_more_micro_batches_fit():
    """m = 6 on 60 GB GPUs: keeping every micro-batch needs 6 x 10 + 25 =
    85 GB, so Mobius has no plan; with the activations in host memory 3 x
    10 + 25 = 55 GB fits."""
    with pytest.raises(InfeasibleError):
        _plan(6, 60, act=False)
    plan = _plan(6, 60)
    assert dict(plan.extra)["mobius"]["device_peak_bytes"] == pytest.approx([55 * GB, 55 * GB])


def _profile(rng, L):
    return mobius_profile(rng, L, saved_gb=(2, 6))


@pytest.mark.parametrize("seed,L,pp,vp,m,cap", [(0, 6, 2, 2, 4, 68), (1, 7, 2, 2, 5, 85), (2, 6, 2, 1, 4, 80),
                                                 (3, 8, 2, 3, 4, 85)])
def test_search_equals_brute_force_over_splits(seed, L, pp, vp, m, cap):
    """Every split of ``pp * vp`` stages with the activations in host
    memory: copy times by hand (weights and gradients 2 B per parameter,
    each micro-batch's saved bytes, over the 25 GB/s link; cross mapping
    puts the two ranks under different switches), the GPU's peak by hand
    (min(m, 3) micro-batches of each of its stages + the largest pair of
    consecutive stays' weights and gradients; on the host 2 + 16 B per
    parameter and all ``m`` micro-batches, all stages together within the
    node's 800 GB), replayed in the time model; the search's best equals
    the least. Every stage either keeps its activations or offloads them
    (the brute force tries all 2^S choices of each split)."""
    rng = np.random.default_rng(seed)
    prof = _profile(rng, L)
    host = _host(pcie_switches=((0, 1), (2, 3)))
    cluster = replace(tiny_cluster(1, 4, memory_bytes=cap * GB), host=host)
    job = Job(global_batch_size=m, memory_reserve_bytes=0, activation_offload=True)
    S = pp * vp
    best, refused, offloads = np.inf, 0, set()
    for bounds, act in itertools.product(all_splits(L, S), itertools.product((False, True), repeat=S)):
        act = np.array(act)
        lay = [prof.layers[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        w = np.array([sum(x.param_bytes for x in ls) for ls in lay])
        kept = np.array([sum(x.saved_bytes for x in ls) for ls in lay])
        held = np.where(act, min(m, 3), m) * kept  # on the GPU: all m micro-batches, or 3 when offloaded
        fits = mobius_gpus_fit(w, held, pp, cap * GB)
        # host: 2 + 16 B per parameter and, offloaded, every micro-batch's activations, all stages of the
        # node (one GPU per rank, all on one node) together within its 800 GB
        fits &= bool(np.sum(w / 2 * 18 + act * m * kept) <= 800 * GB)
        if not fits:
            refused += 1
            continue
        times = StageTimes(
            fwd_s=np.array([sum(x.fwd_s for x in ls) for ls in lay]),
            bwd_s=np.array([sum(x.bwd_s for x in ls) for ls in lay]), bwd_input_s=np.zeros(S), p2p_s=np.zeros(S - 1),
            allreduce_s=w / 2 * pp / 1e10, swap_in_s=w / (25 * GB), swap_out_s=w / (25 * GB), swap_queue=(0, 1),
            act_copy_s=act * kept / (25 * GB), act_host=act)
        t = iteration_time_s("mobius", pp, m, vp, times)
        if t < best:
            best, offloads = t, {tuple(act)}
        elif t == best:
            offloads.add(tuple(act))
    assert np.isfinite(best) and refused > 0  # memory decides some splits
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("mobius",), vps=(vp,),
                         top=1)
    plan = search([ModelVariant(prof)], cluster, job, opts).plans[0]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    chosen = tuple(st.memory_option == "swap+act-host" for st in plan.stages)
    assert sum(chosen) == min(sum(a) for a in offloads)  # a fastest choice, ties keeping fewer offloading stages
    assert simulate_plan(plan)[0] == pytest.approx(best, rel=1e-9)


def test_a_gpu_over_its_memory_tries_the_minimal_sets_of_its_stages():
    """One GPU, two stages of 10 GB each on the device (4 GB offloaded),
    the two stays' weights 5 GB, 20 GB capacity: keeping both needs 25 GB;
    offloading either one 19 GB fits, both are not tried (a superset is
    never faster). The chooser times {0} and {1} (here 7 s and 5 s, given)
    and takes {1}; a 12 GB GPU fits no choice (4 + 4 + 5 = 13 GB)."""
    from pipesearch.stage_options import mobius_activation_choice

    tried = []

    def time_of(idx, sets):
        tried.extend(tuple(bool(x) for x in row) for row in sets)
        return np.where(sets[:, 0], 7.0, 5.0)

    own = np.array([[[10.0, 10.0]], [[4.0, 4.0]]])
    no = np.zeros((1, 2), dtype=bool)
    act, fits = mobius_activation_choice(no, ~no, ~no, own, np.array([[5.0]]), np.array([20.0]), 1, time_of)
    assert tried == [(True, False), (False, True)]
    assert act.tolist() == [[False, True]] and fits.tolist() == [True]
    act, fits = mobius_activation_choice(no, ~no, ~no, own, np.array([[5.0]]), np.array([12.0]), 1, time_of)
    assert fits.tolist() == [False]


def test_a_plan_file_whose_act_host_contradicts_the_stages_is_refused():
    """The plan file records per stage whether its activations are in host
    memory (options.mobius.act_host, read by the replay); one that
    contradicts the stages' memory_option is refused in one line."""
    from pipesearch.plan import plan_to_dict
    from pipesearch.schema.semantics import _mobius

    cluster = replace(tiny_cluster(1, 2, memory_bytes=60 * GB), host=_host())
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("mobius",), vps=(1,),
                         top=1)
    doc = plan_to_dict(search([ModelVariant(_uneven_layers())], cluster, job, opts).plans[0])
    assert doc["options"]["mobius"]["act_host"] == [True, False]
    assert list(_mobius(doc, "plans[0]")) == []
    doc["options"]["mobius"]["act_host"] = [False, True]
    (problem,) = list(_mobius(doc, "plans[0]"))
    assert "act_host" in str(problem) and "memory_option" in str(problem)
