"""Plan files: :class:`PlanFile` <-> versioned JSON (``pipesearch.plan/1``).

Layout (every number carries its unit in its key; ``layers`` is half-open)::

    {"schema": "pipesearch.plan/1",
     "inputs": {"model": {...}, "cluster": {...}, "job": {...}, "fingerprint": "sha256:..."},
     "search": {"points_evaluated": N, "infeasible": {"out_of_memory": N, ...}, "wall_s": x,
                "points": {"columns": ["tp", ...], "values": [[...one list per column...], ...]}},
     "plans": [{"rank": 1,
                "parallelism": {"pp": 4, "dp": 2, "tp": 1, "vp": 1},
                "schedule": {"name": "1f1b", "micro_batch_size": 4, "num_micro_batches": 16},
                "stages": [{"index": 0, "layers": [0, 12], "layer_names": [...],
                            "devices": [...], "device_type": "v100-16gb",
                            "fwd_s": x, "compute_s": x, "comm_s": x, "allreduce_s": x, "dp_comm_s": x,
                            "memory_bytes": n, "send_bytes": n, "saved_bytes": n,
                            "bwd_input_s": x}],
                "predicted": {"iteration_time_s": x, "analytic_iteration_time_s": x,
                              "samples_per_s": x, "bubble_fraction": x,
                              "peak_memory_bytes": n, "memory_capacity_bytes": n},
                "options": {"placement": "pipeline", "recompute": "none", ...},
                "exports": {...}}]}

``predicted.iteration_time_s`` is the simulated time when the plan was
simulated (``options.simulated``), else the analytic one; ``bubble_fraction``
is the share of the iteration the busiest stage's devices are idle.
:func:`load_plan_file` validates a file against the JSON Schema shipped in
the package (``pipesearch/schema/plan-1.schema.json``) and the semantic
checks of :mod:`pipesearch.schema.semantics`, and gives back an object equal
to the one :func:`dump_plan_file` wrote.

``search.points``, the table of every visited point, is written by column
(:func:`points_block`: ``columns`` names them, ``values[k]`` holds column
``k``, one line of the file per column); files with the table by row
(``data``: one list per point, pandas ``orient="split"``, written before the
columnar form) still load, and :func:`points_columns` reads both.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from .errors import InputError, PlanFormatError
from .input_files import parse_failure, read_input_text, unique_keys
from .output import write_text
from .schema import Problem, schema_problems, show
from .schema.digests import planned_digests
from .schema.semantics import semantic_problems
from .types import Plan, Prediction, StagePlan

SCHEMA = "pipesearch.plan/1"


@dataclass(frozen=True)
class PlanFile:
    """The contents of a plan file: inputs and search bookkeeping as JSON
    objects, plans as :class:`Plan` values."""

    inputs: dict
    search: dict
    plans: tuple[Plan, ...]
    exports: tuple[dict, ...] = ()


def _freeze(value):
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    return value


def _thaw(value, copy_strings: bool = True):
    """``value`` as JSON data: tuples as lists, dicts copied, non-finite
    floats as None. ``copy_strings`` False (for JSON text alone) leaves
    sequences of strings, and sequences of them, as they are (``json``
    writes a tuple as a list): nothing in them to convert."""
    if isinstance(value, (tuple, list)):
        kinds = set(map(type, value))
        if kinds <= {str}:  # names (~10^5 for long chains): nothing to convert
            return list(value) if copy_strings else value
        if kinds <= {tuple, list} and set(map(type, chain.from_iterable(value))) <= {str}:  # modules per layer
            return list(map(list, value)) if copy_strings else value
        return [_thaw(v, copy_strings) for v in value]
    if isinstance(value, dict):
        return {k: _thaw(v, copy_strings) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def plan_to_dict(plan: Plan, exports: dict | None = None) -> dict:
    """One plan as its JSON object."""
    options = dict(plan.extra)
    analytic = options.pop("analytic_iteration_time_s", plan.predicted.iteration_time_s)
    out = {
        "rank": plan.rank,
        "parallelism": {"pp": plan.pp, "dp": plan.dp, "tp": plan.tp, "vp": plan.vp},
        "schedule": {"name": plan.schedule, "micro_batch_size": plan.micro_batch_size,
                     "num_micro_batches": plan.num_micro_batches},
        "stages": [
            {"index": s.index, "layers": list(s.layers), "layer_names": list(s.layer_names),
             "devices": list(s.devices), "device_type": s.device_type, "fwd_s": s.fwd_s,
             "compute_s": s.compute_s, "comm_s": s.comm_s, "allreduce_s": s.allreduce_s, "dp_comm_s": s.dp_comm_s,
             "memory_bytes": s.memory_bytes, "send_bytes": s.send_bytes, "saved_bytes": s.saved_bytes,
             "bwd_input_s": s.bwd_input_s, "optimizer_step_s": s.optimizer_step_s,
             "memory_breakdown_bytes": dict(s.memory_breakdown),
             **({"memory_option": s.memory_option, "host_step_s": s.host_step_s} if s.memory_option else {})}
            | ({"replicas": s.replicas} if s.replicas is not None else {})
            for s in plan.stages
        ],
        "predicted": {
            "iteration_time_s": plan.predicted.iteration_time_s,
            "analytic_iteration_time_s": analytic,
            "samples_per_s": plan.predicted.samples_per_s,
            "bubble_fraction": plan.predicted.bubble_fraction,
            "peak_memory_bytes": plan.predicted.peak_memory_bytes,
            "memory_capacity_bytes": plan.predicted.memory_capacity_bytes,
            "tokens_per_iteration": plan.predicted.tokens_per_iteration,
            "model_flops_per_iteration": plan.predicted.model_flops_per_iteration,
            "peak_flops": plan.predicted.peak_flops,
            "num_devices": plan.predicted.num_devices,
            "tokens_per_s": plan.predicted.tokens_per_s,
            "tokens_per_s_per_device": plan.predicted.tokens_per_s_per_device,
            "mfu": plan.predicted.mfu,
        },
        "options": _thaw(options),
    }
    if exports is not None:
        out["exports"] = _thaw(exports)
    return out


def _cell(value):
    """One points-table value as JSON: NaN -> null, numpy scalars -> Python."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, float) or hasattr(value, "dtype") and value.dtype.kind == "f":
        return None if value != value else float(value)
    return int(value) if hasattr(value, "dtype") else value


