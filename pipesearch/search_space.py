"""The plan space: (variant, pp, dp) groups, their points, and the points table."""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Callable, Iterable

import numpy as np

from .costs import profile_precision
from .placement import (count_layouts, group_ids, layout, layout_names, node_ids, num_slots, placement_candidates,
                        replicated_stage_devices)
from .replication import (MAX_REPLICATED_PP, is_uniform_point, parse_replicas_slots, placement_time_scale,
                          replica_vectors, replicated_lower_bound_s, replicated_placements)
from .runtimes import point_refusal
from .search_options import MULTI_STAGE_SCHEDULES, ModelVariant, SearchOptions, vp_choices
from .types import Cluster, DeviceSpec, Job, MAX_MICRO_BATCHES


def points_frame(point_columns: dict):
    """A points table (:attr:`SearchResult.point_columns`) as a pandas
    DataFrame, one row per point, columns in :data:`POINT_COLUMNS` order."""
    import pandas as pd

    return pd.DataFrame(point_columns, columns=list(POINT_COLUMNS))


#: the columns of the points table, in order
POINT_COLUMNS = ("tp", "recompute", "pp", "dp", "schedule", "vp", "micro_batch_size", "num_micro_batches",
                 "placement", "status", "iteration_time_s", "samples_per_s", "peak_memory_bytes",
                 "bubble_fraction", "lower_bound_s")


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_groups(variants: Iterable[ModelVariant], cluster: Cluster, job: Job, options: SearchOptions):
    """Yield ``(variant, pp, dp, status, count)`` over the (layer table,
    pipeline degree, data-parallel degree) groups of the space: ``status``
    None for one group to expand with :func:`expand_group` (``count`` 1), else
    ``count`` groups refused for that reason: ``too_many_stages``, or
    ``batch_not_divisible`` for the ``dp`` values of a ``pp`` that do not
    divide the global batch (counted, never enumerated: only divisors of the
    batch are visited; ``dp`` is then None)."""
    batch_divisors = divisors(job.global_batch_size)
    for variant in variants:
        L = variant.profile.num_layers
        slots = num_slots(cluster, variant.tp)
        pps = [options.pp] if options.pp else range(1, min(slots, L) + 1)
        for pp in pps:
            if not options.pp and not any(vp_choices(s, pp, options) for s in options.schedules):
                continue  # a pinned vp above 1: not pp 1 (vp_choices)
            if pp > L:
                yield variant, pp, None, "too_many_stages", 1
                continue
            if options.dp:
                if pp * options.dp <= slots:
                    refused = job.global_batch_size % options.dp != 0
                    yield variant, pp, options.dp, ("batch_not_divisible" if refused else None), 1
                continue
            dps = batch_divisors[:bisect.bisect_right(batch_divisors, slots // pp)]
            few = bisect.bisect_left(dps, options.min_dp)  # a sharded state needs replicas (SearchOptions.min_dp)
            if few:
                yield variant, pp, None, "one_replica", few
            yield from ((variant, pp, dp, None, 1) for dp in dps[few:])
            if slots // pp > len(dps):
                yield variant, pp, None, "batch_not_divisible", slots // pp - len(dps)


def micro_batch_sizes(per_replica: int, options: SearchOptions) -> list[int]:
    """Micro-batch sizes to try for a replica batch (empty when a pin does not divide it)."""
    if options.num_micro_batches:
        return [per_replica // options.num_micro_batches] if per_replica % options.num_micro_batches == 0 else []
    if options.micro_batch_size:
        return [options.micro_batch_size] if per_replica % options.micro_batch_size == 0 else []
    return divisors(per_replica)


def placement_names(cluster: Cluster, pp: int, dp: int, options: SearchOptions, tp: int = 1,
                    precision: str = "fp16") -> tuple[str, ...]:
    """Placements to try for a (pp, dp) group. Homogeneous clusters:
    ``options.placements`` (``pipeline``, ``data``; one when pp or dp is 1).
    Mixed clusters: every layout up to swaps inside a node
    (:func:`pipesearch.placement.layout_names`) when there are at most
    ``options.enumerate_layouts_up_to``, which makes the search exact over
    placements; else the candidates of
    :func:`pipesearch.placement.placement_candidates` (patterns over the
    slots, fastest type first) and, for a single pipeline (dp = 1),
    ``mapped``: the device order chosen by :func:`pipesearch.ilp.map_pipeline`
    (not with ``--placement``: its patterns only).
    ``precision``: the profile's (:func:`pipesearch.costs.profile_precision`),
    which orders the slots the names refer to (:func:`pipesearch.placement.layout`
    reads them in the same order)."""
    if cluster.is_uniform:
        return options.placements if (pp > 1 and dp > 1) else options.placements[:1]
    mapped = ("mapped",) if dp == 1 and pp > 1 else ()
    if options.placement_pinned:  # --placement: its patterns only, fastest and largest devices first
        return tuple(name for name, _ in placement_candidates(cluster, pp, dp, tp, precision, options.placements))
    if count_layouts(cluster, pp * dp, tp) <= options.enumerate_layouts_up_to:
        return tuple(layout_names(cluster, pp, dp, tp, precision))
    names = tuple(name for name, _ in placement_candidates(cluster, pp, dp, tp, precision))
    return names + mapped


def expand_group(variant: ModelVariant, pp: int, dp: int, job: Job, options: SearchOptions,
                 cluster: Cluster | None = None):
    """Yield ``(mbs, m, schedule, vp, placement, status)`` for every point of a
    (variant, pp, dp) group (placements from :func:`placement_names`, or
    ``options.placements`` when no cluster is given); ``status`` is None for points to evaluate, else
    the reason the point is refused (``batch_not_divisible``,
    ``schedule_refused``, ``too_many_stages``)."""
    L = variant.profile.num_layers
    per_replica = job.global_batch_size // dp
    mbss = micro_batch_sizes(per_replica, options)
    if not mbss:
        yield options.micro_batch_size, options.num_micro_batches, None, None, None, "batch_not_divisible"
        return
    placements = _placements(cluster, pp, dp, options, variant)
    for mbs in mbss:
        m = per_replica // mbs
        for schedule in group_schedules(pp, options):
            for vp in vp_choices(schedule, pp, options):
                refused = schedule_refusal(schedule, pp, m, vp, L, options.runtime)
                for placement in (_schedule_placements(placements, schedule) if refused is None else (None,)):
                    yield mbs, m, schedule, vp, placement, refused


def _schedule_placements(placements: tuple[str, ...], schedule: str) -> tuple[str, ...]:
    """The placements of a group that ``schedule`` is searched with:
    RoundPipe's GPUs take the stages in turn (a pool, :mod:`pipesearch.roundpipe`),
    so no device order is searched for it (``mapped``): the named layouts only."""
    return tuple(p for p in placements if p != "mapped") if schedule == "roundpipe" else placements


def one_rank_schedule(schedules) -> str:
    """The schedule ``pp = 1`` is searched with among ``schedules``: with
    one stage every schedule is plain gradient accumulation, 1F1B's order,
    so 1F1B, else the first that runs one stage per rank (interleaving
    refuses pp 1), else the first."""
    if "1f1b" in schedules:
        return "1f1b"
    return next((s for s in schedules if s not in MULTI_STAGE_SCHEDULES), schedules[0])


def group_schedules(pp: int, options: SearchOptions) -> tuple[str, ...]:
    """The schedules a group of ``pp`` ranks is searched with: all of
    them, but one for ``pp = 1`` (:func:`one_rank_schedule`)."""
    if pp == 1:
        return (one_rank_schedule(options.schedules),) if options.schedules else ()
    return tuple(options.schedules)


def accepted_points(schedule: str, pp: int, per_replica: int, num_layers: int, options: SearchOptions) -> int:
    """How many (micro-batch size, vp) choices of a replica batch of
    ``per_replica`` samples run ``schedule`` on ``pp`` ranks
    (:func:`schedule_refusal` accepts them)."""
    return sum(1 for mbs in micro_batch_sizes(per_replica, options) for vp in vp_choices(schedule, pp, options)
               if schedule_refusal(schedule, pp, per_replica // mbs, vp, num_layers, options.runtime) is None)


def count_points(variant: ModelVariant, pp: int, dp: int, job: Job, options: SearchOptions,
                 cluster: Cluster | None = None, cache: dict | None = None) -> int:
    """How many points of a group :func:`expand_group` yields with status
    None (the points a pruned group stands for), without building them:
    per schedule, its placements (:func:`_schedule_placements`) times the
    (micro-batch size, vp) choices that :func:`schedule_refusal` accepts.
    ``cache`` (a dict) keeps the choices per (layers, pp, replica batch)
    across groups."""
    L, per_replica = variant.profile.num_layers, job.global_batch_size // dp
    key = (L, pp, per_replica)
    per = None if cache is None else cache.get(key)
    if per is None:
        per = {schedule: accepted_points(schedule, pp, per_replica, L, options)
               for schedule in group_schedules(pp, options)}
        if cache is not None:
            cache[key] = per
    placements = _placements(cluster, pp, dp, options, variant)
    return sum(n * len(_schedule_placements(placements, schedule)) for schedule, n in per.items())


def _placements(cluster: Cluster | None, pp: int, dp: int, options: SearchOptions, variant) -> tuple[str, ...]:
    return (placement_names(cluster, pp, dp, options, variant.tp, profile_precision(variant.profile))
            if cluster is not None else options.placements if (pp > 1 and dp > 1) else options.placements[:1])


def schedule_refusal(schedule: str, pp: int, m: int, vp: int, num_layers: int,
                     runtime: str | None = None) -> str | None:
    """Why a runtime would refuse this schedule at this point, or None.

    1F1B-style schedules need at least as many micro-batches as stages
    (torch.distributed.pipelining's Schedule1F1B refuses fewer); Megatron-LM's
    interleaved schedule needs ``m`` to be a multiple of ``pp`` and at least
    two virtual stages per device; every virtual stage needs at least one
    layer; more than :data:`pipesearch.types.MAX_MICRO_BATCHES` micro-batches
    are refused; with ``runtime`` (``--runtime``), also what it refuses of
    every plan of the point (:func:`pipesearch.runtimes.point_refusal`).
    """
    if m > MAX_MICRO_BATCHES:
        return "too_many_micro_batches"
    if schedule == "interleaved-1f1b" and vp < 2:
        return "schedule_refused"
    if schedule in ("1f1b", "zb-h1", "interleaved-1f1b") and m < pp:
        return "schedule_refused"
    if schedule == "interleaved-1f1b" and m % pp:
        return "schedule_refused"
    if pp * vp > num_layers:
        return "too_many_stages"
    if point_refusal(runtime, schedule, pp, vp, m) is not None:
        return "schedule_refused"
    return None


def group_stages(pp: int, options: SearchOptions) -> int:
    """The most stages a point of a ``pp`` group may have: ``pp`` times the
    largest vp when a multi-stage schedule is searched (and pp > 1), else
    ``pp``; the fewer stages, the larger the busiest one must be."""
    if pp > 1 and any(sch in MULTI_STAGE_SCHEDULES for sch in options.schedules):
        return pp * max(options.vps)
    return pp


def in_bound_order(groups: list, strengthen: Callable, skip: Callable[[float], bool] | None = None):
    """Yield ``(bound, group)`` for every group of ``groups`` (sorted by a
    first, weaker bound ``group[0]``) in order of its strengthened bound
    ``strengthen(group) >= group[0]``, computed only for a group about to be
    yielded: a lazy priority queue (heapq) whose entries carry either bound,
    so every strengthened bound yielded is at most every other group's.
    ``skip(first_bound)`` True yields the group with its first bound without
    strengthening it (a caller about to prune it anyway)."""
    heap = [(g[0], 0, g[1], g) for g in groups]
    heapq.heapify(heap)
    while heap:
        bound, strong, order, group = heapq.heappop(heap)
        if strong or (skip is not None and skip(bound)):
            yield bound, group
            continue
        heapq.heappush(heap, (max(bound, strengthen(group)), 1, order, group))


def point_columns_of(rows: list[dict]) -> dict:
    """The points table of :attr:`SearchResult.point_columns` from the search's rows."""
    return {c: [r[c] for r in rows] for c in POINT_COLUMNS}


def replicated_candidates(variants, cluster: Cluster, job: Job, options: SearchOptions, work: dict,
                          fastest: float, profiled_device: DeviceSpec | None = None
                          ) -> list[tuple[float, int, ModelVariant, dict]]:
    """The points of per-stage replication (:mod:`pipesearch.replication`)
    as ``(lower bound, order, variant, row)``, sorted by bound: every
    variant (each replica one slot of its tp), ``2 <= pp <=
    MAX_REPLICATED_PP`` (or the pinned pp), every replica vector on the
    cluster's slots (:func:`pipesearch.replication.replica_vectors`) on
    each of its placements
    (:func:`pipesearch.replication.replicated_placements`, up to
    ``options.enumerate_layouts_up_to``) but those the uniform search visits
    as a data-parallel point (:func:`_visited_as_uniform`),
    every micro-batch size dividing the global batch (no further data
    parallelism: ``m = batch / b``), the schedules with one stage per
    device; ``options.split_replicas`` alone when given. ``work`` maps
    ``id(variant)`` to its fwd+bwd seconds per sample; the bound takes each
    stage's devices on its placement (``profiled_device`` scales them)."""
    out, covered = [], {}
    schedules = tuple(s for s in options.schedules if s not in MULTI_STAGE_SCHEDULES and vp_choices(s, 2, options))
    for variant in variants:
        L, devices, scales = variant.profile.num_layers, num_slots(cluster, variant.tp), {}
        if options.split_replicas:
            vectors = [tuple(options.split_replicas)] if sum(options.split_replicas) <= devices else []
        else:
            pps = [options.pp] if options.pp else range(2, min(MAX_REPLICATED_PP, L, devices) + 1)
            vectors = [v for pp in pps if 2 <= pp <= L for v in replica_vectors(devices, pp)]
        for reps in vectors:
            names = replicated_placements(cluster, reps, variant.tp, options.enumerate_layouts_up_to,
                                          profile_precision(variant.profile))
            for mbs in micro_batch_sizes(job.global_batch_size, options):
                m = job.global_batch_size // mbs
                for name in names:
                    if (not options.split_replicas and is_uniform_point(reps, mbs)
                            and _visited_as_uniform(cluster, variant, reps, name, options, covered)):
                        continue
                    if name not in scales:
                        scales[name] = (fastest if cluster.is_homogeneous else placement_time_scale(
                            cluster, name, variant.tp, profiled_device, profile_precision(variant.profile)))
                    for schedule in schedules:
                        if schedule_refusal(schedule, len(reps), m, 1, L, options.runtime) is None:
                            out.append((replicated_lower_bound_s(work[id(variant)], reps, mbs, m, schedule,
                                                                 scales[name]),
                                        len(out), variant,
                                        point_row(variant, len(reps), 1, mbs, m, schedule, 1, name, None)))
    out.sort(key=lambda x: (x[0], x[1]))
    return out


def _visited_as_uniform(cluster: Cluster, variant: ModelVariant, reps, name: str, options: SearchOptions,
                        cache: dict) -> bool:
    """Whether the uniform search visits this placement of a uniform
    replica vector ``(r, .., r)`` as the data-parallel point ``dp = r``
    (replica ``i`` of a stage sends to replica ``i`` of the next either
    way): one of its ``(pp, r)`` layouts (:func:`placement_names`) puts
    every replica on a slot of the same node, position by position (each
    stage's slots in canonical order), up to a renaming of the nodes of one
    group (same type and links), or ``mapped`` chooses the order of a
    single pipeline (``r = 1``). ``cache`` keeps the layouts' patterns."""
    pp, r, precision = len(reps), reps[0], profile_precision(variant.profile)
    key = (variant.tp, pp, r)
    if key not in cache:
        names = placement_names(cluster, pp, r, options, variant.tp, precision)
        cache[key] = ("mapped" in names and r == 1, {
            _node_pattern(cluster, layout(cluster, pp, r, variant.tp, n, precision)) for n in names if n != "mapped"})
    every, patterns = cache[key]
    if every:
        return True
    devs = replicated_stage_devices(cluster, reps, precision, variant.tp, parse_replicas_slots(name))
    return _node_pattern(cluster, np.array(devs)) in patterns


def _node_pattern(cluster: Cluster, heads: np.ndarray) -> tuple:
    """The nodes of a ``(P, d)`` layout position by position, each group's
    nodes renamed in order of first appearance (a canonical form under
    permutations of the nodes of one group)."""
    node, group = node_ids(cluster)[heads].ravel().tolist(), group_ids(cluster)[heads].ravel().tolist()
    names: dict = {}
    seq = tuple((g, names.setdefault((g, n), sum(1 for k in names if k[0] == g))) for n, g in zip(node, group))
    return heads.shape, seq


def point_row(variant, pp: int, dp: int, mbs: int, m: int, schedule: str, vp: int, placement, status) -> dict:
    """One row of the points table, before evaluation (times unknown)."""
    return dict(tp=variant.tp, recompute=variant.recompute, pp=pp, dp=dp, schedule=schedule, vp=vp,
                micro_batch_size=mbs, num_micro_batches=m, placement=placement, status=status,
                iteration_time_s=np.nan, samples_per_s=np.nan, peak_memory_bytes=np.nan,
                bubble_fraction=np.nan, lower_bound_s=np.nan)


#: a point's status when its split search stopped at its work limits before
#: it met a split that fits every GPU (Mobius' whole-GPU check): neither a
#: plan nor proven out of memory; counted with the unproven points
STOPPED = "stopped_at_work_limits"
