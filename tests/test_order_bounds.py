"""The class bounds of pipesearch.order_bounds against brute force: every
prefix of ranks' classes gets a bound at most the least simulated time
(pipesearch.timemodel.simulate_times) over every order that starts with it
and every split that fits; and one instance by hand."""

from __future__ import annotations

import itertools
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_order_search as tos
from pipesearch import order_bounds
from pipesearch.order_bounds import class_bounds, covering_orders
from pipesearch.order_search import QUICK_FAMILY, best_order, count_vectors, orders_of_vector
from pipesearch.placement import slot_classes, slot_heads
from pipesearch.timemodel import simulate_times
from pipesearch.types import Cluster, DeviceGroup, Job


def _order_times(costs_of, classes, L: int, pp: int, m: int, schedule: str) -> dict:
    """Least simulated time of every order up to swaps inside a class (inf
    when no split fits), keyed by its class sequence."""
    cls = {x: c for c, members in enumerate(classes) for x in members}
    out = {}
    for n in count_vectors([len(c) for c in classes], pp):
        for order in orders_of_vector(classes, n):
            costs = costs_of(order)
            best = math.inf
            for cut in itertools.combinations(range(1, L), pp - 1):
                bounds = (0, *cut, L)
                if costs.split_fits(bounds):
                    best = min(best, simulate_times(schedule, pp, m, 1, costs.stage_times(bounds))[0])
            out[tuple(cls[x] for x in order)] = best
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tos.instances())
def test_every_prefix_bound_is_at_most_its_orders_optimum(inst):
    """Random mixed clusters (2-3 types, 1-2 nodes each, memory often
    binding, transfers up to 100 MB), GPipe / 1F1B / ZB-H1: for every
    prefix of every class sequence, the bound of
    ClassBounds.extend is at most the least simulated time of the orders
    that start with it; with the cutoff at the optimum, the optimum's
    prefixes stay below it. A wrong family (a path the schedule does not
    have), a transfer counted on the wrong boundary, a suffix minimum that
    skipped a class sequence, or a forward DP that lost a split would put a
    bound above an order's time here."""
    cluster, tp, pp, m, schedule, vp, prof = inst
    L = prof.num_layers
    if vp != 1 or pp > L or len(slot_heads(cluster, tp)) < pp:
        return
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, tp, pp, m, schedule, 1)
    classes = slot_classes(cluster, tp)
    times = _order_times(costs_of, classes, L, pp, m, schedule)
    oracle = min(times.values())
    for cutoff in (math.inf, oracle * (1 + 1e-9)):
        _assert_prefix_bounds_below_orders(class_bounds(classes, costs_of, schedule, pp, cutoff_s=cutoff),
                                           times, pp, cutoff)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tos.instances(), st.booleans(), st.booleans(), st.booleans())
def test_relaxed_links_bound_every_order_and_stay_below_the_exact_bound(inst, equal_links, quick, small_passes):
    """The quick pre-pass of the search by classes (relax_links: each
    stage's outgoing transfer its least over the next classes), with
    QUICK_FAMILY or every family (their ``suffix`` components then read
    their pair of minima from two next classes), and with passes of 8
    floats (the stage terms built per pair, no whole-stage tables): every
    prefix's bound is at most the least simulated time of its orders (brute
    force), and at most the same prefix's bound with the links exact. With
    one link for every pair of slots the relaxation changes no transfer and
    QUICK_FAMILY has no component whose pair of minima could come from two
    classes, so the two bounds are then equal. A relaxed transfer that is
    not a least (a next class left out), a pass that reads the minima of the
    wrong vector, or a column of the stage tables taken for the wrong next
    class fails here."""
    cluster, tp, pp, m, schedule, vp, prof = inst
    L = prof.num_layers
    if vp != 1 or pp > L or len(slot_heads(cluster, tp)) < pp:
        return
    if equal_links:
        cluster = Cluster(cluster.name, cluster.groups, tos.LINKS[0], tos.LINKS[0], tos.LINKS[0])
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, tp, pp, m, schedule, 1)
    classes = slot_classes(cluster, tp)
    times = _order_times(costs_of, classes, L, pp, m, schedule)
    only = QUICK_FAMILY if quick else None
    with mock.patch.object(order_bounds, "MAX_PASS_FLOATS", 8 if small_passes else order_bounds.MAX_PASS_FLOATS):
        relaxed = class_bounds(classes, costs_of, schedule, pp, only=only, relax_links=True)
    exact = class_bounds(classes, costs_of, schedule, pp, only=only)
    _assert_prefix_bounds_below_orders(relaxed, times, pp)
    pairs = {(): (relaxed.root(), exact.root())}
    for seq in sorted(times):
        for r in range(1, pp + 1):
            if seq[:r] not in pairs:
                a, b = pairs[seq[:r - 1]]
                pairs[seq[:r]] = (relaxed.extend(a, seq[r - 1]), exact.extend(b, seq[r - 1]))
    for prefix, (a, b) in pairs.items():
        if equal_links and quick:
            assert a.bound_s == pytest.approx(b.bound_s, rel=1e-12), prefix
        else:
            assert a.bound_s <= b.bound_s * (1 + 1e-12), prefix


