"""The round-trip families of 1F1B and ZB-H1 (``split_bounds.round_trip_counts``):
a path of each schedule's dependency graph, so never above the simulated time;
exact on a hand-worked instance where no other family is."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import tiny_cluster, tiny_profile
from pipesearch import split_bounds
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.timemodel import StageTimes, iteration_time_s
from pipesearch.types import Job, Link


def _terms(F, B, I, c, r):
    """``split_stage_terms``' tuple from per-stage arrays (``c`` per boundary)."""
    c_out = np.append(c, 0.0)
    return F, B, I, c_out, np.concatenate([[0.0], c]), r


def _round_trips(schedule: str, m: int, F, B, I, c, r) -> np.ndarray:
    """Each round-trip family's value on one split (``(families,)``)."""
    S = len(F)
    return np.array([a.sum() for a in split_bounds._round_trip_terms(
        schedule, m, S, np.arange(S), _terms(F, B, I, c, r), split_bounds.round_trip_pairs_within(S))])


def _simulated(schedule: str, m: int, F, B, I, c, r) -> float:
    t = StageTimes(fwd_s=F, bwd_s=B, bwd_input_s=I, p2p_s=c, allreduce_s=r)
    return float(np.squeeze(iteration_time_s(schedule, len(F), m, 1, t)))


def test_zb_h1_round_trips_over_a_slow_link_by_hand():
    """ZB-H1, three stages, F = I = W = 1, m = 9, transfers free but a link
    of 5 between stages 1 and 2. The family of k = 1, k' = 2 (d = 2):
    micro-batch 0 down (F0 F1 c F2 = 8) and back up to stage 1 (I2 c I1 =
    7): 15; then n = (9 - 1 - 3 + 1) // 2 + 1 = 4 round trips of F1 c F2
    I2 c I1 = 14, the last three after a W of rank 1 (its W follow the I of
    micro-batches j >= 1): 59; then rank 1's last 2 W (of its 9, 7 came
    before I of micro-batch J = 8 ends): 76 in all, the simulated time
    (the busiest rank's work is 27)."""
    F, I = np.ones(3), np.ones(3)
    B, c, r = F + I, np.array([0.0, 5.0]), np.zeros(3)
    pairs = split_bounds.round_trip_pairs_within(3)
    counts = split_bounds.round_trip_counts("zb-h1", 3, 9, pairs)
    at = pairs.index((1, 2))
    nF, nG, nW, nc, nr = (x[at].tolist() for x in counts)
    assert (nF, nG, nW, nc, nr) == ([1, 5, 5], [0, 5, 5], [0, 5, 0], [1, 10, 0], [0, 1, 0])
    values = _round_trips("zb-h1", 9, F, B, I, c, r)
    assert values[at] == pytest.approx(76.0)
    assert _simulated("zb-h1", 9, F, B, I, c, r) == pytest.approx(76.0)
    assert values.max() == pytest.approx(76.0)


def test_round_trip_pairs_within_a_span_of_at_most_16_families():
    """Pairs k < k' <= k + 3 of 6 stages: 3 + 3 + 3 + 2 + 1; of 8 stages
    k' <= k + 2: 6 x 2 + 1; of 16 stages neighbours only."""
    assert len(split_bounds.round_trip_pairs_within(6)) == 12
    assert len(split_bounds.round_trip_pairs_within(8)) == 13
    assert split_bounds.round_trip_pairs_within(16) == tuple((k, k + 1) for k in range(15))


