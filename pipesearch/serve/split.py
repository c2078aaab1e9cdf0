"""The exact layer split of a serving pipeline.

For ``B`` running sequences of a workload, a split (decoder blocks per
stage) is feasible when every stage's KV capacity holds ``B`` sequences at
their longest (the engine's pool is the minimum over stages). Among feasible
splits the search wants the smallest bottleneck stage time ``T`` of the
steady-state micro-batch (the cycle is ``max(R, m T, ...)`` and ``R`` does not
depend on the split, :mod:`pipesearch.serve.pipeline`), and among those the
largest pool. Both are dynamic programs over (stage, end layer), as the
training split of :mod:`pipesearch.partition`, here vectorised over many
batch levels at once:

1. ``f_s(j) = min_i max(f_{s-1}(i), t_s(i, j))`` over feasible stages
   ``[i, j)`` gives ``T*(B)``;
2. ``g_s(j) = max_i min(g_{s-1}(i), kv_s(i, j))`` over feasible stages with
   ``t_s(i, j) <= T*(B)`` gives the largest pool at that bottleneck, and the
   split.

Stage terms depend on the stage index (the embedding on the first stage, the
LM head and its logits on the last, both when ``pp = 1``), so the remainder
layers go where the costs say. :func:`max_pool_split` (the same max-min DP
without a time limit) gives the largest pool any split reaches, hence the
largest batch that fits. :func:`brute_force_split` enumerates every split, for
the tests.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .pipeline import ServePipeline, Step

__all__ = ["SplitLevel", "stage_capacities", "max_pool_split", "optimal_splits", "brute_force_split",
           "split_metrics"]

_INF = float("inf")
_REL = 1e-9


@dataclass(frozen=True)
class SplitLevel:
    """The best split at one batch level: ``split`` (blocks per stage), its
    bottleneck stage time (seconds), its pool and per-stage KV capacity
    (tokens)."""

    batch: int
    split: tuple[int, ...]
    bottleneck_s: float
    pool_tokens: int
    stage_kv_tokens: tuple[int, ...]


def stage_capacities(pipe: ServePipeline) -> np.ndarray:
    """KV tokens of stage ``s`` holding ``n`` blocks, shape ``(pp, L + 1)``;
    ``-1`` where the weights do not fit or ``n = 0`` (a stage needs a block)."""
    c, L = pipe.costs, pipe.costs.num_layers
    n = np.arange(L + 1)
    out = np.empty((pipe.pp, L + 1))
    for s in range(pipe.pp):
        first, last = pipe.stage_kind(s)
        out[s] = c.stage_kv_tokens(n, first, last)
    out[:, 0] = -1
    return out


def _stage_times(pipe: ServePipeline, step: Step) -> np.ndarray:
    """Seconds of stage ``s`` with ``n`` blocks at each level: ``(pp, nB, L+1)``."""
    L = pipe.costs.num_layers
    n = np.arange(L + 1, dtype=float)[None, :]
    return np.stack([pipe.stage_s(n, s, _column(step)) for s in range(pipe.pp)])


def _column(step: Step) -> Step:
    """The step with every array field as a column ``(nB, 1)`` to broadcast over ``n``."""
    def col(x):
        a = np.asarray(x, dtype=float)
        return a.reshape(-1, 1) if a.ndim else a
    return Step(col(step.decode), col(step.context), col(step.prefill), col(step.prompt_len), col(step.sampled),
                col(step.share))


def _max_min(cap: np.ndarray, allowed: np.ndarray):
    """Max over splits of the min stage capacity; ``allowed[s, b, n]`` marks
    usable stage lengths per level. Returns (pool per level, choice arrays)."""
    P, nB, L1 = allowed.shape
    L = L1 - 1
    j = np.arange(L1)
    nmat = j[None, :] - j[:, None]  # [i, j] -> j - i
    valid_n = nmat >= 1
    nidx = np.clip(nmat, 0, L)
    g = np.where(allowed[0], cap[0][None, :], -_INF)  # stage 0: [0, j)
    args = []
    for s in range(1, P):
        ok = allowed[s][:, nidx] & valid_n[None]  # (nB, i, j)
        val = np.where(ok, np.minimum(g[:, :, None], cap[s][nidx][None]), -_INF)
        if s == P - 1:
            val = val[:, :, L:]
        a = np.argmax(val, axis=1)
        g = np.take_along_axis(val, a[:, None, :], axis=1)[:, 0, :]
        args.append(a)
    pool = g[:, -1] if P > 1 else g[:, L]
    return pool, args


def _backtrack(args, P: int, L: int, level: int) -> tuple[int, ...]:
    bounds = [L]
    j = L
    for s in range(P - 1, 0, -1):
        a = args[s - 1]
        i = int(a[level, 0] if s == P - 1 else a[level, j])
        bounds.append(i)
        j = i
    bounds.append(0)
    b = bounds[::-1]
    return tuple(y - x for x, y in zip(b, b[1:]))


def max_pool_split(pipe: ServePipeline) -> tuple[int, tuple[int, ...]]:
    """The largest pool (tokens) any split reaches and that split; pool ``-1``
    (and an empty split) when no split fits the weights."""
    cap = stage_capacities(pipe)
    allowed = (cap >= 0)[:, None, :]
    pool, args = _max_min(cap, allowed)
    if pool[0] < 0:
        return -1, ()
    return int(pool[0]), _backtrack(args, pipe.pp, pipe.costs.num_layers, 0)


def optimal_splits(pipe: ServePipeline, batches, step: Step, need_tokens) -> list[SplitLevel | None]:
    """The exact split at each batch level (``None`` where nothing fits).

    Args:
        batches: running sequences per level, shape ``(nB,)``.
        step: the steady-state micro-batch of each level (fields ``(nB,)``).
        need_tokens: KV tokens each level must hold, shape ``(nB,)``.
    """
    batches = np.asarray(batches)
    need = np.asarray(need_tokens, dtype=float)
    P, L = pipe.pp, pipe.costs.num_layers
    cap = stage_capacities(pipe)
    times = _stage_times(pipe, step)  # (P, nB, L+1)
    feas = (cap[:, None, :] >= need[None, :, None]) & (np.arange(L + 1) >= 1)[None, None, :]
    # pass 1: min over splits of the max stage time
    j = np.arange(L + 1)
    nmat = j[None, :] - j[:, None]
    valid_n = nmat >= 1
    nidx = np.clip(nmat, 0, L)
    f = np.where(feas[0], times[0], _INF)
    for s in range(1, P):
        ok = feas[s][:, nidx] & valid_n[None]
        val = np.where(ok, np.maximum(f[:, :, None], times[s][:, nidx]), _INF)
        if s == P - 1:
            val = val[:, :, L:]
        f = val.min(axis=1)
    best = f[:, -1] if P > 1 else f[:, L]
    # pass 2: the largest pool among the splits at that bottleneck
    limit = best * (1 + _REL) + 1e-15
    allowed = feas & (times <= limit[None, :, None])
    pool, args = _max_min(cap, allowed)
    out: list[SplitLevel | None] = []
    for k, B in enumerate(batches):
        if not np.isfinite(best[k]) or pool[k] < need[k]:
            out.append(None)
            continue
        split = _backtrack(args, P, L, k)
        kv = tuple(int(cap[s, n]) for s, n in enumerate(split))
        out.append(SplitLevel(int(B), split, float(best[k]), int(min(kv)), kv))
    return out


def split_metrics(pipe: ServePipeline, split: tuple[int, ...], step: Step) -> tuple[float, int, tuple[int, ...]]:
    """(bottleneck seconds, pool tokens, per-stage KV tokens) of ``split`` at one level."""
    cap = stage_capacities(pipe)
    kv = tuple(int(cap[s, n]) for s, n in enumerate(split))
    t = max(float(np.asarray(pipe.stage_s(n, s, step)).reshape(-1)[0]) for s, n in enumerate(split))
    return t, min(kv), kv


def brute_force_split(pipe: ServePipeline, batch: int, step: Step, need_tokens: float) -> SplitLevel | None:
    """Every split of ``L`` blocks into ``pp`` non-empty stages; the feasible
    one with the smallest bottleneck, then the largest pool (for tests; grows
    as ``C(L-1, pp-1)``)."""
    L, P = pipe.costs.num_layers, pipe.pp
    best = None
    for cuts in itertools.combinations(range(1, L), P - 1):
        b = (0, *cuts, L)
        split = tuple(y - x for x, y in zip(b, b[1:]))
        t, pool, kv = split_metrics(pipe, split, step)
        if min(kv) < need_tokens:
            continue
        key = (t, -pool)
        if best is None or key[0] < best[0][0] * (1 - _REL) or (
                abs(key[0] - best[0][0]) <= _REL * best[0][0] and key[1] < best[0][1]):
            best = (key, SplitLevel(batch, split, t, pool, kv))
    return None if best is None else best[1]
