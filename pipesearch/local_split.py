"""A better split near the best one met, for split searches that stop at
their work limits.

When the branch and bound of :func:`pipesearch.split_search.exact_split`
stops before it has proven its best split optimal, the best split it met is
the plan's split. Moving one boundary by a few layers (or a run of up to
:data:`LOCAL_RUN` neighbouring boundaries together by one layer) and
keeping the fastest neighbour, until none is faster, often finds a faster
split cheaply: each round is one batched
evaluation of the neighbours. Steepest descent over this neighbourhood is a
heuristic (a local optimum, no bound); the search still reports the bound
it proved and its gap, now against a faster split.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

#: boundary moves of 1 .. LOCAL_RADIUS layers either way (a count)
LOCAL_RADIUS = 2
#: rounds of steepest descent at most (a count, never seconds)
LOCAL_ROUNDS = 50
#: runs of 2 .. LOCAL_RUN neighbouring inner boundaries moved together by one
#: layer (a count). Four: resnet50's interleaved pp 4 x vp 2 point of 16
#: micro-batches on 4x4-v100-10gbe (`-b 256`, dp 4) stopped its branch and
#: bound at 126.18 ms with boundaries (6, 11, 16, 21, 29, 32, 34); moving the
#: first four back one layer, then the fifth, reaches (5, 10, 15, 20, 31, 32,
#: 34) at 122.71 ms, the point's optimum (every one of its 15.4 million
#: splits bounded or simulated, a scratch script), which runs of two missed
LOCAL_RUN = 4


def neighbours(bounds: Sequence[int], radius: int = LOCAL_RADIUS, run: int = LOCAL_RUN) -> list[tuple[int, ...]]:
    """The splits one move from ``bounds`` (``0 = b_0 < ... < b_S = L``):
    one inner boundary moved by ``1 .. radius`` layers either way, or a run
    of ``2 .. run`` neighbouring inner boundaries moved by one layer the
    same way (the stages between them shifted whole); every stage keeps at
    least one layer. Sorted, each once."""
    b = np.asarray(bounds, dtype=np.int64)
    cands = b[None, :] + _moves(len(b) - 1, radius, run)  # distinct moves give distinct splits, none ``bounds``
    cands = cands[np.all(cands[:, 1:] > cands[:, :-1], axis=1)]
    cands = cands[np.lexsort(cands.T[::-1])]  # rows in lexicographic order: the tuples sorted
    return list(map(tuple, cands.tolist()))


@lru_cache(maxsize=64)
def _moves(S: int, radius: int, run: int) -> np.ndarray:
    """The moves of :func:`neighbours` for ``S`` stages: one row of
    boundary shifts ``(S + 1,)`` per move (read-only, kept per shape)."""
    rows = [((k,), d) for k in range(1, S) for d in range(-radius, radius + 1) if d]
    rows += [(tuple(range(k, k + n)), d) for n in range(2, run + 1) for k in range(1, S - n + 1) for d in (-1, 1)]
    out = np.zeros((len(rows), S + 1), dtype=np.int64)
    for r, (ks, d) in enumerate(rows):
        out[r, list(ks)] = d
    out.setflags(write=False)
    return out


#: a neighbour whose lower bound is at least this much (relative) above the
#: current time is not evaluated: it cannot be faster, nor within the tie
#: window of any time met (bounds agree with the times they bound to
#: rounding, far below this)
SKIP_ABOVE_REL = 1e-9


def improve_split(bounds: Sequence[int], time_s: float, evaluate: Callable[[list], list],
                  fits: Callable[[list], Sequence[bool]], radius: int = LOCAL_RADIUS,
                  rounds: int = LOCAL_ROUNDS, max_splits: int | None = None,
                  lower: Callable[[list], Sequence[float]] | None = None,
                  run: int = LOCAL_RUN) -> tuple[tuple[int, ...], float]:
    """Steepest descent from ``bounds`` (time ``time_s``, seconds): each round
    evaluates every neighbour (:func:`neighbours`) that fits (``fits``: a
    list of splits -> whether each fits) in one call of ``evaluate`` (a
    list of splits -> their times) and moves to the
    fastest one if it is faster, the first in sorted order on ties; stops
    when none is, after ``rounds`` rounds, or once ``max_splits`` neighbours
    in all have been met (None: no such limit; the round that reaches it
    takes the first of its neighbours in sorted order only). ``lower`` (a
    list of splits -> lower bounds of their times): neighbours bounded
    :data:`SKIP_ABOVE_REL` above the current time are not evaluated (the
    same descent). First with runs of two boundaries, then, from where that
    stops, with runs of up to ``run`` (a descent with the larger moves from
    the start ends elsewhere, and on resnet101 on 4x4-v100-10gbe at a
    slower rank 1: 0.5427 s instead of 0.5397); then one round over the
    :func:`relocations` of a boundary when they are at most
    :data:`MAX_RELOCATIONS` and within ``max_splits``, and from a faster
    one the descents again (a variable neighbourhood descent, Mladenovic
    and Hansen 1997, Computers & Operations Research 24(11)), at most
    ``rounds`` times. Returns ``(split, time)``, never slower than the
    start."""
    best, best_t = tuple(int(x) for x in bounds), float(time_s)
    left = max_splits
    for _ in range(rounds):  # variable neighbourhood descent: the smaller moves again after each relocation
        for moves in dict.fromkeys((min(2, run), run)):
            best, best_t, left = _descend(best, best_t, evaluate, fits, lambda b, n=moves: neighbours(b, radius, n),
                                          rounds, left, lower)
        count = (len(best) - 2) * (best[-1] - len(best) + 1)  # (S - 1)(L - S): counted, not built
        if count > MAX_RELOCATIONS or (left is not None and count > left):
            break
        moved, moved_t, left = _descend(best, best_t, evaluate, fits, relocations, 1, left, lower)
        if not moved_t < best_t:
            break
        best, best_t = moved, moved_t
    return best, best_t


#: the relocations of one boundary (:func:`relocations`) are tried when
#: there are at most this many (a count: ``(S - 1)(L - S)``, 224 for 40
#: layers on 8 stages, 2,142 for 98 on 64; counted before any is built:
#: 58,968 for 1,000 layers on 64 stages took 0.2 CPU s to build)
MAX_RELOCATIONS = 1024


def relocations(bounds: Sequence[int]) -> list[tuple[int, ...]]:
    """The splits with one inner boundary of ``bounds`` taken out and put
    back at any layer that is not a boundary (two neighbouring stages
    merged and another one cut in two: ``(S - 1)(L - S)`` splits, the
    moves of :func:`neighbours` of one boundary among them), sorted. From
    resnet50's interleaved pp 4 x vp 2 point of 64 micro-batches on
    4x4-v100-10gbe (`-b 256`, dp 4), whose branch and bound stopped at
    128.40 ms with stages of 5, 1, 5, 1, 7, 9, 4 and 8 layers, one
    relocation (the fourth stage merged into the third, the last cut into 2
    and 6) reaches its optimum, 118.89 ms (every one of its 15.4 million
    splits bounded or simulated, a scratch script)."""
    b = tuple(int(x) for x in bounds)
    L, out = b[-1], set()
    for k in range(1, len(b) - 1):
        rest = b[:k] + b[k + 1:]
        taken = set(rest)
        out.update(tuple(sorted(rest + (j,))) for j in range(1, L) if j not in taken)
    out.discard(b)
    return sorted(out)


def _descend(best: tuple[int, ...], best_t: float, evaluate, fits, hood: Callable, rounds: int,
             left: int | None, lower) -> tuple[tuple[int, ...], float, int | None]:
    """:func:`improve_split`'s steepest descent over the splits ``hood(split)``:
    ``(split, time, count of neighbours still allowed)``."""
    for _ in range(rounds):
        if left is not None and left <= 0:
            break
        cands = _first_fitting(hood(best), fits, left)
        if left is not None:
            left -= len(cands)
        if lower is not None and cands:
            cands = [c for c, lb in zip(cands, lower(cands)) if lb < best_t * (1 + SKIP_ABOVE_REL)]
        if not cands:
            break
        times = evaluate(cands)
        t, c = min(zip(times, cands))
        if not t < best_t:
            break
        best, best_t = c, float(t)
    return best, best_t, left


def _first_fitting(cands: list, fits: Callable[[list], Sequence[bool]], count: int | None) -> list:
    """The first ``count`` of ``cands`` that fit (all when None), in their
    order; ``fits`` asked about blocks of at most ``2 count`` candidates
    (a whole neighbourhood of a 128-stage split is some 760 of them, of
    which a limited search may take 64)."""
    if count is None:
        return [c for c, ok in zip(cands, fits(cands) if cands else ()) if ok]
    out: list = []
    block = max(2 * count, 1)
    for lo in range(0, len(cands), block):
        part = cands[lo:lo + block]
        out += [c for c, ok in zip(part, fits(part)) if ok]
        if len(out) >= count:
            return out[:count]
    return out
