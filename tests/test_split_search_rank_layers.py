"""The whole-layers-per-rank bound of the exact split
(:func:`pipesearch.rank_bounds.rank_layer_bound_s`), checked by enumerating
every split of small instances and replaying each in the simulator:

* the bound ``B`` satisfies ``T(x) >= min(B, cutoff)`` for every split that
  fits (and every cutoff, with the band of stage lengths it allows);
* its two dynamic programs equal brute force over their choices (rank
  lengths for the min-plus convolution, layer counts for the knapsack);
* on identical layers it excludes points that the suffix-minima root bound
  leaves open, and the exact split with it still finds the optimum.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import tiny_cluster, tiny_profile
from pipesearch import split_bounds
from pipesearch import rank_bounds
from pipesearch import split_fits
from pipesearch import split_search
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.fluid_bound import fluid_lower_bound_s
from pipesearch.partition import even_split
from pipesearch.schedules import build, in_flight_peaks, num_stages_of
from pipesearch.split_search import exact_split
from pipesearch.bound_tables import SuffixTables, width_for
from pipesearch.rank_bounds import rank_layer_bound_s
from pipesearch.timemodel import simulate_times
from pipesearch.types import Job, Link

CASES = (("interleaved-1f1b", 2), ("zb-h1", 1), ("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 3),
         ("looped-bfs", 2))


def _costs(schedule, pp, vp, m, L, rng, uniform: bool, memory_bytes: float = 1e12):
    """PipelineCosts of ``L`` layers: ``uniform``: identical middle layers
    with a random first (embedding) and last (head) layer; else random
    layers; random links and all-reduce."""
    S = num_stages_of(schedule, pp, vp)
    if uniform:
        one, first, last = rng.exponential(1.0, 4), rng.exponential(1.0, 4), rng.exponential(1.0, 4)
        fwd, bwd, params, outputs = (np.array([a] + [o] * (L - 2) + [z]) for a, o, z in zip(first, one, last))
    else:
        fwd, bwd, params, outputs = (rng.exponential(1.0, L) for _ in range(4))
    prof = tiny_profile(fwd * 1e-3, bwd * 2e-3, params=params * 1e6, outputs=outputs * 1e6, saved=outputs * 1e6)
    link = Link(float(rng.choice([1e8, 1e9, 1e10])), float(rng.choice([0, 1e-4])))
    cluster = tiny_cluster(1, 2 * pp, memory_bytes=memory_bytes, intra=link, inter=link)
    job = Job(global_batch_size=2 * m, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    return build_pipeline_costs(prof, cluster, job, pp=S, dp=2, micro_batch_size=1, num_micro_batches=m,
                                schedule="gpipe", placement=pipeline_placement(pp, 2)[np.arange(S) % pp],
                                in_flight=np.array(in_flight_peaks(build(schedule, pp, m, vp))),
                                stages_per_device=vp)


def _point(seed: int):
    rng = np.random.default_rng(seed)
    schedule, vp = CASES[seed % len(CASES)]
    pp = int(rng.integers(2, 4)) if vp < 3 else 2
    S = num_stages_of(schedule, pp, vp)
    L = int(rng.integers(S + 1, min(S + 5, 10) + 1))
    m = pp * int(rng.integers(1, 4)) if schedule == "interleaved-1f1b" else int(rng.integers(pp, pp + 5))
    state = rng.bit_generator.state
    costs = _costs(schedule, pp, vp, m, L, rng, uniform=seed % 3 != 2)
    if seed % 4 == 3:  # the same instance with a memory that refuses the longer first stages
        even = even_split(L, S)
        cap = 1.05 * max(float(costs.memory_bytes(k, even[k], even[k + 1])) for k in range(S))
        rng.bit_generator.state = state
        costs = _costs(schedule, pp, vp, m, L, rng, uniform=seed % 3 != 2, memory_bytes=cap)
    return schedule, pp, vp, costs


def _times(costs, schedule, pp, vp):
    """Every split that fits and its simulated time."""
    L, S = costs.num_layers, costs.pp
    out = []
    for cut in itertools.combinations(range(1, L), S - 1):
        b = (0, *cut, L)
        if costs.split_fits(b):
            out.append((b, simulate_times(schedule, pp, costs.num_micro_batches, vp,
                                          costs.stage_times(np.array(b)))[0]))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_one_points_cache_gives_the_bound_of_every_cutoff(seed, monkeypatch):
    """With one point's cache, the bound at every cutoff (and at two
    widths) equals the bound computed without it, and its cutoff-free part
    (``_rank_layer_terms``) is built once per width: a cached part that
    held a cutoff's layer counts, or a key without the width, gives another
    value at some cutoff here."""
    schedule, pp, vp, costs = _point(seed)
    times = _times(costs, schedule, pp, vp)
    if not times:
        pytest.skip("no split fits")
    built = []
    terms = rank_bounds._rank_layer_terms
    monkeypatch.setattr(rank_bounds, "_rank_layer_terms", lambda *a: (built.append(a[3]), terms(*a))[1])
    values = sorted(t for _, t in times)
    cutoffs = (values[0] * (1 + 1e-6), values[len(values) // 3], values[-1] * (1 + 1e-6), np.inf)
    widths = sorted({width_for(costs, values[len(values) // 2]), costs.num_layers})
    cache: dict = {}
    cached = [rank_layer_bound_s(costs, schedule, pp, w, c, cache) for w in widths for c in cutoffs]
    bands = {max(1, min(w, costs.num_layers - costs.pp + 1)) for w in widths}
    assert sorted(built) == sorted(bands)  # once per band width
    assert cached == [rank_layer_bound_s(costs, schedule, pp, w, c) for w in widths for c in cutoffs]


@pytest.mark.parametrize("seed", range(36))
def test_bound_is_at_most_every_split_below_the_cutoff(seed):
    """For cutoffs across the splits' times (and none), ``B`` never exceeds
    the time of a split faster than the cutoff. A minimum over starts taken
    as a maximum, a rank allowed one layer too few, a knapsack that drops a
    rank or a chain family of an early stage counting an action its path
    does not hold overshoots on some split here."""
    schedule, pp, vp, costs = _point(seed)
    times = _times(costs, schedule, pp, vp)
    if not times:
        pytest.skip("no split fits")
    values = sorted(t for _, t in times)
    for cutoff in (np.inf, values[0] * (1 + 1e-6), values[len(values) // 3], values[-1] * (1 + 1e-6)):
        for width in (width_for(costs, cutoff), costs.num_layers):
            B = rank_layer_bound_s(costs, schedule, pp, width, cutoff)
            for b, t in times:
                if t < cutoff:
                    assert B <= t * (1 + 1e-9) + 1e-15, (b, t, B, cutoff)


@pytest.mark.parametrize("seed", range(20))
def test_rank_minima_equal_enumeration(seed):
    """``g[h, q, R]`` is the least sum over rank ``q``'s stage lengths adding
    up to ``R`` (stage ``c pp + q`` for chunk ``c``), by enumeration."""
    rng = np.random.default_rng(seed)
    pp, vp, W, H = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 5)), 2
    a = rng.exponential(1.0, (H, pp * vp, W))
    a[rng.random(a.shape) < 0.2] = np.inf
    g = split_fits.rank_minima(a, pp)
    assert g.shape == (H, pp, vp * W + 1)
    for h, q in itertools.product(range(H), range(pp)):
        want = np.full(vp * W + 1, np.inf)
        for lengths in itertools.product(range(1, W + 1), repeat=vp):
            total = sum(a[h, c * pp + q, d - 1] for c, d in enumerate(lengths))
            want[sum(lengths)] = min(want[sum(lengths)], total)
        np.testing.assert_array_equal(g[h, q], want)


@pytest.mark.parametrize("seed", range(20))
def test_rank_knapsack_equals_enumeration(seed):
    """The knapsack's value is the least ``sum_q g[h, q, R_q]`` over the
    allowed layer counts adding up to ``L``, by enumeration of the counts."""
    rng = np.random.default_rng(seed)
    pp, R1, H = int(rng.integers(1, 4)), int(rng.integers(2, 6)), 3
    L = int(rng.integers(pp, pp * (R1 - 1) + 2))
    g = rng.exponential(1.0, (H, pp, R1))
    allowed = rng.random((pp, R1)) < 0.7
    got = rank_bounds._rank_knapsack(g, allowed, L)
    want = np.full(H, np.inf)
    for counts in itertools.product(range(1, R1), repeat=pp):
        if sum(counts) == L and all(allowed[q, R] for q, R in enumerate(counts)):
            want = np.minimum(want, sum(g[:, q, R] for q, R in enumerate(counts)))
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_counts_reach_equals_enumeration(seed):
    """Whether layer counts of at least one per rank, each allowed, add up
    to ``L``: by enumeration of the counts (a rank allowed 0 layers still
    needs one)."""
    rng = np.random.default_rng(seed)
    pp, R1 = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    L = int(rng.integers(0, pp * R1 + 2))
    allowed = rng.random((pp, R1)) < rng.uniform(0.2, 0.9)
    want = any(sum(counts) == L and all(allowed[q, R] for q, R in enumerate(counts))
               for counts in itertools.product(range(1, R1), repeat=pp))
    assert split_fits._counts_reach(allowed, L) == want


@pytest.mark.parametrize("seed", range(12))
def test_stage_ranges_are_every_placeable_range_that_fits(seed):
    """The ranges some split can give a stage and that fit its memory, found
    by bisection over the ends, are those a check of every (stage, length,
    start) one by one keeps, in the same order; under memory caps at which
    some ranges do not fit (a cap of a few layers' bytes)."""
    rng = np.random.default_rng(seed)
    schedule, vp = CASES[seed % len(CASES)]
    pp = int(rng.integers(2, 4)) if vp < 3 else 2
    S = num_stages_of(schedule, pp, vp)
    L = int(rng.integers(S + 1, S + 7))
    m = pp * int(rng.integers(1, 4)) if schedule == "interleaved-1f1b" else int(rng.integers(pp, pp + 5))
    costs = _costs(schedule, pp, vp, m, L, rng, uniform=seed % 2 == 0, memory_bytes=float(rng.uniform(5e6, 5e7)))
    for W in (1, 2, L - S + 1):
        want = [(s, d, i) for s in range(S) for d in range(1, W + 1) for i in range(L)
                if i >= s and i + d <= L - (S - 1 - s) and (s > 0 or i == 0) and (s < S - 1 or i + d == L)
                and costs.fits(s, i, i + d)]
        got = list(zip(*(x.tolist() for x in split_fits.stage_ranges(costs, W))))
        assert got == want


@pytest.mark.parametrize("seed", range(12))
def test_chain_stage_minima_equal_each_range_bounded_alone(seed):
    """The chain families' least term over the starts of every (stage,
    length), evaluated once per distinct coefficient vector, equals the
    minimum of each family's term computed range by range
    (:func:`pipesearch.split_bounds.bound_families` on one range at a
    time), for interleaved 1F1B (vp 2 and 3) and ZB-H1 on random layers. A
    vector applied to a stage that does not use it, a family mapped to
    another family's vector or a range grouped under the wrong length
    gives another minimum somewhere."""
    rng = np.random.default_rng(seed)
    schedule, vp = (("interleaved-1f1b", 2), ("zb-h1", 1), ("interleaved-1f1b", 3))[seed % 3]
    pp = int(rng.integers(2, 4)) if vp < 3 else 2
    S = num_stages_of(schedule, pp, vp)
    L = int(rng.integers(S + 1, S + 6))
    m = pp * int(rng.integers(1, 4)) if schedule == "interleaved-1f1b" else int(rng.integers(pp, pp + 5))
    costs = _costs(schedule, pp, vp, m, L, rng, uniform=seed % 2 == 0)
    W = L - S + 1
    ks, d, i = split_fits.stage_ranges(costs, W)
    got = rank_bounds._chain_stage_minima(costs, schedule, pp, ks, d, i, W)
    base = len(split_bounds.bound_families(costs, schedule, pp, 0, 0, 1))
    want = np.full((S, S, W), np.inf)
    for k, dk, ik in zip(ks.tolist(), d.tolist(), i.tolist()):
        fams = split_bounds.bound_families(costs, schedule, pp, k, ik, ik + dk, chains=True, chain_families=S)
        for f, fam in enumerate(fams[base:]):
            want[f, k, dk - 1] = min(want[f, k, dk - 1], float(fam[0][1]))
    assert got.shape == (S, S, W)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def _gpt_like(pp: int, vp: int, m: int, middle: int, seed: int):
    """Interleaved 1F1B costs shaped like GPT-3's layer table: ``middle``
    identical transformer layers between a light embedding (2% of a layer's
    compute) and head (35%), fast links, free memory."""
    scale = np.random.default_rng(seed).uniform(0.5, 2.0) * 1e-3
    fwd = np.array([0.02] + [1.0] * middle + [0.35]) * scale
    params = np.array([0.5] + [1.0] * middle + [0.5]) * 1e6
    out = np.full(middle + 2, 1e5)
    prof = tiny_profile(fwd, 2 * fwd, params=params, outputs=out, saved=out)
    cluster = tiny_cluster(1, 2 * pp, memory_bytes=1e12, intra=Link(1e10, 1e-5), inter=Link(1e10, 1e-5))
    job = Job(global_batch_size=2 * m, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    S = pp * vp
    return build_pipeline_costs(prof, cluster, job, pp=S, dp=2, micro_batch_size=1, num_micro_batches=m,
                                schedule="gpipe", placement=pipeline_placement(pp, 2)[np.arange(S) % pp],
                                in_flight=np.array(in_flight_peaks(build("interleaved-1f1b", pp, m, vp))),
                                stages_per_device=vp)


@pytest.mark.parametrize("pp, vp, m, middle", [(2, 2, 8, 8), (2, 2, 16, 8), (3, 2, 12, 12), (2, 3, 8, 12),
                                                (4, 2, 16, 8)])
def test_identical_layers_bound_lies_between_root_and_optimum(pp, vp, m, middle):
    """GPT-like identical layers: the bound is above the suffix-minima root
    bound (which lets every stage take its own best split of the rest, and
    so fractions of a rank's layers) and at most the brute-force optimum; the
    exact split, which tries it in its cutoff proof, returns that optimum
    with a cutoff just above it and excludes the point with one just below."""
    costs = _gpt_like(pp, vp, m, middle, seed=pp * vp + m)
    best = min(t for _, t in _times(costs, "interleaved-1f1b", pp, vp))
    cutoff = best * (1 - 1e-9)
    width = width_for(costs, cutoff)
    B = rank_layer_bound_s(costs, "interleaved-1f1b", pp, width, cutoff)
    root = SuffixTables(costs, "interleaved-1f1b", pp, width).root_bound()
    assert root < B <= best * (1 + 1e-9)
    found = exact_split(costs, "interleaved-1f1b", pp, vp, cutoff_s=best * (1 + 1e-9))
    assert found.exact and found.best_time_s == pytest.approx(best, rel=1e-12)
    below = exact_split(costs, "interleaved-1f1b", pp, vp, cutoff_s=cutoff)
    assert below is None or below.best_time_s >= cutoff


def test_no_bound_above_the_term_limit(monkeypatch):
    """Above :data:`RANK_LAYER_TERMS` the bound is 0 (valid, proves nothing)
    and the exact split still finds the brute-force optimum."""
    costs = _gpt_like(2, 2, 8, 8, seed=1)
    best = min(t for _, t in _times(costs, "interleaved-1f1b", 2, 2))
    assert rank_layer_bound_s(costs, "interleaved-1f1b", 2, 10, best * 0.5) > 0
    monkeypatch.setattr(rank_bounds, "RANK_LAYER_TERMS", 10)
    assert rank_layer_bound_s(costs, "interleaved-1f1b", 2, 10, best * 0.5) == 0.0
    found = exact_split(costs, "interleaved-1f1b", 2, 2, cutoff_s=best * (1 + 1e-9))
    assert found.exact and found.best_time_s == pytest.approx(best, rel=1e-12)



def test_a_stopped_search_bound_counts_whole_layers():
    """The bound a stopped branch and bound reports past its open nodes
    (``_stopped_bound``, here with none: frontier 0) is at least the
    whole-layers count by hand: some rank holds ``ceil(8 / 3) = 3`` of the 8
    identical layers and runs them for all ``m`` micro-batches one after
    another, ``T >= 3 m a`` (``a`` one layer's forward and backward), where
    the fluid relaxation alone (fractions of a layer, about ``m (8 + 0.37) a
    / 3``) stays below it; and at most the brute-force optimum."""
    pp, vp, m, middle = 3, 2, 24, 8
    costs = _gpt_like(pp, vp, m, middle, seed=5)
    best = min(t for _, t in _times(costs, "interleaved-1f1b", pp, vp))
    a = float(costs.compute_s(0, 1, 2))  # one identical layer's forward and backward
    limit = best * (1 + 1e-9)
    assert fluid_lower_bound_s(costs, "interleaved-1f1b", pp, vp) < 2.9 * m * a
    bound = split_search._stopped_bound(costs, "interleaved-1f1b", pp, vp, 0.0, width_for(costs, limit), limit)
    assert 3 * m * a * (1 - 1e-12) <= bound <= best * (1 + 1e-12)


def test_a_stopped_search_reports_the_whole_layers_bound(monkeypatch):
    """A branch and bound stopped after one node (no enumeration) reports a
    lower bound between the whole-layers count by hand (``3 m a``, as in
    the test above) and the brute-force optimum."""
    pp, vp, m, middle = 3, 2, 24, 8
    costs = _gpt_like(pp, vp, m, middle, seed=5)
    best = min(t for _, t in _times(costs, "interleaved-1f1b", pp, vp))
    a = float(costs.compute_s(0, 1, 2))  # one identical layer's forward and backward
    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 0)
    found = exact_split(costs, "interleaved-1f1b", pp, vp, max_nodes=1)
    assert not found.exact
    assert 3 * m * a * (1 - 1e-12) <= found.lower_bound_s <= best * (1 + 1e-12)
