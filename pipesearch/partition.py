"""Exact contiguous stage splitting, plus the baselines users compare against.

Given the cost terms of one search point (:class:`pipesearch.costs.PipelineCosts`),
find boundaries ``0 = x_0 < x_1 < ... < x_P = L`` minimizing the analytic
iteration time::

    T(x) = sum_k a_k(x_k, x_{k+1}) + max_k b_k(x_k, x_{k+1})

subject to every stage fitting in its devices' memory. ``a_k`` is a stage's
per-micro-batch time and ``b_k = (m-1) a_k + allreduce_k`` (see
:mod:`pipesearch.costs`). Stage terms depend on the stage index ``k`` (its
in-flight micro-batches, its device type, its outgoing link), so every dynamic
program here runs over (stage, end layer).

Method (exact; the bottleneck-enumeration idea of Alpa, Zheng et al. OSDI'22
sec. 5.2, made output-sensitive):

1. ``min_max_split``: a DP over (stage, end layer) minimizing ``max_k b_k``
   gives ``B*``, the smallest achievable bottleneck, and a feasible split.
2. ``min_sum_split(limit)``: a DP minimizing ``sum_k a_k`` subject to
   ``b_k <= limit`` (or ``< limit``) gives ``S(limit)``, nonincreasing in the
   limit.
3. Every split with bottleneck ``v`` has ``T >= v + S(v)``, and
   ``T >= B* + S(v)``. Scan the distinct values of ``S`` from the largest useful
   limit ``best - S_lb`` downwards: evaluate ``S`` strictly below the smaller
   of the current bottleneck and ``best - S`` (a split whose sum is at least
   the ``S`` just found beats ``best`` only with a bottleneck below
   ``best - S``), take the split found, and stop once ``B* + S`` reaches the
   best ``T`` seen. Each step moves to a strictly smaller limit, so the scan
   visits each level of ``S`` at most once; in practice a handful of DPs.

Each DP only looks at stage lengths that can satisfy the current limit and the
memory cap (prefix sums are monotone, so ``searchsorted`` gives each end
layer's earliest start, checked exactly, and a binary search where the check
fails), and at stage ``s`` only at the end layers a split of stages no longer
than the band can reach (``L - (P-1-s) W <= j <= (s+1) W``): the work is at
most ``O(P * L * W)`` for a band of width ``W`` rather than ``O(P * L^2)``.
The band is laid out one end layer per row, so each step's minimum over the
stage lengths runs along contiguous memory, and the previous stage's values
are read through a strided view (no gather).

Long chains (a band over :data:`MAX_BAND_CELLS` cells) whose stage terms are
nonincreasing in the stage's start (:func:`_monotone_in_start`) run each
pass without a band (:func:`_dp_crossing`): the min-max value at an end
layer is where the best prefix over a range of starts (nondecreasing in the
range's first start) crosses the stage's own term (nonincreasing in it), a
binary search; the min-sum over the starts a limit allows is a range
minimum, since a stage's sum term is a prefix-sum difference plus a term of
its end. ``O(P L log L)`` work, ``O(P L)`` memory, the banded passes'
values and choices (tests/test_partition_long.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .costs import PipelineCosts

_INF = float("inf")


@dataclass(frozen=True)
class SplitResult:
    """An exact split: boundaries (length P+1), its analytic iteration time and
    how many DP passes it took."""

    bounds: tuple[int, ...]
    iteration_time_s: float
    dp_passes: int = 0

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.bounds, self.bounds[1:]))


def _band_width(costs: PipelineCosts, limit: float, memory_starts=None) -> int:
    """Longest stage (in layers) any stage can have under ``limit`` and memory.

    ``memory_starts`` (:func:`_memory_starts`, when the caller keeps it)
    saves recomputing the memory part, which does not depend on ``limit``."""
    L, m = costs.num_layers, costs.num_micro_batches
    j = np.arange(L + 1)
    width = 0
    cp = costs.compute_prefix_s
    time_starts: dict = {}  # per time scale: each end layer's earliest start under the limit
    for scale, lo in (memory_starts if memory_starts is not None else _memory_starts(costs)):
        if np.isfinite(limit) and m > 1 and scale > 0:
            if scale not in time_starts:
                span = limit / ((m - 1) * scale) * (1 + 1e-9) + 1e-15
                time_starts[scale] = np.searchsorted(cp, cp - span, "left")
            lo = np.maximum(lo, time_starts[scale])
        width = max(width, int(np.max(j - lo)))
        if width >= L:
            return L
    return max(width, 1)


def _memory_prefix(costs: PipelineCosts, s: int) -> np.ndarray:
    """``(L + 1,)``: stage ``s``'s memory of the layers ``[0, j)``, as
    :func:`_stage_fits` counts it (training state plus ``in_flight``
    micro-batches of saved activations); a range's is a difference of two,
    equal up to rounding (less the bytes its first layer shares with the
    layer before it, :attr:`PipelineCosts.saved_start_bytes`: a first guess
    that :func:`_fit_starts` checks)."""
    return costs.param_prefix_bytes * costs.state_bytes_per_param_byte + costs.saved_prefix_bytes * costs.in_flight[s]


def _memory_starts(costs: PipelineCosts):
    """Per distinct stage (in-flight micro-batches, capacity, speed): its
    time scale and, for every end layer ``j``, the earliest start whose range
    fits in memory (prefix sums are monotone: ``searchsorted``)."""
    out, seen = [], set()
    for s in range(costs.pp):
        key = (costs.in_flight[s], costs.capacity_bytes[s], costs.time_scale[s])
        if key in seen:
            continue
        seen.add(key)
        mem_prefix = _memory_prefix(costs, s)
        slack = 1e-9 * (abs(costs.capacity_bytes[s]) + 1.0)
        out.append((costs.time_scale[s], np.searchsorted(mem_prefix, mem_prefix - costs.capacity_bytes[s] - slack,
                                                         "left")))
    return out


#: bands of at most this many cells (stage lengths x end layers) are kept for
#: every DP pass; larger ones are computed a block of end layers at a time and
#: not kept, so the memory of a split is linear in layers x stages
MAX_BAND_CELLS = 2**22
#: cells of one such block
BLOCK_CELLS = 2**18


class _Band:
    """Stage terms over a band of stage lengths ``d = 1 .. W`` and end layers
    ``j``: row ``j``, column ``d-1`` is the stage ``[j-d, j)`` (one end layer
    per row, so that a DP step's minimum over the lengths runs along the
    contiguous axis).

    When ``W x (L+1)`` is at most :data:`MAX_BAND_CELLS` the arrays are
    computed once per distinct stage (same device speed, links and memory)
    and reused by every DP pass; otherwise :meth:`block` computes each block
    of :data:`BLOCK_CELLS` cells from the prefix sums when asked. Both give the same numbers (the same
    elementwise formulas on the same prefix sums).
    """

    def __init__(self, costs: PipelineCosts):
        self.costs = costs
        self.width = 0
        self._memory_starts = None
        self._starts: dict = {}

    def band_width(self, limit: float) -> int:
        """:func:`_band_width` of the costs, the memory part computed once."""
        if self._memory_starts is None:
            self._memory_starts = _memory_starts(self.costs)
        return _band_width(self.costs, limit, self._memory_starts)

    def columns_per_block(self, width: int) -> int:
        """End layers per :meth:`block` for a band of ``width`` lengths."""
        if width * (self.costs.num_layers + 1) <= MAX_BAND_CELLS:
            return self.costs.num_layers + 1
        return max(1, BLOCK_CELLS // max(width, 1))

    def block(self, s: int, width: int, lo: int, hi: int):
        """``(a, b, room)`` of stage ``s`` for stage lengths ``1 .. width``
        ending at layers ``lo .. hi-1``: ``a``, ``b`` of shape ``(hi - lo,
        width)`` (a start below 0 is read as 0, and then does not fit);
        ``room`` ``(hi - lo,)``, the longest length that fits in memory at
        each end (the lengths that fit are ``1 .. room``: memory grows with
        the range)."""
        L = self.costs.num_layers
        room = np.arange(lo, hi) - self.fit_starts(s, width, lo, hi)
        if width * (L + 1) <= MAX_BAND_CELLS and hi - lo > 1:  # (one row, the last stage's: not the whole band)
            self._ensure(width)
            a, b = self._cached_terms(s)
            return a[lo:hi, :width], b[lo:hi, :width], room
        i, j = _ranges(width, lo, hi)
        a, b = _terms(self.costs, s, i, j)
        return a, b, room

    def _ensure(self, width: int) -> None:
        if width <= self.width:
            return
        self.width = width
        self.i, self.j = _ranges(width, 0, self.costs.num_layers + 1)
        self._terms: dict = {}

    def _cached_terms(self, s: int):
        """The band's ``(a, b)`` of stage ``s``, shared by the stages whose
        terms are the same functions of the range: with per-stage options
        (offload, recompute) the option a range takes depends on the stage's
        memory, so those stages share nothing."""
        c = self.costs
        key = (c.time_scale[s], c.p2p_bandwidth_bytes_per_s[s], c.p2p_latency_s[s],
               c.allreduce_s_per_byte[s], c.allreduce_fixed_s[s], s == c.pp - 1,
               None if c.device_step_rate is None else c.device_step_rate[s],
               None if c.options is None else s)
        if key not in self._terms:
            self._terms[key] = _terms(c, s, self.i, self.j)
        return self._terms[key]

    def fit_starts(self, s: int, width: int, lo: int, hi: int) -> np.ndarray:
        """:func:`_fit_starts` of stage ``s`` for stages of at most ``width``
        layers ending at ``lo .. hi-1``, kept per distinct memory (searched
        again only for a wider band or more end layers)."""
        c = self.costs
        key = (c.in_flight[s], c.capacity_bytes[s])
        w0, lo0, hi0, starts = self._starts.get(key, (0, lo, lo, None))
        if w0 < width or lo < lo0 or hi > hi0:
            w0, lo0, hi0 = max(w0, width), min(lo0, lo), max(hi0, hi)
            starts = _fit_starts(c, s, w0, lo0, hi0)
            self._starts[key] = (w0, lo0, hi0, starts)
        return starts[lo - lo0:hi - lo0]


def _ranges(width: int, lo: int, hi: int):
    """The ranges ``[j-d, j)`` for ``j = lo .. hi-1`` (rows) and ``d = 1 ..
    width`` (columns): their starts ``(hi - lo, width)`` (0 where negative)
    and ends ``(hi - lo, 1)`` (broadcast: a term of the end alone is
    computed once per row)."""
    j = np.arange(lo, hi)[:, None]
    return np.maximum(j - np.arange(1, width + 1)[None, :], 0), j


def _terms(c: PipelineCosts, s: int, i, j):
    """``(a, b)`` of stage ``s`` over the ranges ``[i, j)``."""
    a = c.sum_term(s, i, j)
    return a, (c.num_micro_batches - 1) * a + c.after_backward_s(s, i, j)


def _stage_fits(c: PipelineCosts, s: int, i, j):
    """Whether the ranges ``[i, j)`` fit stage ``s``'s memory: training
    state plus ``in_flight`` micro-batches of saved activations."""
    static = (c.param_prefix_bytes[j] - c.param_prefix_bytes[i]) * c.state_bytes_per_param_byte
    act = c.saved_prefix_bytes[j] - c.saved_prefix_bytes[i] + c.saved_start_at(i)
    return static + act * c.in_flight[s] <= c.capacity_bytes[s]


def _fit_starts(c: PipelineCosts, s: int, width: int | None = None, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """``(hi - lo,)``: for every end layer ``j = lo .. hi-1`` (default all,
    ``0 .. L``), the smallest ``i <= j`` with ``[i, j)`` fitting stage ``s``
    (:func:`_stage_fits`), ``j + 1`` when none does; with ``width``, the
    smallest such ``i >= j - width`` (enough for stages of at most ``width``
    layers). The memory of ``[i, j)`` is a sum of
    prefix-sum differences scaled by non-negative factors, each
    non-increasing in ``i`` also in floating point (rounding is monotone), so
    ``[i, j)`` fits exactly when ``i`` is at least this start. A
    ``searchsorted`` of the memory's prefix sums (equal up to rounding)
    guesses it; each guess is checked with :func:`_stage_fits` at it and just
    below it, and the entries whose check fails are searched over their
    range (:func:`_first_true`, ``O(L log width)``)."""
    j = np.arange(lo, c.num_layers + 1 if hi is None else hi)
    lo = np.zeros(len(j), dtype=np.int64) if width is None else np.maximum(j - width, 0)
    top = j + 1  # the answer lies in [lo, j + 1]; every start searched is at most j

    def pred(i, sel):
        return _stage_fits(c, s, i, j[sel])

    mem = _memory_prefix(c, s)
    guess = np.clip(np.searchsorted(mem, mem[j] - c.capacity_bytes[s], "left"), lo, top)
    every = np.arange(len(j))
    ok = _brackets(pred, every, lo, top, guess, guess)
    if ok.all():
        return guess
    out = guess.copy()
    bad = every[~ok]
    out[bad] = _first_true(lambda i, sel: pred(i, bad[sel]), lo[bad], top[bad])
    return out


def _dp(band: _Band, mode: str, limit: float = _INF, strict: bool = False):
    """One DP pass over (stage, end layer).

    ``mode="max"``: minimize ``max_k b_k``; ``mode="sum"``: minimize
    ``sum_k a_k`` subject to ``b_k <= limit`` (``< limit`` when ``strict``).
    Both respect memory. Returns ``(value, bounds)`` or ``(inf, None)``.
    Memory: the ``(P, L+1)`` table of choices plus one band block.
    """
    costs = band.costs
    L, P = costs.num_layers, costs.pp
    W = band.band_width(limit)
    if W * (L + 1) > MAX_BAND_CELLS and _monotone_in_start(costs):
        return _dp_crossing(band, mode, limit, strict)
    step = band.columns_per_block(W)
    # the previous stage's values at every start, behind W entries of +inf:
    # a stage [j - d, j) reads pad[W + j - d] (+inf for a start below 0)
    pad = np.full(W + L + 1, _INF)
    pad[W] = 0.0 if mode == "sum" else -_INF
    # row r of over_room: lengths d (columns d - 1) longer than r layers, for stages with room for r
    over_room = np.arange(W)[None, :] >= np.arange(W + 1)[:, None]
    choice = np.zeros((P, L + 1), dtype=np.int64)
    rows = min(step, L + 1)  # work arrays reused by every block (no allocation per stage)
    cand_buf, out_buf, over_buf = np.empty((rows, W)), np.empty((rows, W), dtype=bool), np.empty((rows, W), dtype=bool)
    for s in range(P):
        first, end = (L, L + 1) if s == P - 1 else (s + 1, L - (P - 1 - s) + 1)
        # no stage is longer than W: stages 0 .. s end by (s + 1) W, the rest cover at most (P - 1 - s) W
        first, end = max(first, L - (P - 1 - s) * W), min(end, (s + 1) * W + 1)
        if first >= end:  # no end layer for stage s: stages of at most W layers cannot cover the L
            return _INF, None
        cur = np.full(W + L + 1, _INF)
        if s == 0 and P > 1:  # from layer 0 only: one range per end, not the band
            j = np.arange(first, end)
            a, b = _terms(costs, 0, np.zeros_like(j), j)
            out = band.fit_starts(0, W, first, end) > 0
            if np.isfinite(limit):
                out |= (b >= limit) if strict else (b > limit)
            cur[W + first:W + end] = np.where(out, _INF, a if mode == "sum" else b)
            choice[0, first:end] = np.where(out, 1, j)
            pad = cur
            continue
        for lo in range(first, end, step):
            hi = min(end, lo + step)
            a, b, room = band.block(s, W, lo, hi)
            n = hi - lo
            cand, out = cand_buf[:n], out_buf[:n]
            # out: the range does not fit in memory or (below) is over the limit
            np.take(over_room, np.clip(room, 0, W), axis=0, out=out)
            if np.isfinite(limit):
                (np.greater_equal if strict else np.greater)(b, limit, out=over_buf[:n])
                out |= over_buf[:n]
            # before[c, d - 1] = pad[W + lo + c - d]: the previous stage's value at the start (a strided view)
            before = np.lib.stride_tricks.as_strided(pad[W + lo - 1:], shape=a.shape,
                                                     strides=(pad.strides[0], -pad.strides[0]), writeable=False)
            (np.add if mode == "sum" else np.maximum)(before, a if mode == "sum" else b, out=cand)
            np.copyto(cand, _INF, where=out)
            best_d = np.argmin(cand, axis=1)
            cur[W + lo:W + hi] = cand[np.arange(n), best_d]
            choice[s, lo:hi] = best_d + 1
        pad = cur
    prev = pad[W:]
    value = prev[L]
    if not np.isfinite(value):
        return _INF, None
    bounds = [L]
    for s in range(P - 1, -1, -1):
        bounds.append(bounds[-1] - int(choice[s, bounds[-1]]))
    bounds.reverse()
    return float(value), tuple(bounds)


# -- long chains: the same DP passes without a band (stage terms monotone in the start)
#: values per block of :class:`_RangeArgmin` (its in-block scans take this many steps)
ARGMIN_BLOCK = 16


def _monotone_in_start(costs: PipelineCosts) -> bool:
    """Whether every stage's ``a`` and ``b`` are nonincreasing in the start
    ``i`` of ``[i, j)`` for a fixed end ``j``, also in floating point.

    True without per-stage options and without overlapped data-parallel
    communication, when the prefix sums are nondecreasing and every factor is
    non-negative: ``a = scale (C[j] - C[i]) + p2p(j)`` and the all-reduce is
    ``where(g > 0, g per + fixed, 0)`` of ``g = grad (P[j] - P[i])``, the
    GPU's optimizer step ``(P[j] - P[i] + tied) rate``; a
    difference ``x - y`` rounds nonincreasing in ``y`` and products and sums
    of non-negative numbers keep the order (IEEE rounding is monotone).
    (With overlap the exposed part ``max(C / K, C - (1 - 1/K) W)`` can grow
    as the stage shrinks; option choices change with the range.)"""
    ov = costs.overlap
    if costs.options is not None or (ov is not None and (ov.grad_reduce or ov.param_gather)):
        return False
    rising = all(bool(np.all(np.diff(p) >= 0)) for p in (costs.compute_prefix_s, costs.param_prefix_bytes))
    factors = (costs.time_scale, costs.allreduce_s_per_byte, costs.allreduce_fixed_s,
               np.array([costs.grad_bytes_per_param_byte, costs.gather_bytes_per_param_byte]),
               np.zeros(1) if costs.device_step_rate is None else costs.device_step_rate)
    return rising and costs.num_micro_batches >= 1 and all(bool(np.all(f >= 0)) for f in factors)


class _RangeArgmin:
    """Index of the smallest of ``values[lo:hi]``, the largest such index
    among ties, for arrays of ranges at once; ``O(n)`` memory.

    Blocks of :data:`ARGMIN_BLOCK` values keep each position's minimum up to
    the end (suffix) and from the start (prefix) of its block; a sparse table
    over the blocks' minima (``log2(n / B)`` levels) answers the whole blocks
    between; a range inside one block is read whole. Preferring the later
    index on ties in every part gives the largest minimizing index."""

    def __init__(self, values: np.ndarray):
        self.values = v = np.asarray(values, dtype=float)
        n, B = len(v), ARGMIN_BLOCK
        nb = -(-n // B)
        grid = np.full((nb, B), _INF)
        grid.reshape(-1)[:n] = v
        base = (np.arange(nb) * B)[:, None]
        pre, suf = np.zeros((nb, B), dtype=np.int64), np.zeros((nb, B), dtype=np.int64)
        best = grid[:, 0].copy()
        for t in range(1, B):  # prefix: ties go to the later index
            take = grid[:, t] <= best
            pre[:, t] = np.where(take, t, pre[:, t - 1])
            best = np.where(take, grid[:, t], best)
        suf[:, B - 1] = B - 1
        best = grid[:, B - 1].copy()
        for t in range(B - 2, -1, -1):  # suffix: ties keep the later index
            take = grid[:, t] < best
            suf[:, t] = np.where(take, t, suf[:, t + 1])
            best = np.where(take, grid[:, t], best)
        last = n - 1  # padding is +inf: it wins only where every value is, and n - 1 is then as good
        self.prefix = np.minimum((pre + base).reshape(-1)[:n], last)
        self.suffix = np.minimum((suf + base).reshape(-1)[:n], last)
        levels = [np.minimum(suf[:, 0] + base[:, 0], last)]  # each block's minimum
        k = 1
        while 2**k <= nb:  # levels[k][b]: the minimum of blocks [b, b + 2^k)
            half, prev, size = 2 ** (k - 1), levels[-1], nb - 2**k + 1
            a, b = prev[:size], prev[half:half + size]
            levels.append(np.where(v[b] <= v[a], b, a))
            k += 1
        self.table = np.zeros((len(levels), nb), dtype=np.int64)
        for k, level in enumerate(levels):
            self.table[k, :len(level)] = level
        self.log2 = np.frexp(np.arange(nb + 1))[1] - 1  # floor(log2(x)) of block counts
        # the values at those indices, for range minima without the index (min_of)
        self.suffix_values, self.prefix_values = v[self.suffix], v[self.prefix]
        self.table_values = v[self.table].reshape(-1)

    def min_of(self, lo, hi) -> np.ndarray:
        """``values[lo:hi].min()`` for arrays of ranges (``hi > lo``): the
        value at :meth:`query`'s index, without tracking the index."""
        v, B, nb = self.values, ARGMIN_BLOCK, self.table.shape[1]
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        bl, bh = lo // B, (hi - 1) // B
        b1, b2 = bl + 1, bh
        mid = b2 > b1
        k = self.log2[np.maximum(b2 - b1, 1)]
        whole = np.minimum(self.table_values[k * nb + np.minimum(b1, nb - 1)],
                           self.table_values[k * nb + np.maximum(b2 - 2**k, 0)])
        out = np.minimum(np.minimum(self.suffix_values[lo], self.prefix_values[hi - 1]),
                         np.where(mid, whole, _INF))
        same = np.flatnonzero(bl == bh)
        if len(same):  # one block: its part read whole
            l0, n0 = lo[same], hi[same] - lo[same]
            offs = np.arange(B)
            vals = np.where(offs < n0[:, None], v[np.minimum(l0[:, None] + offs, len(v) - 1)], _INF)
            out[same] = vals.min(axis=1)
        return out

    def query(self, lo, hi) -> np.ndarray:
        """Index of the minimum of ``values[lo:hi]`` (arrays, ``hi > lo``)."""
        v, B = self.values, ARGMIN_BLOCK
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        bl, bh = lo // B, (hi - 1) // B
        out = np.empty(len(lo), dtype=np.int64)
        same = np.flatnonzero(bl == bh)
        if len(same):  # read the block's part whole: the last smallest offset
            l0, n0 = lo[same], hi[same] - lo[same]
            offs = np.arange(B)
            vals = v[np.minimum(l0[:, None] + offs, len(v) - 1)]
            vals = np.where(offs < n0[:, None], vals, _INF)
            pick = B - 1 - np.argmin(vals[:, ::-1], axis=1)
            out[same] = l0 + np.minimum(pick, n0 - 1)
        far = np.flatnonzero(bl != bh)
        if len(far):
            b1, b2 = bl[far] + 1, bh[far]  # whole blocks [b1, b2) between
            span = np.maximum(b2 - b1, 1)
            k = np.frexp(span)[1] - 1
            mid = b2 > b1
            best = self.suffix[lo[far]]
            value = v[best]
            for cand, use in ((self.table[k, np.minimum(b1, b2 - 1)], mid),
                              (self.table[k, np.maximum(b2 - 2**k, 0)], mid),
                              (self.prefix[hi[far] - 1], None)):
                cv = v[cand]
                take = cv <= value if use is None else (cv <= value) & use
                best, value = np.where(take, cand, best), np.where(take, cv, value)
            out[far] = best
        return out


