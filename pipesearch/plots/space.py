"""Heatmaps of the search space: predicted throughput over (pipeline stages,
micro-batches), one panel per schedule and tensor-parallel degree."""

from __future__ import annotations

import math
import textwrap
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import PlanFormatError
from ..plan import PlanFile
from .common import figure, points_frame, save, schedule_title, title_of

#: Cell statuses of :func:`space_grid`, in order of precedence: a cell with
#: any ``ok`` point is ``ok``; else one with a ``pruned`` point is ``pruned``
#: (its best is unknown); else ``stopped_at_work_limits`` (a split search
#: stopped before it met a split that fits every GPU); else
#: ``out_of_memory``, ``schedule_refused``; else
#: ``n/a`` (no point of the space has that pp and number of micro-batches,
#: or only ones whose batch does not divide).
CELL_STATUSES = ("ok", "pruned", "stopped_at_work_limits", "out_of_memory", "schedule_refused", "n/a")

CELL_TEXT = {"pruned": "bound", "stopped_at_work_limits": "open", "out_of_memory": "OOM", "schedule_refused": "refused", "n/a": "n/a"}
_CELL_STYLE = {  # face colour, hatch, text colour, legend label
    "out_of_memory": ("#F4CCCC", "xx", "#8B1A1A", "OOM: every point out of device memory"),
    "schedule_refused": ("#E3E3E3", "//", "#404040", "refused: the schedule cannot run this pp and m "
                                                     "(1F1B-style: m >= pp; interleaved: m a multiple of pp)"),
    "pruned": ("#D6E4F2", None, "#1F4E79", "bound: not evaluated, pruned by lower bound (use --exhaustive)"),
    "stopped_at_work_limits": ("#FFF2CC", None, "#7F6000", "open: split search stopped at its work limits "
                                                           "before a split fit every GPU"),
    "n/a": ("#FFFFFF", None, "#9A9A9A", "n/a: no such point (batch not divisible, more stages than layers, or "
                                       "pp 1 of a schedule other than the one pp 1 is searched with: one stage "
                                       "runs every schedule's order)"),
}
BEST_COLOUR = "#E8112D"

_KEY = ["tp", "schedule", "pp", "num_micro_batches"]


