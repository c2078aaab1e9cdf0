"""``pipesearch simulate``: replay a plan's schedule; print the figures; draw the timeline."""

from __future__ import annotations

import click
import numpy as np

from ..errors import InputError
from ..output import check_distinct_paths, check_suffix, check_writable, write_outputs
from ..plan import read_plan_file, select_plan
from ..schedules import build, to_torch_csv
from ..point_plan import plan_rank_busy_s, simulate_plan
from ..timemodel import busiest_idle_fraction
from ..units import format_bytes, format_seconds
from . import main
from .validate_cmd import memory_disagreement

#: relative difference between the replayed and the file's iteration time
#: beyond which ``simulate`` warns (both are the same longest path; they agree
#: to about 1e-14 for every plan the search writes)
TIME_REL_TOL = 1e-9


def time_disagreement(path: str, rank: int, replayed_s: float, recorded_s: float,
                      drawn: str = "the figures are the replay's") -> str | None:
    """One warning line when a plan's replay ``replayed_s`` differs from
    its file's ``predicted.iteration_time_s`` ``recorded_s`` beyond
    :data:`TIME_REL_TOL` relative, naming the file and both times and
    ending with ``drawn`` (which of the two what follows shows); None when
    they agree."""
    if abs(replayed_s - recorded_s) <= TIME_REL_TOL * max(abs(replayed_s), abs(recorded_s)):
        return None
    return (f"{path}: plan of rank {rank}: the replay takes {replayed_s:.12g} s, the file's "
            f"predicted.iteration_time_s is {recorded_s!r} s; the file's stage times, copies or prediction were "
            f"edited (pipesearch validate {path} names the field); {drawn}")


def replay(plan, path: str, rank: int):
    """``(total_s, timeline)`` of :func:`pipesearch.point_plan.simulate_plan`
    for the plan of ``rank`` in file ``path``.

    Raises:
        InputError: a valid file whose plan the simulator still refuses,
            named by file and plan.
    """
    try:
        return simulate_plan(plan)
    except InputError as exc:
        raise InputError(f"{path}: plan of rank {rank}: {exc}") from None


def replay_warnings(path: str, rank: int, plan, total_s: float, tl,
                    drawn: str = "the figures are the replay's") -> list[str]:
    """The lines that say a plan's replay (``total_s`` and timeline ``tl``
    of :func:`pipesearch.point_plan.simulate_plan`) disagrees with its file:
    the iteration time (:func:`time_disagreement`, ending with ``drawn``)
    and each stage's memory
    (:func:`pipesearch.cli.validate_cmd.memory_disagreement`)."""
    time = time_disagreement(path, rank, total_s, plan.predicted.iteration_time_s, drawn)
    return [time] * bool(time) + [f"{path}: plan of rank {rank}{line}" for line in memory_disagreement(plan, tl)]


def edit_warnings(path: str, doc: dict, plan_file, rank: int | None = None, figures: bool = True) -> list[str]:
    """The lines that say which parts of the plan file at ``path`` (its
    document ``doc`` and :class:`PlanFile` ``plan_file``,
    :func:`pipesearch.plan.read_plan_file`) were edited after planning
    (:func:`pipesearch.schema.digests.digest_problems`, what ``validate``
    and ``export`` refuse), or that it has no digests: its inputs' and,
    with ``rank``, that plan's (without: the inputs' alone; ``simulate``
    and ``plot`` still draw the file's own figures, which were computed for
    what was planned). ``figures=False`` leaves out the plan's recorded
    figures (said once, by the replay's own line, when it disagrees)."""
    from ..schema.digests import FIGURES, digest_problems, missing_digests_warning

    index = next((k for k, p in enumerate(plan_file.plans) if p.rank == rank), None)
    mine = f"plans[{index}]"
    missing = missing_digests_warning(doc)
    return [f"{path}: {missing}"] * (missing is not None) + [
        f"{path}: {problem}" for problem in digest_problems(doc)
        if (not problem.where.startswith("plans[") or problem.where.startswith(mine + ".") or problem.where == mine)
        and (figures or problem.where != f"{mine}.{FIGURES}")]