#: entries apart of the ones :func:`_first_true` searches first
SEARCH_STRIDE = 64


def _first_true(pred, lo, hi):
    """Smallest ``t`` in ``[lo, hi)`` with ``pred(t, sel)`` true, ``hi``
    where none is (arrays over entries ordered by stage end; ``pred``
    nondecreasing in ``t``, evaluated on the entries ``sel``).

    Every :data:`SEARCH_STRIDE`-th entry is searched over its whole range
    first. Each other entry then starts from a few places around the value
    interpolated between its two searched neighbours' answers, else from
    the range between those answers, else from its whole range: the first
    of these with ``pred`` true at its top and false just below its bottom
    (so the answer is inside). The same answers, with a few steps in place
    of ``log`` of the range for most entries."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    n = len(lo)
    if n <= 4 * SEARCH_STRIDE:  # few entries: bisect them all
        return _bisect(pred, lo, hi, np.arange(n))
    sample = np.unique(np.append(np.arange(0, n, SEARCH_STRIDE), n - 1))
    found = _bisect(pred, lo[sample], hi[sample], sample)
    e = np.arange(n)
    k = np.searchsorted(sample, e, "right") - 1
    nxt = np.minimum(k + 1, len(sample) - 1)
    a, b = found[k], found[nxt]
    gap = np.maximum(sample[nxt] - sample[k], 1)
    guess = a + ((b - a) * (e - sample[k])) // gap
    blo, bhi = lo.copy(), hi.copy()
    todo = e
    for low, high in ((guess - 2, guess + 2), (np.minimum(a, b), np.maximum(a, b))):
        low, high = np.clip(low[todo], lo[todo], hi[todo]), np.clip(high[todo], lo[todo], hi[todo])
        ok = _brackets(pred, todo, lo[todo], hi[todo], low, high)
        blo[todo[ok]], bhi[todo[ok]] = low[ok], high[ok]
        todo = todo[~ok]
        if not len(todo):
            break
    return _bisect(pred, blo, bhi, e)


def _brackets(pred, entries, lo, hi, low, high):
    """Whether the answer of each entry lies in ``[low, high]``: ``pred``
    true at ``high`` (or ``high`` is ``hi``) and false at ``low - 1`` (or
    ``low`` is ``lo``)."""
    ok = np.ones(len(entries), dtype=bool)
    top = np.flatnonzero(high < hi)
    if len(top):
        ok[top] = pred(high[top], entries[top])
    bottom = np.flatnonzero((low > lo) & ok)
    if len(bottom):
        ok[bottom] = ~pred(low[bottom] - 1, entries[bottom])
    return ok


def _bisect(pred, lo, hi, entries):
    """:func:`_first_true` by plain bisection; ``entries`` names the
    entries of ``lo`` / ``hi`` for ``pred``."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        sel = np.flatnonzero(lo < hi)
        if not len(sel):
            return lo
        mid = (lo[sel] + hi[sel]) // 2
        ok = pred(mid, entries[sel])
        hi[sel] = np.where(ok, mid, hi[sel])
        lo[sel] = np.where(ok, lo[sel], mid + 1)


