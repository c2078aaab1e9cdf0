"""The branch and bound's vectorised node expansion (``_Expander``) and the
rank-counting bound's order statistic.

* Expanding many nodes of a stage at once, ahead of the depth-first order,
  visits the same nodes with the same bounds as expanding one node at a
  time: the whole :class:`pipesearch.split_search.ExactSplit` (split, time,
  bound, nodes, splits evaluated) is the same for every look-ahead width,
  with and without a cutoff, at a node limit that stops the search and at
  one that lets it finish.
* ``_kth_smallest`` equals sorting each row, and ``kth_level`` (the
  sampled order statistic of long rows) and ``kth_level_whole`` (every
  level formed) equal sorting every level, with
  ties, zero factors and offsets that leave some ranks no level below the
  answer.
* The rank-counting bound's order-statistic part equals the smallest
  maximum over every way of giving the layers still to place to the ranks
  (enumerated), so reading only each rank's first levels keeps it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import tied_or_random_profile, tiny_cluster
from pipesearch import bound_tables
from pipesearch import branch_and_bound
from pipesearch import rank_bounds
from pipesearch import split_evaluator
from pipesearch import split_search
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.schedules import build, in_flight_peaks, num_stages_of
from pipesearch.in_flight import schedule_chunk_states
from pipesearch.split_search import exact_split, exhaustive_simulated_split
from pipesearch.types import Job, Link

SCHEDULES = (("1f1b", 1), ("zb-h1", 1), ("gpipe", 1), ("interleaved-1f1b", 2))


def _instance(seed: int, L_low: int, L_high: int):
    """A seeded point: the seed's schedule, 2-3 ranks, identical layers with
    a random head (ties everywhere) for even seeds, random layers for odd
    ones, memory that refuses some splits for every third seed (interleaved
    1F1B: checked device by device, :attr:`PipelineCosts.chunk_states`)."""
    rng = np.random.default_rng(seed)
    schedule, vp = SCHEDULES[seed % len(SCHEDULES)]
    pp = int(rng.integers(3, 5)) if vp == 1 else 2
    S = num_stages_of(schedule, pp, vp)
    L = int(rng.integers(max(L_low, S + 1), L_high + 1))
    m = pp * int(rng.integers(1, 3)) if vp > 1 else int(rng.integers(pp, pp + 5))
    prof, params, outputs = tied_or_random_profile(rng, L, seed % 2 == 0)
    link = Link(float(rng.choice([1e8, 1e9, 1e10])), float(rng.choice([0, 1e-4])))
    memory = 1e12 if seed % 3 else float(params.sum()) * 2.0 * 3.0 / S + float(outputs.max()) * 2 * m
    cluster = tiny_cluster(1, 2 * pp, memory_bytes=memory, intra=link, inter=link)
    job = Job(global_batch_size=2 * m, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    costs = build_pipeline_costs(prof, cluster, job, pp=S, dp=2, micro_batch_size=1, num_micro_batches=m,
                                 schedule="gpipe", placement=pipeline_placement(pp, 2)[np.arange(S) % pp],
                                 in_flight=np.array(in_flight_peaks(build(schedule, pp, m, vp))),
                                 stages_per_device=vp, chunk_states=schedule_chunk_states(schedule, pp, m, vp))
    return schedule, pp, vp, costs


def _search(costs, schedule: str, pp: int, vp: int, max_nodes: int, max_splits: int):
    """The branch and bound alone from no incumbent: ``(exact, frontier
    bound, nodes)`` and every split it evaluated with its time."""
    ev = split_evaluator.SplitEvaluator(costs, schedule, pp, vp)
    tables = bound_tables.SuffixTables(costs, schedule, pp, costs.num_layers)
    counter = rank_bounds.RankCount(costs, schedule, pp)
    state = branch_and_bound.run_branch_and_bound(tables, ev, costs.pp, costs.num_layers, pp, np.inf,
                                           split_search.EQUAL_TIME_REL, max_splits, max_nodes, counter)
    return state, ev.times


@pytest.mark.parametrize("seed", range(16))
def test_look_ahead_keeps_every_node_and_bound(seed, monkeypatch):
    """Look-ahead widths 1 (one node at a time), 3 and the default give the
    same result: the branch and bound from no incumbent at node limits 5,
    50 and 3000 and split limits 3 and 300 (the same frontier bound, nodes
    and evaluated splits), and the whole :func:`exact_split` without a
    cutoff and with one just above the optimum (the cutoff proof's first
    nodes run). A child kept or dropped by a limit other than the current
    one, a child given another parent's values, or children ordered
    differently among equal bounds changes the nodes, the evaluated splits
    or the bound."""
    schedule, pp, vp, costs = _instance(seed, 10, 14)
    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 0)  # interleaved points searched, not enumerated
    full = exact_split(costs, schedule, pp, vp)
    if full is None:
        pytest.skip("no split fits")
    runs = {}
    for width in dict.fromkeys((1, 3, branch_and_bound.LOOKAHEAD_WIDTH, 128)):
        monkeypatch.setattr(branch_and_bound, "LOOKAHEAD_WIDTH", width)
        runs[width] = ([_search(costs, schedule, pp, vp, n, k) for n in (5, 50, 3000) for k in (3, 300)],
                       [exact_split(costs, schedule, pp, vp, cutoff_s=c) for c in (np.inf, full.best_time_s * 1.02)])
    first, *rest = runs.values()
    for other in rest:
        assert other == first
    if seed % 3:  # memory refuses no split: the unlimited search left the first path
        assert first[0][-1][0][2] > costs.pp


def test_look_ahead_of_a_deep_search_stays_near_the_nodes_it_visits(monkeypatch):
    """Deep searches (16 stages, 40 layers) that their first progress check
    stops (after 99 nodes of a 3,000-node limit) expand at most about four
    times the nodes they visit plus one level: each look-ahead reaches no
    further than the next node where a stop rule may end the search, and a
    level with ``D`` levels below takes at most ``budget / floor((D + 1) /
    4)`` nodes (64 a level down 16 levels to the node limit expanded 750 to
    920 nodes here).
    Each result is that of a search with no progress check and a node
    limit of 99 (the same nodes in the same order)."""
    expanded = []
    expand = branch_and_bound._Expander.expand
    monkeypatch.setattr(branch_and_bound._Expander, "expand",
                        lambda self, s, starts, acc, limit: (expanded.append(len(starts)),
                                                            expand(self, s, starts, acc, limit))[1])
    stopped_searches = 0
    for seed in range(8):
        rng = np.random.default_rng(7100 + seed)
        schedule, vp = SCHEDULES[seed % len(SCHEDULES)]
        pp = 16 // vp
        L, m = 40, 2 * pp
        prof, _, _ = tied_or_random_profile(rng, L, seed % 2 == 0)
        cluster = tiny_cluster(2, 16, intra=Link(1e10, 1e-5), inter=Link(1e9, 1e-5))
        job = Job(global_batch_size=2 * m, state_bytes_per_param=2.0, memory_reserve_bytes=0)
        S = num_stages_of(schedule, pp, vp)
        costs = build_pipeline_costs(prof, cluster, job, pp=S, dp=2, micro_batch_size=1, num_micro_batches=m,
                                     schedule="gpipe", placement=pipeline_placement(pp, 2)[np.arange(S) % pp],
                                     in_flight=np.array(in_flight_peaks(build(schedule, pp, m, vp))),
                                     stages_per_device=vp, chunk_states=schedule_chunk_states(schedule, pp, m, vp))
        monkeypatch.setattr(branch_and_bound, "PROGRESS_CHECKS", ((100, 0.0),))  # the check at node 100 always stops
        monkeypatch.setattr(branch_and_bound, "EARLY_CHECK", (30, np.inf))  # and the early one never
        expanded.clear()
        stopped, _ = _search(costs, schedule, pp, vp, 3000, 10**6)
        if stopped[0]:  # ended before the check
            continue
        stopped_searches += 1
        assert stopped[2] == 99 and sum(expanded) <= 4 * 100 + branch_and_bound.LOOKAHEAD_WIDTH, (seed, sum(expanded))
        monkeypatch.setattr(branch_and_bound, "PROGRESS_CHECKS", ())
        assert _search(costs, schedule, pp, vp, 99, 10**6)[0] == stopped, seed
    assert stopped_searches >= 4


def _deep_interleaved_point(schedule: str, vp: int, pp: int):
    """The PipelineCosts of a seeded 40-layer point of ``pp * vp`` stages
    (random layers, two 16-GPU nodes) whose branch and bound runs past
    1,000 nodes: the stop-rule tests set its tree estimates."""
    rng = np.random.default_rng(7103)
    prof, _, _ = tied_or_random_profile(rng, 40, False)
    cluster = tiny_cluster(2, 16, intra=Link(1e10, 1e-5), inter=Link(1e9, 1e-5))
    job = Job(global_batch_size=4 * pp, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    return build_pipeline_costs(prof, cluster, job, pp=pp * vp, dp=2, micro_batch_size=1, num_micro_batches=2 * pp,
                                schedule="gpipe", placement=pipeline_placement(pp, 2)[np.arange(pp * vp) % pp],
                                in_flight=np.array(in_flight_peaks(build(schedule, pp, 2 * pp, vp))),
                                stages_per_device=vp, chunk_states=schedule_chunk_states(schedule, pp, 2 * pp, vp))


def test_a_rising_estimate_above_the_rising_factor_stops_the_search(monkeypatch):
    """A deep search that runs past 1,000 nodes, its estimate of the tree
    set through ``searched_share`` (nodes over share; the progress checks
    at 100, 300 and 1,000 nodes, their own factor and the path estimate
    never reached), limit 3,000 nodes: above 3 times the limit at node 300
    and no lower than at node 100, it stops there (299 nodes); above twice
    the limit at node 1,000 and no lower than at node 300, it stops there
    (999 nodes); as high but lower than at the check before, or rising but
    below the factor, it runs on."""
    schedule, vp, pp = "interleaved-1f1b", 2, 8
    costs = _deep_interleaved_point(schedule, vp, pp)
    monkeypatch.setattr(branch_and_bound, "PROGRESS_CHECKS", ((100, 10**9), (300, 10**9), (1000, 10**9)))
    monkeypatch.setattr(branch_and_bound, "EARLY_CHECK", (10**6, 10**9))  # past the node limit: never checked
    monkeypatch.setattr(branch_and_bound, "ESTIMATE_NODES", 10**6)  # the path estimate at node 300 never runs
    nodes = {}
    for name, estimates in (("rising at 300", (9_000, 9_100, 9_100)), ("rising at 1,000", (9_000, 6_000, 6_100)),
                            ("falling", (20_000, 17_000, 16_500)), ("low", (4_000, 5_000, 5_900))):
        shares = iter([n / e for n, e in zip((100, 300, 1000), estimates)])
        monkeypatch.setattr(branch_and_bound, "searched_share", lambda frames, limit, it=shares: next(it))
        nodes[name] = _search(costs, schedule, pp, vp, 3000, 10**6)[0][2]
    assert nodes["rising at 300"] == 299, nodes
    assert nodes["rising at 1,000"] == 999, nodes
    assert nodes["falling"] > 1000 and nodes["low"] > 1000, nodes


def test_the_early_check_stops_only_a_search_with_a_finished_subtree_and_a_large_estimate(monkeypatch):
    """The progress check at node 30 (EARLY_CHECK, factor 30), the later
    checks and the path estimate never reached, limit 3,000 nodes: an
    estimate above 30 times the limit (95,000 nodes) stops the search
    there (29 nodes); one below it, or a share searched of 0 (no subtree
    finished yet: an infinite estimate that says nothing), runs on."""
    schedule, vp, pp = "interleaved-1f1b", 2, 8
    costs = _deep_interleaved_point(schedule, vp, pp)
    monkeypatch.setattr(branch_and_bound, "PROGRESS_CHECKS", ())
    monkeypatch.setattr(branch_and_bound, "RISING_CHECKS", {})
    monkeypatch.setattr(branch_and_bound, "ESTIMATE_NODES", 10**6)
    nodes = {}
    for name, share in (("large", 30 / 95_000), ("below the factor", 30 / 85_000), ("no subtree finished", 0.0)):
        monkeypatch.setattr(branch_and_bound, "searched_share", lambda frames, limit, x=share: x)
        nodes[name] = _search(costs, schedule, pp, vp, 3000, 10**6)[0][2]
    assert nodes["large"] == 29, nodes
    assert nodes["below the factor"] > 30 and nodes["no subtree finished"] > 30, nodes


@pytest.mark.parametrize("seed", range(12))
def test_look_ahead_search_is_the_brute_force_optimum(seed, monkeypatch):
    """With the branch and bound forced (no enumeration) and a look-ahead of
    3 nodes per level, the time is the best simulated time over every split
    that fits, proven."""
    schedule, pp, vp, costs = _instance(100 + seed, 6, 9)
    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 0)
    monkeypatch.setattr(branch_and_bound, "LOOKAHEAD_WIDTH", 3)
    ref = exhaustive_simulated_split(costs, schedule, pp, vp)
    got = exact_split(costs, schedule, pp, vp)
    if ref is None:
        assert got is None
        return
    assert got.exact and got.iteration_time_s == pytest.approx(ref[0], rel=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_kth_smallest_equals_sorting(seed):
    """Short rows (one sort) and long ones (a selection per distinct k), with
    ties and infinities: each row's k-th smallest is its sorted row at k."""
    rng = np.random.default_rng(seed)
    for width in (7, 300, 1000):
        values = rng.integers(0, 50, (40, width)).astype(float)
        values[rng.random(values.shape) < 0.1] = np.inf
        k = rng.integers(0, width, 40)
        assert np.array_equal(rank_bounds._kth_smallest(values, k), np.sort(values, axis=1)[np.arange(40), k])