def _assert_prefix_bounds_below_orders(cb, times: dict, pp: int, cutoff: float = math.inf) -> None:
    """Every class prefix's bound (``cb.extend`` from the root) is at most
    the best simulated time ``times[order]`` of the orders it starts,
    where that time is finite and below ``cutoff``."""
    nodes = {(): cb.root()}
    for seq in sorted(times):
        for r in range(1, pp + 1):
            if seq[:r] not in nodes:
                nodes[seq[:r]] = cb.extend(nodes[seq[:r - 1]], seq[r - 1])
    for prefix, node in nodes.items():
        below = min(t for seq, t in times.items() if seq[:len(prefix)] == prefix)
        if math.isfinite(below) and below < cutoff:
            assert node.bound_s <= below * (1 + 1e-9), (prefix, node.bound_s, below)


def test_bounds_by_hand():
    """Two single-slot classes, a (scale 1) and b (half as fast, scale 2),
    two layers of F = 1 s, B = 2 s on a, GPipe, m = 2, no bytes on the
    link (latency 30 us). One layer per stage. Families at their least:
    micro-batch 0 down and up 3 + 6 = 9 s; each rank from micro-batch 0's
    arrival through its whole work: (a, b) max(6, 1 + 12) = 13 s, (b, a)
    max(12, 2 + 6) = 12 s; so the bound of prefix (a) is 13 s, of (b) 12 s,
    and best_order returns (b, a) (the slow rank first starts at once)."""
    fast, slow = tos._spec("a", 300, 1000), tos._spec("b", 150, 1000)
    cluster = Cluster("r", (DeviceGroup(fast, 1, 1), DeviceGroup(slow, 1, 1)), *tos.LINKS)
    prof = tos._profile([3.0, 3.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0])
    job = Job(global_batch_size=2, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, 1, 2, 2, "gpipe", 1)
    classes = slot_classes(cluster, 1)
    assert classes == [[0], [1]]
    cb = class_bounds(classes, costs_of, "gpipe", 2)
    lat = tos.LINKS[2].latency_s
    assert cb.extend(cb.root(), 0).bound_s == pytest.approx(13.0 + lat, abs=1e-9)
    assert cb.extend(cb.root(), 1).bound_s == pytest.approx(12.0, abs=1e-9)
    found = best_order(classes, costs_of, "gpipe", 2)
    times = _order_times(costs_of, classes, 2, 2, 2, "gpipe")
    assert found.status == "OPTIMAL" and found.order == (1, 0)
    assert found.iteration_time_s == pytest.approx(times[(1, 0)], rel=1e-12) == pytest.approx(min(times.values()))


