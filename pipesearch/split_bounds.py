"""Lower bounds of a split's simulated time from per-stage terms: the path families, the chain
families and their Lagrangian combination, and every bound of complete splits at once."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import schedules as schedule_lib
from .costs import PipelineCosts
from .partition import even_split
from .timemodel import PATH_TERMS, send_overlap


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
      last backward work (ZB-H1 with one stage per rank: its last ``I`` and
      the ``k' + 1`` ``W`` after it) and all-reduce; and the same with rank ``r``'s whole
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
      ``k'``'s all-reduce (ZB-H1 with one stage per rank: the ``k'`` more
      ``W`` that rank runs after its last ``I`` before it); micro-batch 0
      down and up to stage ``k``, rank
      ``k``'s remaining actions and all-reduce; and (1F1B) the two-dwell-free
      forms ``sum (f + b) + max_k max((m-1) b_k + w f_k, (m-1) f_k + w b_k)``;
    * 1F1B / ZB-H1 with one stage per rank: the round-trip families of
      :func:`round_trip_counts` (micro-batch 0 down and back up to stage
      ``k``, round trips between ``k`` and a later ``k'`` while the
      schedule lets them follow one another, rank ``k``'s rest and
      all-reduce), for the pairs a slow link separates
      (:func:`round_trip_pairs`);
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
    few that most often exclude a point whole (:func:`pipesearch.split_search._cutoff_proof`).
    ``terms``: :func:`split_stage_terms` of ``s``, ``i``, ``j`` when already
    computed.
    """
    m, S = costs.num_micro_batches, costs.pp
    F, B, I, c, cin, r = split_stage_terms(costs, s, i, j) if terms is None else terms
    blocking = not send_overlap(schedule)
    f, b = action_terms(schedule, F, B, c, cin)
    w = m - S + s
    G = I if schedule == "zb-h1" else B
    # ZB-H1 (one stage per rank): rank k's W after its last I, beyond the one in B
    tail_w = (schedule_lib.zb_h1_weight_grads_after_last_input_grad(s) - 1) * (B - I) \
        if schedule == "zb-h1" and S == pp else 0.0
    fams = []
    if not own_only:  # the families every schedule has (the own-family tables leave them out)
        up = G + cin  # one step of a gradient back up
        last = (b if schedule == "1f1b" else B) + tail_w + r  # a rank's last backward work, then its all-reduce
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
                     ("suffix", I + cin, B + tail_w + r)])
        fams.append([("sum", F + c, None), ("suffix", I + cin, m * B + w * F + r)])
    if own_only:
        return fams
    pairs = round_trip_pairs(costs, schedule, pp)
    if pairs:
        fams += [[("sum", alpha, None)] for alpha in _round_trip_terms(schedule, m, S, s, (F, B, I, c, cin, r),
                                                                       pairs)]
    if chains and schedule in CHAIN_SCHEDULES:
        fill_drain, per_action = chain_inputs(schedule, (F, B, I, c, cin, r), f, b)
        fams += [[("sum", alpha, None)] for alpha in _chain_terms(schedule, pp, m, S, s, fill_drain, per_action, r,
                                                                 chain_families or MAX_CHAIN_FAMILIES)]
    if chains and len(paths):
        fams += [_path_family(coef, s, (F, B, I, B - I, c, r), cin) for coef in paths]
    if weights is not None:
        terms = separable_terms(fams, s, pp)
        fams.append([("sum", sum(w * a for w, a in zip(weights, terms) if w > 0), None)])
    return fams


def split_stage_terms(costs: PipelineCosts, s, i, j) -> tuple:
    """``(F, B, I, c, c_in, r)`` of stage ``s`` over the layers ``[i, j)``
    (broadcastable int arrays): forward, backward and input-gradient
    compute, the transfer to the next stage and from the previous one (0 on
    stage 0), and the all-reduce after the stage's last backward (seconds)."""
    F, B = costs.fwd_s(s, i, j), costs.bwd_s(s, i, j)
    c = costs.send_s(s, j)
    cin = np.where(np.asarray(s) > 0, costs.send_s(np.maximum(np.asarray(s) - 1, 0), i), 0.0)
    return F, B, costs.bwd_input_s(s, i, j), c, cin, costs.after_backward_s(s, i, j)


