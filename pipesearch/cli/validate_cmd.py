"""``pipesearch validate``: check a plan file (or a serving plan file)
against its schema and the semantic rules; list every problem."""

from __future__ import annotations

import json

import click

from ..errors import InputError, PlanFormatError
from ..plan import _from_document, parse_json, plan_document, read_plan_text
from ..schema import schema_problems, serve_schema_problems
from ..schema.records import record_problems
from ..schema.digests import digest_problems, missing_digests_warning
from ..schema.semantics import points_against_plans, semantic_problems
from ..schema.serve_semantics import serve_semantic_problems
from . import main

#: relative difference between a plan's predicted iteration time and its
#: replay beyond which ``validate`` reports it (both are the same longest path)
REPLAY_REL_TOL = 1e-6

#: stage micro-batches (pp x vp x num_micro_batches) up to which ``validate``
#: replays a plan; larger plans are checked by ``pipesearch simulate``
MAX_REPLAYED_STAGE_MICRO_BATCHES = 200_000


def replay_problems(doc: dict) -> list[str]:
    """Plans whose ``predicted.iteration_time_s`` is not the simulated time
    of their own stage terms (:func:`pipesearch.point_plan.simulate_plan`), one
    line each."""
    from ..point_plan import plan_rank_busy_s, simulate_plan
    from ..timemodel import busiest_idle_fraction

    out = []
    for k, plan in enumerate(_from_document(doc).plans):
        if plan.pp * plan.vp * plan.num_micro_batches > MAX_REPLAYED_STAGE_MICRO_BATCHES:
            continue
        try:
            replay_s, timeline = simulate_plan(plan)
        except InputError as exc:
            out.append(f"plans[{k}]: the simulator refuses the plan ({exc})")
            continue
        predicted = plan.predicted.iteration_time_s
        if abs(replay_s - predicted) > REPLAY_REL_TOL * max(replay_s, predicted):
            fields = _replayed_fields(plan.schedule)
            out.append(f"plans[{k}].predicted.iteration_time_s: {predicted!r} s found, {replay_s!r} s expected "
                       f"(the replay, the simulated time of plans[{k}]'s own stage times{fields}: "
                       "pipesearch simulate); re-plan, or restore the edited field")
        out += [f"plans[{k}]{line}" for line in memory_disagreement(plan, timeline)]
        if plan.schedule not in ("mobius", "roundpipe"):  # their busy time counts copies (their own replays)
            bubble = busiest_idle_fraction(float(plan_rank_busy_s(plan, timeline).max()), replay_s)
            if abs(bubble - plan.predicted.bubble_fraction) > BUBBLE_TOL:
                out.append(f"plans[{k}].predicted.bubble_fraction: {plan.predicted.bubble_fraction!r} found, "
                           f"{bubble!r} expected (the replay's: the share of the iteration its busiest rank "
                           "idles, its GPU optimizer steps busy); re-plan, or restore the edited field")
    return out


#: absolute difference between a plan's recorded bubble fraction and its replay's beyond which validate reports it
BUBBLE_TOL = 1e-6


#: schedules whose replay counts every micro-batch's saved activations whole while
#: in flight, as the plan's memory does (ZB-H1 keeps only the weight-gradient
#: inputs between I and W; Mobius and RoundPipe move activations to the host)
MEMORY_REPLAYED_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs")


def memory_disagreement(plan, timeline) -> list[str]:
    """Ranks whose replayed peak of activations (``saved_bytes`` of every
    micro-batch in flight, :class:`pipesearch.simulate.Timeline`) exceeds the
    memory their stages record (``memory_bytes``, which holds those
    activations and the training state): the schedule, micro-batch count or
    saved bytes no longer match the memory (a hand edit), so the plan may not
    fit its devices. One line each (field first), empty when they agree."""
    if plan.schedule not in MEMORY_REPLAYED_SCHEDULES:
        return []
    out = []
    for r in range(plan.pp):
        recorded = sum(st.memory_bytes for st in plan.stages[r::plan.pp])
        held = timeline.peak_act_bytes[r]
        if held > recorded * (1 + REPLAY_REL_TOL):
            flight = ",".join(str(timeline.peak_in_flight[k]) for k in range(r, len(plan.stages), plan.pp))
            out.append(f".stages[{r}].memory_bytes: rank {r}'s stages record {recorded:.6g} B, but the replay of "
                       f"{plan.schedule} with {plan.num_micro_batches} micro-batches holds {held:.6g} B of "
                       f"activations alone at its peak (at most {flight} micro-batches in flight x saved_bytes); "
                       "the schedule, micro-batch count or saved_bytes were edited: re-plan")
    return out


def _replayed_fields(schedule: str) -> str:
    """The fields besides the stages' times that a schedule's replay reads."""
    return {"roundpipe": " and copies in options.roundpipe", "mobius": " and copies in options.mobius"}.get(
        schedule, "")


