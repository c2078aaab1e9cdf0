"""The copies and host terms a RoundPipe or Mobius plan records, checked
against the numbers they are derived from.

A RoundPipe plan (:mod:`pipesearch.roundpipe`) writes, per group ``g``, its
copies over PCIe and the CPU's optimizer step, and per GPU its switch
share; each is a formula of the plan's own stage bytes and the cluster's
``[host]`` table that the document carries (``inputs.cluster.host``). With
``bw = min(host_to_device_bytes_per_s, switch_uplink_bytes_per_s)``:

* ``options.roundpipe.act_copy_s[g] = stages[g].send_bytes / bw`` (one
  micro-batch's boundary activation, ``g < G - 1``);
* ``options.roundpipe.weights_in_s[g]`` and ``grads_out_s[g]`` are the
  stage's 16-bit ``weights`` and ``gradients`` (``memory_breakdown_bytes``;
  the last group's plus half its ``tied_copy``, a tied LM head it uploads and
  downloads, :meth:`pipesearch.roundpipe.RoundPipeCosts.group_tied_params`)
  over ``bw``;
* ``options.roundpipe.pcie_scale[d] = bw / min(host_to_device,
  switch_uplink / n_d)``, ``n_d`` the pool's GPUs under GPU ``d``'s switch
  (:func:`pipesearch.host.shared_bandwidth_bytes_per_s`);
* ``stages[g].comm_s`` is ``act_copy_s[g]`` (0 for the last group);
  ``stages[g].host_step_s`` the CPU's Adam over the group's parameters,
  ``weights / 2 B / cpu_adam_params_per_s``; ``stages[g].allreduce_s`` that
  step, or 0 with a delayed step (``options.optimizer_step``);
* ``predicted.analytic_iteration_time_s`` is ``iteration_time_s`` (the
  graph's longest path is RoundPipe's only time) and
  ``predicted.bubble_fraction`` one minus the busiest GPU's compute (``m``
  micro-batches of its tasks: a forward ``fwd_s``, a backward or the fused
  last task ``compute_s``, :func:`pipesearch.schedules.roundpipe_tasks`)
  over it.

A Mobius plan (:func:`pipesearch.host.swap_queues`) records per rank its
PCIe queue, the switch of the rank's first GPU numbered ``node x switches
per node + switch``, and per stage copies whose way out takes as long as
the way in (``swap_out_s = swap_in_s``, one rate each way,
:func:`pipesearch.stage_options.swap_options`); with ``dp`` 1 a stage's
``allreduce_s`` is its CPU step ``host_step_s`` (0 with a delayed step,
:meth:`pipesearch.costs.PipelineCosts.after_backward_s`).

Every plan's GPU optimizer steps (``stages[s].optimizer_step_s``) are
checked too (:mod:`pipesearch.schema.optimizer_steps`).

Each problem names the field, the value found and the value expected.
"""

from __future__ import annotations

from typing import Iterator

from ..host import shared_bandwidth_bytes_per_s
from ..roundpipe import WEIGHT_BYTES_PER_PARAM
from ..schedules import roundpipe_tasks
from ..types import HostSpec
from . import Problem, check_record, show
from .host_records import device_place, host_problems, host_spec, job_param_state
from .optimizer_steps import optimizer_step_problems

def _roundpipe(plan: dict, where: str, inputs: dict) -> Iterator[Problem]:
    """A RoundPipe plan's records against the ``[host]`` table (module docstring)."""
    info, stages = plan["options"]["roundpipe"], plan["stages"]
    host = host_spec(inputs)
    if host is None:
        found = (inputs.get("cluster") or {}).get("host") if isinstance(inputs.get("cluster"), dict) else None
        yield Problem("inputs.cluster.host", f"{show(found)} found, the cluster's [host] table expected (positive "
                                             "rates, pcie_switches of device ids), from which a roundpipe plan's "
                                             "copies are derived; re-plan with --schedule roundpipe")
        return
    bw = min(host.host_to_device_bytes_per_s, host.switch_uplink_bytes_per_s)
    pool = [st["devices"][0] for st in stages[:plan["parallelism"]["pp"]]]
    keys = [device_place(d, inputs["cluster"], host) for d in pool]
    for d, key in enumerate(keys):
        if key is not None:
            n = sum(k == key for k in keys)
            yield from check_record(f"{where}.options.roundpipe.pcie_scale[{d}]", info["pcie_scale"][d],
                              float(bw / shared_bandwidth_bytes_per_s(host, n)),
                              f"{n} of the pool's GPUs share GPU {pool[d]}'s PCIe switch")
    yield from _roundpipe_groups(plan, where, host, bw)
    yield from _roundpipe_prediction(plan, where)


