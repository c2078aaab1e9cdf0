"""``pipesearch plan``: search, rank, print the table, write the plan JSON."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from ..errors import InfeasibleError, InputError
from ..hardware import describe_cluster, input_name_warnings
from ..limits import MAX_BUCKET_PARAMS, MAX_COUNT
from ..memory import PRESETS, SHARDINGS, ParamState, from_total_bytes, preset, usable_memory_bytes
from ..models import PER_STAGE, RECOMPUTE_MODES, load_model_source
from .. import runtimes
from ..output import print_whole, write_outputs
from ..output_table import format_table, stage_counts_label
from ..placement import memory_bytes_of, rank_memory
from ..pins import BatchPins, check_fixed_dp_fits, parse_split, resolve_dp
from ..plan import PlanFile, document_problems, points_block, to_json
from ..runtimes import RUNTIMES
from ..search import search
from ..search_options import ALL_SCHEDULES, DEFAULT_SCHEDULES, SearchOptions
from ..search_space import points_frame
from ..types import Job
from ..units import format_bytes, format_seconds, format_size_option, parse_size_option
from .params import FiniteFloatRange
from .plan_checks import (check_host_flags, check_model_flags, check_replica_pins, check_replication_pins,
                          check_roundpipe_pins, checked_cluster, checked_outputs, runtime_schedules, searched_schedules,
                          split_vps)
from . import main

DEFAULT_MODEL = "vgg16"
DEFAULT_CLUSTER = "4x4-v100-10gbe"
DEFAULT_BATCH = 1024


def _split(ctx, param, value):
    """``(layers per stage, replicas per stage or None)`` (:func:`pipesearch.pins.parse_split`)."""
    if value is None:
        return None
    try:
        return parse_split(value)
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None


def _bucket(ctx, param, value):
    if value is None or value.strip().lower() == "layer":
        return value and "layer"
    try:
        n = float(value)
    except ValueError:
        n = float("nan")
    if not (1 <= n <= MAX_BUCKET_PARAMS) or n != int(n):
        raise click.BadParameter(f"{value!r}: expected a whole number of parameters from 1 to {MAX_BUCKET_PARAMS:g} "
                                 f"(e.g. 40000000) or 'layer'")
    return n


def comm_overlap_of(runtime, grad_reduce, param_gather, tp_forward, bucket_params):
    """The :class:`pipesearch.overlap.CommOverlap` the options ask for: the
    ``--runtime``'s defaults (:func:`pipesearch.runtimes.runtime_defaults`),
    each overridden by its own option when given."""
    base = runtimes.runtime_defaults(runtime)[0]
    changes = {k: v for k, v in (("grad_reduce", grad_reduce), ("param_gather", param_gather),
                                 ("tp_forward", tp_forward)) if v is not None}
    if bucket_params is not None:
        changes["bucket_params"] = None if bucket_params == "layer" else bucket_params
    return replace(base, **changes)


def overlap_settings(runtime, grad_reduce, param_gather, tp_forward, bucket_params, param_state, tp,
                     sequence_parallel):
    """:func:`comm_overlap_of`, checked: an explicit option without effect
    is refused (a parameter gather without a sharded optimizer, buckets
    without the overlapped reduce, tensor-parallel overlap with ``--tp 1``),
    a runtime's default parameter gather is dropped when nothing is
    sharded, and the runtime's own rules are applied
    (:func:`pipesearch.runtimes.check_runtime_settings`).

    Raises:
        InputError: the option and why.
    """
    overlap = comm_overlap_of(runtime, grad_reduce, param_gather, tp_forward, bucket_params)
    if param_gather and param_state.stage == 0:
        raise InputError("--overlap-param-gather: without a sharded optimizer there is no parameter all-gather; add "
                         "--sharding zero1 (or zero2 / zero3 / fsdp) or drop it")
    if overlap.param_gather and param_state.stage == 0:  # a runtime's default, with nothing to gather
        overlap = replace(overlap, param_gather=False)
    if bucket_params is not None and not overlap.grad_reduce:
        shown = bucket_params if bucket_params == "layer" else int(bucket_params)
        raise InputError(f"--grad-bucket-params {shown}: buckets size the overlapped gradient reduce; add "
                         f"--overlap-grad-reduce (or a --runtime that overlaps it) or drop it")
    if tp_forward and tp == 1:
        raise InputError("--tp-comm-overlap with --tp 1: there are no tensor-parallel collectives to overlap; "
                         "drop one of them")
    runtimes.check_runtime_settings(runtime, overlap, param_state.sharding, sequence_parallel)
    return overlap


def stage_types_label(stages) -> str:
    """The device type of each stage in stage order, runs of one type as
    their stage range (``0 a100-40gb, 1-4 v100-32gb, 5-7 a100-40gb``), a
    stage whose replicas span types as ``a+b``."""
    runs: list[list] = []
    for k, st in enumerate(stages):
        t = st.device_type.replace(",", "+")
        if runs and runs[-1][0] == t:
            runs[-1][2] = k
        else:
            runs.append([t, k, k])
    return ", ".join(f"{a} {t}" if a == b else f"{a}-{b} {t}" for t, a, b in runs)


def mixed_stage_note(plans) -> list[str]:
    """One line per plan with a stage whose replicas run on several device
    types: every stage's types in order, and what such a stage runs at
    (the table's column, :func:`stage_types_label`, shows them as ``a+b``)."""
    out = []
    for p in plans:
        if any("," in st.device_type for st in p.stages):
            per = " | ".join(st.device_type.replace(",", "+") for st in p.stages)
            out.append(f"plan {p.rank}: its stages run on {per} (a stage of two types runs at its slowest "
                       f"replica's pace and within its smallest one's memory)")
    return out


def tie_note(plans) -> list[str]:
    """One line when the tie rule put a plan above a faster one: the plans
    within :data:`pipesearch.ranking.TIE_REL` of the best time are ranked by
    fewer bytes over PCIe, lower peak memory, less time on links and fewer
    stages (:func:`pipesearch.ranking.rank_plans`)."""
    from ..ranking import TIE_REL

    times = [p.predicted.iteration_time_s for p in plans]
    best = min(times, default=0.0)
    tied = [p.rank for p in plans if p.predicted.iteration_time_s <= best * (1 + TIE_REL)]
    if len(tied) < 2 or times[:len(tied)] == sorted(times[:len(tied)]):
        return []
    return [f"ranks {tied[0]}-{tied[-1]} lie within {100 * TIE_REL:g}% of the best time "
            f"({format_seconds(best)}): among them fewer bytes over PCIe, lower peak memory, less time on links and "
            f"fewer stages rank first"]


def split_notes(plans) -> list[str]:
    """One line per plan whose split the exact search could not prove
    optimal within its work limits: the best time found, the proven lower
    bound and the gap (from the plan's ``split_search`` record). A gap
    within :data:`pipesearch.split_search.EQUAL_TIME_REL` (times equal up to
    rounding) proves the time: what stopped is the tie-break among splits
    of that time (lower peak memory first), and the line says so. And one
    per plan whose device order (a mixed cluster's ``mapping`` record) the
    order search did not prove optimal: its status, orders seen, bound and
    gap."""
    from ..split_search import EQUAL_TIME_REL

    out = []
    for p in plans:
        info = dict(p.extra).get("split_search") or {}
        if info and not info.get("exact", True) and info["gap"] <= EQUAL_TIME_REL:
            out.append(f"plan {p.rank}: iteration time proven optimal ({format_seconds(p.predicted.iteration_time_s)} equals its "
                       f"lower bound), but the search's work limits stopped the tie-break among splits of "
                       f"that time before it saw every one: a split with lower peak memory may exist")
        elif info and not info.get("exact", True):
            out.append(f"plan {p.rank}: split not proven optimal within the search's work limits (best found "
                       f"{format_seconds(p.predicted.iteration_time_s)}, lower bound "
                       f"{format_seconds(info['lower_bound_s'])}, gap {gap_percent(info['gap'])})")
        mapping = _open_mapping(p)
        if mapping:  # the device order of a mixed cluster, not proven
            done, total = mapping.get("orders_evaluated"), mapping.get("orders_total")
            why = (f"every one of its {total} device orders was tried, but the split searches of some stopped at "
                   "their work limits" if done is not None and done == total else
                   f"{done if done is not None else '?'} of {total if total is not None else '?'} device orders "
                   "tried within the search's work limits")
            out.append(f"plan {p.rank}: device order not proven optimal ({why}; lower bound "
                       f"{format_seconds(mapping['best_bound_s'])}, gap {gap_percent(mapping['gap'])})")
    return out


def layout_notes(plans, cluster, pinned: tuple[str, ...] = ()) -> list[str]:
    """One line per ``pp x dp`` of the replicated plans (dp > 1; with
    ``--placement`` a single pipeline too, whose device order is then not
    searched) on a cluster of several groups whose ``pp x dp`` has more
    layouts than the search enumerates
    (:attr:`pipesearch.search_options.SearchOptions.enumerate_layouts_up_to`), or
    whose placement was ``pinned`` (``--placement``): their device layouts
    are the best of the named patterns
    (:func:`pipesearch.placement.placement_candidates`), not of every
    layout (docs/heterogeneous.md). The plans of one ``pp x dp`` share the
    line (``plans 1-5: their devices ...``)."""
    from ..placement import count_layouts

    limit = SearchOptions.enumerate_layouts_up_to
    named = " and ".join(f"{x}-major" for x in pinned) if pinned else "pipeline-major and data-major"
    ranks: dict[tuple[int, int, int], list[int]] = {}
    for p in plans:
        if cluster.is_uniform or p.stage_replicas is not None or (p.dp == 1 and not (pinned and p.pp > 1)):
            continue  # a single pipeline's order is searched whole (mapped) unless --placement pins its pattern
        if p.pp == 1 and p.dp * p.tp == cluster.num_devices:  # one stage on every device: one layout
            continue
        n = count_layouts(cluster, p.pp * p.dp, p.tp)
        if n > limit or pinned:
            ranks.setdefault((p.pp, p.dp, n), []).append(p.rank)
    why = "--placement" if pinned else f"every layout is tried up to {limit}"
    return [f"plan{'s' if len(r) > 1 else ''} {_rank_list(r)}: {'their' if len(r) > 1 else 'its'} devices are the "
            f"best of the named layouts ({named}, fastest or largest devices first, each device type alone), not of "
            f"all {n:,} layouts of pp {pp} x dp {dp} on {cluster.name} ({why}; docs/heterogeneous.md)"
            for (pp, dp, n), r in ranks.items()]


def pinned_placements(placements: tuple[str, ...], runtime: str | None) -> tuple[str, ...]:
    """The placements the search tries: ``--placement`` (in the order given)
    within the ``--runtime``'s (:func:`pipesearch.runtimes.placements_for`),
    else the runtime's (on a cluster of several groups, the pinned patterns
    over its slots, :func:`pipesearch.search_space.placement_names`).

    Raises:
        InputError: a placement the runtime does not run."""
    allowed = runtimes.placements_for(runtime, SearchOptions.placements)
    if not placements:
        return allowed
    refused = [p for p in placements if p not in allowed]
    if refused:
        raise InputError(f"--placement {refused[0]} with --runtime {runtime}: {runtime} runs the "
                         f"{' and '.join(allowed)} placement{'s' if len(allowed) > 1 else ''} only; drop one of them")
    return tuple(dict.fromkeys(placements))


def format_rate(per_s: float) -> str:
    """A rate for the table: one decimal (``1,388.9``), or three
    significant digits below 1 so that a slow plan never reads 0.0
    (``0.0291``)."""
    return f"{per_s:,.1f}" if per_s >= 1 or per_s == 0 else f"{per_s:.3g}"


def gap_percent(gap: float) -> str:
    """A relative gap as a percentage, one decimal, or two significant
    digits below 0.05% so that an open gap never reads 0.0% (``0.25`` ->
    ``25.0%``, ``3.9e-5`` -> ``0.0039%``; 0 -> ``0.0%``)."""
    pct = 100 * gap
    return f"{pct:.2g}%" if 0 < pct < 0.05 else f"{pct:.1f}%"


def usable_memory_line(cluster, job) -> str:
    """What the table's capacity column means: the memory a plan may fill on
    each device type (:func:`pipesearch.memory.usable_memory_bytes`, net of
    ``--memory-headroom`` and ``--memory-reserve``) against the device's."""
    kinds = {g.device.name: g.device.memory_bytes for g in cluster.groups}
    parts = ", ".join(f"{format_bytes(max(usable_memory_bytes(job, b), 0.0))} of {format_bytes(b)} on {name}"
                      for name, b in kinds.items())
    return (f"peak memory is checked against the usable memory: {parts} (--memory-headroom "
            f"{job.memory_headroom_fraction:g}, --memory-reserve {format_size_option(job.memory_reserve_bytes)})")


def search_summary_line(result) -> str:
    """The search's points: how many, how many gave a plan, and the others
    by the reason they gave none (``result.infeasible``; each point counted
    once)."""
    planned = sum(1 for status in result.point_columns.get("status", ()) if status == "ok")
    total = planned + sum(v for _, v in result.infeasible)
    skipped = ", ".join(f"{k} {v}" for k, v in result.infeasible) or "none"
    return (f"{total:,} point{'' if total == 1 else 's'} searched in {result.wall_s:.2f} s: {planned} with a plan; "
            f"skipped: {skipped}")


def delayed_step_note(plans, delayed: bool) -> list[str]:
    """With --delayed-optimizer-step, a line naming the plans that keep every
    stage's optimizer step on the GPUs (no stage offloads it, no host
    schedule), where the flag delays nothing; empty otherwise."""
    kept = [str(p.rank) for p in plans if p.schedule not in ("mobius", "roundpipe")
            and not any(st.host_step_s > 0 for st in p.stages)] if delayed else []
    if not kept:
        return []
    many = len(kept) > 1
    return [f"--delayed-optimizer-step: plan{'s' if many else ''} {', '.join(kept)} keep{'' if many else 's'} every "
            f"stage's optimizer on the GPU{'s' if many else ''} (no stage offloads it: it fits), so "
            f"{'their' if many else 'its'} step is not delayed"]


def unproven_note(result) -> list[str]:
    """A line when the ranking is not proven over the whole space: points
    outside the table stopped at the split search's work limits with a
    lower bound below some ranked plan's time (a faster plan may be among
    them), or a ranked plan whose own split or device-order search stopped
    with a bound below the time of a plan ranked above it (its family may
    hold a split or order that passes those plans: they and it may move). Says which ranks hold
    over the whole space and which only over the points searched to the end
    (nothing when none is open)."""
    times = {p.rank: p.predicted.iteration_time_s for p in result.plans}
    open_: set[int] = set()
    causes = []
    if result.unproven_points:
        n, bound = result.unproven_points, result.unproven_bound_s
        hit = {r for r, t in times.items() if t > bound}
        if hit:
            open_ |= hit
            causes.append(f"{n} point{'s' if n > 1 else ''} outside the table stopped at the split search's work "
                          f"limits, the least lower bound {format_seconds(bound)}")
    inside = []
    for p in result.plans:
        hit = {r for r, t in times.items() if r < p.rank and t > _own_bound_s(p)}
        if hit:
            open_ |= hit | {p.rank}
            inside.append(p.rank)
    if inside:
        causes.append(f"plan{'s' if len(inside) > 1 else ''} {_rank_list(inside)}'s split or device-order search "
                      f"stopped with a lower bound below the time of a plan ranked above it")
    if not open_:
        return []
    held = sorted(set(times) - open_)
    shown = sorted(open_)
    return ["; ".join(causes) + ": "
            + (f"{_ranks(held)} hold{'s' if len(held) == 1 else ''} over the whole space, " if held else "")
            + f"{_ranks(shown)} over the points searched to the end (a faster plan may exist among those)"]


def _own_bound_s(plan) -> float:
    """The least time a ranked plan's own point may still reach: the lower
    bound of its split search when that stopped at its work limits, and of
    its device-order search (a mixed cluster's ``mapping``) when that did
    not prove its order; inf when both are proven."""
    split, mapping = dict(plan.extra or ()).get("split_search") or {}, _open_mapping(plan)
    bounds = [float(split["lower_bound_s"])] if not split.get("exact", True) else []
    if mapping:
        bounds.append(float(mapping["best_bound_s"]))
    return min(bounds, default=math.inf)


def _open_mapping(plan) -> dict | None:
    """The plan's ``mapping`` record (a mixed cluster's device-order
    search) when the order search did not prove its order; else None."""
    mapping = dict(plan.extra or ()).get("mapping") or {}
    return mapping if mapping.get("status") not in (None, "OPTIMAL") else None


def _rank_list(ranks: list[int]) -> str:
    """``1``, ``1-3``, ``1, 4-5``: sorted ranks as runs."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _ranks(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 1-3``, ``ranks 1, 4-5``."""
    return f"rank{'s' if len(ranks) > 1 else ''} {_rank_list(ranks)}"


def _recompute_label(plan) -> str:
    """The plan's recompute mode, or each stage's when the search chose it
    per stage (memory options ``none`` / ``selective`` / ``full``, ``+offload`` aside)."""
    per_stage = [st.memory_option.split("+")[0] for st in plan.stages]
    if any(x in ("none", "selective", "full") for x in per_stage):
        return ",".join(per_stage)
    return dict(plan.extra).get("recompute", "none")


def _fullest_device(plan, capacity_of) -> tuple[float, float]:
    """``(peak, capacity)`` bytes of the plan's device nearest its own
    memory (the largest peak / capacity; on one device type the largest
    peak): each pipeline rank's stages' parts of its peak
    (:attr:`StagePlan.memory_bytes`) added up, against the smallest memory
    among their devices (``capacity_of``: bytes per device id). Mobius
    and RoundPipe plans, whose stages come and go, give their recorded peak."""
    if capacity_of is None or plan.schedule in ("mobius", "roundpipe"):
        return plan.predicted.peak_memory_bytes, plan.predicted.memory_capacity_bytes
    mem, cap = rank_memory(plan.stages, plan.pp, capacity_of)
    r = int((mem / cap).argmax())
    return float(mem[r]), float(cap[r])


def plans_table(plans, capacity_of=None, mixed_cluster: bool = False) -> str:
    """The ranked plans as a fixed-width text table
    (:func:`pipesearch.output_table.format_table`); ``capacity_of``: the
    cluster's memory bytes per device id, so that the memory column shows
    the device nearest its own capacity (:func:`_fullest_device`);
    ``mixed_cluster``: the cluster has several device types, so the stages'
    types are listed (:func:`stage_types_label`) even where a plan uses one."""
    rows = []
    for p in plans:
        peak, capacity = _fullest_device(p, capacity_of)
        layers = stage_counts_label(p.layers_per_stage)  # every stage: a truncated split cannot be checked
        rows.append({
            "rank": p.rank,
            "pp x dp x tp": f"{p.pp} x {p.dp} x {p.tp}",
            "schedule": p.schedule + (f" v{p.vp}" if p.vp > 1 else ""),
            "recompute": _recompute_label(p),
            "mbs x m": f"{p.micro_batch_size} x {p.num_micro_batches}",
            "layers/stage": layers,
            "iteration": format_seconds(p.predicted.iteration_time_s),
            "samples/s": format_rate(p.predicted.samples_per_s),
            "bubble": f"{100 * p.predicted.bubble_fraction:.1f}%",
            "peak memory / capacity": f"{format_bytes(peak)} / {format_bytes(capacity)}",
        })
        if p.predicted.tokens_per_s is not None:
            rows[-1]["tokens/s"] = f"{p.predicted.tokens_per_s:,.0f}"
            rows[-1]["tokens/s/device"] = f"{p.predicted.tokens_per_s_per_device:,.0f}"
        if p.predicted.mfu is not None:
            rows[-1]["MFU"] = f"{100 * p.predicted.mfu:.1f}%"
    names = list(dict.fromkeys(k for row in rows for k in row))  # every key, in order of first appearance
    columns = [(k, [row.get(k) for row in rows]) for k in names]
    replicas = [p.stage_replicas for p in plans]
    if any(r is not None for r in replicas):  # per-stage replication: replicas of each stage
        columns.insert(2, ("replicas", [",".join(map(str, r)) if r is not None else f"{p.dp} each"
                                        for r, p in zip(replicas, plans)]))
    if mixed_cluster or any(len({t for st in p.stages for t in st.device_type.split(",")}) > 1 for p in plans):
        columns.insert(5, ("device types by stage", [stage_types_label(p.stages) for p in plans]))
    if all(label == "none" for label in dict(columns).get("recompute", [])):
        columns = [(k, v) for k, v in columns if k != "recompute"]
    for word, column in (("offload", "optimizer offload"), ("stream", "weights streamed"),
                         ("act-host", "activations on host")):
        counts = [sum(word in st.memory_option for st in p.stages) for p in plans]
        if any(counts):
            columns.append((column, [f"{n}/{len(p.stages)} stages" for n, p in zip(counts, plans)]))
    hosts = [dict(p.extra).get("host") or {} for p in plans]  # option_search.host_plan_info
    if any(hosts):
        columns.append(("host memory", [format_bytes(h.get("total_host_memory_bytes", 0.0)) for h in hosts]))
        columns.append(("PCIe / iteration", [format_bytes(h.get("total_pcie_bytes_per_iteration", 0.0))
                                             for h in hosts]))
    if any(dict(p.extra).get("optimizer_step") == "delayed" for p in plans):
        columns.append(("optimizer step", ["delayed 1" if dict(p.extra).get("optimizer_step") == "delayed"
                                           else "in step" for p in plans]))
    return format_table(dict(columns))


class _Progress:
    """A click progress bar on stderr, shown only on a TTY, only once the
    search has run for a second, never with --quiet."""

    def __init__(self, quiet: bool):
        self.enabled = not quiet and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.bar = None

    def __call__(self, done: int, total: int):
        if not self.enabled:
            return
        if self.bar is None and time.perf_counter() - self.start > 1.0:
            self.bar = click.progressbar(length=total, label="searching", file=sys.stderr)
            self.bar.__enter__()
        if self.bar is not None:
            self.bar.update(done - self.bar.pos)

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


@main.command("plan")
@click.option("--model", "model", default=DEFAULT_MODEL, show_default=True,
              help="Catalog name (see `pipesearch catalog models`) or a file: profile CSV, PipeDream graph.txt, "
                   "transformer TOML or HuggingFace config.json.")
@click.option("--cluster", "cluster_name", default=DEFAULT_CLUSTER, show_default=True,
              help="Catalog name (see `pipesearch catalog hardware`) or a cluster TOML file.")
@click.option("--nodes", type=click.IntRange(min=1), help="Override the node count of the cluster.")
@click.option("--global-batch-size", "-b", type=click.IntRange(min=1, max=2**31 - 1), default=DEFAULT_BATCH, show_default=True,
              help="Samples per iteration across all data-parallel replicas.")
@click.option("--seq-len", type=click.IntRange(min=1, max=MAX_COUNT), help="Sequence length (transformers; default: the config's).")
@click.option("--decoder-seq-len", type=click.IntRange(min=1, max=MAX_COUNT),
              help="Decoder tokens per sample of an encoder-decoder model (T5; default: the config's "
                   "decoder_seq_len, else --seq-len).")
@click.option("--pp", type=click.IntRange(min=1), help="Pin the pipeline-parallel degree.")
@click.option("--dp", type=click.IntRange(min=1), help="Pin the data-parallel degree.")
@click.option("--tp", type=click.IntRange(min=1), help="Pin the tensor-parallel degree (transformers).")
@click.option("--micro-batch-size", type=click.IntRange(min=1), help="Pin the micro-batch size.")
@click.option("--num-micro-batches", type=click.IntRange(min=1), help="Pin the number of micro-batches per replica.")
@click.option("--schedule", "schedules", multiple=True, type=click.Choice(ALL_SCHEDULES),
              help=f"Schedules to consider (repeatable; default: {', '.join(DEFAULT_SCHEDULES)}).")
@click.option("--vp", "vps", multiple=True, type=click.IntRange(min=1),
              help="Virtual stages per device for interleaved 1F1B, looped BFS, Mobius and RoundPipe (repeatable; "
                   "default: 2, and 1 as well for Mobius and RoundPipe).")
@click.option("--placement", "placements", multiple=True, type=click.Choice(SearchOptions.placements),
              help="Device placements to consider when pp > 1 and dp > 1 (repeatable; default: both, or the "
                   "--runtime's; on a cluster of several groups: every layout, or these patterns only): pipeline "
                   "puts each replica's stages on consecutive devices, data the replicas of each stage.")
@click.option("--recompute", type=click.Choice(RECOMPUTE_MODES + (PER_STAGE,)),
              help="Pin activation recomputation (transformers); per-stage: each stage takes the first of "
                   "none / selective / full that fits (docs/offload.md).")
@click.option("--split", callback=_split,
              help="Score this split (layers per stage, e.g. 5,3,4; with per-stage replicas NxR, e.g. 32x15,8x1: "
                   "32 layers on 15 replicas, then 8 on 1; P*K for K stages of P, as the table writes long "
                   "splits, e.g. 2,1*126,2) instead of searching.")
@click.option("--replicate-stages", is_flag=True,
              help="Also search per-stage data-parallel replication (PipeDream / DAPPLE: each stage on its own "
                   "number of replicas, each one tensor-parallel group, pp 2 to 4 unless --pp pins it); many "
                   "more points: vgg16 on 4x4-v100-10gbe takes about a minute on 2 cores (--pp pins cut it).")
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True, help="Plans to keep.")
@click.option("--memory-reserve", default="1GiB", show_default=True,
              help="Memory kept free on every device (framework, workspace, fragmentation).")
