"""Export a :class:`~pipesearch.types.Plan` in the terms of the runtime that will run it.

One exporter per runtime, each in its own module:

========================  ======================================================
format                    runtime (module)
========================  ======================================================
``"torch"``               ``torch.distributed.pipelining`` (:mod:`.torch`)
``"torchtitan"``          torchtitan 0.3.0 launch command and overrides (:mod:`.torchtitan`)
                          (``torchtitan_version="0.2"``: 0.2.x's job TOML, :mod:`.torchtitan_toml`)
``"megatron"``            Megatron-LM launch command (:mod:`.megatron`)
``"deepspeed"``           DeepSpeed ``PipelineModule`` + config (:mod:`.deepspeed`)
``"gpipe"``               torchgpipe ``GPipe`` / fairscale ``Pipe`` (:mod:`.gpipe`)
``"stages-json"``         no runtime: each stage's layers, devices, recompute, optimizer
                          and weight placement, prefetch (:mod:`.stages_json`)
========================  ======================================================

Every export is a JSON-serializable ``dict`` with ``"runtime"``,
``"runtime_version"`` (the release whose code the export was checked
against), ``"format_version": 1``, ``"notes"`` (a list of strings, possibly
empty), ``"files"`` (``{file name: text}``: what the runtime reads, ready to
write to disk) plus the runtime's own argument names.

``inputs`` (optional, the plan file's ``"inputs"`` object: ``model``,
``cluster``, ``job``) gives the exporters what the plan alone does not say:
the model's shape for Megatron-LM's model flags, the sequence length, the
node size for launch commands, ZeRO-1. Without it the exports that need it
say so in a note and leave those flags out. An exporter *refuses* (raises
:class:`~pipesearch.errors.InputError` with the rule and where it comes from)
rather than emit something the runtime would reject or, worse, silently run
differently from the plan (a different schedule, a different split, dropped
stages). Each module also has parse-back helpers that recover the stage
boundaries (half-open layer index ranges) from the exported form; the tests
round-trip every exporter through them.

Sources for each runtime's rules are cited in the module that applies them and
collected in ``docs/exports.md``.

Layer -> module names (``module_names``): pipesearch layers have names from
the profile. Exporters that name modules (torch, torchtitan) map each layer to
one or more module FQNs: by default the identity for profiled models (a torch
``nn.Sequential`` profiled by pipesearch has its child names, ``"0"``,
``"1"``, ...), and for transformer layer tables (``embedding``,
``block_00`` .. ``block_{L-1}``, ``head``) torchtitan's Llama names:
``embedding -> tok_embeddings``, ``block_N -> layers.N``,
``head -> norm, lm_head`` (torchtitan 0.3.0's ``Decoder`` attribute names,
``torchtitan/models/common/decoder.py``), except for torch, whose script
chains one-tensor layers (torchtitan's and HuggingFace's decoder layers take
positions and masks as well): there the children of pipesearch's chain of
the HuggingFace model (:func:`pipesearch.profiler.hf_model_from_config`),
``embedding -> embed_tokens``, ``block_N -> layers_NN``, ``head ->
lm_head``. A ``module_names`` mapping overrides any layer it
names (value: one FQN or a list of FQNs, in execution order).
"""

from __future__ import annotations

import bisect
import importlib
from collections import Counter
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from ..errors import InputError
from ..schedules import SCHEDULES
from ..stage_options import ACT_HOST, offloads_activations
from ..types import MIN_BF16_CAPABILITY, Plan, has_bf16

FORMATS = ("torch", "torchtitan", "megatron", "deepspeed", "gpipe")
"""Export formats, in the order :func:`export_all` reports them."""

FORMAT_VERSION = 1
"""Value of every export's ``"format_version"``."""

_MODULES = {
    "torch": ("torch", "export_torch"),
    "torchtitan": ("torchtitan", "export_torchtitan"),
    "megatron": ("megatron", "export_megatron"),
    "deepspeed": ("deepspeed", "export_deepspeed"),
    "gpipe": ("gpipe", "export_gpipe"),
    "stages-json": ("stages_json", "export_stages_json"),
}

DESCRIPTION_FORMATS = ("stages-json",)
"""Formats no runtime reads as is (``pipesearch export --format``; not in
:data:`FORMATS`, which :func:`export_all` writes into plan files): the
per-stage description of :mod:`.stages_json`."""

RECOMPUTE_MODES = ("none", "selective", "full")

_BLOCK = re.compile(r"block_(\d+)")


# ---------------------------------------------------------------- public API

#: each runtime's name, for the refusal of per-stage replication
RUNTIME_NAMES = {"torch": "torch.distributed.pipelining", "torchtitan": "torchtitan", "megatron": "Megatron-LM",
                 "deepspeed": "DeepSpeed", "gpipe": "torchgpipe / fairscale Pipe"}


def uniform_replicas_as_data_parallel(plan: Plan) -> Plan:
    """A plan replicating every stage ``r`` times with ``r`` dividing the
    micro-batch (each replica computing ``b / r`` samples of each
    micro-batch) as the data-parallel plan it is: ``dp = r`` pipelines of
    micro-batches of ``b / r`` (the search's own equivalence,
    :func:`pipesearch.replication.is_uniform_point`), stage ``k``'s
    devices unchanged (replica ``j`` of the pipeline runs on each stage's
    ``j``-th device). Any other plan as it is."""
    from dataclasses import replace

    from ..replication import is_uniform_point

    reps = plan.stage_replicas
    if reps is None or plan.dp != 1 or not is_uniform_point(reps, plan.micro_batch_size):
        return plan
    r = reps[0]
    return replace(plan, dp=r, micro_batch_size=plan.micro_batch_size // r,
                   stages=tuple(replace(st, replicas=None) for st in plan.stages))


def refuse_stage_replicas(plan: Plan, fmt: str) -> None:
    """Refuse a plan with per-stage replication (stages replicated unequally,
    PipeDream / DAPPLE style): every runtime exported here runs one
    data-parallel degree for all stages (torch.distributed.pipelining and
    torchtitan replicate the whole pipeline with DDP / FSDP over a data-
    parallel mesh dimension, Megatron-LM and DeepSpeed build one
    data-parallel group size from world size / (pp x tp), torchgpipe and
    fairscale Pipe run one pipeline in one process).

    Raises:
        InputError: the plan has per-stage replicas.
    """
    replicas = plan.stage_replicas
    if replicas is not None:
        raise InputError(
            f"export {fmt}: {RUNTIME_NAMES.get(fmt, fmt)} runs one data-parallel degree for all stages, and this "
            f"plan replicates its stages {','.join(map(str, replicas))} times (per-stage replication"
            f"{'' if plan.tp == 1 else f', each replica a group of tp {plan.tp}'}); no "
            "runtime exported here can run it as planned")



