"""The plan file format as a JSON Schema (draft 2020-12), shipped in the
package as ``plan-1.schema.json``, and its check with the ``jsonschema``
library.

:func:`schema_problems` gives every place where a document breaks the
schema, as :class:`Problem` values whose ``where`` is a JSON path written the
way the rest of pipesearch names fields (``plans[0].stages[1].layers``) and
whose ``text`` says what is wrong with the value and what was expected. The
checks a schema cannot express (coverage of the model's layers, devices,
degrees, batch) are in :mod:`pipesearch.schema.semantics`.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Iterator

import jsonschema

SCHEMA_FILE = "plan-1.schema.json"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a plan document: ``where`` (a JSON path such as
    ``plans[0].stages[1].layers``; empty for the whole document) and ``text``
    (the value, what was expected, the fix)."""

    where: str
    text: str

    def __str__(self) -> str:
        return f"{self.where}: {self.text}" if self.where else self.text


def schema_text() -> str:
    """The JSON Schema of ``pipesearch.plan/1`` as shipped in the package."""
    return resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def plan_schema() -> dict:
    """The JSON Schema of ``pipesearch.plan/1`` (parsed once; do not modify)."""
    return json.loads(schema_text())


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    schema = plan_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def json_path(parts) -> str:
    """``["plans", 0, "stages", 1, "layers"]`` -> ``"plans[0].stages[1].layers"``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def show(value: Any) -> str:
    """A value as a message shows it: JSON-like, at most 80 characters."""
    if isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    elif isinstance(value, (dict, list)):
        text = json.dumps(value)
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_TYPE_NAMES = {"integer": "an integer", "number": "a number", "string": "a string", "object": "an object",
               "array": "an array", "boolean": "true or false"}


def _describe(error: jsonschema.ValidationError) -> Problem:
    where = json_path(error.absolute_path)
    v, value, inst = error.validator, error.validator_value, error.instance
    if v == "required":
        missing = next(k for k in value if isinstance(inst, dict) and k not in inst)
        return Problem(where, f"missing key {missing!r}")
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


def schema_problems(doc: Any) -> list[Problem]:
    """Everything that breaks the plan file schema: non-finite numbers
    first, then the schema's errors in a fixed order (by place in the
    document)."""
    problems = list(non_finite_problems(doc))
    errors = sorted(_validator().iter_errors(doc),
                    key=lambda e: (tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in e.absolute_path),
                                   e.validator))
    seen = {p.where for p in problems}
    for error in errors:
        if json_path(error.absolute_path) in seen and error.validator in ("minimum", "maximum", "type"):
            continue  # a NaN already reported at this place
        problems.append(_describe(error))
    return problems
