"""Export a plan for torchgpipe's ``GPipe`` / fairscale's ``Pipe``.

``GPipe(module: nn.Sequential, balance, devices=None, chunks=1,
checkpoint='except_last')`` (torchgpipe; fairscale.nn.Pipe has the same
arguments): ``balance`` lists the number of child layers of each partition,
``chunks`` the micro-batches per mini-batch, ``checkpoint`` one of
``'always'``, ``'except_last'``, ``'never'``.

Rules (torchgpipe/gpipe.py ``split_module`` and fairscale/nn/pipe
``check_balance``, read through the code corpus):

* ``len(module) != sum(balance)`` -> "module and sum of balance have different
  length"; ``any(x <= 0 for x in balance)`` -> "all balance numbers must be
  positive integer": empty stages are refused.
* torchgpipe runs GPipe's fill-drain schedule only, one partition per device:
  **decision:** plans with another schedule (unless one stage runs one
  micro-batch, where every schedule is the same) or ``vp > 1`` are refused
  (it would run GPipe instead of what was planned; with one stage it still
  runs every forward before the backwards and holds every micro-batch's
  activations).
* The mini-batch is split with ``torch.chunk`` into ``chunks`` pieces, which
  yields fewer pieces when the batch is not divisible; the export sets the
  mini-batch to ``micro_batch_size * chunks`` so there are exactly ``chunks``.
* No tensor parallelism: ``tp > 1`` is refused. Data parallelism is outside
  GPipe (one GPipe per replica); ``devices`` lists each replica's devices,
  as the indices of its node's own GPUs (``cuda:i``; a note names the node
  when the cluster has several), which one process drives: a replica spread
  over nodes is refused (when
  the plan file's cluster says where each device is).
* ``checkpoint``: recompute ``full`` -> ``'always'`` (every micro-batch
  recomputed, pipesearch's model of full recomputation); ``none`` ->
  ``'never'``; ``selective`` -> ``'never'`` with a note (torchgpipe
  checkpoints whole partitions; attention-core recomputation must come from
  the layers). torchgpipe's default ``'except_last'`` is not pipesearch's model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import InputError
from ..types import Plan
from . import FORMAT_VERSION, Inputs, plan_layers, recompute_mode, refuse_empty_stages, sequence_parallel

RUNTIME = "torchgpipe"

CHECKPOINT = {"none": "never", "selective": "never", "full": "always"}


def export_gpipe(plan: Plan, *, module_names: Mapping[str, str | Sequence[str]] | None = None,
                 inputs: Inputs | None = None) -> dict:
    """Export ``plan`` as torchgpipe / fairscale Pipe arguments.

    Args:
        plan: the plan; the layer list is the ``nn.Sequential``'s children.
        module_names: unused (GPipe splits by child position); noted if given.

    Returns:
        ``{"runtime", "format_version", "balance", "chunks", "checkpoint",
        "batch_size", "devices", "notes"}``; ``devices[r]`` lists replica
        ``r``'s device ids, one per partition (from the plan's stages).

    Raises:
        InputError: a malformed plan, a schedule other than ``gpipe``,
            ``vp > 1``, ``tp > 1``, an empty stage or a replica on several
            nodes.
    """
    layers = plan_layers(plan, "gpipe")
    if plan.schedule != "gpipe" and (plan.pp > 1 or plan.num_micro_batches > 1):
        # one stage and one micro-batch: every schedule is the same; one stage and several: torchgpipe
        # still runs every forward before the backwards (holding every micro-batch's activations)
        raise InputError(
            f"gpipe: torchgpipe / fairscale Pipe run only GPipe's fill-drain schedule (all "
            f"{plan.num_micro_batches} forwards before the backwards, every micro-batch's activations held), "
            f"the plan uses {plan.schedule!r}; re-plan with schedule 'gpipe'"
        )
    if plan.vp != 1:
        raise InputError(f"gpipe: GPipe places one partition per device, the plan has vp={plan.vp}")
    if plan.tp > 1:
        raise InputError(f"gpipe: GPipe has no tensor parallelism, the plan has tp={plan.tp}")
    refuse_empty_stages(
        layers, "gpipe",
        "GPipe's balance must be positive ('all balance numbers must be positive integer'); "
        "re-plan without empty stages",
    )
    rc = recompute_mode(plan, "gpipe")
    balance = list(layers.counts)
    m = plan.num_micro_batches
    devices = []
    for r in range(plan.dp):
        row = []
        for st in plan.stages:
            row.append(int(st.devices[r]) if r < len(st.devices) else None)
        devices.append(row)
    for r, row in enumerate(devices):  # one process drives a replica's partitions: its GPUs on one node
        # the nodes in the order the partitions reach them
        nodes = list(dict.fromkeys(n for n in (inputs.node_of(d) for d in row if d is not None) if n is not None)
                     ) if inputs is not None else []
        if len(nodes) > 1:
            raise InputError(f"gpipe: torchgpipe / fairscale Pipe run one pipeline in one process, on one node; "
                             f"replica {r}'s partitions are on devices {row}, nodes {nodes}; re-plan with "
                             f"pp at most a node's devices under --runtime gpipe (it places each replica's stages "
                             f"on consecutive devices), or for another runtime")
    notes = [f"pass a mini-batch of micro_batch_size * chunks = {plan.micro_batch_size * m} samples per replica."]
    starts = {n: first for n, (first, _, _) in enumerate(inputs.nodes)} if inputs is not None else {}
    for r, row in enumerate(devices):  # torch.device indices are the node's own: the node's first GPU is cuda:0
        node = inputs.node_of(row[0]) if starts and row and row[0] is not None else None
        if node is None or node not in starts:
            continue
        devices[r] = [d - starts[node] if d is not None else None for d in row]
        if starts[node] or len(starts) > 1:
            notes.append(f"replica {r} runs on node {node} (cluster devices {row}): its devices are that node's "
                         f"cuda:{', cuda:'.join(str(d) for d in devices[r] if d is not None)}.")
    if rc == "selective":
        notes.append("recompute='selective' (attention core) is not a GPipe option; checkpoint='never' and the "
                     "layers must recompute (e.g. FlashAttention).")
    if plan.dp > 1:
        notes.append(f"dp={plan.dp}: run one GPipe per replica (devices[r]) and all-reduce gradients across them.")
    if sequence_parallel(plan):
        notes.append("sequence_parallel has no meaning without tensor parallelism; ignored.")
    if module_names:
        notes.append("module_names is unused: GPipe splits the nn.Sequential by child position.")
    return {
        "runtime": RUNTIME,
        "runtime_version": None,  # not checked against a release (torchgpipe / fairscale are not installed)
        "format_version": FORMAT_VERSION,
        "balance": balance,
        "chunks": m,
        "checkpoint": CHECKPOINT[rc],
        "batch_size": plan.micro_batch_size * m,
        "devices": devices,
        "files": {},
        "notes": notes,
    }


def stages_from_balance(balance: Sequence[int]) -> list[tuple[int, int]]:
    """Stage boundaries from a GPipe ``balance``.

    Raises:
        InputError: a non-positive entry (GPipe's own rule).
    """
    out, pos = [], 0
    for x in balance:
        x = int(x)
        if x <= 0:
            raise InputError(f"gpipe balance {list(balance)}: all balance numbers must be positive integer")
        out.append((pos, pos + x))
        pos += x
    return out
