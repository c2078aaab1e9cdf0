"""A runtime-neutral description of a plan's stages (``pipesearch.stages/1``):
for runtimes that cannot express per-stage memory choices, each stage's
layers, devices, recompute, optimizer-state and weight placement and
prefetch, the host memory it fills and the bytes it moves over PCIe, checked
against ``pipesearch/schema/stages-1.schema.json`` with ``jsonschema``.

Sources of the fields: the plan's per-stage ``memory_option``
(:mod:`pipesearch.stage_options`: ``none`` / ``selective`` / ``full``
recompute, ``+offload`` / ``offload``: ZeRO-Offload's optimizer on the host,
``stream``: weights streamed layer by layer, ``swap``: Mobius' stage swapped
whole, ``act-host``: saved activations in host memory, copied out after each
forward and back before each backward, ``roundpipe``: RoundPipe's layer group,
its weights copied to whichever GPU runs its task and its gradients back, its
boundary activations kept in host memory and its forward re-run in its
backward) and the plan options written by :func:`pipesearch.option_search.host_plan_info`
(RoundPipe's: :func:`pipesearch.roundpipe.plan_point`, with ``options.roundpipe``:
each group's ``forward_gpu`` and ``backward_gpu`` and its copy times).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import jsonschema

from ..errors import InputError
from ..stage_options import ACT_HOST, offloads_activations
from ..types import Plan
from . import Inputs, plan_extra, plan_layers

RECOMPUTE = ("none", "selective", "full")


@lru_cache(maxsize=1)
def stages_schema() -> dict:
    """The JSON Schema of ``pipesearch.stages/1`` (parsed once; do not modify)."""
    text = resources.files("pipesearch.schema").joinpath("stages-1.schema.json").read_text(encoding="utf-8")
    return json.loads(text)  # checked against its metaschema by tests/test_plan_schema.py


def stages_problems(doc) -> list[str]:
    """Every place where ``doc`` breaks the ``pipesearch.stages/1`` schema
    (``path: message``), empty when it conforms."""
    validator = jsonschema.Draft202012Validator(stages_schema())
    return [f"{'.'.join(map(str, e.absolute_path)) or '(document)'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def stage_placement(option: str, plan_recompute: str) -> dict:
    """``recompute``, ``activations``, ``optimizer_state``, ``weights`` and
    ``prefetch`` of one stage from its ``memory_option`` (``plan_recompute``:
    the plan's recompute mode, for options that do not name one).

    Raises:
        InputError: an option this format does not know.
    """
    head, _, tail = option.partition("+")
    if head in RECOMPUTE:
        recompute, rest = head, tail
    else:
        recompute, rest = (plan_recompute if plan_recompute in RECOMPUTE else "none"), option
    if option == "roundpipe":  # pipesearch.roundpipe: every group's state in host memory, dispatched per task
        return {"recompute": "full", "activations": "host", "optimizer_state": "host", "weights": "dispatched",
                "prefetch": "next-task"}
    on_host = offloads_activations(rest)
    rest = "+".join(x for x in rest.split("+") if x and x != ACT_HOST)
    if rest not in ("", "on-device", "offload", "stream", "swap") or (on_host and rest not in ("", "offload", "swap")):
        raise InputError(f"export stages-json: stage memory_option {option!r} is not one of pipesearch's options "
                         "(none / selective / full, +act-host, +offload, +stream, on-device, offload, stream, swap, swap+act-host)")
    return {"recompute": recompute, "activations": "host" if on_host else "device",
            "optimizer_state": "host" if rest in ("offload", "stream", "swap") else "device",
            "weights": {"stream": "streamed", "swap": "swapped"}.get(rest, "device"),
            "prefetch": {"stream": "next-layer", "swap": "next-stage"}.get(rest, "none")}


def stage_gpus(heads, tp: int) -> list[int]:
    """Every GPU of a stage: for each data-parallel replica (the plan's
    ``devices``, one head per replica) its tensor-parallel group, ``tp``
    consecutive ids from the head (:func:`pipesearch.placement.stage_devices`),
    replica by replica."""
    from ..placement import stage_devices

    return [int(d) for d in stage_devices(list(heads), tp).reshape(-1)]


def export_stages_json(plan: Plan, *, module_names=None, inputs: Inputs | None = None) -> dict:
    """The ``pipesearch.stages/1`` document of ``plan`` (a dict; ``files``
    holds it as ``stages.json``). ``module_names`` is unused (noted).

    Raises:
        InputError: a malformed plan, or (a bug) a document the schema refuses.
    """
    plan_layers(plan, "stages-json")
    recompute = plan_extra(plan, "recompute", "none") or "none"
    host = plan_extra(plan, "host", {}) or {}
    mobius = plan_extra(plan, "mobius", {}) or {}
    roundpipe = plan_extra(plan, "roundpipe", {}) or {}
    delayed = plan_extra(plan, "optimizer_step", "") == "delayed"
    stages = []
    for st in plan.stages:
        k = st.index
        row = {"index": k, "rank": k % plan.pp, "layers": list(st.layers), "layer_names": list(st.layer_names),
               "devices": stage_gpus(st.devices, plan.tp), "tp_group_heads": [int(h) for h in st.devices],
               **stage_placement(st.memory_option, recompute),
               "memory_option": st.memory_option, "device_memory_bytes": float(st.memory_bytes),
               "host_memory_bytes": float(host.get("host_memory_bytes", [0.0] * len(plan.stages))[k]),
               "pcie_bytes_per_iteration": float(host.get("pcie_bytes_per_iteration", [0.0] * len(plan.stages))[k]),
               "activation_host_memory_bytes": float(host.get("activation_host_memory_bytes",
                                                              [0.0] * len(plan.stages))[k]),
               "activation_pcie_bytes_per_iteration": float(host.get("activation_pcie_bytes_per_iteration",
                                                                     [0.0] * len(plan.stages))[k]),
               "host_step_s": float(st.host_step_s)}
        if st.replicas is not None:  # per-stage replication: the stage's own replicas (the plan's dp is 1)
            row["replicas"] = int(st.replicas)
        if roundpipe:  # the GPUs its forward and its backward task run on (schedules.roundpipe_tasks)
            gpus = {(kind != "F", g): d for kind, g, d in roundpipe["tasks"]}
            row.update(forward_gpu=int(gpus.get((False, k), gpus[(True, k)])), backward_gpu=int(gpus[(True, k)]),
                       swap_in_s=float(roundpipe["weights_in_s"][k]), swap_out_s=float(roundpipe["grads_out_s"][k]))
            into = plan.stages[k - 1].send_bytes if k else 0.0  # the group's input, kept per micro-batch
            row.update(activation_host_memory_bytes=float(plan.num_micro_batches * into),
                       activation_pcie_bytes_per_iteration=float(plan.num_micro_batches * (
                           3 * into + 2 * st.send_bytes if k + 1 < len(plan.stages) else 2 * into)))
        if mobius:
            row.update(pcie_queue=int(mobius["pcie_queue"][k % plan.pp]), swap_in_s=float(mobius["swap_in_s"][k]),
                       swap_out_s=float(mobius["swap_out_s"][k]))
        stages.append(row)
    notes = ["a runtime-neutral description: no runtime reads it as is; each stage's recompute, optimizer-state "
             "and weight placement are what the plan's time and memory assume"]
    if roundpipe:
        notes.append("schedule roundpipe: task t of the dispatch order (forwards of groups 0..G-2, the last group's "
                     "fused forward and backward, backwards G-2..0) runs all micro-batches on GPU t mod pp; a "
                     "stage's devices are its forward's GPU, backward_gpu its backward's; weights come from host "
                     "memory for each task (the next task's prefetched), gradients go back after the backward, "
                     "activations cross group boundaries through host memory")
    if delayed:
        notes.append("the optimizer step of iteration t runs on the CPU beside iteration t+1: the weights a stage "
                     "uses are one step stale")
    if module_names:
        notes.append("module_names is unused: stages are named by the plan's layer names")
    doc = {"format": "pipesearch.stages/1", "format_version": 1, "runtime": "stages-json", "notes": notes,
           "pipeline": {"schedule": plan.schedule, "pp": plan.pp, "vp": plan.vp, "dp": plan.dp, "tp": plan.tp,
                        "micro_batch_size": plan.micro_batch_size, "num_micro_batches": plan.num_micro_batches,
                        "iteration_time_s": float(plan.predicted.iteration_time_s)},
           "optimizer_step": {"when": "delayed" if delayed else "after-backward", "staleness_steps": int(delayed)},
           "stages": stages,
           "totals": {"host_memory_bytes": float(sum(s["host_memory_bytes"] for s in stages)),
                      "pcie_bytes_per_iteration": float(sum(s["pcie_bytes_per_iteration"] for s in stages))}}
    problems = stages_problems(doc)
    if problems:
        raise InputError(f"export stages-json: the description breaks its schema: {problems[0]}")
    return doc | {"files": {"stages.json": json.dumps(doc, indent=2) + "\n"}}
