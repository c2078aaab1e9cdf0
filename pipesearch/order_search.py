"""The device order and split of one pipeline that minimise the simulated
iteration time, over every order of slots up to swaps inside a class.

A single pipeline (``dp = 1``) on a mixed cluster runs rank ``r`` on a
tensor-parallel slot ``o_r``; slots of one class (one node: one device type,
and :meth:`pipesearch.types.Cluster.link` depends only on group and node)
are interchangeable, so an order is fixed by the class of every rank. The
time is :func:`pipesearch.timemodel.iteration_time_s` of the point's
:class:`pipesearch.costs.PipelineCosts` under the best split of that order
(:func:`pipesearch.split_search.exact_split`).

Search. The orders are grouped by their class-count vector ``n`` (slots used
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

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .costs import PipelineCosts
from .split_search import ExactSplit, any_split_fits, exact_split

#: orders whose exact split :func:`best_order` runs before it stops (a count)
MAX_ORDERS = 100


@dataclass(frozen=True)
class OrderSearch:
    """The best order found and what is proven about it.

    Attributes:
        order: slot of each rank (members of the given classes).
        split: its :class:`pipesearch.split_search.ExactSplit` (None for an
            ``"ABOVE_CUTOFF"`` order whose split search did not run).
        status: ``"OPTIMAL"`` (no order and split is faster), ``"FEASIBLE"``
            (stopped by ``max_orders`` or by a split search's count limits)
            or ``"ABOVE_CUTOFF"`` (no order beats the cutoff given).
        best_bound_s: proven lower bound of the time of every order and split.
        gap: ``(time - bound) / time``; 0 when OPTIMAL.
        orders_evaluated: orders whose exact split ran.
        orders_total: orders up to symmetry (:func:`count_orders`).
    """

    order: tuple[int, ...]
    split: ExactSplit | None
    status: str
    best_bound_s: float
    gap: float
    orders_evaluated: int
    orders_total: int

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
               schedule: str, pp: int, vp: int = 1, *, max_orders: int = MAX_ORDERS,
               cutoff_s: float = math.inf, first: Sequence[Sequence[int]] = ()) -> OrderSearch | None:
    """The order of ``pp`` ranks over the slots of ``classes`` and its split
    with the least simulated time (module docstring).

    Args:
        classes: interchangeable slots, one list per class (e.g.
            :func:`pipesearch.placement.slot_classes`).
        costs_of: the point's cost terms with rank ``r`` on slot ``order[r]``
            (``pp * vp`` stages, stage ``s`` on rank ``s % pp``).
        schedule, pp, vp: as :func:`pipesearch.split_search.exact_split`.
        max_orders: orders whose exact split may run (deterministic).
        cutoff_s: only orders faster than this matter (a search's current
            best plans): every order's split search starts from it.
        first: orders to split before the enumeration (e.g. the closed-form
            optimum of :mod:`pipesearch.class_dp`), counted in
            ``max_orders``: a good first incumbent when the orders are too
            many to visit; the result is never slower than these.

    Returns:
        An :class:`OrderSearch`, or None when no order has a split that fits
        (of the first ``max_orders``). When none beats ``cutoff_s`` its status is
        ``"ABOVE_CUTOFF"``: ``order`` is the first that fits, ``split`` its
        split search's answer, ``best_bound_s`` the proven bound (at least
        ``cutoff_s`` when the search was complete).
    """
    vectors = count_vectors([len(c) for c in classes], pp)
    total = sum(count_orders(n) for n in vectors)
    bounds = sorted((rank_work_bound_s(costs_of(next(orders_of_vector(classes, n))), pp), n) for n in vectors)
    best: tuple[float, tuple[int, ...], ExactSplit] | None = None
    fitting: tuple[tuple[int, ...], ExactSplit] | None = None  # the first order that fits
    unproven, evaluated, stopped_at, cut_short = math.inf, 0, None, False
    tried = list(dict.fromkeys(canonical(o, classes) for o in first))[:max_orders]
    for bound, n in [(None, None)] + bounds:
        if bound is not None and bound >= (best[0] if best is not None else cutoff_s):
            cut_short = True
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
            if found is None:
                continue
            fitting = fitting or (order, found)
            if not found.exact:
                unproven = min(unproven, found.lower_bound_s)
            if found.best_time_s < cutoff:
                best = (found.best_time_s, order, found)
        if stopped_at is not None:
            break
    lower = min(best[0] if best is not None else cutoff_s, unproven,
                stopped_at if stopped_at is not None else math.inf)
    if best is None and fitting is None and cut_short:  # the cutoff stopped it: an order that fits
        every = itertools.chain.from_iterable(orders_of_vector(classes, n) for _, n in bounds)
        fitting = next(((o, None) for o in itertools.islice(every, max_orders) if any_split_fits(costs_of(o))), None)
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
