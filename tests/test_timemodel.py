"""The one time model: closed forms and the levelled evaluator equal the
discrete-event simulator, the exact split equals brute force over the
simulator, and the search's rank 1 is the simulated optimum of the whole space.

Every reference value here comes from the simulator
(:func:`pipesearch.simulate.simulate`) run on every enumerated split, or is
derived by hand in the test's docstring.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import tiny_cluster, tiny_profile
from pipesearch import bound_tables
from pipesearch import branch_and_bound
from pipesearch import split_fits
from pipesearch import split_search
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.schedules import build, in_flight_peaks, num_stages_of
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.simulate import simulate
from pipesearch.split_search import exact_split, exhaustive_simulated_split
from pipesearch.split_fits import any_split_fits
from pipesearch.timemodel import StageTimes, gpipe_time_s, iteration_time_s, send_overlap, simulate_times
from pipesearch.types import Job, Link

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs")


def _des_time(schedule, pp, m, vp, times: StageTimes) -> float:
    """The definition, written out here: the simulator's makespan with the
    schedule's send model, then each rank's all-reduce after it is done."""
    tl = simulate(build(schedule, pp, m, vp), fwd_s=times.fwd_s, bwd_s=times.bwd_s, p2p_s=times.p2p_s,
                  bwd_input_s=times.bwd_input_s, p2p_overlap=send_overlap(schedule))
    ar = [0.0] * pp
    for s, r in enumerate(times.allreduce_s):
        ar[s % pp] += r
    return max(tl.iteration_time_s, max(e + a for e, a in zip(tl.rank_end_s, ar)))


@st.composite
def stage_instances(draw):
    schedule = draw(st.sampled_from(SCHEDULES))
    pp = draw(st.integers(1, 4))
    vp = draw(st.integers(2, 3)) if schedule in ("interleaved-1f1b", "looped-bfs") and pp > 1 else 1
    m = draw(st.integers(pp, pp + 6))
    if schedule == "interleaved-1f1b":
        m = pp * max(1, m // pp)
    S = num_stages_of(schedule, pp, vp)
    pos = st.floats(0.0, 5.0, allow_nan=False)
    fwd = np.array(draw(st.lists(pos, min_size=S, max_size=S)))
    bwd = np.array(draw(st.lists(pos, min_size=S, max_size=S)))
    share = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=S, max_size=S)))
    p2p = np.array(draw(st.lists(st.floats(0.0, 2.0), min_size=S - 1, max_size=S - 1)))
    ar = np.array(draw(st.lists(st.floats(0.0, 20.0), min_size=S, max_size=S)))
    return schedule, pp, m, vp, StageTimes(fwd, bwd, bwd * share, p2p, ar)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stage_instances())
def test_evaluator_and_gpipe_closed_form_equal_the_simulator(inst):
    """The levelled longest-path evaluator (every schedule) and GPipe's closed
    form equal the discrete-event simulator within 1e-9 relative."""
    schedule, pp, m, vp, times = inst
    ref = _des_time(schedule, pp, m, vp, times)
    got = iteration_time_s(schedule, pp, m, vp, times)
    assert math.isclose(got, ref, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(simulate_times(schedule, pp, m, vp, times)[0], ref, rel_tol=1e-12, abs_tol=1e-12)
    if schedule == "gpipe":
        assert math.isclose(gpipe_time_s(times, m), ref, rel_tol=1e-9, abs_tol=1e-12)


def test_gpipe_closed_form_by_hand():
    """GPipe, 2 stages, m = 3, F = (1, 2), B = (3, 1), one link of 0.5 s,
    all-reduce (0, 10). Forward grid rows F0, c, F1 = 1, 0.5, 2: 3.5 + 2 * 2 =
    7.5. Backward from stage 1: rows B1, c = 1, 0.5 (+ B0 = 3 for s = 0):
    s = 1: 1 + 2 * 1 + 10 = 13; s = 0: 1 + 0.5 + 3 + 2 * 3 + 0 = 10.5.
    T = 7.5 + 13 = 20.5."""
    times = StageTimes(np.array([1.0, 2.0]), np.array([3.0, 1.0]), np.array([1.5, 0.5]), np.array([0.5]),
                       np.array([0.0, 10.0]))
    assert gpipe_time_s(times, 3) == pytest.approx(20.5)
    assert _des_time("gpipe", 2, 3, 1, times) == pytest.approx(20.5)


def test_zero_bubble_beats_1f1b_by_the_papers_bubble():
    """Uniform 4 stages, m = 8, F = I = W = 1 s, free links (Qi et al. 2023,
    sec. 3.1): 1F1B takes (m + p - 1)(F + B) = 11 * 3 = 33 s; ZB-H1's bubble is
    (p - 1)(T_F + T_B - T_W) = 3 * (1 + 1 - 1) = 3 s on top of m (F + I + W) =
    24 s: 27 s."""
    times = StageTimes(np.ones(4), 2 * np.ones(4), np.ones(4), np.zeros(3), np.zeros(4))
    assert iteration_time_s("1f1b", 4, 8, 1, times) == pytest.approx(33.0)
    assert iteration_time_s("zb-h1", 4, 8, 1, times) == pytest.approx(27.0)


def test_blocking_sends_of_1f1b_cost_the_sender():
    """1F1B, 2 stages, m = 2, F = 1, B = 2 on both, a 1 s link. Blocking sends:
    rank 0 runs F0 0-1 (+ send: arrives 2), F1 2-3 (+ send: arrives 4); rank 1
    runs F0 2-3, B0 3-5 (+ send: arrives 6), F1 6-7, B1 7-9 (+ send: arrives
    10). Rank 0 runs B0 6-8 and B1 10-12: T = 12."""
    times = StageTimes(np.ones(2), 2 * np.ones(2), np.ones(2), np.ones(1), np.zeros(2))
    assert iteration_time_s("1f1b", 2, 2, 1, times) == pytest.approx(12.0)


# ------------------------------------------------------------ exact split


def _random_point(rng, L, schedule, pp, vp, m, identical=False, idle=False):
    """PipelineCosts of a random profile on a random 1-2 node cluster; with
    ``identical``, every layer but a random last one (a model head) is the
    same (a transformer's blocks); with ``idle``, some layers have no
    compute and no parameters (pooling, reshapes) and every layer the same
    output, so moving a boundary over them changes memory but not time."""
    if identical:
        one = [rng.exponential(1e-3), rng.exponential(2e-3), rng.exponential(1e6), rng.exponential(1e6)]
        head = [x * float(rng.choice([1.0, rng.uniform(0.2, 3.0)])) for x in one]
        fwd, bwd, params, outputs = (np.array([a] * (L - 1) + [h]) for a, h in zip(one, head))
        prof = tiny_profile(fwd, bwd, params=params, outputs=outputs, saved=outputs)
    else:
        fwd, bwd = rng.exponential(1e-3, L), rng.exponential(2e-3, L)
        params = rng.exponential(1e6, L) * (rng.random(L) < 0.7)
        outputs, saved = rng.exponential(1e6, L), rng.exponential(1e6, L)
        if idle:
            none = rng.random(L) < 0.4
            fwd, bwd, params = (np.where(none, 0.0, x) for x in (fwd, bwd, params))
            outputs = np.full(L, outputs[0])
        prof = tiny_profile(fwd, bwd, params=params, outputs=outputs, saved=saved)
    per_node = int(rng.integers(1, pp * 2 + 1))
    nodes = -(-pp * 2 // per_node)
    cluster = tiny_cluster(nodes, per_node, memory_bytes=float(rng.choice([6e6, 1e9])),
                           intra=Link(float(rng.choice([1e9, 1e10])), float(rng.choice([0, 1e-5]))),
                           inter=Link(float(rng.choice([1e8, 1e9])), float(rng.choice([0, 1e-4]))))
    dp = 2 if cluster.num_devices >= 2 * pp else 1
    job = Job(global_batch_size=dp * m, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    actions = build(schedule, pp, m, vp)
    return build_pipeline_costs(prof, cluster, job, pp=pp * vp, dp=dp, micro_batch_size=1, num_micro_batches=m,
                                schedule="gpipe", placement=pipeline_placement(pp, dp)[np.arange(pp * vp) % pp],
                                in_flight=np.array(in_flight_peaks(actions)), stages_per_device=vp)


def _assert_exact_split_is_brute_force_optimum(seed: int, pp_low: int, m_steps: int) -> None:
    """A random instance (seeded; up to 8 layers, the seed's schedule): the
    branch and bound's time equals the best simulated time over every split
    that fits, and it proves it (or both find no split)."""
    rng = np.random.default_rng(seed)
    schedule = SCHEDULES[seed % len(SCHEDULES)]
    pp = int(rng.integers(pp_low, 4))
    vp = 2 if schedule in ("interleaved-1f1b", "looped-bfs") and pp > 1 else 1
    L = int(rng.integers(pp * vp, 9))
    if schedule == "interleaved-1f1b":
        m = pp * int(rng.integers(1, m_steps))
    else:
        m = int(rng.integers(pp, pp + m_steps + 1))
    _assert_exact_equals_brute_force(_random_point(rng, L, schedule, pp, vp, m), schedule, pp, vp)


def _assert_exact_equals_brute_force(costs, schedule: str, pp: int, vp: int) -> None:
    ref = exhaustive_simulated_split(costs, schedule, pp, vp)
    got = exact_split(costs, schedule, pp, vp)
    if ref is None:
        assert got is None
        return
    assert got is not None and got.exact
    assert got.iteration_time_s == pytest.approx(ref[0], rel=1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_exact_split_equals_brute_force_over_the_simulator(seed):
    """Random instances up to 8 layers, every schedule: the branch and bound's
    time equals the best simulated time over every split that fits."""
    _assert_exact_split_is_brute_force_optimum(seed, pp_low=1, m_steps=4)


@pytest.mark.parametrize("seed", range(36))
def test_exact_split_on_identical_layers_equals_brute_force(seed):
    """Identical layers (and a random head), interleaved 1F1B with 2-3
    stages per rank, ZB-H1 and 1F1B: the branch and bound's time equals the
    best simulated time over every split that fits, and it proves it. Ties
    abound here, so a bound that overshoots by a hair prunes the optimum."""
    rng = np.random.default_rng(1000 + seed)
    schedule = ("interleaved-1f1b", "zb-h1", "1f1b")[seed % 3]
    pp = int(rng.integers(2, 4))
    vp = int(rng.integers(2, 4)) if schedule == "interleaved-1f1b" else 1
    if pp * vp > 6:
        pp = 2
    L = int(rng.integers(pp * vp, pp * vp + 4))
    m = pp * int(rng.integers(1, 4)) if schedule == "interleaved-1f1b" else int(rng.integers(pp, pp + 5))
    _assert_exact_equals_brute_force(_random_point(rng, L, schedule, pp, vp, m, identical=True), schedule, pp, vp)


@pytest.mark.parametrize("seed", range(40, 52))
def test_exact_split_with_tables_in_stage_blocks(seed, monkeypatch):
    """Tables too large for one block are built stage by stage and the
    per-node terms recomputed: the same optimum as brute force."""
    monkeypatch.setattr(bound_tables, "TABLE_FLOATS", 1)
    monkeypatch.setattr(branch_and_bound, "TABLE_FLOATS", 1)  # its column cache
    _assert_exact_split_is_brute_force_optimum(seed, pp_low=2, m_steps=3)


@pytest.mark.parametrize("cells", [0, split_fits.LONGEST_FIT_CELLS], ids=["bisection", "every-pair"])
@pytest.mark.parametrize("seed", range(30))
def test_any_split_fits_equals_enumeration(seed, cells, monkeypatch):
    """The feasibility test agrees with trying every split, with each
    stage's longest fitting ranges found by bisection or by checking every
    (start, end) pair."""
    monkeypatch.setattr(split_fits, "LONGEST_FIT_CELLS", cells)
    rng = np.random.default_rng(seed)
    pp = int(rng.integers(1, 4))
    L = int(rng.integers(pp, 9))
    costs = _random_point(rng, L, "1f1b", pp, 1, pp + 1)
    expected = any(costs.split_fits((0, *cut, L)) for cut in itertools.combinations(range(1, L), pp - 1))
    assert any_split_fits(costs) == expected


@pytest.mark.parametrize("seed", range(40))
def test_equal_time_splits_every_one_seen_by_the_tie_break(seed):
    """Layers without compute or parameters make splits of equal time that
    differ in memory. Among every split that fits, simulated one by one,
    those within ``EQUAL_TIME_REL`` of the best are the ties; the split
    search must return the one its tie-break order ranks first (lower peak
    memory per device, then less time on links: ``split_search._tie_key``),
    so that no search path (a cutoff, ``--exhaustive``, the seeds it starts
    from) can return another of equal time."""
    rng = np.random.default_rng(7000 + seed)
    schedule = SCHEDULES[seed % len(SCHEDULES)]
    pp = int(rng.integers(2, 4))
    vp = 2 if schedule in ("interleaved-1f1b", "looped-bfs") else 1
    L = int(rng.integers(pp * vp + 1, 9))
    m = pp * int(rng.integers(1, 3)) if schedule == "interleaved-1f1b" else int(rng.integers(pp, pp + 3))
    costs = _random_point(rng, L, schedule, pp, vp, m, idle=True)
    times = {}
    for cut in itertools.combinations(range(1, L), pp * vp - 1):
        bounds = (0, *cut, L)
        if costs.split_fits(bounds):
            times[bounds] = simulate_times(schedule, pp, m, vp, costs.stage_times(bounds))[0]
    found = exact_split(costs, schedule, pp, vp)
    if not times:
        assert found is None
        return
    best = min(times.values())
    ties = [b for b, t in times.items() if t <= best * (1 + split_search.EQUAL_TIME_REL)]
    want = min(ties, key=lambda b: split_search._tie_key(costs, b, times[b]))
    assert found.exact and found.bounds == want, (schedule, len(ties), found.bounds, want)


def test_equal_time_splits_prefer_lower_memory():
    """Two stages, 1F1B, m = 2, free links, dp = 1. Layers: l0 (1 s), l1 (0 s,
    saves 5 MB), l2 (1 s), l3 (0 s). Splits [1 | 3] and [2 | 2] both take
    stage times (1, 1): equal iteration times. Stage 0 of 1F1B holds
    min(m, p) = 2 micro-batches, stage 1 one, so l1's 5 MB cost 10 MB on stage
    0 and 5 MB on stage 1: [1 | 3] has the lower peak and must be chosen."""
    prof = tiny_profile([1 / 3, 0, 1 / 3, 0], [2 / 3, 0, 2 / 3, 0], saved=[0, 5e6, 0, 0])
    res = search([ModelVariant(prof)], tiny_cluster(1, 2), Job(2, memory_reserve_bytes=0),
                 SearchOptions(pp=2, dp=1, micro_batch_size=1, schedules=("1f1b",)))
    assert [st.layers for st in res.plans[0].stages] == [(0, 1), (1, 4)]


# ------------------------------------------------------------ whole search vs brute force


def _brute_force_best(prof, cluster, job, schedules, vps=(2,)):
    """Best simulated time over every (pp, dp, micro-batch size, schedule, vp,
    placement, split): the cost model's stage terms for each split, the
    schedule's own in-flight peaks for memory, the simulator for time."""
    L, n, B = prof.num_layers, cluster.num_devices, job.global_batch_size
    best = math.inf
    for pp in range(1, min(n, L) + 1):
        for dp in range(1, n // pp + 1):
            if B % dp:
                continue
            for mbs in (d for d in range(1, B // dp + 1) if (B // dp) % d == 0):
                m = B // dp // mbs
                for schedule in (schedules if pp > 1 else ("1f1b",)):
                    for vp in (vps if schedule in ("interleaved-1f1b", "looped-bfs") and pp > 1 else (1,)):
                        if schedule in ("1f1b", "zb-h1", "interleaved-1f1b") and m < pp:
                            continue
                        if schedule == "interleaved-1f1b" and (m % pp or vp < 2):
                            continue
                        if pp * vp > L:
                            continue
                        peaks = np.array(in_flight_peaks(build(schedule, pp, m, vp)))
                        for order in ("pipeline", "data"):
                            place = pipeline_placement(pp, dp, order)[np.arange(pp * vp) % pp]
                            costs = build_pipeline_costs(prof, cluster, job, pp=pp * vp, dp=dp, micro_batch_size=mbs,
                                                         num_micro_batches=m, schedule="gpipe", placement=place,
                                                         in_flight=peaks, stages_per_device=vp)
                            for cut in itertools.combinations(range(1, L), pp * vp - 1):
                                bounds = (0, *cut, L)
                                if costs.split_fits(bounds):
                                    t = _des_time(schedule, pp, m, vp, costs.stage_times(bounds))
                                    best = min(best, t)
    return best


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_rank_one_is_the_simulated_optimum_of_the_whole_space(seed):
    """Random profiles of up to 6 layers on 2-4 devices over 1-2 nodes with
    random links and memory: ``search``'s rank 1 is within the 0.1 % tie
    window of the best simulated time found by brute force over the space."""
    rng = np.random.default_rng(100 + seed)
    L = int(rng.integers(2, 7))
    prof = tiny_profile(rng.exponential(1e-3, L), rng.exponential(2e-3, L),
                        params=rng.exponential(2e6, L), outputs=rng.exponential(2e6, L),
                        saved=rng.exponential(2e6, L))
    per_node = int(rng.integers(1, 3))
    cluster = tiny_cluster(int(rng.integers(1, 3)), 2 * per_node, memory_bytes=float(rng.choice([3e7, 1e9])),
                           intra=Link(float(rng.choice([1e9, 1e10])), 1e-5),
                           inter=Link(float(rng.choice([1e8, 1e9])), 1e-4))
    job = Job(global_batch_size=int(rng.choice([2, 4, 8])), state_bytes_per_param=4.0, memory_reserve_bytes=0)
    schedules = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
    ref = _brute_force_best(prof, cluster, job, schedules)
    if not math.isfinite(ref):
        return
    res = search([ModelVariant(prof)], cluster, job, SearchOptions(schedules=schedules, top=1))
    assert res.plans[0].predicted.iteration_time_s <= ref * (1 + 1e-3) + 1e-15
    assert res.plans[0].predicted.iteration_time_s >= ref * (1 - 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_points_stopped_at_the_limits_are_reported_with_a_valid_bound(seed, monkeypatch):
    """With the split search's work limits cut to one node and one split
    (and no enumeration), many points stop unproven. Whatever the search then
    claims must still hold against brute force over the whole space: a rank-1
    time at most the least bound of the unproven points outside the table is
    the optimum, and that bound never exceeds the best time of the space
    when rank 1 is not it."""
    monkeypatch.setattr(split_search, "MAX_NODES", 1)
    monkeypatch.setattr(split_search, "MAX_SPLITS_EVALUATED", 1)
    monkeypatch.setattr(split_search, "ENUMERATE_SPLITS", 0)
    monkeypatch.setattr(split_search, "FIRST_NODES", 0)
    rng = np.random.default_rng(300 + seed)
    L = int(rng.integers(4, 7))
    prof = tiny_profile(rng.exponential(1e-3, L), rng.exponential(2e-3, L),
                        params=rng.exponential(2e6, L), outputs=rng.exponential(2e6, L),
                        saved=rng.exponential(2e6, L))
    cluster = tiny_cluster(1, 4, memory_bytes=1e9, intra=Link(float(rng.choice([1e8, 1e10])), 1e-5))
    job = Job(global_batch_size=8, state_bytes_per_param=4.0, memory_reserve_bytes=0)
    schedules = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
    ref = _brute_force_best(prof, cluster, job, schedules)
    res = search([ModelVariant(prof)], cluster, job, SearchOptions(schedules=schedules, top=2))
    first = res.plans[0].predicted.iteration_time_s
    if first <= res.unproven_bound_s:  # claimed optimal over the whole space
        assert first <= ref * (1 + 1e-3) + 1e-15
    else:  # not claimed: a faster plan may lie among the unproven points, whose bound must allow it
        assert res.unproven_points > 0 and res.unproven_bound_s <= ref * (1 + 1e-9)
    assert (res.unproven_points == 0) == (res.unproven_bound_s == math.inf)


def test_node_ends_walked_node_by_node_equal_a_level_per_pass(monkeypatch):
    """Each node's end, ``dur + max(end of its two predecessors)``, the same
    from the Python walk (few splits, narrow levels), from the level passes
    and from a reference that follows the predecessor arrays by recursion
    (no use of the level numbering): bit for bit, on the graphs of five
    schedules with random durations for 1, 2 and 7 splits, and one split
    given as a 1-D array (Mobius' and RoundPipe's graphs)."""
    from pipesearch import timemodel

    def by_recursion(g, dur):
        N = len(g.pred1)
        end = [None] * N

        def of(n):
            if n == N:
                return dur[N]
            if end[n] is None:
                end[n] = dur[n] + np.maximum(of(int(g.pred1[n])), of(int(g.pred2[n])))
            return end[n]

        return np.array([of(n) for n in range(N)] + [dur[N]])

    rng = np.random.default_rng(3)
    for key in (("1f1b", 4, 8, 1), ("zb-h1", 3, 6, 1), ("interleaved-1f1b", 2, 4, 2), ("gpipe", 3, 5, 1),
                ("looped-bfs", 2, 4, 2)):
        g = timemodel._graph(*key)
        for n in (1, 2, 7):
            dur = rng.random((len(g.pred1) + 1, n))
            dur[-1] = 0.0
            walked = timemodel._node_ends_by_node(g, dur)
            monkeypatch.setattr(timemodel, "NODE_WALK_CELLS_PER_LEVEL", 0)
            levels = timemodel._node_ends(g, dur)
            monkeypatch.undo()
            assert np.array_equal(walked, levels), (key, n)
            assert np.array_equal(levels, by_recursion(g, dur)), (key, n)
        assert np.array_equal(timemodel._node_ends(g, dur[:, 0]), walked[:, 0])  # one split as a 1-D array


def test_graph_depth_level_by_level_equals_node_by_node(monkeypatch):
    """The longest unit-weight path to each node, walked node by node and a
    level per numpy pass: by hand on a small graph (rows 0 -> 1 -> 2 and
    3 -> 4, cross edges 1 -> 4 and 4 -> 2: depths 0, 1, 3, 0, 2), a cycle
    refused by both, and the same depths on the graphs of several
    schedules."""
    from pipesearch import timemodel
    from pipesearch.errors import InputError

    depth = timemodel._depth
    N = 5
    pred1, pred2 = np.array([N, 0, 1, N, 3]), np.array([N, N, 4, N, 1])
    monkeypatch.setattr(timemodel, "LEVEL_PASS_NODES", 0)
    for width in (0, 1):  # 0: node by node; 1 (with no node minimum): a level per pass
        assert depth(pred1, pred2, width).tolist() == [0, 1, 3, 0, 2]
        with pytest.raises(InputError):
            depth(np.array([2, 0]), np.array([1, 2]), width)  # 0 after 1 and 1 after 0
    seen = []
    monkeypatch.setattr(timemodel, "_depth", lambda a, b, w=0: seen.append((a, b)) or depth(a, b))
    for key in (("1f1b", 8, 16, 1), ("zb-h1", 4, 9, 1), ("interleaved-1f1b", 4, 8, 2), ("gpipe", 3, 5, 1),
                ("looped-bfs", 2, 4, 3)):
        timemodel._graph.__wrapped__(*key)
        a, b = seen[-1]
        assert np.array_equal(depth(a, b), depth(a, b, 1)), key


def test_enumerated_points_settle_against_a_cutoff_as_brute_force(monkeypatch):
    """Interleaved 1F1B points few enough to enumerate (pp 2, vp 2, 6-9
    layers), each against cutoffs around its brute-force optimum: a cutoff
    at or below the optimum is settled (nothing beats it), one above returns
    the optimum; the tables' root bound, tried before every split's bound,
    settles some of them alone. A root bound above the optimum, or a
    settled point whose optimum is below the cutoff, fails here."""
    cheap = split_search._cheap_bounded
    calls = []
    monkeypatch.setattr(split_search, "_cheap_bounded", lambda *a: (calls.append(1), cheap(*a))[1])
    by_root = 0
    for seed in range(24):
        rng = np.random.default_rng(4200 + seed)
        L, m = int(rng.integers(6, 10)), 2 * int(rng.integers(1, 3))
        costs = _random_point(rng, L, "interleaved-1f1b", 2, 2, m, identical=bool(seed % 3 == 0))
        assert split_search._enumerable(costs, "interleaved-1f1b", 2, 2)
        times = [simulate_times("interleaved-1f1b", 2, m, 2, costs.stage_times((0, *cut, L)))[0]
                 for cut in itertools.combinations(range(1, L), 3) if costs.split_fits((0, *cut, L))]
        if not times:
            continue
        best = min(times)
        for factor in (0.5, 0.9, 1.0, 1.05, 2.0):
            calls.clear()
            found = exact_split(costs, "interleaved-1f1b", 2, 2, cutoff_s=best * factor)
            if factor <= 1.0:
                assert found.exact and found.best_time_s >= best * factor, (seed, factor)
                by_root += not calls
            else:
                assert found.exact and found.best_time_s == pytest.approx(best, rel=1e-12), (seed, factor)
    assert by_root > 0
