"""Tests of pipesearch.simulate (and the timeline plot)."""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesearch.errors import InputError
from pipesearch.schedules import SCHEDULES, Action, build, gpipe, interleaved_1f1b, looped_bfs, num_stages_of, one_f_one_b, zb_h1
from pipesearch.simulate import ActionRecord, Timeline, simulate


def _sim(actions, S, tf, tb, p2p=0.0, **kw):
    return simulate(actions, fwd_s=[tf] * S, bwd_s=[tb] * S, p2p_s=[p2p] * (S - 1), **kw)


# ------------------------------------------------------------ closed forms


@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 2), (3, 4), (4, 8), (5, 7), (8, 8), (8, 32)])
@pytest.mark.parametrize("tf,tb", [(1.0, 1.0), (1.0, 2.0), (0.25, 0.5)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_iteration_time(name, p, m, tf, tb):
    """Equal stages, no link delay: the last micro-batch's forward leaves
    stage 0 after m t_f, reaches the last stage after (p-1) t_f more; the
    pipeline is full in between, so (GPipe, Huang et al. 2019; 1F1B, Narayanan
    et al. 2021) iteration = (m + p - 1)(t_f + t_b)."""
    tl = _sim(build(name, p, m), p, tf, tb)
    assert tl.iteration_time_s == pytest.approx((m + p - 1) * (tf + tb), rel=1e-12)
    # Bottleneck (every rank is equally busy): bubble = (p-1)/(m+p-1).
    assert tl.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert tl.busy_s == pytest.approx([m * (tf + tb)] * p)


@pytest.mark.parametrize("p,m,v", [(2, 2, 2), (2, 4, 4), (4, 4, 2), (4, 8, 2), (4, 8, 3), (4, 12, 2), (8, 16, 4)])
@pytest.mark.parametrize("tf,tb", [(1.0, 1.0), (1.0, 2.0), (2.0, 1.0)])
def test_interleaved_bubble(p, m, v, tf, tb):
    """Narayanan et al. SC'21 sec. 2.2.2: with v model chunks per rank and
    per-virtual-stage times t_f, t_b, each rank's ideal time is m v (t_f + t_b)
    and the bubble is (p - 1)(t_f + t_b), i.e. (p - 1)/(v m) of the ideal."""
    S = p * v
    tl = _sim(interleaved_1f1b(p, m, v), S, tf, tb)
    ideal = m * v * (tf + tb)
    assert (tl.iteration_time_s - ideal) / ideal == pytest.approx((p - 1) / (v * m), abs=1e-12)


@pytest.mark.parametrize("p,m", [(2, 2), (3, 5), (4, 8), (6, 12), (8, 20)])
@pytest.mark.parametrize("t_f,t_i,t_w", [(1.0, 1.0, 1.0), (1.0, 1.0, 0.5), (2.0, 1.0, 1.0), (1.0, 1.2, 0.8)])
def test_zb_h1_bubble_and_memory(p, m, t_f, t_i, t_w):
    """Qi et al. 2023, sec. 3.1: ZB-H1's bubble is (p - 1)(T_F + T_B - T_W)
    (their B is our I), a third of 1F1B's (p - 1)(T_F + T_B + T_W) when all
    three are equal; its peak memory over workers equals 1F1B's (p
    micro-batches, on stage 0 for 1F1B, on every stage for ZB-H1)."""
    tl = simulate(zb_h1(p, m), fwd_s=[t_f] * p, bwd_s=[t_i + t_w] * p, bwd_input_s=[t_i] * p,
                  p2p_s=[0.0] * (p - 1), act_bytes=[10.0] * p)
    bubble = tl.iteration_time_s - m * (t_f + t_i + t_w)
    assert bubble == pytest.approx((p - 1) * (t_f + t_i - t_w), abs=1e-9)
    ref = simulate(one_f_one_b(p, m), fwd_s=[t_f] * p, bwd_s=[t_i + t_w] * p, p2p_s=[0.0] * (p - 1),
                   act_bytes=[10.0] * p)
    assert max(tl.peak_in_flight) == max(ref.peak_in_flight) == p
    assert max(tl.peak_act_bytes) == max(ref.peak_act_bytes) == 10.0 * p
    if t_f == t_i == t_w:
        ref_bubble = ref.iteration_time_s - m * (t_f + t_i + t_w)
        assert bubble == pytest.approx(ref_bubble / 3)


@pytest.mark.parametrize("p,m", [(1, 3), (3, 3), (4, 9), (8, 16)])
def test_peak_in_flight_and_bytes(p, m):
    """GPipe holds all m micro-batches on every stage; 1F1B stage s holds
    min(m, p - s). Bytes per rank = act_bytes[s] times that count."""
    act = [float(100 * (s + 1)) for s in range(p)]
    g = _sim(gpipe(p, m), p, 1.0, 2.0, act_bytes=act)
    o = _sim(one_f_one_b(p, m), p, 1.0, 2.0, act_bytes=act)
    assert g.peak_in_flight == (m,) * p
    assert o.peak_in_flight == tuple(min(m, p - s) for s in range(p))
    assert g.peak_act_bytes == tuple(m * a for a in act)
    assert o.peak_act_bytes == tuple(min(m, p - s) * act[s] for s in range(p))


# ------------------------------------------------------------ hand example


def test_1f1b_hand_example_unequal_stages_and_link_delay():
    """1F1B, p = 3 stages, m = 4 micro-batches, F = (1, 2, 1), B = (2, 4, 2),
    link delay 0.5 per boundary (both directions).

    Orders (warm-up p-1-r forwards, then F/B pairs, then drain):
      rank 0: F0 F1 F2 B0 F3 B1 B2 B3
      rank 1: F0 F1 B0 F2 B1 F3 B2 B3
      rank 2: F0 B0 F1 B1 F2 B2 F3 B3
    Notation: [start, end]; "-> x" = arrival at the neighbour (end + 0.5).

    1. r0 F0 [0, 1] -> 1.5; F1 [1, 2] -> 2.5; F2 [2, 3] -> 3.5.
    2. r1 F0 starts at max(free 0, arrival 1.5) = 1.5: [1.5, 3.5] -> r2 at 4.0.
    3. r1 F1: arrival 2.5, free 3.5: [3.5, 5.5] -> r2 at 6.0.
    4. r2 F0 [4.0, 5.0]; B0 [5.0, 7.0] -> r1 at 7.5.
    5. r2 F1: arrival 6.0, free 7.0: [7.0, 8.0]; B1 [8.0, 10.0] -> r1 at 10.5.
    6. r1 B0: arrival 7.5, free 5.5: [7.5, 11.5] -> r0 at 12.0.
    7. r1 F2: arrival 3.5, free 11.5: [11.5, 13.5] -> r2 at 14.0.
    8. r0 B0: arrival 12.0, free 3.0: [12.0, 14.0]; F3 [14.0, 15.0] -> r1 at 15.5.
    9. r1 B1: arrival 10.5, free 13.5: [13.5, 17.5] -> r0 at 18.0.
    10. r1 F3: arrival 15.5, free 17.5: [17.5, 19.5] -> r2 at 20.0.
    11. r2 F2: arrival 14.0, free 10.0: [14.0, 15.0]; B2 [15.0, 17.0] -> r1 at 17.5.
    12. r2 F3: arrival 20.0: [20.0, 21.0]; B3 [21.0, 23.0] -> r1 at 23.5.
    13. r1 B2: arrival 17.5, free 19.5: [19.5, 23.5] -> r0 at 24.0.
    14. r1 B3: arrival 23.5, free 23.5: [23.5, 27.5] -> r0 at 28.0.
    15. r0 B1: arrival 18.0, free 15.0: [18.0, 20.0]; B2 arrival 24.0: [24.0, 26.0];
        B3 arrival 28.0: [28.0, 30.0].
    Iteration time = 30.0. No two transfers overlap on one link (sends on
    r0->r1 at 1, 2, 3, 15; on r1->r0 at 11.5, 17.5, 23.5, 27.5), so no queueing.
    Busy: r0 4*1 + 4*2 = 12, r1 4*2 + 4*4 = 24, r2 12; bottleneck bubble
    = 1 - 24/30 = 0.2; mean bubble = 1 - 48/90.
    """
    tl = simulate(one_f_one_b(3, 4), fwd_s=[1, 2, 1], bwd_s=[2, 4, 2], p2p_s=[0.5, 0.5])
    assert tl.iteration_time_s == 30.0
    rec = {(r.kind, r.stage, r.microbatch): (r.start_s, r.end_s) for r in tl.records}
    assert rec[("F", 1, 0)] == (1.5, 3.5)
    assert rec[("B", 2, 0)] == (5.0, 7.0)
    assert rec[("B", 1, 0)] == (7.5, 11.5)
    assert rec[("F", 1, 2)] == (11.5, 13.5)
    assert rec[("F", 0, 3)] == (14.0, 15.0)
    assert rec[("F", 2, 3)] == (20.0, 21.0)
    assert rec[("B", 1, 3)] == (23.5, 27.5)
    assert rec[("B", 0, 3)] == (28.0, 30.0)
    assert tl.busy_s == (12.0, 24.0, 12.0)
    assert tl.bubble_fraction == pytest.approx(0.2)
    assert tl.mean_bubble_fraction == pytest.approx(1 - 48 / 90)
    assert tl.rank_records(2)[0] == ActionRecord(2, "F", 2, 0, 4.0, 5.0)


def test_link_queueing():
    """GPipe, p = 2, m = 3, F = B = 1, link delay 2.
    r0 F0 [0,1], F1 [1,2], F2 [2,3]. The r0->r1 link carries one transfer at a
    time: F0's [1,3], F1's [3,5] (waits for the link), F2's [5,7].
    r1 F0 [3,4], F1 [5,6], F2 [7,8], B0 [8,9], B1 [9,10], B2 [10,11].
    r1->r0 link: B0's [9,11], B1's [11,13], B2's [13,15].
    r0 B0 [11,12], B1 [13,14], B2 [15,16]: iteration 16.
    (Without queueing it would be 12: arrivals 3,4,5 and 9,10,11.)"""
    tl = simulate(gpipe(2, 3), fwd_s=[1, 1], bwd_s=[1, 1], p2p_s=[2])
    assert tl.iteration_time_s == 16.0
    assert [(r.start_s, r.end_s) for r in tl.rank_records(1)[:3]] == [(3, 4), (5, 6), (7, 8)]


def test_same_rank_transfers_are_free():
    """Looped BFS on one rank, v = 3: stages 0, 1, 2 all on rank 0, so the
    link delays (5 s each) never apply: iteration = m v (t_f + t_b) = 2*3*3."""
    tl = simulate(looped_bfs(1, 2, 3), fwd_s=[1] * 3, bwd_s=[2] * 3, p2p_s=[5, 5])
    assert tl.iteration_time_s == 18.0
    assert tl.bubble_fraction == 0.0


def test_interleaved_wraparound_uses_link():
    """Interleaved p = 2, m = 2, v = 2: stage 1 (rank 1) -> stage 2 (rank 0)
    crosses ranks, so its delay applies; a larger wrap-around delay can only
    lengthen the iteration."""
    a = interleaved_1f1b(2, 2, 2)
    base = simulate(a, fwd_s=[1] * 4, bwd_s=[2] * 4, p2p_s=[0, 0, 0]).iteration_time_s
    slow = simulate(a, fwd_s=[1] * 4, bwd_s=[2] * 4, p2p_s=[0, 3, 0]).iteration_time_s
    assert slow > base


# ------------------------------------------------------------ errors


def test_input_errors():
    a = one_f_one_b(2, 2)
    with pytest.raises(InputError, match="fwd_s has 1 entries, expected 2"):
        simulate(a, fwd_s=[1], bwd_s=[1, 1], p2p_s=[0])
    with pytest.raises(InputError, match="p2p_s has 2 entries, expected 1"):
        simulate(a, fwd_s=[1, 1], bwd_s=[1, 1], p2p_s=[0, 0])
    with pytest.raises(InputError, match=r"bwd_s\[1\] = -1.0 must be finite and >= 0"):
        simulate(a, fwd_s=[1, 1], bwd_s=[1, -1], p2p_s=[0])
    with pytest.raises(InputError, match="give bwd_input_s"):
        simulate(zb_h1(2, 2), fwd_s=[1, 1], bwd_s=[2, 2], p2p_s=[0])
    with pytest.raises(InputError, match=r"bwd_input_s\[0\] = 3.0 exceeds bwd_s\[0\] = 2.0"):
        simulate(zb_h1(2, 2), fwd_s=[1, 1], bwd_s=[2, 2], bwd_input_s=[3, 1], p2p_s=[0])
    with pytest.raises(InputError, match=r"stage_to_rank\[1\] = 0 but the schedule runs stage 1 on rank 1"):
        simulate(a, fwd_s=[1, 1], bwd_s=[1, 1], p2p_s=[0], stage_to_rank=[0, 0])
    simulate(a, fwd_s=[1, 1], bwd_s=[1, 1], p2p_s=[0], stage_to_rank={0: 0, 1: 1})
    with pytest.raises(InputError, match="no actions"):
        simulate([[]], fwd_s=[], bwd_s=[], p2p_s=[])


def test_deadlocked_schedule_refused():
    a = [
        [Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1)],
        [Action("F", 1, 0), Action("F", 1, 1), Action("B", 1, 0), Action("B", 1, 1)],
    ]
    with pytest.raises(InputError, match="deadlock"):
        simulate(a, fwd_s=[1, 1], bwd_s=[1, 1], p2p_s=[0])


# ------------------------------------------------------------ properties


@settings(max_examples=120, deadline=None)
@given(
    data=st.data(),
    p=st.integers(1, 6),
    k=st.integers(1, 4),
    v=st.integers(1, 3),
    name=st.sampled_from(sorted(SCHEDULES)),
)
def test_dependencies_respected(data, p, k, v, name):
    """For random stage and link times, every record starts after its rank's
    previous record ended and after its input arrived (producer end + link
    delay when on another rank), and durations are the stage times."""
    m = p * k
    vv = v if name in ("interleaved-1f1b", "looped-bfs") else 1
    S = num_stages_of(name, p, vv)
    times = st.floats(0.0, 5.0, allow_nan=False)
    fwd = data.draw(st.lists(times, min_size=S, max_size=S))
    bwd = data.draw(st.lists(times, min_size=S, max_size=S))
    frac = data.draw(st.lists(st.floats(0.0, 1.0), min_size=S, max_size=S))
    p2p = data.draw(st.lists(times, min_size=S - 1, max_size=S - 1))
    tl = simulate(build(name, p, m, vv), fwd_s=fwd, bwd_s=bwd, p2p_s=p2p, bwd_input_s=[b * f for b, f in zip(bwd, frac)])
    assert isinstance(tl, Timeline)
    rec = {(r.kind, r.stage, r.microbatch): r for r in tl.records}
    eps = 1e-9
    for r in range(p):
        rows = tl.rank_records(r)
        for a, b in zip(rows, rows[1:]):
            assert b.start_s >= a.end_s - eps
    for x in tl.records:
        dur = {"F": fwd, "B": bwd}.get(x.kind)
        if dur is not None:
            assert x.end_s - x.start_s == pytest.approx(dur[x.stage], abs=1e-9)
        if x.kind == "F" and x.stage > 0:
            src = rec[("F", x.stage - 1, x.microbatch)]
            delay = 0.0 if src.rank == x.rank else p2p[x.stage - 1]
            assert x.start_s >= src.end_s + delay - eps
        if x.kind in ("B", "I") and x.stage < S - 1:
            src = rec.get(("B", x.stage + 1, x.microbatch)) or rec[("I", x.stage + 1, x.microbatch)]
            delay = 0.0 if src.rank == x.rank else p2p[x.stage]
            assert x.start_s >= src.end_s + delay - eps
    assert tl.iteration_time_s >= max(tl.busy_s) - eps
    assert 0.0 <= tl.bubble_fraction <= 1.0


# ------------------------------------------------------------ speed and plot


def test_simulate_1f1b_64x512_makespan():
    """1F1B, p = 64, m = 512 (65 536 actions; its speed is measured by
    benchmarks/bench_simulate.py): uniform stages F = 1 ms, B = 2 ms and free
    p2p give the textbook makespan (m + p - 1)(F + B) = 575 * 3 ms (Narayanan
    et al., SC'21, sec. 2.2)."""
    a = one_f_one_b(64, 512)
    tl = simulate(a, fwd_s=[1e-3] * 64, bwd_s=[2e-3] * 64, p2p_s=[0.0] * 63, act_bytes=[1.0] * 64)
    assert len(tl.records) == 65536
    assert tl.iteration_time_s == pytest.approx(575 * 3e-3, rel=1e-9)


def test_plot_timeline_deterministic(tmp_path):
    pytest.importorskip("matplotlib")
    from pipesearch.plots.timeline import plot_timeline

    tl = simulate(zb_h1(4, 8), fwd_s=[1e-3] * 4, bwd_s=[2e-3] * 4, bwd_input_s=[1e-3] * 4, p2p_s=[1e-4] * 3)
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    plot_timeline(tl, a, "ZB-H1 p=4 m=8")
    plot_timeline(tl, b, "ZB-H1 p=4 m=8")
    assert a.stat().st_size > 1000
    assert a.read_bytes() == b.read_bytes()
    s1, s2 = tmp_path / "a.svg", tmp_path / "b.svg"
    plot_timeline(tl, s1, "t")
    plot_timeline(tl, s2, "t")
    assert s1.read_bytes() == s2.read_bytes()
    assert b"time (ms)" in s1.read_bytes()


def test_plot_timeline_of_many_micro_batches_reads_busy(tmp_path):
    """1F1B p = 2, m = 256 keeps both ranks busy but for the fill and drain
    (each rank busy m (F + B) = 768 ms of (m + p - 1)(F + B) = 771 ms, F = 1, B = 2 ms):
    on a whole-iteration plot the action bars (under a pixel wide each) must
    outweigh the idle grey. With a white outline per bar they did not: half
    the rank rows' pixels were the idle colour."""
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg
    import numpy as np

    from pipesearch.plots.timeline import _IDLE, KIND_COLOURS, plot_timeline

    tl = simulate(one_f_one_b(2, 256), fwd_s=[1e-3] * 2, bwd_s=[2e-3] * 2, p2p_s=[0.0])
    assert tl.iteration_time_s == pytest.approx(257 * 3e-3)
    plot_timeline(tl, tmp_path / "t.png", "1F1B p=2 m=256")
    img = mpimg.imread(tmp_path / "t.png")[..., :3]

    def pixels(colour):
        rgb = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        return int((np.abs(img - rgb).max(axis=-1) < 0.06).sum())

    busy, idle = pixels(KIND_COLOURS["F"]) + pixels(KIND_COLOURS["B"]), pixels(_IDLE)
    assert busy > 0.8 * (busy + idle)


def test_simulate_plan_reports_peak_activations():
    """A plan's replay carries its stages' saved bytes: 1F1B, pp 2, m 4, one
    layer per stage saving 1 MB per micro-batch. Stage 0 runs two forwards
    before its first backward (pp - 0 = 2 in flight), stage 1 one: peaks
    2 MB and 1 MB."""
    from helpers import tiny_cluster, tiny_profile
    from pipesearch.search import search
    from pipesearch.point_plan import simulate_plan
    from pipesearch.search_options import ModelVariant, SearchOptions
    from pipesearch.types import Job

    prof = tiny_profile([1e-3, 1e-3], saved=[1e6, 1e6])
    plan = search([ModelVariant(prof)], tiny_cluster(1, 2), Job(4, memory_reserve_bytes=0),
                  SearchOptions(pp=2, dp=1, micro_batch_size=1, schedules=("1f1b",))).plans[0]
    _, tl = simulate_plan(plan)
    assert list(tl.peak_act_bytes) == [2e6, 1e6]


def test_analytic_figure_where_the_textbook_forms_stop_holding():
    """The secondary closed form beside the simulated time, on 16 identical
    layers (forward 1 ms; backward 2 ms of which the input gradient 0.5 ms)
    in 4 stages of 4, free links: F = 4, I = 2, W = 6 ms a stage.
    ZB-H1, m = 8: Qi et al.'s (p-1)(F + I - W) bubble would be 0 (96 ms),
    below what the last rank must do after waiting (p-1) F = 12 ms for its
    first input: 96 + 12 = 108 ms, the form with max(I - W, 0), and the
    simulated time. Looped BFS, pp 4, vp 2 (8 stages of 2: f + b = 6 ms),
    m = 2 < pp: every chunk waits for the pipeline to fill, ((v-1) max(m,
    p) + m + p - 1)(f + b) = (4 + 5) x 6 = 54 ms, not (m v + p - 1)(f + b) =
    42 ms."""
    from dataclasses import replace

    import numpy as np

    from helpers import make_costs
    from pipesearch.point_plan import analytic_time_s
    from pipesearch.timemodel import iteration_time_s

    costs = make_costs(times=(3e-3,) * 16, fwd=(1e-3,) * 16, pp=4, m=8)
    costs = replace(costs, bwd_input_prefix_s=np.concatenate([[0.0], np.cumsum([0.5e-3] * 16)]))
    bounds = (0, 4, 8, 12, 16)
    assert analytic_time_s("zb-h1", costs, bounds, 4, 1) == pytest.approx(108e-3)
    assert iteration_time_s("zb-h1", 4, 8, 1, costs.stage_times(np.array(bounds))) == pytest.approx(108e-3)
    looped = make_costs(times=(3e-3,) * 16, fwd=(1e-3,) * 16, pp=8, m=2)
    eight = tuple(range(0, 17, 2))
    assert analytic_time_s("looped-bfs", looped, eight, 4, 2) == pytest.approx(54e-3)
    assert iteration_time_s("looped-bfs", 4, 2, 2, looped.stage_times(np.array(eight))) == pytest.approx(54e-3)