def space_grid(points: pd.DataFrame, missing: str = "n/a") -> pd.DataFrame:
    """The cells of the space plot, one row per (tp, schedule, pp, m) cell.

    For each tensor-parallel degree, the cells are every combination of the
    schedules, the pp values and the micro-batch counts that occur in
    ``points`` for that degree. A cell's value is the best ``ok`` point over
    the other dimensions (dp, micro-batch size, placement, recompute).

    Args:
        points: the points table of a search (:attr:`pipesearch.search.
            SearchResult.points` or ``search.points`` of a plan file).
        missing: status of a cell no point falls in: ``"n/a"``, or
            ``"pruned"`` for a search that skipped whole groups of points by
            their lower bound without listing them; but ``"n/a"`` at pp 1
            for every schedule other than the one pp 1 is searched with
            (:func:`pipesearch.search_space.one_rank_schedule` of the schedules in
            ``points``: a grid has pp 1 rows only where that one's pp 1
            points are listed).

    Returns:
        DataFrame with columns ``tp, schedule, pp, num_micro_batches, status``
        (one of :data:`CELL_STATUSES`), ``samples_per_s, iteration_time_s,
        peak_memory_bytes, dp, micro_batch_size, placement, recompute`` (of
        the cell's best ok point; NaN/None otherwise) and ``points`` (points
        of the space in the cell); sorted by tp, schedule (in order of first
        appearance), pp, num_micro_batches.
    """
    pts = points[points["pp"].notna() & points["num_micro_batches"].notna() & points["schedule"].notna()].copy()
    pts["pp"] = pts["pp"].astype(int)
    pts["num_micro_batches"] = pts["num_micro_batches"].astype(int)
    pts["tp"] = pts["tp"].fillna(1).astype(int)
    schedules = list(dict.fromkeys(pts["schedule"]))
    frames = []
    for tp in sorted(pts["tp"].unique()):
        sub = pts[pts["tp"] == tp]
        index = pd.MultiIndex.from_product(
            [[int(tp)], schedules, sorted(sub["pp"].unique()), sorted(sub["num_micro_batches"].unique())],
            names=_KEY)
        frames.append(pd.DataFrame(index=index).reset_index())
    cols = ["samples_per_s", "iteration_time_s", "peak_memory_bytes", "dp", "micro_batch_size", "placement",
            "recompute"]
    if not frames:
        return pd.DataFrame(columns=_KEY + ["status"] + cols + ["points"])
    grid = pd.concat(frames, ignore_index=True)

    counts = pts.groupby(_KEY).size().rename("points")
    flags = pd.DataFrame({s: (pts["status"] == s) for s in CELL_STATUSES[:-1]})
    flags[_KEY] = pts[_KEY]
    anyof = flags.groupby(_KEY).any()
    ok = pts[pts["status"] == "ok"]
    # First occurrence of the maximum: stable, so ties resolve the same way every run.
    best_idx = ok.sort_values("samples_per_s", ascending=False, kind="stable").groupby(_KEY, sort=False).head(1)
    best = best_idx.set_index(_KEY)[cols]

    grid = grid.join(counts, on=_KEY).join(anyof, on=_KEY).join(best, on=_KEY)
    grid["points"] = grid["points"].fillna(0).astype(int)
    if missing not in ("n/a", "pruned"):
        raise ValueError(f"missing must be 'n/a' or 'pruned', got {missing!r}")
    status = np.where(grid["points"].to_numpy() == 0, missing, "n/a").astype(object)
    from ..search_space import one_rank_schedule  # pp 1 is searched with one schedule: no other is pruned there

    others = grid["schedule"].to_numpy() != one_rank_schedule(schedules)
    status[(grid["pp"].to_numpy() == 1) & others & (grid["points"].to_numpy() == 0)] = "n/a"
    for name in reversed(CELL_STATUSES[:-1]):  # highest precedence written last
        status[grid[name].fillna(False).astype(bool).to_numpy()] = name
    grid["status"] = status
    grid.loc[grid["status"] != "ok", cols] = np.nan
    return grid[_KEY + ["status"] + cols + ["points"]].reset_index(drop=True)


def best_cell(grid: pd.DataFrame, prefer: tuple | None = None) -> pd.Series | None:
    """The ok cell of highest throughput, or None: the ``prefer`` cell (``(tp,
    schedule, pp, num_micro_batches)``, the rank-1 plan's) when it is within
    the ranking's tie window of the highest (:data:`pipesearch.ranking.TIE_REL`:
    the ranking broke that tie, by memory and links), else the first one."""
    from ..ranking import TIE_REL

    ok = grid[grid["status"] == "ok"]
    if ok.empty:
        return None
    top = ok.loc[ok["samples_per_s"].idxmax()]
    if prefer is not None:
        tp, schedule, pp, m = prefer
        cell = ok[(ok["tp"] == tp) & (ok["schedule"] == schedule) & (ok["pp"] == pp) & (ok["num_micro_batches"] == m)]
        if len(cell) and cell["samples_per_s"].iloc[0] * (1 + TIE_REL) >= top["samples_per_s"]:
            return cell.iloc[0]
    return top


