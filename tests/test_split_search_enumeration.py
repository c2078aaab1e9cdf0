"""The enumeration of few splits in bound order and the per-split bounds it
sorts by, checked by brute force on small instances.

* :func:`pipesearch.split_bounds.split_lower_bounds` equals, split by split,
  the largest family of :func:`pipesearch.split_bounds.bound_families`
  evaluated from the definitions of its docstring (a loop over the stages),
  and is at most the split's time replayed in the discrete-event simulator.
* :func:`pipesearch.split_search.exact_split` on interleaved 1F1B points
  with few splits (settled by enumeration, only the splits whose bound is
  below the best or the cutoff simulated) returns the split a full
  enumeration picks: the least time, and among the splits within the tie
  window the one of the tie-break; with a cutoff below the optimum it says
  that no split beats the cutoff, with one above it the same split.
* The search evaluates the points of the chain schedules (interleaved 1F1B,
  ZB-H1) after the others; the ranked plans are those of the search that
  evaluates every point in bound order.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from helpers import tied_or_random_profile, tiny_cluster, tiny_profile
from pipesearch import search as search_lib
from pipesearch import split_evaluator
from pipesearch import split_search
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.in_flight import schedule_chunk_states
from pipesearch.schedules import build, in_flight_peaks, num_stages_of
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.split_search import exact_split
from pipesearch.split_bounds import bound_families, split_lower_bounds
from pipesearch.timemodel import iteration_time_s, simulate_times
from pipesearch.types import Job, Link

CASES = (("interleaved-1f1b", 2), ("zb-h1", 1), ("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 3))
GIB = 2**30


def _point(seed: int, memory_cap: bool = False):
    """A seeded instance: schedule, ``pp``, ``vp`` and PipelineCosts, with
    identical layers (and a random head: ties everywhere) for even seeds and
    random layers for odd ones; random links and all-reduce; with
    ``memory_cap`` a device memory that refuses some splits."""
    rng = np.random.default_rng(seed)
    schedule, vp = CASES[seed % len(CASES)]
    pp = int(rng.integers(2, 4)) if vp < 3 else 2
    S = num_stages_of(schedule, pp, vp)
    L = int(rng.integers(S + 1, min(S + 5, 10) + 1))
    m = pp * int(rng.integers(1, 4)) if schedule == "interleaved-1f1b" else int(rng.integers(pp, pp + 5))
    prof, params, outputs = tied_or_random_profile(rng, L, seed % 2 == 0)
    link = Link(float(rng.choice([1e8, 1e9, 1e10])), float(rng.choice([0, 1e-4])))
    memory = float(params.sum()) * 2.0 * 3.0 / S + float(outputs.max()) * 2 * m if memory_cap else 1e12
    cluster = tiny_cluster(1, 2 * pp, memory_bytes=memory, intra=link, inter=link)
    job = Job(global_batch_size=2 * m, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    costs = build_pipeline_costs(prof, cluster, job, pp=S, dp=2, micro_batch_size=1, num_micro_batches=m,
                                 schedule="gpipe", placement=pipeline_placement(pp, 2)[np.arange(S) % pp],
                                 in_flight=np.array(in_flight_peaks(build(schedule, pp, m, vp))),
                                 stages_per_device=vp)
    return schedule, pp, vp, costs


def _splits(L: int, S: int) -> np.ndarray:
    return np.array([(0, *cut, L) for cut in itertools.combinations(range(1, L), S - 1)], dtype=np.int64)


def _family_value(fam, S: int, pp: int) -> float:
    """One family on one complete split, each component from its definition
    in :func:`bound_families` (a loop over the ``S`` stages)."""
    total = 0.0
    for kind, alpha, beta in fam:
        a = None if alpha is None else np.broadcast_to(alpha, (S,)).astype(float)
        b = None if beta is None else np.broadcast_to(beta, (S,)).astype(float)
        if kind == "sum":
            total += sum(a[k] for k in range(S))
        elif kind == "max":
            total += max(b[k] for k in range(S))
        elif kind == "prefix":
            total += max(sum(a[:k]) + b[k] for k in range(S))
        elif kind == "suffix":
            total += max(b[k] + sum(a[k + 1:]) for k in range(S))
        else:  # device: stage k on rank k % pp
            total += max(sum(b[k] for k in range(q, S, pp)) for q in range(pp))
    return total


@pytest.mark.parametrize("seed", range(30))
def test_split_lower_bounds_are_the_families_and_at_most_the_time(seed):
    """Every split of the instance: the vectorised bound equals the largest
    family evaluated one split and one stage at a time (with and without the
    chain families), and it is at most the simulated time. A component
    reduced over the wrong axis, a rank's stages gathered wrongly (the
    ``device`` reshape) or a prefix / suffix off by one stage breaks the
    equality; a family that is not a path of the schedule's graph breaks the
    inequality."""
    schedule, pp, vp, costs = _point(seed)
    S, L, m = costs.pp, costs.num_layers, costs.num_micro_batches
    splits = _splits(L, S)
    for chains in (False, True):
        got = split_lower_bounds(costs, schedule, pp, splits, chains=chains)
        for bounds, lb in zip(splits, got):
            s, i, j = np.arange(S), bounds[:-1], bounds[1:]
            fams = bound_families(costs, schedule, pp, s, i, j, chains=chains)
            want = max(_family_value(fam, S, pp) for fam in fams)
            assert lb == pytest.approx(want, rel=1e-12, abs=1e-15)
            if chains:
                t, _ = simulate_times(schedule, pp, m, vp, costs.stage_times(bounds))
                assert lb <= t * (1 + 1e-9) + 1e-15


def _enumerated_choice(costs, schedule: str, pp: int, vp: int):
    """``(split, time)`` picked from every split that fits, each simulated
    by the vectorised time model: the least time, and among those within the
    tie window the tie-break's first (``_tie_key``: peak memory, link time)."""
    S, L, m = costs.pp, costs.num_layers, costs.num_micro_batches
    splits = [tuple(int(x) for x in b) for b in _splits(L, S) if costs.split_fits(b)]
    times = iteration_time_s(schedule, pp, m, vp, costs.stage_times(np.array(splits)))
    best = float(np.min(times))
    near = [b for b, t in zip(splits, times) if t <= best * (1 + split_search.EQUAL_TIME_REL)]
    chosen = min(near, key=lambda b: split_search._tie_key(costs, b, float(times[splits.index(b)])))
    return chosen, best


