"""Every lower bound of the exact split is at most the simulated time of every
split it covers, checked by enumerating the splits of small instances and
replaying each in the discrete-event simulator.

* the families of :func:`pipesearch.split_bounds.bound_families` (chain
  families and the weighted combination included), each evaluated on a
  complete split from its definition in that docstring;
* the Lagrangian bound of :func:`pipesearch.split_bounds.lagrange_weights`;
* the rank-counting bound of a partial split (``RankCount``), against every
  completion of that partial split;
* the path families (:func:`pipesearch.timemodel.critical_path`, the
  critical path of one split as counts per stage): equal to that split's
  simulated time, at most every other split's.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import make_costs, tied_or_random_profile, tiny_cluster, tiny_profile
from pipesearch import split_bounds
from pipesearch import bound_tables
from pipesearch import rank_bounds
from pipesearch import split_evaluator
from pipesearch import split_search
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.schedules import build, in_flight_peaks, num_stages_of
from pipesearch.split_bounds import bound_families, lagrange_weights, separable_terms
from pipesearch.timemodel import (StageTimes, critical_path, graph_ends, iteration_time_s,
                                  node_before_all_reduces, path_before_all_reduces, rank_work_before,
                                  simulate_times)
from pipesearch.types import Job, Link

CASES = (("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("zb-h1", 1), ("1f1b", 1), ("gpipe", 1),
         ("looped-bfs", 2))


def _point(seed: int):
    """A seeded instance: schedule, ``pp``, ``vp``, ``m`` and PipelineCosts
    with identical layers (and a random head) for even seeds, random layers
    for odd ones; random links, all-reduce and memory (memory never refuses:
    a bound must hold for every split)."""
    rng = np.random.default_rng(seed)
    schedule, vp = CASES[seed % len(CASES)]
    pp = int(rng.integers(2, 4)) if vp < 3 else 2
    S = num_stages_of(schedule, pp, vp)
    L = int(rng.integers(S, min(S + 4, 9) + 1))
    m = pp * int(rng.integers(1, 4)) if schedule == "interleaved-1f1b" else int(rng.integers(pp, pp + 5))
    return schedule, pp, vp, m, _costs(rng, schedule, pp, vp, m, L, seed % 2 == 0)


def _costs(rng, schedule: str, pp: int, vp: int, m: int, L: int, tied: bool):
    """PipelineCosts of ``L`` layers (identical ones and a random head when
    ``tied``), random links and all-reduce, memory that never refuses."""
    S = num_stages_of(schedule, pp, vp)
    prof, _, _ = tied_or_random_profile(rng, L, tied)
    link = Link(float(rng.choice([1e8, 1e9, 1e10])), float(rng.choice([0, 1e-4])))
    cluster = tiny_cluster(1, 2 * pp, memory_bytes=1e12, intra=link, inter=link)
    job = Job(global_batch_size=2 * m, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    return build_pipeline_costs(prof, cluster, job, pp=S, dp=2, micro_batch_size=1, num_micro_batches=m,
                                schedule="gpipe", placement=pipeline_placement(pp, 2)[np.arange(S) % pp],
                                in_flight=np.array(in_flight_peaks(build(schedule, pp, m, vp))),
                                stages_per_device=vp)


def _splits(L: int, S: int):
    return [(0, *cut, L) for cut in itertools.combinations(range(1, L), S - 1)]


def _simulated(costs, schedule, pp, vp, bounds) -> float:
    return simulate_times(schedule, pp, costs.num_micro_batches, vp, costs.stage_times(np.array(bounds)))[0]


def _family_value(fam, S: int, pp: int) -> float:
    """One family on one complete split, from the definitions of
    :func:`bound_families`' docstring (each component over the ``S`` stages)."""
    total = 0.0
    for kind, alpha, beta in fam:
        a = None if alpha is None else np.broadcast_to(alpha, (S,)).astype(float)
        b = None if beta is None else np.broadcast_to(beta, (S,)).astype(float)
        if kind == "sum":
            total += a.sum()
        elif kind == "max":
            total += b.max()
        elif kind == "prefix":
            total += max(a[:k].sum() + b[k] for k in range(S))
        elif kind == "suffix":
            total += max(b[k] + a[k + 1:].sum() for k in range(S))
        else:
            total += max(b[q::pp].sum() for q in range(pp))
    return total