def points_block(columns: dict) -> dict:
    """The ``search.points`` object of a table given by column (``{name:
    sequence}``, sequences of one length): ``{"columns": [names], "values":
    [column, ...]}``, NaN as null."""
    return {"columns": list(columns), "values": [_column_cells(col) for col in columns.values()]}


_PLAIN_CELLS = frozenset({str, bool, int, type(None)})


def _column_cells(col) -> list:
    """``[_cell(v) for v in col]`` with one type test per column: a column
    of Python ``str`` / ``bool`` / ``int`` / None is copied as it is, one of
    Python floats has only its NaNs replaced; any other mix goes cell by
    cell (the same values either way)."""
    kinds = set(map(type, col))
    if kinds <= _PLAIN_CELLS:
        return list(col)
    if kinds == {float}:
        return [None if v != v else v for v in col]
    return [_cell(v) for v in col]


def points_columns(block: dict) -> tuple[list[str], list[list]]:
    """Column names and column values of a ``search.points`` object in either
    layout: by column (``values``) or by row (``data``, older files). The
    object must be schema-valid."""
    names = list(block["columns"])
    if "values" in block:
        return names, [list(col) for col in block["values"]]
    rows = block["data"]
    return names, [[row[k] for row in rows] for k in range(len(names))]


_POINTS_MARK = "\u0000points\u0000"