def _fmt_value(v: float, vmax: float) -> str:
    if vmax >= 100:
        return f"{v:.0f}"
    if vmax >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _panels(grid: pd.DataFrame) -> list[tuple[int, str, int, int]]:
    """``(tp, schedule, row, col)`` of every panel: one row per tp degree and
    one column per schedule; with a single tp degree and more than two
    schedules, two columns and as many rows as needed."""
    tps = sorted(int(t) for t in grid["tp"].unique())
    schedules = list(dict.fromkeys(grid["schedule"]))
    if len(tps) == 1 and len(schedules) > 2:
        return [(tps[0], s, k // 2, k % 2) for k, s in enumerate(schedules)]
    return [(tp, s, r, c) for r, tp in enumerate(tps) for c, s in enumerate(schedules)]


def plot_space(plan_file: PlanFile, path: str | PathLike[str], source: str = "plan file") -> Path:
    """Heatmaps of predicted throughput over (pp, micro-batches per replica).

    One panel per schedule and tensor-parallel degree (rows: tp, columns:
    schedules; a single tp wraps the schedules two per row). A cell's colour
    and number are the best predicted (simulated) samples/s over dp,
    micro-batch size, placement, virtual stages and recompute; infeasible
    cells are hatched and labelled OOM / refused, or n/a where no point
    exists; cells skipped by the search's lower bound are labelled "bound";
    the best cell has a red box (the rank-1 plan's on a tie within the
    ranking's window, :func:`best_cell`) and the rank-1 plan's cell (ranked
    after simulation) a star. One colour scale for all panels.

    Raises:
        PlanFormatError: the plan file has no points table.
    """
    import matplotlib
    from matplotlib.collections import PatchCollection
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    points = points_frame(plan_file, source)
    infeasible = plan_file.search.get("infeasible") if isinstance(plan_file.search, dict) else None
    skipped = isinstance(infeasible, dict) and (infeasible.get("pruned") or 0) > 0
    grid = space_grid(points, missing="pruned" if skipped else "n/a")
    if grid.empty:
        raise PlanFormatError(f"{source}: search.points has no point with a pp, a schedule and a number of "
                              "micro-batches to plot")
    panels = _panels(grid)
    n_rows = max(r for *_, r, _ in panels) + 1
    n_cols = max(c for *_, c in panels) + 1
    axes_of_tp = {int(tp): (sorted(g["pp"].unique()), sorted(g["num_micro_batches"].unique()))
                  for tp, g in grid.groupby("tp")}
    ok = grid[grid["status"] == "ok"]
    vmin = float(ok["samples_per_s"].min()) if not ok.empty else 0.0
    vmax = float(ok["samples_per_s"].max()) if not ok.empty else 1.0
    if vmax <= vmin:
        vmin, vmax = vmin * 0.9, vmax * 1.1 + 1e-9
    top = plan_file.plans[0] if plan_file.plans else None
    best = best_cell(grid, None if top is None else (top.tp, top.schedule, top.pp, top.num_micro_batches))
    vps: dict[str, list[int]] = {}
    if "vp" in points.columns:
        for sched, v in points.groupby("schedule")["vp"]:
            vps[sched] = sorted({int(x) for x in pd.to_numeric(v, errors="coerce").dropna()})

    max_m = max(len(ms) for _, ms in axes_of_tp.values())
    cell_w = min(0.52, max(0.38, 17.0 / (n_cols * max_m)))
    cell_h = 0.3
    panel_w = max(3.0, max_m * cell_w)
    row_pp = [max(len(axes_of_tp[tp][0]) for tp, _, r, _ in panels if r == row) for row in range(n_rows)]
    heights = [max(1.0, n * cell_h) for n in row_pp]
    width = n_cols * (panel_w + 0.7) + 1.5
    present = set(grid["status"])
    handles = _legend_handles(present, best, top)
    ncol = max(1, min(3, len(handles), int((width - 0.5) // LEGEND_COLUMN_IN)))
    sub = _subtitle(points, infeasible, skipped, present, vps, width)
    extra = max(0, sub.count("\n") + 1 - 2)
    gap_h, top_h, bottom_h = 0.75, 1.25 + 0.14 * extra, 0.85 + 0.36 * math.ceil(len(handles) / ncol)
    height = sum(heights) + gap_h * (n_rows - 1) + top_h + bottom_h
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))
    norm = Normalize(vmin=vmin, vmax=vmax)
    fs = 7.0 if cell_w >= 0.5 else 6.0

    with figure(width, height) as fig:
        gs = fig.add_gridspec(n_rows, n_cols, height_ratios=heights, hspace=gap_h / (sum(heights) / n_rows),
                              wspace=0.7 / panel_w, left=0.8 / width, right=1 - 1.35 / width,
                              top=1 - top_h / height, bottom=bottom_h / height)
        image = None
        for tp, sched, r, c in panels:
            pps, ms = axes_of_tp[tp]
            ax = fig.add_subplot(gs[r, c])
            cells = grid[(grid.tp == tp) & (grid.schedule == sched)].set_index(["pp", "num_micro_batches"])
            values = np.full((len(pps), len(ms)), np.nan)
            hatched: dict[str, list] = {}
            for i, pp in enumerate(pps):
                for j, m in enumerate(ms):
                    cell = cells.loc[(pp, m)]
                    if cell["status"] == "ok":
                        v = float(cell["samples_per_s"])
                        values[i, j] = v
                        rgba = cmap(norm(v))
                        lum = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]
                        ax.text(j, i, _fmt_value(v, vmax), ha="center", va="center", fontsize=fs,
                                color="black" if lum > 0.5 else "white", zorder=3)
                    else:
                        face, hatch, tcol, _ = _CELL_STYLE[cell["status"]]
                        hatched.setdefault(cell["status"], []).append(Rectangle((j - 0.5, i - 0.5), 1, 1))
                        ax.text(j, i, CELL_TEXT[cell["status"]], ha="center", va="center", fontsize=fs - 0.5,
                                color=tcol, zorder=3,
                                bbox=None if hatch is None else dict(boxstyle="square,pad=0.08", fc=face,
                                                                     ec="none"))
            for status, rects in sorted(hatched.items()):
                face, hatch, tcol, _ = _CELL_STYLE[status]
                ax.add_collection(PatchCollection(rects, facecolor=face, hatch=hatch, linewidth=0,
                                                  edgecolor="white" if hatch is None else tcol, zorder=1,
                                                  alpha=1.0 if hatch is None else 0.9))
            image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, origin="lower",
                              aspect="auto", interpolation="nearest", zorder=0.5,
                              extent=(-0.5, len(ms) - 0.5, -0.5, len(pps) - 0.5))
            for j in range(len(ms) + 1):
                ax.axvline(j - 0.5, color="white", linewidth=0.8, zorder=2)
            for i in range(len(pps) + 1):
                ax.axhline(i - 0.5, color="white", linewidth=0.8, zorder=2)
            if best is not None and best["tp"] == tp and best["schedule"] == sched:
                i, j = pps.index(best["pp"]), ms.index(best["num_micro_batches"])
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=BEST_COLOUR,
                                       linewidth=2.6, zorder=4))
            if (top is not None and top.tp == tp and top.schedule == sched and top.pp in pps
                    and top.num_micro_batches in ms):
                i, j = pps.index(top.pp), ms.index(top.num_micro_batches)
                ax.plot([j + 0.33], [i + 0.25], marker="*", markersize=8, color="white",
                        markeredgecolor="black", markeredgewidth=0.6, zorder=5, linestyle="none")
            ax.set_xlim(-0.5, len(ms) - 0.5)
            ax.set_ylim(-0.5, len(pps) - 0.5)
            ax.set_xticks(range(len(ms)))
            ax.set_xticklabels([str(m) for m in ms], rotation=0 if len(ms) * 3.2 <= panel_w * 12 else 90)
            ax.set_yticks(range(len(pps)))
            ax.set_yticklabels([str(p) for p in pps])
            ax.tick_params(length=2)
            for spine in ax.spines.values():
                spine.set_visible(False)
            name = schedule_title(sched)
            vp = [v for v in vps.get(sched, []) if v > 1]
            if vp:
                name += f" (vp {', '.join(map(str, vp))})"
            ax.set_title(name if len(axes_of_tp) == 1 else f"{name}, tensor parallel {tp}", fontsize=9.5)
            if r == n_rows - 1 or not any(rr == r + 1 and cc == c for *_, rr, cc in panels):
                ax.set_xlabel("micro-batches per replica, m")
            if c == 0:
                ax.set_ylabel("pipeline stages, pp")
        cax = fig.add_axes((1 - 1.1 / width, bottom_h / height, 0.16 / width, 1 - (top_h + bottom_h) / height))
        cbar = fig.colorbar(image, cax=cax)
        cbar.set_label("predicted throughput (samples/s)")

        while True:
            legend = fig.legend(handles=handles, loc="lower center", ncol=ncol, frameon=False,
                                bbox_to_anchor=(0.5, 0.05 / height), handleheight=1.3, columnspacing=1.5)
            if ncol == 1 or legend.get_window_extent(fig.canvas.get_renderer()).width <= 0.98 * fig.bbox.width:
                break
            legend.remove()  # wider than the figure: one column fewer
            ncol -= 1
        fig.suptitle(f"{title_of(plan_file)}: search space", y=1 - 0.18 / height, va="top")
        fig.text(0.5, 1 - 0.52 / height, sub, ha="center", va="top", fontsize=8, color="#333333")
        return save(fig, path)