@pytest.mark.parametrize("seed", [0, 4, 5, 9, 10, 14, 15, 19, 20, 24, 25, 29])
@pytest.mark.parametrize("memory_cap", [False, True])
def test_enumeration_in_bound_order_is_the_full_enumeration(seed, memory_cap):
    """Interleaved 1F1B points with few splits: the split and time equal
    those of simulating every split; a cutoff just above the optimum gives
    the same split, one just below it a proof that nothing beats it (time at
    least the cutoff, exact). Stopping before a split within the tie window
    changes the split on tied instances (even seeds); stopping at a bound
    above the cutoff instead of the best, or sorting the wrong way, misses
    the optimum."""
    schedule, pp, vp, costs = _point(seed, memory_cap)
    assert schedule == "interleaved-1f1b"
    if not any(costs.split_fits(b) for b in _splits(costs.num_layers, costs.pp)):
        pytest.skip("no split fits")
    chosen, best = _enumerated_choice(costs, schedule, pp, vp)
    for cutoff in (np.inf, best * (1 + 1e-6)):
        found = exact_split(costs, schedule, pp, vp, cutoff_s=cutoff)
        assert found.exact
        assert found.bounds == chosen
        assert found.best_time_s == pytest.approx(best, rel=1e-12)
    below = exact_split(costs, schedule, pp, vp, cutoff_s=best * (1 - 1e-6))
    assert below.exact and below.best_time_s >= best * (1 - 1e-6)
    assert below.lower_bound_s == pytest.approx(best * (1 - 1e-6), rel=1e-12)


