"""The search's use of schedules other than GPipe and 1F1B: in-flight counts,
refusals, and plans that replay in the simulator."""

from __future__ import annotations

import pytest

from pipesearch.hardware import load_cluster
from pipesearch.models import load_model_source
from pipesearch.schedules import build, chunk_states_of, in_flight_peaks
from pipesearch.search import search
from pipesearch.in_flight import schedule_chunk_states, schedule_in_flight
from pipesearch.point_plan import simulate_plan
from pipesearch.search_options import SearchOptions
from pipesearch.search_space import schedule_refusal
from pipesearch.types import Job


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_zb_h1_in_flight_closed_form_matches_builder(p):
    """ZB-H1 keeps min(m, p) micro-batches on every stage (Qi et al. 2023: the
    same peak as 1F1B's first stage), read off the builder's own lists."""
    for m in range(p, 4 * p + 1):
        assert tuple(schedule_in_flight("zb-h1", p, m, 1)) == in_flight_peaks(build("zb-h1", p, m))


@pytest.mark.parametrize("p,v", [(2, 2), (3, 2), (4, 2), (4, 3), (8, 2)])
def test_interleaved_in_flight_saturates_at_2p(p, v):
    """The search computes interleaved count states at min(m, 2p): beyond
    that the warm-up depth (v-1)p + 2(p-1-r) no longer grows, so the states
    (and each chunk's own peak, their maximum) are those of the whole list."""
    for m in range(p, 6 * p + 1, p):
        states = schedule_chunk_states("interleaved-1f1b", p, m, v)
        walked = chunk_states_of("interleaved-1f1b", p, m, v)
        for r in range(p):
            assert {tuple(x) for x in states[r] if any(x)} == {x for x in walked[r] if any(x)}, (p, v, m, r)
        assert tuple(schedule_in_flight("interleaved-1f1b", p, m, v)) == in_flight_peaks(
            build("interleaved-1f1b", p, m, v))


def test_interleaved_p8_v3_rank0_holds_31_chunk_micro_batches():
    """Megatron-LM's interleaved order, p = 8, v = 3, m = 16 (by hand): rank 0
    runs 2(p-1) + (v-1)p = 30 warm-up forwards, micro-batches taken p at a
    time per chunk (0-7 chunk 0, 8-15 chunk 1, 16-23 chunk 2, 24-29 chunk 0),
    then one steady-state forward (chunk 0) before its first backward:
    31 = p v + p - 1 held at once, 15 of chunk 0 and 8 each of chunks 1, 2.
    Then each backward of chunk 2 is followed by a forward of chunk 0 until
    chunk 0 holds 16: (16, 8, 7); later chunk 1's forwards replace chunk 2's
    (16, 9, 6) ... (16, 15, 0). The chunks' own peaks (16, 15, 8) happen at
    different times (their sum 39 over-counts by 8); a chunk 0 saving more
    bytes per micro-batch than chunk 2 peaks at (16, 8, 7), not at the
    moment of the most micro-batches."""
    states = {tuple(x) for x in schedule_chunk_states("interleaved-1f1b", 8, 16, 3)[0]}
    assert states == {(15, 8, 8)} | {(16, 8 + k, 7 - k) for k in range(8)}
    got = schedule_in_flight("interleaved-1f1b", 8, 16, 3)
    assert (got[0], got[8], got[16]) == (16, 15, 8)
    assert max(sum(x) for x in states) == 31 == 8 * 3 + 8 - 1
    own = in_flight_peaks(build("interleaved-1f1b", 8, 16, 3))
    assert own[0] + own[8] + own[16] == 39


def test_zb_h1_after_input_gradient_only_weight_gradient_inputs_remain():
    """ZB-H1, p = 4, by hand: rank r delays each W by r steps, so at its peak
    it holds p - r micro-batches whole and r past their input gradient; with
    h = 1/2 of a micro-batch kept for W that is p - r/2 = 4, 3.5, 3, 2.5
    (1F1B's stage-0 peak p = 4 on every rank when h = 1)."""
    assert tuple(schedule_in_flight("zb-h1", 4, 12, 1, held_after_input=0.5)) == (4.0, 3.5, 3.0, 2.5)
    assert tuple(schedule_in_flight("zb-h1", 4, 12, 1)) == (4.0, 4.0, 4.0, 4.0)
    # W inputs larger than the saved block input (full recompute): 1 + 2 after rank 0's first I
    assert schedule_in_flight("zb-h1", 4, 12, 1, held_after_input=2.0)[0] == 4 - 1 + 2


def test_refusals_follow_the_runtimes():
    assert schedule_refusal("1f1b", 4, 3, 1, 40) == "schedule_refused"  # torch Schedule1F1B: m >= stages
    assert schedule_refusal("gpipe", 4, 3, 1, 40) is None
    assert schedule_refusal("interleaved-1f1b", 4, 6, 2, 40) == "schedule_refused"  # Megatron: m % pp
    assert schedule_refusal("interleaved-1f1b", 4, 8, 2, 40) is None
    assert schedule_refusal("interleaved-1f1b", 4, 8, 2, 7) == "too_many_stages"  # 8 virtual stages, 7 layers