def launch_nodes(plan: Plan, inputs: Mapping | None = None, scan: str = "data") -> list[int]:
    """The cluster nodes the plan uses (indices into :attr:`Inputs.nodes`),
    in the order they are launched (``NODE_RANK`` 0, 1, ...): the order in
    which the plan's (pipeline rank, replica) pairs first reach them, pipeline
    rank by pipeline rank (``scan="data"``) or replica by replica
    (``"pipeline"``), so a plan whose first stages run on the cluster's
    second node starts that node first. ``[]`` without the cluster's nodes."""
    nodes = Inputs.of(inputs).nodes
    if not nodes:
        return []
    pairs = ([(r, k) for r in range(plan.pp) for k in range(plan.dp)] if scan == "data" else
             [(r, k) for k in range(plan.dp) for r in range(plan.pp)])
    starts = _node_starts(nodes)
    out: dict[int, None] = {}  # in first-reached order
    for r, k in pairs:
        if k < len(plan.stages[r].devices):
            out.setdefault(_node_of(starts, plan.stages[r].devices[k]))
    return list(out)


def node_processes(plan: Plan, inputs: Mapping | None = None, scan: str = "data") -> list[int]:
    """Per node the plan uses, in launch order (:func:`launch_nodes`), the
    processes it runs there: its stages' GPUs on that node (each stage
    device heads a tensor-parallel group of ``tp``), counted once each.
    ``[]`` without the cluster's nodes."""
    nodes = Inputs.of(inputs).nodes
    order = launch_nodes(plan, inputs, scan)
    if not order:
        return []
    starts = _node_starts(nodes)
    per_node = Counter(_node_of(starts, d) for d in {d + t for st in plan.stages for d in st.devices
                                                       for t in range(plan.tp)})
    return [per_node[n] for n in order]


def _node_starts(nodes: list[tuple[int, int, str]]) -> list[int]:
    """The first device id of each node of :attr:`Inputs.nodes` (for :func:`_node_of`)."""
    return [lo for lo, _, _ in nodes]


def _node_of(starts: list[int], device: int) -> int:
    """Index of the node holding ``device`` (``starts``: :func:`_node_starts`)."""
    return bisect.bisect_right(starts, device) - 1


def process_grid(plan: Plan, inputs: Mapping | None = None, scan: str = "data") -> list[list[int]]:
    """``grid[r][k]``: the process (torchrun rank, or tensor-parallel group
    of ``tp`` ranks) that runs pipeline rank ``r`` of replica ``k``: the
    position of the plan's device for it (stage ``r``'s ``k``-th device)
    among all the plan's devices numbered node by node, as torchrun numbers
    ranks: the nodes in launch order (:func:`launch_nodes`; in id order
    without the cluster's nodes), each node's devices in id order."""
    used = sorted({d for st in plan.stages for d in st.devices})
    nodes = Inputs.of(inputs).nodes
    order = launch_nodes(plan, inputs, scan)
    if nodes and order:
        rank, starts = {n: i for i, n in enumerate(order)}, _node_starts(nodes)
        used.sort(key=lambda d: (rank.get(_node_of(starts, d), len(order)), d))
    pos = {d: n for n, d in enumerate(used)}
    return [[pos[d] for d in plan.stages[r].devices] for r in range(plan.pp)]


def rank_order(plan: Plan, inputs: Mapping | None = None) -> str | None:
    """How the plan lays its (pipeline rank, replica) pairs over the
    processes (:func:`process_grid`, its nodes launched in the order it
    reaches them): ``"data"`` when the replicas of each
    pipeline rank sit on consecutive processes (process ``r dp + k``: the
    order of Megatron-LM's default ``tp-cp-ep-dp-pp``, DeepSpeed's
    ``PipeDataParallelTopology`` and torchtitan's device mesh, which put
    pp outermost; the two orders coincide when ``pp`` or ``dp`` is 1), ``"pipeline"``
    when each replica's pipeline ranks do (process ``k pp + r``; the
    ``pipeline`` placement), None for any other order (a mapped or custom
    placement)."""
    grid = process_grid(plan, inputs, "data")
    if all(x == r * plan.dp + k for r, row in enumerate(grid) for k, x in enumerate(row)):
        return "data"
    grid = process_grid(plan, inputs, "pipeline")
    if all(x == k * plan.pp + r for r, row in enumerate(grid) for k, x in enumerate(row)):
        return "pipeline"
    return None


def launch_note(plan: Plan, inputs: Mapping | None, scan: str = "data") -> str | None:
    """Which of the cluster's nodes run the job, in launch order, when that
    is not simply the cluster's first nodes in id order: ``NODE_RANK`` ``i``
    on node ``n`` (its devices and type), or, for a job of one node, that
    node (:func:`reordered_nodes`); None otherwise."""
    nodes = Inputs.of(inputs).nodes
    order = reordered_nodes(plan, inputs, scan)
    if not order:
        return None
    where = [f"node {n} of the cluster (devices {nodes[n][0]}-{nodes[n][1]}, {nodes[n][2]})" for n in order]
    if len(order) == 1:
        return f"run it on {where[0]}, where the plan puts its stages."
    return ("launch the nodes in the plan's order: " + "; ".join(f"NODE_RANK {i} on {w}" for i, w in enumerate(where))
            + ".")


def hostfile_note(plan: Plan, inputs: Mapping | None, scan: str = "data") -> str | None:
    """For launchers that read a hostfile (DeepSpeed's): its lines in the
    plan's launch order (:func:`launch_nodes`) with each node's
    ``slots=`` (:func:`node_processes`), unless the plan runs on every
    node of the cluster, each full, in its order, or on node 0 alone (a
    launch without a hostfile); None then."""
    nodes = Inputs.of(inputs).nodes
    order, counts = launch_nodes(plan, inputs, scan), node_processes(plan, inputs, scan)
    every = order == list(range(len(nodes))) and all(c == nodes[n][1] - nodes[n][0] + 1 for n, c in zip(order, counts))
    if not order or every or order == [0]:  # every node full in the cluster's order, or node 0 alone (no hostfile)
        return None
    lines = "; ".join(f"node {n} of the cluster (devices {nodes[n][0]}-{nodes[n][1]}, {nodes[n][2]}) slots={c}"
                      for n, c in zip(order, counts))
    return (f"warning: the plan runs {sum(counts)} processes on {len(order)} node(s), not on every device in the "
            f"cluster's order: list them in the hostfile in this order, with these slots: {lines}.")