def _dp_crossing(band: _Band, mode: str, limit: float = _INF, strict: bool = False):
    """:func:`_dp` without a band, for stage terms nonincreasing in the start
    (:func:`_monotone_in_start`); the same value and, among equal values,
    the same choice (the largest start).

    Stage ``s`` ending at ``j`` may start at ``i`` in ``[f_j, j)``, ``f_j``
    its first fitting start (:func:`_fit_starts`). ``mode="max"``: with
    ``g(t)`` the minimum of ``dp_{s-1}`` over ``[t, j)`` (nondecreasing in
    ``t``) and ``b(t, j)`` nonincreasing in ``t``, ``min_i max(dp_{s-1}(i),
    b(i, j)) = min_t max(g(t), b(t, j))`` is taken at the crossing ``t*``
    (the first ``t`` with ``g(t) >= b(t, j)``) or just before it: a binary
    search over ``t``; the split goes back through the largest ``i`` with
    ``dp_{s-1}(i)`` at most the value. ``mode="sum"``: ``b <= limit`` holds
    on a suffix ``[t_j, j)`` of starts (a binary search), and there
    ``dp_{s-1}(i) + a(i, j)`` is ``dp_{s-1}(i) - scale C[i]`` plus terms of
    ``j``: a range minimum (:class:`_RangeArgmin`; the sum of the chosen
    start is then evaluated as :func:`_dp` does). In real arithmetic both
    equal :func:`_dp`; the sum's choice among starts whose sums differ only
    by rounding may differ. Work ``O(P L log L)``, memory ``O(P L)``."""
    costs = band.costs
    L, P = costs.num_layers, costs.pp
    prev = np.full(L + 1, _INF)
    prev[0] = 0.0 if mode == "sum" else -_INF
    table = np.full((P + 1, L + 1), _INF)
    table[0] = prev
    choice = np.zeros((P, L + 1), dtype=np.int64) if mode == "sum" else None
    for s in range(P):
        first, end = (L, L + 1) if s == P - 1 else (s + 1, L - (P - 1 - s) + 1)
        j = np.arange(first, end)
        f = np.maximum(band.fit_starts(s, L, first, end), s)  # stage s starts at s or later
        cur = np.full(L + 1, _INF)
        if mode == "max":
            values = _max_stage(costs, s, prev, j, f)
            value_ok = (values < limit) if strict else (values <= limit)
            cur[j] = np.where(value_ok, values, _INF)
        else:
            lo = _limit_starts(costs, s, j, f, limit, strict)
            live = np.flatnonzero(lo < j)
            if len(live):
                jj = j[live]
                i = _RangeArgmin(prev - costs.time_scale[s] * costs.compute_prefix_s).query(lo[live], jj)
                a, _ = _terms(costs, s, i, jj)
                cur[jj] = prev[i] + a
                choice[s, jj] = jj - i
        prev = cur
        table[s + 1] = cur
    value = prev[L]
    if not np.isfinite(value):
        return _INF, None
    bounds = [L]
    for s in range(P - 1, -1, -1):
        end = bounds[-1]
        if mode == "sum":
            bounds.append(end - int(choice[s, end]))
        else:  # the largest start whose prefix is within the value (every term then is)
            bounds.append(int(np.flatnonzero(table[s, :end] <= table[s + 1, end])[-1]))
    bounds.reverse()
    return float(value), tuple(bounds)


