"""Per-stage memory options of a search point: recompute, optimizer offload,
activations in host memory and streamed weights (with recompute levels),
each stage taking the fastest option that fits.

:class:`StageOptions` stacks the options' per-layer terms; the cost model
(:class:`pipesearch.costs.PipelineCosts`) reads the chosen option's terms
for every stage (docs/offload.md: why the per-stage choice is exact).
:func:`stage_options` builds recompute and offload chains,
:func:`stream_options` the streamed-weights chain; :func:`range_max_table`
and :func:`range_max` give range maxima (a recomputed or streamed stage's
largest transient buffer, a ZeRO-3 stage's largest gathered unit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .memory import param_state_of
from .types import Cluster, Job, ModelProfile


def _prefix(x):
    """Prefix sums along the last axis with a leading 0: ``(..., L) -> (..., L+1)``."""
    x = np.asarray(x, dtype=float)
    return np.concatenate([np.zeros(x.shape[:-1] + (1,)), np.cumsum(x, axis=-1)], axis=-1)


def range_max_table(values: np.ndarray) -> np.ndarray:
    """Sparse table for range maxima: ``(levels, L)`` with row ``q`` holding
    ``max(values[x : x + 2**q])`` (clipped at ``L``); :func:`range_max`
    reads it. ``values`` has shape ``(L,)``, ``levels = floor(log2 L) + 1``."""
    rows = [np.asarray(values, dtype=float)]
    width = 1
    while 2 * width <= len(values):
        prev = rows[-1]
        rows.append(np.maximum(prev, np.concatenate([prev[width:], np.full(width, -np.inf)])))
        width *= 2
    return np.stack(rows) if len(values) else np.zeros((1, 0))


def range_max(table: np.ndarray, i, j):
    """``max(values[i:j])`` from :func:`range_max_table`, vectorised over
    broadcastable int arrays ``i``, ``j``; 0 where ``j <= i``. A stack of
    tables ``(K, levels, L)`` (one per option) gives ``(K,) + shape``, each
    the value its own table gives."""
    i, j = np.broadcast_arrays(np.asarray(i), np.asarray(j))
    n = np.maximum(j - i, 1)
    q = np.minimum(np.floor(np.log2(n)).astype(np.int64), table.shape[-2] - 1)
    L = table.shape[-1]
    a = table[..., q, np.clip(i, 0, max(L - 1, 0))]
    b = table[..., q, np.clip(j - (1 << q), 0, max(L - 1, 0))]
    return np.where(j > i, np.maximum(a, b), 0.0)


@dataclass(frozen=True, eq=False)
class StageOptions:
    """Per-stage memory options of a search point, ordered fastest first,
    stacked on a leading axis of ``K`` options (option 0 is the plain one).

    Each stage runs the first option whose memory fits (on the device and,
    for offloading options, in the host's share): the options form a chain
    in which every layer's forward, backward and input-gradient times and
    every stage's host step are non-decreasing from one option to the next
    (checked on construction), and the simulated makespan is monotone
    non-decreasing in every stage's times (a longest path with non-negative
    weights), so for a fixed split the first fitting option of each stage
    is the best choice of all stages together; memory is checked stage by
    stage, so the choices are independent.

    Arrays (``L`` layers, ``P`` stages; times at the micro-batch size on the
    profiled device, bytes at the micro-batch size):
        names: ``(K,)`` option names (``"none"``, ``"full"``, ``"none+offload"``...).
        fwd_prefix_s, compute_prefix_s, bwd_input_prefix_s, saved_prefix_bytes:
            ``(K, L+1)`` prefix sums as in :class:`PipelineCosts` under each
            option (the three times may be ``(K, P, L+1)``: per stage, for
            streamed weights, whose copies depend on the stage's PCIe share).
        transient_table_bytes: ``(K, levels, L)`` :func:`range_max_table` of
            the bytes one layer's backward re-creates (a recomputed layer's
            full saved activations; Chen et al. 2016 sec. 3: checkpoints plus
            the largest recomputed segment).
        state_bytes_per_param_byte: ``(K,)`` device training state per
            parameter byte (the optimizer state leaves it when offloaded).
        host_bytes_per_param_byte: ``(K,)`` host memory per parameter byte.
        host_step_s_per_param_byte: ``(K, P)`` seconds after the stage's last
            backward per parameter byte (offloaded optimizer step,
            :func:`pipesearch.host.offload_step_s_per_param`).
        host_capacity_bytes: ``(P,)`` host memory each stage may fill.
    """

    names: tuple[str, ...]
    fwd_prefix_s: np.ndarray
    compute_prefix_s: np.ndarray
    bwd_input_prefix_s: np.ndarray
    saved_prefix_bytes: np.ndarray
    transient_table_bytes: np.ndarray
    state_bytes_per_param_byte: np.ndarray
    host_bytes_per_param_byte: np.ndarray
    host_step_s_per_param_byte: np.ndarray
    host_capacity_bytes: np.ndarray
    #: ``(K, P)`` bool: the options stage ``s`` may run (``None``: all); each
    #: stage's allowed options, in index order, form its chain
    allowed: np.ndarray | None = None
    #: ``(3, K)`` bool: the chains of :data:`POLICIES` (mixed options only,
    #: :func:`mixed_offload_options`); ``allowed`` is one row per stage
    policy_chains: np.ndarray | None = None
    #: Mobius (:func:`swap_options`): ``(K, P)`` seconds per parameter byte of
    #: a stage's weights copied in and of its gradients copied out, and each
    #: rank's PCIe queue (:func:`pipesearch.host.swap_queues`)
    swap_in_s_per_param_byte: np.ndarray | None = None
    swap_out_s_per_param_byte: np.ndarray | None = None
    swap_queue: tuple[int, ...] | None = None
    #: activation offload (:func:`activation_host_level`): ``(K, P, L+1)``
    #: prefix sums of the seconds (profiled-device seconds, as the times)
    #: one micro-batch's kept activations take over the stage's PCIe share
    #: in one direction (0 for options that keep them on the device), and
    #: ``(K,)`` the micro-batches whose activations stay on the device
    #: (``inf``: all in flight; :data:`ACT_HOST_RESIDENT` when offloaded)
    act_copy_prefix_s: np.ndarray | None = None
    act_resident_micro_batches: np.ndarray | None = None
    #: streamed weights (:func:`stream_options`, :func:`mixed_stream_options`):
    #: ``(K, levels, L)`` :func:`range_max_table` of a streamed layer's weight
    #: and gradient buffers, added to the transient term (0 on the device)
    buffer_table_bytes: np.ndarray | None = None
    #: streamed weights: bytes each streamed copy of the one stage adds, the
    #: matrix its last layer shares with its first (a tied embedding, copied
    #: in for the head as for the embedding); 0 with several stages (the
    #: last one keeps its own copy, ``PipelineCosts.tied_copy_bytes``)
    stream_tied_bytes: float = 0.0
    #: Mobius with activations in host memory (:func:`swap_options`):
    #: ``(K, P, L+1)`` prefix sums of the seconds one micro-batch's kept
    #: activations take on the stage's PCIe queue (each direction), copy
    #: nodes of :func:`pipesearch.timemodel.mobius_graph`, not in the times
    swap_act_copy_prefix_s: np.ndarray | None = None
    #: Mobius (:func:`swap_options`): ``(R, N)`` GPUs of rank ``r`` on node
    #: ``n`` (:func:`pipesearch.host.rank_gpus_per_node`) and ``(N,)`` each
    #: node's host memory: the whole split's host check, all stages of a
    #: node together (:meth:`pipesearch.costs.PipelineCosts.mobius_node_host_bytes`)
    swap_node_gpus: np.ndarray | None = None
    node_host_memory_bytes: np.ndarray | None = None

    def __post_init__(self):
        P = self.host_step_s_per_param_byte.shape[1]
        masks = np.ones((len(self.names), P), dtype=bool) if self.allowed is None else self.allowed
        checked = ("fwd_prefix_s", "compute_prefix_s", "bwd_input_prefix_s", "host_step_s_per_param_byte") + (
            ("act_copy_prefix_s",) if self.act_copy_prefix_s is not None else ())
        for s in {tuple(col) for col in masks.T}:
            keep = np.flatnonzero(s)
            for name in checked:
                arr = getattr(self, name)[keep]
                steps = np.diff(arr, axis=-1) if name != "host_step_s_per_param_byte" else arr
                if np.any(np.diff(steps, axis=0) < -1e-12 * np.maximum(1.0, np.abs(steps[1:]))):
                    raise ValueError(f"stage options {tuple(self.names[k] for k in keep)}: {name} decreases "
                                     "from one option to the next; options must be ordered fastest first, "
                                     "layer by layer")

    def with_step_floor(self, device_step_rate) -> StageOptions:
        """These options with every positive host step at least the
        stage's own GPU step, ``device_step_rate`` ``(P,)`` seconds per
        parameter byte (:meth:`pipesearch.costs.PipelineCosts.device_step_s`):
        a chain from an on-device option to an offloaded one must not get
        faster after the last backward. The floor binds only where a
        device's memory streams the state slower than its PCIe copies and
        the CPU's Adam run (under about 35 GB/s: no GPU of the catalog)."""
        step = self.host_step_s_per_param_byte
        floored = np.where(step > 0, np.maximum(step, np.asarray(device_step_rate, dtype=float)[None, :]), step)
        return self if np.array_equal(floored, step) else replace(self, host_step_s_per_param_byte=floored)

    def with_policies(self, policies) -> StageOptions:
        """These options with stage ``s`` restricted to the chain
        ``policies[s]`` (an index into :data:`POLICIES`; ``(P,)`` ints).
        Raises ValueError without :attr:`policy_chains`."""
        if self.policy_chains is None:
            raise ValueError(f"stage options {self.names} have no per-stage chains to choose from")
        return replace(self, allowed=self.policy_chains[np.asarray(policies, dtype=np.int64)].T.copy())


