"""One point's devices, links and cost terms, and the mapped device order."""

from __future__ import annotations

import math

import numpy as np

from .costs import build_pipeline_costs, profile_precision
from .errors import InfeasibleError
from .host import cross_mapping
from .in_flight import schedule_chunk_states, schedule_in_flight
from .placement import SLOTS_PREFIX, check_layout, layout, placement_links, slot_classes, slot_heads
from .replication import parse_replicas_name, parse_replicas_slots, replicated_costs
from .search_options import ANALYTIC_SCHEDULES, ModelVariant
from .types import Cluster


def placement_array(cluster: Cluster, variant: ModelVariant, row: dict, ctx: dict) -> np.ndarray:
    """``(pp, dp)`` heads (first device of each tensor-parallel group,
    :mod:`pipesearch.placement`) of a point's placement; ``ctx`` caches
    across points. Named patterns run over the cluster's canonical slots
    (:func:`pipesearch.placement.layout`); ``mapped`` is the order chosen by
    :func:`_mapped_order` (None when no order fits in memory)."""
    pp, dp, name = row["pp"], row["dp"], row["placement"]
    if name == "mapped":
        return _mapped_order(cluster, variant, row, ctx)
    return layout(cluster, pp, dp, variant.tp, name, profile_precision(variant.profile))


def _mapped_order(cluster: Cluster, variant: ModelVariant, row: dict, ctx: dict) -> np.ndarray | None:
    """Device order of one pipeline on a mixed cluster over its tensor-parallel
    slots: :func:`pipesearch.order_search.best_order`, the order and split of
    least simulated time over every order of slots up to swaps inside a node
    (OPTIMAL, or bound and gap under its deterministic count of orders), per
    point (micro-batching, schedule, vp), from the search's cutoff
    (``ctx["cutoff_s"]``; when no order beats it, the point is pruned,
    :func:`mapped_above`); when the orders exceed its count, the
    closed-form optimum of :func:`_closed_form_order` is split first, so the
    result is never slower than that order's exact split. The status, bound
    and gap go into the plan's options. None when no order fits in memory
    or none was met that fits and none beats the cutoff."""
    from .order_search import MAX_ORDERS, best_order, total_orders

    key = mapped_key(variant, row)
    if key not in ctx:
        precision = profile_precision(variant.profile)

        built: dict = {}  # the point's costs per order: its bounds read the same few orders' costs again

        def costs_of(order):
            if order not in built:
                named = dict(row, placement=SLOTS_PREFIX + ",".join(map(str, order)))
                built[order] = point_costs(variant, cluster, ctx["job"], named, ctx["profiled_device"],
                                           ctx.get("in_flight_cache"), ctx.get("links_cache"), ctx)[1]
            return built[order]

        classes = slot_classes(cluster, variant.tp, precision)
        first = (lambda: _closed_form_order(cluster, variant, row, ctx)) if total_orders(
            classes, row["pp"]) > MAX_ORDERS else ()  # only for a point the rank-capacity bound does not settle
        found = best_order(classes, costs_of, row["schedule"], row["pp"], row["vp"],
                           cutoff_s=ctx.get("cutoff_s", math.inf), first=first)
        heads = None if found is None or not found.order else layout(
            cluster, row["pp"], 1, variant.tp, SLOTS_PREFIX + ",".join(map(str, found.order)), precision)
        ctx[key] = (heads, None if found is None else {
            "method": found.method + "+exact-split", "status": found.status, "objective_s": found.iteration_time_s,
            "best_bound_s": found.best_bound_s, "gap": found.gap, "orders_evaluated": found.orders_evaluated,
            "orders_total": found.orders_total})
    return ctx[key][0]


