"""The checks of a plan document that a JSON Schema cannot express.

Run on a document that already follows the schema (:mod:`pipesearch.schema`),
:func:`semantic_problems` checks every plan against the document's own
inputs:

* its stages cover exactly the model's layers (``inputs.model.num_layers``),
  contiguously, each with at least one layer, in index order, with one layer
  name per layer, and there are ``pp x vp`` of them;
* every stage lists ``dp`` device ids (one per data-parallel replica), or,
  under per-stage replication (every stage has ``replicas``; ``dp`` and
  ``vp`` are 1), its ``replicas`` device ids, so that the sum of the
  replicas times ``tp`` devices are used; every
  id, with its tensor-parallel group ``id .. id + tp - 1``, exists in the
  cluster (``inputs.cluster.devices``); the virtual stages of one pipeline
  slot (stages ``s``, ``s + pp``, ...) run on the same devices and different
  slots on different devices, so that ``pp x dp x tp`` devices are used and
  fit the cluster; a stage's ``device_type`` names its devices' types where
  ``inputs.cluster.groups`` says which ids hold which type (and lays the
  ids out node by node, from 0 to ``devices - 1``);
* ``micro_batch_size x num_micro_batches x dp`` is the global batch
  (``inputs.job.global_batch_size``);
* every stage's forward time ``fwd_s`` is part of its ``compute_s`` and its
  input-gradient time ``bwd_input_s`` part of the backward time
  ``compute_s - fwd_s``;
* the schedule's builder (:func:`pipesearch.schedules.check`) accepts
  ``pp``, ``vp`` and ``num_micro_batches`` (at most
  :data:`MAX_STAGE_MICRO_BATCHES` stage micro-batches), so the simulator can
  replay it;
* ``inputs.job.zero1`` agrees with ``optimizer_state.sharding`` (true for
  every sharding but ``none``), and without communication overlap
  (``comm_overlap`` grad_reduce and param_gather false) every stage's
  ``allreduce_s`` is at least its ``dp_comm_s`` (nothing hides it);
* every stage's ``memory_bytes`` is the sum of its breakdown, and the
  stages one device runs fit its device type's usable memory together,
  ``predicted.peak_memory_bytes`` lies between the largest of them and the
  largest sum of one device's (virtual) stages, and
  ``predicted.samples_per_s`` the global batch over the iteration time;
* a Mobius or RoundPipe plan's per-GPU peaks (and RoundPipe's host memory)
  are those its stages give, within capacity, and its predicted peak is
  their largest (:mod:`pipesearch.schema.gpu_peaks`);
* plan ranks do not repeat, follow the iteration time (up to the 0.1 % tie
  window of the ranking) and agree on every layer's name;
* the points table (``search.points``), when present, has one value per
  column in every row (by-row ``data``) or one list per column, all of one
  length (by-column ``values``, not both), and its known columns hold what the search writes:
  degrees and micro-batch figures integers >= 1, times, rates and sizes
  numbers >= 0, schedules known names, texts strings (any of them may be
  null for a point that was not evaluated); a point of status ``ok`` has
  the throughput of its time (and, once the plans replay, is no faster than
  plan 1: :func:`points_against_plans`).
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from ..errors import InputError
from ..limits import MAX_BYTES, MAX_PLAN_S, MAX_SAMPLES_PER_S
from ..schedules import check
from ..stage_options import offloads_activations
from ..types import SCHEDULES, mfu_peak_flops
from . import Problem, show
from .gpu_peaks import gpu_peak_problems
from .optimizer_steps import group_values


def _coverage(plan: dict, where: str, num_layers: int) -> Iterator[Problem]:
    stages = plan["stages"]
    names: list[Problem] = []
    expect = 0
    for k, st in enumerate(stages):
        w = f"{where}.stages[{k}]"
        if st["index"] != k:
            yield Problem(f"{w}.index", f"{st['index']}, expected {k} (stages are listed in pipeline order)")
        first, end = st["layers"]
        if first != expect:
            before = "the first stage must start at layer 0" if k == 0 else (
                f"stages[{k - 1}] ends at layer {expect}, so this stage must start there")
            yield Problem(f"{w}.layers", f"{[first, end]} starts at layer {first}; {before} "
                                         "(half-open [first, last + 1], stages cover the layers contiguously)")
            return
        if end <= first:
            yield Problem(f"{w}.layers", f"{[first, end]} holds no layer; a stage needs at least one "
                                         "(half-open [first, last + 1])")
            return
        if len(st["layer_names"]) != end - first:
            names.append(Problem(f"{w}.layer_names", f"{len(st['layer_names'])} names for the {end - first} layers "
                                              f"{[first, end]}; give one name per layer"))
        expect = end
    if expect != num_layers:
        yield Problem(f"{where}.stages[{len(stages) - 1}].layers",
                      f"{stages[-1]['layers']} ends at layer {expect} but the model has {num_layers} layers "
                      f"(inputs.model.num_layers); the last stage must end at {num_layers}")
    yield from names


def _devices(plan: dict, where: str, num_devices: int) -> Iterator[Problem]:
    par = plan["parallelism"]
    pp, dp, tp = par["pp"], par["dp"], par["tp"]
    if pp * dp * tp > num_devices:
        yield Problem(f"{where}.parallelism", _too_many_devices(pp, dp, tp, num_devices))
        return
    replicated = [st.get("replicas") for st in plan["stages"]]
    if any(r is not None for r in replicated):
        problem = _replicas(plan, where, replicated, num_devices)
        if problem is not None:
            yield problem
            return
    owner: dict[int, int] = {}  # device id -> pipeline slot using it
    for k, st in enumerate(plan["stages"]):
        w = f"{where}.stages[{k}].devices"
        devices = st["devices"]
        if replicated[k] is not None and len(devices) != replicated[k]:
            yield Problem(w, f"{devices} lists {len(devices)} device id(s) but the stage's replicas is "
                             f"{replicated[k]} (one id per replica)")
            return
        if replicated[k] is None and len(devices) != dp:
            yield Problem(w, f"{devices} lists {len(devices)} device id(s) but parallelism.dp is {dp} "
                             "(one id per data-parallel replica)")
            return
        for d in devices:
            if d + tp > num_devices:
                group = f"device {d} does" if tp == 1 else f"devices {d} .. {d + tp - 1} (tp {tp}) do"
                yield Problem(w, f"{devices}: {group} not exist; the cluster (inputs.cluster.devices) "
                                 f"has {num_devices} devices, ids 0 .. {num_devices - 1}")
                return
        slot = k % pp
        if k >= pp:
            base = plan["stages"][slot]["devices"]
            if devices != base:
                yield Problem(w, f"{devices} differs from stages[{slot}].devices {base}: virtual stage {k} "
                                 f"runs on the devices of pipeline slot {slot} (vp {par['vp']})")
            continue
        for d in devices:
            for used in range(d, d + tp):
                if used in owner:
                    other = owner[used]
                    what = "stage" if other == slot else f"stages[{other}]"
                    yield Problem(w, f"{devices}: device {used} already serves {what}"
                                     f"{'' if tp == 1 else f' (tp {tp} groups overlap)'}; "
                                     "each device serves one pipeline stage and one replica")
                    return
                owner[used] = slot


def _replicas(plan: dict, where: str, replicas: list, num_devices: int) -> Problem | None:
    """Per-stage replication: every stage has ``replicas``, ``dp`` and
    ``vp`` are 1, and the sum of the replicas times ``tp`` fits the cluster."""
    par = plan["parallelism"]
    if None in replicas:
        k = replicas.index(None)
        return Problem(f"{where}.stages[{k}]", "has no replicas but other stages have; under per-stage "
                                               "replication give every stage its replicas")
    if par["dp"] != 1 or par["vp"] != 1:
        return Problem(f"{where}.parallelism", f"dp {par['dp']}, vp {par['vp']} with per-stage replicas; "
                                               "replicated stages take dp 1 and vp 1")
    used = sum(replicas) * par["tp"]
    if used > num_devices:
        return Problem(f"{where}.stages", f"replicas {','.join(map(str, replicas))} x tp {par['tp']} = {used} "
                                          f"devices, but the cluster (inputs.cluster.devices) has {num_devices}")
    return None


def _device_types(plan: dict, where: str, cluster: dict) -> Iterator[Problem]:
    """Each stage's ``device_type`` names the types of its devices, as
    ``inputs.cluster.groups`` (when given) places them."""
    groups = cluster.get("groups")
    if not isinstance(groups, list) or not all(
            isinstance(g, dict) and isinstance(g.get("device"), str) and isinstance(g.get("first_device"), int)
            and isinstance(g.get("last_device"), int) for g in groups):
        return
    def type_of(d: int) -> str | None:
        return next((g["device"] for g in groups if g["first_device"] <= d <= g["last_device"]), None)
    for k, st in enumerate(plan["stages"]):
        types = [type_of(d) for d in st["devices"]]
        if None in types:
            return  # a device outside every group: _devices names it
        expected = ",".join(dict.fromkeys(types))
        if st["device_type"] != expected:
            yield Problem(f"{where}.stages[{k}].device_type", f"{st['device_type']!r}, but devices {st['devices']} "
                                                              f"are {expected!r} (inputs.cluster.groups)")
            return


def _batch(plan: dict, where: str, batch: int) -> Iterator[Problem]:
    sch, dp = plan["schedule"], plan["parallelism"]["dp"]
    mbs, m = sch["micro_batch_size"], sch["num_micro_batches"]
    if mbs * m * dp != batch:
        yield Problem(f"{where}.schedule", f"micro_batch_size {mbs} x num_micro_batches {m} x dp {dp} = "
                                           f"{mbs * m * dp}, but inputs.job.global_batch_size is {batch}")


#: relative slack of the consistency checks between a plan's own numbers
#: (they are sums and quotients of the same floats, written to 17 digits)
REL_TOL = 1e-9


def _above(value: float, limit: float) -> bool:
    """``value > limit`` beyond rounding (:data:`REL_TOL`)."""
    return value > limit + REL_TOL * abs(limit) + 1e-300


def _times(plan: dict, where: str) -> Iterator[Problem]:
    for k, st in enumerate(plan["stages"]):
        w = f"{where}.stages[{k}]"
        # three fields of one stage disagree: any of them may be the edited one, so the message names all three
        if _above(st["fwd_s"], st["compute_s"]):
            yield Problem(w, f"fwd_s {st['fwd_s']!r} is more than compute_s {st['compute_s']!r} (compute_s is "
                             "forward plus backward time); restore the file or plan again")
        elif _above(st["bwd_input_s"], st["compute_s"] - st["fwd_s"]):
            yield Problem(w, f"bwd_input_s {st['bwd_input_s']!r} is more than the backward time compute_s - fwd_s = "
                             f"{st['compute_s']!r} - {st['fwd_s']!r} = {st['compute_s'] - st['fwd_s']!r} (it is the "
                             "input-gradient part of the backward); restore the file or plan again")


#: (virtual) stages x micro-batches of one plan beyond which it is not replayed (each is a few actions)
MAX_STAGE_MICRO_BATCHES = 2**24


def _schedule(plan: dict, where: str) -> Iterator[Problem]:
    par, sch = plan["parallelism"], plan["schedule"]
    size = par["pp"] * par["vp"] * sch["num_micro_batches"]
    if size > MAX_STAGE_MICRO_BATCHES:
        yield Problem(f"{where}.schedule", f"pp {par['pp']} x vp {par['vp']} x num_micro_batches "
                                           f"{sch['num_micro_batches']} = {size} stage micro-batches, more than the "
                                           f"{MAX_STAGE_MICRO_BATCHES} a schedule is built for")
        return
    if sch["name"] == "roundpipe":  # not an action list: its tasks are checked by _roundpipe
        return
    try:
        check(sch["name"], par["pp"], sch["num_micro_batches"], par["vp"])
    except InputError as exc:
        yield Problem(f"{where}.schedule", f"{sch['name']} cannot run pp {par['pp']} x vp {par['vp']} with "
                                           f"{sch['num_micro_batches']} micro-batches ({exc})")


def _mobius(plan: dict, where: str) -> Iterator[Problem]:
    """A Mobius plan records its copies (``options.mobius``: per stage its
    ``swap_in_s`` and ``swap_out_s``, per rank its ``pcie_queue``), which
    its replay needs (:func:`pipesearch.timemodel.stage_times_of`)."""
    if plan["schedule"]["name"] != "mobius":
        return
    info = (plan.get("options") or {}).get("mobius")
    S, pp = len(plan["stages"]), plan["parallelism"]["pp"]
    bad = _list_problem(info, f"{where}.options.mobius", (("swap_in_s", S, "stage"), ("swap_out_s", S, "stage"),
                                                          ("pcie_queue", pp, "rank")), "mobius")
    if bad is not None:
        yield bad
        return
    if "act_host" in info:  # the stages whose activations are in host memory (per stage, docs/offload.md)
        act = info["act_host"]
        named = [("act-host" in str(st.get("memory_option", "")).split("+")) for st in plan["stages"]]
        if not (isinstance(act, list) and len(act) == S and all(isinstance(x, bool) for x in act)
                and "act_copy_s" in info):
            yield Problem(f"{where}.options.mobius.act_host", f"{show(act)} found, one true/false per stage ({S}) "
                                                              "beside act_copy_s expected; re-plan with --schedule "
                                                              "mobius")
        elif act != named:
            k = next(n for n, (a, b) in enumerate(zip(act, named)) if a != b)
            yield Problem(f"{where}.options.mobius.act_host[{k}]",
                          f"{act[k]} found, {named[k]} expected (stages[{k}].memory_option is "
                          f"{plan['stages'][k].get('memory_option')!r}; swap+act-host keeps activations in host "
                          "memory); re-plan or fix the file")


def _roundpipe(plan: dict, where: str) -> Iterator[Problem]:
    """A RoundPipe plan records its tasks and copies (``options.roundpipe``:
    ``tasks``, ``[kind, group, gpu]`` for each of the ``2G - 1`` tasks in
    dispatch order; ``act_copy_s`` per boundary, ``weights_in_s`` and
    ``grads_out_s`` per group, ``pcie_scale`` per GPU), which its replay
    needs (:func:`pipesearch.timemodel.stage_times_of`)."""
    if plan["schedule"]["name"] != "roundpipe":
        return
    info = (plan.get("options") or {}).get("roundpipe")
    G, pp = len(plan["stages"]), plan["parallelism"]["pp"]
    bad = _list_problem(info, f"{where}.options.roundpipe", (
        ("act_copy_s", G - 1, "boundary"), ("weights_in_s", G, "group"), ("grads_out_s", G, "group"),
        ("pcie_scale", pp, "GPU")), "roundpipe")
    if bad is not None:
        yield bad
        return
    from ..schedules import roundpipe_tasks
    tasks, want = info.get("tasks"), [list(t) for t in roundpipe_tasks(G, pp)]
    if not isinstance(tasks, list) or len(tasks) != len(want):
        yield Problem(f"{where}.options.roundpipe.tasks", f"{_length(tasks)} found, {len(want)} tasks ([kind, "
                                                          f"group, gpu], 2 x {G} groups - 1) expected; re-plan with "
                                                          "--schedule roundpipe")
    elif tasks != want:
        t = next(n for n, (a, b) in enumerate(zip(tasks, want)) if a != b)
        yield Problem(f"{where}.options.roundpipe.tasks[{t}]",
                      f"{show(tasks[t])} found, {show(want[t])} expected (forwards of the {G} groups, the last "
                      f"group's fused task, then backwards, round robin over {pp} GPUs); re-plan with --schedule "
                      "roundpipe")


def _length(x) -> str:
    return f"{len(x)} entries" if isinstance(x, list) else show(x)


def _list_problem(info, where: str, keys, schedule: str) -> Problem | None:
    """The first of ``keys`` (``(key, length, per what)``) of ``info`` that is
    not a list of that many numbers >= 0, as a problem naming the key (or the
    entry), what was found and what was expected."""
    if not isinstance(info, dict):
        return Problem(where, f"{show(info)} found, an object with "
                              f"{', '.join(k for k, _, _ in keys)} expected; re-plan with --schedule {schedule}")
    for key, n, per in keys:
        x = info.get(key)
        if not isinstance(x, list) or len(x) != n:
            return Problem(f"{where}.{key}", f"{_length(x)} found, {n} numbers >= 0 (one per {per}) expected; "
                                             f"re-plan with --schedule {schedule}")
        for k, v in enumerate(x):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
                return Problem(f"{where}.{key}[{k}]", f"{show(v)} found, a number >= 0 expected; re-plan with "
                                                      f"--schedule {schedule}")
    return None


def _memory_options(plan: dict, where: str) -> Iterator[Problem]:
    """Each stage's ``memory_option`` belongs to its schedule: every stage of
    a RoundPipe plan is ``roundpipe`` (:mod:`pipesearch.roundpipe`), every
    stage of a Mobius plan ``swap`` or ``swap+act-host``
    (:func:`pipesearch.stage_options.swap_options`), and no other
    schedule's stage takes either (docs/offload.md)."""
    schedule = plan["schedule"]["name"]
    allowed = {"roundpipe": ("roundpipe",), "mobius": ("swap", "swap+act-host")}.get(schedule)
    for k, st in enumerate(plan["stages"]):
        option = str(st.get("memory_option", ""))
        foreign = option == "roundpipe" or option.split("+")[0] == "swap"
        if (option not in allowed) if allowed else foreign:
            want = " or ".join(repr(x) for x in allowed) if allowed else "an option of its own schedule"
            yield Problem(f"{where}.stages[{k}].memory_option",
                          f"{option!r} under schedule {schedule}: expected {want}; re-plan or fix the file")
            return