def to_json(plan_file: PlanFile) -> str:
    """The plan file as pretty-printed JSON text; a by-column points table is
    written one line per column (a 16,384-device search visits ~10^5 points)."""
    exports = list(plan_file.exports) + [None] * (len(plan_file.plans) - len(plan_file.exports))
    points = plan_file.search.get("points")
    compact = isinstance(points, dict) and "values" in points
    if compact:  # the table is thawed column by column below (most are JSON-ready already)
        search = {k: _POINTS_MARK if k == "points" else _thaw(v) for k, v in plan_file.search.items()}
    else:
        search = _thaw(plan_file.search)
        points = search.get("points")
    doc = {
        "schema": SCHEMA,
        "inputs": _thaw(plan_file.inputs),
        "search": search,
        "plans": [plan_to_dict(p) | ({} if e is None else {"exports": _thaw(e, copy_strings=False)})
                  for p, e in zip(plan_file.plans, exports)],
    }
    doc["digests"] = planned_digests(doc)
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    if not compact:
        return text
    inner = ",\n".join("        " + _column_json(col) for col in points["values"])
    names = json.dumps(_thaw(points["columns"]))
    block = (f'{{\n      "columns": {names},\n      "values": [\n{inner}\n      ]\n    }}'
             if points["values"] else f'{{"columns": {names}, "values": []}}')
    mark = '"points": ' + json.dumps(_POINTS_MARK)  # quotes inside strings are escaped: only the key matches
    if text.count(mark) != 1:
        raise RuntimeError("internal error: the points table's place in the plan JSON is ambiguous")
    return text.replace(mark, '"points": ' + block)