RECOMPUTE_OPTIONS = ("none", "full")
"""Per-stage recompute options of a profile with ``recompute_saved_bytes``."""


def stage_options(profile: ModelProfile, cluster: Cluster, job: Job, *, ratio: float, dp: int,
                  placement: np.ndarray, tp: int = 1, offload: bool = False,
                  stages_per_device: int = 1,
                  option_profiles: tuple[tuple[str, ModelProfile], ...] | None = None,
                  time_scale: np.ndarray | None = None) -> StageOptions | None:
    """The per-stage memory options of a search point, fastest first, or
    ``None`` when a stage has only its plain one.

    * Recompute (profiles whose layers have ``recompute_saved_bytes``):
      ``full`` keeps only each recomputable layer's checkpoint per in-flight
      micro-batch and re-runs its forward in backward: the layer's backward
      and its input-gradient part each grow by its forward time (Chen et al.
      2016 sec. 3; Korthikanti et al. 2022 sec. 4), and the layer whose
      backward runs holds its full saved activations once more (the
      transient term).
    * Optimizer offload (``offload`` and a cluster with ``[host]``):
      ``+offload`` keeps the optimizer state in host memory
      (:func:`pipesearch.memory.offload_bytes_per_param`) and adds its step
      after the stage's last backward
      (:func:`pipesearch.host.offload_step_s_per_param`, worst-case PCIe
      sharing); host memory is divided among the node's GPUs
      (:func:`pipesearch.host.host_memory_share_bytes`).

    * Recompute modes of a transformer (``option_profiles``: the
      ``none``, ``selective`` and ``full`` layer tables of one tensor-parallel
      degree, :func:`pipesearch.profiles.transformer.layer_table`): each
      table's own times and saved bytes; with offload the chain is the first
      mode, then every mode with ``+offload``.

    The chain: ``none, full`` without offload; ``none, none+offload,
    full+offload`` with it (``on-device, offload`` for a layer table without
    recompute columns, e.g. a transformer variant, whose recompute mode is
    the variant's). With offload a profile's stage cannot recompute without
    also offloading (``full`` and ``none+offload`` are not ordered: one adds
    backward time, the other time after backward). Every option's times are at least the previous
    one's, layer by layer (:class:`StageOptions`).

    * Activation offload (``job.activation_offload``, a cluster with
      ``[host]``, one stage per device): :func:`activation_host_options`
      (``time_scale``: ``(P,)`` the stages' device speed factors, for the
      copies' profiled-device seconds).
    """
    arrays = profile.layer_arrays
    recompute = bool(arrays["recomputable"].any())
    offload = offload and cluster.host is not None
    if getattr(job, "activation_offload", False) and cluster.host is not None and stages_per_device == 1:
        return activation_host_options(profile, cluster, job, ratio=ratio, dp=dp, placement=placement, tp=tp,
                                       offload=offload, option_profiles=option_profiles,
                                       time_scale=np.ones(len(placement)) if time_scale is None else time_scale)
    if option_profiles:
        return _table_options(option_profiles, cluster, job, ratio=ratio, dp=dp, placement=placement, tp=tp,
                              offload=offload, stages_per_device=stages_per_device)
    if not recompute and not offload:
        return None
    if offload and recompute:  # every recompute level with and without offload (docs/offload.md)
        return mixed_offload_options(_profile_levels(profile, ratio),
                                     *_offload_terms(profile, cluster, job, dp, placement, tp, offload,
                                                     stages_per_device))
    names = (("none", "none+offload", "full+offload") if recompute else ("on-device", "offload")) if offload \
        else RECOMPUTE_OPTIONS
    times = profile.layer_times_at(ratio * profile.profiled_batch_size)
    fwd, bwd, bin_ = (times[k] for k in ("fwd_s", "bwd_s", "bwd_input_s"))
    rc = arrays["recomputable"]
    saved, ckpt = arrays["saved_bytes"] * ratio, arrays["recompute_saved_bytes"] * ratio
    on_device, off_device, off_host, step, host_cap = _offload_terms(profile, cluster, job, dp, placement, tp,
                                                                     offload, stages_per_device)
    rows = _empty_rows()
    for name in names:
        full = name.startswith("full")
        extra = rc * fwd if full else 0 * fwd
        rows["fwd"].append(_prefix(fwd))
        rows["compute"].append(_prefix(fwd + bwd + extra))
        rows["bin"].append(_prefix(bin_ + extra))
        rows["saved"].append(_prefix(np.where(rc > 0, ckpt, saved) if full else saved))
        rows["transient"].append(_level_transient(arrays, ratio, full))
        off = name.endswith("offload")
        rows["state"].append(off_device if off else on_device)
        rows["host"].append(off_host if off else 0.0)
        rows["step"].append(step if off else np.zeros(len(placement)))
    return _stack_options(names, rows, host_cap)


