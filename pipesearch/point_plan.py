"""A point's split turned into a plan: stages, prediction, and its replay in the simulator."""

from __future__ import annotations

import math

import numpy as np

from .costs import PipelineCosts
from .memory import param_state_of
from .option_search import host_plan_info, pin_mobius_activations, prefer_device_state
from .placement import group_ids, memory_bytes_of, rank_memory
from .replication import parse_replicas_name
from .search_options import ANALYTIC_SCHEDULES
from .stage_options import ACT_HOST_RESIDENT, offloads_activations
from .timemodel import (busiest_idle_fraction, busy_with_steps_s, iteration_time_s, rank_busy_s, simulate_times,
                        stage_times_of)
from .types import Cluster, Job, ModelProfile, Plan, Prediction, StagePlan


def plan_stages(variant, costs: PipelineCosts, bounds, placement, cluster,
                job: Job | None = None, replicated: bool = False) -> tuple[StagePlan, ...]:
    """The plan's stages under the split ``bounds``; with several stages
    per device each stage's memory is its part of its device's peak
    (:meth:`pipesearch.costs.PipelineCosts.at_device_peak`)."""
    costs = costs.at_device_peak(bounds)
    names = [lay.name for lay in variant.profile.layers]
    st, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    cols = {
        "compute_s": costs.compute_s(st, i, j),
        "comm_s": costs.send_s(st, j),
        "dp_comm_s": sum(costs.dp_comm_s(st, i, j)),
        "memory_bytes": costs.total_memory_bytes(st, i, j),
        "send_bytes": np.where(st + 1 < costs.pp, costs.output_bytes[j - 1], 0.0),
        "fwd_s": costs.fwd_s(st, i, j),
        "saved_bytes": costs.saved_bytes(st, i, j),
        "bwd_input_s": costs.bwd_input_s(st, i, j),
        "allreduce_s": costs.after_backward_s(st, i, j),
        "host_step_s": costs.host_step_s(st, i, j),
        "optimizer_step_s": costs.device_step_s(st, i, j),
    }
    # the recorded backward is compute_s - fwd_s (two prefix sums apart, so a stage with no backward can
    # round to a forward past its compute): keep it, and the input-gradient part inside it, non-negative
    cols["fwd_s"] = np.minimum(cols["fwd_s"], cols["compute_s"])
    cols["bwd_input_s"] = np.minimum(cols["bwd_input_s"], cols["compute_s"] - cols["fwd_s"])
    cols = {k: v.tolist() for k, v in cols.items()}
    stages = []
    ranks = len({tuple(np.asarray(row).ravel().tolist()) for row in placement})  # stages of a rank share its slot
    state = param_state_of(job, ranks) if job is not None else None
    group_names = [g.device.name for g in cluster.groups]
    of_group = group_ids(cluster)
    for s in range(costs.pp):
        devices = tuple(np.asarray(placement[s], dtype=np.int64).tolist())
        gids = of_group[np.asarray(devices, dtype=np.int64)]
        firsts = gids[np.sort(np.unique(gids, return_index=True)[1])]  # groups in order of first appearance
        parts = costs.memory_breakdown(s, int(i[s]), int(j[s]), state, len(placement[s]),
                                       variant.profile.bytes_per_param)
        stages.append(StagePlan(
            index=s, layers=(int(i[s]), int(j[s])), layer_names=tuple(names[i[s]:j[s]]), devices=devices,
            device_type=",".join(dict.fromkeys(group_names[g] for g in firsts.tolist())),
            memory_breakdown=tuple(parts.items()), replicas=len(devices) if replicated else None,
            memory_option=costs.option_name(s, int(i[s]), int(j[s])),
            **{k: v[s] for k, v in cols.items()},
        ))
    return tuple(stages)