def _point(pp: int, vp: int = 1, per_node: int = 4):
    """Costs of 48 layers on ``pp`` ranks of ``per_node``-GPU nodes (intra
    100 GB/s, inter 1 GB/s), one replica, 2 pp micro-batches."""
    cluster = tiny_cluster(-(-pp // per_node), per_node, intra=Link(1e11, 1e-6), inter=Link(1e9, 1e-5))
    job = Job(global_batch_size=2 * pp, memory_reserve_bytes=0)
    S = pp * vp
    return build_pipeline_costs(tiny_profile([1e-3] * 48, outputs=[1e6] * 48), cluster, job, pp=S, dp=1,
                                micro_batch_size=1, num_micro_batches=2 * pp, schedule="gpipe",
                                placement=pipeline_placement(pp, 1)[np.arange(S) % pp], stages_per_device=vp)


def test_round_trips_across_slow_links_only_at_most_16():
    """One stage per rank of 1F1B and ZB-H1 only (none for GPipe or
    interleaved 1F1B, whose orders the path does not walk), and only pairs
    a link between nodes separates: none on one node; on 6 ranks of
    4-GPU nodes those of k' - k <= 3 across the link after stage 3; on 20
    ranks neighbours only, those across nodes; on 40 ranks of 2-GPU nodes
    19 such neighbours, the first 16 kept (the links alike)."""
    assert split_bounds.round_trip_pairs(_point(4), "gpipe", 4) == ()
    assert split_bounds.round_trip_pairs(_point(2, 2), "interleaved-1f1b", 2) == ()
    assert split_bounds.round_trip_pairs(_point(4), "zb-h1", 4) == ()  # one node: every link alike
    assert split_bounds.round_trip_pairs(_point(6), "zb-h1", 6) == ((1, 4), (2, 4), (2, 5), (3, 4), (3, 5))
    assert split_bounds.round_trip_pairs(_point(20), "1f1b", 20) == ((3, 4), (7, 8), (11, 12), (15, 16))
    assert split_bounds.round_trip_pairs(_point(40, per_node=2), "1f1b", 40) == tuple(
        (k, k + 1) for k in range(1, 32, 2))


@settings(max_examples=150, deadline=None)
@given(schedule=st.sampled_from(["1f1b", "zb-h1"]), S=st.integers(2, 5), extra=st.integers(0, 8),
       seed=st.integers(0, 2**31 - 1), slow=st.booleans())
def test_every_round_trip_is_at_most_the_simulated_time(schedule, S, extra, seed, slow):
    """On random stage times (one link up to 20 times slower than compute
    when ``slow``): each family at most the simulator's time. A round trip
    counted once too often, a W on the path before micro-batch k, or the
    rest of rank k counted from the wrong micro-batch overshoots here."""
    rng = np.random.default_rng(seed)
    m = S + extra
    F = rng.uniform(0.1, 2.0, S)
    I = rng.uniform(0.1, 2.0, S)
    B = I + rng.uniform(0.0, 2.0, S)
    c = rng.uniform(0.0, 0.5, S - 1)
    if slow:
        c[rng.integers(S - 1)] = rng.uniform(1.0, 20.0)
    r = rng.uniform(0.0, 3.0, S)
    t = _simulated(schedule, m, F, B, I, c, r)
    assert _round_trips(schedule, m, F, B, I, c, r).max() <= t * (1 + 1e-12)


def test_an_infinite_term_on_a_stage_a_family_does_not_use_leaves_it_finite():
    """An infinite all-reduce on stage 0 (as an out-of-memory stage's time
    would be): the families that end on rank 0 are infinite, the one of k =
    1, k' = 2 ends on rank 1 and runs no all-reduce of stage 0, so it stays
    the finite sum of its actions, not nan (0 x inf)."""
    F, I = np.ones(3), np.ones(3)
    values = _round_trips("zb-h1", 6, F, F + I, I, np.array([1.0, 1.0]), np.array([np.inf, 0.0, 0.0]))
    counts = split_bounds.round_trip_counts("zb-h1", 3, 6, split_bounds.round_trip_pairs_within(3))
    ends_on_rank_0 = counts[4][:, 0] > 0
    assert np.all(np.isinf(values[ends_on_rank_0]))
    assert np.all(np.isfinite(values[~ends_on_rank_0]))
