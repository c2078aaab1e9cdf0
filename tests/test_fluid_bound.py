"""The fluid lower bound of interleaved 1F1B
(:func:`pipesearch.fluid_bound.fluid_lower_bound_s`), checked against
values derived apart from it:

* it never exceeds the simulated time of any split (every split of small
  random instances replayed in the simulator, with links, all-reduce,
  uneven forward / backward ratios and devices of different speeds);
* on identical layers it lies between the average work per rank and
  Megatron-LM's closed form for equal stages, ``(m v + p - 1)`` stage times
  (Narayanan et al. 2021, sec. 2.2, bubble ``(p - 1) / v`` of a rank's
  micro-batch time);
* its certified value equals the least maximum of the same paths over a
  grid of stage loads, to the grid's resolution;
* the exact split uses it: a cutoff below the bound is settled before any
  split is simulated, and a stopped search reports at least the bound.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from helpers import tiny_cluster, tiny_profile
from pipesearch import split_bounds
from pipesearch import split_search
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.fluid_bound import fluid_lower_bound_s, layer_times
from pipesearch.partition import even_split
from pipesearch.schedules import build, in_flight_peaks
from pipesearch.timemodel import simulate_times
from pipesearch.types import Job, Link

SCHEDULE = "interleaved-1f1b"


def _costs(fwd, bwd, pp: int, vp: int, m: int, *, params=None, outputs=None, link=None, dp: int = 1):
    S = pp * vp
    prof = tiny_profile(fwd, bwd, params=params, outputs=outputs)
    cluster = tiny_cluster(1, pp * dp, memory_bytes=1e15, intra=link, inter=link)
    job = Job(global_batch_size=m * dp, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    return build_pipeline_costs(prof, cluster, job, pp=S, dp=dp, micro_batch_size=1, num_micro_batches=m,
                                schedule="gpipe", placement=pipeline_placement(pp, dp)[np.arange(S) % pp],
                                in_flight=np.array(in_flight_peaks(build(SCHEDULE, pp, m, vp))),
                                stages_per_device=vp)


def _least_time(costs, pp: int, vp: int) -> float:
    L, S = costs.num_layers, costs.pp
    return min(simulate_times(SCHEDULE, pp, costs.num_micro_batches, vp, costs.stage_times(np.array((0, *c, L))))[0]
               for c in itertools.combinations(range(1, L), S - 1))


@pytest.mark.parametrize("seed", range(24))
def test_bound_is_at_most_every_split(seed):
    """Random layers (forward and backward drawn apart, so the ratio varies),
    links, all-reduce, and on every third seed devices of different speeds:
    the bound never exceeds the least simulated time over all splits. A
    path counting an action its chain does not hold, a stage's least layer
    taken as its share, a ratio cone the wrong way round or a dual of the
    wrong sign overshoots on some instance here."""
    rng = np.random.default_rng(seed)
    pp, vp = int(rng.integers(2, 4)), int(rng.integers(2, 4)) if seed % 2 else 2
    S = pp * vp
    m = pp * int(rng.integers(1, 4))
    L = int(rng.integers(S + 1, min(S + 4, 10) + 1))
    fwd, bwd = rng.exponential(1e-3, L), rng.exponential(2e-3, L)
    link = Link(float(rng.choice([1e8, 1e9, 1e10])), float(rng.choice([0, 1e-4])))
    costs = _costs(fwd, bwd, pp, vp, m, params=rng.exponential(1e6, L), outputs=rng.exponential(1e6, L), link=link,
                   dp=2)
    if seed % 3 == 0:
        costs = dataclasses.replace(costs, time_scale=rng.uniform(0.5, 2.0, S))
    bound = fluid_lower_bound_s(costs, SCHEDULE, pp, vp)
    least = _least_time(costs, pp, vp)
    assert 0 < bound <= least * (1 + 1e-9), (bound, least)


@pytest.mark.parametrize("pp,vp,m", [(2, 2, 2), (2, 2, 4), (4, 2, 4), (4, 2, 8), (2, 3, 4), (4, 3, 8)])
def test_identical_layers_between_average_work_and_megatron(pp, vp, m):
    """``n = 3`` identical layers per stage (forward 1 s, backward 2 s): a
    rank runs ``m v`` micro-batches of a 9 s stage, the least any split can
    give; the even split simulates to Megatron's ``(m v + p - 1) x 9`` s. The
    bound lies between, and above the average by at least a third of the
    bubble (the chains see the fill and drain; without them it is the
    average)."""
    n, S = 3, pp * vp
    costs = _costs([1.0] * (S * n), [2.0] * (S * n), pp, vp, m)
    average, megatron = m * vp * 3.0 * n, (m * vp + pp - 1) * 3.0 * n
    even = simulate_times(SCHEDULE, pp, m, vp, costs.stage_times(np.array(even_split(S * n, S))))[0]
    assert even == pytest.approx(megatron, rel=1e-12)
    bound = fluid_lower_bound_s(costs, SCHEDULE, pp, vp)
    assert average + (megatron - average) / 3 <= bound <= megatron * (1 + 1e-12)


@pytest.mark.parametrize("m", [2, 4])
def test_certified_value_is_the_grid_minimum(m):
    """pp 2, vp 2, 40 identical layers (forward 1, backward 2): the least
    over loads ``x_s >= 1/40`` on a grid of step 1/80 of the largest of the
    paths the bound weighs (each rank's work, each stage's chain, built here
    from the chain counts), each stage's forward a third of its load. The
    certified value is at most the grid's least, and above it by less than
    the grid's resolution (one step moves a path by at most its largest
    coefficient times the step)."""
    pp, vp, L = 2, 2, 40
    S = pp * vp
    costs = _costs([1.0] * L, [2.0] * L, pp, vp, m)
    bound = fluid_lower_bound_s(costs, SCHEDULE, pp, vp)
    total = 3.0 * L
    stage = np.arange(S)
    paths = [np.where(stage % pp == q, m * 3.0, 0.0) for q in range(pp)]  # per unit of a stage's load
    for k in range(S):
        n = split_bounds.interleaved_chain(pp, m, vp, k)
        paths.append((stage < k) * 3.0 + n[:, 0] * 1.0 + n[:, 1] * 2.0)
    paths = np.array(paths) / 3.0  # per unit of load (forward a third, backward two thirds)
    step = 1 / 80
    grid = np.arange(1 / 40, 1.0, step)
    loads = np.array([(a, b, c, 1 - a - b - c) for a in grid for b in grid for c in grid if 1 - a - b - c >= 1 / 40 - 1e-12])
    least = float(np.min(np.max(loads @ paths.T, axis=1))) * total
    assert bound <= least * (1 + 1e-9)
    assert bound >= least - float(np.max(paths)) * step * total * 2


def test_other_schedules_have_no_bound():
    costs = _costs([1.0] * 8, [2.0] * 8, 2, 1, 4)
    for schedule in ("1f1b", "gpipe", "zb-h1"):
        assert fluid_lower_bound_s(costs, schedule, 2, 1) == 0.0


def test_layer_times_are_the_least_over_options():
    """Without options: each layer's own forward and backward; the sums are
    the profile's."""
    costs = _costs([1.0, 2.0, 3.0], [4.0, 5.0, 7.0], 1, 3, 2)
    f, b = layer_times(costs)
    assert f.tolist() == [1.0, 2.0, 3.0]
    assert b.tolist() == [4.0, 5.0, 7.0]


