"""Throughput against peak memory per device for every evaluated point, with
the Pareto front and the ranked plans."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from ..plan import PlanFile
from .common import (GIB, capacities, figure, headroom_fraction, points_frame, reserve_bytes, save, schedule_colour,
                     schedule_title, title_of, usable_label)

FRONT_COLOUR = "#222222"
PLAN_COLOUR = "#E8112D"


def pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """The ok points no other ok point beats on both axes (higher samples/s
    and lower peak memory), sorted by memory; one row per distinct
    (memory, throughput) pair.

    Args:
        points: a points table (only rows with status ``ok`` are used).
    """
    ok = points[(points["status"] == "ok") & points["samples_per_s"].notna() & points["peak_memory_bytes"].notna()]
    ok = ok.sort_values(["peak_memory_bytes", "samples_per_s"], ascending=[True, False], kind="stable")
    keep, best = [], -np.inf
    for idx, thr in zip(ok.index, ok["samples_per_s"].to_numpy()):
        if thr > best:
            keep.append(idx)
            best = thr
    return ok.loc[keep]


def _group_labels(plans, x_of, y_of, xspan, yspan):
    """Plans whose markers (almost) coincide share one label: ``#1-4`` or ``#1,3``."""
    groups: list[list] = []
    for p in plans:
        for g in groups:
            q = g[0]
            if abs(x_of(p) - x_of(q)) <= 0.01 * xspan and abs(y_of(p) - y_of(q)) <= 0.015 * yspan:
                g.append(p)
                break
        else:
            groups.append([p])
    out = []
    for g in groups:
        ranks = sorted(p.rank for p in g)
        if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
            text = f"#{ranks[0]}-{ranks[-1]}"
        else:
            text = "#" + ",".join(map(str, ranks))
        out.append((g[0], text))
    return out


#: statuses of points that cannot run at all (a batch their dp does not
#: divide, a schedule that refuses their micro-batch count), not counted in
#: the space (the search does not count those of the groups it prunes whole)
NOT_IN_SPACE = ("batch_not_divisible", "schedule_refused")


def space_counts(points, search) -> dict[str, int]:
    """Points of the searched space by status: the points table's, with the
    search's own counts of the others where the plan file has them
    (``search.infeasible``: the points of groups its bound pruned whole are
    counted there, not listed)."""
    counts = {str(k): int(v) for k, v in points["status"].value_counts().items()}
    found = search.get("infeasible") if isinstance(search, dict) else None
    if isinstance(found, dict):
        counts.update({k: v for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool)})
    return counts


