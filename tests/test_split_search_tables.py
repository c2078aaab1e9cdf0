"""The exact split's tables (``bound_tables.SuffixTables``) on small seeded points:
suffix minima against enumeration when memory cuts the band short, and
every stage's column (kept, recomputed in chunks, the last stage's one
range) against :func:`pipesearch.split_bounds.bound_families` evaluated on
that range alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import test_split_search_bounds as bounds_tests
from pipesearch import split_bounds
from pipesearch import bound_tables
from pipesearch import branch_and_bound
from pipesearch import split_fits
from pipesearch.split_bounds import bound_families


def _tight(costs):
    """``costs`` with each stage's memory capped at its largest two-layer
    range: every range of up to two layers fits, longer ones only some."""
    L, S = costs.num_layers, costs.pp
    i = np.arange(L - 1)
    cap = np.array([float(np.max(costs.memory_bytes(s, i, i + 2))) for s in range(S)])
    return dataclasses.replace(costs, capacity_bytes=cap)


def _table_modes(monkeypatch, mode: str, costs):
    """``kept``: every stage in one block, terms kept; ``chunked``: one stage
    per block, middle terms recomputed per chunk of starts."""
    if mode == "chunked":
        monkeypatch.setattr(bound_tables, "TABLE_FLOATS", 1)
        monkeypatch.setattr(branch_and_bound, "TABLE_FLOATS", 1)  # its column cache


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", ["kept", "chunked"])
def test_suffix_minima_under_tight_memory_equal_enumeration(seed, mode, monkeypatch):
    """With memory that refuses long stages, every suffix minimum equals the
    minimum over the splits of the layers left whose stages all fit
    (enumerated): the band cut to the longest fitting range loses nothing."""
    schedule, pp, vp, m, costs = bounds_tests._point(seed)
    costs = _tight(costs)
    if not split_fits.any_split_fits(costs):
        pytest.skip("no split fits")
    _table_modes(monkeypatch, mode, costs)
    tables = bound_tables.SuffixTables(costs, schedule, pp, costs.num_layers)
    bounds_tests.assert_suffix_minima_enumerated(tables, schedule, pp, costs, True)


def test_tight_memory_cuts_some_band():
    """The seeds above do exercise the cut: some block is tabled with fewer
    lengths than the table's rows."""
    cut = 0
    for seed in range(12):
        schedule, pp, _, _, costs = bounds_tests._point(seed)
        costs = _tight(costs)
        if split_fits.any_split_fits(costs):
            tables = bound_tables.SuffixTables(costs, schedule, pp, costs.num_layers)
            cut += any(kept[3].shape[-1] < tables.rows for kept in tables._kept.values() if kept[0] == "banded")
    assert cut > 0


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", ["kept", "chunked"])
@pytest.mark.parametrize("tight", [False, True])
def test_columns_equal_bound_families_of_each_range(seed, mode, tight, monkeypatch):
    """``column(s, i)`` says which lengths ``d`` fit (the range ends by
    ``L`` and fits memory; the last stage only ``d = L - i``) and, for those,
    holds each component's terms as :func:`bound_families` gives them for
    the range ``[i, i + d)`` alone (with chain families and weights)."""
    schedule, pp, vp, m, costs = bounds_tests._point(seed)
    if tight:
        costs = _tight(costs)
    _table_modes(monkeypatch, mode, costs)
    L, S = costs.num_layers, costs.pp
    chains = schedule in split_bounds.CHAIN_SCHEDULES
    weights = None
    if chains:
        terms = split_bounds.separable_terms(bound_families(costs, schedule, pp, 0, 0, 1, chains=True), 0, pp)
        weights = np.full(len(terms), 1.0 / len(terms))
    tables = bound_tables.SuffixTables(costs, schedule, pp, L, weights, chains)
    W = tables.rows
    for s in range(S):
        for i in ([0] if s == 0 else range(s, L - S + s + 1)):
            cols, fits = tables.column(s, i)
            for d in range(1, W + 1):
                j = i + d
                want_fit = j <= L and bool(costs.fits(s, i, min(j, L))) and (s < S - 1 or j == L)
                assert bool(fits[d - 1]) == want_fit, (s, i, d)
                if not want_fit:
                    continue
                comps = {}
                for fam in bound_families(costs, schedule, pp, np.array(s), np.array(i), np.array(j), weights, chains):
                    for kind, a, x in fam:
                        comps.setdefault(kind, []).append((a, x))
                for kind, (alpha, beta) in cols.items():
                    for q, (a, x) in enumerate(comps[kind]):
                        for got, want in ((alpha, a), (beta, x)):
                            assert (got is None) == (want is None), (s, i, d, kind)
                            if got is not None:
                                assert got[q, d - 1] == pytest.approx(float(want), rel=1e-12, abs=0), (s, i, d, kind, q)


