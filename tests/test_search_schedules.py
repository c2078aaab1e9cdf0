"""The search's use of schedules other than GPipe and 1F1B: in-flight counts,
refusals, and plans that replay in the simulator."""

from __future__ import annotations

import pytest

from pipesearch.hardware import load_cluster
from pipesearch.models import load_model_source
from pipesearch.schedules import build, in_flight_peaks, simultaneous_in_flight
from pipesearch.search import SearchOptions, schedule_in_flight, schedule_refusal, search, simulate_plan
from pipesearch.types import Job


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_zb_h1_in_flight_closed_form_matches_builder(p):
    """ZB-H1 keeps min(m, p) micro-batches on every stage (Qi et al. 2023: the
    same peak as 1F1B's first stage), read off the builder's own lists."""
    for m in range(p, 4 * p + 1):
        assert tuple(schedule_in_flight("zb-h1", p, m, 1)) == in_flight_peaks(build("zb-h1", p, m))


@pytest.mark.parametrize("p,v", [(2, 2), (3, 2), (4, 2), (4, 3), (8, 2)])
def test_interleaved_in_flight_saturates_at_2p(p, v):
    """The search computes interleaved simultaneous peaks at min(m, 2p):
    beyond that the warm-up depth (v-1)p + 2(p-1-r) no longer grows, so the
    counts are equal."""
    for m in range(p, 6 * p + 1, p):
        assert tuple(schedule_in_flight("interleaved-1f1b", p, m, v)) == simultaneous_in_flight(
            build("interleaved-1f1b", p, m, v))


def test_interleaved_p8_v3_rank0_holds_31_chunk_micro_batches():
    """Megatron-LM's interleaved order, p = 8, v = 3, m = 16 (by hand): rank 0
    runs 2(p-1) + (v-1)p = 30 warm-up forwards, micro-batches taken p at a
    time per chunk (0-7 chunk 0, 8-15 chunk 1, 16-23 chunk 2, 24-29 chunk 0),
    then one steady-state forward (chunk 0) before its first backward:
    31 = p v + p - 1 held at once, 15 of chunk 0 and 8 each of chunks 1, 2.
    The chunks' own peaks (16, 15, 8) happen at different times; their sum
    39 over-counts by 8."""
    got = schedule_in_flight("interleaved-1f1b", 8, 16, 3)
    assert (got[0], got[8], got[16]) == (15, 8, 8)
    assert got[0] + got[8] + got[16] == 31 == 8 * 3 + 8 - 1
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
    from pipesearch.search import ModelVariant

    fits = search([ModelVariant(prof)], tiny_cluster(1, 8, memory_bytes=36 * MiB), Job(16, memory_reserve_bytes=0),
                  opts).plans[0]
    assert fits.layers_per_stage == (1,) * 24
    assert fits.predicted.peak_memory_bytes == pytest.approx(34 * MiB)
    with pytest.raises(Exception, match="no plan fits"):
        search([ModelVariant(prof)], tiny_cluster(1, 8, memory_bytes=33 * MiB), Job(16, memory_reserve_bytes=0), opts)
