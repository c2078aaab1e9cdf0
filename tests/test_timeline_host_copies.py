"""Every PCIe copy on the timeline (pipesearch.plots.timeline.pcie_copy_spans):
Mobius' activation copies (nodes of pipesearch.timemodel.mobius_graph) and
the copies the other schedules' stage times hold (activations in host
memory, the offloaded optimizer step; pipesearch.timemodel.host_copy_spans).

Oracles: the schedules traced by hand in tests/test_offload_activations.py,
tests/test_offload_mobius_activations.py and tests/test_offload_ties.py.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from helpers import pcie_host, record_broken_barh, tiny_cluster
from pipesearch.plots import timeline as tl_plot
from pipesearch.search import search
from pipesearch.point_plan import simulate_plan
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, mobius_pcie_spans, simulate_times
from pipesearch.types import Job

sys.path.insert(0, str(Path(__file__).parent))
from test_offload_activations import _hand_profile  # noqa: E402
from test_offload_ties import STEP_S, _plan as tie_plan  # noqa: E402

GB = 1e9


def _by(spans):
    """``{(lane, direction, what): (count, total seconds)}``."""
    out: dict = {}
    for lane, d, what, _, a, b in spans:
        n, t = out.get((lane, d, what), (0, 0.0))
        out[(lane, d, what)] = (n + 1, t + b - a)
    return out


def test_mobius_draws_the_copies_of_the_one_offloading_stage():
    """tests/test_offload_mobius_activations.py's trace with stage 0's
    activations only on the host: out (0,0) [1.5, 1.9], (0,1) [2.5, 2.9];
    in (0,1) [2.9, 3.3], (0,0) [3.3, 3.7], on the one switch's queues
    beside the weights (in [0, .5], [.5, 1]) and gradients (out stage 1
    [7.5, 8], stage 0 [9.5, 10])."""
    times = StageTimes(fwd_s=np.ones(2), bwd_s=np.full(2, 2.0), bwd_input_s=np.ones(2), p2p_s=np.zeros(1),
                       allreduce_s=np.zeros(2), swap_in_s=np.full(2, 0.5), swap_out_s=np.full(2, 0.5),
                       swap_queue=(0, 0), act_copy_s=np.full(2, 0.4), act_host=np.array([True, False]))
    spans = mobius_pcie_spans(times, 2, 2, 1)
    act = [(d, s, round(a, 9), round(b, 9)) for _, d, what, s, a, b in spans if what == "activations"]
    assert act == [("in", 0, 2.9, 3.3), ("in", 0, 3.3, 3.7), ("out", 0, 1.5, 1.9), ("out", 0, 2.5, 2.9)]
    other = [(d, s, round(a, 9), round(b, 9)) for _, d, what, s, a, b in spans if what != "activations"]
    assert other == [("in", 0, 0.0, 0.5), ("in", 1, 0.5, 1.0), ("out", 1, 7.5, 8.0), ("out", 0, 9.5, 10.0)]
    assert simulate_times("mobius", 2, 2, 1, times)[0] == pytest.approx(10.0)


def test_activation_copies_of_gpipe_on_the_gpu_lane():
    """tests/test_offload_activations.py's hand case (GPipe, pp 2, m = 6):
    stage 0 offloads, its copy 0.48 s each way. Out: micro-batch k during
    the action after F(k), F(k+1) at 0.48 (k+1) for k < 5, and F(5)'s during
    B(0) at 3.48; in: B(0)'s during F(5) at 2.4, B(j)'s during B(j-1) at
    3.48 + 0.48 (j - 1). Six copies each way on rank 0 (2.88 s each), none
    on rank 1; the bars drawn are these spans."""
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB), host=pcie_host())
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("gpipe",), top=1)
    plan = search([ModelVariant(_hand_profile())], cluster, job, opts).plans[0]
    assert dict(plan.extra)["host"]["activation_copy_s"] == pytest.approx([0.48, 0.0])
    spans = tl_plot.pcie_copy_spans(plan)
    counts = _by(spans)
    assert set(counts) == {(0, "out", "activations"), (0, "in", "activations")}
    for key in counts:
        assert counts[key][0] == 6 and counts[key][1] == pytest.approx(6 * 0.48)
    out = sorted(a for _, d, _, _, a, _ in spans if d == "out")
    ins = sorted(a for _, d, _, _, a, _ in spans if d == "in")
    assert out == pytest.approx([0.48, 0.96, 1.44, 1.92, 2.4, 3.48])
    assert ins == pytest.approx([2.4, 3.48, 3.96, 4.44, 4.92, 5.4])
    assert max(b for *_, b in spans) <= simulate_plan(plan)[0] + 1e-9


def test_optimizer_step_copies_after_the_last_backward(monkeypatch, tmp_path):
    """tests/test_offload_ties.py's plan (pp 1, GPipe, m = 6, optimizer
    offloaded): the GPU computes 6 x 0.6 = 3.6 s, then its gradients go out
    (2e9 B / 25 GB/s = 0.08 s: [3.6, 3.68]), the CPU runs Adam (1 s), the
    weights come back [4.68, 4.76], the end of the iteration; the timeline
    draws the two bars on rank 0's PCIe rows."""
    pytest.importorskip("matplotlib")
    plan = tie_plan(20)
    spans = tl_plot.pcie_copy_spans(plan)
    assert [(d, what, round(a, 9), round(b, 9)) for _, d, what, _, a, b in spans] == [
        ("in", "weights", 4.68, 4.76), ("out", "gradients", 3.6, 3.68)]
    assert 3.6 + STEP_S == pytest.approx(4.76) == simulate_plan(plan)[0]
    drawn = record_broken_barh(monkeypatch)
    rows = tl_plot.plan_pcie_rows(plan)
    assert [r[0] for r in rows] == ["rank 0 PCIe in", "rank 0 PCIe out"]
    tl_plot.plot_timeline(simulate_plan(plan)[1], tmp_path / "t.png", "t", pcie=rows)
    bars = {round(y + h / 2): [tuple(round(float(v), 6) for v in x) for x in xr] for xr, (y, h), c in drawn
            if c in tl_plot.PCIE_COLOURS.values()}
    assert bars == {1: [(4680.0, 80.0)], 2: [(3600.0, 80.0)]}