def node_rank_preamble(plan: Plan, inputs: Mapping | None, scan: str = "data") -> str:
    """Shell lines for a launch script (after ``set -euo pipefail``) that
    set ``NODE_RANK`` (and ``NPROC_PER_NODE`` where nodes run different
    counts, :func:`uneven_nodes`) from ``CLUSTER_NODE``, the machine's node
    index in the cluster file, when the plan launches its nodes in another
    order than the cluster's (:func:`launch_nodes`: a mixed cluster whose
    faster node runs the first stages); an unknown ``CLUSTER_NODE`` exits
    2. In the cluster's order with nodes of different counts (a last node
    partly used): ``NPROC_PER_NODE`` from ``NODE_RANK``. One node other
    than the first: a comment naming it. Else ``""``."""
    nodes = Inputs.of(inputs).nodes
    order = reordered_nodes(plan, inputs, scan)
    counts = node_processes(plan, inputs, scan)
    nproc = uneven_nodes(counts, sum(counts))
    if not order and nproc:  # the cluster's order, nodes of different counts: each NODE_RANK's own count
        arms = "".join(f"    {i}) NPROC_PER_NODE={c} ;;\n" for i, c in enumerate(counts))
        return ("# the plan's nodes run different numbers of processes: NPROC_PER_NODE follows NODE_RANK\n"
                f'case "${{NODE_RANK:?set NODE_RANK to the index of this machine among the nodes of the job, 0 .. '
                f'{len(counts) - 1}}}" in\n' + arms  # (no quote inside: the shell word ends at it)
                + f'    *) echo "NODE_RANK=$NODE_RANK: this plan runs on {len(counts)} nodes" >&2; exit 2 ;;\n'
                "esac\n")
    if not order:
        return ""
    where = [f"devices {nodes[n][0]}-{nodes[n][1]}, {nodes[n][2]}" for n in order]
    if len(order) == 1:
        return f"# run this on node {order[0]} of the cluster ({where[0]}): the plan puts its stages there\n"
    arms = "".join(f"    {n}) NODE_RANK={i}{f' NPROC_PER_NODE={counts[i]}' if nproc else ''} ;;  # {w}\n"
                   for i, (n, w) in enumerate(zip(order, where)))
    listed = ", ".join(map(str, order))
    return ("# the plan launches the cluster's nodes in its own order (its first stages on the nodes it starts first):\n"
            "# set CLUSTER_NODE to this machine's node index in the cluster file, NODE_RANK follows\n"
            'case "${CLUSTER_NODE:?set CLUSTER_NODE to the index of this machine among the nodes of the cluster file}" in\n'
            + arms +
            f'    *) echo "CLUSTER_NODE=$CLUSTER_NODE: this plan runs on nodes {listed} of the cluster" >&2; exit 2 ;;\n'
            "esac\n")


def reordered_nodes(plan: Plan, inputs: Mapping | None, scan: str = "data") -> list[int]:
    """The plan's launch order of the cluster's nodes (:func:`launch_nodes`)
    where it matters: not the cluster's own first nodes in id order, on a
    cluster of more than one group (the nodes of one group are
    interchangeable, the same type, size and links: a 128-node plan's note
    listed every NODE_RANK); ``[]`` otherwise."""
    order = launch_nodes(plan, inputs, scan)
    if not order or order == list(range(len(order))) or len(Inputs.of(inputs).cluster.get("groups") or []) == 1:
        return []
    return order


def uneven_nodes(counts: Sequence[int], world_size: int) -> bool:
    """Whether the plan's nodes (:func:`node_processes`, launch order) run
    different numbers of processes, so that each node's torchrun gets its
    own ``--nproc-per-node`` (a last node with fewer too: one
    ``--nproc-per-node`` of the others' there starts processes the
    rendezvous does not expect)."""
    return bool(counts) and sum(counts) == world_size and len(set(counts)) > 1


def refuse_rank_order(plan: Plan, fmt: str, runs: tuple[str, ...], how: str, inputs: Mapping | None = None) -> str:
    """The plan's :func:`rank_order` when the runtime runs it (``runs``),
    else an InputError naming the order and the fix; ``how``: how the
    runtime numbers its ranks (for the message)."""
    order = rank_order(plan, inputs)
    if order in runs:
        return order
    if one_node_of_one_type(plan, inputs):  # every order of the node's devices has the same devices and links
        return runs[0]
    placed = {"pipeline": "each replica's pipeline ranks on consecutive devices (placement 'pipeline')",
              None: f"its pipeline ranks{' and replicas' if plan.dp > 1 else ''} on devices in an order of its "
                    f"own (a mapped or custom placement: {_first_moved(plan, inputs)})"}[order]
    name = RUNTIME_NAMES.get(fmt, fmt)
    fix = (f"re-plan with --runtime {fmt} or --placement {runs[0]}" if order == "pipeline" else
           "export it with --format torch, whose script puts every stage on its planned device (GRID)"
           if plan.tp == 1 else
           "export it with --format stages-json, which lists every stage's devices, and start the ranks in that "
           "order (the torch export's script, which places them, runs tp = 1 only)")
    raise InputError(f"export {fmt}: the plan puts {placed}, and {name} {how}, so its stages would run on other "
                     f"devices and links than planned; {fix}")


def one_node_of_one_type(plan: Plan, inputs: Mapping | None) -> bool:
    """Whether every device of the plan lies in one node of the cluster
    (:attr:`Inputs.nodes`; False without them) whose GPUs share one host
    link (no ``pcie_switches`` of several switches): its devices are then
    of one type with one intra-node link between any two and one path to
    host memory, so a runtime's own order of them runs the plan's times."""
    ins = Inputs.of(inputs)
    nodes, host = ins.nodes, ins.cluster.get("host")
    if not nodes or (isinstance(host, Mapping) and len(host.get("pcie_switches") or ()) > 1):
        return False
    starts = _node_starts(nodes)
    return len({_node_of(starts, d) for st in plan.stages for d in st.devices}) == 1


def _first_moved(plan: Plan, inputs: Mapping | None) -> str:
    """``pipeline rank r [of replica k] on device d``: the first pair that a
    runtime numbering its ranks in ``data`` order (:func:`rank_order`) would
    run on another device."""
    grid = process_grid(plan, inputs, "data")
    r, k = next(((r, k) for r, row in enumerate(grid) for k, x in enumerate(row) if x != r * plan.dp + k), (0, 0))
    return f"pipeline rank {r}{f' of replica {k}' if plan.dp > 1 else ''} on device {plan.stages[r].devices[k]}"


def host_memory_stages(plan: Plan) -> tuple[list[int], list[int]]:
    """``(offloaded, streamed)``: the stages whose memory option keeps the
    optimizer state (``+offload``) or the weights (``stream``) in host
    memory (:attr:`pipesearch.types.StagePlan.memory_option`)."""
    offloaded = [st.index for st in plan.stages if "offload" in st.memory_option]
    streamed = [st.index for st in plan.stages if "stream" in st.memory_option]
    return offloaded, streamed


