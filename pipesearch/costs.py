"""The cost model of one search point: per-stage compute, point-to-point,
all-reduce and memory, vectorized over contiguous layer ranges.

A search point fixes the pipeline degree ``pp``, the data-parallel degree
``dp``, the micro-batch size ``b``, the number of micro-batches ``m``, the
schedule and the placement of stages on devices. What is left is the split of
the layer chain into ``pp`` contiguous stages, which :mod:`pipesearch.partition`
optimizes exactly using the terms below. Stage ``s`` covering layers
``[i, j)`` costs (all per micro-batch unless said otherwise):

* compute: ``scale_s * (b / B) * sum_{l in [i, j)} (fwd_s[l] + bwd_s[l])`` with
  ``B`` the profiled batch size (times are linear in the batch size, as in
  PipeDream's planner, Narayanan et al. SOSP'19 sec. 3.1) and ``scale_s`` the
  ratio of the profiled device's FLOP rate to that of stage ``s``'s slowest
  device (:func:`device_rate_flops`: fp32 peak for fp32 profiles, achieved
  fp16 rate otherwise; 1 when they are the same type or the profiled device
  is unknown);
* p2p: the stage sends layer ``j-1``'s output forward and receives its gradient
  back, both over the link between its devices and the next stage's:
  ``2 * (latency + (b / B) * output_bytes[j-1] / bandwidth)`` (alpha-beta
  model; zero for the last stage);
* all-reduce of the stage's gradients across its ``dp`` replicas, once per
  iteration: ring, ``2 (d-1)/d * bytes / bw + 2 (d-1) * latency`` (Patarasuk &
  Yuan 2009; Thakur et al. 2005), or hierarchical (reduce-scatter in the node,
  ring across nodes, all-gather in the node) when replicas share nodes and that
  is faster, as NCCL chooses;
* memory of one device: ``params * state_bytes_per_param`` (weights, gradients,
  optimizer state by component, sharded over ``dp`` as ZeRO-1/2/3 or FSDP
  say: :mod:`pipesearch.memory`) ``+ (b / B) * saved_bytes[i, j) * in_flight(s)``
  (plus, on a last stage without the first layer, the copy of a tied
  embedding, and under ZeRO-3 the gathered weights) where
  ``in_flight`` is the number of micro-batches whose activations the schedule
  keeps on stage ``s`` at its peak (GPipe: ``m``, Huang et al. 2019; 1F1B:
  ``min(m, pp - s)``, Narayanan et al. ICML'21 PipeDream-Flush), which must
  not exceed ``device memory * (1 - memory_headroom_fraction) -
  memory_reserve_bytes`` (:func:`pipesearch.memory.usable_memory_bytes`).

Iteration time of a split into stages ``k = 0..pp-1`` with per-micro-batch time
``a_k = compute_k + p2p_k`` and all-reduce ``r_k``::

    T = sum_k a_k + max_k ((m - 1) * a_k + r_k)

The first term is the time one micro-batch takes to flow through the pipeline
and back (fill and drain); the second is the bottleneck stage processing the
other ``m - 1`` micro-batches and then its all-reduce. With equal stages, free
links and ``dp = 1`` it is GPipe's/1F1B's ``(m + p - 1) * t`` (Huang et al.
2019; Narayanan et al. SC'21 sec. 2.2). Transfers are assumed not to overlap the
sender's compute, and the all-reduce not to overlap the backward pass. The
discrete-event simulator (:mod:`pipesearch.simulate`) replays the schedule with
the same stage times and is the judge of the best candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

import numpy as np

from .errors import InputError
from .memory import FSDP_LIVE_UNITS, OFFLOAD_KEPT_COMPONENTS, param_state_of, usable_memory_bytes
from .overlap import CommOverlap, exposed_s
from .stage_options import (StageOptions, range_max, range_max_table, stage_options, stream_options,
                            swap_device_bytes, swap_options)
# placement is the one home of layouts, links and per-stage device terms; the
# names below are also reachable from here for callers of the cost model
from .placement import (allreduce_model, device_rate_flops, pipeline_placement,  # noqa: F401
                        placement_links, stage_capacity_bytes, stage_streaming_bandwidth, stage_time_scale)
from .types import Cluster, DeviceSpec, Job, Link, ModelProfile


def state_bytes_per_param(job: Job, dp: int) -> float:
    """Bytes of weights, gradients and optimizer state one device keeps per
    parameter, by component and sharding (:mod:`pipesearch.memory`): e.g.
    ``16 - 12 (1 - 1/dp)`` for mixed-precision Adam under ZeRO-1
    (Rajbhandari et al. SC'20, sec. 5.1: the optimizer states are partitioned
    across the data-parallel replicas), ``6 + 12/dp`` for Megatron-LM's
    distributed optimizer."""
    return param_state_of(job).bytes_per_param(dp)


def device_step_s_per_param_byte(state, dp: int, bytes_per_param: float, bandwidth_bytes_per_s) -> np.ndarray:
    """``(P,)`` seconds per parameter byte of each stage's optimizer step on
    its GPU: the bytes the step streams per parameter it updates
    (:attr:`pipesearch.memory.ParamState.step_bytes_per_param`) times the
    share it updates (:meth:`~pipesearch.memory.ParamState.update_share`,
    ``1 / dp`` from ZeRO-1 on), over the stage's streaming memory bandwidth
    ``(P,)`` bytes/s (the step is memory-bound: a few flops per 28-30 bytes),
    per byte of the profile's parameters (``bytes_per_param`` each); 0 for
    a profile without parameter sizes."""
    bandwidth = np.asarray(bandwidth_bytes_per_s, dtype=float)
    if bytes_per_param <= 0:
        return np.zeros_like(bandwidth)
    return state.step_bytes_per_param * state.update_share(dp) / bytes_per_param / bandwidth


def device_step_terms(state, dp: int, bytes_per_param: float, bandwidth_bytes_per_s, options: StageOptions | None,
                      delayed: bool) -> tuple[np.ndarray, StageOptions | None]:
    """``(rate, options)``: :func:`device_step_s_per_param_byte` and the
    stage options with their host steps floored at it
    (:meth:`pipesearch.stage_options.StageOptions.with_step_floor`; not
    for a ``delayed`` host step, which runs beside the next iteration)."""
    rate = device_step_s_per_param_byte(state, dp, bytes_per_param, bandwidth_bytes_per_s)
    return rate, (options.with_step_floor(rate) if options is not None and not delayed else options)


def in_flight_micro_batches(schedule: str, pp: int, m: int) -> np.ndarray:
    """Peak number of micro-batches whose activations stage ``s`` holds.

    Returns an int array of shape ``(pp,)``. GPipe: ``m`` on every stage
    (Huang et al. 2019); 1F1B: ``min(m, pp - s)`` (Narayanan et al. ICML'21).

    Raises:
        InputError: unknown schedule.
    """
    s = np.arange(pp)
    if schedule == "gpipe":
        return np.full(pp, m, dtype=np.int64)
    if schedule == "1f1b":
        return np.minimum(m, pp - s).astype(np.int64)
    raise InputError(f"unknown schedule {schedule!r} (expected one of: gpipe, 1f1b)")


PRECISIONS = ("auto", "fp32", "fp16")


def profile_precision(profile: ModelProfile, precision: str = "auto") -> str:
    """The rate at which ``profile``'s times convert between device types
    (:func:`pipesearch.placement.device_rate_flops`): ``"fp32"`` or
    ``"fp16"``, ``"auto"`` fp32 for a profile with 4-byte parameters, fp16
    otherwise; fp16 as ``"fp16@N"`` for a layer table computed at GEMM
    size ``N`` (:attr:`ModelProfile.gemm_size`: each type's rate at that
    size, as the table's own)."""
    if precision not in PRECISIONS:
        raise InputError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        precision = "fp32" if profile.bytes_per_param == 4 else "fp16"
    if precision == "fp16" and profile.gemm_size > 0:
        return f"fp16@{profile.gemm_size:g}"
    return precision


#: the row of :attr:`PipelineCosts.fixed_time_prefix_s` for each time prefix
_FIXED_ROWS = {"compute_prefix_s": 0, "fwd_prefix_s": 1, "bwd_input_prefix_s": 2}


def device_time_scale(profiled: DeviceSpec | None, target: DeviceSpec, precision: str = "fp16") -> float:
    """Factor that turns a time measured on ``profiled`` into one on ``target``:
    the ratio of their :func:`device_rate_flops`; 1.0 when the profiled device
    is unknown or is the target."""
    if profiled is None or profiled.name == target.name:
        return 1.0
    return device_rate_flops(profiled, precision) / device_rate_flops(target, precision)


_MEMO_SIZE = 4096  # ranges per option_index call worth remembering
_MEMO_ENTRIES = 16


@dataclass(frozen=True, eq=False)
class PipelineCosts:
    """Cost terms of one search point, vectorized over layer ranges ``[i, j)``.

    Arrays (``L`` layers, ``P`` = pp stages):
        compute_prefix_s: ``(L+1,)`` prefix sums of fwd+bwd seconds at the
            micro-batch size on the profiled device.
        fwd_prefix_s: ``(L+1,)`` the same for forward only.
        param_prefix_bytes: ``(L+1,)`` prefix sums of parameter bytes (profile dtype).
        saved_prefix_bytes: ``(L+1,)`` prefix sums of saved activation bytes at
            the micro-batch size.
        output_bytes: ``(L,)`` output bytes of each layer at the micro-batch size.
        time_scale: ``(P,)`` device speed factor of each stage.
        p2p_bandwidth_bytes_per_s, p2p_latency_s: ``(P,)`` link of the boundary
            after each stage (the last entry is unused).
        allreduce_s_per_byte, allreduce_fixed_s: ``(P,)`` all-reduce model of
            each stage's replicas.
        in_flight: ``(P,)`` micro-batches held per stage.
        capacity_bytes: ``(P,)`` usable memory per device of each stage.
        bwd_input_prefix_s: ``(L+1,)`` prefix sums of the input-gradient part
            of backward (zero-bubble schedules; half of backward when the
            profile does not split it).
        tied_copy_bytes: ``(P,)`` weights + gradients + optimizer state of
            the parameters the last layer shares with the first (tied
            embeddings), on the last stage when there are several: it keeps
            its own copy (Megatron-LM's embedding group; Shoeybi et al. 2019
            sec. 3 for the tied matrix); 0 elsewhere.
        gathered_table: :func:`range_max_table` of each layer's gathered
            ZeRO-3 / FSDP bytes (its unit's weights, times the live copies),
            when each device holds one stage: a stage then holds the two
            largest-unit copies of its own layers (``gathered_bytes`` is 0);
            ``None`` otherwise.
        gathered_bytes: ``(P,)`` each stage's part of the bytes its device
            holds whatever the split (ZeRO-3 / FSDP: the gathered weights of
            the units computing and prefetched, divided among the device's
            stages).
        gather_bytes_per_param_byte: bytes the data-parallel all-gather of
            a sharded optimizer moves per profiled parameter byte (0: not
            sharded; the reduce is then an all-reduce).
        overlap: the job's :class:`pipesearch.overlap.CommOverlap` (``None``:
            none).
        wgrad_window: the gradient reduce hides under the weight-gradient
            part of the last backward only (zero-bubble schedules).
        params_per_param_byte: parameters per profiled parameter byte (for
            the bucket count).
        param_layer_prefix: ``(L+1,)`` prefix counts of layers with
            parameters (one bucket per layer).
        activation_share: ``(P,)`` the share of a micro-batch's saved
            activations one device of each stage keeps (per-stage
            replication, :mod:`pipesearch.replication`: ``ceil(b / r_k) / b``
            when ``r_k`` replicas split each micro-batch of ``b``); ``None``
            means 1 on every stage.

    Both are fixed per stage (a split into ``P > 1`` contiguous stages always
    puts the last layer without the first on the last stage), so
    ``capacity_bytes`` is given net of them and :meth:`memory_bytes` is the
    split-dependent part; :meth:`total_memory_bytes` adds them back.
        held_prefix_bytes, wgrad_counts: zero-bubble schedules (one stage
            per device): ``(L+1,)`` prefix sums of the bytes a micro-batch
            still holds between its ``I`` and ``W``
            (``Layer.wgrad_saved_bytes`` x micro-batch share), and ``(A, B)``
            of shape ``(P, Q)``: the count states of
            :func:`pipesearch.schedules.wgrad_states`, padded with zeros.
            Stage ``s`` then holds ``max_q (A[s, q] saved + B[s, q] held)``
            of activations instead of ``in_flight[s] saved``
            (:meth:`activation_bytes`).
    """

    num_micro_batches: int
    compute_prefix_s: np.ndarray
    fwd_prefix_s: np.ndarray
    param_prefix_bytes: np.ndarray
    saved_prefix_bytes: np.ndarray
    output_bytes: np.ndarray
    time_scale: np.ndarray
    p2p_bandwidth_bytes_per_s: np.ndarray
    p2p_latency_s: np.ndarray
    allreduce_s_per_byte: np.ndarray
    allreduce_fixed_s: np.ndarray
    in_flight: np.ndarray
    capacity_bytes: np.ndarray
    state_bytes_per_param_byte: float
    grad_bytes_per_param_byte: float
    bwd_input_prefix_s: np.ndarray | None = None
    tied_copy_bytes: np.ndarray | None = None
    gathered_bytes: np.ndarray | None = None
    gathered_table: np.ndarray | None = None
    options: StageOptions | None = None
    gather_bytes_per_param_byte: float = 0.0
    overlap: CommOverlap | None = None
    wgrad_window: bool = False
    params_per_param_byte: float = 0.0
    param_layer_prefix: np.ndarray | None = None
    activation_share: np.ndarray | None = None
    held_prefix_bytes: np.ndarray | None = None
    wgrad_counts: tuple[np.ndarray, np.ndarray] | None = None
    #: the host step runs beside the next iteration (Job.delayed_optimizer_step;
    #: timemodel.delayed_host_time_s), not after the stage's last backward
    delayed_host_step: bool = False
    #: ``(P,)`` bytes per second of each stage's GPU to or from host memory
    #: with every GPU of the plan under its switch copying at once
    #: (:func:`pipesearch.host.shared_bandwidth_bytes_per_s`); None without ``[host]``
    pcie_bandwidth_bytes_per_s: np.ndarray | None = None
    #: the ZeRO stage whose collectives recur with every micro-batch
    #: (:meth:`collective_counts`): 2 or 3 for a sharded state without a
    #: pipeline, 0 otherwise (one reduce and one gather per iteration)
    micro_batch_collectives: int = 0
    #: ``(R, Q, v)``: with ``v`` stages per device (stage ``c R + r`` on device
    #: ``r``), the in-flight counts of every chunk at each of the device's
    #: count states (:func:`pipesearch.schedules.chunk_states_of`); the split
    #: is then checked device by device (:meth:`device_memory_bytes`), each
    #: stage alone against its whole device. None: one stage per device, or
    #: the chunks' shares of the device (per-stage options)
    chunk_states: np.ndarray | None = None
    #: ``(3, L+1)`` prefix sums of the layers' fixed seconds (compute, forward,
    #: input gradient: the part of a layer's time that does not scale with the
    #: batch, :meth:`pipesearch.types.ModelProfile.layer_times_at`), with
    #: ``fixed_time_weight`` ``(P,)``: stage ``s``'s times are ``time_scale[s]
    #: (range(prefix) + fixed_time_weight[s] range(fixed))`` (weights >= 0; for
    #: stages whose devices run other batch sizes than the micro-batch the
    #: prefixes are at, :func:`pipesearch.replication.replicated_costs`). None:
    #: ``time_scale[s] range(prefix)``
    fixed_time_prefix_s: np.ndarray | None = None
    fixed_time_weight: np.ndarray | None = None
    #: :func:`range_max_table` of the layers' backward transient bytes per
    #: micro-batch (:attr:`pipesearch.types.Layer.backward_transient_bytes`:
    #: what a recomputing layer holds once more while it runs its backward);
    #: a stage adds its largest (without per-stage options, whose own
    #: transient tables hold it); None: none
    recompute_transient_table: np.ndarray | None = None
    #: ``(P,)`` 1 or 0: whether stage ``s`` counts its one-at-a-time bytes
    #: (:meth:`peak_extra_at`); a device computes one chunk at a time, so
    #: :meth:`at_device_peak` keeps them on the chunk of each device that
    #: has the most. None: every stage counts its own
    extra_stages: np.ndarray | None = None
    #: ``(L+1,)`` bytes of one micro-batch a stage starting at layer ``i``
    #: saves besides ``saved_prefix_bytes[j] - saved_prefix_bytes[i]``: what
    #: its first layer shares with the layer before it
    #: (:attr:`pipesearch.types.Layer.shared_saved_bytes`; the prefix sums
    #: count it only where that layer is in the stage too), under every
    #: option (a profile with it has no recompute options); 0 at ``L``;
    #: the activation copies to host memory (``--activation-offload``,
    #: Mobius) move it too (:meth:`_copy_start_s`). None: 0
    saved_start_bytes: np.ndarray | None = None
    #: ``(L+1,)`` the same for ``held_prefix_bytes`` (zero-bubble schedules:
    #: the shared bytes' part held until the weight gradient,
    #: ``saved_start_bytes x ModelProfile.wgrad_saved_fraction``). None: 0
    held_start_bytes: np.ndarray | None = None
    #: ``(P,)`` seconds per parameter byte of each stage's optimizer step on
    #: its GPU (:func:`device_step_s_per_param_byte`; :meth:`device_step_s`);
    #: None: the step is not timed (costs built for one term alone)
    device_step_rate: np.ndarray | None = None
    #: the last few option_index results (the terms of one range ask for it
    #: several times in a row); not an input: replace() starts it empty
    _option_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.output_bytes)

    @property
    def pp(self) -> int:
        return len(self.time_scale)

    # -- per-stage options (StageOptions): every term below is that of the chosen option
    def _option_memory(self, s, i, j):
        """``(device bytes, host bytes)`` of every option, shape ``(K,) +
        broadcast(s, i, j)``."""
        o = self.options
        s, i, j = np.broadcast_arrays(np.asarray(s), np.asarray(i), np.asarray(j))
        col = (slice(None),) + (None,) * i.ndim
        params = self.param_prefix_bytes[j] - self.param_prefix_bytes[i]
        saved = o.saved_prefix_bytes[:, j] - o.saved_prefix_bytes[:, i] + self.saved_start_at(i)
        transient = range_max(o.transient_table_bytes, i, j)  # (K,) + the ranges' shape
        share = self.activation_share_at(s)  # replicated stages hold their share of a micro-batch
        resident = None if o.act_resident_micro_batches is None else o.act_resident_micro_batches[col]
        device = (params * o.state_bytes_per_param_byte[col] + self.activation_bytes(s, saved, i, j, resident)
                  + transient * share + self.gathered_at(i, j))
        if o.buffer_table_bytes is not None:  # streamed layers' weights and gradients (stage_options.stream_options)
            device = device + range_max(o.buffer_table_bytes, i, j)
        host = params * o.host_bytes_per_param_byte[col]
        tied = self._tied_params(s)
        if tied is not None:  # an offloaded optimizer takes the tied copy's state too (capacity is net of it)
            shift = self._tied_state_shift
            device = device + tied * shift[0][col]
            host = host + tied * shift[1][col]
        if resident is not None:  # offloaded activations: every in-flight micro-batch's kept bytes on the host
            host = host + np.where(np.isfinite(resident), self.activation_bytes(s, saved, i, j), 0.0)
        return device, host

    @cached_property
    def _tied_state_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """``(device, host)`` ``(K,)``: per option, the change of the tied
        copy's device state bytes per parameter byte from the on-device rate
        and its host bytes: an optimizer-offload option moves it as it moves
        the stage's own state (ZeRO-Offload, Ren et al. 2021); the others
        (Mobius, streaming) keep it on the device whole."""
        o = self.options
        moved = np.array(["offload" in name for name in o.names])
        device = np.where(moved, o.state_bytes_per_param_byte - self.state_bytes_per_param_byte, 0.0)
        return device, np.where(moved, o.host_bytes_per_param_byte, 0.0)

    def _tied_params(self, s):
        """Parameter bytes of the tied copy stage(s) ``s`` hold
        (:attr:`tied_copy_bytes` at the device state rate), None without one."""
        if not self._has_tied_copy:
            return None
        return self.tied_copy_bytes[np.asarray(s)] / self.state_bytes_per_param_byte

    @cached_property
    def _has_tied_copy(self) -> bool:
        """Whether a stage holds a tied copy (:meth:`_tied_params`), asked once."""
        return (self.tied_copy_bytes is not None and bool(np.any(self.tied_copy_bytes > 0))
                and self.state_bytes_per_param_byte > 0)

    def option_index(self, s, i, j):
        """Index of the option stage ``s`` holding ``[i, j)`` runs: the first
        (fastest) that fits its device and host memory; 0 when none fits or
        there are no options. Shape: ``broadcast(s, i, j)``."""
        if self.options is None:
            return np.zeros(np.broadcast(np.asarray(s), np.asarray(i), np.asarray(j)).shape, dtype=np.int64)
        key = None
        s_, i_, j_ = np.broadcast_arrays(np.asarray(s), np.asarray(i), np.asarray(j))
        if s_.size <= _MEMO_SIZE:
            key = (s_.shape, s_.dtype.str, i_.dtype.str, j_.dtype.str, s_.tobytes(), i_.tobytes(), j_.tobytes())
            if key in self._option_memo:
                return self._option_memo[key]
        out = np.asarray(self._first_fitting_option(s, i, j))
        out.flags.writeable = False  # shared with later calls
        if key is not None:
            if len(self._option_memo) >= _MEMO_ENTRIES:
                self._option_memo.clear()
            self._option_memo[key] = out
        return out

    def _first_fitting_option(self, s, i, j):
        """:meth:`option_index` computed."""
        device, host = self._option_memory(s, i, j)
        s_b = np.broadcast_to(np.asarray(s), device.shape[1:])
        ok = (device <= self.capacity_bytes[s_b]) & (host <= self.options.host_capacity_bytes[s_b])
        if self.options.allowed is not None:  # each stage's own chain (StageOptions.allowed)
            ok &= self.options.allowed[:, s_b]
        return np.argmax(ok, axis=0)

    def option_name(self, s: int, i: int, j: int) -> str:
        """Name of the option stage ``s`` holding ``[i, j)`` runs (``""``
        without options)."""
        if self.options is None:
            return ""
        return self.options.names[int(self.option_index(s, i, j))]

    def _time_range(self, name: str, s, i, j):
        """:meth:`_range` of a time prefix (``compute_prefix_s``,
        ``fwd_prefix_s``, ``bwd_input_prefix_s``) plus, with
        :attr:`fixed_time_prefix_s`, stage ``s``'s weight times the range's
        fixed seconds (before ``time_scale``)."""
        out = self._range(name, s, i, j)
        if self.fixed_time_prefix_s is None:
            return out
        fixed = self.fixed_time_prefix_s[_FIXED_ROWS[name]]
        return out + self.fixed_time_weight[np.asarray(s)] * (fixed[np.asarray(j)] - fixed[np.asarray(i)])

    def _range(self, name: str, s, i, j):
        """``prefix[j] - prefix[i]`` of the chosen option's ``name`` array."""
        if self.options is None:
            prefix = getattr(self, name)
            return prefix[j] - prefix[i]
        k = self.option_index(s, i, j)
        k, s, i, j = np.broadcast_arrays(k, np.asarray(s), np.asarray(i), np.asarray(j))
        prefix = getattr(self.options, name)
        if prefix.ndim == 3:  # per-stage prefix sums (streamed weights: the stage's PCIe share)
            return prefix[k, s, j] - prefix[k, s, i]
        return prefix[k, j] - prefix[k, i]

    def host_step_s(self, s, i, j):
        """Seconds after stage ``s``'s last backward for its host-side work
        (an offloaded optimizer step); 0 without offloading options."""
        if self.options is None:
            return np.zeros(np.broadcast(np.asarray(s), np.asarray(i), np.asarray(j)).shape)
        k = self.option_index(s, i, j)
        return self.host_param_bytes(s, i, j, k) * self.options.host_step_s_per_param_byte[k, np.asarray(s)]

    def device_step_s(self, s, i, j):
        """Seconds of stage ``s``'s optimizer step on its GPU after its last
        backward (and its data-parallel reduce): the parameter bytes it
        steps (its layers' and the tied copy's, :meth:`host_param_bytes`)
        times :attr:`device_step_rate`; 0 under an option that keeps the
        optimizer state in host memory (its step is :meth:`host_step_s`),
        and without the rate."""
        if self.device_step_rate is None:
            return np.zeros(np.broadcast(np.asarray(s), np.asarray(i), np.asarray(j)).shape)
        params = self.param_prefix_bytes[j] - self.param_prefix_bytes[i]
        tied = self._tied_params(s)
        step = (params if tied is None else params + tied) * self.device_step_rate[s]  # broadcast(s, i, j)
        if self.options is None:
            return step
        return np.where(self.options.host_bytes_per_param_byte[self.option_index(s, i, j)] == 0, step, 0.0)

    def host_param_bytes(self, s, i, j, k=None):
        """Parameter bytes whose optimizer state stage ``s`` holding ``[i,
        j)`` keeps at its option's host rate: its layers' and, when the
        option offloads the optimizer, the tied copy's
        (:meth:`_tied_state_shift`; ZeRO-Offload steps every parameter the
        device trains). ``k``: the option index when known."""
        params = self.param_prefix_bytes[j] - self.param_prefix_bytes[i]
        tied = None if self.options is None else self._tied_params(s)
        if tied is None:
            return params
        k = self.option_index(s, i, j) if k is None else k
        return params + tied * (self._tied_state_shift[1][k] > 0)

    def activation_offload_bytes(self, s, i, j):
        """``(copied, host)``: bytes one device of stage ``s`` holding ``[i,
        j)`` copies per micro-batch in each direction, and keeps in host
        memory, when its option offloads activations (0 otherwise; shape
        ``broadcast(s, i, j)``)."""
        zero = np.zeros(np.broadcast(np.asarray(s), np.asarray(i), np.asarray(j)).shape)
        o = self.options
        if o is None or o.act_resident_micro_batches is None:
            return zero, zero
        k = self.option_index(s, i, j)
        on = np.isfinite(o.act_resident_micro_batches[k])
        saved = self.saved_bytes(s, i, j)
        return np.where(on, saved, 0.0), np.where(on, self.activation_bytes(s, saved / self.activation_share_at(s),
                                                                            i, j), 0.0)

    def saved_bytes(self, s, i, j):
        """Saved activation bytes of one micro-batch of stage ``s`` holding
        ``[i, j)`` under its option (checkpoints only for recomputed layers),
        the tensor its first layer shares with the layer before it included
        (:attr:`saved_start_bytes`)."""
        return (self._range("saved_prefix_bytes", s, i, j) + self.saved_start_at(i)) * self.activation_share_at(s)

    def saved_start_at(self, i):
        """:attr:`saved_start_bytes` at the first layers ``i`` (0 without)."""
        return 0.0 if self.saved_start_bytes is None else self.saved_start_bytes[i]

    # -- per-stage terms, vectorized: s is an int, i and j broadcastable int arrays
    def compute_s(self, s: int, i, j):
        """Forward+backward seconds of one micro-batch on stage ``s`` for ``[i, j)``
        (with offloaded activations each action waits for its copies:
        :meth:`fwd_s`, :meth:`bwd_s`)."""
        total = self._time_range("compute_prefix_s", s, i, j)
        x = self._copy_s(s, i, j)
        if x is not None:
            fwd = self._time_range("fwd_prefix_s", s, i, j)
            total = np.maximum(fwd, x) + self._backward_with_copies(total - fwd, s, i, j, x)
        return self.time_scale[s] * total

    def activation_copy_s(self, s, i, j):
        """Seconds of one copy of a micro-batch's kept activations of stage
        ``s`` holding ``[i, j)`` to or from host memory (each direction, on
        its device: the ``x`` of :meth:`fwd_s`), 0 where its option keeps
        them on the device."""
        x = self._copy_s(s, i, j)
        copied = self.activation_offload_bytes(s, i, j)[0]
        if x is None:
            return np.zeros(np.shape(copied))
        return np.where(copied > 0, self.time_scale[s] * x, 0.0)

    def _copy_s(self, s, i, j):
        """Profiled-device seconds of one direction of the chosen option's
        activation copy (:attr:`pipesearch.stage_options.StageOptions.act_copy_prefix_s`),
        or None when no option copies activations."""
        if self.options is None or self.options.act_copy_prefix_s is None:
            return None
        x = self._range("act_copy_prefix_s", s, i, j)
        if self.saved_start_bytes is None:
            return x
        k = self.option_index(s, i, j)
        return x + self._copy_start_s(self.options.act_copy_prefix_s[k, s, -1], k, i)

    def _copy_start_s(self, whole_s, k, i):
        """The copy seconds of the bytes a stage starting at ``i`` saves
        besides the prefix sums (:attr:`saved_start_bytes`), at option
        ``k``'s rate: a copy prefix is its kept bytes times one rate per
        stage (:func:`pipesearch.stage_options.activation_host_level`,
        :func:`pipesearch.stage_options.swap_options`), so the rate is the
        whole model's copy seconds ``whole_s`` over its saved bytes."""
        saved = self.options.saved_prefix_bytes
        total = saved[k, -1] - saved[k, 0]
        rate = np.where(total > 0, whole_s / np.where(total > 0, total, 1.0), 0.0)
        return self.saved_start_at(i) * rate

    def _backward_with_copies(self, bwd, s, i, j, x):
        """Backward under activation offload: ``max(bwd, x)``, or under a
        zero-bubble schedule (separate input- and weight-gradient actions,
        :attr:`wgrad_window`) ``max(I, x) + max(W, x)``: every action
        carries at most one copy each way
        (:func:`pipesearch.stage_options.activation_host_level`)."""
        if not self.wgrad_window:
            return np.maximum(bwd, x)
        bin_ = self._range("bwd_input_prefix_s", s, i, j)
        return np.maximum(bin_, x) + np.maximum(bwd - bin_, x)

    def p2p_s(self, s: int, j):
        """Activation forward + gradient backward seconds over the boundary at ``j``."""
        j = np.asarray(j)
        out = self.output_bytes[np.minimum(np.maximum(j - 1, 0), self.num_layers - 1)]
        t = 2.0 * (self.p2p_latency_s[s] + out / self.p2p_bandwidth_bytes_per_s[s])
        return np.where((j >= self.num_layers) | (np.asarray(s) == self.pp - 1), 0.0, t)

    def dp_comm_s(self, s, i, j):
        """``(reduce_s, gather_s)``: the data-parallel communication of stage
        ``s`` holding ``[i, j)`` per iteration, before any overlap. Without a
        sharded optimizer, the gradient all-reduce and no gather; with one
        (ZeRO-1/2/3, FSDP, Megatron's distributed optimizer) a reduce-scatter
        of the gradients and an all-gather of the updated weights, each half
        of an all-reduce of its bytes (a ring all-reduce is a reduce-scatter
        followed by an all-gather; Patarasuk & Yuan 2009)."""
        params = self.param_prefix_bytes[j] - self.param_prefix_bytes[i]
        per, fixed = self.allreduce_s_per_byte[s], self.allreduce_fixed_s[s]
        grad = params * self.grad_bytes_per_param_byte
        reduce = np.where(grad > 0, grad * per + fixed, 0.0)
        if self.gather_bytes_per_param_byte <= 0:
            return reduce, np.zeros_like(reduce)
        gather = params * self.gather_bytes_per_param_byte
        n_reduce, n_fwd, n_bwd = self.collective_counts()
        return 0.5 * reduce * n_reduce, np.where(gather > 0, 0.5 * (gather * per + fixed), 0.0) * (n_fwd + n_bwd)

    def collective_counts(self) -> tuple[int, int, int]:
        """``(reduce-scatters, forward all-gathers, backward all-gathers)``
        of a stage's sharded state per iteration (:attr:`micro_batch_collectives`):
        ``(1, 1, 0)`` for ZeRO-1 and under pipelining (reduced after the
        last micro-batch, gathered after the step); without a pipeline, ZeRO-2
        reduce-scatters every micro-batch's gradients (``(m, 1, 0)``; ZeRO
        SC'20 sec. 5.2, DeepSpeed's stage 2 under gradient accumulation) and
        ZeRO-3 / FSDP also gathers the weights for every forward and again
        for every backward (``(m, m, m)``: sec. 7.2.2's ``3 Psi`` per
        micro-batch; FSDP2's ``reshard_after_forward``, torchtitan's default
        without a pipeline, and its gradient accumulation loop)."""
        m, k = self.num_micro_batches, self.micro_batch_collectives
        return (m if k >= 2 else 1), (m if k >= 3 else 1), (m if k >= 3 else 0)

    def allreduce_s(self, s, i, j):
        """The time model's data-parallel term of stage ``s`` holding
        ``[i, j)``: the seconds of :meth:`dp_comm_s` left after the rank's
        last action (:func:`pipesearch.overlap.exposed_s`; all of it without
        overlap). The gradient reduce hides under the last backward (its
        weight-gradient part under zero-bubble schedules), the all-gather
        under the first forward, each in the stage's buckets, every bucket's
        collective paying the all-reduce model's latency term."""
        reduce, gather = self.dp_comm_s(s, i, j)
        ov = self.overlap
        if ov is None or not (ov.grad_reduce or ov.param_gather):
            return reduce + gather
        buckets = self.num_buckets(i, j)
        # every bucket's collective pays the latency term (dp_comm_s counts it once)
        latency = self.allreduce_fixed_s[s] * (0.5 if self.gather_bytes_per_param_byte > 0 else 1.0)
        n_reduce, n_fwd, n_bwd = self.collective_counts()
        back = gather * (n_bwd / (n_fwd + n_bwd))  # ZeRO-3's backward re-gathers: in the backward's window
        gather = gather - back

        def bucketed(comm, n):  # n collectives of the iteration, each bucket paying the latency
            return np.where(comm > 0, comm + n * (buckets - 1) * latency, 0.0)

        # a collective of every micro-batch hides under that micro-batch's window: n of them expose
        # exposed_s(n c, n w, K) = n exposed_s(c, w, K)
        if ov.grad_reduce:
            window = self.bwd_s(s, i, j) - (self.bwd_input_s(s, i, j) if self.wgrad_window else 0.0)
            reduce = exposed_s(bucketed(reduce, n_reduce) + bucketed(back, n_bwd), n_reduce * window, buckets)
            back = 0.0
        if ov.param_gather:
            gather = exposed_s(bucketed(gather, n_fwd), n_fwd * self.fwd_s(s, i, j), buckets)
        return reduce + back + gather

    def num_buckets(self, i, j):
        """Gradient buckets of the layers ``[i, j)``: ``ceil(parameters /
        bucket_params)``, or one per layer with parameters when the overlap
        settings say so (FSDP units)."""
        ov = self.overlap
        if ov is None or ov.bucket_params is None or self.params_per_param_byte <= 0:
            layers = self.param_layer_prefix if self.param_layer_prefix is not None else np.arange(self.num_layers + 1)
            return np.maximum(layers[j] - layers[i], 1)
        params = (self.param_prefix_bytes[j] - self.param_prefix_bytes[i]) * self.params_per_param_byte
        return np.maximum(np.ceil(params / ov.bucket_params), 1)

    def memory_bytes(self, s: int, i, j):
        """Split-dependent peak bytes on one device of stage ``s`` holding
        ``[i, j)``: state + in-flight activations (compared with
        ``capacity_bytes``, which is net of the fixed parts); with options,
        those of the chosen option (:meth:`option_index`)."""
        if self.options is not None:
            device, _ = self._option_memory(s, i, j)
            k = self.option_index(s, i, j)
            return np.take_along_axis(device, k[None], axis=0)[0]
        params = self.param_prefix_bytes[j] - self.param_prefix_bytes[i]
        saved = self.saved_prefix_bytes[j] - self.saved_prefix_bytes[i] + self.saved_start_at(i)
        return params * self.state_bytes_per_param_byte + self.activation_bytes(s, saved, i, j) + self.peak_extra_at(
            s, i, j)

    def least_memory_bytes(self, s, i, j):
        """The least device bytes of stage(s) ``s`` holding ``[i, j)`` over
        the options each may run (:attr:`StageOptions.allowed`; an
        offloaded or streamed option keeps less than the one on the
        device), :meth:`memory_bytes` without options: what a stage needs
        at the least, the figure a refusal quotes."""
        if self.options is None:
            return self.memory_bytes(s, i, j)
        device, _ = self._option_memory(s, i, j)
        if self.options.allowed is not None:
            device = np.where(self.options.allowed[:, np.asarray(s)].reshape(
                (len(device),) + np.shape(np.asarray(s)) + (1,) * (device.ndim - 1 - np.ndim(s))), device, np.inf)
        return device.min(axis=0)

    def peak_extra_at(self, s, i, j):
        """Bytes stage(s) ``s`` holding ``[i, j)`` hold only while one of
        their layers runs: that layer's gathered ZeRO-3 / FSDP weights
        (:meth:`gathered_at`) and its backward transient
        (:meth:`recompute_transient_at`), each the largest over the layers;
        0 for a stage whose device counts another chunk's
        (:attr:`extra_stages`). A device runs one action at a time, so with
        several stages per device it holds one stage's at a time
        (:meth:`device_memory_bytes`)."""
        extra = self._layer_extra(s, i, j)
        return extra if self.extra_stages is None else extra * self.extra_stages[s]

    def _layer_extra(self, s, i, j):
        """:meth:`peak_extra_at` of every stage, whichever chunk its device counts."""
        return self.gathered_at(i, j) + self.recompute_transient_at(s, i, j)

    def recompute_transient_at(self, s, i, j):
        """The largest backward transient of the layers ``[i, j)`` of stage
        ``s`` (:attr:`recompute_transient_table`, times the stage's
        :meth:`activation_share_at`; 0 without one): one layer recomputes at
        a time (with several stages per device, one of the device's at a
        time: :meth:`peak_extra_at`)."""
        if self.recompute_transient_table is None:
            return 0.0
        return range_max(self.recompute_transient_table, i, j) * self.activation_share_at(s)

    def gathered_at(self, i, j):
        """Gathered ZeRO-3 / FSDP weights a stage holding ``[i, j)`` keeps
        while it computes (:attr:`gathered_table`; 0 without one)."""
        if self.gathered_table is None:
            return 0.0
        return range_max(self.gathered_table, i, j)

    def activation_bytes(self, s, saved, i, j, resident=None):
        """In-flight activation bytes of stage(s) ``s`` holding ``[i, j)``
        whose micro-batch saves ``saved`` (shape ``broadcast(s, i, j)``, or
        ``(K,)`` + that for per-stage options): ``saved x in_flight[s]``, or
        under a zero-bubble schedule the exact peak ``max_q (A saved + B
        held)`` (:attr:`wgrad_counts`); times :meth:`activation_share_at`.
        ``resident`` (broadcastable to ``saved``; activation offload) caps
        the micro-batches kept whole (``in_flight`` and ``A``) at that many
        (:data:`pipesearch.stage_options.ACT_HOST_RESIDENT`); the bytes a
        zero-bubble micro-batch holds for its weight gradient stay."""
        share = self.activation_share_at(s)
        if self.wgrad_counts is None:
            n = self.in_flight[s] if resident is None else np.minimum(self.in_flight[s], resident)
            return saved * n * share
        A, B = self.wgrad_counts
        A = A[s] if resident is None else np.minimum(A[s], np.asarray(resident)[..., None])
        held = self.held_prefix_bytes[j] - self.held_prefix_bytes[i]
        if self.held_start_bytes is not None:
            held = held + self.held_start_bytes[i]
        peak = np.max(A * np.asarray(saved)[..., None] + B[s] * np.asarray(held)[..., None], axis=-1)
        return peak * share

    def activation_share_at(self, s):
        """:attr:`activation_share` of stage(s) ``s`` (1 when unset)."""
        return 1.0 if self.activation_share is None else self.activation_share[s]

    def fixed_bytes(self, s):
        """Bytes stage ``s`` holds whatever the split: its tied copy and its
        part of the gathered ZeRO-3 weights (0 when there are none)."""
        out = 0.0
        for arr in (self.tied_copy_bytes, self.gathered_bytes):
            if arr is not None:
                out = out + arr[s]
        return out

    def total_memory_bytes(self, s, i, j):
        """Peak bytes on one device of stage ``s`` holding ``[i, j)`` (no
        reserve): :meth:`memory_bytes` + :meth:`fixed_bytes`, the sum of
        :meth:`memory_breakdown`."""
        return self.memory_bytes(s, i, j) + self.fixed_bytes(s)

    def memory_breakdown(self, s: int, i: int, j: int, param_state=None, dp: int = 1,
                         bytes_per_param: float = 2.0) -> dict[str, float]:
        """Bytes of stage ``s`` holding ``[i, j)`` by part: the training state
        by component (:meth:`pipesearch.memory.ParamState.breakdown_per_param`
        of ``param_state`` at ``dp``, when given; else one ``state`` entry),
        ``tied_copy`` (the last stage's copy of a tied matrix, its gradient
        and optimizer state), ``gathered_weights`` (ZeRO-3 / FSDP transient)
        and ``activations`` (saved bytes times the stage's in-flight
        micro-batches). The values sum to :meth:`total_memory_bytes`."""
        params = float(self.param_prefix_bytes[j] - self.param_prefix_bytes[i])
        tied = float(self.tied_copy_bytes[s]) if self.tied_copy_bytes is not None else 0.0
        counted = 1.0 if self.extra_stages is None else float(self.extra_stages[s])  # its device's one-at-a-time bytes
        gathered = (float(self.gathered_bytes[s]) if self.gathered_bytes is not None else 0.0) + float(
            self.gathered_at(i, j)) * counted
        out: dict[str, float] = {}
        option = self.option_name(s, i, j)
        offloaded, streamed = "offload" in option, "stream" in option or option.startswith("swap")
        if param_state is not None:
            n = params / bytes_per_param
            parts = param_state.breakdown_per_param(dp)
            if offloaded or streamed:
                parts = {k: v for k, v in parts.items() if k in OFFLOAD_KEPT_COMPONENTS and not streamed}
            out.update({k: n * v for k, v in parts.items()})
        else:
            k = int(self.option_index(s, i, j))
            state = (self.options.state_bytes_per_param_byte[k] if self.options is not None
                     else self.state_bytes_per_param_byte)
            out["state"] = params * state
        out["tied_copy"] = tied
        out["gathered_weights"] = gathered
        if self.options is None:
            if self.recompute_transient_table is not None:
                out["recompute_transient"] = float(self.recompute_transient_at(s, i, j)) * counted
            out["activations"] = float(self.activation_bytes(
                s, self.saved_prefix_bytes[j] - self.saved_prefix_bytes[i] + self.saved_start_at(i), i, j))
        else:
            tied_params = self._tied_params(s)
            if tied_params is not None:  # the tied copy at the option's state rate (_option_memory)
                k = int(self.option_index(s, i, j))
                shift = float(tied_params) * float(self._tied_state_shift[0][k])
                out["tied_copy"] = tied + shift
            else:
                shift = 0.0
            rest = float(self.memory_bytes(s, i, j)) - float(self.gathered_at(i, j)) - shift - sum(
                v for key, v in out.items() if key not in ("tied_copy", "gathered_weights"))
            if option.startswith("swap"):  # Mobius: the stage computing and the one prefetched (stage_options.swap_options)
                out["swapped_buffers"] = params * float(self.options.state_bytes_per_param_byte[0])
                rest -= out["swapped_buffers"]
            elif streamed:  # the double buffer of streamed layers (weights + gradients)
                k = int(self.option_index(s, i, j))
                out["streamed_buffers"] = float(range_max(self.options.transient_table_bytes[k], i, j)
                                                if self.options.buffer_table_bytes is None
                                                else range_max(self.options.buffer_table_bytes[k], i, j))
                rest -= out["streamed_buffers"]
            out["activations"] = rest
        return out

    def sum_term(self, s: int, i, j):
        """``a_k``: per-micro-batch time of the stage (compute + p2p)."""
        return self.compute_s(s, i, j) + self.p2p_s(s, j)

    def max_term(self, s: int, i, j):
        """``b_k = (m - 1) * a_k + allreduce_k``: the stage as the bottleneck."""
        return (self.num_micro_batches - 1) * self.sum_term(s, i, j) + self.after_backward_s(s, i, j)

    def fits(self, s: int, i, j):
        """Whether stage ``s`` holding ``[i, j)`` fits in its devices' memory
        (with options: whether one of them fits, device and host)."""
        if self.options is not None:
            device, host = self._option_memory(s, i, j)
            s_b = np.broadcast_to(np.asarray(s), device.shape[1:])
            ok = (device <= self.capacity_bytes[s_b]) & (host <= self.options.host_capacity_bytes[s_b])
            if self.options.allowed is not None:
                ok &= self.options.allowed[:, s_b]
            return np.any(ok, axis=0)
        return self.memory_bytes(s, i, j) <= self.capacity_bytes[s]

    def stage_terms(self, bounds) -> tuple[np.ndarray, np.ndarray]:
        """``(a, b)`` of every stage of the split with boundaries ``bounds``
        (arrays of shape ``(P,)``)."""
        s, i, j = np.arange(self.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
        a = self.sum_term(s, i, j)
        return a, (self.num_micro_batches - 1) * a + self.after_backward_s(s, i, j)

    def iteration_time_s(self, bounds) -> float:
        """Analytic iteration time of the split with boundaries
        ``0 = bounds[0] < ... < bounds[P] = L``: ``sum a_k + max b_k``."""
        a, b = self.stage_terms(bounds)
        return float(a.sum() + b.max())

    # -- the split's terms of the time model (pipesearch.timemodel)
    def fwd_s(self, s, i, j):
        """Forward compute seconds of one micro-batch on stage ``s`` for ``[i, j)``
        (``max(forward, x)`` when its option offloads activations, ``x`` one
        copy of a micro-batch's kept activations: :meth:`_copy_s`)."""
        fwd = self._time_range("fwd_prefix_s", s, i, j)
        x = self._copy_s(s, i, j)
        return self.time_scale[s] * (fwd if x is None else np.maximum(fwd, x))

    def bwd_s(self, s, i, j):
        """Full backward compute seconds of one micro-batch on stage ``s``
        (never below 0: a stage of layers without backward leaves the
        difference of its prefix sums at a rounding residue such as -4e-19,
        which the simulator's input check refuses)."""
        return np.maximum(self.compute_s(s, i, j) - self.fwd_s(s, i, j), 0.0)

    def bwd_input_s(self, s, i, j):
        """Input-gradient part of the backward on stage ``s``."""
        if self.options is not None:
            bin_ = self._range("bwd_input_prefix_s", s, i, j)
            x = self._copy_s(s, i, j)
            if x is not None:  # the input-gradient action waits for its copies (zero-bubble); else its share
                bwd = self._range("compute_prefix_s", s, i, j) - self._range("fwd_prefix_s", s, i, j)
                full = self._backward_with_copies(bwd, s, i, j, x)
                bin_ = np.maximum(bin_, x) if self.wgrad_window else np.where(
                    bwd > 0, bin_ * full / np.where(bwd > 0, bwd, 1.0), bin_)
            return self.time_scale[s] * bin_
        if self.bwd_input_prefix_s is None:
            return self.time_scale[s] * np.zeros(np.broadcast(np.asarray(i), np.asarray(j)).shape)
        return self.time_scale[s] * self._time_range("bwd_input_prefix_s", s, i, j)

    def send_s(self, s, j):
        """One transfer over the boundary after stage ``s`` ending at layer
        ``j`` (alpha-beta: ``latency + output_bytes[j-1] / bandwidth``); zero
        after the last stage."""
        out, latency, bandwidth = self._send_table
        j = np.asarray(j)
        t = np.take(latency, s, mode="clip") + np.take(out, j, mode="clip") / np.take(bandwidth, s, mode="clip")
        return np.where(j >= self.num_layers, 0.0, t)

    @cached_property
    def _send_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`send_s`'s arrays: the bytes sent at boundary ``j`` (layer
        ``j - 1``'s output, layer 0's at ``j = 0``), and per stage the link's
        latency and bandwidth, the last stage's 0 and inf (it sends nothing)."""
        return (np.concatenate([self.output_bytes[:1], self.output_bytes]).astype(float),
                np.append(np.asarray(self.p2p_latency_s, dtype=float)[:self.pp - 1], 0.0),
                np.append(np.asarray(self.p2p_bandwidth_bytes_per_s, dtype=float)[:self.pp - 1], np.inf))

    def stage_times(self, bounds):
        """The :class:`pipesearch.timemodel.StageTimes` of the split with
        boundaries ``bounds`` (shape ``(P + 1,)``), or of ``n`` splits at once
        (shape ``(n, P + 1)``: every array gets a leading axis of ``n``)."""
        from .timemodel import StageTimes

        bounds = np.asarray(bounds)
        s, i, j = np.arange(self.pp), bounds[..., :-1], bounds[..., 1:]

        def arr(x):
            return np.broadcast_to(np.asarray(x, dtype=float), i.shape)

        swaps, over = {}, 0.0
        if self.options is not None and self.options.swap_in_s_per_param_byte is not None:  # Mobius' copies
            k, params = self.option_index(s, i, j), self.param_prefix_bytes[j] - self.param_prefix_bytes[i]
            swaps = dict(swap_in_s=arr(params * self.options.swap_in_s_per_param_byte[k, s]),
                         swap_out_s=arr(params * self.options.swap_out_s_per_param_byte[k, s]),
                         swap_queue=self.options.swap_queue)
            device = self.mobius_device_peak_bytes(bounds)
            ranks = device.shape[-1]
            over = np.where(device > self.mobius_gpu_capacity_bytes(), np.inf, 0.0)[..., np.arange(self.pp) % ranks]
            host_over = np.any(self.mobius_node_host_bytes(bounds) > self.options.node_host_memory_bytes, axis=-1)
            over = over + np.where(host_over, np.inf, 0.0)[..., None]
        if self.chunk_states is not None:  # a device over its memory: the split is out (an infinite time)
            over = np.where(np.all(self.device_fits(bounds), axis=-1), 0.0, np.inf)[..., None]
        times = StageTimes(fwd_s=arr(self.fwd_s(s, i, j)), bwd_s=arr(self.bwd_s(s, i, j)),
                           bwd_input_s=arr(self.bwd_input_s(s, i, j)),
                           p2p_s=np.asarray(self.send_s(s[:-1], j[..., :-1]), dtype=float),
                           allreduce_s=arr(self.after_backward_s(s, i, j)) + over, **swaps,
                           **({"delayed_host_s": arr(self.host_step_s(s, i, j))} if self.delayed_host_step else {}))
        if swaps and self.options.swap_act_copy_prefix_s is not None:  # activations in host memory: copy nodes
            times = self._mobius_activations(times, bounds)
        return times

    def mobius_device_peak_bytes(self, bounds) -> np.ndarray:
        """Mobius: each GPU's peak bytes over its stays under the split
        ``bounds`` (``(P + 1,)`` or ``(n, P + 1)``), each stage in its chosen
        option (:meth:`option_index`): :func:`pipesearch.stage_options.swap_device_bytes`
        of the stages' parameter bytes and of what each holds besides its
        weights and gradients (its :meth:`memory_bytes` less them, plus its
        :meth:`fixed_bytes`: the tied copy, the gathered weights). Returns
        ``(ranks,)`` or ``(n, ranks)`` bytes, checked against
        :meth:`mobius_gpu_capacity_bytes`; every stage's
        :meth:`total_memory_bytes` is at most its GPU's peak."""
        bounds = np.asarray(bounds)
        s, i, j = np.arange(self.pp), bounds[..., :-1], bounds[..., 1:]
        params = self.param_prefix_bytes[j] - self.param_prefix_bytes[i]
        state = self.options.state_bytes_per_param_byte[self.option_index(s, i, j)]
        own = self.memory_bytes(s, i, j) - params * state + self.fixed_bytes(s)
        return swap_device_bytes(params, np.broadcast_to(own, params.shape), len(self.options.swap_queue))

    def mobius_node_host_bytes(self, bounds, act=None) -> np.ndarray:
        """Mobius: the host memory each node holds under the split
        ``bounds`` (``(P + 1,)`` or ``(n, P + 1)``): every stage's host bytes
        in its chosen option (:meth:`option_index`; with ``act``, ``(S,)``
        or ``(n, S)`` bools, ``swap+act-host`` where set), summed over its
        rank's stages (one GPU keeps all of them: Feng et al., ASPLOS'23,
        sec. 3) and over the rank's GPUs on the node
        (``StageOptions.swap_node_gpus``). Returns ``(N,)`` or ``(n, N)``
        bytes, checked against ``StageOptions.node_host_memory_bytes``."""
        o = self.options
        bounds = np.asarray(bounds)
        s, i, j = np.arange(self.pp), bounds[..., :-1], bounds[..., 1:]
        host = self._option_memory(s, i, j)[1]
        if act is None:
            per_stage = np.take_along_axis(host, self.option_index(s, i, j)[None], axis=0)[0]
        else:
            per_stage = np.where(act, host[-1], host[0])
        ranks = len(o.swap_queue)
        per_gpu = per_stage.reshape(per_stage.shape[:-1] + (self.pp // ranks, ranks)).sum(axis=-2)
        return per_gpu @ o.swap_node_gpus

    def mobius_gpu_capacity_bytes(self) -> np.ndarray:
        """Mobius: ``(ranks,)`` each GPU's usable memory (bytes), the bound
        of :meth:`mobius_device_peak_bytes`: its first stage's
        ``capacity_bytes`` with the fixed parts that capacity is net of
        (tied copy, ``stages_per_device`` shares of the gathered weights)
        added back, since the peak counts them."""
        ranks = len(self.options.swap_queue)
        tied = 0.0 if self.tied_copy_bytes is None else self.tied_copy_bytes[:ranks]
        gathered = 0.0 if self.gathered_bytes is None else self.gathered_bytes[:ranks]
        return self.capacity_bytes[:ranks] + (self.pp // ranks) * gathered + tied

    def _mobius_activations(self, times, bounds):
        """``times`` of Mobius splits with each stage's activations in host
        memory where its GPU requires it
        (:func:`pipesearch.stage_options.mobius_activation_choice`):
        ``act_copy_s`` (one copy, the offloading option's) and ``act_host``
        set, and an infinite after-backward time where no choice fits."""
        from .stage_options import mobius_activation_choice
        from .timemodel import iteration_time_s

        o = self.options
        b = np.atleast_2d(bounds)
        n, S = b.shape[0], self.pp
        s, i, j = np.arange(S), b[:, :-1], b[:, 1:]
        params = self.param_prefix_bytes[j] - self.param_prefix_bytes[i]
        dev, host = self._option_memory(s, i, j)
        ok = (dev <= self.capacity_bytes[s]) & (host <= o.host_capacity_bytes[s])
        if o.allowed is not None:
            ok &= o.allowed[:, None, :]
        own = dev - params * o.state_bytes_per_param_byte[:, None, None] + self.fixed_bytes(s)
        ranks = len(o.swap_queue)
        pairs = swap_device_bytes(params, np.zeros_like(params), ranks)
        copy = o.swap_act_copy_prefix_s[1, s, j] - o.swap_act_copy_prefix_s[1, s, i]
        if self.saved_start_bytes is not None:
            copy = copy + self._copy_start_s(o.swap_act_copy_prefix_s[1, s, -1], 1, i)
        after = np.broadcast_to(np.asarray(self.after_backward_s(s, i, j), dtype=float), i.shape)  # no GPU check
        plain = replace(times, **{f: np.atleast_2d(getattr(times, f)) for f in (
            "fwd_s", "bwd_s", "bwd_input_s", "swap_in_s", "swap_out_s")}, p2p_s=np.asarray(times.p2p_s).reshape(n, -1),
            allreduce_s=after, **({} if times.delayed_host_s is None else {
                "delayed_host_s": np.atleast_2d(times.delayed_host_s)}))

        def time_of(idx, sets):
            rows = {f: getattr(plain, f)[idx] for f in ("fwd_s", "bwd_s", "bwd_input_s", "p2p_s", "allreduce_s",
                                                         "swap_in_s", "swap_out_s")}
            if plain.delayed_host_s is not None:
                rows["delayed_host_s"] = plain.delayed_host_s[idx]
            return iteration_time_s("mobius", ranks, self.num_micro_batches, S // ranks,
                                    replace(plain, **rows, act_copy_s=copy[idx] * sets, act_host=sets))

        def host_fits(idx, sets):  # every node's host memory holds the choice (more offloading stages: more bytes)
            return np.all(self.mobius_node_host_bytes(b[idx], sets) <= o.node_host_memory_bytes, axis=-1)

        first = self.option_index(s, i, j) == 1
        act, fits = mobius_activation_choice(first, ok[0], ok[1], own, pairs, self.mobius_gpu_capacity_bytes(), ranks,
                                             time_of, host_fits)
        allreduce = plain.allreduce_s + np.where(fits, 0.0, np.inf)[:, None]
        single = np.ndim(bounds) == 1
        pick = (lambda x: x[0]) if single else (lambda x: x)
        return replace(plain, **{f: pick(getattr(plain, f)) for f in (
            "fwd_s", "bwd_s", "bwd_input_s", "p2p_s", "swap_in_s", "swap_out_s")},
            allreduce_s=pick(allreduce), act_copy_s=pick(copy * act), act_host=pick(act),
            **({} if plain.delayed_host_s is None else {"delayed_host_s": pick(plain.delayed_host_s)}))

    def after_backward_s(self, s, i, j):
        """What stage ``s`` adds after its last backward: :meth:`allreduce_s`
        plus its optimizer step, :meth:`device_step_s` or the offloaded
        :meth:`host_step_s` (not overlapped: the step starts when the
        stage's gradients are reduced; a delayed host step runs beside the
        next iteration instead)."""
        out = self.allreduce_s(s, i, j) + self.device_step_s(s, i, j)
        if self.options is None or self.delayed_host_step:
            return out
        return out + self.host_step_s(s, i, j)

    def device_memory_bytes(self, bounds) -> np.ndarray:
        """With :attr:`chunk_states`: each device's peak bytes under the
        split ``bounds`` (``(P + 1,)`` or ``(n, P + 1)``), less its fixed
        bytes (:meth:`fixed_bytes`, compared with :attr:`capacity_bytes`,
        which is net of them): its chunks' training state, the most
        one-at-a-time bytes of any of its chunks (:meth:`peak_extra_at`: it
        runs one action at a time) and ``max_q sum_c n_qc a_c``, ``n_q``
        its count states and ``a_c`` the saved bytes of one micro-batch of
        chunk ``c`` (exact: :func:`pipesearch.schedules.chunk_states_of`).
        Returns ``(R,)`` or ``(n, R)``."""
        bounds = np.asarray(bounds)
        s, i, j = np.arange(self.pp), bounds[..., :-1], bounds[..., 1:]
        R, _, v = self.chunk_states.shape
        rest = self.resident_bytes(s, i, j)
        extra = np.broadcast_to(self.peak_extra_at(s, i, j), rest.shape)
        return (rest.reshape(rest.shape[:-1] + (v, R)).sum(axis=-2) + extra.reshape(extra.shape[:-1] + (v, R)).max(
            axis=-2) + self._state_activations(bounds).max(axis=-1))

    def resident_bytes(self, s, i, j):
        """:meth:`memory_bytes` of stage(s) ``s`` holding ``[i, j)`` less its
        in-flight activations and its one-at-a-time bytes
        (:meth:`peak_extra_at`): its training state, what it holds whatever
        its micro-batches and actions (without per-stage options, as
        :attr:`chunk_states` needs)."""
        return self.memory_bytes(s, i, j) - self.saved_bytes(s, i, j) * self.in_flight[s] - self.peak_extra_at(s, i, j)

    def _state_activations(self, bounds) -> np.ndarray:
        """``(.., R, Q)``: the activation bytes each device holds at each of
        its count states under the split(s) ``bounds`` (the state's count of
        each chunk times one micro-batch's saved bytes of that chunk)."""
        bounds = np.asarray(bounds)
        s, i, j = np.arange(self.pp), bounds[..., :-1], bounds[..., 1:]
        R, _, v = self.chunk_states.shape
        act = np.broadcast_to(self.saved_bytes(s, i, j), i.shape)  # stage c R + r is chunk c of device r
        chunks = np.swapaxes(act.reshape(act.shape[:-1] + (v, R)), -1, -2)  # (.., R, v)
        return np.einsum("...rc,rqc->...rq", chunks, self.chunk_states)

    def at_device_peak(self, bounds) -> "PipelineCosts":
        """With :attr:`chunk_states`: these costs with each stage's
        ``in_flight`` its count at its device's peak state under the one
        split ``bounds`` (:meth:`device_memory_bytes`) and the one-at-a-time
        bytes (:meth:`peak_extra_at`) on each device's chunk with the most
        (:attr:`extra_stages`), so that the stages' :meth:`memory_bytes`
        (and :meth:`memory_breakdown`) add up to their device's peak; these
        costs unchanged without."""
        if self.chunk_states is None:
            return self
        R, _, v = self.chunk_states.shape
        q = np.argmax(self._state_activations(bounds), axis=-1)
        counts = self.chunk_states[np.arange(R), q]  # (R, v): stage c R + r holds counts[r, c]
        bounds = np.asarray(bounds)
        s, i, j = np.arange(self.pp), bounds[:-1], bounds[1:]
        extra = np.broadcast_to(self._layer_extra(s, i, j), (self.pp,))
        keep = np.zeros((v, R))
        keep[np.argmax(extra.reshape(v, R), axis=0), np.arange(R)] = 1.0  # each device's chunk with the most
        return replace(self, in_flight=counts.T.reshape(-1), extra_stages=keep.reshape(-1))

    def device_fits(self, bounds) -> np.ndarray:
        """With :attr:`chunk_states`: whether each device holds its chunks
        under the split ``bounds`` (:meth:`device_memory_bytes`); ``(R,)`` or
        ``(n, R)`` bools."""
        R = self.chunk_states.shape[0]
        return self.device_memory_bytes(bounds) <= self.capacity_bytes[:R]

    def split_fits(self, bounds) -> bool:
        """Whether every stage of the split ``bounds`` fits (:meth:`fits`),
        every device its chunks (:meth:`device_fits`, with
        :attr:`chunk_states`) and, for Mobius, every GPU
        (:meth:`mobius_device_peak_bytes` with the stages' activation choice:
        a finite :meth:`stage_times`)."""
        return bool(self.splits_fit(np.asarray(bounds)[None])[0])

    def splits_fit(self, splits) -> np.ndarray:
        """:meth:`split_fits` of every split of ``splits`` (``(n, P + 1)``
        boundaries) at once: ``(n,)`` bools (the whole-device checks only
        for the splits whose stages fit)."""
        b = np.asarray(splits, dtype=np.int64).reshape(-1, self.pp + 1)
        ok = np.all(self.fits(np.arange(self.pp)[None, :], b[:, :-1], b[:, 1:]), axis=1)
        if self.chunk_states is not None and ok.any():
            ok[ok] = np.all(self.device_fits(b[ok]), axis=1)
        if self.options is not None and self.options.swap_in_s_per_param_byte is not None and ok.any():
            ok[ok] = np.all(np.isfinite(np.asarray(self.stage_times(b[ok]).allreduce_s).reshape(-1, self.pp)), axis=1)
        return ok


def build_pipeline_costs(
    profile: ModelProfile,
    cluster: Cluster,
    job: Job,
    *,
    pp: int,
    dp: int,
    micro_batch_size: int,
    num_micro_batches: int,
    schedule: str,
    placement: np.ndarray,
    profiled_device: DeviceSpec | None = None,
    in_flight: np.ndarray | None = None,
    stages_per_device: int = 1,
    links: tuple[list[Link], list[tuple[float, float]]] | None = None,
    tp: int = 1,
    optimizer_offload: bool = False,
    option_profiles: tuple[tuple[str, ModelProfile], ...] | None = None,
    weight_streaming: bool = False,
    weight_swapping: bool = False,
    wgrad_window: bool | None = None,
    chunk_states: np.ndarray | None = None,
) -> PipelineCosts:
    """Assemble the cost terms of one search point.

    Args:
        placement: ``(pp, dp)`` heads of each stage's tensor-parallel groups
            (:mod:`pipesearch.placement`); speeds, capacities and links are
            those of these devices.
        profiled_device: spec of the device the profile was measured on, for
            scaling times to other device types (``None``: no scaling).
        in_flight: ``(pp,)`` in-flight micro-batches per stage, for schedules
            other than GPipe and 1F1B (default: :func:`in_flight_micro_batches`).
        stages_per_device: virtual stages each device holds (interleaved
            schedules). With ``chunk_states`` and no per-stage options each
            stage is checked alone against its whole device and every split
            device by device (:attr:`PipelineCosts.chunk_states`); otherwise
            each stage gets its share of the device's usable memory
            (:func:`device_memory_shares`), so the device's total never
            exceeds it.
        chunk_states: ``(pp / stages_per_device, Q, stages_per_device)``
            in-flight counts of each device's chunks at its count states
            (:func:`pipesearch.in_flight.schedule_chunk_states`); ``in_flight``
            must then hold each chunk's own peak (their maxima).
        links: precomputed :func:`placement_links` of ``placement`` (the
            search reuses them across points with the same placement).
        tp: tensor-parallel degree of the slots (their devices are the
            ``tp`` consecutive ids from each head; for PCIe sharing).
        optimizer_offload: also offer stages the optimizer in host memory
            (:func:`stage_options`; the cluster needs a ``[host]`` table).
        option_profiles: per-stage recompute modes as ``(name, layer
            table)`` pairs, fastest first (the same layers and parameters
            as ``profile``; :func:`stage_options`).
        weight_streaming: offer stages their weights, gradients and
            optimizer state in host memory, the weights streamed in layer by
            layer (:func:`stream_options`; the cluster needs ``[host]``).
        weight_swapping: Mobius: every stage in host memory, copied in
            and out whole (:func:`swap_options`; ``pp`` counts all stages,
            ``placement`` their heads).
        wgrad_window: the data-parallel reduce hides only under the
            weight-gradient part of the last backward (zero-bubble
            schedules); default: ``schedule == "zb-h1"``.

    Raises:
        InputError: placement shape does not match ``(pp, dp)``.
    """
    if placement.shape != (pp, dp):
        raise InputError(f"placement has shape {placement.shape}, expected ({pp}, {dp})")
    arrays = profile.layer_arrays
    ratio = micro_batch_size / profile.profiled_batch_size  # activation bytes scale linearly
    times = profile.layer_times_at(micro_batch_size)  # fixed + per-sample where profiled so
    fwd, bwd, bwd_input = times["fwd_s"], times["bwd_s"], times["bwd_input_s"]
    zero = np.zeros(1)
    # a stage is as slow as its slowest replica and as small as its smallest one
    placement = np.asarray(placement)
    p2p, ar = links if links is not None else placement_links(cluster, placement, tp)
    state = param_state_of(job, pp // stages_per_device)
    grad_bpp = dp_reduce_bytes_per_param(job, state, profile.bytes_per_param)
    state_per_byte = state.bytes_per_param(dp) / profile.bytes_per_param
    inflight = (np.asarray(in_flight, dtype=float) if in_flight is not None
                else in_flight_micro_batches(schedule, pp, num_micro_batches))
    wgrad = schedule == "zb-h1" if wgrad_window is None else wgrad_window
    counts = zero_bubble_counts(pp, num_micro_batches) if wgrad and stages_per_device == 1 and pp > 1 else None
    gathered, gathered_table = _fsdp_gathered(profile, state, pp, stages_per_device)
    tied = np.zeros(pp)
    if pp > 1:
        tied[-1] = profile.tied_param_bytes * state_per_byte
    time_scale = stage_time_scale(cluster, placement, profiled_device, profile_precision(profile))
    options = _memory_options(profile, cluster, job, ratio=ratio, dp=dp, placement=placement, tp=tp, pp=pp,
                              stages_per_device=stages_per_device, time_scale=time_scale,
                              optimizer_offload=optimizer_offload, option_profiles=option_profiles,
                              weight_streaming=weight_streaming, weight_swapping=weight_swapping)
    step_rate, options = device_step_terms(state, dp, profile.bytes_per_param,
                                           stage_streaming_bandwidth(cluster, placement), options,
                                           job.delayed_optimizer_step)
    device_checked = chunk_states is not None and stages_per_device > 1 and options is None
    usable = usable_memory_bytes(job, stage_capacity_bytes(cluster, placement)) - gathered * stages_per_device
    if weight_swapping:  # Mobius: every stage swapped in and out over PCIe; each checked against the whole device
        capacity = usable - tied
    elif device_checked:  # each stage alone within its whole device, less the device's fixed bytes
        dev = np.arange(pp) % (pp // stages_per_device)
        capacity = usable - np.bincount(dev, tied, pp // stages_per_device)[dev]
    else:
        # streamed stages keep little besides their activations: their chunks share a device as the least-memory
        # recompute table's balanced split needs (the table a streamed plan runs without per-stage levels)
        streamed = weight_streaming and cluster.host is not None
        share_profile = option_profiles[-1][1] if streamed and option_profiles else profile
        capacity = usable * device_memory_shares(share_profile, inflight, stages_per_device, state_per_byte,
                                                 ratio) - tied
    pcie = None
    if cluster.host is not None:
        from . import host as host_lib

        pcie = host_lib.shared_bandwidth_bytes_per_s(cluster.host,
                                                     host_lib.stage_switch_sharing(cluster, placement, tp))
    return PipelineCosts(
        device_step_rate=step_rate, options=options,
        delayed_host_step=job.delayed_optimizer_step and options is not None,
        pcie_bandwidth_bytes_per_s=None if pcie is None else np.asarray(pcie, dtype=float),
        num_micro_batches=num_micro_batches,
        compute_prefix_s=np.concatenate([zero, np.cumsum(fwd + bwd)]),
        fwd_prefix_s=np.concatenate([zero, np.cumsum(fwd)]),
        param_prefix_bytes=np.concatenate([zero, np.cumsum(arrays["param_bytes"])]),
        saved_prefix_bytes=np.concatenate([zero, np.cumsum(arrays["saved_bytes"])]) * ratio,
        saved_start_bytes=start_bytes(arrays, ratio),
        output_bytes=arrays["output_bytes"] * ratio,
        time_scale=time_scale,
        p2p_bandwidth_bytes_per_s=np.array([link.bandwidth_bytes_per_s for link in p2p]),
        p2p_latency_s=np.array([link.latency_s for link in p2p]),
        allreduce_s_per_byte=np.array([x[0] for x in ar]),
        allreduce_fixed_s=np.array([x[1] for x in ar]),
        in_flight=inflight,
        capacity_bytes=capacity,
        bwd_input_prefix_s=np.concatenate([zero, np.cumsum(bwd_input)]),
        state_bytes_per_param_byte=state_per_byte,
        grad_bytes_per_param_byte=grad_bpp / profile.bytes_per_param,
        tied_copy_bytes=tied,
        gathered_bytes=gathered,
        gathered_table=gathered_table,
        recompute_transient_table=(range_max_table(arrays["backward_transient_bytes"] * ratio)
                                   if options is None and np.any(arrays["backward_transient_bytes"] > 0) else None),
        gather_bytes_per_param_byte=1.0 if state.stage >= 1 else 0.0,
        micro_batch_collectives=state.stage if state.stage >= 2 else 0,  # ZeRO-1 once a pipeline (in_pipeline)
        overlap=job.comm_overlap,
        wgrad_window=wgrad,
        held_prefix_bytes=(np.concatenate([zero, np.cumsum(arrays["wgrad_saved_bytes"])]) * ratio
                           if counts is not None else None),
        held_start_bytes=start_bytes(arrays, ratio * profile.wgrad_saved_fraction) if counts is not None else None,
        wgrad_counts=counts,
        params_per_param_byte=1.0 / profile.bytes_per_param if profile.bytes_per_param > 0 else 0.0,
        param_layer_prefix=np.concatenate([[0], np.cumsum(arrays["param_bytes"] > 0)]),
        chunk_states=np.asarray(chunk_states, dtype=float) if device_checked else None,
    )


def _fsdp_gathered(profile: ModelProfile, state, pp: int, stages_per_device: int):
    """``(gathered, gathered_table)``: the bytes of FSDP units held gathered
    per stage, ``(pp,)``, and with one stage per device the range-maximum
    table of them (None otherwise). FSDP keeps the unit computing and the
    one prefetched gathered: with one stage per device, the two largest of
    the stage's own layers (a range maximum, ``gathered`` then 0); with
    chunks, the model's largest, shared out."""
    per_param = state.gathered_bytes_per_param()
    unit_gathered = FSDP_LIVE_UNITS * profile.layer_arrays["param_bytes"] * per_param / profile.bytes_per_param
    per_stage = stages_per_device == 1 and per_param > 0
    gathered_table = range_max_table(unit_gathered) if per_stage else None
    gathered = np.full(pp, 0.0 if per_stage else float(np.max(unit_gathered, initial=0.0)) / stages_per_device)
    return gathered, gathered_table


def _memory_options(profile: ModelProfile, cluster: Cluster, job: Job, *, ratio: float, dp: int, placement, tp: int,
                    pp: int, stages_per_device: int, time_scale, optimizer_offload: bool, option_profiles,
                    weight_streaming: bool, weight_swapping: bool) -> StageOptions | None:
    """The per-stage memory options of :func:`build_pipeline_costs`:
    Mobius' swapped stages (:func:`swap_options`), streamed weights
    (:func:`stream_options`, with a ``[host]``), else recompute levels and
    optimizer offload (:func:`stage_options`; None when there is no
    choice)."""
    first = option_profiles[0][1] if option_profiles else profile
    if weight_swapping:
        return swap_options(first, cluster, job, ratio=ratio, dp=dp, placement=placement, tp=tp,
                            pp=pp // stages_per_device)
    if weight_streaming and cluster.host is not None:
        return stream_options(first, cluster, job, ratio=ratio, dp=dp, placement=placement, tp=tp,
                              time_scale=time_scale, stages_per_device=stages_per_device,
                              option_profiles=option_profiles)
    return stage_options(profile, cluster, job, ratio=ratio, dp=dp, placement=placement, tp=tp,
                         offload=optimizer_offload, stages_per_device=stages_per_device,
                         option_profiles=option_profiles, time_scale=time_scale)


def start_bytes(arrays: dict, scale: float) -> np.ndarray | None:
    """``(L+1,)``: the bytes a stage starting at each layer saves besides
    the prefix sums of :attr:`pipesearch.types.ModelProfile.layer_arrays`
    (its first layer's ``shared_saved_bytes`` times ``scale``; 0 at ``L``),
    or None for a profile without shared bytes."""
    shared = arrays["shared_saved_bytes"]
    return np.concatenate([shared, [0.0]]) * scale if np.any(shared > 0) else None


@lru_cache(maxsize=256)
def zero_bubble_counts(pp: int, num_micro_batches: int) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)``, each ``(pp, Q)``: the ZB-H1 count states of every stage
    (:func:`pipesearch.schedules.wgrad_states`, padded with ``(0, 0)``),
    read at ``min(m, 2 pp)`` micro-batches (the warm-up depth is bounded:
    the states stop changing there). Read-only arrays, memoised."""
    return _zero_bubble_counts(pp, min(num_micro_batches, 2 * pp))


@lru_cache(maxsize=64)
def _zero_bubble_counts(pp: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The count states in closed form (``m >= pp``; else the schedule's
    own walk, which refuses it). Rank ``r`` of ZB-H1 (:func:`pipesearch.
    schedules.zb_h1`) runs ``w = pp - 1 - r`` warm-up forwards; at the start
    of step ``j`` it has run ``w + j`` forwards (while ``w + j < m``), ``j``
    input gradients and ``max(0, j - r)`` weight gradients, so it holds
    ``(w, min(j, r))``; the step's ``F`` makes it ``(w + 1, min(j, r))`` and
    its ``I`` ``(w, min(j, r) + 1)``. Step ``j = r`` (it has an ``F``: ``w +
    r < m``) reaches ``(pp - r, r)`` and ``(pp - r - 1, r + 1)``; every other
    state (warm-up, other steps, the steps without ``F`` after ``m - w``
    where ``a <= w - 1``, the closing ``W``) lies below one of them in both
    counts. tests/test_costs_zero_bubble.py checks this against the walk."""
    from .schedules import build, wgrad_states

    if m >= pp >= 1:
        r = np.arange(pp, dtype=float)
        A, B = np.stack([pp - r - 1, pp - r], axis=1), np.stack([r + 1, r], axis=1)
        A.flags.writeable = B.flags.writeable = False
        return A, B
    states = wgrad_states(build("zb-h1", pp, m, 1))
    Q = max(len(x) for x in states)
    A, B = np.zeros((pp, Q)), np.zeros((pp, Q))
    for k, xs in enumerate(states):
        for q, (a, b) in enumerate(xs):
            A[k, q], B[k, q] = a, b
    A.flags.writeable = B.flags.writeable = False
    return A, B


def dp_reduce_bytes_per_param(job: Job, state, model_bytes_per_param: float) -> float:
    """Bytes per parameter the data-parallel gradient reduce moves:
    ``job.grad_bytes_per_param`` when given; else the fp32 main gradients
    when the state keeps them (Megatron-LM reduces ``main_grad``, fp32 for
    bf16 training: its ``--accumulate-allreduce-grads-in-fp32``); else the
    gradients the state keeps, at least the model dtype's
    ``model_bytes_per_param`` (fp32 training, ``fp32-adam``, reduces 4
    bytes a parameter of a 16-bit profile)."""
    if job.grad_bytes_per_param is not None:
        return job.grad_bytes_per_param
    if state.main_grad_bytes > 0:
        return state.main_grad_bytes
    return max(model_bytes_per_param, state.grad_bytes)


def device_memory_shares(profile: ModelProfile, in_flight: np.ndarray, stages_per_device: int,
                         state_per_param_byte: float, ratio: float) -> np.ndarray:
    """Share of its device's usable memory each of the ``P`` stages may fill.

    One stage per device: 1. With ``v = stages_per_device > 1`` (stage ``s``
    on device ``s % (P / v)``) the device's chunks share its memory, and the
    split is checked stage by stage, so the device's capacity is divided
    among its chunks; any division whose shares sum to 1 is safe (the
    device's total never exceeds its capacity). Chunk ``c`` of a device gets
    ``(S + n_c A) / (v S + N A)``, with ``S`` and ``A`` the model's total
    state and saved activation bytes per micro-batch and ``n_c`` its
    in-flight micro-batches at the device's simultaneous peak
    (``N = sum n_c``): the shares a balanced split of the model needs, so
    balanced interleaved plans that fit are not refused (an equal ``1/v``
    division would refuse them when the chunks' in-flight counts differ,
    e.g. 15, 8 and 8 for rank 0 of ``p = 8, v = 3``).
    """
    P = len(in_flight)
    if stages_per_device <= 1:
        return np.ones(P)
    arrays = profile.layer_arrays
    S = float(arrays["param_bytes"].sum()) * state_per_param_byte
    A = float(arrays["saved_bytes"].sum()) * ratio
    n = np.asarray(in_flight, dtype=float)
    dev = np.arange(P) % (P // stages_per_device)
    need = S + n * A
    total = np.bincount(dev, weights=need, minlength=P // stages_per_device)[dev]
    return np.where(total > 0, need / np.where(total > 0, total, 1.0), 1.0 / stages_per_device)