@click.option("--max-search-memory", default="8GiB", show_default=True,
              help="Host memory the search may use; a model whose exact split would need more is refused "
                   "before the search starts.")
@click.option("--memory-headroom", type=FiniteFloatRange(min=0, max=0.9), default=0.05, show_default=True,
              help="Share of each device's memory left unplanned on top of --memory-reserve (fragmentation, "
                   "communication buffers, transient peaks).")
@click.option("--optimizer-state", type=click.Choice(tuple(PRESETS)),
              help="Training state per parameter by component: mixed-adam (2 weights + 2 grads + 4 master + "
                   "8 moments = 16 B, the default), megatron (bf16 weights + fp32 main grads + master + moments "
                   "= 18 B), fp32-adam (16 B).")
@click.option("--sharding", type=click.Choice(SHARDINGS),
              help="Shard the state over data-parallel replicas: zero1 (optimizer states; Megatron's distributed "
                   "optimizer), zero2 (+ gradients), zero3 / fsdp (+ weights). Default none. With pp > 1 a "
                   "stage keeps zero1's memory under zero2 and zero3 (the pipeline defers resharding and the "
                   "gradient reduce to its last micro-batch); with pp 1 they reduce (and zero3 gathers) every "
                   "micro-batch (docs/schedules.md).")
