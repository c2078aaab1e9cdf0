"""Why a search found no plan, or a pinned split does not fit: the one-line messages."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from .costs import PipelineCosts
from .memory import offload_bytes_per_param, param_state_of, usable_memory_bytes
from .placement import memory_bytes_of
from .replication import parse_replicas_name
from .search_space import STOPPED
from .types import Cluster, Job, MAX_MICRO_BATCHES
from .units import format_gib_pair


def note_split_overflow(ctx: dict, costs: PipelineCosts, bounds, row: dict) -> None:
    """Keep in ``ctx["split_overflow"]`` the --split point closest to fitting
    in memory, as (overflow ratio, text naming its fullest stage)."""
    s, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    if costs.options is not None and costs.options.swap_queue is not None:
        _note_mobius_gpu_overflow(ctx, costs, bounds, row)
        return
    need = costs.least_memory_bytes(s, i, j)
    ratio = need / costs.capacity_bytes
    k = int(np.argmax(ratio))
    if costs.chunk_states is not None and ratio[k] <= 1:  # each stage fits alone: a device holding several does not
        _note_device_overflow(ctx, costs, bounds, row)
        return
    if "split_overflow" in ctx and ctx["split_overflow"][0] <= ratio[k]:
        return
    tied = float(costs.tied_copy_bytes[k]) if costs.tied_copy_bytes is not None else 0.0
    ctx["split_overflow"] = (float(ratio[k]), (
        f"closest: --split stage {k} (layers {int(i[k])}..{int(j[k]) - 1}) needs {need[k] / 2**30:.1f} GiB per "
        f"device against {costs.capacity_bytes[k] / 2**30:.1f} GiB usable"
        + (f" (after its tied embedding copy's {tied / 2**30:.1f} GiB)" if tied > 0 else "")
        + f", at {_degrees(row)}, "
        f"micro-batch size {row['micro_batch_size']}, {row['schedule']}; move layers off stage {k} or "
        + ("change the micro-batch size (with replicas a device keeps ceil(b / r) samples of each of its in-flight "
           "micro-batches)" if parse_replicas_name(row.get("placement")) else "lower the micro-batch size")))


def _degrees(row: dict) -> str:
    """``pp P x dp D`` of a point, or ``pp P, replicas R0,R1,..`` where its
    stages have their own replicas (its dp is then 1)."""
    replicas = parse_replicas_name(row.get("placement"))
    if replicas:
        return f"pp {row['pp']}, replicas {','.join(str(r) for r in replicas)}"
    return f"pp {row['pp']} x dp {row['dp']}"


def _note_device_overflow(ctx: dict, costs: PipelineCosts, bounds, row: dict) -> None:
    """:func:`note_split_overflow` of a --split whose stages each fit
    alone but some device, holding several of them, does not at its peak
    (:meth:`PipelineCosts.device_memory_bytes`): that device, its stages
    and both figures."""
    need = costs.device_memory_bytes(np.asarray(bounds))
    R = len(need)
    ratio = need / costs.capacity_bytes[:R]
    r = int(np.argmax(ratio))
    if "split_overflow" in ctx and ctx["split_overflow"][0] <= ratio[r]:
        return
    stages = ", ".join(str(k) for k in range(r, costs.pp, R))
    ctx["split_overflow"] = (float(ratio[r]), (
        f"closest: --split: pipeline rank {r} holds stages {stages}, {need[r] / 2**30:.1f} GiB at its peak "
        f"(training state of its stages and the activations they hold at once) against "
        f"{costs.capacity_bytes[r] / 2**30:.1f} GiB usable, at pp {row['pp']} x dp {row['dp']}, micro-batch size "
        f"{row['micro_batch_size']}, {row['schedule']}; move layers off those stages or lower the micro-batch size"))


def _note_mobius_gpu_overflow(ctx: dict, costs: PipelineCosts, bounds, row: dict) -> None:
    """:func:`note_split_overflow` of a Mobius --split: what refuses it,
    the host memory of a node (every stage keeping its activations on the
    GPU, the least host bytes: :meth:`PipelineCosts.mobius_node_host_bytes`)
    or else a GPU's peak over its usable memory
    (:meth:`PipelineCosts.mobius_device_peak_bytes`, every stage that can
    keeping its activations in host memory: the least peak), or, when each
    fits alone, the host memory under that least peak; the fixes named are
    the ones that can change the figure."""
    o = costs.options
    bounds = np.asarray(bounds)
    least = keep = costs
    if o.swap_act_copy_prefix_s is not None:
        every = np.stack([np.zeros(costs.pp, bool), np.ones(costs.pp, bool)])  # swap+act-host on every stage
        least = replace(costs, options=replace(o, allowed=every))
        keep = replace(costs, options=replace(o, allowed=~every))
    gib = 2.0 ** 30
    where = f"at pp {row['pp']} x dp {row['dp']}, micro-batch size {row['micro_batch_size']}, mobius"
    host, cap = keep.mobius_node_host_bytes(bounds), o.node_host_memory_bytes
    peaks, caps = least.mobius_device_peak_bytes(bounds), costs.mobius_gpu_capacity_bytes()
    if np.all(host <= cap) and np.all(peaks <= caps):  # each fits alone: the GPUs fit only with more on the host
        host = least.mobius_node_host_bytes(bounds)
    if np.any(host > cap):
        n = int(np.argmax(host / cap))
        ratio = float(host[n] / cap[n])
        acts = " and offloaded activations" if np.any(host != keep.mobius_node_host_bytes(bounds)) else ""
        need, have = format_gib_pair(host[n], cap[n])
        text = (f"closest: --split needs {need} of host memory on node {n} (its GPUs' stages' "
                f"16-bit weights and optimizer state{acts}) against its {have}, {where}; use a "
                "host with more memory ([host] memory_GB)" + (" or fewer micro-batches in flight" if acts else ""))
    else:
        r = int(np.argmax(peaks / caps))
        ratio = float(peaks[r] / caps[r])
        mine = ",".join(str(x) for x in range(r, costs.pp, len(peaks)))
        fixes = ["move layers off its stages"] + (["lower the micro-batch size"] if row["micro_batch_size"] > 1
                                                    else []) + (["add --activation-offload"]
                                                                if o.swap_act_copy_prefix_s is None else [])
        text = (f"closest: --split GPU {r} (stages {mine}) needs {peaks[r] / gib:.1f} GiB at its peak (its stages' "
                f"activations and fixed bytes, two stays' weights and gradients) against {caps[r] / gib:.1f} GiB "
                f"usable, {where}; " + ", ".join(fixes[:-1]) + (" or " if len(fixes) > 1 else "") + fixes[-1])
    if "split_overflow" in ctx and ctx["split_overflow"][0] <= ratio:
        return
    ctx["split_overflow"] = (ratio, text)


def _micro_batch_size_can_drop(options) -> bool:
    """Whether a smaller micro-batch is a fix the search has not tried: a
    pinned size above 1 or a pinned micro-batch count (unpinned, every
    divisor down to 1 was searched: :func:`micro_batch_sizes`)."""
    return bool(options.num_micro_batches) or (options.micro_batch_size or 1) > 1


def _smaller_micro_batch(options) -> list[str]:
    """The pin that gives smaller micro-batches, where the search has not
    tried them (:func:`_micro_batch_size_can_drop`): more micro-batches
    where their count is pinned (the size follows from it), else a smaller
    size."""
    if not _micro_batch_size_can_drop(options):
        return []
    if options.num_micro_batches and not options.micro_batch_size:
        return [f"raise --num-micro-batches (pinned to {options.num_micro_batches}; smaller micro-batches)"]
    return ["lower --micro-batch-size"]


def _either(fixes: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + " or " + fixes[-1]


#: host-memory flags each host schedule refuses, searched alone (it keeps that state on the host already)
_HOST_SCHEDULE_REFUSES = {"roundpipe": {"--optimizer-offload", "--activation-offload", "--stream-weights"},
                          "mobius": {"--optimizer-offload", "--stream-weights"}}


def _host_flags(job: Job, schedules=()) -> str:
    """The flags that keep state in host memory the job does not use yet and
    may add (activations on the host and streamed weights exclude each
    other; a host schedule searched alone refuses those it covers,
    :data:`_HOST_SCHEDULE_REFUSES`), as a hint ("add --optimizer-offload
    or --activation-offload"), or ""."""
    refused = _HOST_SCHEDULE_REFUSES.get(schedules[0], set()) if len(schedules) == 1 else set()
    unused = [flag for flag, on in (("--optimizer-offload", job.optimizer_offload),
                                    ("--activation-offload", job.activation_offload or job.weight_streaming),
                                    ("--stream-weights", job.weight_streaming or job.activation_offload))
              if not on and flag not in refused]
    return "add " + " or ".join(unused) + " (this cluster has host memory)" if unused and len(unused) == 3 else (
        "add " + " or ".join(unused) if unused else "")


def _pp_can_rise(options, cluster: Cluster, num_layers: int, tp: int) -> bool:
    """Whether a pipeline longer than the pinned ``--pp`` has room: fewer
    stages than layers and devices for one more stage of ``tp`` per replica."""
    return options.pp < num_layers and (options.pp + 1) * (options.dp or 1) * tp <= cluster.num_devices


def _pinned_share_hint(variants, job: Job, usable_bytes: float, options, cluster: Cluster, offload: str) -> str:
    """With ``--pp`` pinned: when even an even split leaves each device more
    of the weights and optimizer state than it holds (the least over the
    variants searched of a stage's share, ``P / pp`` of a tp shard's ``P``
    bytes per device at the state's floor), the line that says so and
    which pins or flags to change; else "". No micro-batch size fits
    there: activations only add to it."""
    if options is None or not options.pp or options.split:
        return ""
    if job.optimizer_offload or job.weight_streaming:
        return ""  # the state lives on the host: the device's share is not this
    floor = param_state_of(job).floor_bytes_per_param()
    each = min(sum(lay.param_bytes for lay in v.profile.layers) / v.profile.bytes_per_param * floor / options.pp
               for v in variants)
    if each <= usable_bytes:
        return ""
    tp = max(v.tp for v in variants)
    need, usable = format_gib_pair(each, usable_bytes)
    fixes = (["raise --pp"] * _pp_can_rise(options, cluster, variants[0].profile.num_layers, tp)
             + ["raise --tp"] * (tp < max(g.devices_per_node for g in cluster.groups))
             + ["shard the optimizer state over the data-parallel replicas (--sharding zero1 or zero3)"]
             * (param_state_of(job).stage < 3 and 2 * options.pp <= cluster.num_devices and options.dp != 1)
             + [offload.removesuffix(", or ")] * bool(offload))
    return (f"with --pp {options.pp} and tp {tp}, each device holds at least {need} of the model's weights and "
            f"optimizer state (an even split) against {usable} usable; "
            + (_either(fixes) if fixes else "use a cluster with larger devices"))


def infeasible_message(counts: Counter, variants, cluster: Cluster, job: Job, options=None,
                       host_full: bool = False) -> str:
    """The no-plan line: the counts by reason and the likely fix (``host_full``:
    the host memory is what the offloading plans overflowed, so no flag that
    keeps more there is suggested)."""
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no points"
    prof = variants[0].profile
    params = sum(lay.param_bytes for lay in prof.layers) / prof.bytes_per_param
    state = params * (0.0 if job.weight_streaming else  # streamed: the state lives on the host
                      offload_bytes_per_param(param_state_of(job), cluster.num_devices)[0] if job.optimizer_offload
                      else param_state_of(job).floor_bytes_per_param())
    mem = usable_memory_bytes(job, float(memory_bytes_of(cluster).max()))
    on_host = options is not None and set(options.schedules) <= {"mobius", "roundpipe"}  # the state lives on the host
    host_flags = (_host_flags(job, options.schedules)
                  if options is not None and cluster.host is not None and not host_full else "")
    offload = ("" if cluster.host is None or job.weight_streaming else
               "add --optimizer-offload (this cluster has host memory), or " if not job.optimizer_offload else
               "add --stream-weights (weights and gradients on the host, streamed layer by layer), or ")
    kept = ("weights and gradients (the optimizer state offloaded)" if job.optimizer_offload else
            "weights and optimizer state")
    need, usable = format_gib_pair(state, mem * cluster.num_devices)
    hint = (f"the model's {kept} alone need {need} against {usable} usable on all "
            f"{cluster.num_devices} devices ({mem / 2**30:.1f} GiB each); {offload}"
            "use a cluster with more or larger devices" if state > mem * cluster.num_devices and not on_host else
            "the schedules asked for refused every point (1F1B and its variants need at least pp "
            "micro-batches, interleaved 1F1B a multiple of pp; pp x vp stages need a layer each): lower --pp "
            "or --vp, "
            + (f"change --num-micro-batches (pinned to {options.num_micro_batches}) to at least pp, a multiple of "
               "it for interleaved 1F1B, or "
               if options is not None and options.num_micro_batches else
               "raise --num-micro-batches (or lower --micro-batch-size), or ")
            + ("drop --vp" if options is not None and options.vp_pinned else "add --schedule gpipe")
            if (counts.get("schedule_refused") or counts.get("too_many_stages")) and not counts.get("out_of_memory")
            else
            _either(_smaller_micro_batch(options)
                    + [f"raise --pp (pinned to {options.pp})"] * bool(options.pp and not options.split and _pp_can_rise(
                        options, cluster, prof.num_layers, min(v.tp for v in variants)))
                    + [host_flags] * bool(host_flags)
                    + ["drop --split (or pin smaller stages)"] * bool(options.split)
                    + ["use a larger cluster"])
            if options is not None  # only what the search could not try (it tried every unpinned pp and size)
            else
            "lower --micro-batch-size, raise --pp, or use a larger cluster")
    idle = [g for g in cluster.groups if usable_memory_bytes(job, float(g.device.memory_bytes)) <= 0]
    if idle and counts.get("out_of_memory"):  # types of a mixed cluster the reserve leaves nothing of (as warned)
        usable = cluster.num_devices - sum(g.num_devices for g in idle)
        names = ", ".join(sorted({g.device.name for g in idle}))
        hint = (f"--memory-reserve and --memory-headroom leave nothing of {names}'s memory, so only {usable} of the "
                f"{cluster.num_devices} devices can hold a stage; lower them, or drop the pins that need more devices "
                f"than {usable}")
    pinned = _pinned_share_hint(variants, job, mem, options, cluster, offload) if counts.get("out_of_memory") and (
        state <= mem * cluster.num_devices) else ""  # (else the cluster holds too little whatever the pins)
    if pinned:
        hint = pinned
    if job.optimizer_offload and not on_host and cluster.host is not None and counts.get("out_of_memory"):
        host_need = params * offload_bytes_per_param(param_state_of(job), 1)[1]  # the state's one copy, sharded or not
        host_total = cluster.num_nodes * cluster.host.memory_bytes
        if host_need > host_total:
            need, held = format_gib_pair(host_need, host_total)
            hint = (f"--optimizer-offload keeps the optimizer state in host memory, {need} at the least, against "
                    f"{held} on the cluster's {cluster.num_nodes} node{'s' if cluster.num_nodes > 1 else ''}; use "
                    "hosts with more memory ([host] memory_GB), more nodes, or a smaller optimizer state "
                    "(--optimizer-state)")
    if counts.get("too_many_micro_batches") and len(counts) == 1:
        hint = (f"every point needs more than {MAX_MICRO_BATCHES:,} micro-batches per replica; raise "
                "--micro-batch-size or --dp")
    elif counts.get("too_many_micro_batches") and counts.get("out_of_memory"):
        # small micro-batches are too many, larger ones (the divisors of the batch) do not fit
        hint = (f"the micro-batch sizes that divide the global batch {job.global_batch_size:,} either need more than "
                f"{MAX_MICRO_BATCHES:,} micro-batches per replica or do not fit; choose a global batch with more "
                "divisors (e.g. a multiple of a power of two), or use a larger cluster")
    if counts.get(STOPPED):
        hint = (f"{counts[STOPPED]} points are not proven out of memory: their split search stopped at its work "
                f"limits before it met a split that fits every GPU; pin one with --split, or {hint}")
    if on_host and cluster.host is not None:
        # Mobius / RoundPipe's host copy of every parameter (a layer table of tp > 1 holds one device's shard): every
        # split keeps at least this on the hosts, so no split, pin or activation flag fits more than they hold
        host_need = min(params * v.tp for v in variants) * (2.0 + offload_bytes_per_param(param_state_of(job), 1)[1])
        host_total = cluster.num_nodes * cluster.host.memory_bytes
        if host_need > host_total:
            need, held = format_gib_pair(host_need, host_total)
            hint = (f"{' and '.join(options.schedules)} keep{'s' if len(options.schedules) == 1 else ''} the model's "
                    f"16-bit weights and optimizer state in host memory, {need} at the least, "
                    f"against {held} on the cluster's {cluster.num_nodes} "
                    f"node{'s' if cluster.num_nodes > 1 else ''}; use hosts with more memory ([host] memory_GB), more "
                    f"nodes, or another schedule")
    if counts.get("one_replica") and options is not None and options.min_dp > 1:
        others = set(counts) - {"one_replica", "pruned", "batch_not_divisible"}  # what else left no plan
        hint = ("the optimizer state is sharded over data-parallel replicas (--sharding / --zero1), so plans of one "
                "replica were not searched: drop that flag to plan them" + (f", or {hint}" if others else ""))
    return f"no plan fits {prof.name} on {cluster.name} ({reasons}); {hint}"