def _closed_form_order(cluster: Cluster, variant: ModelVariant, row: dict, ctx: dict) -> tuple:
    """The slots of the order :func:`pipesearch.ilp.map_pipeline` chooses for
    the closed-form 1F1B objective (once per variant and pp, at the first
    micro-batching asked), as the order search's first order when its orders
    are too many to visit; empty when none fits."""
    from .ilp import map_pipeline

    key = ("closed-form", id(variant), row["pp"])
    if key not in ctx:
        heads = slot_heads(cluster, variant.tp, profile_precision(variant.profile))
        try:
            result = map_pipeline(variant.profile, cluster, ctx["job"], pp=row["pp"],
                                  micro_batch_size=row["micro_batch_size"],
                                  num_micro_batches=row["num_micro_batches"], schedule="1f1b",
                                  objective="iteration", profiled_device=ctx["profiled_device"],
                                  devices=heads, max_deterministic_time=ctx["time_limit_s"])
            pos = {int(h): k for k, h in enumerate(heads)}
            ctx[key] = (tuple(pos[d] for d in result.devices),)
        except InfeasibleError:
            ctx[key] = ()
    return ctx[key]


#: among mapped points of equal bound, the schedules with the least bubble
#: first (their plans are likeliest to set a low cutoff for the others);
#: a schedule not listed comes last
BUBBLE_ORDER = ("zb-h1", "interleaved-1f1b", "looped-bfs", "1f1b", "gpipe")


def mapped_visit_order(points: list, rows: list[dict]) -> list:
    """The order in which the search evaluates its mapped points ``(bound,
    row index, variant)``, after every other point: first the point of least
    bound of each family (variant, pp, schedule, vp: the likeliest best
    mapping of each configuration, so that the cutoff falls early), then
    the others; each part by bound, then schedule (:data:`BUBBLE_ORDER`:
    on a mixed cluster the bounds of one (pp, dp, m) often tie), then row
    index. Deterministic; the ranked plans do not depend on it
    (docs/heterogeneous.md, "Point order")."""
    def key(point):
        schedule = rows[point[1]]["schedule"]
        return (point[0], BUBBLE_ORDER.index(schedule) if schedule in BUBBLE_ORDER else len(BUBBLE_ORDER), point[1])

    heads: dict = {}
    for point in sorted(points, key=key):
        row = rows[point[1]]
        heads.setdefault((id(point[2]), row["pp"], row["schedule"], row["vp"]), point)
    first = {p[1] for p in heads.values()}
    return sorted(heads.values(), key=key) + sorted((p for p in points if p[1] not in first), key=key)


def mapped_above(variant: ModelVariant, row: dict, ctx: dict, cutoff_s: float) -> bool:
    """Whether a mapped point's order search (:func:`_mapped_order`) proved
    that no order and split beats ``cutoff_s`` (status ``ABOVE_CUTOFF``,
    bound at least ``cutoff_s``): the point is then pruned as it stands,
    with no split search on any order (whether one fits does not matter)."""
    info = ctx.get(mapped_key(variant, row), (None, None))[1]
    return info is not None and info["status"] == "ABOVE_CUTOFF" and info["best_bound_s"] >= cutoff_s


def mapped_key(variant: ModelVariant, row: dict) -> tuple:
    return ("mapped", id(variant), row["pp"], row["micro_batch_size"], row["num_micro_batches"], row["schedule"],
            row["vp"])


def slots_and_links(cluster, variant, row, placement: str, placement_ctx: dict, links_cache: dict):
    """Heads of every (virtual) stage of a point under ``placement`` and
    their links (:func:`pipesearch.placement.placement_links`), cached per
    placement; ``(None, None)`` when a mapped placement found no order."""
    pp, dp, vp = row["pp"], row["dp"], row["vp"]
    heads = placement_array(cluster, variant, dict(row, placement=placement), placement_ctx)
    if heads is None:
        return None, None
    if row["schedule"] == "mobius":  # adjacent stages under different PCIe switches (host.cross_mapping)
        heads = cross_mapping(cluster, heads, variant.tp)
    slots = heads[np.arange(pp * vp) % pp]
    key = (pp, dp, vp, variant.tp, placement, row["schedule"] == "mobius") + (
        (tuple(heads.ravel()),) if placement == "mapped" else ())
    if key not in links_cache:
        check_layout(cluster, heads, variant.tp)  # distinct devices on the cluster, each group in one node
        links_cache[key] = placement_links(cluster, slots, variant.tp)
    return slots, links_cache[key]


