"""Value types of pipesearch: frozen dataclasses with units in their field names.

Nothing here imports the rest of the package. Conventions:

* times are seconds (``*_s``), sizes bytes (``*_bytes``), bandwidths bytes per
  second (``*_bytes_per_s``), rates FLOP per second (``*_flops``);
* a :class:`Layer`'s times and activation sizes are those measured (or
  computed) at its profile's ``profiled_batch_size``; the cost model scales
  activation sizes linearly to the micro-batch size it is asked about, and
  times through :meth:`ModelProfile.layer_times_at` (a fixed part plus a
  per-sample part where the profile has one, else linearly);
* device ids are integers ``0 .. cluster.num_devices - 1``, numbered node by
  node, group by group (see :class:`Cluster`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - annotations only; types imports nothing at run time
    from .memory import ParamState
    from .overlap import CommOverlap


@dataclass(frozen=True)
class Layer:
    """One layer (or block of layers) of a model that runs as a chain.

    Attributes:
        name: unique name of the layer within its model (e.g. ``"conv3_1"``).
        fwd_s: forward compute time at the profile's batch size, seconds.
        bwd_s: backward compute time at the profile's batch size, seconds
            (input-gradient plus weight-gradient).
        param_bytes: bytes of the layer's parameters, in the profile's parameter
            dtype (``ModelProfile.bytes_per_param`` bytes per parameter).
        output_bytes: bytes of the layer's output at the profile's batch size;
            what a stage boundary after this layer sends forward (and receives
            back as a gradient).
        saved_bytes: bytes kept from forward for backward at the profile's
            batch size (activations saved for the backward pass).
        bwd_input_s: optional share of ``bwd_s`` that computes the input
            gradient (zero-bubble schedules split backward into I and W).
        flops: optional forward+backward FLOPs at the profile's batch size.
        recompute_saved_bytes: optional bytes the layer keeps per batch when
            its activations are recomputed in backward (full recompute: its
            input, the checkpoint; Chen et al. 2016 sec. 3); ``None``: the
            layer is never recomputed.
        fwd_fixed_s, bwd_fixed_s, bwd_input_fixed_s: optional parts of
            ``fwd_s``, ``bwd_s``, ``bwd_input_s`` that do not depend on the
            batch size (kernel launches, weight reads), seconds: the
            intercepts of ``t(b) = fixed + per_sample * b`` fitted over two or
            more batch sizes (:func:`pipesearch.profiler.fit_fixed_per_sample`).
            ``None``: the time is proportional to the batch size.
        wgrad_saved_bytes: optional bytes the layer still holds per batch
            between a micro-batch's input-gradient and weight-gradient steps
            (zero-bubble schedules: the inputs of its weight-gradient GEMMs,
            Qi et al. 2023 Table 1; recomputed ones included); ``None``:
            ``saved_bytes x ModelProfile.wgrad_saved_fraction``.
        backward_transient_bytes: optional bytes per batch the layer holds
            only while it runs its backward, besides what it saved: the
            activations it recomputes there (a transformer block under full
            recomputation its whole activations, Chen et al. 2016 sec. 3);
            ``None``: 0.
        shared_saved_bytes: optional bytes of what the layer saves for
            backward that the layer before it saves too: the tensor between
            them, kept by both (a ReLU keeps its output for its backward and
            the Linear after it keeps the same tensor as its input). A stage
            holding both layers keeps it once, a stage starting at this
            layer keeps it (its device received it), so stage ``[i, j)``
            saves ``sum saved_bytes[i:j] - sum shared_saved_bytes[i+1:j]``
            (:meth:`pipesearch.costs.PipelineCosts.saved_bytes`); measured by
            :func:`pipesearch.profiler.profile_module`. ``None``: 0.
    """

    name: str
    fwd_s: float
    bwd_s: float
    param_bytes: float
    output_bytes: float
    saved_bytes: float
    bwd_input_s: float | None = None
    flops: float | None = None
    recompute_saved_bytes: float | None = None
    fwd_fixed_s: float | None = None
    bwd_fixed_s: float | None = None
    bwd_input_fixed_s: float | None = None
    wgrad_saved_bytes: float | None = None
    backward_transient_bytes: float | None = None
    shared_saved_bytes: float | None = None

    def renamed(self, name: str) -> "Layer":
        """This layer under another ``name`` (every other field the same; a
        copy without :func:`dataclasses.replace`'s per-field work, for the
        thousands of alike blocks of a transformer's table)."""
        out = object.__new__(Layer)
        out.__dict__.update(self.__dict__, name=name)
        return out

    def __repr__(self) -> str:
        """The dataclass repr, the fixed-time fields and the recompute
        checkpoint only when given (so the
        plan fingerprint of a profile without them is what it was before
        they existed)."""
        names = ("name", "fwd_s", "bwd_s", "param_bytes", "output_bytes", "saved_bytes", "bwd_input_s", "flops")
        names += tuple(n for n in ("fwd_fixed_s", "bwd_fixed_s", "bwd_input_fixed_s", "recompute_saved_bytes",
                                   "wgrad_saved_bytes", "backward_transient_bytes", "shared_saved_bytes")
                       if getattr(self, n) is not None)
        return f"Layer({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"


@dataclass(frozen=True)
class ModelProfile:
    """A model as a chain of layers with the conditions they were measured at.

    Attributes:
        name: model name (catalog name or file stem).
        layers: the chain, in execution order.
        profiled_batch_size: samples per batch the times and activation sizes
            were measured (or computed) at.
        profiled_device: catalog name (or free text) of the device the times
            were measured on.
        bytes_per_param: bytes per parameter in ``Layer.param_bytes``
            (4 for fp32 profiles such as PipeDream's).
        source: provenance, free text (file, paper, date).
        tied_param_bytes: bytes (profile dtype) of parameters the last layer
            shares with the first (tied input embedding and LM head), counted
            once, on the first layer; a stage holding the last layer but not
            the first keeps a copy of them.
        tokens_per_sample: tokens one sample trains on (sequence length;
            0 when the model has no tokens).
        model_flops_per_sample: PaLM's model FLOPs of one sample, forward
            and backward, without recomputation (0 when unknown).
        gemm_size: the GEMMs' inner dimension (a transformer's hidden size)
            at which the times were computed on ``profiled_device``
            (:meth:`DeviceSpec.achieved_fraction_at`): times convert between
            device types at that size's rates
            (:func:`pipesearch.costs.profile_precision`); 0: measured times,
            converted at each type's flat ``achieved_fraction``.
        wgrad_saved_fraction: share of the saved activation bytes still held
            between a micro-batch's input-gradient and weight-gradient steps
            (zero-bubble schedules; the inputs of the weight-gradient GEMMs,
            Qi et al. 2023 Table 1) by layers without their own
            ``Layer.wgrad_saved_bytes``; 1 keeps everything until the weight
            gradient. Where every layer has its own, the smallest of their
            shares (what the search's memory pre-filter, a lower bound,
            reads).
    """

    name: str
    layers: tuple[Layer, ...]
    profiled_batch_size: int
    profiled_device: str = "unknown"
    bytes_per_param: float = 4.0
    source: str = ""
    tied_param_bytes: float = 0.0
    wgrad_saved_fraction: float = 1.0
    tokens_per_sample: int = 0
    model_flops_per_sample: float = 0.0
    gemm_size: float = 0.0

    #: why a profile that does not :attr:`takes_time` is refused
    NO_TIME = ("every layer has zero forward and backward time, so every plan would take 0 s; "
               "give the profile's measured times")

    @property
    def takes_time(self) -> bool:
        """Whether some layer has a non-zero forward or backward time (a
        profile without any would make every plan take 0 s, :attr:`NO_TIME`)."""
        return any(lay.fwd_s + lay.bwd_s > 0 for lay in self.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def layer_arrays(self) -> dict:
        """The layer table as float arrays of shape ``(num_layers,)``: ``fwd_s``,
        ``bwd_s``, ``bwd_input_s`` (half of ``bwd_s`` where not given),
        ``param_bytes``, ``output_bytes``, ``shared_saved_bytes`` (0 where
        not given), ``saved_bytes`` (the layer's ``saved_bytes`` less its
        ``shared_saved_bytes``: what it adds to a stage holding the layer
        before it; a stage starting at it adds the shared bytes back,
        :meth:`pipesearch.costs.PipelineCosts.saved_bytes`), ``recomputable``
        (1.0 where the layer has ``recompute_saved_bytes``, else 0.0) and
        ``recompute_saved_bytes`` (``saved_bytes`` where not recomputable),
        ``wgrad_saved_bytes`` (``saved_bytes x wgrad_saved_fraction``, the
        shared bytes left out as in ``saved_bytes``, where not given; a
        stage starting at the layer holds its share of them,
        :attr:`pipesearch.costs.PipelineCosts.held_start_bytes`), ``backward_transient_bytes``
        (0 where not given). Computed once."""
        import numpy as np

        cols = {k: np.array([getattr(lay, k) for lay in self.layers], dtype=float)
                for k in ("fwd_s", "bwd_s", "param_bytes", "output_bytes", "saved_bytes")}
        cols["shared_saved_bytes"] = np.array([lay.shared_saved_bytes or 0.0 for lay in self.layers], dtype=float)
        cols["saved_bytes"] = cols["saved_bytes"] - cols["shared_saved_bytes"]
        cols["bwd_input_s"] = np.array([lay.bwd_s / 2 if lay.bwd_input_s is None else lay.bwd_input_s
                                        for lay in self.layers], dtype=float)
        cols["recomputable"] = np.array([lay.recompute_saved_bytes is not None for lay in self.layers], dtype=float)
        cols["recompute_saved_bytes"] = np.where(
            cols["recomputable"] > 0, [lay.recompute_saved_bytes or 0.0 for lay in self.layers], cols["saved_bytes"])
        cols["wgrad_saved_bytes"] = np.where([lay.wgrad_saved_bytes is None for lay in self.layers],
                                             cols["saved_bytes"] * self.wgrad_saved_fraction,
                                             [lay.wgrad_saved_bytes or 0.0 for lay in self.layers])
        cols["backward_transient_bytes"] = np.array([lay.backward_transient_bytes or 0.0 for lay in self.layers],
                                                    dtype=float)
        for v in cols.values():
            v.flags.writeable = False
        return cols

    def layer_times_at(self, batch_size: float) -> dict:
        """Per-layer compute seconds at ``batch_size`` samples per micro-batch.

        The one rule for a layer's time at another batch size: with ``B =
        profiled_batch_size``, ``t`` the time at ``B`` and ``f`` its fixed part
        (``Layer.fwd_fixed_s`` ...), ``t(b) = f + (t - f) b / B`` (the affine
        fit ``fixed + per_sample * b`` through the profiled point); without a
        fixed part ``t(b) = t b / B``.

        Returns:
            ``{"fwd_s", "bwd_s", "bwd_input_s"}``: float arrays ``(num_layers,)``;
            ``bwd_input_s`` defaults to half of ``bwd_s`` as in
            :attr:`layer_arrays`.
        """
        import numpy as np

        arrays, ratio = self.layer_arrays, batch_size / self.profiled_batch_size
        out = {}
        for key, (has, fixed) in self.fixed_time_arrays.items():
            t = arrays[key]
            out[key] = np.where(has, fixed + (t - fixed) * ratio, t * ratio) if has.any() else t * ratio
        return out

    @cached_property
    def fixed_time_arrays(self) -> dict:
        """``{"fwd_s", "bwd_s", "bwd_input_s"}: (has, fixed_s)``, a bool and a
        float array ``(num_layers,)``: which layers have a fixed part and its
        seconds (0 where not). A missing input-gradient time is half of
        ``bwd_s``, and so is its fixed part. Computed once."""
        import numpy as np

        values = {"fwd_s": [lay.fwd_fixed_s for lay in self.layers],
                  "bwd_s": [lay.bwd_fixed_s for lay in self.layers],
                  "bwd_input_s": [(None if lay.bwd_fixed_s is None else lay.bwd_fixed_s / 2)
                                  if lay.bwd_input_s is None else lay.bwd_input_fixed_s for lay in self.layers]}
        out = {}
        for key, column in values.items():
            has = np.array([v is not None for v in column], dtype=bool)
            fixed = np.array([0.0 if v is None else v for v in column], dtype=float)
            has.flags.writeable = fixed.flags.writeable = False
            out[key] = (has, fixed)
        return out

    @property
    def compute_per_sample_s(self) -> float:
        """Sum over layers of the per-sample part of ``fwd_s + bwd_s``,
        seconds per sample: ``sum (t - f) / B`` (``f = 0`` without a fixed
        part). Since ``f >= 0``, ``b`` times it is at most the model's
        compute at any batch size ``b`` (a lower bound for pruning)."""
        return sum(lay.fwd_s + lay.bwd_s - ((lay.fwd_fixed_s or 0.0) + (lay.bwd_fixed_s or 0.0))
                   for lay in self.layers) / self.profiled_batch_size

    def time_ratio_at(self, batch_size: float):
        """Per layer, ``fwd + bwd`` at ``batch_size`` over ``fwd + bwd`` at
        ``profiled_batch_size`` (:meth:`layer_times_at`): the factor that
        takes a layer's time at the profiled batch size (on any device type)
        to ``batch_size``. ``batch_size / B`` for layers without a fixed part
        or with zero time. Float array ``(num_layers,)``."""
        import numpy as np

        arrays, at = self.layer_arrays, self.layer_times_at(batch_size)
        base = arrays["fwd_s"] + arrays["bwd_s"]
        affine = self.fixed_time_arrays["fwd_s"][0] | self.fixed_time_arrays["bwd_s"][0]
        safe = np.where(base > 0, base, 1.0)
        return np.where(affine & (base > 0), (at["fwd_s"] + at["bwd_s"]) / safe,
                        batch_size / self.profiled_batch_size)


#: the CUDA compute capability from which a device computes in bf16 and the serving
#: engines load FP8 weights (Ampere; Volta and Turing have neither)
MIN_BF16_CAPABILITY = 8.0


def has_bf16(compute_capability: float | None) -> bool:
    """Whether a device of this compute capability computes in bf16 (8.0 or
    newer; True when not stated)."""
    return compute_capability is None or compute_capability >= MIN_BF16_CAPABILITY


def mfu_peak_flops(peak_fp16_flops: float, tensor_accumulate: str) -> float:
    """The MFU denominator of a device whose dense 16-bit tensor peak
    ``peak_fp16_flops`` (FLOP/s) holds at ``tensor_accumulate``: that peak
    with fp32 accumulate, half an fp16-accumulate one (GeForce cards run
    fp32 accumulate at half rate; :attr:`DeviceSpec.mfu_peak_flops`)."""
    return peak_fp16_flops / 2 if tensor_accumulate == "fp16" else peak_fp16_flops


#: share of a device's peak memory bandwidth that streaming kernels reach
#: (nominal: decode GEMV and paged-attention kernels, and the fused
#: multi-tensor optimizer steps of apex / torch, measure 70-90% of peak)
STREAMING_BANDWIDTH_FRACTION = 0.8


@dataclass(frozen=True)
class DeviceSpec:
    """An accelerator type.

    Attributes:
        name: catalog name (e.g. ``"a100-80gb"``).
        memory_bytes: device memory.
        peak_fp16_flops: dense fp16/bf16 tensor peak, FLOP/s.
        peak_fp32_flops: dense fp32 peak (non-tensor), FLOP/s.
        hbm_bandwidth_bytes_per_s: memory bandwidth.
        achieved_fraction: fraction of ``peak_fp16_flops`` that large GEMMs reach
            in training (one calibration per device type, documented in the
            catalog entry).
        gemm_half_efficiency_size: GEMM inner dimension at which half of
            ``achieved_fraction`` is reached (see :meth:`achieved_fraction_at`).
        peak_fp8_flops: dense FP8 tensor peak, FLOP/s; 0 for devices without
            FP8 tensor cores (serving times FP8 GEMMs at this rate).
        tensor_accumulate: accumulate type at which ``peak_fp16_flops`` holds
            (``"fp16"`` or ``"fp32"``; GeForce cards run fp32 accumulate at
            half their fp16-accumulate rate).
        nvlink: whether the device has NVLink to its peers (``None``: not stated).
        compute_capability: CUDA compute capability (``8.0`` for A100;
            ``None``: not stated); the serving engines need 8.0 for FP8
            weights and bf16.
    """

    name: str
    memory_bytes: float
    peak_fp16_flops: float
    peak_fp32_flops: float
    hbm_bandwidth_bytes_per_s: float
    achieved_fraction: float = 0.5
    description: str = ""
    gemm_half_efficiency_size: float = 0.0
    peak_fp8_flops: float = 0.0
    tensor_accumulate: str = "fp32"
    nvlink: bool | None = None
    compute_capability: float | None = None

    @property
    def mfu_peak_flops(self) -> float:
        """The dense 16-bit tensor peak of mixed-precision training, FLOP/s:
        ``peak_fp16_flops`` with fp32 accumulate (the MFU denominator),
        half the fp16-accumulate rate a GeForce catalog entry states (NVIDIA
        Ada white paper, Table 2: RTX 4090 330.3 TFLOP/s with fp16
        accumulate, 165.2 with fp32, the rate bf16 runs at)."""
        return mfu_peak_flops(self.peak_fp16_flops, self.tensor_accumulate)

    @property
    def streaming_bandwidth_bytes_per_s(self) -> float:
        """Bytes per second a kernel that streams its operands through
        memory once reaches: ``hbm_bandwidth_bytes_per_s`` times
        :data:`STREAMING_BANDWIDTH_FRACTION`."""
        return self.hbm_bandwidth_bytes_per_s * STREAMING_BANDWIDTH_FRACTION

    def achieved_fraction_at(self, gemm_size: float) -> float:
        """Fraction of ``peak_fp16_flops`` reached by a transformer whose GEMMs
        have inner dimension ``gemm_size`` (its hidden size):
        ``achieved_fraction * n / (n + gemm_half_efficiency_size)``, a
        saturating curve (small GEMMs and the element-wise kernels around them
        reach less of the peak). With ``gemm_half_efficiency_size = 0`` it is
        ``achieved_fraction`` for every size."""
        n = float(gemm_size)
        return self.achieved_fraction * n / (n + self.gemm_half_efficiency_size)


@dataclass(frozen=True)
class Link:
    """A point-to-point link class: ``time(bytes) = latency_s + bytes / bandwidth``.

    ``nics_per_node`` (links between nodes only): how many transfers of
    ``bandwidth_bytes_per_s`` each a node can send at once (its network
    ports); ``None`` for one per device (a NIC per GPU, as DGX servers have).
    Flows leaving one node beyond it share the ports
    (:func:`pipesearch.placement.nic_share`)."""

    bandwidth_bytes_per_s: float
    latency_s: float
    nics_per_node: int | None = None
    #: (inside a node only) every pair of the node's devices is linked at
    #: ``bandwidth_bytes_per_s`` through NVSwitch: the serving engines' own
    #: all-reduce runs there (:func:`pipesearch.serve.costs.allreduce_s`)
    nvswitch: bool = False

    def transfer_s(self, num_bytes: float) -> float:
        """Seconds to move ``num_bytes`` over this link (alpha-beta model)."""
        if num_bytes <= 0:
            return 0.0
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class DeviceGroup:
    """``nodes`` nodes of ``devices_per_node`` devices of one type."""

    device: DeviceSpec
    nodes: int
    devices_per_node: int

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node


@dataclass(frozen=True)
class HostSpec:
    """The host side of every node of a cluster: host memory and the PCIe
    tree between the host and the node's GPUs (the same for each node).

    Attributes:
        memory_bytes: host (CPU) memory of one node usable for offloaded
            training state, bytes.
        pcie_generation: PCIe generation of the GPU links (3, 4 or 5).
        pcie_lanes_per_gpu: lanes of each GPU's link (x16 usually).
        host_to_device_bytes_per_s: effective pinned host-to-device copy
            bandwidth of one GPU transferring alone, bytes/s (about 12.4 GB/s
            Gen3, 25 GB/s Gen4, 55 GB/s Gen5 for x16).
        switch_uplink_bytes_per_s: bandwidth of the uplink from one PCIe
            switch to its root complex, shared by every GPU under the switch
            that transfers at the same time, bytes/s.
        pcie_switches: the node-local GPU indices under each switch; the
            lists partition ``0 .. devices_per_node - 1``.
        cpu_adam_params_per_s: parameters per second the host's CPU Adam
            (fp32 master weights and moments) updates.
    """

    memory_bytes: float
    pcie_generation: int
    pcie_lanes_per_gpu: int
    host_to_device_bytes_per_s: float
    switch_uplink_bytes_per_s: float
    pcie_switches: tuple[tuple[int, ...], ...]
    cpu_adam_params_per_s: float

    def switch_of(self, local_gpu: int) -> int:
        """Index of the switch that node-local GPU ``local_gpu`` sits under."""
        for k, members in enumerate(self.pcie_switches):
            if local_gpu in members:
                return k
        raise IndexError(f"GPU {local_gpu} is under no PCIe switch of the host")


@dataclass(frozen=True)
class Cluster:
    """A cluster of one or more device groups.

    Device ids run group by group, node by node: group 0's node 0 holds ids
    ``0 .. devices_per_node-1``, and so on. Two devices on the same node talk
    over ``intra_node``; on different nodes of the same group over
    ``inter_node``; in different groups over ``inter_group`` (``inter_node``
    when not given). ``host`` describes each node's host memory and PCIe
    tree (``None``: not given; nothing can be offloaded).
    """

    name: str
    groups: tuple[DeviceGroup, ...]
    intra_node: Link
    inter_node: Link
    inter_group: Link | None = None
    description: str = ""
    host: HostSpec | None = None

    @cached_property
    def num_devices(self) -> int:
        return sum(g.num_devices for g in self.groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def is_homogeneous(self) -> bool:
        return len({g.device.name for g in self.groups}) == 1

    @property
    def is_uniform(self) -> bool:
        """Every node alike and one link between any two nodes (one group,
        or groups of one device spec and node size joined by an
        ``inter_group`` link equal to ``inter_node``), so the ``pipeline``
        and ``data`` placements over the device ids are its layouts up to
        symmetry. Groups that their device, their node sizes or the
        ``inter_group`` link tell apart are not: their search tries every
        layout, as a mixed cluster's."""
        first = self.groups[0]
        alike = all(g.device == first.device and g.devices_per_node == first.devices_per_node for g in self.groups)
        return alike and (len(self.groups) == 1 or (self.inter_group or self.inter_node) == self.inter_node)

    def device_spec(self, device_id: int) -> DeviceSpec:
        """The spec of device ``device_id``; raises IndexError when out of range."""
        return self.groups[self.group_of(device_id)].device

    def node_of(self, device_id: int) -> int:
        """Global node index of ``device_id``."""
        self._check(device_id)
        return self._node_ids[device_id]

    def group_of(self, device_id: int) -> int:
        self._check(device_id)
        return self._group_ids[device_id]

    @cached_property
    def _group_ids(self) -> tuple[int, ...]:
        return tuple(self._locate(d)[0] for d in range(self.num_devices))

    @cached_property
    def _node_ids(self) -> tuple[int, ...]:
        out = []
        for d in range(self.num_devices):
            group, node = self._locate(d)
            out.append(sum(g.nodes for g in self.groups[:group]) + node)
        return tuple(out)

    @cached_property
    def _id_arrays(self):
        """``(node ids, group ids)`` of every device as read-only int64
        numpy arrays, made once per cluster (vectorised link terms)."""
        import numpy as np

        out = np.array(self._node_ids, dtype=np.int64), np.array(self._group_ids, dtype=np.int64)
        for a in out:
            a.flags.writeable = False
        return out

    def _check(self, device_id: int) -> None:
        if not 0 <= device_id < len(self._group_ids):
            raise IndexError(f"device id {device_id} outside 0 .. {self.num_devices - 1}")

    def link(self, a: int, b: int) -> Link:
        """The link class between devices ``a`` and ``b`` (``a != b``)."""
        ga, gb = self.group_of(a), self.group_of(b)
        if ga != gb:
            return self.inter_group or self.inter_node
        return self.intra_node if self.node_of(a) == self.node_of(b) else self.inter_node

    def _locate(self, device_id: int) -> tuple[int, int]:
        if device_id < 0:
            raise IndexError(f"device id {device_id} < 0")
        rest = device_id
        for gi, g in enumerate(self.groups):
            if rest < g.num_devices:
                return gi, rest // g.devices_per_node
            rest -= g.num_devices
        raise IndexError(f"device id {device_id} >= {self.num_devices} devices")


#: every schedule pipesearch knows (builders in :mod:`pipesearch.schedules`)
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs", "mobius", "roundpipe")

#: more micro-batches per iteration than this are refused: the schedules and
#: the simulator hold every action, and no runtime accumulates that many
MAX_MICRO_BATCHES = 16384


@dataclass(frozen=True)
class Job:
    """What to train and how.

    Attributes:
        global_batch_size: samples per iteration across all replicas.
        state_bytes_per_param: bytes of weights + gradients + optimizer state per
            parameter held by a device. Default 16: mixed-precision Adam
            (fp16 weights 2 + fp16 gradients 2 + fp32 master weights, momentum
            and variance 12; Rajbhandari et al., ZeRO, SC'20, sec. 3.1), which
            is also plain fp32 Adam (4 + 4 + 4 + 4).
        grad_bytes_per_param: bytes per parameter of the gradients the
            data-parallel all-reduce moves; ``None`` means the profile's own
            ``bytes_per_param``.
        memory_reserve_bytes: bytes per device kept free for the framework,
            workspace and fragmentation.
        zero1: shard the optimizer state across the data-parallel replicas
            (ZeRO stage 1, Rajbhandari et al. SC'20): each device keeps
            ``optimizer_bytes_per_param / dp`` of it; the gradient all-reduce
            becomes a reduce-scatter plus an all-gather of the same volume.
        optimizer_bytes_per_param: the shardable part of
            ``state_bytes_per_param`` (12 for mixed-precision Adam: fp32
            master weights, momentum, variance).
        param_state: the training state by component with its sharding
            (:class:`pipesearch.memory.ParamState`); when given it replaces
            ``state_bytes_per_param``, ``optimizer_bytes_per_param`` and
            ``zero1`` (:func:`pipesearch.memory.param_state_of`).
        memory_headroom_fraction: share of each device's capacity left
            unplanned on top of ``memory_reserve_bytes`` (allocator
            fragmentation, NCCL buffers, transient peaks the model does not
            count); usable memory ``= capacity * (1 - headroom) - reserve``.
        optimizer_offload: let stages keep their optimizer state in host
            memory (ZeRO-Offload style; the cluster needs a ``[host]`` table;
            :func:`pipesearch.stage_options.stage_options`).
        weight_streaming: let stages keep weights, gradients and optimizer
            state in host memory and stream each layer's weights in while the
            previous one computes (:func:`pipesearch.stage_options.stream_options`).
        comm_overlap: which data-parallel communication overlaps compute
            (:class:`pipesearch.overlap.CommOverlap`); ``None``: none, every
            collective after the rank's last action.
        delayed_optimizer_step: run each stage's host step (offloaded or
            streamed optimizer, Mobius) beside the next iteration's compute,
            the weights one step stale (docs/offload.md).
    """

    global_batch_size: int
    state_bytes_per_param: float = 16.0
    grad_bytes_per_param: float | None = None
    memory_reserve_bytes: float = 1 << 30
    zero1: bool = False
    optimizer_bytes_per_param: float = 12.0
    param_state: ParamState | None = None
    memory_headroom_fraction: float = 0.0
    optimizer_offload: bool = False
    weight_streaming: bool = False
    comm_overlap: CommOverlap | None = None
    #: not in the repr, so that search fingerprints without it stay as they were
    #: (the search adds it to the fingerprint when set)
    delayed_optimizer_step: bool = field(default=False, repr=False)
    #: let stages keep their saved activations in host memory, copied over
    #: PCIe (:func:`pipesearch.stage_options.activation_host_options`); not in
    #: the repr, as ``delayed_optimizer_step``
    activation_offload: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage of a plan.

    ``layers`` is half-open: ``(first, last + 1)``. ``devices`` lists the device
    ids that run this stage, one per data-parallel replica. ``compute_s`` is the
    forward+backward time of one micro-batch (``fwd_s`` of it forward); ``comm_s`` the point-to-point time
    of one micro-batch's activation sent forward plus its gradient received back
    over the stage's outgoing boundary; ``send_bytes`` the activation bytes sent
    forward per micro-batch; ``saved_bytes`` the activation bytes one in-flight
    micro-batch keeps on the stage; ``allreduce_s`` the data-parallel
    communication per iteration left after the stage's last backward (all of
    it without overlap: :mod:`pipesearch.overlap`) plus the stage's
    optimizer step, ``optimizer_step_s`` on its GPU or ``host_step_s``
    offloaded (each 0 where the step runs on the other side): what follows
    its last backward; ``dp_comm_s`` all of the
    data-parallel communication (gradient all-reduce, or reduce-scatter +
    all-gather); ``memory_option`` the stage's per-stage memory option
    (``"full"``: recomputed, ``"none+offload"``: optimizer in host memory;
    :func:`pipesearch.stage_options.stage_options`; empty when there were none);
    ``memory_bytes`` the peak memory of one of its devices, and
    ``memory_breakdown`` its parts as ``(name, bytes)`` pairs (training state
    by component, the copy of a tied matrix, gathered ZeRO-3 weights,
    activations; :meth:`pipesearch.costs.PipelineCosts.memory_breakdown`).
    ``replicas`` is set on every stage of a plan with per-stage replication
    (:mod:`pipesearch.replication`; the plan's ``dp`` is then 1 and
    ``devices`` lists the stage's ``replicas`` devices), None otherwise
    (every stage has the plan's ``dp`` replicas).
    """

    index: int
    layers: tuple[int, int]
    layer_names: tuple[str, ...]
    devices: tuple[int, ...]
    compute_s: float
    comm_s: float
    allreduce_s: float
    memory_bytes: float
    send_bytes: float
    device_type: str = ""
    fwd_s: float = 0.0
    saved_bytes: float = 0.0
    bwd_input_s: float = 0.0
    memory_breakdown: tuple[tuple[str, float], ...] = ()
    memory_option: str = ""
    host_step_s: float = 0.0
    dp_comm_s: float = 0.0
    replicas: int | None = None
    optimizer_step_s: float = 0.0


@dataclass(frozen=True)
class Prediction:
    """Predicted figures of a plan. ``bubble_fraction`` is the share of the
    iteration time that the bottleneck stage's devices sit idle.

    ``tokens_per_iteration`` and ``model_flops_per_iteration`` (PaLM's model
    FLOPs, :attr:`ModelProfile.model_flops_per_sample`) are 0 when unknown
    (profiles without tokens); ``peak_flops`` is the dense fp16 peak (fp32
    accumulate, :attr:`DeviceSpec.mfu_peak_flops`) of all
    ``num_devices`` devices the plan uses (0 in plan files written before
    they were recorded for every model); the rates derive from them and
    ``iteration_time_s``."""

    iteration_time_s: float
    samples_per_s: float
    bubble_fraction: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    tokens_per_iteration: float = 0.0
    model_flops_per_iteration: float = 0.0
    peak_flops: float = 0.0
    num_devices: int = 0

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second of the whole job, or None without tokens."""
        if not self.tokens_per_iteration or not self.iteration_time_s > 0:
            return None
        return self.tokens_per_iteration / self.iteration_time_s

    @property
    def tokens_per_s_per_device(self) -> float | None:
        """:attr:`tokens_per_s` divided by the devices the plan uses."""
        t = self.tokens_per_s
        return None if t is None or not self.num_devices else t / self.num_devices

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization (Chowdhery et al., "PaLM", 2022, Appendix B):
        model FLOPs per second (no recomputation counted) over the devices'
        peak, ``model_flops_per_iteration / (iteration_time_s * peak_flops)``."""
        if not self.model_flops_per_iteration or not self.peak_flops or not self.iteration_time_s > 0:
            return None
        return self.model_flops_per_iteration / (self.iteration_time_s * self.peak_flops)


@dataclass(frozen=True)
class Plan:
    """A complete, runnable plan: degrees, schedule, stages and predictions."""

    rank: int
    pp: int
    dp: int
    tp: int
    schedule: str
    micro_batch_size: int
    num_micro_batches: int
    stages: tuple[StagePlan, ...]
    predicted: Prediction
    vp: int = 1
    extra: tuple[tuple[str, object], ...] = field(default=())

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(s.layers[1] - s.layers[0] for s in self.stages)

    @property
    def stage_replicas(self) -> tuple[int, ...] | None:
        """Replicas of each stage under per-stage replication, or None (one
        ``dp`` for all stages)."""
        if not any(st.replicas is not None for st in self.stages):
            return None
        return tuple(st.replicas if st.replicas is not None else self.dp for st in self.stages)