def _max_stage(costs: PipelineCosts, s: int, prev, j, f):
    """``min_{f <= i < j} max(prev[i], b_s(i, j))`` for every end ``j``
    (:func:`_dp_crossing`); ``inf`` where ``f >= j``."""
    out = np.full(len(j), _INF)
    live = np.flatnonzero(f < j)
    if not len(live):
        return out
    jl, fl = j[live], f[live]
    rmq = _RangeArgmin(prev)

    def crossed(t, sel):
        return rmq.min_of(t, jl[sel]) >= _terms(costs, s, t, jl[sel])[1]

    t = _first_true(crossed, fl, jl)
    best = np.full(len(jl), _INF)
    at = np.flatnonzero(t < jl)  # at the crossing: the range minimum
    if len(at):
        best[at] = np.maximum(rmq.min_of(t[at], jl[at]), _terms(costs, s, t[at], jl[at])[1])
    before = np.flatnonzero(t > fl)  # just before it: the stage's own term
    if len(before):
        tb = t[before] - 1
        cand = np.maximum(rmq.min_of(tb, jl[before]), _terms(costs, s, tb, jl[before])[1])
        best[before] = np.minimum(best[before], cand)
    out[live] = best
    return out


def _limit_starts(costs: PipelineCosts, s: int, j, f, limit: float, strict: bool):
    """For every end ``j``, the first start ``t >= f`` with ``b_s(t, j)``
    within ``limit`` (``< limit`` when ``strict``), ``j`` where none is."""
    if not np.isfinite(limit) and not strict:
        return np.minimum(f, j)

    def within(t, sel):
        b = _terms(costs, s, t, j[sel])[1]
        return (b < limit) if strict else (b <= limit)

    return _first_true(within, np.minimum(f, j), j)


