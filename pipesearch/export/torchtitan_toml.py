"""Export a plan as a job TOML for the torchtitan releases that read one (0.2.x).

torchtitan (github.com/pytorch/torchtitan) read its job from a TOML file,
``--job.config_file FILE``, up to release 0.2.2 (tag ``v0.2.2``, commit
73a0e69, 2026-02-20); the next change to ``torchtitan/config/manager.py``
(2026-02-23, "Config System Refactor: TOML to Python Dataclass Registry")
replaced it with the ``--module/--config`` registry that 0.3.0 reads
(:mod:`pipesearch.export.torchtitan`). 0.2.0, 0.2.1 and 0.2.2 have the same
pipeline keys; 0.1.0 named the split differently
(``pipeline_parallel_split_points``) and is not a target.

Checked against tag ``v0.2.2``:

* ``torchtitan/config/manager.py``: ``ConfigManager._maybe_load_toml`` loads
  the file with ``tomllib``; ``_dict_to_dataclass`` raises ``ValueError`` on
  a key that is no field of the section, so only that release's fields are
  written (:data:`TOML_FIELDS`);
* ``torchtitan/config/job_config.py``: the sections and fields;
* ``torchtitan/distributed/pipeline_parallel.py``: ``pipeline_llm`` takes
  ``module_fqns_per_model_part`` as the stages (one FQN list per stage, rank
  ``r`` builds stages ``r, r + pp, ..``), ``build_pipeline_schedule`` runs
  ``local_batch_size // pipeline_parallel_microbatch_size`` micro-batches of
  torch's schedule classes (so the torch rules apply, as for 0.3.0);
* ``torchtitan/models/llama3/model/model.py``: the Llama ``Transformer``'s
  children are ``tok_embeddings``, ``layers``, ``norm``, ``output`` (0.3.0
  renamed ``output`` to ``lm_head``), and ``models/llama3/__init__.py``
  names the flavors ``"8B"`` and ``"70B"``.

Fields written (all from the plan):

* ``[parallelism]``: ``pipeline_parallel_degree`` (ranks),
  ``pipeline_parallel_schedule`` (torch's class name, as for 0.3.0),
  ``pipeline_parallel_microbatch_size``, ``module_fqns_per_model_part``,
  ``tensor_parallel_degree``, ``data_parallel_replicate_degree = dp`` and
  ``data_parallel_shard_degree = 1`` (plain replication, as the plan
  assumes; torchtitan's default ``-1`` is FSDP);
* ``[training]``: ``local_batch_size = micro_batch_size * m`` (``pp = 1``:
  the micro-batch size, the ``m`` micro-batches being gradient accumulation steps),
  ``global_batch_size = local * dp``, ``seq_len`` when the plan's model has one;
* ``[activation_checkpoint]``: ``mode`` ``full`` for recompute ``full``,
  else ``none`` (torchtitan's attention is fused: pipesearch's ``selective``,
  :data:`pipesearch.export.torchtitan.AC_SUBCOMMANDS`);
* ``[model]``: ``name`` and ``flavor`` for the catalog models of
  :data:`TORCHTITAN_FLAVORS`, else placeholders (with a note);
* ``[job]``: ``description``.

0.2.x has no sequence-parallel switch: its Llama tensor-parallel plan always
shards the norms along the sequence (noted when the plan has ``tp > 1``
without sequence parallelism).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import InputError
from ..types import Plan
from . import (FORMAT_VERSION, Inputs, plan_layers, recompute_mode, sequence_parallel, shell_command, shell_line,
               node_rank_preamble,
    torchrun_prefix,
               transformer_shape, unmapped_layers_note)
from .torch import SINGLE_STAGE_CLASSES, torch_stage_modules
from .torchtitan import RUNTIME, fused_attention_note, layers_per_stage_alternative, pipeline_sections

TOML_VERSIONS = ("0.2", "0.2.0", "0.2.1", "0.2.2")
"""Releases whose job TOML this module writes (same keys in all)."""

TOML_RUNTIME_VERSION = "0.2.2"

HEAD_MODULES = ("norm", "output")
"""0.2.x Llama ``Transformer`` children after the blocks."""

TORCHTITAN_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3.1-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B")}
"""pipesearch catalog model -> 0.2.x ``[model] name, flavor``."""

TOML_FIELDS = {
    "job": ("config_file", "dump_folder", "description", "print_config", "custom_config_module"),
    "model": ("name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"),
    "training": ("dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
                 "gc_debug"),
    "parallelism": ("data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "context_parallel_degree", "context_parallel_rotate_method", "expert_parallel_degree",
                    "expert_tensor_parallel_degree"),
    "activation_checkpoint": ("mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "early_stop", "memory_budget", "visualize_memory_budget_pareto"),
}
"""Fields of the sections written, as in tag v0.2.0 and v0.2.2
``torchtitan/config/job_config.py`` (those present in both)."""

TOML_FILE = "torchtitan.toml"


def _default_head_names(names: Sequence[str], module_names) -> dict | None:
    """``module_names`` with the 0.2.x head modules for a transformer layer
    table's ``head`` (unless the caller names it)."""
    if transformer_shape(names) is None or "head" not in names:
        return module_names
    return {"head": list(HEAD_MODULES), **dict(module_names or {})}