@click.option("--sequence-parallel/--no-sequence-parallel", default=True, show_default=True,
              help="Sequence parallelism with tensor parallelism (transformers, tp > 1).")
@click.option("--optimizer-bytes-per-param", type=FiniteFloatRange(min=4, max=16),
              help="Total bytes of weights + gradients + optimizer state per parameter, 4 to 16: the first 2 "
                   "are fp16 weights, the next 2 their gradients (the data-parallel reduce moves them, at least "
                   "the profile's bytes per parameter), the rest "
                   "optimizer state, which --zero1 shards; for other layouts use --optimizer-state; "
                   "instead of --optimizer-state (default 16 = mixed-adam).")
@click.option("--mapping-time-limit", type=FiniteFloatRange(min=0.01, max=3600), default=0.5, show_default=True,
              help="Mixed clusters with more device orders than the order search splits (24 in bound order with "
                   "one stage per rank, else 100, or all of up to 200): work limit (CP-SAT deterministic seconds) of "
                   "the closed-form order it splits first; the order search's status, bound and gap are in the plan "
                   "JSON and the table's notes.")
@click.option("--zero1", is_flag=True,
              help="Shard the optimizer state across data-parallel replicas (ZeRO stage 1): --sharding zero1.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write the plan JSON here (nothing is written without it).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan JSON to stdout instead of the table.")