def _empty_rows() -> dict[str, list]:
    """One list per :class:`StageOptions` array, filled option by option
    (``copy`` and ``resident`` only by activation offload: left empty,
    :class:`StageOptions` gets no activation copies)."""
    return {key: [] for key in ("fwd", "compute", "bin", "saved", "transient", "state", "host", "step", "copy",
                                "resident")}


def _stack_options(names, rows: dict, host_cap: np.ndarray, **chains) -> StageOptions:
    """:class:`StageOptions` from rows filled option by option (``chains``:
    its ``allowed`` and ``policy_chains``, when given)."""
    return StageOptions(
        names=tuple(names), fwd_prefix_s=np.stack(rows["fwd"]), compute_prefix_s=np.stack(rows["compute"]),
        bwd_input_prefix_s=np.stack(rows["bin"]), saved_prefix_bytes=np.stack(rows["saved"]),
        transient_table_bytes=np.stack(rows["transient"]),
        state_bytes_per_param_byte=np.array(rows["state"], dtype=float),
        host_bytes_per_param_byte=np.array(rows["host"], dtype=float),
        host_step_s_per_param_byte=np.stack(rows["step"]), host_capacity_bytes=host_cap, **chains,
        **({"act_copy_prefix_s": np.stack(rows["copy"]),
            "act_resident_micro_batches": np.array(rows["resident"], dtype=float)} if rows["copy"] else {}),
    )


