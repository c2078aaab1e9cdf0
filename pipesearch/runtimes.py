"""Which plans each runtime runs as written (``pipesearch plan --runtime``).

A runtime runs a plan *as written* when its exporter
(:mod:`pipesearch.export`) accepts the plan: the same schedule, the same
split, every stage kept. The rules, per runtime (sources in each exporter's
module doc and in docs/exports.md):

==============  ==============================================================
runtime         rules
==============  ==============================================================
``torch``       schedules gpipe, 1f1b, interleaved-1f1b, zb-h1, looped-bfs;
                single-stage classes (gpipe, 1f1b, zb-h1) with vp = 1,
                interleaved 1F1B and looped BFS with vp >= 2; Schedule1F1B
                needs m >= number of stages; interleaved 1F1B / ZB need m a
                multiple of max(1, m // pp) (torch runs interleaved 1F1B with
                m not a multiple of pp, e.g. m = 3 on pp = 2); no empty stage
``torchtitan``  the torch rules (it builds torch's classes) and module names
                of at most ``<container>.<key>``
``megatron``    1f1b with vp = 1, interleaved-1f1b with pp >= 2, vp >= 2 and
                m a multiple of pp; a split that its flags or its layout
                string express (transformer layer tables only)
``deepspeed``   1f1b only (its TrainSchedule), vp = 1, no empty stage
``gpipe``       gpipe only, vp = 1, tp = 1, no empty stage
==============  ==============================================================

:func:`check_pins` refuses pins (schedules, vp, pp, m) a runtime cannot run
before the search, naming the rule and the nearest valid values;
:func:`filter_plans` keeps the plans the runtime's exporter accepts after it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .errors import InputError
from .overlap import NO_OVERLAP, TORCH_DDP_BUCKET_BYTES, CommOverlap
from .types import Plan

RUNTIMES = ("torch", "torchtitan", "megatron", "deepspeed", "gpipe")
"""Values of ``plan --runtime`` (the export formats of the same names)."""

SCHEDULES = {
    "torch": ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs"),
    "torchtitan": ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs"),
    "megatron": ("1f1b", "interleaved-1f1b"),
    "deepspeed": ("1f1b",),
    "gpipe": ("gpipe",),
}
"""Schedules each runtime runs (pipesearch names)."""

STATE_DEFAULTS = {
    "megatron": ("megatron", "zero1"),
    "torchtitan": ("mixed-adam", "fsdp"),
    "deepspeed": ("mixed-adam", "zero1"),
}
"""``(optimizer state preset, sharding)`` a runtime trains with by default in
the configuration pipesearch exports for it, where that differs from
pipesearch's own default (``mixed-adam``, no sharding): Megatron-LM's bf16
weights with fp32 main gradients and its distributed optimizer (the export
writes ``--use-distributed-optimizer``); torchtitan's FSDP2 over the
data-parallel ranks (its ``data_parallel_shard_degree = -1`` default);
DeepSpeed's pipeline engine with ZeRO stage 1 (the export writes
``zero_optimization.stage`` 1: without ZeRO a bf16 pipeline runs DeepSpeed's
BF16_Optimizer, which splits the fp32 state over the replicas anyway, with
an all-gather and bf16 gradient accumulation the plan would not time).
torch.distributed.pipelining as exported keeps the whole state on every
replica."""


OVERLAP_DEFAULTS: dict[str, CommOverlap] = {
    # the flags pipesearch's Megatron-LM export writes: --overlap-grad-reduce
    # --overlap-param-gather (the Megatron-Core performance runs' settings);
    # --tp-comm-overlap needs Transformer Engine's userbuffers: opt in
    "megatron": CommOverlap(grad_reduce=True, param_gather=True),
    # the pipeline_torch.py pipesearch exports all-reduces each stage's gradients after the pipeline's step
    # (--overlap-grad-reduce plans DDP's overlap instead, in 25 MiB buckets, and the export says what to wrap)
    "torch": CommOverlap(bucket_params=TORCH_DDP_BUCKET_BYTES / 2),
    # FSDP2: reduce-scatter per block during the last backward, all-gather
    # prefetched per block in the first forward
    "torchtitan": CommOverlap(grad_reduce=True, param_gather=True, bucket_params=None),
    # the pipeline engine reduces gradients after the last micro-batch
    "deepspeed": NO_OVERLAP,
    "gpipe": NO_OVERLAP,
}
"""Overlap each runtime has with the configuration pipesearch exports for it."""


def runtime_defaults(runtime: str | None):
    """``(CommOverlap, state preset name, sharding)`` of ``runtime``
    (:data:`OVERLAP_DEFAULTS`, :data:`STATE_DEFAULTS`);
    pipesearch's own defaults (no overlap, ``mixed-adam``, no sharding) for
    ``None``. Each can be overridden by its own option."""
    if runtime is None:
        return NO_OVERLAP, "mixed-adam", "none"
    if runtime not in SCHEDULES:
        raise InputError(f"--runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    state, sharding = STATE_DEFAULTS.get(runtime, ("mixed-adam", "none"))
    return OVERLAP_DEFAULTS[runtime], state, sharding


SEARCH_MARGIN = 4
"""The search keeps ``SEARCH_MARGIN`` times ``--top`` configurations, of which
the runtime's plans are kept (1 for :data:`POINT_RULED`)."""