@pytest.mark.parametrize("seed", range(36))
def test_every_family_is_at_most_the_simulated_time(seed):
    """Every family (the chain families and a random convex combination of
    the one-sum families included) on every split: at most the simulated
    time. A chain count off by one action, a drain through the wrong kind of
    backward (``B`` for ZB-H1's ``I``) or a fill credited to a rank that does
    not start with micro-batch 0 overshoots on some split here."""
    schedule, pp, vp, m, costs = _point(seed)
    S, L = costs.pp, costs.num_layers
    s = np.arange(S)
    rng = np.random.default_rng(seed)
    for bounds in _splits(L, S):
        i, j = np.array(bounds[:-1]), np.array(bounds[1:])
        n_sep = len(separable_terms(bound_families(costs, schedule, pp, s, i, j, chains=True), s, pp))
        fams = bound_families(costs, schedule, pp, s, i, j, weights=rng.dirichlet(np.ones(n_sep)), chains=True)
        t = _simulated(costs, schedule, pp, vp, bounds)
        for fam in fams:
            assert _family_value(fam, S, pp) <= t * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("seed", range(36))
def test_path_family_is_its_split_time_and_at_most_every_split(seed):
    """The critical path of a random split, as a family of
    :func:`bound_families` (``paths``): on that split it equals the time the
    discrete-event simulator replays (the path is the longest one, its
    transfers and the all-reduce that ends it counted), and on every split
    it is at most the simulated time (the dependency graph is the same for
    all splits). A transfer or a blocking send left out, an all-reduce
    charged to the wrong rank's stages or a path read back through the
    predecessor that ended first misses the first or breaks the second."""
    schedule, pp, vp, m, costs = _point(seed)
    S, L = costs.pp, costs.num_layers
    s = np.arange(S)
    splits = _splits(L, S)
    rng = np.random.default_rng(seed)
    times = {b: _simulated(costs, schedule, pp, vp, b) for b in splits}
    for k in rng.choice(len(splits), size=min(3, len(splits)), replace=False):
        origin = splits[k]
        t, coef = critical_path(schedule, pp, m, vp, costs.stage_times(np.array(origin)))
        assert t == pytest.approx(times[origin], rel=1e-12)
        for bounds, sim in times.items():
            i, j = np.array(bounds[:-1]), np.array(bounds[1:])
            fam = bound_families(costs, schedule, pp, s, i, j, chains=True, paths=[coef])[-1]
            value = _family_value(fam, S, pp)
            assert value <= sim * (1 + 1e-9) + 1e-15, (origin, bounds)
            if bounds == origin:
                assert value == pytest.approx(sim, rel=1e-9)


def test_chain_family_is_tight_on_even_uniform_interleaved():
    """Interleaved 1F1B, p = 4 ranks, v = 2 chunks, m = 8, 16 identical layers
    of F = 1 ms, B = 2 ms (chunks of 2 layers: f = 2, b = 4 ms), free links,
    no all-reduce: T = (m v + p - 1)(f + b) = 19 * 6 = 114 ms (Narayanan et
    al. SC'21: bubble (p - 1)(f + b) per chunk; the simulator agrees). The
    chain family of the last stage (micro-batch 0 down 7 stages, rank 3 from
    there, micro-batch 7 back up) is this longest path, so the largest family
    equals T."""
    L, pp, vp, m = 16, 4, 2, 8
    prof = tiny_profile([1e-3] * L, [2e-3] * L)
    cluster = tiny_cluster(1, pp)
    costs = build_pipeline_costs(prof, cluster, Job(global_batch_size=m, memory_reserve_bytes=0), pp=pp * vp, dp=1,
                                 micro_batch_size=1, num_micro_batches=m, schedule="gpipe",
                                 placement=pipeline_placement(pp, 1)[np.arange(pp * vp) % pp],
                                 in_flight=np.array(in_flight_peaks(build("interleaved-1f1b", pp, m, vp))),
                                 stages_per_device=vp)
    bounds = tuple(range(0, L + 1, 2))
    assert _simulated(costs, "interleaved-1f1b", pp, vp, bounds) == pytest.approx(0.114)
    s, i, j = np.arange(pp * vp), np.array(bounds[:-1]), np.array(bounds[1:])
    fams = bound_families(costs, "interleaved-1f1b", pp, s, i, j, chains=True)
    values = [_family_value(f, pp * vp, pp) for f in fams]
    assert max(values) == pytest.approx(0.114)


