"""The local search of a stopped split search (pipesearch/local_split.py).

* ``neighbours``: the moves, by hand on a small split.
* ``improve_split``: steepest descent reaches the minimum of a separable
  convex function of the boundaries, never ends slower than it started,
  and evaluates only splits that fit; it stops at its count of evaluations.
* ``exact_split`` with its work limits cut so that it stops: the split it
  returns is no slower than any split one move away, each replayed in the
  discrete-event simulator (a search that stops without the local search
  returns a split some move improves on for some seeds).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipesearch import branch_and_bound
from pipesearch import split_search
from pipesearch.local_split import improve_split, neighbours, relocations
from pipesearch.split_search import exact_split
from test_split_search_lookahead import _instance
from pipesearch.timemodel import simulate_times


def test_neighbours_by_hand():
    """(0, 2, 3, 6), radius 1: boundary 1 to 1 or 3 (3 would empty stage 1:
    refused), boundary 2 to 2 (empties stage 1: refused) or 4, both together
    to (1, 2) or (3, 4)."""
    got = neighbours((0, 2, 3, 6), radius=1)
    assert got == sorted({(0, 1, 3, 6), (0, 2, 4, 6), (0, 1, 2, 6), (0, 3, 4, 6)})
    assert all(b[0] == 0 and b[-1] == 6 for b in neighbours((0, 2, 3, 6), radius=2))


@pytest.mark.parametrize("radius", (1, 2, 3))
@pytest.mark.parametrize("run", (2, 4))
def test_neighbours_are_the_splits_one_move_away(radius, run):
    """Every split of ``L`` layers (3-9) into ``S`` stages (1-6), from every
    split: its neighbours are exactly the other splits that differ from it
    in one inner boundary by at most ``radius`` layers, or in ``2 .. run``
    adjacent inner boundaries by the same one layer, in sorted order (found
    here by comparing against every split)."""
    for L in range(3, 10):
        for S in range(1, min(L, 6) + 1):
            every = [(0, *cut, L) for cut in itertools.combinations(range(1, L), S - 1)]
            for b in every:
                want = []
                for c in every:
                    diff = [y - x for x, y in zip(b, c)]
                    moved = [k for k, x in enumerate(diff) if x]
                    if (len(moved) == 1 and abs(diff[moved[0]]) <= radius) or (
                            2 <= len(moved) <= run and moved[-1] - moved[0] == len(moved) - 1
                            and len({diff[k] for k in moved}) == 1 and abs(diff[moved[0]]) == 1):
                        want.append(c)
                assert neighbours(b, radius, run) == sorted(want), (b, radius, run)


def test_descent_reaches_the_minimum_of_a_convex_function():
    """f(b) = sum_k (b_k - target_k)^2 over the inner boundaries: every
    single move that brings one boundary closer lowers f, so steepest descent
    from any split ends at the target (checked from 20 random starts); splits
    that do not fit (boundary 2 at 7) are never evaluated."""
    target = (0, 3, 5, 9, 12)
    rng = np.random.default_rng(0)
    seen = []

    def evaluate(splits):
        seen.extend(splits)
        return [float(sum((a - b) ** 2 for a, b in zip(s, target))) for s in splits]

    def fits(s):
        return s[2] != 7

    for _ in range(20):
        inner = np.sort(rng.choice(np.arange(1, 12), 3, replace=False))
        start = (0, *map(int, inner), 12)
        if not fits(start):
            continue
        t0 = evaluate([start])[0]
        best, t = improve_split(start, t0, evaluate, lambda c: [fits(x) for x in c])
        assert t <= t0
        assert best == target and t == 0.0
    assert all(fits(s) for s in seen)


def test_descent_stops_at_its_count_of_evaluations():
    """With ``max_splits`` = 6 on the convex function above from (0, 2, 7,
    10, 12) (f = 1 + 4 + 1 = 6; 14 neighbours): exactly the first 6
    neighbours in sorted order are evaluated, (0, 1, 6, 10, 12) f = 6, (0,
    1, 7, 10, 12) 9, (0, 2, 5, 10, 12) 2, (0, 2, 6, 9, 12) 2, (0, 2, 6, 10,
    12) 3, (0, 2, 7, 8, 12) 6; the descent moves to the first of the two at
    2 and stops there (the unlimited descent goes on to the target)."""
    target = (0, 3, 5, 9, 12)
    seen = []

    def evaluate(splits):
        seen.extend(splits)
        return [float(sum((a - b) ** 2 for a, b in zip(s, target))) for s in splits]

    start = (0, 2, 7, 10, 12)
    best, t = improve_split(start, 6.0, evaluate, lambda c: [True] * len(c), max_splits=6)
    assert seen == [(0, 1, 6, 10, 12), (0, 1, 7, 10, 12), (0, 2, 5, 10, 12), (0, 2, 6, 9, 12), (0, 2, 6, 10, 12),
                    (0, 2, 7, 8, 12)]
    assert (best, t) == ((0, 2, 5, 10, 12), 2.0)
    assert improve_split(start, 6.0, evaluate, lambda c: [True] * len(c)) == (target, 0.0)




def test_a_limited_descent_asks_about_few_neighbours_and_takes_the_first_that_fit():
    """Same descent, ``max_splits`` = 3, with the neighbours whose second
    boundary is 1 not fitting: the three evaluated are the first three
    that fit in sorted order, (0, 2, 5, 10, 12), (0, 2, 6, 9, 12), (0, 2,
    6, 10, 12), as with every neighbour asked at once; ``fits`` is asked
    about blocks of at most 6 of the 14, and, the count spent, no second
    round asks again."""
    target = (0, 3, 5, 9, 12)
    seen, asked = [], []

    def evaluate(splits):
        seen.extend(splits)
        return [float(sum((a - b) ** 2 for a, b in zip(s, target))) for s in splits]

    def fits(splits):
        asked.append(len(splits))
        return [s[1] != 1 for s in splits]

    best, t = improve_split((0, 2, 7, 10, 12), 6.0, evaluate, fits, max_splits=3)
    assert seen == [(0, 2, 5, 10, 12), (0, 2, 6, 9, 12), (0, 2, 6, 10, 12)]
    assert (best, t) == ((0, 2, 5, 10, 12), 2.0)
    assert asked == [6]  # the first block holds 4 that fit; the round after the count is spent asks nothing
@pytest.mark.parametrize("seed", range(20))
def test_bounded_neighbours_are_skipped_and_the_descent_is_the_same(seed):
    """A random landscape (times drawn per split, many exact ties) with lower
    bounds between half the time and the time (some exact): the descent with
    ``lower`` ends at the same split and time as without, with and without
    ``max_splits``, and evaluates only neighbours whose bound is below the
    time then current (so at most as many as without)."""
    rng = np.random.default_rng(seed)
    table, bound = {}, {}

    def time_of(s):
        if s not in table:
            table[s] = float(rng.integers(1, 12))  # coarse: ties between neighbours
            bound[s] = table[s] * (1.0 if rng.random() < 0.3 else float(rng.uniform(0.5, 1.0)))
        return table[s]

    for limit in (None, 9):
        start = (0, 3, 5, 9, 12)
        t0 = time_of(start)
        plain_seen, bounded_seen = [], []
        plain = improve_split(start, t0, lambda c: plain_seen.extend(c) or [time_of(x) for x in c],
                              lambda c: [True] * len(c), max_splits=limit)
        def lower(c):
            for x in c:
                time_of(x)  # draws its time and bound
            return [bound[x] for x in c]

        bounded = improve_split(start, t0, lambda c: bounded_seen.extend(c) or [time_of(x) for x in c],
                                lambda c: [True] * len(c), max_splits=limit, lower=lower)
        assert bounded == plain
        assert set(bounded_seen) <= set(plain_seen) and len(bounded_seen) <= len(plain_seen)


@pytest.mark.parametrize("seed", range(12))
def test_stopped_search_returns_a_local_optimum(seed, monkeypatch):
    """With the branch and bound cut to 2 nodes and 2 splits (and no
    enumeration), the returned split is at most every fitting split one
    move away, each simulated by the discrete-event simulator."""
    schedule, pp, vp, costs = _instance(200 + seed, 10, 14)
    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 0)
    monkeypatch.setattr(split_search, "PROOF_SPLITS", 0)
    got = exact_split(costs, schedule, pp, vp, max_nodes=2, max_splits=2)
    if got is None or got.exact:
        pytest.skip("no split fits, or the search finished")
    m = costs.num_micro_batches
    for b in neighbours(got.bounds):
        if costs.split_fits(b):
            t, _ = simulate_times(schedule, pp, m, vp, costs.stage_times(np.array(b)))
            assert got.best_time_s <= t * (1 + 1e-9), b


def test_remaining_nodes_estimate_by_hand():
    """Root: children bounds 1, 2, 9 with the first visited, limit 5: one
    live child (9 is excluded); the frame below: four children, two
    visited, two live. Each live child of the frame below stands for itself
    (1 node): 2; each live root child for itself and a subtree of 2: 3. The
    tree left: 5 nodes; nothing live: 0."""
    from pipesearch.branch_and_bound import remaining_nodes_estimate

    frames = [([1.0, 2.0, 9.0], 1, 3), ([1.0, 1.0, 1.0, 1.0], 2, 4)]
    assert remaining_nodes_estimate(frames, 5.0) == 5.0
    assert remaining_nodes_estimate([([1.0, 2.0], 2, 2)], 5.0) == 0.0


def test_searched_share_by_hand():
    """Root: children bounds 1, 2, 9, limit 5: two live, each half the
    tree; the one at position 0 in progress. Below it: four live children,
    an eighth each, two finished: a quarter searched. With the root's
    second child in progress and one of two below finished: 1/2 + 1/4.
    Under a limit of 1.5 the root's second child (bound 2) is excluded
    while in progress: its one live sibling finished, all of it searched."""
    from pipesearch.branch_and_bound import searched_share

    assert searched_share([([1.0, 2.0, 9.0], 0, 1, 3), ([1.0] * 4, 0, 2, 4)], 5.0) == 0.25
    assert searched_share([([1.0, 2.0, 9.0], 0, 2, 3), ([3.0, 3.0], 0, 1, 2)], 5.0) == 0.75
    assert searched_share([([1.0, 2.0, 9.0], 0, 2, 3), ([3.0, 3.0], 0, 1, 2)], 1.5) == 1.0
    assert searched_share([([6.0], 0, 0, 1)], 5.0) == 0.0


@pytest.mark.parametrize("rule", ["path estimate", "searched share"])
def test_searches_stopped_as_hopeless_keep_valid_bounds(monkeypatch, rule):
    """With either estimate taken before the third node and any tree of
    more than a small share of the node limit called hopeless (and no
    enumeration), on 8 seeded points: some searches stop there (before,
    every one ran to its limit), and each one reports a lower bound at most
    the best time of every fitting split (the discrete-event simulator on
    each) and a split whose time is its own; one that ends has that best."""
    from pipesearch.split_search import exhaustive_simulated_split

    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 0)
    monkeypatch.setattr(split_search, "PROOF_SPLITS", 0)
    if rule == "path estimate":
        monkeypatch.setattr(branch_and_bound, "ESTIMATE_NODES", 3)
        monkeypatch.setattr(branch_and_bound, "HOPELESS_FACTOR", 0.1)
    else:
        monkeypatch.setattr(branch_and_bound, "ESTIMATE_NODES", 10**9)
        monkeypatch.setattr(branch_and_bound, "PROGRESS_CHECKS", ((3, 0.01),))
    stopped = 0
    for seed in range(8):
        schedule, pp, vp, costs = _instance(400 + seed, 8, 10)
        got = exact_split(costs, schedule, pp, vp, max_nodes=50)
        ref = exhaustive_simulated_split(costs, schedule, pp, vp)
        if ref is None:
            assert got is None
            continue
        stopped += not got.exact and got.nodes < 3
        m = costs.num_micro_batches
        t, _ = simulate_times(schedule, pp, m, vp, costs.stage_times(np.array(got.bounds)))
        assert got.iteration_time_s == pytest.approx(t, rel=1e-12)
        assert got.lower_bound_s <= ref[0] * (1 + 1e-9)
        if got.exact:
            assert got.best_time_s == pytest.approx(ref[0], rel=1e-9)
    assert stopped > 0


def test_fluid_only_points_build_no_tables_and_keep_valid_bounds(monkeypatch):
    """With the fluid bound's regime forced on small interleaved points
    (every table counted large, every node budget below the limit, no
    enumeration): no bound table is built, and on 6 seeded points each
    search reports a lower bound at most the best time of every fitting
    split (each simulated), a split whose time is its own, and exact only
    when that bound meets it; with cutoffs at and above the optimum, a
    point is proven unable to beat its cutoff only when the optimum does
    not beat it either."""
    from pipesearch.split_search import exhaustive_simulated_split

    def no_tables(*args, **kwargs):
        raise AssertionError("a bound table was built")

    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 0)
    monkeypatch.setattr(split_search, "PROOF_SPLITS", 0)
    monkeypatch.setattr(split_search, "FLUID_FIRST_RANGES", 0)
    monkeypatch.setattr(split_search, "FLUID_ONLY_NODES", 10**9)
    monkeypatch.setattr(split_search, "SuffixTables", no_tables)
    seen = 0
    for seed in range(60):
        schedule, pp, vp, costs = _instance(500 + seed, 8, 10)
        if schedule != "interleaved-1f1b":
            continue
        ref = exhaustive_simulated_split(costs, schedule, pp, vp)
        if ref is None:
            continue
        seen += 1
        m = costs.num_micro_batches
        for cutoff in (np.inf, ref[0] * (1 + 1e-6), ref[0] * 1.2):
            got = exact_split(costs, schedule, pp, vp, cutoff_s=cutoff)
            assert got is not None
            assert got.lower_bound_s <= ref[0] * (1 + 1e-9)
            if not np.isfinite(got.best_time_s):  # proven: no split beats the cutoff
                assert got.exact and cutoff <= ref[0] * (1 + 1e-6)
                continue
            t, _ = simulate_times(schedule, pp, m, vp, costs.stage_times(np.array(got.bounds)))
            assert got.iteration_time_s == pytest.approx(t, rel=1e-12)
            assert not got.exact or got.lower_bound_s >= got.best_time_s * (1 - 1e-9)
        if seen == 6:
            break
    assert seen == 6


def test_a_run_of_boundaries_moved_together_leaves_a_pairs_only_optimum():
    """Widths (3, 2, 2, 3) scored by their distance to (2, 2, 2, 4): one
    boundary moved, or two together, never scores better (2), so a descent
    over those moves stays; the first three moved back one layer together
    reach (2, 2, 2, 4), score 0, and the default descent (pairs, then runs)
    finds it."""
    target = np.array([2, 2, 2, 4])

    def evaluate(splits):
        return [float(np.abs(np.diff(b) - target).sum()) for b in splits]

    def fits(splits):
        return [True] * len(splits)

    start = (0, 3, 5, 7, 10)
    assert improve_split(start, 2.0, evaluate, fits, run=2) == (start, 2.0)
    assert improve_split(start, 2.0, evaluate, fits) == ((0, 2, 4, 6, 10), 0.0)


def test_relocations_are_the_splits_with_one_boundary_elsewhere():
    """Every split of ``L`` layers (3-9) into ``S`` stages (1-6), from every
    split: its relocations are exactly the other splits whose inner
    boundaries differ from its own in one (the sets differ by one taken out
    and one put in), in sorted order; ``(S - 1)(L - S)`` of them."""
    for L in range(3, 10):
        for S in range(1, min(L, 6) + 1):
            every = [(0, *cut, L) for cut in itertools.combinations(range(1, L), S - 1)]
            for b in every:
                want = sorted(c for c in every if len(set(c) ^ set(b)) == 2)
                assert relocations(b) == want, b
                assert len(want) == (S - 1) * (L - S)


def test_a_relocation_leaves_a_local_optimum_of_the_boundary_moves():
    """Stages of 3, 1, 2, 4 layers scored by how many differ from (3, 3, 2,
    2): every move of one boundary by up to two layers, or of a run of
    them, changes the stages around it and scores no better (2), but
    taking the boundary at layer 4 to layer 8 (the second stage merged
    into the third, the last cut in two) matches all four."""
    target = np.array([3, 3, 2, 2])

    def evaluate(splits):
        return [float(np.sum(np.diff(b) != target)) for b in splits]

    start = (0, 3, 4, 6, 10)
    assert evaluate([start]) == [2.0]
    assert min(evaluate(neighbours(start))) >= 2.0
    assert improve_split(start, 2.0, evaluate, lambda splits: [True] * len(splits)) == ((0, 3, 6, 8, 10), 0.0)
