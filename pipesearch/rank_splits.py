"""The splits of one point whose every rank stays below a time limit, listed
whole when they are few.

Rank ``q`` starts with the forward of micro-batch 0 on its first stage
``q``, after that micro-batch's forwards and transfers down the stages
before it, runs the forward and backward of every micro-batch on each of its
stages one after another, then its all-reduce (a path of the schedule's
dependency graph: the ``device`` family of
:func:`pipesearch.split_bounds.bound_families` and micro-batch 0's way to
the rank), so every split has ``T >= sum_{s < q} (F_s + c_s) + m sum_{s on
q} (F_s + B_s) + sum_{s on q} r_s`` for every rank ``q`` (``c_s`` the
transfer after stage ``s``). A split in which some rank reaches
a limit is therefore at least that slow: the splits below it are among
those this module lists. On identical layers the ranks' counts of layers
are then nearly forced (GPT-3 1.3B's 26 layers on 4 ranks of 2 chunks at
64 micro-batches: 8,555 of its 480,700 splits keep every rank below the
fifth plan's time), so the few left are bounded and simulated one by one
(:func:`pipesearch.split_search._enumerate_all`) where a branch and bound
stops at its limits.
"""

from __future__ import annotations

import numpy as np

from .bound_tables import width_for
from .costs import PipelineCosts
from .fluid_bound import layer_times

#: partial splits (stages placed so far) kept at most while the list is
#: built stage by stage, and candidate stage ranges formed at most per
#: stage (counts, never seconds): beyond them the list is not built. T5-3B's
#: interleaved pp 4 points on 16 A100s (`-b 512`) keep up to 56,133
#: candidates on the way to lists of 5,868 to 17,662 splits (2^15 and
#: 2^16 refused them: four of its points and four of T5-11B's stopped
#: unproven, and both missed their second plan); at most 2^17 partial
#: splits of ``S + 1`` int64 boundaries are ``S + 1`` MiB
MAX_PARTIAL_SPLITS = 2**17
MAX_CANDIDATES = 2**18
#: no list when the limit exceeds this times the average rank's least work
#: (the model's least work over ``pp``): the layer counts are then loose and
#: the list long (resnet50 and resnet101 on 4x4-v100-10gbe, 1.19 to 2.4:
#: millions of splits; the transformers whose lists were short, 1.04 to
#: 1.16, GPT-3 1.3B's pp 4 points on 8 H100 + 16 A100 at 1.155)
MAX_SLACK = 1.2


