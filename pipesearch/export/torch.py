"""Export a plan for ``torch.distributed.pipelining`` (PyTorch >= 2.4).

What the export holds (all JSON):

* ``split_spec``: ``{module_fqn: "SplitPoint.BEGINNING"}`` for the first module
  of every stage but the first; pass it as
  ``pipeline(module, mb_args, split_spec={fqn: SplitPoint.BEGINNING, ...})``
  and build stage ``s`` with ``pipe.build_stage(s, device, group)``.
* ``schedule_class``, ``n_microbatches``, ``stages_per_rank``,
  ``stage_to_rank`` (a list: stage ``s`` runs on ``stage_to_rank[s]``) and
  ``rank_to_stages``.
* ``pipeline_order_csv``: pipesearch's own order of the schedule
  (:func:`pipesearch.schedules.build_orders` + :func:`~pipesearch.schedules.to_torch_csv`),
  **always** emitted. For the multi-stage classes (``ScheduleInterleaved1F1B``,
  ``ScheduleLoopedBFS``, ``ScheduleInterleavedZeroBubble``, all
  ``_PipelineScheduleRuntime`` subclasses) write it to a file and call
  ``schedule._load_csv(path)`` to run exactly the order pipesearch simulated;
  for ``ScheduleGPipe`` / ``Schedule1F1B`` it is the order those classes run
  themselves, given for reference.
* ``layer_modules``: the FQNs of each pipesearch layer (what the split and the
  parse-back use).

Rules applied (torch/distributed/pipelining/schedules.py, pytorch/pytorch at
commit 00722e648b, read through the code corpus):

* ``Schedule1F1B.__init__``: ``if n_microbatches < self._num_stages: raise
  ValueError("Number of microbatches (..) must be greater than or equal to the
  number of stages (..)")`` -> refused here.
* ``ScheduleInterleaved1F1B`` / ``ScheduleInterleavedZeroBubble``:
  ``number_of_rounds = max(1, n_microbatches // pp_group_size)``; ``if
  n_microbatches % number_of_rounds != 0: raise ValueError(..)`` -> refused.
  (Older releases required ``n_microbatches % pp_group_size == 0``;
  pipesearch's interleaved builder requires that too, Megatron-LM's rule.)
* ``PipelineScheduleSingle`` subclasses (``ScheduleGPipe``, ``Schedule1F1B``)
  take one stage per rank: a plan with ``vp > 1`` is refused for them, and
  interleaved 1F1B with one stage per rank is refused (use ``1f1b``).
* ``PipelineScheduleMulti`` maps stage ``s`` to rank ``s % pp``
  (``generate_stage_to_rank_mapping(pp, num_stages)``, "loop" style), the
  mapping of pipesearch plans. ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV``
  use the "v" mapping and exactly 2 stages per rank; no pipesearch schedule
  maps to them. pipesearch's ``zb-h1`` (one stage per rank, backward split into
  I and W) is torch's ``ScheduleInterleavedZeroBubble`` (the ZB1P schedule of
  Qi et al.) with one stage per rank.
* ``_load_csv`` -> ``_validate_schedule`` checks every stage has ``m`` forwards
  and ``m`` backwards (B, or I+W): pipesearch's orders satisfy it
  (:func:`pipesearch.schedules.validate`).
* ``pipeline(..., split_spec)`` (torch/distributed/pipelining/_IR.py) splits
  *before* the module named by a ``SplitPoint.BEGINNING`` key; a stage with no
  layers cannot be written as a split point, so empty stages are refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import InputError
from ..runtimes import SCHEDULE_CLASSES, SINGLE_STAGE_CLASSES, torch_schedule_problem
from ..schedules import build_orders, from_torch_csv, stage_to_rank, to_torch_csv
from ..types import Plan
from . import (
    FORMAT_VERSION,
    Inputs,
    launch_note,
    layer_modules,
    plan_layers,
    process_grid,
    refuse_empty_stages,
    sequence_parallel,
    stage_recompute_modes,
    tied_across_stages,
    transformer_shape,
    unmapped_layers_note,
)

RUNTIME = "torch.distributed.pipelining"

SPLIT_POINT = "SplitPoint.BEGINNING"

RUNTIME_VERSION = "2.13.0"
"""The torch release whose ``torch.distributed.pipelining`` the tests run the
exports with."""

SNIPPET = '''"""Run the plan with torch.distributed.pipelining (torch {version}); written by pipesearch export.

    torchrun [--nnodes N --node-rank K ...] --nproc-per-node G pipeline_torch.py MODULE:FACTORY \
        [--factory-arg ARG ...] --sample-shape SHAPE [--input-dtype long --vocab-size V] [--steps 10] [--seed 0]