def _activation_offload(plan: dict, where: str) -> Iterator[Problem]:
    """A stage whose ``memory_option`` keeps its activations in host memory
    (``act-host``) has them in ``options.host``: a positive
    ``activation_pcie_bytes_per_iteration`` and
    ``activation_host_memory_bytes`` within its ``host_memory_bytes``
    (:func:`pipesearch.option_search.host_plan_info`); other stages move
    none."""
    stages = plan["stages"]
    offloading = [k for k, st in enumerate(stages) if offloads_activations(st.get("memory_option", ""))]
    info = (plan.get("options") or {}).get("host") or {}
    moved, held = info.get("activation_pcie_bytes_per_iteration"), info.get("activation_host_memory_bytes")
    if not offloading and moved is None:
        return
    total = info.get("host_memory_bytes")
    if not all(isinstance(x, list) and len(x) == len(stages) for x in (moved, held, total)):
        yield Problem(f"{where}.options.host", f"stages {','.join(map(str, offloading))} keep their activations "
                                               "in host memory but options.host lacks activation_pcie_bytes_per_"
                                               f"iteration, activation_host_memory_bytes or host_memory_bytes (one "
                                               f"per stage, {len(stages)}); re-plan with --activation-offload")
        return
    for k in range(len(stages)):
        if (moved[k] > 0) != (k in offloading) or _above(held[k], total[k] * (1 + 1e-9)):
            yield Problem(f"{where}.options.host.activation_pcie_bytes_per_iteration[{k}]",
                          f"{moved[k]!r} B moved and {held[k]!r} B held for stage {k} with memory_option "
                          f"{stages[k].get('memory_option', '')!r} (host memory {total[k]!r} B): an act-host stage "
                          "moves activations and holds at most its host memory, other stages move none")
            return