def stage_or_link_exceeds(costs: PipelineCosts, schedule: str, pp: int, limit_s: float) -> bool:
    """Whether every split has a stage whose ``m`` forwards and backwards
    and all-reduce, ``m (f + b) + r`` with the blocking sends of 1F1B in
    ``f`` (the ``device`` family of :func:`bound_families`, its incoming
    transfer left out; a rank of several stages runs at least each one's
    work, and its all-reduce after its last backward is at least each
    one's), or, with overlapped sends, a boundary whose ``m`` transfers on
    its link (``m c``), exceed ``limit_s``: then every split is slower than
    ``limit_s``. False when some split keeps every one of those terms
    within it. Memory is not looked at (a split that does not fit counts
    as one that might be fast: the answer stays a bound; on the default
    plan and resnet50 on 4x4-v100-10gbe it excluded no point more with
    memory).

    Stage ``s`` may end at ``j`` when its terms over ``[i, j)`` are within
    the limit for some start ``i`` it can have (an end of stage ``s - 1``
    reachable so). The transfer depends on ``j`` alone, and starting later
    only removes layers from a stage (its compute and all-reduce do not
    grow), so the latest reachable start below ``j`` is the one to try:
    one pass per stage over the ends (the set of reachable ends, not the
    furthest one: every stage holds a layer, so a stage that ends later can
    leave the next one only ends with large transfers). ``S`` numpy passes
    over at most ``L`` ends, no tables; from :data:`WITNESS_STAGES` stages
    on, one pass over the even split's stages first (False when it keeps
    them all within the limit).
    """
    L, S, m = costs.num_layers, costs.pp, costs.num_micro_batches
    if not np.isfinite(limit_s):
        return False
    overlap = send_overlap(schedule)
    if S >= WITNESS_STAGES:  # the even split first: one pass over its stages, where the walk below takes S
        even = np.asarray(even_split(L, S))  # any split will do (when it keeps every term within, some split does)
        if np.all(_stage_within(costs, overlap, m, limit_s, np.arange(S), even[:-1], even[1:])):
            return False
    reached = np.zeros(L + 1, dtype=bool)  # the starts stage s can have
    reached[0] = True
    for s in range(S):
        latest = np.maximum.accumulate(np.where(reached, np.arange(L + 1), -1))  # the latest start at or below
        j = np.array([L]) if s == S - 1 else np.arange(s + 1, L - (S - 1 - s) + 1)
        i = latest[j - 1]
        j = j[i >= 0]
        i = i[i >= 0]
        ok = _stage_within(costs, overlap, m, limit_s, s, i, j)
        reached = np.zeros(L + 1, dtype=bool)
        reached[j[ok]] = True
        if not reached.any():
            return True
    return not reached[L]


#: stages from which :func:`stage_or_link_exceeds` tries the even split
#: before its walk over the stages (a count: on GPT-3 175B's search over
#: 16,384 GPUs it kept every term of 118 of the 165 points that some split
#: keeps, where the walk took a numpy pass per stage; with fewer stages the
#: walk is short and the try would mostly add a pass, as on resnet50 on
#: 4x4-v100-10gbe, whose points mostly have a stage over the limit)
WITNESS_STAGES = 16


def _stage_within(costs: PipelineCosts, overlap: bool, m: int, limit_s: float, s, i, j) -> np.ndarray:
    """Whether stage ``s`` over the layers ``[i, j)`` (broadcastable int
    arrays) keeps :func:`stage_or_link_exceeds`' terms within ``limit_s``:
    ``m (F + B) + r`` with the blocking send in it unless ``overlap``, else
    ``m c`` too (:func:`split_stage_terms`' F, B, c and r: no input gradient
    or incoming transfer)."""
    c = costs.send_s(s, j)
    ok = m * (costs.fwd_s(s, i, j) + costs.bwd_s(s, i, j) + (0.0 if overlap else c)) + costs.after_backward_s(
        s, i, j) <= limit_s
    if overlap:
        ok &= m * c <= limit_s
    return ok


def _rank_work(schedule: str, m: int, F, B, c, cin, r):
    """A stage's ``m`` forwards and backwards (:func:`action_terms`) and
    its all-reduce: the ``device`` family of every schedule
    (:func:`bound_families`), a rank's whole work and all-reduce."""
    f, b = action_terms(schedule, F, B, c, cin)
    return m * (f + b) + r


def action_terms(schedule: str, F, B, c, cin) -> tuple:
    """``(f, b)``: a stage's forward and backward with its sends charged to
    them where ``schedule``'s sends block (``F + c``, ``B + c_in``), else
    ``F`` and ``B``."""
    if send_overlap(schedule):
        return F, B
    return F + c, B + cin


def chain_inputs(schedule: str, terms, f, b) -> tuple:
    """``(fill_drain, per_action)`` of :func:`_chain_terms` from a stage's
    ``terms`` (:func:`split_stage_terms`) and its ``f``, ``b``
    (:func:`action_terms`): ``F + c`` plus one step of micro-batch ``m -
    1``'s gradient back up, and the durations of an ``F``, ``B``, ``I`` and
    ``W`` action (blocking sends charged to the action that waits on them)."""
    F, B, I, c, cin, _ = terms
    blocking = not send_overlap(schedule)
    drain = b if blocking else (I if schedule == "zb-h1" else B) + c
    return F + c + drain, (f, b, I + (cin if blocking else 0.0), B - I)