def _levels_sorted(v, sigma, P, j, c, e):
    """Per row the ``e``-th smallest of every level ``v_q + sigma_q P[j, c_q +
    n]``, ``n = 1 .. e``, by sorting them all (the same two floating-point
    operations per level)."""
    out = []
    for r in range(len(e)):
        levels = np.concatenate([v[r, q] + sigma[q] * P[j[r], c[q] + 1:c[q] + 1 + e[r]] for q in range(len(c))])
        out.append(np.sort(levels)[e[r] - 1])
    return np.array(out)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_kth_level_equals_sorting_every_level(seed):
    """The sample's bracket and the windows never drop the answer: random
    cheapest-layer tables (tied layers for some), offsets from
    none to ten times the layers' work, per-row ranks from 1 to every
    level, one rank or up to nine."""
    rng = np.random.default_rng(seed)
    pp, L = int(rng.integers(1, 10)), int(rng.integers(8, 300))
    layer = rng.uniform(0.0, 1.0, L)
    if rng.random() < 0.4:
        layer = np.round(layer * 3) / 3  # few distinct layers: many equal levels
    P = np.full((L + 1, L + 1), np.inf)
    for row in range(L):
        P[row, 0] = 0.0
        P[row, 1:L - row + 1] = np.cumsum(np.sort(layer[row:]))
    c = rng.integers(0, 3, pp)
    n = int(rng.integers(1, 6))
    j = rng.integers(0, L - int(c.max()) - 2, n)
    e = np.array([int(rng.integers(1, L - jj - int(c.max()) + 1)) for jj in j])
    v = rng.exponential(1.0, (n, pp)) * float(rng.choice([0.0, 1.0, 10.0]))
    if rng.random() < 0.3:
        v = np.round(v)
    sigma = rng.choice([0.0, 0.5, 1.0, 2.0], pp) if rng.random() < 0.5 else np.full(pp, rng.uniform(0.1, 3.0))
    want = _levels_sorted(v, sigma, P, j, c, e)
    assert np.array_equal(rank_bounds.kth_level(v, sigma, P, j, c, e), want)
    assert np.array_equal(rank_bounds.kth_level_whole(v, sigma, P, j, c, e), want)


