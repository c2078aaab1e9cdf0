"""The per-GPU memory of a Mobius or RoundPipe plan, recomputed from its stages.

Both schedules run more stages (layer groups) than GPUs and check memory per
GPU, not per stage: Mobius a GPU's stages' activations plus two stays'
weights and gradients (:func:`pipesearch.stage_options.swap_device_bytes`),
RoundPipe the peak over a GPU's task pairs
(:func:`pipesearch.roundpipe.device_peak_bytes`) and the node's host memory
(:func:`pipesearch.roundpipe.group_host_bytes`). The plan records those
figures (``options.mobius.device_peak_bytes``,
``options.roundpipe.device_peak_bytes`` and ``host_memory_bytes``); the
checks here recompute them from each stage's recorded bytes with the same
functions the search used and refuse a plan whose figure disagrees, that
does not fit, or whose ``predicted.peak_memory_bytes`` is not its largest
GPU peak (docs/offload.md, "What the outputs show").
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from . import REL_TOL, Problem, differs


def _usable_bytes(plan: dict, inputs: dict, gpus: int) -> np.ndarray | None:
    """``(gpus,)`` usable bytes of each of the plan's GPUs, ``capacity x (1 -
    memory_headroom_fraction) - memory_reserve_bytes``
    (:func:`pipesearch.memory.usable_memory_bytes`): Mobius' GPU ``r`` is its
    stage ``r``'s device type (stage ``s`` runs on GPU ``s % pp``; on a mixed
    cluster each GPU its own); RoundPipe's pool the smallest of its types.
    None when the inputs do not give the capacity."""
    capacity = inputs["cluster"].get("memory_bytes_per_device")
    if not isinstance(capacity, dict):
        return None
    types = [str(st.get("device_type", "")).split(",") for st in plan["stages"]]
    caps = [[capacity.get(t) for t in ts] for ts in types]
    if not caps or not all(isinstance(c, (int, float)) and not isinstance(c, bool) for cs in caps for c in cs):
        return None
    own = [min(cs) for cs in caps]
    per_gpu = np.array(own[:gpus] if plan["schedule"]["name"] == "mobius" and len(own) >= gpus else
                       [min(own)] * gpus, dtype=float)
    job = inputs["job"]
    return per_gpu * (1.0 - job.get("memory_headroom_fraction", 0.0)) - job.get("memory_reserve_bytes", 0.0)


def _breakdown(plan: dict, keys: tuple[str, ...]) -> list[dict] | None:
    """Each stage's ``memory_breakdown_bytes`` when every stage has numbers
    under ``keys``, else None."""
    out = [st.get("memory_breakdown_bytes") for st in plan["stages"]]
    ok = all(isinstance(b, dict) and all(isinstance(b.get(k), (int, float)) and not isinstance(b.get(k), bool)
                                         for k in keys) for b in out)
    return out if ok else None


def recomputed_peaks(plan: dict) -> tuple[str, np.ndarray | None] | None:
    """``(field, peaks)``: the option holding the plan's per-GPU peaks
    (``options.mobius.device_peak_bytes`` or
    ``options.roundpipe.device_peak_bytes``) and the ``(pp,)`` bytes
    recomputed from its stages, or ``(field, None)`` when a stage lacks the
    bytes needed; None for other schedules or a stage count that is not
    ``pp x vp`` (reported on its own).

    Mobius (stage ``s`` on GPU ``s % pp``): a stage's weights and gradients
    are its breakdown's ``swapped_buffers``, at
    :data:`pipesearch.stage_options.SWAP_DEVICE_BYTES_PER_PARAM_BYTE` per
    parameter byte; the rest of its ``memory_bytes`` (activations, tied
    copy, gathered weights) is held whatever the stay. RoundPipe: a group's
    ``weights`` (and half its ``tied_copy``, the tied matrix's 16-bit
    weights, on the last group) and ``activations`` (its computing task's
    transient bytes) over the plan's dispatch."""
    from ..roundpipe import device_peak_bytes
    from ..stage_options import SWAP_DEVICE_BYTES_PER_PARAM_BYTE, swap_device_bytes

    name, pp = plan["schedule"]["name"], plan["parallelism"]["pp"]
    if name not in ("mobius", "roundpipe") or len(plan["stages"]) != pp * plan["parallelism"]["vp"]:
        return None
    if name == "mobius":
        parts = _breakdown(plan, ("swapped_buffers",))
        if parts is None:
            return "options.mobius.device_peak_bytes", None
        wg = np.array([b["swapped_buffers"] for b in parts])
        own = np.array([st["memory_bytes"] for st in plan["stages"]]) - wg
        return "options.mobius.device_peak_bytes", swap_device_bytes(wg / SWAP_DEVICE_BYTES_PER_PARAM_BYTE, own, pp)
    parts = _breakdown(plan, ("weights", "activations"))
    if parts is None:
        return "options.roundpipe.device_peak_bytes", None
    weights = np.array([[b["weights"] + b.get("tied_copy", 0.0) / 2 for b in parts]])  # the last group's tied matrix
    transient = np.array([[b["activations"] for b in parts]])
    return "options.roundpipe.device_peak_bytes", device_peak_bytes(weights, transient, pp)[0]