@click.option("--all-points", type=click.Path(dir_okay=False, writable=True),
              help="Write the table of the points the search looked at one by one as CSV (with a plan, out "
                   "of memory, refused, pruned by their own bound or split search); points left out a group at a "
                   "time (pruned with their group, batch_not_divisible) are only counted in the summary line. "
                   "Written also when no plan fits.")
@click.option("--exhaustive", is_flag=True,
              help="Evaluate every point, each split search without a cutoff (no pruning by lower bound; a split "
                   "search may still stop at its work limits, and says so: without the cutoff fewer searches "
                   "end proven, so the note under the table can name more unproven points than the default "
                   "search's); for plots of the whole space, not for a better rank 1; about 20 times slower "
                   "(vgg16: 24 s on 2 cores).")
@click.option("--plot-dir", type=click.Path(file_okay=False),
              help="Also draw space.png, pareto.png, stages.png and timeline.png (plan 1) into this directory "
                   "(see `pipesearch plot`); --exhaustive fills the space plot.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary lines.")
@click.option("--optimizer-offload", is_flag=True,
              help="Let stages keep their optimizer state in host memory when it does not fit on the GPU "
                   "(ZeRO-Offload style; needs a cluster with a [host] table, docs/offload.md).")
@click.option("--stream-weights", is_flag=True,
              help="Let stages keep all their training state in host memory and stream each layer's weights "
                   "in while the previous layer computes (needs a cluster with a [host] table, docs/offload.md).")
