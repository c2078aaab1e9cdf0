"""The plan file format as a JSON Schema (draft 2020-12), shipped in the
package as ``plan-1.schema.json`` (and the serving plans' as
``serve-1.schema.json``), and its check with the ``jsonschema`` library.

:func:`schema_problems` gives every place where a document breaks the
schema, as :class:`Problem` values whose ``where`` is a JSON path written the
way the rest of pipesearch names fields (``plans[0].stages[1].layers``) and
whose ``text`` says what is wrong with the value and what was expected. The
checks a schema cannot express (coverage of the model's layers, devices,
degrees, batch) are in :mod:`pipesearch.schema.semantics` (for serving
plans, :mod:`pipesearch.schema.serve_semantics`).
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # loaded where a document is checked (plan files going out or read)
    import jsonschema

SCHEMA_FILE = "plan-1.schema.json"
SERVE_SCHEMA_FILE = "serve-1.schema.json"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a plan document: ``where`` (a JSON path such as
    ``plans[0].stages[1].layers``; empty for the whole document) and ``text``
    (the value, what was expected, the fix)."""

    where: str
    text: str

    def __str__(self) -> str:
        return f"{self.where}: {self.text}" if self.where else self.text


def schema_text(name: str = SCHEMA_FILE) -> str:
    """A JSON Schema as shipped in the package: ``pipesearch.plan/1``'s
    (:data:`SCHEMA_FILE`) or ``pipesearch.serve/1``'s (:data:`SERVE_SCHEMA_FILE`)."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def plan_schema() -> dict:
    """The JSON Schema of ``pipesearch.plan/1`` (parsed once; do not modify)."""
    return json.loads(schema_text())


@lru_cache(maxsize=1)
def serve_schema() -> dict:
    """The JSON Schema of ``pipesearch.serve/1`` (parsed once; do not
    modify). Its cluster is the plan file's (a reference into
    :func:`plan_schema` by that schema's ``$id``)."""
    return json.loads(schema_text(SERVE_SCHEMA_FILE))


@lru_cache(maxsize=2)
def _validator(name: str = SCHEMA_FILE) -> "jsonschema.Draft202012Validator":
    """The validator of the schema ``name``, with ``integer`` meaning a JSON
    number written without a fraction or exponent (Python ``int``): JSON
    Schema counts ``4.0`` as an integer, which the plan's counts and
    indices cannot be (``range(4.0)``)."""
    import jsonschema
    from referencing import Registry, Resource

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    registry = Registry().with_resource(plan_schema()["$id"], Resource.from_contents(plan_schema()))
    # the shipped schemas are checked against their metaschema by the tests
    # (tests/test_plan_schema.py, tests/test_serve_schema.py), not on every run (0.1 s)
    schema = plan_schema() if name == SCHEMA_FILE else serve_schema()
    return jsonschema.validators.extend(base, type_checker=checker)(schema, registry=registry)