def refuse_host_memory(plan: Plan, fmt: str) -> None:
    """Refuse a plan that keeps state in host memory where the runtime's
    export cannot say so: every runtime but DeepSpeed (whose ZeRO-Offload the
    DeepSpeed export writes when *every* stage offloads its optimizer
    state), and streamed weights everywhere (no runtime exported here
    streams a pipeline stage's weights from host memory).

    Raises:
        InputError: names the stages and what they keep on the host.
    """
    offloaded, streamed = host_memory_stages(plan)
    runtime = RUNTIME_NAMES.get(fmt, fmt)
    if plan.schedule == "roundpipe":
        raise InputError(f"export {fmt}: schedule roundpipe dispatches each layer group's forward and backward to "
                         f"the next GPU of a pool (weights and optimizer in host memory); {runtime} binds every "
                         "stage to its GPUs; export --format stages-json for a description, or re-plan without "
                         "--schedule roundpipe")
    swapped = [st.index for st in plan.stages if st.memory_option == "swap"]
    if swapped or plan.schedule == "mobius":
        first = swapped[0] if swapped else 0
        raise InputError(f"export {fmt}: stage {first} has option swap (schedule mobius: its weights, gradients "
                         f"and optimizer state are copied between host memory and its GPU); {runtime} keeps every "
                         "stage on its GPU; export --format stages-json for a per-stage description, or re-plan "
                         "without --schedule mobius")
    if streamed:
        raise InputError(f"export {fmt}: stages {','.join(map(str, streamed))} stream their weights from host "
                         f"memory (--stream-weights); {runtime} keeps a stage's weights on its GPU, so the plan would "
                         "not fit as written; re-plan without --stream-weights")
    refuse_activation_offload(plan, fmt)
    if offloaded and (fmt != "deepspeed" or len(offloaded) != len(plan.stages)):
        why = ("DeepSpeed's offload_optimizer applies to every stage alike" if fmt == "deepspeed"
               else f"{runtime}'s export has no optimizer offload")
        raise InputError(f"export {fmt}: stages {','.join(map(str, offloaded))} of {len(plan.stages)} keep their "
                         f"optimizer state in host memory (--optimizer-offload) and {why}; re-plan without "
                         "--optimizer-offload" + ("" if fmt == "deepspeed" else " or export --format deepspeed"))


def activation_offload_stages(plan: Plan) -> list[int]:
    """The stages whose memory option keeps their saved activations in host
    memory (``act-host``, :func:`pipesearch.stage_options.activation_host_options`)."""
    return [st.index for st in plan.stages if offloads_activations(st.memory_option)]


def deepspeed_cpu_checkpointing(plan: Plan) -> bool:
    """Whether DeepSpeed's ``activation_checkpointing.cpu_checkpointing``
    runs the plan's activation offload: every stage offloads, and what it
    offloads are full recompute's checkpoints (DeepSpeed moves the inputs of
    its checkpointed layers to the CPU, one setting for all stages;
    deepspeed/runtime/activation_checkpointing/checkpointing.py)."""
    act = activation_offload_stages(plan)
    if not plan.stages or len(act) != len(plan.stages):
        return False
    plan_rc = plan_extra(plan, "recompute", "none")
    return all(st.memory_option.split("+")[0] == "full" or (st.memory_option.startswith(ACT_HOST)
                                                             and plan_rc == "full") for st in plan.stages)


def refuse_activation_offload(plan: Plan, fmt: str) -> None:
    """Refuse a plan whose stages keep their activations in host memory
    where the runtime's export cannot say so: every runtime but DeepSpeed,
    and DeepSpeed unless :func:`deepspeed_cpu_checkpointing`.

    Raises:
        InputError: names the first such stage and its option.
    """
    act = activation_offload_stages(plan)
    if not act or (fmt == "deepspeed" and deepspeed_cpu_checkpointing(plan)):
        return
    k = act[0]
    why = ("DeepSpeed's cpu_checkpointing offloads full recompute's checkpoints of every stage alike"
           if fmt == "deepspeed" else f"{RUNTIME_NAMES.get(fmt, fmt)}'s export has no activation offload")
    raise InputError(f"export {fmt}: stage {k} has option {plan.stages[k].memory_option} (its saved activations in "
                     f"host memory, --activation-offload; stages {','.join(map(str, act))} of {len(plan.stages)}) "
                     f"and {why}; re-plan without --activation-offload or export --format stages-json")


def refuse_unplanned_overlap(fmt: str, inputs: "Inputs") -> None:
    """Refuse a plan timed with a communication overlap that ``fmt``'s
    runtime does not run (:data:`pipesearch.runtimes.OVERLAP_SUPPORT`, read
    from ``inputs.job.comm_overlap``): the runtime would be slower than the
    plan says (its exposed communication was charged as hidden).

    Raises:
        InputError: names the overlap, the runtime and the re-plan option.
    """
    from ..runtimes import OVERLAP_FLAGS, OVERLAP_SUPPORT

    overlap = inputs.comm_overlap
    for key, runs in OVERLAP_SUPPORT.items():
        if fmt in _MODULES and overlap.get(key) and fmt not in runs:
            raise InputError(f"export {fmt}: the plan was timed with {OVERLAP_FLAGS[key]}, which "
                             f"{RUNTIME_NAMES.get(fmt, fmt)} does not run, so it would be slower than planned; "
                             f"re-plan with --runtime {fmt} (or without {OVERLAP_FLAGS[key]})")


def export_plan(plan: Plan, fmt: str, *, module_names: Mapping[str, str | Sequence[str]] | None = None,
                inputs: Mapping | None = None, **options) -> dict:
    """Export ``plan`` for runtime ``fmt``.

    Args:
        plan: the plan (``stages`` in order, ``pp * vp`` of them).
        fmt: one of :data:`FORMATS`.
        module_names: optional mapping from pipesearch layer names to the
            runtime's module FQNs (a string or a list of strings per layer);
            layers not in it keep the default mapping (see the module doc).
            Exporters whose runtime does not name modules (megatron, deepspeed,
            gpipe) accept it and say in a note that it is unused.
        inputs: the plan file's ``inputs`` object (``model``, ``cluster``,
            ``job``), or ``None``; see the module doc.
        **options: exporter-specific keyword options (documented on each
            ``export_<fmt>`` function, e.g. ``allow_layout`` for megatron).

    Returns:
        A JSON-serializable dict with ``"runtime"``, ``"format_version"``,
        ``"notes"`` and the runtime's own keys.

    Raises:
        InputError: unknown ``fmt`` (the message lists :data:`FORMATS`), an
            unknown option, a malformed plan, or the runtime's refusal with
            its reason.
    """
    if fmt not in _MODULES:
        raise InputError(f"export: unknown format {fmt!r}; expected one of {', '.join(FORMATS + DESCRIPTION_FORMATS)}")
    inputs = Inputs.of(inputs)  # one for every check and the exporter (its nodes are built once)
    if fmt not in DESCRIPTION_FORMATS:  # a description says what the stages keep where
        plan = uniform_replicas_as_data_parallel(plan)
        refuse_stage_replicas(plan, fmt)
        refuse_host_memory(plan, fmt)
        refuse_unplanned_overlap(fmt, inputs)
        refuse_chain_limits(plan, fmt, inputs)
    mod_name, fn_name = _MODULES[fmt]
    fn = getattr(importlib.import_module(f"{__name__}.{mod_name}"), fn_name)
    try:
        return fn(plan, module_names=module_names, inputs=inputs, **options)
    except TypeError as exc:
        if "unexpected keyword argument" in str(exc):
            raise InputError(f"export {fmt}: {exc}") from exc
        raise


