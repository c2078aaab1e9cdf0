"""Pins and options refused before any search, with the reason."""

from __future__ import annotations



from .errors import InputError
from .pins import split_text
from .placement import num_slots
from .replication import check_replication_job
from .search_options import ALL_SCHEDULES, MULTI_STAGE_SCHEDULES, SearchOptions
from .types import Cluster, Job


def check_options(variants, cluster, job, options):
    if job.global_batch_size < 1:
        raise InputError(f"global batch size {job.global_batch_size} must be >= 1")
    L = variants[0].profile.num_layers
    for variant in variants:
        if not variant.profile.takes_time:
            raise InputError(f"model {variant.profile.name!r}: {variant.profile.NO_TIME}")
    if options.split is not None:
        reps = options.split_replicas
        text = ",".join(f"{x}x{r}" for x, r in zip(options.split, reps)) if reps else ",".join(map(str, options.split))
        if any(x < 1 for x in options.split):
            raise InputError(f"--split {text}: every stage needs >= 1 layer")
        if sum(options.split) != L:
            raise InputError(
                f"--split {text} covers {sum(options.split)} layers, the model has {L}: the counts must sum to {L}")
        n = len(options.split)
        chunked = any(sch in MULTI_STAGE_SCHEDULES for sch in options.schedules) and options.pp and any(
            n == options.pp * v for v in options.vps)
        if options.pp and options.pp != n and not chunked:
            raise InputError(f"--split has {n} stages but --pp is {options.pp} (a split of pp x vp stages needs a "
                             f"multi-stage --schedule and --vp {n // options.pp if n % options.pp == 0 else 'V'})")
    if options.pp is not None:
        if options.pp < 1:
            raise InputError(f"--pp {options.pp} must be >= 1")
        if options.pp > L:
            raise InputError(
                f"--pp {options.pp}: more stages than the model's {L} layer{'s' if L != 1 else ''}; use --pp {L} or fewer")
        if options.vp_pinned and all(options.pp * v > L for v in options.vps):
            v, most = min(options.vps), L // options.pp
            fix = (f"use --vp {most} or lower, or a lower --pp" if most > 1 else
                   f"use --pp {L // v} or lower for --vp {v}" if L // v >= 1 else "use a lower --vp and --pp")
            raise InputError(f"--pp {options.pp} x --vp {v} = {options.pp * v} stages, more than the model's {L} "
                             f"layer{'s' if L != 1 else ''} (each stage holds one); {fix}")
    for name in ("dp", "micro_batch_size", "num_micro_batches"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} {value} must be >= 1")
    tp_min = min(v.tp for v in variants)
    groups = num_slots(cluster, tp_min)  # tensor-parallel groups inside nodes
    # a --split of S stages pins pp = S (vp 1): name the flag the user gave, and its fix
    by_split = bool(options.split) and len(options.split) == options.pp
    pins = ((f"--split of {options.pp} stages (pp {options.pp})", "fewer stages", options.pp) if by_split else
            (f"--pp {options.pp}", "lower --pp", options.pp), (f"--dp {options.dp}", "lower --dp", options.dp))
    # Mobius and RoundPipe run more stages than GPUs as pp x vp, pp the GPUs
    stacked = next((sch for sch in options.schedules if sch in ("mobius", "roundpipe")), None)
    for shown, fix, value in pins:
        if value and value * tp_min > cluster.num_devices:
            gpus = cluster.num_devices // tp_min
            more = (f" ({stacked} runs pp x vp stages on pp GPUs: --pp {gpus} or fewer, and --vp for more stages)"
                    if stacked and shown.startswith("--pp") and gpus >= 1 else "")
            raise InputError(f"{shown}{f' x --tp {tp_min}' if tp_min > 1 else ''} needs {value * tp_min} devices, "
                             f"cluster {cluster.name} has {cluster.num_devices}{more}")
        if value and value > groups:
            raise InputError(f"{shown} needs {value} groups of tp {tp_min} devices inside one node, "
                             f"cluster {cluster.name} holds {groups}; {fix} or --tp")
    if tp_min > cluster.num_devices:
        raise InputError(f"--tp {tp_min} needs {tp_min} devices, cluster {cluster.name} has {cluster.num_devices}")
    if groups == 0:
        widest = max(g.devices_per_node for g in cluster.groups)
        raise InputError(f"--tp {tp_min}: a tensor-parallel group stays inside one node, and the nodes of "
                         f"{cluster.name} hold at most {widest} devices; use --tp {widest} or lower")
    if options.num_micro_batches and options.num_micro_batches > job.global_batch_size:
        raise InputError(f"--num-micro-batches {options.num_micro_batches} is more than the global batch "
                         f"{job.global_batch_size}: every micro-batch needs at least one sample")
    if options.pp and options.dp and options.pp * options.dp * tp_min > cluster.num_devices:
        tp_part = f" x --tp {tp_min}" if tp_min > 1 else ""
        pp_part = f"--split of {options.pp} stages" if by_split else f"--pp {options.pp}"
        raise InputError(
            f"{pp_part} x --dp {options.dp}{tp_part} needs {options.pp * options.dp * tp_min} devices, "
            f"cluster {cluster.name} has {cluster.num_devices}")
    b = job.global_batch_size
    if options.dp and b % options.dp:
        raise InputError(f"global batch size {b} is not divisible by --dp {options.dp}; use a --global-batch-size "
                         f"that --dp divides (e.g. {_multiple(b, options.dp)})")
    per = b // options.dp if options.dp else None
    for flag, value in (("--micro-batch-size", options.micro_batch_size), ("--num-micro-batches",
                                                                            options.num_micro_batches)):
        if per and value and per % value:
            raise InputError(f"per-replica batch {per} (--global-batch-size {b} / --dp {options.dp}) is not divisible "
                             f"by {flag} {value}; use a {flag} that divides {per} or a --global-batch-size of "
                             f"{_multiple(b, options.dp * value)}")
    if options.micro_batch_size and b % options.micro_batch_size:
        raise InputError(f"global batch size {b} is not divisible by --micro-batch-size {options.micro_batch_size}; "
                         f"use a --global-batch-size of {_multiple(b, options.micro_batch_size)}")
    unknown = [s for s in options.schedules if s not in ALL_SCHEDULES]
    if unknown:
        raise InputError(f"unknown schedule {unknown[0]!r}; expected one of {', '.join(ALL_SCHEDULES)}")
    if any(v < 1 for v in options.vps):
        raise InputError(f"--vp {min(options.vps)} must be >= 1")
    if options.pp == 1 and options.schedules and set(options.schedules) == {"interleaved-1f1b"}:
        raise InputError("--pp 1 with --schedule interleaved-1f1b: virtual stages interleave over at least 2 "
                         "pipeline ranks (one rank runs its stages as one); use --pp 2 or more, or --schedule 1f1b")
    if options.split is not None and any(s in MULTI_STAGE_SCHEDULES for s in options.schedules) and not (
            options.pp and any(len(options.split) == options.pp * v for v in options.vps)):
        n = len(options.split)
        if options.split_replicas:  # per-stage replicas run one stage per device
            raise InputError(f"--split with replicas (NxR) and --schedule "
                             f"{next(s for s in options.schedules if s in MULTI_STAGE_SCHEDULES)}: per-stage "
                             "replication runs one stage per device; choose --schedule gpipe, 1f1b or zb-h1")
        here = ", ".join(f"pp {options.pp} x vp {v} = {options.pp * v}" for v in options.vps) if options.pp else ""
        example = f"e.g. --pp {n // 2} --vp 2" if n % 2 == 0 and n >= 4 else ""
        hint = "; ".join(x for x in (f"here {here}" if here else "", example) if x)
        several = [s for s in options.schedules if s in MULTI_STAGE_SCHEDULES]
        if set(several) <= {"mobius", "roundpipe"}:  # they run one stage per rank too (vp 1)
            raise InputError(f"--split of {n} stages with --schedule {' and '.join(several)}: give its stages per "
                             f"rank: --vp 1 for one each (pp {n}), or --pp and --vp with pp x vp = {n}"
                             f"{f' ({example})' if example else ''}")
        raise InputError(f"--split of {n} stages with a multi-stage schedule needs --pp and --vp with pp x vp = "
                         f"{n}{f' ({hint})' if hint else ''}, or --schedule gpipe, 1f1b or zb-h1"
                         + (" without --vp" if options.vp_pinned and 1 not in options.vps else ""))
    if options.replicate_stages or options.split_replicas:
        _check_replication_options(variants, cluster, job, options)


def _check_replication_options(variants, cluster: Cluster, job: Job, options: SearchOptions) -> None:
    """Refuse pins per-stage replication cannot honour: a pinned dp above 1,
    a sharded state, a replicated split whose replicas (tensor-parallel groups
    of the smallest tp) exceed the cluster's or do not match its stages."""
    what = (split_text(options.split or (), options.split_replicas)
            if options.split_replicas else "--replicate-stages")
    if options.dp is not None and options.dp != 1:  # 1: a replicated plan's own (its replicas split each batch)
        raise InputError(f"{what} with dp pinned to {options.dp} (--dp, or --micro-batch-size x "
                         "--num-micro-batches): per-stage replicas replace the data-parallel degree; drop the pin")
    if options.placement_pinned:  # the replicated plans would ignore it (their layout follows their replicas)
        raise InputError(f"{what} with --placement {options.placements[0]}: each replicated stage runs on its own "
                         f"replicas, placed stage after stage, so no pipeline- or data-major layout applies; drop "
                         f"--placement or {what}")
    check_replication_job(job, what)
    if options.vp_pinned and 1 not in options.vps:
        raise InputError(f"{what} with --vp {','.join(map(str, options.vps))}: replicated stages run one stage per "
                         f"device (vp 1); drop --vp or {what}")
    multi = [sch for sch in options.schedules if sch in MULTI_STAGE_SCHEDULES]
    if multi and len(multi) == len(options.schedules):
        raise InputError(f"{what}: replicated stages run one stage per device (gpipe, 1f1b or zb-h1), and "
                         f"--schedule asks for {', '.join(multi)} only; add one of those")
    if options.split_replicas:
        if options.split is None or len(options.split) != len(options.split_replicas):
            raise InputError(f"{what}: give replicas for every stage")
        tp = min(v.tp for v in variants)
        if sum(options.split_replicas) > num_slots(cluster, tp):
            raise InputError(f"{what} needs {sum(options.split_replicas) * tp} devices (the sum of the replicas"
                             f"{'' if tp == 1 else f' x tp {tp}'}, one node per tensor-parallel group), cluster "
                             f"{cluster.name} has {num_slots(cluster, tp) * tp} such; lower the replicas")


def _multiple(n: int, k: int) -> int:
    """The multiple of ``k`` nearest ``n`` from above (a batch size that
    ``k`` divides, for a refusal's fix)."""
    return -(-n // k) * k