def plan_file_problems(doc: dict) -> list[str]:
    """Every problem ``pipesearch validate`` reports for a parsed plan
    document, one line each (empty when valid): the schema and semantic
    rules (:func:`pipesearch.plan.document_problems`), then the recorded
    copies and host terms against their formulas
    (:func:`pipesearch.schema.records.record_problems`), then the replay
    (:func:`replay_problems`). ``pipesearch export`` runs the same checks
    but the embedded exports' (:func:`export_problems`: it writes its own)."""
    return staged_problems(doc, embedded_exports=False)[1]


#: what each stage of :func:`staged_problems` leaves for later, said after its problems
LATER_CHECKS = {"schema": "the rules beyond the schema (layers, devices, degrees, batch, memory, rates), the recorded "
                          "copies and host terms and the replay of each plan's time are checked once these are fixed",
                "document": "the recorded copies and host terms and the replay of each plan's time are checked "
                            "once these are fixed",
                "records": "the replay of each plan's time is checked once these are fixed", "replay": ""}


def staged_problems(doc: dict, embedded_exports: bool = True) -> tuple[str, list[str]]:
    """:func:`plan_file_problems` with the stage that found them:
    ``"schema"``, ``"document"`` (the semantic rules), ``"records"``
    (recorded copies and host terms) or ``"replay"``; each runs only on a
    document the earlier ones accept (a replay of inconsistent records would
    be noise). ``embedded_exports``: also the plans' ``exports`` against
    their re-export (:func:`export_problems`)."""
    problems = schema_problems(doc)
    if problems:
        return "schema", [str(p) for p in problems]
    problems = semantic_problems(doc)
    if problems:
        return "document", [str(p) for p in problems]
    problems = record_problems(doc)
    if problems:
        return "records", [str(p) for p in problems]
    edited = [str(p) for p in digest_problems(doc)]  # an edited input changes the exports too: said once, there
    exports = export_problems(doc) if embedded_exports and not edited else []
    replayed = replay_problems(doc)
    points = [str(p) for p in points_against_plans(doc)] if not replayed else []  # the plans' times hold first
    return "replay", replayed + points + edited + exports


def export_problems(doc: dict) -> list[str]:
    """Plans whose embedded ``exports`` are not the exports of the plan as
    the file records it (:func:`pipesearch.export.export_all`, what
    ``pipesearch export`` writes): an edited runtime config the README calls
    runnable as written. The first difference of each plan, one line."""
    from ..export import export_all
    from ..schema.digests import canonical

    plan_file = _from_document(doc)
    out = []
    for k, (plan, obj) in enumerate(zip(plan_file.plans, doc["plans"])):
        recorded = obj.get("exports")
        if not isinstance(recorded, dict):
            continue  # a file without exports (they are optional)
        expected = canonical(json.loads(json.dumps(export_all(plan, plan_file.inputs))))
        where, found, want = _first_difference(canonical(recorded), expected, f"plans[{k}].exports")
        if where is not None:
            out.append(f"{where}: {_short(found)} found, {_short(want)} expected (the export of the plan as the file "
                       "records it: pipesearch export; an edited field, or exports of an older pipesearch); "
                       "re-plan, or restore the field")
    return out


def _first_difference(found, want, where: str):
    """``(path, found, expected)`` of the first place two JSON values
    differ (keys in sorted order), ``(None, None, None)`` when equal."""
    if isinstance(found, dict) and isinstance(want, dict):
        for key in sorted(set(found) | set(want)):
            if key not in found or key not in want:
                return f"{where}.{key}", found.get(key, "(missing)"), want.get(key, "(missing)")
            hit = _first_difference(found[key], want[key], f"{where}.{key}")
            if hit[0] is not None:
                return hit
        return None, None, None
    if isinstance(found, list) and isinstance(want, list):
        for i, (a, b) in enumerate(zip(found, want)):
            hit = _first_difference(a, b, f"{where}[{i}]")
            if hit[0] is not None:
                return hit
        if len(found) == len(want):
            return None, None, None
        k = min(len(found), len(want))  # one list runs on: its first element past the other's end
        return f"{where}[{k}]", (found[k] if k < len(found) else "(missing)"), (want[k] if k < len(want) else
                                                                               "(missing)")
    if isinstance(found, str) and isinstance(want, str) and found != want and "\n" in found + want:
        return _first_line_difference(found, want, where)
    return (None, None, None) if found == want else (where, found, want)


def _first_line_difference(found: str, want: str, where: str):
    """A file's text: ``(where line K, found, expected)`` for its first line
    that differs (split at newlines only, so a carriage return or a missing
    last newline differs too), a long one cut to the text around the first
    character that differs (``...`` where cut), or ``(end of text)`` past
    the shorter text's end."""
    a_lines, b_lines = found.split("\n"), want.split("\n")
    k = next((i for i, (a, b) in enumerate(zip(a_lines, b_lines)) if a != b), min(len(a_lines), len(b_lines)))
    a, b = (lines[k] if k < len(lines) else None for lines in (a_lines, b_lines))
    if a is None or b is None:
        return f"{where} line {k + 1}", END if a is None else a[:70], END if b is None else b[:70]
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, i - 30) if max(len(a), len(b)) > 70 else 0  # a short line whole

    def cut(text: str) -> str:
        return ("..." if lo else "") + text[lo:lo + 60] + ("..." if len(text) > lo + 60 else "")

    return f"{where} line {k + 1}, character {i + 1}", cut(a), cut(b)


