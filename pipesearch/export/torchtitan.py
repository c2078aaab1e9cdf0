"""Export a plan as a torchtitan 0.3.0 launch command.

torchtitan (github.com/pytorch/torchtitan) builds torch.distributed.pipelining
stages from its own config; its schedule classes are torch's, so the torch
rules (:func:`pipesearch.export.torch.check_torch_schedule`) apply too.

Target: torchtitan 0.3.0 (checked against that release's own code:
``torchtitan/config/manager.py`` ``ConfigManager``, ``config/configs.py``,
``distributed/pipeline_parallel.py``, ``trainer.py``). 0.3.0 reads no TOML:
a job is ``--module <model module> --config <config_registry function>``
plus ``--<section>.<key> value`` overrides parsed by tyro, and activation
checkpointing is a tyro subcommand (``activation-checkpoint:none``,
``activation-checkpoint:full``, ``activation-checkpoint:selective``).
Overrides written (all from the plan):

* ``--parallelism.pipeline_parallel_degree``: pipeline ranks (not stages).
* ``--parallelism.pipeline_parallel_schedule``: a name
  ``torch.distributed.pipelining.schedules.get_schedule_class`` accepts
  (``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble``,
  ``LoopedBFS``).
* ``--parallelism.module_fqns_per_model_part``: one comma-separated FQN list
  per stage ("model part"), as 0.3.0's ``list_str_rule`` parses them;
  ``_pipeline_module_split`` keeps those modules in a deep copy of the model
  (top-level children, or ``<ModuleList/ModuleDict>.<key>``) and sets every
  other top-level child to ``None``, so the names must be the model's own:
  0.3.0's ``Decoder`` has ``tok_embeddings``, ``layers``, ``norm``,
  ``lm_head``. Rank ``r`` builds stages ``r, r + pp, ..`` ("loop" style).
* ``--parallelism.pipeline_parallel_microbatch_size`` and
  ``--training.local_batch_size = micro_batch_size * m``:
  ``_build_pipeline_schedule`` runs ``local_batch_size //
  pipeline_parallel_microbatch_size`` micro-batches. Without pipeline
  parallelism (``pp = 1``) the dataloader batch is ``local_batch_size``
  itself, so it is the micro-batch size and the ``m`` micro-batches are the
  trainer's gradient accumulation steps, ``global_batch_size //
  (local_batch_size * dp)``.
* ``--training.global_batch_size = local * dp``, ``--training.seq_len`` (from
  the plan's model, when known).
* ``--training.disable_cuda_graphs`` when ``pp > 1`` (``Trainer.Config``
  refuses pipeline parallelism with CUDA graphs: "CUDA graphs do not support
  pipeline parallelism yet").
* ``--parallelism.tensor_parallel_degree``,
  ``--parallelism.[no-]enable_sequence_parallel`` (with ``tp > 1``),
  ``--parallelism.data_parallel_replicate_degree = dp`` and
  ``--parallelism.data_parallel_shard_degree 1`` for a plan that shards
  nothing (replicas with a gradient all-reduce; torchtitan's default shard
  degree ``-1`` is FSDP over the leftover ranks), ``replicate 1`` and
  ``shard = dp`` for ``--sharding fsdp`` (FSDP2); ZeRO-1/2 refused
  (:func:`pipesearch.export.torchtitan_dp_degrees`).
* Refused for a 16-bit plan on devices without bf16 (V100, T4: compute
  capability below 8.0): ``training.mixed_precision_param`` takes
  ``bfloat16`` or ``float32`` only (``TrainingConfig``), so the fp16 compute
  the plan was timed with has no setting there; a plan timed in fp32 (a
  profile of 4-byte parameters) gets ``mixed_precision_param = float32``.

``layers_per_stage_alternative``: ``pipeline_parallel_layers_per_stage`` (+
``pipeline_parallel_first/last_stage_less_layers``) when torchtitan's own
recipe (``_get_pipeline_metadata`` + ``_generate_llm_fqn_per_model_part``)
reproduces the plan's split exactly and the stages per rank fit its checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..errors import InputError
from ..types import MIN_BF16_CAPABILITY, Plan
from . import (
    FORMAT_VERSION,
    Inputs,
    recompute_mode,
    refuse_rank_order,
    shell_command,
    shell_line,
    stored_scores_note,
    torchtitan_dp_degrees,
    node_rank_preamble,
    torchrun_prefix,
    sequence_parallel,
    tied_across_stages,
    transformer_shape,
    unmapped_layers_note,
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
                                    output_weight: int = 1,
                                    head: Sequence[str] = ("norm", "lm_head")) -> list[list[str]]:
    """torchtitan 0.3.0's ``_generate_llm_fqn_per_model_part``
    (torchtitan/distributed/pipeline_parallel.py), reimplemented to check which
    split ``pipeline_parallel_layers_per_stage`` would produce (the tests
    compare it with torchtitan's own where torchtitan is installed). 0.2.x's
    ``generate_llm_fqn_per_model_part`` is the same recipe with the head
    modules ``head = ("norm", "output")``.

    Raises:
        InputError: where torchtitan raises ValueError.
    """
    if num_stages < 1:
        raise InputError("Number of stages must be at least 1")
    if num_stages == 1:
        return [["tok_embeddings"] + [f"layers.{i}" for i in range(num_layers)] + list(head)]
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
            mods.extend(head)
        out.append(mods)
    return out


def layers_per_stage_alternative(plan: Plan, parts: list[list[str]], names: Sequence[str],
                                 single: bool, head: Sequence[str] = ("norm", "lm_head")) -> dict | None:
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
            gen = generate_llm_fqn_per_model_part(S, nblocks, iw, ow, head)
        except InputError:
            continue
        if gen == parts:
            return {
                "pipeline_parallel_layers_per_stage": lps,
                "pipeline_parallel_first_stage_less_layers": iw,
                "pipeline_parallel_last_stage_less_layers": ow,
            }
    return None


RUNTIME_VERSION = "0.3.0"

TORCHTITAN_CONFIGS = {
    "llama3-8b": ("llama3", "llama3_8b"),
    "llama3.1-8b": ("llama3", "llama3_8b"),
    "llama3-70b": ("llama3", "llama3_70b"),
    "qwen3-1.7b": ("qwen3", "qwen3_1_7b"),
    "qwen3-32b": ("qwen3", "qwen3_32b"),
}
"""pipesearch catalog model -> torchtitan 0.3.0 ``(--module, --config)``
(``torchtitan/models/{llama3,qwen3}/config_registry.py``; the tests check
that the configs have the same shape). ``llama3_8b`` is Llama-3.1-8B (its
``hf_assets_path``); Llama-3 8B has the same shapes (:data:`CONFIG_IS_ANOTHER`).
Qwen3-1.7B ties its embedding and LM head, which torchtitan refuses with
pipeline parallelism (so does the export)."""

CONFIG_IS_ANOTHER = {"llama3-8b": "Llama-3.1-8B (hf_assets_path ./assets/hf/Llama-3.1-8B)"}
"""Catalog models whose torchtitan config is a model of the same shapes but
another release: what the config trains (a note of the export)."""

#: what a torchtitan config fixes of a model: a transformer with these equal builds with its config
SHAPE_FIELDS = ("kind", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                "ffn_hidden_size", "vocab_size", "gated_mlp", "tied_embeddings", "norm", "bias", "qkv_bias", "qk_norm",
                "position_embedding", "rope_theta", "rope_scaling_type", "rope_scaling_factor")


def same_shape_model(transformer: Mapping | None) -> str | None:
    """The catalog model of :data:`TORCHTITAN_CONFIGS` whose transformer
    has every :data:`SHAPE_FIELDS` value of ``transformer`` (a plan's
    ``inputs.model.transformer``: a model planned from its own config
    file), None when none has."""
    if not isinstance(transformer, Mapping):
        return None
    from ..catalog import resolve
    from ..profiles.transformer import load_transformer

    for cat in TORCHTITAN_CONFIGS:
        cfg = load_transformer(resolve("model", cat))
        if all(getattr(cfg, k) == transformer.get(k) for k in SHAPE_FIELDS):
            return cat
    return None


AC_SUBCOMMANDS = {"none": "activation-checkpoint:none", "full": "activation-checkpoint:full",
                  "selective": "activation-checkpoint:none"}
"""pipesearch recompute mode -> torchtitan 0.3.0 activation-checkpoint subcommand.
torchtitan's attention is fused (FlexAttention or SDPA's flash kernel): it
never stores the attention scores and recomputes them in its backward, which
is pipesearch's ``selective`` (the attention core recomputed, Korthikanti et
al. 2022), with no activation checkpointing; torchtitan's own
``selective`` (per op: every second matmul recomputed as well) has no
pipesearch mode (:func:`fused_attention_note`)."""


def fused_attention_note(rc: str, setting: str, inputs: Inputs) -> str | None:
    """The export note on what torchtitan's fused attention makes of the
    plan's recompute mode ``rc`` (``setting``: the export's words for
    torchtitan's checkpointing off): for ``selective``, and for ``none`` of
    a transformer planned from its shapes (``inputs``); None otherwise."""
    if rc == "selective":
        return (f"pipesearch's 'selective' recomputes the attention core (Korthikanti et al.): torchtitan's fused "
                f"attention (FlexAttention / SDPA) does that itself, never storing the scores, so {setting} is that "
                f"plan; torchtitan's own selective checkpointing also recomputes every second matmul (slower than "
                f"planned).")
    if rc == "none" and inputs.model.get("kind") == "transformer":
        return stored_scores_note("torchtitan's fused attention", setting)
    return None


def pipeline_sections(plan: Plan, parts, inputs: Inputs, release: str) -> tuple[dict, dict, str]:
    """The ``parallelism`` and ``training`` keys both torchtitan releases
    share (0.3.0 overrides, 0.2.x TOML: the same names), from the plan:
    pipeline degree, schedule class, micro-batch size, modules per stage
    (``parts``), tensor and data-parallel degrees
    (:func:`pipesearch.export.torchtitan_dp_degrees`, whose note is
    returned third), local and global batch, sequence length, and
    ``mixed_precision_param = float32`` for a plan timed in fp32 (a profile
    of 4-byte parameters, :attr:`pipesearch.export.Inputs.training_precision`;
    torchtitan's default is bfloat16)."""
    replicate, shard, dp_note = torchtitan_dp_degrees(plan, inputs, release)
    m, mbs = plan.num_micro_batches, plan.micro_batch_size
    parallelism = {
        "pipeline_parallel_degree": plan.pp,
        "pipeline_parallel_schedule": SCHEDULE_NAMES[plan.schedule],
        "pipeline_parallel_microbatch_size": mbs,
        "module_fqns_per_model_part": parts,
        "tensor_parallel_degree": plan.tp,
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
    }
    # with pipeline parallelism the trainer splits local_batch_size into
    # micro-batches of pipeline_parallel_microbatch_size; without it each
    # forward takes local_batch_size samples and the m micro-batches are
    # gradient accumulation steps, global // (local * dp) (Trainer.__init__)
    local = mbs * m if plan.pp > 1 else mbs
    training = {"local_batch_size": local, "global_batch_size": mbs * m * plan.dp}
    if inputs.seq_len:
        training["seq_len"] = inputs.seq_len
    if inputs.training_precision == "fp32":
        training["mixed_precision_param"] = "float32"
    return parallelism, training, dp_note


#: how torchtitan numbers its ranks (ParallelDims.build_mesh: one device mesh, pp outermost)
TORCHTITAN_RANK_ORDER = ("builds one device mesh over the ranks with pp outermost (pp, dp_replicate, dp_shard, cp, "
                         "tp), which puts the replicas of a stage on consecutive ranks")


def check_torchtitan_version(version: str, what: str = "torchtitan version") -> None:
    """Refuse a torchtitan release the exporter does not write for.

    Raises:
        InputError: ``version`` is not 0.3 / 0.3.0 or a 0.2.x of
            :data:`pipesearch.export.torchtitan_toml.TOML_VERSIONS`, naming
            ``what`` (the option or argument) and the releases it knows.
    """
    from .torchtitan_toml import TOML_VERSIONS

    if version not in ("0.3", RUNTIME_VERSION) + TOML_VERSIONS:
        raise InputError(f"{what} {version!r}: expected one of {', '.join(('0.3', RUNTIME_VERSION) + TOML_VERSIONS)} "
                         "(0.3.0 reads --module/--config overrides; 0.2.x reads a job TOML)")


def _refusals(plan: Plan, inputs: Inputs | None) -> None:
    """Raise InputError where torchtitan cannot run ``plan``: another rank
    order than its mesh's, devices without bf16 for a half-precision plan,
    an embedding tied to the head on another stage."""
    refuse_rank_order(plan, "torchtitan", ("data",), TORCHTITAN_RANK_ORDER, inputs)
    half = inputs.without_bf16(plan) if inputs.training_precision != "fp32" else []
    if half:
        others = ("megatron or deepspeed, which train" if inputs.model.get("kind") == "transformer"
                  else "deepspeed, which trains")
        raise InputError(
            f"torchtitan trains in bf16 or fp32 (training.mixed_precision_param) and {', '.join(half)} has no bf16 "
            f"(compute capability below {MIN_BF16_CAPABILITY:g}): the plan's fp16 compute has no setting there; "
            f"export to {others} in fp16 with loss scaling")
    if tied_across_stages(plan):  # its model config's update_from_config raises NotImplementedError
        raise InputError("torchtitan: the model ties its input embedding and LM head, on different stages, and "
                         "torchtitan refuses weight tying with pipeline parallelism ('Weight tying is not supported "
                         "with Pipeline Parallel'); re-plan with --pp 1, or export --format torch (which says how "
                         "to keep the copies equal)")


def _stage_modules(plan: Plan, module_names):
    """:func:`pipesearch.export.torch.torch_stage_modules` for torchtitan,
    every FQN checked: at most ``<container>.<key>`` and no comma (raises
    InputError)."""
    layers, cls, mods = torch_stage_modules(
        plan, "torchtitan", module_names,
        "torchtitan's _pipeline_module_split would build a stage module with no layers "
        "(re-plan without empty stages)",
    )
    for f in (f for fqns in mods for f in fqns):
        if f.count(".") > 1:
            raise InputError(
                f"torchtitan: module FQN {f!r} is nested more than one level; torchtitan's "
                f"_pipeline_module_split handles top-level modules and '<ModuleList/ModuleDict>.<key>' "
                f"only ('Does not support nested moduledict and modulelist structures')"
            )
        if "," in f or not f.strip():
            raise InputError(f"torchtitan: module FQN {f!r} cannot be written as an override "
                             f"(torchtitan splits each stage's list on commas)")
    return layers, cls, mods


def _overrides(parallelism: dict, training: dict, rc: str) -> list[str]:
    """The ``--section.key value`` overrides of the two sections (booleans
    as ``--section.key`` / ``--section.no-key``, a stage's FQNs joined by
    commas), then the activation-checkpoint subcommand of recompute ``rc``."""
    overrides: list[str] = []
    for section, kv in (("parallelism", parallelism), ("training", training)):
        for key, val in kv.items():
            flag = f"--{section}.{key}"
            if isinstance(val, bool):
                overrides.append(flag if val else f"--{section}.no-{key}")
            elif key == "module_fqns_per_model_part":
                overrides += [flag, *(",".join(part) for part in val)]
            else:
                overrides += [flag, str(val)]
    overrides.append(AC_SUBCOMMANDS[rc])  # a tyro subcommand: after every top-level option
    return overrides


def _module_and_config(inputs: Inputs, module: str | None, config: str | None, notes: list[str]):
    """``(module, config, placeholders)``: the caller's ``--module`` /
    ``--config``, else :data:`TORCHTITAN_CONFIGS`' for the plan's model (or
    a model of its shapes, :func:`same_shape_model`), else ``MODULE`` /
    ``CONFIG`` with ``placeholders`` saying so (None otherwise); the notes
    that go with each are appended to ``notes``."""
    if module is not None and config is not None:
        return module, config, None
    name = str(inputs.model.get("name", ""))
    known = TORCHTITAN_CONFIGS.get(name)
    alike = None if known else same_shape_model(inputs.model.get("transformer"))
    if alike:  # a model of its own file with the shapes of a catalog model torchtitan has a config of
        known = TORCHTITAN_CONFIGS[alike]
        notes.append(f"model {name!r} has the shapes of {alike} (layers, widths, heads, vocabulary): torchtitan's "
                     f"{known[1]} builds it; point --hf_assets_path at {name!r}'s tokenizer and weights.")
    elif known and name in CONFIG_IS_ANOTHER:
        notes.append(f"torchtitan's {known[1]} is {CONFIG_IS_ANOTHER[name]}: the same shapes as {name}, so "
                     f"the same costs; point --hf_assets_path at {name}'s tokenizer and weights to train it.")
    if known:
        return module or known[0], config or known[1], None
    placeholders = (f"pipesearch knows no torchtitan config for model {name or '(not given)'!r}: replace "
                    f"MODULE and CONFIG with the --module / --config of a torchtitan config_registry function "
                    f"of the same shape")
    notes.append(f"warning: {placeholders} before running the command.")
    return module or "MODULE", config or "CONFIG", placeholders


def export_torchtitan(plan: Plan, *, module_names: Mapping[str, str | Sequence[str]] | None = None,
                      inputs: Inputs | None = None, module: str | None = None, config: str | None = None,
                      torchtitan_version: str | None = None) -> dict:
    """Export ``plan`` as a torchtitan 0.3.0 launch command, or for an
    older release that reads a job TOML (``torchtitan_version`` ``"0.2"`` ..
    ``"0.2.2"``: :func:`pipesearch.export.torchtitan_toml.export_torchtitan_toml`).

    Args:
        plan: the plan.
        module_names: layer name -> module FQN(s); the default maps transformer
            layer tables to torchtitan's decoder names (``tok_embeddings``,
            ``layers.N``, ``norm`` + ``lm_head``).
        inputs: the plan file's inputs (model name and sequence length, node
            size); optional.
        module, config: torchtitan's ``--module`` / ``--config``; default from
            :data:`TORCHTITAN_CONFIGS` for the plan's model, else the
            placeholders ``MODULE`` / ``CONFIG`` (with a note).
        torchtitan_version: the release to target: ``None``, ``"0.3"`` or
            ``"0.3.0"`` (this function), or one of
            :data:`pipesearch.export.torchtitan_toml.TOML_VERSIONS`.

    Returns:
        ``{"runtime", "runtime_version", "format_version", "overrides":
        [argv items after --module/--config], "argv": [the whole argv of
        torchtitan.train], "command_line": str (torchrun ... -m
        torchtitan.train ...), "env": {}, "parallelism": {...}, "training":
        {...}, "activation_checkpoint": subcommand,
        "layers_per_stage_alternative": dict | None, "layer_modules",
        "files": {"launch_torchtitan.sh": text}, "notes"}``; ``parallelism``
        and ``training`` are the same settings keyed by torchtitan's field
        names.

    Raises:
        InputError: a malformed plan, an empty stage, an FQN nested deeper
            than ``<container>.<key>``, or a torch schedule rule the plan
            breaks (torchtitan builds torch's schedule classes; with a
            single-stage class it passes only ``stages[0]`` to the schedule, so
            ``vp > 1`` would silently drop stages); an unknown
            ``torchtitan_version``; devices without bf16 in the plan.
    """
    _refusals(plan, inputs)
    if torchtitan_version is not None and torchtitan_version not in ("0.3", RUNTIME_VERSION):
        from .torchtitan_toml import export_torchtitan_toml

        check_torchtitan_version(torchtitan_version)
        if module is not None or config is not None:
            raise InputError(f"torchtitan {torchtitan_version}: --module/--config are 0.3.0's; a 0.2.x job TOML "
                             "names its model by [model] name and flavor")
        return export_torchtitan_toml(plan, module_names=module_names, inputs=inputs)
    inputs = inputs or Inputs()
    layers, cls, mods = _stage_modules(plan, module_names)
    parts = [[f for i in range(a, b) for f in mods[i]] for a, b in layers.ranges]
    m = plan.num_micro_batches
    rc = recompute_mode(plan, "torchtitan")
    parallelism, training, dp_note = pipeline_sections(plan, parts, inputs, RUNTIME_VERSION)
    if plan.tp > 1:
        parallelism["enable_sequence_parallel"] = sequence_parallel(plan)
    if plan.pp > 1:
        training["disable_cuda_graphs"] = True
    overrides = _overrides(parallelism, training, rc)
    notes = [
        f"torchtitan {RUNTIME_VERSION}: {m} micro-batches = training.local_batch_size // "
        f"pipeline_parallel_microbatch_size." if plan.pp > 1 else
        f"torchtitan {RUNTIME_VERSION}: without pipeline parallelism the {m} micro-batches are gradient "
        f"accumulation steps = training.global_batch_size // (training.local_batch_size x {plan.dp} data-parallel "
        f"ranks).",
        dp_note,
    ]
    module, config, placeholders = _module_and_config(inputs, module, config, notes)
    argv = ["--module", module, "--config", config, *overrides]
    world = plan.tp * plan.pp * plan.dp
    launch, launch_note = torchrun_prefix(world, inputs, plan)
    command = launch + ["-m", "torchtitan.train", *argv]
    if launch_note:
        notes.append(launch_note)
    alt = layers_per_stage_alternative(plan, parts, layers.names, cls in SINGLE_STAGE_CLASSES)
    unmapped = unmapped_layers_note(layers.names, module_names, inputs, "module_fqns_per_model_part and "
                                    "layer_modules", "the model torchtitan builds (top-level children, its forward "
                                    "skipping modules set to None)", warn=True)
    if unmapped:  # torchtitan builds the models of its own registry: a warning for any other layer names
        notes.append(unmapped)
    if alt is not None:
        notes.append(
            "layers_per_stage_alternative gives the same split from torchtitan's own recipe "
            "(--parallelism.pipeline_parallel_layers_per_stage ...); pass it instead of "
            "module_fqns_per_model_part, not with it."
        )
    fused = fused_attention_note(rc, "activation-checkpoint:none", inputs)
    if fused:
        notes.append(fused)
    if plan.schedule == "zb-h1":
        notes.append("zb-h1 runs as torch's ScheduleInterleavedZeroBubble with one stage per rank.")
    script = "#!/usr/bin/env bash\n# " + f"torchtitan {RUNTIME_VERSION} launch for the plan (pipesearch export)\n" + \
        ("" if placeholders is None else f"# {placeholders}.\n") + "set -euo pipefail\n" + \
        node_rank_preamble(plan, inputs) + shell_command(command) + "\n"
    return {
        "runtime": RUNTIME,
        "runtime_version": RUNTIME_VERSION,
        "format_version": FORMAT_VERSION,
        "overrides": overrides,
        "argv": argv,
        "command_line": shell_line(command),
        "env": {},
        "parallelism": parallelism,
        "training": training,
        "activation_checkpoint": AC_SUBCOMMANDS[rc],
        "layers_per_stage_alternative": alt,
        "layer_modules": mods,
        "files": {"launch_torchtitan.sh": script},
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


def parse_overrides(overrides: Sequence[str]) -> dict[str, object]:
    """The settings in an export's ``overrides`` (the form torchtitan 0.3.0's
    tyro parser reads), without torchtitan.

    Returns:
        ``{"section.key": value}``: a string for a valued option, ``True`` /
        ``False`` for ``--section.key`` / ``--section.no-key`` switches, a list
        of FQN lists for ``module_fqns_per_model_part``, and
        ``{"activation_checkpoint": subcommand}``.

    Raises:
        InputError: a token that is no option, or an option without a value.
    """
    out: dict[str, object] = {}
    i = 0
    toks = list(overrides)
    while i < len(toks):
        tok = toks[i]
        if tok.startswith("activation-checkpoint:"):
            out["activation_checkpoint"] = tok
            i += 1
            continue
        if not tok.startswith("--") or "." not in tok:
            raise InputError(f"torchtitan overrides: {tok!r} is not a --section.key option")
        section, key = tok[2:].split(".", 1)
        vals = []
        j = i + 1
        while j < len(toks) and not toks[j].startswith("--") and not toks[j].startswith("activation-checkpoint:"):
            vals.append(toks[j])
            j += 1
        if not vals:
            if key.startswith("no-"):
                out[f"{section}.{key[3:]}"] = False
            else:
                out[f"{section}.{key}"] = True
        elif key == "module_fqns_per_model_part":
            out[f"{section}.{key}"] = [v.split(",") for v in vals]
        elif len(vals) == 1:
            out[f"{section}.{key}"] = vals[0]
        else:
            raise InputError(f"torchtitan overrides: {tok} has {len(vals)} values")
        i = j
    return out
