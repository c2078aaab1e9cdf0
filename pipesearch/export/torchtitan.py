"""Export a plan as torchtitan job-config settings.

torchtitan (github.com/pytorch/torchtitan) builds torch.distributed.pipelining
stages from its own config; its schedule classes are torch's, so the torch
rules (:func:`pipesearch.export.torch.check_torch_schedule`) apply too.

Config keys used (torchtitan/config/job_config.py, ``[parallelism]`` and
``[training]`` sections, the 2025 version with ``module_fqns_per_model_part``,
read through the code corpus):

* ``parallelism.pipeline_parallel_degree``: pipeline ranks (not stages).
* ``parallelism.pipeline_parallel_schedule``: a name
  ``torch.distributed.pipelining.schedules.get_schedule_class`` accepts
  (case-insensitive): ``"GPipe"``, ``"1F1B"``, ``"Interleaved1F1B"``,
  ``"InterleavedZeroBubble"``, ``"ZBVZeroBubble"``, ``"LoopedBFS"``, ...
* ``parallelism.module_fqns_per_model_part``: list of lists of module FQNs,
  one list per stage ("model part"); torchtitan's ``pipeline_module_split``
  keeps those modules in a deep copy of the model (top-level children, or
  ``<ModuleList/ModuleDict>.<key>``; "Does not support nested moduledict and
  modulelist structures") and gives rank ``r`` stages ``r, r + pp, ..``
  ("loop" style) except for ZBV/DualPipeV ("v" style).
* ``parallelism.pipeline_parallel_microbatch_size``: the number of
  micro-batches is ``training.local_batch_size //
  pipeline_parallel_microbatch_size`` (``build_pipeline_schedule``), so the
  export sets ``training.local_batch_size = micro_batch_size * m``.
* ``parallelism.pipeline_parallel_layers_per_stage`` (+
  ``pipeline_parallel_first_stage_less_layers`` /
  ``_last_stage_less_layers``, default 1): an alternative to the explicit
  FQN lists. ``pipeline_llm`` computes ``num_virtual_stages =
  ceil((n_layers + first_less + last_less) / layers_per_stage)``, requires it
  divisible by the pipeline degree, exactly 1 stage per rank for single-stage
  schedules and at least 2 for multi-stage ones, and
  ``generate_llm_fqn_per_model_part`` then spreads the layers (extra layers to
  the first stages). The export offers it (under
  ``"layers_per_stage_alternative"``) only when that recipe reproduces the
  plan's split exactly. Recent torchtitan raises if both are set.
* ``parallelism.tensor_parallel_degree``,
  ``parallelism.data_parallel_replicate_degree`` /
  ``data_parallel_shard_degree``: pipesearch's data parallelism is plain
  replication with a gradient all-reduce, i.e. ``replicate = dp`` and
  ``shard = 1`` (torchtitan's default ``shard = -1`` is FSDP over the leftover
  ranks, which changes memory and communication).
* ``activation_checkpoint.mode``: ``"none"``, ``"selective"`` or ``"full"``
  (torchtitan's default is ``"selective"``, so ``"none"`` is written out).

Renames in newer torchtitan (torchtitan/config/parallelism.py, 2026):
``pipeline_parallel_module_fqns_per_model_part`` and ``num_pp_microbatches``
replace ``module_fqns_per_model_part`` and the micro-batch-size route; the
export notes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..errors import InputError
from ..types import Plan
from . import (
    FORMAT_VERSION,
    recompute_mode,
    sequence_parallel,
    transformer_shape,
)
from .torch import SINGLE_STAGE_CLASSES, torch_stage_modules

RUNTIME = "torchtitan"

SCHEDULE_NAMES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "zb-h1": "InterleavedZeroBubble",
    "looped-bfs": "LoopedBFS",
}
"""pipesearch schedule -> torchtitan ``pipeline_parallel_schedule`` value."""


def generate_llm_fqn_per_model_part(num_stages: int, num_layers: int, input_weight: int = 1,
                                    output_weight: int = 1) -> list[list[str]]:
    """torchtitan's ``generate_llm_fqn_per_model_part`` (torchtitan/distributed/
    pipeline_parallel.py), reimplemented to check which split
    ``pipeline_parallel_layers_per_stage`` would produce.

    Raises:
        InputError: where torchtitan raises ValueError.
    """
    if num_stages < 1:
        raise InputError("Number of stages must be at least 1")
    if num_stages == 1:
        return [["tok_embeddings"] + [f"layers.{i}" for i in range(num_layers)] + ["norm", "output"]]
    eff = num_layers + input_weight + output_weight
    if num_stages > eff:
        raise InputError(f"Number of stages ({num_stages}) cannot be greater than effective layers ({eff})")
    per, extra = divmod(eff, num_stages)
    if per == 0:
        raise InputError("Configuration would result in empty stages")
    if input_weight > per or output_weight > per:
        raise InputError("input/output weight exceeds minimum layers per stage")
    out, cur = [], 0
    for s in range(num_stages):
        n = per + (1 if s < extra else 0)
        mods: list[str] = []
        if s == 0:
            mods.append("tok_embeddings")
            n -= input_weight
        elif s == num_stages - 1:
            n -= output_weight
        for _ in range(n):
            if cur < num_layers:
                mods.append(f"layers.{cur}")
                cur += 1
        if s == num_stages - 1 and s != 0:
            mods.extend(["norm", "output"])
        out.append(mods)
    return out


def _layers_per_stage_alternative(plan: Plan, parts: list[list[str]], names: Sequence[str],
                                  single: bool) -> dict | None:
    """The ``pipeline_parallel_layers_per_stage`` settings that reproduce
    ``parts`` exactly, or ``None``."""
    shape = transformer_shape(names)
    if shape is None or not (shape[0] and shape[2]):
        return None
    nblocks = shape[1]
    S = len(parts)
    spr = S // plan.pp
    if (single and spr != 1) or (not single and spr < 2):
        return None
    # prefer torchtitan's defaults (1, 1), then the smallest weights
    cands = sorted(((i, o) for i in range(0, nblocks + 2) for o in range(0, nblocks + 2)),
                   key=lambda io: (io != (1, 1), io[0] + io[1], io))
    for iw, ow in cands:
        eff = nblocks + iw + ow
        lps = math.ceil(eff / S)
        if lps < 1 or math.ceil(eff / lps) != S:
            continue
        try:
            gen = generate_llm_fqn_per_model_part(S, nblocks, iw, ow)
        except InputError:
            continue
        if gen == parts:
            return {
                "pipeline_parallel_layers_per_stage": lps,
                "pipeline_parallel_first_stage_less_layers": iw,
                "pipeline_parallel_last_stage_less_layers": ow,
            }
    return None


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def to_toml(sections: Mapping[str, Mapping[str, object]]) -> str:
    """A TOML text of ``{section: {key: value}}`` (ints, bools, strings, nested lists)."""
    lines = []
    for sec, kv in sections.items():
        lines.append(f"[{sec}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in kv.items())
        lines.append("")
    return "\n".join(lines)


def export_torchtitan(plan: Plan, *, module_names: Mapping[str, str | Sequence[str]] | None = None) -> dict:
    """Export ``plan`` as torchtitan config sections.

    Args:
        plan: the plan.
        module_names: layer name -> module FQN(s); the default maps transformer
            layer tables to torchtitan's Llama names (``tok_embeddings``,
            ``layers.N``, ``norm`` + ``output``).

    Returns:
        ``{"runtime", "format_version", "parallelism": {...}, "training":
        {...}, "activation_checkpoint": {...}, "toml": str,
        "layers_per_stage_alternative": dict | None, "layer_modules",
        "notes"}``; the three sections are torchtitan's TOML sections,
        ``toml`` the same as text; ``layer_modules`` lists each pipesearch
        layer's FQNs (for :func:`stages_from_module_fqns`).

    Raises:
        InputError: a malformed plan, an empty stage, an FQN nested deeper
            than ``<container>.<key>``, or a torch schedule rule the plan
            breaks (torchtitan builds torch's schedule classes; with a
            single-stage class it passes only ``stages[0]`` to the schedule, so
            ``vp > 1`` would silently drop stages).
    """
    layers, cls, mods = torch_stage_modules(
        plan, "torchtitan", module_names,
        "torchtitan's pipeline_module_split would build a stage module with no layers "
        "(re-plan without empty stages)",
    )
    for fqns in mods:
        for f in fqns:
            if f.count(".") > 1:
                raise InputError(
                    f"torchtitan: module FQN {f!r} is nested more than one level; torchtitan's "
                    f"pipeline_module_split handles top-level modules and '<ModuleList/ModuleDict>.<key>' "
                    f"only ('Does not support nested moduledict and modulelist structures')"
                )
    parts = [[f for i in range(a, b) for f in mods[i]] for a, b in layers.ranges]
    m, mbs = plan.num_micro_batches, plan.micro_batch_size
    rc = recompute_mode(plan, "torchtitan")
    parallelism = {
        "pipeline_parallel_degree": plan.pp,
        "pipeline_parallel_schedule": SCHEDULE_NAMES[plan.schedule],
        "pipeline_parallel_microbatch_size": mbs,
        "module_fqns_per_model_part": parts,
        "tensor_parallel_degree": plan.tp,
        "data_parallel_replicate_degree": plan.dp,
        "data_parallel_shard_degree": 1,
    }
    training = {"local_batch_size": mbs * m, "global_batch_size": mbs * m * plan.dp}
    ac = {"mode": rc}
    alt = _layers_per_stage_alternative(plan, parts, layers.names, cls in SINGLE_STAGE_CLASSES)
    notes = [
        f"number of micro-batches = training.local_batch_size // pipeline_parallel_microbatch_size = {m}.",
        "newer torchtitan (config/parallelism.py) renames module_fqns_per_model_part to "
        "pipeline_parallel_module_fqns_per_model_part and takes num_pp_microbatches = "
        f"{m} instead of the micro-batch size.",
        "data_parallel_shard_degree = 1 and replicate = dp reproduce pipesearch's data parallelism "
        "(full replicas, gradient all-reduce); FSDP (shard > 1) changes memory and communication.",
    ]
    if transformer_shape(layers.names) is None and not module_names:
        notes.append(
            "layer names are used as module FQNs (identity mapping); they must be top-level children "
            "of the model torchtitan splits, and its forward must skip modules set to None."
        )
    if alt is not None:
        notes.append(
            "layers_per_stage_alternative reproduces the same split from torchtitan's own recipe; use it "
            "instead of module_fqns_per_model_part, not with it."
        )
    if plan.tp > 1 and not sequence_parallel(plan):
        notes.append(
            "the plan has tp > 1 without sequence parallelism; torchtitan versions without "
            "parallelism.enable_sequence_parallel always apply sequence parallelism with TP "
            "(less activation memory than planned); set enable_sequence_parallel = false where it exists."
        )
    if rc == "selective":
        notes.append(
            "pipesearch's 'selective' recomputes the attention core (Korthikanti et al.); torchtitan's "
            "selective mode is per-op ('op') or every n-th layer ('int'): choose selective_ac_option = 'op'."
        )
    sections = {"parallelism": parallelism, "training": training, "activation_checkpoint": ac}
    return {
        "runtime": RUNTIME,
        "format_version": FORMAT_VERSION,
        "parallelism": parallelism,
        "training": training,
        "activation_checkpoint": ac,
        "toml": to_toml(sections),
        "layers_per_stage_alternative": alt,
        "layer_modules": mods,
        "notes": notes,
    }


# ---------------------------------------------------------------- parse back


def stages_from_module_fqns(parts: Sequence[Sequence[str]], layer_modules: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """Stage boundaries from ``module_fqns_per_model_part``.

    Args:
        parts: one list of module FQNs per stage.
        layer_modules: per layer in execution order, its module FQNs.

    Returns:
        Half-open layer index ranges, one per stage.

    Raises:
        InputError: a part that does not hold whole, consecutive layers in
            order, or layers left over / repeated.
    """
    owner = {}
    for i, fqns in enumerate(layer_modules):
        for f in fqns:
            owner[f] = i
    out, pos = [], 0
    for s, part in enumerate(parts):
        start = pos
        k = 0
        while k < len(part):
            if pos >= len(layer_modules):
                raise InputError(f"torchtitan part {s}: {part[k]!r} is past the last layer")
            want = list(layer_modules[pos])
            got = list(part[k:k + len(want)])
            if got != want:
                raise InputError(
                    f"torchtitan part {s}: expected modules {want} of layer {pos} next, got {got}"
                    + ("" if part[k] in owner else f" ({part[k]!r} is no layer's module)")
                )
            k += len(want)
            pos += 1
        out.append((start, pos))
    if pos != len(layer_modules):
        raise InputError(f"torchtitan parts cover {pos} of {len(layer_modules)} layers")
    return out


def stages_from_layers_per_stage(alt: Mapping[str, int], num_blocks: int) -> list[list[str]]:
    """``module_fqns_per_model_part`` that torchtitan derives from a
    ``layers_per_stage_alternative`` for a model with ``num_blocks`` layers."""
    iw = alt["pipeline_parallel_first_stage_less_layers"]
    ow = alt["pipeline_parallel_last_stage_less_layers"]
    lps = alt["pipeline_parallel_layers_per_stage"]
    stages = math.ceil((num_blocks + iw + ow) / lps)
    return generate_llm_fqn_per_model_part(stages, num_blocks, iw, ow)