def _subtitle(points, infeasible: dict, skipped: bool, present: set, vps: dict, width: float) -> str:
    """The space plot's subtitle: what a cell's colour and number are the
    best over, and what the pruned cells mean, wrapped to a figure of
    ``width`` inches (fontsize 8: at most 16 characters an inch)."""
    over = ["dp", "micro-batch size", "placement"]
    if any(len(v) > 1 for v in vps.values()):
        over.append("virtual stages")
    if points["recompute"].nunique() > 1:
        over.append("recompute")
    sub = f"colour and number: best predicted (simulated) samples/s over {', '.join(over)}"
    unlisted = (infeasible.get("pruned") or 0) - int((points["status"] == "pruned").sum()) if skipped else 0
    if unlisted > 0:  # whole groups pruned by their bound: counted in the file, not listed (docs/formats.md)
        sub += (f"\n{unlisted:,} points of whole (tp, pp, dp) groups pruned by their bound are not listed (their "
                "cells read 'bound', or are missing where no point of that tp or pp was listed): run "
                "`pipesearch plan --exhaustive` to draw every cell")
    elif "pruned" in present:
        sub += "\nsearch pruned by lower bound: run `pipesearch plan --exhaustive` to evaluate every cell"
    return "\n".join(textwrap.fill(part, max(40, int((width - 0.4) * 16))) for part in sub.split("\n"))


