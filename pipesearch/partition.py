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
   limit ``best - S_lb`` downwards: evaluate ``S`` strictly below the current
   bottleneck, take the split found, and stop once ``B* + S`` reaches the best
   ``T`` seen. Each step moves to a strictly smaller bottleneck, so the scan
   visits each level of ``S`` at most once; in practice a handful of DPs.

Each DP only looks at stage lengths that can satisfy the current limit and the
memory cap (prefix sums are monotone, so ``searchsorted`` gives each end
layer's earliest start): the work is ``O(P * L * W)`` for a band of width ``W``
rather than ``O(P * L^2)``.
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


def _band_width(costs: PipelineCosts, limit: float) -> int:
    """Longest stage (in layers) any stage can have under ``limit`` and memory."""
    L, P, m = costs.num_layers, costs.pp, costs.num_micro_batches
    j = np.arange(L + 1)
    width = 0
    seen = set()
    for s in range(P):
        key = (costs.in_flight[s], costs.capacity_bytes[s], costs.time_scale[s])
        if key in seen:
            continue
        seen.add(key)
        mem_prefix = (
            costs.param_prefix_bytes * costs.state_bytes_per_param_byte
            + costs.saved_prefix_bytes * costs.in_flight[s]
        )
        slack = 1e-9 * (abs(costs.capacity_bytes[s]) + 1.0)
        lo = np.searchsorted(mem_prefix, mem_prefix - costs.capacity_bytes[s] - slack, "left")
        if np.isfinite(limit) and m > 1 and costs.time_scale[s] > 0:
            span = limit / ((m - 1) * costs.time_scale[s]) * (1 + 1e-9) + 1e-15
            cp = costs.compute_prefix_s
            lo = np.maximum(lo, np.searchsorted(cp, cp - span, "left"))
        width = max(width, int(np.max(j - lo)))
        if width >= L:
            return L
    return max(width, 1)


class _Band:
    """Stage terms over a band of stage lengths, computed once per distinct
    stage (same device speed, links and memory) and reused by every DP pass.

    Arrays have shape ``(W, L+1)``: row ``d-1``, column ``j`` is the stage
    ``[j-d, j)``.
    """

    def __init__(self, costs: PipelineCosts):
        self.costs = costs
        self.width = 0

    def ensure(self, width: int) -> None:
        if width <= self.width:
            return
        c = self.costs
        self.width = width
        j = np.arange(c.num_layers + 1)[None, :]
        i = j - np.arange(1, width + 1)[:, None]
        self.start_ok = i >= 0
        self.i = np.where(self.start_ok, i, 0)
        self.j = np.broadcast_to(j, i.shape)
        self.static = (c.param_prefix_bytes[j] - c.param_prefix_bytes[self.i]) * c.state_bytes_per_param_byte
        self.act = c.saved_prefix_bytes[j] - c.saved_prefix_bytes[self.i]
        self._terms: dict = {}
        self._fits: dict = {}

    def terms(self, s: int):
        """``(a, b)`` of stage ``s`` for every range in the band."""
        c = self.costs
        key = (c.time_scale[s], c.p2p_bandwidth_bytes_per_s[s], c.p2p_latency_s[s],
               c.allreduce_s_per_byte[s], c.allreduce_fixed_s[s], s == c.pp - 1)
        if key not in self._terms:
            a = c.sum_term(s, self.i, self.j)
            b = (c.num_micro_batches - 1) * a + c.allreduce_s(s, self.i, self.j)
            self._terms[key] = (a, b)
        return self._terms[key]

    def fits(self, s: int):
        """Whether each range of the band is a valid stage ``s`` in memory."""
        c = self.costs
        key = (c.in_flight[s], c.capacity_bytes[s])
        if key not in self._fits:
            self._fits[key] = self.start_ok & (self.static + self.act * c.in_flight[s] <= c.capacity_bytes[s])
        return self._fits[key]


def _dp(band: _Band, mode: str, limit: float = _INF, strict: bool = False):
    """One DP pass over (stage, end layer).

    ``mode="max"``: minimize ``max_k b_k``; ``mode="sum"``: minimize
    ``sum_k a_k`` subject to ``b_k <= limit`` (``< limit`` when ``strict``).
    Both respect memory. Returns ``(value, bounds)`` or ``(inf, None)``.
    """
    costs = band.costs
    L, P = costs.num_layers, costs.pp
    W = _band_width(costs, limit)
    band.ensure(W)
    prev = np.full(L + 1, _INF)
    prev[0] = 0.0 if mode == "sum" else -_INF
    choice = np.zeros((P, L + 1), dtype=np.int64)
    for s in range(P):
        cols = slice(L, L + 1) if s == P - 1 else slice(s + 1, L - (P - 1 - s) + 1)
        a, b = band.terms(s)
        a, b = a[:W, cols], b[:W, cols]
        ok = band.fits(s)[:W, cols]
        if np.isfinite(limit):
            ok = ok & ((b < limit) if strict else (b <= limit))
        before = prev[band.i[:W, cols]]
        if mode == "sum":
            cand = np.where(ok, before + a, _INF)
        else:
            cand = np.where(ok, np.maximum(before, b), _INF)
        best_d = np.argmin(cand, axis=0)
        cur = np.full(L + 1, _INF)
        cur[cols] = cand[best_d, np.arange(cand.shape[1])]
        choice[s, cols] = best_d + 1
        prev = cur
    value = prev[L]
    if not np.isfinite(value):
        return _INF, None
    bounds = [L]
    for s in range(P - 1, -1, -1):
        bounds.append(bounds[-1] - int(choice[s, bounds[-1]]))
    bounds.reverse()
    return float(value), tuple(bounds)


def _bottleneck(costs: PipelineCosts, bounds) -> float:
    return float(costs.stage_terms(bounds)[1].max())


def min_max_split(costs: PipelineCosts, band: _Band | None = None) -> tuple[float, tuple[int, ...] | None]:
    """Smallest achievable ``max_k b_k`` under memory, and a split achieving it.

    Returns ``(inf, None)`` when no split fits in memory. Starts from a narrow
    band around the average stage and widens it until the answer is inside it.
    """
    band = band or _Band(costs)
    m, P = costs.num_micro_batches, costs.pp
    full_width = _band_width(costs, _INF)
    even = even_split(costs.num_layers, P)
    if costs.split_fits(even):
        # the even split is feasible, so the optimum is <= its bottleneck: one pass
        return _dp(band, "max", limit=_bottleneck(costs, even))
    total = float(costs.compute_prefix_s[-1] * np.min(costs.time_scale))
    limit = max((m - 1) * total / P, 1e-12) * 2.0
    while _band_width(costs, limit) < full_width:
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
        limit, strict = _bottleneck(costs, bounds), True
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
        for j in range(s + 1, L - (pp - 1 - s) + 1):
            i = np.arange(s, j)
            cand = np.maximum(prev[i], prefix[j] - prefix[i])
            k = int(np.argmin(cand))
            cur[j], choice[s, j] = cand[k], i[k]
        prev = cur
    bounds = [L]
    for s in range(pp - 1, -1, -1):
        bounds.append(int(choice[s, bounds[-1]]))
    return tuple(reversed(bounds))


# ---------------------------------------------------------------------------
# The exact split for the time model (pipesearch.timemodel)


@dataclass(frozen=True)
class ExactSplit:
    """The best split of one search point for the simulated iteration time.

    Attributes:
        bounds: boundaries of the chosen split (length ``S + 1``).
        iteration_time_s: its time under :func:`pipesearch.timemodel.iteration_time_s`.
        lower_bound_s: a proven lower bound on the time of every split of the
            point; equal to ``best_time_s`` when the search was complete.
        best_time_s: the smallest time found (``iteration_time_s`` may exceed
            it by at most the tie tolerance, when a near-tie had less memory).
        exact: whether every split was either evaluated or excluded by a bound.
        splits_evaluated: splits whose time was evaluated.
        nodes: branch-and-bound nodes expanded.
    """

    bounds: tuple[int, ...]
    iteration_time_s: float
    lower_bound_s: float
    best_time_s: float
    exact: bool
    splits_evaluated: int
    nodes: int

    @property
    def gap(self) -> float:
        """``(best - bound) / best``: 0 for a complete search."""
        return max(0.0, (self.best_time_s - self.lower_bound_s) / self.best_time_s) if self.best_time_s > 0 else 0.0


#: deterministic work limits of :func:`exact_split` (never wall-clock)
MAX_SPLITS_EVALUATED = 2000
MAX_NODES = 200_000
TIE_REL = 1e-3


def _bound_families(costs: PipelineCosts, schedule: str, pp: int, i, j, s: int):
    """Per-stage terms of the lower-bound families of ``schedule`` for stage
    ``s`` over ranges ``[i, j)`` (arrays). Each family is ``(alpha, betas)``
    and bounds the time of a split by ``sum_k alpha_k + sum_c max_k beta_c,k``;
    docs/schedules.md derives each as a path of the dependency graph:

    * every schedule: one micro-batch down and back up,
      ``sum_k (F_k + c_k + G_k + c'_k)`` (``G`` = input-gradient part for
      zero-bubble, full backward otherwise);
    * every schedule: each rank does all its work, then its all-reduce,
      ``max_k m (f_k + b_k) + r_k`` (one stage per rank only);
    * GPipe: ``sum (f + b) + (m-1) max F + (m-1) max B`` (its closed form at
      ``s = 0``);
    * 1F1B: ``sum (f + b) + max_k max((m-1) b_k + (m-S+k) f_k,
      (m-1) f_k + (m-S+k) b_k)``: the path that waits for stage ``k``'s first
      backward and then follows rank ``k``, and the one that follows rank
      ``k`` from its first forward to its last.

    ``f``, ``b`` include the blocking sends of 1F1B.
    """
    from .timemodel import send_overlap

    m, S = costs.num_micro_batches, costs.pp
    F, B = costs.fwd_s(s, i, j), costs.bwd_s(s, i, j)
    cout, cin = costs.send_s(s, j), (costs.send_s(s - 1, i) if s > 0 else np.zeros_like(F))
    G = costs.bwd_input_s(s, i, j) if schedule == "zb-h1" else B
    r = costs.allreduce_s(s, i, j)
    blocking = not send_overlap(schedule)
    f = F + cout if blocking else F
    b = B + cin if blocking else B
    fams = [(F + cout + G + cin, [])]
    if S == pp:
        fams.append((np.zeros_like(F), [m * (f + b) + r]))
    if schedule == "gpipe":
        fams.append((F + B + cout + cin, [(m - 1) * F, (m - 1) * B]))
    elif schedule == "1f1b":
        w = m - S + s
        fams.append((f + b, [np.maximum((m - 1) * b + w * f, (m - 1) * f + w * b)]))
    return fams


class _Tables:
    """Band tables of the bound families: row ``d - 1``, column ``i`` is the
    stage ``[i, i + d)``; and the suffix minima of each family's sum and
    maxima over the splits of ``[i, L)`` into stages ``s .. S-1``."""

    def __init__(self, costs: PipelineCosts, schedule: str, pp: int, width: int):
        L, S = costs.num_layers, costs.pp
        self.width = W = max(1, min(width, L))
        i = np.arange(L + 1)[None, :]
        j = i + np.arange(1, W + 1)[:, None]
        valid = j <= L
        jc = np.minimum(j, L)
        ib = np.broadcast_to(i, jc.shape)
        self.terms, self.fits = [], []
        for s in range(S):
            fams = _bound_families(costs, schedule, pp, ib, jc, s)
            self.terms.append([(np.where(valid, a, np.inf), [np.where(valid, x, np.inf) for x in bs])
                               for a, bs in fams])
            self.fits.append(valid & costs.fits(s, ib, jc))
        nf = len(self.terms[0])
        inf = np.full(L + 1, np.inf)
        # suffix minima: suf[s][f] = (min sum alpha, [min max beta_c]) over splits of [i, L)
        self.suf = [None] * (S + 1)
        last = []
        for f in range(nf):
            zero = inf.copy()
            zero[L] = 0.0
            nb = len(self.terms[0][f][1])
            mx = [inf.copy() for _ in range(nb)]
            for x in mx:
                x[L] = -np.inf
            last.append((zero, mx))
        self.suf[S] = last
        rows = np.arange(W)[:, None]
        for s in range(S - 1, -1, -1):
            out = []
            jj = np.minimum(i + rows + 1, L)
            ok = self.fits[s]
            for f in range(nf):
                a, bs = self.terms[s][f]
                na, nbs = self.suf[s + 1][f]
                cand = np.where(ok, a + na[jj], np.inf)
                sa = cand.min(axis=0)
                smx = []
                for bc, nb in zip(bs, nbs):
                    c = np.where(ok & np.isfinite(na[jj]), np.maximum(bc, nb[jj]), np.inf)
                    smx.append(c.min(axis=0))
                out.append((sa, smx))
            self.suf[s] = out


def _width_for(costs: PipelineCosts, limit_s: float) -> int:
    """Longest stage (layers) whose ``m`` micro-batches of compute fit in ``limit_s``."""
    L, m = costs.num_layers, costs.num_micro_batches
    if not np.isfinite(limit_s):
        return L
    cp = costs.compute_prefix_s
    span = limit_s / (m * max(float(np.min(costs.time_scale)), 1e-300)) * (1 + 1e-9) + 1e-15
    lo = np.searchsorted(cp, cp - span, "left")
    return int(max(1, np.max(np.arange(L + 1) - lo)))


def exact_split(costs: PipelineCosts, schedule: str, pp: int, vp: int = 1, *,
                seeds=(), max_splits: int = MAX_SPLITS_EVALUATED, max_nodes: int = MAX_NODES,
                tie_rel: float = TIE_REL) -> ExactSplit | None:
    """The split of ``costs``' layers into ``costs.pp`` stages minimizing the
    simulated iteration time of ``schedule`` (:func:`pipesearch.timemodel.iteration_time_s`)
    under memory, by branch and bound.

    Stages are fixed left to right; a partial split is discarded when a lower
    bound on every completion (the prefix's exact terms plus the suffix
    minima of each bound family, :func:`_bound_families`) is not below the
    best time found. Complete splits that survive are evaluated exactly. The
    first incumbent is the best of ``seeds``, the even split and the
    closed-form split (:func:`optimal_split`). Among splits within ``tie_rel``
    of the best time the one with the lowest peak memory, then the least time
    on links, is returned.

    The search is deterministic: it stops after ``max_splits`` evaluations or
    ``max_nodes`` expansions (counts, not seconds), and then reports
    ``exact=False`` with the proven lower bound.

    Returns None when no split fits in memory.
    """
    from .timemodel import iteration_time_s

    L, S = costs.num_layers, costs.pp
    if S > L:
        return None
    m = costs.num_micro_batches
    evaluated: dict[tuple[int, ...], float] = {}

    def evaluate(bounds):
        bounds = tuple(int(x) for x in bounds)
        if bounds not in evaluated:
            evaluated[bounds] = iteration_time_s(schedule, pp, m, vp, costs.stage_times(bounds))
        return evaluated[bounds]

    starts = [tuple(b) for b in seeds if b is not None and costs.split_fits(b)]
    even = even_split(L, S)
    if costs.split_fits(even):
        starts.append(even)
    closed = optimal_split(costs)
    if closed is not None:
        starts.append(closed.bounds)
    if not starts:
        # nothing found by the heuristics: search with no incumbent
        best_t = np.inf
    else:
        best_t = min(evaluate(b) for b in starts)
    tables = _Tables(costs, schedule, pp, _width_for(costs, best_t * (1 + tie_rel)) if np.isfinite(best_t) else L)
    W = tables.width
    nf = len(tables.terms[0])
    nodes = 0
    frontier_lb = np.inf
    stopped = False

    def threshold():
        return best_t * (1 + tie_rel)

    # iterative DFS; a frame: (s, i, acc, bounds_so_far, children list, position)
    def children(s, i, acc):
        d = np.arange(1, W + 1)
        j = i + d
        keep = (j <= L - (S - 1 - s)) if s < S - 1 else (j == L)
        keep &= tables.fits[s][:, i]
        d, j = d[keep], j[keep]
        if len(d) == 0:
            return [], []
        lb = np.zeros(len(d))
        new_acc = []
        for f in range(nf):
            a, bs = tables.terms[s][f]
            sa, smx = tables.suf[s + 1][f]
            acc_a, acc_b = acc[f]
            ca = acc_a + a[d - 1, i]
            tot = ca + sa[j]
            cbs = []
            for c, (bc, sb) in enumerate(zip(bs, smx)):
                cb = np.maximum(acc_b[c], bc[d - 1, i])
                cbs.append(cb)
                tot = tot + np.maximum(cb, sb[j])
            lb = np.maximum(lb, tot)
            new_acc.append((ca, cbs))
        order = np.argsort(lb, kind="stable")
        kids = [(int(j[o]), float(lb[o]), [(na[o], [cb[o] for cb in nbs]) for na, nbs in new_acc])
                for o in order if np.isfinite(lb[o])]
        return kids, lb

    root_acc = [(0.0, [-np.inf] * len(tables.terms[0][f][1])) for f in range(nf)]
    kids0, _ = children(0, 0, root_acc)
    stack = [[0, (0,), kids0, 0]]
    while stack:
        frame = stack[-1]
        s, prefix, kids, pos = frame
        if pos >= len(kids):
            stack.pop()
            continue
        j, lb, acc = kids[pos]
        frame[3] = pos + 1
        if lb > threshold() or (lb >= best_t and not tie_rel):
            # children are sorted by bound: the rest of this frame is excluded too
            frame[3] = len(kids)
            continue
        if nodes >= max_nodes or len(evaluated) >= max_splits:
            # children are sorted by bound: each frame's next child has its smallest
            stopped = True
            frame[3] = pos
            frontier_lb = min(fr[2][fr[3]][1] for fr in stack if fr[3] < len(fr[2]))
            break
        nodes += 1
        bounds = prefix + (j,)
        if s == S - 1:
            t = evaluate(bounds)
            best_t = min(best_t, t)
            continue
        sub, _ = children(s + 1, j, acc)
        stack.append([s + 1, bounds, sub, 0])
    if not evaluated:
        return None
    best_t = min(evaluated.values())
    near = [b for b, t in evaluated.items() if t <= best_t * (1 + tie_rel) and costs.split_fits(b)]
    if not near:
        return None
    chosen = min(near, key=lambda b: _tie_key(costs, b, evaluated[b]))
    lower = min(best_t, frontier_lb) if stopped else best_t
    return ExactSplit(chosen, evaluated[chosen], float(lower), float(best_t), not stopped, len(evaluated), nodes)


def _tie_key(costs: PipelineCosts, bounds, t: float):
    """Tie-break among near-equal splits: lower peak memory per device, then
    less time on links, then the time itself, then the boundaries."""
    s, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    mem = float(np.max(costs.memory_bytes(s, i, j)))
    link = float(np.sum(costs.send_s(s, j)))
    return (round(mem, 3), round(link, 12), t, tuple(bounds))


def exhaustive_simulated_split(costs: PipelineCosts, schedule: str, pp: int, vp: int = 1):
    """Reference: evaluate every split that fits with the simulator
    (:func:`pipesearch.timemodel.simulate_times`); returns ``(time, bounds)``
    of the best, or None. For tests on small instances."""
    from .timemodel import simulate_times

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