def gpu_peak_problems(plan: dict, where: str, inputs: dict) -> Iterator[Problem]:
    """A Mobius or RoundPipe plan's recorded per-GPU peaks are the ones
    :func:`recomputed_peaks` gives, each within the GPUs' usable memory,
    ``predicted.peak_memory_bytes`` is the largest of them, and a RoundPipe
    plan's host memory is recomputed and within the node's (at most one
    problem)."""
    found = recomputed_peaks(plan)
    if found is None:
        return
    field, peaks = found
    option = field.split(".")[1]
    if peaks is None:
        need = "swapped_buffers" if option == "mobius" else "weights and activations"
        yield Problem(f"{where}.stages", f"every stage of a {option} plan needs memory_breakdown_bytes with {need} "
                                         f"so that {field} can be rechecked; re-plan with --schedule {option}")
        return
    recorded = ((plan.get("options") or {}).get(option) or {}).get("device_peak_bytes")
    if not (isinstance(recorded, list) and len(recorded) == len(peaks)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in recorded)):
        yield Problem(f"{where}.{field}", f"{recorded!r}: expected one number per GPU ({len(peaks)}), the peak "
                                          f"recomputed from the stages; re-plan with --schedule {option}")
        return
    for r, (rec, new) in enumerate(zip(recorded, peaks)):
        if differs(float(rec), float(new)):
            yield Problem(f"{where}.{field}[{r}]", f"{rec!r} B, but the stages' memory_bytes put GPU {r}'s peak at "
                                                   f"{float(new)!r} B; re-plan or fix the file")
            return
    usable = _usable_bytes(plan, inputs, len(peaks))
    worst = int(np.argmax(peaks))
    over = [] if usable is None else [r for r in range(len(peaks)) if float(peaks[r]) > usable[r] * (1 + REL_TOL)]
    if over:
        r = over[0]
        yield Problem(f"{where}.{field}[{r}]", f"{float(peaks[r])!r} B, more than the {usable[r]:.6g} B GPU {r} "
                                               "offers (capacity less headroom and reserve); the plan does not fit")
        return
    peak = plan["predicted"]["peak_memory_bytes"]
    if differs(float(peak), float(peaks[worst])):
        yield Problem(f"{where}.predicted.peak_memory_bytes", f"{peak!r}, but the largest GPU peak ({field}[{worst}]) "
                                                              f"is {float(peaks[worst])!r}; re-plan or fix the file")
        return
    if option == "roundpipe":
        yield from _roundpipe_host(plan, where, inputs)


def _roundpipe_host(plan: dict, where: str, inputs: dict) -> Iterator[Problem]:
    """RoundPipe: ``options.roundpipe.host_memory_bytes`` and each group's
    ``options.host.host_memory_bytes`` are :func:`pipesearch.roundpipe.group_host_bytes`
    of its parameters (its ``weights`` over
    :data:`pipesearch.roundpipe.WEIGHT_BYTES_PER_PARAM`), of its
    ``tied_copy``'s parameters (its 16-bit weights and gradients, 4 B a
    parameter) and of the boundaries' ``send_bytes``, and their sum is within the node's host
    memory (``inputs.cluster.host.memory_bytes``)."""
    from ..roundpipe import WEIGHT_BYTES_PER_PARAM, group_host_bytes

    stages = plan["stages"]
    params = np.array([[st["memory_breakdown_bytes"]["weights"] / WEIGHT_BYTES_PER_PARAM for st in stages]])
    tied = np.array([[st["memory_breakdown_bytes"].get("tied_copy", 0.0) / (2 * WEIGHT_BYTES_PER_PARAM)
                      for st in stages]])  # its 16-bit weights and gradients
    sends = [st.get("send_bytes", 0.0) for st in stages[:-1]]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in sends):
        return
    groups = group_host_bytes(params, np.array([sends]), plan["schedule"]["num_micro_batches"], tied)[0]
    options = plan.get("options") or {}
    per_group = (options.get("host") or {}).get("host_memory_bytes")
    if isinstance(per_group, list) and len(per_group) == len(groups):
        for g, (rec, new) in enumerate(zip(per_group, groups)):
            if isinstance(rec, (int, float)) and differs(float(rec), float(new)):
                yield Problem(f"{where}.options.host.host_memory_bytes[{g}]",
                              f"{rec!r} B, but group {g}'s parameters and saved inputs take {float(new)!r} B; "
                              "re-plan or fix the file")
                return
    total = (options.get("roundpipe") or {}).get("host_memory_bytes")
    if not isinstance(total, (int, float)) or isinstance(total, bool) or differs(float(total), float(groups.sum())):
        yield Problem(f"{where}.options.roundpipe.host_memory_bytes",
                      f"{total!r} B, but the groups' parameters and saved inputs take {float(groups.sum())!r} B; "
                      "re-plan or fix the file")
        return
    table = inputs["cluster"].get("host")
    host = table.get("memory_bytes") if isinstance(table, dict) else None  # a hand-edited table may be anything
    if isinstance(host, (int, float)) and not isinstance(host, bool) and float(total) > host * (1 + REL_TOL):
        yield Problem(f"{where}.options.roundpipe.host_memory_bytes",
                      f"{float(total)!r} B, more than the node's {host:.6g} B of host memory "
                      "(inputs.cluster.host.memory_bytes); the plan does not fit")