def _bottleneck(costs: PipelineCosts, bounds) -> float:
    return float(costs.stage_terms(bounds)[1].max())


def min_max_split(costs: PipelineCosts, band: _Band | None = None) -> tuple[float, tuple[int, ...] | None]:
    """Smallest achievable ``max_k b_k`` under memory, and a split achieving it.

    Returns ``(inf, None)`` when no split fits in memory. Starts from a narrow
    band around the average stage and widens it until the answer is inside it.
    """
    band = band or _Band(costs)
    m, P = costs.num_micro_batches, costs.pp
    full_width = band.band_width(_INF)
    even = even_split(costs.num_layers, P)
    if costs.split_fits(even):
        # the even split is feasible, so the optimum is <= its bottleneck: one pass
        return _dp(band, "max", limit=_bottleneck(costs, even))
    total = float(costs.compute_prefix_s[-1] * np.min(costs.time_scale))
    limit = max((m - 1) * total / P, 1e-12) * 2.0
    while band.band_width(limit) < full_width:
        value, bounds = _dp(band, "max", limit=limit)
        if bounds is not None:
            return value, bounds
        limit *= 4.0
    return _dp(band, "max")


def optimal_split(costs: PipelineCosts) -> SplitResult | None:
    """The split minimizing the analytic iteration time under memory, exactly.

    Returns None when no split into ``costs.pp`` non-empty stages fits in
    memory. See the module docstring for the method and its proof sketch.
    """
    if costs.pp > costs.num_layers:
        return None
    band = _Band(costs)
    b_star, bounds0 = min_max_split(costs, band)
    passes = 1
    if bounds0 is None:
        return None
    best_bounds = bounds0
    best = costs.iteration_time_s(bounds0)
    s_lb = float(costs.compute_prefix_s[-1] * np.min(costs.time_scale))
    limit, strict = best - s_lb, False
    while True:
        s_val, bounds = _dp(band, "sum", limit=limit, strict=strict)
        passes += 1
        if bounds is None:
            break
        value = costs.iteration_time_s(bounds)
        if value < best:
            best, best_bounds = value, bounds
        if b_star + s_val >= best:
            break
        # a split of sum >= s_val beats best only with a bottleneck below best - s_val
        below = min(_bottleneck(costs, bounds), best - s_val)
        if strict and below >= limit:  # the pass broke its own limit: it would repeat forever
            raise RuntimeError(f"internal error: the closed-form split's pass returned {bounds}, whose "
                               f"bottleneck {below!r} is not below its limit {limit!r}")
        limit, strict = below, True
    return SplitResult(tuple(best_bounds), best, passes)


