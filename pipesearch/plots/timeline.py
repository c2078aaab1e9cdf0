"""Gantt chart of a simulated pipeline iteration."""

from __future__ import annotations

from os import PathLike

from ..simulate import Timeline

KIND_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#55A868", "W": "#8172B3"}
KIND_LABELS = {"F": "F forward", "B": "B backward", "I": "I input grad", "W": "W weight grad"}
ALLREDUCE_COLOUR = "#C44E52"
_IDLE = "#E6E6E6"


def allreduce_spans(plan, timeline: Timeline, total_s: float | None = None) -> list[tuple[float, float]]:
    """Per rank, ``(start_s, duration_s)`` of its gradient all-reduce: from
    the rank's end (``timeline.rank_end_s``: its last action with a blocking
    send; Mobius: and its stages' last gradient copy), as long as the ``allreduce_s`` of
    its stages (the rule of :func:`pipesearch.timemodel.simulate_times`);
    ``(0, 0)`` without one. RoundPipe (no all-reduce; the CPU's step over
    all groups once the last gradients are on the host): that step on every
    rank, ending at the replay's time ``total_s`` (the plan's recorded time
    when not given)."""
    p = timeline.num_ranks
    if plan.schedule == "roundpipe":
        step = sum(st.allreduce_s for st in plan.stages)
        end = plan.predicted.iteration_time_s if total_s is None else total_s
        return [(end - step, step) if step > 0 else (0.0, 0.0)] * p
    end = list(timeline.rank_end_s)
    if plan.schedule == "mobius":  # and after the last copy of its gradients to the host
        for _, direction, what, stage, _, stop in pcie_copy_spans(plan):
            if (direction, what) == ("out", "gradients"):
                end[stage % p] = max(end[stage % p], stop)
    dur = [0.0] * p
    for st in plan.stages:
        dur[st.index % p] += st.allreduce_s
    return [(e, d) if d > 0 else (0.0, 0.0) for e, d in zip(end, dur)]


def has_replicas(plan) -> bool:
    """Whether some stage of ``plan`` runs on more than one replica (dp,
    or per-stage replication): a gradient all-reduce follows its pipeline."""
    return plan.dp > 1 or any(r > 1 for r in plan.stage_replicas or ())


def allreduce_label(plan) -> str:
    """Legend of the bars :func:`allreduce_spans` draws: the gradient
    all-reduce, and the optimizer step with it, on the host where a stage
    offloads its optimizer, else on the GPU (both follow the last backward:
    ``StagePlan.allreduce_s`` holds their sum), the step alone for one
    replica."""
    if any(st.host_step_s > 0 for st in plan.stages):
        return "A all-reduce + host optimizer step" if has_replicas(plan) else "A host optimizer step"
    if any(st.optimizer_step_s > 0 for st in plan.stages):
        return "A gradient all-reduce + optimizer step" if has_replicas(plan) else "A optimizer step"
    return "A gradient all-reduce"


PCIE_COLOURS = {("in", "weights"): "#2CA02C", ("out", "gradients"): "#9467BD",
                ("out", "activations"): "#17BECF", ("in", "activations"): "#BCBD22"}
PCIE_LABELS = {("in", "weights"): "weights in (host to GPU)", ("out", "gradients"): "gradients out (GPU to host)",
               ("out", "activations"): "activations out (GPU to host)",
               ("in", "activations"): "activations in (host to GPU)"}


def pcie_copy_spans(plan, timeline: Timeline | None = None) -> list[tuple[int, str, str, int, float, float]]:
    """Every PCIe copy of ``plan`` as ``(lane, direction, what, stage,
    start_s, end_s)`` (:func:`pipesearch.timemodel.mobius_pcie_spans`'
    fields), at the times the time model gives it:

    * Mobius: the copy nodes of its graph (weights in, gradients out,
      activations out and in; ``lane`` its PCIe switch's queue), evaluated
      with the plan's stage times (:func:`pipesearch.timemodel.stage_times_of`);
    * RoundPipe: its graph's copy nodes
      (:func:`pipesearch.timemodel.roundpipe_copy_spans`; ``lane`` the GPU,
      ``stage`` the layer group, or the boundary for activations);
    * other schedules: the activation, streamed-weight and optimizer-step
      copies that their stage times hold (plan ``options.host``'s
      ``activation_copy_s``, ``weight_copy_s``, ``optimizer_copy_s``), placed
      on the simulated ``timeline`` (:func:`pipesearch.timemodel.host_copy_spans`;
      ``lane`` the rank's GPU). ``timeline`` None: the plan simulated here.

    Empty for a plan without host copies."""
    from ..timemodel import host_copy_spans, mobius_pcie_spans, roundpipe_copy_spans, stage_times_of

    if plan.schedule == "mobius":
        return mobius_pcie_spans(stage_times_of(plan), plan.pp, plan.num_micro_batches, plan.vp)
    if plan.schedule == "roundpipe":  # lane: the GPU; the graph's copy nodes named as the other schedules' copies
        names = {"weights": "weights", "grads": "gradients", "act": "activations"}
        return [(gpu, d, names[what], group, a, b) for gpu, d, what, group, a, b
                in roundpipe_copy_spans(stage_times_of(plan), plan.pp, plan.num_micro_batches, plan.vp)]
    host = dict(plan.extra or ()).get("host", {})
    keys = ("activation_copy_s", "weight_copy_s", "optimizer_copy_s")
    if not any(k in host for k in keys):
        return []
    if timeline is None:
        from ..point_plan import simulate_plan

        timeline = simulate_plan(plan)[1]
    return host_copy_spans(timeline, [st.allreduce_s for st in plan.stages], [st.host_step_s for st in plan.stages],
                           **{k: host.get(k) for k in keys})