def plot_pareto(plan_file: PlanFile, path: str | PathLike[str], source: str = "plan file") -> Path:
    """Scatter of every evaluated ok point: predicted (simulated) samples/s
    against peak memory per device (GiB), coloured by schedule; the Pareto
    front (most throughput for the memory) as a step line; the ranked plans
    (simulated throughput) labelled with their rank; the device memory
    capacity (and the usable memory: capacity less the headroom and reserve) as vertical lines.

    Raises:
        PlanFormatError: no points table in the plan file.
    """
    from matplotlib.lines import Line2D

    points = points_frame(plan_file, source)
    ok = points[(points["status"] == "ok") & points["samples_per_s"].notna() & points["peak_memory_bytes"].notna()]
    front = pareto_front(points)
    caps = capacities(plan_file)
    reserve = reserve_bytes(plan_file)
    keep = 1 - headroom_fraction(plan_file)
    plans = list(plan_file.plans)

    n_lines = min(len(plans), 8)
    W, plot_h, line_h = 9.5, 4.2, 0.16
    foot = 0.6 + (line_h * n_lines + 0.2 if n_lines else 0.0)
    H = 0.75 + plot_h + foot
    with figure(W, H) as fig:
        ax = fig.add_axes((0.8 / W, foot / H, 6.3 / W, plot_h / H))
        handles = []
        schedules = [s for s in dict.fromkeys(points["schedule"].dropna()) if s in set(ok["schedule"])]
        for k, sched in enumerate(schedules):
            sub = ok[ok["schedule"] == sched]
            colour = schedule_colour(sched, k)
            ax.scatter(sub["peak_memory_bytes"] / GIB, sub["samples_per_s"], s=12, color=colour, alpha=0.45,
                       linewidths=0, zorder=2, rasterized=False)
            handles.append(Line2D([], [], marker="o", linestyle="none", color=colour, alpha=0.7, markersize=5,
                                  label=f"{schedule_title(sched)} ({len(sub)} points)"))
        if not front.empty:
            fx = front["peak_memory_bytes"].to_numpy() / GIB
            fy = front["samples_per_s"].to_numpy()
            ax.step(fx, fy, where="post", color=FRONT_COLOUR, linewidth=1.4, zorder=3)
            ax.scatter(fx, fy, s=22, facecolors="none", edgecolors=FRONT_COLOUR, linewidths=1.0, zorder=3)
            handles.append(Line2D([], [], color=FRONT_COLOUR, marker="o", markerfacecolor="none", linewidth=1.4,
                                  label="Pareto front (more samples/s\nfor less memory)"))

        xs = [v / GIB for v in ok["peak_memory_bytes"]] + [p.predicted.peak_memory_bytes / GIB for p in plans]
        ys = list(ok["samples_per_s"]) + [p.predicted.samples_per_s for p in plans]
        cap_lines = sorted(set(caps.values()))
        xmax = max(xs + [c / GIB for c in cap_lines] + [1.0]) * 1.06
        ymax = max(ys + [1.0]) * 1.15
        ax.set_xlim(0.0, xmax)
        ax.set_ylim(0.0, ymax)

        by_cap: dict[float, list[str]] = {}  # device types of one capacity share its line and its label
        for dev, cap in sorted(caps.items(), key=lambda kv: (kv[1], kv[0])):
            by_cap.setdefault(cap, []).append(dev)
        for cap, devs in by_cap.items():
            ax.axvline(cap / GIB, color="#B22222", linewidth=1.5, zorder=1)
            ax.text(cap / GIB, ymax * 0.985, f"{', '.join(devs)}: {cap / GIB:g} GiB ", rotation=90,
                    ha="right", va="top", fontsize=7.5, color="#B22222", zorder=4)
            if reserve > 0 or keep < 1:
                ax.axvline((cap * keep - reserve) / GIB, color="#B22222", linewidth=1.0, linestyle="--", zorder=1)
        handles.append(Line2D([], [], color="#B22222", linewidth=1.5, label="device memory capacity"))
        if reserve > 0 or keep < 1:
            handles.append(Line2D([], [], color="#B22222", linewidth=1.0, linestyle="--",
                                  label=usable_label(reserve, 1 - keep)))

        if plans:
            moved = []
            for p in plans:
                t = dict(p.extra).get("analytic_iteration_time_s")
                if isinstance(t, (int, float)) and t > 0 and dict(p.extra).get("simulated"):
                    a = p.predicted.samples_per_s * p.predicted.iteration_time_s / t
                    if abs(a - p.predicted.samples_per_s) > 5e-3 * ymax:
                        moved.append((p.predicted.peak_memory_bytes / GIB, a, p.predicted.samples_per_s))
            for x, a, sim in moved:
                ax.annotate("", (x, sim), xytext=(x, a), zorder=4,
                            arrowprops=dict(arrowstyle="->", color=PLAN_COLOUR, linewidth=0.9, linestyle=":",
                                            shrinkA=0, shrinkB=5))
            if moved:
                handles.append(Line2D([], [], color=PLAN_COLOUR, linewidth=0.9, linestyle=":",
                                      label="plan: analytic -> simulated"))
            px = [p.predicted.peak_memory_bytes / GIB for p in plans]
            py = [p.predicted.samples_per_s for p in plans]
            ax.scatter(px, py, s=70, marker="D", facecolors="none", edgecolors=PLAN_COLOUR, linewidths=1.6, zorder=5)
            labels = _group_labels(plans, lambda p: p.predicted.peak_memory_bytes / GIB,
                                   lambda p: p.predicted.samples_per_s, xmax, ymax)
            for n, (p, text) in enumerate(labels):
                x, y = p.predicted.peak_memory_bytes / GIB, p.predicted.samples_per_s
                dx = 10 if x < 0.75 * xmax else -10
                ax.annotate(text, (x, y), xytext=(dx, 8 + 11 * (n % 2)), textcoords="offset points",
                            ha="left" if dx > 0 else "right", va="bottom", fontsize=8.5, fontweight="bold",
                            color=PLAN_COLOUR, zorder=6,
                            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85),
                            arrowprops=dict(arrowstyle="-", color=PLAN_COLOUR, linewidth=0.8))
            handles.append(Line2D([], [], marker="D", linestyle="none", markerfacecolor="none",
                                  markeredgecolor=PLAN_COLOUR, markeredgewidth=1.6, markersize=7,
                                  label="ranked plans (#rank), simulated"))

        ax.set_xlabel("peak memory per device (GiB)")
        ax.set_ylabel("predicted throughput (samples/s)")
        ax.grid(True, color="#E5E5E5", linewidth=0.6, zorder=0)
        ax.set_axisbelow(True)
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, borderaxespad=0,
                  title="evaluated points (simulated)", title_fontsize=8, alignment="left")

        # the plans, spelled out
        lines = []
        for p in plans[:8]:
            rec = dict(p.extra).get("recompute", "none")
            lines.append(f"#{p.rank}  pp {p.pp} x dp {p.dp} x tp {p.tp}, {p.schedule}, mbs {p.micro_batch_size} x "
                         f"m {p.num_micro_batches}" + ("" if rec in (None, "none") else f", {rec} recompute")
                         + f": {p.predicted.samples_per_s:,.1f} samples/s, "
                         f"{p.predicted.peak_memory_bytes / GIB:.1f} GiB")
        if lines:
            fig.text(0.8 / W, (line_h * n_lines + 0.12) / H, "\n".join(lines), ha="left", va="top",
                     fontsize=7.5, family="DejaVu Sans Mono", linespacing=1.45)
        counts = space_counts(points, plan_file.search)
        n_all = sum(v for k, v in counts.items() if k not in NOT_IN_SPACE)
        fig.suptitle(f"{title_of(plan_file)}: throughput vs memory", y=1 - 0.12 / H, va="top")
        fig.text(0.5, 1 - 0.45 / H, f"{counts.get('ok', 0)} feasible points of {n_all} in the space "
                 f"({counts.get('out_of_memory', 0)} out of memory, {counts.get('pruned', 0)} pruned by bound"
                 + (f", {counts['same_as_other_placement']} the same as another placement"
                    if counts.get("same_as_other_placement") else "") + ")",
                 ha="center", va="top", fontsize=8, color="#333333")
        return save(fig, path)
