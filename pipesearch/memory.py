"""Per-parameter training state by component, and how data parallelism shards it.

A device that trains ``N`` parameters with a mixed-precision Adam optimizer
keeps, per parameter (bytes):

===================  ===========================================================
component            meaning
===================  ===========================================================
``weight_bytes``     the weights the forward and backward use (bf16/fp16: 2)
``grad_bytes``       their gradients in the model dtype (fp16/bf16: 2); 0 when
                     the runtime accumulates straight into fp32 main gradients
``main_grad_bytes``  fp32 gradient accumulation buffer (Megatron-LM's
                     ``main_grad``: 4; 0 elsewhere)
``master_bytes``     fp32 master copy of the weights (4)
``moment_bytes``     Adam's first and second moments, fp32 (8)
===================  ===========================================================

Presets (:data:`PRESETS`):

* ``mixed-adam`` = 2 + 2 + 0 + 4 + 8 = 16 B: Rajbhandari et al., "ZeRO", SC'20,
  sec. 3.1 ("2Psi + 2Psi + 12Psi"); the pipesearch default (it is also plain fp32
  Adam, 4 + 4 + 4 + 4).
* ``megatron`` = 2 + 0 + 4 + 4 + 8 = 18 B: Megatron-LM with 16-bit (bf16)
  weights and fp32 gradient accumulation and reduction (``main_grad``); the
  Megatron Core user guide, "Distributed Optimizer", table row "float16
  param, fp32 grads": 18 bytes without, ``6 + 12/d`` with the distributed
  optimizer, which distributes the optimizer state but not the gradients or
  the parameters. Korthikanti et al. 2022 (Fig. 1) count the same 18 bytes
  of state per parameter.
* ``fp32-adam`` = 4 + 4 + 0 + 0 + 8 = 16 B: fp32 training, no master copy
  (the same guide's "fp32 param, fp32 grads": 16, ``8 + 8/d``).

Sharding over ``d`` data-parallel replicas (:data:`SHARDINGS`; Rajbhandari et
al. SC'20 sec. 5, Fig. 1):

* ``none``: every replica keeps everything;
* ``zero1`` (optimizer states, ``P_os``; Megatron-LM's distributed optimizer
  is this): master weights and moments divided by ``d``;
* ``zero2`` (``P_os+g``): also the gradients (``grad_bytes`` and
  ``main_grad_bytes``) divided by ``d``;
* ``zero3`` / ``fsdp`` (``P_os+g+p``; PyTorch FSDP ``FULL_SHARD``, torchtitan's
  default): everything divided by ``d``. The unsharded weights of the units
  being computed are gathered on the fly; :func:`gathered_bytes_per_param`
  says how many such copies are live (two: the one computing and the one
  prefetched).

Under pipeline parallelism (more than one pipeline rank) ZeRO-2 and ZeRO-3
keep what ZeRO-1 keeps (:meth:`ParamState.in_pipeline`: the pipeline
runtimes defer gradient reduction and resharding to the last micro-batch).

With ``Psi = 7.5e9`` parameters and ``d = 64`` the ``mixed-adam`` totals are
120 GB, 31.4 GB, 16.6 GB and 1.9 GB (ZeRO Fig. 1), which the tests check.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from .types import Job

SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp")
"""Accepted sharding names; ``fsdp`` is ``zero3``."""

COMPONENTS = ("weights", "grads", "main_grads", "master_weights", "optimizer_moments")
"""Names of the components in :meth:`ParamState.breakdown_per_param`, in order."""


@dataclass(frozen=True)
class ParamState:
    """Bytes per parameter of each training-state component, and their sharding.

    Attributes:
        weight_bytes: model-dtype weights used by forward and backward.
        grad_bytes: model-dtype gradients.
        main_grad_bytes: fp32 gradient accumulation buffer (Megatron-LM).
        master_bytes: fp32 master weights.
        moment_bytes: optimizer moments (Adam: momentum + variance, fp32).
        sharding: one of :data:`SHARDINGS`.
        name: preset name or ``"custom"``.
    """

    weight_bytes: float = 2.0
    grad_bytes: float = 2.0
    main_grad_bytes: float = 0.0
    master_bytes: float = 4.0
    moment_bytes: float = 8.0
    sharding: str = "none"
    name: str = "mixed-adam"

    def __post_init__(self) -> None:
        if self.sharding not in SHARDINGS:
            raise InputError(f"sharding {self.sharding!r}: expected one of {', '.join(SHARDINGS)}")
        for label in ("weight_bytes", "grad_bytes", "main_grad_bytes", "master_bytes", "moment_bytes"):
            v = getattr(self, label)
            if not (isinstance(v, (int, float)) and v >= 0 and v < float("inf")):
                raise InputError(f"ParamState.{label} = {v!r}: expected a finite number >= 0")

    @property
    def stage(self) -> int:
        """ZeRO stage: 0 (none), 1, 2 or 3 (``fsdp``)."""
        return {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}[self.sharding]

    @property
    def total_bytes(self) -> float:
        """Unsharded bytes per parameter (the sum of the components)."""
        return self.weight_bytes + self.grad_bytes + self.main_grad_bytes + self.master_bytes + self.moment_bytes

    def breakdown_per_param(self, dp: int) -> dict[str, float]:
        """Bytes per parameter one of ``dp`` replicas keeps, by component
        (:data:`COMPONENTS`), after sharding (ZeRO SC'20 sec. 5.1-5.3: stage 1
        divides the optimizer states by ``dp``, stage 2 also the gradients,
        stage 3 also the weights)."""
        if dp < 1:
            raise InputError(f"dp = {dp}: expected >= 1")
        k = self.stage
        opt = 1 / dp if k >= 1 else 1.0
        grad = 1 / dp if k >= 2 else 1.0
        weight = 1 / dp if k >= 3 else 1.0
        return {
            "weights": self.weight_bytes * weight,
            "grads": self.grad_bytes * grad,
            "main_grads": self.main_grad_bytes * grad,
            "master_weights": self.master_bytes * opt,
            "optimizer_moments": self.moment_bytes * opt,
        }

    def bytes_per_param(self, dp: int) -> float:
        """Total of :meth:`breakdown_per_param`: e.g. ``megatron`` with
        ``zero1`` keeps ``6 + 12 / dp`` (Megatron Core user guide, "Distributed Optimizer")."""
        return sum(self.breakdown_per_param(dp).values())

    def update_share(self, dp: int) -> float:
        """The part of the parameters one of ``dp`` replicas runs the
        optimizer step for: its share of the optimizer state (``1 / dp``
        from ZeRO stage 1 on, ZeRO SC'20 sec. 5.1), read off the master
        weights, or the moments where there are none; 1 without either."""
        parts = self.breakdown_per_param(dp)
        if self.master_bytes:
            return parts["master_weights"] / self.master_bytes
        return parts["optimizer_moments"] / self.moment_bytes if self.moment_bytes else 1.0

    @property
    def step_bytes_per_param(self) -> float:
        """Bytes of device memory the optimizer step reads and writes per
        parameter it updates: the gradient read (the fp32 main gradient
        where one is kept, else the model-dtype gradient), the master
        weights and the moments each read and written, the model-dtype
        weights written (read too where there is no master copy: the step
        updates them in place). Adam's update per parameter (Kingma & Ba,
        ICLR 2015, Alg. 1) in one pass of a fused multi-tensor kernel (apex
        FusedAdam, torch's fused AdamW, Megatron-LM's distributed optimizer):
        ``2 + 2 (4 + 8) + 2 = 28`` for ``mixed-adam``, ``4 + 24 + 2 = 30``
        for ``megatron``, ``4 + 2 x 8 + 2 x 4 = 28`` for ``fp32-adam``."""
        grad = self.main_grad_bytes if self.main_grad_bytes > 0 else self.grad_bytes
        weights = self.weight_bytes if self.master_bytes > 0 else 2 * self.weight_bytes
        return grad + 2 * (self.master_bytes + self.moment_bytes) + weights

    def floor_bytes_per_param(self) -> float:
        """The limit of :meth:`bytes_per_param` as ``dp`` grows: a lower bound
        for every ``dp`` (what the search's memory pruning may assume)."""
        return sum(v for v, sharded in zip(self.breakdown_per_param(1).values(), self._sharded()) if not sharded)

    def _sharded(self) -> tuple[bool, ...]:
        k = self.stage
        return (k >= 3, k >= 2, k >= 2, k >= 1, k >= 1)

    def in_pipeline(self, pipeline_ranks: int) -> "ParamState":
        """What a stage of a pipeline of ``pipeline_ranks`` ranks holds
        through an iteration: ZeRO-2 and ZeRO-3 / FSDP keep gradients (and
        weights) unsharded from the first micro-batch to the last, as ZeRO-1
        does. torch.distributed.pipelining runs every backward but the last
        of an FSDP stage with ``set_reshard_after_backward(False)`` and
        ``set_requires_gradient_sync(False)`` and reduce-scatters once after
        the last (``perform_reduce_grad``), torchtitan turns
        ``reshard_after_forward`` off under pipelining (its ``default``
        policy: per-micro-batch all-gathers would not overlap), and
        DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only. The data-
        parallel traffic stays one reduce-scatter and one all-gather per
        iteration. ``self`` for one rank or ZeRO-1 and below."""
        return replace(self, sharding="zero1") if pipeline_ranks > 1 and self.stage >= 2 else self

    def gathered_bytes_per_param(self) -> float:
        """Model-dtype bytes per parameter of the transiently gathered
        (unsharded) weights under ZeRO-3 / FSDP, per gathered copy; 0 for the
        other stages (they keep the weights whole)."""
        return self.weight_bytes if self.stage >= 3 else 0.0


OFFLOAD_KEPT_COMPONENTS = ("weights", "grads", "main_grads")
"""Components a device keeps when its optimizer is offloaded to the host
(ZeRO-Offload, Ren et al. USENIX ATC'21, sec. 4.1 and Fig. 2: the
forward-backward super-node keeps the 16-bit weights and gradients on the
GPU; the update super-node, fp32 weights, gradients, momentum and variance,
lives on the CPU)."""

#: fp32 gradient copy on the host per parameter (ZeRO-Offload's update super-node)
OFFLOAD_HOST_GRAD_BYTES = 4.0


def offload_bytes_per_param(state: ParamState, dp: int) -> tuple[float, float]:
    """``(device, host)`` bytes per parameter of one of ``dp`` replicas with
    the optimizer offloaded: the device keeps :data:`OFFLOAD_KEPT_COMPONENTS`
    (sharded as ``state`` says), the host the master weights and moments
    (sharded likewise) plus a fp32 gradient copy of the same share, e.g.
    ``(4, 16)`` for ``mixed-adam`` without sharding (ZeRO-Offload Fig. 2:
    ``2M + 2M`` on the GPU, ``4 x 4M`` on the CPU)."""
    parts = state.breakdown_per_param(dp)
    device = sum(v for k, v in parts.items() if k in OFFLOAD_KEPT_COMPONENTS)
    host = parts["master_weights"] + parts["optimizer_moments"] + OFFLOAD_HOST_GRAD_BYTES * state.update_share(dp)
    return device, host


def offload_copy_bytes_per_param(state: ParamState) -> tuple[float, float]:
    """``(out, in)`` bytes per parameter an offloaded optimizer step copies
    over PCIe: the gradients the device keeps (its model-dtype gradients, or
    Megatron-LM's fp32 main gradients where it keeps only those) to the host,
    and the updated weights, in the device's dtype, back (ZeRO-Offload, Ren
    et al. ATC'21 Fig. 2: ``2M`` out and ``2M`` in for 16-bit training; 4 B
    each way for ``fp32-adam``), before sharding (times the device's share)."""
    return (state.grad_bytes if state.grad_bytes > 0 else state.main_grad_bytes), state.weight_bytes


PRESETS: dict[str, ParamState] = {
    "mixed-adam": ParamState(2.0, 2.0, 0.0, 4.0, 8.0, "none", "mixed-adam"),
    "megatron": ParamState(2.0, 0.0, 4.0, 4.0, 8.0, "none", "megatron"),
    "fp32-adam": ParamState(4.0, 4.0, 0.0, 0.0, 8.0, "none", "fp32-adam"),
}
"""Named component sets (see the module docstring for their sources)."""

#: live gathered weight copies under ZeRO-3 / FSDP: the unit computing and the
#: one prefetched (PyTorch FSDP ``forward_prefetch`` / ``BACKWARD_PRE``)
FSDP_LIVE_UNITS = 2


def preset(name: str, sharding: str = "none") -> ParamState:
    """The preset ``name`` (:data:`PRESETS`) with ``sharding``.

    Raises:
        InputError: unknown preset or sharding.
    """
    if name not in PRESETS:
        raise InputError(f"optimizer state {name!r}: expected one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], sharding=sharding)


def from_totals(state_bytes_per_param: float, optimizer_bytes_per_param: float = 12.0,
                sharding: str = "none") -> ParamState:
    """A :class:`ParamState` from the two totals older options give: all
    state bytes per parameter, and the shardable optimizer part of it. The
    optimizer part (at most the total) is split 1:2 into master weights and
    moments (as Adam's 4 + 8); the rest half weights, half gradients. With the
    defaults 16 and 12 it is the ``mixed-adam`` preset."""
    if not (state_bytes_per_param >= 0 and optimizer_bytes_per_param >= 0):
        raise InputError(f"state bytes {state_bytes_per_param!r} / optimizer bytes {optimizer_bytes_per_param!r}: "
                         f"expected numbers >= 0")
    opt = min(float(optimizer_bytes_per_param), float(state_bytes_per_param))
    rest = float(state_bytes_per_param) - opt
    name = "mixed-adam" if (state_bytes_per_param, opt) == (16.0, 12.0) else "custom"
    return ParamState(rest / 2, rest / 2, 0.0, opt / 3, 2 * opt / 3, sharding, name)


#: bytes per parameter of fp16 / bf16 weights and of their gradients in
#: mixed-precision training (Micikevicius et al. 2018): what a total of
#: training-state bytes holds before any optimizer state
MODEL_DTYPE_BYTES = 2.0


def from_total_bytes(total_bytes_per_param: float, sharding: str = "none") -> ParamState:
    """A :class:`ParamState` from one total of bytes per parameter (the
    ``--optimizer-bytes-per-param`` option): the first
    :data:`MODEL_DTYPE_BYTES` are weights, the next as many gradients, the
    rest, at most 12, optimizer state (1:2 master weights and moments, as
    Adam's 4 + 8); bytes beyond 16 go half to weights, half to gradients.
    16 is the ``mixed-adam`` preset; 4 is weights and gradients only (nothing
    for ZeRO to shard). The plan command takes totals from 4 to 16, where
    the gradients are the model dtype's 2 bytes the reduce moves.

    Raises:
        InputError: a total below 0.
    """
    total = float(total_bytes_per_param)
    if not total >= 0:
        raise InputError(f"state bytes {total_bytes_per_param!r}: expected a number >= 0")
    weights = min(total, MODEL_DTYPE_BYTES)
    grads = min(total - weights, MODEL_DTYPE_BYTES)
    opt = min(12.0, total - weights - grads)
    extra = total - weights - grads - opt
    name = "mixed-adam" if total == 16.0 else "custom"
    return ParamState(weights + extra / 2, grads + extra / 2, 0.0, opt / 3, 2 * opt / 3, sharding, name)


def param_state_of(job: Job, pipeline_ranks: int = 1) -> ParamState:
    """The :class:`ParamState` a :class:`~pipesearch.types.Job` asks for:
    ``job.param_state`` when set, else the one its totals
    (``state_bytes_per_param``, ``optimizer_bytes_per_param``, ``zero1``)
    describe (:func:`from_totals`); what a stage of a pipeline of
    ``pipeline_ranks`` ranks holds (:meth:`ParamState.in_pipeline`)."""
    if job.param_state is not None:
        return job.param_state.in_pipeline(pipeline_ranks)
    return from_totals(job.state_bytes_per_param, job.optimizer_bytes_per_param,
                       "zero1" if job.zero1 else "none").in_pipeline(pipeline_ranks)


def usable_memory_bytes(job: Job, capacity_bytes):
    """Memory a plan may fill on a device of ``capacity_bytes``:
    ``capacity * (1 - memory_headroom_fraction) - memory_reserve_bytes``
    (works element-wise on arrays)."""
    return capacity_bytes * (1.0 - job.memory_headroom_fraction) - job.memory_reserve_bytes