def test_exact_split_settles_a_cutoff_below_the_bound_without_simulating():
    """48 identical layers, pp 4, vp 2, m 4 (too many splits to enumerate):
    with a cutoff 1% below the fluid bound the exact split proves that no
    split beats it and simulates none; with the cutoff above the bound it
    finds a split at least as slow as the bound."""
    pp, vp, m, L = 4, 2, 4, 48
    costs = _costs([1.0] * L, [2.0] * L, pp, vp, m)
    bound = fluid_lower_bound_s(costs, SCHEDULE, pp, vp)
    proof = split_search.exact_split(costs, SCHEDULE, pp, vp, cutoff_s=bound * 0.99)
    assert proof.exact and proof.splits_evaluated == 0 and proof.bounds == ()
    found = split_search.exact_split(costs, SCHEDULE, pp, vp)
    assert found.best_time_s >= bound
    assert found.lower_bound_s >= min(bound, found.best_time_s)


def test_a_target_above_the_equal_loads_is_not_solved_for():
    """``below_s``: on identical layers the equal loads are the even split,
    whose paths are at most its simulated time, Megatron's ``(m v + p - 1)``
    stage times; asked for more than that the bound is 0.0 (not solved);
    asked for less than the bound it is the bound."""
    pp, vp, m, n = 2, 2, 4, 3
    costs = _costs([1.0] * (pp * vp * n), [2.0] * (pp * vp * n), pp, vp, m)
    megatron = (m * vp + pp - 1) * 3.0 * n
    bound = fluid_lower_bound_s(costs, SCHEDULE, pp, vp)
    assert fluid_lower_bound_s(costs, SCHEDULE, pp, vp, below_s=megatron * 1.001) == 0.0
    assert fluid_lower_bound_s(costs, SCHEDULE, pp, vp, below_s=bound * 0.99) == bound