#: width of one column of the space plot's legend (inches; its labels wrap at :data:`LEGEND_CHARS`)
LEGEND_COLUMN_IN = 3.4
LEGEND_CHARS = 42


def _legend_handles(present: set, best, top) -> list:
    """The space plot's legend entries: the best cell, the rank-1 plan's
    star and each cell status in ``present``, labels wrapped at
    :data:`LEGEND_CHARS` characters."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def wrap(text: str) -> str:
        return "\n".join(textwrap.wrap(text, LEGEND_CHARS))

    handles = []
    if best is not None:
        handles.append(Patch(fill=False, edgecolor=BEST_COLOUR, linewidth=2.2,
                             label=wrap(f"best: {best['samples_per_s']:.1f} samples/s "
                                        f"({schedule_title(best['schedule'])}, pp {best['pp']}, dp {int(best['dp'])}, "
                                        f"tp {best['tp']}, m {best['num_micro_batches']})")))
    if top is not None:
        handles.append(Line2D([], [], marker="*", markersize=9, color="white", markeredgecolor="black",
                              linestyle="none", label="plan #1 (ranked by simulation)"))
    for status in ("out_of_memory", "schedule_refused", "pruned", "stopped_at_work_limits", "n/a"):
        if status in present:
            face, hatch, tcol, label = _CELL_STYLE[status]
            handles.append(Patch(facecolor=face, hatch=hatch, edgecolor=tcol if hatch else "#BBBBBB",
                                 linewidth=0.5, label=wrap(label)))
    return handles