def rank_bounded_splits(costs: PipelineCosts, pp: int, limit_s: float, max_splits: int) -> np.ndarray | None:
    """Every split of ``costs`` (``S = costs.pp`` stages on ``pp`` ranks,
    stage ``s`` on rank ``s % pp``) whose stages each fit their devices
    (:meth:`PipelineCosts.fits`) and whose every rank keeps its work and
    all-reduce (module docstring) below ``limit_s``: ``(n, S + 1)``
    boundaries in lexicographic order (``n`` may be 0). None when
    ``limit_s`` is infinite or above :data:`MAX_SLACK` times the average
    rank's least work, or when more than ``max_splits`` splits (or more
    than :data:`MAX_PARTIAL_SPLITS` or ``4 max_splits`` partial ones) remain.

    Built stage by stage: a stage of ``[i, j)`` is kept when its rank (its
    head, micro-batch 0's forwards and transfers before its first stage, and
    its work so far) stays below the limit and the least work of the layers
    after ``j`` (each at
    its least time over the stage options, on the fastest device) fits in
    what the ranks of the later stages have left below it (a rank not
    started yet starts after the head of the stages placed: on the default
    plan's interleaved pp 4 points of 4 micro-batches the heads cut a list
    of 10,321 splits to none); stages other
    than the last (which ends at the last layer) are at most
    :func:`pipesearch.bound_tables.width_for` layers long and end before
    their rank's least work reaches the limit. The tests are strict, with
    no tolerance: a caller that needs the splits within a tie window of a
    time passes that time raised by the window (``split_search._listed``:
    the cutoff times ``1 + tie_rel``)."""
    L, S, m = costs.num_layers, costs.pp, costs.num_micro_batches
    if not np.isfinite(limit_s) or S > L:
        return None
    f, b = layer_times(costs)
    least = m * float(np.min(costs.time_scale)) * (f + b)
    before = np.concatenate([[0.0], np.cumsum(least)])  # (L+1,): least work of the layers [0, j)
    if limit_s > MAX_SLACK * before[L] / pp:
        return None
    width = width_for(costs, limit_s)
    # per partial split: each rank's head and work so far (0 before its first stage), and the forward path of
    # micro-batch 0 through the stages placed (every rank not started yet starts at least that late)
    bounds, used, head = np.zeros((1, 1), dtype=np.int64), np.zeros((1, pp)), np.zeros(1)
    for s in range(S):
        q, later = s % pp, np.zeros(pp, dtype=bool)  # later: the ranks of the stages after s
        later[np.arange(s + 1, S) % pp] = True
        waiting = np.arange(pp) >= s  # ranks whose first stage is this one or later: they start at head or after
        ends = _stage_ends(bounds[:, -1], used + np.where(waiting, head[:, None], 0.0), limit_s, before, later, q,
                           min(width, L - S + 1), L - (S - 1 - s))
        if ends is None:
            return None
        parent, j = ends
        i = bounds[parent, -1]
        fwd = costs.fwd_s(s, i, j)
        total = used[parent, q] + (head[parent] if s < pp else 0.0) + m * (fwd + costs.bwd_s(s, i, j)) \
            + costs.after_backward_s(s, i, j)
        then = head[parent] + fwd + costs.send_s(s, j) if s < pp - 1 else head[parent]  # head of the ranks after s
        room = np.clip(limit_s - used[parent][:, later] - np.where(np.arange(pp)[later] > s, then[:, None], 0.0),
                       0, None).sum(axis=1)  # a rank not started yet: after the head through stage s
        if later[q]:  # rank q's room after this stage instead of before it
            room += used[parent, q] - total
        rest = before[L] - before[j]
        keep = np.flatnonzero((total < limit_s) & (rest <= room) & np.asarray(costs.fits(s, i, j), dtype=bool))
        if len(keep) > min(MAX_PARTIAL_SPLITS, 4 * max_splits):
            return None
        bounds = np.concatenate([bounds[parent[keep]], j[keep, None]], axis=1)
        used, head = used[parent[keep]], then[keep]
        used[:, q] = total[keep]
    return bounds if len(bounds) <= max_splits else None


def _stage_ends(start: np.ndarray, work: np.ndarray, limit_s: float, before: np.ndarray, later: np.ndarray,
                q: int, width: int, last: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(parent, j)``: the ends ``j`` worth testing of the next stage (on
    rank ``q``) of each partial split (``start`` its last boundary,
    ``work`` ``(n, pp)`` its ranks' work so far), at most ``width`` layers
    long and ending by ``last`` (the last stage: at ``last``); ends before
    the layer where rank ``q``'s least work (``before``: the least work of
    the layers before each) reaches the limit, and, when ``q`` has no stage
    after this one, from where the least work left fits in the ``later``
    ranks' room. Both loosened by rounding: the caller's exact tests follow.
    None when more than :data:`MAX_CANDIDATES`."""
    loose = 1 + 1e-9
    if later.any():
        hi = np.minimum(start + width, last)
        reach = np.searchsorted(before, before[start] + (limit_s - work[:, q]) * loose, "left") - 1
        hi = np.minimum(hi, reach)
    else:  # the last stage: it ends at the last layer (whatever the least work of the layers before it)
        hi = np.full(len(start), last)
    lo = start + 1 if later.any() else np.maximum(start + 1, last)
    if not later[q]:  # (before is non-decreasing: layer_times' shares are never negative)
        room = np.clip(limit_s - work[:, later], 0, None).sum(axis=1)
        lo = np.maximum(lo, np.searchsorted(-(before[-1] - before), -room * loose, "left"))
    counts = np.clip(hi - lo + 1, 0, None)
    if counts.sum() > MAX_CANDIDATES:
        return None
    parent = np.repeat(np.arange(len(start)), counts)
    return parent, lo[parent] + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