#: the seventh row of a marked path family of :func:`pipesearch.split_search._start_paths` (a ``(7, S)``
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


def path_rows(paths) -> int:
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
    (counted from the schedule's order, :func:`chain_counts`), that
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
    ks, counts = chain_counts(schedule, pp, m, S // pp, families)
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


#: schedules with the round-trip families of :func:`round_trip_counts` (one stage per rank)
ROUND_TRIP_SCHEDULES = ("1f1b", "zb-h1")


#: the round-trip families span at most this many boundaries (``k' - k``),
#: fewer where the pairs would be more than :data:`MAX_ROUND_TRIP_FAMILIES`
#: (:func:`round_trip_pairs_within`), and at most that many families in all
#: (:func:`round_trip_pairs`): each is a table row (at span 3 the 16-device,
#: 3-type case, ZB-H1 pp 16, took 7% more CPU time; at span 1 vgg16 on
#: 4x4-v100-10gbe proved one of its points fewer; the 63 pairs of 1,000
#: layers on 64 stages of one link speed, 1F1B, took the exact split from
#: 0.59 to 1.43 CPU s)
MAX_ROUND_TRIP_SPAN = 3
MAX_ROUND_TRIP_FAMILIES = 16


def round_trip_pairs_within(S: int) -> tuple[tuple[int, int], ...]:
    """Every pair of stages ``k < k' <= k + span`` of ``S`` stages, ``span``
    at most :data:`MAX_ROUND_TRIP_SPAN` and at most
    :data:`MAX_ROUND_TRIP_FAMILIES` over the ``S - 1`` boundaries (at least
    1)."""
    span = max(1, min(MAX_ROUND_TRIP_SPAN, MAX_ROUND_TRIP_FAMILIES // max(1, S - 1)))
    return tuple((k, k2) for k in range(S) for k2 in range(k + 1, min(S, k + span + 1)))


def round_trip_pairs(costs: PipelineCosts, schedule: str, pp: int) -> tuple[tuple[int, int], ...]:
    """The pairs of stages whose round-trip families :func:`bound_families`
    has at this point: for 1F1B and ZB-H1 with one stage per rank, the
    pairs of :func:`round_trip_pairs_within` whose stages a slow link
    separates (less bandwidth or more latency than the point's fastest
    link: between nodes), where a round trip outlasts the ranks' own work,
    at most :data:`MAX_ROUND_TRIP_FAMILIES` (across the slowest links
    first); none where every link is alike."""
    S = costs.pp
    if schedule not in ROUND_TRIP_SCHEDULES or S != pp or S < 2:
        return ()
    bandwidth = np.asarray(costs.p2p_bandwidth_bytes_per_s, dtype=float)[:S - 1]
    latency = np.asarray(costs.p2p_latency_s, dtype=float)[:S - 1]
    slow = (bandwidth < bandwidth.max()) | (latency > latency.min())
    if not slow.any():
        return ()
    rank = {k: n for n, k in enumerate(sorted(np.flatnonzero(slow).tolist(),
                                              key=lambda k: (bandwidth[k], -latency[k], k)))}
    # a pair by the slowest link it crosses
    crossing = [(min(rank[b] for b in range(k, k2) if b in rank), k, k2) for k, k2 in round_trip_pairs_within(S)
                if any(slow[k:k2])]
    return tuple(sorted((k, k2) for _, k, k2 in sorted(crossing)[:MAX_ROUND_TRIP_FAMILIES]))


def _round_trip_terms(schedule: str, m: int, S: int, s, terms, pairs) -> list:
    """Per-stage terms of the round-trip families of :func:`round_trip_counts`
    for ``pairs``: ``alpha_s = nF f + nG g + nW W + nc c + nr r`` (``f``,
    ``g`` the forward and backward (ZB-H1: input-gradient) actions of
    :func:`action_terms`; ``c`` counted only where sends overlap, blocking
    ones are in ``f`` and ``g``)."""
    F, B, I, c, cin, r = terms
    f, b = action_terms(schedule, F, B, c, cin)
    g = I if schedule == "zb-h1" else b
    hop = c if send_overlap(schedule) else 0.0
    counts, s = round_trip_counts(schedule, S, m, tuple(pairs)), np.asarray(s)
    shape = np.broadcast_shapes(s.shape, np.shape(F), np.shape(B), np.shape(I), np.shape(c), np.shape(r))
    lead = (len(counts[0]),) + (1,) * (len(shape) - s.ndim)  # the family axis before every axis of the terms
    out = 0.0
    with np.errstate(invalid="ignore"):  # a count of 0 adds +0, even against an infinite term (no 0 x inf)
        for n, t in zip(counts, (f, g, B - I, hop, r)):
            if np.any(n):
                n = np.reshape(n[:, s], lead + s.shape)
                out = out + np.where(n > 0, n * np.asarray(t, dtype=float), 0.0)
    return list(np.broadcast_to(out, (len(counts[0]),) + shape))


@lru_cache(maxsize=256)
def round_trip_counts(schedule: str, S: int, m: int, pairs: tuple[tuple[int, int], ...]):
    """The round-trip families of 1F1B and ZB-H1 (one stage per rank): ``(nF,
    nG, nW, nc, nr)``, int arrays ``(families, S)``, per stage the number
    of forwards, backwards (ZB-H1: input gradients), weight gradients, hops
    over the boundary after it and all-reduces on one path of the
    dependency graph, one family per pair of stages ``(k, k')`` of
    ``pairs``, ``k < k'`` (:func:`round_trip_pairs`).

    The path: micro-batch 0 down to the last stage and back up to ``k``;
    then ``n`` round trips, each from ``k``'s backward of micro-batch ``j``
    (rank ``k``'s next action is the forward of ``j + S - k``, ZB-H1: after
    one ``W`` when ``j >= k``) down to ``k'``, whose next action is the
    backward of ``j + d`` (``d = k' - k + 1``), and back up to ``k``'s
    backward of ``j + d``, for ``j = 0, d, ..., (n-1) d`` while ``j + S - k
    <= m - 1``; then rank ``k``'s remaining actions and its all-reduce. A
    round trip is ``d`` micro-batches of ``sum_{k..k'} (f + g) + 2 sum c``:
    a cycle of the schedule's event graph, whose mean bounds the period (as
    the cycle mean of a max-plus system, Baccelli et al. 1992,
    *Synchronization and Linearity*, ch. 3), so a slow link between
    ranks that hold few micro-batches in flight bounds the time where no
    rank's own work does."""
    zb = schedule == "zb-h1"
    rows = []
    for k, k2 in pairs:
        d = k2 - k + 1
        n = (m - 1 - S + k) // d + 1 if m - 1 - S + k >= 0 else 0
        J = n * d
        nF, nG, nW, nc, nr = (np.zeros(S, dtype=np.int64) for _ in range(5))
        nF += 1  # micro-batch 0 down to the last stage and back up to k
        nG[k:] += 1
        nc[:S - 1] += 1
        nc[k:S - 1] += 1
        nF[k:k2 + 1] += n  # the round trips
        nG[k:k2 + 1] += n
        nc[k:k2] += 2 * n
        if zb:  # a W after the input gradient of each j >= k
            nW[k] += max(0, n - -(-k // d))
        nF[k] += max(0, m - J - S + k)  # rank k's rest after its backward of J
        nG[k] += m - 1 - J
        if zb:
            nW[k] += m - max(0, J - k)
        nr[k] = 1
        rows.append((nF, nG, nW, nc, nr))
    out = tuple(np.array([row[x] for row in rows], dtype=np.int64).reshape(len(rows), S) for x in range(5))
    for x in out:
        x.setflags(write=False)
    return out


@lru_cache(maxsize=256)
def chain_counts(schedule: str, pp: int, m: int, vp: int, families: int = MAX_CHAIN_FAMILIES):
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
            n = interleaved_chain(pp, m, vp, k)
        counts.append(n)
    out = np.array(counts, dtype=np.int64).reshape(len(counts), S, 4)
    out.setflags(write=False)  # memoised: shared by every caller
    return tuple(ks), out


def interleaved_chain(pp: int, m: int, vp: int, k: int) -> np.ndarray:
    """``(S, 4)`` counts of the interleaved 1F1B chain of stage ``k``
    (:func:`chain_counts`): the forwards ``a0 .. a_hi`` and backwards
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


TERM_KINDS = ("sum", "max", "prefix", "suffix", "device")


def split_lower_bounds(costs: PipelineCosts, schedule: str, pp: int, splits: np.ndarray,
                       chains: bool = True, paths=(), limit_s: float = np.inf) -> np.ndarray:
    """Lower bounds ``(n,)`` of the simulated time of the complete splits
    ``splits`` (``(n, S + 1)`` boundaries): the largest over the families of
    :func:`bound_families` (with the chain families when ``chains``, and the
    path families of ``paths``, :func:`pipesearch.split_search._start_paths`) of its value on the
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
    terms = split_stage_terms(costs, s, i, j)
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
    ``j`` (``(S, n)``) with :func:`split_stage_terms` ``terms``: the largest family."""
    n = i.shape[1]
    fams = bound_families(costs, schedule, pp, s, i, j, chains=chains, paths=paths, terms=terms)
    total = np.zeros((len(fams), n))
    for kind in TERM_KINDS:  # every component of one kind in one pass, stacked (family, stage, split)
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