def test_enumeration_simulates_only_splits_below_the_best():
    """On random layers the bound excludes most splits: fewer splits are
    simulated than fit (an enumeration that simulates every split fails)."""
    schedule, pp, vp, costs = _point(5)
    fitting = sum(costs.split_fits(b) for b in _splits(costs.num_layers, costs.pp))
    found = exact_split(costs, schedule, pp, vp)
    assert found.exact and found.splits_evaluated < fitting



@pytest.mark.parametrize("seed", [0, 4, 5, 9])
def test_cutoff_below_every_bound_simulates_nothing(seed):
    """A cutoff below the least per-split bound of the splits that fit (the
    bounds taken from the families' definitions, split by split): the point
    is settled (exact, nothing beats the cutoff) without simulating any
    split, not even the starting ones; a cutoff just above that least bound
    is not settled that way (the split with that bound may beat it, so at
    least one split is simulated). An early exit that ignored the tie
    window or read the bounds of splits that do not fit fails the second."""
    schedule, pp, vp, costs = _point(seed)
    splits = [b for b in _splits(costs.num_layers, costs.pp) if costs.split_fits(b)]
    S = costs.pp
    least = min(max(_family_value(fam, S, pp) for fam in bound_families(
        costs, schedule, pp, np.arange(S), np.array(b[:-1]), np.array(b[1:]))) for b in splits)
    below = exact_split(costs, schedule, pp, vp, cutoff_s=least * (1 - 1e-3))
    assert below.exact and below.splits_evaluated == 0 and below.best_time_s == np.inf
    above = exact_split(costs, schedule, pp, vp, cutoff_s=least * (1 + 1e-3))
    assert above.splits_evaluated >= 1

def _two_node_search(seed: int, L: int):
    """``(profile, cluster, job, options)``: ``L`` random layers with
    weights worth all-reducing on 2 x 4 devices with slow links between the
    nodes, a batch of 64, every default schedule, the top 6."""
    rng = np.random.default_rng(seed)
    prof = tiny_profile(list(rng.uniform(1e-3, 8e-3, L)), params=list(rng.uniform(0, 4e8, L)),
                        outputs=list(rng.uniform(1e6, 4e7, L)), saved=list(rng.uniform(1e8, 6e8, L)), batch_size=8)
    cluster = tiny_cluster(2, 4, memory_bytes=24 * GIB, intra=Link(1e10, 1e-5), inter=Link(1.25e9, 5e-5))
    return prof, cluster, Job(64, memory_reserve_bytes=GIB), SearchOptions(
        schedules=("gpipe", "1f1b", "interleaved-1f1b", "zb-h1"), top=6)


@pytest.mark.parametrize("seed", [0, 1])
def test_deferred_interleaved_points_keep_the_ranked_plans(seed, monkeypatch):
    """A 12-layer model on 2 x 4 devices with slow links between nodes and
    weights worth all-reducing, every schedule: the ranked plans (family,
    split, time) are those of the search that evaluates the points in bound
    order without deferring the chain schedules (the order only moves the
    cutoff); an interleaved plan ranks among them. A deferred point never
    evaluated, or evaluated against a cutoff it cannot be held to, changes
    the table."""
    prof, cluster, job, options = _two_node_search(seed, 12)

    def ranked():
        res = search([ModelVariant(prof)], cluster, job, options)
        return [(p.pp, p.dp, p.vp, p.schedule, p.num_micro_batches, tuple(s.layers for s in p.stages),
                 p.predicted.iteration_time_s) for p in res.plans]

    deferred = ranked()
    assert any(plan[3] == "interleaved-1f1b" for plan in deferred)  # it competes for the table
    monkeypatch.setattr(search_lib, "DEFERRED_SCHEDULES", ())
    assert ranked() == deferred


