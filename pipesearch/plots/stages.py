"""Per-stage time and memory of one plan: where the time goes, how balanced
the stages are and how much memory headroom each has."""

from __future__ import annotations

import textwrap
from os import PathLike
from pathlib import Path

import numpy as np

from ..plan import PlanFile
from ..types import Plan
from .common import (GIB, capacities, figure, headroom_fraction, plan_label, plan_of_rank, reserve_bytes, save,
                     title_of, usable_label)

PARTS = (  # key, label, colour
    ("forward", "forward compute", "#4C72B0"),
    ("backward", "backward compute", "#DD8452"),
    ("p2p", "point-to-point send/receive", "#55A868"),
    ("allreduce", "gradient all-reduce", "#8172B3"),
    ("step", "optimizer step on the GPU (after the last backward)", "#CCB974"),
    ("host", "optimizer step on the host (after the last backward)", "#937860"),
)
RECOMPUTE_PART = ("recompute", "forward re-run in the backward task", "#DA8BC3")
STATE_COLOUR = "#64B5CD"
ACT_COLOUR = "#C7E3EC"
CAPACITY_COLOUR = "#B22222"


def stage_breakdown(plan: Plan) -> dict[str, np.ndarray]:
    """Seconds per iteration spent by each stage's devices, by part:
    ``forward`` = m fwd_s, ``backward`` = m (compute_s - fwd_s), ``p2p`` =
    m comm_s, ``allreduce`` = allreduce_s less the optimizer steps it
    includes, ``step`` = optimizer_step_s (the step on the GPU), ``host`` =
    host_step_s (the offloaded optimizer step after the last backward; 0
    when the plan delays it beside the next iteration: it then takes no
    device time) (arrays indexed by stage)."""
    m = plan.num_micro_batches
    st = plan.stages
    delayed = dict(plan.extra or ()).get("optimizer_step") == "delayed"
    host = np.array([0.0 if delayed else s.host_step_s for s in st])
    step = np.array([s.optimizer_step_s for s in st])
    return {
        "forward": np.array([m * s.fwd_s for s in st]),
        "backward": np.array([m * max(0.0, s.compute_s - s.fwd_s) for s in st]),
        "p2p": np.array([m * s.comm_s for s in st]),
        "allreduce": np.maximum(np.array([s.allreduce_s for s in st]) - host - step, 0.0),
        "step": step,
        "host": host,
    }


def roundpipe_tasks_of(plan: Plan) -> list[tuple[str, int, int]] | None:
    """A RoundPipe plan's ``(kind, group, gpu)`` tasks as it records them
    (``options.roundpipe.tasks``, :func:`pipesearch.schedules.roundpipe_tasks`),
    or None for other plans or a plan without them."""
    rp = dict(plan.extra or ()).get("roundpipe") if plan.schedule == "roundpipe" else None
    tasks = (rp or {}).get("tasks")
    if not isinstance(tasks, (list, tuple)) or not tasks:
        return None
    return [(str(k), int(g), int(d)) for k, g, d in tasks]


def roundpipe_gpu_breakdown(plan: Plan) -> dict[str, np.ndarray] | None:
    """Seconds per iteration of each GPU of a RoundPipe plan, by part, from
    its task list (:func:`roundpipe_tasks_of`): a group's forward task (``F``)
    adds ``m fwd_s`` to ``forward`` and ``m comm_s`` (its boundary
    activations to host memory) to ``p2p`` on the GPU it runs on; its
    backward task (``B``) adds ``m (compute_s - fwd_s)`` to ``backward`` and
    the forward it re-runs first, ``m fwd_s``, to ``recompute``, on *its*
    GPU (usually another than the forward's); the last group's fused task
    (``FB``) adds its forward and backward once, without a re-run. The host
    step (CPU Adam after every gradient is back, 0 when delayed) goes to the
    GPU of the group's backward. The compute parts are the per-GPU busy time
    of :func:`pipesearch.roundpipe.plan_point` and of ``simulate``. Arrays
    ``(pp,)``; None for other plans."""
    tasks = roundpipe_tasks_of(plan)
    if tasks is None:
        return None
    m, st = plan.num_micro_batches, plan.stages
    delayed = dict(plan.extra or ()).get("optimizer_step") == "delayed"
    out = {k: np.zeros(plan.pp) for k in ("forward", "backward", "recompute", "p2p", "allreduce", "step", "host")}
    for kind, g, d in tasks:
        s = st[g]
        if kind in ("F", "FB"):
            out["forward"][d] += m * s.fwd_s
            out["p2p"][d] += m * s.comm_s
        if kind in ("B", "FB"):
            out["backward"][d] += m * max(0.0, s.compute_s - s.fwd_s)
            out["recompute"][d] += m * s.fwd_s if kind == "B" else 0.0
            host = 0.0 if delayed else s.host_step_s
            out["host"][d] += host
            out["allreduce"][d] += max(0.0, s.allreduce_s - host)
    return out