def test_twin_minima_are_their_canonical_vectors_permuted_bit_for_bit(monkeypatch):
    """Three twin nodes of 2 b slots and one node of a (zb-h1, pp 5): the
    suffix minima computed only for vectors whose twin counts do not rise,
    the others permuted from them, equal bit for bit those computed for
    every vector (the symmetry switched off), and fewer are computed."""
    import pipesearch.order_bounds as ob

    a, b = tos._spec("a", 300, 1000), tos._spec("b", 100, 1000)
    cluster = Cluster("r", (DeviceGroup(a, 1, 1), DeviceGroup(b, 3, 2)), *tos.LINKS)
    prof = tos._profile([1e-3, 3e-3, 2e-3, 1e-3, 2e-3, 4e-3], [1e8] * 6, [0.0] * 6, [0.0] * 6)
    job = Job(global_batch_size=6, memory_reserve_bytes=0)
    pp, m = 5, 6
    costs_of = tos._point(prof, cluster, job, 1, pp, m, "zb-h1", 1)
    classes = slot_classes(cluster, 1)
    assert [len(c) for c in classes] == [1, 2, 2, 2]
    computed = []
    suffix_class = ob.ClassBounds._suffix_class
    monkeypatch.setattr(ob.ClassBounds, "_suffix_class", lambda self, c, s, stages, vectors, *rest: (
        computed.extend(map(tuple, vectors.tolist())), suffix_class(self, c, s, stages, vectors, *rest))[1])
    sym = class_bounds(classes, costs_of, "zb-h1", pp)
    assert sym._twin_sets == [[1, 2, 3]]
    n_sym = len(set(computed))
    computed.clear()
    monkeypatch.setattr(ob.ClassBounds, "_twin_sets", [])
    full = class_bounds(classes, costs_of, "zb-h1", pp)
    assert n_sym < len(set(computed))
    assert sym.V.keys() == full.V.keys()
    for left in full.V:
        assert np.array_equal(sym.V[left], full.V[left]), left
    assert sym.V[(0, 2, 1, 0)][1].tobytes() == full.V[(0, 1, 2, 0)][2].tobytes()  # by hand: swap b1, b2


def test_twin_nodes_are_branched_once_and_donors_cover_every_rank():
    """Two nodes of 2 b slots (one group) and one node of a: the two b
    classes are twins (same slots, terms and links to a), so a prefix may
    open the second b node only after the first; the covering orders put
    every class on every rank. best_order equals brute force."""
    a, b = tos._spec("a", 300, 1000), tos._spec("b", 100, 1000)
    cluster = Cluster("r", (DeviceGroup(a, 1, 1), DeviceGroup(b, 2, 2)), *tos.LINKS)
    prof = tos._profile([1e-3, 3e-3, 2e-3, 1e-3, 2e-3], [1e8] * 5, [0.0] * 5, [0.0] * 5)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    pp, m = 4, 4
    costs_of = tos._point(prof, cluster, job, 1, pp, m, "zb-h1", 1)
    classes = slot_classes(cluster, 1)
    assert [len(c) for c in classes] == [1, 2, 2]
    cb = class_bounds(classes, costs_of, "zb-h1", pp)
    assert cb.twin_before == (None, None, 1)
    root = cb.root()
    assert cb.allowed(root, 1) and not cb.allowed(root, 2)
    assert cb.allowed(cb.extend(root, 1), 2)
    cls = {x: c for c, members in enumerate(classes) for x in members}
    covered = {(s, cls[x]) for o in covering_orders(classes, pp) for s, x in enumerate(o)}
    assert covered == {(s, c) for s in range(pp) for c in range(3)}
    times = _order_times(costs_of, classes, 5, pp, m, "zb-h1")
    found = best_order(classes, costs_of, "zb-h1", pp, max_orders=10**6)
    assert found.status == "OPTIMAL" and found.iteration_time_s == pytest.approx(min(times.values()), rel=1e-9)
    # a cutoff below the optimum: nothing beats it (the one-family check or the full search proves it);
    # just above it: the optimum
    low = best_order(classes, costs_of, "zb-h1", pp, cutoff_s=min(times.values()) * 0.999)
    assert low.status == "ABOVE_CUTOFF" and low.best_bound_s >= min(times.values()) * 0.999
    high = best_order(classes, costs_of, "zb-h1", pp, cutoff_s=min(times.values()) * 1.001)
    assert high.status == "OPTIMAL" and high.iteration_time_s == pytest.approx(min(times.values()), rel=1e-9)


def _two_round_trips_s(times, m: int) -> float:
    """The ZB-H1 path of two round trips (docs/heterogeneous.md), written
    from one split's stage times: micro-batch 0 down and up, rank 0's ``W``
    of it and forward of micro-batch ``S``, that one down to stage ``k``,
    rank ``k``'s ``m - S`` forwards and the ``I``, ``W`` between them,
    micro-batch ``m - 1`` down from ``k`` and back up, rank 0's last ``W``
    and all-reduce: ``2 sum_s (F + I + 2 c)_s + 2 W_0 + r_0 + (m - S - 1)
    max_k (F + B)_k``."""
    F, B, I = (np.asarray(x, dtype=float) for x in (times.fwd_s, times.bwd_s, times.bwd_input_s))
    c = np.append(np.asarray(times.p2p_s, dtype=float), 0.0)
    S = len(F)
    return float(2 * np.sum(F + I + 2 * c) + 2 * (B[0] - I[0]) + times.allreduce_s[0] + (m - S - 1) * np.max(F + B))