@pytest.mark.parametrize("seed", range(12))
def test_lagrange_bound_is_at_most_every_split(seed):
    """The bound the weights' ascent reports is at most the simulated time of
    every split, and its weights lie on the simplex."""
    schedule, pp, vp, m, costs = _point(seed)
    weights, phi = lagrange_weights(costs, schedule, pp, costs.num_layers)
    assert weights is not None
    assert np.all(weights >= 0) and weights.sum() == pytest.approx(1.0)
    best = min(_simulated(costs, schedule, pp, vp, b) for b in _splits(costs.num_layers, costs.pp))
    assert phi <= best * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(36))
def test_rank_count_bound_is_at_most_every_completion(seed):
    """For every partial split (stages ``0 .. s`` fixed, ``s < S - 1``), the
    rank-counting bound is at most the simulated time of each of its
    completions. Pinning the last layer to the wrong rank, counting a rank's
    fill when its first action is not micro-batch 0 on its first stage, or
    adding the drain to a rank that does not end with the last backward
    overshoots here."""
    schedule, pp, vp, m, costs = _point(seed)
    S, L = costs.pp, costs.num_layers
    count = rank_bounds.RankCount(costs, schedule, pp)
    times = {b: _simulated(costs, schedule, pp, vp, b) for b in _splits(L, S)}
    for s in range(S - 1):
        for prefix in {b[:s + 2] for b in times}:
            state = count.root
            for k in range(s + 1):
                state = count.advance(state, k, prefix[k], np.array([prefix[k + 1]]))[0]
            lb = count.bound(state[None], s, np.array([prefix[-1]]))[0]
            best = min(t for b, t in times.items() if b[:s + 2] == prefix)
            assert lb <= best * (1 + 1e-9) + 1e-15, (s, prefix)


def test_stage_times_have_the_rank_count_layout():
    """The rank-counting bound reads a stage's work from the cost terms: its
    work on the last stage's rank at the full split equals m (F + B) over that
    rank's stages (the sum the simulator's busy time of that rank shows)."""
    schedule, pp, vp, m, costs = _point(0)
    S, L = costs.pp, costs.num_layers
    bounds = split_search.even_split(L, S)
    count = rank_bounds.RankCount(costs, schedule, pp)
    state = count.root
    for k in range(S):
        state = count.advance(state, k, bounds[k], np.array([bounds[k + 1]]))[0]
    st: StageTimes = costs.stage_times(np.array(bounds))
    q = (S - 1) % pp
    assert state[0, q] == pytest.approx(m * (st.fwd_s[q::pp] + st.bwd_s[q::pp]).sum())


def _counted_from_the_order(schedule, pp, m, vp):
    """The chain counts by walking the built order (the reference for the
    closed form): rank ``k % pp`` from ``F`` of micro-batch 0 on ``k`` to the
    backward of ``m - 1`` on ``k``, plus rank 0 after its backward of ``m - 1``
    on stage 0."""
    from pipesearch.schedules import build_orders
    S = pp * vp
    orders = build_orders(schedule, pp, m, vp)
    back = "I" if schedule == "zb-h1" else "B"
    kinds = "FBIW"

    def count(seq):
        n = np.zeros((S, 4), dtype=np.int64)
        for kind, st, _ in seq:
            n[st, kinds.index(kind)] += 1
        return n

    tail = count(orders[0][orders[0].index((back, 0, m - 1)) + 1:])
    out = []
    for k in range(S):
        seq = orders[k % pp]
        out.append(count(seq[seq.index(("F", k, 0)):seq.index((back, k, m - 1)) + 1]) + tail)
    return out


@pytest.mark.parametrize("schedule,vp", [("interleaved-1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3),
                                         ("interleaved-1f1b", 4), ("zb-h1", 1)])
def test_chain_counts_closed_form_equals_the_order(schedule, vp):
    """The closed-form chain counts equal a walk over the built order, for
    every rank and stage, over ``p = 1 .. 5`` and several ``m``."""
    for pp in range(1, 6):
        for m in (pp, 2 * pp, 3 * pp, 5 * pp, pp + 1, pp + 3):
            if schedule == "interleaved-1f1b" and m % pp:
                continue
            ks, counts = split_bounds.chain_counts(schedule, pp, m, vp)
            ref = _counted_from_the_order(schedule, pp, m, vp)
            assert list(ks) == list(range(max(0, pp * vp - split_bounds.MAX_CHAIN_FAMILIES), pp * vp))
            for k, n in zip(ks, counts):
                assert np.array_equal(n, ref[k]), (pp, m, k)


@pytest.mark.parametrize("schedule,vp", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2),
                                         ("interleaved-1f1b", 3), ("looped-bfs", 2)])