#: formats whose runtimes run a chain of stages passing one tensor (an encoder-decoder needs two)
_CHAIN_FORMATS = ("torch", "torchtitan", "deepspeed", "gpipe")
#: formats whose exported training loop steps every replica's whole optimizer (no sharded state)
_UNSHARDED_FORMATS = ("torch", "gpipe")


def tied_across_stages(plan: Plan) -> bool:
    """Whether a plan of more than one stage keeps a copy of a matrix its
    first layer shares with its last (a tied input embedding and LM head:
    ``tied_copy`` in a stage's memory breakdown)."""
    return len(plan.stages) > 1 and any(dict(st.memory_breakdown).get("tied_copy", 0.0) > 0 for st in plan.stages)


def model_kind_refusal(fmt: str, transformer: Mapping | None) -> str | None:
    """Why format ``fmt`` cannot run a transformer of its config's ``kind``
    (``transformer``: the config's fields, None for a profiled model), or
    None: an encoder-decoder model is no chain of layers that each pass
    one tensor on (a decoder layer also reads the encoder's output), and
    Megatron's command here is ``pretrain_gpt.py``'s."""
    kind = "decoder" if transformer is None else transformer.get("kind", "decoder")
    if kind == "decoder":
        return None
    if fmt == "megatron":
        return (f"model kind {kind!r}: only decoder-only models get a pretrain_gpt.py command (encoder-decoder "
                f"models train with pretrain_t5.py and --encoder/--decoder-num-layers)")
    if fmt in _CHAIN_FORMATS:
        return (f"model kind {kind!r}: {RUNTIME_NAMES.get(fmt, fmt)} runs a chain of layers that each pass one "
                f"tensor on, and a decoder layer also needs the encoder's output")
    return None


def refuse_chain_limits(plan: Plan, fmt: str, inputs: "Inputs") -> None:
    """Refuse what a runtime's pipeline of stages cannot run as planned: an
    encoder-decoder model (each stage passes one tensor on; a decoder stage
    also needs the encoder's output) and a sharded optimizer state in the
    exports whose loop steps every replica's whole optimizer.

    Raises:
        InputError: names the runtime, what it cannot run and the fix.
    """
    name = RUNTIME_NAMES.get(fmt, fmt)
    reason = model_kind_refusal(fmt, inputs.transformer) if fmt in _CHAIN_FORMATS else None
    if reason:
        raise InputError(f"export {fmt}: {reason}; export --format stages-json for the split")
    if fmt in _UNSHARDED_FORMATS and inputs.sharding != "none":
        raise InputError(f"export {fmt}: the plan shards the optimizer state (--sharding {inputs.sharding}), and "
                         f"{name}'s training loop here keeps every replica's whole state and steps it, so the "
                         f"plan's memory would not be what runs; re-plan with --sharding none, or export with a "
                         f"runtime that shards (--runtime megatron or deepspeed for zero1, torchtitan for fsdp)")

def export_all(plan: Plan, inputs: Mapping | None = None) -> dict[str, dict]:
    """Export ``plan`` in every format of :data:`FORMATS` (``inputs``: as for
    :func:`export_plan`).

    Returns:
        ``{fmt: export}`` for every format, where a refused export is
        ``{"refused": reason}`` (the :class:`InputError` message). Never raises
        for refusals; other exceptions (bugs) propagate.
    """
    out: dict[str, dict] = {}
    try:
        inputs = Inputs.of(inputs)  # one for every format (its nodes are built once)
    except InputError:
        pass  # each format refuses them below
    for fmt in FORMATS:
        try:
            out[fmt] = export_plan(plan, fmt, inputs=inputs)
        except InputError as exc:
            out[fmt] = {"refused": str(exc)}
    return out


# ---------------------------------------------------------------- shared helpers (used by the exporters)


