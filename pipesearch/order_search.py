"""The device order and split of one pipeline that minimise the simulated
iteration time, over every order of slots up to swaps inside a class.

A single pipeline (``dp = 1``) on a mixed cluster runs rank ``r`` on a
tensor-parallel slot ``o_r``; slots of one class (one node: one device type,
and :meth:`pipesearch.types.Cluster.link` depends only on group and node)
are interchangeable, so an order is fixed by the class of every rank. The
time is :func:`pipesearch.timemodel.iteration_time_s` of the point's
:class:`pipesearch.costs.PipelineCosts` under the best split of that order
(:func:`pipesearch.split_search.exact_split`).

Before either search, with a cutoff known, the point-level bounds of
:mod:`pipesearch.order_bounds` that hold for every order and split at
once: each rank busy with all its stages' work, within its class's memory
(:func:`pipesearch.order_bounds.rank_capacity_bound_s`; with 1F1B's
blocking sends each rank's own transfers too), and each link's chain of
transfers under overlapped sends (:func:`pipesearch.order_bounds.link_bound_s`).
When they reach the cutoff the point is ``"ABOVE_CUTOFF"`` without any
order split (and without looking for an order that fits: the point is
pruned whether or not one does); when no order's ranks can hold the
model, None.

Search by classes (one stage per rank: GPipe, 1F1B, ZB-H1, no per-stage
memory options; :func:`class_bounds_apply`). A best-first branch and bound
fixes the class of rank 0, 1, ... in turn; the bound of a prefix
(:meth:`pipesearch.order_bounds.ClassBounds.extend`: path families of the
schedule, a forward DP over the prefix's splits joined with suffix minima
over every sequence of the classes left) holds for every order that starts
with it and every split. A complete order whose bound is below the best
time so far is split exactly from that time; the search is OPTIMAL when the
least open bound reaches the best time (OPTIMAL_WITHIN_TIES when it
reaches ``1 - tie_rel`` times it, a caller's tie window; the search asks
for OPTIMAL), else, after
``max_orders`` splits or ``max_nodes`` expanded prefixes (counts), FEASIBLE
with the least open bound (every order not split is at least that). With a finite cutoff the
DP runs first with :data:`QUICK_FAMILY` alone (a fifth of the work), at
first with each stage's outgoing transfer relaxed to its least over the
next class (``relax_links``: a pass per class, not per pair of classes):
when its least bound reaches the cutoff no order can beat it. Two nodes with the same
slots, terms and links (two A100 nodes of one group) are opened in order
only: swapping them maps every order to one of the same time.

Search by vectors (the other schedules). The orders are grouped by their class-count vector ``n`` (slots used
of each class). Every order of ``n`` has the same multiset of stage speeds,
so one lower bound serves them all (:func:`rank_work_bound_s`): rank ``r``
runs the forward and backward of all ``m`` micro-batches of its stages one
after another, so ``T >= m * scale_r * w_r`` with ``w_r`` its stages'
per-micro-batch work at the profiled speed and ``scale_r`` its slowdown; the
ranks' ``w_r`` add up to at least ``W``, the model's work with each layer at
its cheapest option, hence ``max_r m scale_r w_r >= m W / sum_r (1 /
scale_r)`` (the work spread over the ranks in proportion to their speed).
Vectors are visited in increasing order of that bound; each order of a
vector gets the exact split with the best time so far as its cutoff (a
proof that it cannot beat it is usually the split search's root bound
alone), and the search stops when the next vector's bound is at least the
best time: the result is then OPTIMAL over all orders and splits. A
deterministic count of orders (``max_orders``, never seconds) may stop it
earlier; the result then says FEASIBLE with a proven lower bound: the least
of the best time, the bound of the vector being visited (every order not yet
visited has at least that bound) and the bound of any split search that hit
its own count limits.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .costs import PipelineCosts
from .order_bounds import (CLASS_BOUND_SCHEDULES, MAX_TABLE_FLOATS, class_bounds, families, rank_capacity_bound_s,
                           rank_capacity_tables, rank_covering_orders, link_bound_s, link_send_minima,
                           blocking_send_floor_s)
from .split_search import ExactSplit, exact_split
from .split_fits import any_split_fits
from .timemodel import send_overlap

#: orders whose exact split :func:`best_order` runs before it stops (a count)
MAX_ORDERS = 100
#: orders the branch and bound over classes splits before it stops (a count): its
#: orders come in bound order, so the first few hold the best ones (pp 16 of the
#: 16-device 3-type case, docs/heterogeneous.md, is proven at its 28th)
MAX_CLASS_ORDERS = 32
#: prefixes of ranks the branch and bound over classes expands before it stops (a count)
MAX_NODES = 20_000
#: the families tried alone before the others, by component names (rank k from micro-batch 0's arrival
#: through its whole work; under ZB-H1 with m > pp also the two round trips around the bottleneck rank's
#: steady state, :func:`pipesearch.order_bounds.families`)
QUICK_FAMILY = ("f1", "z6s", "z6m")
#: schedules whose ranks run every forward and backward of their stages one after another (the rank-capacity bound)
RANK_BUSY_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs")


@dataclass(frozen=True)
class OrderSearch:
    """The best order found and what is proven about it.

    Attributes:
        order: slot of each rank (members of the given classes); empty
            for an ``"ABOVE_CUTOFF"`` answer proven by bounds before an
            order that fits was met.
        split: its :class:`pipesearch.split_search.ExactSplit` (None for an
            ``"ABOVE_CUTOFF"`` order whose split search did not run).
        status: ``"OPTIMAL"`` (no order and split is faster),
            ``"OPTIMAL_WITHIN_TIES"`` (none is more than the ``tie_rel`` of
            :func:`best_order` faster: ``gap`` at most that), ``"FEASIBLE"``
            (stopped by ``max_orders`` or by a split search's count limits)
            or ``"ABOVE_CUTOFF"`` (no order beats the cutoff given).
        best_bound_s: proven lower bound of the time of every order and split.
        gap: ``(time - bound) / time``; 0 when OPTIMAL.
        orders_evaluated: orders whose exact split ran.
        orders_total: orders up to symmetry (:func:`count_orders`).
        method: ``"class-bounds"`` (the branch and bound over classes),
            ``"orders"`` (orders grouped by class-count vector) or
            ``"rank-capacity"`` (settled by
            :func:`pipesearch.order_bounds.rank_capacity_bound_s` before any
            order was split).
        prefixes_expanded: prefixes of ranks the class branch and bound expanded.
    """

    order: tuple[int, ...]
    split: ExactSplit | None
    status: str
    best_bound_s: float
    gap: float
    orders_evaluated: int
    orders_total: int
    method: str = "orders"
    prefixes_expanded: int = 0

    @property
    def iteration_time_s(self) -> float:
        return self.split.iteration_time_s if self.split is not None else math.inf


def count_vectors(class_sizes: Sequence[int], pp: int) -> list[tuple[int, ...]]:
    """Every ``n`` with ``0 <= n_c <= class_sizes[c]`` and ``sum n = pp``,
    in lexicographic order."""
    return [n for n in itertools.product(*(range(s + 1) for s in class_sizes)) if sum(n) == pp]


def orders_of_vector(classes: Sequence[Sequence[int]], counts: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Every order using ``counts[c]`` members of class ``c``, one per
    arrangement of the classes over the ranks (members of a class in
    increasing order of rank), in lexicographic order of the class sequence."""
    left, used, seq = list(counts), [0] * len(classes), []
    total = sum(counts)

    def rec():
        if len(seq) == total:
            yield tuple(seq)
            return
        for c, members in enumerate(classes):
            if left[c]:
                left[c] -= 1
                seq.append(members[used[c]])
                used[c] += 1
                yield from rec()
                used[c] -= 1
                seq.pop()
                left[c] += 1

    yield from rec()


def count_orders(counts: Sequence[int]) -> int:
    """Arrangements of a class-count vector: ``(sum n)! / prod n_c!``."""
    return math.factorial(sum(counts)) // math.prod(math.factorial(n) for n in counts)


def rank_work_bound_s(costs: PipelineCosts, pp: int) -> float:
    """``m W / sum_r (1 / scale_r)`` (module docstring), seconds: a lower
    bound of the simulated time of every split of ``costs`` and of every
    order of the same ranks. ``W`` takes each layer at its cheapest option
    (with per-stage options, the least over options and stages of the
    layer's time); stage ``s`` runs on rank ``s % pp``. 0 when a rank's
    scale is 0."""
    scale = np.asarray(costs.time_scale, dtype=float)[:pp]
    if not np.all(scale > 0):
        return 0.0
    per_layer = np.diff(costs.compute_prefix_s)
    if costs.options is not None:
        prefix = np.asarray(costs.options.compute_prefix_s, dtype=float)
        per_layer = np.diff(prefix, axis=-1).reshape(-1, costs.num_layers).min(axis=0)
    work = float(np.maximum(per_layer, 0.0).sum())
    return costs.num_micro_batches * work / float(np.sum(1.0 / scale))


def canonical(order: Sequence[int], classes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """``order`` with the slots it uses of each class reassigned in
    increasing order of rank (the representative :func:`orders_of_vector`
    yields; same costs, since members of a class are interchangeable)."""
    out = list(order)
    for members in classes:
        ranks = [r for r, x in enumerate(order) if x in set(members)]
        for r, x in zip(ranks, members):
            out[r] = x
    return tuple(out)


def total_orders(classes: Sequence[Sequence[int]], pp: int) -> int:
    """Orders of ``pp`` ranks up to swaps inside a class."""
    return sum(count_orders(n) for n in count_vectors([len(c) for c in classes], pp))


def _seed_order(orders: Iterator[tuple[int, ...]], costs_of, schedule: str, pp: int, vp: int, budget: int) -> list:
    """The first ``budget`` of ``orders`` sorted by the time of their best
    starting split (:func:`pipesearch.split_search.exact_split` with
    ``seeds_only``; orders with no fitting start last, ties in enumeration
    order), then the next one if any (it marks the budget as exhausted): the
    likely best order is split first, so its time excludes the others early."""
    orders = list(orders)
    head, tail = orders[:budget], orders[budget:]
    if len(head) < 2:
        return head + tail

    def seed_time(order) -> float:
        found = exact_split(costs_of(order), schedule, pp, vp, seeds_only=True)
        return math.inf if found is None else found.best_time_s

    times = [seed_time(o) for o in head]
    return [head[k] for k in sorted(range(len(head)), key=lambda k: (times[k], k))] + tail


def best_order(classes: Sequence[Sequence[int]], costs_of: Callable[[tuple[int, ...]], PipelineCosts],
               schedule: str, pp: int, vp: int = 1, *, max_orders: int | None = None,
               cutoff_s: float = math.inf, first: Sequence[Sequence[int]] | Callable[[], Sequence] = (),
               max_nodes: int = MAX_NODES, tie_rel: float = 0.0) -> OrderSearch | None:
    """The order of ``pp`` ranks over the slots of ``classes`` and its split
    with the least simulated time (module docstring).

    Args:
        classes: interchangeable slots, one list per class (e.g.
            :func:`pipesearch.placement.slot_classes`).
        costs_of: the point's cost terms with rank ``r`` on slot ``order[r]``
            (``pp * vp`` stages, stage ``s`` on rank ``s % pp``).
        schedule, pp, vp: as :func:`pipesearch.split_search.exact_split`.
        max_orders: orders whose exact split may run (deterministic; default
            :data:`MAX_CLASS_ORDERS` for the search by classes, else
            :data:`MAX_ORDERS`, or every order when there are at most twice
            that many: 108 orders stopped at 100 with a 40% gap).
        max_nodes: prefixes the search by classes may expand (deterministic).
        cutoff_s: only orders faster than this matter (a search's current
            best plans): every order's split search starts from it.
        first: orders to split before the enumeration (e.g. the closed-form
            optimum of :mod:`pipesearch.class_dp`), counted in
            ``max_orders``: a good first incumbent when the orders are too
            many to visit; the result is never slower than these. A
            callable is called (once) only when the point is not settled by
            the rank-capacity bound first, and in the search by classes only
            when that search stops at its counts (:func:`_by_class_bounds`).
        tie_rel: the search by classes may stop once no open prefix can be
            more than this share faster than the best order: status
            ``"OPTIMAL_WITHIN_TIES"``, bound and gap (at most ``tie_rel``)
            reported; the order returned may then be slower than the best
            (within that share). 0 (the default, what
            :func:`pipesearch.search.search` uses): only ``"OPTIMAL"`` proofs.

    Returns:
        An :class:`OrderSearch`, or None when no order has a split that fits
        (of the first ``max_orders``). When none beats ``cutoff_s`` its status is
        ``"ABOVE_CUTOFF"`` with ``best_bound_s`` the proven bound: when that
        is at least ``cutoff_s`` (the search was complete) ``order`` is an
        order met that fits, or empty when none was met (none is looked
        for: whether one fits does not matter to a point that cannot beat
        the cutoff); else (a search stopped at its counts) the first order
        that fits, ``split`` its split search's answer.
    """
    vectors = count_vectors([len(c) for c in classes], pp)
    total = sum(count_orders(n) for n in vectors)
    excluded = _capacity_exclusion(classes, costs_of, schedule, pp, vp, cutoff_s, total)
    if excluded is not None:
        return None if excluded.best_bound_s == math.inf else excluded
    if class_bounds_apply(classes, costs_of, schedule, pp, vp):
        return _by_class_bounds(classes, costs_of, schedule, pp, max_nodes=max_nodes, cutoff_s=cutoff_s,
                                first=first, total=total, tie_rel=tie_rel,
                                max_orders=MAX_CLASS_ORDERS if max_orders is None else max_orders)
    if max_orders is None:  # the default: every order when they are at most twice as many (a proof at that cost)
        max_orders = total if total <= 2 * MAX_ORDERS else MAX_ORDERS
    first = first() if callable(first) else first
    bounds = sorted((rank_work_bound_s(costs_of(next(orders_of_vector(classes, n))), pp), n) for n in vectors)
    best: tuple[float, tuple[int, ...], ExactSplit] | None = None
    fitting: tuple[tuple[int, ...], ExactSplit] | None = None  # the first order that fits
    unproven, evaluated, stopped_at = math.inf, 0, None
    tried = list(dict.fromkeys(canonical(o, classes) for o in first))[:max_orders]
    for bound, n in [(None, None)] + bounds:
        if bound is not None and bound >= (best[0] if best is not None else cutoff_s):
            break
        visit = tried if n is None else _seed_order(
            itertools.islice((o for o in orders_of_vector(classes, n) if o not in tried), max_orders - evaluated + 1),
            costs_of, schedule, pp, vp, max_orders - evaluated)
        for order in visit:
            if evaluated >= max_orders:
                stopped_at = bound
                break
            evaluated += 1
            cutoff = best[0] if best is not None else cutoff_s
            found = exact_split(costs_of(order), schedule, pp, vp, cutoff_s=cutoff)
            best, fitting, unproven = _offer(order, found, cutoff, best, fitting, unproven)
        if stopped_at is not None:
            break
    lower = min(best[0] if best is not None else cutoff_s, unproven,
                stopped_at if stopped_at is not None else math.inf)
    if best is None and math.isfinite(cutoff_s) and lower >= cutoff_s:  # proven: no order beats the cutoff
        return OrderSearch(order=() if fitting is None else fitting[0], split=None if fitting is None else fitting[1],
                           status="ABOVE_CUTOFF", best_bound_s=float(lower), gap=0.0, orders_evaluated=evaluated,
                           orders_total=total)
    if best is None:
        if fitting is None:
            return None
        return OrderSearch(order=fitting[0], split=fitting[1], status="ABOVE_CUTOFF", best_bound_s=float(lower),
                           gap=0.0, orders_evaluated=evaluated, orders_total=total)
    value, order, split = best
    optimal = lower >= value
    gap = 0.0 if optimal or value <= 0 else max(0.0, (value - lower) / value)
    return OrderSearch(order=order, split=split, status="OPTIMAL" if optimal else "FEASIBLE",
                       best_bound_s=float(lower), gap=float(gap), orders_evaluated=evaluated, orders_total=total)


def _capacity_exclusion(classes, costs_of, schedule: str, pp: int, vp: int, cutoff_s: float,
                        total: int) -> OrderSearch | None:
    """The point's answer when the rank-capacity bound
    (:func:`pipesearch.order_bounds.rank_capacity_bound_s`) settles it
    before any order is split: ``"ABOVE_CUTOFF"`` with that bound (at
    least ``cutoff_s``) and no order, or a bound of ``inf`` when no
    order's ranks can hold the model (no split fits).
    None when it does not settle it (or does not apply)."""
    if schedule not in RANK_BUSY_SCHEDULES:
        return None
    tables = rank_capacity_tables(classes, costs_of, pp, vp)
    if tables is None:
        return None
    m = costs_of(rank_covering_orders(classes, pp)[0]).num_micro_batches
    sizes = [len(c) for c in classes]
    bound = rank_capacity_bound_s(tables, sizes, m, cutoff_s)
    if bound < cutoff_s and math.isfinite(cutoff_s):  # the transfers too (C^2 orders' costs)
        sigma = link_send_minima(classes, costs_of, pp)
        if send_overlap(schedule):
            bound = max(bound, link_bound_s(sigma, sizes, pp, vp, m))
        else:
            bound = max(bound, rank_capacity_bound_s(tables, sizes, m, cutoff_s, blocking_send_floor_s(sigma, pp, m)))
    if bound < cutoff_s:
        return None
    return OrderSearch(order=(), split=None, status="ABOVE_CUTOFF",
                       best_bound_s=float(bound), gap=0.0, orders_evaluated=0, orders_total=total,
                       method="rank-capacity")


def _offer(order, found: ExactSplit | None, limit_s: float, best, fitting, unproven: float):
    """``(best, fitting, unproven)`` after ``order``'s split search ``found``
    (None: no split fits) ran with cutoff ``limit_s``: the best ``(time,
    order, split)`` below the cutoff, the first ``(order, split)`` that fits,
    the least bound of the split searches stopped at their limits."""
    if found is None:
        return best, fitting, unproven
    if not found.exact:
        unproven = min(unproven, found.lower_bound_s)
    if found.best_time_s < limit_s:
        best = (found.best_time_s, order, found)
    return best, fitting or (order, found), unproven


def class_bounds_apply(classes: Sequence[Sequence[int]], costs_of, schedule: str, pp: int, vp: int) -> bool:
    """Whether :func:`best_order` branches on classes with the bounds of
    :mod:`pipesearch.order_bounds`: one stage per rank, GPipe / 1F1B /
    ZB-H1, no per-stage memory options, tables within
    :data:`pipesearch.order_bounds.MAX_TABLE_FLOATS`."""
    if vp != 1 or schedule not in CLASS_BOUND_SCHEDULES or pp < 2:
        return False
    costs = costs_of(tuple(x for members in classes for x in members)[:pp])
    if costs.options is not None or costs.pp != pp:
        return False
    rows = 2 * len(families(schedule, pp, costs.num_micro_batches)) + 2
    return len(classes) * pp * rows * (costs.num_layers + 1) ** 2 <= MAX_TABLE_FLOATS


def _by_class_bounds(classes, costs_of, schedule: str, pp: int, *, max_orders: int, max_nodes: int,
                     cutoff_s: float, first, total: int, tie_rel: float = 0.0) -> OrderSearch | None:
    """Best-first branch and bound over the class of each rank, left to
    right: a prefix's bound (:meth:`pipesearch.order_bounds.ClassBounds.extend`)
    holds for every order that starts with it and every split; a complete
    order whose bound is below the best time is split by
    :func:`pipesearch.split_search.exact_split` from that time. The ``first``
    orders are split before (their best time is the first cutoff); a
    callable ``first`` (the closed-form optimum, dear to find) only when the
    search stops at its counts, after it (a search that proves its order
    optimal needs no incumbent: on the 16-device, 3-type plan of
    benchmarks/README.md the same plans, without the class DP's 0.6 CPU s). Stops
    OPTIMAL when the least open bound reaches the best time (OPTIMAL_WITHIN_TIES
    when it reaches ``(1 - tie_rel)`` times it: no order is more than
    ``tie_rel`` faster); after ``max_orders`` splits or ``max_nodes``
    expanded prefixes FEASIBLE with the least open bound."""
    best: tuple[float, tuple[int, ...], ExactSplit] | None = None
    fitting = None
    unproven, evaluated, stopped_at = math.inf, 0, None
    done: set[tuple[int, ...]] = set()

    def split(order):
        nonlocal best, fitting, unproven, evaluated
        evaluated += 1
        done.add(order)
        limit = best[0] if best is not None else cutoff_s
        found = exact_split(costs_of(order), schedule, pp, 1, cutoff_s=limit)
        best, fitting, unproven = _offer(order, found, limit, best, fitting, unproven)

    memo: dict = {}
    costs_memo = lambda order: memo[order] if order in memo else memo.setdefault(order, costs_of(order))  # noqa: E731

    def quick_excludes(limit: float) -> bool:  # one family: most points of a search end here, above their cutoff
        for relax in (True, False):  # the links relaxed first: about 60% of the work, nearly the same bound
            quick = class_bounds(classes, costs_memo, schedule, pp, cutoff_s=limit * (1 + 1e-9), only=QUICK_FAMILY,
                                 relax_links=relax)
            root = quick.root()
            if min((quick.extend(root, c).bound_s for c in range(len(classes)) if quick.allowed(root, c)),
                   default=math.inf) >= limit:
                return True
        return False

    if math.isfinite(cutoff_s) and quick_excludes(cutoff_s):  # no order beats the cutoff: none is split
        return OrderSearch(order=(), split=None, status="ABOVE_CUTOFF", best_bound_s=float(cutoff_s), gap=0.0,
                           orders_evaluated=0, orders_total=total, method="class-bounds")
    for order in list(dict.fromkeys(canonical(o, classes) for o in (() if callable(first) else first)))[:max_orders]:
        split(order)
    limit = best[0] if best is not None else cutoff_s
    heap = []
    quick = best is not None and quick_excludes(limit)  # the first orders' best may already be optimal
    if not quick:
        cb = class_bounds(classes, costs_memo, schedule, pp, cutoff_s=limit * (1 + 1e-9))
        heap = [(0.0, (), cb.root())]
    expanded = 0
    closed = math.inf  # the least bound of a prefix left unexpanded (tie_rel > 0: may be below the best time)
    while heap:
        bound, key, node = heapq.heappop(heap)
        limit = best[0] * (1 - tie_rel) if best is not None else cutoff_s
        if bound >= limit:
            closed = min(closed, bound)  # the least open bound
            break
        if len(key) == pp:
            order = _slots_of(key, classes)
            if order in done:
                continue
            if evaluated >= max_orders:
                stopped_at = bound
                break
            split(order)
            continue
        if expanded >= max_nodes:
            stopped_at = bound
            break
        expanded += 1
        for c in range(len(classes)):
            if cb.allowed(node, c):
                child = cb.extend(node, c)
                if child.bound_s < limit:
                    heapq.heappush(heap, (child.bound_s, child.classes, child))
                else:
                    closed = min(closed, child.bound_s)
    if stopped_at is not None and callable(first):  # stopped at its counts: never slower than these orders either
        for order in dict.fromkeys(canonical(o, classes) for o in first()):
            if order not in done:
                split(order)
    lower = min(best[0] if best is not None else cutoff_s, unproven, closed,
                stopped_at if stopped_at is not None else math.inf)
    if best is None:
        proven = math.isfinite(cutoff_s) and lower >= cutoff_s
        if fitting is None and not proven:  # an order that fits, for the caller's split search
            fitting = _first_fitting(classes, costs_of, pp, max_orders)
        if fitting is None and not proven:
            return None
        order, found = fitting if fitting is not None else ((), None)
        return OrderSearch(order=order, split=found, status="ABOVE_CUTOFF", best_bound_s=float(lower),
                           gap=0.0, orders_evaluated=evaluated, orders_total=total, method="class-bounds",
                           prefixes_expanded=expanded)
    value, order, found = best
    optimal = lower >= value
    gap = 0.0 if optimal or value <= 0 else max(0.0, (value - lower) / value)
    status = "OPTIMAL" if optimal else "OPTIMAL_WITHIN_TIES" if (
        stopped_at is None and lower >= value * (1 - tie_rel)) else "FEASIBLE"
    return OrderSearch(order=order, split=found, status=status,
                       best_bound_s=float(lower), gap=float(gap), orders_evaluated=evaluated, orders_total=total,
                       method="class-bounds", prefixes_expanded=expanded)


def _slots_of(seq: Sequence[int], classes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The order of a class sequence: each class's slots in increasing rank order."""
    used = [0] * len(classes)
    out = []
    for c in seq:
        out.append(classes[c][used[c]])
        used[c] += 1
    return tuple(out)


def _first_fitting(classes, costs_of, pp: int, max_orders: int):
    """The first order (in :func:`orders_of_vector`'s order over the
    vectors) with a split that fits, of the first ``max_orders``; None when none."""
    every = itertools.chain.from_iterable(orders_of_vector(classes, n)
                                          for n in count_vectors([len(c) for c in classes], pp))
    return next(((o, None) for o in itertools.islice(every, max_orders) if any_split_fits(costs_of(o))), None)