def test_rank_path_ends_match_the_order(schedule, vp):
    """Which ranks start with micro-batch 0 on their first stage and end
    (with rank 0) on the backward of micro-batch ``m - 1`` there: as the built
    order says (a wrong ``True`` would add a drain that is not a path)."""
    from pipesearch.schedules import build_orders
    for pp in range(1, 5):
        for m in (pp, 2 * pp, 4 * pp):
            orders = build_orders(schedule, pp, m, vp)
            first, last = rank_bounds._rank_path_ends(schedule, pp)
            ends = [seq[-1] == ("B", q, m - 1) for q, seq in enumerate(orders)]
            assert list(first) == [seq[0] == ("F", q, 0) for q, seq in enumerate(orders)]
            ref = [e and ends[0] for e in ends]
            assert all(r for got, r in zip(last, ref) if got)  # never a drain the order does not have
            if schedule != "looped-bfs":  # (its m = 1 ends on micro-batch 0 = m - 1: left unused)
                assert list(last) == ref


def _component_minimum(kind, q, fams, costs, s0: int, i0: int, S: int, pp: int, tight_memory: bool):
    """The smallest value over every split of layers ``[i0, L)`` into stages
    ``s0 .. S-1`` (each fitting, at most ``L - S + 1`` layers) of component
    ``q`` of ``kind``, from the definitions of ``SuffixTables``' docstring, by
    enumeration: ``sum`` the sum of alpha, ``max`` the max of beta, ``prefix``
    ``max_k (sum_{k'<k} alpha + beta_k)``, ``suffix`` the pair (sum of alpha,
    ``max_k (beta_k + sum_{k'>k} alpha)``), ``device`` the sum of beta."""
    L = costs.num_layers
    best = None
    for cut in itertools.combinations(range(i0 + 1, L), S - 1 - s0):
        bounds = (i0, *cut, L)
        if min(np.diff(bounds)) < 1 or max(np.diff(bounds)) > L - S + 1:
            continue
        s = np.arange(s0, S)
        i, j = np.array(bounds[:-1]), np.array(bounds[1:])
        if tight_memory and not np.all(costs.fits(s, i, j)):
            continue
        comps = [(a, b) for fam in bound_families(costs, *fams, s, i, j) for k, a, b in fam if k == kind]
        alpha, beta = comps[q]
        a = None if alpha is None else np.broadcast_to(alpha, s.shape).astype(float)
        b = None if beta is None else np.broadcast_to(beta, s.shape).astype(float)
        n = len(s)
        if kind == "sum":
            v = (a.sum(),)
        elif kind == "max":
            v = (b.max(),)
        elif kind == "prefix":
            v = (max(a[:k].sum() + b[k] for k in range(n)),)
        elif kind == "suffix":
            v = (a.sum(), max(b[k] + a[k + 1:].sum() for k in range(n)))
        else:
            v = (b.sum(),)
        best = v if best is None else tuple(min(x, y) for x, y in zip(best, v))
    return best


@pytest.mark.parametrize("seed", range(18))
def test_suffix_minima_equal_enumeration(seed, monkeypatch):
    """Every suffix minimum of the tables (``SuffixTables.suffix_min``) equals the
    minimum over every split of the layers left (enumerated) of its
    component: from layer 0 at the first stage, from every layer a split
    can start stage ``s`` at (``s .. L - S + s``) at the others (the first
    stage is tabled from layer 0 only, the last only to layer L). Seeds
    ``3k`` table every stage in one block; ``3k + 1`` the first and the
    last stage on their own and the middle ones one at a time; ``3k + 2``
    the same with the middle ones in one block."""
    schedule, pp, vp, m, costs = _point(seed)
    L, S = costs.num_layers, costs.pp
    if seed % 3 == 1:
        monkeypatch.setattr(bound_tables, "TABLE_FLOATS", 1)
    elif seed % 3 == 2:  # too large for one block of all stages, one of the middle ones fits
        W = L - S + 1
        monkeypatch.setattr(bound_tables, "TABLE_FLOATS", bound_tables._ROWS_PER_STAGE * W * W * max(S - 2, 1))
    assert_suffix_minima_enumerated(bound_tables.SuffixTables(costs, schedule, pp, L), schedule, pp, costs, False)


