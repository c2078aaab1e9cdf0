"""Shared pieces of the plan-file plots: loading, the points table, titles,
a fixed deterministic style, saving, and :func:`render` / :func:`write_all`.

Figures are drawn on a :class:`matplotlib.figure.Figure` attached to the Agg
canvas inside each function: no display is needed and the global pyplot
backend of the caller (a notebook, a GUI) is left alone. Output is
deterministic: the style is reset to matplotlib's defaults plus the fixed
values in :data:`STYLE` (ignoring the user's matplotlibrc), figure size and
dpi are fixed, PNGs carry no software/time metadata and SVGs use a fixed hash
salt, so rendering the same plan file twice gives identical bytes.
"""

from __future__ import annotations

import contextlib
import math
from os import PathLike
from pathlib import Path
from typing import Iterator

import pandas as pd

from ..errors import InputError, PlanFormatError
from ..input_files import non_regular_kind
from ..plan import PlanFile, load_plan_file, points_columns, select_plan
from ..schema.semantics import REQUIRED_POINT_COLUMNS
from ..types import Plan

KINDS = ("space", "pareto", "stages", "timeline")
GIB = float(1 << 30)
DPI = 110

STYLE = {
    "svg.hashsalt": "pipesearch",
    "svg.fonttype": "path",
    "pdf.fonttype": 42,
    "path.simplify": False,
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.labelsize": 9.0,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "legend.fontsize": 8.0,
    "figure.titlesize": 11.0,
    "hatch.linewidth": 0.6,
    "axes.grid": False,
    "savefig.dpi": DPI,
    "savefig.facecolor": "white",
    "figure.facecolor": "white",
}

SCHEDULE_COLOURS = {"gpipe": "#4C72B0", "1f1b": "#DD8452", "interleaved-1f1b": "#55A868", "zb-h1": "#8172B3",
                    "looped-bfs": "#937860", "mobius": "#B07AA1"}
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B", "zb-h1": "ZB-H1",
                  "looped-bfs": "looped BFS", "mobius": "Mobius"}
