"""Mobius' PCIe copies on the timeline (pipesearch.plots.timeline): the bars
drawn on each PCIe queue's row are the time model's copy nodes
(pipesearch.timemodel.mobius_graph), checked against schedules traced by
hand (tests/test_offload_mobius.py's cases)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import record_broken_barh
from pipesearch.plots import timeline as tl_plot
from pipesearch.timemodel import StageTimes, mobius_copy_spans, mobius_pcie_spans, simulate_times


def _times(S, queue, fwd=1.0, bwd=2.0, swap_in=3.0, swap_out=1.0):
    return StageTimes(fwd_s=np.full(S, fwd), bwd_s=np.full(S, bwd), bwd_input_s=np.zeros(S),
                      p2p_s=np.zeros(S - 1), allreduce_s=np.zeros(S), swap_in_s=np.full(S, swap_in),
                      swap_out_s=np.full(S, swap_out), swap_queue=queue)


def test_copies_of_two_gpus_under_one_switch():
    """pp 2, one stage each, one micro-batch, F 1, B 2, in 3, out 1, both
    ranks on queue 0: weights in [0, 3] (stage 0) and [3, 6] (stage 1);
    F1 [6, 7], B1 [7, 9], its gradients out [9, 10]; B0 [9, 11], out [11,
    12] (T = 12)."""
    times = _times(2, (0, 0))
    got = mobius_copy_spans(times, 2, 1, 1)
    assert got == [(0, "in", 0, 0.0, 3.0), (0, "in", 1, 3.0, 6.0), (0, "out", 1, 9.0, 10.0),
                   (0, "out", 0, 11.0, 12.0)]
    assert simulate_times("mobius", 2, 1, 1, times)[0] == pytest.approx(max(c[4] for c in got))


def test_prefetch_of_the_next_stage_and_the_second_stay():
    """One GPU, vp 2 (tests/test_offload_mobius.py): in stage 0 [0, 3],
    stage 1 [3, 6], stage 0 again [6, 9]; out stage 1 [9, 10], stage 0
    [11, 12]."""
    got = mobius_copy_spans(_times(2, (0,)), 1, 1, 2)
    assert [(d, s, a, b) for _, d, s, a, b in got] == [("in", 0, 0.0, 3.0), ("in", 1, 3.0, 6.0),
                                                        ("in", 0, 6.0, 9.0), ("out", 1, 9.0, 10.0),
                                                        ("out", 0, 11.0, 12.0)]


def test_the_drawn_bars_are_the_copy_nodes(monkeypatch, tmp_path):
    """Two switches (queues 0 and 1): rows 'PCIe 0 in', 'PCIe 0 out',
    'PCIe 1 in', 'PCIe 1 out' below the two ranks, each bar (in ms) one
    copy: both weights in [0, 3] s, stage 1 out [7, 8], stage 0 out [9,
    10] (tests/test_offload_mobius.py's trace)."""
    pytest.importorskip("matplotlib")
    drawn = record_broken_barh(monkeypatch)
    times = _times(2, (0, 1))
    total, timeline = simulate_times("mobius", 2, 1, 1, times)
    rows = tl_plot.pcie_rows(mobius_pcie_spans(times, 2, 1, 1), mobius=True)
    assert [r[0] for r in rows] == ["PCIe 0 in", "PCIe 0 out", "PCIe 1 in", "PCIe 1 out"]
    tl_plot.plot_timeline(timeline, tmp_path / "t.png", "t", pcie=rows)
    pcie = {round(y + h / 2): (x, c) for x, (y, h), c in drawn if c in tl_plot.PCIE_COLOURS.values()}
    want = {2: [(0.0, 3000.0)], 3: [(9000.0, 1000.0)], 4: [(0.0, 3000.0)], 5: [(7000.0, 1000.0)]}
    assert {k: [tuple(round(float(x), 6) for x in s) for s in v[0]] for k, v in pcie.items()} == want
    assert pcie[2][1] == tl_plot.PCIE_COLOURS[("in", "weights")]
    assert pcie[3][1] == tl_plot.PCIE_COLOURS[("out", "gradients")]
    assert total == pytest.approx(10.0)


def test_a_plan_without_host_copies_draws_no_pcie_rows():
    class _Plan:
        schedule = "1f1b"
        extra = ()

    assert tl_plot.pcie_copy_spans(_Plan()) == []