def pcie_rows(copies, mobius: bool = False) -> list[tuple[str, list[tuple[tuple[str, str], float, float]]]]:
    """The timeline's PCIe rows from :func:`pcie_copy_spans`: per lane and
    direction (lane order, ``in`` first), ``(label, [((direction, what),
    start_s, duration_s), ...])``; ``mobius``: lanes are PCIe switch queues
    (``PCIe q in``), else GPUs (``rank r PCIe in``)."""
    rows: dict[tuple[int, str], list] = {}
    for lane, direction, what, _, start, end in copies:
        rows.setdefault((lane, direction), []).append(((direction, what), start, end - start))
    return [(f"PCIe {q} {d}" if mobius else f"rank {q} PCIe {d}", spans)
            for (q, d), spans in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1] != "in"))]


def plan_pcie_rows(plan, timeline: Timeline | None = None):
    """:func:`pcie_rows` of :func:`pcie_copy_spans`: the rows the timeline
    draws below the ranks for ``plan``."""
    return pcie_rows(pcie_copy_spans(plan, timeline), mobius=plan.schedule == "mobius")


#: actions narrower than this many pixels (the median) are drawn without
#: their white outlines, which would cover them: a whole iteration of
#: hundreds of micro-batches then reads as busy, not as idle
EDGE_MIN_PX = 4.0


