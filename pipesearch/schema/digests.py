"""Digests of what a plan was computed from, written into the plan file, so
that an edit of them is told apart from the plan.

A plan's recorded figures (stage times and bytes, predicted time and
memory) follow from its inputs (model, cluster, job) and its own choices
(parallel degrees, schedule, options such as recompute or placement, each
stage's layers and devices). The file's other checks recompute what they
can from the file itself (the replay of each plan's time, memory against
capacity, rates), but not the layer table a transformer config or a
recompute mode implies, nor a stage's times after its layers moved: an
edited ``hidden_size`` or ``recompute`` still validated, and an export
wrote a launch for the edited model. ``pipesearch plan`` therefore records
a SHA-256 of each such part (:func:`_parts`) over its canonical JSON
(sorted keys, no spaces, every number as a float: ``2`` and ``2.0`` are one
value, as a JSON tool that rewrites the file may write either);
``pipesearch validate`` and ``export`` name every part whose digest
differs. Provenance is left out (the model file's path and the load
warnings), so a file can move between machines. Each plan's recorded
figures (its stages' times and bytes, its predicted block) have a digest
of their own, ``plans[k].figures``: the replay checks that the predicted
time follows from the stage times, not that the stage times follow from
the inputs, so a halved stage time with the predicted figures set to its
replay still validated. A file without digests (written before them) is
not checked, but :func:`missing_digests_warning` says so; a file with
digests but no figures digests (written before those) has its other
parts checked.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from . import Problem

#: the parts digested: ``inputs.<key>`` and each plan's ``plans[k].<key>``
INPUT_PARTS = ("model", "cluster", "job", "fingerprint")
PLAN_PARTS = ("parallelism", "schedule", "options", "stages")
#: provenance in ``inputs.model``, not what the plans were computed from
MODEL_PROVENANCE = ("file", "warnings")
#: what a stage's digest covers: where it runs, not its recorded figures (the replay checks those)
STAGE_LAYOUT = ("index", "layers", "layer_names", "devices", "replicas")
#: each plan's recorded figures (its stages' fields but their layout, and ``predicted``): ``plans[k].figures``,
#: checked where the file has that digest (files written before it have none)
FIGURES = "figures"
_PATH = re.compile(r"^(inputs\.(%s)|plans\[\d+\]\.(%s))$" % ("|".join(INPUT_PARTS),
                                                              "|".join(PLAN_PARTS + (FIGURES,))))


def canonical(value: Any) -> Any:
    """``value`` with every number a float (booleans kept), recursively."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def digest(value: Any) -> str:
    """``"sha256:<hex>"`` of ``value``'s canonical JSON (sorted keys, no
    spaces, numbers as floats, no NaN): the same for a value and its JSON
    as any tool writes it back."""
    text = json.dumps(canonical(value), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _part(path_key: str, value: Any) -> Any:
    """What of a part is digested: the model without its provenance, each
    stage's layout."""
    if path_key == "model" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in MODEL_PROVENANCE}
    if path_key == "stages" and isinstance(value, list):
        return [{k: st.get(k) for k in STAGE_LAYOUT} if isinstance(st, dict) else st for st in value]
    return value


def _parts(doc: dict) -> dict[str, Any]:
    """Path -> digested value of every part present in ``doc``."""
    inputs = doc.get("inputs", {})
    out = {f"inputs.{key}": _part(key, inputs[key]) for key in INPUT_PARTS if key in inputs}
    for k, plan in enumerate(doc.get("plans", [])):
        out.update({f"plans[{k}].{key}": _part(key, plan[key]) for key in PLAN_PARTS if key in plan})
        out[f"plans[{k}].{FIGURES}"] = _figures(plan)
    return out


def _figures(plan: Any) -> Any:
    """A plan's recorded figures: each stage's fields but its layout
    (:data:`STAGE_LAYOUT`), and its ``predicted`` block (None where absent)."""
    if not isinstance(plan, dict):
        return None
    stages = plan.get("stages")
    stages = [{k: v for k, v in st.items() if k not in STAGE_LAYOUT} if isinstance(st, dict) else st
              for st in stages] if isinstance(stages, list) else stages
    return {"stages": stages, "predicted": plan.get("predicted")}


def _planned_at(recorded: dict, path: str, found: str) -> str | None:
    """The other plan's path whose recorded digest of the same part is
    ``found`` (a plan moved in the file), or None."""
    if not path.startswith("plans["):
        return None
    part = path.split(".", 1)[1]
    return next((p for p, d in recorded.items() if p != path and p.endswith("." + part) and p.startswith("plans[")
                 and d == found), None)


def planned_digests(doc: dict) -> dict[str, str]:
    """The ``digests`` block of a plan document about to be written."""
    return {path: digest(value) for path, value in _parts(doc).items()}


def digest_problems(doc: dict) -> list[Problem]:
    """One problem per digested part of ``doc`` edited since it was planned
    (its digest differs, or it has none while the file has digests), per
    digest whose part is gone, and per digest of a path pipesearch does not
    digest; none for a file without ``digests``."""
    recorded = doc.get("digests")
    if not isinstance(recorded, dict):
        return []
    parts = _parts(doc)
    out = []
    for path, value in parts.items():
        if path.endswith("." + FIGURES) and path not in recorded and not any(
                p.endswith("." + FIGURES) for p in recorded):
            continue  # a file written before the figures were digested
        if path not in recorded:
            out.append(Problem(path, "not in the file's digests: added after planning; its figures were not "
                                     "computed for it: plan again rather than edit the file"))
        elif recorded[path] != digest(value):
            moved = _planned_at(recorded, path, digest(value))
            if moved is not None:
                out.append(Problem(path, f"as planned at {moved} (the file's plans were reordered or one removed): "
                                         "restore their order, or plan again"))
                continue
            what = (" (its stages' layers or devices)" if path.endswith(".stages") else
                    " (its stages' recorded times and bytes, or its predicted figures)"
                    if path.endswith("." + FIGURES) else "")
            out.append(Problem(path, f"edited after planning{what} (its digest in 'digests' differs): the plan's "
                                     "times and bytes are those of what was planned, not of this; plan again with "
                                     "what you changed (pipesearch plan ...) rather than edit the file, or restore "
                                     "it"))
    for path in recorded:
        if not _PATH.match(path):
            out.append(Problem(f"digests.{path}", "not a part pipesearch digests (inputs.model, inputs.cluster, "
                                                  "inputs.job, inputs.fingerprint, plans[k].parallelism, "
                                                  ".schedule, .options, .stages, .figures); restore the file"))
        elif path not in parts:
            out.append(Problem(path, "in the file's digests but gone from the file: restore it or plan again"))
    return out


def missing_digests_warning(doc: dict) -> str | None:
    """What to say of a plan file with no ``digests`` block (written before
    digests, or with them removed): edits of its inputs, stages and figures
    cannot be told apart from what was planned. None when it has one."""
    if isinstance(doc.get("digests"), dict):
        return None
    return ("no 'digests': an edit of the inputs, a stage's layers or devices, or the recorded times cannot be "
            "told apart from what was planned (files written before digests have none); plan again to check them")