@dataclass(frozen=True)
class Inputs:
    """What the exporters read from a plan file's ``inputs`` object.

    Attributes:
        model: ``inputs.model`` (``{}`` when not given): ``name``, ``kind``
            (``"transformer"`` or ``"profile"``), ``seq_len``, and for
            transformers ``transformer`` (the config's fields, see
            :class:`pipesearch.profiles.transformer.TransformerConfig`).
        cluster: ``inputs.cluster`` (``{}`` when not given); the exporters use
            ``groups[*].devices_per_node`` and ``name``.
        job: ``inputs.job`` (``{}`` when not given); the exporters use
            ``zero1``, ``optimizer_state.sharding`` and ``comm_overlap``.
    """

    model: Mapping = field(default_factory=dict)
    cluster: Mapping = field(default_factory=dict)
    job: Mapping = field(default_factory=dict)

    @classmethod
    def of(cls, inputs: Mapping | None) -> "Inputs":
        if isinstance(inputs, Inputs):
            return inputs
        inputs = inputs or {}
        if not isinstance(inputs, Mapping):
            raise InputError(f"export: inputs = {inputs!r}; expected the plan file's inputs object")
        return cls(dict(inputs.get("model") or {}), dict(inputs.get("cluster") or {}), dict(inputs.get("job") or {}))

    @property
    def transformer(self) -> Mapping | None:
        """The transformer config fields, or ``None`` (no inputs, or a profiled model)."""
        t = self.model.get("transformer")
        return t if isinstance(t, Mapping) else None

    @property
    def seq_len(self) -> int | None:
        v = self.model.get("seq_len")
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    @cached_property
    def nodes(self) -> list[tuple[int, int, str]]:
        """The cluster's nodes in id order, ``(first device, last device,
        device type)`` each (``[]`` without the groups' device ranges); built
        once per :class:`Inputs` (a 2,048-node cluster is read by every
        exporter several times)."""
        out = []
        for g in self.cluster.get("groups") or []:
            first, size, count = (g.get(k) if isinstance(g, Mapping) else None
                                  for k in ("first_device", "devices_per_node", "nodes"))
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (first, size, count)) or size < 1:
                return []
            out += [(first + j * size, first + (j + 1) * size - 1, str(g.get("device", "?"))) for j in range(count)]
        return out

    @property
    def devices_per_node(self) -> int | None:
        """Devices per node of the cluster (the smallest group's), or ``None``."""
        groups = self.cluster.get("groups") or []
        sizes = [g.get("devices_per_node") for g in groups if isinstance(g, Mapping)]
        sizes = [s for s in sizes if isinstance(s, int) and s > 0]
        return min(sizes) if sizes else None

    @property
    def training_precision(self) -> str | None:
        """What the plan's model trains in: ``"16-bit"`` mixed precision for
        a transformer layer table (2-byte weights and activations,
        docs/transformer_costs.md) or a profile of parameters under 4 bytes
        (``inputs.model.bytes_per_param``), ``"fp32"`` for a profile of
        4-byte parameters (timed and sized in fp32: the rule of
        :func:`pipesearch.costs.profile_precision`, which times any other
        size at the 16-bit rate), None when the inputs do not say."""
        if self.model.get("kind") == "transformer":
            return "16-bit"
        bpp = self.model.get("bytes_per_param")
        if not isinstance(bpp, (int, float)) or isinstance(bpp, bool) or bpp <= 0:
            return None
        return "fp32" if bpp == 4 else "16-bit"

    def without_bf16(self, plan: Plan) -> list[str]:
        """The plan's device types whose compute capability (the cluster
        groups' ``compute_capability``) is below 8.0: no bf16 there (V100,
        T4), the runtimes train in fp16 with loss scaling instead."""
        used = {name for st in plan.stages for name in st.device_type.split(",")}  # a stage may span types
        return sorted({str(g.get("device")) for g in self.cluster.get("groups") or [] if isinstance(g, Mapping)
                       and g.get("device") in used and isinstance(g.get("compute_capability"), (int, float))
                       and not has_bf16(g["compute_capability"])})

    def fp16_note(self, plan: Plan, flag: str, runtime: str) -> str | None:
        """The note of an export that trains in fp16 because some of the
        plan's devices have no bf16 (:meth:`without_bf16`), naming the flag
        it wrote; None when every device has bf16."""
        half = self.without_bf16(plan)
        if not half:
            return None
        return (f"{flag}: {', '.join(half)} has no bf16 (compute capability below {MIN_BF16_CAPABILITY:g}); "
                f"{runtime} trains in fp16 with dynamic loss scaling, the same bytes as planned.")

    def node_of(self, device: int) -> int | None:
        """The node (0-based, over the groups in order) of a global device
        id, from ``groups[*]`` ``first_device``, ``last_device``,
        ``devices_per_node``; ``None`` when the cluster does not say
        (:func:`pipesearch.hardware.described_place`)."""
        from ..hardware import described_place

        place = described_place(self.cluster, device)
        return None if place is None else place[0]

    @property
    def zero1(self) -> bool:
        return bool(self.job.get("zero1", False))

    @property
    def sharding(self) -> str:
        """``inputs.job.optimizer_state.sharding``; without it ``zero1`` or
        ``none`` from ``inputs.job.zero1``."""
        state = self.job.get("optimizer_state")
        v = state.get("sharding") if isinstance(state, Mapping) else None
        return v if isinstance(v, str) else ("zero1" if self.zero1 else "none")

    @property
    def comm_overlap(self) -> Mapping:
        """``inputs.job.comm_overlap`` (:meth:`pipesearch.overlap.CommOverlap.as_dict`), ``{}`` when absent."""
        v = self.job.get("comm_overlap")
        return v if isinstance(v, Mapping) else {}


def torchtitan_dp_degrees(plan: Plan, inputs: "Inputs", release: str) -> tuple[int, int, str]:
    """``(data_parallel_replicate_degree, data_parallel_shard_degree, note)``
    of torchtitan for the plan's data parallelism: full replicas with a
    gradient all-reduce (``replicate = dp``, ``shard = 1``) when the plan
    shards nothing; FSDP2 over the replicas (``replicate = 1``, ``shard =
    dp``) for ``zero3`` / ``fsdp``.

    Raises:
        InputError: ZeRO-1 or ZeRO-2 (torchtitan shards with FSDP2 only).
    """
    sharding = inputs.sharding
    if plan.dp == 1 and sharding in ("none", "zero3", "fsdp"):
        return 1, 1, ("one data-parallel replica: nothing to shard or all-reduce (data_parallel_replicate_degree "
                      "= data_parallel_shard_degree = 1).")
    if sharding in ("zero3", "fsdp"):
        return 1, plan.dp, (f"data_parallel_shard_degree = {plan.dp}: FSDP2 over the data-parallel ranks (the "
                            f"plan's --sharding {sharding}: weights, gradients and optimizer state sharded).")
    if sharding != "none":
        raise InputError(f"torchtitan {release}: sharding {sharding!r}: torchtitan shards with FSDP2 only (all of "
                         f"weights, gradients and optimizer state); re-plan with --sharding fsdp or none")
    return plan.dp, 1, ("data_parallel_shard_degree = 1 and replicate = dp reproduce the plan's data parallelism "
                        "(full replicas, gradient all-reduce); FSDP needs a plan with --sharding fsdp.")


#: a double-quoted shell variable with an optional default or error (``"${NAME:-x}"``, ``"${NAME:?}"``)
_SHELL_VARIABLE = re.compile(r'"\$\{[A-Z_][A-Z0-9_]*(:[-?][A-Za-z0-9_.]*)?\}"')


def shell_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """``argv`` (after ``env`` assignments) as a shell command, one flag and its values per line; a
    value that is one double-quoted shell variable (``"${NODE_RANK:?}"``) stays as it is, to expand."""
    head = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    groups: list[list[str]] = []
    for a in argv:
        if a.startswith("-") or not groups or a.startswith("activation-checkpoint:") or a.endswith(".py"):
            groups.append([a])
        else:
            groups[-1].append(a)
    # the launcher and the program name stay on the first line
    lines = [shell_line(g) for g in groups]
    return " \\\n    ".join([" ".join(head + [lines[0]]) if head else lines[0], *lines[1:]])


def shell_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """``argv`` (after ``env`` assignments) as a one-line shell command: :func:`shlex.quote` on
    each word but one double-quoted shell variable (``"${NODE_RANK:?}"``), which stays as it is,
    to expand."""
    words = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    return " ".join(words + [x if _SHELL_VARIABLE.fullmatch(x) else shlex.quote(x) for x in argv])