def _bar_edges(timeline: Timeline, ms_per_px: float) -> dict:
    """``broken_barh`` edge keywords: thin white outlines between actions
    whose median width is at least :data:`EDGE_MIN_PX` pixels, none below."""
    widths = sorted(rec.end_s - rec.start_s for rec in timeline.records)
    median_px = widths[len(widths) // 2] * 1e3 / ms_per_px if widths and ms_per_px > 0 else 0.0
    return {"edgecolor": "white", "linewidth": 0.5} if median_px >= EDGE_MIN_PX else {"edgecolor": "none"}


def parse_window(text: str) -> tuple[float, float]:
    """``"FROM:TO"`` in milliseconds (either side may be empty) -> seconds.

    Raises:
        InputError: not two numbers with ``FROM < TO``.
    """
    from ..errors import InputError

    a, sep, b = text.partition(":")
    try:
        lo = float(a) / 1e3 if a.strip() else 0.0
        hi = float(b) / 1e3 if b.strip() else float("inf")
    except ValueError:
        lo = hi = float("nan")
    if not sep or not (lo >= 0 and hi > lo):
        raise InputError(f"--window {text!r}: expected FROM_MS:TO_MS with 0 <= FROM < TO, e.g. 0:50 or 120:")
    return lo, hi


def drawn_end_s(timeline: Timeline, allreduce=None, pcie=None) -> float:
    """Where :func:`plot_timeline`'s time axis ends (s): the last action,
    all-reduce or PCIe copy it draws."""
    return max([timeline.iteration_time_s] + [a + d for a, d in (allreduce or []) if d > 0]
               + [a + d for _, spans in (pcie or []) for _, a, d in spans])


def plot_timeline(timeline: Timeline, path: str | PathLike[str], title: str,
                  allreduce: list[tuple[float, float]] | None = None,
                  window_s: tuple[float, float] | None = None,
                  allreduce_label_text: str = "A gradient all-reduce",
                  pcie: list[tuple[str, list]] | None = None) -> None:
    """Draw ``timeline`` as a Gantt chart and save it to ``path``.

    One row per rank (rank 0 on top), one bar per action coloured by kind
    (F, B, I, W; legend lists the kinds present), the micro-batch number written
    inside a bar when it fits, idle time shown as the light grey row
    background, x axis in milliseconds. The format follows ``path``'s suffix
    (``.png``, ``.svg``, ``.pdf``). Output is deterministic: fixed size and dpi,
    no timestamps or software metadata, fixed SVG hash salt.

    Args:
        timeline: result of :func:`pipesearch.simulate.simulate`.
        path: file to write.
        title: figure title.
        allreduce: per rank ``(start_s, duration_s)`` of its gradient
            all-reduce (:func:`allreduce_spans`), drawn as "A all-reduce"
            bars; ``None`` draws none.
        window_s: ``(from_s, to_s)``: draw only that time window (a zoom, for
            many micro-batches: bars and micro-batch numbers stay readable);
            ``None`` the whole iteration.
        allreduce_label_text: the legend of the ``allreduce`` bars
            (:func:`allreduce_label`).
        pcie: rows drawn below the ranks, one per PCIe lane and direction
            (:func:`plan_pcie_rows`: every copy to or from host memory), each
            copy a bar from its start to its end, coloured by what it moves.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    P = timeline.num_ranks
    pcie = pcie or []
    rows = P + len(pcie)
    spans_ar = [(a, d) for a, d in (allreduce or []) if d > 0]
    total_ms = drawn_end_s(timeline, allreduce, pcie) * 1e3
    width_in = 12.0
    height_in = 1.2 + 0.45 * rows
    dpi = 100
    with matplotlib.rc_context({"svg.hashsalt": "pipesearch", "path.simplify": False}):
        fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=dpi)
        try:
            xmax = total_ms if total_ms > 0 else 1.0
            xmin = 0.0
            if window_s is not None:
                xmin = min(window_s[0] * 1e3, xmax)
                xmax = min(window_s[1] * 1e3, xmax)
                if xmax <= xmin:
                    xmin, xmax = 0.0, total_ms or 1.0
            ax.set_xlim(xmin, xmax)
            ax.set_ylim(rows - 0.5, -0.5)
            bar_h = 0.8
            axes_px = width_in * dpi * 0.8
            ms_per_px = (xmax - xmin) / axes_px
            edge = _bar_edges(timeline, ms_per_px)
            for r in range(rows):
                ax.broken_barh([(0.0, xmax)], (r - bar_h / 2, bar_h), facecolors=_IDLE, edgecolor="none", zorder=1)
            by = {}
            for rec in timeline.records:
                by.setdefault((rec.rank, rec.kind), []).append((rec.start_s * 1e3, (rec.end_s - rec.start_s) * 1e3))
            for (r, kind), spans in sorted(by.items()):
                ax.broken_barh(spans, (r - bar_h / 2, bar_h), facecolors=KIND_COLOURS[kind], zorder=2, **edge)
            for r, (start, dur) in enumerate(allreduce or []):
                if dur > 0:
                    ax.broken_barh([(start * 1e3, dur * 1e3)], (r - bar_h / 2, bar_h), facecolors=ALLREDUCE_COLOUR,
                                   zorder=2, **edge)
            for k, (_, spans) in enumerate(pcie):
                for key in dict.fromkeys(key for key, _, _ in spans):
                    ax.broken_barh([(a * 1e3, d * 1e3) for kk, a, d in spans if kk == key],
                                   (P + k - bar_h / 2, bar_h), facecolors=PCIE_COLOURS[key], zorder=2, **edge)
            # Text when the bar is wide enough: ~7 px per digit at 7 pt.
            n_labels = 0
            for rec in timeline.records:
                w_ms = (rec.end_s - rec.start_s) * 1e3
                label = str(rec.microbatch)
                mid = rec.start_s * 1e3 + w_ms / 2
                if w_ms / ms_per_px >= 7 * len(label) + 4 and n_labels < 5000 and xmin <= mid <= xmax:
                    ax.text((rec.start_s * 1e3) + w_ms / 2, rec.rank, label, ha="center", va="center",
                            fontsize=7, color="white", zorder=3)
                    n_labels += 1
            ax.set_yticks(range(rows))
            ax.set_yticklabels([f"rank {r}" for r in range(P)] + [label for label, _ in pcie])
            ax.set_xlabel("time (ms)" + (f", window {xmin:g} to {xmax:g} ms of {total_ms:g}"
                                         if window_s is not None else ""))
            ax.set_title(title)
            present = [k for k in KIND_COLOURS if (k in {rec.kind for rec in timeline.records})]
            handles = [Patch(facecolor=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in present]
            if spans_ar:
                handles.append(Patch(facecolor=ALLREDUCE_COLOUR, label=allreduce_label_text))
            for key in [k for k in PCIE_COLOURS if any(kk == k for _, spans in pcie for kk, _, _ in spans)]:
                handles.append(Patch(facecolor=PCIE_COLOURS[key], label=PCIE_LABELS[key]))
            handles.append(Patch(facecolor=_IDLE, label="idle"))
            fig.tight_layout()
            axes_h_in = ax.get_position().height * height_in
            ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.5 / axes_h_in),
                      ncol=len(handles), frameon=False, fontsize=8)
            suffix = str(path).rsplit(".", 1)[-1].lower()
            meta = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None},
                    "pdf": {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}}.get(suffix)
            fig.savefig(path, dpi=dpi, metadata=meta, bbox_inches="tight")
        finally:
            plt.close(fig)