def plan_prediction(costs: PipelineCosts, stages, iteration_time_s: float, global_batch: int, cluster,
                    pp: int, schedule: str, profile: ModelProfile | None = None, tp: int = 1) -> Prediction:
    m = costs.num_micro_batches
    busy = busy_with_steps_s(rank_busy_s(schedule, pp, m, costs.stage_times(
        (stages[0].layers[0],) + tuple(st.layers[1] for st in stages))), [st.optimizer_step_s for st in stages], pp)
    mem, caps = rank_memory(stages, pp, memory_bytes_of(cluster))  # caps: the peak device's own memory
    if schedule == "mobius":  # each GPU's peak over its stays, the figure its memory check uses
        mem = costs.mobius_device_peak_bytes((stages[0].layers[0],) + tuple(st.layers[1] for st in stages))
    busiest, k = float(busy.max()), int(np.argmax(mem))
    peak, cap = float(mem[k]), float(caps[k])
    return Prediction(
        iteration_time_s=iteration_time_s,
        samples_per_s=global_batch / iteration_time_s if iteration_time_s > 0 else math.inf,
        bubble_fraction=busiest_idle_fraction(busiest, iteration_time_s),
        peak_memory_bytes=peak,
        memory_capacity_bytes=cap,
        **throughput_terms(profile, stages, global_batch, cluster, tp),
    )


def throughput_terms(profile: ModelProfile | None, stages, global_batch: int, cluster, tp: int) -> dict:
    """The plan's devices (each stage device heads a group of ``tp``) and
    their fp16 peak (fp32 accumulate, the MFU denominator), and, for a model
    with tokens, tokens and PaLM model FLOPs per iteration (left out, 0, for
    a layer profile)."""
    devices = np.unique(np.concatenate([np.asarray(st.devices, dtype=np.int64) for st in stages]))
    flops = np.array([g.device.mfu_peak_flops for g in cluster.groups], dtype=float)[group_ids(cluster)[devices]]
    out = {"peak_flops": float(tp * sum(flops.tolist())),  # summed in device order, as a Python sum
           "num_devices": tp * len(devices)}
    if profile is not None and profile.tokens_per_sample:
        out.update(tokens_per_iteration=float(global_batch * profile.tokens_per_sample),
                   model_flops_per_iteration=float(global_batch * profile.model_flops_per_sample))
    return out


def plan_rank_busy_s(plan: Plan, timeline) -> np.ndarray:
    """``(pp,)``: each rank's busy seconds in ``timeline`` (a replay of
    ``plan``, :func:`simulate_plan`) with its stages' GPU optimizer steps
    (:func:`pipesearch.timemodel.busy_with_steps_s`), the busy time
    ``predicted.bubble_fraction`` counts."""
    return busy_with_steps_s(timeline.busy_s, [st.optimizer_step_s for st in plan.stages], timeline.num_ranks)


def simulate_plan(plan: Plan) -> tuple[float, object]:
    """Replay a plan's schedule with its stage times in the simulator
    (:func:`pipesearch.timemodel.simulate_times`): returns (iteration time
    including each rank's gradient all-reduce after its last action, Timeline)."""
    resident = [ACT_HOST_RESIDENT if offloads_activations(st.memory_option) else math.inf for st in plan.stages]
    return simulate_times(plan.schedule, plan.pp, plan.num_micro_batches, plan.vp, stage_times_of(plan),
                          act_bytes=[st.saved_bytes for st in plan.stages], act_resident=resident)