def plan_problems(plan: dict, where: str, inputs: dict) -> list[Problem]:
    """What is wrong with one schema-valid plan object, judged against the
    document's ``inputs`` (at most one problem per kind of check)."""
    out: list[Problem] = []
    stages, par = plan["stages"], plan["parallelism"]
    if len(stages) != par["pp"] * par["vp"]:
        out.append(Problem(f"{where}.stages", f"{len(stages)} stages but pp x vp = {par['pp']} x {par['vp']} = "
                                              f"{par['pp'] * par['vp']}"))
    out += _coverage(plan, where, inputs["model"]["num_layers"])
    out += _devices(plan, where, inputs["cluster"]["devices"])
    out += _device_types(plan, where, inputs["cluster"])
    out += _batch(plan, where, inputs["job"]["global_batch_size"])
    out += _times(plan, where)
    out += _memory(plan, where, inputs)
    out += _predicted(plan, where, inputs["job"]["global_batch_size"])
    out += _tensor_parallel(plan, where, inputs["model"], inputs["cluster"])
    out += _rates(plan, where, inputs)
    out += _capacity(plan, where, inputs["cluster"])
    out += _schedule(plan, where)
    out += _mobius(plan, where)
    out += _roundpipe(plan, where)
    out += _activation_offload(plan, where)
    out += _memory_options(plan, where)
    out += _overlap(plan, where, inputs["job"])
    out += gpu_peak_problems(plan, where, inputs)
    return out