def _best_assignment(v, sigma, layers, c, extra):
    """The smallest ``max_q (v_q + sigma_q * (sum of the n_q cheapest
    layers))`` over every ``n_q >= c_q`` with ``sum n_q = sum c + extra``
    (each rank may take the cheapest: the relaxation of ``RankCount``)."""
    cheap = np.concatenate([[0.0], np.cumsum(np.sort(layers))])
    best = np.inf
    total = int(c.sum()) + extra
    for n in itertools.product(*(range(cq, total + 1) for cq in c)):
        if sum(n) != total or max(n) >= len(cheap):
            continue
        best = min(best, max(v[q] + sigma[q] * cheap[n[q]] for q in range(len(c))))
    return best


@pytest.mark.parametrize("sorted_levels, whole_levels", ((rank_bounds._SORTED_LEVELS, rank_bounds._WHOLE_LEVELS),
                                                          (0, 0), (0, 2**40)))
@pytest.mark.parametrize("seed", range(12))
def test_rank_count_order_statistic_is_the_best_assignment(seed, sorted_levels, whole_levels, monkeypatch):
    """For states with only rank work (no fill, drain or all-reduce), the
    rank-counting bound of a child ending at ``j`` equals the smallest
    achievable maximum over ranks found by enumerating how many of the
    layers still to place (those after ``j`` but the last) each rank takes,
    with the default paths, with every row through ``kth_level`` and with
    every row through ``kth_level_whole``. Too few levels per rank, or
    levels read from the wrong offset, give a smaller or larger value."""
    monkeypatch.setattr(rank_bounds, "_SORTED_LEVELS", sorted_levels)
    monkeypatch.setattr(rank_bounds, "_WHOLE_LEVELS", whole_levels)
    schedule, pp, vp, costs = _instance(200 + seed, 9, 12)
    count = rank_bounds.RankCount(costs, schedule, pp)
    S, L = costs.pp, costs.num_layers
    rng = np.random.default_rng(seed)
    layer = np.diff(costs.compute_prefix_s)
    for s in range(S - 1):
        j = np.arange(s + 1, L - (S - 1 - s) + 1)
        states = np.zeros((len(j), 4, pp))
        states[:, 0] = rng.exponential(1e-2, (len(j), pp))
        got = count.bound(states, s, j)
        for row, jj in enumerate(j):
            v = states[row, 0].copy()
            v[(S - 1) % pp] += count.last
            c = count.left[s]
            extra = L - 1 - int(jj) - int(c.sum())
            ref = _best_assignment(v, count.sigma, layer[jj:L - 1], c, extra)
            assert got[row] == pytest.approx(ref, rel=1e-12), (s, jj)


