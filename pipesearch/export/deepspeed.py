"""Export a plan for DeepSpeed's pipeline engine (``deepspeed.pipe.PipelineModule``).

Rules (read through the code corpus and issue tracker):

* ``PipelineModule(layers, num_stages=None, topology=None, loss_fn=None, ...,
  partition_method='parameters', activation_checkpoint_interval=0, ...)``
  (deepspeed/runtime/pipe/module.py). ``_partition_layers`` knows
  ``'uniform'`` (``ds_utils.partition_uniform`` over the layer count),
  ``'parameters'`` (balanced by trainable parameter counts), ``'type:<regex>'``
  (balanced over the layers whose class name matches) and ``'profile'`` (not
  implemented). There is **no** method that takes exact boundaries: the
  request for one (deepspeedai/DeepSpeed issue #2974, "Custom partition option
  for PipelineModule") is open, and users set ``self.parts`` themselves
  (issue #5379). The export therefore gives the boundary list ``parts``
  (``len = num_stages + 1``, stage ``s`` holds layers ``parts[s] ..
  parts[s+1]-1``, the format of ``PipelineModule.parts``) and a small subclass
  that overrides ``_partition_layers`` to install it and call
  ``self._set_bounds(start=parts[stage_id], stop=parts[stage_id + 1])``, as
  the built-in methods do. ``partition_method='uniform'`` is named as an
  equivalent only when the layers divide evenly (``partition_uniform`` spread
  a remainder differently across DeepSpeed versions: floor in old releases,
  extra layers to the first stages in newer ones).
* The pipeline engine trains with ``TrainSchedule`` (deepspeed/runtime/pipe/
  schedule.py), synchronous 1F1B ("num_pipe_buffers ... For synchronous 1F1B,
  this is equivalent to the index difference between this stage and the last
  stage"); it has no GPipe, interleaved, zero-bubble or looped schedule and no
  virtual stages. **Decision:** plans with another schedule or ``vp > 1`` are
  refused (DeepSpeed would run 1F1B instead of what was planned).
* Micro-batches are gradient-accumulation steps: ``train_batch_size =
  train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp`` (the
  config check DeepSpeed applies), ``gradient_accumulation_steps = m``.
* Activation checkpointing in ``PipelineModule`` is per layer
  (``activation_checkpoint_interval``: checkpoint every n layers, 0 = off).
* ``ds_config.json`` (the export's ``files``): the batch keys above,
  ``zero_optimization.stage`` 1 with ZeRO-1 (the plan's ``job.zero1``), else
  0 (the pipeline engine refuses stages 2 and 3), and ``bf16.enabled`` (or
  ``fp16.enabled`` on devices without bf16) for plans of 16-bit models
  (transformer tables, profiles of 2-byte parameters; a profile of 4-byte
  parameters trains in fp32: no block). Checked by DeepSpeed 0.19.8's ``DeepSpeedConfig`` in the tests.
* An empty stage is refused: the rank would hold a partition without layers
  or parameters.
* ZeRO-Offload (``--optimizer-offload``): ``offload_optimizer`` is "Valid
  with stage 1, 2, and 3" (deepspeed/runtime/zero/offload_config.py), so the
  export writes ZeRO stage 1, which shards the optimizer state and the CPU
  step over the dp replicas: a plan with ``dp > 1`` that shards nothing is
  refused (re-plan with ``--sharding zero1``). DeepSpeed has no one-step
  delayed parameter update (Ren et al. ATC'21 sec. 5; the offload config's
  keys are ``device``, ``nvme_path``, ``buffer_count``, ``pin_memory``,
  ``pipeline_read/write``, ``fast_init``, ``ratio`` and ``super_offload``,
  the last two ZeRO-3 only), so ``--delayed-optimizer-step`` plans are
  refused: DeepSpeed would step synchronously.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from ..errors import InputError
from ..types import Plan
from . import (FORMAT_VERSION, Inputs, deepspeed_cpu_checkpointing, hostfile_note, plan_extra, plan_layers,
               recompute_mode, refuse_empty_stages, refuse_rank_order, sequence_parallel)

RUNTIME = "deepspeed"

RUNTIME_VERSION = "0.19.8"
"""The DeepSpeed release the tests check the config and partition against
(``DeepSpeedConfig``, ``PipelineModule``)."""

PARTITION_RECIPE = '''\
from deepspeed.pipe import PipelineModule


class ExactPartitionPipelineModule(PipelineModule):
    """PipelineModule with the stage boundaries given as ``parts``
    (len num_stages + 1, as PipelineModule.parts)."""

    def __init__(self, *args, parts, **kwargs):
        self._exact_parts = [int(x) for x in parts]
        super().__init__(*args, **kwargs)

    def _partition_layers(self, method="uniform"):
        num_stages = self._topo.get_dim("pipe")
        stage_id = self._topo.get_coord(self.global_rank).pipe
        parts = self._exact_parts
        if len(parts) != num_stages + 1 or parts[0] != 0 or parts[-1] != len(self._layer_specs):
            raise ValueError(f"parts {parts} do not fit {num_stages} stages of {len(self._layer_specs)} layers")
        self.parts = list(parts)
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])
'''


def _partition_uniform_new(num_items: int, num_parts: int) -> list[int]:
    # deepspeed/runtime/utils.py partition_uniform (newer releases)
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def _partition_uniform_old(num_items: int, num_parts: int) -> list[int]:
    # deepspeed/runtime/utils.py partition_uniform (older releases: floor, remainder on the last stage)
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk = num_items // num_parts
    return [min(chunk * p, num_items) for p in range(num_parts)] + [num_items]


def export_deepspeed(plan: Plan, *, module_names: Mapping[str, str | Sequence[str]] | None = None,
                     inputs: Inputs | None = None) -> dict:
    """Export ``plan`` for DeepSpeed's pipeline engine.

    Args:
        plan: the plan; the layer list is the ``layers`` list given to
            ``PipelineModule`` (one entry per pipesearch layer, in order).
        module_names: unused (DeepSpeed indexes layers by position); noted if
            given.

    Returns:
        ``{"runtime", "format_version", "pipeline_module": {"num_stages",
        "parts", "partition_method", "activation_checkpoint_interval",
        "topology"}, "config": {"train_batch_size",
        "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"},
        "parts", "num_stages", "partition_recipe": python source, "notes"}``.
        ``pipeline_module.partition_method`` is ``"uniform"`` when that gives
        the same split in every DeepSpeed version, else ``None`` (use the
        recipe with ``parts``).

    Raises:
        InputError: a malformed plan, an empty stage, ``vp > 1``, a
            schedule other than ``1f1b``, a delayed optimizer step, or an
            offloaded optimizer with ``dp > 1`` and no ZeRO-1 sharding.
    """
    layers = plan_layers(plan, "deepspeed")
    if plan.schedule != "1f1b" and plan.pp > 1:  # one stage: any schedule is plain accumulation
        raise InputError(
            f"deepspeed: the pipeline engine always runs its TrainSchedule (synchronous 1F1B) and has no "
            f"{plan.schedule!r} schedule, so it would not run this plan as planned; re-plan with schedule '1f1b'"
        )
    if plan.vp != 1:
        raise InputError(f"deepspeed: PipelineModule has one stage per pipeline rank, the plan has vp={plan.vp}")
    refuse_empty_stages(
        layers, "deepspeed",
        "a PipelineModule stage must hold at least one layer (its rank would build no layers and have no "
        "parameters to train); re-plan without empty stages",
    )
    p, m, mbs = plan.pp, plan.num_micro_batches, plan.micro_batch_size
    n = len(layers.names)
    parts = [0] + [b for _, b in layers.ranges]
    same_uniform = parts == _partition_uniform_new(n, p) == _partition_uniform_old(n, p)
    rc = recompute_mode(plan, "deepspeed")
    topology = _topology(plan, inputs)
    notes = [
        "build the module with ExactPartitionPipelineModule(layers, topology=topology(), parts=PARTS, "
        "activation_checkpoint_interval=ACTIVATION_CHECKPOINT_INTERVAL, ...) from partition.py" + (" or PipelineModule(..., partition_method='uniform'), which gives the same split."
                              if same_uniform else "; no built-in partition_method gives this split."),
        f"DeepSpeed runs {m} micro-batches per step as gradient accumulation (TrainSchedule, 1F1B)." if p > 1 else
        f"one stage: DeepSpeed's pipeline engine runs the {m} micro-batches one after another as gradient "
        f"accumulation (no pipeline; deepspeed.initialize with the plain module runs the same).",
        f"parts index the plan's {n} layers in order ({', '.join(layers.names[:2])}, ..., {layers.names[-1]}): the "
        f"layers list passed to the module must be exactly those, one LayerSpec each (embedding and head "
        f"included); a tied embedding and head need TiedLayerSpec on both ends.",
    ]
    where = hostfile_note(plan, inputs, "pipeline" if topology["class"] == "ProcessTopology" else "data")
    if where:
        notes.append(where)
    if topology["class"] == "ProcessTopology":
        notes.append(f"topology: ProcessTopology(axes={topology['axes']}, dims={topology['dims']}) puts each "
                     f"replica's stages on consecutive ranks, as planned (PipeDataParallelTopology would put the "
                     f"replicas of a stage there instead, and the stage-to-stage sends on other links).")
    if rc == "selective":
        notes.append("recompute='selective' (attention core) has no PipelineModule option; it must come from the "
                     "layers (e.g. a FlashAttention kernel). activation_checkpoint_interval is 0.")
    if plan.tp > 1:
        notes.append(f"tp={plan.tp}: the layers must implement tensor parallelism (e.g. Megatron-DeepSpeed); "
                     f"the topology only lays out the ranks.")
    if sequence_parallel(plan):
        notes.append("sequence_parallel must come from the layers' tensor-parallel implementation.")
    if m < p:
        notes.append(f"only {m} micro-batches for {p} stages: most of each step is pipeline bubble.")
    if module_names:
        notes.append("module_names is unused: DeepSpeed indexes layers by position.")
    inputs = inputs or Inputs()
    if inputs.sharding not in ("none", "zero1"):
        raise InputError(f"deepspeed: sharding {inputs.sharding!r}: the pipeline engine runs ZeRO stage 0 or 1 only "
                         f"(ZeRO-2 and -3 are incompatible with pipeline parallelism); re-plan with --sharding "
                         f"zero1 or none")
    config = {
        "train_batch_size": mbs * m * plan.dp,
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": m,
        # the pipeline engine supports ZeRO stage 0 and 1 only (PipelineEngine.__init__)
        "zero_optimization": {"stage": 1 if inputs.zero1 else 0},
    }
    if plan_extra(plan, "optimizer_step", "") == "delayed":
        raise InputError(
            "deepspeed: the plan runs each host optimizer step one iteration late (--delayed-optimizer-step, "
            f"ZeRO-Offload's delayed parameter update); DeepSpeed {RUNTIME_VERSION}'s offload_optimizer has no such "
            "option (DeepSpeedZeroOffloadOptimizerConfig) and steps the CPU optimizer synchronously, so the planned "
            "time would not hold; re-plan without --delayed-optimizer-step"
        )
    offload = bool(plan.stages) and all("offload" in st.memory_option for st in plan.stages)
    if offload and plan.dp > 1 and inputs.sharding == "none":
        raise InputError(
            f"deepspeed: DeepSpeed offloads the optimizer to the CPU from ZeRO stage 1 on, and stage 1 shards the "
            f"optimizer state and the CPU step across the dp={plan.dp} replicas, while the plan keeps the whole "
            f"state on every replica's host (--sharding none); re-plan with --sharding zero1 (or dp 1)"
        )
    if offload:
        # ZeRO-Offload (Ren et al. ATC'21): the optimizer state and step on the CPU; DeepSpeed offloads
        # from ZeRO stage 1 on (the pipeline engine runs stage 0 or 1)
        config["zero_optimization"] = {"stage": 1, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
        # the config's optimizer, so that deepspeed.initialize builds DeepSpeedCPUAdam: another torch optimizer
        # passed in with the offload is refused (engine._configure_optimizer raises ZeRORuntimeException)
        config["optimizer"] = {"type": "AdamW",  # placeholders: the step's cost does not depend on them
                               "params": {"lr": 1.0e-4, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1}}
        notes.append("every stage keeps its optimizer state in host memory, as planned (--optimizer-offload): "
                     "zero_optimization.offload_optimizer = cpu, ZeRO stage 1; the config's optimizer (AdamW) makes "
                     "DeepSpeed build DeepSpeedCPUAdam for the CPU step (pass no optimizer to deepspeed.initialize, "
                     "or a DeepSpeedCPUAdam: another torch optimizer with the offload is refused); its params "
                     "(lr 1e-4, betas 0.9 / 0.95, eps 1e-8, weight_decay 0.1) are placeholders for the run's.")
    if "optimizer" not in config:  # the run's own optimizer: not the plan's business (its cost is the state's bytes)
        notes.append("ds_config.json names no optimizer: pass the run's to deepspeed.initialize(..., "
                     "optimizer=...) or add an \"optimizer\" block (deepspeed.initialize needs one of the two "
                     "to train).")
    if deepspeed_cpu_checkpointing(plan):
        # activation checkpoint offload (ZeRO-Infinity, Rajbhandari et al. SC'21 sec. 5): the checkpoints
        # of PipelineModule's checkpointed layers (activation_checkpoint_interval 1) live in host memory
        config["activation_checkpointing"] = {"cpu_checkpointing": True}
        notes.append("every stage keeps its activation checkpoints in host memory, as planned "
                     "(--activation-offload): activation_checkpointing.cpu_checkpointing = true with "
                     "activation_checkpoint_interval 1; call deepspeed.checkpointing.configure(None, "
                     "deepspeed_config=...) before building the module.")
    if inputs.training_precision == "16-bit":
        # a transformer table (2-byte activations and weights) or a profile of 16-bit parameters:
        # bf16, or fp16 where a device has no bf16
        half = inputs.fp16_note(plan, "fp16.enabled", "DeepSpeed")
        config["fp16" if half else "bf16"] = {"enabled": True}
        notes += [half] if half else []
        if not half and config["zero_optimization"]["stage"] == 0:
            notes.append(_bf16_optimizer_note(plan.dp, m))
    files = {
        "ds_config.json": json.dumps(config, indent=2) + "\n",
        "partition.py": PARTITION_RECIPE + _module_arguments(parts, rc, topology),
    }
    return {
        "runtime": RUNTIME,
        "runtime_version": RUNTIME_VERSION,
        "format_version": FORMAT_VERSION,
        "pipeline_module": {
            "num_stages": p,
            "parts": parts,
            "partition_method": "uniform" if same_uniform else None,
            "activation_checkpoint_interval": 1 if rc == "full" else 0,
            "topology": topology,
        },
        "config": config,
        "parts": parts,
        "num_stages": p,
        "partition_recipe": PARTITION_RECIPE,
        "files": files,
        "notes": notes,
    }


def _bf16_optimizer_note(dp: int, m: int) -> str:
    """What DeepSpeed's pipeline engine does with bf16 and no ZeRO
    (``engine._do_optimizer_sanity_check``: ``BF16_Optimizer``, gradients
    accumulated in bf16, as no fp32 accumulation runs without ZeRO) and how
    that differs from the plan (``dp`` replicas, ``m`` micro-batches)."""
    split = (f" It also splits the fp32 master weights and Adam moments over the dp={dp} replicas and all-gathers "
             f"the updated weights after each step: less memory than planned (2 + 2 + 12/{dp} bytes per parameter "
             f"instead of 16) and an all-gather the plan does not time; --sharding zero1 plans a split state."
             if dp > 1 else "")
    return (f"warning: DeepSpeed runs bf16 pipelines without ZeRO through its BF16_Optimizer, which accumulates "
            f"gradients in bf16 over the {m} micro-batches (DeepSpeed itself warns that this is not numerically "
            f"safe over many steps).{split}")


def _module_arguments(parts: list[int], recompute: str, topology: dict) -> str:
    """The rest of partition.py: the plan's ``PARTS``, its
    ``ACTIVATION_CHECKPOINT_INTERVAL`` (1 when it recomputes every layer)
    and ``topology()``, the ProcessTopology that puts its stages on its
    devices (:func:`_topology`): what ``ExactPartitionPipelineModule(layers,
    topology=topology(), parts=PARTS, activation_checkpoint_interval=
    ACTIVATION_CHECKPOINT_INTERVAL, ...)`` takes."""
    args = ", ".join(f"{k}={v!r}" for k, v in topology.items() if k != "class")
    return (f"\n\nPARTS = {parts!r}  # layer boundaries, len = num_stages + 1\n"
            f"ACTIVATION_CHECKPOINT_INTERVAL = {1 if recompute == 'full' else 0}  # recompute {recompute!r}\n\n\n"
            f"def topology():\n"
            f"    \"\"\"The ranks of the plan's stages and replicas (PipelineModule's topology=).\"\"\"\n"
            f"    from deepspeed.runtime.pipe.topology import {topology['class']}\n\n"
            f"    return {topology['class']}({args})\n")


def _topology(plan: Plan, inputs: Inputs | None = None) -> dict:
    """The ``ProcessTopology`` that puts the plan's stages on its devices:
    ``PipeDataParallelTopology`` (``PipeModelDataParallelTopology`` with
    tp) numbers ranks ``pipe`` outermost, the replicas of a stage on
    consecutive ranks (:func:`pipesearch.export.rank_order` ``"data"``);
    the ``pipeline`` placement (each replica's stages on consecutive ranks)
    is ``ProcessTopology(axes=["data", "pipe"(, "model")])``, whose first
    axis varies slowest (deepspeed/runtime/pipe/topology.py), and the
    engine's groups and stage ids are read by axis name
    (``PipelineParallelGrid``).

    Raises:
        InputError: any other order (:func:`pipesearch.export.refuse_rank_order`).
    """
    order = refuse_rank_order(plan, "deepspeed", ("data", "pipeline"), "numbers its ranks by a ProcessTopology",
                              inputs)
    if order == "pipeline":
        model = [("model", plan.tp)] if plan.tp > 1 else []
        axes = [("data", plan.dp), ("pipe", plan.pp)] + model
        return {"class": "ProcessTopology", "axes": [a for a, _ in axes], "dims": [d for _, d in axes]}
    if plan.tp > 1:
        return {"class": "PipeModelDataParallelTopology", "num_pp": plan.pp, "num_mp": plan.tp, "num_dp": plan.dp}
    return {"class": "PipeDataParallelTopology", "num_pp": plan.pp, "num_dp": plan.dp}


def stages_from_parts(parts: Sequence[int]) -> list[tuple[int, int]]:
    """Stage boundaries from a DeepSpeed ``parts`` list (``PipelineModule.parts``).

    Raises:
        InputError: fewer than 2 entries, not starting at 0, or decreasing.
    """
    parts = [int(x) for x in parts]
    if len(parts) < 2 or parts[0] != 0 or any(b < a for a, b in zip(parts, parts[1:])):
        raise InputError(f"deepspeed parts {parts}: expected 0 = parts[0] <= parts[1] <= ... (len num_stages + 1)")
    return list(zip(parts[:-1], parts[1:]))
