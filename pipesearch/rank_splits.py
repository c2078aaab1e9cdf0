"""The splits of one point whose every rank stays below a time limit, listed
whole when they are few.

Rank ``q`` runs the forward and backward of every micro-batch on each of its
stages one after another, then its all-reduce (the ``device`` family of
:func:`pipesearch.split_bounds.bound_families`: a path of the schedule's
dependency graph), so every split has ``T >= m sum_{s on q} (F_s + B_s) +
sum_{s on q} r_s`` for every rank ``q``. A split in which some rank reaches
a limit is therefore at least that slow: the splits below it are among
those this module lists. On identical layers the ranks' counts of layers
are then nearly forced (GPT-3 1.3B's 26 layers on 4 ranks of 2 chunks at
32 micro-batches: 7,800 of its 480,700 splits keep every rank below the
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
#: stage (counts, never seconds): beyond them the list is not built
MAX_PARTIAL_SPLITS = 2**15
MAX_CANDIDATES = 2**16


def rank_bounded_splits(costs: PipelineCosts, pp: int, limit_s: float, max_splits: int) -> np.ndarray | None:
    """Every split of ``costs`` (``S = costs.pp`` stages on ``pp`` ranks,
    stage ``s`` on rank ``s % pp``) whose stages each fit their devices
    (:meth:`PipelineCosts.fits`) and whose every rank keeps its work and
    all-reduce (module docstring) below ``limit_s``: ``(n, S + 1)``
    boundaries in lexicographic order (``n`` may be 0). None when
    ``limit_s`` is infinite or more than ``max_splits`` splits (or more
    than :data:`MAX_PARTIAL_SPLITS` or ``4 max_splits`` partial ones) remain.

    Built stage by stage: a stage of ``[i, j)`` is kept when its rank stays
    below the limit and the least work of the layers after ``j`` (each at
    its least time over the stage options, on the fastest device) fits in
    what the ranks of the later stages have left below it; stages are at most
    :func:`pipesearch.bound_tables.width_for` layers long."""
    L, S, m = costs.num_layers, costs.pp, costs.num_micro_batches
    if not np.isfinite(limit_s) or S > L:
        return None
    f, b = layer_times(costs)
    least = m * float(np.min(costs.time_scale)) * (f + b)
    rest = np.concatenate([np.cumsum(least[::-1])[::-1], [0.0]])  # (L+1,): least work of the layers [j, L)
    width = width_for(costs, limit_s)
    bounds, work = np.zeros((1, 1), dtype=np.int64), np.zeros((1, pp))
    for s in range(S):
        start, q = bounds[:, -1], s % pp
        if s == S - 1:
            parent, j = np.arange(len(start)), np.full(len(start), L)
        else:
            counts = np.clip(np.minimum(start + width, L - (S - 1 - s)) - start, 0, None)
            if counts.sum() > MAX_CANDIDATES:
                return None
            parent = np.repeat(np.arange(len(start)), counts)
            j = start[parent] + 1 + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        i = start[parent]
        total = work[parent, q] + m * (costs.fwd_s(s, i, j) + costs.bwd_s(s, i, j)) + costs.after_backward_s(s, i, j)
        later = np.zeros(pp, dtype=bool)  # the ranks of the stages after s: the layers after j go to them
        later[np.arange(s + 1, S) % pp] = True
        room = np.clip(limit_s - work[parent][:, later], 0, None).sum(axis=1)
        if later[q]:
            room += (limit_s - total) - (limit_s - work[parent, q])
        keep = np.flatnonzero((total < limit_s) & (rest[j] <= room) & np.asarray(costs.fits(s, i, j), dtype=bool))
        if len(keep) > min(MAX_PARTIAL_SPLITS, 4 * max_splits):
            return None
        bounds = np.concatenate([bounds[parent[keep]], j[keep, None]], axis=1)
        work = work[parent[keep]]
        work[:, q] = total[keep]
    return bounds if len(bounds) <= max_splits else None
