"""The splits whose every rank stays below a limit
(:func:`pipesearch.rank_splits.rank_bounded_splits`), and the exact split of
interleaved 1F1B points settled by simulating them (``split_search._listed``),
checked by brute force on small instances.

* The list is every split whose stages fit and whose every rank's work and
  all-reduce, ``m sum (F + B) + sum r`` over its stages, read off the
  split's own stage times (the simulator's input), is below the limit: no
  more, no fewer, in lexicographic order.
* Every split left out is at least the limit slow in the simulator (the
  rank's work and all-reduce is a path of the schedule).
* ``exact_split`` on points with too many splits to simulate every one
  (``ENUMERATE_SPLITS`` lowered) but few below the cutoff returns the split
  and time of simulating every split, or proves that none beats the cutoff.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import tiny_cluster, tiny_profile
from pipesearch import rank_splits, split_search
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.rank_splits import rank_bounded_splits
from pipesearch.schedules import build, in_flight_peaks
from pipesearch.split_search import exact_split
from pipesearch.timemodel import iteration_time_s, simulate_times
from pipesearch.types import Job, Link
from test_split_search_enumeration import _enumerated_choice, _point

SEEDS = [0, 4, 5, 9, 10, 14, 15, 19, 20, 24]  # interleaved 1F1B points of _point


@pytest.fixture
def any_slack(monkeypatch):
    """Lists at any limit (these instances' limits run far above the
    average rank's work)."""
    monkeypatch.setattr(rank_splits, "MAX_SLACK", np.inf)


def _rank_values(costs, pp: int, bounds) -> np.ndarray:
    """Each rank's head (micro-batch 0's forwards and transfers down to its
    first stage), work and all-reduce on the split ``bounds``, from the
    stage times the simulator replays."""
    t = costs.stage_times(np.array(bounds))
    per_stage = costs.num_micro_batches * (t.fwd_s + t.bwd_s) + t.allreduce_s
    head = np.concatenate([[0.0], np.cumsum(t.fwd_s[:-1] + t.p2p_s)])
    return np.array([head[q] + per_stage[q::pp].sum() for q in range(pp)])


def _every_split(L: int, S: int) -> list[tuple[int, ...]]:
    return [(0, *cut, L) for cut in itertools.combinations(range(1, L), S - 1)]


def _stages_fit(costs, bounds) -> bool:
    return all(bool(costs.fits(s, bounds[s], bounds[s + 1])) for s in range(costs.pp))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("memory_cap", [False, True])
def test_listed_splits_are_those_with_every_rank_below_the_limit(seed, memory_cap, any_slack):
    """At limits between the least and the largest busiest-rank value, the
    list equals the brute-force filter (a list that dropped the all-reduce,
    or cut stages too short, would differ), and every split outside it
    simulates at least the limit."""
    schedule, pp, vp, costs = _point(seed, memory_cap)
    assert schedule == "interleaved-1f1b"
    S, L, m = costs.pp, costs.num_layers, costs.num_micro_batches
    splits = [b for b in _every_split(L, S) if _stages_fit(costs, b)]
    if not splits:
        pytest.skip("no split fits")
    busiest = np.array([_rank_values(costs, pp, b).max() for b in splits])
    for limit in np.quantile(busiest, [0.0, 0.1, 0.5, 1.0]) * (1 + 1e-9):
        want = [b for b, v in zip(splits, busiest) if v < limit * (1 - 1e-12)]
        got = rank_bounded_splits(costs, pp, float(limit), 10**6)
        maybe = {b for b, v in zip(splits, busiest) if abs(v - limit) <= 1e-12 * limit}  # rounding at the limit
        assert set(want) <= {tuple(int(x) for x in row) for row in got} <= set(want) | maybe
        assert [tuple(row) for row in got.tolist()] == sorted(tuple(row) for row in got.tolist())
        listed = {tuple(int(x) for x in row) for row in got}
        for b in _every_split(L, S):
            if b not in listed and _stages_fit(costs, b):
                t, _ = simulate_times(schedule, pp, m, vp, costs.stage_times(np.array(b)))
                assert t >= limit * (1 - 1e-9)


def test_list_refused_above_its_count(any_slack):
    """More splits below the limit than asked for: None, not a partial list."""
    schedule, pp, vp, costs = _point(4)
    top = max(_rank_values(costs, pp, b).max() for b in _every_split(costs.num_layers, costs.pp))
    full = rank_bounded_splits(costs, pp, top * 2, 10**6)
    assert len(full) > 1
    assert rank_bounded_splits(costs, pp, top * 2, len(full) - 1) is None
    assert rank_bounded_splits(costs, pp, np.inf, 10**6) is None


def test_list_refused_far_above_the_average_rank():
    """A limit above MAX_SLACK times the average rank's least work (the
    model's least work, m (F + B) per layer, over pp): None; just below it:
    a list."""
    schedule, pp, vp, costs = _point(4)
    t = costs.stage_times(np.array(_every_split(costs.num_layers, costs.pp)[0]))  # one device type: any split
    avg = costs.num_micro_batches * float(np.sum(t.fwd_s + t.bwd_s)) / pp
    assert rank_bounded_splits(costs, pp, avg * rank_splits.MAX_SLACK * 1.001, 10**6) is None
    assert rank_bounded_splits(costs, pp, avg * rank_splits.MAX_SLACK * 0.999, 10**6) is not None


def _too_many_to_enumerate(seed: int, memory_cap: bool, monkeypatch):
    """:func:`_point` with its brute-force choice ``(schedule, pp, vp,
    costs, chosen split, its time)``, the whole enumeration turned off (its
    split count limit at 1); skipped when no split fits."""
    schedule, pp, vp, costs = _point(seed, memory_cap)
    if not any(costs.split_fits(b) for b in _every_split(costs.num_layers, costs.pp)):
        pytest.skip("no split fits")
    chosen, best = _enumerated_choice(costs, schedule, pp, vp)
    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 1)
    return schedule, pp, vp, costs, chosen, best


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("memory_cap", [False, True])
def test_exact_split_over_the_listed_splits_is_the_full_enumeration(seed, memory_cap, monkeypatch, any_slack):
    """With every point too large to enumerate whole, a cutoff just above
    the optimum: the listed splits are simulated and the split and time are
    those of simulating every split; a cutoff just below it: a proof that
    nothing beats it. A list that left out a split below the cutoff, or an
    enumeration that stopped at the wrong bound, picks another split."""
    schedule, pp, vp, costs, chosen, best = _too_many_to_enumerate(seed, memory_cap, monkeypatch)
    seen = []
    listed = split_search._listed
    monkeypatch.setattr(split_search, "_listed", lambda *a: seen.append(listed(*a)) or seen[-1])
    found = exact_split(costs, schedule, pp, vp, cutoff_s=best * (1 + 1e-6))
    assert seen and seen[0] is not None  # settled by the list, not by the branch and bound
    assert found.exact and found.nodes == 0
    assert found.bounds == chosen
    assert found.best_time_s == pytest.approx(best, rel=1e-12)
    below = exact_split(costs, schedule, pp, vp, cutoff_s=best * (1 - 1e-6))
    assert below.exact and below.best_time_s >= best * (1 - 1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("memory_cap", [False, True])
def test_listing_over_the_work_limit_is_settled_with_the_starting_splits_paths(seed, memory_cap, monkeypatch,
                                                                              any_slack):
    """A listing whose evaluation is over the work limit is kept, bounded
    again with the starting splits' critical paths once they are simulated,
    and simulated when that is within the limit (here: always, the first
    check refused): the split and time of simulating every split. A
    re-bound against a wrong limit, or with bounds that are not those of
    the paths, drops a split below the cutoff and picks another one."""
    schedule, pp, vp, costs, chosen, best = _too_many_to_enumerate(seed, memory_cap, monkeypatch)
    asked = []
    fits = split_search._evaluation_fits
    monkeypatch.setattr(split_search, "_evaluation_fits",
                        lambda *a: (asked.append(a[4]) or len(asked) > 1) and fits(*a))
    paths = []
    bounded = split_search._path_bounded
    monkeypatch.setattr(split_search, "_path_bounded", lambda *a: paths.append(a[5]) or bounded(*a))
    found = exact_split(costs, schedule, pp, vp, cutoff_s=best * (1 + 1e-6))
    assert len(asked) == 2 and asked[1] <= asked[0]  # the listing, then what the paths left of it
    assert paths and len(paths[0]) > 0
    assert found.exact and found.nodes <= split_search.FIRST_NODES  # the cutoff proof's first nodes at most
    assert found.bounds == chosen
    assert found.best_time_s == pytest.approx(best, rel=1e-12)


def _zero_tail_point():
    """Interleaved 1F1B, pp 2 x vp 2, 4 micro-batches: six layers of 1 + 2
    ms, then a last layer that takes no time but holds 50 MB of weights (a
    loss or a view in a PipeDream profile), over 10 GB/s links."""
    pp, vp, m = 2, 2, 4
    fwd, bwd = [1e-3] * 6 + [0.0], [2e-3] * 6 + [0.0]
    prof = tiny_profile(fwd, bwd, params=[1e6] * 6 + [5e7], outputs=[1e6] * 7)
    link = Link(1e10, 1e-5)
    costs = build_pipeline_costs(prof, tiny_cluster(1, 2 * pp, memory_bytes=1e12, intra=link, inter=link),
                                 Job(global_batch_size=2 * m, state_bytes_per_param=2.0, memory_reserve_bytes=0),
                                 pp=pp * vp, dp=2, micro_batch_size=1, num_micro_batches=m,
                                 schedule="interleaved-1f1b", placement=pipeline_placement(pp, 2)[np.arange(4) % pp],
                                 in_flight=np.array(in_flight_peaks(build("interleaved-1f1b", pp, m, vp))),
                                 stages_per_device=vp)
    return pp, vp, costs


def test_last_stage_ends_at_the_last_layer_after_layers_of_no_time(monkeypatch, any_slack):
    """Layers of no time at the end leave the least work after an earlier
    boundary at 0: every listed split still ends at the last layer, and the
    split the listing settles is brute force's (a list that let the last
    stage end early returned a split without the last layer, faster than
    any real one)."""
    pp, vp, costs = _zero_tail_point()
    L, S, m = costs.num_layers, costs.pp, costs.num_micro_batches
    got = rank_bounded_splits(costs, pp, 1.0, 10**6)
    assert len(got) and np.all(got[:, 0] == 0) and np.all(got[:, -1] == L)
    splits = np.array(_every_split(L, S))
    times = np.asarray(iteration_time_s("interleaved-1f1b", pp, m, vp, costs.stage_times(splits)))
    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 1)
    found = exact_split(costs, "interleaved-1f1b", pp, vp, cutoff_s=float(times.min()) * 1.5)
    assert found.exact and found.bounds[-1] == L
    assert found.best_time_s == pytest.approx(float(times.min()), rel=1e-12)