def test_every_schedule_yields_a_plan_that_replays():
    """Each schedule pinned on a real model gives a plan whose simulated time
    is positive and whose stages tile the layers (pp*vp stages for
    interleaved and looped BFS, on ranks s % pp)."""
    cluster = load_cluster("1x8-a100-80gb")
    src = load_model_source("gpt3-1.3b", cluster, tp=1, recompute="selective")
    L = src.variants[0].profile.num_layers
    for schedule in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs"):
        res = search(list(src.variants), cluster, Job(64), SearchOptions(
            pp=4, dp=2, schedules=(schedule,), micro_batch_size=1, top=1))
        plan = res.plans[0]
        vp = 2 if schedule in ("interleaved-1f1b", "looped-bfs") else 1
        assert plan.schedule == schedule and plan.vp == vp and len(plan.stages) == 4 * vp
        assert plan.stages[0].layers[0] == 0 and plan.stages[-1].layers[1] == L
        assert all(a.layers[1] == b.layers[0] for a, b in zip(plan.stages, plan.stages[1:]))
        assert all(st.devices == plan.stages[st.index % 4].devices for st in plan.stages)
        # the plan's time (levelled longest-path evaluator) equals the discrete-event replay
        t, timeline = simulate_plan(plan)
        assert t == pytest.approx(plan.predicted.iteration_time_s, rel=1e-9)
        assert timeline.num_ranks == 4


def test_interleaving_cuts_the_bubble_on_a_balanced_model():
    """On uniform blocks with few micro-batches the interleaved schedule's
    simulated iteration is shorter than 1F1B's: its bubble is (p-1)/(v m) of
    the ideal time instead of (p-1)/m (Narayanan et al. SC'21)."""
    cluster = load_cluster("1x8-a100-80gb")
    src = load_model_source("gpt3-1.3b", cluster, tp=1, recompute="none")
    opts = dict(pp=4, dp=1, micro_batch_size=1, top=1)
    one = search(list(src.variants), cluster, Job(8), SearchOptions(schedules=("1f1b",), **opts)).plans[0]
    inter = search(list(src.variants), cluster, Job(8), SearchOptions(schedules=("interleaved-1f1b",), **opts)).plans[0]
    assert inter.predicted.iteration_time_s < one.predicted.iteration_time_s


def test_interleaved_plan_that_fits_its_simultaneous_peak_is_accepted():
    """24 equal layers (state 1 MiB, saved activations 1 MiB per micro-batch
    each), pp 8, vp 3, m 16, one layer per chunk: a device holds 3 MiB of
    state and, by hand (see above), 15 + 8 + 8 = 31 chunk-micro-batches of
    activations at once: 34 MiB. With 36 MiB usable the plan fits; summing
    the chunks' own peaks (16 + 15 + 8 = 39, 42 MiB) would refuse it. With
    33 MiB usable nothing fits."""
    from helpers import tiny_cluster, tiny_profile

    MiB = 2**20
    prof = tiny_profile([1e-3] * 24, params=[MiB / 16 * 4] * 24, saved=[MiB] * 24, outputs=[MiB] * 24)
    opts = SearchOptions(pp=8, dp=1, micro_batch_size=1, num_micro_batches=16, schedules=("interleaved-1f1b",),
                         vps=(3,), top=1)
    from pipesearch.search_options import ModelVariant

    fits = search([ModelVariant(prof)], tiny_cluster(1, 8, memory_bytes=36 * MiB), Job(16, memory_reserve_bytes=0),
                  opts).plans[0]
    assert fits.layers_per_stage == (1,) * 24
    assert fits.predicted.peak_memory_bytes == pytest.approx(34 * MiB)
    with pytest.raises(Exception, match="no plan fits"):
        search([ModelVariant(prof)], tiny_cluster(1, 8, memory_bytes=33 * MiB), Job(16, memory_reserve_bytes=0), opts)


def test_interleaved_chunk_states_p2_v2_by_hand():
    """Megatron's interleaved order for p = 2, v = 2, m = 4 walked by hand
    (warm-up min((v-1)p + 2(p-1-r), mv): 4 forwards on rank 0, 2 on rank 1;
    virtual micro-batch k is chunk (k mod 4) // 2 forward, reversed
    backward). Rank 0 holds (chunk 0, chunk 1) = (2, 2) after its warm-up,
    then (3, 2), (3, 1), (4, 1), (4, 0), (4, 1), (3, 1), (3, 2), (2, 2), ...:
    the states no other reaches in both chunks are (3, 2) and (4, 1), equal
    in micro-batches (5), so a chunk 0 saving more bytes than chunk 1 peaks
    at (4, 1), the other way at (3, 2). Rank 1 reaches (2, 1) and (3, 0)."""
    states = chunk_states_of("interleaved-1f1b", 2, 4, 2)
    assert set(states[0]) == {(3.0, 2.0), (4.0, 1.0)}
    assert set(states[1]) == {(2.0, 1.0), (3.0, 0.0)}
    # each chunk's own peak, the search's per-stage count: stage c p + r is chunk c of rank r
    assert tuple(schedule_in_flight("interleaved-1f1b", 2, 4, 2)) == (4.0, 3.0, 2.0, 1.0)


@pytest.mark.parametrize("v", (1, 2, 3))
def test_undominated_states_are_those_no_other_reaches(v):
    """Random sets of count vectors (with ties and repeats in each
    component): the states kept are exactly those no other state reaches
    in every component (checked against every pair), in decreasing order
    of their total, ties by the vector; the two-chunk sweep and the general
    rule agree with it."""
    import random

    from pipesearch.schedules import _undominated

    rng = random.Random(v)
    for _ in range(500):
        states = {tuple(float(rng.choice((0, 0.5, 1, 2, 3, 4))) for _ in range(v)) for _ in range(rng.randint(1, 25))}
        kept = [x for x in states if not any(y != x and all(b >= a for a, b in zip(x, y)) for y in states)]
        assert _undominated(states) == sorted(kept, key=lambda y: (-sum(y), y))