#: what :func:`_first_line_difference` shows past a text's last line
END = "(end of text)"


def _short(value) -> str:
    """A value for a one-line message: its JSON, cut at 80 characters."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a count read back as JSON's number: 4, not 4.0
    text = value if isinstance(value, str) and value in ("(missing)", END) else json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def warn_missing_digests(path: str, doc: dict) -> None:
    """On stderr, a warning line when the plan file at ``path`` has no
    digests (:func:`pipesearch.schema.digests.missing_digests_warning`)."""
    missing = missing_digests_warning(doc)
    if missing is not None:
        click.echo(f"warning: {path}: {missing}", err=True)


@main.command("validate")
@click.argument("plans", metavar="PLANS.json", type=click.Path(dir_okay=False))
def validate_command(plans):
    """Check a plan file: the JSON Schema of pipesearch.plan/1 (shipped in the
    package) and the rules a schema cannot express (stages cover exactly the
    model's layers, devices exist and serve one pipeline slot, pp x dp x tp
    fits the cluster, micro-batch size x count x dp is the global batch).

    Also: stages fit their devices' memory, ranks follow the iteration time
    (up to the 0.1% tie window, where lower peak memory ranks first), a
    RoundPipe or Mobius plan's recorded copies and host terms follow from
    its stage bytes and the cluster's [host] table, each plan's predicted
    iteration time is the simulated time of its own stage terms (a replay),
    the inputs and each plan's degrees, schedule and options are those it
    was planned for (the file's digests), and each plan's embedded exports
    are what pipesearch export writes for it.

    A serving plan file (pipesearch.serve/1, written by pipesearch serve) is
    checked against its own schema and rules: stages cover the decoder
    layers, devices exist and serve one stage, the KV pool is the least
    stage's, the cycle and total rate follow from the stage and replica
    figures, and each engine command gives the plan's degrees, split,
    limits, context, memory share and dtypes. The stages' weights, KV
    tokens and step times and the predicted rates themselves are not
    recomputed (pipesearch serve does that from the inputs).

    Prints one line per problem on stdout (and, when the schema or the
    recorded terms fail, a line saying the later checks wait for them) and
    exits with status 2 when there is any; prints a summary and exits 0 when the file is valid.

    \b
    Examples:
      pipesearch plan -o plans.json
      pipesearch validate plans.json
      pipesearch serve -o serving.json
      pipesearch validate serving.json
    """
    value = parse_json(read_plan_text(plans), plans)
    if _is_serving(value):
        _validate_serving(plans, value)
        return
    doc = plan_document(value, plans)
    stage, problems = staged_problems(doc)
    if problems:
        _report(plans, problems, LATER_CHECKS[stage])
    warn_missing_digests(plans, doc)
    n = len(doc["plans"])
    click.echo(f"{plans}: valid {doc['schema']} file, {n} plan{'s' if n != 1 else ''} "
               f"({doc['inputs']['model']['name']} on {doc['inputs']['cluster']['name']})")


def _report(path: str, problems: list, later: str) -> None:
    """Print each problem (and what waits for them) and raise the exit's error."""
    for problem in problems:
        click.echo(f"{path}: {problem}")
    if later:
        click.echo(f"{path}: {later}")
    raise PlanFormatError(f"{path}: {len(problems)} problem(s), the first: {problems[0]}")


def _is_serving(value) -> bool:
    """Whether a parsed file is a serving plan file: an object whose
    ``format`` names ``pipesearch.serve/`` (any version; its schema says
    which it reads)."""
    return isinstance(value, dict) and "schema" not in value and str(value.get("format", "")).startswith(
        "pipesearch.serve/")


def _validate_serving(path: str, doc: dict) -> None:
    """``validate`` of a serving plan file: its schema, then its rules
    (:mod:`pipesearch.schema.serve_semantics`) once the schema holds."""
    problems = [str(p) for p in serve_schema_problems(doc)]
    if problems:
        _report(path, problems, "the rules beyond the schema (layers, devices, pools, rates, engine commands) are "
                                "checked once these are fixed")
    problems = [str(p) for p in serve_semantic_problems(doc)]
    if problems:
        _report(path, problems, "")
    n = len(doc["plans"])
    click.echo(f"{path}: valid {doc['format']} file, {n} plan{'s' if n != 1 else ''} "
               f"({doc['inputs']['model']['name']} on {doc['inputs']['cluster']['name']})")