def _offload_terms(profile: ModelProfile, cluster: Cluster, job: Job, dp: int, placement: np.ndarray, tp: int,
                   offload: bool, stages_per_device: int, flows: int = 1):
    """Per parameter byte: device state on the device and offloaded, host
    state offloaded; per stage: the offloaded step (s per parameter byte;
    its copies at ``1 / flows`` of the GPU's PCIe share) and the host
    memory share (:mod:`pipesearch.host`)."""
    from . import host as host_lib
    from .memory import offload_bytes_per_param, offload_copy_bytes_per_param

    state = param_state_of(job, len(placement) // stages_per_device)
    on_device = state.bytes_per_param(dp) / profile.bytes_per_param
    off_device, off_host = (x / profile.bytes_per_param for x in offload_bytes_per_param(state, dp))
    P = len(placement)
    step, host_cap = np.zeros(P), np.zeros(P)
    if offload:
        share = state.update_share(dp)
        step = host_lib.offload_step_s_per_param(
            cluster.host, host_lib.stage_switch_sharing(cluster, placement, tp),
            host_lib.node_sharing(cluster, placement, tp), *offload_copy_bytes_per_param(state), share=share,
            flows=flows) / profile.bytes_per_param
        host_cap = host_lib.host_memory_share_bytes(cluster, placement, tp, stages_per_device)
    return on_device, off_device, off_host, step, host_cap


def _table_options(option_profiles, cluster: Cluster, job: Job, *, ratio: float, dp: int, placement: np.ndarray,
                   tp: int, offload: bool, stages_per_device: int) -> StageOptions:
    """:func:`stage_options` from one layer table per recompute mode."""
    first = option_profiles[0][1]
    on_device, off_device, off_host, step, host_cap = _offload_terms(first, cluster, job, dp, placement, tp,
                                                                     offload, stages_per_device)
    if offload and len(option_profiles) > 1:  # every mode with and without offload (docs/offload.md)
        return mixed_offload_options(_table_levels(option_profiles, ratio), on_device, off_device, off_host,
                                     step, host_cap)
    chain = ([(n, p, False) for n, p in option_profiles] if not offload
             else [(option_profiles[0][0], option_profiles[0][1], False)]
             + [(f"{n}+offload", p, True) for n, p in option_profiles])
    rows = _empty_rows()
    for _, prof, off in chain:
        a = prof.layer_arrays
        times = prof.layer_times_at(ratio * prof.profiled_batch_size)
        fwd, bwd, bin_ = (times[k] for k in ("fwd_s", "bwd_s", "bwd_input_s"))
        rows["fwd"].append(_prefix(fwd))
        rows["compute"].append(_prefix(fwd + bwd))
        rows["bin"].append(_prefix(bin_))
        rows["saved"].append(_prefix(a["saved_bytes"] * ratio))
        rows["transient"].append(_level_transient(a, ratio))
        rows["state"].append(off_device if off else on_device)
        rows["host"].append(off_host if off else 0.0)
        rows["step"].append(step if off else np.zeros(len(placement)))
    return _stack_options([n for n, _, _ in chain], rows, host_cap)


ACT_HOST_RESIDENT = 3
"""Micro-batches whose activations an activation-offloading stage keeps on
its GPU: the one its action computes, the one whose copy to the host is
leaving and the one being prefetched for the next backward (reached by the
last warm-up forward, which produces one while the previous one leaves and
the first backward's comes back; :func:`activation_host_options`)."""

ACT_HOST = "act-host"
"""Name part of the options whose saved activations live in host memory."""


def offloads_activations(option: str) -> bool:
    """Whether the per-stage memory option named ``option`` (e.g.
    ``full+act-host``, ``swap+act-host``) keeps its saved activations in host
    memory (:data:`ACT_HOST` is one of its ``+`` parts)."""
    return ACT_HOST in option.split("+")


def activation_host_options(profile: ModelProfile, cluster: Cluster, job: Job, *, ratio: float, dp: int,
                            placement: np.ndarray, tp: int, offload: bool,
                            option_profiles: tuple[tuple[str, ModelProfile], ...] | None,
                            time_scale: np.ndarray) -> StageOptions:
    """The chain of recompute levels with, after the last, that level's
    activations (its checkpoints when it recomputes) offloaded to host
    memory (``<level>+act-host``; ``act-host`` for a table without recompute
    levels), and with ``offload`` every level also with the optimizer
    offloaded (:func:`mixed_offload_options`: the offloaded activations are
    one more level, the slowest).

    Activation offload is ZeRO-Infinity's / DeepSpeed's activation
    checkpoint offload (Rajbhandari et al. SC'21, sec. 5; DeepSpeed's
    ``activation_checkpointing.cpu_checkpointing``) and Mobius' and
    RoundPipe's checkpoints in host memory: after its forward a micro-batch's
    kept activations go to the host, before its backward they come back
    (:func:`activation_host_level`; memory and host bytes in
    :meth:`pipesearch.costs.PipelineCosts.activation_bytes`). It is offered
    after the last recompute level only: ``none+act-host`` and ``full`` are
    not ordered (one waits for copies, the other recomputes), and the chain
    must be ordered for the first fitting option to be the fastest
    (:class:`StageOptions`); offloading the checkpoints is what those
    runtimes do. One stage per device (the copies of a stage wait in its own
    actions; interleaved chunks of a GPU would share its link unmodelled).
    """
    levels = (_table_levels(option_profiles, ratio) if option_profiles
              else _profile_levels(profile, ratio) if profile.layer_arrays["recomputable"].any()
              else [("on-device", _profile_levels(profile, ratio)[0][1])])
    first = option_profiles[0][1] if option_profiles else profile
    on_device, off_device, off_host, step, host_cap = _offload_terms(first, cluster, job, dp, placement, tp, True, 1)
    # the delayed step's copies run beside the next iteration's activation copies: two flows on one link
    flows = 2 if offload and job.delayed_optimizer_step else 1
    step_shared = _offload_terms(first, cluster, job, dp, placement, tp, True, 1, flows)[3]
    levels = levels + [activation_host_level(levels[-1], cluster, placement, tp, time_scale, flows, step_shared)]
    if offload:
        return mixed_offload_options(levels, on_device, off_device, off_host, step, host_cap)
    rows = _empty_rows()
    for _, lv in levels:
        for key in ("fwd", "compute", "bin", "saved", "transient"):
            rows[key].append(lv[key])
        rows["state"].append(on_device)
        rows["host"].append(0.0)
        rows["step"].append(np.zeros(len(placement)))
        rows["copy"].append(lv.get("copy", np.zeros((len(placement), lv["fwd"].shape[-1]))))
        rows["resident"].append(lv.get("resident", np.inf))
    return _stack_options([n for n, _ in levels], rows, host_cap)


def activation_host_level(level, cluster: Cluster, placement: np.ndarray, tp: int, time_scale: np.ndarray,
                          flows: int = 1, step_shared: np.ndarray | None = None):
    """``(name, rows)`` of recompute level ``level`` (``(name, rows)`` as
    :func:`mixed_offload_options` takes) with its kept activations in host
    memory.

    Per micro-batch the stage copies the activations it keeps of every layer
    (``saved`` of the level: all of them, or the checkpoints under
    recompute), ``x = kept / bw`` seconds, out after its forward and back
    before its backward, with ``bw`` the GPU's PCIe share with every GPU of
    the plan under its switch copying at once
    (:func:`pipesearch.host.activation_copy_s_per_byte`; PCIe is full duplex,
    each direction its own share). The copy out runs during the stage's next
    action, the copy in during the action before the backward, so an action
    carries at most one copy each way and lasts ``max(compute, x)``
    (:meth:`pipesearch.costs.PipelineCosts.fwd_s`; ZB-H1's input- and
    weight-gradient parts each). ``copy``: ``(P, L+1)`` prefix sums of ``x``
    per layer in profiled-device seconds (divided by the stage's
    ``time_scale``); ``resident``: :data:`ACT_HOST_RESIDENT`. With the
    optimizer offloaded and its step delayed (``flows = 2``) the step's
    copies share the link with the activations' (each gets half:
    ``copy_offload``, ``step_offload`` = ``step_shared``).
    """
    from . import host as host_lib

    name, lv = level
    kept = np.diff(lv["saved"])
    per_byte = host_lib.activation_copy_s_per_byte(cluster, placement, tp) / np.asarray(time_scale, dtype=float)
    copy = _prefix(kept[None, :] * per_byte[:, None])
    out = dict(lv, copy=copy, resident=float(ACT_HOST_RESIDENT))
    if flows > 1:
        out.update(copy_offload=copy * flows, step_offload=step_shared)
    return (ACT_HOST if name == "on-device" else f"{name}+{ACT_HOST}"), out


POLICIES = ("offload-first", "device-first", "relaxed")
"""The per-stage chains of :func:`mixed_offload_options`, by index: the
recompute levels offloaded (after the plain option), the levels on the
device (then the last one offloaded), and the relaxation every level (on
the device, then offloaded with its host step left out) that bounds both
from below (:mod:`pipesearch.option_search`). :func:`mixed_stream_options`
uses the same indices with the levels streamed in place of offloaded."""
OFFLOAD_FIRST, DEVICE_FIRST, RELAXED = range(3)



def _mark_chains(chains, kind: str, r: int, R: int, other: str) -> None:
    """The chains one option of a width-2 grid belongs to (recompute level
    ``r`` of ``0 .. R``, ``kind`` ``"device"``, ``other`` (the host-side
    variant: ``"offload"``, ``"stream"``) or ``"bound"``): the other-first
    chain (the plain level 0, then every ``other`` option), the device-first
    chain (every device option, then the last level's ``other``) and the
    relaxed one (all but the ``other`` options)."""
    chains[OFFLOAD_FIRST].append(kind == other or (kind == "device" and r == 0))
    chains[DEVICE_FIRST].append(kind == "device" or (kind == other and r == R))
    chains[RELAXED].append(kind != other)

def mixed_offload_options(levels, on_device: float, off_device: float, off_host: float, step: np.ndarray,
                          host_cap: np.ndarray) -> StageOptions:
    """Every recompute level x {on device, optimizer offloaded}: options
    ``(level)``, ``(level)+offload (bound)`` and ``(level)+offload`` per
    level, with three chains (:data:`POLICIES`) from which each stage takes
    one (:meth:`StageOptions.with_policies`; default: all offload-first).

    The options of a stage form a grid: recompute level ``r`` (times
    non-decreasing in ``r``, memory non-increasing) x offload (the same
    times, less device memory, a host step). ``full`` and ``none+offload``
    are not ordered, so no single chain holds the grid; its two chains
    offload-first (``(0), (0)+offload, (1)+offload, ...``) and device-first
    (``(0), (1), ..., (R), (R)+offload``) cover it (the grid has width 2:
    Dilworth). For any choice of options, the stage's option lies on one of
    them, and the first fitting option of that chain is at most as slow, so
    the best plan takes, per stage, one chain and its first fitting option.
    The relaxed chain (times of the least level that fits either way, no
    host step) is at most as slow as both, per stage and range: a lower
    bound for every choice of chains.

    Args:
        levels: ``(name, rows)`` per recompute level, fastest first; ``rows``
            holds ``fwd``, ``compute``, ``bin``, ``saved`` (``(L+1,)`` prefix
            sums) and ``transient`` (:func:`range_max_table`).
        on_device, off_device, off_host: state bytes per parameter byte on
            the device, and on the device and host when offloaded.
        step: ``(P,)`` offloaded step seconds per parameter byte.
        host_cap: ``(P,)`` host bytes each stage may fill.
    """
    rows, names, chains = _empty_rows(), [], [[], [], []]
    R = len(levels) - 1
    copies = any("copy" in lv for _, lv in levels)  # activation offload (activation_host_level)
    for r, (name, lv) in enumerate(levels):
        for kind in ("device", "bound", "offload"):
            for key in ("fwd", "compute", "bin", "saved", "transient"):
                rows[key].append(lv[key])
            off = kind != "device"
            rows["state"].append(off_device if off else on_device)
            rows["host"].append(off_host if off else 0.0)
            rows["step"].append(lv.get("step_offload", step) if kind == "offload" else np.zeros(len(step)))
            if copies:
                none = np.zeros((len(step), lv["fwd"].shape[-1]))
                rows["copy"].append(lv.get("copy_offload" if off else "copy", lv.get("copy", none)))
                rows["resident"].append(lv.get("resident", np.inf))
            names.append(name if kind == "device" else f"{name}+offload" + (" (bound)" if kind == "bound" else ""))
            _mark_chains(chains, kind, r, R, "offload")
    policy_chains = np.array(chains, dtype=bool)
    return _stack_options(names, rows, host_cap, policy_chains=policy_chains,
                          allowed=np.repeat(policy_chains[OFFLOAD_FIRST][:, None], len(step), axis=1))


def _level_transient(arrays: dict, ratio: float, full: bool = False) -> np.ndarray:
    """:func:`range_max_table` of what a layer holds once more while it runs
    its backward at micro-batch ``ratio`` x the profiled batch: a layer
    table's own recomputation (``backward_transient_bytes``) and, under
    ``full`` recomputation of a profile with ``recompute_saved_bytes``, a
    recomputed layer's whole saved activations (Chen et al. 2016)."""
    own = arrays["backward_transient_bytes"] * ratio
    if full:
        own = np.maximum(own, np.where(arrays["recomputable"] > 0, arrays["saved_bytes"] * ratio, 0.0))
    return range_max_table(own)


def _profile_levels(profile: ModelProfile, ratio: float):
    """``(name, rows)`` of ``none`` and ``full`` recompute of a profile with
    ``recompute_saved_bytes`` (:func:`stage_options`' terms)."""
    arrays = profile.layer_arrays
    times = profile.layer_times_at(ratio * profile.profiled_batch_size)
    fwd, bwd, bin_ = (times[k] for k in ("fwd_s", "bwd_s", "bwd_input_s"))
    rc = arrays["recomputable"]
    saved, ckpt = arrays["saved_bytes"] * ratio, arrays["recompute_saved_bytes"] * ratio
    extra = rc * fwd
    return [("none", dict(fwd=_prefix(fwd), compute=_prefix(fwd + bwd), bin=_prefix(bin_), saved=_prefix(saved),
                          transient=_level_transient(arrays, ratio))),
            ("full", dict(fwd=_prefix(fwd), compute=_prefix(fwd + bwd + extra), bin=_prefix(bin_ + extra),
                          saved=_prefix(np.where(rc > 0, ckpt, saved)),
                          transient=_level_transient(arrays, ratio, full=True)))]


def _table_levels(option_profiles, ratio: float):
    """``(name, rows)`` of one layer table per recompute mode."""
    out = []
    for name, prof in option_profiles:
        times = prof.layer_times_at(ratio * prof.profiled_batch_size)
        fwd, bwd, bin_ = (times[k] for k in ("fwd_s", "bwd_s", "bwd_input_s"))
        out.append((name, dict(fwd=_prefix(fwd), compute=_prefix(fwd + bwd), bin=_prefix(bin_),
                               saved=_prefix(prof.layer_arrays["saved_bytes"] * ratio),
                               transient=_level_transient(prof.layer_arrays, ratio))))
    return out


#: weight copies live on a streaming GPU: the layer computing and the one prefetched
STREAM_BUFFERS = 2


def stream_options(profile: ModelProfile, cluster: Cluster, job: Job, *, ratio: float, dp: int,
                   placement: np.ndarray, tp: int, time_scale: np.ndarray,
                   stages_per_device: int = 1,
                   option_profiles: tuple[tuple[str, ModelProfile], ...] | None = None) -> StageOptions:
    """Streamed weights: a streaming stage keeps its 16-bit weights, its
    gradients and its optimizer state in host memory and copies each
    layer's weights in before the layer runs, prefetching the next layer
    while one computes (ZeRO-Infinity, Rajbhandari et al. SC'21, sec. 5-6,
    parameters offloaded to the CPU and prefetched layer by layer; Mobius,
    Feng et al. ASPLOS'23, sec. 4, prefetch overlapped with compute).

    Per micro-batch, layer ``l`` of stage ``s`` takes ``max(fwd_l, w_l /
    bw_s)`` forward and ``max(bwd_l, (w_l + g_l) / bw_s)`` backward (its
    weights in again, its gradients out to be accumulated on the host; both
    directions share the GPU's PCIe share ``bw_s``, :mod:`pipesearch.host`
    with worst-case switch sharing), the input-gradient part scaled with
    the backward; after the last backward the CPU runs Adam (node-shared
    rate). The device holds ``STREAM_BUFFERS`` layers' weights and
    gradients (the largest of the stage) and the activations; the host
    ``2 + 16`` B per parameter (the streamed copy and ZeRO-Offload's fp32
    weights, gradients and moments), checked against its share.

    Recompute levels (``option_profiles``, the transformer's ``none``,
    ``selective`` and ``full`` tables of one tensor-parallel degree, or a
    profile with ``recompute_saved_bytes``: ``none`` and ``full``): every
    level on the device and streamed, ``(level)+stream``
    (:func:`mixed_stream_options`: two chains per stage, as for the
    optimizer offload); a recomputed streamed layer re-runs its forward in
    its backward, ``max(bwd_l + fwd_l, 2 w_l / bw_s)``, and holds its full
    activations once besides the two layers' buffers. Without levels the
    chain is ``on-device, stream``. ``time_scale``: ``(P,)`` the stages'
    device speed factors (the copies in profiled-device seconds).
    """
    from . import host as host_lib

    levels = (_table_levels(option_profiles, ratio) if option_profiles and len(option_profiles) > 1
              else _profile_levels(profile, ratio) if profile.layer_arrays["recomputable"].any() else None)
    first = option_profiles[0][1] if option_profiles else profile
    a = first.layer_arrays
    bpp = first.bytes_per_param
    state = param_state_of(job, len(placement) // stages_per_device)
    bw = host_lib.shared_bandwidth_bytes_per_s(cluster.host, host_lib.stage_switch_sharing(cluster, placement, tp))
    per_byte = 1.0 / (bw * np.asarray(time_scale, dtype=float))  # copy seconds per byte, profiled-device seconds
    P = len(placement)
    node = host_lib.node_sharing(cluster, placement, tp)
    share = state.update_share(dp)
    step = share * node / cluster.host.cpu_adam_params_per_s / bpp
    host_cap = host_lib.host_memory_share_bytes(cluster, placement, tp, stages_per_device)
    # one stage holds the embedding and the head: a tied matrix is copied in for each (its bytes are the first
    # layer's; with several stages the last keeps its own copy, PipelineCosts.tied_copy_bytes)
    tied = float(first.tied_param_bytes) if P == 1 else 0.0
    copied = np.asarray(a["param_bytes"], dtype=float).copy()
    copied[-1] += tied
    buffers = range_max_table(STREAM_BUFFERS * 2 * copied)
    if levels is not None:
        return replace(mixed_stream_options(levels, [streamed_level(lv, copied, per_byte) for _, lv in levels],
                                            buffers, state.bytes_per_param(dp) / bpp,
                                            stream_host_bytes_per_param_byte(state, dp, bpp), step, host_cap),
                       stream_tied_bytes=tied)
    plain = _profile_levels(first, ratio)[0][1]
    streamed = streamed_level(plain, copied, per_byte)
    base = {key: np.broadcast_to(plain[key], (P,) + plain[key].shape) for key in ("fwd", "compute", "bin")}
    return StageOptions(
        names=("on-device", "stream"),
        fwd_prefix_s=np.stack([base["fwd"], streamed["fwd"]]),
        compute_prefix_s=np.stack([base["compute"], streamed["compute"]]),
        bwd_input_prefix_s=np.stack([base["bin"], streamed["bin"]]),
        saved_prefix_bytes=np.stack([plain["saved"]] * 2),
        transient_table_bytes=np.stack([plain["transient"]] * 2),  # a recomputing layer's own, streamed or not
        buffer_table_bytes=np.stack([0 * buffers, buffers]),
        state_bytes_per_param_byte=np.array([state.bytes_per_param(dp) / bpp, 0.0]),
        host_bytes_per_param_byte=np.array([0.0, stream_host_bytes_per_param_byte(state, dp, bpp)]),
        host_step_s_per_param_byte=np.stack([np.zeros(P), step]),
        host_capacity_bytes=host_cap,
        stream_tied_bytes=tied,
    )


def stream_host_bytes_per_param_byte(state, dp: int, bytes_per_param: float) -> float:
    """Host bytes of a streamed (or Mobius-swapped) stage per parameter
    byte: its 16-bit copy (2 B per parameter) and ZeRO-Offload's fp32
    weights, gradients and moments (:func:`pipesearch.memory.offload_bytes_per_param`)."""
    from .memory import offload_bytes_per_param

    return (2.0 + offload_bytes_per_param(state, dp)[1]) / bytes_per_param


def streamed_level(level: dict, param_bytes: np.ndarray, per_byte: np.ndarray) -> dict:
    """The rows of one recompute level (``fwd``, ``compute``, ``bin`` as
    ``(L+1,)`` prefix sums, as :func:`mixed_offload_options` takes) with
    the weights streamed: per stage ``s`` (``per_byte``: ``(P,)`` copy
    seconds per byte) and layer ``l``, forward ``max(fwd_l, w_l x
    per_byte_s)`` and backward ``max(bwd_l, 2 w_l x per_byte_s)``, ``bwd_l``
    the level's backward (with its recomputed forward), the input-gradient
    part scaled with the backward; returns ``(P, L+1)`` prefix sums (the
    other rows as given).

    Along the recompute levels the streamed times stay ordered: the
    forward and backward are maxima of the level's (non-decreasing) times
    and a fixed copy, and the input-gradient part ``I x max(1, c / B)``
    does not decrease when a level adds the same recomputed forward ``e``
    to ``I <= B`` and ``B`` (:class:`StageOptions` checks it).
    """
    fwd, bwd_input = np.diff(level["fwd"]), np.diff(level["bin"])
    bwd = np.diff(level["compute"]) - fwd
    w = np.asarray(param_bytes, dtype=float)[None, :] * np.asarray(per_byte, dtype=float)[:, None]
    sfwd = np.maximum(fwd[None, :], w)
    sbwd = np.maximum(bwd[None, :], 2 * w)
    sbin = np.where(bwd > 0, bwd_input * sbwd / np.where(bwd > 0, bwd, 1.0), bwd_input)
    return dict(level, fwd=_prefix(sfwd), compute=_prefix(sfwd + sbwd), bin=_prefix(sbin))


def _layerwise_min(a: dict, b: dict) -> dict:
    """Rows whose per-layer forward, backward and input-gradient times are
    the least of ``a``'s and ``b``'s (prefix sums, broadcast to the larger
    shape); the other rows ``a``'s."""
    fa, fb = np.diff(a["fwd"]), np.diff(b["fwd"])
    ba, bb = np.diff(a["compute"]) - fa, np.diff(b["compute"]) - fb
    fwd, bwd = np.minimum(fa, fb), np.minimum(ba, bb)
    return dict(a, fwd=_prefix(fwd), compute=_prefix(fwd + bwd),
                bin=_prefix(np.minimum(np.diff(a["bin"]), np.diff(b["bin"]))))


def mixed_stream_options(levels, streamed, buffers: np.ndarray, on_device: float, host_bytes: float,
                         step: np.ndarray, host_cap: np.ndarray) -> StageOptions:
    """Every recompute level on the device and streamed: options
    ``(level)``, ``(level)+stream (bound)`` and ``(level)+stream`` per
    level, with the chains of :data:`POLICIES` (the off-device option of
    a level is its streamed one).

    The grid is ordered as the optimizer offload's
    (:func:`mixed_offload_options`): recompute level ``r`` (times
    non-decreasing in ``r``, device memory non-increasing) x {on device,
    streamed} (times at least the level's: each is a maximum with the
    copy; device memory of the weights down to two layers' buffers). A
    streamed level and a higher level on the device are not ordered, so the
    two chains are **stream-first** ``(none), none+stream, selective+stream,
    full+stream`` and **device-first** ``none, selective, full,
    full+stream``; each stage takes one (:func:`pipesearch.option_search.
    exact_split_over_policies`) and its first fitting option. The relaxed
    chain's ``(level)+stream (bound)`` has the streamed memory; a stage
    that takes it fits neither a lower level nor this level on the device,
    so stream-first runs this level streamed (or a later one) and
    device-first a higher level on the device or the last level streamed:
    its times are, layer by layer, the least of this level streamed and the
    next level on the device, without the host step (at the last level
    both chains run it streamed: its times and step). Per stage and range
    at most as slow as both chains' first fitting options, and still a
    chain (``level r <= bound r <= level r+1``).

    Args:
        levels: ``(name, rows)`` per recompute level, fastest first
            (:func:`_profile_levels`, :func:`_table_levels`).
        streamed: per level, its rows streamed (:func:`streamed_level`).
        buffers: :func:`range_max_table` of a layer's two streamed buffers
            (``STREAM_BUFFERS`` x weights + gradients), added to a streamed
            option's transient: the recomputed layer's activations and the
            largest layer's buffers may coincide, so their range maxima add.
        on_device: device state bytes per parameter byte on the device.
        host_bytes: host bytes per parameter byte streamed
            (:func:`stream_host_bytes_per_param_byte`).
        step: ``(P,)`` CPU Adam seconds per parameter byte.
        host_cap: ``(P,)`` host bytes each stage may fill.
    """
    P = len(step)
    rows, names, chains, buffer_rows = _empty_rows(), [], [[], [], []], []
    R = len(levels) - 1
    for r, ((name, lv), st) in enumerate(zip(levels, streamed)):
        bound = st if r == R else _layerwise_min(st, levels[r + 1][1])
        for kind in ("device", "bound", "stream"):
            src = {"device": lv, "bound": bound, "stream": st}[kind]
            for key in ("fwd", "compute", "bin"):
                rows[key].append(np.broadcast_to(src[key], (P, src[key].shape[-1])))
            rows["saved"].append(lv["saved"])
            rows["transient"].append(lv["transient"])
            buffer_rows.append(buffers if kind != "device" else 0 * buffers)
            rows["state"].append(on_device if kind == "device" else 0.0)
            rows["host"].append(0.0 if kind == "device" else host_bytes)
            rows["step"].append(step if kind == "stream" or (kind == "bound" and r == R) else np.zeros(P))
            names.append(name if kind == "device" else f"{name}+stream" + (" (bound)" if kind == "bound" else ""))
            _mark_chains(chains, kind, r, R, "stream")
    policy_chains = np.array(chains, dtype=bool)
    return _stack_options(names, rows, host_cap, policy_chains=policy_chains,
                          allowed=np.repeat(policy_chains[OFFLOAD_FIRST][:, None], P, axis=1),
                          buffer_table_bytes=np.stack(buffer_rows))


def swap_options(profile: ModelProfile, cluster: Cluster, job: Job, *, ratio: float, dp: int,
                 placement: np.ndarray, tp: int, pp: int) -> StageOptions:
    """The one option of a Mobius stage, ``swap`` (Feng et al., ASPLOS'23,
    sec. 3): its 16-bit weights, gradients and optimizer state live in host
    memory; the GPU holds the stage computing and the one prefetched, each
    with its weights and gradients (2 + 2 B per parameter for 16-bit
    training), and the activations of all its stages: the device check is
    :func:`swap_device_bytes` (whole splits, in
    :meth:`pipesearch.costs.PipelineCosts.stage_times`: a split over it
    takes forever). Per stage, the options' memory is what the stage holds
    on its GPU while it runs: its activations and its own weights and
    gradients (2 B per parameter byte), checked against the whole device, a
    necessary part of the GPU's peak (the stage is in some stay pair, whose
    weights and gradients are at least its own). Each
    stay of the stage on its GPU copies its weights in, each stay with
    backwards its gradients out (:func:`pipesearch.timemodel.mobius_graph`),
    one copy at a time per PCIe switch at the link's rate
    (``min(host_to_device, switch_uplink)``), times the rank's GPUs under
    one switch (:func:`pipesearch.host.swap_queues`). After its gradients
    are out, the CPU runs Adam on the stage (node-shared rate, as for
    :func:`stream_options`). The host keeps ``2 + 16`` B per parameter
    (the 16-bit copy and ZeRO-Offload's fp32 weights, gradients and moments).
    Host memory is one pool per node: each stage alone is checked against
    its node's memory over its rank's GPUs there (``host_capacity_bytes``),
    and the whole split, all stages of a node together, in
    :meth:`pipesearch.costs.PipelineCosts.stage_times`
    (:meth:`~pipesearch.costs.PipelineCosts.mobius_node_host_bytes`).

    ``placement`` holds the ``(P, dp)`` heads of all ``P = pp * vp`` stages
    (stage ``s`` on rank ``s % pp``).

    With ``job.activation_offload`` a second option, ``swap+act-host``:
    every micro-batch's saved activations go to host memory after its
    forward and come back before its backward, copies on the same queues
    at the same rate (:func:`pipesearch.timemodel.mobius_graph` with
    ``act``; ``swap_act_copy_prefix_s``, zero for ``swap``), and at most
    :data:`ACT_HOST_RESIDENT` micro-batches of a stage are counted on the
    device (all ``m`` in host memory). The choice is per stage, only where
    the GPU's memory requires it (:func:`mobius_activation_choice`): the
    per-stage times of the two options are equal, the copies are nodes of
    the graph.

    Raises:
        InputError: the cluster has no ``[host]`` table.
    """
    from . import host as host_lib
    from .errors import InputError
    from .memory import offload_bytes_per_param

    if cluster.host is None:
        raise InputError(f"schedule mobius: cluster {cluster.name!r} has no [host] table (host memory and PCIe "
                         "switches); add one (docs/offload.md) or choose another schedule")
    a = profile.layer_arrays
    bpp = profile.bytes_per_param
    state = param_state_of(job, pp)
    P = len(placement)
    queue, copies = host_lib.swap_queues(cluster, np.asarray(placement)[:pp], tp)
    link = min(cluster.host.host_to_device_bytes_per_s, cluster.host.switch_uplink_bytes_per_s)
    per_byte = (copies / link)[np.arange(P) % pp][None, :]
    node = host_lib.node_sharing(cluster, placement, tp)
    share = state.update_share(dp)
    times = profile.layer_times_at(ratio * profile.profiled_batch_size)
    fwd, bwd, bin_ = (times[k] for k in ("fwd_s", "bwd_s", "bwd_input_s"))
    act = bool(getattr(job, "activation_offload", False))
    K = 2 if act else 1
    copy = _prefix(a["saved_bytes"][None, :] * ratio * per_byte[0][:, None])
    act_terms = {} if not act else dict(
        act_resident_micro_batches=np.array([np.inf, float(ACT_HOST_RESIDENT)]),
        swap_act_copy_prefix_s=np.stack([0 * copy, copy]))

    def rows(x):
        return np.repeat(np.asarray(x, dtype=float)[None], K, axis=0)

    gpus = host_lib.rank_gpus_per_node(cluster, np.asarray(placement)[:pp], tp)

    return StageOptions(
        names=("swap", f"swap+{ACT_HOST}")[:K], fwd_prefix_s=rows(_prefix(fwd)),
        compute_prefix_s=rows(_prefix(fwd + bwd)),
        bwd_input_prefix_s=rows(_prefix(bin_)), saved_prefix_bytes=rows(_prefix(a["saved_bytes"] * ratio)),
        transient_table_bytes=rows(_level_transient(a, ratio)),
        state_bytes_per_param_byte=np.full(K, SWAP_DEVICE_BYTES_PER_PARAM_BYTE),
        host_bytes_per_param_byte=np.full(K, (2.0 + offload_bytes_per_param(state, dp)[1]) / bpp),
        host_step_s_per_param_byte=rows(share * node / cluster.host.cpu_adam_params_per_s / bpp),
        host_capacity_bytes=cluster.host.memory_bytes / gpus.max(axis=1)[np.arange(P) % pp],
        swap_in_s_per_param_byte=rows(per_byte[0]), swap_out_s_per_param_byte=rows(per_byte[0]), swap_queue=queue,
        swap_node_gpus=gpus, node_host_memory_bytes=np.full(cluster.num_nodes, float(cluster.host.memory_bytes)),
        **act_terms,
    )


#: Mobius: device bytes of a resident stage's 16-bit weights and gradients per parameter byte
#: (2 B + 2 B per parameter of 2 B: Feng et al., ASPLOS'23, sec. 3)
SWAP_DEVICE_BYTES_PER_PARAM_BYTE = 2.0


def swap_device_bytes(param_bytes: np.ndarray, own_bytes: np.ndarray, pp: int) -> np.ndarray:
    """Peak bytes of each Mobius GPU (:func:`swap_options`): what all its
    stages hold besides their weights and gradients, ``own_bytes``
    (activations, and the bytes a stage holds whatever the split: the tied
    copy, gathered weights), plus the largest weights + gradients of two
    stays in a row (:func:`pipesearch.timemodel.mobius_residencies`: stages
    ``c`` and ``c + 1`` of the rank while one computes and the next is
    prefetched; the one stage alone when ``vp = 1``), at
    :data:`SWAP_DEVICE_BYTES_PER_PARAM_BYTE` bytes of weight and gradient per
    parameter byte. A stage's own device bytes (``own`` + its weights and
    gradients) are at most its GPU's peak.

    ``param_bytes`` and ``own_bytes`` are ``(..., S)`` with stage ``s`` on
    rank ``s % pp``; returns ``(..., pp)`` with the rank's peak repeated
    over its stages' positions' first ``pp`` entries (rank ``r`` at ``r``).
    """
    wg = SWAP_DEVICE_BYTES_PER_PARAM_BYTE * np.asarray(param_bytes, dtype=float)
    own = np.asarray(own_bytes, dtype=float)
    S = wg.shape[-1]
    v = S // pp
    wg = wg.reshape(wg.shape[:-1] + (v, pp))
    own = own.reshape(own.shape[:-1] + (v, pp)).sum(axis=-2)
    pairs = wg[..., :-1, :] + wg[..., 1:, :] if v > 1 else wg
    return own + pairs.max(axis=-2)


def mobius_activation_choice(first: np.ndarray, can_keep: np.ndarray, can_offload: np.ndarray,
                             own_bytes: np.ndarray, pair_bytes: np.ndarray, capacity_bytes: np.ndarray,
                             pp: int, time_of, host_fits=None) -> tuple[np.ndarray, np.ndarray]:
    """Which Mobius stages keep their activations in host memory, per split:
    the fastest choice that fits every GPU (docs/offload.md, "Mobius with
    activations in host memory").

    A GPU holds the activations of all its stages plus two stays' weights
    (:func:`swap_device_bytes`), so the choice is per GPU, not per stage.
    Each stage offloads where its own check requires it (``first``, its
    first fitting option); a GPU still over its capacity tries every
    set of its other stages that can offload, smallest first, keeping the
    minimal sets that fit; the sets of all such GPUs are crossed and each
    combination is timed (``time_of``). Exact: the graph of a set of
    offloading stages holds every path of the graph of a subset
    (:func:`pipesearch.timemodel.mobius_graph`), so the makespan never
    drops when a stage offloads, and every choice that fits contains one of
    the combinations tried. Ties keep the fewer offloading stages, then the
    earlier combination.

    Args (``n`` splits, ``S`` stages, stage ``s`` on GPU ``s % pp``):
        first: ``(n, S)`` bool, the stage's first fitting option offloads.
        can_keep, can_offload: ``(n, S)`` bool, each option fits the
            stage's own device and host checks.
        own_bytes: ``(2, n, S)`` the stage's own device bytes keeping and
            offloading (:func:`swap_device_bytes`' ``own_bytes``).
        pair_bytes: ``(n, pp)`` each GPU's largest two stays' weights and
            gradients.
        capacity_bytes: ``(pp,)`` the GPUs' capacities.
        time_of: ``(n_c,)`` split indices, ``(n_c, S)`` bool sets -> ``(n_c,)``
            makespans.
        host_fits: the same arguments -> ``(n_c,)`` bool, whether the host
            memory holds the choice (None: always). Offloading more stages
            only adds host bytes, so a choice the host refuses has no
            fitting superset: filtering the combinations keeps it exact.

    Returns ``(act, fits)``: ``(n, S)`` bool offloading stages, ``(n,)``
    bool whether some choice fits (``act`` is ``first`` where none does).
    """
    import itertools

    first = np.asarray(first, dtype=bool)
    n, S = first.shape
    rank = np.arange(S) % pp

    def device(act, rows):  # (len(rows), pp) peak bytes of the splits ``rows`` under ``act``
        own = np.where(act, own_bytes[1][rows], own_bytes[0][rows])
        return np.stack([own[..., rank == r].sum(axis=-1) for r in range(pp)], axis=-1) + pair_bytes[rows]

    over = device(first, np.arange(n)) > capacity_bytes
    act, fits = first.copy(), ~over.any(axis=1)
    host_ok = np.ones(n, dtype=bool) if host_fits is None else np.asarray(host_fits(np.arange(n), first), dtype=bool)
    searched = ~fits & host_ok  # the forced offloads alone overflowing the host: no superset fits
    fits &= host_ok
    cand_split, cand_sets = [], []
    for x in np.flatnonzero(searched):
        per_gpu = []
        for r in range(pp):
            if not over[x, r]:
                per_gpu.append([first[x]])
                continue
            free = [s for s in range(S) if rank[s] == r and not first[x, s] and can_keep[x, s] and can_offload[x, s]]
            minimal: list = []
            for size in range(1, len(free) + 1):
                for extra in itertools.combinations(free, size):
                    if any(set(e) <= set(extra) for e in minimal):
                        continue
                    trial = first[x].copy()
                    trial[list(extra)] = True
                    if device(trial[None], [x])[0, r] <= capacity_bytes[r]:
                        minimal.append(extra)
            per_gpu.append([_with(first[x], e) for e in minimal])
        for combo in itertools.product(*per_gpu):
            cand_split.append(x)
            cand_sets.append(np.any(np.stack(combo), axis=0))
    if cand_split and host_fits is not None:
        keep = np.asarray(host_fits(np.asarray(cand_split), np.stack(cand_sets)), dtype=bool)
        cand_split = [x for x, k in zip(cand_split, keep) if k]
        cand_sets = [c for c, k in zip(cand_sets, keep) if k]
    if cand_split:
        idx, sets = np.asarray(cand_split), np.stack(cand_sets)
        t = np.asarray(time_of(idx, sets), dtype=float)
        best: dict = {}
        for k in range(len(idx)):
            key = (t[k], int(sets[k].sum()))
            if idx[k] not in best or key < best[idx[k]][0]:
                best[idx[k]] = (key, sets[k])
        for x, (_, chosen) in best.items():
            act[x], fits[x] = chosen, True
    return act, fits


def _with(base: np.ndarray, extra) -> np.ndarray:
    """``base`` (bools) with the positions ``extra`` set."""
    out = base.copy()
    out[list(extra)] = True
    return out