def test_node_budget_by_hand():
    """MAX_NODES (3,000) for bands up to NODE_WIDTH (128) layers, then in
    proportion: 256 layers 1,500, 1,000 layers 384, never below FIRST_NODES."""
    assert split_search.node_budget(1) == split_search.node_budget(128) == 3000
    assert split_search.node_budget(256) == 1500
    assert split_search.node_budget(1000) == 384
    assert split_search.node_budget(10**9) == split_search.FIRST_NODES


def test_node_budget_of_long_profiles_by_hand():
    """Up to NODE_LAYERS (128) layers the budget is the band's alone; above,
    it falls in proportion to the layers too: a band of 30 in 1,500 layers
    3,000 x 128 / 1,500 = 256 nodes, a band of 256 in 256 layers 1,500 / 2 =
    750, and never below FIRST_NODES (100,000 layers)."""
    assert split_search.node_budget(30, 100) == split_search.node_budget(30, 128) == 3000
    assert split_search.node_budget(30, 1500) == 256
    assert split_search.node_budget(256, 256) == 750
    assert split_search.node_budget(1000, 129) == 384 * 128 // 129
    assert split_search.node_budget(30, 100_000) == split_search.FIRST_NODES


def test_wide_bands_get_proportionally_fewer_nodes(monkeypatch):
    """With MAX_NODES = 40 and NODE_WIDTH = 4 (and no enumeration), the
    branch and bound of a search with the default limits gets 40 x 4 / band
    nodes (the band of the tables it searches, at least FIRST_NODES) and
    expands at most that many, while one given max_nodes = 40 keeps its 40
    (and uses more than the scaled count on some seeded instance)."""
    monkeypatch.setattr(split_search, "MAX_NODES", 40)
    monkeypatch.setattr(split_search, "NODE_WIDTH", 4)
    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 0)
    monkeypatch.setattr(split_search, "PROOF_SPLITS", 0)
    searched = []
    inner = branch_and_bound.run_branch_and_bound

    def spy(tables, ev, S, L, pp, best, tie_rel, max_splits, max_nodes, counter=None):
        out = inner(tables, ev, S, L, pp, best, tie_rel, max_splits, max_nodes, counter)
        searched.append((tables.rows, max_nodes, out[2]))
        return out

    monkeypatch.setattr(split_search, "run_branch_and_bound", spy)
    over = 0
    for seed in range(12):
        schedule, pp, vp, costs = _instance(300 + seed, 12, 16)
        searched.clear()
        split_search.exact_split(costs, schedule, pp, vp)
        for band, limit, nodes in searched:
            if limit == split_search.FIRST_NODES:  # the cutoff proof's (none here: no cutoff)
                continue
            assert limit == max(split_search.FIRST_NODES, 40 * 4 // band) if band > 4 else limit == 40
            assert nodes <= limit
        searched.clear()
        split_search.exact_split(costs, schedule, pp, vp, max_nodes=40)
        for band, limit, nodes in searched:
            assert limit == 40
            over += nodes > max(split_search.FIRST_NODES, 40 * 4 // band)
    assert over > 0