def torchrun_prefix(world_size: int, inputs: Inputs, plan: Plan | None = None,
                    scan: str = "data") -> tuple[list[str], str | None]:
    """``torchrun`` arguments for ``world_size`` processes on the plan's nodes
    (``plan``, ``scan``: which of the cluster's nodes, in what order,
    :func:`launch_note`).

    Returns:
        ``(argv, note)``: ``["torchrun", "--nnodes", N, "--nproc-per-node",
        G]`` with ``G = min(devices per node, world_size)`` and ``N =
        ceil(world_size / G)``, and with several nodes torchrun's static
        rendezvous read from the shell (``--node-rank "${NODE_RANK:?}"
        --master-addr "${MASTER_ADDR:?}" --master-port
        "${MASTER_PORT:-29500}"``: node ``k`` runs the ranks the plan puts
        on its ``k``-th node; a dynamic rendezvous would number the nodes
        in the order they join); when ``G`` does not divide ``world_size`` the
        last node runs the remainder (torchrun's rendezvous adds up each
        node's ``--nproc-per-node``), which ``note`` says, as it says what a
        multi-node job needs and how many devices stay idle; ``None`` when
        there is nothing to say. Without the cluster's node size, one node
        of ``world_size`` processes. When the plan's nodes run different
        numbers of processes (:func:`node_processes`; groups of different
        node sizes), ``--nproc-per-node "${NPROC_PER_NODE:?}"`` and a note
        giving each ``NODE_RANK``'s count: torchrun's static rendezvous adds
        up every agent's and numbers the ranks node by node.
    """
    counts = node_processes(plan, inputs, scan) if plan is not None else []
    if uneven_nodes(counts, world_size):
        # nodes of different sizes (a mixed cluster's groups): each node's agent starts its own count, and
        # torchrun's static rendezvous numbers the ranks node by node in NODE_RANK order, as the plan does
        where = launch_note(plan, inputs, scan)
        return (["torchrun", "--nnodes", str(len(counts)), "--nproc-per-node", '"${NPROC_PER_NODE:?}"',
                 "--node-rank", '"${NODE_RANK:?}"', "--master-addr", '"${MASTER_ADDR:?}"', "--master-port",
                 '"${MASTER_PORT:-29500}"'],
                f"the plan's nodes run different numbers of processes: run the command on each of the "
                f"{len(counts)} nodes with NODE_RANK, NPROC_PER_NODE and MASTER_ADDR (node 0's address) set: "
                + "; ".join(f"NODE_RANK {i}: NPROC_PER_NODE={c}" for i, c in enumerate(counts))
                + ("; " + where.rstrip(".") if where else "") + ".")
    per_node = inputs.devices_per_node or world_size
    g = min(per_node, world_size)
    n = -(-world_size // g)
    notes = []
    last = world_size - (n - 1) * g
    if last != g:
        notes.append(f"{world_size} processes do not fill nodes of {g}: on the last node pass "
                     f"--nproc-per-node {last}")
    rendezvous = []
    if n > 1:  # static rendezvous: node k runs ranks k G .. (k + 1) G - 1, the order the plan places them in
        rendezvous = ["--node-rank", '"${NODE_RANK:?}"', "--master-addr", '"${MASTER_ADDR:?}"', "--master-port",
                      '"${MASTER_PORT:-29500}"']
        notes.append(f"run the command on each of the {n} nodes with NODE_RANK set to the node's index (0 .. "
                     f"{n - 1}, in the plan's node order) and MASTER_ADDR to node 0's address")
        nodes = Inputs.of(inputs).nodes[:n]
        if len({kind for _, _, kind in nodes}) > 1 and not reordered_nodes(plan, inputs, scan):
            # nodes of several device types: which one is which index is what the stages' split rests on
            notes.append("NODE_RANK " + "; ".join(f"{k} on node {k} of the cluster (devices {a}-{b}, {kind})"
                                                  for k, (a, b, kind) in enumerate(nodes)))
    if inputs.devices_per_node:
        idle = n * per_node - world_size
        if idle > 0:
            notes.append(f"{idle} device(s) of the {n} node(s) stay idle: the plan uses {world_size} processes")
    where = launch_note(plan, inputs, scan) if plan is not None else None
    if where:
        notes.append(where.rstrip("."))
    return (["torchrun", "--nnodes", str(n), "--nproc-per-node", str(g), *rendezvous],
            "; ".join(notes) + "." if notes else None)


@dataclass(frozen=True)
class PlanLayers:
    """The checked layer structure of a plan.

    Attributes:
        names: all layer names of the model, in order (the concatenation of
            the stages' ``layer_names``).
        ranges: per stage (in stage order), its half-open ``(first, last + 1)``
            layer range.
    """

    names: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.ranges)


def plan_layers(plan: Plan, runtime: str) -> PlanLayers:
    """Check the plan's structure and return its layers and stage ranges.

    Checks: positive integer ``pp``, ``vp``, ``dp``, ``tp``, micro-batch size
    and count; a known schedule; ``pp * vp`` stages with indices ``0 ..``;
    stage ranges contiguous from layer 0, each ``first <= last + 1``, with as
    many ``layer_names`` as layers; unique layer names.

    Raises:
        InputError: naming ``runtime``, the field and the value.
    """
    for name in ("pp", "vp", "dp", "tp", "micro_batch_size", "num_micro_batches"):
        val = getattr(plan, name)
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise InputError(f"{runtime}: plan.{name} = {val!r}; expected an integer >= 1")
    if plan.schedule not in SCHEDULES and plan.schedule != "roundpipe":  # RoundPipe: tasks, not action lists
        raise InputError(f"{runtime}: plan.schedule = {plan.schedule!r}; expected one of {', '.join(SCHEDULES)}")
    want = plan.pp * plan.vp
    if len(plan.stages) != want:
        raise InputError(
            f"{runtime}: plan has {len(plan.stages)} stages; expected pp * vp = {plan.pp} * {plan.vp} = {want}"
        )
    names: list[str] = []
    ranges: list[tuple[int, int]] = []
    pos = 0
    for i, st in enumerate(plan.stages):
        if st.index != i:
            raise InputError(f"{runtime}: plan.stages[{i}].index = {st.index}; stages must be listed in index order")
        a, b = st.layers
        if a != pos or b < a:
            raise InputError(
                f"{runtime}: stage {i} has layers {st.layers}; expected a half-open range starting at layer {pos} "
                f"(stages must cover the layers in order without gaps or overlaps)"
            )
        if len(st.layer_names) != b - a:
            raise InputError(
                f"{runtime}: stage {i} has layers {st.layers} ({b - a} layers) but {len(st.layer_names)} layer_names"
            )
        names.extend(st.layer_names)
        ranges.append((a, b))
        pos = b
    if pos == 0:
        raise InputError(f"{runtime}: plan has no layers")
    dup = sorted(n for n, k in Counter(names).items() if k > 1)
    if dup:
        raise InputError(f"{runtime}: layer names must be unique; repeated: {', '.join(dup[:5])}")
    return PlanLayers(tuple(names), tuple(ranges))


def plan_extra(plan: Plan, key: str, default):
    """Value of ``key`` in ``plan.extra`` (a tuple of ``(key, value)`` pairs), or ``default``."""
    for k, v in plan.extra or ():
        if k == key:
            return v
    return default


def stage_recompute_modes(plan: Plan, runtime: str) -> list[str]:
    """Each stage's recompute setting: the plan's one (``plan.extra``
    ``recompute``, ``"none"`` when missing), or with ``per-stage`` the one
    each stage chose (the recompute part of
    :attr:`pipesearch.types.StagePlan.memory_option`, ``"none"`` for an
    option without recomputation: on-device, act-host, offload, stream).

    Raises:
        InputError: a plan-wide value outside ``none``, ``selective``, ``full``.
    """
    mode = plan_extra(plan, "recompute", "none") or "none"
    if mode == "per-stage":
        return [head if (head := st.memory_option.split("+")[0]) in RECOMPUTE_MODES else "none"
                for st in plan.stages]
    if mode not in RECOMPUTE_MODES:
        raise InputError(f"{runtime}: plan.extra recompute = {mode!r}; expected one of {', '.join(RECOMPUTE_MODES)}")
    return [mode] * len(plan.stages)