@click.option("--activation-offload", is_flag=True,
              help="Let stages that do not fit otherwise keep their saved activations (their checkpoints, with "
                   "recompute) in host memory, copied over PCIe after each forward and back before each backward "
                   "(needs a cluster with a [host] table, docs/offload.md).")
@click.option("--delayed-optimizer-step", is_flag=True,
              help="Run the host's optimizer step of each iteration beside the next iteration's compute (one step "
                   "stale weights, RoundPipe / ZeRO-Offload's delayed update); with --optimizer-offload, "
                   "--stream-weights, --schedule mobius or --schedule roundpipe (docs/offload.md).")
@click.option("--runtime", type=click.Choice(RUNTIMES),
              help="Keep only plans this runtime runs as written (its schedules, split, vp and micro-batch rules), "
                   "and take its defaults for the training state and communication overlap (megatron: "
                   "--optimizer-state megatron --sharding zero1, gradient reduce and parameter gather "
                   "overlapped; torchtitan: --sharding fsdp, both overlapped per block; deepspeed: --sharding "
                   "zero1, no overlap; torch: its exported script all-reduces the gradients after the step, no "
                   "overlap (--overlap-grad-reduce plans DDP's); gpipe: no overlap).")
@click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=None,
              help="Data-parallel gradient reduce overlapped with the last backward, in buckets (default: "
                   "the --runtime's, else off).")
@click.option("--overlap-param-gather/--no-overlap-param-gather", default=None,
              help="With a sharded optimizer, the parameter all-gather overlapped with the first forward "
                   "(default: the --runtime's, else off).")
@click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
              help="Forward tensor-parallel collectives under the GEMMs (Megatron-LM --tp-comm-overlap; "
                   "transformers; default off).")
@click.option("--grad-bucket-params", callback=_bucket,
              help="Parameters per gradient bucket of the overlapped reduce, or 'layer' for one bucket per "
                   "layer (default: the --runtime's; 40000000, Megatron-LM's).")
