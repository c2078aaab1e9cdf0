"""Tests of the band-free split of long chains (``partition._dp_crossing``,
used when a band would exceed ``MAX_BAND_CELLS`` and the stage terms are
monotone in the start).

Oracles, independent of the code under test: the exhaustive split (every
split enumerated, its closed-form ``T`` evaluated), the brute force written
from the docstring formula (``helpers.reference_optimum``), the banded DP
(``partition._dp``, its cells enumerated), and ``numpy.argmin`` over every
range for the range minimum.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import make_costs, reference_optimum
from pipesearch import partition
from pipesearch.overlap import CommOverlap
from pipesearch.partition import _Band, _dp, _dp_crossing, _monotone_in_start, _RangeArgmin, exhaustive_split
from pipesearch.partition import optimal_split
from test_partition import dyadic_specs, realistic_specs


@pytest.fixture
def crossing(monkeypatch):
    """Every DP pass takes the band-free path."""
    monkeypatch.setattr(partition, "MAX_BAND_CELLS", 0)


@contextlib.contextmanager
def _stride(stride):
    old = partition.SEARCH_STRIDE
    partition.SEARCH_STRIDE = stride
    try:
        yield
    finally:
        partition.SEARCH_STRIDE = old


@contextlib.contextmanager
def _band_free():
    """:func:`crossing` for hypothesis tests (no function-scoped fixture)."""
    old = partition.MAX_BAND_CELLS
    partition.MAX_BAND_CELLS = 0
    try:
        yield
    finally:
        partition.MAX_BAND_CELLS = old


def _passes(costs):
    """The DP passes optimal_split can ask for: the min-max, the min-sum
    without a limit, and the min-sum at, above and below the min-max value,
    strict and not."""
    b_star, _ = _dp(_Band(costs), "max")
    yield "max", math.inf, False
    if b_star < math.inf:
        yield "max", b_star, False
        for limit in (math.inf, b_star, b_star * 1.25, b_star * 0.9):
            for strict in (False, True):
                yield "sum", limit, strict


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dyadic_specs(max_layers=14, max_stages=5))
def test_crossing_equals_banded_dp_exactly_with_ties(spec):
    """Exactly representable numbers (sums are exact, ties frequent): the
    band-free pass gives the banded pass's value and the same split, i.e.
    the same choice among tied starts (the largest)."""
    costs = spec.costs()
    assert _monotone_in_start(costs)
    for mode, limit, strict in _passes(costs):
        want = _dp(_Band(costs), mode, limit, strict)
        assert _dp_crossing(_Band(costs), mode, limit, strict) == want, (mode, limit, strict)
        for stride in (1, 2):  # entries start from their neighbours' answers
            with _stride(stride):
                assert _dp_crossing(_Band(costs), mode, limit, strict) == want, (mode, limit, strict, stride)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(realistic_specs(max_layers=14, max_stages=5))
def test_crossing_equals_banded_dp_at_real_scales(spec):
    """Rounded sums: the min-max pass is the banded one exactly (it only
    compares stage terms); the min-sum pass has the banded value up to
    rounding and a split that keeps the limit and memory and sums to it
    (starts whose sums differ by rounding only may be told apart otherwise)."""
    costs = spec.costs()
    for mode, limit, strict in _passes(costs):
        got, want = _dp_crossing(_Band(costs), mode, limit, strict), _dp(_Band(costs), mode, limit, strict)
        if mode == "max":
            assert got == want
            continue
        assert (got[1] is None) == (want[1] is None)
        if got[1] is not None:
            assert got[0] == pytest.approx(want[0], rel=1e-12, abs=1e-300)
            a, b = costs.stage_terms(got[1])
            assert costs.split_fits(got[1]) and np.all((b < limit) if strict else (b <= limit))
            assert float(a.sum()) == pytest.approx(got[0], rel=1e-12, abs=1e-300)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dyadic_specs(max_layers=10, max_stages=4))
def test_optimal_split_without_band_is_the_brute_force_optimum(spec):
    """Through optimal_split: the optimum of the docstring formula over every
    split (helpers.reference_optimum), and one of its minimizers."""
    with _band_free():
        got = optimal_split(spec.costs())
    ref = reference_optimum(spec)
    assert (got is None) == (ref is None)
    if ref is not None:
        best, argmins = ref
        assert got.iteration_time_s == best
        assert got.bounds in argmins


@pytest.mark.parametrize("seed", range(6))
def test_long_chain_without_band_equals_exhaustive(crossing, seed):
    """Chains of 9 to 12 layers on 3 or 4 stages with tight memory and a
    different link and all-reduce per stage: every split enumerated."""
    rng = np.random.default_rng(seed)
    L, P = int(rng.integers(9, 13)), int(rng.integers(3, 5))
    times = rng.uniform(1.5, 4.5, L) * 1e-3
    params = rng.uniform(0, 1e6, L)
    costs = make_costs(times=tuple(times), fwd=tuple(times / 3), params=tuple(params),
                       outputs=tuple(rng.uniform(0, 1e7, L)), pp=P, m=2 * P,
                       capacity=float(params.sum()) * 4 / P * 1.6, link_bandwidth=tuple(rng.uniform(1e9, 1e10, P)),
                       allreduce_per_byte=tuple(rng.uniform(0, 3e-9, P)), allreduce_fixed=1e-4,
                       time_scale=tuple(rng.choice([1.0, 0.5, 2.0], P)))
    want = exhaustive_split(costs)
    for stride in (64, 2, 1):
        with _stride(stride):
            got = optimal_split(costs)
        assert (got is None) == (want is None)
        if want is not None:
            assert got.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-12)
            assert got.iteration_time_s >= want.iteration_time_s


def test_two_thousand_layers_band_free_equals_banded():
    """A 2,000-layer chain on 3 stages: the banded DP (its band kept whole)
    and the band-free one give the same bottleneck, the same min-sum under
    it and the same optimal split."""
    rng = np.random.default_rng(7)
    L, P = 2000, 3
    times = rng.uniform(1.0, 3.0, L) * 1e-6
    costs = make_costs(times=tuple(times), fwd=tuple(times / 3), params=tuple(rng.uniform(0, 1e3, L)),
                       outputs=tuple(rng.uniform(0, 1e4, L)), pp=P, m=8, link_bandwidth=(1e9, 4e9, 1e9),
                       allreduce_per_byte=(1e-9, 2e-9, 1e-9), time_scale=(1.0, 0.5, 1.0))
    banded = _Band(costs)
    b_star, bounds = _dp(banded, "max")
    assert _dp_crossing(_Band(costs), "max") == (b_star, bounds)
    assert _dp_crossing(_Band(costs), "sum", b_star) == _dp(banded, "sum", b_star)
    want = optimal_split(costs)
    with _band_free():
        got = optimal_split(costs)
    assert got == want


def test_overlap_or_options_keep_the_banded_dp():
    """Exposed overlapped communication can grow as a stage shrinks: such
    costs are not monotone in the start and keep the banded DP (its result
    still the exhaustive one)."""
    rng = np.random.default_rng(3)
    L = 10
    times = rng.uniform(1.0, 3.0, L) * 1e-3
    base = make_costs(times=tuple(times), params=tuple(rng.uniform(0, 1e6, L)), pp=3, m=4,
                      allreduce_per_byte=2e-9)
    assert _monotone_in_start(base)
    overlapped = dataclasses.replace(base, overlap=CommOverlap(grad_reduce=True))
    assert not _monotone_in_start(overlapped)
    with _band_free():
        got = optimal_split(overlapped)
    want = exhaustive_split(overlapped)
    assert got.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, math.inf]), min_size=1, max_size=70),
       st.sampled_from([1, 2, 3, 16]))
def test_range_argmin_is_the_last_smallest(values, block):
    """Every range [lo, hi) of arrays with many ties and infinities: the
    index numpy.argmin finds on the reversed range (the largest smallest)."""
    old = partition.ARGMIN_BLOCK
    partition.ARGMIN_BLOCK = block
    try:
        v = np.asarray(values)
        n = len(v)
        lo, hi = np.array([(a, b) for a in range(n) for b in range(a + 1, n + 1)]).T
        rmq = _RangeArgmin(v)
        got, got_min = rmq.query(lo, hi), rmq.min_of(lo, hi)
    finally:
        partition.ARGMIN_BLOCK = old
    want = [b - 1 - int(np.argmin(v[a:b][::-1])) for a, b in zip(lo, hi)]
    assert got.tolist() == want
    assert got_min.tolist() == [float(v[a:b].min()) for a, b in zip(lo, hi)]


def _balanced_by_scan(weights, pp):
    """The min-max DP written as a scan over every start of every stage end
    (the smallest start among ties)."""
    w = [float(x) for x in weights]
    L = len(w)
    prefix = [0.0]
    for x in w:
        prefix.append(prefix[-1] + x)
    prev = [math.inf] * (L + 1)
    prev[0] = -math.inf
    choice = [[0] * (L + 1) for _ in range(pp)]
    for s in range(pp):
        cur = [math.inf] * (L + 1)
        for j in range(s + 1, L - (pp - 1 - s) + 1):
            best, arg = math.inf, None
            for i in range(s, j):
                c = max(prev[i], prefix[j] - prefix[i])
                if arg is None or c < best:
                    best, arg = c, i
            cur[j], choice[s][j] = best, arg
        prev = cur
    bounds = [L]
    for s in range(pp - 1, -1, -1):
        bounds.append(choice[s][bounds[-1]])
    return tuple(reversed(bounds))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0, 2.0, 0.5, 3.0]), min_size=1, max_size=24), st.integers(1, 6))
def test_balanced_split_is_the_scan_with_its_ties(weights, pp):
    from pipesearch.partition import balanced_split

    pp = min(pp, len(weights))
    assert balanced_split(weights, pp) == _balanced_by_scan(weights, pp)