def _memory(plan: dict, where: str, inputs: dict) -> Iterator[Problem]:
    """Every stage's ``memory_bytes`` is the sum of its
    ``memory_breakdown_bytes`` (when given); the stages one device runs fit
    its usable memory together, ``capacity x (1 - memory_headroom_fraction)
    - memory_reserve_bytes`` (:func:`pipesearch.memory.usable_memory_bytes`;
    a Mobius plan swaps its stages in and out, so each alone), where the
    inputs give the capacity; ``predicted.peak_memory_bytes`` lies between
    the largest stage and the largest sum of one device's stages (the
    simultaneous peak of interleaved schedules)."""
    stages = plan["stages"]
    for k, st in enumerate(stages):
        parts = st.get("memory_breakdown_bytes")
        if isinstance(parts, dict) and parts and all(isinstance(v, (int, float)) for v in parts.values()):
            total = sum(parts.values())
            if _above(abs(total - st["memory_bytes"]), 1e-6 * max(total, st["memory_bytes"])):
                yield Problem(f"{where}.stages[{k}].memory_bytes", f"{st['memory_bytes']!r}, but its "
                                                                   f"memory_breakdown_bytes add up to {total!r}; "
                                                                   "restore the file or plan again")
                return
    pp = plan["parallelism"]["pp"]
    if not stages or len(stages) != pp * plan["parallelism"]["vp"]:
        return  # the stage count is reported on its own
    swapped = plan["schedule"]["name"] in ("mobius", "roundpipe")
    groups = [[k] for k in range(len(stages))] if swapped else [list(range(r, len(stages), pp)) for r in range(pp)]
    capacity = inputs["cluster"].get("memory_bytes_per_device")
    job = inputs["job"]
    headroom, reserve = job.get("memory_headroom_fraction", 0.0), job.get("memory_reserve_bytes", 0.0)
    if isinstance(capacity, dict) and all(isinstance(v, (int, float)) for v in capacity.values()):
        for group in groups:
            first = stages[group[0]]
            cap = capacity.get(first["device_type"].split(",")[0])
            if not isinstance(cap, (int, float)):
                continue
            usable = cap * (1.0 - headroom) - reserve
            total = sum(stages[k]["memory_bytes"] for k in group)
            if usable <= 0:  # the capacity (or its headroom and reserve) is the edit, not the stage
                yield Problem(f"inputs.cluster.memory_bytes_per_device.{first['device_type'].split(',')[0]}",
                              f"{cap!r} B, which leaves nothing after the headroom {headroom:g} and the reserve "
                              f"{reserve:.6g} B (inputs.job); no stage fits such a device")
                return
            if _above(total, usable):
                which = (f"stages {','.join(map(str, group))} of devices {first['devices']} hold" if len(group) > 1
                         else f"stage {group[0]} holds")
                yield Problem(f"{where}.stages[{group[0]}].memory_bytes",
                              f"{which} {total!r} B, more than the {usable:.6g} B one {first['device_type']} "
                              f"device offers (capacity {cap:.6g} B, headroom {headroom:g}, reserve {reserve:.6g} B); "
                              "the plan does not fit")
                return
    peak, largest = plan["predicted"]["peak_memory_bytes"], max(st["memory_bytes"] for st in stages)
    per_rank = max(sum(st["memory_bytes"] for st in stages[r::pp]) for r in range(pp))
    if plan["schedule"]["name"] == "roundpipe":  # a GPU holds the group computing and the next one's weights
        per_rank = sum(sorted(st["memory_bytes"] for st in stages)[-2:])
    if _above(largest, peak) or _above(peak, per_rank):
        yield Problem(f"{where}.predicted.peak_memory_bytes",
                      f"{peak!r}, but the stages' memory_bytes put a device's peak between {largest!r} (the largest "
                      f"stage) and {per_rank!r} (the largest sum of the stages one device runs)")


def _predicted(plan: dict, where: str, batch: int) -> Iterator[Problem]:
    """``predicted.samples_per_s`` is the global batch over the iteration time."""
    pred = plan["predicted"]
    t = pred["iteration_time_s"]
    if t > 0 and _above(abs(pred["samples_per_s"] - batch / t), REL_TOL * batch / t):
        yield Problem(f"{where}.predicted.samples_per_s", f"{pred['samples_per_s']!r}, but global batch {batch} / "
                                                          f"iteration_time_s {t!r} = {batch / t!r}; restore the "
                                                          "file or plan again")