def test_streamed_weights_copies_inside_their_actions():
    """tests/test_offload.py's streamed stages (1F1B, pp 2, m = 2, two
    layers of 2.5e9 weight bytes per stage, 12.5 GB/s per GPU): a stage's
    weights take 5e9 / 12.5e9 = 0.4 s. Each rank: weights in during its 2
    forwards and 2 backwards (4 copies, 1.6 s), gradients out during its 2
    backwards after their weights (2 copies, 0.8 s); every copy inside its
    action (forward 1.2 s, backward 2.4 s)."""
    from test_offload import _cluster, _stream_profile

    prof = _stream_profile([1.0, 0.1, 1.0, 1.0], [2.0, 0.2, 2.0, 2.0], [2.5e9] * 4, [0.0] * 4)
    job = Job(global_batch_size=2, memory_reserve_bytes=0, weight_streaming=True)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=2, schedules=("1f1b",), top=1,
                         split=(2, 2))
    plan = search([ModelVariant(prof)], _cluster(12 * GB, cpu_adam_params_per_s=1e10), job, opts).plans[0]
    assert [st.memory_option for st in plan.stages] == ["stream", "stream"]
    assert dict(plan.extra)["host"]["weight_copy_s"] == pytest.approx([0.4, 0.4])
    total, timeline = simulate_plan(plan)
    spans = tl_plot.pcie_copy_spans(plan, timeline)
    counts = _by(spans)
    for r in (0, 1):
        assert counts[(r, "in", "weights")][0] == 4 and counts[(r, "in", "weights")][1] == pytest.approx(1.6)
        assert counts[(r, "out", "gradients")][0] == 2 and counts[(r, "out", "gradients")][1] == pytest.approx(0.8)
    for r, _, _, s, a, b in spans:
        assert any(rec.rank == r and rec.stage == s and rec.start_s - 1e-9 <= a and b <= rec.end_s + 1e-9
                   for rec in timeline.records)