def _zb_h1_times_below_paths(inst, extra: int, paths):
    """A random instance under ZB-H1 with ``m = pp + extra``: every order's
    least simulated time over its splits that fit, keyed by its class
    sequence, after checking that each length of ``paths(stage_times, m)``
    is at most the simulated time of every order and split. ``(classes,
    costs_of, pp, times)``, or None when the instance has fewer slots or
    layers than ranks."""
    cluster, tp, pp, _, _, _, prof = inst
    L, m = prof.num_layers, pp + extra
    if pp > L or len(slot_heads(cluster, tp)) < pp:
        return None
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, tp, pp, m, "zb-h1", 1)
    classes = slot_classes(cluster, tp)
    cls = {x: c for c, members in enumerate(classes) for x in members}
    times: dict = {}
    for n in count_vectors([len(c) for c in classes], pp):
        for order in orders_of_vector(classes, n):
            costs, best = costs_of(order), math.inf
            for cut in itertools.combinations(range(1, L), pp - 1):
                bounds = (0, *cut, L)
                if costs.split_fits(bounds):
                    st_times = costs.stage_times(bounds)
                    t = simulate_times("zb-h1", pp, m, 1, st_times)[0]
                    for q, length in enumerate(paths(st_times, m)):
                        assert length <= t * (1 + 1e-9), (order, bounds, q)
                    best = min(best, t)
            times[tuple(cls[x] for x in order)] = best
    return classes, costs_of, pp, times


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tos.instances(), st.integers(1, 3))
def test_zb_h1_two_round_trips_bound_every_order_and_split(inst, extra):
    """Random mixed clusters under ZB-H1 with ``m = pp + extra > pp``: the
    two-round-trip path, written from each split's stage times, is at most
    the simulated time of every order and split; and the class bounds with
    that family alone (``z6s``, ``z6m``) give every prefix of classes a
    bound at most the least simulated time of the orders that start with
    it. A count of rank k's actions between F of micro-batch S and F of
    micro-batch m - 1 that the schedule does not run, a transfer counted
    twice too often, or the family's terms written on the wrong stage would
    fail here."""
    found = _zb_h1_times_below_paths(inst, extra, lambda times, m: [_two_round_trips_s(times, m)])
    if found is None:
        return
    classes, costs_of, pp, times = found
    cb = class_bounds(classes, costs_of, "zb-h1", pp, only=("z6s", "z6m"))
    assert [[n for _, n in fam] for fam in cb.fams] == [["z6s", "z6m"]]
    _assert_prefix_bounds_below_orders(cb, times, pp)


def test_zb_h1_two_round_trips_by_hand():
    """Three identical devices in one node (transfer c = the link's latency,
    no bytes), three layers of F = I = W = t = 1 ms (tos._profile: F = x/3,
    B = 2x/3, I = B/2), one per stage, ZB-H1 with m = 5: the family is
    2 (3 (F + I) + 4 c) + 2 W + (m - S - 1) 3 t = 17 t + 8 c, and it is the
    simulated time (docs/schedules.md: ZB-H1 takes 3 m t + (p - 1) t with
    no link delay; each of the two round trips adds its 4 transfers)."""
    t, c, scale, costs, bound_of = _three_identical_stages([0.0] * 3)
    hand = scale * 17 * t + 8 * c
    assert simulate_times("zb-h1", 3, 5, 1, costs.stage_times((0, 1, 2, 3)))[0] == pytest.approx(hand, rel=1e-12)
    assert bound_of(("z6s", "z6m")) == pytest.approx(hand, rel=1e-12)


def _three_identical_stages(params):
    """Three identical devices in one node (transfer c = the link's
    latency, no bytes), three layers of F = I = W = t = 1 ms (tos._profile:
    F = x/3, B = 2x/3, I = B/2) with ``params`` bytes, one per stage, ZB-H1
    with m = 5: ``(t, c, scale, costs, bound_of)``, ``bound_of(only)`` the
    class bound of the one order with those families alone."""
    dev = tos._spec("a", 300, 1000)
    cluster = Cluster("r", (DeviceGroup(dev, 1, 3),), *tos.LINKS)
    t, pp, m = 1e-3, 3, 5
    prof = tos._profile([3 * t] * 3, [0.0] * 3, params, [0.0] * 3)
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    costs_of = tos._point(prof, cluster, job, 1, pp, m, "zb-h1", 1)
    costs = costs_of((0, 1, 2))

    def bound_of(only) -> float:
        cb = class_bounds(slot_classes(cluster, 1), costs_of, "zb-h1", pp, only=only)
        node = cb.root()
        for _ in range(pp):
            node = cb.extend(node, 0)
        return node.bound_s

    # the profile is measured on "a": scale 1
    return t, tos.LINKS[0].latency_s, float(costs.time_scale[0]), costs, bound_of


