"""What a plan keeps in host memory and moves over PCIe, checked against the
cluster's ``[host]`` table that the document carries (``inputs.cluster.host``).

A plan whose stages keep state in host memory (ZeRO-offload ``offload``
options, Mobius ``swap``) records ``options.host``
(:func:`pipesearch.option_search.host_plan_info`). Here each recorded figure
is recomputed from the stage's own parameter bytes ``p`` (per GPU: an
offloaded stage's ``memory_breakdown_bytes.weights`` plus its tied copy's
weights, ``tied_copy`` over the kept bytes per parameter, a Mobius stage's
``swapped_buffers / 2``, :data:`pipesearch.stage_options.SWAP_DEVICE_BYTES_PER_PARAM_BYTE`),
the job's optimizer state (``inputs.job.optimizer_state``) and the table,
with the same formulas the search used:

* ``host_memory_bytes[s] = p x host bytes per parameter byte x dp x tp``:
  ZeRO-Offload's fp32 master weights, moments and gradient copy
  (:func:`pipesearch.memory.offload_bytes_per_param`, Ren et al. ATC'21
  Fig. 2), plus Mobius' 16-bit copy (2 B per parameter,
  :func:`pipesearch.stage_options.swap_options`);
* ``pcie_bytes_per_iteration[s]``: an offloaded stage ``share x p / w x (g_out
  + w_in) x dp x tp`` (gradients out, weights back, ``w`` the device's weight
  bytes per parameter; :func:`pipesearch.memory.offload_copy_bytes_per_param`),
  a Mobius stage ``3 p x dp x tp`` (``2 p`` for a rank's last stage;
  :func:`pipesearch.option_search.stage_pcie_bytes`);
* ``optimizer_copy_s[s] = share x p / w x g_out / bw_s`` (0 with a delayed step), ``bw_s``
  the switch's shared bandwidth with every GPU of the plan under the stage's
  switch copying (:func:`pipesearch.host.shared_bandwidth_bytes_per_s`);
* ``stages[s].host_step_s``: offloaded, ``p / b x``
  :func:`pipesearch.host.offload_step_s_per_param`; Mobius, ``p / b x share x
  n_node / cpu_adam_params_per_s`` (``b`` the profile's bytes per parameter,
  below; ``n_node`` the plan's GPUs on the stage's node);
* a Mobius stage's parameters are ``p`` over the profile's bytes per
  parameter (``inputs.model.bytes_per_param``, as the search's
  :func:`pipesearch.stage_options.swap_options`);
* Mobius ``options.mobius.swap_in_s[s] = p x c_r / min(host_to_device,
  switch_uplink)``, ``c_r`` the most of rank ``r``'s GPUs under one switch
  (:func:`pipesearch.host.swap_queues`);
* a stage whose ``memory_option`` keeps nothing on the host records no host
  bytes and no host step; the totals are the sums, and each node's stages
  fit its ``memory_bytes``.

Stages that stream weights or keep activations in host memory are checked
only in the totals and against the node's memory. Each problem names the
field, the value found and the value expected.
"""

from __future__ import annotations

from typing import Iterator

from ..hardware import described_place
from ..host import offload_step_s_per_param, shared_bandwidth_bytes_per_s
from ..memory import OFFLOAD_KEPT_COMPONENTS, ParamState, offload_bytes_per_param, offload_copy_bytes_per_param
from ..stage_options import SWAP_DEVICE_BYTES_PER_PARAM_BYTE
from ..types import HostSpec
from . import REL_TOL, Problem, check_record, show
from .optimizer_steps import stage_streaming_bandwidth

_HOST_OPTIONS = ("offload", "stream", "swap", "roundpipe", "act-host")


def _parts(plan: dict) -> list[set[str]]:
    return [set(str(st.get("memory_option", "")).split("+")) for st in plan["stages"]]


def uses_host(plan: dict) -> bool:
    """True when a stage of the plan keeps state in host memory (by its
    ``memory_option``), the plan records ``options.host``, or its schedule
    (Mobius, RoundPipe) needs the host."""
    return (plan["schedule"]["name"] in ("mobius", "roundpipe") or "host" in (plan.get("options") or {})
            or any(p & set(_HOST_OPTIONS) for p in _parts(plan)))