def plan_command(model, cluster_name, nodes, global_batch_size, seq_len, pp, dp, tp, micro_batch_size,
                 num_micro_batches, schedules, vps, recompute, split, top, memory_reserve,
                 max_search_memory, memory_headroom, optimizer_state, sharding, sequence_parallel,
                 optimizer_bytes_per_param, mapping_time_limit, zero1, output, as_json, all_points, exhaustive, quiet,
                 plot_dir, runtime, overlap_grad_reduce, overlap_param_gather, tp_comm_overlap, grad_bucket_params,
                 replicate_stages, optimizer_offload=False, stream_weights=False, delayed_optimizer_step=False,
                 activation_offload=False, placements=(), decoder_seq_len=None):
    """Search pipeline plans for a model on a cluster and rank them.

    \b
    Examples:
      pipesearch plan
      pipesearch plan --model vgg16 --cluster 4x4-v100-10gbe --global-batch-size 1024 --top 5 -o plans.json
      pipesearch plan --model gnmt --cluster 1x4-v100-pcie --pp 4 --schedule 1f1b
      pipesearch plan --model resnet50 --cluster 1x4-v100-pcie --pp 2 --split 20,20
      pipesearch plan --model vgg16 --split 18x12,22x4 --schedule gpipe
      pipesearch plan --model vgg16 --replicate-stages --pp 2
      pipesearch plan --model gpt3-1.3b --cluster 2x8-a100-80gb -b 512 --json
      pipesearch plan --model llama3-70b --cluster 4x8-h100 -b 256 --optimizer-state megatron --sharding zero1
    """
    # a value repeated in a repeatable option is one pin (the plan file records each once)
    schedules, vps, placements = (tuple(dict.fromkeys(x)) for x in (schedules, vps, placements))
    # every output is checked before the search, so a bad path costs nothing and leaves nothing
    out, plot_dir = checked_outputs(output, all_points, plot_dir, model, cluster_name)
    reserve = parse_size_option("--memory-reserve", memory_reserve)
    search_budget = parse_size_option("--max-search-memory", max_search_memory)
    if optimizer_bytes_per_param is not None and not math.isfinite(optimizer_bytes_per_param):
        raise InputError(f"--optimizer-bytes-per-param {optimizer_bytes_per_param}: expected a finite number")
    asked_sharding = sharding  # before a runtime's default
    if optimizer_bytes_per_param is None and not zero1:  # the runtime's state, where none is asked for
        _, state_default, sharding_default = runtimes.runtime_defaults(runtime)
        optimizer_state = optimizer_state or (state_default if state_default != "mixed-adam" else None)
        sharding = sharding or (sharding_default if sharding_default != "none" else None)
    param_state = _param_state(optimizer_state, sharding, optimizer_bytes_per_param, zero1)
    comm_overlap = overlap_settings(runtime, overlap_grad_reduce, overlap_param_gather, tp_comm_overlap,
                                    grad_bucket_params, param_state, tp, sequence_parallel)
    host_flags = (("--optimizer-offload", optimizer_offload), ("--stream-weights", stream_weights),
                  ("--activation-offload", activation_offload))
    cluster = checked_cluster(cluster_name, nodes, mapping_time_limit, memory_reserve, reserve, memory_headroom,
                              host_flags)
    if runtime in ("gpipe", "torch") and tp is None:
        # torchgpipe / fairscale Pipe have no tensor parallelism; the torch export's script has none either (a
        # pinned --tp above 1 is planned, and its export says what to apply by hand)
        tp = 1
    source = load_model_source(model, cluster, tp=tp, recompute=recompute, seq_len=seq_len,
                               decoder_seq_len=decoder_seq_len,
                               max_search_memory_bytes=search_budget, sequence_parallel=sequence_parallel,
                               overlap_tp_forward=comm_overlap.tp_forward)
    check_model_flags(source, model, runtime, tp, tp_comm_overlap, sequence_parallel)
    job = Job(global_batch_size=global_batch_size, state_bytes_per_param=param_state.total_bytes,
              memory_reserve_bytes=reserve, zero1=param_state.stage >= 1, param_state=param_state,
              memory_headroom_fraction=memory_headroom, comm_overlap=comm_overlap if comm_overlap.any else None,
              optimizer_offload=optimizer_offload, weight_streaming=stream_weights,
              delayed_optimizer_step=delayed_optimizer_step, activation_offload=activation_offload)
    check_host_flags(cluster, schedules, vps, recompute, optimizer_offload=optimizer_offload,
                     stream_weights=stream_weights, activation_offload=activation_offload,
                     delayed_optimizer_step=delayed_optimizer_step)
    if "roundpipe" in (schedules or ()):
        check_roundpipe_pins(cluster, runtime, pp=pp, tp=tp, dp=dp, recompute=recompute,
                             optimizer_offload=optimizer_offload, stream_weights=stream_weights,
                             activation_offload=activation_offload, optimizer_state=optimizer_state,
                             sharding=sharding, zero1=zero1, optimizer_bytes_per_param=optimizer_bytes_per_param,
                             overlap_grad_reduce=overlap_grad_reduce, tp_comm_overlap=tp_comm_overlap)
    split, split_replicas = split if split else (None, None)
    check_replication_pins(split, split_replicas, runtime, replicate_stages, dp, pp, vps, schedules)
    explicit_schedules = schedules
    schedules = searched_schedules(schedules, split, split_replicas, vps, pp, replicate_stages=replicate_stages,
                                   optimizer_offload=optimizer_offload)
    if runtime:  # the runtime's own rules first: their message names the runtime's fix
        schedules = runtime_schedules(runtime, source, schedules, explicit_schedules, split, vps, pp=pp,
                                      num_micro_batches=num_micro_batches, tp=tp)
    typed_dp = dp
    dp = resolve_dp(BatchPins(global_batch_size, dp, micro_batch_size, num_micro_batches), cluster.num_devices)
    pinned_pp = pp or (len(split) if split else None)
    if typed_dp is None and dp is not None:
        check_fixed_dp_fits(cluster, global_batch_size, micro_batch_size, num_micro_batches, dp, pinned_pp, tp)
    check_replica_pins(cluster, dp, pinned_pp, tp, placements, replicate_stages=replicate_stages,
                       split_replicas=split_replicas, sharding=asked_sharding, zero1=zero1,
                       overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=overlap_param_gather)
    sharded = asked_sharding not in (None, "none") or zero1  # asked for: plans of one replica would not honour it
    options = SearchOptions(pp=pinned_pp, dp=dp, micro_batch_size=micro_batch_size,
                            num_micro_batches=num_micro_batches, schedules=tuple(schedules),
                            vps=tuple(vps) or split_vps(split, pp),
                            vp_pinned=bool(vps),
                            split=split, top=top * runtimes.search_margin(runtime), runtime=runtime,
                            exhaustive=exhaustive, mapping_time_limit_s=mapping_time_limit,
                            replicate_stages=replicate_stages, split_replicas=split_replicas,
                            placements=pinned_placements(placements, runtime),
                            placement_pinned=bool(placements), min_dp=2 if sharded else 1)
    result = _searched(source, cluster, job, options, all_points, quiet or as_json)
    for warning in source.info.get("warnings", ()):  # after the search: a refusal stays one line
        click.echo(f"warning: {warning}", err=True)
    for note in input_name_warnings(model, cluster_name):
        click.echo(f"warning: {note}", err=True)
    plan_file = _plan_file(source, cluster, job, param_state, comm_overlap, options, result,
                           sequence_parallel=sequence_parallel)
    if runtime:
        kept, refused = runtimes.filter_plans(runtime, result.plans, top, plan_file.inputs)
        if not kept:
            raise InputError(runtimes.no_plan_message(runtime, refused))
        result = replace(result, plans=kept)
        plan_file = replace(plan_file, plans=kept, inputs=plan_file.inputs | {"runtime": runtime})
    text = ""
    if as_json or out or plot_dir:  # only a plan file that goes out is built and checked
        plan_file, text = _plan_text(plan_file, result.plans)
    # every file of the command at once, all or none (output.write_outputs), before anything is printed
    outputs = [(out, lambda f: f.write_text(text), "plan file")] if out else []
    if all_points is not None:
        outputs.append((all_points, lambda f: result.points.to_csv(f, index=False), "--all-points"))
    figures = _write_files(outputs, plot_dir, text, str(out) if out else "plan JSON")
    if as_json:
        print_whole(text)
        return
    _report(result, source, cluster, job, out, figures, quiet=quiet, recompute=recompute, placements=placements,
            delayed_optimizer_step=delayed_optimizer_step, micro_batch_size=micro_batch_size)