with one process per device of the plan ({world} in all; G of them per node) and SHAPE the shape of
one input sample (e.g. 3,224,224; a sequence length for token ids). MODULE is a module importable
from the current directory or a Python file (models/small.py), as for pipesearch profile;
FACTORY(ARG, ...) returns the model that was planned; it runs after torch.manual_seed(--seed), and each
stage's data-parallel replicas then take replica 0's weights (a broadcast, as DDP does). Each
stage runs its modules in a chain, as a model profiled by pipesearch does (one tensor between
layers); a transformer planned from its configuration is pipesearch's chain of the HuggingFace
model: pipesearch.profiler:hf_model_from_config --factory-arg config.json. Every process builds the
whole model on the CPU and keeps its stages' modules: for a model larger than a host's memory per
process, build it on the meta device and materialise each stage's modules from your checkpoint.
Process r runs on the plan's r-th device in device order (node by node, as torchrun numbers them):
GRID says which pipeline rank and replica the plan puts there. The data-parallel replicas
all-reduce gradients after each step. The loss is the mean of the squared outputs, a stand-in:
replace it with the model's own.
"""

import argparse
import importlib
import importlib.util
import os
import sys
from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining

PP, VP, DP = {pp}, {vp}, {dp}
GRID = {grid!r}  # GRID[pipeline rank][replica]: the process (device, in the plan's device order) it runs on
SCHEDULE_CLASS = "{cls}"
N_MICROBATCHES, MICROBATCH_SIZE = {m}, {mbs}
STAGE_LAYERS = {stage_layers!r}  # stage s (on pipeline rank s % PP): its layers' module FQNs
STAGE_RECOMPUTE = {recompute!r}  # per stage; "full": each layer keeps its input only and re-runs its forward
PIPELINE_ORDER_CSV = """{csv}"""
MULTI_STAGE = {multi}


def load_factory(spec: str):
    """MODULE:FACTORY, MODULE a module importable from the current directory or a Python file."""
    module_text, _, name = spec.rpartition(":")
    if module_text.endswith(".py") or os.sep in module_text:
        path = os.path.abspath(module_text if module_text.endswith(".py") else module_text + ".py")
        if not os.path.isfile(path):
            raise SystemExit(f"{{spec}}: no Python file {{path}}")
        sys.path.insert(0, os.path.dirname(path))
        spec_ = importlib.util.spec_from_file_location("planned_model", path)
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_text)
    return getattr(module, name)


class Checkpointed(nn.Module):
    """One layer under activation checkpointing (torch.utils.checkpoint, non-reentrant): it keeps its
    input and recomputes its activations in the backward (Chen et al. 2016)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)


