"""Digests of what a plan was computed from, written into the plan file, so
that an edit of them is told apart from the plan.

A plan's recorded figures (stage times and bytes, predicted time and
memory) follow from its inputs (model, cluster, job) and its own choices
(parallel degrees, schedule, options such as recompute or placement). The
file's other checks recompute what they can from the file itself (the
replay of each plan's time, memory against capacity, rates), but not the
layer table a transformer config or a recompute mode implies: an edited
``hidden_size`` or ``recompute`` still validated, and an export wrote a
launch for the edited model. ``pipesearch plan`` therefore records a
SHA-256 of each such part (:data:`PARTS`, canonical JSON: sorted keys, no
spaces); ``pipesearch validate`` and ``export`` name every part whose
digest differs. A file without digests (written before them) is not
checked.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import Problem

#: the parts digested: ``inputs.<key>`` and each plan's ``plans[k].<key>``
INPUT_PARTS = ("model", "cluster", "job")
PLAN_PARTS = ("parallelism", "schedule", "options")


def digest(value: Any) -> str:
    """``"sha256:<hex>"`` of ``value``'s canonical JSON (sorted keys, no
    spaces, no NaN): the same for a value and its JSON read back."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _parts(doc: dict) -> dict[str, Any]:
    """Path -> value of every digested part present in ``doc``."""
    out = {f"inputs.{key}": doc["inputs"][key] for key in INPUT_PARTS if key in doc.get("inputs", {})}
    for k, plan in enumerate(doc.get("plans", [])):
        out.update({f"plans[{k}].{key}": plan[key] for key in PLAN_PARTS if key in plan})
    return out


def planned_digests(doc: dict) -> dict[str, str]:
    """The ``digests`` block of a plan document about to be written."""
    return {path: digest(value) for path, value in _parts(doc).items()}


def digest_problems(doc: dict) -> list[Problem]:
    """One problem per digested part of ``doc`` edited since it was planned
    (its digest differs, or it has none while the file has digests), and
    per digest whose part is gone; none for a file without ``digests``."""
    recorded = doc.get("digests")
    if not isinstance(recorded, dict):
        return []
    parts = _parts(doc)
    out = []
    for path, value in parts.items():
        if path not in recorded:
            out.append(Problem(path, "not in the file's digests: added after planning; its figures were not "
                                     "computed for it: plan again rather than edit the file"))
        elif recorded[path] != digest(value):
            out.append(Problem(path, "edited after planning (its digest in 'digests' differs): the plan's times and "
                                     "bytes are those of what was planned, not of this; plan again with what you "
                                     "changed (pipesearch plan ...) rather than edit the file, or restore it"))
    out += [Problem(path, "in the file's digests but gone from the file: restore it or plan again")
            for path in recorded if path not in parts]
    return out