def _rates(plan: dict, where: str, inputs: dict) -> Iterator[Problem]:
    """The derived figures of ``predicted`` (where recorded) follow from the
    plan's own time and inputs: ``num_devices`` is ``tp`` x the distinct
    stage devices, ``peak_flops`` ``tp`` x their groups' MFU peaks (:func:`_device_peaks`),
    ``tokens_per_iteration`` the global batch x ``inputs.model.seq_len`` (a
    decoder), each unless 0 (unknown: a profile without tokens), and
    ``tokens_per_s``, ``tokens_per_s_per_device`` and ``mfu`` are
    :class:`pipesearch.types.Prediction`'s (PaLM's MFU, Chowdhery et al.
    2022, Appendix B), at most 1."""
    from ..types import Prediction

    pred, tp = plan["predicted"], plan["parallelism"]["tp"]
    heads = sorted({d for st in plan["stages"] for d in st["devices"]})
    peaks = _device_peaks(heads, inputs["cluster"])
    transformer = inputs["model"].get("transformer")
    decoder = isinstance(transformer, dict) and transformer.get("kind") == "decoder"
    seq = inputs["model"].get("seq_len")
    expected = {"num_devices": tp * len(heads)}
    if peaks is not None:
        expected["peak_flops"] = float(tp * sum(peaks))
    if decoder and isinstance(seq, int):
        expected["tokens_per_iteration"] = float(inputs["job"]["global_batch_size"] * seq)
    terms = ("tokens_per_iteration", "model_flops_per_iteration", "peak_flops", "num_devices")
    if all(isinstance(pred.get(k), (int, float)) and not isinstance(pred.get(k), bool) for k in terms):
        p = Prediction(pred["iteration_time_s"], 0.0, 0.0, 0.0, 0.0, **{k: pred[k] for k in terms})
        expected.update({"tokens_per_s": p.tokens_per_s, "tokens_per_s_per_device": p.tokens_per_s_per_device,
                         "mfu": p.mfu})
    for key, want in expected.items():
        found = pred.get(key)
        if want is None and found is not None and key in ("tokens_per_s", "tokens_per_s_per_device", "mfu"):
            yield Problem(f"{where}.predicted.{key}", f"{show(found)} found, null expected (the plan's "
                                                      "tokens_per_iteration or model_flops_per_iteration is 0: a "
                                                      "profile without tokens has no such rate); restore the field")
            return
        if found is None or want is None or (found == 0 and key in terms):  # 0: unknown (a profile without tokens)
            continue
        if not isinstance(found, (int, float)) or _above(abs(found - want), REL_TOL * abs(want)):
            yield Problem(f"{where}.predicted.{key}", f"{show(found)} found, {want!r} expected (from the plan's "
                                                      f"iteration_time_s {pred['iteration_time_s']!r} s, "
                                                      f"{tp * len(heads)} devices and its inputs); re-plan, or "
                                                      "restore the field")
            return
    if isinstance(pred.get("mfu"), (int, float)) and pred["mfu"] > 1:
        yield Problem(f"{where}.predicted.mfu", f"{pred['mfu']!r}: more than 1 (the devices' peak); re-plan")


def _capacity(plan: dict, where: str, cluster: dict) -> Iterator[Problem]:
    """``predicted.memory_capacity_bytes`` is the memory of one of the
    plan's devices (its peak device's, as ``inputs.cluster.groups`` give
    them; unchecked where the groups do not say)."""
    found = plan["predicted"].get("memory_capacity_bytes")
    groups = cluster.get("groups")
    if not isinstance(found, (int, float)) or not isinstance(groups, list):
        return
    heads = {d for st in plan["stages"] for d in st["devices"]}
    sizes = {g["memory_bytes"] for g in groups if isinstance(g, dict) and isinstance(g.get("memory_bytes"), (int, float))
             and isinstance(g.get("first_device"), int) and isinstance(g.get("last_device"), int)
             and any(g["first_device"] <= d <= g["last_device"] for d in heads)}
    if sizes and not any(abs(found - size) <= REL_TOL * size for size in sizes):
        listed = ", ".join(f"{size:.6g}" for size in sorted(sizes))
        yield Problem(f"{where}.predicted.memory_capacity_bytes", f"{show(found)} found, the memory of one of the "
                                                                  f"plan's devices expected ({listed} B); re-plan, "
                                                                  "or restore the field")


def _tensor_parallel(plan: dict, where: str, model: dict, cluster: dict) -> Iterator[Problem]:
    """``parallelism.tp`` divides the heads, KV heads and MLP width of the
    model the inputs name (Megatron-LM splits them evenly,
    :func:`pipesearch.profiles.transformer.layer_table`), and is the degree
    the stages were timed for where ``predicted.num_devices`` and
    ``peak_flops`` both say another one (``num_devices`` over the distinct
    stage devices)."""
    tp, cfg = plan["parallelism"]["tp"], model.get("transformer")
    if not isinstance(cfg, dict):
        cfg = model
    for key in ("num_attention_heads", "num_kv_heads", "ffn_hidden_size"):
        n = cfg.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0 and n % tp:
            yield Problem(f"{where}.parallelism.tp", f"{tp} does not divide {key} {n} of {model.get('name')!r} "
                                                     f"(inputs.model); tensor parallelism splits them evenly; "
                                                     "re-plan, or restore the field")
            return
    pred = plan["predicted"]
    heads = sorted({d for st in plan["stages"] for d in st["devices"]})
    nd, flops, peaks = pred.get("num_devices"), pred.get("peak_flops"), _device_peaks(heads, cluster)
    if not (isinstance(nd, int) and isinstance(flops, (int, float)) and nd > 0 and nd % len(heads) == 0
            and peaks is not None):
        return
    timed = nd // len(heads)
    if timed != tp and abs(flops - timed * sum(peaks)) <= REL_TOL * flops:
        yield Problem(f"{where}.parallelism.tp", f"{tp}, but predicted.num_devices {nd} and peak_flops {flops!r} over "
                                                 f"the {len(heads)} stage devices are those of tp {timed}, the degree "
                                                 "the stages were timed for; re-plan, or restore the field")


def _device_peaks(heads: list, cluster: dict) -> list | None:
    """Each device's MFU peak from ``inputs.cluster.groups``: ``peak_fp16_flops``, halved where the group's
    ``tensor_accumulate`` is ``"fp16"`` (:func:`pipesearch.types.mfu_peak_flops`); None where one is not given."""
    found = zip(group_values(heads, cluster, "peak_fp16_flops"), group_values(heads, cluster, "tensor_accumulate"))
    peaks = [mfu_peak_flops(peak, acc or "fp32") if isinstance(peak, (int, float)) else peak for peak, acc in found]
    return peaks if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in peaks) else None


#: ranks may leave time order only inside this window: among plans within
#: 0.1 % of each other the search prefers lower peak memory, then fewer bytes
#: over slow links, then fewer stages
RANK_TIE_WINDOW = 1e-3