_FALLBACK_COLOURS = ("#C44E52", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")


def schedule_title(name: str) -> str:
    """Display name of a schedule (``"1f1b"`` -> ``"1F1B"``)."""
    return SCHEDULE_NAMES.get(name, name)


def schedule_colour(name: str, order: int = 0) -> str:
    """A fixed colour per schedule name (fallback cycle for unknown ones)."""
    return SCHEDULE_COLOURS.get(name, _FALLBACK_COLOURS[order % len(_FALLBACK_COLOURS)])


# --- inputs -----------------------------------------------------------------


def load(plan_file: PlanFile | str | PathLike[str]) -> PlanFile:
    """A :class:`PlanFile` as is, or read and validated from a path.

    Raises:
        PlanFormatError: not a plan file (see :func:`pipesearch.plan.load_plan_file`).
    """
    if isinstance(plan_file, PlanFile):
        return plan_file
    return load_plan_file(plan_file)


def source_name(plan_file) -> str:
    return "plan file" if isinstance(plan_file, PlanFile) else str(plan_file)


POINT_COLUMNS = REQUIRED_POINT_COLUMNS  # the columns the space and pareto figures read


def points_frame(plan_file: PlanFile, source: str = "plan file") -> pd.DataFrame:
    """The evaluated points of the search (``search.points``) as a DataFrame.

    Raises:
        PlanFormatError: the file has no ``search.points`` table (written by an
            older pipesearch or by another tool), or the table is malformed.
    """
    pts = plan_file.search.get("points") if isinstance(plan_file.search, dict) else None
    if pts is None:
        raise PlanFormatError(
            f"{source}: no search.points table (the evaluated points); the space and pareto plots need "
            "it: re-run `pipesearch plan -o FILE` (add --exhaustive to evaluate every point)")
    if not isinstance(pts, dict) or "columns" not in pts or ("data" not in pts and "values" not in pts):
        raise PlanFormatError(f"{source}: search.points must be an object with 'columns' and 'values' (one list "
                              "per column) or 'data' (one list per point)")
    columns, values = points_columns(pts)
    missing = [c for c in POINT_COLUMNS if c not in columns]
    if missing:
        raise PlanFormatError(f"{source}: search.points lacks column(s) {', '.join(missing)}")
    if len(values) != len(columns) or len({len(v) for v in values}) > 1:
        raise PlanFormatError(f"{source}: search.points must have one value per column for every point")
    df = pd.DataFrame(dict(zip(columns, values)), columns=columns)
    for col in ("tp", "pp", "dp", "micro_batch_size", "num_micro_batches", "iteration_time_s",
                "samples_per_s", "peak_memory_bytes"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    if df.empty:
        raise PlanFormatError(f"{source}: search.points is empty (no evaluated points to plot)")
    return df


def plan_of_rank(plan_file: PlanFile, rank: int, source: str = "plan file") -> Plan:
    """The plan of that rank (1-based); PlanFormatError names the ranks present."""
    if not plan_file.plans:
        raise PlanFormatError(f"{source}: the file holds no plans")
    return select_plan(plan_file, rank, source)


def title_of(plan_file: PlanFile) -> str:
    """``"vgg16 on 4x4-v100-10gbe (16 x v100-pcie-16gb), global batch 1024"``
    from the file's ``inputs`` (missing parts are left out)."""
    inputs = plan_file.inputs if isinstance(plan_file.inputs, dict) else {}
    model = inputs.get("model") or {}
    cluster = inputs.get("cluster") or {}
    job = inputs.get("job") or {}
    name = model.get("name", "model")
    text = str(name)
    seq = model.get("seq_len")
    if seq:
        text += f" (seq {seq})"
    if cluster.get("name"):
        text += f" on {cluster['name']}"
        types = list(cluster.get("device_types") or ())
        counts: dict[str, int] = {}
        for g in cluster.get("groups") or ():  # a mixed cluster: each type's count
            if isinstance(g, dict) and isinstance(g.get("nodes"), int) and isinstance(g.get("devices_per_node"), int):
                counts[str(g.get("device"))] = counts.get(str(g.get("device")), 0) + g["nodes"] * g["devices_per_node"]
        if len(counts) > 1:
            text += f" ({' + '.join(f'{n} x {t}' for t, n in counts.items())})"
        elif cluster.get("devices") and types:
            text += f" ({cluster['devices']} x {' + '.join(types)})"
    if job.get("global_batch_size"):
        text += f", global batch {job['global_batch_size']}"
    return text


def plan_label(plan: Plan) -> str:
    """``"#1: pp 2 x dp 8 x tp 1, gpipe, 1 x 128 micro-batches"`` (+ recompute;
    ``replicas 15,1`` in place of ``dp`` for per-stage replication)."""
    extra = dict(plan.extra)
    rec = extra.get("recompute", "none")
    dp = (f"replicas {','.join(map(str, plan.stage_replicas))}" if plan.stage_replicas is not None
          else f"dp {plan.dp}")  # per-stage replication: each stage's own count
    text = (f"#{plan.rank}: pp {plan.pp} x {dp} x tp {plan.tp}"
            + (f" x vp {plan.vp}" if plan.vp > 1 else "")
            + f", {plan.schedule}, micro-batch {plan.micro_batch_size} x {plan.num_micro_batches}")
    if rec and rec != "none":
        text += f", {rec} recompute"
    return text


def capacities(plan_file: PlanFile, plans=()) -> dict[str, float]:
    """Device memory capacity in bytes by device type: ``inputs.cluster.
    memory_bytes_per_device``, else the plans' ``memory_capacity_bytes``."""
    cluster = (plan_file.inputs or {}).get("cluster") or {}
    per = cluster.get("memory_bytes_per_device") or {}
    out = {str(k): float(v) for k, v in per.items() if isinstance(v, (int, float)) and v > 0}
    if not out:
        for p in plans or plan_file.plans:
            types = {st.device_type for st in p.stages}
            for t in sorted(types):
                out.setdefault(t, float(p.predicted.memory_capacity_bytes))
    return out


def reserve_bytes(plan_file: PlanFile) -> float:
    job = (plan_file.inputs or {}).get("job") or {}
    value = job.get("memory_reserve_bytes", 0.0)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def headroom_fraction(plan_file: PlanFile) -> float:
    """The job's ``memory_headroom_fraction`` (0 in older files)."""
    job = (plan_file.inputs or {}).get("job") or {}
    value = job.get("memory_headroom_fraction", 0.0)
    return float(value) if isinstance(value, (int, float)) and 0 <= value < 1 else 0.0


def usable_label(reserve: float, headroom: float) -> str:
    """Legend text of the usable-memory line."""
    left = f"{100 * (1 - headroom):g}%" if headroom else "capacity"
    return f"usable ({left} - {reserve / GIB:g} GiB reserve)"


# --- figures ----------------------------------------------------------------


@contextlib.contextmanager
def figure(width_in: float, height_in: float) -> Iterator[object]:
    """A fresh Agg-backed :class:`~matplotlib.figure.Figure` under the fixed
    style; closed afterwards."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context():
        matplotlib.style.use("default")
        matplotlib.rcParams.update(STYLE)
        fig = Figure(figsize=(width_in, height_in), dpi=DPI)
        FigureCanvasAgg(fig)
        try:
            yield fig
        finally:
            fig.clear()


_METADATA = {"png": {"Software": None},
             "svg": {"Date": None, "Creator": None},
             "pdf": {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}}


def check_output(path: str | PathLike[str]) -> tuple[Path, str]:
    """``(path, format)``; InputError for an unknown suffix or a missing directory."""
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in _METADATA:
        raise InputError(f"{path}: unsupported figure format {path.suffix or '(no suffix)'!r}; "
                         "use .png, .svg or .pdf")
    if not path.parent.is_dir():
        raise InputError(f"{path}: directory {path.parent} does not exist")
    kind = non_regular_kind(path)
    if kind is not None:  # the image writers seek back into the file: a pipe or device cannot take a figure
        raise InputError(f"{path}: is {kind}; a figure is written to a regular file (give a file name)")
    return path, suffix


def save(fig, path: str | PathLike[str]) -> Path:
    """Save deterministically; the format follows the suffix (png, svg, pdf)."""
    path, suffix = check_output(path)
    meta = _METADATA[suffix]
    return _atomic(path, lambda tmp: fig.savefig(tmp, dpi=DPI, metadata=meta, format=suffix))


def _atomic(path: Path, write) -> Path:
    """All-or-nothing write (:func:`pipesearch.output.write_output`)."""
    from ..output import write_output

    return write_output(path, lambda tmp: write(str(tmp)), "figure")


# --- entry points -------------------------------------------------------------


def render(kind: str, plan_file: PlanFile | str | PathLike[str], path: str | PathLike[str],
           rank: int = 1, source: str | None = None) -> Path:
    """Draw one figure of a plan file (``kind`` in :data:`KINDS`) to ``path``.

    ``rank`` chooses the plan for ``stages`` and ``timeline``; ``source``
    names the file in messages (default: the path, or "plan file" for a
    :class:`PlanFile` already read).

    Raises:
        InputError: unknown kind, unsupported suffix, missing output directory.
        PlanFormatError: not a plan file, no plan of that rank, no points table
            (space, pareto).
    """
    if kind not in KINDS:
        raise InputError(f"unknown plot kind {kind!r}; expected one of {', '.join(KINDS)}")
    return _render(kind, load(plan_file), path, rank, source or source_name(plan_file))


def _render(kind: str, pf: PlanFile, path, rank: int, source: str) -> Path:
    check_output(path)
    if kind == "space":
        from .space import plot_space
        return plot_space(pf, path, source=source)
    if kind == "pareto":
        from .pareto import plot_pareto
        return plot_pareto(pf, path, source=source)
    if kind == "stages":
        from .stages import plot_stages
        return plot_stages(pf, path, rank=rank, source=source)
    return plot_plan_timeline(pf, path, rank=rank, source=source)


def after_pipeline(plan) -> str:
    """What the timeline's title says follows the pipeline: the gradient
    all-reduce where stages have replicas, the optimizer step (on the host
    where stages step there in the iteration, not a delayed step, which runs
    beside the next one; else on the GPU where the plan times it), both, or
    neither (``dp = 1: no all-reduce``)."""
    from .timeline import has_replicas

    host = any(st.host_step_s > 0 for st in plan.stages) and dict(plan.extra or ()).get("optimizer_step") != "delayed"
    step = "host optimizer step" if host else "optimizer step" if any(
        st.optimizer_step_s > 0 for st in plan.stages) else ""
    if has_replicas(plan):
        return f", then gradient all-reduce and {step}" if step else ", then gradient all-reduce"
    return f", then {step}; dp = 1: no all-reduce" if step else ", dp = 1: no all-reduce"


def plot_plan_timeline(plan_file: PlanFile, path, rank: int = 1, source: str = "plan file") -> Path:
    """Simulate plan ``rank`` (:func:`pipesearch.point_plan.simulate_plan`) and draw
    its Gantt chart (:func:`pipesearch.plots.timeline.plot_timeline`)."""
    from ..point_plan import simulate_plan
    from ..units import format_seconds
    from .timeline import allreduce_label, allreduce_spans, plan_pcie_rows, plot_timeline

    plan = plan_of_rank(plan_file, rank, source)
    path, _ = check_output(path)
    total_s, timeline = simulate_plan(plan)
    title = (f"{title_of(plan_file)}\nplan {plan_label(plan)}: simulated iteration {format_seconds(total_s)} "
             f"(pipeline {format_seconds(timeline.iteration_time_s)}{after_pipeline(plan)})")
    spans = allreduce_spans(plan, timeline, total_s)
    pcie = plan_pcie_rows(plan, timeline)
    return _atomic(path, lambda tmp: plot_timeline(timeline, tmp, title, allreduce=spans,
                                                   allreduce_label_text=allreduce_label(plan), pcie=pcie))


def write_all(plan_file: PlanFile | str | PathLike[str], directory: str | PathLike[str]) -> list[Path]:
    """Write ``space.png``, ``pareto.png``, ``stages.png`` and ``timeline.png``
    (the last two for the rank-1 plan) of a plan file into ``directory``
    (created if needed).

    Returns:
        The paths written, in that order.

    Raises:
        InputError: the directory cannot be created.
        PlanFormatError: see :func:`render`.
    """
    source = source_name(plan_file)
    pf = load(plan_file)
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{directory}: cannot create the figure directory ({exc.strerror})") from None
    return [render_into(kind, pf, directory / f"{kind}.png", source) for kind in KINDS]


def render_into(kind: str, plan_file: PlanFile, path, source: str = "plan file") -> Path:
    """Draw the figure ``kind`` (one of :data:`KINDS`; the plan figures of
    rank 1) of ``plan_file`` into ``path``, a ``.png`` (a temporary file
    when several outputs are written together, :func:`pipesearch.output.write_outputs`)."""
    return _render(kind, plan_file, path, 1, source)