def memory_breakdown(plan: Plan) -> dict[str, np.ndarray] | None:
    """Peak bytes per device of each stage split into ``activations``
    (``saved_bytes`` x micro-batches in flight: GPipe ``m``, 1F1B
    ``min(m, pp - s)``) and ``state`` (the rest: weights, gradients, optimizer
    state); None for other schedules, whose in-flight counts the plan file
    does not record. Plans whose stages carry ``memory_breakdown`` (any
    schedule) are split from it, one column per device."""
    from ..costs import in_flight_micro_batches

    if plan.stages and all(st.memory_breakdown for st in plan.stages):
        cols = plan.pp if len(plan.stages) != plan.pp else len(plan.stages)
        state, acts = np.zeros(cols), np.zeros(cols)
        for st in plan.stages:
            a = dict(st.memory_breakdown).get("activations", 0.0)
            acts[st.index % cols] += a
            state[st.index % cols] += st.memory_bytes - a
        return {"state": state, "activations": acts}
    if plan.schedule not in ("gpipe", "1f1b") or len(plan.stages) != plan.pp:
        return None
    mem = np.array([s.memory_bytes for s in plan.stages], dtype=float)
    saved = np.array([getattr(s, "saved_bytes", 0.0) or 0.0 for s in plan.stages], dtype=float)
    flight = in_flight_micro_batches(plan.schedule, plan.pp, plan.num_micro_batches)
    act = np.clip(saved * flight, 0.0, mem)
    return {"state": mem - act, "activations": act}


def gpu_peaks(plan: Plan) -> dict[str, np.ndarray] | None:
    """Mobius and RoundPipe plans (more stages than GPUs, memory checked per
    GPU): ``peak``, each GPU's recorded peak bytes, the figure the search's
    memory check used (``options.mobius.device_peak_bytes``,
    :meth:`pipesearch.costs.PipelineCosts.mobius_device_peak_bytes`;
    ``options.roundpipe.device_peak_bytes``,
    :func:`pipesearch.roundpipe.device_peak_bytes`), and ``activations``, the
    part of it that is its stages' activations (Mobius: a GPU holds every
    stage's at once; RoundPipe: zeros, its peak is one task pair's), each
    ``(pp,)``; None for other schedules or a plan without the figures."""
    option = {"mobius": "mobius", "roundpipe": "roundpipe"}.get(plan.schedule)
    peaks = (dict(plan.extra or ()).get(option) or {}).get("device_peak_bytes") if option else None
    if not isinstance(peaks, (list, tuple)) or len(peaks) != plan.pp:
        return None
    acts = np.zeros(plan.pp)
    if option == "mobius":
        for st in plan.stages:
            acts[st.index % plan.pp] += dict(st.memory_breakdown).get("activations", 0.0)
    return {"peak": np.asarray(peaks, dtype=float), "activations": acts}


def state_label(plan: Plan) -> str:
    """Legend of the memory panel's training-state bar: what the stages keep
    on the device (:func:`pipesearch.export.stages_json.stage_placement` of
    each stage's ``memory_option``): weights (or, streamed, their layer
    buffers), gradients, and the optimizer state unless it is in host memory
    (ZeRO-Offload, ``--optimizer-offload``)."""
    from ..errors import InputError
    from ..export.stages_json import stage_placement

    def parts(option: str) -> tuple[str, ...]:
        try:
            where = stage_placement(option or "none", "none")
        except InputError:  # an option this reader does not know: say nothing about it
            return ("weights", "gradients", "optimizer state")
        weights = "weights" if where["weights"] == "device" else "weight buffers"
        return (weights, "gradients") + (("optimizer state",) if where["optimizer_state"] == "device" else ())

    kinds = list(dict.fromkeys(parts(st.memory_option) for st in plan.stages)) or [("weights", "gradients",
                                                                                    "optimizer state")]
    if len(kinds) == 1:
        text = " + ".join(kinds[0])
        return text + ("" if "optimizer state" in kinds[0] else " (optimizer state in host memory)")
    return ("weights + gradients, + optimizer state on the stages that keep it on the device (the others: in "
            "host memory)")