def _rank_order(plans: list) -> Iterator[Problem]:
    """Plans in rank order take non-decreasing iteration times (up to the
    tie window), and agree on every layer's name."""
    ordered = sorted(plans, key=lambda p: p["rank"])
    for a, b in zip(ordered, ordered[1:]):
        ta, tb = a["predicted"]["iteration_time_s"], b["predicted"]["iteration_time_s"]
        if tb < ta * (1.0 - RANK_TIE_WINDOW):
            yield Problem("plans", f"rank {b['rank']} ({tb!r} s) is faster than rank {a['rank']} ({ta!r} s); "
                                   "ranks follow the iteration time")
            return
    names: dict[int, tuple[str, int]] = {}
    for plan in ordered:
        for st in plan["stages"]:
            first = st["layers"][0]
            for layer, name in enumerate(st["layer_names"], start=first):
                seen = names.setdefault(layer, (name, plan["rank"]))
                if seen[0] != name:
                    yield Problem("plans", f"layer {layer} is {seen[0]!r} in the plan of rank {seen[1]} but "
                                           f"{name!r} in the plan of rank {plan['rank']}; the plans share one model")
                    return


#: the statuses of the points table's rows (docs/formats.md)
POINT_STATUSES = ("ok", "pruned", "out_of_memory", "schedule_refused", "batch_not_divisible", "too_many_stages",
                  "too_many_micro_batches", "split_mismatch", "same_as_other_placement", "stopped_at_work_limits")

#: the columns every points table holds (files of every version: the figures read them)
REQUIRED_POINT_COLUMNS = ("tp", "recompute", "pp", "dp", "schedule", "micro_batch_size", "num_micro_batches",
                          "placement", "status", "iteration_time_s", "samples_per_s", "peak_memory_bytes")


#: points-table columns every point fills (what the point is, and how it ended)
POINT_IDENTITY_COLUMNS = ("tp", "recompute", "pp", "dp", "status")
#: points-table columns every point fills but one whose dp does not divide the batch (no schedule enumerated)
POINT_SCHEDULE_COLUMNS = ("schedule", "vp", "micro_batch_size", "num_micro_batches")
#: points-table columns every ``ok`` point fills (what it achieves)
POINT_OK_COLUMNS = ("iteration_time_s", "samples_per_s", "peak_memory_bytes")


#: points-table column -> ``(cell types, low, high, what is expected)``: numbers of those types in ``[low,
#: high]``, or strings (in ``low`` when it is a tuple); the bounds are the plan schema's. ``bool`` is not ``int``
#: here (the types are compared exactly)
_COLUMN_RULES = {
    **{c: ((int,), 1, math.inf, "an integer >= 1") for c in ("tp", "pp", "dp", "vp", "micro_batch_size",
                                                             "num_micro_batches")},
    **{c: ((int, float), 0, MAX_PLAN_S, f"a number in [0, {MAX_PLAN_S:g}]") for c in ("iteration_time_s",
                                                                                       "lower_bound_s")},
    "samples_per_s": ((int, float), 0, MAX_SAMPLES_PER_S, f"a number in [0, {MAX_SAMPLES_PER_S:g}]"),
    "peak_memory_bytes": ((int, float), 0, MAX_BYTES, f"a number in [0, {MAX_BYTES:g}]"),
    "bubble_fraction": ((int, float), 0, 1.0, "a number in [0, 1]"),
    **{c: ((str,), None, None, "a string") for c in ("recompute", "placement")},
    "status": ((str,), POINT_STATUSES, None, f"one of {', '.join(POINT_STATUSES)}"),
    "schedule": ((str,), SCHEDULES, None, f"one of {', '.join(SCHEDULES)}"),
}


def _cell_passes(column: str, v) -> bool:
    """Whether one (non-null) cell of ``column`` passes its rule of :data:`_COLUMN_RULES`."""
    types, low, high, _ = _COLUMN_RULES[column]
    if type(v) not in types:
        return False
    if types == (str,):
        return low is None or v in low
    return low <= v <= high


#: points-table column -> (check of one cell, what is expected)
_POINT_COLUMNS = {c: (lambda v, c=c: _cell_passes(c, v), rule[3]) for c, rule in _COLUMN_RULES.items()}


def _points(doc: dict) -> Iterator[Problem]:
    table = doc["search"].get("points")
    if table is None:
        return
    columns = table["columns"]
    repeated = sorted({c for c in columns if columns.count(c) > 1}, key=str)
    if repeated:
        yield Problem("search.points.columns", f"names {show(repeated[0])} more than once; give each column once")
        return
    missing = [c for c in REQUIRED_POINT_COLUMNS if c not in columns]
    if missing:
        yield Problem("search.points.columns", f"lacks {', '.join(missing)}; a points table holds "
                                               f"{', '.join(REQUIRED_POINT_COLUMNS)} (and the search's others)")
        return
    if "values" in table and "data" in table:
        yield Problem("search.points", "has both 'values' (by column) and 'data' (by row); give one")
        return
    problems = list(_point_columns(columns, table["values"]) if "values" in table else
                    _point_rows(columns, table["data"]))
    if problems:
        yield from problems
        return
    by_column, where = _by_column(table)
    problems = list(_point_nulls(columns, by_column, where)) or list(_point_degrees(
        columns, by_column, doc["inputs"]["cluster"]["devices"], where))
    yield from problems or _point_rates(columns, by_column, doc, where)


def _by_column(table: dict):
    """``(values by column, where(k, r))`` of a points table of either layout."""
    if "values" in table:
        return table["values"], lambda k, r: f"search.points.values[{k}][{r}]"
    data = table["data"]
    return ([list(col) for col in zip(*data)] if data else [[] for _ in table["columns"]],
            lambda k, r: f"search.points.data[{r}]")


def points_against_plans(doc: dict) -> list[Problem]:
    """A listed point of status ``ok`` no faster than plan 1 beyond the tie
    window (without ``inputs.runtime``, whose refusals may drop faster plans
    after the search): the ranked plans are the best of the points
    searched. Asked once the plans replay to their recorded times
    (:func:`pipesearch.cli.validate_cmd.staged_problems`), so that an edited
    plan time is named as such rather than the points it then
    contradicts; on a document :func:`semantic_problems` accepts."""
    table = doc["search"].get("points")
    if table is None or doc["inputs"].get("runtime") or not doc["plans"]:
        return []
    by_column, where = _by_column(table)
    columns = table["columns"]
    first = min(doc["plans"], key=lambda p: p["rank"])["predicted"]["iteration_time_s"]
    for r, t, _ in _ok_points(columns, by_column):
        if t * (1 + RANK_TIE_WINDOW) * (1 + REL_TOL) < first:
            return [Problem(where(columns.index("iteration_time_s"), r),
                            f"a point of status 'ok' at {t!r} s, faster than plan 1 ({first!r} s): the ranked plans "
                            "are the best of the points searched; restore the file or plan again")]
    return []