def host_spec(inputs: dict) -> HostSpec | None:
    """The document's ``[host]`` table as a :class:`HostSpec`, or None when it
    is missing or malformed (see :func:`host_table_problem`)."""
    cluster = inputs.get("cluster")
    h = cluster.get("host") if isinstance(cluster, dict) else None
    try:
        host = HostSpec(**{**h, "pcie_switches": tuple(tuple(int(x) for x in sw) for sw in h["pcie_switches"])})
    except (TypeError, KeyError, ValueError):
        return None
    numbers = (host.memory_bytes, host.host_to_device_bytes_per_s, host.switch_uplink_bytes_per_s,
               host.cpu_adam_params_per_s)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in numbers):
        return None
    return host


def host_table_problem(inputs: dict) -> Problem | None:
    """A problem when ``inputs.cluster.host`` is not a ``[host]`` table with
    positive memory and rates whose ``pcie_switches`` put every GPU of a
    node (ids ``0 .. devices_per_node - 1`` of each group) under exactly one
    switch; None when it is one."""
    found = (inputs.get("cluster") or {}).get("host") if isinstance(inputs.get("cluster"), dict) else None
    host = host_spec(inputs)
    if host is None:
        return Problem("inputs.cluster.host", f"{show(found)} found, the cluster's [host] table expected (positive "
                                              "memory_bytes and rates, pcie_switches of device ids), from which the "
                                              "plan's host memory and copies are derived; restore it or re-plan")
    groups = inputs["cluster"].get("groups")
    for g in groups if isinstance(groups, list) else ():
        per = g.get("devices_per_node") if isinstance(g, dict) else None
        if not isinstance(per, int) or isinstance(per, bool):
            continue
        for d in range(per):
            n = sum(d in sw for sw in host.pcie_switches)
            if n != 1:
                return Problem("inputs.cluster.host.pcie_switches",
                               f"{show(found['pcie_switches'])} puts GPU {d} of a node under {n} switches, one "
                               f"expected (every id 0 .. {per - 1} in exactly one switch); restore the table")
    return None


def job_param_state(job: dict) -> ParamState | None:
    """``inputs.job.optimizer_state`` as a :class:`ParamState`, None when it is malformed."""
    opt = job.get("optimizer_state")
    b = opt.get("bytes_per_param") if isinstance(opt, dict) else None
    keys = ("weights", "grads", "main_grads", "master_weights", "optimizer_moments")
    if not isinstance(b, dict) or not all(isinstance(b.get(k), (int, float)) for k in keys):
        return None
    try:
        return ParamState(*(float(b[k]) for k in keys), str(opt.get("sharding", "none")), str(opt.get("name", "")))
    except (TypeError, ValueError):
        return None


def device_place(device: int, cluster: dict, host: HostSpec) -> tuple[int, int] | None:
    """(node, switch) of a global device id from ``inputs.cluster.groups``."""
    place = described_place(cluster, device)
    if place is None:
        return None
    switch = next((k for k, sw in enumerate(host.pcie_switches) if place[1] in sw), None)
    return None if switch is None else (place[0], switch)


def _gpus(plan: dict, k: int) -> list[int]:
    tp = plan["parallelism"]["tp"]
    return [d + t for d in plan["stages"][k]["devices"] for t in range(tp)]


def _sharing(plan: dict, cluster: dict, host: HostSpec):
    """Per stage ``(switch share, node share, node)``: the most of the plan's
    GPUs under one switch (on one node) with one of the stage's GPUs
    (:func:`pipesearch.host.stage_switch_sharing`, :func:`pipesearch.host.node_sharing`),
    and the node of its first GPU; None where a GPU has no place."""
    used = sorted({d for k in range(len(plan["stages"])) for d in _gpus(plan, k)})
    place = {d: device_place(d, cluster, host) for d in used}
    if None in place.values():
        return None
    switch, node = {}, {}
    for p in place.values():
        switch[p] = switch.get(p, 0) + 1
        node[p[0]] = node.get(p[0], 0) + 1
    return [(max(switch[place[d]] for d in _gpus(plan, k)), max(node[place[d][0]] for d in _gpus(plan, k)),
             place[_gpus(plan, k)[0]][0]) for k in range(len(plan["stages"]))]


def _profile_bytes_per_param(inputs: dict, state: ParamState) -> float:
    """The model profile's bytes per parameter (``inputs.model.bytes_per_param``;
    the 16-bit weight's bytes in files written before it was recorded)."""
    b = (inputs.get("model") or {}).get("bytes_per_param")
    return float(b) if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 else state.weight_bytes