def _columns(plan: Plan) -> tuple[np.ndarray, list[str], str]:
    """Column of each stage in the plot, tick labels, axis label: one column
    per stage, or per device (pipeline rank) when devices hold several
    virtual stages (stage ``s`` on rank ``s mod pp``)."""
    stages = plan.stages
    tasks = roundpipe_tasks_of(plan)
    if tasks is not None:  # RoundPipe: per GPU, the groups whose forward (F) and backward (B) tasks it runs
        labels = [f"{r}\nF " + ",".join(str(g) for k, g, d in tasks if d == r and "F" in k)
                  + "\nB " + ",".join(str(g) for k, g, d in tasks if d == r and "B" in k) for r in range(plan.pp)]
        return np.array([s.index % plan.pp for s in stages]), labels, "GPU (F, B: the groups of its tasks)"
    shown = any(s.memory_option not in ("", "none") for s in stages)  # per-stage memory options (stage_options)
    if len(stages) <= plan.pp:
        labels = [f"{s.index}\n{s.layers[0]}" + (f"-{s.layers[1] - 1}" if s.layers[1] - s.layers[0] > 1 else "")
                  + (f"\n{s.memory_option}" if shown else "") for s in stages]
        return np.arange(len(stages)), labels, "stage (first-last layer)" + ("; memory option" if shown else "")
    col = np.array([s.index % plan.pp for s in stages])
    labels = [f"{r}\nst " + ",".join(str(s.index) for s in stages if s.index % plan.pp == r)
              + ("\n" + ",".join(dict.fromkeys(s.memory_option for s in stages if s.index % plan.pp == r))
                 if shown else "") for r in range(plan.pp)]
    return col, labels, (f"pipeline rank (st: its {len(stages) // plan.pp} virtual stages)"
                         + ("; memory options" if shown else ""))


def plot_stages(plan_file: PlanFile, path: str | PathLike[str], rank: int = 1, source: str = "plan file") -> Path:
    """Two panels for plan ``rank``: per-stage busy time per iteration
    stacked by part (forward, backward, point-to-point, all-reduce) against
    the plan's iteration time, and per-stage peak memory per device
    (weights + optimizer state and activations, where known) against the
    device capacity and the usable memory (capacity less headroom and reserve). With virtual
    stages (interleaved schedules) the bars are per device, summing its stages;
    Mobius and RoundPipe plans draw each GPU's peak instead (:func:`gpu_peaks`).

    Raises:
        PlanFormatError: no plan of that rank.
    """
    plan = plan_of_rank(plan_file, rank, source)
    col, labels, xlabel = _columns(plan)
    n = len(labels)
    x = np.arange(n)

    def per_col(values) -> np.ndarray:
        return np.bincount(col, weights=np.asarray(values, dtype=float), minlength=n)

    parts = roundpipe_gpu_breakdown(plan)  # RoundPipe: per GPU from its task list, not per stage
    parts = {k: per_col(v) for k, v in stage_breakdown(plan).items()} if parts is None else parts

    caps_by_type = capacities(plan_file, [plan])
    cap = np.zeros(n)
    for c, st in zip(col, plan.stages):
        cap[c] = caps_by_type.get(st.device_type, plan.predicted.memory_capacity_bytes)
    reserve = reserve_bytes(plan_file)
    keep = 1 - headroom_fraction(plan_file)
    mem = per_col([st.memory_bytes for st in plan.stages])
    mb = memory_breakdown(plan)
    per_gpu = gpu_peaks(plan)  # Mobius, RoundPipe: each GPU's peak over its stays or tasks, not a sum of stages
    if per_gpu is not None:
        mem = per_gpu["peak"]
        mb = {"state": mem - per_gpu["activations"], "activations": per_gpu["activations"]}
    small = 6.5 if n > 12 else 8

    width = min(16.0, max(11.0, 3.0 + n))
    with figure(width, 5.0) as fig:
        deep = any(label.count("\n") >= 2 for label in labels)  # a third tick line: the memory options
        gs = fig.add_gridspec(1, 2, left=0.07, right=0.98, top=0.79, bottom=0.34 if deep else 0.3, wspace=0.2)
        ax_t = fig.add_subplot(gs[0, 0])
        ax_m = fig.add_subplot(gs[0, 1])

        handles = _time_panel(ax_t, plan, parts, small)
        mem_handles = _memory_panel(ax_m, plan, mem, mb, per_gpu, cap, reserve, keep, small)
        for ax in (ax_t, ax_m):
            ax.set_xticks(x)
            ax.set_xticklabels(labels, fontsize=7 if n > 10 else 8)
            ax.set_xlim(-0.6, n - 0.4)
            ax.set_xlabel(xlabel)
            ax.grid(True, axis="y", color="#E5E5E5", linewidth=0.6, zorder=0)
            ax.set_axisbelow(True)
        below = -0.32 if deep else -0.24
        ax_t.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, below), ncol=2, frameon=False,
                    borderaxespad=0, columnspacing=1.2)
        ax_m.legend(handles=mem_handles, loc="upper left", bbox_to_anchor=(0.0, below), ncol=2, frameon=False,
                    borderaxespad=0, columnspacing=1.2)
        host_text = _host_text(plan)
        if host_text:
            fig.text(0.5, 0.875, host_text, ha="center", va="top", fontsize=8.5, color="#333333")
        fig.suptitle(title_of(plan_file), y=0.975)
        where = _placement_text(plan)
        fig.text(0.5, 0.915, textwrap.fill(f"plan {plan_label(plan)}: {plan.predicted.samples_per_s:,.1f} "
                                           f"samples/s, bubble {100 * plan.predicted.bubble_fraction:.1f}%; {where}",
                                           150), ha="center", va="top", fontsize=8.5, color="#333333")
        return save(fig, path)