def _ok_points(columns: list, values: list):
    """``(row, iteration_time_s, samples_per_s)`` of each listed point of
    status ``ok`` with a positive time (both required columns)."""
    status = values[columns.index("status")]
    times, rates = values[columns.index("iteration_time_s")], values[columns.index("samples_per_s")]
    for r, (st, t, rate) in enumerate(zip(status, times, rates)):
        if st == "ok" and isinstance(t, (int, float)) and t > 0:
            yield r, t, rate


def _point_rates(columns: list, values: list, doc: dict, where) -> Iterator[Problem]:
    """The first point of status ``ok`` whose ``samples_per_s`` is not the
    global batch over its ``iteration_time_s``."""
    batch = doc["inputs"]["job"]["global_batch_size"]
    for r, t, rate in _ok_points(columns, values):
        if isinstance(rate, (int, float)) and _above(abs(rate - batch / t), REL_TOL * batch / t):
            yield Problem(where(columns.index("samples_per_s"), r),
                          f"samples_per_s {rate!r}, but global batch {batch} / iteration_time_s {t!r} = {batch / t!r}; "
                          "restore the file or plan again")
            return


def _point_rows(columns: list, data: list) -> Iterator[Problem]:
    """The by-row layout's first row of another length than ``columns``,
    or its first cell that fails its column's rule."""
    for r, row in enumerate(data):
        if len(row) != len(columns):
            yield Problem(f"search.points.data[{r}]", f"{len(row)} values for the {len(columns)} columns; "
                                                      "give one value per column")
            return
        for column, value in zip(columns, row):
            check = _POINT_COLUMNS.get(column)
            if check is not None and value is not None and not check[0](value):
                yield Problem(f"search.points.data[{r}]", f"column {column!r} = {show(value)}: expected {check[1]} "
                                                          "or null")
                return


def _point_degrees(columns: list, values: list, num_devices: int, where) -> Iterator[Problem]:
    """The first point whose ``pp x dp x tp`` needs more devices than the
    cluster has (``values`` by column; a point of per-stage replication has
    dp 1 and at most ``pp`` slots per replica, so the rule holds for it too)."""
    at = {c: k for k, c in enumerate(columns)}
    if not {"pp", "dp"} <= set(at):
        return
    tps = values[at["tp"]] if "tp" in at else [1] * len(values[at["pp"]])
    for r, (pp, dp, tp) in enumerate(zip(values[at["pp"]], values[at["dp"]], tps)):
        if None not in (pp, dp) and pp * dp * (tp or 1) > num_devices:
            yield Problem(where(at["pp"], r), _too_many_devices(pp, dp, tp or 1, num_devices)
                          + "; restore the point or re-plan")
            return


def _too_many_devices(pp: int, dp: int, tp: int, num_devices: int) -> str:
    """The problem of a plan or point of more devices than the cluster's."""
    return (f"pp {pp} x dp {dp} x tp {tp} = {pp * dp * tp} devices, but the cluster (inputs.cluster.devices) has "
            f"{num_devices}")


def _point_nulls(columns: list, values: list, where) -> Iterator[Problem]:
    """Nulls where a point always has a value: the columns of
    :data:`POINT_IDENTITY_COLUMNS` of every point, those of
    :data:`POINT_SCHEDULE_COLUMNS` of every point but a
    ``batch_not_divisible`` one, those of :data:`POINT_OK_COLUMNS` of every
    ``ok`` point (``values`` by column; ``where(k, r)`` names the cell of
    column ``k``, point ``r``)."""
    at = {c: k for k, c in enumerate(columns)}
    status = values[at["status"]] if "status" in at else []
    rules = ([(c, lambda st: True, "every point") for c in POINT_IDENTITY_COLUMNS]
             + [(c, lambda st: st != "batch_not_divisible", "every point whose dp divides the batch")
                for c in POINT_SCHEDULE_COLUMNS]
             + [(c, lambda st: st == "ok", "an ok point") for c in POINT_OK_COLUMNS])
    for column, applies, whose in rules:
        if column not in at:
            continue
        k = at[column]
        if None not in values[k]:  # a column without nulls: one scan in C (a schema-valid column is a list)
            continue
        r = next((r for r, v in enumerate(values[k]) if v is None and (not status or applies(status[r]))), None)
        if r is not None:
            yield Problem(where(k, r), f"column {column!r} is null: {whose} has one; restore it or re-plan")
            return


def _column_passes(column: str, col: list) -> bool:
    """Whether every non-null cell of a points-table column passes its
    rule (:func:`_cell_passes`), decided a column at a time: the set of
    cell types, the range of the integers (compared exactly, as the cell
    rule does) and of the floats (with numpy; NaN fails it), the set of
    strings. False sends the
    column to the cell-by-cell check, which names the first cell that fails."""
    rule = _COLUMN_RULES.get(column)
    if rule is None or not isinstance(col, list):
        return False
    types, low, high, _ = rule
    cells = [v for v in col if v is not None]
    if not set(map(type, cells)) <= set(types):
        return False
    if not cells:
        return True
    if types == (str,):
        return low is None or set(cells) <= set(low)
    ints = [v for v in cells if type(v) is int]  # compared exactly (2**60 + 1 is above a bound of 2.0**60)
    if ints and not (min(ints) >= low and max(ints) <= high):
        return False
    floats = np.array([v for v in cells if type(v) is float], dtype=float)
    return bool(np.all((floats >= low) & (floats <= high)))  # NaN fails both


def _point_columns(columns: list, values: list) -> Iterator[Problem]:
    """The by-column layout: one list per column, all of one length, cells as in the by-row one."""
    if len(values) != len(columns):
        yield Problem("search.points.values", f"{len(values)} columns of values for the {len(columns)} names "
                                              "in search.points.columns; give one list per column")
        return
    lengths = {len(col) for col in values}
    if len(lengths) > 1:
        yield Problem("search.points.values", f"columns of different lengths ({', '.join(map(str, sorted(lengths)))}); "
                                              "give every column one value per point")
        return
    for k, (column, col) in enumerate(zip(columns, values)):
        check = _POINT_COLUMNS.get(column)
        if check is None or _column_passes(column, col):
            continue
        for r, value in enumerate(col):
            if value is not None and not check[0](value):
                yield Problem(f"search.points.values[{k}][{r}]", f"column {column!r} = {show(value)}: expected "
                                                                  f"{check[1]} or null")
                return