def plan_title(plan_file, plan, iteration_time_s: float) -> str:
    """``model on cluster, pp x dp x tp, schedule, mbs x m: iteration time``."""
    model = plan_file.inputs.get("model", {}).get("name", "model")
    cluster = plan_file.inputs.get("cluster", {}).get("name", "cluster")
    batch = plan_file.inputs.get("job", {}).get("global_batch_size", "?")
    vp = f", vp {plan.vp}" if plan.vp > 1 else ""
    if plan.stage_replicas is not None:
        vp += f", replicas {','.join(map(str, plan.stage_replicas))}"
    return (f"{model} on {cluster}, global batch {batch}: pp {plan.pp} x dp {plan.dp} x tp {plan.tp}{vp}, "
            f"{plan.schedule}, {plan.micro_batch_size} x {plan.num_micro_batches} micro-batches; "
            f"iteration {format_seconds(iteration_time_s)}")


def host_step_terms(plan, tl, total_s: float) -> str | None:
    """The summary's terms after the pipeline when stages step their
    optimizer on the host (``host_step_s > 0``: ZeRO-Offload's CPU Adam with
    its gradient and weight copies, Ren et al. ATC'21), None otherwise.

    The time model (:func:`pipesearch.timemodel.simulate_times`) ends the
    iteration at ``max_r (end_r + allreduce_r)``, each rank's ``allreduce_r``
    holding its stages' host steps; the rank that sets it is named, with its
    host step and the rest of its data-parallel communication (which may
    start before the pipeline's end: rank ``r`` ends its last action at
    ``end_r``; Mobius' ``end_r`` includes its last gradient copy, hence the
    start shown is ``T - allreduce_r``). RoundPipe steps every group on one CPU after the GPUs finish
    (:func:`pipesearch.timemodel._roundpipe_total`); a delayed step runs beside
    the next iteration (:func:`pipesearch.timemodel.delayed_host_time_s`).
    """
    st = plan.stages
    host = np.array([s.host_step_s for s in st], dtype=float)
    if not st or host.max() <= 0:
        return None
    pipe = f"pipeline {format_seconds(tl.iteration_time_s)}"
    word = "host optimizer step (CPU Adam and its copies)"
    if dict(plan.extra or ()).get("optimizer_step") == "delayed":
        return None  # beside the next iteration: delayed_host_note
    ar = np.array([s.allreduce_s for s in st], dtype=float)
    if plan.schedule == "roundpipe":
        return (f"{pipe} + {format_seconds(total_s - tl.iteration_time_s)} after it, of which the {word} of every "
                f"group on the CPU {format_seconds(float(host.sum()))}")
    ranks = np.arange(len(st)) % plan.pp
    h_r = np.bincount(ranks, weights=host, minlength=plan.pp)
    ar_r = np.bincount(ranks, weights=ar, minlength=plan.pp)
    ends = np.asarray(tl.rank_end_s, dtype=float) if len(tl.rank_end_s) == plan.pp else np.full(plan.pp,
                                                                                                 tl.iteration_time_s)
    r = int(np.argmax(ends + ar_r))
    if ends[r] + ar_r[r] <= tl.iteration_time_s:
        return f"{pipe}, {word} hidden: the longest, rank {r}'s, {format_seconds(float(h_r.max()))}"
    comm = ar_r[r] - h_r[r]
    start = max(float(ends[r]), total_s - float(ar_r[r]))  # Mobius: its last gradient copy may end after its last action
    return (f"{pipe} + {format_seconds(total_s - tl.iteration_time_s)} after it: rank {r}'s {word} "
            f"{format_seconds(float(h_r[r]))}"
            + (f" and data-parallel communication {format_seconds(float(comm))}" if comm > 0 else "")
            + f" from {format_seconds(start)}, after its last action and copies")


