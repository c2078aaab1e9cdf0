"""The point-level bounds of pipesearch.order_bounds (rank capacity, link
chains) against brute force over every order and split, and by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings

import test_order_search as tos
from pipesearch.order_bounds import (blocking_send_floor_s, link_bound_s, link_send_minima, rank_capacity_bound_s,
                                     rank_capacity_tables, rank_covering_orders, stage_fit_masks)
from pipesearch.order_search import best_order
from pipesearch.placement import slot_classes, slot_heads
from pipesearch.split_search import exact_split
from pipesearch.timemodel import iteration_time_s, send_overlap
from pipesearch.types import Cluster, DeviceGroup, Job


def _oracle(costs_of, num_slots: int, L: int, pp: int, m: int, schedule: str, vp: int):
    """Least time (timemodel.iteration_time_s, the search's time) over every
    ordered choice of pp distinct slots and every split that fits; None when
    none fits."""
    best = None
    for order in itertools.permutations(range(num_slots), pp):
        costs = costs_of(order)
        for cut in itertools.combinations(range(1, L), pp * vp - 1):
            bounds = (0, *cut, L)
            if costs.split_fits(bounds):
                t = float(iteration_time_s(schedule, pp, m, vp, costs.stage_times(np.asarray(bounds))))
                best = t if best is None else min(best, t)
    return best

def _instance(inst):
    """``(costs_of, classes, oracle)`` of a drawn instance (oracle None when
    no order has a split that fits), or None when it has more stages than
    layers or fewer slots than ranks."""
    cluster, tp, pp, m, schedule, vp, prof = inst
    L = prof.num_layers
    slots = len(slot_heads(cluster, tp))
    if pp * vp > L or slots < pp:
        return None
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, tp, pp, m, schedule, vp)
    return costs_of, slot_classes(cluster, tp), _oracle(costs_of, slots, L, pp, m, schedule, vp)



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tos.instances())
def test_capacity_and_link_bounds_hold_for_every_order_and_split(inst):
    """Random mixed clusters (2-3 types, memory often binding, transfers up
    to 100 MB), GPipe / 1F1B / ZB-H1 / interleaved 1F1B: the rank-capacity
    bound, without a cutoff and with the cutoff at the optimum or just
    above it, is at most the least time over every order and split; it is
    inf only when no order has a split that fits; the link bound (overlapped
    sends) is at most the optimum too. A capacity table that missed a
    fitting range, a floor above a range that fits, an assignment DP that
    lost a class sequence, a link bound that counted boundaries the link
    does not carry, or a cutoff test that excluded a feasible order would
    fail here; under 1F1B the bound with each rank's blocking sends too
    (a send counted on a rank that does not make it would fail)."""
    _, _, pp, m, schedule, vp, _ = inst
    drawn = _instance(inst)
    if drawn is None:
        return
    costs_of, classes, oracle = drawn
    sizes = [len(c) for c in classes]
    tables = rank_capacity_tables(classes, costs_of, pp, vp)
    assert tables is not None
    plain = rank_capacity_bound_s(tables, sizes, m)
    if oracle is None:
        return
    assert plain <= oracle * (1 + 1e-9), (plain, oracle)
    for cutoff in (oracle, oracle * (1 + 1e-9), oracle * 1.5):
        assert rank_capacity_bound_s(tables, sizes, m, cutoff) <= oracle * (1 + 1e-9), cutoff
    sigma = link_send_minima(classes, costs_of, pp)
    if send_overlap(schedule):
        assert link_bound_s(sigma, sizes, pp, vp, m) <= oracle * (1 + 1e-9)
    else:  # 1F1B: each rank's own blocking sends are part of its busy time
        sends = blocking_send_floor_s(sigma, pp, m)
        for cutoff in (math.inf, oracle, oracle * (1 + 1e-9), oracle * 1.5):
            assert rank_capacity_bound_s(tables, sizes, m, cutoff, sends) <= oracle * (1 + 1e-9), cutoff


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tos.instances())
def test_best_order_below_the_optimum_is_refused_with_a_valid_bound(inst):
    """With a cutoff below the optimum, best_order answers ABOVE_CUTOFF (or
    None when no split fits) and its bound is at most the optimum; with the
    cutoff above it, it finds the optimum (the exclusion never drops the
    best order)."""
    _, _, pp, m, schedule, vp, _ = inst
    drawn = _instance(inst)
    if drawn is None:
        return
    costs_of, classes, oracle = drawn
    if oracle is None:
        return
    low = best_order(classes, costs_of, schedule, pp, vp, cutoff_s=oracle * 0.999, max_orders=10**6)
    assert low is not None and low.status == "ABOVE_CUTOFF"
    assert low.best_bound_s <= oracle * (1 + 1e-9)
    high = best_order(classes, costs_of, schedule, pp, vp, cutoff_s=oracle * 1.001, max_orders=10**6)
    assert high.status == "OPTIMAL" and math.isclose(high.iteration_time_s, oracle, rel_tol=1e-9)


def _two_class_point(schedule: str = "gpipe", mem_gb: float = 1000.0, m: int = 1):
    """Class a: one device of 300 TFLOPs (scale 1, the profiled type);
    class b: one of 150 (scale 2); four layers of F = 1/3 s, B = 2/3 s
    (1 s of work each), no bytes; pp 2."""
    specs = [tos._spec("a", 300, mem_gb), tos._spec("b", 150, mem_gb)]
    cluster = Cluster("two", tuple(DeviceGroup(s, 1, 1) for s in specs), *tos.LINKS)
    prof = tos._profile([1.0] * 4, [0.0] * 4, [0.0] * 4, [0.0] * 4)
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    return cluster, tos._point(prof, cluster, job, 1, 2, m, schedule, 1)


def test_capacity_bound_by_hand():
    """The two-class point of _two_class_point, m = 1. Work W = 4 s; a rank
    on a holds at most 3 s (one layer is left to the other stage), on b the
    same; a busy T holds T of a's work and T / 2 of b's. Divisible work:
    T + T / 2 >= 4 gives T >= 8/3 s. At the cutoff 2.9 s the integral test:
    a takes at most 2 layers (2 s <= 2.9 s), b at most 1 (2 s of busy time
    for 1 s of work, 1.45 s allowed): 3 < 4, so no order is faster than 2.9
    s and the bound is the cutoff. At 3.5 s a takes 3 layers and b 1: the
    bound stays 8/3 s. GPipe with one micro-batch runs the stages one after
    another: the best plan is (a: 3 layers, b: 1) in 3 + 2 = 5 s plus the
    activation and its gradient over the inter-group link (no bytes, 30 us
    latency each): 5.00006 s, above every bound."""
    cluster, costs_of = _two_class_point()
    classes = slot_classes(cluster, 1)
    tables = rank_capacity_tables(classes, costs_of, 2)
    np.testing.assert_allclose(tables.cap, [[3.0, 3.0], [3.0, 3.0]])
    np.testing.assert_allclose(tables.floor, [[1.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(tables.scale, [1.0, 2.0])
    assert math.isclose(tables.work_s, 4.0)
    assert math.isclose(rank_capacity_bound_s(tables, [1, 1], 1), 8 / 3, rel_tol=1e-8)
    assert rank_capacity_bound_s(tables, [1, 1], 1, cutoff_s=2.9) == 2.9
    assert math.isclose(rank_capacity_bound_s(tables, [1, 1], 1, cutoff_s=3.5), 8 / 3, rel_tol=1e-8)
    assert math.isclose(_oracle(costs_of, 2, 4, 2, 1, "gpipe", 1), 5.00006, rel_tol=1e-9)


def test_floor_of_a_slow_class_bounds_by_hand():
    """Three single-slot classes a (scale 1), b (scale 2), c (scale 20), pp
    3, four layers of 1 s, m = 4: the slow c must hold at least one layer,
    busy 4 x 20 x 1 = 80 s, so every order is at least 80 s although the
    divisible work alone would allow 16 / (1 + 1/2 + 1/20) = 10.3 s."""
    specs = [tos._spec("a", 300, 1000.0), tos._spec("b", 150, 1000.0), tos._spec("c", 15, 1000.0)]
    cluster = Cluster("three", tuple(DeviceGroup(s, 1, 1) for s in specs), *tos.LINKS)
    prof = tos._profile([1.0] * 4, [0.0] * 4, [0.0] * 4, [0.0] * 4)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, 1, 3, 4, "1f1b", 1)
    classes = slot_classes(cluster, 1)
    tables = rank_capacity_tables(classes, costs_of, 3)
    assert math.isclose(rank_capacity_bound_s(tables, [1, 1, 1], 4), 80.0, rel_tol=1e-8)
    assert _oracle(costs_of, 3, 4, 3, 4, "1f1b", 1) >= 80.0


def test_memory_that_no_order_can_hold_is_infinite():
    """Each device holds one layer (0.5 GB of state and activations per
    layer, 0.6 GB per device), two devices, four layers: no order has a
    split that fits; the bound is inf and best_order answers None."""
    specs = [tos._spec("a", 300, 0.6), tos._spec("b", 150, 0.6)]
    cluster = Cluster("small", tuple(DeviceGroup(s, 1, 1) for s in specs), *tos.LINKS)
    prof = tos._profile([1e-3] * 4, [0.0] * 4, [3e7] * 4, [5e7] * 4)
    job = Job(global_batch_size=2, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, 1, 2, 2, "1f1b", 1)
    classes = slot_classes(cluster, 1)
    assert _oracle(costs_of, 2, 4, 2, 2, "1f1b", 1) is None
    assert rank_capacity_bound_s(rank_capacity_tables(classes, costs_of, 2), [1, 1], 2) == math.inf
    assert best_order(classes, costs_of, "1f1b", 2, cutoff_s=1.0) is None


def test_link_bound_by_hand():
    """Two nodes of one type, one slot each, linked at 25 GB/s and 10 us
    (tos.LINKS' inter-node link), 50 MB out of every layer, pp 2, vp 2
    (interleaved): the link from rank 0 to rank 1 carries boundaries 0 and 2,
    m = 4 micro-batches each, at least 50e6 / 25e9 + 1e-5 = 2.01 ms each:
    8 x 2.01 ms = 16.08 ms; the orders' times are above it. The two
    single-slot nodes are one class (interchangeable), whose two slots are
    always linked across nodes."""
    spec = tos._spec("a", 300, 1000.0)
    cluster = Cluster("pair", (DeviceGroup(spec, 2, 1),), *tos.LINKS)
    prof = tos._profile([1e-4] * 4, [5e7] * 4, [0.0] * 4, [0.0] * 4)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, 1, 2, 4, "interleaved-1f1b", 2)
    classes = slot_classes(cluster, 1)
    assert classes == [[0, 1]]
    sigma = link_send_minima(classes, costs_of, 2)
    assert math.isclose(sigma[0, 0], 50e6 / 25e9 + 1e-5, rel_tol=1e-9)
    bound = link_bound_s(sigma, [2], 2, 2, 4)
    assert math.isclose(bound, 8 * (50e6 / 25e9 + 1e-5), rel_tol=1e-9)
    assert bound <= _oracle(costs_of, 2, 4, 2, 4, "interleaved-1f1b", 2)


def test_rank_covering_orders_put_every_class_on_every_rank():
    classes = [[0, 1], [2], [3, 4, 5]]
    for pp in (2, 3, 5):
        seen = {(r, c) for o in rank_covering_orders(classes, pp) for r, x in enumerate(o)
                for c, members in enumerate(classes) if x in members}
        assert seen == {(r, c) for r in range(pp) for c in range(3)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tos.instances())
def test_tie_window_keeps_the_bound_and_the_time_within_it(inst):
    """best_order with a tie window of 5% (the search passes 0.1%): its
    bound is at most the optimum over every order and split, its time at
    most 5% above the optimum, and OPTIMAL only when its time is the
    optimum; OPTIMAL_WITHIN_TIES only with a gap of at most 5%. A stop rule
    that dropped the window's edge or a bound that forgot the prefixes left
    closed under the window would fail here."""
    cluster, tp, pp, m, schedule, vp, prof = inst
    L = prof.num_layers
    slots = len(slot_heads(cluster, tp))
    if vp != 1 or pp > L or slots < pp:
        return
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, tp, pp, m, schedule, 1)
    oracle = _oracle(costs_of, slots, L, pp, m, schedule, 1)
    found = best_order(slot_classes(cluster, tp), costs_of, schedule, pp, 1, max_orders=10**6, tie_rel=0.05)
    if oracle is None:
        assert found is None
        return
    assert found.best_bound_s <= oracle * (1 + 1e-9)
    assert found.iteration_time_s <= oracle * (1 + 1e-9) / (1 - 0.05)
    assert found.status in ("OPTIMAL", "OPTIMAL_WITHIN_TIES")
    if found.status == "OPTIMAL":
        assert math.isclose(found.iteration_time_s, oracle, rel_tol=1e-9)
    else:
        assert found.gap <= 0.05 + 1e-12


def test_first_orders_are_not_built_for_a_point_the_bound_excludes():
    """The two-class point of _two_class_point (every order at least 8/3 s,
    its best 5.00006 s): with a cutoff of 2.9 s the rank-capacity bound
    settles it, so the callable giving the first orders (the closed-form
    mapping, costly) is never called; with a cutoff of 6 s the search by
    classes proves the optimum without it, so it is not called either;
    when that search stops at its counts (no prefix expanded), it is, and
    the answer is that order's exact split (never slower than it)."""
    cluster, costs_of = _two_class_point()
    classes = slot_classes(cluster, 1)
    calls = []

    def first():
        calls.append(1)
        return [(0, 1)]

    low = best_order(classes, costs_of, "gpipe", 2, cutoff_s=2.9, first=first)
    assert low.status == "ABOVE_CUTOFF" and low.method == "rank-capacity" and low.best_bound_s == 2.9
    assert not calls and low.order == ()  # no order that fits is looked for: the point is pruned as it stands
    high = best_order(classes, costs_of, "gpipe", 2, cutoff_s=6.0, first=first)
    assert not calls and high.status == "OPTIMAL" and math.isclose(high.iteration_time_s, 5.00006, rel_tol=1e-9)
    stopped = best_order(classes, costs_of, "gpipe", 2, cutoff_s=6.0, first=first, max_nodes=0)
    assert calls and stopped.status == "FEASIBLE" and stopped.orders_evaluated == 1
    own = exact_split(costs_of(stopped.order), "gpipe", 2, 1)
    assert stopped.iteration_time_s == own.best_time_s <= 6.0


def test_blocking_sends_by_hand():
    """The two-class point of _two_class_point under 1F1B with m = 2 and
    40 MB out of every layer over the 10 GB/s, 30 us inter-group link: one
    transfer at least 40e6 / 10e9 + 30e-6 = 4.03 ms; rank 0 sends m = 2
    activations, rank 1 m = 2 gradients: 8.06 ms each. The divisible bound
    becomes T with (T - 8.06 ms) / 2 of a's work plus (T - 8.06 ms) / 4 of
    b's >= 4 s (per micro-batch, m = 2): T = 16/3 s + 8.06 ms."""
    specs = [tos._spec("a", 300, 1000.0), tos._spec("b", 150, 1000.0)]
    cluster = Cluster("two", tuple(DeviceGroup(s, 1, 1) for s in specs), *tos.LINKS)
    prof = tos._profile([1.0] * 4, [4e7] * 4, [0.0] * 4, [0.0] * 4)
    job = Job(global_batch_size=2, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, 1, 2, 2, "1f1b", 1)
    classes = slot_classes(cluster, 1)
    sends = blocking_send_floor_s(link_send_minima(classes, costs_of, 2), 2, 2)
    np.testing.assert_allclose(sends, np.full((2, 2), 2 * (4e7 / 10e9 + 30e-6)))
    tables = rank_capacity_tables(classes, costs_of, 2)
    assert math.isclose(rank_capacity_bound_s(tables, [1, 1], 2, sends_s=sends), 16 / 3 + 8.06e-3, rel_tol=1e-8)
    assert rank_capacity_bound_s(tables, [1, 1], 2, sends_s=sends) <= _oracle(costs_of, 2, 4, 2, 2, "1f1b", 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tos.instances())
def test_stage_fit_masks_are_every_range_that_fits(inst):
    """Random mixed clusters with memory often binding: for every order's
    costs and every stage, ``stage_fit_masks`` (each start's longest
    fitting end by bisection, all stages at once) is exactly the ranges the
    stage may have (start in ``[s, L - S + s]``, 0 for the first with
    ``first_at_zero``, a layer left to every later stage, the last one
    ending at ``L``) that ``PipelineCosts.fits`` accepts, each range tested
    on its own. A bisection that lost the last fitting end, a start range
    off by one, or a last stage not pinned to ``L`` would fail here."""
    cluster, tp, pp, m, schedule, vp, prof = inst
    drawn = _instance(inst)
    if drawn is None:
        return
    costs_of, classes, _ = drawn
    L, S = prof.num_layers, pp * vp
    ii, jj = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    for order in rank_covering_orders(classes, pp):
        costs = costs_of(order)
        for first_at_zero in (False, True):
            masks = stage_fit_masks(costs, list(range(S)), S, ii, jj, first_at_zero=first_at_zero)
            for s, mask in enumerate(masks):
                want = np.zeros_like(mask)
                first = 0 if first_at_zero and s == 0 else L - S + s
                for i in range(s, first + 1):
                    for j in ([L] if s == S - 1 else range(i + 1, L - S + s + 2)):
                        want[i, j] = bool(costs.fits(s, i, j))
                assert np.array_equal(mask, want), (order, s, first_at_zero)