def memory_key(cluster, variant, row: dict, options) -> tuple | None:
    """The point without its placement, where whether a split fits does not
    depend on the placement: devices of one memory size (the same capacity
    on every stage, whichever devices hold it), no per-stage memory
    options, host-memory offload or weight streaming (whose host memory is
    counted per node), no Mobius or RoundPipe (their own GPU and host
    rules), no device order search or per-stage replicas, no pinned split.
    None elsewhere. The split search's memory test of a stage reads its layers,
    its micro-batches in flight and its devices' capacity, never a link,
    so a point of another placement that no split fits fits no split
    either (on GPT-3 175B on 1,024 GPUs, 16 of its 48 such split searches)."""
    if (len({g.device.memory_bytes for g in cluster.groups}) > 1 or variant.offload or variant.stream
            or variant.stage_tables or options.split
            or row["schedule"] in ("mobius", "roundpipe") or row["placement"] == "mapped"
            or parse_replicas_name(row["placement"]) is not None):
        return None
    return (id(variant), row["pp"], row["dp"], row["micro_batch_size"], row["num_micro_batches"], row["schedule"],
            row["vp"])


def same_links(cluster, variant, row, first: str, placement_ctx: dict, links_cache: dict) -> bool:
    """Whether this point's placement puts every boundary and every all-reduce
    on the same devices' links as the group's first placement (then both score
    the same and only the first is evaluated)."""
    if not cluster.is_uniform:
        return False
    mine = slots_and_links(cluster, variant, row, row["placement"], placement_ctx, links_cache)[1]
    return mine == slots_and_links(cluster, variant, row, first, placement_ctx, links_cache)[1]


def point_costs(variant, cluster, job, row, profiled_device, in_flight_cache, links_cache, placement_ctx):
    """``(slots, costs)`` of one search point (its placement's devices per
    stage and its :class:`pipesearch.costs.PipelineCosts`), or ``(None,
    None)`` when a mapped placement has no device order that fits."""
    pp, dp, mbs, m = row["pp"], row["dp"], row["micro_batch_size"], row["num_micro_batches"]
    schedule, vp = row["schedule"], row["vp"]
    replicas = parse_replicas_name(row["placement"])
    profile, stage_tables = variant.tables(schedule)
    if replicas is not None:  # per-stage replication (pipesearch.replication)
        return replicated_costs(profile, cluster, job, replicas, micro_batch_size=mbs, num_micro_batches=m,
                                schedule=schedule if schedule in ANALYTIC_SCHEDULES else "gpipe",
                                in_flight=schedule_in_flight(schedule, pp, m, 1, in_flight_cache,
                                                             variant.profile.wgrad_saved_fraction),
                                profiled_device=profiled_device, cache=links_cache, tp=variant.tp,
                                slots=parse_replicas_slots(row["placement"]))
    slots, links = slots_and_links(cluster, variant, row, row["placement"], placement_ctx,
                                   {} if links_cache is None else links_cache)
    if slots is None:
        return None, None
    costs = build_pipeline_costs(
        profile, cluster, job, pp=pp * vp, dp=dp, micro_batch_size=mbs, num_micro_batches=m,
        schedule=schedule if schedule in ANALYTIC_SCHEDULES else "gpipe", placement=slots,
        profiled_device=profiled_device, in_flight=schedule_in_flight(schedule, pp, m, vp, in_flight_cache,
                                                                      variant.profile.wgrad_saved_fraction),
        stages_per_device=vp, links=links, wgrad_window=schedule == "zb-h1", tp=variant.tp,
        chunk_states=schedule_chunk_states(schedule, pp, m, vp, in_flight_cache, variant.profile.wgrad_saved_fraction),
        optimizer_offload=variant.offload, option_profiles=stage_tables or None,
        weight_streaming=variant.stream, weight_swapping=schedule == "mobius",
    )
    return slots, costs