def delayed_host_note(plan) -> str | None:
    """For a plan that delays its host optimizer step one iteration, the
    host's work per iteration (:func:`pipesearch.timemodel.delayed_host_time_s`:
    each rank's stages' steps in a row, the longest; RoundPipe: every group
    on one CPU), which runs beside the next iteration's pipeline; None
    otherwise."""
    host = np.array([s.host_step_s for s in plan.stages], dtype=float)
    if dict(plan.extra or ()).get("optimizer_step") != "delayed" or not len(host) or host.max() <= 0:
        return None
    if plan.schedule == "roundpipe":
        return (f"host optimizer step (CPU Adam and its copies) of every group {format_seconds(float(host.sum()))}, "
                f"delayed beside the next iteration")
    per_rank = np.bincount(np.arange(len(host)) % plan.pp, weights=host, minlength=plan.pp)
    r = int(np.argmax(per_rank))
    return (f"host optimizer step (CPU Adam and its copies) of rank {r} {format_seconds(float(per_rank[r]))} "
            f"(the longest), delayed beside the next iteration")


def zero_bubble_activations(plan, ranks: int) -> list[float] | None:
    """Per rank, the activation bytes the plan's memory model gives a
    ZB-H1 plan's device (its one stage's ``activations`` part: saved
    activations until ``I``, then only the ``W`` inputs until ``W``), or
    None for other schedules, plans without a memory breakdown and plans
    whose stages are not its ``ranks`` ranks one to one."""
    if (plan.schedule != "zb-h1" or plan.vp != 1 or len(plan.stages) != ranks
            or not all(st.memory_breakdown for st in plan.stages)):
        return None
    return [float(dict(st.memory_breakdown).get("activations", 0.0)) for st in plan.stages]


@main.command("simulate")
@click.argument("plans", type=click.Path(dir_okay=False))
@click.option("--rank", type=click.IntRange(min=1), default=1, show_default=True, help="Which plan of the file.")
@click.option("--timeline", type=click.Path(dir_okay=False, writable=True),
              help="Draw the Gantt chart to this file (.png, .svg or .pdf).")
@click.option("--torch-csv", type=click.Path(dir_okay=False, writable=True),
              help="Write the per-rank action order in torch.distributed.pipelining's CSV form.")
@click.option("--window", help="Draw only this part of the timeline, FROM_MS:TO_MS (e.g. 0:200 or 1500:), "
                               "to read many micro-batches.")
