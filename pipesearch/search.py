"""Enumerate the plan space, split each point exactly, rank, simulate the best.

A *point* is (tp, recompute, pp, dp, micro-batch size, schedule, placement).
For each point the exact split (:func:`pipesearch.partition.optimal_split`)
gives the point's best analytic iteration time; points are visited in order of
a lower bound on that time, and a point whose bound cannot enter the top ``K``
is skipped (``pruned``) without losing exactness of the ranking. The top
``simulate_top`` plans are then replayed by the discrete-event simulator
(:mod:`pipesearch.simulate`) and the final ranking uses the simulated
iteration time.

Every visited point is a row of :attr:`SearchResult.points` (a pandas
DataFrame) with its status: ``ok``, ``out_of_memory``, ``batch_not_divisible``,
``schedule_refused``, ``too_many_stages`` or ``pruned``.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from . import schedules as schedule_lib
from .costs import PipelineCosts, build_pipeline_costs, device_time_scale, pipeline_placement
from .errors import InfeasibleError, InputError
from .partition import SplitResult, optimal_split
from .simulate import simulate
from .types import Cluster, DeviceSpec, Job, ModelProfile, Plan, Prediction, StagePlan

ANALYTIC_SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class SearchOptions:
    """Pins and knobs of a search. ``None`` means "search over it".

    Attributes:
        pp, dp, micro_batch_size, num_micro_batches: pinned degrees.
        schedules: schedules to consider.
        split: layers per stage to score instead of searching (implies pp).
        top: number of plans to return.
        simulate_top: how many of the best analytic plans to simulate and
            re-rank by simulated time (0: analytic ranking only).
        placements: device placement orders to try when pp > 1 and dp > 1
            (see :func:`pipesearch.costs.pipeline_placement`).
        exhaustive: evaluate every point instead of skipping those whose
            lower bound cannot enter the top plans (for plots of the space).
    """

    pp: int | None = None
    dp: int | None = None
    micro_batch_size: int | None = None
    num_micro_batches: int | None = None
    schedules: tuple[str, ...] = ANALYTIC_SCHEDULES
    split: tuple[int, ...] | None = None
    top: int = 5
    simulate_top: int = 8
    placements: tuple[str, ...] = ("pipeline", "data")
    exhaustive: bool = False


@dataclass(frozen=True)
class ModelVariant:
    """A layer table of the model under one (tp, recompute) choice."""

    profile: ModelProfile
    tp: int = 1
    recompute: str = "none"
    extra: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True, eq=False)
class SearchResult:
    """Ranked plans plus the bookkeeping of the search.

    ``points`` has one row per visited point (columns: tp, recompute, pp, dp,
    schedule, micro_batch_size, num_micro_batches, placement, status,
    iteration_time_s, samples_per_s, peak_memory_bytes, bubble_fraction,
    lower_bound_s).
    """

    plans: tuple[Plan, ...]
    points_evaluated: int
    infeasible: tuple[tuple[str, int], ...]
    wall_s: float
    fingerprint: str
    points: pd.DataFrame = field(repr=False)


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def fingerprint(*parts) -> str:
    """``sha256:`` of the JSON of ``parts`` (dataclasses via ``repr``)."""
    text = json.dumps([repr(p) for p in parts], sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _lower_bound_s(variant: ModelVariant, cluster: Cluster, pp: int, mbs: int, m: int, fastest: float) -> float:
    """A valid lower bound on any split's iteration time: total compute on the
    fastest device, ``T >= W (1 + (m-1)/pp)`` (no stage is faster than the
    average; links and all-reduce cost >= 0)."""
    prof = variant.profile
    work = sum(lay.fwd_s + lay.bwd_s for lay in prof.layers) * mbs / prof.profiled_batch_size * fastest
    return work * (1 + (m - 1) / pp)


def _stage_plans(variant, costs: PipelineCosts, bounds, placement, cluster) -> tuple[StagePlan, ...]:
    names = [lay.name for lay in variant.profile.layers]
    stages = []
    for s in range(costs.pp):
        i, j = bounds[s], bounds[s + 1]
        devices = tuple(int(d) for d in placement[s])
        stages.append(StagePlan(
            index=s,
            layers=(i, j),
            layer_names=tuple(names[i:j]),
            devices=devices,
            compute_s=float(costs.compute_s(s, i, j)),
            comm_s=float(costs.p2p_s(s, j)),
            allreduce_s=float(costs.allreduce_s(s, i, j)),
            memory_bytes=float(costs.memory_bytes(s, i, j)),
            send_bytes=float(costs.output_bytes[j - 1]) if s + 1 < costs.pp else 0.0,
            device_type=cluster.device_spec(devices[0]).name,
            fwd_s=float(costs.time_scale[s] * (costs.fwd_prefix_s[j] - costs.fwd_prefix_s[i])),
            saved_bytes=float(costs.saved_prefix_bytes[j] - costs.saved_prefix_bytes[i]),
        ))
    return tuple(stages)


def _prediction(costs: PipelineCosts, stages, iteration_time_s: float, global_batch: int, cluster) -> Prediction:
    m = costs.num_micro_batches
    busiest = max(m * (st.compute_s + st.comm_s) for st in stages)
    peak = max(st.memory_bytes for st in stages)
    cap = min(cluster.device_spec(st.devices[0]).memory_bytes for st in stages)
    return Prediction(
        iteration_time_s=iteration_time_s,
        samples_per_s=global_batch / iteration_time_s if iteration_time_s > 0 else math.inf,
        bubble_fraction=max(0.0, 1.0 - busiest / iteration_time_s) if iteration_time_s > 0 else 0.0,
        peak_memory_bytes=peak,
        memory_capacity_bytes=cap,
    )


def simulate_plan(plan: Plan) -> tuple[float, object]:
    """Replay a plan's schedule with its stage times; returns (iteration time
    including each stage's gradient all-reduce after its last backward, Timeline).

    The simulated iteration ends when the last stage finishes its all-reduce:
    ``max_k (end of stage k's last backward + allreduce_k)``.
    """
    p, m = plan.pp, plan.num_micro_batches
    actions = schedule_lib.build(plan.schedule, p, m, plan.vp)
    fwd = [st.fwd_s for st in plan.stages]
    bwd = [st.compute_s - st.fwd_s for st in plan.stages]
    p2p = [st.comm_s / 2 for st in plan.stages[:-1]]
    timeline = simulate(actions, fwd_s=fwd, bwd_s=bwd, p2p_s=p2p, act_bytes=[st.saved_bytes for st in plan.stages])
    end = [0.0] * len(plan.stages)
    for rec in timeline.records:
        if rec.kind in ("B", "W"):
            end[rec.stage] = max(end[rec.stage], rec.end_s)
    total = max(max(e + st.allreduce_s for e, st in zip(end, plan.stages)), timeline.iteration_time_s)
    return total, timeline


def enumerate_points(variants: Iterable[ModelVariant], cluster: Cluster, job: Job, options: SearchOptions):
    """Yield ``(variant, pp, dp, mbs, m, schedule, placement_name, status)``
    for every point of the space; ``status`` is None for points to evaluate,
    else the reason the point is refused without evaluation."""
    for variant in variants:
        L = variant.profile.num_layers
        slots = cluster.num_devices // variant.tp
        pps = [options.pp] if options.pp else range(1, min(slots, L) + 1)
        for pp in pps:
            if pp > L:
                yield variant, pp, None, None, None, None, None, "too_many_stages"
                continue
            if pp > slots:
                continue
            dps = [options.dp] if options.dp else range(1, slots // pp + 1)
            for dp in dps:
                if pp * dp > slots:
                    continue
                if job.global_batch_size % dp:
                    yield variant, pp, dp, None, None, None, None, "batch_not_divisible"
                    continue
                per_replica = job.global_batch_size // dp
                if options.num_micro_batches:
                    if per_replica % options.num_micro_batches:
                        yield variant, pp, dp, None, options.num_micro_batches, None, None, "batch_not_divisible"
                        continue
                    mbss = [per_replica // options.num_micro_batches]
                elif options.micro_batch_size:
                    if per_replica % options.micro_batch_size:
                        yield variant, pp, dp, options.micro_batch_size, None, None, None, "batch_not_divisible"
                        continue
                    mbss = [options.micro_batch_size]
                else:
                    mbss = divisors(per_replica)
                placements = options.placements if (pp > 1 and dp > 1) else options.placements[:1]
                for mbs in mbss:
                    m = per_replica // mbs
                    for schedule in options.schedules:
                        refused = schedule == "1f1b" and m < pp
                        for placement in placements:
                            yield variant, pp, dp, mbs, m, schedule, placement, (
                                "schedule_refused" if refused else None)


def search(
    variants: list[ModelVariant],
    cluster: Cluster,
    job: Job,
    options: SearchOptions = SearchOptions(),
    *,
    profiled_device: DeviceSpec | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Search the plan space and return the ranked plans.

    Args:
        variants: layer tables of the model (one per tp/recompute choice; a
            profiled model has one).
        cluster, job: where and what.
        options: pins and knobs.
        profiled_device: device the profile was measured on (for time scaling).
        progress: called as ``progress(done, total)`` while points are evaluated.

    Raises:
        InputError: a pin that cannot hold (e.g. ``--split`` that does not sum
            to the number of layers, pp*dp larger than the cluster).
        InfeasibleError: no point of the space yields a plan; the message gives
            the counts by reason and the likely fix.
    """
    start = time.perf_counter()
    _check_options(variants, cluster, job, options)
    fastest = min(
        device_time_scale(profiled_device, cluster.device_spec(d)) for d in range(cluster.num_devices)
    )
    rows: list[dict] = []
    todo = []
    for variant, pp, dp, mbs, m, schedule, placement, status in enumerate_points(variants, cluster, job, options):
        row = dict(tp=variant.tp, recompute=variant.recompute, pp=pp, dp=dp, schedule=schedule,
                   micro_batch_size=mbs, num_micro_batches=m, placement=placement, status=status,
                   iteration_time_s=np.nan, samples_per_s=np.nan, peak_memory_bytes=np.nan,
                   bubble_fraction=np.nan, lower_bound_s=np.nan)
        rows.append(row)
        if status is None:
            row["lower_bound_s"] = _lower_bound_s(variant, cluster, pp, mbs, m, fastest)
            todo.append((row["lower_bound_s"], len(rows) - 1, variant))
    todo.sort(key=lambda x: (x[0], x[1]))
    keep = max(options.top, options.simulate_top, 1)
    heap: list[tuple[float, int]] = []  # max-heap of the best `keep` times (negated)
    found: dict[int, tuple[Plan, PipelineCosts]] = {}
    for done, (bound, idx, variant) in enumerate(todo):
        if progress:
            progress(done, len(todo))
        row = rows[idx]
        if not options.exhaustive and len(heap) >= keep and bound >= -heap[0][0]:
            row["status"] = "pruned"
            continue
        plan, costs = _evaluate(variant, cluster, job, options, row, profiled_device)
        if plan is None:
            continue
        t = plan.predicted.iteration_time_s
        row.update(status="ok", iteration_time_s=t, samples_per_s=plan.predicted.samples_per_s,
                   peak_memory_bytes=plan.predicted.peak_memory_bytes,
                   bubble_fraction=plan.predicted.bubble_fraction)
        found[idx] = (plan, costs)
        if len(heap) < keep:
            heapq.heappush(heap, (-t, idx))
        elif t < -heap[0][0]:
            heapq.heapreplace(heap, (-t, idx))
    if progress:
        progress(len(todo), len(todo))
    counts = Counter(r["status"] for r in rows if r["status"] not in ("ok",))
    if not found:
        raise InfeasibleError(_no_plan_message(counts, variants, cluster, job))
    best = sorted(((found[i][0].predicted.iteration_time_s, i) for _, i in heap))
    plans = [found[i][0] for _, i in best]
    if options.simulate_top > 0:
        plans = _rerank_by_simulation(plans[: max(options.simulate_top, options.top)], job)
    plans = [replace(p, rank=r + 1) for r, p in enumerate(plans[: options.top])]
    points = pd.DataFrame(rows)
    return SearchResult(
        plans=tuple(plans),
        points_evaluated=sum(1 for r in rows if r["status"] in ("ok", "out_of_memory")),
        infeasible=tuple(sorted((k, v) for k, v in counts.items() if k != "pruned"))
        + ((("pruned", counts["pruned"]),) if counts.get("pruned") else ()),
        wall_s=time.perf_counter() - start,
        fingerprint=fingerprint([v.profile for v in variants], cluster, job, options),
        points=points,
    )


def _evaluate(variant, cluster, job, options, row, profiled_device):
    pp, dp, mbs, m = row["pp"], row["dp"], row["micro_batch_size"], row["num_micro_batches"]
    slots = pipeline_placement(pp, dp, row["placement"]) * variant.tp
    costs = build_pipeline_costs(
        variant.profile, cluster, job, pp=pp, dp=dp, micro_batch_size=mbs, num_micro_batches=m,
        schedule=row["schedule"], placement=slots, profiled_device=profiled_device,
    )
    if options.split:
        bounds = tuple(int(x) for x in np.concatenate([[0], np.cumsum(options.split)]))
        if not costs.split_fits(bounds):
            row["status"] = "out_of_memory"
            return None, costs
        result = SplitResult(bounds, costs.iteration_time_s(bounds))
    else:
        result = optimal_split(costs)
        if result is None:
            row["status"] = "out_of_memory"
            return None, costs
    stages = _stage_plans(variant, costs, result.bounds, slots, cluster)
    extra = (("placement", row["placement"]), ("recompute", variant.recompute)) + variant.extra + (
        ("analytic_iteration_time_s", result.iteration_time_s),)
    plan = Plan(
        rank=0, pp=pp, dp=dp, tp=variant.tp, schedule=row["schedule"], micro_batch_size=mbs,
        num_micro_batches=m, stages=stages,
        predicted=_prediction(costs, stages, result.iteration_time_s, job.global_batch_size, cluster),
        extra=extra,
    )
    return plan, costs


def _rerank_by_simulation(plans: list[Plan], job: Job) -> list[Plan]:
    out = []
    for plan in plans:
        t_sim, timeline = simulate_plan(plan)
        extra = dict(plan.extra)
        analytic = extra.pop("analytic_iteration_time_s")
        extra["simulated"] = True
        extra["analytic_iteration_time_s"] = analytic
        pred = replace(
            plan.predicted,
            iteration_time_s=t_sim,
            samples_per_s=job.global_batch_size / t_sim if t_sim > 0 else math.inf,
            bubble_fraction=max(0.0, 1.0 - max(timeline.busy_s) / t_sim) if t_sim > 0 else 0.0,
        )
        out.append(replace(plan, predicted=pred, extra=tuple(extra.items())))
    out.sort(key=lambda p: (p.predicted.iteration_time_s, dict(p.extra)["analytic_iteration_time_s"]))
    return out


def _check_options(variants, cluster, job, options):
    if job.global_batch_size < 1:
        raise InputError(f"global batch size {job.global_batch_size} must be >= 1")
    L = variants[0].profile.num_layers
    if options.split is not None:
        if any(x < 1 for x in options.split):
            raise InputError(f"--split {','.join(map(str, options.split))}: every stage needs >= 1 layer")
        if sum(options.split) != L:
            raise InputError(
                f"--split {','.join(map(str, options.split))} covers {sum(options.split)} layers, "
                f"the model has {L}: the counts must sum to {L}")
        if options.pp and options.pp != len(options.split):
            raise InputError(f"--split has {len(options.split)} stages but --pp is {options.pp}")
    if options.pp is not None:
        if options.pp < 1:
            raise InputError(f"--pp {options.pp} must be >= 1")
        if options.pp > L:
            raise InputError(
                f"--pp {options.pp}: more stages than the model's {L} layers; use --pp {L} or fewer")
    for name in ("dp", "micro_batch_size", "num_micro_batches"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} {value} must be >= 1")
    if options.pp and options.dp and options.pp * options.dp * variants[0].tp > cluster.num_devices:
        raise InputError(
            f"--pp {options.pp} x --dp {options.dp} needs {options.pp * options.dp} devices, "
            f"cluster {cluster.name} has {cluster.num_devices}")
    if options.dp and job.global_batch_size % options.dp:
        raise InputError(
            f"global batch size {job.global_batch_size} is not divisible by --dp {options.dp}")
    if options.dp and options.micro_batch_size and (job.global_batch_size // options.dp) % options.micro_batch_size:
        raise InputError(
            f"per-replica batch {job.global_batch_size // options.dp} is not divisible by "
            f"--micro-batch-size {options.micro_batch_size}")
    if options.dp and options.num_micro_batches and (job.global_batch_size // options.dp) % options.num_micro_batches:
        raise InputError(
            f"per-replica batch {job.global_batch_size // options.dp} is not divisible by "
            f"--num-micro-batches {options.num_micro_batches}")
    if options.micro_batch_size and job.global_batch_size % options.micro_batch_size:
        raise InputError(
            f"global batch size {job.global_batch_size} is not divisible by "
            f"--micro-batch-size {options.micro_batch_size}")
    unknown = [s for s in options.schedules if s not in ANALYTIC_SCHEDULES]
    if unknown:
        raise InputError(f"unknown schedule {unknown[0]!r}; expected one of {', '.join(ANALYTIC_SCHEDULES)}")


def _no_plan_message(counts: Counter, variants, cluster: Cluster, job: Job) -> str:
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no points"
    prof = variants[0].profile
    params = sum(lay.param_bytes for lay in prof.layers) / prof.bytes_per_param
    state = params * job.state_bytes_per_param
    mem = cluster.device_spec(0).memory_bytes - job.memory_reserve_bytes
    hint = ("the model's weights and optimizer state alone need "
            f"{state / 2**30:.1f} GiB against {mem / 2**30:.1f} GiB usable per device; "
            "use a cluster with more or larger devices" if state > mem * cluster.num_devices else
            "lower --micro-batch-size, raise --pp, or use a larger cluster")
    return f"no plan fits {prof.name} on {cluster.name} ({reasons}); {hint}"
