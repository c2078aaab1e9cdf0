"""The device order of one pipeline on a mixed cluster, exact for the
simulated time: pipesearch.order_search.best_order and the search's
``mapped`` placement against brute force over every order of slots and
every split, each (order, split) replayed by the discrete-event simulator
(pipesearch.timemodel.simulate_times)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesearch.costs import build_pipeline_costs
from pipesearch.order_search import (best_order, canonical, count_orders, count_vectors, orders_of_vector,
                                     rank_work_bound_s)
from pipesearch.placement import slot_classes, slot_heads
from pipesearch.search import search
from pipesearch.in_flight import schedule_chunk_states, schedule_in_flight
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.split_fits import any_split_fits
from pipesearch.timemodel import simulate_times
from pipesearch.types import Cluster, DeviceGroup, DeviceSpec, Job, Layer, Link, ModelProfile

GB = 1e9
LINKS = (Link(200 * GB, 1e-6), Link(25 * GB, 1e-5), Link(10 * GB, 3e-5))


def _spec(name: str, fp16_tflops: float, mem_gb: float) -> DeviceSpec:
    return DeviceSpec(name, mem_gb * GB, fp16_tflops * 1e12, fp16_tflops * 1e11, 1e12, achieved_fraction=0.5)


def _profile(t, out, params, saved) -> ModelProfile:
    layers = tuple(Layer(f"l{i}", float(x) / 3, 2 * float(x) / 3, float(p), float(o), float(s))
                   for i, (x, o, p, s) in enumerate(zip(t, out, params, saved)))
    return ModelProfile("rand", layers, 1, profiled_device="a", bytes_per_param=2.0)


def _point(prof, cluster, job, tp, pp, m, schedule, vp):
    """``costs_of(order)``: the point's PipelineCosts with rank r on slot
    ``order[r]`` (slot indices of pipesearch.placement.slot_heads)."""
    heads = slot_heads(cluster, tp)
    ref = cluster.groups[0].device
    inflight = schedule_in_flight(schedule, pp, m, vp, {}, prof.wgrad_saved_fraction)
    states = schedule_chunk_states(schedule, pp, m, vp, {}, prof.wgrad_saved_fraction)  # devices checked whole

    def costs_of(order):
        slots = heads[np.asarray(order)][np.arange(pp * vp) % pp][:, None]
        return build_pipeline_costs(prof, cluster, job, pp=pp * vp, dp=1, micro_batch_size=1, num_micro_batches=m,
                                    schedule=schedule if schedule in ("gpipe", "1f1b") else "gpipe",
                                    placement=slots, profiled_device=ref, in_flight=inflight,
                                    stages_per_device=vp, tp=tp, wgrad_window=schedule == "zb-h1",
                                    chunk_states=states)
    return costs_of


def _brute_force(costs_of, num_slots: int, L: int, pp: int, m: int, schedule: str, vp: int):
    """Least simulated time over every ordered choice of pp distinct slots
    (no symmetry reduction) and every split that fits; None when none fits.
    Checks on the way that the rank-work bound of every order is at most
    the simulated time of every split of it, and that
    split_fits.any_split_fits says whether some split of it fits."""
    best = None
    S = pp * vp
    for order in itertools.permutations(range(num_slots), pp):
        costs = costs_of(order)
        fitting = False
        bound = rank_work_bound_s(costs, pp)
        for cut in itertools.combinations(range(1, L), S - 1):
            bounds = (0, *cut, L)
            t, _ = simulate_times(schedule, pp, m, vp, costs.stage_times(bounds))
            assert bound <= t * (1 + 1e-12), (order, bounds)  # the vector bound holds for every split
            if not costs.split_fits(bounds):
                continue
            fitting = True
            if best is None or t < best:
                best = t
        assert any_split_fits(costs) == fitting, order
    return best


@st.composite
def instances(draw):
    L = draw(st.integers(2, 8))
    tp = draw(st.sampled_from([1, 2]))
    mem = draw(st.sampled_from([0.3, 0.6, 1000.0]))  # GB: often binding, sometimes not
    specs = [_spec("a", 300, mem), _spec("b", draw(st.sampled_from([100, 150])), 2 * mem), _spec("c", 60, 4 * mem)]
    groups = [DeviceGroup(specs[k], draw(st.integers(1, 2)), draw(st.integers(tp, 2 * tp)))
              for k in range(draw(st.integers(2, 3)))]
    if sum(g.num_devices for g in groups) > 6:
        groups = [DeviceGroup(g.device, 1, g.devices_per_node) for g in groups]
    cluster = Cluster("r", tuple(groups), *LINKS)
    slots = len(slot_heads(cluster, tp))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "zb-h1", "interleaved-1f1b"]))
    vp = 2 if schedule == "interleaved-1f1b" else 1
    pp = draw(st.integers(2, max(2, min(4, slots, L // vp))))
    if schedule == "interleaved-1f1b":  # Megatron-LM's rule: m a multiple of pp
        m = pp * draw(st.integers(1, 2))
    else:
        m = draw(st.integers(1 if schedule == "gpipe" else pp, 6))
    t = draw(st.lists(st.floats(0.5e-3, 4e-3), min_size=L, max_size=L))
    out = draw(st.lists(st.sampled_from([0.0, 1e6, 2e7, 1e8]), min_size=L, max_size=L))
    params = draw(st.lists(st.sampled_from([0.0, 1e7, 3e7]), min_size=L, max_size=L))
    saved = draw(st.lists(st.sampled_from([0.0, 1e7, 5e7]), min_size=L, max_size=L))
    return cluster, tp, pp, m, schedule, vp, _profile(t, out, params, saved)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_best_order_equals_brute_force(inst):
    """Random mixed clusters (2-3 types, <= 6 devices, tp 1 or 2, memory
    often binding), <= 8 layers, GPipe / 1F1B / ZB-H1 / interleaved 1F1B:
    best_order's time equals the least simulated time over every order of
    slots and every split, it says OPTIMAL, and its own (order, split)
    replayed by the simulator has that time; None exactly when nothing fits.
    A bug in the symmetry classes, the vector bound (stopping too early) or
    the cutoff handling would return a slower order."""
    cluster, tp, pp, m, schedule, vp, prof = inst
    if pp * vp > prof.num_layers or len(slot_heads(cluster, tp)) < pp:
        return
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    costs_of = _point(prof, cluster, job, tp, pp, m, schedule, vp)
    oracle = _brute_force(costs_of, len(slot_heads(cluster, tp)), prof.num_layers, pp, m, schedule, vp)
    # no count limit here (up to 6 slots: a few hundred orders at most); test_count_limit_reports_a_valid_bound
    # covers the limit
    found = best_order(slot_classes(cluster, tp), costs_of, schedule, pp, vp, max_orders=10**6)
    if oracle is None:
        assert found is None
        return
    assert found is not None and found.status == "OPTIMAL" and found.gap == 0.0
    assert found.iteration_time_s == pytest.approx(oracle, rel=1e-9)
    again, _ = simulate_times(schedule, pp, m, vp, costs_of(found.order).stage_times(found.split.bounds))
    assert again == pytest.approx(oracle, rel=1e-9)
    assert found.orders_evaluated <= found.orders_total


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_search_mapped_rank1_equals_brute_force(inst):
    """The search with dp 1 and no layout enumeration (placements: the
    patterns and ``mapped``): rank 1 equals the brute force over every order
    and split, and uses distinct devices, tp per slot inside one node."""
    cluster, tp, pp, m, schedule, vp, prof = inst
    if pp * vp > prof.num_layers or len(slot_heads(cluster, tp)) < pp:
        return
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    costs_of = _point(prof, cluster, job, tp, pp, m, schedule, vp)
    oracle = _brute_force(costs_of, len(slot_heads(cluster, tp)), prof.num_layers, pp, m, schedule, vp)
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, schedules=(schedule,), vps=(vp,), top=1,
                         enumerate_layouts_up_to=0)
    try:
        res = search([ModelVariant(prof, tp=tp)], cluster, job, opts, profiled_device=cluster.groups[0].device)
    except Exception as exc:  # noqa: BLE001 - only "nothing fits" is acceptable, and only when so
        assert oracle is None, exc
        return
    assert oracle is not None
    best = res.plans[0]
    mapping = dict(best.extra).get("mapping") or {}
    if mapping.get("status") == "FEASIBLE":  # the search's count of orders ran out: its bound and time bracket the optimum
        assert mapping["best_bound_s"] <= oracle * (1 + 1e-9) <= best.predicted.iteration_time_s * (1 + 2e-9)
    else:
        assert best.predicted.iteration_time_s == pytest.approx(oracle, rel=1e-9)
    used = [d + k for s in best.stages[:pp] for d in s.devices for k in range(tp)]  # rank r: stages r, r + pp, ...
    assert len(set(used)) == len(used) and max(used) < cluster.num_devices
    assert all(s.devices == best.stages[k % pp].devices for k, s in enumerate(best.stages))
    for s in best.stages:
        assert len({cluster.node_of(d + k) for d in s.devices for k in range(tp)}) == 1


def test_count_limit_reports_a_valid_bound():
    """Three types, one slot each, pp 3: 6 orders. With max_orders = 1 the
    search stops after one order: FEASIBLE, its bound at most the brute
    force optimum (a valid bound) and its time at least it."""
    specs = [_spec("a", 300, 1000), _spec("b", 100, 1000), _spec("c", 60, 1000)]
    cluster = Cluster("r", tuple(DeviceGroup(s, 1, 1) for s in specs), *LINKS)
    prof = _profile([1e-3, 3e-3, 2e-3, 1e-3, 2e-3, 4e-3], [1e8] * 6, [0.0] * 6, [0.0] * 6)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    costs_of = _point(prof, cluster, job, 1, 3, 4, "1f1b", 1)
    oracle = min(t for order in itertools.permutations(range(3)) for t in
                 [simulate_times("1f1b", 3, 4, 1, costs_of(order).stage_times((0, *cut, 6)))[0]
                  for cut in itertools.combinations(range(1, 6), 2)])
    full = best_order(slot_classes(cluster, 1), costs_of, "1f1b", 3)
    part = best_order(slot_classes(cluster, 1), costs_of, "1f1b", 3, max_orders=1)
    assert full.status == "OPTIMAL" and full.iteration_time_s == pytest.approx(oracle, rel=1e-12)
    assert part.orders_evaluated == 1 and part.orders_total == 6
    assert part.best_bound_s <= oracle * (1 + 1e-12) <= part.iteration_time_s * (1 + 1e-12)
    if part.iteration_time_s > oracle * (1 + 1e-9):
        assert part.status == "FEASIBLE" and part.gap > 0


def test_vectors_orders_and_work_bound_by_hand():
    """Classes of sizes 2 and 1, pp 2: vectors (1, 1) and (2, 0); (1, 1)
    has the orders (0, 2) and (2, 0), (2, 0) only (0, 1). The rank-work
    bound of 2 ranks with scales 1 and 3 on work W = 4 s over m = 3:
    3 * 4 / (1 + 1/3) = 9 s."""
    assert count_vectors([2, 1], 2) == [(1, 1), (2, 0)]
    assert list(orders_of_vector([[0, 1], [2]], (1, 1))) == [(0, 2), (2, 0)]
    assert list(orders_of_vector([[0, 1], [2]], (2, 0))) == [(0, 1)]
    assert count_orders((2, 1, 1)) == 12
    from helpers import make_costs

    costs = make_costs(times=(2.0, 2.0), pp=2, m=3, time_scale=[1.0, 3.0])
    assert rank_work_bound_s(costs, 2) == pytest.approx(9.0)


def test_slow_devices_on_one_node_beat_fast_devices_apart():
    """Two fast devices on separate nodes (25 GB/s between them) and two
    devices a third as fast on one node (200 GB/s); 1 GB crosses the
    boundary and compute is 6 ms in all: the fast pair's vector has the
    smaller work bound and is visited first, yet the slow pair on one node
    is the optimum (brute force), so a search that stopped after the first
    vector, or ignored the links, would fail here."""
    fast, slow = _spec("a", 300, 1000), _spec("b", 100, 1000)
    cluster = Cluster("r", (DeviceGroup(fast, 2, 1), DeviceGroup(slow, 1, 2)), *LINKS)
    prof = _profile([1e-3] * 6, [1e9] * 6, [0.0] * 6, [0.0] * 6)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    costs_of = _point(prof, cluster, job, 1, 2, 4, "1f1b", 1)
    oracle = min(simulate_times("1f1b", 2, 4, 1, costs_of(order).stage_times((0, cut, 6)))[0]
                 for order in itertools.permutations(range(4), 2) for cut in range(1, 6))
    found = best_order(slot_classes(cluster, 1), costs_of, "1f1b", 2)
    heads = slot_heads(cluster, 1)
    assert found.status == "OPTIMAL" and found.iteration_time_s == pytest.approx(oracle, rel=1e-12)
    assert {cluster.device_spec(int(heads[s])).name for s in found.order} == {"b"}


def test_any_split_fits_finds_a_split_the_greedy_rule_misses():
    """Memory per layer 1, 1, 2, 1 (one micro-batch in flight), capacities
    2, 1, 3: the split [0,1) [1,2) [2,4) fits (1 <= 2, 1 <= 1, 3 <= 3);
    the greedy gives stage 0 the layers 0-1 and then stage 1 must hold
    layer 2 (2 > 1). Mixed clusters (interleaved chunks with their memory
    shares, devices of several sizes) produce such capacities."""
    from helpers import make_costs

    costs = make_costs(times=(1.0,) * 4, pp=3, m=1, saved=(1.0, 1.0, 2.0, 1.0), capacity=[2.0, 1.0, 3.0],
                       in_flight=[1, 1, 1])
    assert costs.split_fits((0, 1, 2, 4))
    assert any_split_fits(costs)


def test_any_split_fits_checks_each_device_whole():
    """Two devices, two chunks each (stage c 2 + r on device r), 5 layers
    of saved bytes 1 and no weights, every device at the state of 2
    micro-batches of chunk 0 and 1 of chunk 1: device r holds
    2 len(stage r) + len(stage r + 2). One stage has two layers, so some
    device holds 4 at best (the two layers in chunk 1), 5 otherwise. With
    3.5 per device every stage fits alone (at most 2 x 1 or 1 x 2 = 2) yet
    no split fits; with 4 the split [1, 1, 2, 1] does."""
    from dataclasses import replace

    from helpers import make_costs

    states = np.array([[[2, 1]], [[2, 1]]])  # (device, state, chunk)
    for cap, fits in ((3.5, False), (4.0, True)):
        costs = replace(make_costs(times=(1.0,) * 5, pp=4, m=2, saved=(1.0,) * 5, capacity=[cap] * 4,
                                   in_flight=[2, 2, 1, 1]), chunk_states=states)
        assert np.all(costs.fits(np.arange(4), np.array([0, 1, 2, 3]), np.array([1, 2, 3, 5])))
        assert any_split_fits(costs) is fits, cap
        assert costs.split_fits((0, 1, 2, 4, 5)) is fits


def test_first_orders_are_split_first_and_kept():
    """The instance of test_count_limit_reports_a_valid_bound: with the
    brute-force optimum's order given first and max_orders = 1, that order
    is the one split, so the result has the optimum's time; an order given
    with its slots of one class swapped is the same order (canonical)."""
    specs = [_spec("a", 300, 1000), _spec("b", 100, 1000), _spec("c", 60, 1000)]
    cluster = Cluster("r", tuple(DeviceGroup(s, 1, 1) for s in specs), *LINKS)
    prof = _profile([1e-3, 3e-3, 2e-3, 1e-3, 2e-3, 4e-3], [1e8] * 6, [0.0] * 6, [0.0] * 6)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    costs_of = _point(prof, cluster, job, 1, 3, 4, "1f1b", 1)
    times = {order: min(simulate_times("1f1b", 3, 4, 1, costs_of(order).stage_times((0, *cut, 6)))[0]
                        for cut in itertools.combinations(range(1, 6), 2))
             for order in itertools.permutations(range(3))}
    best = min(times, key=times.get)
    worst = max(times, key=times.get)
    found = best_order(slot_classes(cluster, 1), costs_of, "1f1b", 3, max_orders=1, first=[best])
    assert found.order == best and found.iteration_time_s == pytest.approx(times[best], rel=1e-12)
    assert found.orders_evaluated == 1
    slow = best_order(slot_classes(cluster, 1), costs_of, "1f1b", 3, max_orders=1, first=[worst])
    assert slow.order == worst and slow.status == "FEASIBLE"
    assert canonical((3, 0, 1), [[0, 1], [3]]) == (3, 0, 1)
    assert canonical((1, 3, 0), [[0, 1], [3]]) == (0, 3, 1)


def test_a_few_more_orders_than_the_limit_are_all_visited():
    """Five device types, one slot each, interleaved 1F1B over 4 ranks: 5 x
    4 x 3 x 2 = 120 orders, 8 layers (one split: a layer per stage). With
    at most twice MAX_ORDERS orders every one is split: OPTIMAL, the brute
    force optimum over all 120 (it stopped at 100, FEASIBLE with its gap)."""
    from pipesearch.order_search import MAX_ORDERS

    rng = np.random.default_rng(0)
    specs = [_spec(n, float(f), 1000) for n, f in zip("abcde", rng.uniform(50, 300, 5))]
    cluster = Cluster("r", tuple(DeviceGroup(s, 1, 1) for s in specs), *LINKS)
    prof = _profile(rng.uniform(1e-3, 5e-3, 8), rng.uniform(1e6, 5e7, 8), [1e8] * 8, [1e7] * 8)
    costs_of = _point(prof, cluster, Job(global_batch_size=4, memory_reserve_bytes=0), 1, 4, 4,
                      "interleaved-1f1b", 2)
    found = best_order(slot_classes(cluster, 1), costs_of, "interleaved-1f1b", 4, 2)
    oracle = min(simulate_times("interleaved-1f1b", 4, 4, 2, costs_of(o).stage_times(tuple(range(9))))[0]
                 for o in itertools.permutations(range(5), 4))
    assert MAX_ORDERS < found.orders_total == 120 <= 2 * MAX_ORDERS
    assert found.status == "OPTIMAL" and found.iteration_time_s == pytest.approx(oracle, rel=1e-12)
    assert found.orders_evaluated > MAX_ORDERS