def stored_scores_note(attention: str, setting: str) -> str:
    """The export note of a transformer plan of recompute ``none`` (which
    keeps every block's attention scores, as unfused attention does) for a
    runtime whose ``attention`` keeps none of them, run with ``setting``
    (its words for no recompute)."""
    return (f"the plan stores the attention scores (unfused attention); {attention} never does and recomputes them "
            f"in its backward, so with {setting} it holds less activation memory than planned and runs the "
            f"attention core's forward once more (re-plan with --recompute selective to time that).")


def recompute_mode(plan: Plan, runtime: str) -> str:
    """The one recompute setting of every stage (:func:`stage_recompute_modes`).

    Raises:
        InputError: a value outside ``none``, ``selective``, ``full``, or
            stages that chose differently (``per-stage``).
    """
    chosen = set(stage_recompute_modes(plan, runtime))
    if len(chosen) == 1:
        return next(iter(chosen))
    per = ", ".join(f"stage {st.index} {st.memory_option or 'none'}" for st in plan.stages)
    names = [n for st in plan.stages for n in st.layer_names]
    fix = ("re-plan with --recompute none, selective or full" if transformer_shape(names) is not None else
           "re-plan with --recompute none (a layer profile's stages recompute only as the search chooses)")
    raise InputError(f"{runtime}: the plan recomputes its stages differently ({per}) and {runtime} applies one "
                     f"recompute setting to every stage; {fix}, or export to torch, whose script checkpoints "
                     f"each stage on its own")


def sequence_parallel(plan: Plan) -> bool:
    """``plan.extra["sequence_parallel"]`` (``False`` when missing)."""
    return bool(plan_extra(plan, "sequence_parallel", False))


def transformer_shape(names: Sequence[str]) -> tuple[bool, int, bool] | None:
    """If ``names`` is a transformer layer table, ``(has_embedding, num_blocks, has_head)``.

    A transformer layer table is an optional ``embedding``, then blocks
    ``block_<i>`` with ``i = 0, 1, ..`` in order (any zero padding), then an
    optional ``head``; at least one block. Anything else returns ``None``.
    """
    n = len(names)
    lo, hi = 0, n
    has_emb = n > 0 and names[0] == "embedding"
    has_head = n > 0 and names[-1] == "head"
    if has_emb:
        lo = 1
    if has_head:
        hi = n - 1
    if hi <= lo:
        return None
    for i, name in enumerate(names[lo:hi]):
        mt = _BLOCK.fullmatch(name)
        if not mt or int(mt.group(1)) != i:
            return None
    return has_emb, hi - lo, has_head


def unmapped_layers_note(names: Sequence[str], module_names: Mapping | None, inputs: "Inputs | None",
                         what: str, model: str, warn: bool = False) -> str | None:
    """The note that layers of a plan that is not a transformer layer table
    (:func:`transformer_shape`) and that ``module_names`` leaves out are
    named by their own layer names in ``what`` (the exported fields), so
    ``model`` (the model the runtime builds) needs modules of those names;
    None when every layer is mapped or the plan is a transformer layer
    table. A warning (``"warning: "``, printed by ``pipesearch export``)
    when ``warn`` or when the layers are named as in a PipeDream graph,
    which no torch model's modules are."""
    unmapped = [n for n in names if n not in (module_names or {})]
    if transformer_shape(names) is not None or not unmapped:
        return None
    pipedream = "PipeDream" in str(Inputs.of(inputs).model.get("source", ""))
    return (f"{'warning: ' if warn or pipedream else ''}{what} name each layer"
            f"{' not in module_names' if module_names else ''} by the plan's layer name "
            f"({', '.join(unmapped[:2])}, ...): {model} needs modules of those names, as a model profiled by "
            "pipesearch profile has"
            + (" (this plan's layers are named as in a PipeDream profile graph, not as torch modules)"
               if pipedream else "")
            + "; else map them with pipesearch export --module-names NAMES.json (a JSON object: layer name "
              "-> module name, or a list of them in execution order).")


def layer_modules(names: Sequence[str], module_names: Mapping[str, str | Sequence[str]] | None,
                  runtime: str) -> list[list[str]]:
    """Module FQNs of every layer, in execution order (see the module doc).

    Raises:
        InputError: a ``module_names`` entry for an unknown layer, an empty or
            non-string FQN, or an FQN used by two layers.
    """
    shape = transformer_shape(names)
    out: list[list[str]] = []
    for name in names:
        if shape is None:
            out.append([name])
        elif runtime == "torch":  # pipesearch's chain of the HuggingFace model (profiler.hf_causal_lm_chain)
            out.append(["embed_tokens"] if name == "embedding" else ["lm_head"] if name == "head" else
                       [f"layers_{int(_BLOCK.fullmatch(name).group(1)):02d}"])
        elif name == "embedding":
            out.append(["tok_embeddings"])
        elif name == "head":
            out.append(["norm", "lm_head"])
        else:
            out.append([f"layers.{int(_BLOCK.fullmatch(name).group(1))}"])
    if module_names:
        index = {n: i for i, n in enumerate(names)}
        for key, val in module_names.items():
            if key not in index:
                raise InputError(f"{runtime}: module_names has an entry for {key!r}, which is not a layer of the plan")
            fqns = [val] if isinstance(val, str) else list(val)
            if not fqns or not all(isinstance(f, str) and f.strip() for f in fqns):
                raise InputError(f"{runtime}: module_names[{key!r}] = {val!r}; expected a non-empty FQN or list of FQNs")
            out[index[key]] = [f.strip() for f in fqns]
    seen: dict[str, str] = {}
    for name, fqns in zip(names, out):
        for f in fqns:
            if f in seen:
                raise InputError(f"{runtime}: module FQN {f!r} is given to layers {seen[f]!r} and {name!r}")
            seen[f] = name
    return out


def ranges_from_counts(counts: Sequence[int]) -> list[tuple[int, int]]:
    """Half-open layer ranges of consecutive stages with ``counts`` layers each."""
    out, pos = [], 0
    for c in counts:
        out.append((pos, pos + int(c)))
        pos += int(c)
    return out


def refuse_empty_stages(layers: PlanLayers, runtime: str, why: str) -> None:
    """Raise :class:`InputError` naming the first stage with no layers.

    ``why`` says what the runtime does with an empty stage (and the source).
    """
    for i, (a, b) in enumerate(layers.ranges):
        if a == b:
            raise InputError(f"{runtime}: stage {i} has no layers; {why}")
