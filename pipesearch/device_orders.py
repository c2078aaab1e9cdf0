"""Device classes and orders of one pipeline's stages (pure Python).

A device order puts stage ``k`` on device ``order[k]``. Devices that are
interchangeable (same type and capacity, same links to every other device;
on a cluster, the devices of one node) are grouped into classes
(:func:`device_classes`), and orders are enumerated up to swaps inside a
class (:func:`device_orders`, counted without enumeration by
:func:`count_orders`): exact for any objective of
:class:`pipesearch.mapping.MappingProblem`, which sees a device only through
its type, capacity and links.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from .types import Cluster

if TYPE_CHECKING:  # the problem is only read through its attributes
    from .mapping import MappingProblem


def device_classes(problem: MappingProblem, devices: Sequence[int] | None = None) -> list[list[int]]:
    """Groups of interchangeable candidates, each sorted.

    ``a`` and ``b`` are interchangeable when swapping them maps the problem to
    itself: same type and capacity, the same links to and from every other
    device, and a symmetric link between them. Swaps compose, so the classes
    are exact symmetry classes of the problem.
    """
    devs = list(range(problem.num_devices)) if devices is None else list(devices)
    bw, lat = problem.link_bandwidth_bytes_per_s, problem.link_latency_s

    def same(a: int, b: int) -> bool:
        if problem.device_type[a] != problem.device_type[b] or problem.capacity_bytes[a] != problem.capacity_bytes[b]:
            return False
        if bw[a, b] != bw[b, a] or lat[a, b] != lat[b, a]:
            return False
        others = [c for c in range(problem.num_devices) if c not in (a, b)]
        return (np.array_equal(bw[a, others], bw[b, others]) and np.array_equal(bw[others, a], bw[others, b])
                and np.array_equal(lat[a, others], lat[b, others])
                and np.array_equal(lat[others, a], lat[others, b]))

    classes: list[list[int]] = []
    for d in devs:
        for cls in classes:
            if same(cls[0], d):
                cls.append(d)
                break
        else:
            classes.append([d])
    return [sorted(c) for c in classes]


def _cluster_classes(cluster: Cluster, devices: Sequence[int]) -> list[list[int]]:
    """Devices of a cluster grouped by (group, node): interchangeable, since
    :meth:`Cluster.link` depends only on group and node equality."""
    classes: dict[tuple[int, int], list[int]] = {}
    for d in devices:
        classes.setdefault((cluster.group_of(d), cluster.node_of(d)), []).append(int(d))
    return [sorted(v) for v in classes.values()]


def device_orders(
    source: Cluster | MappingProblem,
    pp: int,
    devices: Sequence[int] | None = None,
    *,
    reduce_symmetry: bool = True,
) -> Iterator[tuple[int, ...]]:
    """All ordered choices of ``pp`` distinct devices.

    Args:
        source: a :class:`Cluster` (orders of cluster ids) or a
            :class:`MappingProblem` (orders of candidate indices).
        devices: the devices to choose from (default: all).
        reduce_symmetry: yield one order per class of equivalent orders: within
            a class of interchangeable devices (:func:`device_classes`; for a
            cluster, the devices of one node) devices are used in increasing
            order. Exact for any objective of :mod:`pipesearch.mapping`.

    Yields:
        tuples of ``pp`` device ids.
    """
    if isinstance(source, Cluster):
        devs = list(range(source.num_devices)) if devices is None else [int(d) for d in devices]
        classes = _cluster_classes(source, devs) if reduce_symmetry else [[d] for d in devs]
    else:
        devs = list(range(source.num_devices)) if devices is None else [int(d) for d in devices]
        classes = device_classes(source, devs) if reduce_symmetry else [[d] for d in devs]
    if pp > len(devs):
        return
    used = [0] * len(classes)
    seq: list[int] = []

    def rec():
        if len(seq) == pp:
            yield tuple(seq)
            return
        for c, members in enumerate(classes):
            if used[c] < len(members):
                seq.append(members[used[c]])
                used[c] += 1
                yield from rec()
                used[c] -= 1
                seq.pop()

    yield from rec()


def count_orders(source: Cluster | MappingProblem, pp: int, devices: Sequence[int] | None = None) -> int:
    """Number of orders :func:`device_orders` yields with symmetry reduction
    (a multinomial sum over class counts; no enumeration)."""
    if isinstance(source, Cluster):
        devs = list(range(source.num_devices)) if devices is None else list(devices)
        sizes = [len(c) for c in _cluster_classes(source, devs)]
    else:
        sizes = [len(c) for c in device_classes(source, devices)]
    # number of sequences of length pp using class c at most sizes[c] times:
    # pp! * [x^pp] prod_c sum_{i<=s_c} x^i / i!
    poly = [1.0]
    for s in sizes:
        term = [1.0 / math.factorial(i) for i in range(s + 1)]
        new = [0.0] * min(len(poly) + s, pp + 1)
        for a, pa in enumerate(poly):
            for b, tb in enumerate(term):
                if a + b <= pp:
                    new[a + b] += pa * tb
        poly = new
    return int(round(poly[pp] * math.factorial(pp))) if pp < len(poly) else 0


def canonical_order(problem: MappingProblem, order: Sequence[int]) -> tuple[int, ...]:
    """The representative of ``order`` under device symmetry: within each class
    of :func:`device_classes`, the used devices are reassigned in increasing
    order of stage. Same objective and feasibility as ``order``."""
    out = list(order)
    for cls in device_classes(problem):
        members = set(cls)
        stages = [k for k, d in enumerate(order) if d in members]
        for k, d in zip(stages, cls):
            out[k] = d
    return tuple(out)


def node_crossings(problem_or_cluster, order: Sequence[int]) -> int:
    """How many consecutive stages sit on different nodes (``order`` holds
    cluster ids for a cluster, candidate indices for a problem)."""
    if isinstance(problem_or_cluster, Cluster):
        node = problem_or_cluster.node_of
    else:
        node = problem_or_cluster.node_of.__getitem__
    return sum(1 for a, b in zip(order, order[1:]) if node(a) != node(b))


def topology_order(cluster: Cluster, devices: Sequence[int] | None = None) -> tuple[int, ...]:
    """Devices sorted so that each node's devices are consecutive (by group,
    node, id). On a homogeneous cluster a pipeline over this order crosses
    the inter-node link ``(#nodes it spans) - 1`` times, the fewest possible."""
    devs = list(range(cluster.num_devices)) if devices is None else [int(d) for d in devices]
    return tuple(sorted(devs, key=lambda d: (cluster.group_of(d), cluster.node_of(d), d)))