def assert_suffix_minima_enumerated(tables, schedule: str, pp: int, costs, fits_only: bool) -> None:
    """Every start ``i`` a split can give stage ``s``: each family
    component's suffix minimum in ``tables`` equals the minimum over the
    enumerated splits of the layers left (:func:`_component_minimum`;
    ``fits_only``: over the splits whose stages all fit), infinite where
    there is none."""
    L, S = costs.num_layers, costs.pp
    for s in range(S):
        for i in ([0] if s == 0 else range(s, L - S + s + 1)):
            for kind in tables.kinds:
                got = tables.suffix_min(kind, s)
                for q in range(len(tables.fam[kind])):
                    want = _component_minimum(kind, q, (schedule, pp), costs, s, i, S, pp, fits_only)
                    have = (got[0][q, i], got[1][q, i]) if kind == "suffix" else (got[q, i],)
                    if want is None:
                        assert all(np.isinf(x) for x in have), (s, i, kind, q)
                    elif kind == "suffix":  # the pair's parts are minimised one after the other
                        assert have[0] == pytest.approx(want[0], rel=1e-12), (s, i, kind, q)
                        assert have[1] <= want[1] * (1 + 1e-12), (s, i, kind, q)
                    else:
                        assert have[0] == pytest.approx(want[0], rel=1e-12), (s, i, kind, q)


# ------------------------------------------------------------- splits too long to table


@pytest.mark.parametrize("seed", range(12))
def test_untabled_split_is_achievable_and_its_bound_valid(seed, monkeypatch):
    """With the table budget at 0 every split is the best of the starting
    splits: its time is its own simulated time, and the table-free bound
    (the busiest rank runs at least the average of all work) is at most the
    brute-force optimum over every split; exact only when the two meet."""
    rng = np.random.default_rng(500 + seed)
    L, pp = int(rng.integers(3, 8)), int(rng.integers(2, 4))
    schedule = str(rng.choice(["gpipe", "1f1b", "zb-h1"]))
    m = int(rng.integers(pp, 2 * pp + 2))
    costs = make_costs(times=tuple(rng.exponential(1.0, L)), pp=pp, m=m)
    monkeypatch.setattr(bound_tables, "MAX_TABLED_FLOATS", 0)
    found = split_search.exact_split(costs, schedule, pp)
    best = min(iteration_time_s(schedule, pp, m, 1, costs.stage_times(np.array((0, *cut, L))))
               for cut in itertools.combinations(range(1, L), pp - 1))
    assert found.iteration_time_s == pytest.approx(
        iteration_time_s(schedule, pp, m, 1, costs.stage_times(np.array(found.bounds))), rel=1e-12)
    assert found.lower_bound_s <= best * (1 + 1e-12)
    assert found.best_time_s >= best * (1 - 1e-12)
    assert found.exact == (found.lower_bound_s >= found.best_time_s)
    assert found.nodes == 0  # no branch and bound ran


@pytest.mark.parametrize("seed", [s for s in range(24) if CASES[s % len(CASES)][0] in split_bounds.CHAIN_SCHEDULES])
def test_start_paths_from_the_starting_pass_are_recomputed_ones(seed, monkeypatch):
    """The critical paths of the fastest starting splits
    (:func:`split_search._start_paths`) read back from the node ends of the
    pass that timed those splits equal the ones a fresh
    :func:`pipesearch.timemodel.critical_path` pass gives, the path before
    every rank's all-reduce (marked by its seventh row) is the fastest
    split's from a fresh pass, and no pass is run again for them (a column
    read for the wrong split, or ends of another pass, fails the first two;
    a second simulation fails the third)."""
    schedule, pp, vp, m, costs = _point(seed)  # a chain schedule: interleaved 1F1B or ZB-H1
    S, L = costs.pp, costs.num_layers
    starts = _splits(L, S)[:6]
    ev = split_evaluator.SplitEvaluator(costs, schedule, pp, vp)
    ev.run(starts, keep=True)
    assert ev.kept is not None and sorted(ev.kept[0]) == sorted(starts)
    best = sorted(starts, key=lambda b: (ev.times[b], b))[:split_search.PATH_FAMILIES]
    want = critical_path(schedule, pp, m, vp, costs.stage_times(np.array(best)))
    g, ends = graph_ends(schedule, pp, m, vp, costs.stage_times(np.array(best[0])))
    common = path_before_all_reduces(g, ends.reshape(len(ends), -1)[:, 0], S)
    monkeypatch.setattr(split_search, "graph_ends", None)  # a second pass would call it
    got = split_search._start_paths(costs, schedule, pp, vp, ev)
    distinct = list({c.tobytes(): c for _, c in want}.values())
    plain = [c for c in got if len(c) == 6]
    assert len(plain) == len(distinct)
    for a, b in zip(plain, distinct):
        assert np.array_equal(a, b)
    marked = [c for c in got if len(c) == 7]
    assert len(marked) == (2 if common is not None else 0)
    if marked:
        assert np.array_equal(marked[0][:6], common) and np.all(marked[0][6] == 1)
        node = node_before_all_reduces(g, ends.reshape(len(ends), -1)[:, 0])
        assert np.array_equal(marked[1][:6], rank_work_before(g, node, S)) and np.all(marked[1][6] == 2)