def _end_at_rank_s(times, m: int, q: int) -> float:
    """The ZB-H1 path of two round trips that ends on rank ``q`` (``q = 0``:
    :func:`_two_round_trips_s`), written from one split's stage times:
    micro-batch 0 down and up, rank 0's ``W`` of it and forward of
    micro-batch ``S``, rank ``k``'s steady state, micro-batch ``m - 1`` down
    to the last stage and back up to stage ``q`` only, then the ``q + 1``
    ``W`` rank ``q`` runs after its last ``I`` (schedules.zb_h1: the ``W``
    of micro-batch ``j`` follows the ``I`` of ``j + q``) and its all-reduce:
    ``sum_s (2 F + I + 3 c)_s + W_0 + (m - S - 1) max_k (F + B)_k + sum_{s
    >= q} (I + c)_s + (q + 1) W_q + r_q``."""
    F, B, I = (np.asarray(x, dtype=float) for x in (times.fwd_s, times.bwd_s, times.bwd_input_s))
    c = np.append(np.asarray(times.p2p_s, dtype=float), 0.0)
    S, W = len(F), B - I
    return float(np.sum(2 * F + I + 3 * c) + W[0] + (m - S - 1) * np.max(F + B) + np.sum((I + c)[q:])
                 + (q + 1) * W[q] + times.allreduce_s[q])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tos.instances(), st.integers(1, 3))
def test_zb_h1_round_trips_ending_on_any_rank_bound_every_order_and_split(inst, extra):
    """Random mixed clusters under ZB-H1 with ``m = pp + extra > pp``: the
    path of two round trips ending on rank ``q``, for every ``q``, is at
    most the simulated time of every order and split; and the class bounds
    with that family alone (``z7s``, ``z6m``, ``z7q``) give every prefix of
    classes a bound at most the least simulated time of the orders that
    start with it. One ``W`` too many after rank ``q``'s last ``I``, the
    up trip counted below ``q``, or ``r`` of the wrong rank would fail here."""
    found = _zb_h1_times_below_paths(
        inst, extra, lambda times, m: [_end_at_rank_s(times, m, q) for q in range(len(times.fwd_s))])
    if found is None:
        return
    classes, costs_of, pp, times = found
    cb = class_bounds(classes, costs_of, "zb-h1", pp, only=("z7s", "z6m", "z7q"))
    assert [[n for _, n in fam] for fam in cb.fams] == [["z7s", "z6m", "z7q"]]
    _assert_prefix_bounds_below_orders(cb, times, pp)


def test_zb_h1_round_trips_ending_on_the_last_rank_by_hand():
    """Three identical devices in one node, three layers of F = I = W = t =
    1 ms, one per stage, ZB-H1 with m = 5, parameters on the last layer
    only, so that only the last rank has an optimizer step ``r``: rank 2
    runs its 15 actions from 2 t on without a gap (ZB-H1 takes 3 m t +
    (p - 1) t = 17 t with no link delay) and then its step, so the time is
    17 t + r plus the transfers of its path, 3 per boundary: micro-batch 0
    down and up, and micro-batch 5 - 1 down. The family ending on rank 2
    gives exactly that; the one ending on rank 0 (17 t + 8 c, no step)
    less."""
    t, c, scale, costs, bound_of = _three_identical_stages([0.0, 0.0, 2e9])
    times = costs.stage_times((0, 1, 2, 3))
    r = float(times.allreduce_s[2])
    assert r > 4 * c and times.allreduce_s[0] == times.allreduce_s[1] == 0.0
    hand = scale * 17 * t + 6 * c + r
    assert simulate_times("zb-h1", 3, 5, 1, times)[0] == pytest.approx(hand, rel=1e-12)
    assert _end_at_rank_s(times, 5, 2) == pytest.approx(hand, rel=1e-12)
    assert bound_of(("z7s", "z6m", "z7q")) == pytest.approx(hand, rel=1e-12)
    assert bound_of(("z6s", "z6m")) == pytest.approx(scale * 17 * t + 8 * c, rel=1e-12)
