"""Which communication runs under compute, and how much of it stays exposed.

Data-parallel gradient synchronisation is the one collective of a training
step that does not sit between two computations of the same micro-batch:
it runs once per iteration, after the gradients of the last micro-batch are
ready. Runtimes hide it in different amounts
(:data:`pipesearch.runtimes.OVERLAP_DEFAULTS`):

* **Gradient reduce overlapped with the last backward** (Megatron-LM
  ``--overlap-grad-reduce``, PyTorch DDP, FSDP). Gradients are grouped into
  ``K`` buckets in reverse layer order; a bucket's all-reduce (or, with a
  sharded optimizer, reduce-scatter) starts as soon as the last micro-batch's
  backward has produced all of its gradients, and the buckets' collectives run
  one after another on the network.
* **Parameter all-gather overlapped with the first forward** (Megatron-LM
  ``--overlap-param-gather`` with the distributed optimizer; FSDP's forward
  prefetch): the updated, sharded weights are gathered bucket by bucket while
  the next iteration's first micro-batch runs its forward.
* **Tensor-parallel collectives under GEMMs** (Megatron-LM
  ``--tp-comm-overlap``): handled where the layer tables are computed
  (:func:`pipesearch.profiles.transformer.layer_table`, ``overlap_tp_forward``).

Exposed time of a bucketed collective (:func:`exposed_s`). A stage's
collective of ``C`` seconds in ``K`` equal buckets runs under a compute window
of ``W`` seconds (the last backward, or the first forward) that produces (or
consumes) the buckets at a uniform rate: bucket ``k = 1..K`` is ready at
``k W / K`` and the collectives queue on the network, each ``C / K``, so the
last one ends at ``max_k (k W / K + (K - k + 1) C / K)`` after the window
starts; the expression is linear in ``k``, so its maximum is at ``k = 1`` or
``k = K``: ``max(W / K + C, W + C / K)``. What runs past the window's end is

    exposed = max(C / K, C - (1 - 1 / K) W)

(``K = 1``: the whole collective; ``K -> inf``: ``max(0, C - W)``, the
classic "communication hidden up to the compute time"). Every bucket's
collective pays the latency term ``alpha`` of the all-reduce model, so
``C = bytes term + K alpha`` (:meth:`pipesearch.costs.PipelineCosts.allreduce_s`):
tiny buckets cost their latencies. Megatron-LM's bucket
size is 40 M parameters (``DistributedDataParallelConfig.bucket_size``
default; Megatron Core user guide, "Distributed Data Parallel"), PyTorch
DDP's 25 MiB (``bucket_cap_mb``), FSDP's one unit (a transformer block in
torchtitan) per bucket.

The time model (:mod:`pipesearch.timemodel`) charges each stage's exposed
part after its rank's last action. The all-gather's exposed part belongs to
the next iteration's start; charging it at the end of this one gives the same
period. Both are conservative where the overlap is better than modelled: an
interleaved rank's earlier chunks finish their backward before its last one
(their buckets have more than one window to hide in), and ranks other than
the first wait for their first activation anyway, which also hides the
all-gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InputError

#: bucket size of Megatron-LM's distributed data parallel, parameters
MEGATRON_BUCKET_PARAMS = 40_000_000
#: bucket size of PyTorch DDP (``bucket_cap_mb = 25``), bytes of gradient
TORCH_DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class CommOverlap:
    """The communication-overlap settings of a training job.

    Attributes:
        grad_reduce: data-parallel gradient all-reduce / reduce-scatter
            overlapped with the last micro-batch's backward.
        param_gather: with a sharded optimizer (ZeRO-1/2/3, FSDP), the
            parameter all-gather overlapped with the first forward.
        tp_forward: forward tensor-parallel collectives overlapped with the
            block's GEMMs (transformer layer tables).
        bucket_params: parameters per gradient bucket; ``None``: one bucket
            per layer (FSDP units).
    """

    grad_reduce: bool = False
    param_gather: bool = False
    tp_forward: bool = False
    bucket_params: float | None = MEGATRON_BUCKET_PARAMS

    def __post_init__(self) -> None:
        b = self.bucket_params
        if b is not None and not (isinstance(b, (int, float)) and 1 <= b < float("inf")):
            raise InputError(f"gradient bucket size {b!r} parameters: expected a finite number >= 1")

    @property
    def any(self) -> bool:
        return self.grad_reduce or self.param_gather or self.tp_forward

    def as_dict(self) -> dict:
        """The settings as the plan JSON records them."""
        return {"grad_reduce": self.grad_reduce, "param_gather": self.param_gather,
                "tp_forward": self.tp_forward, "bucket_params": self.bucket_params}


NO_OVERLAP = CommOverlap()
"""Everything after compute (pipesearch's default without ``--runtime``)."""


def exposed_s(comm_s, window_s, num_buckets):
    """Seconds of a bucketed collective left after its compute window
    (module docstring): ``max(C / K, C - (1 - 1/K) W)``, element-wise.

    Args:
        comm_s: ``C``, the collective's seconds (0 where there is none).
        window_s: ``W``, the compute it overlaps, seconds.
        num_buckets: ``K`` (values below 1 count as 1).
    """
    c = np.asarray(comm_s, dtype=float)
    k = np.maximum(np.asarray(num_buckets, dtype=float), 1.0)
    return np.maximum(c / k, c - (1.0 - 1.0 / k) * np.asarray(window_s, dtype=float))