def _column_json(col) -> str:
    """One points-table column as compact JSON: as written, or, when it
    holds a non-finite float, as :func:`_thaw` makes it (null)."""
    try:
        return json.dumps(col, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(_thaw(col), allow_nan=False, separators=(",", ":"))


def dump_plan_file(plan_file: PlanFile, path: str | Path, text: str | None = None) -> None:
    """Write the plan file all or nothing (:func:`pipesearch.output.write_text`).
    ``text``: its JSON from :func:`to_json`, when the caller already has it
    (so it is not serialised twice).

    Raises:
        InputError: the path cannot be written.
    """
    write_text(path, to_json(plan_file) if text is None else text, "plan file")


# --- reading ---------------------------------------------------------------


def plan_from_dict(obj: dict) -> tuple[Plan, dict | None]:
    """A plan (and its exports, if any) from its JSON object.

    The object must already be valid (:func:`document_problems`); this only
    converts it.
    """
    stages = tuple(
        StagePlan(index=st["index"], layers=(st["layers"][0], st["layers"][1]),
                  layer_names=tuple(st["layer_names"]), devices=tuple(st["devices"]),
                  compute_s=st["compute_s"], comm_s=st["comm_s"], allreduce_s=st["allreduce_s"],
                  memory_bytes=st["memory_bytes"], send_bytes=st["send_bytes"], device_type=st["device_type"],
                  fwd_s=st["fwd_s"], saved_bytes=st["saved_bytes"], bwd_input_s=st["bwd_input_s"],
                  memory_breakdown=tuple((k, float(v)) for k, v in st.get("memory_breakdown_bytes", {}).items()),
                  memory_option=st.get("memory_option", ""), host_step_s=st.get("host_step_s", 0.0),
                  dp_comm_s=st.get("dp_comm_s", 0.0), optimizer_step_s=st.get("optimizer_step_s", 0.0),
                  replicas=st.get("replicas"))
        for st in obj["stages"])
    par, sch, pred = obj["parallelism"], obj["schedule"], obj["predicted"]
    options = dict(_freeze(obj.get("options", {})))
    extra = tuple(options.items()) + (("analytic_iteration_time_s", pred["analytic_iteration_time_s"]),)
    plan = Plan(
        rank=obj["rank"], pp=par["pp"], dp=par["dp"], tp=par["tp"], vp=par["vp"],
        schedule=sch["name"], micro_batch_size=sch["micro_batch_size"], num_micro_batches=sch["num_micro_batches"],
        stages=stages,
        predicted=Prediction(**{k: pred[k] for k in (
            "iteration_time_s", "samples_per_s", "bubble_fraction", "peak_memory_bytes", "memory_capacity_bytes")},
            **{k: pred[k] for k in ("tokens_per_iteration", "model_flops_per_iteration", "peak_flops", "num_devices")
               if k in pred}),
        extra=extra,
    )
    return plan, obj.get("exports")


def _from_document(doc: dict) -> PlanFile:
    pairs = [plan_from_dict(p) for p in doc["plans"]]
    exports = tuple(_freeze(e) for _, e in pairs if e is not None)
    return PlanFile(inputs=_freeze(doc["inputs"]), search=_freeze(doc["search"]), plans=tuple(p for p, _ in pairs),
                    exports=exports if len(exports) == len(pairs) else ())


def parse_document(text: str, source: str = "<text>") -> Any:
    """The JSON value of a plan file's text.

    Raises:
        PlanFormatError: not JSON (with the line), or not a
            ``pipesearch.plan/1`` document (its ``schema`` key).
    """
    return plan_document(parse_json(text, source), source)


def parse_json(text: str, source: str = "<text>") -> Any:
    """The JSON value of a file's text (any document: a plan file, a
    serving plan file), keys unique in every object.

    Raises:
        PlanFormatError: not JSON, with the line, and what the text looks
            like instead (a points CSV, another input file).
    """
    try:
        return json.loads(text, object_pairs_hook=unique_keys(source, PlanFormatError))
    except PlanFormatError:
        raise
    except json.JSONDecodeError as exc:
        first = text.split("\n", 1)[0]
        hint = ("; it is the table of every point (--all-points CSV): give the plan file of pipesearch plan -o"
                if first.startswith("tp,") and ",status," in first else _input_kind_hint(text, source))
        raise PlanFormatError(f"{source}: not JSON ({exc.msg}: line {exc.lineno}, column {exc.colno}){hint}") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4300 digits, nesting too deep
        raise PlanFormatError(f"{source}: not a plan file ({parse_failure(exc)})") from None


def plan_document(doc: Any, source: str = "<text>") -> dict:
    """``doc`` (a parsed JSON value, :func:`parse_json`) when it is a
    ``pipesearch.plan/1`` document.

    Raises:
        PlanFormatError: not an object of that ``schema``, naming what it
            is instead (a serving plan, an export, a model config).
    """
    if not isinstance(doc, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(doc), "a number")
        raise PlanFormatError(f"{source}: the top level is {kind}, expected an object with schema {SCHEMA!r} "
                              "(a file written by `pipesearch plan -o`)")
    if doc.get("schema") != SCHEMA:
        if "schema" not in doc and str(doc.get("format", "")).startswith("pipesearch.serve/"):
            raise PlanFormatError(f"{source}: a serving plan ({doc['format']!r}, written by `pipesearch serve`); "
                                  f"this command reads training plans (schema {SCHEMA!r}, `pipesearch plan -o`)")
        export = _export_kind(doc) if "schema" not in doc else None
        if export:
            raise PlanFormatError(f"{source}: {export} (written by `pipesearch export`); this command reads "
                                  f"training plans (schema {SCHEMA!r}, `pipesearch plan -o`), and checks the "
                                  f"exports of the plan file it is given")
        if "schema" not in doc and ({"model_type", "architectures"} & set(doc) or "hidden_size" in doc):
            raise PlanFormatError(f"{source}: a model config (HuggingFace config.json), not a plan file; "
                                  f"`pipesearch plan --model {source} -o plans.json` writes one")
        if "schema" in doc:
            found = f"schema is {doc['schema']!r}"
        elif "format" in doc:
            found = f"no 'schema' key (its format is {show(doc['format'])}: a serving plan file has format " \
                    f"'pipesearch.serve/1')"
        else:
            found = "no 'schema' key"
        raise PlanFormatError(f"{source}: {found}, expected {SCHEMA!r} (a file written by `pipesearch plan -o`)")
    return doc


def _input_kind_hint(text: str, source: str) -> str:
    """``"; it is ..."``: what an input file given as a plan file looks like
    (a layer profile CSV, a PipeDream graph.txt, a TOML cluster or device
    file), with the command that takes it; "" when it looks like none."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    table = next((x for x in lines if not x.startswith("#")), "")
    if str(source).endswith(".csv") or ("fwd_ms" in table and "," in table):
        return (f"; it is a layer profile (CSV): `pipesearch plan --model {source} -o plans.json` writes the plan "
                "file this command reads")
    if any(" -- " in x and x.startswith("node") for x in lines[:3]):
        return (f"; it is a PipeDream graph.txt profile: `pipesearch plan --model {source} -o plans.json` writes "
                "the plan file this command reads")
    if str(source).endswith(".json"):
        return ""
    import tomllib

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return ""
    if "transformer" in doc:
        use = f"a transformer config: `pipesearch plan --model {source} -o plans.json` writes the plan file this " \
              "command reads"
    elif "devices_per_node" in doc or "groups" in doc:
        use = f"a cluster: give it to `pipesearch plan --cluster {source}`, and this command the plan file " \
              "`pipesearch plan -o` writes"
    elif "memory_GiB" in doc or "memory_GB" in doc:
        use = "a device: a cluster TOML names it (device = ...), and this command reads the plan file " \
              "`pipesearch plan -o` writes"
    else:
        return ""
    return f"; it is a TOML file, {use}"


def _export_kind(doc: dict) -> str | None:
    """What kind of ``pipesearch export`` output ``doc`` is (its ``format``
    or ``runtime`` key; DeepSpeed's config by its batch keys), None when it
    looks like none."""
    if isinstance(doc.get("format"), str) and doc["format"].startswith("pipesearch.stages/"):
        return f"a stage description ({doc['format']!r})"
    if isinstance(doc.get("runtime"), str) and "format_version" in doc:
        return f"an export for {doc['runtime']}"
    if "train_micro_batch_size_per_gpu" in doc or "train_batch_size" in doc:
        return "a DeepSpeed config"
    return None


def document_problems(doc: Any, finite: bool = False) -> list[Problem]:
    """Everything wrong with a parsed plan document: the JSON Schema
    (``pipesearch/schema/plan-1.schema.json``, checked with ``jsonschema``),
    then, when the schema holds, the semantic checks
    (:mod:`pipesearch.schema.semantics`). Empty when the document is valid.
    ``finite``: as for :func:`pipesearch.schema.schema_problems` (a
    document parsed from :func:`to_json`'s text)."""
    problems = schema_problems(doc, finite)
    return problems if problems else semantic_problems(doc)


def normalize(plan_file: PlanFile) -> PlanFile:
    """The plan file as it will read back from JSON (for equality checks).
    Only converts: ``inputs`` need not be complete (no validation)."""
    return _from_document(json.loads(to_json(plan_file)))


def load_plan_text(text: str, source: str = "<text>") -> PlanFile:
    """Parse and validate plan JSON text (:func:`document_problems`).

    Raises:
        PlanFormatError: not JSON, wrong schema version, or a malformed plan;
            the message names ``source``, the field (a JSON path such as
            ``plans[0].stages[1].layers``), its value and what was expected.
    """
    return _checked(parse_document(text, source), source)


def _checked(doc: dict, source: str) -> PlanFile:
    """The :class:`PlanFile` of a parsed document (:func:`load_plan_text`)."""
    problems = document_problems(doc)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s); `pipesearch validate {source}` lists them)" \
            if len(problems) > 1 else ""
        raise PlanFormatError(f"{source}: {problems[0]}{more}")
    return _from_document(doc)


def read_plan_text(path: str | Path) -> str:
    """The text of a plan file (a regular file; see :mod:`pipesearch.input_files`).

    Raises:
        PlanFormatError: missing, not a regular file, unreadable, not UTF-8.
    """
    try:
        return read_input_text(path, "plan file")
    except InputError as exc:
        raise PlanFormatError(str(exc)) from None


def load_plan_file(path: str | Path) -> PlanFile:
    """Read and validate a plan file (see :func:`load_plan_text`)."""
    return read_plan_file(path)[1]


def read_plan_file(path: str | Path) -> tuple[dict, PlanFile]:
    """A plan file read and parsed once: its JSON document (for the checks
    that read the file as written: digests, embedded exports) and its
    validated :class:`PlanFile` (see :func:`load_plan_text`)."""
    doc = parse_document(read_plan_text(path), str(path))
    return doc, _checked(doc, str(path))


def select_plan(plan_file: PlanFile, rank: int, source: str = "plan file") -> Plan:
    """The plan of the given rank (1-based).

    Raises:
        PlanFormatError: no plan has that rank.
    """
    for plan in plan_file.plans:
        if plan.rank == rank:
            return plan
    ranks = ", ".join(str(p.rank) for p in plan_file.plans)
    raise PlanFormatError(f"{source}: no plan of rank {rank} (ranks present: {ranks})")