@pytest.mark.parametrize("seed", [1, 2, 3, 6, 7, 8, 11, 12, 13])
@pytest.mark.parametrize("memory_cap", [False, True])
def test_cutoff_proof_by_per_split_bounds(seed, memory_cap, monkeypatch):
    """Points of at most :data:`PROOF_SPLITS` splits (1F1B, ZB-H1, GPipe):
    with a cutoff just below the simulated optimum (every split simulated)
    the search proves that nothing beats it; with one just above it finds
    the optimum, and the answers equal those without the per-split proof.
    A proof from a split's bound instead of the least one over the splits
    that fit excludes a point that holds the optimum."""
    schedule, pp, vp, costs = _point(seed, memory_cap)
    assert schedule != "interleaved-1f1b"
    if not any(costs.split_fits(b) for b in _splits(costs.num_layers, costs.pp)):
        pytest.skip("no split fits")
    _, best = _enumerated_choice(costs, schedule, pp, vp)
    for cutoff in (best * (1 - 1e-6), best * (1 + 1e-6)):
        with_proof = exact_split(costs, schedule, pp, vp, cutoff_s=cutoff)
        monkeypatch.setattr(split_search, "PROOF_SPLITS", 0)
        without = exact_split(costs, schedule, pp, vp, cutoff_s=cutoff)
        monkeypatch.undo()
        assert with_proof.exact and without.exact
        if cutoff < best:
            assert with_proof.best_time_s >= cutoff and without.best_time_s >= cutoff
        else:
            assert with_proof.best_time_s == pytest.approx(best, rel=1e-12)
            assert with_proof.bounds == without.bounds