def json_path(parts) -> str:
    """``["plans", 0, "stages", 1, "layers"]`` -> ``"plans[0].stages[1].layers"``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def show(value: Any) -> str:
    """A value as a message shows it: JSON-like (``true``, ``false``,
    ``null`` as the file writes them; strings quoted), at most 80 characters."""
    if isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    elif isinstance(value, (dict, list, bool)) or value is None:
        text = json.dumps(value)
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


#: relative difference beyond which a recorded value disagrees with its formula
REL_TOL = 1e-9


def differs(found, expected: float) -> bool:
    """Whether a recorded ``found`` (a number, else it differs) is not
    ``expected`` within :data:`REL_TOL`."""
    if not isinstance(found, (int, float)) or isinstance(found, bool):
        return True
    return abs(found - expected) > REL_TOL * max(abs(found), abs(expected)) + 1e-300


def check_record(where: str, found, expected: float, why: str) -> Iterator[Problem]:
    """A problem when the recorded ``found`` is not ``expected`` within :data:`REL_TOL`."""
    if differs(found, expected):
        yield Problem(where, f"{found!r} found, {expected!r} expected ({why}); re-plan, or restore the field")


_TYPE_NAMES = {"integer": "an integer", "number": "a number", "string": "a string", "object": "an object",
               "array": "an array", "boolean": "true or false"}


def _describe(error: "jsonschema.ValidationError") -> Problem:
    where = json_path(error.absolute_path)
    v, value, inst = error.validator, error.validator_value, error.instance
    if v == "required":  # one error per missing key, each naming them all (the list is deduplicated)
        missing = [k for k in value if isinstance(inst, dict) and k not in inst]
        return Problem(where, f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    if v == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        extra = sorted(k for k in inst if k not in allowed)
        close = difflib.get_close_matches(extra[0], allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return Problem(where, f"unknown key {extra[0]!r} ({hint}allowed: {', '.join(allowed)})")
    if v == "type":
        kinds = value if isinstance(value, list) else [value]
        return Problem(where, f"expected {' or '.join(_TYPE_NAMES.get(k, k) for k in kinds)}, got {show(inst)}")
    if v == "minimum":
        return Problem(where, f"must be >= {value:g}, got {show(inst)}")
    if v == "maximum":
        return Problem(where, f"must be <= {value:g}, got {show(inst)}")
    if v == "exclusiveMinimum":
        return Problem(where, f"must be > {value:g}, got {show(inst)}")
    if v == "exclusiveMaximum":
        return Problem(where, f"must be < {value:g}, got {show(inst)}")
    if v == "enum":
        return Problem(where, f"{show(inst)} is not one of {', '.join(map(str, value))}")
    if v == "const":
        return Problem(where, f"{show(inst)}, expected {show(value)}")
    if v == "minItems":
        return Problem(where, f"{show(inst)} has {len(inst)} item(s), expected at least {value}")
    if v == "maxItems":
        return Problem(where, f"{show(inst)} has {len(inst)} items, expected at most {value}")
    if v == "uniqueItems":
        seen, dup = set(), None
        for item in inst:
            key = json.dumps(item, sort_keys=True)
            if key in seen:
                dup = item
                break
            seen.add(key)
        return Problem(where, f"{show(inst)} names {show(dup)} twice; each entry must be distinct")
    if v in ("oneOf", "anyOf") and error.context:  # alternatives: what the nearest one broke ("or null" said)
        kept = [e for e in error.context if not (e.validator == "type" and e.validator_value == "null")]
        if kept:  # the nearest: an error inside the value (its keys matched) before a missing or unknown key
            inner = _describe(min(kept, key=lambda e: (e.validator in ("required", "additionalProperties"),
                                                       -len(e.relative_path))))
            nullable = len(kept) < len(error.context)
            return Problem(inner.where, inner.text + (" (or null)" if nullable else ""))
    return Problem(where, error.message)


def non_finite_problems(doc: Any, path: tuple = ()) -> Iterator[Problem]:
    """Every NaN or infinite number in a parsed document (Python's json
    module reads the non-standard tokens ``NaN`` and ``Infinity``, which a
    schema's ``type: number`` lets through)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        yield Problem(json_path(path), f"must be a finite number, got {show(doc)}")
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield from non_finite_problems(v, path + (k,))
    elif isinstance(doc, list):
        for k, v in enumerate(doc):
            yield from non_finite_problems(v, path + (k,))


def _all_finite(doc: Any) -> bool:
    """True when the document surely holds no NaN or infinite number: the
    json module's C encoder refuses them (``allow_nan=False``), one pass in C
    where :func:`non_finite_problems` walks every value in Python. False
    also for anything else it refuses (the walk then decides)."""
    try:
        json.dumps(doc, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


_NAMES_SCHEMA = {"type": "array", "items": {"type": "string"}}


def _compact_names(doc: Any) -> Any:
    """The document with every stage's ``layer_names`` that holds only
    strings cut to its first name, for the schema check alone (a long chain
    has ~10^5 names, each a step of ``jsonschema``). Exact: while the
    schema's ``layer_names`` is an array of strings and nothing else
    (checked here), such a list and its first name are valid alike, and a
    list holding anything else is kept whole, so the errors are the same;
    the input is not modified."""
    stage_props = plan_schema().get("$defs", {}).get("stage", {}).get("properties", {})
    plans = doc.get("plans") if isinstance(doc, dict) else None
    if stage_props.get("layer_names") != _NAMES_SCHEMA or not isinstance(plans, list):
        return doc
    out_plans = []
    for plan in plans:
        stages = plan.get("stages") if isinstance(plan, dict) else None
        if not isinstance(stages, list):
            out_plans.append(plan)
            continue
        cut = []
        for stage in stages:
            names = stage.get("layer_names") if isinstance(stage, dict) else None
            if isinstance(names, list) and len(names) > 1 and all(isinstance(x, str) for x in names):
                stage = {**stage, "layer_names": names[:1]}
            cut.append(stage)
        out_plans.append({**plan, "stages": cut})
    return {**doc, "plans": out_plans}


def schema_problems(doc: Any, finite: bool = False) -> list[Problem]:
    """Everything that breaks the plan file schema: non-finite numbers
    first, then the schema's errors in a fixed order (by place in the
    document). ``finite``: the caller knows every number is finite (a
    document parsed from the text :func:`pipesearch.plan.to_json` writes,
    which refuses NaN and infinities): that check is skipped."""
    return _problems(doc, finite, SCHEMA_FILE, _compact_names(doc))


def serve_schema_problems(doc: Any) -> list[Problem]:
    """Everything that breaks the serving plan file schema
    (``serve-1.schema.json``), as :func:`schema_problems` lists them."""
    return _problems(doc, False, SERVE_SCHEMA_FILE, doc)


def _problems(doc: Any, finite: bool, name: str, checked: Any) -> list[Problem]:
    """Non-finite numbers of ``doc`` (unless ``finite``), then the errors of
    schema ``name`` on ``checked`` (``doc`` or a copy that gives the same
    errors), by place in the document."""
    problems = [] if finite or _all_finite(doc) else list(non_finite_problems(doc))
    errors = sorted(_validator(name).iter_errors(checked),
                    key=lambda e: (tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in e.absolute_path),
                                   e.validator))
    seen = {p.where for p in problems}
    for error in errors:
        if json_path(error.absolute_path) in seen and error.validator in ("minimum", "maximum", "type", "oneOf"):
            continue  # a NaN already reported at this place
        problem = _describe(error)
        if problem not in problems:
            problems.append(problem)
    return problems
