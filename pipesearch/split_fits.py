"""Whether some split fits every stage's and every device's memory, and a split that does."""

from __future__ import annotations


import numpy as np

from .costs import PipelineCosts
from .partition import even_split


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
    the witness split it seeks, :func:`witness_split`)."""
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
    (:func:`witness_split`): on that profile it took 1.0 of the search's 5.3 CPU
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


def witness_split(costs: PipelineCosts, cache: dict | None = None) -> tuple[int, ...] | None:
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


def mobius_witness(costs: PipelineCosts, cache: dict | None = None) -> tuple[int, ...] | None:
    """Mobius: a split every GPU holds (:meth:`PipelineCosts.split_fits`:
    each GPU's peak over its stays, :meth:`PipelineCosts.mobius_device_peak_bytes`,
    within its memory, and each node's host memory), a starting split of the
    search where the others overflow a GPU (the search's branch and bound,
    ordered by time, may meet no split that fits before its work limits).
    From the even split, a descent by single-layer boundary moves, each to
    the neighbour whose most-overflowing GPU overflows least (ties: the
    first), at most ``L x S`` moves; None when none fits on the way or a
    move no longer helps. Kept in ``cache`` (one point's dict) when given."""
    cache = {} if cache is None else cache
    if "mobius_witness" in cache:
        return cache["mobius_witness"]
    L, S = costs.num_layers, costs.pp
    found = None
    bounds = np.array(even_split(L, S), dtype=np.int64)
    capacity = costs.mobius_gpu_capacity_bytes()
    worst = float(np.max(costs.mobius_device_peak_bytes(bounds) - capacity))
    for _ in range(L * S):
        if worst <= 0 and costs.split_fits(tuple(bounds)):
            found = tuple(int(x) for x in bounds)
            break
        moves = np.repeat(bounds[None, :], 2 * (S - 1), axis=0)
        k = np.arange(1, S)
        moves[np.arange(S - 1), k] -= 1
        moves[np.arange(S - 1, 2 * (S - 1)), k] += 1
        moves = moves[np.all(np.diff(moves, axis=1) >= 1, axis=1)]  # every stage keeps a layer
        if not len(moves):
            break
        over = np.max(costs.mobius_device_peak_bytes(moves) - capacity, axis=1)
        best = int(np.argmin(over))
        if over[best] >= worst:  # (a split within the GPUs that the hosts cannot hold: no move aims at that)
            break
        bounds, worst = moves[best], float(over[best])
    cache["mobius_witness"] = found
    return found


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
    with its range), else by bisection (:func:`fit_ends`)."""
    ends = np.arange(int(starts.min(initial=last)) + 1, last + 1)
    if len(starts) * len(ends) <= LONGEST_FIT_CELLS:
        fit = costs.fits(s, starts[:, None], ends[None, :]) & (ends[None, :] > starts[:, None])
        return starts + np.count_nonzero(fit, axis=1)
    return fit_ends(costs, np.full(len(starts), s), starts, np.full(len(starts), last))


def fit_ends(costs: PipelineCosts, s: np.ndarray, starts: np.ndarray, last: np.ndarray) -> np.ndarray:
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


def chunk_pairs_fit(least: np.ndarray, capacity_bytes: np.ndarray, pp: int) -> np.ndarray:
    """Two stages per device, ``least`` of :func:`least_stage_bytes` and
    each device's ``capacity_bytes``: ``(pp, W, W)``, whether rank ``q``'s device
    can hold its chunks with ``d0`` and ``d1`` layers: at every count state
    ``n`` the least bytes of each length (over its starts,
    :func:`stage_minima`) add up to at most its capacity. Chunks of one
    device hold their micro-batches at different times (chunk 0 up to
    about twice chunk 1's), so the device's memory decides how its layers
    divide between them, not only how many it takes."""
    least = least.reshape(len(least), 2, pp, -1)  # (Q, chunk, rank, length)
    total = least[:, 0, :, :, None] + least[:, 1, :, None, :]  # (Q, pp, d0, d1)
    return np.all(total <= capacity_bytes[:pp, None, None], axis=0)


#: terms up to which the whole-layers-per-rank reasoning runs (a count):
#: :func:`_devices_can_hold`'s ``S W L`` (stage, length, start) ranges, and
#: :func:`pipesearch.rank_bounds.rank_layer_bound_s`'s about ``S W L (S + 8)``
#: (stage range, family) terms (64 MiB of float64), else no bound is sought
RANK_LAYER_TERMS = 2**23


def _devices_can_hold(costs: PipelineCosts, pp: int) -> bool:
    """False when no split can fit every device holding several stages
    (:attr:`PipelineCosts.chunk_states`): no count of layers per rank that
    adds up to ``L`` has each rank's device within its memory
    (:func:`rank_memory_fits`, a necessary condition); True otherwise, or
    without several stages per device, or above :data:`RANK_LAYER_TERMS`
    terms (not checked: the split search's leaves are checked anyway).
    Its caller (:func:`_device_split_fits`) tries a witness split first."""
    L, S = costs.num_layers, costs.pp
    W = max(1, L - S + 1)
    if costs.chunk_states is None or S <= pp or S * W * L > RANK_LAYER_TERMS:
        return True
    ks, d, i = stage_ranges(costs, W)
    if not len(ks):
        return False
    allowed = rank_memory_fits(least_stage_bytes(costs, ks, d, i, pp, W), costs.capacity_bytes, pp)
    return _counts_reach(allowed, L)


def _counts_reach(allowed: np.ndarray, L: int) -> bool:
    """Whether some counts ``R_q >= 1`` with ``allowed[q, R_q]`` (``(pp,
    n)`` bools) add up to ``L``: the sums the ranks ``0 .. q`` reach, one
    integer convolution per rank (:func:`pipesearch.rank_bounds._rank_knapsack` of zero costs,
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


def rank_memory_fits(least: np.ndarray, capacity_bytes: np.ndarray, pp: int) -> np.ndarray:
    """``(pp, vp W + 1)`` from ``least`` of :func:`least_stage_bytes` and
    each device's ``capacity_bytes``: whether rank ``q``'s device can hold ``R`` layers
    over its chunks: at each of its count states ``n`` (:attr:`PipelineCosts.chunk_states`)
    it holds at least ``sum_c (state_c + n_c a_c)``, whose least value over
    the chunks' lengths adding up to ``R`` (:func:`rank_minima` of the
    least over the starts, :func:`stage_minima`) must be within its
    capacity at every state (:meth:`PipelineCosts.device_memory_bytes` of
    a split is at least that)."""
    return rank_minima(least, pp).max(axis=0) <= capacity_bytes[:pp, None]  # (Q, pp, vp W + 1) at first


def least_stage_bytes(costs: PipelineCosts, ks, d, i, pp: int, W: int) -> np.ndarray:
    """``(Q, S, W)``: the least bytes stage ``s`` of ``d`` layers adds to its
    device at each count state ``q`` (its training state, plus its
    chunk's count at ``q`` times one micro-batch's saved
    bytes), over its starts among the ranges ``(ks, d, i)`` of
    :func:`stage_ranges` (:func:`stage_minima`; ``inf`` where none).
    The first chunk's stages add their one-at-a-time bytes
    (:meth:`PipelineCosts.peak_extra_at`): a device holds the most of its
    chunks', at least its first chunk's."""
    act = np.asarray(costs.saved_bytes(ks, i, i + d), dtype=float)
    rest = costs.resident_bytes(ks, i, i + d) + np.where(ks < pp, costs.peak_extra_at(ks, i, i + d), 0.0)
    counts = costs.chunk_states[ks % pp, :, ks // pp]  # (ranges, Q): each range's chunk count at every state
    return stage_minima([rest + counts[:, q] * act for q in range(counts.shape[1])], ks, d, costs.pp, W)


def stage_ranges(costs: PipelineCosts, W: int):
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
    not even one layer fits; :func:`fit_ends` over every ``(s, i)`` at
    once: ``log W`` calls of :meth:`PipelineCosts.fits` on ``S L`` ranges,
    not one on ``S W L``)."""
    L, S = costs.num_layers, costs.pp
    s, i = np.meshgrid(np.arange(S), np.arange(L), indexing="ij")
    return fit_ends(costs, s, i, np.minimum(i + W, L))


def stage_minima(terms, ks, d, S: int, W: int) -> np.ndarray:
    """``(H, S, W)``: each term's minimum over the starts of every ``(stage,
    length)`` (``inf`` where none fits); ``ks``, ``d`` grouped as
    :func:`stage_ranges` orders them."""
    vals = np.stack([np.broadcast_to(t, ks.shape) for t in terms]).astype(float)
    key = ks * W + (d - 1)
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    out = np.full((len(terms), S * W), np.inf)
    out[:, key[first]] = np.minimum.reduceat(vals, first, axis=1)
    return out.reshape(len(terms), S, W)


def rank_minima(a: np.ndarray, pp: int, pairs: np.ndarray | None = None) -> np.ndarray:
    """``(H, pp, vp W + 1)``: ``g[h, q, R]``, the least sum of ``a[h, s,
    d_s - 1]`` over rank ``q``'s stages ``s = c pp + q`` with lengths ``d_s``
    adding up to ``R`` (``inf`` where none does); with ``pairs`` (two
    stages per rank, ``(pp, W, W)``) only over the length pairs it allows
    (:func:`chunk_pairs_fit`)."""
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