def export_torchtitan_toml(plan: Plan, *, module_names: Mapping[str, str | Sequence[str]] | None = None,
                           inputs: Inputs | None = None) -> dict:
    """Export ``plan`` as a torchtitan 0.2.x job TOML and its launch command.

    Args:
        plan: the plan.
        module_names: layer name -> module FQN(s); the default maps transformer
            layer tables to 0.2.x's Llama names (``tok_embeddings``,
            ``layers.N``, ``norm`` + ``output``).
        inputs: the plan file's inputs (model name, sequence length, node size).

    Returns:
        ``{"runtime", "runtime_version": "0.2.2", "format_version", "config":
        {section: {field: value}}, "argv": ["--job.config_file",
        "torchtitan.toml"], "command_line", "env": {}, "parallelism",
        "training", "activation_checkpoint": mode, "layers_per_stage_alternative",
        "layer_modules", "files": {"torchtitan.toml", "launch_torchtitan.sh"},
        "notes"}``.

    Raises:
        InputError: as :func:`pipesearch.export.torchtitan.export_torchtitan`
            (empty stage, torch schedule rule, FQN nested too deep).
    """
    import tomli_w

    inputs = inputs or Inputs()
    names = plan_layers(plan, "torchtitan").names
    layers, cls, mods = torch_stage_modules(
        plan, "torchtitan", _default_head_names(names, module_names),
        "torchtitan's pipeline_module_split would build a stage module with no layers "
        "(re-plan without empty stages)",
    )
    for fqns in mods:
        for f in fqns:
            if f.count(".") > 1:
                raise InputError(f"torchtitan {TOML_RUNTIME_VERSION}: module FQN {f!r} is nested more than one "
                                 "level; pipeline_module_split handles top-level modules and "
                                 "'<ModuleList/ModuleDict>.<key>' only")
    parts = [[f for i in range(a, b) for f in mods[i]] for a, b in layers.ranges]
    m = plan.num_micro_batches
    rc = recompute_mode(plan, "torchtitan")
    parallelism, training, dp_note = pipeline_sections(plan, parts, inputs, TOML_RUNTIME_VERSION)
    checkpoint = {"mode": "full" if rc == "full" else "none"}
    notes = [
        f"torchtitan {TOML_RUNTIME_VERSION} (0.2.x): {m} micro-batches = training.local_batch_size // "
        "pipeline_parallel_microbatch_size; the TOML holds only what the plan decides: merge it into your job "
        "file (dataset, steps, optimizer ...) or pass those as --section.key overrides.",
        dp_note,
    ]
    name = str(inputs.model.get("name", ""))
    model_name, flavor = TORCHTITAN_FLAVORS.get(name, ("MODEL", "FLAVOR"))
    if name not in TORCHTITAN_FLAVORS:  # the TOML says MODEL and FLAVOR, which torchtitan cannot run
        notes.append(f"warning: pipesearch knows no torchtitan 0.2 flavor for model {name or '(not given)'!r}: set "
                     "[model] name and flavor to a torchtitan model of the same shape before running the job file.")
    unmapped = unmapped_layers_note(layers.names, module_names, inputs, "[parallelism] module_fqns_per_model_part"
                                    " and layer_modules", "the model torchtitan builds (top-level children)",
                                    warn=True)
    if unmapped:
        notes.append(unmapped)
    if plan.tp > 1 and not sequence_parallel(plan):
        notes.append("torchtitan 0.2.x always uses sequence parallelism with tensor parallelism (no switch); "
                     "the plan assumed none, so torchtitan keeps less activation memory than planned.")
    fused = fused_attention_note(rc, "mode 'none'", inputs)
    if fused:
        notes.append(fused)
    config = {
        "job": {"description": f"pipesearch plan: pp {plan.pp} x dp {plan.dp} x tp {plan.tp}, {plan.schedule}"},
        "model": {"name": model_name, "flavor": flavor},
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": checkpoint,
    }
    text = f"# torchtitan {TOML_RUNTIME_VERSION} job file for the plan (pipesearch export)\n" + tomli_w.dumps(config)
    argv = ["--job.config_file", TOML_FILE]
    launch, launch_note = torchrun_prefix(plan.tp * plan.pp * plan.dp, inputs, plan)
    if launch_note:
        notes.append(launch_note)
    command = launch + ["-m", "torchtitan.train", *argv]
    alt = layers_per_stage_alternative(plan, parts, layers.names, cls in SINGLE_STAGE_CLASSES, HEAD_MODULES)
    if alt is not None:
        notes.append("layers_per_stage_alternative gives the same split from torchtitan's own recipe "
                     "(pipeline_parallel_layers_per_stage ...); use it instead of module_fqns_per_model_part, "
                     "not with it.")
    # run from the torchtitan checkout (its default asset paths are relative); the TOML is found beside the script
    script = (f"#!/usr/bin/env bash\n# torchtitan {TOML_RUNTIME_VERSION} launch for the plan (pipesearch export)\n"
              "set -euo pipefail\n" + node_rank_preamble(plan, inputs)
              + f"CONFIG_FILE=\"${{CONFIG_FILE:-$(dirname \"$0\")/{TOML_FILE}}}\"\n"
              + shell_command(command[:-1]) + ' "$CONFIG_FILE"\n')
    return {
        "runtime": RUNTIME,
        "runtime_version": TOML_RUNTIME_VERSION,
        "format_version": FORMAT_VERSION,
        "config": config,
        "argv": argv,
        "command_line": shell_line(command),
        "env": {},
        "parallelism": parallelism,
        "training": training,
        "activation_checkpoint": rc,
        "layers_per_stage_alternative": alt,
        "layer_modules": mods,
        "files": {TOML_FILE: text, "launch_torchtitan.sh": script},
        "notes": notes,
    }
