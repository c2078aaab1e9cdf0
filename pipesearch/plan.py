"""Plan files: :class:`PlanFile` <-> versioned JSON (``pipesearch.plan/1``).

Layout (every number carries its unit in its key; ``layers`` is half-open)::

    {"schema": "pipesearch.plan/1",
     "inputs": {"model": {...}, "cluster": {...}, "job": {...}, "fingerprint": "sha256:..."},
     "search": {"points_evaluated": N, "infeasible": {"out_of_memory": N, ...}, "wall_s": x},
     "plans": [{"rank": 1,
                "parallelism": {"pp": 4, "dp": 2, "tp": 1, "vp": 1},
                "schedule": {"name": "1f1b", "micro_batch_size": 4, "num_micro_batches": 16},
                "stages": [{"index": 0, "layers": [0, 12], "layer_names": [...],
                            "devices": [...], "device_type": "v100-16gb",
                            "fwd_s": x, "compute_s": x, "comm_s": x, "allreduce_s": x,
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
:func:`load_plan_file` validates a file and gives back an object equal to the
one :func:`dump_plan_file` wrote.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PlanFormatError
from .output import write_text
from .types import MAX_MICRO_BATCHES, SCHEDULES, Plan, Prediction, StagePlan

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


def _thaw(value):
    if isinstance(value, (tuple, list)):
        return [_thaw(v) for v in value]
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
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
             "compute_s": s.compute_s, "comm_s": s.comm_s, "allreduce_s": s.allreduce_s,
             "memory_bytes": s.memory_bytes, "send_bytes": s.send_bytes, "saved_bytes": s.saved_bytes,
             "bwd_input_s": s.bwd_input_s, "memory_breakdown_bytes": dict(s.memory_breakdown)}
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


def to_json(plan_file: PlanFile) -> str:
    """The plan file as pretty-printed JSON text."""
    exports = list(plan_file.exports) + [None] * (len(plan_file.plans) - len(plan_file.exports))
    doc = {
        "schema": SCHEMA,
        "inputs": _thaw(plan_file.inputs),
        "search": _thaw(plan_file.search),
        "plans": [plan_to_dict(p, e) for p, e in zip(plan_file.plans, exports)],
    }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def dump_plan_file(plan_file: PlanFile, path: str | Path) -> None:
    """Write the plan file all or nothing (:func:`pipesearch.output.write_text`).

    Raises:
        InputError: the path cannot be written.
    """
    write_text(path, to_json(plan_file), "plan file")


# --- validation -------------------------------------------------------------

_NUM = (int, float)


def _need(obj: Any, key: str, kind, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise PlanFormatError(f"{where}: missing key {key!r}")
    value = obj[key]
    if kind is float:
        ok = isinstance(value, _NUM) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        name = getattr(kind, "__name__", str(kind))
        raise PlanFormatError(f"{where}.{key}: expected {name}, got {value!r}")
    if kind in (float, int) and isinstance(value, _NUM) and not math.isfinite(value):
        raise PlanFormatError(f"{where}.{key}: must be a finite number, got {value!r}")
    if kind in (float, int) and isinstance(value, _NUM) and value < 0:
        raise PlanFormatError(f"{where}.{key}: must be >= 0, got {value!r}")
    return value


def _breakdown(st: dict, where: str) -> tuple[tuple[str, float], ...]:
    """Optional ``memory_breakdown_bytes`` of a stage: name -> bytes >= 0."""
    parts = st.get("memory_breakdown_bytes", {})
    if not isinstance(parts, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for k, v in parts.items()):
        raise PlanFormatError(f"{where}.memory_breakdown_bytes: expected an object of name -> bytes >= 0, "
                              f"got {parts!r}")
    return tuple((k, float(v)) for k, v in parts.items())


def _throughput(pred: dict, where: str) -> dict:
    """Optional throughput terms of ``predicted`` (absent in older files)."""
    out = {}
    for key, kind in (("tokens_per_iteration", float), ("model_flops_per_iteration", float),
                      ("peak_flops", float), ("num_devices", int)):
        if key in pred:
            out[key] = _need(pred, key, kind, where)
    return out


def plan_from_dict(obj: dict, where: str = "plan") -> tuple[Plan, dict | None]:
    """A plan (and its exports, if any) from its JSON object.

    Raises:
        PlanFormatError: a missing key, a wrong type, a negative size or time,
            stages that do not cover the layers contiguously.
    """
    par = _need(obj, "parallelism", dict, where)
    sch = _need(obj, "schedule", dict, where)
    pred = _need(obj, "predicted", dict, where)
    stages = []
    expect_first = 0
    for k, st in enumerate(_need(obj, "stages", list, where)):
        w = f"{where}.stages[{k}]"
        layers = _need(st, "layers", list, w)
        if len(layers) != 2 or layers[0] != expect_first or layers[1] <= layers[0]:
            raise PlanFormatError(f"{w}.layers: {layers} does not continue at layer {expect_first} "
                                  "with at least one layer (half-open [first, last+1])")
        expect_first = layers[1]
        stages.append(StagePlan(
            index=_need(st, "index", int, w), layers=(int(layers[0]), int(layers[1])),
            layer_names=tuple(_need(st, "layer_names", list, w)),
            devices=tuple(_need(st, "devices", list, w)),
            compute_s=_need(st, "compute_s", float, w), comm_s=_need(st, "comm_s", float, w),
            allreduce_s=_need(st, "allreduce_s", float, w), memory_bytes=_need(st, "memory_bytes", float, w),
            send_bytes=_need(st, "send_bytes", float, w), device_type=_need(st, "device_type", str, w),
            fwd_s=_need(st, "fwd_s", float, w), saved_bytes=_need(st, "saved_bytes", float, w),
            bwd_input_s=_need(st, "bwd_input_s", float, w),
            memory_breakdown=_breakdown(st, w),
        ))
    if not stages:
        raise PlanFormatError(f"{where}.stages: empty")
    options = dict(_freeze(obj.get("options", {})))
    analytic = _need(pred, "analytic_iteration_time_s", float, f"{where}.predicted")
    extra = tuple(options.items()) + (("analytic_iteration_time_s", analytic),)
    plan = Plan(
        rank=_need(obj, "rank", int, where),
        pp=_need(par, "pp", int, f"{where}.parallelism"), dp=_need(par, "dp", int, f"{where}.parallelism"),
        tp=_need(par, "tp", int, f"{where}.parallelism"), vp=_need(par, "vp", int, f"{where}.parallelism"),
        schedule=_need(sch, "name", str, f"{where}.schedule"),
        micro_batch_size=_need(sch, "micro_batch_size", int, f"{where}.schedule"),
        num_micro_batches=_need(sch, "num_micro_batches", int, f"{where}.schedule"),
        stages=tuple(stages),
        predicted=Prediction(**{k: _need(pred, k, float, f"{where}.predicted") for k in (
            "iteration_time_s", "samples_per_s", "bubble_fraction", "peak_memory_bytes",
            "memory_capacity_bytes")}, **_throughput(pred, f"{where}.predicted")),
        extra=extra,
    )
    for key, value in (("parallelism.pp", plan.pp), ("parallelism.dp", plan.dp), ("parallelism.tp", plan.tp),
                       ("parallelism.vp", plan.vp), ("schedule.micro_batch_size", plan.micro_batch_size),
                       ("schedule.num_micro_batches", plan.num_micro_batches)):
        if value < 1:
            raise PlanFormatError(f"{where}.{key}: must be >= 1, got {value}")
    if plan.num_micro_batches > MAX_MICRO_BATCHES:
        raise PlanFormatError(f"{where}.schedule.num_micro_batches: {plan.num_micro_batches} is more than "
                              f"{MAX_MICRO_BATCHES}")
    if plan.schedule not in SCHEDULES:
        raise PlanFormatError(f"{where}.schedule.name: {plan.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if len(stages) != plan.pp * plan.vp:
        raise PlanFormatError(f"{where}: {len(stages)} stages but pp x vp = {plan.pp * plan.vp}")
    for st in stages:
        if len(st.devices) != plan.dp or any(not isinstance(d, int) or isinstance(d, bool) or d < 0
                                             for d in st.devices):
            raise PlanFormatError(f"{where}.stages[{st.index}].devices: expected {plan.dp} device ids >= 0 "
                                  f"(one per data-parallel replica), got {list(st.devices)}")
    return plan, obj.get("exports")


def normalize(plan_file: PlanFile) -> PlanFile:
    """The plan file as it will read back from JSON (for equality checks)."""
    return load_plan_text(to_json(plan_file), "<memory>")


def load_plan_text(text: str, source: str = "<text>") -> PlanFile:
    """Parse and validate plan JSON text.

    Raises:
        PlanFormatError: not JSON, wrong schema version, or a malformed plan;
            the message names ``source`` and the offending key.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanFormatError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise PlanFormatError(f"{source}: schema is {got!r}, expected {SCHEMA!r} (a file written by `pipesearch plan -o`)")
    try:
        inputs = _need(doc, "inputs", dict, source)
        search = _need(doc, "search", dict, source)
        raw = _need(doc, "plans", list, source)
        pairs = [plan_from_dict(p, f"{source}: plans[{k}]") for k, p in enumerate(raw)]
    except PlanFormatError as exc:
        msg = str(exc)
        raise PlanFormatError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    ranks = [p.rank for p, _ in pairs]
    if len(set(ranks)) != len(ranks):
        raise PlanFormatError(f"{source}: plan ranks repeat ({', '.join(map(str, ranks))})")
    batch = inputs.get("job", {}).get("global_batch_size") if isinstance(inputs.get("job"), dict) else None
    for k, (p, _) in enumerate(pairs):
        if isinstance(batch, int) and p.micro_batch_size * p.num_micro_batches * p.dp != batch:
            raise PlanFormatError(
                f"{source}: plans[{k}]: micro_batch_size {p.micro_batch_size} x num_micro_batches "
                f"{p.num_micro_batches} x dp {p.dp} != inputs.job.global_batch_size {batch}")
    exports = tuple(_freeze(e) for _, e in pairs if e is not None)
    return PlanFile(inputs=_freeze(inputs), search=_freeze(search), plans=tuple(p for p, _ in pairs),
                    exports=exports if len(exports) == len(pairs) else ())


def load_plan_file(path: str | Path) -> PlanFile:
    """Read and validate a plan file (see :func:`load_plan_text`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanFormatError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise PlanFormatError(f"{path}: not a plan file (not UTF-8 text)") from None
    return load_plan_text(text, str(path))


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