BAR_WIDTH = 0.7  # of a column


def _time_panel(ax, plan, parts: dict, small: float) -> list:
    """Draw the busy time of each column stacked by part against the
    iteration (simulated, and the analytic value where it differs), with
    each column's share of the iteration; returns the legend handles."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    total = sum(parts.values())
    n = len(total)
    x = np.arange(n)
    t_iter = plan.predicted.iteration_time_s
    t_analytic = dict(plan.extra).get("analytic_iteration_time_s")
    if not isinstance(t_analytic, (int, float)):
        t_analytic = None
    simulated = bool(dict(plan.extra).get("simulated"))
    scale, unit, prec = (1e3, "ms", 1) if max(t_iter, float(total.max())) < 2.0 else (1.0, "s", 3)
    bottom = np.zeros(n)
    handles = []
    for key, label, colour in PARTS + ((RECOMPUTE_PART,) if "recompute" in parts else ()):
        vals = parts[key] * scale
        if key in ("step", "host") and not np.any(vals):  # a step the plan does not time, or runs elsewhere
            continue
        ax.bar(x, vals, BAR_WIDTH, bottom=bottom, color=colour, edgecolor="white", linewidth=0.5, zorder=2)
        bottom = bottom + vals
        handles.append(Patch(facecolor=colour, label=label))
    ax.axhline(t_iter * scale, color="black", linewidth=1.3, zorder=3)
    handles.append(Line2D([], [], color="black", linewidth=1.3,
                          label=f"iteration{' (simulated)' if simulated else ''}: {t_iter * scale:.{prec}f} {unit}"))
    if simulated and t_analytic is not None and abs(t_analytic - t_iter) > 1e-3 * t_iter:
        ax.axhline(t_analytic * scale, color="black", linewidth=1.0, linestyle="--", zorder=3)
        handles.append(Line2D([], [], color="black", linewidth=1.0, linestyle="--",
                              label=f"iteration (analytic): {t_analytic * scale:.{prec}f} {unit}"))
    busiest = int(np.argmax(total))
    for c in range(n):
        share = total[c] / t_iter if t_iter > 0 else 0.0
        ax.text(c, total[c] * scale / 2, f"{100 * share:.0f}%", ha="center", va="center", fontsize=small,
                color="black", fontweight="bold" if c == busiest else "normal", zorder=4,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.85))
    ax.set_ylim(0, max(t_iter, float(total.max()), t_analytic or 0.0) * scale * 1.12)
    ax.set_ylabel(f"time per iteration ({unit})")
    note = ("\n(over 100%: the simulation overlaps transfers with compute)"
            if t_iter > 0 and total.max() > t_iter * 1.005 else "")
    ax.set_title(f"time per {'stage' if len(plan.stages) == n else 'device'}: {plan.num_micro_batches} "
                 f"micro-batches of {plan.micro_batch_size} (% of the iteration){note}", fontsize=9)
    return handles


def _memory_panel(ax, plan, mem, mb, per_gpu, cap, reserve: float, keep: float, small: float) -> list:
    """Draw each column's peak memory (state and activations where known)
    against its device's capacity and usable memory, with the GiB still
    usable; returns the legend handles."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n = len(cap)
    x = np.arange(n)
    if mb is not None:
        ax.bar(x, mb["state"] / GIB, BAR_WIDTH, color=STATE_COLOUR, edgecolor="white", linewidth=0.5, zorder=2)
        ax.bar(x, mb["activations"] / GIB, BAR_WIDTH, bottom=mb["state"] / GIB, color=ACT_COLOUR,
               edgecolor="white", linewidth=0.5, zorder=2)
        handles = [Patch(facecolor=STATE_COLOUR, label=state_label(plan)),
                   Patch(facecolor=ACT_COLOUR, label="activations kept for backward")]
        if per_gpu is not None:
            handles = [Patch(facecolor=STATE_COLOUR, label=(
                "weights + gradients of two stays (+ tied copy)" if plan.schedule == "mobius"
                else "peak over its tasks (one task + the next's weights)")),
                       Patch(facecolor=ACT_COLOUR, label="activations of its stages")][
                :1 if plan.schedule == "roundpipe" else 2]
    else:
        ax.bar(x, mem / GIB, BAR_WIDTH, color=STATE_COLOUR, edgecolor="white", linewidth=0.5, zorder=2)
        handles = [Patch(facecolor=STATE_COLOUR, label="peak memory (state + activations)")]
    for c in range(n):
        ax.hlines(cap[c] / GIB, c - 0.5, c + 0.5, color=CAPACITY_COLOUR, linewidth=1.6, zorder=3)
        if reserve > 0 or keep < 1:
            ax.hlines((cap[c] * keep - reserve) / GIB, c - 0.5, c + 0.5, color=CAPACITY_COLOUR, linewidth=1.0,
                      linestyles="--", zorder=3)
        ax.text(c, mem[c] / GIB, f"{(cap[c] * keep - reserve - mem[c]) / GIB:.1f}", ha="center", va="bottom",
                fontsize=small - 0.5, color="#333333")
    ax.set_ylim(0, float(max(cap.max(), mem.max())) / GIB * 1.1)
    ax.set_ylabel("peak memory per device (GiB)")
    ax.set_title(("peak memory per GPU, as checked" if per_gpu is not None else "memory per device")
                 + " (number: GiB still usable)", fontsize=9)
    handles.append(Line2D([], [], color=CAPACITY_COLOUR, linewidth=1.6, label="device memory capacity"))
    if reserve > 0 or keep < 1:
        handles.append(Line2D([], [], color=CAPACITY_COLOUR, linewidth=1.0, linestyle="--",
                              label=usable_label(reserve, 1 - keep)))
    return handles