@pytest.mark.parametrize("seed", range(6))
def test_layers_of_no_backward_or_no_forward(seed):
    """Layers with a zero forward or backward (their prefix differences leave
    rounding residue such as 1e-20, which once made the ratio cone 1e16 steep
    and the program run without end): the bound is still found, positive and
    at most every split's time."""
    rng = np.random.default_rng(100 + seed)
    pp, vp, L = 2, 2, 7
    fwd, bwd = rng.exponential(1e-3, L), rng.exponential(2e-3, L)
    fwd[rng.choice(L, 2, replace=False)] = 0.0
    bwd[rng.choice(L, 2, replace=False)] = 0.0
    costs = _costs(fwd, bwd, pp, vp, 4)
    bound = fluid_lower_bound_s(costs, SCHEDULE, pp, vp)
    assert 0 < bound <= _least_time(costs, pp, vp) * (1 + 1e-9)


@pytest.mark.parametrize("seed", [117, 121, 163, 204, 210, 273, 0, 1, 2, 3])
def test_times_over_many_orders_of_magnitude(seed):
    """Layer times log-uniform over six orders of magnitude and device
    speeds over six (every stage a layer or two): the first six seeds are
    the ones of 400 where the program ended ABNORMAL (a cone up to 1e6
    steep) and gave no bound; it is now solved (without the cone when it
    must) and never above the least simulated time."""
    from helpers import make_costs

    rng = np.random.default_rng(1000 + seed)
    pp, vp = int(rng.integers(2, 5)), 3
    S, m = pp * vp, pp * 2
    L = S + int(rng.integers(0, 2))
    f, b = 10 ** rng.uniform(-6, 0, L), 10 ** rng.uniform(-6, 0, L)
    costs = make_costs(times=tuple(f + b), fwd=tuple(f), pp=S, m=m, time_scale=10 ** rng.uniform(-3, 3, S),
                       in_flight=[1] * S)
    bound = fluid_lower_bound_s(costs, SCHEDULE, pp, vp)
    assert 0 < bound <= _least_time(costs, pp, vp) * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_the_programs_rows_are_the_paths_of_the_module_docstring(seed):
    """The program of :func:`pipesearch.fluid_bound._program` (without the
    ratio cone) at stage loads ``u``, ``v``: its rows hold exactly when
    ``t`` is at least every rank's work ``m sum_{s on q} a_s (u_s + v_s)``
    and every stage's chain ``P_k + sum_s n_F(k, s) a_s u_s + n_B(k, s) a_s
    v_s`` (``P_k`` the scaled compute before stage ``k``, the counts of
    :func:`pipesearch.split_bounds.interleaved_chain`), written here from
    the docstring: at the longest of them each row's value is ``t`` less
    its path (ranks first, then the stages' chains), the prefix rows 0 and
    the totals the model's. A rank's stage left out, a chain of the wrong
    stage, a prefix off by one stage or unscaled breaks one of them."""
    from pipesearch.fluid_bound import _program

    rng = np.random.default_rng(seed)
    pp, vp = int(rng.integers(2, 5)), int(rng.integers(2, 4))
    S, m = pp * vp, pp * int(rng.integers(1, 4))
    f, b = rng.uniform(0.1, 1, 3 * S), rng.uniform(0.1, 2, 3 * S)
    f, b = f / (f.sum() + b.sum()), b / (f.sum() + b.sum())
    scale = rng.choice([1.0, 1.5, 0.7], S)
    A, lo, hi, x_lo, x_hi = _program(f, b, scale, pp, m, vp, cone=False)
    u, v = rng.dirichlet(np.ones(S)) * f.sum(), rng.dirichlet(np.ones(S)) * b.sum()
    work = scale * (u + v)
    before = np.concatenate([[0.0], np.cumsum(work)[:-1]])
    paths = [m * work[q::pp].sum() for q in range(pp)]
    for k in range(S):
        n = split_bounds.interleaved_chain(pp, m, vp, k)
        paths.append(before[k] + float(np.sum(n[:, 0] * scale * u + n[:, 1] * scale * v)))
    t = max(paths)
    ax = A @ np.concatenate([u, v, before, [t]])
    # row by row, in order: t less each rank's work, then each stage's chain (>= 0); the prefixes (= 0); the totals
    assert ax[:pp + S] == pytest.approx(t - np.array(paths), abs=1e-12)
    assert np.all(lo[:pp + S] == 0) and np.all(np.isinf(hi[:pp + S]))
    equal = np.concatenate([np.zeros(S - 1), [f.sum(), b.sum()]])
    assert ax[pp + S:] == pytest.approx(equal, abs=1e-12)
    assert np.array_equal(lo[pp + S:], hi[pp + S:]) and lo[pp + S:] == pytest.approx(equal, abs=1e-15)
    assert len(A) == pp + 2 * S + 1