def _searched(source, cluster, job, options, all_points, quiet: bool):
    """:func:`pipesearch.search.search` of the command's variants, with a
    progress line unless ``quiet``. A search that finds no plan raises one
    line with the model's warnings joined and, with ``--all-points``, the
    table of every point looked at written first."""
    progress = _Progress(quiet)
    try:
        return search(list(source.variants), cluster, job, options, profiled_device=source.profiled_device,
                      progress=progress)
    except InfeasibleError as exc:  # a warning that explains the refusal joins its one line
        warned = "; ".join(source.info.get("warnings", ()))
        message = f"{exc}; note: {warned}" if warned else str(exc)
        if all_points is not None and exc.point_columns is not None:  # the table says how far each point was
            write_outputs([(all_points, lambda f: points_frame(exc.point_columns).to_csv(f, index=False),
                            "--all-points")])
            message += f"; {all_points} lists every point looked at with its status"
        raise InfeasibleError(message) from None
    finally:
        progress.close()


def _plan_file(source, cluster, job, param_state, comm_overlap, options, result, *,
               sequence_parallel) -> PlanFile:
    """The plan file of a search: its inputs (model, cluster, job with the
    training state, overlap and flags), the search's bookkeeping and the
    ranked plans."""
    return PlanFile(
        inputs={"model": source.info | {"bytes_per_param": float(source.variants[0].profile.bytes_per_param)},
                "cluster": describe_cluster(cluster) | {"name": cluster.name},
                "job": {"global_batch_size": job.global_batch_size,
                        "state_bytes_per_param": job.state_bytes_per_param,
                        "optimizer_state": {"name": param_state.name, "sharding": param_state.sharding,
                                            "bytes_per_param": {"weights": param_state.weight_bytes,
                                                                "grads": param_state.grad_bytes,
                                                                "main_grads": param_state.main_grad_bytes,
                                                                "master_weights": param_state.master_bytes,
                                                                "optimizer_moments": param_state.moment_bytes}},
                        "memory_reserve_bytes": job.memory_reserve_bytes,
                        "memory_headroom_fraction": job.memory_headroom_fraction, "zero1": job.zero1,
                        **({"optimizer_offload": True} if job.optimizer_offload else {}),
                        **({"weight_streaming": True} if job.weight_streaming else {}),
                        **({"delayed_optimizer_step": True} if job.delayed_optimizer_step else {}),
                        **({"activation_offload": True} if job.activation_offload else {}),
                        "sequence_parallel": sequence_parallel,
                        "comm_overlap": comm_overlap.as_dict(),
                        "schedules": list(options.schedules)},
                "fingerprint": result.fingerprint},
        search={"points_evaluated": result.points_evaluated, "infeasible": dict(result.infeasible),
                "wall_s": round(result.wall_s, 4), "time_model": "simulated",
                **({"unproven_points": {"count": result.unproven_points,
                                        "least_lower_bound_s": result.unproven_bound_s}}
                   if result.unproven_points else {}),
                "points": points_block(result.point_columns)},
        plans=result.plans,
    )


def _report(result, source, cluster, job, out, figures, *, quiet: bool, recompute, placements,
            delayed_optimizer_step: bool, micro_batch_size: int | None) -> None:
    """Print the ranked plans' table and the notes that explain it (ties,
    layouts, unproven splits); unless ``quiet`` also the model and cluster
    line above it and, below it, the usable memory, the profile's device,
    the batch notes, idle devices, the search's summary and what was
    written."""
    if not quiet:
        devices = " + ".join(f"{g.num_devices} x {g.device.name}" for g in cluster.groups)
        seq = f", sequence length {source.info['seq_len']}" if source.info.get("seq_len") else ""
        if source.info.get("decoder_seq_len"):
            seq += f" (decoder {source.info['decoder_seq_len']})"
        desc = source.info.get("layers_description", "")
        layers = f" ({desc}: layers/stage counts all of them)" if "blocks" in desc else ""
        click.echo(f"{source.name}{layers} on {cluster.name} ({devices}), global batch {job.global_batch_size}{seq}")
    click.echo(plans_table(result.plans, memory_bytes_of(cluster), mixed_cluster=not cluster.is_homogeneous))
    for line in (tie_note(result.plans) + mixed_stage_note(result.plans) + split_notes(result.plans)
                 + layout_notes(result.plans, cluster, tuple(dict.fromkeys(placements))) + unproven_note(result)
                 + delayed_step_note(result.plans, delayed_optimizer_step)):
        click.echo(line)
    if not quiet:
        click.echo(usable_memory_line(cluster, job))
        named = source.variants[0].profile.profiled_device  # the header's own words (a warning covers a bad one)
        if source.profiled_device is None and cluster.is_homogeneous and source.info.get("kind") == "profile" \
                and named in (None, "", "unknown"):
            dev = cluster.groups[0].device.name
            click.echo(f"the profile names no device ('# device: unknown'): its times are used as {dev}'s, unscaled; "
                       f"name the device it was measured on to compare clusters of other devices")
        for line in (small_batch_note(result.plans, source, micro_batch_size),
                     large_batch_note(result.plans, source, micro_batch_size),
                     attention_note(result.plans, source, recompute), *idle_device_notes(result.plans, cluster)):
            if line is not None:
                click.echo(line)
        click.echo(search_summary_line(result))
        click.echo(f"wrote {out}" if out else "no plan file written (-o FILE writes one)")
    if figures and not quiet:
        click.echo(f"wrote {', '.join(str(p) for p in figures)}")


def idle_device_notes(plans, cluster) -> list[str]:
    """One line per device count the plans leave some of the cluster's
    devices idle with (pp x dp x tp, or the stages' replicas x tp, below the
    cluster's devices), naming the plans' ranks."""
    total = sum(g.num_devices for g in cluster.groups)
    idle: dict[tuple[int, str], list[str]] = {}
    for p in plans:
        used = p.pp * p.dp * p.tp if p.stage_replicas is None else sum(p.stage_replicas) * p.tp
        how = "pp x dp x tp" if p.stage_replicas is None else "the stages' replicas x tp"
        if used < total:
            idle.setdefault((used, how), []).append(str(p.rank))
    return [f"plan{'s' if len(ranks) > 1 else ''} {', '.join(ranks)} use{'' if len(ranks) > 1 else 's'} "
            f"{used} of the {total} devices ({how}); {total - used} stay{'s' if total - used == 1 else ''} idle"
            for (used, how), ranks in idle.items()]


def _param_state(optimizer_state, sharding, optimizer_bytes_per_param, zero1) -> ParamState:
    """The training state the options ask for. ``--optimizer-bytes-per-param``
    (a total) and ``--optimizer-state`` (components) exclude each other;
    ``--zero1`` is ``--sharding zero1`` and conflicts with another sharding."""
    if optimizer_state and optimizer_bytes_per_param is not None:
        raise InputError(f"--optimizer-state {optimizer_state} and --optimizer-bytes-per-param "
                         f"{optimizer_bytes_per_param:g} both set the training state; give one")
    if zero1 and sharding not in (None, "zero1"):
        raise InputError(f"--zero1 and --sharding {sharding} disagree; --zero1 is --sharding zero1")
    shard = sharding or ("zero1" if zero1 else "none")
    if optimizer_bytes_per_param is not None:
        return from_total_bytes(optimizer_bytes_per_param, shard)
    return preset(optimizer_state or "mixed-adam", shard)