def analytic_time_s(schedule: str, costs: PipelineCosts, bounds, pp: int, vp: int) -> float:
    """The textbook closed form of a split's iteration time, reported beside
    the simulated time as a labelled secondary number (never used to rank).

    GPipe, 1F1B: ``sum a_k + max_k ((m-1) a_k + allreduce_k)`` with ``a_k``
    a stage's compute and both transfers (Narayanan et al. SC'21 sec. 2.2).
    Interleaved 1F1B and looped breadth-first, with device time per
    micro-batch ``tau_r``: ``(m + (pp-1)/vp) * max_r tau_r + max_r
    allreduce_r`` (SC'21 sec. 2.2.2); looped breadth-first with fewer
    micro-batches than ranks waits for the pipeline to fill at every
    chunk, ``((vp-1) max(m, pp) + m + pp - 1) / vp`` in place of ``m +
    (pp-1)/vp``. ZB-H1: the 1F1B form less ``(pp-1) min_k (W_k + min(I_k,
    W_k))``: 1F1B's bubble is ``(pp-1)(F+I+W)`` and ZB-H1's ``(pp-1)(F+I-W)``
    with ``I`` the input-gradient and ``W`` the weight-gradient part (Qi et
    al. 2023, sec. 3.1, bubble ``(p-1)(T_F + T_B - T_W)``), ``(pp-1) F``
    when ``W > I`` (the last rank still waits ``(p-1) F`` to start).
    """
    m = costs.num_micro_batches
    if schedule in ANALYTIC_SCHEDULES:
        return costs.iteration_time_s(bounds)
    S = costs.pp
    st, i, j = np.arange(S), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    a = costs.sum_term(st, i, j)
    ar = costs.after_backward_s(st, i, j)
    if schedule == "zb-h1":
        bin_ = costs.bwd_input_s(st, i, j)
        w = costs.bwd_s(st, i, j) - bin_
        return costs.iteration_time_s(bounds) - (pp - 1) * float((w + np.minimum(w, bin_)).min())
    tau = np.bincount(np.arange(S) % pp, weights=a, minlength=pp)
    ar_dev = np.bincount(np.arange(S) % pp, weights=ar, minlength=pp)
    steps = ((vp - 1) * max(m, pp) + m + pp - 1) / vp if schedule == "looped-bfs" else m + (pp - 1) / vp
    return float(steps * tau.max() + ar_dev.max())


def plan_of_split(variant, cluster: Cluster, job: Job, row: dict, costs: PipelineCosts, bounds, time_s: float,
                  slots, split_info: dict, mapping: dict | None = None) -> tuple[Plan, PipelineCosts]:
    """The plan of a point (``row``: its degrees, schedule, micro-batching
    and placement) under the split ``bounds`` of simulated time ``time_s``
    on the devices ``slots`` (``(stages, replicas)`` heads): its stages, its
    prediction, and in ``extra`` the placement, recompute, ``split_info``
    (the split search's exactness, bound and gap), the labelled closed form
    and, for a mapped placement, ``mapping`` (the order search's status).
    Among equal times the stages' choices keep state on the GPU and hold
    Mobius' stages to their activation choice
    (:func:`pipesearch.option_search.prefer_device_state`,
    :func:`pipesearch.option_search.pin_mobius_activations`); returns the
    plan and the costs it was built from."""
    pp, dp, mbs, m = row["pp"], row["dp"], row["micro_batch_size"], row["num_micro_batches"]
    schedule, vp, t = row["schedule"], row["vp"], time_s
    # equal times: state kept on the GPU; Mobius' stages held to their activation choice
    tied = pin_mobius_activations(prefer_device_state(costs, bounds, job, dp, variant.tp), bounds)
    if tied is not costs:
        costs, t = tied, float(iteration_time_s(schedule, pp, m, vp, tied.stage_times(np.asarray(bounds))))
    analytic = analytic_time_s(schedule, costs, bounds, pp, vp)
    stage_plans = plan_stages(variant, costs, bounds, slots, cluster, job,
                              replicated=parse_replicas_name(row["placement"]) is not None)
    mapping_info = ((("mapping", mapping),) if mapping is not None else ())
    recompute = variant.recompute
    if recompute == "none" and costs.options is not None and any(
            n.split("+")[0] in ("full", "selective") for n in costs.options.names):
        recompute = "per-stage"  # the stages chose (StagePlan.memory_option)
    extra = (("placement", row["placement"]), ("recompute", recompute)) + variant.extra + mapping_info + (
        ("split_search", split_info), ("simulated", True), ("analytic_iteration_time_s", analytic)) + (
        host_plan_info(costs, bounds, job, dp, variant.tp))
    plan = Plan(
        rank=0, pp=pp, dp=dp, tp=variant.tp, vp=vp, schedule=schedule, micro_batch_size=mbs,
        num_micro_batches=m, stages=stage_plans,
        predicted=plan_prediction(costs, stage_plans, t, job.global_batch_size, cluster, pp, schedule,
                                  variant.profile, variant.tp),
        extra=extra,
    )
    return plan, costs