def test_cheapest_layer_sums_by_hand_and_shared():
    """``P[j, n]`` is the sum of the ``n`` cheapest of layers ``j .. L-2``
    (+inf past their count), checked by sorting each suffix by hand on
    layers 3, 1, 2, 5, 4; two points of the same layers share one
    read-only table, other layers get their own."""
    layer = np.array([3.0, 1.0, 2.0, 5.0, 4.0])
    P = rank_bounds._cheapest_sums(layer.tobytes())
    L = len(layer)
    for j in range(L + 1):
        rest = sorted(layer[j:L - 1].tolist())
        for n in range(L + 1):
            want = 0.0 if n == 0 and j < L else (sum(rest[:n]) if 0 < n <= len(rest) else np.inf)
            assert P[j, n] == want, (j, n)
    assert rank_bounds._cheapest_sums(layer.copy().tobytes()) is P
    assert rank_bounds._cheapest_sums((layer + 1).tobytes()) is not P
    assert not P.flags.writeable


@pytest.mark.parametrize("seed", range(12))
def test_bounds_under_a_limit_are_the_bounds_up_to_it(seed):
    """``split_lower_bounds(..., limit_s=X)`` skips the other families of a
    split whose busiest rank's work is above ``X``: every split whose bound
    is at most ``X`` gets that bound, to the bit (a split of the kept ones
    taken in another memory layout or alone would sum its stages in another
    order), and every other one a value above ``X`` and at most its bound;
    at limits from below every bound to above all of them, on every split
    of 14 to 20 layers (70 to 89 for two stages: 69 splits or more, above
    the count where the limit is used)."""
    rng = np.random.default_rng(seed)
    schedule, pp, vp, m, small = _point(seed)
    S = small.pp
    L = int(rng.integers(14, 21)) if S > 2 else int(rng.integers(70, 90))
    costs = _costs(rng, schedule, pp, vp, m, L, seed % 2 == 0)
    splits = np.array(_splits(L, S), dtype=np.int64)
    assert len(splits) >= split_bounds.PREFILTER_SPLITS
    for chains in (False, True):
        full = split_bounds.split_lower_bounds(costs, schedule, pp, splits, chains=chains)
        for limit in [full.min() * 0.5, *np.quantile(full, [0.0, 0.01, 0.3, 0.7]), full.max() * 2]:
            got = split_bounds.split_lower_bounds(costs, schedule, pp, splits, chains=chains, limit_s=limit)
            under = full <= limit
            assert np.array_equal(got[under], full[under])
            assert np.all(got[~under] > limit) and np.all(got[~under] <= full[~under])



