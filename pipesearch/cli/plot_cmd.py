"""``pipesearch plot``: figures of a plan file (search space, Pareto front,
per-stage breakdown, simulated timeline)."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from ..output import check_distinct_paths, check_writable
from ..plots.common import KINDS, render
from . import main
from .params import option_given


@main.command("plot")
@click.argument("plan_file", metavar="PLANS.json", type=click.Path(dir_okay=False))
@click.option("--kind", type=click.Choice(KINDS), default="space", show_default=True,
              help="space: throughput heatmap over pp x micro-batches (per schedule, tp); pareto: throughput vs "
                   "peak memory with the Pareto front; stages: per-stage time and memory of one plan; "
                   "timeline: simulated Gantt chart of one plan.")
@click.option("--rank", type=click.IntRange(min=1), default=1, show_default=True,
              help="Plan to draw (stages, timeline).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Figure file; the format follows the suffix (.png, .svg, .pdf). Default: KIND.png.")
def plot_command(plan_file, kind, rank, output):
    """Draw a figure of a plan file written by `pipesearch plan -o`.

    \b
    Examples:
      pipesearch plan --exhaustive -o plans.json
      pipesearch plot plans.json --kind space -o space.png
      pipesearch plot plans.json --kind pareto -o pareto.png
      pipesearch plot plans.json --kind stages --rank 2 -o stages.png
      pipesearch plot plans.json --kind timeline -o timeline.svg

    The space plot shows cells skipped by the search's lower bound as
    "bound"; `pipesearch plan --exhaustive` evaluates them all.
    """
    if kind in ("space", "pareto") and option_given(click.get_current_context(), "rank"):
        raise InputError(f"--rank {rank} with --kind {kind}: that figure draws every point of the search, not one "
                         "plan; --rank picks the plan of --kind stages or timeline")
    if output is not None:
        check_writable(output, "figure (-o)")
    check_distinct_paths({"-o": output or f"{kind}.png"}, {"PLANS.json": plan_file})
    from ..plan import read_plan_file, select_plan
    from .simulate_cmd import edit_warnings, replay, replay_warnings

    raw, doc = read_plan_file(plan_file)  # read once: drawn below
    one = kind in ("stages", "timeline")  # one plan drawn, else every point (searched for the file's inputs)
    replayed = []
    if one:  # and say so when the plan disagrees with its replay
        plan = select_plan(doc, rank, plan_file)
        total_s, tl = replay(plan, plan_file, rank)
        drawn = ("the timeline drawn is the replay's" if kind == "timeline" else
                 "the stages figure draws the file's own stage times and figures")
        replayed = replay_warnings(plan_file, rank, plan, total_s, tl, drawn)
    warnings = edit_warnings(plan_file, raw, doc, rank if one else None, figures=not replayed) + replayed
    for line in warnings:
        click.echo(f"warning: {line}", err=True)
    out = render(kind, doc, f"{kind}.png" if output is None else output, rank=rank, source=str(plan_file))
    click.echo(f"wrote {Path(out)}")