def _host_text(plan) -> str:
    """The figure's line on host memory and PCIe traffic (offloaded state,
    activations on the host, a delayed optimizer step); '' without."""
    host = dict(plan.extra or ()).get("host") or {}  # option_search.host_plan_info
    text = (f"host memory {host['total_host_memory_bytes'] / GIB:,.1f} GiB, PCIe "
            f"{host['total_pcie_bytes_per_iteration'] / GIB:,.1f} GiB per iteration" if host else "")
    act = [k for k, x in enumerate(host.get("activation_pcie_bytes_per_iteration") or []) if x > 0]
    if act:  # offloaded activations (stage_options.activation_host_options)
        text += (f"; activations of stage{'s' if len(act) > 1 else ''} {','.join(map(str, act))} on the "
                 "host (their copies' exposed time in forward and backward): "
                 f"{sum(host['activation_host_memory_bytes']) / GIB:,.1f} GiB, "
                 f"{sum(host['activation_pcie_bytes_per_iteration']) / GIB:,.1f} GiB over PCIe")
    if dict(plan.extra or ()).get("optimizer_step") == "delayed":
        text += "; optimizer step delayed one iteration (weights one step stale)"
    return text


def _placement_text(plan) -> str:
    """Where the stages run: each stage's device count and type, or the
    runs of consecutive stages of one type on a mixed cluster."""
    kinds = [st.device_type for st in plan.stages]
    runs: list[list] = []  # [first stage, count, type] of each run of consecutive stages of one type
    for k, t in enumerate(kinds):
        if runs and runs[-1][2] == t:
            runs[-1][1] += 1
        else:
            runs.append([k, 1, t])
    lead = (f"stages on {', '.join(str(r * plan.tp) for r in plan.stage_replicas)}"  # each on its own replicas
            if plan.stage_replicas is not None else f"each stage on {plan.dp * plan.tp}")
    if len(set(kinds)) == 1:
        return f"{lead} {kinds[0]} device(s)"
    return f"{lead} device(s): " + "; ".join(f"stage{'s' if n > 1 else ''} {k}{f'-{k + n - 1}' if n > 1 else ''} "
                                             f"{t}" for k, n, t in runs)