POINT_RULED = ("torch",)
"""Runtimes whose every refusal of a searched plan is a rule of its point
(schedule, pp, vp, micro-batches: :func:`point_refusal`): the search skips
those points, so its top plans are the runtime's and it keeps ``--top``
configurations only (at ``SEARCH_MARGIN`` times as many, the default vgg16
case with ``--runtime torch`` took 8.6 s against 0.7 s and left 51 points
at the split search's work limits)."""


def search_margin(runtime: str | None) -> int:
    """How many times ``--top`` configurations the search keeps for
    ``runtime`` (:data:`SEARCH_MARGIN`, 1 for :data:`POINT_RULED` and no
    runtime)."""
    return 1 if runtime is None or runtime in POINT_RULED else SEARCH_MARGIN


SCHEDULE_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zb-h1": "ScheduleInterleavedZeroBubble",
    "looped-bfs": "ScheduleLoopedBFS",
}
"""pipesearch schedule -> torch.distributed.pipelining class name."""

SINGLE_STAGE_CLASSES = frozenset({"ScheduleGPipe", "Schedule1F1B"})
"""Classes derived from ``PipelineScheduleSingle`` (one stage per rank)."""


def torch_schedule_problem(schedule: str, p: int, v: int, m: int) -> str | None:
    """What torch.distributed.pipelining's schedule class for ``schedule``
    refuses in a point of ``p`` ranks, ``v`` stages per rank and ``m``
    micro-batches (the rule, the numbers and the fix), or None: a single-stage
    class (:data:`SINGLE_STAGE_CLASSES`) with ``v != 1``; interleaved 1F1B
    with ``v < 2``; ZB-H1 (pipesearch's, one stage per rank) with ``v != 1``;
    Schedule1F1B with fewer micro-batches than stages (its ``__init__``); the
    interleaved classes with ``m`` not a multiple of their rounds
    ``max(1, m // p)`` (their ``__init__``)."""
    cls = SCHEDULE_CLASSES[schedule]
    stages = p * v
    if cls in SINGLE_STAGE_CLASSES and v != 1:
        return (f"{cls} (schedule {schedule!r}) runs one stage per rank (a PipelineScheduleSingle), but the plan "
                f"has vp={v} stages per rank; use an interleaved or looped schedule, or vp=1")
    if schedule == "interleaved-1f1b" and v < 2:
        return (f"interleaved 1F1B needs more than one stage per rank (stages_per_rank > 1), the plan has vp={v}; "
                f"use schedule '1f1b' for one stage per rank")
    if schedule == "zb-h1" and v != 1:
        return f"pipesearch's zb-h1 is ZB-H1 with one stage per rank, the plan has vp={v}"
    if cls == "Schedule1F1B" and m < stages:
        return (f"Schedule1F1B needs n_microbatches >= number of stages (its __init__ raises 'Number of "
                f"microbatches ({m}) must be greater than or equal to the number of stages ({stages})'); use "
                f"num_micro_batches >= {stages} or schedule 'gpipe'")
    rounds = max(1, m // p)
    if cls in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble") and m % rounds:
        return (f"{cls} needs n_microbatches={m} to be a multiple of its number of rounds, max(1, n_microbatches "
                f"// pp) = {rounds} (pp={p}); a multiple of pp always is one: use a multiple of {p}")
    return None


def point_refusal(runtime: str | None, schedule: str, pp: int, vp: int, m: int) -> str | None:
    """Why ``runtime`` refuses every plan of a point whatever its split (the
    torch schedule rules for ``torch`` and ``torchtitan``, which builds
    torch's classes: :func:`torch_schedule_problem`), or None."""
    if runtime in ("torch", "torchtitan") and schedule in SCHEDULE_CLASSES:
        return torch_schedule_problem(schedule, pp, vp, m)
    return None


def _multiples(k: int, near: int) -> list[int]:
    """Two multiples of ``k`` around ``near`` (``near`` not a multiple): the
    one below (when positive) and the one above, else the two smallest."""
    below, above = (near // k) * k, (near // k + 1) * k
    return [below, above] if below >= k else [above, above + k]


#: device placements a runtime runs (None: any the search offers): one
#: process drives a torchgpipe / fairscale Pipe replica, so its stages sit on
#: consecutive devices (``pipeline``: one node when pp is at most a node's
#: devices; :func:`pipesearch.placement.pipeline_placement`); torchtitan
#: builds one device mesh with pp outermost, the replicas of a stage on
#: consecutive ranks (``data``). Megatron-LM runs both (its default rank
#: order, or ``--use-tp-pp-dp-mapping``), DeepSpeed both (a
#: ``ProcessTopology``'s axis order), torch.distributed.pipelining any (the
#: export's rank grid) (:func:`pipesearch.export.rank_order`)
PLACEMENTS = {"gpipe": ("pipeline",), "torchtitan": ("data",)}


def placements_for(runtime: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """The placements the search tries for ``runtime`` (``default`` when it
    runs any, :data:`PLACEMENTS`)."""
    return PLACEMENTS.get(runtime or "", default)


def schedules_for(runtime: str, requested: Sequence[str], explicit: bool) -> tuple[str, ...]:
    """The schedules to search for ``runtime``.

    Args:
        runtime: one of :data:`RUNTIMES`.
        requested: the schedules asked for (``--schedule``) or the defaults.
        explicit: whether ``requested`` was given by the user (``--schedule``).

    Returns:
        ``requested`` restricted to the runtime's schedules; with no explicit
        request, all of the runtime's schedules.

    Raises:
        InputError: an explicit request of which the runtime runs none (names
            the schedules it runs).
    """
    if runtime not in SCHEDULES:
        raise InputError(f"--runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    runs = SCHEDULES[runtime]
    if not explicit:
        return runs
    bad = [s for s in requested if s not in runs]
    if bad:
        raise InputError(f"--runtime {runtime}: {runtime} has no {', '.join(repr(s) for s in bad)} schedule; "
                         f"it runs {', '.join(runs)}")
    return tuple(requested)


def check_pins(runtime: str, *, schedules: Sequence[str], pp: int | None, num_micro_batches: int | None,
               tp: int | None) -> None:
    """Refuse pins that ``runtime`` cannot run, before the search.

    Args:
        runtime: one of :data:`RUNTIMES`.
        schedules: the schedules to search (after :func:`schedules_for`).
        pp, num_micro_batches, tp: the pinned degrees (``None``: searched).

    Raises:
        InputError: the rule broken and the nearest valid values, e.g.
            Megatron's interleaved schedule with ``--pp 6 --vp 2
            --num-micro-batches 3``: "m must be a multiple of 6: try 6 or 12".
            Pins are checked only where they decide the question (one
            schedule pinned); other plans are filtered after the search.
    """
    m = num_micro_batches
    if runtime == "gpipe" and tp not in (None, 1):
        raise InputError(f"--runtime gpipe: torchgpipe / fairscale Pipe have no tensor parallelism; "
                         f"--tp {tp} cannot run (use --tp 1)")
    if runtime == "megatron" and schedules == ("interleaved-1f1b",) and pp is not None and pp < 2:
        raise InputError("--runtime megatron: interleaved 1F1B needs pp >= 2 (Megatron runs plain 1F1B on one "
                         "pipeline stage); use --schedule 1f1b or --pp 2 or more")
    if runtime == "megatron" and "interleaved-1f1b" in schedules and schedules == ("interleaved-1f1b",) \
            and pp and m and m % pp:
        try_m = " or ".join(map(str, _multiples(pp, m)))
        raise InputError(
            f"--runtime megatron: with the interleaved schedule the number of micro-batches must be a multiple of "
            f"the pipeline size (Megatron-LM schedules.py: 'number of microbatches is not divisible by "
            f"pipeline-model-parallel-size'): m must be a multiple of {pp}: try --num-micro-batches {try_m}"
        )
    if runtime in ("torch", "torchtitan") and schedules == ("interleaved-1f1b",) and pp and m and m % pp:
        try_m = " or ".join(map(str, _multiples(pp, m)))
        raise InputError(
            f"--runtime {runtime}: torch's ScheduleInterleaved1F1B would run {m} micro-batches on pp {pp}, but "
            f"pipesearch's interleaved 1F1B order (the one it simulates and exports) needs the number of "
            f"micro-batches to be a multiple of the pipeline size: m must be a multiple of {pp}: try "
            f"--num-micro-batches {try_m}"
        )
    if runtime in ("torch", "torchtitan") and schedules == ("1f1b",) and pp and m and m < pp:
        raise InputError(
            f"--runtime {runtime}: Schedule1F1B needs at least as many micro-batches as stages ('Number of "
            f"microbatches ({m}) must be greater than or equal to the number of stages ({pp})'): try "
            f"--num-micro-batches {pp}, or --schedule gpipe"
        )


#: overlap each runtime can run: option -> runtimes that have it
OVERLAP_SUPPORT = {
    "grad_reduce": ("megatron", "torch", "torchtitan"),
    "param_gather": ("megatron", "torchtitan"),
    "tp_forward": ("megatron", "torchtitan"),
}
OVERLAP_FLAGS = {"grad_reduce": "--overlap-grad-reduce", "param_gather": "--overlap-param-gather",
                 "tp_forward": "--tp-comm-overlap"}
_NO_OVERLAP_REASON = {
    "deepspeed": "its pipeline engine reduces the gradients after the last micro-batch",
    "gpipe": "torchgpipe / fairscale Pipe synchronise gradients after the pipeline",
    "torch": "torch.distributed.pipelining with DDP keeps whole weights and has no asynchronous tensor parallelism",
}


#: shardings each runtime's export runs as planned
SHARDING_SUPPORT = {
    "megatron": ("none", "zero1"),        # --use-distributed-optimizer is ZeRO-1
    "torchtitan": ("none", "zero3", "fsdp"),  # FSDP2 only
    "deepspeed": ("none", "zero1"),       # the pipeline engine: ZeRO stage 0 or 1
    "torch": ("none",),                   # the exported script replicates with DDP
    "gpipe": ("none",),
}


def megatron_overlap_refusal(param_gather: bool, grad_reduce: bool, tp_forward: bool,
                             sequence_parallel: bool) -> str | None:
    """Why Megatron-LM's ``validate_args`` refuses this communication overlap
    (the parameter gather overlapped without the gradient reduce;
    ``--tp-comm-overlap`` without sequence parallelism), with the fix; None
    when it runs. ``tp_forward`` counts only with tensor parallelism."""
    if param_gather and not grad_reduce:
        return ("--overlap-param-gather needs --overlap-grad-reduce (Megatron-LM's validate_args); add "
                "--no-overlap-param-gather or keep the gradient reduce overlapped")
    if tp_forward and not sequence_parallel:
        return ("--tp-comm-overlap needs sequence parallelism (Megatron-LM's validate_args); drop "
                "--no-sequence-parallel or --tp-comm-overlap")
    return None


def check_runtime_settings(runtime: str | None, overlap, sharding: str = "none", sequence_parallel: bool = True) -> None:
    """Refuse, before the search, communication overlap and sharding that
    ``runtime`` does not run as planned (:data:`OVERLAP_SUPPORT`,
    :data:`SHARDING_SUPPORT`; torchtitan's tensor-parallel overlap is its
    asynchronous tensor parallelism, Megatron-LM's ``--tp-comm-overlap``),
    and Megatron-LM's own rules (``validate_args``): the parameter gather
    overlapped only with the gradient reduce, ``--tp-comm-overlap`` only with
    sequence parallelism, buckets sized in parameters.

    Raises:
        InputError: names the option, the runtime and why.
    """
    if runtime is None:
        return
    for key, runs in OVERLAP_SUPPORT.items():
        if getattr(overlap, key) and runtime not in runs:
            raise InputError(f"--runtime {runtime} with {OVERLAP_FLAGS[key]}: {runtime} cannot overlap it "
                             f"({_NO_OVERLAP_REASON.get(runtime, 'not supported')}); drop the option or choose "
                             f"--runtime {' / '.join(runs)}")
    if sharding not in SHARDING_SUPPORT[runtime]:
        raise InputError(f"--runtime {runtime} with --sharding {sharding}: {runtime} runs "
                         f"{' / '.join(SHARDING_SUPPORT[runtime])} as planned; choose one of those")
    if runtime == "megatron":
        refusal = megatron_overlap_refusal(overlap.param_gather, overlap.grad_reduce, overlap.tp_forward,
                                           sequence_parallel)
        if refusal:
            raise InputError(f"--runtime megatron: {refusal}")
        if overlap.grad_reduce and overlap.bucket_params is None:
            raise InputError("--runtime megatron: --grad-bucket-params layer: Megatron-LM sizes its gradient "
                             "buckets in parameters (--ddp-bucket-size); give a number, e.g. 40000000")


def filter_plans(runtime: str, plans: Sequence[Plan], top: int,
                 inputs: Mapping | None = None) -> tuple[tuple[Plan, ...], dict[str, int]]:
    """The plans ``runtime`` runs as written, re-ranked from 1.

    Args:
        runtime: one of :data:`RUNTIMES`.
        plans: ranked plans (best first).
        top: how many to keep.
        inputs: the plan file's inputs (passed to the exporter).

    Returns:
        ``(kept plans, {refusal reason: count})``; the reasons are the
        exporter's messages for the plans left out.
    """
    from .export import export_plan

    kept: list[Plan] = []
    refused: Counter[str] = Counter()
    for plan in plans:
        if len(kept) >= top:
            break
        try:
            export_plan(plan, runtime, inputs=inputs)
        except InputError as exc:
            refused[str(exc)] += 1
            continue
        kept.append(replace(plan, rank=len(kept) + 1))
    return tuple(kept), dict(refused)


def no_plan_message(runtime: str, refused: Mapping[str, int]) -> str:
    """The error when none of the searched plans runs on ``runtime``."""
    if not refused:
        return f"--runtime {runtime}: the search found no feasible plan"
    reason, n = max(refused.items(), key=lambda kv: kv[1])
    return (f"--runtime {runtime}: none of the {sum(refused.values())} best plans runs on {runtime} as written; "
            f"most common reason ({n}): {reason}")