def _roundpipe_groups(plan: dict, where: str, host: HostSpec, bw: float) -> Iterator[Problem]:
    """Each group's copies, ``comm_s``, CPU step and ``allreduce_s`` (module docstring)."""
    info, stages = plan["options"]["roundpipe"], plan["stages"]
    rp, G = f"{where}.options.roundpipe", len(stages)
    delayed = (plan.get("options") or {}).get("optimizer_step") == "delayed"
    for g, st in enumerate(stages):
        parts = st.get("memory_breakdown_bytes") or {}
        w = f"{where}.stages[{g}]"
        if g + 1 < G:
            yield from check_record(f"{rp}.act_copy_s[{g}]", info["act_copy_s"][g], st["send_bytes"] / bw,
                              f"{w}.send_bytes {st['send_bytes']!r} B over {bw:.6g} B/s")
        yield from check_record(f"{w}.comm_s", st["comm_s"], info["act_copy_s"][g] if g + 1 < G else 0.0,
                          f"{rp}.act_copy_s[{g}]" if g + 1 < G else "the last group sends nothing")
        # the tied copy's weights and gradient, half each (pipesearch.roundpipe.plan_point)
        tied = parts["tied_copy"] / 2 if isinstance(parts.get("tied_copy"), (int, float)) else 0.0
        for key, part in (("weights_in_s", "weights"), ("grads_out_s", "gradients")):
            if isinstance(parts.get(part), (int, float)):
                plus = f" + tied_copy / 2 {tied!r} B" if tied else ""
                yield from check_record(f"{rp}.{key}[{g}]", info[key][g], (parts[part] + tied) / bw,
                                  f"{w}.memory_breakdown_bytes.{part} {parts[part]!r} B{plus} over {bw:.6g} B/s")
        if isinstance(parts.get("weights"), (int, float)) and "host_step_s" in st:
            params = parts["weights"] / WEIGHT_BYTES_PER_PARAM
            yield from check_record(f"{w}.host_step_s", st["host_step_s"], params / host.cpu_adam_params_per_s,
                              f"the CPU's Adam over {params:.6g} parameters at {host.cpu_adam_params_per_s:.6g}/s")
        yield from check_record(f"{w}.allreduce_s", st["allreduce_s"], 0.0 if delayed else st.get("host_step_s", 0.0),
                          "the delayed step runs beside the next iteration" if delayed else
                          f"{w}.host_step_s: the CPU's step after the iteration")


def _roundpipe_prediction(plan: dict, where: str) -> Iterator[Problem]:
    """The analytic time and the bubble of a RoundPipe plan (module docstring)."""
    stages, pp = plan["stages"], plan["parallelism"]["pp"]
    G = len(stages)
    pred = plan["predicted"]
    t = pred["iteration_time_s"]
    if "analytic_iteration_time_s" in pred:
        yield from check_record(f"{where}.predicted.analytic_iteration_time_s", pred["analytic_iteration_time_s"], t,
                          "RoundPipe's time is its graph's longest path, predicted.iteration_time_s")
    m = plan["schedule"]["num_micro_batches"]
    busy = [0.0] * pp
    for kind, g, d in roundpipe_tasks(G, pp):
        busy[d] += m * (stages[g]["fwd_s"] if kind == "F" else stages[g]["compute_s"])
    if t > 0:
        d = max(range(pp), key=lambda x: (busy[x], -x))
        mine = ",".join(dict.fromkeys(str(g) for kind, g, dd in roundpipe_tasks(G, pp) if dd == d))
        yield from check_record(f"{where}.predicted.bubble_fraction", pred["bubble_fraction"], max(0.0, 1 - busy[d] / t),
                          f"1 - the busiest GPU's compute / iteration_time_s {t!r} s: GPU {d} runs {busy[d]!r} s, "
                          f"{m} micro-batches of the tasks of stages {mine} at their fwd_s and compute_s")


def _mobius(plan: dict, where: str, inputs: dict) -> Iterator[Problem]:
    """A Mobius plan's copies out, CPU step at dp 1 and queues (module docstring)."""
    info, stages = plan["options"]["mobius"], plan["stages"]
    mb = f"{where}.options.mobius"
    delayed = (plan.get("options") or {}).get("optimizer_step") == "delayed"
    for k, st in enumerate(stages):
        yield from check_record(f"{mb}.swap_out_s[{k}]", info["swap_out_s"][k], info["swap_in_s"][k],
                          f"{mb}.swap_in_s[{k}]: one rate each way")
        if plan["parallelism"]["dp"] == 1 and "host_step_s" in st:  # no gradient all-reduce: the CPU's step alone
            yield from check_record(f"{where}.stages[{k}].allreduce_s", st["allreduce_s"],
                              0.0 if delayed else st["host_step_s"],
                              "the delayed step runs beside the next iteration" if delayed else
                              f"{where}.stages[{k}].host_step_s: dp 1, the CPU's step after the stage's backward")
    host = host_spec(inputs)
    if host is None:
        return
    per_node = len(host.pcie_switches)
    for r in range(plan["parallelism"]["pp"]):
        key = device_place(stages[r]["devices"][0], inputs["cluster"], host)
        if key is not None:
            yield from check_record(f"{mb}.pcie_queue[{r}]", info["pcie_queue"][r], key[0] * per_node + key[1],
                              f"the PCIe switch of rank {r}'s GPU {stages[r]['devices'][0]}: node {key[0]} x "
                              f"{per_node} switches + switch {key[1]}")


def record_problems(doc: dict) -> list[Problem]:
    """Every recorded GPU optimizer step, RoundPipe and Mobius copy and host
    term of a document that already passes
    :func:`pipesearch.plan.document_problems` and disagrees with its formula
    (module docstring), one per field; first, for
    a plan that uses the host, its ``options.host`` figures and the
    ``[host]`` table (:func:`pipesearch.schema.host_records.host_problems`)."""
    out: list[Problem] = []
    for k, plan in enumerate(doc["plans"]):
        name = plan["schedule"]["name"]
        first = list(host_problems(plan, f"plans[{k}]", doc["inputs"]))  # recorded fields before derived ones
        if first:
            out += first
        elif name == "roundpipe":
            out += _roundpipe(plan, f"plans[{k}]", doc["inputs"])
        elif name == "mobius":
            out += _mobius(plan, f"plans[{k}]", doc["inputs"])
        if not first:
            out += optimizer_step_problems(plan, f"plans[{k}]", doc["inputs"], job_param_state(doc["inputs"]["job"]))
    return out