def simulate_command(plans, rank, timeline, torch_csv, window):
    """Replay a plan's schedule in the discrete-event simulator.

    Prints the simulated iteration time next to the analytic one, the busy
    fraction and peak activation memory on the device of every rank (an
    offloading stage counts its resident micro-batches only; under ZB-H1 the
    plan's figure, which keeps only the W inputs between I and W, then the
    simulator's with every micro-batch's activations held whole until W). When the
    replayed time differs from the file's predicted iteration time (an
    edited file), one warning line on stderr names the file and both times.

    \b
    Examples:
      pipesearch plan -o plans.json
      pipesearch simulate plans.json --rank 1 --timeline timeline.png
      pipesearch simulate plans.json --torch-csv order.csv
      pipesearch simulate plans.json --timeline zoom.png --window 0:200
    """
    window_s = None
    if window is not None:
        from ..plots.timeline import parse_window

        if timeline is None:
            raise InputError("--window: needs --timeline FILE")
        window_s = parse_window(window)
    if timeline is not None:
        from ..plots.common import check_output

        check_writable(timeline, "--timeline")
        check_output(timeline)
    if torch_csv is not None:
        check_suffix(torch_csv, "--torch-csv", ".csv", "torch's pipeline order is CSV")
        check_writable(torch_csv, "--torch-csv")
    check_distinct_paths({"--timeline": timeline, "--torch-csv": torch_csv}, {"PLANS": plans})
    doc, plan_file = read_plan_file(plans)
    plan = select_plan(plan_file, rank, plans)
    total_s, tl = replay(plan, plans, rank)
    if timeline is not None:
        from ..plots.timeline import allreduce_spans, drawn_end_s, plan_pcie_rows

        spans = allreduce_spans(plan, tl, total_s)
        pcie = plan_pcie_rows(plan, tl)  # every copy to or from host memory, on its PCIe lane
        end_s = drawn_end_s(tl, spans, pcie)
        if window_s is not None and window_s[0] * 1e3 >= round(end_s * 1e3, 3):
            raise InputError(f"--window {window!r}: starts at {window_s[0] * 1e3:g} ms, after the timeline ends at "
                             f"{end_s * 1e3:.3f} ms; give a FROM below that")
    disagreement = time_disagreement(plans, rank, total_s, plan.predicted.iteration_time_s)
    replayed = replay_warnings(plans, rank, plan, total_s, tl)
    for line in edit_warnings(plans, doc, plan_file, rank, figures=not replayed) + replayed:
        click.echo(f"warning: {line}", err=True)
    analytic = dict(plan.extra).get("analytic_iteration_time_s")
    click.echo(plan_title(plan_file, plan, total_s))
    tail = total_s - tl.iteration_time_s
    replicated = plan.dp > 1 or bool(plan.stage_replicas)
    parts = ["data-parallel communication"] if replicated else []
    parts += ["optimizer step"] if any(st.optimizer_step_s > 0 for st in plan.stages) else []
    after = " and ".join(parts) or "communication"
    how = host_step_terms(plan, tl, total_s) or (
           f"pipeline {format_seconds(tl.iteration_time_s)} + {after} left after the last backward "
           f"{format_seconds(tail)}" + ("" if replicated else " (stages' allreduce_s; dp = 1: no all-reduce)")
           if tail > 0 else
           f"pipeline {format_seconds(tl.iteration_time_s)}, no all-reduce: dp = 1"
           if not replicated else f"pipeline {format_seconds(tl.iteration_time_s)}, all-reduce hidden")
    delayed = delayed_host_note(plan)
    if delayed:
        how += f"; {delayed}"
    click.echo(f"simulated iteration: {format_seconds(total_s)} ({how}); "
               f"textbook closed form (sends not overlapped, secondary): "
               f"{format_seconds(analytic) if analytic else 'n/a'}"
               + (" (as recorded in the file, not recomputed)" if analytic and disagreement else ""))
    busy = plan_rank_busy_s(plan, tl)  # a GPU optimizer step is the rank's own work
    click.echo(f"bubble (busiest rank idle): {100 * busiest_idle_fraction(float(busy.max()), total_s):.1f}%")
    held = zero_bubble_activations(plan, tl.num_ranks)
    for r in range(tl.num_ranks):
        peak = format_bytes(tl.peak_act_bytes[r])
        click.echo(f"  rank {r}: busy {100 * busy[r] / total_s if total_s > 0 else 0.0:5.1f}%  "
                   f"peak activations on the device "
                   + (peak if held is None else f"{format_bytes(held[r])} ({peak} held whole)"))
    whole = "each micro-batch's activations counted whole until its weight gradient W: an upper bound"
    if held is not None:
        click.echo(f"  (the plan's activations: only the W inputs are kept between I and W, docs/schedules.md; "
                   f"held whole: {whole})")
    elif plan.schedule == "zb-h1":  # the one schedule with I / W actions
        click.echo(f"  ({whole}; the plan's memory keeps only the W inputs between I and W, docs/schedules.md)")
    outputs = []  # written together: all or none (output.write_outputs)
    if timeline is not None:
        from ..plots.timeline import allreduce_label, plot_timeline

        outputs.append((timeline, lambda p: plot_timeline(tl, p, plan_title(plan_file, plan, total_s), allreduce=spans,
                                                          allreduce_label_text=allreduce_label(plan),
                                                          window_s=window_s, pcie=pcie), "timeline"))
    if torch_csv is not None:
        text = to_torch_csv(build(plan.schedule, plan.pp, plan.num_micro_batches, plan.vp))
        outputs.append((torch_csv, lambda p: p.write_text(text), "torch CSV"))
    for path in write_outputs(outputs) if outputs else ():
        click.echo(f"wrote {path}")
