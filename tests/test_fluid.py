"""The fluid split (pipesearch.fluid) and the critical path it reads
(timemodel.critical_path_counts): path counts against the evaluator, the
fluid loads against a brute-force grid of loads, the split's rounding by
hand, and the exact split's use of it as a starting split."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from pipesearch import fluid
from pipesearch.fluid import fluid_loads, fluid_split
from pipesearch.split_search import exact_split
from pipesearch.timemodel import StageTimes, critical_path_counts, iteration_time_s
from test_timemodel import _random_point, stage_instances


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stage_instances())
def test_critical_path_is_a_longest_path_of_the_evaluator(inst):
    """Without all-reduce, the path's length is the evaluated time, and
    re-adding its actions' durations (plus the transfers it crosses, at
    most the time) gives it back from the counts alone when transfers are
    free."""
    schedule, pp, m, vp, t = inst
    if schedule in ("gpipe", "mobius", "roundpipe"):
        return
    S = len(t.fwd_s)
    no_comm = StageTimes(t.fwd_s, t.bwd_s, t.bwd_input_s, np.zeros(S - 1), np.zeros(S))
    value, counts = critical_path_counts(schedule, pp, m, vp, no_comm)
    assert value == pytest.approx(float(iteration_time_s(schedule, pp, m, vp, no_comm)), rel=1e-12, abs=1e-12)
    per_kind = np.stack([t.fwd_s, t.bwd_s, t.bwd_input_s, t.bwd_s - t.bwd_input_s])
    assert float(np.sum(counts * per_kind)) == pytest.approx(value, rel=1e-9, abs=1e-12)
    # every rank runs m forwards of each of its stages: a path holds at most that many of one stage
    assert counts.min() >= 0 and counts[0].max() <= m


def _grid_min(schedule: str, pp: int, m: int, vp: int, phi: float, steps: int) -> float:
    """The least simulated time over every load vector of the grid ``k /
    steps`` (adding up to 1), by brute force."""
    S = pp * vp
    grid = np.array([c for c in itertools.product(range(steps + 1), repeat=S - 1) if sum(c) <= steps], dtype=float)
    loads = np.concatenate([grid, steps - grid.sum(axis=1, keepdims=True)], axis=1) / steps
    times = StageTimes(phi * loads, (1 - phi) * loads, 0.5 * (1 - phi) * loads, np.zeros((len(loads), S - 1)),
                       np.zeros((len(loads), S)))
    return float(np.min(iteration_time_s(schedule, pp, m, vp, times)))


@pytest.mark.parametrize("pp, m, phi", [(2, 2, 1 / 3), (2, 4, 1 / 3), (2, 4, 0.5)])
def test_fluid_loads_are_the_least_time_over_every_load(pp, m, phi):
    """Interleaved 1F1B on 2 ranks x 2 chunks: the cutting planes close (the
    value is the time at the loads returned), and no load vector of a fine
    grid is faster; the grid's best is within its resolution of the value
    (each load moves by at most 1/steps, and T is Lipschitz with constant at
    most 2 m in the max norm of the loads, times 4 stages)."""
    value, loads = fluid_loads("interleaved-1f1b", pp, m, 2, phi)
    times = StageTimes(phi * loads, (1 - phi) * loads, 0.5 * (1 - phi) * loads, np.zeros(3), np.zeros(4))
    assert float(iteration_time_s("interleaved-1f1b", pp, m, 2, times)) == pytest.approx(value, rel=1e-9)
    assert loads.sum() == pytest.approx(1.0) and loads.min() >= -1e-12
    steps = 40
    best = _grid_min("interleaved-1f1b", pp, m, 2, phi, steps)
    assert best >= value * (1 - 1e-9)
    assert best <= value + 2 * m * 4 / steps
    # the even loads are not the best: the last stage of the last chunk gets less
    assert value < float(iteration_time_s("interleaved-1f1b", pp, m, 2, StageTimes(
        np.full(4, phi / 4), np.full(4, (1 - phi) / 4), np.full(4, (1 - phi) / 8), np.zeros(3), np.zeros(4)))) - 1e-9
    assert loads[-1] < loads[0]


def test_fluid_loads_only_for_interleaved_and_small_graphs():
    assert fluid_loads("1f1b", 4, 8, 1, 1 / 3) is None
    assert fluid_loads("interleaved-1f1b", 64, 4096, 2, 1 / 3) is None  # its cuts would pass FLUID_WORK


def test_fluid_split_rounds_the_loads_to_whole_layers(monkeypatch):
    """Loads 0.3, 0.3, 0.2, 0.2 on 10 layers of 1 ms (compute prefix 0 .. 10
    ms): boundaries at the layers nearest 3, 6 and 8 ms."""
    monkeypatch.setattr(fluid, "fluid_loads", lambda *a: (1.0, np.array([0.3, 0.3, 0.2, 0.2])))
    costs = _random_point(np.random.default_rng(0), 10, "interleaved-1f1b", 2, 2, 4, identical=True)
    costs = replace(costs, compute_prefix_s=np.arange(11) * 1e-3, fwd_prefix_s=np.arange(11) * 1e-3 / 3,
                    time_scale=np.ones(4))
    assert fluid_split(costs, "interleaved-1f1b", 2, 2) == (0, 3, 6, 8, 10)
    # running sums 0.1, 0.2, 5.1 ms round to layers 0, 0, 5; the first two stages still get a layer each
    monkeypatch.setattr(fluid, "fluid_loads", lambda *a: (1.0, np.array([0.01, 0.01, 0.49, 0.49])))
    assert fluid_split(costs, "interleaved-1f1b", 2, 2) == (0, 1, 2, 5, 10)
    # a last stage rounding to no layer gets the last one, the earlier boundaries moved left
    monkeypatch.setattr(fluid, "fluid_loads", lambda *a: (1.0, np.array([0.34, 0.33, 0.32, 0.01])))
    assert fluid_split(costs, "interleaved-1f1b", 2, 2) == (0, 3, 7, 9, 10)


def test_exact_split_is_at_most_the_fluid_split():
    """The fluid split is one of the exact split's starting splits: whatever
    its work limits, the split it returns is at most as slow (when it fits)."""
    checked = 0
    for seed in range(40):
        costs = _random_point(np.random.default_rng(seed), 12, "interleaved-1f1b", 2, 2, 4)
        start = fluid_split(costs, "interleaved-1f1b", 2, 2)
        found = exact_split(costs, "interleaved-1f1b", 2, 2, max_splits=1, max_nodes=1)
        if start is None or not costs.split_fits(start) or found is None:
            continue
        own = float(iteration_time_s("interleaved-1f1b", 2, 4, 2, costs.stage_times(np.array(start))))
        assert found.best_time_s <= own * (1 + 1e-12)
        checked += 1
    assert checked >= 10