@pytest.mark.parametrize("seed", [0, 1, 2, 4, 5, 6, 9, 10, 11])
def test_path_before_every_all_reduce_bounds_every_split(seed):
    """The two families before every all-reduce: the longest path, in one
    split, to a node from which every rank's last action is reached
    (:func:`pipesearch.timemodel.path_before_all_reduces`), and the busiest
    rank's actions that node follows
    (:func:`pipesearch.timemodel.rank_work_before`), each plus the largest
    stage all-reduce. The nodes it may end at are those whose descendants
    (networkx, from the graph's edges) hold every rank's last action; the
    counts of actions are those of the node's networkx ancestors; and for
    every split of the instance both values, from the definitions, are at
    most the time of the discrete-event simulator. A node set that admits a
    node some rank's last action does not follow (its all-reduce could then
    start before the path ends) fails the first; counting transfers or the
    node's descendants fails the second; a family that is not a lower bound
    fails the last."""
    import networkx as nx

    from pipesearch import timemodel

    schedule, pp, vp, costs = _point(seed)
    if schedule == "gpipe":  # no graph: GPipe has its closed form
        pytest.skip("GPipe")
    S, L, m = costs.pp, costs.num_layers, costs.num_micro_batches
    g = timemodel._graph(schedule, pp, m, vp)
    N = len(g.col)
    edges = nx.DiGraph()
    edges.add_nodes_from(range(N))
    edges.add_edges_from((int(p), n) for n in range(N) for p in (g.pred1[n], g.pred2[n]) if p < N)
    lasts = [int(x) for x in g.last_of_rank]
    want = np.array([all(q == n or q in nx.descendants(edges, n) for q in lasts) for n in range(N)])
    assert np.array_equal(g.before_every_last, want)
    splits = _splits(L, S)
    start = splits[len(splits) // 2]
    _, ends = timemodel.graph_ends(schedule, pp, m, vp, costs.stage_times(start))
    coef = timemodel.path_before_all_reduces(g, ends.reshape(len(ends), -1)[:, 0], S)
    assert coef is not None and not coef[5].any()
    node = timemodel.node_before_all_reduces(g, ends.reshape(len(ends), -1)[:, 0])
    work = timemodel.rank_work_before(g, node, S)
    before = sorted(n for n in nx.ancestors(edges, node) | {node} if g.col[n] < 4 * S)  # actions, not transfers
    for bounds in splits:
        s, i, j = np.arange(S), bounds[:-1], bounds[1:]
        F, B, I = costs.fwd_s(s, i, j), costs.bwd_s(s, i, j), costs.bwd_input_s(s, i, j)
        c = costs.send_s(s, j)
        terms = (F, B, I, B - I, c, costs.after_backward_s(s, i, j))
        largest_r = float(np.max(terms[5]))
        value = sum(float(np.dot(coef[k], terms[k])) for k in range(6)) + largest_r
        # each rank's busy time before the node: its ancestors' durations (blocking sends included) on its chain
        dur = timemodel._durations(g, costs.stage_times(bounds))[:, 0]
        rank_of = g.col[before] % S % pp
        busiest = max(float(dur[before][rank_of == q].sum()) for q in range(pp))
        cin = np.concatenate([[0.0], c[:-1]])
        per_stage = sum(work[k] * t for k, t in enumerate((F, B, I, B - I, c, cin)))
        assert max(float(per_stage[q::pp].sum()) for q in range(pp)) == pytest.approx(busiest, rel=1e-12)
        t, _ = simulate_times(schedule, pp, m, vp, costs.stage_times(bounds))
        assert value <= t * (1 + 1e-9) + 1e-15
        assert busiest + largest_r <= t * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("seed", range(6))
def test_looped_bfs_enumeration_with_devices_over_their_memory(seed):
    """Looped BFS (several stages per device, not a chain schedule): a device
    cap that refuses some splits whose every stage fits. The enumeration
    (run directly) settles the point at the least simulated time over the
    splits that fit every stage and every device, from simulating them all
    (it crashed, its bounds not filtered with the splits, and could
    evaluate them out of order)."""
    rng = np.random.default_rng(100 + seed)
    pp, vp, m = 2, 2, 4
    S = pp * vp
    L = int(rng.integers(S + 2, S + 5))
    prof, params, outputs = tied_or_random_profile(rng, L, seed % 2 == 0)
    chunks = build("looped-bfs", pp, m, vp)
    link = Link(1e9, 1e-4)
    states = schedule_chunk_states("looped-bfs", pp, m, vp)

    def costs_with(memory):
        cluster = tiny_cluster(1, pp, memory_bytes=memory, intra=link, inter=link)
        job = Job(global_batch_size=m, state_bytes_per_param=2.0, memory_reserve_bytes=0)
        return build_pipeline_costs(prof, cluster, job, pp=S, dp=1, micro_batch_size=1, num_micro_batches=m,
                                    schedule="looped-bfs", placement=pipeline_placement(pp, 1)[np.arange(S) % pp],
                                    in_flight=np.array(in_flight_peaks(chunks)), stages_per_device=vp,
                                    chunk_states=states)

    splits = _splits(L, S)
    roomy = costs_with(1e15)
    peaks = roomy.device_memory_bytes(splits).max(axis=1)  # each split's fullest device
    cap = float(np.quantile(peaks, 0.5))  # about half the splits leave a device over it
    costs = costs_with(cap + float(roomy.fixed_bytes(0)))
    fit = [tuple(b) for b in splits.tolist() if costs.split_fits(b) and np.all(costs.device_fits(np.array([b])))]
    assert 0 < len(fit) < len(splits)
    best = min(float(iteration_time_s("looped-bfs", pp, m, vp, costs.stage_times(np.array(b)))) for b in fit)
    ev = split_evaluator.SplitEvaluator(costs, "looped-bfs", pp, vp)
    assert split_search._enumerate_all(costs, "looped-bfs", pp, vp, ev)
    assert set(ev.times) <= set(fit)
    assert min(ev.times.values()) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("memory_cap", [False, True])
def test_starting_splits_kept_from_a_seeds_only_call_leave_the_answer(seed, memory_cap, monkeypatch):
    """``exact_split`` after a ``seeds_only`` call on the same point, the two
    sharing a ``cache``: the same answer (split, times, bound, exactness and
    splits simulated) as a call without one, with no cutoff and with one just
    above and just below the enumerated optimum, and no starting split found
    again (the analytic optimum, one of them, is not asked for) nor, with
    no cutoff (no proof evaluates splits before them), simulated again. The
    ``seeds_only`` time is the simulator's time of its split, at least the
    optimum. Kept times not counted as fitting (the branch and bound's split
    limit, the no-split answer) change the answer or the count."""
    schedule, pp, vp, costs = _point(seed, memory_cap)
    if not any(costs.split_fits(b) for b in _splits(costs.num_layers, costs.pp)):
        pytest.skip("no split fits")
    _, best = _enumerated_choice(costs, schedule, pp, vp)
    for cutoff in (np.inf, best * (1 + 1e-6), best * (1 - 1e-6)):
        without = exact_split(costs, schedule, pp, vp, cutoff_s=cutoff)
        cache: dict = {}
        seeded = exact_split(costs, schedule, pp, vp, seeds_only=True, cache=cache)
        simulated, _ = simulate_times(schedule, pp, costs.num_micro_batches, vp,
                                      costs.stage_times(np.array(seeded.bounds)))
        assert seeded.iteration_time_s == pytest.approx(simulated, rel=1e-9)
        assert seeded.iteration_time_s >= best * (1 - 1e-12)
        simulated: list = []
        run = split_evaluator.SplitEvaluator.run

        def recording(self, splits, keep=False):
            simulated.extend(tuple(b) for b in splits if tuple(b) not in self.times)
            return run(self, splits, keep)

        with monkeypatch.context() as patched:
            patched.setattr(split_search, "optimal_split", None)  # a starting split searched again fails
            patched.setattr(split_evaluator.SplitEvaluator, "run", recording)
            assert exact_split(costs, schedule, pp, vp, cutoff_s=cutoff, cache=cache) == without
        if not np.isfinite(cutoff):  # (no cutoff proof before the starts): none of them is simulated again
            assert cache["start_run"][0] and not set(simulated) & set(cache["start_run"][0])


def _same_costs(a, b) -> bool:
    """Whether two PipelineCosts hold equal values in every field."""
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            if not (dataclasses.is_dataclass(y) and _same_costs(x, y)):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("seed", [0, 1])
def test_search_hands_each_seeded_point_its_own_costs(seed, monkeypatch):
    """The search keeps the costs and starting splits of the points its
    seed cutoff evaluated, for their own evaluation later: every point
    handed kept work gets the costs its row builds (devices, micro-batches,
    links, all-reduce, memory), and the ranked plans (family, split, time,
    the split search's bound and count) equal those of the search that
    builds every point's costs again. A key that leaves out the micro-batch
    count (or size) hands a point of another micro-batch count its costs."""
    prof, cluster, job, options = _two_node_search(seed, 10)
    checked = []
    evaluate = search_lib._evaluate

    def checking(variant, cluster, job, options, row, *args, seed_work=None, **kwargs):
        if seed_work is not None:
            slots, fresh = search_lib.point_costs(variant, cluster, job, row, *args[:4])
            assert np.array_equal(np.asarray(slots), np.asarray(seed_work[0]))
            assert _same_costs(fresh, seed_work[1]), row
            checked.append(row["placement"])
        return evaluate(variant, cluster, job, options, row, *args, seed_work=seed_work, **kwargs)

    def ranked():
        res = search([ModelVariant(prof)], cluster, job, options)
        return [(p.pp, p.dp, p.vp, p.schedule, p.micro_batch_size, p.num_micro_batches,
                 tuple(s.layers for s in p.stages), p.predicted.iteration_time_s, dict(p.extra)["split_search"])
                for p in res.plans]

    monkeypatch.setattr(search_lib, "_evaluate", checking)
    with_seeds = ranked()
    assert checked  # kept work reaches points
    monkeypatch.setattr(search_lib, "_seed_key", lambda variant, row: None)
    assert ranked() == with_seeds