def exhaustive_split(costs: PipelineCosts) -> SplitResult | None:
    """Brute force over all ``C(L-1, P-1)`` splits (reference for small cases)."""
    L, P = costs.num_layers, costs.pp
    best = None
    for cut in itertools.combinations(range(1, L), P - 1):
        bounds = (0, *cut, L)
        if not costs.split_fits(bounds):
            continue
        value = costs.iteration_time_s(bounds)
        if best is None or value < best.iteration_time_s:
            best = SplitResult(bounds, value)
    return best


def even_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layer-count-balanced boundaries: the first ``L mod P`` stages get one
    more layer (what runtimes do by default)."""
    q, r = divmod(num_layers, pp)
    sizes = [q + (1 if k < r else 0) for k in range(pp)]
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)]))


def balanced_split(weights, pp: int) -> tuple[int, ...]:
    """Boundaries minimizing the largest per-stage sum of ``weights`` (e.g.
    parameter counts, the common heuristic), by an exact min-max DP over
    prefix sums. Every stage gets at least one layer."""
    w = np.asarray(weights, dtype=float)
    L = len(w)
    prefix = np.concatenate([[0.0], np.cumsum(w)])
    prev = np.full(L + 1, _INF)
    prev[0] = -_INF
    choice = np.zeros((pp, L + 1), dtype=np.int64)
    for s in range(pp):
        cur = np.full(L + 1, _INF)
        ends = np.arange(s + 1, L - (pp - 1 - s) + 1)
        i = np.arange(s, L)
        step = max(1, 2**20 // max(len(i), 1))  # end layers per block of (end, start) cells
        for lo in range(0, len(ends), step):
            j = ends[lo:lo + step, None]
            cand = np.where(i[None, :] < j, np.maximum(prev[i][None, :], prefix[j] - prefix[i][None, :]), _INF)
            k = np.argmin(cand, axis=1)  # the first (smallest start) among ties, as a scan over starts
            cur[j[:, 0]], choice[s, j[:, 0]] = cand[np.arange(len(k)), k], i[k]
        prev = cur
    bounds = [L]
    for s in range(pp - 1, -1, -1):
        bounds.append(int(choice[s, bounds[-1]]))
    return tuple(reversed(bounds))
