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
  of ``T`` built from per-stage terms (:func:`bound_families`). A family is
  either ``sum_k alpha_k + sum_c max_k beta_c,k`` ("sum" kind) or
  ``max_k (sum_{k'<k} alpha_k' + beta_k)`` ("prefix" kind). For a partial
  split (stages ``0 .. s-1`` fixed, layers ``[i, L)`` left) the fixed part is
  known exactly and the rest is bounded by suffix minima over all splits of
  ``[i, L)``, computed once per point by a backward DP over a band of stage
  lengths (:class:`_Tables`).
* *Stronger bounds where the cheap ones leave work* (interleaved 1F1B and
  ZB-H1, whose identical-layer models leave many splits within the cheap
  bounds' reach): chain families (micro-batch 0 down to a stage, that
  stage's rank up to its last backward there, the gradient back up; the
  longest path of an even split of identical layers) and one weighted sum
  of the one-sum families, weights from a few steps of a subgradient
  ascent of their Lagrangian relaxation (:func:`lagrange_weights`); and the
  path families: the critical paths of the fastest starting splits
  (:func:`pipesearch.timemodel.critical_path`, counts per stage), each the
  sum of its stages' counts times their durations on any split (tight at
  its own split, where the fixed families fall 10-40% short on CNN
  profiles with heavy all-reduce). All are tabulated only for points that
  run the branch and bound. For every
  schedule, children that survive the tables get the rank-counting bound of
  :class:`_RankCount` (each rank's fill, whole work and drain, with the
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
(:func:`_enumerate_all`: each split's bound, :func:`split_lower_bounds`, and
the splits simulated in bound order while one can still beat the best or the
cutoff; interleaved 1F1B's points with few splits go there directly). Before
any split is evaluated, the per-split bounds (few splits), the root bounds,
the whole-layers-per-rank bound (:func:`rank_layer_bound_s`) and a first few
nodes try to exclude the point against the cutoff (:func:`_cutoff_proof`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import schedules as schedule_lib
from .costs import PipelineCosts
from .fluid import fluid_split
from .fluid_bound import FLUID_BOUND_SCHEDULES, fluid_lower_bound_s
from .local_split import improve_split
from .partition import balanced_split, even_split, optimal_split
from .timemodel import (COMMON_NODE_GRAPHS, PATH_TERMS, evaluation_cost, graph_ends, iteration_time_s,
                        node_before_all_reduces, path_before_all_reduces, paths_of_ends, rank_work_before,
                        send_overlap, simulate_times, times_of_ends)

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
#: nodes after which the branch and bound estimates the nodes its tree has
#: left (:func:`remaining_nodes_estimate`) and stops, as at its node limit,
#: when that is more than HOPELESS_FACTOR times the limit: it could not end
#: within it (counts, never seconds). On the 34 catalog cases of
#: benchmarks/bench_rank1.py every search that ended had an estimate of at
#: most 3,553 here (resnet101 on 4x4-v100-10gbe, which ended at 1,461
#: nodes), and those of GPT-3 175B that ran to the limit 1.7e7 to 3e12
ESTIMATE_NODES = 300
HOPELESS_FACTOR = 10
#: ``(nodes, factor)``: after that many nodes the branch and bound also
#: stops when its tree, estimated from the share of it already searched
#: (:func:`searched_share`), holds more than ``factor`` times its node
#: limit. Measured at 100 to 2,000 nodes on the 34 cases of
#: benchmarks/bench_rank1.py (the stop rules disabled, limit 3,000): the 41
#: searches that ended had estimates of at most 34,650 at node 100,
#: 30,927 at node 300 (resnext101, which ended at 1,527 nodes) and 10,643
#: at node 1,000 (gnmt_large, at 2,539); of the 158 that ran to a limit,
#: 121 are stopped at node 100, 133 by node 300 with :data:`HOPELESS_FACTOR`
#: and 4 more at 1,000 (with HOPELESS_FACTOR alone 101): T5-11B's and
#: T5-3B's then, too.
#: GPT-3 1.3B's interleaved points on 16 A100s (8,000 to 34,000 all along)
#: are not told apart from searches that end by the factor alone
PROGRESS_CHECKS = ((100, 100), (300, 33), (1000, 16))
#: ``(nodes, factor)``: a progress check before those of
#: :data:`PROGRESS_CHECKS`, which stops the search only when some subtree is
#: already finished (a positive share searched: a depth-first search of 30
#: or more stages may not have met a leaf by node 30, which says nothing of
#: its size) and the estimate is above ``factor`` times the node limit.
#: Measured with every stop rule off (limit 3,000) on the 34 cases of
#: benchmarks/bench_rank1.py and GPT-3 175B at 16,384 GPUs: the searches
#: that ended had estimates of at most 18.8 times the limit at node 30
#: (gnmt_large, ended at 2,539 nodes; resnext101 18.5, at 1,394), and 131 of
#: the 167 that ran to their limit were above 30 times it (110 of them also
#: above :data:`PROGRESS_CHECKS`' 100 at node 100, where they stopped before)
EARLY_CHECK = (30, 30)
#: ``{nodes: factor}``: at that check (one of :data:`PROGRESS_CHECKS`) the
#: search also stops when the estimate is more than ``factor`` times its
#: node limit and has not fallen since the check before. Measured with
#: every stop rule off (limit 3,000) on the 34 cases of
#: benchmarks/bench_rank1.py, estimates at nodes 100, 300, 1,000: every
#: search that ended and reached node 1,000 had an estimate there of at
#: most 10,643, each of those above 2,000 lower than at node 300
#: (gnmt_large 18,020 -> 10,643, resnext101 18,730 -> 7,600); of those that
#: reached node 300, none had a rising estimate above 7,992 there
#: (densenet121: 6,791 -> 7,992, ended at 1,375 nodes; resnext101's 30,800
#: -> 18,730 and gnmt_large's 32,000 -> 18,020 fell). Of the searches that
#: ran to the limit, at node 300 (factor 3: 9,000) the four interleaved
#: ones of GPT-3 1.3B on 16 A100s (14,065-22,500 -> 17,269-25,871), three
#: of llama2-13b's, resnext101's and inception_v3's, one of T5-11B's; at
#: node 1,000 (factor 2) GPT-3 1.3B's two of 32 micro-batches (6,584 ->
#: 6,742), each of which ran on to the limit without a proof
RISING_CHECKS = {300: 3, 1000: 2}
#: splits within this relative time of the best (equal up to rounding) are tie-broken
EQUAL_TIME_REL = 1e-12
_BATCH = 256


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


def bound_families(costs: PipelineCosts, schedule: str, pp: int, s, i, j, weights=None, chains: bool = False,
                   chain_families: int = 0, paths=(), own_only: bool = False, terms=None):
    """Per-stage terms of the lower-bound families of ``schedule`` for stage
    ``s`` over the ranges ``[i, j)`` (``s``, ``i``, ``j`` broadcastable int
    arrays: one stage or all of them at once).

    A family is a list of components whose bounds add up; each component is
    ``(kind, alpha, beta)`` over the stages ``k`` of a split:

    * ``("sum", alpha, None)``: ``sum_k alpha_k``;
    * ``("max", None, beta)``: ``max_k beta_k``;
    * ``("prefix", alpha, beta)``: ``max_k (sum_{k'<k} alpha_k' + beta_k)``;
    * ``("suffix", alpha, beta)``: ``max_k (beta_k + sum_{k'>k} alpha_k')``;
    * ``("device", None, beta)``: ``max_r sum_{k on rank r} beta_k`` (rank
      ``k % pp``).

    Every family is the length of a path of the schedule's dependency graph
    (docs/schedules.md), so it never exceeds the simulated time. ``F``, ``B``
    are a stage's forward and backward compute, ``I`` the input-gradient part,
    ``W = B - I``, ``c`` / ``c_in`` its transfer to the next / from the
    previous stage, ``f = F + c`` and ``b = B + c_in`` under 1F1B's blocking
    sends (``F``, ``B`` otherwise), ``r`` its all-reduce, ``m`` micro-batches,
    ``S`` stages and ``w = m - S + k`` the forwards rank ``k`` runs after its
    first backward (1F1B and ZB-H1 warm up with ``S - k`` forwards):

    * all: micro-batch 0 down and back up; each rank's whole work and
      all-reduce (``device``, ``m (f + b) + r``); with overlapped sends, each
      directed link's ``m`` transfers per boundary it carries (``device``,
      ``m c`` and ``m c_in``); rank ``k``'s ``m`` forwards (in micro-batch
      order in every schedule) or the ``m`` transfers of its boundary, micro-batch ``m-1``
      down to the last stage and back up to stage ``k'``, then ``k'``'s rank's
      last backward work and all-reduce; and the same with rank ``r``'s whole
      work up to its last forward of its first stage (counted from the
      schedule's order, :func:`pipesearch.schedules.work_until_last_forward`)
      in place of the ``m`` forwards;
    * one stage per rank: rank ``k`` starts when micro-batch 0 reaches it,
      runs all its work and its all-reduce;
    * GPipe (its closed form, :func:`pipesearch.timemodel.gpipe_time_s`, with
      the slowest rows chosen): the forward grid, then the backward grid up
      to stage ``k`` and ``k``'s all-reduce; and the whole backward grid;
    * 1F1B / ZB-H1: micro-batch 0 to stage ``k``, rank ``k`` up to its last
      forward, micro-batch ``m-1`` down and back up to stage ``k'`` and
      ``k'``'s all-reduce; micro-batch 0 down and up to stage ``k``, rank
      ``k``'s remaining actions and all-reduce; and (1F1B) the two-dwell-free
      forms ``sum (f + b) + max_k max((m-1) b_k + w f_k, (m-1) f_k + w b_k)``;
    * with ``chains``, interleaved 1F1B / ZB-H1: the chain families of :func:`_chain_terms`
      (micro-batch 0 down to stage ``k``, ``k``'s rank from there to its
      backward of micro-batch ``m - 1``, that gradient back up, rank 0's
      rest and all-reduce), one for each of the last ``chain_families``
      stages (0: :data:`MAX_CHAIN_FAMILIES`);
    * with ``chains``, one family per path of ``paths`` (``(6, S)``
      coefficients of :func:`pipesearch.timemodel.critical_path`, the
      critical paths of splits already evaluated): ``sum_s coef[:, s] . (F,
      B, I, W, c, r)_s``; a seventh row marks the two families before
      every all-reduce (:func:`_path_family`): a path to a node every
      rank's last action follows
      (:func:`pipesearch.timemodel.path_before_all_reduces`) or the actions
      each rank runs before that node
      (:func:`pipesearch.timemodel.rank_work_before`, a ``device``
      component), then ``max_s r_s`` (every rank's all-reduce comes after
      its last action);
    * with ``weights`` (one per family of :func:`separable_terms`, summing to
      at most 1): ``sum_h weights_h G_h``, a convex combination of lower bounds
      that are each one sum over the stages (Lagrangian relaxation of their
      maximum, Fisher 1981, Management Science 27(1)), so it is one ``sum``
      whose minimum over splits a min-sum DP finds.

    ``own_only``: only the families of the schedule's own closed form (the
    GPipe, 1F1B and ZB-H1 ones above; none for the other schedules), the
    few that most often exclude a point whole (:func:`_cutoff_proof`).
    ``terms``: :func:`_stage_terms` of ``s``, ``i``, ``j`` when already
    computed.
    """
    m, S = costs.num_micro_batches, costs.pp
    F, B, I, c, cin, r = _stage_terms(costs, s, i, j) if terms is None else terms
    blocking = not send_overlap(schedule)
    f, b = _action_terms(schedule, F, B, c, cin)
    w = m - S + s
    G = I if schedule == "zb-h1" else B
    fams = []
    if not own_only:  # the families every schedule has (the own-family tables leave them out)
        up = G + cin  # one step of a gradient back up
        last = (b if schedule == "1f1b" else B) + r  # a rank's last backward work, then its all-reduce
        fams += [[("sum", F + c + G + cin, None)], [("device", None, _rank_work(schedule, m, F, B, c, cin, r))],
                 [("sum", F + c, None), ("max", None, (m - 1) * np.maximum(f, c)), ("suffix", up, last)]]
        nF, nB, nI, nW = _work_before_last_forward(schedule, pp, m, S // pp)
        rank_work = nF[s] * f + nB[s] * b + nI[s] * (I + (cin if blocking else 0.0)) + nW[s] * (B - I)
        fams.append([("device", None, rank_work), ("suffix", up, last)])
        if not blocking:  # each directed link carries its m transfers one after another
            fams += [[("device", None, m * c)], [("device", None, m * cin)]]
        if S == pp:
            fams.append([("prefix", F + c, m * (f + b) + r)])
    if schedule == "gpipe":
        row_f, row_b = np.maximum(F, c), np.maximum(B, c)
        fams.append([("sum", F + c, None), ("max", None, (m - 1) * row_f),
                     ("suffix", B + c, B + c + (m - 1) * row_b + r)])
        fams.append([("sum", F + c + B + c, None), ("max", None, (m - 1) * row_f), ("max", None, (m - 1) * row_b)])
    elif schedule == "1f1b":
        fams.append([("sum", f, None), ("max", None, (m - 1) * f + w * b), ("suffix", b, b + r)])
        fams.append([("sum", f, None), ("suffix", b, m * b + w * f + r)])
        fams.append([("sum", f + b, None), ("max", None, np.maximum((m - 1) * b + w * f, (m - 1) * f + w * b))])
        fams.append([("prefix", f + b, m * (f + b))])
    elif schedule == "zb-h1":
        # rank k runs W of micro-batch j after I of j + k: w - k of them before its last forward
        fams.append([("sum", F + c, None),
                     ("max", None, np.maximum((m - 1) * F + w * I + max(m - S, 0) * (B - I), (m - 1) * c)),
                     ("suffix", I + cin, B + r)])
        fams.append([("sum", F + c, None), ("suffix", I + cin, m * B + w * F + r)])
    if own_only:
        return fams
    if chains and schedule in CHAIN_SCHEDULES:
        fill_drain, per_action = _chain_inputs(schedule, (F, B, I, c, cin, r), f, b)
        fams += [[("sum", alpha, None)] for alpha in _chain_terms(schedule, pp, m, S, s, fill_drain, per_action, r,
                                                                 chain_families or MAX_CHAIN_FAMILIES)]
    if chains and len(paths):
        fams += [_path_family(coef, s, (F, B, I, B - I, c, r), cin) for coef in paths]
    if weights is not None:
        terms = separable_terms(fams, s, pp)
        fams.append([("sum", sum(w * a for w, a in zip(weights, terms) if w > 0), None)])
    return fams


def _stage_terms(costs: PipelineCosts, s, i, j) -> tuple:
    """``(F, B, I, c, c_in, r)`` of stage ``s`` over the layers ``[i, j)``
    (broadcastable int arrays): forward, backward and input-gradient
    compute, the transfer to the next stage and from the previous one (0 on
    stage 0), and the all-reduce after the stage's last backward (seconds)."""
    F, B = costs.fwd_s(s, i, j), costs.bwd_s(s, i, j)
    c = costs.send_s(s, j)
    cin = np.where(np.asarray(s) > 0, costs.send_s(np.maximum(np.asarray(s) - 1, 0), i), 0.0)
    return F, B, costs.bwd_input_s(s, i, j), c, cin, costs.after_backward_s(s, i, j)


def _rank_work(schedule: str, m: int, F, B, c, cin, r):
    """A stage's ``m`` forwards and backwards (:func:`_action_terms`) and
    its all-reduce: the ``device`` family of every schedule
    (:func:`bound_families`), a rank's whole work and all-reduce."""
    f, b = _action_terms(schedule, F, B, c, cin)
    return m * (f + b) + r


def _action_terms(schedule: str, F, B, c, cin) -> tuple:
    """``(f, b)``: a stage's forward and backward with its sends charged to
    them where ``schedule``'s sends block (``F + c``, ``B + c_in``), else
    ``F`` and ``B``."""
    if send_overlap(schedule):
        return F, B
    return F + c, B + cin


def _chain_inputs(schedule: str, terms, f, b) -> tuple:
    """``(fill_drain, per_action)`` of :func:`_chain_terms` from a stage's
    ``terms`` (:func:`_stage_terms`) and its ``f``, ``b``
    (:func:`_action_terms`): ``F + c`` plus one step of micro-batch ``m -
    1``'s gradient back up, and the durations of an ``F``, ``B``, ``I`` and
    ``W`` action (blocking sends charged to the action that waits on them)."""
    F, B, I, c, cin, _ = terms
    blocking = not send_overlap(schedule)
    drain = b if blocking else (I if schedule == "zb-h1" else B) + c
    return F + c + drain, (f, b, I + (cin if blocking else 0.0), B - I)


#: the seventh row of a marked path family of :func:`_start_paths` (a ``(7, S)``
#: array): a path to a node every rank's last action follows, then the largest
#: stage all-reduce; or the actions each rank runs before that node, then the same
PATH_THEN_MAX_R, RANK_WORK_THEN_MAX_R = 1.0, 2.0


def _path_family(coef: np.ndarray, s, terms, cin) -> list:
    """The family of one path of ``paths`` (:func:`bound_families`):
    ``terms`` the stage's ``(F, B, I, W, c, r)``, ``cin`` its incoming
    transfer. A ``(6, S)`` path: ``sum_s coef[:, s] . terms_s``; marked
    :data:`PATH_THEN_MAX_R`: that plus ``max_s r_s``; marked
    :data:`RANK_WORK_THEN_MAX_R` (counts of
    :func:`pipesearch.timemodel.rank_work_before`: ``F``, ``B``, ``I``,
    ``W``, sends down, sends up): ``max_q sum_{s on q} (...) + max_s r_s``."""
    form = coef[len(PATH_TERMS)][0] if len(coef) > len(PATH_TERMS) else 0.0
    r = terms[5]
    rows = terms[:5] + ((cin,) if form == RANK_WORK_THEN_MAX_R else (r,))
    alpha = sum((coef[k][s] * t for k, t in enumerate(rows) if np.any(coef[k])), np.zeros(np.shape(r)))
    if form == RANK_WORK_THEN_MAX_R:
        return [("device", None, alpha), ("max", None, r)]
    return [("sum", alpha, None)] + ([("max", None, r)] if form == PATH_THEN_MAX_R else [])


def _path_rows(paths) -> int:
    """Component rows of the path families of ``paths`` (two for the marked
    ones, :func:`bound_families`)."""
    return sum(1 + (len(coef) > len(PATH_TERMS)) for coef in paths)


def separable_terms(fams, s, pp: int):
    """The lower bounds among ``fams`` (:func:`bound_families`) that are one
    sum over the stages, as per-stage terms: each single-``sum`` family, and
    each single-``device`` family split by rank (``beta_s [s % pp = q]`` for
    ``q = 0 .. pp-1``: every rank's sum is a lower bound)."""
    out = []
    for fam in fams:
        if len(fam) == 1 and fam[0][0] == "sum":
            out.append(fam[0][1])
        elif len(fam) == 1 and fam[0][0] == "device":
            out += [np.where(np.asarray(s) % pp == q, fam[0][2], 0.0) for q in range(pp)]
    return out


#: schedules whose bounds include the chain families of :func:`_chain_terms`
CHAIN_SCHEDULES = ("interleaved-1f1b", "zb-h1")
#: at most this many chain families (the stages of the last chunks when more)
MAX_CHAIN_FAMILIES = 16


def _chain_terms(schedule: str, pp: int, m: int, S: int, s, fill_drain, per_action, r,
                 families: int = MAX_CHAIN_FAMILIES):
    """Per-stage terms of the chain families: for a stage ``k`` on rank
    ``q = k % pp``, the path micro-batch 0's forward down to stage ``k``,
    rank ``q``'s actions from the forward of micro-batch 0 on ``k`` to the
    backward (ZB-H1: input gradient) of micro-batch ``m - 1`` on ``k``
    (counted from the schedule's order, :func:`_chain_counts`), that
    gradient back up to stage 0, rank 0's remaining actions and rank 0's
    all-reduce (the sum over its stages). Its length is ``sum_s alpha_s``
    with ``alpha_s = [s < k] (F_s + c_s + drain_s) + sum_kind n_kind(k, s)
    d_kind(s) + [s % pp = 0] r_s``; it is a path of the dependency graph
    (docs/schedules.md), so the sum never exceeds the simulated time.

    ``fill_drain`` is ``F + c`` plus one step of the gradient back up
    (``G + c`` with overlapped sends, ``b`` with blocking ones);
    ``per_action`` the durations of an ``F``, ``B``, ``I`` and ``W`` action
    of the stage; ``families`` how many (the last stages). Returns one
    array per chain family."""
    ks, counts = _chain_counts(schedule, pp, m, S // pp, families)
    if not len(counts):
        return []
    s = np.asarray(s)
    own = np.where(s % pp == 0, r, 0.0)
    on_s = counts[:, s]  # each family's counts on s: (families,) + s.shape + (4,)
    acting = on_s.any(axis=tuple(range(0, on_s.ndim - 1)))  # (4,): the kinds some family runs on s
    kinds = [kind for kind in range(4) if acting[kind]]
    shape = np.broadcast_shapes(s.shape, np.shape(fill_drain), np.shape(own),
                                *(np.shape(per_action[kind]) for kind in kinds))
    lead = (len(ks),) + (1,) * (len(shape) - s.ndim)  # the family axis before every axis of the terms
    before = np.reshape(s[None] < np.reshape(np.asarray(ks), (-1,) + (1,) * s.ndim), lead + s.shape)
    # every family at once: a kind a family does not run on a stage adds +0 there (x + 0 = x), so each
    # family's work is the sum of its own actions in kind order (where: no 0 x inf), then the fill, then own
    work = 0.0
    with np.errstate(invalid="ignore"):
        for kind in kinds:
            n = np.reshape(on_s[..., kind], lead + s.shape)
            work = work + np.where(n > 0, n * per_action[kind], 0.0)
    return list(np.broadcast_to(np.where(before, fill_drain, 0.0) + work + own, (len(ks),) + shape))


@lru_cache(maxsize=256)
def _chain_counts(schedule: str, pp: int, m: int, vp: int, families: int = MAX_CHAIN_FAMILIES):
    """The chain families of :func:`_chain_terms` in closed form from the
    builders' orders (:mod:`pipesearch.schedules`): ``(stages, counts)`` with
    ``counts[f, s, kind]`` (an int array ``(families, S, 4)``) the number of actions of ``kind`` (``F B I W``) on
    stage ``s`` that family ``f``'s path runs on its ranks: rank ``k % pp``
    from ``F`` of micro-batch 0 on ``k`` to the backward (ZB-H1: ``I``) of
    micro-batch ``m - 1`` on ``k`` (inclusive), and rank 0 after that
    backward on stage 0. With more than ``families`` stages only the last
    ``families`` are kept.

    * ZB-H1 (``k = r``): ``F`` of micro-batch 0 is the rank's first action and
      all ``m`` forwards and ``m`` input gradients run by ``I`` of ``m - 1``,
      with the ``W`` of the steps ``j = r .. m - 2`` (``m - 1 - r``); rank 0
      then runs one more ``W``.
    * Interleaved 1F1B: in virtual micro-batches (``F`` of chunk ``c``,
      micro-batch 0 is ``a0 = c p``; the backward of chunk ``c``, micro-batch
      ``m - 1`` is ``b* = (m/p - 1) p v + (v - 1 - c) p + p - 1``), forward
      ``a`` sits at position ``a`` in the warm-up and ``warm + 2 (a - warm)``
      after it, backward ``b`` at ``warm + 2 b + 1`` in the steady phase and
      ``m v + b`` in the cool-down; the path holds the forwards
      ``a0 .. a_hi`` and backwards ``b_lo .. b*`` between the two positions.
      Rank 0's backward of micro-batch ``m - 1`` on stage 0 is its last action.
    """
    S = pp * vp
    ks = range(max(0, S - families), S)
    counts = []
    for k in ks:
        if schedule == "zb-h1":
            n = np.zeros((S, 4), dtype=np.int64)
            n[k] = (m, 0, m, m - 1 - k)
            n[0, 3] += 1
        else:
            n = _interleaved_chain(pp, m, vp, k)
        counts.append(n)
    out = np.array(counts, dtype=np.int64).reshape(len(counts), S, 4)
    out.setflags(write=False)  # memoised: shared by every caller
    return tuple(ks), out


def _interleaved_chain(pp: int, m: int, vp: int, k: int) -> np.ndarray:
    """``(S, 4)`` counts of the interleaved 1F1B chain of stage ``k``
    (:func:`_chain_counts`): the forwards ``a0 .. a_hi`` and backwards
    ``b_lo .. b*`` (virtual micro-batches) of rank ``k % pp`` between the
    positions of ``F`` of micro-batch 0 and ``B`` of ``m - 1`` on ``k``."""
    n = np.zeros((pp * vp, 4), dtype=np.int64)
    q, c = k % pp, k // pp
    total, group = m * vp, pp * vp
    warm = min((vp - 1) * pp + 2 * (pp - 1 - q), total)
    steady = total - warm
    a0, b_end = c * pp, (m // pp - 1) * group + (vp - 1 - c) * pp + pp - 1
    lo = a0 if a0 < warm else warm + 2 * (a0 - warm)
    hi = warm + 2 * b_end + 1 if b_end < steady else total + b_end
    a_hi = min(hi if hi < warm else warm + (hi - warm) // 2, total - 1)
    b_lo = max(0, -(-(lo - warm - 1) // 2))
    if b_lo >= steady:
        b_lo = max(steady, lo - total)
    for chunk in range(vp):
        n[chunk * pp + q, 0] = _in_chunk(a_hi + 1, chunk, pp, group) - _in_chunk(a0, chunk, pp, group)
        back = vp - 1 - chunk
        n[chunk * pp + q, 1] = _in_chunk(b_end + 1, back, pp, group) - _in_chunk(b_lo, back, pp, group)
    return n


def _in_chunk(n: int, chunk: int, p: int, group: int) -> int:
    """How many virtual micro-batches ``k < n`` have ``(k mod group) // p ==
    chunk``."""
    return (n // group) * p + min(max(n % group - chunk * p, 0), p)


#: steps of the weights' ascent in :func:`lagrange_weights` (counts, never seconds)
LAGRANGE_STEPS = 40
LAGRANGE_PATIENCE = 8  # steps without a better bound before it stops
LAGRANGE_WORK = 2**24  # family-times-stage-range products over all steps (fewer steps for large bands)
LAGRANGE_RANGES = 2**15  # stage ranges (stages x band) above which no weights are sought


def lagrange_weights(costs: PipelineCosts, schedule: str, pp: int, width: int, target_s: float = np.inf,
                     steps: int = LAGRANGE_STEPS, paths=()):
    """Weights for the combined family of :func:`bound_families`: an
    approximate maximizer of ``phi(w) = min_x sum_h w_h G_h(x)`` over the
    simplex (``G_h`` the families of :func:`separable_terms`, ``x`` the splits
    that fit with stages of at most ``width`` layers), by exponentiated
    subgradient ascent (Kivinen and Warmuth 1997, Information and Computation
    132(1)): the subgradient at ``w`` is ``G(x_w)`` for the split ``x_w`` a
    min-sum DP finds. Every ``w`` of the simplex gives a valid lower bound
    ``phi(w)`` of every split's time; the best one seen is returned.

    Stops after ``steps`` steps (fewer when the band is large: at most
    :data:`LAGRANGE_WORK` products in all), after :data:`LAGRANGE_PATIENCE`
    steps without a better bound, or once the bound reaches ``target_s``
    (counts, never seconds). Returns ``(weights, phi)``, or ``(None, 0.0)``
    when the band of all stages holds more than :data:`LAGRANGE_RANGES` stage
    ranges or no split fits. ``paths``: the path families of
    :func:`bound_families` (they join the families weighed).
    """
    L, S = costs.num_layers, costs.pp
    W = max(1, min(width, L))
    if S * W * (L + 1) > LAGRANGE_RANGES:
        return None, 0.0
    i = np.broadcast_to(np.arange(L + 1)[None, :], (W, L + 1))
    j = i + np.arange(1, W + 1)[:, None]
    stages = np.arange(S)[:, None, None]
    jc = np.minimum(j, L)
    ok = (j <= L)[None] & np.broadcast_to(costs.fits(stages, i[None], jc[None]), (S, W, L + 1))
    fitting = int(ok.sum())  # the step budget counts these (the ranges below only drop infinite candidates)
    # only the ranges some split can hold (stage s from the starts the tables use, ending at a start of
    # stage s + 1): the others never lie on a finite path of the min-sum DP, so every pick is the same
    st = np.arange(S)
    first, last = np.maximum(st, L - (S - st) * W), np.minimum(st * W, L - S + st)
    then_first, then_last = np.append(first[1:], L), np.append(last[1:], L)
    ok &= (i[None] >= first[:, None, None]) & (i[None] <= last[:, None, None])
    ok &= (jc[None] >= then_first[:, None, None]) & (jc[None] <= then_last[:, None, None])
    ks, rows, at = np.nonzero(ok)  # row-major, the order of ok's True entries
    terms = separable_terms(bound_families(costs, schedule, pp, ks, at, at + rows + 1, chains=True, paths=paths), ks,
                            pp)
    if not terms:
        return None, 0.0
    G = np.stack([np.broadcast_to(a, ks.shape) for a in terms]).astype(float)  # (H, ranges a split can hold)
    steps = min(steps, max(1, LAGRANGE_WORK // max(len(terms) * fitting, 1)))
    w = np.full(len(terms), 1.0 / len(terms))
    best, best_w, since = -np.inf, w, 0
    alpha = np.full(ok.shape, np.inf)
    rank = np.cumsum(ok.ravel()) - 1  # an entry's position among the True ones
    for t in range(steps):
        alpha[ok] = np.einsum("h,hn->n", w, G)  # (not BLAS: its threads stall on a loaded machine)
        picked = _min_sum_path(alpha, jc, rank)
        if picked is None:
            return None, 0.0
        g = G[:, picked].sum(axis=1)
        since += 1
        if w @ g > best:
            best, best_w, since = float(w @ g), w, 0
        spread = float(g.max() - g.min())
        if best >= target_s or since > LAGRANGE_PATIENCE or spread <= 0:
            break
        w = w * np.exp(2.0 / np.sqrt(t + 1) * (g - g.max()) / spread)
        w = w / w.sum()
    return best_w, best


def _min_sum_path(alpha: np.ndarray, jc: np.ndarray, rank: np.ndarray):
    """The split minimizing ``sum_s alpha[s, d - 1, x_s]`` (``alpha``: ``(S,
    W, L+1)``, infinite where a stage may not go; ``jc[d - 1, i]`` the end of
    the stage ``[i, i + d)``): the positions of its stages among the
    allowed entries (``rank``: each entry's position among them, row-major),
    or None when every split is infinite."""
    S, W, L1 = alpha.shape
    value = np.full(L1, np.inf)
    value[L1 - 1] = 0.0
    cols = np.arange(L1)
    choice = []
    for s in range(S - 1, -1, -1):
        tot = alpha[s] + value[jc]
        arg = np.argmin(tot, axis=0)
        value = tot[arg, cols]
        choice.append(arg)
    if not np.isfinite(value[0]):
        return None
    flat, at = [], 0
    for s in range(S):
        d = int(choice[S - 1 - s][at])
        flat.append((s * W + d) * L1 + at)
        at = int(jc[d, at])
    return rank[np.array(flat)]


@lru_cache(maxsize=512)
def _work_before_last_forward(schedule: str, pp: int, m: int, vp: int):
    """Per stage: the ``F``, ``B``, ``I``, ``W`` counts of
    :func:`pipesearch.schedules.work_until_last_forward` as int arrays."""
    counts = schedule_lib.work_until_last_forward(schedule, pp, m, vp)
    return tuple(np.array(counts[k], dtype=np.int64) for k in "FBIW")


_KINDS = ("sum", "max", "prefix", "suffix", "device")

#: schedules whose cutoff proof first tables their own closed form's families alone
#: (:func:`bound_families` ``own_only``); on the default plan and GPT-3 175B at
#: 1,024 and 16,384 GPUs they excluded every one of the 414 points the root
#: bound of all families excludes (the other points need the full tables anyway)
OWN_FAMILY_SCHEDULES = ("gpipe", "1f1b", "zb-h1")


#: floats the band tables of one block of stages may hold; longer models are
#: tabled block by block and their terms recomputed per node (memory stays
#: linear in layers x band width)
TABLE_FLOATS = 2**23
_ROWS_PER_STAGE = 32  # an upper bound on the stacked components of a stage
_COLUMN_CHUNK = 16  # starts of one stage whose terms are recomputed together (kept up to TABLE_FLOATS floats)


class _Tables:
    """Band tables of the bound components and their suffix minima, per kind
    of component (all components of one kind are stacked on a leading axis).

    ``fam[K]`` holds the family of each component of kind ``K``. A stage's
    terms (:meth:`column`) are ``alpha[K]``, ``beta[K]`` of shape ``(Q_K,
    W)`` (row ``d - 1``: the stage ``[i, i + d)``) and whether that stage
    fits in memory. The suffix minima (:meth:`suffix_min`) bound each
    component over every split of ``[i, L)`` into stages ``s .. S-1``, shape
    ``(Q_K, L+1)``: ``sum``: min sum; ``max``: min max; ``prefix``: ``min
    max_k (sum_{s<=k'<k} alpha + beta_k)``; ``suffix``: the pair ``(min sum
    alpha, min max_k (beta_k + sum_{k'>k} alpha))``; ``device``: min sum
    beta.

    Only the ranges a split can hold are tabled: stage ``s`` from the layers
    ``max(s, L - (S - s) W) .. min(s W, L - S + s)`` (``_start``, ``_stop``),
    stages of at most ``W = min(width, L - S + 1)`` layers, the first stage
    only from layer 0 and the last one only up to layer ``L`` (one range per
    start); with ``limit_s`` (only splits faster than it matter, ``W`` its
    :func:`_width_for`) also only from the layers whose compute before them
    the ``s`` stages before can hold and whose compute after them the rest
    can (each at most :func:`_span_s`: ``c(i) <= s span`` and ``c(L) -
    c(i) <= (S - s) span``, ``c`` the compute prefix), which on layers of
    unequal times is narrower than counting ``W`` layers per stage; the
    minima from other layers are infinite. Within a block of
    stages the band is cut to the longest range that fits in memory
    (longer ones are +inf). The components are stacked by how the backward
    DP combines them (:meth:`_block`): ``add`` (``sum`` alpha, ``device``
    beta, ``suffix`` alpha: min-sum), ``mx`` (``max`` and ``prefix`` beta:
    min-max, with the ``prefix`` alpha in ``mxa``) and ``sfx`` (``suffix``
    beta). The stages are tabled in blocks of at most
    :data:`TABLE_FLOATS` floats, laid out ``(Q, stage, start, length)``, so
    that stage ``s``'s DP step reads the minima of stage ``s + 1`` at ``i +
    d`` as a sliding window (no gather) and takes one minimum over the
    contiguous last axis per component. Memory is ``O(Q S L)`` for the
    minima plus one block. The terms of the stages are kept for
    :meth:`column` when they fit in one block (those of the last stage
    always), else recomputed there.
    """

    def __init__(self, costs: PipelineCosts, schedule: str, pp: int, width: int, weights=None, chains: bool = False,
                 paths=(), own_only: bool = False, limit_s: float = np.inf):
        L, S = costs.num_layers, costs.pp
        self.costs, self.schedule, self.pp, self.own_only, self.limit_s = costs, schedule, pp, own_only, limit_s
        self.width = max(1, min(width, L))
        # no stage of a split is longer than L - S + 1 (every other stage has a layer)
        self.rows = W = max(1, min(self.width, L - S + 1))
        self._kept: dict = {}
        self._columns: dict = {}
        self._held = 0  # floats in _columns
        self._suf = [None] * (S + 1)
        self.weights, self.chains, self.paths = weights, chains, paths
        # stage s from every layer it can start at in a split of stages of at
        # most W layers: from max(s, L - (S - s) W) (the later stages cover
        # the rest) to min(s W, L - S + s) (every other stage holds a layer);
        # the suffix minima from other layers are infinite
        st = np.arange(S)
        self._start = np.maximum(st, L - (S - st) * W)
        self._stop = np.minimum(st * W, L - S + st)
        if np.isfinite(limit_s):  # and the compute the stages before and after can hold
            cp, span = costs.compute_prefix_s, _span_s(costs, limit_s)
            self._start = np.maximum(self._start, np.searchsorted(cp, cp[-1] - (S - st) * span, "left"))
            self._stop = np.minimum(self._stop, np.searchsorted(cp, st * span, "right") - 1)
        rows = _ROWS_PER_STAGE + (MAX_CHAIN_FAMILIES + 1 + _path_rows(paths) if chains else 0)
        if self._block_size(rows, S) >= S:  # every stage in one block (the first from layer 0, the last to L)
            self._stages(0, S, keep=True)
            return
        block = self._block_size(rows)
        self._last_stage()  # several blocks: the last stage's one range per start on its own, kept
        for hi in range(S - 1, 1, -block):
            self._stages(max(1, hi - block), hi, keep=block >= S - 2)
        self._stages(0, 1, keep=True)  # one start: layer 0

    def _block_size(self, rows: int, upto: int | None = None) -> int:
        """Stages per block: ``rows`` stacked components of the band of each
        within :data:`TABLE_FLOATS` floats (at least one stage), the band
        as wide as the most starts of stages ``1 .. upto - 1`` (default: the
        middle stages)."""
        upto = self.costs.pp - 1 if upto is None else upto
        U = int(max(1, np.max(self._stop[1:upto] - self._start[1:upto] + 1, initial=1)))
        return max(1, TABLE_FLOATS // (rows * self.rows * U))

    def with_chains(self, weights, paths=()) -> "_Tables":
        """``_Tables(costs, schedule, pp, width, weights, chains=True, paths)`` of
        this table's point and width, equal to it entry for entry, built
        from this table (without chains): the families it has come first
        and each component's DP row is independent of the others, so only
        the added ``sum`` rows (the chain families and the combined one of
        ``weights``) are tabled for the middle stages; the first and the
        last stage (one range per start) are tabled whole. Built from
        scratch when this table has chains or weights already or keeps its
        middle terms."""
        costs, S = self.costs, self.costs.pp
        new = _Tables.__new__(_Tables)
        # (and when a path family adds a row other than a sum: :meth:`_added_rows` tables sums only)
        if self.chains or self.weights is not None or self.own_only or S <= 2 or any(
                where == "banded" and 0 < k < S - 1 for k, (where, *_) in self._kept.items()) or any(
                len(coef) > len(PATH_TERMS) for coef in paths):
            new.__init__(costs, self.schedule, self.pp, self.width, weights, chains=True, paths=paths,
                         limit_s=self.limit_s)
            return new
        new.costs, new.schedule, new.pp, new.width, new.rows = costs, self.schedule, self.pp, self.width, self.rows
        new.own_only, new.limit_s = False, self.limit_s
        new.weights, new.chains, new.paths = weights, True, paths
        new._kept, new._columns, new._held, new._suf = {}, {}, 0, [None] * (S + 1)
        new._start, new._stop = self._start, self._stop
        new._last_stage()
        block = new._block_size(MAX_CHAIN_FAMILIES + 1 + _path_rows(paths))
        for hi in range(S - 1, 1, -block):
            new._added_rows(max(1, hi - block), hi, self)
        new._stages(0, 1, keep=True)
        return new

    def _band(self, lo: int, hi: int):
        """The band of stages ``lo .. hi-1``: ``(stages, i, j, ok, first)``
        with ``i`` ``(n, U, 1)`` the starts from each stage's first
        (``first``; clipped below ``L``), ``j`` ``(n, U, Wb)`` the ends and
        ``ok`` whether each range ends by ``L``, starts by the stage's last
        start (``_stop``) and fits in memory; ``Wb`` the longest length that
        is ``ok`` somewhere (longer ones are +inf everywhere)."""
        L, W = self.costs.num_layers, self.rows
        first, stop = self._start[lo:hi], self._stop[lo:hi]
        U = int(max(1, np.max(stop - first) + 1))
        stages = np.arange(lo, hi)[:, None, None]
        at = first[:, None, None] + np.arange(U)[None, :, None]  # (n, U, 1)
        i = np.minimum(at, L - 1)  # past a stage's last start: masked
        j = i + np.arange(1, W + 1)  # (n, U, W)
        ok = (j <= L) & (at <= stop[:, None, None])
        if hi == self.costs.pp:  # the last stage ends at L
            ok[-1] &= j[-1] == L
        ok = ok & self.costs.fits(stages, i, np.minimum(j, L))
        rows = np.flatnonzero(ok.any(axis=(0, 1)))
        Wb = int(rows[-1]) + 1 if len(rows) else 1
        return stages, i, j[..., :Wb], ok[..., :Wb], first

    def _added_rows(self, lo: int, hi: int, cheap: "_Tables") -> None:
        """Stages ``lo .. hi-1`` of :meth:`with_chains`: the DP of the ``sum``
        rows past those of ``cheap`` (same point and width), every other row
        of the minima taken from ``cheap``."""
        stages, i, j, ok, first = self._band(lo, hi)
        L = self.costs.num_layers
        fams = bound_families(self.costs, self.schedule, self.pp, stages, i, np.minimum(j, L), self.weights, True,
                              paths=self.paths)
        n0 = cheap._sizes["sum"]
        sums = [a for fam in fams for kind, a, _ in fam if kind == "sum"][n0:]
        t = self._stack(sums, np.inf, ok)
        U, Wb = t.shape[2:]
        buf = np.empty((len(t), U, Wb))
        for s in range(hi - 1, lo - 1, -1):
            k, at = s - lo, int(first[s - lo])
            np.add(t[:, k], self._window(self._suf[s + 1]["add"][n0:n0 + len(t)], at, U, Wb), out=buf)
            c = cheap._suf[s]
            self._suf[s] = {"add": np.concatenate([c["add"][:n0], self._placed(buf.min(axis=2), at), c["add"][n0:]]),
                            "mx": c["mx"], "sfx": c["sfx"]}

    def _window(self, v: np.ndarray, at: int, U: int, Wb: int) -> np.ndarray:
        """``v[:, at + u + d]`` for ``u < U``, ``d = 1 .. Wb`` (``v``: a row of
        suffix minima, ``(Q, L + rows + 2)``, +inf past ``L``, :meth:`_row`): a
        ``(Q, U, Wb)`` sliding-window view of ``v`` (of a copy padded with
        more +inf when a window reaches past it)."""
        if at + U + Wb >= v.shape[1]:
            pad = np.full((len(v), at + U + Wb + 1), np.inf)
            pad[:, :v.shape[1]] = v
            v = pad
        if not v.flags.c_contiguous:
            v = np.ascontiguousarray(v)
        step = v.strides[1]  # [q, u, d] -> v[q, at + 1 + u + d]: a view made by the array constructor (C)
        out = np.ndarray((len(v), U, Wb), dtype=v.dtype, buffer=v, offset=(at + 1) * step,
                         strides=(v.strides[0], step, step))
        out.flags.writeable = False
        return out

    def _row(self, q: int) -> np.ndarray:
        """A ``(q, L + rows + 2)`` row of suffix minima, all +inf: columns
        ``0 .. L`` are starts, the rest padding that lets :meth:`_window` read
        every window as a view."""
        return np.full((q, self.costs.num_layers + self.rows + 2), np.inf)

    @staticmethod
    def _stack(xs, fill: float, ok: np.ndarray) -> np.ndarray:
        """The arrays ``xs`` (each broadcast to ``ok``'s shape) stacked on a
        leading axis, ``fill`` where not ``ok``."""
        out = np.empty((len(xs),) + ok.shape)
        if fill == np.inf and len(xs):  # one pass per row: fmax(x, -inf) = x, fmax(x, +inf) = +inf (exact)
            floor = np.where(ok, -np.inf, np.inf)
            for row, x in zip(out, xs):
                np.fmax(x, floor, out=row)
            return out
        for row, x in zip(out, xs):
            row[...] = x
        np.copyto(out, fill, where=~ok)
        return out

    def _last_stage(self) -> None:
        """The last stage from each start it can have to layer ``L`` (one
        range per start), and its suffix minima: its own terms (every layer
        is then placed). For tables of several blocks (:meth:`_stages` tables
        it in the band of the others when all fit in one: fewer numpy
        passes, but a band of its masked lengths, which on 1,000 layers x 64
        stages, kept, held 35 MiB more)."""
        L, S, W = self.costs.num_layers, self.costs.pp, self.rows
        s, first, stop = S - 1, int(self._start[S - 1]), int(self._stop[S - 1])
        i = np.arange(first, max(first, stop) + 1)  # (one masked start when none is possible)
        j = np.full_like(i, L)
        ok = (i >= first) & (i <= stop) & (j - i <= W) & (j > i)
        ok = ok & np.broadcast_to(self.costs.fits(np.array(s), i, j), ok.shape)
        groups, ok = self._block(np.array(s), i, j, ok)
        self._kept[s] = ("last", int(i[0]), groups, ok)
        self._end_row(groups)
        nxt, g, nmax = self._suf[S], groups, self._sizes["max"]
        h_add, h_mx, h_sfx = nxt["add"][:, L:L + 1], nxt["mx"][:, L:L + 1], nxt["sfx"][:, L:L + 1]
        na0, ns = self._rows["suffix"][1], self._sizes["suffix"]
        mx = np.concatenate([np.maximum(g["mx"][:nmax], h_mx[:nmax]),
                             np.maximum(g["mx"][nmax:], g["mxa"] + h_mx[nmax:])])
        self._suf[s] = {kind: self._placed(v, int(i[0])) for kind, v in
                        (("add", g["add"] + h_add), ("mx", mx),
                         ("sfx", np.maximum(g["sfx"] + h_add[na0:na0 + ns], h_sfx)))}

    def _end_row(self, groups) -> None:
        """The minima past the last stage: every layer placed, 0 for the sums
        and -inf for the maxima at ``L`` (+inf elsewhere)."""
        self._suf[self.costs.pp] = {kind: self._placed(np.full((len(groups[kind]), 1), value), self.costs.num_layers)
                                    for kind, value in (("add", 0.0), ("mx", -np.inf), ("sfx", -np.inf))}

    def _placed(self, v: np.ndarray, at: int) -> np.ndarray:
        """``v`` (``(Q, U)``: starts ``at .. at + U - 1``) in a row of +inf
        (:meth:`_row`; starts past ``L`` dropped)."""
        L = self.costs.num_layers
        out = self._row(len(v))
        n = max(0, min(v.shape[1], L + 1 - at))
        out[:, at:at + n] = v[:, :n]
        return out

    def _stages(self, lo: int, hi: int, keep: bool = True) -> None:
        """Table stages ``lo .. hi-1`` from each one's first possible start
        (``_start``) on, those past its last start (``_stop``) masked as not
        fitting, with every length up to the longest that fits (the last
        stage only the one that ends at ``L``), and their suffix minima
        (:meth:`_banded_minima`; with the last stage, from the row past it:
        0 for the sums and -inf for the maxima at ``L``, every layer
        placed); keep their terms for :meth:`column` when ``keep``. When
        every stage fits one block, the last stage is tabled in the band of
        the others, not on its own (:meth:`_last_stage`): on the default
        plan's own-family tables that saved about a tenth of their CPU
        time, though it tables more ranges (its masked ones)."""
        stages, i, j, ok, first = self._band(lo, hi)
        groups, ok = self._block(stages, i, j, ok)
        if keep:
            self._kept.update({k: ("banded", lo, groups, ok) for k in range(lo, hi)})
        if hi == self.costs.pp:
            self._end_row(groups)
        self._banded_minima(groups, ok, lo, hi, first)

    def _block(self, stages, i, j, ok=None):
        """Stacked terms of ``stages`` (int array broadcast against ``i``,
        ``j``) over the ranges ``[i, j)``: ``(groups, ok)`` with ``groups``
        the ``add``, ``mx``, ``mxa`` and ``sfx`` stacks (class docstring),
        each ``(Q,) + shape``, and ``ok`` whether the range is valid and fits
        (computed when None). Ranges that are not ``ok`` are +inf in every
        stack but ``mxa`` (0 there), so that each of their DP candidates is
        +inf (never nan: finite terms plus a suffix value in ``[-inf,
        inf]``)."""
        L = self.costs.num_layers
        jc = np.minimum(j, L)
        shape = np.broadcast_shapes(np.shape(stages), np.shape(i), np.shape(j))
        if ok is None:
            ok = (j <= L) & (j > i) & (j - i <= self.rows)
            ok = ok & self.costs.fits(stages, i, jc)
        ok = np.broadcast_to(ok, shape)
        fams = bound_families(self.costs, self.schedule, self.pp, stages, i, jc, self.weights, self.chains,
                              paths=self.paths, own_only=self.own_only)
        comps = {kind: [(f, a, x) for f, fam in enumerate(fams) for k, a, x in fam if k == kind] for kind in _KINDS}
        self.fam = {kind: np.array([f for f, _, _ in c], dtype=np.int64) for kind, c in comps.items() if c}
        self.kinds, self.num_families = tuple(self.fam), len(fams)  # the same for every block
        self._sizes = sizes = {k: len(c) for k, c in comps.items()}
        na0 = sizes["sum"] + sizes["device"]
        self._rows = {"sum": ("add", 0, sizes["sum"]), "device": ("add", sizes["sum"], na0),
                      "suffix": ("add", na0, na0 + sizes["suffix"]),
                      "max": ("mx", 0, sizes["max"]), "prefix": ("mx", sizes["max"], sizes["max"] + sizes["prefix"])}

        def stack(xs, fill):
            return self._stack(xs, fill, ok)

        alphas = {k: [a for _, a, _ in c] for k, c in comps.items()}
        betas = {k: [x for _, _, x in c] for k, c in comps.items()}
        groups = {"add": stack(alphas["sum"] + betas["device"] + alphas["suffix"], np.inf),
                  "mx": stack(betas["max"] + betas["prefix"], np.inf),
                  "mxa": stack(alphas["prefix"], 0.0), "sfx": stack(betas["suffix"], np.inf)}
        return groups, ok

    def _views(self, groups, pick):
        """Per kind ``(alpha, beta)`` (None where the kind has none) of the
        stacks ``groups``, each indexed by ``pick`` after the component axis."""
        out = {}
        for kind in self.kinds:
            group, a, b = self._rows[kind]
            rows = groups[group][a:b][pick]
            alpha = {"sum": rows, "suffix": rows, "prefix": groups["mxa"][pick]}.get(kind)
            beta = None if kind == "sum" else groups["sfx"][pick] if kind == "suffix" else rows
            out[kind] = (alpha, beta)
        return out

    def column(self, s: int, i: int):
        """Stage ``s`` starting at layer ``i``, every length ``d = 1 .. W``:
        ``({kind: (alpha, beta)}, fits)`` with arrays ``(Q_K, W)`` and
        ``(W,)``; terms of the ranges that do not fit are arbitrary."""
        where, lo, groups, ok = self._kept.get(s, (None, 0, None, None))
        W = self.rows
        if where == "banded" and 0 <= i - self._start[s] < ok.shape[1]:
            k, u = s - lo, i - self._start[s]
            return self._padded(self._views(groups, (slice(None), k, u)), ok[k, u], W)
        if where == "last":  # the one length that ends at L
            d, u = self.costs.num_layers - i, i - lo
            fits = np.zeros(W, dtype=bool)
            cols = {kind: tuple(None if x is None else np.full((len(x), W), np.inf) for x in ab)
                    for kind, ab in self._views(groups, (slice(None), slice(0, 0))).items()}
            if 1 <= d <= W and 0 <= u < len(ok):
                fits[d - 1] = ok[u]
                for kind, ab in self._views(groups, (slice(None), u)).items():
                    for out, x in zip(cols[kind], ab):
                        if x is not None:
                            out[:, d - 1] = x
            return cols, fits
        key = (s, i // _COLUMN_CHUNK)  # the starts of one chunk in one pass (a node's children start close by)
        if key not in self._columns:
            if self._held > TABLE_FLOATS:
                self._columns.clear()
                self._held = 0
            L = self.costs.num_layers
            at = key[1] * _COLUMN_CHUNK + np.arange(_COLUMN_CHUNK)[:, None]
            start = np.minimum(at, L - 1)
            j = start + np.arange(1, W + 1)
            ok = (j <= L) & (at < L) & self.costs.fits(np.array(s), start, np.minimum(j, L))
            if s == self.costs.pp - 1:  # the last stage ends at L
                ok &= j == L
            self._columns[key] = self._block(np.array(s), start, j, ok)
            self._held += sum(g.size for g in self._columns[key][0].values())
        groups, ok = self._columns[key]
        u = i % _COLUMN_CHUNK
        return self._views(groups, (slice(None), u)), ok[u]

    @staticmethod
    def _padded(cols, ok, W: int):
        """Columns of a band cut to ``len(ok) <= W`` lengths, padded to ``W``
        (the longer ranges do not fit)."""
        if len(ok) == W:
            return cols, ok
        fits = np.zeros(W, dtype=bool)
        fits[:len(ok)] = ok
        out = {}
        for kind, ab in cols.items():
            out[kind] = tuple(None if x is None else np.concatenate(
                [x, np.full((len(x), W - len(ok)), np.inf)], axis=1) for x in ab)
        return out, fits

    def _banded_minima(self, groups, ok, lo: int, hi: int, first: np.ndarray) -> None:
        """The backward DP over stages ``hi - 1 .. lo`` of every component at
        once, from the minima of stage ``hi``: stage ``s`` from ``i = first +
        u`` takes, per component, the minimum over the lengths ``d`` of its
        term combined with the next stage's minimum at ``i + d`` (``add``:
        sum; ``mx``: ``max(beta, alpha + next)``; ``sfx``: ``max(beta + next
        add, next sfx)``), read as a sliding window over that row padded
        with +inf (``groups``: ``(Q, n, U, Wb)`` from :meth:`_stages`)."""
        _, _, U, Wb = groups["add"].shape
        nmax, ns = self._sizes["max"], self._sizes["suffix"]
        na0 = self._rows["suffix"][1]
        t_add, t_mx, a_mx, x_sfx = groups["add"], groups["mx"], groups["mxa"], groups["sfx"]
        buf = np.empty((max(len(t_add), len(t_mx), 1), U, Wb))
        # the rows of minima of these stages (:meth:`_row`), all +inf but the starts each stage writes
        width = self.costs.num_layers + self.rows + 2
        rows = {g: np.full((hi - lo, len(x), width), np.inf) for g, x in (("add", t_add), ("mx", t_mx), ("sfx", x_sfx))}
        for s in range(hi - 1, lo - 1, -1):
            k, at = s - lo, int(first[s - lo])
            nxt = self._suf[s + 1]
            h_add, h_mx, h_sfx = (self._window(nxt[g], at, U, Wb) for g in ("add", "mx", "sfx"))
            n = max(0, min(U, self.costs.num_layers + 1 - at))  # starts past L dropped (:meth:`_placed`)
            b = buf[:len(t_add)]
            np.add(t_add[:, k], h_add, out=b)
            rows["add"][k, :, at:at + n] = b.min(axis=2)[:, :n]
            b = buf[:len(t_mx)]
            np.maximum(t_mx[:nmax, k], h_mx[:nmax], out=b[:nmax])
            np.add(a_mx[:, k], h_mx[nmax:], out=b[nmax:])
            np.maximum(b[nmax:], t_mx[nmax:, k], out=b[nmax:])
            rows["mx"][k, :, at:at + n] = b.min(axis=2)[:, :n]
            b = buf[:ns]
            np.add(x_sfx[:, k], h_add[na0:na0 + ns], out=b)
            np.maximum(b, h_sfx, out=b)
            rows["sfx"][k, :, at:at + n] = b.min(axis=2)[:, :n]
            self._suf[s] = {g: v[k] for g, v in rows.items()}

    def suffix_min(self, kind: str, s: int):
        """The suffix minima of the components of ``kind`` from stage ``s``:
        ``(Q_K, L+1)``; for ``suffix`` the pair (min sum alpha, min max)."""
        group, a, b = self._rows[kind]
        n = self.costs.num_layers + 1
        if kind == "suffix":
            return self._suf[s]["add"][a:b, :n], self._suf[s]["sfx"][:, :n]
        return self._suf[s][group][a:b, :n]

    def root_bound(self) -> float:
        """The smallest lower bound of any split: each family's suffix minima
        from stage 0 at layer 0."""
        fam = np.zeros(self.num_families)
        for kind in self.kinds:
            v = self.suffix_min(kind, 0)
            v = v[1][:, 0] if kind == "suffix" else v[:, 0]
            if kind == "device":
                v = v / self.pp
            np.add.at(fam, self.fam[kind], v)
        return float(fam.max())


def any_split_fits(costs: PipelineCosts, cache: dict | None = None) -> bool:
    """Whether some split of the ``L`` layers into ``S`` stages of at least
    one layer fits every stage's memory, in ``O(S L log L)`` vectorised
    work. A stage's memory only grows with its range (a sub-range of a
    fitting range fits), so from a start ``i`` stage ``s`` fits exactly the
    ends ``i < j <= e_s(i)``, ``e_s(i)`` found by bisection for every ``i``
    at once; the ends stage ``s`` can reach are the union of those
    intervals over the starts stage ``s - 1`` reached (a difference array).
    Stages may differ in capacity, so no greedy choice of one end is safe
    (the longest range for stage ``s`` can force stage ``s + 1`` onto a
    layer it cannot hold). Where devices hold several stages
    (:attr:`PipelineCosts.chunk_states`) each device is checked whole
    (:func:`_device_split_fits`; ``cache``: one point's dict, which keeps
    the witness split it seeks, :func:`_witness`)."""
    L, S = costs.num_layers, costs.pp
    if S > L:
        return False
    if costs.chunk_states is not None:
        return _device_split_fits(costs, cache)
    even = np.asarray(even_split(L, S))
    if np.all(costs.fits(np.arange(S), even[:-1], even[1:])):  # the commonest case: one fits call in all
        return True
    if _greedy_split_fits(costs):  # a split it builds fits: one fits call per stage
        return True
    return _stage_reach(costs)


def _stage_reach(costs: PipelineCosts) -> bool:
    """Whether some split fits every stage on its own (:meth:`PipelineCosts.fits`):
    the reach of each stage's ends over the starts the one before reached."""
    L, S = costs.num_layers, costs.pp
    reach = np.zeros(L + 1, dtype=bool)
    reach[0] = True
    for s in range(S):
        last = L - (S - 1 - s)  # leave a layer for every later stage
        starts = np.flatnonzero(reach[:last])
        if not len(starts):
            return False
        ends = _longest_fit(costs, s, starts, last)
        mark = np.zeros(L + 2, dtype=np.int64)
        ok = ends > starts
        np.add.at(mark, starts[ok] + 1, 1)
        np.add.at(mark, ends[ok] + 1, -1)
        reach = np.cumsum(mark)[:L + 1] > 0
    return bool(reach[L])


#: (chunk 0 end, chunk 0 range, chunk 1 range) cells up to which :func:`_device_split_fits`
#: is exact for two chunks per device (about ``pp (L + 1)^5`` multiply-adds)
DEVICE_FIT_CELLS = 2**22


def _device_split_fits(costs: PipelineCosts, cache: dict | None = None) -> bool:
    """:func:`any_split_fits` with devices holding ``vp`` stages each
    (stage ``c pp + r`` on device ``r``): no split fits when no split fits
    every stage alone (:func:`_stage_reach`) or no count of layers per
    device fits (:func:`_devices_can_hold`). With two chunks and at most
    :data:`DEVICE_FIT_CELLS` cells the answer is exact: device by device,
    the boundaries ``(k, b_r, b_{pp + r})`` reachable (chunk 0 ends at
    ``k``), each device's two ranges checked together by
    :meth:`PipelineCosts.device_memory_bytes`' rule; a split fits when
    some ``(k, k, L)`` is reached. Above that size, or with more chunks,
    these necessary conditions only (the split search checks every
    device of what it returns). The even split is tried first, then the
    witness of :func:`_device_balanced_split` (``O(L)`` moves): when one
    fits, so does some split (on the 1,500-layer profile of
    benchmarks/bench_scale.py the witness settled 11 of 52 points, each in
    about 1 ms against 10 ms for the stage reach before it; kept in
    ``cache``, :func:`_balanced_witness`). The dearer witness of
    :func:`_chunk_moved_split` is left to the split search's starts
    (:func:`_witness`): on that profile it took 1.0 of the search's 5.3 CPU
    s on a 2-core machine, about 80 ms on each point it found none."""
    R, _, v = costs.chunk_states.shape
    L = costs.num_layers
    if costs.split_fits(even_split(L, costs.pp)):  # the commonest case
        return True
    held = _balanced_witness(costs, cache)
    if held is not None and costs.split_fits(held):
        return True
    if not _stage_reach(costs) or not _devices_can_hold(costs, R):
        return False
    if v != 2 or R * (L + 1) ** 5 > DEVICE_FIT_CELLS:
        return True
    n = L + 1
    reach = np.zeros((n, n, n), dtype=np.float32)  # (k, end of chunk 0 so far, end of chunk 1 so far)
    reach[np.arange(n), 0, np.arange(n)] = 1.0
    for r in range(R):
        step = _device_pairs_fit(costs, r, n).reshape(n * n, n * n).astype(np.float32)
        reach = (reach.reshape(n, n * n) @ step > 0).astype(np.float32).reshape(n, n, n)
    return bool(np.any(reach[np.arange(n), np.arange(n), L] > 0))


def _witness(costs: PipelineCosts, cache: dict | None = None) -> tuple[int, ...] | None:
    """A split every device holds (several stages per device), a starting
    split of the search: :func:`_device_balanced_split`, else
    :func:`_chunk_moved_split` (up to ``4 L`` moves, each weighing every
    device: sought only where the split search needs its starts, not to
    tell whether a split fits, :func:`_device_split_fits`), kept in
    ``cache`` (one point's dict) when given."""
    cache = {} if cache is None else cache
    if "witness" not in cache:
        cache["witness"] = _balanced_witness(costs, cache) or _chunk_moved_split(costs, costs.chunk_states.shape[0])
    return cache["witness"]


def _balanced_witness(costs: PipelineCosts, cache: dict | None = None) -> tuple[int, ...] | None:
    """:func:`_device_balanced_split` of ``costs``, kept in ``cache`` when given."""
    cache = {} if cache is None else cache
    if "balanced" not in cache:
        cache["balanced"] = _device_balanced_split(costs, costs.chunk_states.shape[0])
    return cache["balanced"]


def _device_pairs_fit(costs: PipelineCosts, r: int, n: int) -> np.ndarray:
    """``(n, n, n, n)`` bools ``[i, u, j, w]``: whether device ``r`` holds
    stage ``r`` on ``[i, j)`` and stage ``pp + r`` on ``[u, w)`` (both
    ranges of at least one layer) at every one of its count states
    (:meth:`PipelineCosts.device_memory_bytes`' rule)."""
    R = costs.chunk_states.shape[0]
    i, j = np.triu_indices(n, 1)
    terms = []
    for s in (r, R + r):
        rest = np.full((n, n), np.inf)
        act = np.zeros((n, n))
        extra = np.zeros((n, n))
        ok = costs.fits(s, i, j)
        rest[i, j] = np.where(ok, costs.resident_bytes(s, i, j), np.inf)
        act[i, j] = costs.saved_bytes(s, i, j)
        extra[i, j] = costs.peak_extra_at(s, i, j)
        terms.append((rest, act, extra))
    (rest0, act0, extra0), (rest1, act1, extra1) = terms
    peak = np.maximum(extra0[:, None, :, None], extra1[None, :, None, :])  # one chunk's at a time
    held = np.zeros((n, n, n, n))
    for n0, n1 in costs.chunk_states[r]:
        held = np.maximum(held, n0 * act0[:, None, :, None] + n1 * act1[None, :, None, :])
    return rest0[:, None, :, None] + rest1[None, :, None, :] + peak + held <= costs.capacity_bytes[r]


def _greedy_split_fits(costs: PipelineCosts) -> bool:
    """Whether the split that gives each stage in turn the longest range that
    fits (leaving a layer for each later stage) fits: sufficient for
    :func:`any_split_fits`, not necessary when capacities differ."""
    L, S = costs.num_layers, costs.pp
    i = 0
    for s in range(S):
        last = L - (S - 1 - s)
        if i >= last:
            return False
        j = np.arange(i + 1, last + 1)
        ok = np.flatnonzero(costs.fits(s, i, j))
        if not len(ok):
            return False
        i = int(j[ok[-1]])
    return i == L


#: (start, end) pairs up to which :func:`_longest_fit` checks every pair in one call
LONGEST_FIT_CELLS = 2**16


def _longest_fit(costs: PipelineCosts, s: int, starts: np.ndarray, last: int) -> np.ndarray:
    """For each start ``i``, the largest end ``j <= last`` with ``[i, j)``
    fitting stage ``s`` (``i`` itself when not even one layer fits): with
    at most :data:`LONGEST_FIT_CELLS` (start, end) pairs, from one check of
    every pair (the ends that fit are ``i + 1 .. e``: a stage's memory grows
    with its range), else by bisection (:func:`_fit_ends`)."""
    ends = np.arange(int(starts.min(initial=last)) + 1, last + 1)
    if len(starts) * len(ends) <= LONGEST_FIT_CELLS:
        fit = costs.fits(s, starts[:, None], ends[None, :]) & (ends[None, :] > starts[:, None])
        return starts + np.count_nonzero(fit, axis=1)
    return _fit_ends(costs, np.full(len(starts), s), starts, np.full(len(starts), last))


def _fit_ends(costs: PipelineCosts, s: np.ndarray, starts: np.ndarray, last: np.ndarray) -> np.ndarray:
    """For each entry (stage ``s``, start ``i``, bound ``last``, arrays of
    one shape), the largest end ``j <= last`` with ``[i, j)`` fitting stage
    ``s`` (``i`` itself when not even one layer fits), by bisection over
    ``j`` for all entries at once: a stage's memory only grows with its
    range (:func:`any_split_fits`), so the ranges that fit from ``i`` are
    those up to it; ``log (last - i)`` calls of :meth:`PipelineCosts.fits`."""
    lo = starts.copy()  # fits (or is the empty range)
    hi = last + 1  # does not fit, or beyond last
    while True:
        active = hi - lo > 1
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        fit = np.zeros(lo.shape, dtype=bool)
        fit[active] = costs.fits(s[active], starts[active], mid[active])
        lo = np.where(active & fit, mid, lo)
        hi = np.where(active & ~fit, mid, hi)


def _width_for(costs: PipelineCosts, limit_s: float) -> int:
    """Longest stage (layers) whose ``m`` micro-batches of compute take at
    most ``limit_s`` on the fastest stage (no longer stage can be in a split
    faster than ``limit_s``: its rank does that work one micro-batch after
    another)."""
    L = costs.num_layers
    if not np.isfinite(limit_s):
        return L
    cp = costs.compute_prefix_s
    lo = np.searchsorted(cp, cp - _span_s(costs, limit_s), "left")
    return int(max(1, np.max(np.arange(L + 1) - lo)))


def _span_s(costs: PipelineCosts, limit_s: float) -> float:
    """The most compute (seconds of ``costs.compute_prefix_s``) one stage
    of a split faster than ``limit_s`` can hold: its rank runs the stage's
    ``m`` micro-batches one after another, at best on the fastest stage's
    device (with a relative margin of 1e-9 for rounding)."""
    return limit_s / (costs.num_micro_batches * max(float(np.min(costs.time_scale)), 1e-300)) * (1 + 1e-9) + 1e-15


class _Evaluator:
    """Exact times of splits, memoised, evaluated in vectorized batches."""

    def __init__(self, costs: PipelineCosts, schedule: str, pp: int, vp: int):
        self.costs, self.schedule, self.pp, self.vp = costs, schedule, pp, vp
        self.times: dict[tuple[int, ...], float] = {}
        self.feasible = 0  # finite times: a split over a whole GPU's memory (Mobius) is no work limit's split
        self.kept = None  # (splits, graph, node ends) of a pass run with keep (the starting splits)

    def batch_size(self) -> int:
        """Splits per vectorized evaluation: about two million graph nodes."""
        nodes = 4 * self.costs.pp * self.costs.num_micro_batches
        return int(max(1, min(_BATCH, 2_000_000 // max(nodes, 1))))

    def first_chunk(self) -> int:
        """Splits in the first evaluation of a batch of leaves (later ones
        double): about as many as cost one graph pass on their own
        (:func:`pipesearch.timemodel.evaluation_cost`), so a pass is never
        spent on one split while larger chunks cost little more."""
        fixed, per_split = evaluation_cost(self.schedule, self.pp, self.costs.num_micro_batches, self.vp)
        return int(min(self.batch_size(), max(1, fixed // max(per_split, 1))))

    def run(self, splits, keep: bool = False) -> None:
        """Evaluate the splits not evaluated yet. ``keep``: a chain
        schedule's splits that take one pass keep that pass's node ends
        (:attr:`kept`), for the critical paths of :func:`_start_paths`."""
        todo = list(dict.fromkeys(tuple(b) for b in splits if tuple(b) not in self.times))
        if not todo:
            return
        step = self.batch_size()  # memory: about two million graph nodes per pass, whatever the count asked
        for at in range(0, len(todo), step):
            chunk = todo[at:at + step]
            times = self.costs.stage_times(np.array(chunk, dtype=np.int64))
            if keep and len(todo) <= step and self.schedule in CHAIN_SCHEDULES and times.delayed_host_s is None:
                g, ends = graph_ends(self.schedule, self.pp, self.costs.num_micro_batches, self.vp, times)
                self.kept = (chunk, g, ends)
                t = times_of_ends(g, ends, times, self.pp)
            else:
                t = iteration_time_s(self.schedule, self.pp, self.costs.num_micro_batches, self.vp, times)
            t = [float(x) for x in np.atleast_1d(t)]
            self.times.update(zip(chunk, t))
            self.feasible += sum(1 for x in t if math.isfinite(x))

    def times_of(self, splits) -> list[float]:
        """The times of ``splits`` (evaluated by :meth:`run` where new)."""
        self.run(splits)
        return [self.times[tuple(b)] for b in splits]


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
    ev = _Evaluator(costs, schedule, pp, vp)
    tables = None
    cutoff_width = _width_for(costs, cutoff_s * (1 + tie_rel))  # no stage of a split faster than the cutoff is wider
    tabled = tables_fit(costs, cutoff_width)
    enumerated = schedule == "interleaved-1f1b" and _enumerable(costs, schedule, pp, vp)
    if np.isfinite(cutoff_s) and tabled and not value_above_cutoff and not enumerated:
        tables, proof = _cutoff_proof(costs, schedule, pp, ev, cutoff_s, tie_rel, max_splits, max_nodes, point_cache)
        if proof is not None:
            return None if isinstance(proof, str) else proof
    if enumerated and np.isfinite(cutoff_s) and tabled and not value_above_cutoff and _Tables(
            costs, schedule, pp, cutoff_width, limit_s=cutoff_s * (1 + tie_rel)).root_bound() >= cutoff_s:
        # the tables' root bound first: a sixth of the cost of every split's bound below, and on resnet50's
        # interleaved pp 2 points it settled 13 of the 15 those settle
        return ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    # (only the splits under the cutoff are asked about: above it a split's bound may be any bound above it)
    cheap = _cheap_bounded(costs, schedule, pp, np.inf if value_above_cutoff else cutoff_s * (1 + tie_rel)) \
        if enumerated else None
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
    if enumerated and _enumerate_all(costs, schedule, pp, vp, ev, enum_cutoff, tie_rel, cheap):
        # its bounds are the weakest (a branch and bound stops at its limits): few splits, each
        # simulated unless its bound excludes it
        if not ev.times:  # a split fits (checked above), but none beats the cutoff
            return ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
        chosen, best = _chosen(costs, ev, tie_rel)
        exact = not (value_above_cutoff and best > cutoff_s)
        return ExactSplit(chosen, ev.times[chosen], best, float(min(best, cutoff_s)), exact, len(ev.times), 0)
    width = _width_for(costs, incumbent * (1 + tie_rel))
    if not tabled or not tables_fit(costs, width):
        return _untabled(costs, ev, pp, tie_rel)
    paths = ()
    if tables is None and nodes_given is None and _fluid_only(costs, schedule, width):
        exact, frontier, nodes = False, untabled_bound_s(costs, pp), 0  # the relaxations' bound, no tables
    else:
        if tables is None:  # else the cutoff's band holds every stage a split faster than it can have
            tables = _Tables(costs, schedule, pp, width, limit_s=incumbent * (1 + tie_rel))
        width = tables.width
        if schedule in CHAIN_SCHEDULES and S * width * (L + 1) <= PATH_RANGES:
            paths = _start_paths(costs, schedule, pp, vp, ev)
        if schedule in CHAIN_SCHEDULES and not (schedule in FLUID_BOUND_SCHEDULES and _fluid_first(costs, width)):
            # the cheap bounds left work: add the chain and path families (on large tables of interleaved 1F1B the
            # fluid bound weighs the same paths together, and the branch and bound goes too few nodes deep to use
            # them)
            weights, _ = lagrange_weights(costs, schedule, pp, width, incumbent * (1 - tie_rel), paths=paths)
            tables = tables.with_chains(weights, paths)
        counter = _RankCount(costs, schedule, pp)
        if nodes_given is None:
            max_nodes = node_budget(tables.rows, L)
        state = _branch_and_bound(tables, ev, S, L, pp, incumbent, tie_rel, max_splits, max_nodes, counter)
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
    and, with several stages per device, the :func:`_witness`."""
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
        held = _witness(costs, point_cache)
        if held is not None:
            starts.append(held)
    point_cache["starts"] = starts
    return starts


def _run_starts(ev: "_Evaluator", starts, point_cache: dict, keep: bool) -> None:
    """``ev.run(starts, keep)``, or, when an earlier call on the point ran
    the same new splits (``point_cache``), their times from it: the same
    values, not simulated again (the pass :attr:`_Evaluator.kept` holds
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


def _device_balanced_split(costs: PipelineCosts, pp: int) -> tuple[int, ...] | None:
    """With several stages per device (:attr:`PipelineCosts.chunk_states`):
    a split that every device holds, found from the even counts of layers
    per rank by moving one layer at a time from the device most over its
    memory to the one with the most room left (each rank's layers spread
    evenly over its chunks, the later chunks, which hold fewer micro-batches,
    taking the odd ones); None when none is met in ``L`` moves, or when
    the counts come back to ones already tried (the moves then cycle
    through them: the same answer, without the rest of the ``L``). A starting
    split near the balanced ones where those overflow (their chunk 0 holds
    about twice chunk 1's micro-batches), for the search's first
    incumbent."""
    L, S = costs.num_layers, costs.pp
    v = S // pp
    counts = _even_rank_counts(L, pp)
    seen: set[bytes] = set()  # each move is a function of the counts alone: a count met again cycles for good
    for _ in range(L + 1):
        if np.any(counts < v) or counts.tobytes() in seen:
            return None
        seen.add(counts.tobytes())
        lengths = _chunk_lengths(counts, v)
        bounds = tuple(int(x) for x in np.concatenate([[0], np.cumsum(lengths.reshape(-1))]))
        room = costs.capacity_bytes[:pp] - costs.device_memory_bytes(np.array(bounds))
        if np.all(room >= 0) and costs.split_fits(bounds):
            return bounds
        counts[int(np.argmin(room))] -= 1
        counts[int(np.argmax(room))] += 1
    return None


def _even_rank_counts(L: int, pp: int) -> np.ndarray:
    """``(pp,)`` layers per rank of ``L`` layers, as even as they go (the
    last ``L mod pp`` ranks one more)."""
    return np.full(pp, L // pp) + (np.arange(pp) >= pp - L % pp)


def _chunk_lengths(counts: np.ndarray, v: int) -> np.ndarray:
    """``(v, pp)``: each rank's ``counts`` layers spread evenly over its
    ``v`` chunks, the later chunks (fewer micro-batches in flight) taking
    the odd ones; row ``c`` is chunk ``c`` of every rank (stage ``c pp + r``)."""
    return (counts[None, :] // v) + (np.arange(v)[:, None] >= v - counts[None, :] % v)


def _chunk_moved_split(costs: PipelineCosts, pp: int) -> tuple[int, ...] | None:
    """With several stages per device: a split that every device holds,
    found from the even counts of layers per rank (as
    :func:`_device_balanced_split`) by moving one layer at a time from the
    device most over its memory, out of its chunk that holds the most
    micro-batches (the layer there costs it the most), to the chunk that
    holds the fewest of the device with the most room left. Where moving
    whole layers per rank cycles (a rank's chunk 0 holds about twice chunk
    1's micro-batches: a layer off the rank takes twice the memory off it
    when it comes from chunk 0) this still moves by single layers: Llama 3
    405B at 8,192 tokens, tp 8 x pp 16 x vp 2 on 80 GB GPUs, whose even
    split overflows the first ten ranks by up to 33 GiB. None when no split
    is met in ``4 L`` moves, when the lengths come back to ones met, or when
    the device most over holds one layer per chunk."""
    L, S = costs.num_layers, costs.pp
    lengths = _chunk_lengths(_even_rank_counts(L, pp), S // pp).reshape(-1)
    if np.any(lengths < 1):
        return None
    held = costs.chunk_states.max(axis=1)  # (pp, v): each chunk's most micro-batches in flight
    seen: set[bytes] = set()
    for _ in range(4 * L):
        if lengths.tobytes() in seen:
            return None
        seen.add(lengths.tobytes())
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        room = costs.capacity_bytes[:pp] - costs.device_memory_bytes(bounds)
        if np.all(room >= 0):
            return tuple(int(x) for x in bounds) if costs.split_fits(bounds) else None
        r = int(np.argmin(room))
        give = [c * pp + r for c in np.argsort(-held[r], kind="stable") if lengths[c * pp + r] > 1]
        if not give:
            return None
        q = int(np.argmax(np.where(np.arange(pp) == r, -np.inf, room)))
        lengths[give[0]] -= 1
        lengths[int(np.argmin(held[q])) * pp + q] += 1
    return None


def _stopped_bound(costs: PipelineCosts, schedule: str, pp: int, vp: int, frontier_s: float, width: int,
                   limit_s: float, rank_cache: dict | None = None) -> float:
    """The lower bound of a branch and bound stopped at its limits with
    ``frontier_s`` the least bound of its open nodes, a search of stages of
    at most ``width`` layers (a split with a longer one is at least
    ``limit_s`` slow, :func:`_width_for`): also at least the fluid
    relaxation's (:func:`pipesearch.fluid_bound.fluid_lower_bound_s`) and
    ``min(B, limit_s)`` with ``B`` the whole-layers-per-rank bound
    (:func:`rank_layer_bound_s`), which the node bounds relax away on
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


def _start_paths(costs: PipelineCosts, schedule: str, pp: int, vp: int, ev: "_Evaluator") -> tuple:
    """The distinct critical paths (``(6, S)`` coefficients,
    :func:`pipesearch.timemodel.critical_path`) of the
    :data:`PATH_FAMILIES` fastest splits ``ev`` has evaluated (the starting
    splits): path families of :func:`bound_families` that are tight at
    those splits, where the fixed families can be far below the time. On
    graphs of at most :data:`pipesearch.timemodel.COMMON_NODE_GRAPHS`
    nodes, second and third, the fastest split's two families before every
    rank's all-reduce (``(7, S)``, marked by their seventh row,
    :func:`_path_family`): they hold where one stage's all-reduce dominates
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


def _enumerate_all(costs: PipelineCosts, schedule: str, pp: int, vp: int, ev: "_Evaluator",
                   cutoff_s: float = np.inf, tie_rel: float = EQUAL_TIME_REL, cheap=None) -> bool:
    """When the splits of ``L`` layers into ``S`` stages are few
    (``C(L-1, S-1)`` within :data:`ENUMERATE_SPLITS` and their evaluation
    within :data:`ENUMERATE_WORK`), settle the point by enumeration and
    return True; else False, nothing evaluated.

    Every split that fits gets its lower bound (:func:`split_lower_bounds`)
    and they are evaluated into ``ev`` in bound order, in batches, until the
    next bound exceeds ``min(best, cutoff_s) (1 + tie_rel)`` (``best`` the
    least time in ``ev``): a split left out has a time of at least its
    bound, so it neither beats the best nor comes within ``tie_rel`` of it
    (the tie-break of :func:`_chosen` sees every near-tie), nor beats the
    cutoff. When no split beats ``cutoff_s`` the least time in ``ev`` is at
    least ``cutoff_s`` (not necessarily the point's optimum). ``cheap``:
    :func:`_cheap_bounded` of the point when already computed."""
    if not _enumerable(costs, schedule, pp, vp):
        return False
    count = math.comb(costs.num_layers - 1, costs.pp - 1)
    _, per_split = evaluation_cost(schedule, pp, costs.num_micro_batches, vp)
    limit = min(min(ev.times.values(), default=np.inf), cutoff_s) * (1 + tie_rel)
    todo, lower = _cheap_bounded(costs, schedule, pp, limit) if cheap is None else cheap
    # the cheap families first: a split they put above the best or the cutoff is never evaluated
    keep = lower <= limit
    todo, lower = todo[keep], lower[keep]
    if costs.chunk_states is not None and len(todo):  # and every device its chunks
        fit = np.all(costs.device_fits(todo), axis=1)
        todo, lower = todo[fit], lower[fit]
    if schedule in CHAIN_SCHEDULES:  # (the limit only falls as splits are evaluated: those above it stay out)
        lower = split_lower_bounds(costs, schedule, pp, todo, limit_s=limit)
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
    lexicographic order) and their cheap bounds (:func:`split_lower_bounds`
    without the chain families, exact up to ``limit_s``), for
    :func:`_enumerate_all`. Whether each
    device holds its chunks (several stages per device) is left to the
    caller: it is costlier, and only asked of the splits a bound keeps."""
    L, S = costs.num_layers, costs.pp
    splits = _all_splits(L, S)
    todo = splits[np.all(costs.fits(np.arange(S)[None, :], splits[:, :-1], splits[:, 1:]), axis=1)]
    return todo, split_lower_bounds(costs, schedule, pp, todo, chains=False, limit_s=limit_s)


def _enumerable(costs: PipelineCosts, schedule: str, pp: int, vp: int) -> bool:
    """Whether the splits are few enough for :func:`_enumerate_all`:
    ``C(L-1, S-1)`` within :data:`ENUMERATE_SPLITS` and their evaluation
    (:func:`pipesearch.timemodel.evaluation_cost`) within
    :data:`ENUMERATE_WORK`."""
    count = math.comb(costs.num_layers - 1, costs.pp - 1)
    if count > ENUMERATE_SPLITS:  # (before the evaluation cost, which builds the schedule's graph)
        return False
    _, per_split = evaluation_cost(schedule, pp, costs.num_micro_batches, vp)
    return count * per_split <= ENUMERATE_WORK


@lru_cache(maxsize=16)
def _all_splits(L: int, S: int) -> np.ndarray:
    """Every split of ``L`` layers into ``S`` non-empty stages, ``(C(L-1,
    S-1), S + 1)`` boundaries in lexicographic order (read-only)."""
    count = math.comb(L - 1, S - 1)
    cuts = np.array(list(itertools.combinations(range(1, L), S - 1)), dtype=np.int64).reshape(count, S - 1)
    out = np.concatenate([np.zeros((count, 1), dtype=np.int64), cuts, np.full((count, 1), L)], axis=1)
    out.flags.writeable = False
    return out


def split_lower_bounds(costs: PipelineCosts, schedule: str, pp: int, splits: np.ndarray,
                       chains: bool = True, paths=(), limit_s: float = np.inf) -> np.ndarray:
    """Lower bounds ``(n,)`` of the simulated time of the complete splits
    ``splits`` (``(n, S + 1)`` boundaries): the largest over the families of
    :func:`bound_families` (with the chain families when ``chains``, and the
    path families of ``paths``, :func:`_start_paths`) of its value on the
    split, each component evaluated as its formula states (``sum``,
    ``max``, ``prefix``, ``suffix`` and, per rank, ``device``). Each family
    is the length of a path of the dependency graph, so every bound is at
    most the split's time.

    ``limit_s``: a split whose ``device`` family (:func:`_rank_work`, the
    busiest rank's work and all-reduce) is above it gets that family's
    value, itself a lower bound and above ``limit_s``, without the other
    families (the default plan's interleaved pp 2 points have 35% to all
    of their 9,139 splits above the cutoff there; their cheap bounds took
    5.7-5.9 ms a point, 7.8-8.1 without a limit); every other split gets
    its exact largest. So every
    split's bound is at most ``limit_s`` exactly when the largest is, and
    then equal to it."""
    S, n = costs.pp, len(splits)
    # stage-major (S, n): each reduction over the stages adds whole rows
    s, i, j = np.arange(S)[:, None], np.ascontiguousarray(splits[:, :-1].T), np.ascontiguousarray(splits[:, 1:].T)
    terms = _stage_terms(costs, s, i, j)
    if not np.isfinite(limit_s) or n < PREFILTER_SPLITS:
        return _largest_family(costs, schedule, pp, s, i, j, terms, chains, paths)
    F, B, _, c, cin, r = terms
    work = _rank_work(schedule, costs.num_micro_batches, F, B, c, cin, r)
    busiest = _busiest_rank(np.stack([np.broadcast_to(work, i.shape)]), pp)[0]  # as _largest_family reduces it
    out = busiest.copy()
    keep = np.flatnonzero(busiest <= limit_s)
    if len(keep):
        # C-ordered, of two columns at least, as the whole (numpy sums the stages of a column of another
        # layout, or of a lone column, in another order: an ulp apart)
        sub = keep if len(keep) > 1 else np.repeat(keep, 2)
        cut = tuple(np.ascontiguousarray(np.broadcast_to(t, i.shape)[:, sub]) for t in terms)
        i, j = np.ascontiguousarray(i[:, sub]), np.ascontiguousarray(j[:, sub])
        out[keep] = _largest_family(costs, schedule, pp, s, i, j, cut, chains, paths)[:len(keep)]
    return out


def _busiest_rank(b: np.ndarray, pp: int) -> np.ndarray:
    """``device`` components ``b`` (``(Q, S, n)``, stage ``c pp + q`` on rank
    ``q``): each one's busiest rank's sum, ``(Q, n)``."""
    Q, S, n = b.shape
    return b.reshape(Q, S // pp, pp, n).sum(axis=1).max(axis=1)


#: splits below which :func:`split_lower_bounds` computes every family of
#: every split, a limit or not (a count)
PREFILTER_SPLITS = 64


def _largest_family(costs: PipelineCosts, schedule: str, pp: int, s, i, j, terms, chains: bool, paths) -> np.ndarray:
    """:func:`split_lower_bounds` of the splits whose stages are ``s``, ``i``,
    ``j`` (``(S, n)``) with :func:`_stage_terms` ``terms``: the largest family."""
    S, n = costs.pp, i.shape[1]
    fams = bound_families(costs, schedule, pp, s, i, j, chains=chains, paths=paths, terms=terms)
    total = np.zeros((len(fams), n))
    for kind in _KINDS:  # every component of one kind in one pass, stacked (family, stage, split)
        comps = [(f, a, b) for f, fam in enumerate(fams) for k, a, b in fam if k == kind]
        if not comps:
            continue
        idx = np.array([f for f, _, _ in comps])
        a = None if comps[0][1] is None else np.stack([np.broadcast_to(x, i.shape) for _, x, _ in comps])
        b = None if comps[0][2] is None else np.stack([np.broadcast_to(x, i.shape) for _, _, x in comps])
        if kind == "sum":
            v = a.sum(axis=1)
        elif kind == "max":
            v = b.max(axis=1)
        elif kind == "prefix":
            v = (np.cumsum(a, axis=1) - a + b).max(axis=1)
        elif kind == "suffix":
            v = (b + a.sum(axis=1, keepdims=True) - np.cumsum(a, axis=1)).max(axis=1)
        else:  # device: the busiest rank
            v = _busiest_rank(b, pp)
        if len(set(idx.tolist())) == len(idx):  # one component per family: a fancy-indexed add (np.add.at's sums)
            total[idx] += v
        else:
            np.add.at(total, idx, v)
    return total.max(axis=0, initial=-np.inf)


#: at most this many (stage range, family) terms in :func:`rank_layer_bound_s`
#: (about ``S W L (S + 8)``; 64 MiB of float64), else no bound is sought (a count)
RANK_LAYER_TERMS = 2**23


def rank_layer_bound_s(costs: PipelineCosts, schedule: str, pp: int, width: int, cutoff_s: float,
                       cache: dict | None = None) -> float:
    """A lower bound ``B`` with ``T(x) >= min(B, cutoff_s)`` for every split
    ``x`` that fits and whose stages hold at most ``width`` layers (a split
    with a longer stage must be at least ``cutoff_s`` slow, e.g. ``width =
    _width_for(costs, cutoff_s)``); ``inf`` when no such split has every
    rank below the cutoff.

    It counts whole layers per rank. Each one-sum family ``G_h`` of
    :func:`bound_families` (chain families for every stage) and each rank's
    ``device`` sums are sums over the stages of a term of ``(stage, start,
    length)``; with the term's minimum over the starts, ``a_h[s, d]``, and
    its minimum over the lengths of one rank's stages with ``R`` layers in
    all (min-plus convolution), ``g_h[q, R]``, every split with ``R_q``
    layers on rank ``q`` has ``G_h >= sum_q g_h[q, R_q]`` and rank ``q``'s
    device sum at least ``g_dev[q, R_q]``. A rank whose ``g_dev[q, R_q]`` is
    not below ``cutoff_s`` makes the split at least that slow; over the
    other layer counts (``sum_q R_q = L``, a knapsack DP) ``B = max_h min_R
    sum_q g_h[q, R_q]``. On identical layers the counts are nearly forced
    (whole layers: one layer more on a rank is ``m (F + B)`` more work), which
    the suffix minima of :class:`_Tables` relax away. Cost ``O(H S W L)``
    for ``H`` families, ``S`` stages, ``W = width``, ``L`` layers; 0 (no
    bound) above :data:`RANK_LAYER_TERMS` terms. ``cache`` (a dict, one
    point's: the same ``costs``) keeps the per-rank minima, which do not
    depend on ``cutoff_s``, per ``(schedule, pp, W)``: a point's cutoff
    proof and its stopped search's bound (:func:`_stopped_bound`) then
    build them once."""
    L, S = costs.num_layers, costs.pp
    W = max(1, min(width, L - S + 1))
    if S * W * L * (S + 8) > RANK_LAYER_TERMS:
        return 0.0
    cache = {} if cache is None else cache
    if (schedule, pp, W) not in cache:
        cache[schedule, pp, W] = _rank_layer_terms(costs, schedule, pp, W)
    return _rank_layer_value(cache[schedule, pp, W], L, cutoff_s)


def _rank_layer_terms(costs: PipelineCosts, schedule: str, pp: int, W: int):
    """The part of :func:`rank_layer_bound_s` that does not depend on the
    cutoff: ``(sums, devices, memory)``, the per-rank minima of the one-sum
    families and of the device sums (:func:`_rank_minima`) and, with several
    stages per device, the layer counts each rank's device can hold
    (:func:`_rank_memory_fits`, else None); None when no stage range fits."""
    L, S = costs.num_layers, costs.pp
    ks, d, i = _stage_ranges(costs, W)
    if not len(ks):
        return None
    fams = bound_families(costs, schedule, pp, ks, i, i + d)  # the chain families: _chain_stage_minima
    sums = _stage_minima([fam[0][1] for fam in fams if len(fam) == 1 and fam[0][0] == "sum"], ks, d, S, W)
    if schedule in CHAIN_SCHEDULES:
        sums = np.concatenate([sums, _chain_stage_minima(costs, schedule, pp, ks, d, i, W)])
    devices = _stage_minima([fam[0][2] for fam in fams if len(fam) == 1 and fam[0][0] == "device"], ks, d, S, W)
    least = _least_stage_bytes(costs, ks, d, i, pp, W) if costs.chunk_states is not None and S > pp else None
    pairs = _chunk_pairs_fit(least, costs.capacity_bytes, pp) if least is not None and S == 2 * pp else None
    memory = _rank_memory_fits(least, costs.capacity_bytes, pp) if least is not None else None
    return _rank_minima(sums, pp, pairs), _rank_minima(devices, pp, pairs), memory


def _rank_layer_value(terms, L: int, cutoff_s: float) -> float:
    """:func:`rank_layer_bound_s` from its cutoff-free ``terms``
    (:func:`_rank_layer_terms`): the knapsack over the layer counts whose
    rank stays below ``cutoff_s`` (and whose device holds them)."""
    if terms is None:
        return np.inf
    sums, devices, memory = terms
    allowed = np.all(devices < cutoff_s, axis=0)  # (pp, R): layer counts a rank below the cutoff can hold
    if memory is not None:  # and its device's memory can hold
        allowed &= memory
    return float(_rank_knapsack(sums, allowed, L).max())


def _chunk_pairs_fit(least: np.ndarray, capacity_bytes: np.ndarray, pp: int) -> np.ndarray:
    """Two stages per device, ``least`` of :func:`_least_stage_bytes` and
    each device's ``capacity_bytes``: ``(pp, W, W)``, whether rank ``q``'s device
    can hold its chunks with ``d0`` and ``d1`` layers: at every count state
    ``n`` the least bytes of each length (over its starts,
    :func:`_stage_minima`) add up to at most its capacity. Chunks of one
    device hold their micro-batches at different times (chunk 0 up to
    about twice chunk 1's), so the device's memory decides how its layers
    divide between them, not only how many it takes."""
    least = least.reshape(len(least), 2, pp, -1)  # (Q, chunk, rank, length)
    total = least[:, 0, :, :, None] + least[:, 1, :, None, :]  # (Q, pp, d0, d1)
    return np.all(total <= capacity_bytes[:pp, None, None], axis=0)


def _devices_can_hold(costs: PipelineCosts, pp: int) -> bool:
    """False when no split can fit every device holding several stages
    (:attr:`PipelineCosts.chunk_states`): no count of layers per rank that
    adds up to ``L`` has each rank's device within its memory
    (:func:`_rank_memory_fits`, a necessary condition); True otherwise, or
    without several stages per device, or above :data:`RANK_LAYER_TERMS`
    terms (not checked: the split search's leaves are checked anyway).
    Its caller (:func:`_device_split_fits`) tries a witness split first."""
    L, S = costs.num_layers, costs.pp
    W = max(1, L - S + 1)
    if costs.chunk_states is None or S <= pp or S * W * L > RANK_LAYER_TERMS:
        return True
    ks, d, i = _stage_ranges(costs, W)
    if not len(ks):
        return False
    allowed = _rank_memory_fits(_least_stage_bytes(costs, ks, d, i, pp, W), costs.capacity_bytes, pp)
    return _counts_reach(allowed, L)


def _counts_reach(allowed: np.ndarray, L: int) -> bool:
    """Whether some counts ``R_q >= 1`` with ``allowed[q, R_q]`` (``(pp,
    n)`` bools) add up to ``L``: the sums the ranks ``0 .. q`` reach, one
    integer convolution per rank (:func:`_rank_knapsack` of zero costs,
    without its loop over the counts)."""
    reach = np.zeros(L + 1, dtype=np.int64)
    reach[0] = 1
    rows = allowed[:, :L + 1].astype(np.int64)
    rows[:, 0] = 0  # every rank holds a layer
    for row in rows:
        reach = (np.convolve(reach, row)[:L + 1] > 0).astype(np.int64)
        if not reach.any():
            return False
    return bool(reach[L])


def _rank_memory_fits(least: np.ndarray, capacity_bytes: np.ndarray, pp: int) -> np.ndarray:
    """``(pp, vp W + 1)`` from ``least`` of :func:`_least_stage_bytes` and
    each device's ``capacity_bytes``: whether rank ``q``'s device can hold ``R`` layers
    over its chunks: at each of its count states ``n`` (:attr:`PipelineCosts.chunk_states`)
    it holds at least ``sum_c (state_c + n_c a_c)``, whose least value over
    the chunks' lengths adding up to ``R`` (:func:`_rank_minima` of the
    least over the starts, :func:`_stage_minima`) must be within its
    capacity at every state (:meth:`PipelineCosts.device_memory_bytes` of
    a split is at least that)."""
    return _rank_minima(least, pp).max(axis=0) <= capacity_bytes[:pp, None]  # (Q, pp, vp W + 1) at first


def _least_stage_bytes(costs: PipelineCosts, ks, d, i, pp: int, W: int) -> np.ndarray:
    """``(Q, S, W)``: the least bytes stage ``s`` of ``d`` layers adds to its
    device at each count state ``q`` (its training state, plus its
    chunk's count at ``q`` times one micro-batch's saved
    bytes), over its starts among the ranges ``(ks, d, i)`` of
    :func:`_stage_ranges` (:func:`_stage_minima`; ``inf`` where none).
    The first chunk's stages add their one-at-a-time bytes
    (:meth:`PipelineCosts.peak_extra_at`): a device holds the most of its
    chunks', at least its first chunk's."""
    act = np.asarray(costs.saved_bytes(ks, i, i + d), dtype=float)
    rest = costs.resident_bytes(ks, i, i + d) + np.where(ks < pp, costs.peak_extra_at(ks, i, i + d), 0.0)
    counts = costs.chunk_states[ks % pp, :, ks // pp]  # (ranges, Q): each range's chunk count at every state
    return _stage_minima([rest + counts[:, q] * act for q in range(counts.shape[1])], ks, d, costs.pp, W)


def _stage_ranges(costs: PipelineCosts, W: int):
    """Every range ``(stage, length, start)`` some split can give a stage
    (lengths ``1 .. W``; stage ``s`` starts at ``s`` or later and leaves a
    layer to each later stage; stage 0 starts at 0, the last ends at ``L``)
    that fits in memory, ordered by stage, then length: ``(ks, d, i)``."""
    L, S = costs.num_layers, costs.pp
    s, d, i = np.arange(S)[:, None, None], np.arange(1, W + 1)[None, :, None], np.arange(L)[None, None, :]
    ok = (i >= s) & (i + d <= L - (S - 1 - s)) & ((s > 0) | (i == 0)) & ((s < S - 1) | (i + d == L))
    ok = ok & (i + d <= _fitting_ends(costs, W)[:, None, :])
    ks, dd, ii = np.nonzero(ok)
    return ks, dd + 1, ii


def _fitting_ends(costs: PipelineCosts, W: int) -> np.ndarray:
    """``(S, L)``: for each stage ``s`` and start ``i``, the largest end
    ``j <= min(i + W, L)`` with ``[i, j)`` fitting stage ``s`` (``i`` when
    not even one layer fits; :func:`_fit_ends` over every ``(s, i)`` at
    once: ``log W`` calls of :meth:`PipelineCosts.fits` on ``S L`` ranges,
    not one on ``S W L``)."""
    L, S = costs.num_layers, costs.pp
    s, i = np.meshgrid(np.arange(S), np.arange(L), indexing="ij")
    return _fit_ends(costs, s, i, np.minimum(i + W, L))


def _stage_minima(terms, ks, d, S: int, W: int) -> np.ndarray:
    """``(H, S, W)``: each term's minimum over the starts of every ``(stage,
    length)`` (``inf`` where none fits); ``ks``, ``d`` grouped as
    :func:`_stage_ranges` orders them."""
    vals = np.stack([np.broadcast_to(t, ks.shape) for t in terms]).astype(float)
    key = ks * W + (d - 1)
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    out = np.full((len(terms), S * W), np.inf)
    out[:, key[first]] = np.minimum.reduceat(vals, first, axis=1)
    return out.reshape(len(terms), S, W)


def _chain_stage_minima(costs: PipelineCosts, schedule: str, pp: int, ks, d, i, W: int) -> np.ndarray:
    """``(S, S, W)``: the chain families of every stage (:func:`_chain_terms`
    with ``families = S``) through :func:`_stage_minima` over the ranges
    ``(ks, d, i)`` of :func:`_stage_ranges`, equal to it entry for entry.
    A family's term on stage ``s`` is fixed by five numbers of ``(family,
    s)`` (whether ``s`` precedes the family's stage, and its F, B, I, W
    counts there) and only a few such vectors occur (four for interleaved
    1F1B at any ``pp`` and ``vp``; at most three per stage for ZB-H1), so
    each vector is evaluated once on the ranges of the stages that use it,
    not once per family: ``O(U n)`` for ``U`` vectors per stage and ``n``
    ranges, against ``O(S n)``."""
    m, S = costs.num_micro_batches, costs.pp
    stages, counts = _chain_counts(schedule, pp, m, S // pp, S)
    if not len(counts):
        return np.zeros((0, S, W))
    F, B, _, c, cin, r = terms = _stage_terms(costs, ks, i, i + d)
    fill_drain, per_action = _chain_inputs(schedule, terms, *_action_terms(schedule, F, B, c, cin))
    before = (np.array(stages)[:, None] > np.arange(S)[None, :]).astype(np.int64)  # (family, stage)
    vectors, which = np.unique(np.concatenate([before[..., None], counts], axis=2).reshape(-1, 5), axis=0,
                               return_inverse=True)
    which = which.reshape(len(stages), S)
    used = np.zeros((len(vectors), S), dtype=bool)
    used[which, np.arange(S)[None, :]] = True
    fd, per_action = np.broadcast_to(fill_drain, ks.shape), [np.broadcast_to(x, ks.shape) for x in per_action]
    own = np.where(ks % pp == 0, np.broadcast_to(r, ks.shape), 0.0)
    key = ks * W + (d - 1)
    out = np.full((len(vectors), S * W), np.inf)
    with np.errstate(invalid="ignore"):
        for u, (precedes, *kinds) in enumerate(vectors.tolist()):
            at = np.flatnonzero(used[u][ks])
            if not len(at):
                continue
            work = 0.0  # in kind order, as _chain_terms adds them (a count of 0 adds +0)
            for kind, n in enumerate(kinds):
                if n > 0:
                    work = work + n * per_action[kind][at]
            value = np.broadcast_to((fd[at] if precedes else 0.0) + work + own[at], at.shape).astype(float)
            first = np.flatnonzero(np.r_[True, key[at][1:] != key[at][:-1]])
            out[u, key[at][first]] = np.minimum.reduceat(value, first)
    return out.reshape(len(vectors), S, W)[which, np.arange(S)[None, :]]


def _rank_minima(a: np.ndarray, pp: int, pairs: np.ndarray | None = None) -> np.ndarray:
    """``(H, pp, vp W + 1)``: ``g[h, q, R]``, the least sum of ``a[h, s,
    d_s - 1]`` over rank ``q``'s stages ``s = c pp + q`` with lengths ``d_s``
    adding up to ``R`` (``inf`` where none does); with ``pairs`` (two
    stages per rank, ``(pp, W, W)``) only over the length pairs it allows
    (:func:`_chunk_pairs_fit`)."""
    H, S, W = a.shape
    vp = S // pp
    if pairs is not None:
        both = a[:, :pp, :, None] + a[:, pp:, None, :]  # (H, pp, d0, d1)
        both = np.where(pairs[None], both, np.inf)
        out = np.full((H, pp, 2 * W + 1), np.inf)
        for d0 in range(W):  # lengths d0 + 1 and d1 + 1: R = d0 + d1 + 2
            np.minimum(out[:, :, d0 + 2:d0 + 2 + W], both[:, :, d0, :], out=out[:, :, d0 + 2:d0 + 2 + W])
        return out
    by_chunk = a.reshape(H, vp, pp, W)
    cur = np.full((H, pp, vp * W + 1), np.inf)
    cur[:, :, 1:W + 1] = by_chunk[:, 0]  # chunk 0 alone: R = its length
    for c in range(1, vp):  # chunks 0 .. c - 1 hold c .. c W layers, chunk c one more to W more
        nxt = np.full_like(cur, np.inf)
        held = cur[:, :, c:c * W + 1]
        for dl in range(1, W + 1):
            out = nxt[:, :, c + dl:c * W + dl + 1]
            np.minimum(out, held + by_chunk[:, c, :, dl - 1, None], out=out)
        cur = nxt
    return cur


def _rank_knapsack(g: np.ndarray, allowed: np.ndarray, L: int) -> np.ndarray:
    """``(H,)``: ``min sum_q g[h, q, R_q]`` over the layer counts with
    ``allowed[q, R_q]`` and ``sum_q R_q = L`` (``inf`` when none)."""
    H, pp, R1 = g.shape
    best = np.full((H, L + 1), np.inf)
    best[:, 0] = 0.0
    for q in range(pp):
        nxt = np.full_like(best, np.inf)
        for R in np.flatnonzero(allowed[q, :L + 1]).tolist():
            if R > 0:
                np.minimum(nxt[:, R:], best[:, :L + 1 - R] + g[:, q, R, None], out=nxt[:, R:])
        best = nxt
    return best[:, L]


#: at most this many splits are bounded one by one in the cutoff proof
#: (:func:`split_lower_bounds`) before any table is built (a count)
PROOF_SPLITS = 2048


def _cutoff_proof(costs: PipelineCosts, schedule: str, pp: int, ev: "_Evaluator", cutoff_s: float, tie_rel: float,
                  max_splits: int, max_nodes: int, rank_cache: dict | None = None):
    """Before any starting split is evaluated, try to prove that no split
    beats ``cutoff_s``: with at most :data:`PROOF_SPLITS` splits, the least
    bound of a split that fits (:func:`split_lower_bounds`, no table); for
    :data:`OWN_FAMILY_SCHEDULES` the root bound of their own closed-form
    families alone (``own_only`` tables); the root bound of the cheap
    families; for
    interleaved 1F1B the fluid bound
    (:func:`pipesearch.fluid_bound.fluid_lower_bound_s`; before the tables
    when they are large, :func:`_fluid_first`); then the
    first :data:`FIRST_NODES` nodes of the branch and bound with the cheap
    families and the rank-counting bound (a split it meets below the cutoff
    is evaluated and kept in ``ev``); last, for the chain schedules, the
    whole-layers-per-rank bound of :func:`rank_layer_bound_s` (the dearest:
    on the default plan it settled none of the 35 points it was tried on
    before the first nodes). The chain families and their
    Lagrangian combination (:func:`lagrange_weights`) are left to the
    search proper: on the PipeDream profiles (vgg16, resnet50 on
    4x4-v100-10gbe) they excluded 1 more of 347 interleaved and ZB-H1
    points here at nearly twice the cost. ``rank_cache``: the point's cache
    of :func:`rank_layer_bound_s`. Returns ``(tables, proof)``: the
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
    width = _width_for(costs, cutoff_s * (1 + tie_rel))
    fluid_first = _fluid_first(costs, width)
    if fluid_first and fluid_lower_bound_s(costs, schedule, pp, S // pp, cutoff_s) >= cutoff_s:
        return None, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    if _fluid_only(costs, schedule, width):  # no tables: the whole-layers bound is the one left
        if rank_layer_bound_s(costs, schedule, pp, width, cutoff_s, rank_cache) >= cutoff_s:
            return None, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
        return None, None
    if schedule in OWN_FAMILY_SCHEDULES:  # its own few families first: smaller tables
        own = _Tables(costs, schedule, pp, width, own_only=True, limit_s=cutoff_s * (1 + tie_rel)).root_bound()
        if cutoff_s <= own < np.inf:
            return None, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)
    tables = _Tables(costs, schedule, pp, width, limit_s=cutoff_s * (1 + tie_rel))
    root = tables.root_bound()
    if root >= cutoff_s:
        if not np.isfinite(root) and optimal_split(costs) is None:
            return tables, "infeasible"
        return tables, ExactSplit((), np.inf, np.inf, float(min(root, cutoff_s)), True, 0, 0)
    if not fluid_first and fluid_lower_bound_s(costs, schedule, pp, S // pp, cutoff_s) >= cutoff_s:
        return tables, ExactSplit((), np.inf, np.inf, float(cutoff_s), True, 0, 0)  # the fluid relaxation
    excluded, _, _ = _branch_and_bound(tables, ev, costs.pp, costs.num_layers, pp, cutoff_s / (1 + tie_rel), tie_rel,
                                       max_splits, min(max_nodes, FIRST_NODES), _RankCount(costs, schedule, pp))
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


#: floats the bound tables of one exact split may hold (1 GiB of float64);
#: above it the split is the best of the starting splits, reported with a
#: table-free lower bound and its gap (:func:`tables_fit`)
MAX_TABLED_FLOATS = 2**27


def tables_fit(costs: PipelineCosts, width: int) -> bool:
    """Whether the branch and bound's tables fit :data:`MAX_TABLED_FLOATS`:
    the suffix tables of the middle stages, ``(S - 2)`` of shape ``(width,
    L + 1)``, and the rank-counting bound's ``(L + 1, L + 1)``
    (:class:`_RankCount`). A count of the input, never of the machine."""
    L, S = costs.num_layers, costs.pp
    return max(S - 2, 0) * min(width, L) * (L + 1) + (L + 1) ** 2 <= MAX_TABLED_FLOATS


def untabled_bound_s(costs: PipelineCosts, pp: int) -> float:
    """A lower bound on the simulated time of every split that needs no
    table: each of the ``pp`` ranks runs its micro-batches' forwards and
    backwards one after another, and together they run all ``m`` of every
    layer, so the busiest runs at least the average, ``m sum_l (F + B)_l /
    pp``, on the fastest stage's device (the smallest time scale; the layer
    table's own option, the fastest)."""
    total = float(costs.compute_prefix_s[-1]) * float(np.min(costs.time_scale))
    return costs.num_micro_batches * total / pp


def _chosen(costs: PipelineCosts, ev: "_Evaluator", tie_rel: float) -> tuple[tuple[int, ...], float]:
    """``(split, best time)`` of the evaluated splits: among those within
    ``tie_rel`` of the best, the one :func:`_tie_key` ranks first."""
    best = min(ev.times.values())
    near = [b for b, t in ev.times.items() if t <= best * (1 + tie_rel)]
    return min(near, key=lambda b: _tie_key(costs, b, ev.times[b])), best


def _untabled(costs: PipelineCosts, ev: "_Evaluator", pp: int, tie_rel: float) -> "ExactSplit | None":
    """The best of the starting splits ``ev`` has evaluated, with
    :func:`untabled_bound_s` as its proven bound (exact only if it meets it)."""
    if not ev.times:
        return None
    chosen, best = _chosen(costs, ev, tie_rel)
    lower = min(best, untabled_bound_s(costs, pp))
    return ExactSplit(chosen, ev.times[chosen], best, float(lower), lower >= best, len(ev.times), 0)


class _RankCount:
    """The rank-counting bound of a node, for children that survive the
    tabled bounds.

    Every rank ``q`` runs all its actions one after another, so ``T`` is at
    least the path: micro-batch 0's forward down to stage ``q`` (when the
    rank's first action is ``F`` of micro-batch 0 on stage ``q``), the rank's
    whole work ``m (f + b)`` over its stages, then either its all-reduce or
    (when its last action and rank 0's are the backward of micro-batch
    ``m - 1`` on their first stage) that gradient back up to stage 0 and rank
    0's all-reduce. For a node with stages ``0 .. s`` fixed, the fixed part of
    each rank's path is known (``v_q``; unknown fill and drain terms count 0);
    each layer ``l`` still to place adds at least ``m sigma_q (F + B)_l`` to
    the rank that gets it (``sigma_q`` the rank's slowest-free time scale, the
    smallest over its stages), the last layer goes to the last stage's rank,
    and rank ``q`` gets at least one layer per stage it still has (``c_q``).
    With ``P_j(n)`` the sum of the ``n`` cheapest layers left after layer
    ``j`` (each rank may take the cheapest: a relaxation), the smallest
    achievable maximum over ranks is, since every ``P_j`` is convex,
    ``max(max_q (v_q + P_j(c_q)), the E-th smallest of the levels
    v_q + P_j(n), n > c_q)`` with ``E`` the layers beyond the ``c_q``
    (greedy assignment of unit increments; e.g. Graham 1969, SIAM J. Appl.
    Math. 17(2), for the makespan of identical items). It never exceeds the
    simulated time of any completion of the node.
    """

    def __init__(self, costs: PipelineCosts, schedule: str, pp: int):
        L, S, m = costs.num_layers, costs.pp, costs.num_micro_batches
        self.costs, self.pp, self.S, self.L, self.m = costs, pp, S, L, m
        self.blocking = not send_overlap(schedule)
        self.zb = schedule == "zb-h1"
        self.fill_ok, self.drain_ok = _rank_path_ends(schedule, pp)
        ranks = np.arange(S) % pp
        self.sigma = np.array([costs.time_scale[ranks == q].min() for q in range(pp)]) * m
        layer = np.diff(costs.compute_prefix_s)
        self.last = self.sigma[(S - 1) % pp] * layer[L - 1]
        key = np.ascontiguousarray(layer, dtype=float).tobytes()
        self.P = _cheapest_sums(key) if (L + 1) ** 2 <= CACHED_SUMS_FLOATS else _cheapest_sums.__wrapped__(key)
        later = np.arange(S)[None, :] > np.arange(S)[:, None]  # later[s, k]: k after s
        self.left = np.stack([np.bincount(ranks[later[s]], minlength=pp) for s in range(S)])
        self.left[:, (S - 1) % pp] -= 1  # the last layer is placed on the last stage
        self.root = np.zeros((4, pp))
        self._columns: dict = {}

    def advance(self, state, s: int, i: int, j):
        """The states ``(n, 4, pp)`` (work, all-reduce, fill, drain per rank)
        of the children ``[i, j)`` of a node at stage ``s`` with ``state``."""
        d = j - i - 1
        return self.step(np.repeat(state[None], len(j), axis=0), s, *(t[d] for t in self._column(s, i)))

    def step(self, out, s: int, work, r, fill, up):
        """Add stage ``s``'s terms (per row: its rank's work and all-reduce,
        one forward step down, one gradient step up; ``(n,)`` each, from
        :meth:`_column`) to the states ``out`` ``(n, 4, pp)`` in place and
        return them."""
        q = s % self.pp
        out[:, 0, q] += work
        out[:, 1, q] += r
        after = np.arange(self.pp) > s
        out[:, 2, after] += fill[:, None]
        out[:, 3, after] += up[:, None]
        return out

    def _column(self, s: int, i: int):
        """Stage ``s`` from layer ``i``, every end ``i + 1 .. L``: its rank's
        work ``m (f + b)``, its all-reduce, one forward step down (``F + c``)
        and one gradient step back up (memoised per ``(s, i)``)."""
        if (s, i) not in self._columns:
            self._columns[s, i] = self.terms(s, i, np.arange(i + 1, self.L + 1))
        return self._columns[s, i]

    def terms(self, s: int, i, j):
        """The terms of :meth:`_column` for stage ``s`` over the ranges
        ``[i, j)`` (int arrays broadcast together: many starts at once)."""
        c = self.costs
        F, B, r = c.fwd_s(s, i, j), c.bwd_s(s, i, j), c.after_backward_s(s, i, j)
        send = c.send_s(s, j)
        cin = c.send_s(s - 1, i) if s > 0 else 0.0
        up = (B + cin) if self.blocking else ((c.bwd_input_s(s, i, j) if self.zb else B) + send)
        work = self.m * (F + B + ((send + cin) if self.blocking else 0.0))
        shape = np.broadcast_shapes(np.shape(i), np.shape(j))
        return tuple(np.broadcast_to(x, shape) for x in (work, r, F + send, up))

    def bound(self, states, s: int, j, limit: float = np.inf):
        """Lower bounds ``(n,)`` for the children at stage ``s`` ending at
        ``j`` (not the last stage) with ``states`` from :meth:`advance`; the
        order-statistic part only for children whose first part is below
        ``limit`` (the others are excluded already)."""
        work, ar, fill, drain = (states[:, k] for k in range(4))
        tail = np.maximum(ar, np.where(self.drain_ok, drain + ar[:, :1], -np.inf))
        v = work + tail + np.where(self.fill_ok, fill, 0.0)
        v[:, (self.S - 1) % self.pp] += self.last
        c = self.left[s]  # (pp,)
        extra = self.L - 1 - j - c.sum()  # layers beyond one per remaining stage
        out = (v + self.sigma * self.P[j[:, None], c[None, :]]).max(axis=1)
        rows = np.flatnonzero((extra > 0) & (out < limit))
        # rank q's levels v_q + P_j(n) for n = c_q + 1 .. c_q + extra (a rank takes at most c_q +
        # extra layers): they grow with n, so the extra-th smallest of all ranks' levels is among
        # each rank's first extra
        sampled = rows[self.pp * extra[rows] > _SORTED_LEVELS]
        if len(sampled) and len(sampled) * self.pp * int(extra[sampled].max()) > _WHOLE_LEVELS:
            out[sampled] = np.maximum(out[sampled], kth_level(v[sampled], self.sigma, self.P, j[sampled], c,
                                                              extra[sampled]))
            rows = rows[self.pp * extra[rows] <= _SORTED_LEVELS]
        if len(rows):  # the others: every level formed, one selection per row
            out[rows] = np.maximum(out[rows], kth_level_whole(v[rows], self.sigma, self.P, j[rows], c, extra[rows]))
        return out


#: rows of the rank-counting bound with at most this many levels (ranks times layers beyond one per
#: remaining stage) are formed whole (:func:`kth_level_whole`); longer ones go through
#: :func:`kth_level`'s sample (a count; the same values: at 1024 the partial sorts took half the bound's
#: time at 16,384 GPUs)
_SORTED_LEVELS = 64

#: ... unless all the longer rows of a call hold at most this many levels together (a count): then they
#: are formed whole too (one gather and one selection cost less than the sample's two dozen numpy
#: passes: on GPT-3 175B at 16,384 GPUs 0.14 of its 1.5 CPU seconds of order statistics)
_WHOLE_LEVELS = 2**16


def kth_level_whole(v: np.ndarray, sigma: np.ndarray, P: np.ndarray, j: np.ndarray, c: np.ndarray,
                    e: np.ndarray) -> np.ndarray:
    """:func:`kth_level`'s value (arguments and result the same) from every
    level at once: the ``(n, pp, max e)`` levels ``v[r, q] + sigma[q] * P[j_r,
    c[q] + n]`` (the same floating-point operations), ``+inf`` past each
    row's ``e_r``, and the ``e_r``-th smallest of each row
    (:func:`_kth_smallest`)."""
    n, pp = v.shape
    steps = np.arange(1, int(e.max()) + 1)
    cols = np.minimum(c[None, :, None] + steps, P.shape[1] - 1)  # past a row's e_r: masked below
    with np.errstate(invalid="ignore"):  # 0 x inf past a row's e_r (masked next)
        levels = v[:, :, None] + sigma[None, :, None] * P[j[:, None, None], cols]
    levels[np.broadcast_to(steps > e[:, None, None], levels.shape)] = np.inf
    return _kth_smallest(levels.reshape(n, -1), e - 1)


def kth_level(v: np.ndarray, sigma: np.ndarray, P: np.ndarray, j: np.ndarray, c: np.ndarray,
              e: np.ndarray) -> np.ndarray:
    """Per row ``r``: the ``e_r``-th smallest (from 1) of the levels ``v[r, q]
    + sigma[q] * P[j_r, c[q] + n]`` over the ranks ``q`` and ``n = 1 ..
    e_r``, the order statistic of :meth:`_RankCount.bound` (the same
    floating-point operations on each level, so the same value as sorting
    all ``pp e_r`` of them), in ``O(pp sqrt(e))`` levels per row instead of
    ``pp e``.

    Args:
        v: ``(n, pp)`` per-rank offsets (s); sigma: ``(pp,)`` factors (>= 0).
        P: table whose rows are non-decreasing (cheapest-layer sums, s);
            ``j``: ``(n,)`` its row per level row; ``c``: ``(pp,)`` column
            offsets (``c[q] + e_r`` within the row).
        e: ``(n,)`` the rank wanted (``>= 1``).

    Each rank's levels are non-decreasing in ``n`` (rounding is monotone).
    Take every ``step``-th level of each rank as a sample (``step`` about
    ``sqrt(e / 2)`` per row; selection in sorted lists through a sample, as
    in Frederickson and Johnson 1982, J. Comput. Syst. Sci. 24(2)): the
    ``ceil(e / step)``-th smallest sample ``U`` has at least ``e`` levels
    at or below it (each sample at or below it vouches for the ``step``
    levels of its rank up to it), and the ``(floor(e / step) - pp + 1)``-th
    smallest ``Z`` (``-inf`` when that is below 1) fewer than ``e`` strictly
    below it (a rank with ``u`` samples below ``Z`` has fewer than ``(u +
    1) step`` levels below it). So the answer lies in ``[Z, U]``; rank ``q``'s
    levels there lie in the window after its ``u_q step`` first levels (all
    below ``Z``) and before its ``(t_q + 1) step``-th (above ``U``; ``t_q``
    its samples at or below ``U``), and the answer is the ``(e - step sum_q
    u_q)``-th smallest of the windows' levels."""
    n, pp = v.shape
    flat, width = P.ravel(), P.shape[1]
    step = np.maximum(1, np.sqrt(e // 2).astype(np.int64))  # per row: about sqrt(e / 2) samples and window
    t = np.arange(1, int(np.max(e // step)) + 1)[None, :] * step[:, None]  # (n, T)
    valid = t <= e[:, None]
    offsets, rank_of = np.unique(c, return_inverse=True)  # ranks with the same offset read the same entries
    at = (j * width)[:, None, None] + offsets[None, :, None] + np.where(valid, t, 0)[:, None, :]
    sample = v[:, :, None] + sigma[None, :, None] * flat[at][:, rank_of]
    sample[~np.broadcast_to(valid[:, None, :], sample.shape)] = np.inf
    ordered = np.sort(sample.reshape(n, -1), axis=1)
    ordered = np.concatenate([ordered, np.full((n, 1), np.inf)], axis=1)  # one rank, step not dividing e: all
    rows = np.arange(n)
    upper = ordered[rows, np.minimum(-(-e // step), ordered.shape[1]) - 1]
    k_low = e // step - pp + 1
    lower = np.where(k_low >= 1, ordered[rows, np.maximum(k_low, 1) - 1], -np.inf)
    below = (sample < lower[:, None, None]).sum(axis=2)  # (n, pp)
    upto = (sample <= upper[:, None, None]).sum(axis=2)
    first = below * step[:, None] + 1
    size = np.maximum(np.minimum((upto + 1) * step[:, None] - 1, e[:, None]) - first + 1, 0)
    # the windows' levels, row r's in row r of a grid padded with +inf
    per_row = size.sum(axis=1)
    owner = np.repeat(np.arange(n * pp), size.ravel())  # each window level's (row, rank), flat
    place = np.arange(len(owner)) - np.repeat(np.cumsum(per_row) - per_row, per_row)  # its place in its row
    r, q = owner // pp, owner % pp
    n_at = first.ravel()[owner] + place - np.repeat((np.cumsum(size, axis=1) - size).ravel(), size.ravel())
    grid = np.full((n, int(per_row.max(initial=1))), np.inf)
    grid[r, place] = v.ravel()[owner] + sigma[q] * flat[j[r] * width + c[q] + n_at]
    return np.sort(grid, axis=1)[rows, e - below.sum(axis=1) * step - 1]


_P_ROWS = 256  # rows of the rank-counting bound's cheapest-layer sums sorted together (memory: rows x L floats)


#: the rank-counting bound's table of cheapest-layer sums is kept (two of
#: them) up to this many floats (32 MiB each: 2,047 layers); larger ones are
#: built for each point
CACHED_SUMS_FLOATS = 2**22


@lru_cache(maxsize=2)
def _cheapest_sums(layer_bytes: bytes) -> np.ndarray:
    """``P[j, n]``, ``(L + 1, L + 1)``: the sum of the ``n`` cheapest of
    layers ``j .. L-2`` (``+inf`` past their count) for the per-layer
    compute ``layer`` (``(L,)`` float64, given as its bytes: the points of
    one profile and micro-batch size share it), rows sorted in blocks of
    :data:`_P_ROWS`; read-only (memoised)."""
    layer = np.frombuffer(layer_bytes, dtype=float)
    L = len(layer)
    P = np.full((L + 1, L + 1), np.inf)
    P[:L, 0] = 0.0
    cols = np.arange(max(L - 1, 0))
    for lo in range(0, L, _P_ROWS):
        rows = np.arange(lo, min(L, lo + _P_ROWS))
        block = np.where(cols[None, :] >= rows[:, None], layer[:L - 1][None, :], np.inf)
        P[lo:lo + len(rows), 1:L] = np.cumsum(np.sort(block, axis=1), axis=1)
    P.setflags(write=False)
    return P


def _kth_smallest(values: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``values[r]``'s ``k[r]``-th smallest (0-based) for every row ``r``: one
    sort of all rows when they are short, else one selection per distinct
    ``k`` over the rows that share it (linear in the rows' length instead of
    ``n log n``)."""
    if values.shape[1] <= 256:
        return np.sort(values, axis=1)[np.arange(len(values)), k]
    out = np.empty(len(values))
    for kk in np.unique(k):
        rows = np.flatnonzero(k == kk)
        out[rows] = np.partition(values[rows], kk, axis=1)[:, kk]
    return out


def _rank_path_ends(schedule: str, pp: int):
    """Per rank, from the builders' orders (:mod:`pipesearch.schedules`):
    whether its first action is ``F`` of micro-batch 0 on its first stage
    (every schedule: each warms up with micro-batch 0 on its first stage),
    and whether its last action and rank 0's are the backward of micro-batch
    ``m - 1`` on the first stage (GPipe, 1F1B, interleaved 1F1B; ZB-H1 ends
    with a ``W``, looped BFS with micro-batch 0) (:class:`_RankCount`)."""
    first = np.ones(pp, dtype=bool)
    last = np.full(pp, schedule in ("gpipe", "1f1b", "interleaved-1f1b"))
    return first, last


#: nodes of one level of a look-ahead expansion (:class:`_Expander`), at
#: most; fewer where the children's rank-counting terms would pass
#: :data:`LOOKAHEAD_FLOATS` floats, or the node limit is near (counts; the
#: answer is the same for every width: wider levels cost fewer numpy passes
#: but bound more children the search never reaches. Replaying the split
#: searches of the default plan and GPT-3 175B at 1,024 and 16,384 GPUs under
#: callgrind, 32 ran 6-13% fewer instructions than 128, 8 and 16 more; in
#: CPU seconds, replaying those of GPT-3 1.3B on 16 GPUs, the default plan,
#: resnet50 on 4x4-v100-10gbe and GPT-3 175B on 1,024 GPUs, 64 took 15-17%,
#: 2%, 2% and 0-3% less than 32, 128 22%, 1%, 1% less and 5% more)
LOOKAHEAD_WIDTH = 64
LOOKAHEAD_FLOATS = 2**22


class _Kids:
    """The children of a batch of nodes of one stage (:meth:`_Expander.expand`).

    ``stage``: the stage the children end (they are nodes of stage ``stage +
    1``; leaves when it is the last one). ``j``, ``lb``: their ends and
    lower bounds (lists), the children of parent ``p`` at positions
    ``lo[p] .. hi[p] - 1`` in bound order (ties in end order), only those
    below the limit of the expansion. ``rows[pos]``: the column of child
    ``pos`` in ``acc`` (per kind the accumulated component values, the
    children on the last axis; ``count`` the rank-counting states on the
    first; ``device`` the parents' per-rank sums ``(N, Q, pp)`` with the
    children's own rank's sums in ``own`` ``(Q, T)``). ``child[pos]``: the
    ``(kids, parent index)`` of child ``pos``'s children once expanded.
    """

    __slots__ = ("stage", "j", "lb", "lo", "hi", "rows", "par", "acc", "own", "child")

    def __init__(self, stage, j, lb, lo, hi, rows, par, acc, own):
        self.stage, self.j, self.lb, self.lo, self.hi = stage, j, lb, lo, hi
        self.rows, self.par, self.acc, self.own, self.child = rows, par, acc, own, {}


class _Expander:
    """Node expansion of :func:`_branch_and_bound`, vectorised over all the
    nodes of one stage that a look-ahead expands together.

    A node's children and their bounds depend only on the node and on the
    limit (the incumbent), which only falls. Children found under a limit
    are those below it, with the same bounds (the rank-counting bound is
    only skipped for children already excluded), so a list found under an
    earlier, higher limit and cut at the current one is the list a fresh
    expansion would give. :meth:`lookahead` therefore expands a node and,
    level by level, the first children in depth-first order (at most
    :attr:`width` per level and the node limit in all), each level one
    numpy pass; the depth-first search then takes each node's children from
    there, visiting the same nodes in the same order, with the same bounds
    (elementwise the same floating-point operations as one node at a time).
    """

    def __init__(self, tables: _Tables, counter: _RankCount | None, S: int, L: int, pp: int):
        self.tables, self.counter, self.S, self.L, self.pp = tables, counter, S, L, pp
        self.nfam, self.kinds = tables.num_families, tables.kinds
        # per kind: the family of each component, and whether no family has two of them
        # (then a fancy-indexed add, in the same order as np.add.at, is exact)
        self.scatter = {kind: (idx, len(np.unique(idx)) == len(idx)) for kind, idx in tables.fam.items()}
        self.others_of = [np.delete(np.arange(pp), r) for r in range(pp)]
        self.width = max(1, min(LOOKAHEAD_WIDTH, LOOKAHEAD_FLOATS // (tables.rows * pp * (L + 1))))
        self._columns: dict = {}
        self._suffix: dict = {}
        self._held = 0
        self.layout = self._rows(tables.column(0, 0)[0])
        costs = tables.costs
        # several stages per device: each node carries its devices' bytes so far at every count state
        self.states = costs.chunk_states if costs.chunk_states is not None and S > pp else None

    def columns(self, s: int, starts: list[int]) -> list:
        """Per start ``i``: the children's ends ``j`` of a node at stage
        ``s`` from layer ``i`` (those that fit and leave a layer per later
        stage), per kind their terms and the suffix minima at ``j``, and the
        rank-counting terms of :meth:`_RankCount.step` (memoised per ``(s,
        i)``, the missing ones found together; at most :data:`TABLE_FLOATS`
        floats held, then dropped)."""
        have = {i: self._columns[s, i] for i in starts if (s, i) in self._columns}
        missing = [i for i in dict.fromkeys(starts) if i not in have]
        if missing:
            have.update(zip(missing, self._new_columns(s, missing)))
        return [have[i] for i in starts]

    def _new_columns(self, s: int, starts: list[int]) -> list:
        """The entries of :meth:`columns` for ``starts`` (none memoised yet):
        ``(j, block, count)``, ``block`` the children's terms of every kind
        and their suffix minima stacked as rows (:meth:`_rows` says which),
        ``count`` the ``(4, n)`` rank-counting terms or None."""
        tables, S, L, W = self.tables, self.S, self.L, self.tables.rows
        d = np.arange(1, W + 1)
        suf = self._suffix_rows(s + 1)
        out = []
        for i in starts:
            j = i + d
            keep = (j <= L - (S - 1 - s)) if s < S - 1 else (j == L)
            terms, fits = tables.column(s, i)
            keep &= fits
            rows, j = d[keep] - 1, j[keep]
            own = np.concatenate([t for kind in self.kinds for t in terms[kind] if t is not None])
            out.append([j, np.concatenate([own[:, rows], suf[:, j]]), None])
        if self.counter is not None and s < S - 1:  # every start's terms in one pass
            at = np.array(starts)[:, None]
            count = np.stack(self.counter.terms(s, at, np.minimum(at + d, L)), axis=1)  # (n, 4, W)
            for k, entry in enumerate(out):
                entry[2] = count[k][:, entry[0] - starts[k] - 1]
        for i, entry in zip(starts, out):
            if self._held > TABLE_FLOATS:
                self._columns.clear()
                self._held = 0
            self._held += entry[1].size
            self._columns[s, i] = tuple(entry)
        return [tuple(e) for e in out]

    def _suffix_rows(self, s: int) -> np.ndarray:
        """The suffix minima from stage ``s`` of every kind stacked as rows
        (``(R, L + 1)``, in the order of :meth:`_rows`; memoised per stage)."""
        if s not in self._suffix:
            parts = [self.tables.suffix_min(kind, s) for kind in self.kinds]
            self._suffix[s] = np.concatenate([x for p in parts for x in (p if isinstance(p, tuple) else (p,))])
        return self._suffix[s]

    def _rows(self, column) -> dict:
        """Per kind, the slices of a column block's rows (:meth:`_new_columns`)
        holding its alpha and beta (None where the kind has none), then its
        suffix minima (two for ``suffix``: the min sum and the min max)."""
        sizes = {kind: len(self.tables.fam[kind]) for kind in self.kinds}
        own = [(kind, k) for kind in self.kinds for k, t in enumerate(column[kind]) if t is not None]
        out, at = {kind: [None, None] for kind in self.kinds}, 0
        for kind, k in own:
            out[kind][k] = slice(at, at + sizes[kind])
            at += sizes[kind]
        for kind in self.kinds:
            for _ in range(2 if kind == "suffix" else 1):
                out[kind].append(slice(at, at + sizes[kind]))
                at += sizes[kind]
        return out

    def root(self) -> _Kids:
        """The root (no stage placed, every layer left) as the one child of
        stage ``-1``."""
        acc = {}
        for kind in self.kinds:
            q = len(self.tables.fam[kind])
            if kind == "prefix":
                acc[kind] = np.array([np.zeros((q, 1)), np.full((q, 1), -np.inf)])
            elif kind == "sum":
                acc[kind] = np.zeros((q, 1))
            elif kind != "device":
                acc[kind] = np.full((q, 1), -np.inf)
        if "device" in self.kinds:
            q = len(self.tables.fam["device"])
            acc["device"] = np.zeros((1, q, self.pp))
        if self.counter is not None:
            acc["count"] = self.counter.root[None].copy()
        if self.states is not None:
            acc["mem"] = np.zeros((1,) + self.states.shape[:2])
            acc["peak"] = np.zeros((1, self.states.shape[0]))
            acc["extra"] = np.zeros((1, self.states.shape[0]))
        own = np.zeros((len(self.tables.fam.get("device", ())), 1))
        return _Kids(-1, [0], [-np.inf], [0], [1], np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), acc, own)

    def gather(self, kids: _Kids, pos: list[int]) -> dict:
        """The accumulated values of the children ``pos`` of ``kids`` (the
        nodes on the last axis; ``device`` and ``count`` on the first)."""
        cols = kids.rows[pos]
        out = {}
        for kind, val in kids.acc.items():
            if kind == "device":
                dev = val[kids.par[cols]]
                dev[:, :, kids.stage % self.pp] = kids.own[:, cols].T
                out[kind] = dev
            elif kind in ("count", "mem", "peak", "extra"):
                out[kind] = val[cols]
            else:
                out[kind] = val[..., cols]
        return out

    def lookahead(self, kids: _Kids, pos: int, limit: float, budget: int):
        """Expand child ``pos`` of ``kids`` with the children after it not
        yet expanded (the search visits them next), then, level by level,
        the first of the new children in depth-first order (at most
        :attr:`width` per level, ``budget`` nodes in all: the search pops at
        most that many more). A level of nodes with ``D`` more levels below
        takes at most ``budget / floor((D + 1) / 4)`` of them: the search
        reaches the next one only after the subtree of the one before, at
        least one node and at most a path of ``D + 1`` (replaying the split
        searches of GPT-3 175B at 1,024 and 16,384 GPUs, pipelines of up to
        96 stages whose searches stop after 99 nodes, 64 a level expanded
        up to eight nodes for each one visited; dividing by ``D + 1`` cost
        GPT-3 1.3B's 3,000-node searches of 8 stages 8%, a quarter of it
        nothing). Returns ``(kids, parent index)`` of child ``pos``'s
        children."""
        def wide(stage: int, budget: int) -> int:  # nodes of ``stage`` expanded together
            return max(1, min(self.width, budget // max(1, (self.S - stage) // 4)))

        ahead = range(pos, min(len(kids.j), pos + wide(kids.stage + 1, budget)))
        level, rows = kids, [r for r in ahead if r not in kids.child and kids.lb[r] < limit]
        while True:
            s = level.stage + 1
            out = self.expand(s, [level.j[r] for r in rows], self.gather(level, rows), limit)
            for p, r in enumerate(rows):
                level.child[r] = (out, p)
            n = min(len(out.j), wide(s + 1, budget), budget)
            if s >= self.S - 1 or n <= 0:  # its children are leaves, or the search stops first
                return kids.child[pos]
            level, rows, budget = out, list(range(n)), budget - n

    def expand(self, s: int, starts: list[int], acc: dict, limit: float) -> _Kids:
        """The children of the nodes of stage ``s`` starting at the layers
        ``starts`` with the accumulated values ``acc`` (:meth:`gather`), with
        their lower bounds: per family the fixed part plus the suffix minima
        of the rest, the largest over families, then (not the last stage)
        the rank-counting bound for those below ``limit``; only the children
        below ``limit``."""
        cols = self.columns(s, starts)
        N = len(cols)
        par = np.repeat(np.arange(N), [len(c[0]) for c in cols])
        T = len(par)

        def cat(xs):
            return xs[0] if N == 1 else np.concatenate(xs, axis=-1)

        if T == 0:
            return _Kids(s, [], [], [0] * N, [0] * N, par, par, {}, None)
        j, block = cat([c[0] for c in cols]), cat([c[1] for c in cols])
        fam_lb = np.zeros((self.nfam, T))
        new, own, rank = {}, None, s % self.pp
        for kind in self.kinds:
            a, x, *suf = (None if r is None else block[r] for r in self.layout[kind])
            if kind == "device":
                dev = acc[kind]  # (N, Q, pp)
                mine = dev[:, :, rank]
                own = mine.T[:, par] + x
                others = dev[:, :, self.others_of[rank]].max(axis=2, initial=-np.inf).T[:, par]
                rest = (dev.sum(axis=2) - mine).T[:, par]
                tot = np.maximum(np.maximum(own, others), (rest + own + suf[0]) / self.pp)
                new[kind] = dev
            else:
                v = acc[kind][..., par]
                if kind == "sum":
                    new[kind] = v + a
                    tot = new[kind] + suf[0]
                elif kind == "max":
                    new[kind] = np.maximum(v, x)
                    tot = np.maximum(new[kind], suf[0])
                elif kind == "prefix":
                    cm = np.maximum(v[1], v[0] + x)
                    ca = v[0] + a
                    tot = np.maximum(cm, ca + suf[0])
                    new[kind] = np.stack([ca, cm])
                else:  # suffix
                    new[kind] = np.maximum(v + a, x)
                    tot = np.maximum(new[kind] + suf[0], suf[1])
            idx, unique = self.scatter[kind]
            if unique:
                fam_lb[idx] += tot
            else:
                np.add.at(fam_lb, idx, tot)
        lb = fam_lb.max(axis=0)
        if self.states is not None:
            new["mem"], new["peak"], new["extra"] = self._device_bytes(
                s, np.asarray(starts)[par], j, acc["mem"][par], acc["peak"][par], acc["extra"][par], lb)
        if self.counter is not None and s < self.S - 1:  # only children that may still be expanded
            live = np.flatnonzero(lb < limit)
            states = np.zeros((T, 4, self.pp))
            if len(live):
                count = cat([c[2] for c in cols])[:, live]
                states[live] = self.counter.step(acc["count"][par[live]], s, *count)
                lb[live] = np.maximum(lb[live], self.counter.bound(states[live], s, j[live], limit))
            new["count"] = states
        order = np.lexsort((lb, par))  # per parent in bound order, ties in end order
        order = order[lb[order] < limit]  # the rest can never be expanded
        per_parent = np.bincount(par[order], minlength=N)
        hi = np.cumsum(per_parent)
        lo = hi - per_parent
        return _Kids(s, j[order].tolist(), lb[order].tolist(), lo.tolist(), hi.tolist(), order, par, new, own)


    def _device_bytes(self, s: int, i: np.ndarray, j: np.ndarray, before: np.ndarray, peak: np.ndarray,
                      extra: np.ndarray, lb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """With several stages per device: ``(T, R, Q)`` bytes each child's
        devices hold so far at each count state (``before``, the parents',
        a copy of them, updated in place), stage ``s`` on ``[i, j)`` added to
        its device (its training state, and the state's count of its chunk
        times one micro-batch's saved bytes), ``(T, R)`` the most
        one-at-a-time bytes of each device's stages so far (``extra``, the
        parents', a copy, in place; :meth:`PipelineCosts.peak_extra_at`),
        and ``(T, R)`` each device's peak over the states plus that
        (``peak``, the parents', a copy, in place:
        :meth:`PipelineCosts.device_memory_bytes` of the stages placed, the
        rest holding at least nothing; only the device of stage ``s``
        changes, so its row alone is reduced). A child
        whose device already exceeds its capacity at some state has no
        split that fits below it, nor one whose layers left need more
        training-state bytes than the devices have left together (each
        device ends at least at its peak so far plus the state of the layers
        it gets): its bound ``lb`` becomes +inf (in place)."""
        costs = self.tables.costs
        R = self.states.shape[0]
        r, c = s % R, s // R
        act = np.asarray(costs.saved_bytes(s, i, j), dtype=float)
        out = before
        out[:, r, :] += costs.resident_bytes(s, i, j)[:, None] + act[:, None] * self.states[r, :, c][None, :]
        extra[:, r] = np.maximum(extra[:, r], costs.peak_extra_at(s, i, j))
        peak[:, r] = out[:, r, :].max(axis=1) + extra[:, r]
        left = (costs.param_prefix_bytes[-1] - costs.param_prefix_bytes[j]) * costs.state_bytes_per_param_byte
        cap = costs.capacity_bytes[:R]
        lb[(peak[:, r] > cap[r]) | (peak.sum(axis=1) + left > cap.sum())] = np.inf
        return out, peak, extra


def _branch_and_bound(tables: _Tables, ev: _Evaluator, S: int, L: int, pp: int, best: float, tie_rel: float,
                      max_splits: int, max_nodes: int, counter: _RankCount | None = None):
    """Depth-first over stages, children in bound order (their bounds found
    level by level for many nodes at once, :class:`_Expander`); leaves are
    queued and evaluated in batches. Stops at ``max_nodes`` nodes, or at
    :data:`ESTIMATE_NODES` when the tree left is estimated at more than
    :data:`HOPELESS_FACTOR` times the limit
    (:func:`remaining_nodes_estimate`). Returns ``(exact, frontier_bound,
    nodes)``."""
    pending: list[tuple[float, tuple[int, ...]]] = []
    nodes = 0

    batch = ev.batch_size()

    def limit():
        # splits within the tie window of the best matter too: the tie-break (_chosen) sees every one
        return best * (1 + tie_rel)

    def flush():
        nonlocal best
        if not pending:
            return
        pending.sort()
        todo = [(lb, b) for lb, b in pending]
        pending.clear()
        step = ev.first_chunk()
        while todo:
            todo = [(lb, b) for lb, b in todo if lb < limit()]
            chunk, todo = todo[:step], todo[step:]
            if not chunk:
                break
            ev.run([b for _, b in chunk])
            best = min(best, min(ev.times[b] for _, b in chunk))
            step = min(2 * step, batch)

    expander = _Expander(tables, counter, S, L, pp)
    checks = {n: factor * max_nodes for n, factor in (EARLY_CHECK,) + PROGRESS_CHECKS if n < max_nodes}
    # where the search may stop (its stop rules' checks, its node limit): a look-ahead expands no node past the
    # next one, so that a search stopped there expanded none it does not visit (one of 64 stages of 64 nodes a
    # level reaches 4,096 nodes ahead)
    stops = sorted({*checks, max_nodes} | ({ESTIMATE_NODES} if ESTIMATE_NODES < max_nodes else set()))

    def ahead(nodes: int) -> int:
        return next((n for n in stops if n > nodes), max_nodes) - nodes

    kids, p = expander.lookahead(expander.root(), 0, limit(), ahead(0))
    # a frame: the node's boundaries, its children (kids, next position, end, first)
    stack = [[(0,), kids, kids.lo[p], kids.hi[p], kids.lo[p]]]
    hopeless = False  # the tree left is far larger than the node limit (ESTIMATE_NODES, PROGRESS_CHECKS)
    last_estimate = np.inf  # the tree's estimate at the last progress check passed (RISING_CHECKS)
    while stack:
        frame = stack[-1]
        prefix, kids, pos, end, _ = frame
        if pos >= end or kids.lb[pos] >= limit():
            stack.pop()  # children are sorted by bound: the rest is excluded too
            continue
        if hopeless or nodes >= max_nodes or ev.feasible + len(pending) >= max_splits:
            flush()
            live = [fr[1].lb[fr[2]] for fr in stack if fr[2] < fr[3] and fr[1].lb[fr[2]] < limit()]
            if live:
                return False, min(live), nodes
            return True, np.inf, nodes
        if nodes + 1 == ESTIMATE_NODES < max_nodes and remaining_nodes_estimate(
                [(fr[1].lb, fr[2] + (fr is frame), fr[3]) for fr in stack], limit()) > HOPELESS_FACTOR * max_nodes:
            hopeless = True  # stopped as at the node limit, before this child
            continue
        if nodes + 1 in checks:
            share = searched_share([(fr[1].lb, fr[4], fr[2], fr[3]) for fr in stack], limit())
            estimate = (nodes + 1) / share if share > 0 else np.inf
            rising = RISING_CHECKS.get(nodes + 1)
            informed = share > 0 or nodes + 1 != EARLY_CHECK[0]  # the early check needs a finished subtree
            if informed and (estimate > checks[nodes + 1] or (rising is not None and estimate >= last_estimate
                                                              and estimate > rising * max_nodes)):
                hopeless = True
                continue
            last_estimate = estimate
        frame[2] = pos + 1
        nodes += 1
        bounds = prefix + (kids.j[pos],)
        if len(bounds) == S + 1:
            pending.append((kids.lb[pos], bounds))
            if len(pending) >= batch:
                flush()
            continue
        sub, p = kids.child.get(pos) or expander.lookahead(kids, pos, limit(), ahead(nodes))
        stack.append([bounds, sub, sub.lo[p], sub.hi[p], sub.lo[p]])
    flush()
    return True, np.inf, nodes


def searched_share(frames, limit: float) -> float:
    """The share of a depth-first branch and bound's tree already searched,
    from its stack: ``frames`` root first, each ``(lb, first, pos, end)``
    with its children's bounds ``lb[first:end]`` in bound order, those below
    ``limit`` live, and ``pos`` the next to visit (the one before it is in
    progress in every frame but the last). Each live child of a frame
    stands for an equal share of that frame's share, so the share searched
    is the sum of the finished children's shares (the weighted estimate
    of Kilby, Slaney, Thiebaux and Walsh 2006, "Estimating search tree
    size", AAAI); ``nodes / share`` estimates the tree's size."""
    share, weight = 0.0, 1.0
    for k, (lb, first, pos, end) in enumerate(frames):
        live = bisect.bisect_left(lb, limit, first, end) - first
        if live <= 0:
            break
        weight /= live
        finished = pos - first - (k < len(frames) - 1)
        if finished >= live:  # the child in progress is excluded now (the limit fell): the frame is done
            return share + live * weight
        share += finished * weight
    return share


def remaining_nodes_estimate(frames, limit: float) -> float:
    """Nodes a depth-first branch and bound has left, estimated from its
    stack: ``frames`` root first, each ``(lb, pos, end)`` with its
    children's bounds ``lb[pos:end]`` not yet visited (in bound order), of
    which those below ``limit`` are live. Along the current path, as Knuth's
    estimator of a backtrack tree's size does with its random path (Knuth
    1975, Mathematics of Computation 29(129)): a live child of frame ``k``
    stands for a subtree of ``1 + b_{k+1} + b_{k+1} b_{k+2} + ...`` nodes,
    ``b_i`` the live children of the frames below it."""
    total, below = 0.0, 1.0
    for lb, pos, end in reversed(frames):
        live = bisect.bisect_left(lb, limit, pos, end) - pos
        total += live * below
        below = 1.0 + live * below
    return total


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