def cluster_group_problems(cluster: dict) -> list[Problem]:
    """``inputs.cluster.groups`` (when given) lays the devices out node by
    node: every group's ``first_device`` .. ``last_device`` is ``nodes x
    devices_per_node`` ids (integers >= 1), the groups follow one another
    from id 0 and end at ``devices - 1``."""
    groups = cluster.get("groups")
    if groups is None:
        return []
    at = "inputs.cluster.groups"
    if not isinstance(groups, list) or not groups:
        return [Problem(at, f"{show(groups)} found, a list of the device groups expected; restore it or drop it")]
    expect = 0
    for k, g in enumerate(groups):
        w = f"{at}[{k}]"
        keys = ("first_device", "last_device", "nodes", "devices_per_node")
        bad = [key for key in keys if not isinstance(g, dict) or not isinstance(g.get(key), int)
               or isinstance(g.get(key), bool) or g.get(key) < (0 if key.endswith("_device") else 1)]
        if bad:
            return [Problem(f"{w}.{bad[0]}", f"{show(g.get(bad[0]) if isinstance(g, dict) else g)} found, an "
                                             f"integer >= {0 if bad[0].endswith('_device') else 1} expected; "
                                             f"restore the cluster description")]
        if g["first_device"] != expect:
            return [Problem(f"{w}.first_device", f"{g['first_device']} found, {expect} expected (groups number the "
                                                 f"devices one after another from 0); restore the cluster description")]
        count = g["nodes"] * g["devices_per_node"]
        if g["last_device"] != expect + count - 1:
            return [Problem(f"{w}.last_device", f"{g['last_device']} found, {expect + count - 1} expected "
                                                f"({g['nodes']} nodes x {g['devices_per_node']} devices from id "
                                                f"{expect}); restore the cluster description")]
        expect += count
    if expect != cluster["devices"]:
        return [Problem(at, f"the groups hold {expect} devices, inputs.cluster.devices is {cluster['devices']}; "
                            f"restore the cluster description")]
    return []


def _transformer(doc: dict) -> list[Problem]:
    """``inputs.model.transformer`` (when given) is a config the model files'
    own rules accept (:class:`pipesearch.profiles.transformer.TransformerConfig`:
    positive sizes, heads dividing the width and divisible by the KV heads,
    known kinds), and its blocks are the plan's blocks (a decoder's layer
    table, :func:`pipesearch.export.transformer_shape`)."""
    from dataclasses import MISSING, fields

    from ..export import transformer_shape
    from ..profiles.transformer import TransformerConfig

    t = doc["inputs"]["model"].get("transformer")
    if t is None:
        return []
    at = "inputs.model.transformer"
    if not isinstance(t, dict):
        return [Problem(at, f"{show(t)} found, the transformer's config (an object) expected; restore it")]
    known = {f.name for f in fields(TransformerConfig)} - {"source"}
    unknown = sorted(set(t) - known)
    if unknown:
        return [Problem(f"{at}.{unknown[0]}", "not a transformer config key; restore the config")]
    required = [f.name for f in fields(TransformerConfig) if f.default is MISSING and f.default_factory is MISSING]
    missing = [key for key in required if key not in t]
    if missing:
        return [Problem(f"{at}.{missing[0]}", "missing (a transformer config key with no default); restore the config")]
    try:
        cfg = TransformerConfig(**t)
    except (InputError, TypeError) as exc:
        return [Problem(at, f"{' '.join(str(exc).split())}; restore the config")]
    for k, plan in enumerate(doc["plans"]):
        shape = transformer_shape([str(name) for st in plan["stages"] for name in st["layer_names"]])
        blocks = shape[1] if shape is not None else 0  # a decoder's table: embedding, block_<i>, head
        if blocks and blocks != cfg.total_blocks:
            return [Problem(f"{at}.num_layers", f"{cfg.num_layers} ({cfg.total_blocks} blocks), but plans[{k}] "
                                                f"runs {blocks} blocks; restore the config")]
    return []


def _job(job: dict) -> list[Problem]:
    """``inputs.job.zero1`` says what ``optimizer_state.sharding`` says: the
    optimizer state sharded over the replicas (any sharding but ``none``),
    as ``pipesearch plan`` writes them (the exporters read ``zero1``)."""
    state = job.get("optimizer_state")
    sharding = state.get("sharding") if isinstance(state, dict) else None
    if "zero1" in job and sharding is not None and job["zero1"] != (sharding != "none"):
        return [Problem("inputs.job.zero1", f"{show(job['zero1'])} found, but optimizer_state.sharding is "
                                            f"{sharding!r}: zero1 is {str(sharding != 'none').lower()} for that "
                                            "sharding; restore the file")]
    return []


def _overlap(plan: dict, where: str, job: dict) -> Iterator[Problem]:
    """Without overlap (``inputs.job.comm_overlap`` grad_reduce and
    param_gather false or absent) nothing hides a stage's data-parallel
    communication: its ``allreduce_s`` (what runs after its last backward)
    is at least its ``dp_comm_s``."""
    overlap = job.get("comm_overlap") or {}
    if overlap.get("grad_reduce") or overlap.get("param_gather"):
        return
    for k, st in enumerate(plan["stages"]):
        dp = st.get("dp_comm_s", 0.0)
        if _above(dp, st["allreduce_s"]):
            yield Problem(f"{where}.stages[{k}].allreduce_s",
                          f"{st['allreduce_s']!r} is less than its dp_comm_s {dp!r}, but inputs.job.comm_overlap "
                          "overlaps neither the gradient reduce nor the parameter gather (nothing hides it); "
                          "restore the file")
            return


def semantic_problems(doc: dict) -> list[Problem]:
    """Every problem of a schema-valid plan document beyond the schema (see
    the module docstring), in document order."""
    inputs = doc["inputs"]
    out: list[Problem] = cluster_group_problems(inputs["cluster"]) + _transformer(doc) + _job(inputs["job"])
    for k, plan in enumerate(doc["plans"]):
        out += plan_problems(plan, f"plans[{k}]", inputs)
    ranks = [p["rank"] for p in doc["plans"]]
    if len(set(ranks)) != len(ranks):
        out.append(Problem("plans", f"plan ranks repeat ({', '.join(map(str, ranks))}); give each plan its own rank"))
    elif not out:  # across plans only once each plan is consistent (a broken stage would be named twice)
        out += _rank_order(doc["plans"])
    out += _points(doc)
    return out
