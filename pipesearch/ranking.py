"""The ranking of plans: time, then the tie-breaks; one plan per configuration."""

from __future__ import annotations

import math


from .types import Plan


def plan_family(plan: Plan) -> tuple:
    """The configuration a plan stands for in the ranking: (tp, recompute,
    pp, dp, schedule, vp). The ranked list holds the best plan of each family
    (its micro-batch size, placement and split chosen inside it), so the top
    plans are distinct choices rather than near-copies. A plan with
    per-stage replication adds its replica vector."""
    family = (plan.tp, dict(plan.extra).get("recompute"), plan.pp, plan.dp, plan.schedule, plan.vp)
    return family + ((plan.stage_replicas,) if plan.stage_replicas is not None else ())


def kth_best(times: list[float], keep: int) -> float:
    """The time a point must beat to enter the ``keep`` best of the sorted
    family ``times``, near-ties of the best kept (:data:`TIE_REL`); inf while
    fewer than ``keep`` are known."""
    if len(times) < keep:
        return math.inf
    return max(times[keep - 1], times[0] * (1 + TIE_REL))


TIE_REL = 1e-3
"""Plans within this relative time of the best are ranked by tie-breaks."""


def rank_plans(plans: list[Plan]) -> list[Plan]:
    """Order plans by simulated iteration time; among those within
    :data:`TIE_REL` of the best, prefer fewer bytes over PCIe per iteration
    (state kept on the GPU: ``options.host.total_pcie_bytes_per_iteration``,
    0 without host options), then lower peak memory, then less time on
    links, then fewer stages, then fewer micro-batches (the rest follow by
    time); plans equal in all
    of those in a fixed order (:func:`_plan_key`), whatever order they
    come in."""
    plans = sorted(plans, key=lambda p: (p.predicted.iteration_time_s,) + _plan_key(p))
    if not plans:
        return plans
    best = plans[0].predicted.iteration_time_s
    near = [p for p in plans if p.predicted.iteration_time_s <= best * (1 + TIE_REL)]
    rest = plans[len(near):]
    near.sort(key=lambda p: tie_key(p) + (p.predicted.iteration_time_s,) + _plan_key(p))
    return near + rest


def _plan_key(plan: Plan) -> tuple:
    """What orders plans equal in every ranked respect, so that the order
    never follows the order they were found in (the search's and
    ``--exhaustive``'s differ): degrees, schedule, micro-batches, split,
    placement, recompute."""
    extra = dict(plan.extra or ())
    return (plan.pp, plan.dp, plan.tp, plan.vp, plan.schedule, plan.micro_batch_size, plan.num_micro_batches,
            tuple(plan.layers_per_stage), str(extra.get("placement", "")), str(extra.get("recompute", "")),
            tuple(st.memory_option for st in plan.stages))


def tie_key(plan: Plan) -> tuple:
    """What breaks a tie of time (:func:`rank_plans`): bytes over PCIe per
    iteration, peak memory, time on links, stages, then micro-batches
    (fewer, larger ones: fewer kernel launches, and statistics such as
    BatchNorm's over more samples, which a profile timed in proportion to
    the batch does not see; one stage of GPipe at any micro-batch size is
    the same time and memory); smaller first."""
    return (round(_pcie_bytes(plan), 0), round(plan.predicted.peak_memory_bytes, 0),
            sum(st.comm_s for st in plan.stages), plan.pp * plan.vp, plan.num_micro_batches)


def _pcie_bytes(plan: Plan) -> float:
    """Bytes ``plan`` moves over PCIe per iteration (its ``host`` option, 0 without)."""
    return float(dict(plan.extra or ()).get("host", {}).get("total_pcie_bytes_per_iteration", 0.0))