OWN_FAMILIES = {"gpipe": 2, "1f1b": 4, "zb-h1": 2}  # the schedule branches of bound_families' docstring


@pytest.mark.parametrize("seed", range(12))
def test_own_family_tables_hold_the_schedules_own_families(seed):
    """``own_only`` keeps the families of the schedule's own closed form:
    GPipe 2, 1F1B 4 (the three 1F1B forms and the two-dwell-free one), ZB-H1
    2, none for the chunked schedules, each the same arrays as at the end of
    the full list but for its round-trip families; and the tables built from them alone give as root bound
    the largest over those families of the sum of each component's least
    value over the enumerated splits (each evaluated on the whole split, as
    in test_split_search_bounds), at most every split's simulated time. A family
    cut from the wrong end, or a table that mishandles kinds it no longer
    holds (no ``device`` row), breaks one of them."""
    schedule, pp, vp, m, costs = bounds_tests._point(seed)
    S, L = costs.pp, costs.num_layers
    s = np.arange(S)
    splits = bounds_tests._splits(L, S)
    own = bound_families(costs, schedule, pp, s, np.array(splits[0][:-1]), np.array(splits[0][1:]), own_only=True)
    full = bound_families(costs, schedule, pp, s, np.array(splits[0][:-1]), np.array(splits[0][1:]))
    assert len(own) == OWN_FAMILIES.get(schedule, 0)
    if not own:
        return
    end = len(full) - len(split_bounds.round_trip_pairs(costs, schedule, pp))  # then the round-trip families
    for mine, theirs in zip(own, full[end - len(own):end]):
        assert [k for k, _, _ in mine] == [k for k, _, _ in theirs]
        for (_, a, b), (_, a2, b2) in zip(mine, theirs):
            assert all(x is y is None or np.array_equal(x, y) for x, y in ((a, a2), (b, b2)))
    per_split = [bound_families(costs, schedule, pp, s, np.array(b[:-1]), np.array(b[1:]), own_only=True)
                 for b in splits]
    want = max(sum(min(bounds_tests._family_value([fams[f][c]], S, pp) for fams in per_split)
                   for c in range(len(own[f]))) for f in range(len(own)))
    root = bound_tables.SuffixTables(costs, schedule, pp, L, own_only=True).root_bound()
    assert root == pytest.approx(want, rel=1e-12)
    assert root <= min(bounds_tests._simulated(costs, schedule, pp, vp, b) for b in splits) * (1 + 1e-9)


def test_starts_under_a_limit_hold_every_split_that_can_beat_it():
    """With a limit, stage ``s`` is tabled only from the layers whose
    compute before it the ``s`` stages before can hold and whose compute
    after it the rest can (each stage's ``m`` micro-batches of compute on
    the fastest device within the limit). By enumeration on 16 seeded
    points and limits across the splits' needs: every split whose every
    stage stays within the limit (the only ones that can beat it) starts
    each stage inside the tabled range, and on unequal layers the range is
    narrower than counting ``W`` layers per stage on some point (a start
    test on the wrong side of the prefix, or an off-by-one at the
    boundary, fails one of the two)."""
    narrower = 0
    for seed in range(16):
        schedule, pp, _, m, costs = bounds_tests._point(seed)
        L, S = costs.num_layers, costs.pp
        cp, scale = costs.compute_prefix_s, float(np.min(costs.time_scale))
        splits = np.array(bounds_tests._splits(L, S))
        need = m * scale * np.max(np.diff(cp[splits], axis=1), axis=1)  # (splits,): the least limit each can beat
        for limit in np.unique(np.quantile(need, [0.0, 0.3, 0.7])):
            width = bound_tables.width_for(costs, limit)
            tables = bound_tables.SuffixTables(costs, schedule, pp, width, limit_s=limit)
            plain = bound_tables.SuffixTables(costs, schedule, pp, width)
            for b in splits[need <= limit]:
                assert np.all(tables._start <= b[:-1]) and np.all(b[:-1] <= tables._stop), (seed, limit, b)
            narrower += bool(np.any(tables._start > plain._start) or np.any(tables._stop < plain._stop))
    assert narrower > 0