def _capped_point(seed: int):
    """``(schedule, pp, vp, m, costs)``: a seeded instance of one stage per
    rank (GPipe, 1F1B or ZB-H1), random layers and links, each device's
    memory at the median over every split of its largest stage's bytes
    (about half the splits fit)."""
    rng = np.random.default_rng(seed)
    schedule = ("gpipe", "1f1b", "zb-h1")[seed % 3]
    pp = int(rng.integers(2, 5))
    L = int(rng.integers(pp, pp + 5))
    m = int(rng.integers(pp, pp + 5))
    prof, _, _ = tied_or_random_profile(rng, L, False)
    link = Link(float(rng.choice([1e8, 1e9, 1e10])), float(rng.choice([0, 1e-4])))
    job = Job(global_batch_size=2 * m, state_bytes_per_param=2.0, memory_reserve_bytes=0)

    def build_costs(memory_bytes: float):
        cluster = tiny_cluster(1, 2 * pp, memory_bytes=memory_bytes, intra=link, inter=link)
        return build_pipeline_costs(prof, cluster, job, pp=pp, dp=2, micro_batch_size=1, num_micro_batches=m,
                                    schedule="gpipe", placement=pipeline_placement(pp, 2),
                                    in_flight=np.array(in_flight_peaks(build(schedule, pp, m, 1))))

    free = build_costs(1e15)
    peaks = [max(float(free.memory_bytes(s, b[s], b[s + 1])) for s in range(pp)) for b in _splits(L, pp)]
    return schedule, pp, 1, m, build_costs(float(np.median(peaks)))


def _stage_and_link_terms(costs, schedule: str, bounds) -> float:
    """The largest of one split's stages' work and all-reduce (``m (F +
    B) + r``, with the outgoing transfer in each forward under 1F1B's
    blocking sends) and, with overlapped sends, of its boundaries' ``m``
    transfers, from the split's stage times."""
    t = costs.stage_times(np.array(bounds))
    m = costs.num_micro_batches
    F, B, r = (np.asarray(x, dtype=float) for x in (t.fwd_s, t.bwd_s, t.allreduce_s))
    c = np.append(np.asarray(t.p2p_s, dtype=float), 0.0)  # nothing after the last stage
    blocking = schedule == "1f1b"
    work = m * (F + B + (c if blocking else 0.0)) + r
    return float(max(work.max(), 0.0 if blocking else m * c.max()))


@pytest.mark.parametrize("witness", [False, True])
@pytest.mark.parametrize("seed", range(24))
def test_stage_or_link_exceeds_is_the_least_largest_term_over_every_split(seed, witness, monkeypatch):
    """``stage_or_link_exceeds(limit)`` is True exactly when every split has
    a rank or link term above ``limit`` (brute force over every split, the
    terms written from its stage times), tried at every split's largest
    term and just below and above it; and when True, every split that fits
    in memory simulates slower than ``limit``. A greedy pass that took the
    first end instead of the furthest, or left out the all-reduce or the
    transfers, would fail here (as did one that skipped ends whose stage
    did not fit: a stage's memory holds its received activations, so it
    can grow when the stage starts later). ``witness``: the even split is
    tried first at every stage count (else from WITNESS_STAGES, more than
    these instances have), so a try that left a term out, or took a split
    that is none, fails too."""
    if witness:
        monkeypatch.setattr(split_bounds, "WITNESS_STAGES", 1)
    schedule, pp, vp, m, costs = _capped_point(seed)
    splits = _splits(costs.num_layers, pp)
    fitting = [b for b in splits if costs.split_fits(b)]
    largest = sorted(_stage_and_link_terms(costs, schedule, b) for b in splits)
    assert fitting and largest[0] > 0
    for limit in sorted({x * f for x in largest for f in (1 - 1e-9, 1 + 1e-9)} | {largest[0] / 2}):
        want = largest[0] > limit
        assert split_bounds.stage_or_link_exceeds(costs, schedule, pp, limit) == want, (limit, largest[0])
        if want:
            assert min(_simulated(costs, schedule, pp, vp, b) for b in fitting) > limit


@pytest.mark.parametrize("seed", range(12))
def test_stage_or_link_exceeds_bounds_ranks_of_several_stages(seed):
    """:func:`_point`'s instances (interleaved 1F1B and looped BFS among
    them, several stages per rank): True exactly when every split has a
    stage whose own work and all-reduce, or a boundary whose transfers,
    exceed the limit (brute force, as above); and then every split
    simulates slower than the limit (a rank runs at least each of its
    stages' work, its all-reduce after the last of them)."""
    schedule, pp, vp, m, costs = _point(seed)
    splits = _splits(costs.num_layers, costs.pp)
    largest = sorted(_stage_and_link_terms(costs, schedule, b) for b in splits)
    for limit in sorted({x * f for x in largest for f in (1 - 1e-9, 1 + 1e-9)}):
        want = largest[0] > limit
        assert split_bounds.stage_or_link_exceeds(costs, schedule, pp, limit) == want, (limit, largest[0])
        if want:
            assert min(_simulated(costs, schedule, pp, vp, b) for b in splits) > limit
