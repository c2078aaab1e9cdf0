"""A plan's optimizer steps on the GPU, ``stages[s].optimizer_step_s``,
recomputed from the document's inputs (the rules of
:meth:`pipesearch.costs.PipelineCosts.device_step_s`):

* a stage whose ``memory_option`` keeps the optimizer state in host memory
  (``offload``, ``stream``, ``swap``, ``roundpipe``) steps there, its
  ``host_step_s``: its ``optimizer_step_s`` is 0;
* any other stage steps on its GPUs: the parameters one of its devices
  holds (``memory_breakdown_bytes.weights`` over the weight bytes a replica
  keeps per parameter, plus ``tied_copy`` over the state bytes per
  parameter) times the bytes the step streams per parameter it updates and
  the share it updates (:attr:`pipesearch.memory.ParamState.step_bytes_per_param`,
  :meth:`~pipesearch.memory.ParamState.update_share`), over the streaming
  bandwidth of the stage's slowest device
  (``inputs.cluster.groups[g].hbm_bandwidth_bytes_per_s`` times
  :data:`pipesearch.types.STREAMING_BANDWIDTH_FRACTION`);
* its ``allreduce_s`` (what follows its last backward) holds it.

Files written before the step was timed record neither the field (read as
0) nor the groups' bandwidth: nothing is recomputed for them.
"""

from __future__ import annotations

from typing import Iterator

from ..memory import ParamState
from ..types import STREAMING_BANDWIDTH_FRACTION
from . import Problem, check_record

#: memory options whose optimizer state lives in host memory (their step is ``host_step_s``)
HOST_STEP_OPTIONS = ("offload", "stream", "swap", "roundpipe")


def group_values(devices, cluster: dict, key: str) -> list:
    """``inputs.cluster.groups[g][key]`` of the group of each device id in
    ``devices`` (None where no group holds the id or gives the key)."""
    groups = [g for g in cluster.get("groups") or () if isinstance(g, dict)
              and isinstance(g.get("first_device"), int) and isinstance(g.get("last_device"), int)]
    return [next((g.get(key) for g in groups if g["first_device"] <= d <= g["last_device"]), None) for d in devices]


def stage_streaming_bandwidth(devices, cluster: dict) -> float | None:
    """The streaming memory bandwidth of the slowest of ``devices`` (bytes/s),
    None where a group does not record its ``hbm_bandwidth_bytes_per_s``."""
    found = group_values(devices, cluster, "hbm_bandwidth_bytes_per_s")
    if not found or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in found):
        return None
    return min(found) * STREAMING_BANDWIDTH_FRACTION


def device_step_s(stage: dict, state: ParamState, dp: int, cluster: dict) -> float | None:
    """The recomputed GPU step of one stage record whose state stays on
    its devices (module docstring); None where the record or the cluster
    lacks a figure it needs."""
    parts = stage.get("memory_breakdown_bytes") or {}
    weights, tied = parts.get("weights"), parts.get("tied_copy", 0.0)
    per_param = state.breakdown_per_param(dp)
    bandwidth = stage_streaming_bandwidth(stage["devices"], cluster)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (weights, tied)) \
            or per_param["weights"] <= 0 or bandwidth is None:
        return None
    params = weights / per_param["weights"] + tied / state.bytes_per_param(dp)
    return params * state.step_bytes_per_param * state.update_share(dp) / bandwidth


def optimizer_step_problems(plan: dict, where: str, inputs: dict, state: ParamState | None) -> Iterator[Problem]:
    """At most one problem: the first stage whose ``optimizer_step_s`` is
    not the recomputed one, or is not within its ``allreduce_s``; ``state``:
    the job's training state (None: not recomputed)."""
    ranks = len({tuple(st["devices"]) for st in plan["stages"]})
    state = None if state is None else state.in_pipeline(ranks)
    for k, st in enumerate(plan["stages"]):
        w = f"{where}.stages[{k}]"
        found = st.get("optimizer_step_s", 0.0)
        if isinstance(found, (int, float)) and found > st["allreduce_s"] * (1 + 1e-9) + 1e-300:
            yield Problem(f"{w}.optimizer_step_s", f"{found!r} found, more than its allreduce_s {st['allreduce_s']!r} "
                                                   "that holds it; re-plan, or restore the field")
            return
        if "optimizer_step_s" not in st or state is None:
            continue
        option = set(str(st.get("memory_option", "")).split("+"))
        if option & set(HOST_STEP_OPTIONS) or plan["schedule"]["name"] in ("mobius", "roundpipe"):
            expected, why = 0.0, f"{w}.memory_option {st.get('memory_option')!r} steps in host memory"
        else:
            dp = st.get("replicas") or plan["parallelism"]["dp"]
            expected = device_step_s(st, state, dp, inputs["cluster"])
            if expected is None:
                continue
            why = (f"the {state.step_bytes_per_param:g} bytes a parameter's step streams over the stage's memory, "
                   f"for its share {state.update_share(dp):g} of the parameters it holds")
        problems = list(check_record(f"{w}.optimizer_step_s", found, expected, why))
        if problems:
            yield problems[0]
            return
