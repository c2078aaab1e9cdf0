"""Exact split + device mapping by dynamic programming over device classes.

Devices of one class (:func:`pipesearch.device_orders.device_classes`: same type,
capacity and links; on a cluster, the devices of one node) are
interchangeable, so a mapping is fixed by the *class* of every stage and the
split. The DP runs over states ``(n, c, j)``: ``n`` the devices used of each
class (a vector; its sum is the number of stages placed, so the current
stage's index ``k = sum(n) - 1`` and its in-flight count are known), ``c``
the class of the current stage and ``j`` its first layer. A transition ends
the current stage at ``j'`` and picks the next stage's class ``c'``; the
stage's time is ``a_k = compute_c[j, j') + p2p(c, c', j')``
(:class:`pipesearch.mapping.MappingProblem`'s terms: the outgoing transfer
depends on the next device, which the transition knows), and the stage must
fit in a device of class ``c``.

Objectives (:mod:`pipesearch.mapping`):

* ``"bottleneck"`` ``max_k a_k``: one pass with ``max`` as the combination;
* ``"iteration"`` ``sum_k a_k + (m-1) max_k a_k``: passes of the min-sum DP
  restricted to ``a_k <= B``. A pass with ``B = inf`` gives the least sum
  ``S_inf``, a ``max`` pass the least bottleneck ``M*``; the better of
  their two solutions is the first best value ``F``, so the first sum pass
  takes ``B = (F - S_inf) / (m-1)`` (no solution with a larger bottleneck
  can beat ``F``). Each pass's solution ``(S, M)`` updates ``F``,
  and the next pass takes ``B`` just below ``M`` and at most ``(F -
  S_inf) / (m-1)``; the loop stops as soon as a pass's least sum ``S(B)``
  satisfies ``S(B) + (m-1) M* >= F`` (``M*`` the least bottleneck, one
  ``max`` pass): every solution left has at least that value. An optimum ``X`` with ``M_X <= B`` either has ``M_X >=
  M`` (then the pass's solution is as good: ``S <= S_X``) or stays
  admissible for the next pass; so the loop ends (``B`` decreases over
  finitely many stage times) with the optimum.

Size: ``prod_c (n_c + 1)`` count vectors x classes x classes x ``(L+1)^2``
array operations; polynomial for a fixed number of classes. Exact (status
OPTIMAL, bound = objective) and deterministic: no time limit.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from .errors import InfeasibleError, InputError, PipesearchError
from .device_orders import device_classes
from .mapping import MappingProblem, MappingResult, _check_objective, _no_fit_message, make_result

#: count vectors above which :func:`class_dp_applies` declines (the DP's size)
MAX_COUNT_VECTORS = 20_000


def count_vectors(problem: MappingProblem) -> int:
    """``prod_c (n_c + 1)`` over the device classes of ``problem``."""
    return int(np.prod([len(c) + 1 for c in device_classes(problem)]))


def class_dp_applies(problem: MappingProblem, max_count_vectors: int = MAX_COUNT_VECTORS) -> bool:
    """Whether :func:`class_dp_mapping` is small enough to run."""
    return count_vectors(problem) <= max_count_vectors


class _Tables:
    """Per class: compute times ``(L+1, L+1)`` over ``[j, j')``; per class
    pair: the transfer at each boundary ``j'``; memory prefixes."""

    def __init__(self, problem: MappingProblem, classes: list[list[int]]):
        L = problem.num_layers
        self.classes = classes
        rep = [c[0] for c in classes]
        second = [c[1] if len(c) > 1 else c[0] for c in classes]
        j = np.arange(L + 1)
        self.valid = j[None, :] > j[:, None]
        prefix = problem._time_prefix[problem.device_type[rep]]  # (C, L+1)
        self.comp = np.where(self.valid[None], prefix[:, None, :] - prefix[:, :, None], np.inf)
        out = np.concatenate([[0.0], problem.output_bytes])  # out[j'] = bytes after layer j'-1
        C = len(classes)
        self.p2p = np.zeros((C, C + 1, L + 1))  # index C: no next stage (the last one)
        for x, y in itertools.product(range(C), range(C)):
            d, e = rep[x], (second[y] if x == y else rep[y])
            bw, lat = problem.link_bandwidth_bytes_per_s[d, e], problem.link_latency_s[d, e]
            self.p2p[x, y] = 2.0 * (lat + out / bw)
        s, a = problem._static_prefix, problem._act_prefix
        self.static = s[None, :] - s[:, None]
        self.act = a[None, :] - a[:, None]
        self.cap = problem.capacity_bytes[rep]
        self.in_flight = problem.in_flight

    def times_of(self, seq: list[int], bounds) -> np.ndarray:
        """``a_k`` of a solution (classes ``seq``, boundaries ``bounds``) in
        the tables' own arithmetic, which the passes' limits compare with
        (the result is re-evaluated by :meth:`MappingProblem.stage_times_s`)."""
        C, P = len(self.classes), len(seq)
        nxt = list(seq[1:]) + [C]
        return np.array([self.comp[seq[k], bounds[k], bounds[k + 1]] + self.p2p[seq[k], nxt[k], bounds[k + 1]]
                         for k in range(P)])

    def stage_times(self, k: int, limit: float) -> np.ndarray:
        """``(C, C+1, L+1, L+1)``: ``a`` of stage ``k`` on class ``c`` over
        ``[j, j')`` followed by class ``c'`` (``c' = C``: stage ``k`` is the
        last), inf where it does not fit in memory or exceeds ``limit``."""
        fits = self.static[None] + self.in_flight[k] * self.act[None] <= self.cap[:, None, None]
        a = self.comp[:, None, :, :] + self.p2p[:, :, None, :]
        return np.where(fits[:, None] & (a <= limit), a, np.inf)


#: elements of one chunk of a level's transitions (count vectors x classes^2 x (L+1)^2 at most)
LEVEL_CHUNK = 2**22


def _run(problem: MappingProblem, tab: _Tables, mode: str, limit: float):
    """One DP pass: ``mode`` ``"max"`` or ``"sum"`` over stage times that
    are at most ``limit``. Returns ``(value, classes, bounds)`` or None.

    A level (the count vectors of one sum) at a time: every state's
    transitions at once (in chunks of :data:`LEVEL_CHUNK` elements), each
    next state taking the least of its sources, the first class and then the
    first start on ties."""
    P, L = problem.pp, problem.num_layers
    sizes = [len(c) for c in tab.classes]
    C = len(sizes)
    combine = np.maximum if mode == "max" else np.add
    vectors = [n for n in itertools.product(*(range(s + 1) for s in sizes)) if 0 < sum(n) <= P]
    levels = [[n for n in vectors if sum(n) == k + 1] for k in range(P)]
    index = [{n: t for t, n in enumerate(level)} for level in levels]
    value = np.full((len(levels[0]), C, L + 1), np.inf)  # (vector, class of its current stage, its start)
    for t, n in enumerate(levels[0]):
        value[t, n.index(1), 0] = 0.0
    back = []  # per level k >= 1: (previous class, previous start), each (vectors, C, L+1)
    for k in range(P - 1):
        # (C, C, L+1, L+1): stage k on class c followed by c2 over [j, j'), laid out [c, c2, j', j]
        A = np.ascontiguousarray(tab.stage_times(k, limit)[:, :C].transpose(0, 1, 3, 2))
        nv = len(levels[k])
        best = np.full((nv, C, C, L + 1), np.inf)  # [vector, c, c2, j']
        arg = np.zeros((nv, C, C, L + 1), dtype=np.int64)
        step = max(1, LEVEL_CHUNK // (C * C * (L + 1) ** 2))
        for lo in range(0, nv, step):
            v = value[lo:lo + step]
            for c in range(C):
                live = np.flatnonzero(np.isfinite(v[:, c]).any(axis=0))  # the starts some state reached
                if not len(live):
                    continue
                j0, j1 = int(live[0]), int(live[-1]) + 1
                tot = combine(v[:, c, None, None, j0:j1], A[c, None, :, :, j0:j1])  # (chunk, c2, j', j)
                a = np.argmin(tot, axis=3)
                arg[lo:lo + step, c] = a + j0
                best[lo:lo + step, c] = np.take_along_axis(tot, a[..., None], axis=3)[..., 0]
        nxt = levels[k + 1]
        tgt, c2s, src = [], [], []
        for t, n in enumerate(nxt):
            for c2 in range(C):
                if n[c2] > 0:
                    prev = n[:c2] + (n[c2] - 1,) + n[c2 + 1:]
                    if prev in index[k]:
                        tgt.append(t), c2s.append(c2), src.append(index[k][prev])
        tgt, c2s, src = (np.array(x, dtype=np.int64) for x in (tgt, c2s, src))
        cand = best[src, :, c2s, :]  # (K, C, L+1) over the source's class
        pc = np.argmin(cand, axis=1)
        new = np.full((len(nxt), C, L + 1), np.inf)
        bc, bj = np.zeros((len(nxt), C, L + 1), dtype=np.int64), np.zeros((len(nxt), C, L + 1), dtype=np.int64)
        new[tgt, c2s] = np.take_along_axis(cand, pc[:, None, :], axis=1)[:, 0, :]
        bc[tgt, c2s] = pc
        bj[tgt, c2s] = np.take_along_axis(arg[src, :, c2s, :], pc[:, None, :], axis=1)[:, 0, :]
        back.append((bc, bj))
        value = new
    A = tab.stage_times(P - 1, limit)
    tot = combine(value, A[np.arange(C), C, :, L][None])  # (vectors, C, L+1): the last stage ends at L
    flat = int(np.argmin(tot))
    if not np.isfinite(tot.flat[flat]):
        return None
    t, c, j = np.unravel_index(flat, tot.shape)
    n, c, j = levels[P - 1][t], int(c), int(j)
    out, seq, bounds = float(tot.flat[flat]), [c], [L, j]
    for k in range(P - 1, 0, -1):
        bc, bj = back[k - 1]
        t = index[k][n]
        pc, pj = int(bc[t, c, j]), int(bj[t, c, j])
        n = n[:c] + (n[c] - 1,) + n[c + 1:]
        c, j = pc, pj
        seq.append(c)
        bounds.append(j)
    return out, seq[::-1], bounds[::-1]


def _devices(tab: _Tables, seq: list[int]) -> list[int]:
    """Concrete devices: each class's members in increasing order of stage."""
    used = [0] * len(tab.classes)
    out = []
    for c in seq:
        out.append(tab.classes[c][used[c]])
        used[c] += 1
    return out


def class_dp_mapping(problem: MappingProblem, objective: str = "iteration") -> MappingResult:
    """The exact optimum of ``problem`` (see the module docstring).

    Returns a :class:`MappingResult` with ``method="class-dp"``, status
    OPTIMAL, ``best_bound_s = objective_s``, ``candidates`` = DP passes.

    Raises:
        InputError: bad objective, ``P > L`` or ``P > D``.
        InfeasibleError: no split and mapping fits in memory.
    """
    _check_objective(objective)
    problem.check_sizes()
    start = time.perf_counter()
    tab = _Tables(problem, device_classes(problem))
    m = problem.num_micro_batches
    if objective == "bottleneck" or m == 1:
        found = _run(problem, tab, "max" if objective == "bottleneck" else "sum", np.inf)
        if found is None:
            raise InfeasibleError(_no_fit_message(problem))
        order, passes = _devices(tab, found[1]), 1
        bounds = found[2]
    else:
        first = _run(problem, tab, "sum", np.inf)
        if first is None:
            raise InfeasibleError(_no_fit_message(problem))
        s_inf, passes = first[0], 2
        bott = _run(problem, tab, "max", np.inf)  # the least bottleneck of any solution
        m_star = bott[0]
        best = None
        for seed in (first, bott):  # both are solutions: start from the better one
            order = _devices(tab, seed[1])
            a = tab.times_of(seed[1], seed[2])
            value = float(a.sum() + (m - 1) * a.max())
            if best is None or value < best[0]:
                best = (value, order, seed[2])
        limit = (best[0] - s_inf) / (m - 1) * (1 + 1e-12)
        found = _run(problem, tab, "sum", limit)
        while found is not None:
            if best is not None and found[0] + (m - 1) * m_star >= best[0]:
                break  # every solution left has sum >= found[0] and max >= m_star
            passes += 1
            order = _devices(tab, found[1])
            a = tab.times_of(found[1], found[2])
            if not a.max() <= limit:  # pragma: no cover - the DP's tables disagree with the problem
                raise PipesearchError(f"class DP: stage time {a.max()} above the pass limit {limit}")
            value = float(a.sum() + (m - 1) * a.max())
            if best is None or value < best[0]:
                best = (value, order, found[2])
            # strictly below this solution's bottleneck, so the loop ends
            limit = min(np.nextafter(float(a.max()), -np.inf),
                        (best[0] - s_inf) / (m - 1) * (1 + 1e-12))
            found = _run(problem, tab, "sum", limit)
        _, order, bounds = best
    if any(d not in range(problem.num_devices) for d in order):  # pragma: no cover - a bug above
        raise InputError("class DP produced an unknown device")
    return make_result(problem, order, bounds, objective, method="class-dp", candidates=passes,
                       wall_s=time.perf_counter() - start)
