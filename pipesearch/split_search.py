"""The exact split of one search point for the one time model.

Given the cost terms of a point (:class:`pipesearch.costs.PipelineCosts`) and
its schedule, find boundaries ``0 = x_0 < ... < x_S = L`` minimizing the
simulated iteration time ``T(x)`` (:func:`pipesearch.timemodel.iteration_time_s`)
subject to every stage fitting in its devices' memory.

``T`` is a longest path through the schedule's dependency graph; it has many
max terms (a critical path may dwell on several stages), so no single
min-sum or min-max DP minimizes it. The search is a branch and bound over
the stages, left to right:

* *Bounds.* Several families of paths through the graph give lower bounds
  of ``T`` built from per-stage terms (:func:`pipesearch.split_bounds.bound_families`). A family is
  either ``sum_k alpha_k + sum_c max_k beta_c,k`` ("sum" kind) or
  ``max_k (sum_{k'<k} alpha_k' + beta_k)`` ("prefix" kind). For a partial
  split (stages ``0 .. s-1`` fixed, layers ``[i, L)`` left) the fixed part is
  known exactly and the rest is bounded by suffix minima over all splits of
  ``[i, L)``, computed once per point by a backward DP over a band of stage
  lengths (:class:`pipesearch.bound_tables.SuffixTables`).
* *Stronger bounds where the cheap ones leave work* (interleaved 1F1B and
  ZB-H1, whose identical-layer models leave many splits within the cheap
  bounds' reach): chain families (micro-batch 0 down to a stage, that
  stage's rank up to its last backward there, the gradient back up; the
  longest path of an even split of identical layers) and one weighted sum
  of the one-sum families, weights from a few steps of a subgradient
  ascent of their Lagrangian relaxation (:func:`pipesearch.split_bounds.lagrange_weights`); and the
  path families: the critical paths of the fastest starting splits
  (:func:`pipesearch.timemodel.critical_path`, counts per stage), each the
  sum of its stages' counts times their durations on any split (tight at
  its own split, where the fixed families fall 10-40% short on CNN
  profiles with heavy all-reduce). All are tabulated only for points that
  run the branch and bound. For every
  schedule, children that survive the tables get the rank-counting bound of
  :class:`pipesearch.rank_bounds.RankCount` (each rank's fill, whole work and drain, with the
  layers still to place counted onto the ranks; catches the imbalance that
  whole layers force on identical-layer models).
* *Incumbent.* The best of the even split and the closed-form split of
  :func:`pipesearch.partition.optimal_split`; a search of interleaved 1F1B
  that stops at its limits also evaluates the whole-layer split nearest
  the best free loads (:func:`pipesearch.fluid.fluid_split`), and any
  search that stops descends from the best split met by boundary moves
  (:func:`pipesearch.local_split.improve_split`).
* *Leaves.* Complete splits whose bound is below the incumbent are evaluated
  exactly, in batches (one vectorized longest-path pass per batch), in bound
  order.

A split is discarded only when a valid lower bound of its time is not below
a time already achieved, so the result is optimal for ``T``; the work is
limited by counts (never seconds) and a search that hits them says so and
reports its proven bound, unless the splits are few enough to enumerate
(:func:`_enumerate_all`: each split's bound, :func:`pipesearch.split_bounds.split_lower_bounds`, and
the splits simulated in bound order while one can still beat the best or the
cutoff; interleaved 1F1B's points with few splits go there directly). Before
any split is evaluated, whether every split has a stage whose work and
all-reduce, or a boundary whose transfers, exceed the cutoff
(:func:`pipesearch.split_bounds.stage_or_link_exceeds`, no tables: on the
default plan and resnet50 on 4x4-v100-10gbe it settles 243 of 408 and 332
of 450 points searched against a cutoff, at about a tenth of a table's
cost each), then the per-split bounds (few splits), the root bounds,
the whole-layers-per-rank bound (:func:`pipesearch.rank_bounds.rank_layer_bound_s`) and a first few
nodes try to exclude the point against the cutoff (:func:`_cutoff_proof`).

The parts live in their own modules: the bound families
(:mod:`pipesearch.split_bounds`), their suffix-minimum tables
(:mod:`pipesearch.bound_tables`), whether and how a split fits memory
(:mod:`pipesearch.split_fits`), the whole-layers-per-rank bounds
(:mod:`pipesearch.rank_bounds`), the exact evaluation of splits
(:mod:`pipesearch.split_evaluator`) and the branch and bound itself
(:mod:`pipesearch.branch_and_bound`); this module runs them for one point.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .bound_tables import OWN_FAMILY_SCHEDULES, SuffixTables, tables_fit, width_for
from .branch_and_bound import run_branch_and_bound
from .costs import PipelineCosts
from .fluid import fluid_split
from .fluid_bound import FLUID_BOUND_SCHEDULES, fluid_lower_bound_s
from .local_split import improve_split
from .partition import balanced_split, even_split, optimal_split
from .rank_bounds import RankCount, rank_layer_bound_s
from .rank_splits import rank_bounded_splits
from .split_bounds import (CHAIN_SCHEDULES, PATH_THEN_MAX_R, RANK_WORK_THEN_MAX_R, lagrange_weights,
                           stage_or_link_exceeds, split_lower_bounds)
from .split_evaluator import SplitEvaluator
from .split_fits import any_split_fits, mobius_witness, witness_split
from .timemodel import (COMMON_NODE_GRAPHS, evaluation_cost, graph_ends, iteration_time_s,
                        node_before_all_reduces, path_before_all_reduces, paths_of_ends, rank_work_before,
                        simulate_times)

#: deterministic work limits of :func:`exact_split` (counts, never seconds)
MAX_SPLITS_EVALUATED = 300
MAX_NODES = 3_000
#: the default node count is for bands of at most this many layers per
#: stage; a node of a wider band bounds that many more children, so the
#: count falls in proportion (:func:`node_budget`)
NODE_WIDTH = 128
#: and for profiles of at most this many layers (every catalog model); a
#: longer one's node bounds and tables cover that many more layers, so the
#: count falls in proportion too
NODE_LAYERS = 128
#: nodes of a first branch and bound against the cutoff alone, before any
#: starting split is evaluated (most points of a search are excluded there)
FIRST_NODES = 8
#: splits within this relative time of the best (equal up to rounding) are tie-broken
EQUAL_TIME_REL = 1e-12


@dataclass(frozen=True)
class ExactSplit:
    """The best split of one search point for the simulated iteration time.

    Attributes:
        bounds: boundaries of the chosen split (length ``S + 1``).
        iteration_time_s: its time under :func:`pipesearch.timemodel.iteration_time_s`.
        best_time_s: the smallest time found (``iteration_time_s`` exceeds it
            by at most :data:`EQUAL_TIME_REL` when a near-tie had less memory).
        lower_bound_s: proven lower bound on the time of every split of the
            point; ``best_time_s`` when the search was complete.
        exact: whether every split was evaluated or excluded by a bound.
        splits_evaluated: splits whose time was evaluated.
        nodes: branch-and-bound nodes expanded.
    """

    bounds: tuple[int, ...]
    iteration_time_s: float
    best_time_s: float
    lower_bound_s: float
    exact: bool
    splits_evaluated: int
    nodes: int

    @property
    def gap(self) -> float:
        """``(best - bound) / best``; 0 for a complete search."""
        if self.best_time_s <= 0:
            return 0.0
        return max(0.0, (self.best_time_s - self.lower_bound_s) / self.best_time_s)


def exact_split(costs: PipelineCosts, schedule: str, pp: int, vp: int = 1, *, seeds=(),
                cutoff_s: float = np.inf, value_above_cutoff: bool = False, max_splits: int | None = None,
                max_nodes: int | None = None, tie_rel: float = EQUAL_TIME_REL, seeds_only: bool = False,
                cache: dict | None = None) -> ExactSplit | None:
    """The split minimizing the simulated iteration time of ``schedule``
    under memory (module docstring).

    Args:
        costs: the point's cost terms (``costs.pp`` = stages, ``pp * vp``).
        schedule, pp, vp: the schedule, pipeline ranks and stages per rank.
        seeds: extra candidate splits (boundaries) to start from.
        cutoff_s: only splits faster than this matter (the search's current
            ``K``-th best plan): the search then proves either the optimum or
            that no split beats ``cutoff_s`` (``best_time_s >= cutoff_s``).
        value_above_cutoff: when no split beats ``cutoff_s``, still return the
            best of the starting splits (for plots of the whole space), with
            the proven bound ``min(cutoff, root bound)`` and ``exact=False``.
        max_splits, max_nodes: work limits (counts; default :data:`MAX_SPLITS_EVALUATED`,
            and :data:`MAX_NODES` for bands of stages of up to :data:`NODE_WIDTH`
            layers in profiles of up to :data:`NODE_LAYERS` layers, fewer
            above, :func:`node_budget`).
        tie_rel: among splits within this relative time of the best, the one
            with the lowest peak memory, then least time on links, is chosen.
        seeds_only: only evaluate the starting splits (an achievable time,
            ``exact=False``, lower bound 0; no tables, no branch and bound).
        cache: a dict, empty at first, shared by the calls on one point
            (the same ``costs`` object, schedule, pp and vp; a
            ``seeds_only`` call, then the search proper): the starting
            splits and their times are kept in it, and a later call takes
            them from it instead of finding and simulating them again. The
            answer is the one without it.

    Returns:
        An :class:`ExactSplit`, or None when no split fits in memory.
    """
    L, S = costs.num_layers, costs.pp
    max_splits = MAX_SPLITS_EVALUATED if max_splits is None else max_splits
    nodes_given, max_nodes = max_nodes, MAX_NODES if max_nodes is None else max_nodes
    # one point's cache: the device-balanced split (any_split_fits, the starting splits) and the
    # whole-layers-per-rank bound's cutoff-free part (the cutoff proof, a stopped search's bound)
    point_cache: dict = {} if cache is None else cache
    if S > L or not any_split_fits(costs, point_cache):
        return None
    if S == 1:  # the only split
        t = float(iteration_time_s(schedule, pp, costs.num_micro_batches, vp, costs.stage_times(np.array([0, L]))))
        return ExactSplit((0, L), t, t, t, True, 1, 0)
    ev = SplitEvaluator(costs, schedule, pp, vp)
    tables = None
    cutoff_width = width_for(costs, cutoff_s * (1 + tie_rel))  # no stage of a split faster than the cutoff is wider
    tabled = tables_fit(costs, cutoff_width)
    against_cutoff = np.isfinite(cutoff_s) and tabled and not value_above_cutoff
    if against_cutoff and stage_or_link_exceeds(costs, schedule, pp, cutoff_s):  # whole layers, no table
        return ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    enumerated = schedule == "interleaved-1f1b" and _enumerable(costs, schedule, pp, vp)
    cheap = _listed(costs, schedule, pp, vp, cutoff_s * (1 + tie_rel)) if against_cutoff and not enumerated else None
    held = None  # a listing over the evaluation limit: bounded again with the starting splits' paths below
    if cheap is not None and not _evaluation_fits(schedule, pp, costs.num_micro_batches, vp, len(cheap[0])):
        held, cheap = cheap, None
    listed, enumerated = cheap is not None, enumerated or cheap is not None
    if against_cutoff and not enumerated:
        tables, proof = _cutoff_proof(costs, schedule, pp, ev, cutoff_s, tie_rel, max_splits, max_nodes, point_cache)
        if proof is not None:
            return None if isinstance(proof, str) else proof
    if enumerated and against_cutoff and not listed and SuffixTables(
            costs, schedule, pp, cutoff_width, limit_s=cutoff_s * (1 + tie_rel)).root_bound() >= cutoff_s:
        # the tables' root bound first: a sixth of the cost of every split's bound below, and on resnet50's
        # interleaved pp 2 points it settled 13 of the 15 those settle
        return ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    # (only the splits under the cutoff are asked about: above it a split's bound may be any bound above it)
    if enumerated and not listed:
        cheap = _cheap_bounded(costs, schedule, pp, np.inf if value_above_cutoff else cutoff_s * (1 + tie_rel))
    if (cheap is not None and np.isfinite(cutoff_s) and not value_above_cutoff
            and not np.any(cheap[1] <= cutoff_s * (1 + tie_rel))):
        # every split's bound reaches the cutoff: settled before any split is simulated
        return ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    starts = [tuple(b) for b in seeds if b is not None and costs.split_fits(b)]
    _run_starts(ev, starts + _starting_splits(costs, point_cache), point_cache, keep=not seeds_only)
    best = min(ev.times.values(), default=np.inf)
    if seeds_only:
        if not ev.times:
            return None
        chosen = min(ev.times, key=lambda b: (ev.times[b], b))
        return ExactSplit(chosen, ev.times[chosen], ev.times[chosen], 0.0, False, len(ev.times), 0)
    incumbent = min(best, cutoff_s)
    enum_cutoff = np.inf if value_above_cutoff else cutoff_s
    paths = ()
    if held is not None:  # the listing's splits that the starting splits' critical paths leave, if few enough
        paths = _start_paths(costs, schedule, pp, vp, ev)
        cheap = _path_bounded(costs, schedule, pp, vp, held, paths, incumbent * (1 + tie_rel))
        listed = enumerated = cheap is not None
    if enumerated and _enumerate_all(costs, schedule, pp, vp, ev, enum_cutoff, tie_rel, cheap, paths):
        # its bounds are the weakest (a branch and bound stops at its limits): few splits, each
        # simulated unless its bound excludes it
        if not ev.times:  # a split fits (checked above), but none beats the cutoff
            return ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
        chosen, best = _chosen(costs, ev, tie_rel)
        exact = not (value_above_cutoff and best > cutoff_s)
        return ExactSplit(chosen, ev.times[chosen], best, float(min(best, cutoff_s)), exact, len(ev.times), 0)
    width = width_for(costs, incumbent * (1 + tie_rel))
    if not tabled or not tables_fit(costs, width):
        return _untabled(costs, ev, pp, tie_rel)
    traced, paths = paths, ()  # the starting splits' paths when a held listing asked for them (ev the same since)
    if tables is None and nodes_given is None and _fluid_only(costs, schedule, width):
        exact, frontier, nodes = False, untabled_bound_s(costs, pp), 0  # the relaxations' bound, no tables
    else:
        if tables is None:  # else the cutoff's band holds every stage a split faster than it can have
            tables = SuffixTables(costs, schedule, pp, width, limit_s=incumbent * (1 + tie_rel))
        width = tables.width
        if schedule in CHAIN_SCHEDULES and S * width * (L + 1) <= PATH_RANGES:
            paths = traced or _start_paths(costs, schedule, pp, vp, ev)
        if schedule in CHAIN_SCHEDULES and not (schedule in FLUID_BOUND_SCHEDULES and _fluid_first(costs, width)):
            # the cheap bounds left work: add the chain and path families (on large tables of interleaved 1F1B the
            # fluid bound weighs the same paths together, and the branch and bound goes too few nodes deep to use
            # them)
            weights, _ = lagrange_weights(costs, schedule, pp, width, incumbent * (1 - tie_rel), paths=paths)
            tables = tables.with_chains(weights, paths)
        counter = RankCount(costs, schedule, pp)
        if nodes_given is None:
            max_nodes = node_budget(tables.rows, L)
        state = run_branch_and_bound(tables, ev, S, L, pp, incumbent, tie_rel, max_splits, max_nodes, counter)
        if not state[0] and _enumerate_all(costs, schedule, pp, vp, ev, enum_cutoff, tie_rel):
            state = (True, np.inf, state[2])  # stopped, but few splits: settled by enumeration
            if not ev.times:  # a split fits (checked above), but none beats the cutoff
                return ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, state[2])
        exact, frontier, nodes = state
    if not exact:  # stopped at its limits: also the whole-layer split nearest the best free loads
        fluid = fluid_split(costs, schedule, pp, vp)
        if fluid is not None and costs.split_fits(fluid):
            ev.run([fluid])
        if ev.feasible:  # and the splits a few boundary moves from the best met
            start = min((t, b) for b, t in ev.times.items())
            per_split = evaluation_cost(schedule, pp, costs.num_micro_batches, vp)[1]
            chains = schedule in CHAIN_SCHEDULES
            improve_split(start[1], start[0], ev.times_of, costs.splits_fit,
                          max_splits=max(1, LOCAL_WORK // max(per_split, 1)),
                          lower=lambda c: split_lower_bounds(costs, schedule, pp, np.array(c, dtype=np.int64),
                                                             chains=chains, paths=paths))
    if not exact:  # every split's time is at least the relaxations' too
        frontier = _stopped_bound(costs, schedule, pp, vp, frontier, width, incumbent * (1 + tie_rel), point_cache)
    if not ev.feasible:  # no split met fits every GPU, or none beat the cutoff
        if exact and not np.isfinite(cutoff_s):
            return None  # proven: no split fits (a whole-GPU check, Mobius)
        lower = min(cutoff_s, frontier) if not exact else cutoff_s
        return ExactSplit((), np.inf, np.inf, float(lower), exact, len(ev.times), nodes)
    chosen, best = _chosen(costs, ev, tie_rel)
    lower = min(best, cutoff_s) if exact else min(best, frontier)
    if value_above_cutoff and best > cutoff_s:
        exact = False
    return ExactSplit(chosen, ev.times[chosen], best, float(lower), exact, len(ev.times), nodes)


def _starting_splits(costs: PipelineCosts, point_cache: dict) -> list[tuple[int, ...]]:
    """The starting splits of :func:`exact_split` that fit (kept in
    ``point_cache``): the even split, the analytic time's optimum
    (:func:`pipesearch.partition.optimal_split`), the memory-balanced split
    and, with several stages per device, the :func:`pipesearch.split_fits.witness_split`;
    under Mobius, when none of those fits its GPUs,
    :func:`pipesearch.split_fits.mobius_witness`."""
    if "starts" in point_cache:
        return point_cache["starts"]
    L, S = costs.num_layers, costs.pp
    starts = []
    even = even_split(L, S)
    if costs.split_fits(even):
        starts.append(even)
    closed = optimal_split(costs)
    if closed is not None and costs.split_fits(closed.bounds):  # its memory rule is 1F1B's in-flight count
        starts.append(closed.bounds)
    # the memory-balanced split: an incumbent of low memory where equal-time splits differ in it (the tie-break
    # sees every tie within the branch and bound's window; a search stopped at its limits keeps this one)
    mem = np.diff(costs.param_prefix_bytes) * costs.state_bytes_per_param_byte + np.diff(costs.saved_prefix_bytes)
    if np.any(mem > 0) and S * L <= 4096:  # balanced_split is O(S L^2)
        balanced = balanced_split(mem, S)
        if costs.split_fits(balanced):
            starts.append(balanced)
    if costs.chunk_states is not None:  # several stages per device: layers moved off the devices that overflow
        held = witness_split(costs, point_cache)
        if held is not None:
            starts.append(held)
    mobius = costs.options is not None and costs.options.swap_in_s_per_param_byte is not None
    if mobius and not starts:  # Mobius: every start overflows a GPU over its stays
        held = mobius_witness(costs, point_cache)
        if held is not None:
            starts.append(held)
    point_cache["starts"] = starts
    return starts


def _run_starts(ev: "SplitEvaluator", starts, point_cache: dict, keep: bool) -> None:
    """``ev.run(starts, keep)``, or, when an earlier call on the point ran
    the same new splits (``point_cache``), their times from it: the same
    values, not simulated again (the pass :attr:`pipesearch.split_evaluator.SplitEvaluator.kept` holds
    is not kept in the cache, where a point's graph of many micro-batches
    would stay for the rest of the search: :func:`_start_paths` traces it
    again)."""
    todo = list(dict.fromkeys(tuple(b) for b in starts if tuple(b) not in ev.times))
    held = point_cache.get("start_run")
    if held is not None and held[0] == todo:
        ev.times.update(held[1])
        ev.feasible += sum(1 for t in held[1].values() if math.isfinite(t))
        return
    ev.run(todo, keep)
    point_cache["start_run"] = (todo, {b: ev.times[b] for b in todo})


def _stopped_bound(costs: PipelineCosts, schedule: str, pp: int, vp: int, frontier_s: float, width: int,
                   limit_s: float, rank_cache: dict | None = None) -> float:
    """The lower bound of a branch and bound stopped at its limits with
    ``frontier_s`` the least bound of its open nodes, a search of stages of
    at most ``width`` layers (a split with a longer one is at least
    ``limit_s`` slow, :func:`pipesearch.bound_tables.width_for`): also at least the fluid
    relaxation's (:func:`pipesearch.fluid_bound.fluid_lower_bound_s`) and
    ``min(B, limit_s)`` with ``B`` the whole-layers-per-rank bound
    (:func:`pipesearch.rank_bounds.rank_layer_bound_s`), which the node bounds relax away on
    identical layers (GPT-3 175B, pp 8 x vp 2: 20.63 s against a frontier of
    19.84 s)."""
    out = max(frontier_s, fluid_lower_bound_s(costs, schedule, pp, vp, frontier_s))
    if np.isfinite(limit_s) and out < limit_s:
        out = max(out, min(rank_layer_bound_s(costs, schedule, pp, width, limit_s, rank_cache), limit_s))
    return out


def node_budget(width: int, num_layers: int = NODE_LAYERS) -> int:
    """The branch and bound's default node count for a band of ``width``
    layers per stage of a ``num_layers``-layer profile: :data:`MAX_NODES`
    up to :data:`NODE_WIDTH` and :data:`NODE_LAYERS`, then ``MAX_NODES *
    NODE_WIDTH / width * NODE_LAYERS / num_layers`` (at least
    :data:`FIRST_NODES`), so that the work of the nodes (the children they
    bound, the layers their bounds cover) stays about the same. A band of
    hundreds of layers, or a profile of thousands, holds far more splits
    than a search of this size could settle: on a 1,500-layer profile
    (interleaved 1F1B, bands of 30 to 807 layers) its best split and bound
    after 30 nodes were those after 3,000. A count of the input, never of
    the machine."""
    nodes = MAX_NODES * NODE_WIDTH // max(width, NODE_WIDTH)
    return max(FIRST_NODES, nodes * NODE_LAYERS // max(num_layers, NODE_LAYERS))


#: the descent from a stopped search's best split evaluates at most this
#: much work (neighbour splits times graph nodes,
#: :func:`pipesearch.timemodel.evaluation_cost`; a count, never seconds),
#: as much as the enumeration of few splits (:data:`ENUMERATE_WORK`): 40
#: rounds of 40 neighbours of 8 stages x 256 micro-batches (8,192 nodes); a
#: third of one round of 128 stages x 128 micro-batches (764 neighbours of
#: 65,536 nodes); on 1,000 layers x 64 stages (1F1B, m 256) 4x the work
#: found a split 0.05% faster for 0.7 CPU s more
LOCAL_WORK = 2**24


#: the branch and bound of a chain schedule bounds with the critical paths of
#: at most this many of the fastest starting splits (a count), when its
#: tables hold at most ``PATH_RANGES`` stage ranges (stages x band x starts;
#: larger tables cost more to rebuild with them than they save: 20 of the
#: 1,500-layer profile's 80 CPU seconds)
PATH_FAMILIES = 4
PATH_RANGES = 2**15


def _start_paths(costs: PipelineCosts, schedule: str, pp: int, vp: int, ev: "SplitEvaluator") -> tuple:
    """The distinct critical paths (``(6, S)`` coefficients,
    :func:`pipesearch.timemodel.critical_path`) of the
    :data:`PATH_FAMILIES` fastest splits ``ev`` has evaluated (the starting
    splits): path families of :func:`pipesearch.split_bounds.bound_families` that are tight at
    those splits, where the fixed families can be far below the time. On
    graphs of at most :data:`pipesearch.timemodel.COMMON_NODE_GRAPHS`
    nodes, second and third, the fastest split's two families before every
    rank's all-reduce (``(7, S)``, marked by their seventh row,
    :func:`pipesearch.split_bounds._path_family`): they hold where one stage's all-reduce dominates
    and the critical path moves with the rank that holds it."""
    best = [b for _, b in sorted((t, b) for b, t in ev.times.items() if math.isfinite(t))[:PATH_FAMILIES]]
    if not best:
        return ()
    times = costs.stage_times(np.array(best))
    kept, g, ends = ev.kept if ev.kept is not None else ((), None, None)
    if all(b in kept for b in best):  # the starting splits' own pass: traced, not simulated again
        ends = ends[:, [kept.index(b) for b in best]]
    else:
        g, ends = graph_ends(schedule, pp, costs.num_micro_batches, vp, times)
        ends = ends.reshape(len(ends), -1)
    found = [coef for _, coef in paths_of_ends(g, ends, times, pp)]
    node = node_before_all_reduces(g, ends[:, 0]) if len(g.col) <= COMMON_NODE_GRAPHS else None
    if node is not None:  # and the fastest one's two families before every rank's all-reduce, + max r
        common = path_before_all_reduces(g, ends[:, 0], costs.pp, node)
        work = rank_work_before(g, node, costs.pp)
        found[1:1] = [np.vstack([common, np.full((1, costs.pp), PATH_THEN_MAX_R)]),
                      np.vstack([work, np.full((1, costs.pp), RANK_WORK_THEN_MAX_R)])]
    seen, out = set(), []
    for coef in found:
        if coef.tobytes() not in seen:
            seen.add(coef.tobytes())
            out.append(coef)
    return tuple(out)


#: at most this many splits, and this much evaluation work (splits times
#: graph nodes, :func:`pipesearch.timemodel.evaluation_cost`), are simulated
#: one and all instead of searched (counts, never seconds)
ENUMERATE_SPLITS = 20_000
ENUMERATE_WORK = 2**24


def _enumerate_all(costs: PipelineCosts, schedule: str, pp: int, vp: int, ev: "SplitEvaluator",
                   cutoff_s: float = np.inf, tie_rel: float = EQUAL_TIME_REL, cheap=None, paths=()) -> bool:
    """When the splits of ``L`` layers into ``S`` stages are few
    (``C(L-1, S-1)`` within :data:`ENUMERATE_SPLITS` and their evaluation
    within :data:`ENUMERATE_WORK`), settle the point by enumeration and
    return True; else False, nothing evaluated.

    Every split that fits gets its lower bound (:func:`pipesearch.split_bounds.split_lower_bounds`)
    and they are evaluated into ``ev`` in bound order, in batches, until the
    next bound exceeds ``min(best, cutoff_s) (1 + tie_rel)`` (``best`` the
    least time in ``ev``): a split left out has a time of at least its
    bound, so it neither beats the best nor comes within ``tie_rel`` of it
    (the tie-break of :func:`_chosen` sees every near-tie), nor beats the
    cutoff. When no split beats ``cutoff_s`` the least time in ``ev`` is at
    least ``cutoff_s`` (not necessarily the point's optimum). ``cheap``:
    :func:`_cheap_bounded` of the point when already computed, or the
    splits and bounds of :func:`_listed` (then settled whatever their
    count); given either, the critical paths of the fastest splits
    evaluated so far (:func:`_start_paths`) bound the splits too, unless
    ``paths`` holds them (``cheap``'s bounds then include them already:
    :func:`_path_bounded`)."""
    if cheap is None and not _enumerable(costs, schedule, pp, vp):
        return False
    count = math.comb(costs.num_layers - 1, costs.pp - 1) if cheap is None else len(cheap[0])
    _, per_split = evaluation_cost(schedule, pp, costs.num_micro_batches, vp)
    limit = min(min(ev.times.values(), default=np.inf), cutoff_s) * (1 + tie_rel)
    todo, lower = _cheap_bounded(costs, schedule, pp, limit) if cheap is None else cheap
    # the cheap families first: a split they put above the best or the cutoff is never evaluated
    keep = lower <= limit
    todo, lower = todo[keep], lower[keep]
    if costs.chunk_states is not None and len(todo):  # and every device its chunks
        fit = np.all(costs.device_fits(todo), axis=1)
        todo, lower = todo[fit], lower[fit]
    if not len(paths) and schedule in CHAIN_SCHEDULES:  # (the limit only falls as splits are evaluated)
        paths = _start_paths(costs, schedule, pp, vp, ev) if cheap is not None and len(todo) > ev.first_chunk() else ()
        lower = split_lower_bounds(costs, schedule, pp, todo, paths=paths, limit_s=limit)
    order = np.argsort(lower, kind="stable")
    todo, lower = todo[order], lower[order]
    # large batches: the graph's levels are walked once per batch (about 4 million node values each)
    batch = int(max(ev.batch_size(), min(count, 4_000_000 // max(per_split, 1))))
    step, at = ev.first_chunk(), 0
    while at < len(todo):
        limit = min(min(ev.times.values(), default=np.inf), cutoff_s) * (1 + tie_rel)
        hi = min(at + step, int(np.searchsorted(lower, limit, "right")))
        if hi <= at:
            break
        ev.run([tuple(row) for row in todo[at:hi].tolist()])
        at, step = hi, min(2 * step, batch)
    return True


def _cheap_bounded(costs: PipelineCosts, schedule: str, pp: int,
                   limit_s: float = np.inf) -> tuple[np.ndarray, np.ndarray]:
    """The splits whose every stage fits (``(n, S + 1)`` boundaries, in
    lexicographic order) and their cheap bounds (:func:`pipesearch.split_bounds.split_lower_bounds`
    without the chain families, exact up to ``limit_s``), for
    :func:`_enumerate_all`. Whether each
    device holds its chunks (several stages per device) is left to the
    caller: it is costlier, and only asked of the splits a bound keeps."""
    L, S = costs.num_layers, costs.pp
    splits = _all_splits(L, S)
    todo = splits[np.all(costs.fits(np.arange(S)[None, :], splits[:, :-1], splits[:, 1:]), axis=1)]
    return todo, split_lower_bounds(costs, schedule, pp, todo, chains=False, limit_s=limit_s)


#: at most this many splits (``C(L-1, S-1)``) has a point whose splits below
#: its cutoff are listed (:func:`_listed`; a count): above it the list is
#: seldom short (GPT-3 175B's 98 layers on 16 stages)
LISTED_FROM = 10**8
#: at most this many splits are listed (a count, as :data:`ENUMERATE_SPLITS`); those the bounds leave are
#: simulated when within :data:`ENUMERATE_WORK`, else :data:`LISTED_WORK` after the starting splits' paths
LISTED_SPLITS = 20_000
#: the evaluation work at most of the listed splits the starting splits'
#: paths leave (:func:`_path_bounded`; a count): they are simulated in bound
#: order, and on Llama 2 13B's interleaved pp 4 points of 256 micro-batches
#: on 16 A100s (`-b 512`), whose 3,066 and 4,480 listed splits are over
#: :data:`ENUMERATE_WORK`, 1,121 of them were (0.1 CPU s each, as much as
#: the branch and bound that stopped at its limits before)
LISTED_WORK = 2**26


def _listed(costs: PipelineCosts, schedule: str, pp: int, vp: int,
            limit_s: float) -> tuple[np.ndarray, np.ndarray] | None:
    """For interleaved 1F1B with more splits than :func:`_enumerable`
    takes (up to :data:`LISTED_FROM`): the splits whose every rank keeps
    its head, work and all-reduce below ``limit_s``
    (:func:`pipesearch.rank_splits.rank_bounded_splits`; every other split is
    at least that slow) whose bound with the chain families
    (:func:`pipesearch.split_bounds.split_lower_bounds`, the cheap families
    first) is within ``limit_s``, and those bounds, when at most
    :data:`LISTED_SPLITS` splits are listed; else None. Those left are
    simulated (:func:`_enumerate_all`) when their evaluation is within
    :data:`ENUMERATE_WORK` (:func:`_evaluation_fits`), else after the
    starting splits' paths bound them too (:func:`_path_bounded`)."""
    if schedule != "interleaved-1f1b" or math.comb(costs.num_layers - 1, costs.pp - 1) > LISTED_FROM:
        return None
    listed = rank_bounded_splits(costs, pp, limit_s, LISTED_SPLITS)
    if listed is None:
        return None
    lower = split_lower_bounds(costs, schedule, pp, listed, chains=False, limit_s=limit_s)
    listed = listed[lower <= limit_s]  # the others never beat the limit
    lower = split_lower_bounds(costs, schedule, pp, listed, limit_s=limit_s)  # and with the chain families
    return listed[lower <= limit_s], lower[lower <= limit_s]


def _evaluation_fits(schedule: str, pp: int, m: int, vp: int, splits: int, work: int = ENUMERATE_WORK) -> bool:
    """Whether simulating ``splits`` splits of the point is within ``work``
    (:func:`pipesearch.timemodel.evaluation_cost` units)."""
    return splits * evaluation_cost(schedule, pp, m, vp)[1] <= work


def _path_bounded(costs: PipelineCosts, schedule: str, pp: int, vp: int, held, paths,
                  limit_s: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The splits of a listing ``held`` (:func:`_listed`, over
    :data:`ENUMERATE_WORK`) whose bound with the path families ``paths``
    (the starting splits' critical paths, :func:`_start_paths`) is within
    ``limit_s`` (the best starting split's time or the cutoff, raised by the
    tie window), and those bounds, when their evaluation is within
    :data:`LISTED_WORK`; else None. GPT-3 1.3B's interleaved pp 4 points
    of 128 micro-batches on 16 A100s: 4,916 and 6,292 listed splits, 2,776
    and 2,714 left."""
    lower = split_lower_bounds(costs, schedule, pp, held[0], paths=paths, limit_s=limit_s)
    keep = lower <= limit_s
    if not _evaluation_fits(schedule, pp, costs.num_micro_batches, vp, int(keep.sum()), LISTED_WORK):
        return None
    return held[0][keep], lower[keep]


def _enumerable(costs: PipelineCosts, schedule: str, pp: int, vp: int) -> bool:
    """Whether the splits are few enough for :func:`_enumerate_all`:
    ``C(L-1, S-1)`` within :data:`ENUMERATE_SPLITS` and their evaluation
    (:func:`pipesearch.timemodel.evaluation_cost`) within
    :data:`ENUMERATE_WORK`."""
    count = math.comb(costs.num_layers - 1, costs.pp - 1)
    # (the count before the evaluation cost, which builds the schedule's graph)
    return count <= ENUMERATE_SPLITS and _evaluation_fits(schedule, pp, costs.num_micro_batches, vp, count)


@lru_cache(maxsize=16)
def _all_splits(L: int, S: int) -> np.ndarray:
    """Every split of ``L`` layers into ``S`` non-empty stages, ``(C(L-1,
    S-1), S + 1)`` boundaries in lexicographic order (read-only)."""
    count = math.comb(L - 1, S - 1)
    cuts = np.array(list(itertools.combinations(range(1, L), S - 1)), dtype=np.int64).reshape(count, S - 1)
    out = np.concatenate([np.zeros((count, 1), dtype=np.int64), cuts, np.full((count, 1), L)], axis=1)
    out.flags.writeable = False
    return out


#: at most this many splits are bounded one by one in the cutoff proof
#: (:func:`pipesearch.split_bounds.split_lower_bounds`) before any table is built (a count)
PROOF_SPLITS = 2048


def _cutoff_proof(costs: PipelineCosts, schedule: str, pp: int, ev: "SplitEvaluator", cutoff_s: float, tie_rel: float,
                  max_splits: int, max_nodes: int, rank_cache: dict | None = None):
    """Before any starting split is evaluated, try to prove that no split
    beats ``cutoff_s`` (after :func:`pipesearch.split_bounds.stage_or_link_exceeds`,
    which :func:`exact_split` asks first): with at most :data:`PROOF_SPLITS` splits, the least
    bound of a split that fits (:func:`pipesearch.split_bounds.split_lower_bounds`, no table); for
    :data:`pipesearch.bound_tables.OWN_FAMILY_SCHEDULES` the root bound of their own closed-form
    families alone (``own_only`` tables); the root bound of the cheap
    families; for
    interleaved 1F1B the fluid bound
    (:func:`pipesearch.fluid_bound.fluid_lower_bound_s`; before the tables
    when they are large, :func:`_fluid_first`); then the
    first :data:`FIRST_NODES` nodes of the branch and bound with the cheap
    families and the rank-counting bound (a split it meets below the cutoff
    is evaluated and kept in ``ev``); last, for the chain schedules, the
    whole-layers-per-rank bound of :func:`pipesearch.rank_bounds.rank_layer_bound_s` (the dearest:
    on the default plan it settled none of the 35 points it was tried on
    before the first nodes). The chain families and their
    Lagrangian combination (:func:`pipesearch.split_bounds.lagrange_weights`) are left to the
    search proper: on the PipeDream profiles (vgg16, resnet50 on
    4x4-v100-10gbe) they excluded 1 more of 347 interleaved and ZB-H1
    points here at nearly twice the cost. ``rank_cache``: the point's cache
    of :func:`pipesearch.rank_bounds.rank_layer_bound_s`. Returns ``(tables, proof)``: the
    cheap tables and an :class:`ExactSplit` saying no split beats the
    cutoff, ``"infeasible"`` when no split fits, or None."""
    L, S = costs.num_layers, costs.pp
    if math.comb(L - 1, S - 1) <= PROOF_SPLITS:  # each split's own bound: at least the tables' root bound
        splits = _all_splits(L, S)
        fit = np.all(costs.fits(np.arange(S)[None, :], splits[:, :-1], splits[:, 1:]), axis=1)
        lower = split_lower_bounds(costs, schedule, pp, splits[fit], chains=schedule in CHAIN_SCHEDULES,
                                   limit_s=cutoff_s)
        if len(lower) and lower.min() >= cutoff_s:
            return None, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    width = width_for(costs, cutoff_s * (1 + tie_rel))
    fluid_first = _fluid_first(costs, width)
    if fluid_first and fluid_lower_bound_s(costs, schedule, pp, S // pp, cutoff_s) >= cutoff_s:
        return None, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    if _fluid_only(costs, schedule, width):  # no tables: the whole-layers bound is the one left
        if rank_layer_bound_s(costs, schedule, pp, width, cutoff_s, rank_cache) >= cutoff_s:
            return None, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
        return None, None
    if schedule in OWN_FAMILY_SCHEDULES:  # its own few families first: smaller tables
        own = SuffixTables(costs, schedule, pp, width, own_only=True, limit_s=cutoff_s * (1 + tie_rel)).root_bound()
        if cutoff_s <= own < np.inf:
            return None, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    tables = SuffixTables(costs, schedule, pp, width, limit_s=cutoff_s * (1 + tie_rel))
    root = tables.root_bound()
    if root >= cutoff_s:
        if not np.isfinite(root) and optimal_split(costs) is None:
            return tables, "infeasible"
        return tables, ExactSplit((), np.inf, np.inf, float(min(root, cutoff_s)), True, 0, 0)
    if not fluid_first and fluid_lower_bound_s(costs, schedule, pp, S // pp, cutoff_s) >= cutoff_s:
        return tables, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)  # the fluid relaxation
    excluded, _, _ = run_branch_and_bound(tables, ev, costs.pp, costs.num_layers, pp, cutoff_s / (1 + tie_rel), tie_rel,
                                          max_splits, min(max_nodes, FIRST_NODES), RankCount(costs, schedule, pp))
    if excluded and min(ev.times.values(), default=np.inf) >= cutoff_s:
        return tables, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    if schedule in CHAIN_SCHEDULES and rank_layer_bound_s(costs, schedule, pp, tables.width, cutoff_s,
                                                         rank_cache) >= cutoff_s:
        return tables, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)  # whole layers per rank
    return tables, None


#: stage ranges (stages x band x starts) of the cutoff proof's tables above
#: which the fluid bound (:func:`pipesearch.fluid_bound.fluid_lower_bound_s`,
#: a few milliseconds) is tried before them, not after their root bound
FLUID_FIRST_RANGES = 2**18


def _fluid_first(costs: PipelineCosts, width: int) -> bool:
    """Whether the bound tables of stages of at most ``width`` layers hold
    more than :data:`FLUID_FIRST_RANGES` stage ranges (they then cost more
    than the fluid bound's program)."""
    L = costs.num_layers
    return costs.pp * min(width, L) * (L + 1) > FLUID_FIRST_RANGES


#: node budgets (:func:`node_budget`) below which a branch and bound on tables
#: large enough for the fluid bound to go first (:func:`_fluid_only`) is not run
FLUID_ONLY_NODES = 300


def _fluid_only(costs: PipelineCosts, schedule: str, width: int) -> bool:
    """Whether a point of ``schedule`` with stages of at most ``width``
    layers is searched without tables: interleaved 1F1B (the fluid bound's
    schedule) whose tables would be large (:func:`_fluid_first`) and whose
    branch and bound would get fewer than :data:`FLUID_ONLY_NODES` nodes.
    There the tables' root bound stayed below the fluid bound, which is
    then the search's bound, and the split is the best of the starting
    splits, the fluid split and their local improvement: on a 1,500-layer
    profile (bands of 700 to 800 layers, 40 to 256 nodes) the root bound
    was 1.5-3% below the fluid bound on every one of 16 points, at 0.2 to
    0.3 s a table against 1 to 18 ms."""
    L, S = costs.num_layers, costs.pp
    return (schedule in FLUID_BOUND_SCHEDULES and _fluid_first(costs, width)
            and node_budget(max(1, min(width, L - S + 1)), L) < FLUID_ONLY_NODES)


def untabled_bound_s(costs: PipelineCosts, pp: int) -> float:
    """A lower bound on the simulated time of every split that needs no
    table: each of the ``pp`` ranks runs its micro-batches' forwards and
    backwards one after another, and together they run all ``m`` of every
    layer, so the busiest runs at least the average, ``m sum_l (F + B)_l /
    pp``, on the fastest stage's device (the smallest time scale; the layer
    table's own option, the fastest)."""
    total = float(costs.compute_prefix_s[-1]) * float(np.min(costs.time_scale))
    return costs.num_micro_batches * total / pp


def _chosen(costs: PipelineCosts, ev: "SplitEvaluator", tie_rel: float) -> tuple[tuple[int, ...], float]:
    """``(split, best time)`` of the evaluated splits: among those within
    ``tie_rel`` of the best, the one :func:`_tie_key` ranks first."""
    best = min(ev.times.values())
    near = [b for b, t in ev.times.items() if t <= best * (1 + tie_rel)]
    return min(near, key=lambda b: _tie_key(costs, b, ev.times[b])), best


def _untabled(costs: PipelineCosts, ev: "SplitEvaluator", pp: int, tie_rel: float) -> "ExactSplit | None":
    """The best of the starting splits ``ev`` has evaluated, with
    :func:`untabled_bound_s` as its proven bound (exact only if it meets it)."""
    if not ev.times:
        return None
    chosen, best = _chosen(costs, ev, tie_rel)
    lower = min(best, untabled_bound_s(costs, pp))
    return ExactSplit(chosen, ev.times[chosen], best, float(lower), lower >= best, len(ev.times), 0)


def _tie_key(costs: PipelineCosts, bounds, t: float):
    """Among near-equal splits: lower peak memory per device, then less time
    on links, then the time, then the boundaries."""
    s, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    if costs.chunk_states is not None:  # several stages per device: the devices' own peaks
        mem = float(np.max(costs.device_memory_bytes(np.asarray(bounds))))
    else:
        mem = float(np.max(costs.memory_bytes(s, i, j)))
    link = float(np.sum(costs.send_s(s, j)))
    return (round(mem), round(link, 12), t, tuple(bounds))


def exhaustive_simulated_split(costs: PipelineCosts, schedule: str, pp: int, vp: int = 1):
    """Reference for tests: simulate every split that fits with the
    discrete-event simulator (:func:`pipesearch.timemodel.simulate_times`);
    returns ``(time, bounds)`` of the best, or None."""
    L, S = costs.num_layers, costs.pp
    best = None
    for cut in itertools.combinations(range(1, L), S - 1):
        bounds = (0, *cut, L)
        if not costs.split_fits(bounds):
            continue
        t, _ = simulate_times(schedule, pp, costs.num_micro_batches, vp, costs.stage_times(bounds))
        if best is None or t < best[0]:
            best = (t, bounds)
    return best