def _stage_terms(plan: dict, k: int, state: ParamState, host: HostSpec, share3, cluster: dict,
                 bpp: float) -> dict | None:
    """The recomputed host figures of stage ``k`` (module docstring): ``host``
    bytes, ``pcie`` bytes, ``step`` s, ``copy`` s (offload) or ``swap_in`` s
    (Mobius), and ``option`` in words; None for a stage checked only in the
    totals (streamed weights, activations on the host, RoundPipe). A Mobius
    stage's parameters are its parameter bytes over the profile's ``bpp``."""
    st, par = plan["stages"][k], plan["parallelism"]
    state = state.in_pipeline(par["pp"])  # what a pipeline's stage keeps (ZeRO-1's, for ZeRO-2 and 3)
    parts, bd = _parts(plan)[k], st.get("memory_breakdown_bytes") or {}
    n = par["dp"] * par["tp"] if "replicas" not in st else st["replicas"] * par["tp"]
    b, dp = state.weight_bytes, par["dp"]
    share = state.update_share(dp)
    switch_share, node_share, _ = share3
    delayed = (plan.get("options") or {}).get("optimizer_step") == "delayed"
    if parts & {"stream", "act-host", "roundpipe"}:
        return None
    if "swap" in parts:
        p = bd.get("swapped_buffers")
        if not isinstance(p, (int, float)):
            return None
        p = p / SWAP_DEVICE_BYTES_PER_PARAM_BYTE
        S, pp = len(plan["stages"]), par["pp"]
        r = k % pp
        rank_gpus = [d + t for d in plan["stages"][r]["devices"] for t in range(par["tp"])]
        places = [device_place(d, cluster, host) for d in rank_gpus]
        copies = max(places.count(x) for x in places)
        link = min(host.host_to_device_bytes_per_s, host.switch_uplink_bytes_per_s)
        return {"option": "swap", "p": p, "host": p * (2.0 + offload_bytes_per_param(state, dp)[1]) / bpp * n,
                "pcie": (2.0 if k >= S - pp else 3.0) * p * n, "swap_in": p * copies / link,
                "step": p / bpp * share * node_share / host.cpu_adam_params_per_s,
                "why": f"{copies} of rank {r}'s GPUs under one switch at {link:.6g} B/s"}
    if "offload" in parts:
        p = bd.get("weights")
        if not isinstance(p, (int, float)):
            return None
        per_param = state.breakdown_per_param(dp)  # bytes one replica keeps per parameter, after sharding
        if per_param["weights"] > 0:  # the stage's own weights, unsharded (ZeRO-3 keeps 1 / dp of them)
            p = p * b / per_param["weights"]
        kept = sum(v for c, v in per_param.items() if c in OFFLOAD_KEPT_COMPONENTS)
        tied = bd.get("tied_copy", 0.0)
        if isinstance(tied, (int, float)) and tied > 0 and kept > 0:  # the tied copy's parameters step too
            p = p + tied / kept * b
        out_b, in_b = offload_copy_bytes_per_param(state)
        bw = float(shared_bandwidth_bytes_per_s(host, switch_share))
        step = float(offload_step_s_per_param(host, switch_share, node_share, out_b, in_b, share)) / b * p
        bandwidth = stage_streaming_bandwidth(st["devices"], cluster)
        if bandwidth is not None and not delayed:  # never below the GPU's own step (StageOptions.with_step_floor)
            step = max(step, p / b * state.step_bytes_per_param * share / bandwidth)
        return {"option": "offload", "p": p, "host": p * offload_bytes_per_param(state, dp)[1] / b * n,
                "pcie": share * p / b * (out_b + in_b) * n, "copy": 0.0 if delayed else share * p / b * out_b / bw,
                "step": step,
                "why": f"{switch_share} GPUs under its switch at {bw:.6g} B/s each, {node_share} on its node"}
    return {"option": "device", "p": 0.0, "host": 0.0, "pcie": 0.0, "step": 0.0, "copy": 0.0}