def stage_module(model: nn.Module, s: int) -> nn.Module:
    """Stage s: its layers' modules in a chain, each layer checkpointed when the stage's STAGE_RECOMPUTE is "full"."""
    try:
        layers = [nn.Sequential(OrderedDict((f.replace(".", "_"), model.get_submodule(f)) for f in fqns))
                  for fqns in STAGE_LAYERS[s]]
    except AttributeError as exc:
        raise SystemExit(f"stage {{s}}: {{exc}}: STAGE_LAYERS names the model's modules as the plan's profile named "
                         "its layers; map them to this model's module names with pipesearch export PLANS "
                         "--format torch --module-names NAMES.json (layer name -> module name)") from None
    if STAGE_RECOMPUTE[s] == "full":
        layers = [Checkpointed(layer) for layer in layers]
    return nn.Sequential(*layers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("factory", help="MODULE:FACTORY returning the model")
    ap.add_argument("--factory-arg", action="append", default=[], help="an argument of FACTORY (repeat for more)")
    ap.add_argument("--sample-shape", "--input-shape", dest="sample_shape", required=True,
                    help="shape of one input sample, e.g. 3,224,224 (--input-shape, as pipesearch profile names it)")
    ap.add_argument("--input-dtype", choices=("float", "long"), default="float",
                    help="float: random normal inputs; long: random token ids below --vocab-size")
    ap.add_argument("--vocab-size", type=int, help="token ids are drawn below this (with --input-dtype long)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the model's initial weights (replicas then take replica 0's) and of the random "
                         "inputs and targets (the same on every rank)")
    args = ap.parse_args()
    if args.input_dtype == "long" and (args.vocab_size is None or args.vocab_size < 1):
        ap.error("--input-dtype long needs --vocab-size of 1 or more")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != PP * DP:
        raise SystemExit(f"the plan needs {{PP * DP}} processes (pp {{PP}} x dp {{DP}}), got {{world}}")
    pp_rank, replica = next((r, k) for r, row in enumerate(GRID) for k, x in enumerate(row) if x == rank)
    pp_groups = [dist.new_group([GRID[r][k] for r in range(PP)]) for k in range(DP)]
    # new_group numbers a group's members in process order, and the schedules send stage s's activations to
    # group rank s % PP: where the plan's pipeline visits its processes in another order (a mapped placement),
    # each pipeline rank's group rank is its process's place in that order
    column = [GRID[r][replica] for r in range(PP)]
    group_rank = {{r: sorted(column).index(column[r]) for r in range(PP)}}
    stage_to_group_rank = {{s: group_rank[s % PP] for s in range(PP * VP)}}
    dp_groups = [dist.new_group([GRID[r][k] for k in range(DP)]) for r in range(PP)]
    device = torch.device(f"cuda:{{rank % torch.cuda.device_count()}}") if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(args.seed)  # the model's initial weights too: the same on every run
    model = load_factory(args.factory)(*args.factory_arg)
    shape = tuple(int(x) for x in args.sample_shape.split(","))
    local = [s for s in range(PP * VP) if s % PP == pp_rank]
    # one write per line: the processes share stdout, and print's separate write of the newline
    # (unbuffered Python) lets another process's line in between
    sys.stdout.write(f"process {{rank}}: pipeline rank {{pp_rank}}, replica {{replica}}, stages {{local}}"
                     + (", every layer checkpointed" if all(STAGE_RECOMPUTE[s] == "full" for s in local) else
                        "".join(f", stage {{s}}'s layers checkpointed" for s in local
                                if STAGE_RECOMPUTE[s] == "full")) + "\\n")
    sys.stdout.flush()
    stages, params = [], []
    for s in local:
        sub = stage_module(model, s)
        sub.to(device)
        if DP > 1:  # every replica starts from replica 0's weights, as DistributedDataParallel does
            for t in [*sub.parameters(), *sub.buffers()]:
                dist.broadcast(t.data, src=GRID[pp_rank][0], group=dp_groups[pp_rank])
        params += list(sub.parameters())
        stages.append(pipelining.PipelineStage(sub, s, PP * VP, device, group=pp_groups[replica]))
        stages[-1].stage_index_to_group_rank = dict(stage_to_group_rank)
    last = (PP * VP - 1) in local
    target = None
    n = N_MICROBATCHES * MICROBATCH_SIZE
    torch.manual_seed(args.seed)
    x = (torch.randint(0, args.vocab_size, (n, *shape), device=device) if args.input_dtype == "long"
         else torch.randn(n, *shape, device=device))
    if last:  # a target per sample, which the stand-in loss does not read
        target = torch.zeros(n, device=device)
    del model
    cls = getattr(pipelining, SCHEDULE_CLASS)

    def loss_fn(output, target):  # on every rank: a schedule built without loss_fn runs forward only
        return output.float().pow(2).mean()

    sched = cls(stages if MULTI_STAGE else stages[0], n_microbatches=N_MICROBATCHES, loss_fn=loss_fn)
    if MULTI_STAGE and hasattr(sched, "_load_csv"):
        import os
        import tempfile

        rows = PIPELINE_ORDER_CSV.splitlines(keepends=True)  # one row per pipeline rank: one per group rank here
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("".join(rows[r] for r in sorted(range(PP), key=group_rank.get)))
        sched._load_csv(f.name)  # exactly the order pipesearch simulated
        os.unlink(f.name)
    opt = torch.optim.SGD(params, lr=1e-2)
    for step in range(args.steps):
        losses = [] if last else None
        if 0 in local:
            sched.step(x, target=target, losses=losses) if last else sched.step(x)
        elif last:
            sched.step(target=target, losses=losses)
        else:
            sched.step()
        if DP > 1:
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=dp_groups[pp_rank])
                    p.grad /= DP
        opt.step()
        opt.zero_grad(set_to_none=True)
        if last and replica == 0:
            print(f"step {{step}}: loss {{torch.stack(losses).mean().item():.6g}}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def torch_stage_modules(plan: Plan, runtime: str, module_names, empty_stage_reason: str):
    """What the torch-based exporters share: the plan's layers per stage
    (refusing an empty stage with ``empty_stage_reason``), the torch schedule
    class (:func:`check_torch_schedule`) and each stage's module FQNs.

    Returns:
        ``(PlanLayers, schedule class name, module FQNs per stage)``.
    """
    layers = plan_layers(plan, runtime)
    refuse_empty_stages(layers, runtime, empty_stage_reason)
    cls = check_torch_schedule(plan, runtime)
    return layers, cls, layer_modules(layers.names, module_names, runtime)


def check_torch_schedule(plan: Plan, runtime: str) -> str:
    """Check the plan against torch.distributed.pipelining's schedule rules
    (:func:`pipesearch.runtimes.torch_schedule_problem`) and return the
    schedule class name.

    Shared by the torchtitan exporter, which builds the same classes.

    Raises:
        InputError: the broken rule, with the numbers and the fix.
    """
    problem = torch_schedule_problem(plan.schedule, plan.pp, plan.vp, plan.num_micro_batches)
    if problem is not None:
        raise InputError(f"{runtime}: {problem}")
    return SCHEDULE_CLASSES[plan.schedule]


def export_torch(plan: Plan, *, module_names: Mapping[str, str | Sequence[str]] | None = None,
                 inputs: Inputs | None = None) -> dict:
    """Export ``plan`` for ``torch.distributed.pipelining``.

    Args:
        plan: the plan.
        module_names: layer name -> module FQN(s) (see :mod:`pipesearch.export`).
        inputs: unused (the plan has all the torch export needs).

    Returns:
        ``{"runtime", "format_version", "split_spec", "num_stages",
        "schedule_class", "n_microbatches", "microbatch_size",
        "batch_size_per_step", "pp_group_size", "stages_per_rank",
        "stage_to_rank", "rank_to_stages", "pipeline_order_csv",
        "layer_modules", "files", "notes"}``; ``files["pipeline_torch.py"]``
        (plans with tp = 1) is a script for ``torchrun`` that builds the
        plan's stages from a model factory and trains with the plan's
        schedule class (and, for multi-stage classes, pipesearch's order).

    Raises:
        InputError: a malformed plan, an empty stage, or a schedule rule of
            torch.distributed.pipelining (see the module doc) the plan breaks.
    """
    layers, cls, mods = torch_stage_modules(
        plan, "torch", module_names,
        "torch.distributed.pipelining's pipeline(split_spec=...) splits before a module, so a stage "
        "without modules cannot be expressed (re-plan without empty stages)",
    )
    p, v, m = plan.pp, plan.vp, plan.num_micro_batches
    num_stages = p * v
    try:
        order_csv = to_torch_csv(build_orders(plan.schedule, p, m, v))
    except InputError as exc:
        raise InputError(f"torch: cannot build the pipeline order: {exc}") from exc
    split_spec = {mods[a][0]: SPLIT_POINT for a, _ in layers.ranges[1:]}
    notes = [
        "split_spec values are the enum torch.distributed.pipelining.SplitPoint.BEGINNING written as text; "
        "map them back with getattr(SplitPoint, value.split('.')[1]).",
        f"pipeline_order_csv is pipesearch's order for {plan.schedule!r}; "
        + ("load it with schedule._load_csv(path) to run exactly this order."
           if cls not in SINGLE_STAGE_CLASSES else
           f"{cls} runs this order itself (given for reference)."),
    ]
    where = launch_note(plan, inputs)
    if where:  # the script's GRID numbers processes node by node in this order: said on stderr too
        notes.append("warning: " + where)
    if plan.tp > 1:
        notes.append(
            f"the export covers the pipeline dimension only; build the dp={plan.dp} x tp={plan.tp} "
            f"DeviceMesh and apply data/tensor parallelism to each stage module yourself."
        )
    elif plan.dp > 1:
        notes.append(
            f"pipeline_torch.py runs the dp={plan.dp} replicas and all-reduces each stage's gradients over its "
            f"replicas; the split_spec covers the pipeline dimension, so a training loop of your own applies data "
            f"parallelism to each stage module itself."
        )
    rc = stage_recompute_modes(plan, "torch")  # the script checkpoints each stage's layers on its own
    full = [str(k) for k, x in enumerate(rc) if x == "full"]
    script = plan.tp == 1  # pipeline_torch.py is written (below): it has no tensor parallelism
    if full:
        which = "every stage" if len(full) == len(rc) else f"stage{'s' if len(full) > 1 else ''} {', '.join(full)}"
        them = "them" if len(full) > 1 else "it"
        notes.append(
            f"recompute='full' on {which}: torch.distributed.pipelining has no recompute option; "
            + (f"pipeline_torch.py checkpoints every layer of {them} (torch.utils.checkpoint), so each keeps its "
               "input only." if script else
               f"checkpoint every layer of {them} (torch.utils.checkpoint) for the planned memory, each keeping "
               "its input only."))
    selective = [str(k) for k, x in enumerate(rc) if x == "selective"]
    if selective:
        notes.append(
            f"warning: recompute='selective' (the attention core recomputed) on stage{'s' if len(selective) > 1 else ''} "
            f"{', '.join(selective)}: torch.distributed.pipelining has no "
            f"recompute option{' and pipeline_torch.py keeps every activation' if script else ''}; use an attention "
            "kernel that recomputes (e.g. FlashAttention) or the plan's memory is not what it holds."
        )
    transformer = transformer_shape(layers.names) is not None
    if transformer and not module_names and plan.tp == 1:
        notes.append("pipeline_torch.py chains one-tensor layers: run this transformer plan with pipesearch's chain "
                     "of the HuggingFace model, pipeline_torch.py pipesearch.profiler:hf_model_from_config "
                     "--factory-arg config.json --sample-shape SEQ_LEN --input-dtype long --vocab-size V "
                     "(split_spec and layer_modules name its children: embed_tokens, layers_NN, lm_head).")
    unmapped = unmapped_layers_note(layers.names, module_names, inputs,
                                    "split_spec, layer_modules and pipeline_torch.py's STAGE_LAYERS",
                                    "the model FACTORY returns")
    if unmapped:
        notes.append(unmapped)
    if sequence_parallel(plan):
        notes.append("sequence_parallel=True: apply it with the tensor-parallel plan (torch.distributed.tensor.parallel).")
    if cls == "ScheduleInterleavedZeroBubble":
        notes.append(
            "ScheduleInterleavedZeroBubble splits backward into input and weight gradients and refuses "
            "torch.compile'd stage modules (_check_torch_compile_compatibility)."
        )
    files = {}
    if script:
        files["pipeline_torch.py"] = SNIPPET.format(
            version=RUNTIME_VERSION, world=p * plan.dp, pp=p, vp=v, dp=plan.dp, grid=process_grid(plan, inputs),
            cls=cls, m=m,
            mbs=plan.micro_batch_size, stage_layers=[[list(mods[i]) for i in range(a, b)] for a, b in layers.ranges],
            recompute=rc,
            csv=order_csv, multi=cls not in SINGLE_STAGE_CLASSES)
        if inputs.comm_overlap.get("grad_reduce"):
            notes.append("warning: the plan times the gradient reduce overlapped with the backward (as DDP's "
                         "buckets run it), while pipeline_torch.py all-reduces each gradient after the pipeline's "
                         "step: wrap each stage's module in DistributedDataParallel for the planned time, or "
                         "re-plan with --no-overlap-grad-reduce for the script's")
    else:
        notes.append("no pipeline_torch.py: the snippet has no tensor parallelism (tp > 1).")
    if tied_across_stages(plan):
        notes.append("warning: the model ties its input embedding and LM head, which sit on different stages (the "
                     "plan counts the head's copy of the matrix): torch.distributed.pipelining updates each stage's "
                     "copy on its own, so all-reduce the tied weight's gradient between the first and the last "
                     "stage before each optimizer step, or the copies drift apart")
    return {
        "runtime": RUNTIME,
        "runtime_version": RUNTIME_VERSION,
        "format_version": FORMAT_VERSION,
        "split_spec": split_spec,
        "num_stages": num_stages,
        "schedule_class": cls,
        "n_microbatches": m,
        "microbatch_size": plan.micro_batch_size,
        "batch_size_per_step": plan.micro_batch_size * m,
        "pp_group_size": p,
        "stages_per_rank": v,
        "stage_to_rank": [s % p for s in range(num_stages)],
        "rank_to_stages": [[r + c * p for c in range(v)] for r in range(p)],
        "pipeline_order_csv": order_csv,
        "layer_modules": mods,
        "files": files,
        "notes": notes,
    }


# ---------------------------------------------------------------- parse back


def stages_from_split_spec(split_spec: Mapping[str, str], layer_modules: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """Stage boundaries from a ``split_spec`` and the layers' module FQNs.

    Args:
        split_spec: ``{fqn: "SplitPoint.BEGINNING"}`` (``"BEGINNING"`` and the
            enum's value ``1`` are accepted too).
        layer_modules: per layer in execution order, its module FQNs (the
            export's ``layer_modules``); a split point must be the first FQN of
            a layer.

    Returns:
        Half-open layer index ranges, one per stage.

    Raises:
        InputError: an FQN that starts no layer, an ``END`` split point, or a
            split before the first layer.
    """
    first = {fqns[0]: i for i, fqns in enumerate(layer_modules) if fqns}
    cuts = set()
    for fqn, kind in split_spec.items():
        if kind not in (SPLIT_POINT, "BEGINNING", 1):
            raise InputError(f"torch split_spec[{fqn!r}] = {kind!r}; only SplitPoint.BEGINNING is supported here")
        if fqn not in first:
            raise InputError(f"torch split_spec: {fqn!r} is not the first module of any layer")
        if first[fqn] == 0:
            raise InputError(f"torch split_spec: {fqn!r} splits before the first layer (empty first stage)")
        cuts.add(first[fqn])
    bounds = [0, *sorted(cuts), len(layer_modules)]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def schedule_from_csv(text: str):
    """The schedule in an exported ``pipeline_order_csv`` and its stage -> rank map.

    Returns:
        ``(actions, stage_to_rank)``: the per-rank tuples of
        :class:`~pipesearch.schedules.Action` and ``{stage: rank}``.

    Raises:
        InputError: a malformed CSV (see :func:`pipesearch.schedules.from_torch_csv`)
            or a stage on two ranks.
    """
    actions = from_torch_csv(text)
    return actions, stage_to_rank(actions)
