"""Bounds from whole layers per rank: the rank-layer bound and the rank-counting bound of the branch and bound."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .costs import PipelineCosts
from .split_bounds import CHAIN_SCHEDULES, action_terms, bound_families, chain_counts, chain_inputs, split_stage_terms
from .split_fits import (RANK_LAYER_TERMS, chunk_pairs_fit, least_stage_bytes, rank_memory_fits, rank_minima,
                         stage_minima, stage_ranges)
from .timemodel import send_overlap


def rank_layer_bound_s(costs: PipelineCosts, schedule: str, pp: int, width: int, cutoff_s: float,
                       cache: dict | None = None) -> float:
    """A lower bound ``B`` with ``T(x) >= min(B, cutoff_s)`` for every split
    ``x`` that fits and whose stages hold at most ``width`` layers (a split
    with a longer stage must be at least ``cutoff_s`` slow, e.g. ``width =
    width_for(costs, cutoff_s)``); ``inf`` when no such split has every
    rank below the cutoff.

    It counts whole layers per rank. Each one-sum family ``G_h`` of
    :func:`pipesearch.split_bounds.bound_families` (chain families for every stage) and each rank's
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
    the suffix minima of :class:`pipesearch.bound_tables.SuffixTables` relax away. Cost ``O(H S W L)``
    for ``H`` families, ``S`` stages, ``W = width``, ``L`` layers; 0 (no
    bound) above :data:`pipesearch.split_fits.RANK_LAYER_TERMS` terms. ``cache`` (a dict, one
    point's: the same ``costs``) keeps the per-rank minima, which do not
    depend on ``cutoff_s``, per ``(schedule, pp, W)``: a point's cutoff
    proof and its stopped search's bound (:func:`pipesearch.split_search._stopped_bound`) then
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
    families and of the device sums (:func:`pipesearch.split_fits.rank_minima`) and, with several
    stages per device, the layer counts each rank's device can hold
    (:func:`pipesearch.split_fits.rank_memory_fits`, else None); None when no stage range fits."""
    S = costs.pp
    ks, d, i = stage_ranges(costs, W)
    if not len(ks):
        return None
    fams = bound_families(costs, schedule, pp, ks, i, i + d)  # the chain families: _chain_stage_minima
    sums = stage_minima([fam[0][1] for fam in fams if len(fam) == 1 and fam[0][0] == "sum"], ks, d, S, W)
    if schedule in CHAIN_SCHEDULES:
        sums = np.concatenate([sums, _chain_stage_minima(costs, schedule, pp, ks, d, i, W)])
    devices = stage_minima([fam[0][2] for fam in fams if len(fam) == 1 and fam[0][0] == "device"], ks, d, S, W)
    least = least_stage_bytes(costs, ks, d, i, pp, W) if costs.chunk_states is not None and S > pp else None
    pairs = chunk_pairs_fit(least, costs.capacity_bytes, pp) if least is not None and S == 2 * pp else None
    memory = rank_memory_fits(least, costs.capacity_bytes, pp) if least is not None else None
    return rank_minima(sums, pp, pairs), rank_minima(devices, pp, pairs), memory


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


def _chain_stage_minima(costs: PipelineCosts, schedule: str, pp: int, ks, d, i, W: int) -> np.ndarray:
    """``(S, S, W)``: the chain families of every stage (:func:`pipesearch.split_bounds._chain_terms`
    with ``families = S``) through :func:`pipesearch.split_fits.stage_minima` over the ranges
    ``(ks, d, i)`` of :func:`pipesearch.split_fits.stage_ranges`, equal to it entry for entry.
    A family's term on stage ``s`` is fixed by five numbers of ``(family,
    s)`` (whether ``s`` precedes the family's stage, and its F, B, I, W
    counts there) and only a few such vectors occur (four for interleaved
    1F1B at any ``pp`` and ``vp``; at most three per stage for ZB-H1), so
    each vector is evaluated once on the ranges of the stages that use it,
    not once per family: ``O(U n)`` for ``U`` vectors per stage and ``n``
    ranges, against ``O(S n)``."""
    m, S = costs.num_micro_batches, costs.pp
    stages, counts = chain_counts(schedule, pp, m, S // pp, S)
    if not len(counts):
        return np.zeros((0, S, W))
    F, B, _, c, cin, r = terms = split_stage_terms(costs, ks, i, i + d)
    fill_drain, per_action = chain_inputs(schedule, terms, *action_terms(schedule, F, B, c, cin))
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


class RankCount:
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
    e_r``, the order statistic of :meth:`RankCount.bound` (the same
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
    with a ``W``, looped BFS with micro-batch 0) (:class:`RankCount`)."""
    first = np.ones(pp, dtype=bool)
    last = np.full(pp, schedule in ("gpipe", "1f1b", "interleaved-1f1b"))
    return first, last
