"""benchmarks/bench_compiled_walk.py: the graphs and durations it times are
the simulator's (the node walk it compares against equals the levelled
numpy pass and the simulated time), and without numba it says so and exits 0."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import script_module
from pipesearch import timemodel


def _bench():
    return script_module("benchmarks/bench_compiled_walk.py")


@pytest.mark.parametrize("schedule, pp, m, vp", [("1f1b", 4, 8, 1), ("zb-h1", 4, 8, 1), ("interleaved-1f1b", 2, 4, 2)])
def test_the_timed_walk_is_the_simulators(schedule, pp, m, vp):
    g, dur, times = _bench().durations(schedule, pp, m, vp)
    walked = timemodel._node_ends_by_node(g, dur)
    levelled = dur.copy()  # the same recurrence a level at a time (the other branch of _node_ends)
    for nodes, p1, p2 in g.level_preds:
        levelled[nodes] += np.maximum(levelled[p1], levelled[p2])
    assert np.array_equal(walked, levelled)
    # no all-reduce: the simulated time is the last action's end
    assert walked[:-1].max() == timemodel.iteration_time_s(schedule, pp, m, vp, times)


def test_without_numba_it_says_so(capsys, monkeypatch):
    bench = _bench()
    monkeypatch.setitem(__import__("sys").modules, "numba", None)  # import numba raises ImportError
    assert bench.main([]) == 0
    assert "numba is not installed" in capsys.readouterr().out