def host_problems(plan: dict, where: str, inputs: dict) -> Iterator[Problem]:
    """Every recorded host figure of a plan that uses the host and disagrees
    with its formula (module docstring), the stages' own fields first, then
    the totals and the node's memory; at most one problem per field."""
    if not uses_host(plan):
        return
    bad = host_table_problem(inputs)
    if bad is not None:
        yield bad
        return
    if plan["schedule"]["name"] == "roundpipe":  # its records: pipesearch.schema.records and gpu_peaks
        return
    host, state = host_spec(inputs), job_param_state(inputs["job"])
    info = (plan.get("options") or {}).get("host")
    S = len(plan["stages"])
    h = f"{where}.options.host"
    lists = ("host_memory_bytes", "pcie_bytes_per_iteration")
    if not isinstance(info, dict) or not all(
            isinstance(info.get(key), list) and len(info[key]) == S
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in info[key])
            for key in lists):
        yield Problem(h, f"{show(info)} found, host_memory_bytes and pcie_bytes_per_iteration (one number >= 0 per "
                         f"stage, {S}) expected for stages that keep state in host memory; re-plan")
        return
    sharing = _sharing(plan, inputs["cluster"], host)
    if state is not None and sharing is not None:
        yield from _stage_problems(plan, where, info, state, host, sharing, inputs)
    for key, total in (("host_memory_bytes", "total_host_memory_bytes"),
                       ("pcie_bytes_per_iteration", "total_pcie_bytes_per_iteration")):
        yield from check_record(f"{h}.{total}", info.get(total), float(sum(info[key])), f"the sum of {h}.{key}")
    nodes: dict[int, float] = {}
    for k in range(S):
        node = sharing[k][2] if sharing is not None else 0
        nodes[node] = nodes.get(node, 0.0) + info["host_memory_bytes"][k]
    for node, held in sorted(nodes.items()):
        if held > host.memory_bytes * (1 + REL_TOL):
            yield Problem(f"{h}.host_memory_bytes", f"the stages on node {node} keep {held!r} B in host memory, more "
                                                    f"than its {host.memory_bytes:.6g} B (inputs.cluster.host."
                                                    "memory_bytes); the plan does not fit")
            return


def _stage_problems(plan, where, info, state, host, sharing, inputs) -> Iterator[Problem]:
    """Each stage's host bytes, PCIe bytes, copy seconds and CPU step (module docstring)."""
    h, mb = f"{where}.options.host", f"{where}.options.mobius"
    copies = info.get("optimizer_copy_s")
    bpp = _profile_bytes_per_param(inputs, state)
    for k, st in enumerate(plan["stages"]):
        t = _stage_terms(plan, k, state, host, sharing[k], inputs["cluster"], bpp)
        if t is None:
            continue
        w = f"{where}.stages[{k}]"
        option = st.get("memory_option", "")
        if t["option"] == "device" and info["host_memory_bytes"][k] > 0 and st.get("host_step_s", 0.0) > 0:
            yield Problem(f"{w}.memory_option", f"{option!r} keeps the stage's state on the device, but {h}."
                                                f"host_memory_bytes[{k}] holds {info['host_memory_bytes'][k]!r} B "
                                                f"and host_step_s is {st['host_step_s']!r} s (0 expected for it); "
                                                "re-plan, or restore the field")
            return
        why = f"{w}.memory_option {option!r} with {t['p']!r} parameter bytes per GPU" + (
            f" at {bpp:g} B per parameter (inputs.model.bytes_per_param)"
            if t["option"] == "swap" else "")
        found = [(f"{h}.host_memory_bytes[{k}]", info["host_memory_bytes"][k], t["host"], why),
                 (f"{h}.pcie_bytes_per_iteration[{k}]", info["pcie_bytes_per_iteration"][k], t["pcie"], why)]
        if "host_step_s" in st:
            found.append((f"{w}.host_step_s", st["host_step_s"], t["step"],
                          f"the CPU's step over the stage's parameters at {host.cpu_adam_params_per_s:.6g}/s"))
        if "swap_in" in t and isinstance(plan["options"].get("mobius"), dict):
            found.append((f"{mb}.swap_in_s[{k}]", plan["options"]["mobius"]["swap_in_s"][k], t["swap_in"],
                          f"{t['p']!r} B x {t['why']}"))
        if "copy" in t and isinstance(copies, list) and len(copies) == len(plan["stages"]):
            found.append((f"{h}.optimizer_copy_s[{k}]", copies[k], t["copy"], f"{t['p']!r} B, {t.get('why', '')}"))
        for field, value, expected, reason in found:
            problems = list(check_record(field, value, expected, reason))
            if problems:
                yield problems[0]
                return