def _plan_text(plan_file: PlanFile, plans) -> tuple[PlanFile, str]:
    """The plan file with each plan's runtime exports, and its JSON text,
    checked against the plan format before anything is written or printed."""
    from ..export import export_all

    plan_file = replace(plan_file, exports=tuple(export_all(p, plan_file.inputs) for p in plans))
    text = to_json(plan_file)
    problems = document_problems(json.loads(text), finite=True)  # to_json refuses NaN and infinities
    if problems:  # the search wrote what its own reader refuses: a bug, never a file to leave behind
        raise RuntimeError(f"internal error: the plan file to write breaks its format: {problems[0]}")
    return plan_file, text


def _write_files(outputs, plot_dir, text: str, source: str) -> list:
    """Write ``outputs`` (``(path, write, what)``) and, with ``--plot-dir``,
    the four figures of the plan file ``text`` into that directory (made if
    needed, and removed again if anything fails), all or none. Returns the
    figures' paths."""
    figures = []
    if plot_dir:
        from ..plan import load_plan_text
        from ..plots.common import KINDS, render_into

        plan_file = load_plan_text(text, source)
        figures = [Path(plot_dir) / f"{kind}.png" for kind in KINDS]
        outputs = outputs + [(path, lambda f, k=kind: render_into(k, plan_file, f, source), "figure")
                             for kind, path in zip(KINDS, figures)]
    if outputs:
        write_outputs(outputs, directory=plot_dir or None)
    return figures


def replica_batches(plan) -> list[int]:
    """The samples each stage's replica runs of one micro-batch:
    ``ceil(b / r)`` of a micro-batch of ``b`` on a stage of ``r`` replicas
    (per-stage replication), ``b`` on every stage otherwise."""
    return [-(-plan.micro_batch_size // r) for r in (plan.stage_replicas or (1,))]


def large_batch_note(plans, source, pinned_micro_batch_size: int | None = None) -> str | None:
    """A line when ranked plans of a profile fitted over several batch sizes
    (its layers' fixed and per-sample times, ``pipesearch profile
    --batch-sizes``) run micro-batches (or replicas' shares of them) larger
    than the largest it was measured at, its ``batch_size``: their times
    extrapolate the fit. The pin it names, as :func:`small_batch_note`'s,
    is one of at most that size where ``--micro-batch-size`` pinned one
    above it. None otherwise."""
    profile = source.variants[0].profile
    if source.info.get("kind") != "profile" or not any(has.any() for has, _ in profile.fixed_time_arrays.values()):
        return None
    ranks = [str(p.rank) for p in plans if max(replica_batches(p)) > profile.profiled_batch_size]
    if not ranks:
        return None
    return (f"plan{'s' if len(ranks) > 1 else ''} {', '.join(ranks)} run{'' if len(ranks) > 1 else 's'} micro-batches "
            f"larger than the largest the profile was measured at ({profile.profiled_batch_size}), timed by "
            f"extrapolating its fit (fixed + per-sample time); measure up to that size (pipesearch profile "
            f"--batch-sizes){_pin_advice(pinned_micro_batch_size, profile.profiled_batch_size, larger=True)}")


def attention_note(plans, source, recompute: str | None) -> str | None:
    """A line when the search (``--recompute`` not pinned) ranked
    transformer plans that keep every block's attention scores (recompute
    ``none``: ``5 a s^2 b`` bytes a block, unfused attention, whose
    element-wise work on the scores the time model leaves out): a
    FlashAttention run keeps none of them and recomputes them in its
    backward, which ``selective`` models (docs/transformer_costs.md). None
    otherwise."""
    if recompute is not None or source.info.get("kind") != "transformer":
        return None
    ranks = [p.rank for p in plans if _recompute_label(p) == "none"]
    if not ranks:
        return None
    return (f"plan{'s' if len(ranks) > 1 else ''} {_rank_list(ranks)} keep{'' if len(ranks) > 1 else 's'} every "
            "block's attention scores (recompute none: unfused attention, its softmax and dropout over the scores "
            "not timed); a FlashAttention run keeps none of them: --recompute selective plans it "
            "(docs/transformer_costs.md)")


def small_batch_note(plans, source, pinned_micro_batch_size: int | None = None) -> str | None:
    """A line when ranked plans of a measured profile run micro-batches
    smaller than it was measured at and no layer has a fixed time: its times
    are scaled down in proportion (:meth:`pipesearch.types.ModelProfile.layer_times_at`),
    which a GPU does not do (kernel launches and small GEMMs), so such
    plans look faster than they run. A stage replicated ``r`` times runs
    ``ceil(b / r)`` samples of each micro-batch of ``b`` on each replica
    (per-stage replication), its smallest such batch is the plan's. The
    fix it names: measure several sizes, or pin a micro-batch size (one of at
    least the profile's batch where ``--micro-batch-size`` pinned one below
    it; none where the pinned one is not below it, the replicas' shares
    are). None otherwise."""
    profile = source.variants[0].profile
    if source.info.get("kind") != "profile" or any(has.any() for has, _ in profile.fixed_time_arrays.values()):
        return None
    batch = profile.profiled_batch_size
    ranks = [str(p.rank) for p in plans if min(replica_batches(p)) < batch]
    if not ranks:
        return None
    return (f"plan{'s' if len(ranks) > 1 else ''} {', '.join(ranks)} run{'' if len(ranks) > 1 else 's'} micro-batches "
            f"(or replicas' shares of them) smaller than the profile's batch of {batch}, timed "
            f"in proportion to their size "
            f"(the profile gives no fixed per-micro-batch time): a GPU runs small batches less efficiently; measure "
            f"several sizes (pipesearch profile --batch-sizes){_pin_advice(pinned_micro_batch_size, batch)}")


def _pin_advice(pinned: int | None, batch: int, larger: bool = False) -> str:
    """The pin :func:`small_batch_note` (``larger``: :func:`large_batch_note`)
    suggests besides measuring: any micro-batch size when none is pinned;
    one on the profile's side of ``batch`` when the pinned one is past it;
    none when the pinned one is not (the replicas' shares are)."""
    if pinned is None:
        return " or pin --micro-batch-size"
    if (pinned > batch) if larger else (pinned < batch):
        side, where = ("less", "above") if larger else ("more", "below")
        return f" or pin a --micro-batch-size of {batch} or {side} (--micro-batch-size {pinned} is {where} it)"
    return ""
