"""RoundPipe's cost terms and split (``--schedule roundpipe``).

RoundPipe (arXiv 2604.27085; the ITcarrot/RoundPipe runtime) keeps every
parameter in host memory and runs ``G`` contiguous layer groups as tasks
dispatched round-robin over a pool of ``n`` GPUs
(:func:`pipesearch.schedules.roundpipe_tasks`); the time of a split is the
longest path of :func:`pipesearch.timemodel.roundpipe_graph`
(:func:`pipesearch.timemodel.roundpipe_time_s`). This module turns a layer
table, a cluster and a job into the per-group times and bytes of that graph
(:class:`RoundPipeCosts`), checks memory, and finds the split
(:func:`roundpipe_split`). The search takes ``G = pp vp`` (``vp`` the
searched degree, as Mobius' stages).

Per group ``g`` holding layers ``[i, j)`` (``P_g`` parameters, 16-bit
weights and gradients, 2 B each, as RoundPipe's ``param_dtype``):

* forward ``F_g`` and backward ``B_g`` per micro-batch (the layer table at
  the micro-batch size, scaled to the device); a backward task runs
  ``F_g + B_g`` (it re-runs the group's forward from its saved input,
  ``run_backward``); the last group's fused task too (its forward is done
  once, inside it);
* one copy of boundary ``k``'s activation (or its gradient) over PCIe:
  ``output_bytes[k] / bw`` with ``bw = min(host_to_device,
  switch_uplink)``, scaled per GPU by the number of the pool's GPUs under
  its switch when the uplink is the limit (``pcie_scale``,
  :func:`pipesearch.host.shared_bandwidth_bytes_per_s`: every GPU of the
  plan under the switch copying at once, the cost model's worst case);
* weights in ``2 P_g / bw`` per task, gradients out ``2 P_g / bw`` after a
  backward task (accumulated on the GPU over the micro-batches);
* the CPU's Adam over all parameters after the iteration (``P /
  cpu_adam_params_per_s``, one optimizer for the node), or beside the next
  iteration with ``--delayed-optimizer-step`` (RoundPipe's default
  ``step(is_async=True)``: one step stale).

A tied input embedding and LM head (``P_t`` parameters,
``ModelProfile.tied_param_bytes``; the layer table counts them once, on the
first layer) is one parameter of the host model, used by the first group
and by the last. RoundPipe's ``upload_layers`` (roundpipe/transfer.py)
copies every parameter of a task's layers to its GPU, so the last group
(when it does not hold the first layer, ``G > 1``) uploads the matrix
with its own weights, holds it and its gradient, and downloads that
gradient (``download_layer``) into a host buffer of its own: a shared
parameter's host gradients are kept per layer (``ParamAttribute.grad_cpu``,
keyed by layer, roundpipe/attribute.py) and summed before the optimizer
step (``param.grad = sum(grads)``, roundpipe/roundpipe.py). So the last
group's weights, gradients and both copies count ``P_g + P_t`` parameters;
the host keeps the matrix's weights, master weights and moments once (on
group 0) and one more 16-bit gradient (2 B per parameter,
:data:`TIED_HOST_BYTES_PER_PARAM`, on the last group); the CPU's Adam
covers it once.

Memory (exact for the graph's buffers): while a GPU computes task ``t`` it
holds ``t``'s weights (and gradients for a backward), the next task's on
that GPU arriving, one micro-batch's saved activations of ``t``'s group
(the backward re-runs the forward; a forward keeps its graph until its
outputs are detached) and two micro-batches' input and output boundaries
(the one computing and the one arriving); the peak over a GPU's task pairs
must fit its usable memory (:meth:`RoundPipeCosts.device_peak_bytes`). The
host holds the 16-bit weights and gradients, the fp32 master weights,
gradients and moments (2 + 2 + 16 B per parameter), and every group's
saved input for every micro-batch until its backward.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from . import host as host_lib
from .errors import InputError
from .costs import start_bytes
from .memory import usable_memory_bytes
from .placement import stage_capacity_bytes, stage_time_scale
from .schedules import roundpipe_tasks
from .split_search import ExactSplit
from .timemodel import StageTimes, busiest_idle_fraction, roundpipe_graph, roundpipe_time_s
from .types import Cluster, DeviceSpec, Job, ModelProfile

#: bytes per parameter of RoundPipe's 16-bit weights and of its gradients
WEIGHT_BYTES_PER_PARAM = 2.0
#: host bytes per parameter: 16-bit weights and gradients, fp32 master weights, gradients and Adam moments
HOST_BYTES_PER_PARAM = 2.0 + 2.0 + 16.0
#: host bytes per parameter of a tied matrix's second use: its own 16-bit gradient buffer (``grad_cpu``)
TIED_HOST_BYTES_PER_PARAM = 2.0
#: splits enumerated one and all (and splits x graph nodes), counts never seconds
ENUMERATE_SPLITS = 5_000
ENUMERATE_WORK = 2**28
#: steps of the boundary-moving descent that finds the branch and bound's first split
DESCENT_STEPS = 40
#: work limits of the branch and bound (counts, never seconds)
MAX_NODES = 4_000
MAX_SPLITS_EVALUATED = 400
_BATCH = 64


@dataclass(frozen=True, eq=False)
class RoundPipeCosts:
    """Cost terms of one RoundPipe point over ``L`` layers (module docstring).

    Attributes:
        num_groups, num_gpus, num_micro_batches: ``G``, ``n``, ``m``.
        fwd_prefix_s, bwd_prefix_s: ``(L+1,)`` prefix sums of a layer's
            forward and backward seconds per micro-batch on the pool's GPUs.
        param_prefix: ``(L+1,)`` prefix sums of parameters.
        saved_prefix_bytes: ``(L+1,)`` prefix sums of one micro-batch's saved
            activation bytes.
        output_bytes: ``(L,)`` one micro-batch's output bytes of each layer.
        s_per_byte: seconds per byte of a copy at ``min(host_to_device,
            switch_uplink)``.
        pcie_scale: ``(n,)`` each GPU's copy time over that rate.
        capacity_bytes: usable memory of the pool's smallest GPU.
        host_capacity_bytes: host memory of the node.
        adam_s_per_param: the CPU's Adam seconds per parameter.
        delayed: the optimizer step runs beside the next iteration.
        tied_params: parameters of a tied input embedding and LM head
            (counted in ``param_prefix`` on the first layer); the last
            group uploads, holds and downloads them too when it does not
            hold the first layer (module docstring).
        saved_start_bytes: ``(L+1,)`` what a group starting at layer ``i``
            saves besides the prefix sums' difference (its first layer's
            :attr:`pipesearch.types.Layer.shared_saved_bytes`), None: 0.
    """

    num_groups: int
    num_gpus: int
    num_micro_batches: int
    fwd_prefix_s: np.ndarray
    bwd_prefix_s: np.ndarray
    param_prefix: np.ndarray
    saved_prefix_bytes: np.ndarray
    output_bytes: np.ndarray
    s_per_byte: float
    pcie_scale: np.ndarray
    capacity_bytes: float
    host_capacity_bytes: float
    adam_s_per_param: float
    delayed: bool
    tied_params: float = 0.0
    saved_start_bytes: np.ndarray | None = None

    @property
    def num_layers(self) -> int:
        return len(self.output_bytes)

    def saved_bytes(self, i, j):
        """One micro-batch's saved activation bytes of the layers ``[i, j)``
        (as :meth:`pipesearch.costs.PipelineCosts.saved_bytes`)."""
        start = 0.0 if self.saved_start_bytes is None else self.saved_start_bytes[i]
        return self.saved_prefix_bytes[j] - self.saved_prefix_bytes[i] + start

    def _ranges(self, bounds):
        b = np.atleast_2d(np.asarray(bounds, dtype=np.int64))
        return b[:, :-1], b[:, 1:]

    def group_tied_params(self, bounds) -> np.ndarray:
        """``(k, G)``: the tied matrix's parameters each group uses besides
        its own (``tied_params`` on the last group when it does not start at
        layer 0, else 0)."""
        b = np.atleast_2d(np.asarray(bounds, dtype=np.int64))
        out = np.zeros((b.shape[0], b.shape[1] - 1))
        out[:, -1] = np.where(b[:, -2] > 0, self.tied_params, 0.0)
        return out

    def boundary_bytes(self, bounds) -> np.ndarray:
        """``(k, G-1)``: one micro-batch's activation bytes over each boundary."""
        b = np.atleast_2d(np.asarray(bounds, dtype=np.int64))
        return self.output_bytes[b[:, 1:-1] - 1]

    def stage_times(self, bounds) -> StageTimes:
        """The :class:`pipesearch.timemodel.StageTimes` of one split
        (``(G+1,)`` boundaries) or of ``k`` (``(k, G+1)``), for
        :func:`pipesearch.timemodel.roundpipe_time_s`."""
        i, j = self._ranges(bounds)
        params = self.param_prefix[j] - self.param_prefix[i]
        copy = WEIGHT_BYTES_PER_PARAM * (params + self.group_tied_params(bounds)) * self.s_per_byte
        host = params * self.adam_s_per_param
        one = np.ndim(bounds) == 1
        arr = (lambda x: x[0]) if one else (lambda x: x)
        return StageTimes(
            fwd_s=arr(self.fwd_prefix_s[j] - self.fwd_prefix_s[i]),
            bwd_s=arr(self.bwd_prefix_s[j] - self.bwd_prefix_s[i]),
            bwd_input_s=arr(np.zeros(i.shape)),
            p2p_s=arr(self.boundary_bytes(bounds) * self.s_per_byte),
            allreduce_s=arr(np.zeros(i.shape) if self.delayed else host),
            swap_in_s=arr(copy), swap_out_s=arr(copy),
            delayed_host_s=arr(host) if self.delayed else None,
            pcie_scale=self.pcie_scale,
        )

    def group_bytes(self, bounds) -> tuple[np.ndarray, np.ndarray]:
        """``(weights, transient)``, each ``(k, G)``: a group's 16-bit weight
        bytes (the last group's with the tied matrix,
        :meth:`group_tied_params`), and the bytes its computing task holds
        besides weights and gradients (one micro-batch's saved activations,
        two micro-batches' input and output boundaries)."""
        i, j = self._ranges(bounds)
        params = self.param_prefix[j] - self.param_prefix[i] + self.group_tied_params(bounds)
        weights = WEIGHT_BYTES_PER_PARAM * params
        bnd = self.boundary_bytes(bounds)
        k = bnd.shape[0]
        zero = np.zeros((k, 1))
        edges = np.concatenate([zero, bnd], axis=1) + np.concatenate([bnd, zero], axis=1)
        return weights, self.saved_bytes(i, j) + 2.0 * edges

    def device_peak_bytes(self, bounds) -> np.ndarray:
        """``(k, n)``: each GPU's peak bytes (:func:`device_peak_bytes` of
        :meth:`group_bytes`)."""
        weights, transient = self.group_bytes(bounds)
        return device_peak_bytes(weights, transient, self.num_gpus)

    def host_bytes(self, bounds) -> np.ndarray:
        """``(k, G)``: each group's host bytes (:func:`group_host_bytes`)."""
        i, j = self._ranges(bounds)
        return group_host_bytes(self.param_prefix[j] - self.param_prefix[i], self.boundary_bytes(bounds),
                                self.num_micro_batches, self.group_tied_params(bounds))

    def pcie_bytes(self, bounds) -> np.ndarray:
        """``(k, G)``: bytes each group moves over PCIe per iteration: its
        weights in for its forward and its backward task (once for the
        last, fused, group, with the tied matrix, :meth:`group_tied_params`),
        its gradients out, and per micro-batch its
        forward's input and output, its backward's saved input, output
        gradient in and input gradient out (the last group: its input in and
        its input gradient out)."""
        weights = self.group_bytes(bounds)[0]
        bnd = self.boundary_bytes(bounds)
        zero = np.zeros((bnd.shape[0], 1))
        inp, out = np.concatenate([zero, bnd], axis=1), np.concatenate([bnd, zero], axis=1)
        uploads = np.full(weights.shape, 2.0)
        uploads[:, -1] = 1.0  # the last group's fused task: its input in, its input gradient out
        act = np.where(uploads == 2.0, 3.0 * inp + 2.0 * out, 2.0 * inp)
        return (uploads + 1.0) * weights + self.num_micro_batches * act

    def least_host_bytes(self) -> float:
        """The least host bytes of any split: every parameter's state,
        the tied matrix's second gradient when ``G > 1`` and ``m``
        micro-batches of the ``G - 1`` smallest layer outputs (some
        ``G - 1`` boundaries are cut)."""
        cuts = np.sort(self.output_bytes[:-1])[:self.num_groups - 1]
        tied = TIED_HOST_BYTES_PER_PARAM * self.tied_params if self.num_groups > 1 else 0.0
        return float(HOST_BYTES_PER_PARAM * self.param_prefix[-1] + tied + self.num_micro_batches * cuts.sum())

    def group_alone_fits(self, i, j) -> np.ndarray:
        """Whether a group over layers ``[i, j)`` (arrays) fits its backward
        task alone: weights, gradients, one micro-batch's saved bytes and
        two micro-batches' boundaries (a necessary part of every GPU peak,
        :meth:`device_peak_bytes`); a last group not starting at layer 0
        with the tied matrix."""
        i, j = np.asarray(i), np.asarray(j)
        tied = np.where((j == self.num_layers) & (i > 0), self.tied_params, 0.0)
        weights = WEIGHT_BYTES_PER_PARAM * (self.param_prefix[j] - self.param_prefix[i] + tied)
        edge = (np.where(i > 0, self.output_bytes[np.maximum(i - 1, 0)], 0.0)
                + np.where(j < self.num_layers, self.output_bytes[np.minimum(j, self.num_layers) - 1], 0.0))
        return 2 * weights + self.saved_bytes(i, j) + 2 * edge <= self.capacity_bytes

    def fits(self, bounds) -> np.ndarray:
        """``(k,)`` bools: every GPU's peak within its usable memory and the
        host's bytes within its memory."""
        gpu = np.all(self.device_peak_bytes(bounds) <= self.capacity_bytes, axis=1)
        return gpu & (self.host_bytes(bounds).sum(axis=1) <= self.host_capacity_bytes)

    def time_s(self, bounds):
        """:func:`pipesearch.timemodel.roundpipe_time_s` of the splits."""
        return roundpipe_time_s(self.stage_times(bounds), self.num_gpus, self.num_micro_batches)


def device_peak_bytes(weights, transient, num_gpus: int) -> np.ndarray:
    """Each GPU's peak bytes under RoundPipe's dispatch (module docstring;
    :func:`pipesearch.schedules.roundpipe_tasks`): over its tasks in order,
    the one computing (its group's 16-bit weights, gradients too for a
    backward or the fused last task, and its ``transient`` bytes) plus the
    next task's on that GPU weights (and gradients) arriving.

    Args:
        weights, transient: ``(k, G)`` bytes of each group's weights and
            of what its computing task holds besides weights and gradients
            (:meth:`RoundPipeCosts.group_bytes`), for ``k`` splits.
        num_gpus: the pool's GPUs ``n``.

    Returns ``(k, n)`` bytes."""
    weights, transient = np.atleast_2d(np.asarray(weights, dtype=float)), np.atleast_2d(np.asarray(transient, float))
    tasks = roundpipe_tasks(weights.shape[1], num_gpus)
    peak = np.zeros((weights.shape[0], num_gpus))
    for d in range(num_gpus):
        mine = [(kind, g) for kind, g, dd in tasks if dd == d]
        for a, (kind, g) in enumerate(mine):
            held = weights[:, g] * (1 if kind == "F" else 2) + transient[:, g]
            if a + 1 < len(mine):
                kn, gn = mine[a + 1]
                held = held + weights[:, gn] * (1 if kn == "F" else 2)
            peak[:, d] = np.maximum(peak[:, d], held)
    return peak


def group_host_bytes(params, boundary_bytes, num_micro_batches: int, tied_params=0.0) -> np.ndarray:
    """Each group's host bytes (module docstring): its parameters' state
    (:data:`HOST_BYTES_PER_PARAM` per parameter), the host gradient buffer
    of a tied matrix it uses a second time (:data:`TIED_HOST_BYTES_PER_PARAM`
    per parameter) and its saved input, one micro-batch's bytes over the
    boundary before it, for all ``m`` micro-batches (none for group 0).

    Args:
        params: ``(k, G)`` parameters of each group (a tied matrix counted
            once, in the group holding the first layer).
        boundary_bytes: ``(k, G - 1)`` one micro-batch's bytes over each
            boundary (:meth:`RoundPipeCosts.boundary_bytes`).
        num_micro_batches: ``m``.
        tied_params: ``(k, G)`` (or a scalar) parameters of the tied matrix
            each group uses besides its own
            (:meth:`RoundPipeCosts.group_tied_params`); 0 when untied.

    Returns ``(k, G)`` bytes; their sum is checked against the node's host
    memory (:meth:`RoundPipeCosts.fits`)."""
    params = np.atleast_2d(np.asarray(params, dtype=float))
    bnd = np.asarray(boundary_bytes, dtype=float).reshape(params.shape[0], -1)
    inputs = np.concatenate([np.zeros((bnd.shape[0], 1)), bnd], axis=1)
    return HOST_BYTES_PER_PARAM * params + TIED_HOST_BYTES_PER_PARAM * np.asarray(tied_params, dtype=float) \
        + num_micro_batches * inputs


def build_roundpipe_costs(profile: ModelProfile, cluster: Cluster, job: Job, *, gpus: np.ndarray, groups: int,
                          micro_batch_size: int, num_micro_batches: int,
                          profiled_device: DeviceSpec | None = None, precision: str = "fp16") -> RoundPipeCosts:
    """:class:`RoundPipeCosts` of ``profile`` on the pool ``gpus`` (global
    device ids, one per GPU) with ``groups`` layer groups.

    Raises:
        InputError: the cluster has no ``[host]`` table.
    """
    if cluster.host is None:
        raise InputError(f"schedule roundpipe: cluster {cluster.name!r} has no [host] table (host memory and PCIe "
                         "switches); add one (docs/offload.md) or choose another schedule")
    heads = np.asarray(gpus, dtype=np.int64).reshape(-1, 1)
    a = profile.layer_arrays
    ratio = micro_batch_size / profile.profiled_batch_size
    times = profile.layer_times_at(micro_batch_size)
    scale = float(stage_time_scale(cluster, heads, profiled_device, precision).max())
    zero = np.zeros(1)
    h = cluster.host
    link = min(h.host_to_device_bytes_per_s, h.switch_uplink_bytes_per_s)
    shared = host_lib.shared_bandwidth_bytes_per_s(h, host_lib.stage_switch_sharing(cluster, heads))
    return RoundPipeCosts(
        num_groups=groups, num_gpus=len(heads), num_micro_batches=num_micro_batches,
        fwd_prefix_s=np.concatenate([zero, np.cumsum(times["fwd_s"])]) * scale,
        bwd_prefix_s=np.concatenate([zero, np.cumsum(times["bwd_s"])]) * scale,
        param_prefix=np.concatenate([zero, np.cumsum(a["param_bytes"])]) / profile.bytes_per_param,
        saved_prefix_bytes=np.concatenate([zero, np.cumsum(a["saved_bytes"])]) * ratio,
        saved_start_bytes=start_bytes(a, ratio),
        output_bytes=a["output_bytes"] * ratio,
        s_per_byte=1.0 / link, pcie_scale=np.asarray(link / shared, dtype=float),
        capacity_bytes=float(usable_memory_bytes(job, stage_capacity_bytes(cluster, heads)).min()),
        host_capacity_bytes=float(h.memory_bytes),
        adam_s_per_param=1.0 / h.cpu_adam_params_per_s,
        delayed=bool(job.delayed_optimizer_step),
        tied_params=float(profile.tied_param_bytes) / profile.bytes_per_param,
    )


def bound_coefficients(costs: RoundPipeCosts) -> tuple[np.ndarray, np.ndarray]:
    """``(alpha, beta)``, each ``(n + 1, G)``: families of lower bounds on
    the GPU makespan of every split, ``sum_g alpha[f, g] F_g + beta[f, g]
    B_g`` (``F_g``, ``B_g`` the group's forward and backward per
    micro-batch), each the length of a path of
    :func:`pipesearch.timemodel.roundpipe_graph` with copies taken as 0:

    * ``f = d < n``, GPU ``d``: micro-batch 0 through every task before the
      GPU's first, the GPU's whole compute chain (``m`` micro-batches of each
      of its tasks), micro-batch ``m - 1`` through every task after its last
      (a task's micro-batch waits for the previous task's same one);
    * ``f = n``: the average GPU, ``m / n`` of all tasks' work.

    A forward task costs ``F_g`` per micro-batch, a fused or backward task
    ``F_g + B_g`` (:func:`pipesearch.schedules.roundpipe_tasks`)."""
    G, n, m = costs.num_groups, costs.num_gpus, costs.num_micro_batches
    tasks = roundpipe_tasks(G, n)
    alpha, beta = np.zeros((n + 1, G)), np.zeros((n + 1, G))
    for d in range(n + 1):
        mine = [t for t, (_, _, dd) in enumerate(tasks) if dd == d]
        for t, (kind, g, dd) in enumerate(tasks):
            if d == n:
                c = m / n
            elif dd == d:
                c = float(m)
            else:
                c = 1.0 if not mine or t < mine[0] or t > mine[-1] else 0.0
            alpha[d, g] += c
            beta[d, g] += c if kind != "F" else 0.0
    return alpha, beta


def _suffix_tables(costs: RoundPipeCosts, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``(n + 1, G + 1, L + 1)``: ``best[f, g, i]``, the least family-``f``
    cost of splitting layers ``[i, L)`` into groups ``g .. G-1`` (inf where
    impossible), by a backward min-sum DP over ranges."""
    G, L = costs.num_groups, costs.num_layers
    F, B = costs.fwd_prefix_s, costs.bwd_prefix_s
    rng_f = F[None, :] - F[:, None]  # [i, j]
    rng_b = B[None, :] - B[:, None]
    valid = np.triu(np.ones((L + 1, L + 1), dtype=bool), 1)
    best = np.full((len(alpha), G + 1, L + 1), np.inf)
    best[:, G, L] = 0.0
    for g in range(G - 1, -1, -1):
        cost = alpha[:, g, None, None] * rng_f[None] + beta[:, g, None, None] * rng_b[None]
        cost = np.where(valid[None], cost + best[:, g + 1, None, :], np.inf)
        best[:, g, :] = cost.min(axis=2)
    return best


def _with_host(costs: RoundPipeCosts, gpu_s):
    """``T`` from a GPU makespan (or a bound on it): the CPU's Adam over
    all parameters after it, or beside it with the delayed step."""
    host = costs.param_prefix[-1] * costs.adam_s_per_param
    return np.maximum(gpu_s, host) if costs.delayed else gpu_s + host


def lower_bound_s(costs: RoundPipeCosts) -> float:
    """A lower bound on the time of every split, fitting or not: the
    largest of :func:`bound_coefficients`' families at its least over all
    splits (:func:`_suffix_tables`), then the host's step
    (:func:`_with_host`)."""
    alpha, beta = bound_coefficients(costs)
    return float(_with_host(costs, _suffix_tables(costs, alpha, beta)[:, 0, 0].max()))


def roundpipe_split(costs: RoundPipeCosts, cutoff_s: float = math.inf) -> ExactSplit | None:
    """The split of the ``L`` layers into ``G`` groups minimizing
    :meth:`RoundPipeCosts.time_s` among those that fit, or None when none
    does (or, with a finite ``cutoff_s``, when :func:`lower_bound_s` proves
    no split beats it: an exact ``ExactSplit`` is then not returned either;
    None).

    The bound families of :mod:`pipesearch.split_search` describe schedules
    whose stages stay on their rank; here a group's tasks move between GPUs,
    so none is used. When the splits are few (``C(L-1, G-1)`` within
    :data:`ENUMERATE_SPLITS` and their evaluation within
    :data:`ENUMERATE_WORK` node updates) every one is simulated: exact.
    Otherwise a branch and bound over the groups, left to right
    (:func:`_branch_and_bound`), from the split a descent finds
    (:func:`_descent`); where it stops at its work limits the result
    reports its proven lower bound and gap (``exact`` False).
    """
    L, G, m, n = costs.num_layers, costs.num_groups, costs.num_micro_batches, costs.num_gpus
    if G > L or costs.least_host_bytes() > costs.host_capacity_bytes:
        return None
    bound = lower_bound_s(costs)
    if bound >= cutoff_s:
        return None
    count = math.comb(L - 1, G - 1)
    nodes = len(roundpipe_graph(n, m, G)[0].col)
    if count <= ENUMERATE_SPLITS and count * nodes <= ENUMERATE_WORK:
        cuts = np.array(list(itertools.combinations(range(1, L), G - 1)), dtype=np.int64).reshape(count, G - 1)
        splits = np.concatenate([np.zeros((count, 1), np.int64), cuts, np.full((count, 1), L)], axis=1)
        splits = splits[costs.fits(splits)]
        if not len(splits):
            return None
        times = _times(costs, splits)
        best = int(np.lexsort((np.arange(len(times)), times))[0])
        t = float(times[best])
        return ExactSplit(tuple(int(x) for x in splits[best]), t, t, t, True, len(splits), 0)
    return _branch_and_bound(costs, cutoff_s)


def _branch_and_bound(costs: RoundPipeCosts, cutoff_s: float) -> ExactSplit | None:
    """Best-first branch and bound: a node fixes groups ``0 .. g-1`` (layers
    ``[0, i)``); its bound is the largest family of
    :func:`bound_coefficients` with the fixed groups' exact terms and the
    least completion of the rest (:func:`_suffix_tables`), then the host's
    step. A group that does not fit its backward task alone
    (:meth:`RoundPipeCosts.group_alone_fits`) is not branched on. Complete
    splits are simulated in batches; a node whose bound is
    not below the best time found (or ``cutoff_s``) is discarded, so when
    the queue empties the best is optimal. Stops at :data:`MAX_NODES`
    nodes or :data:`MAX_SPLITS_EVALUATED` splits: the least open bound is
    then the proven lower bound. None when no split beats ``cutoff_s`` or
    none fits."""
    import heapq

    L, G = costs.num_layers, costs.num_groups
    alpha, beta = bound_coefficients(costs)
    tab = _suffix_tables(costs, alpha, beta)
    F, B = costs.fwd_prefix_s, costs.bwd_prefix_s
    start = _descent(costs, -math.inf)
    times: dict[tuple[int, ...], float] = {}
    if start is not None:
        times[start.bounds] = start.iteration_time_s
    evaluated = 0 if start is None else start.splits_evaluated

    def target() -> float:
        return min(min(times.values(), default=math.inf), cutoff_s) * (1 - 1e-12)

    heap = [(float(_with_host(costs, tab[:, 0, 0].max())), (0,), np.zeros(len(alpha)))]
    pending: list[tuple[int, ...]] = []
    nodes, exact = 0, True

    def flush() -> None:
        nonlocal evaluated
        todo = np.array(pending, dtype=np.int64)
        pending.clear()
        ok = costs.fits(todo)
        if ok.any():
            for row, t in zip(todo[ok], _times(costs, todo[ok])):
                times[tuple(int(x) for x in row)] = float(t)
        evaluated += len(todo)

    while True:
        top = heap[0][0] if heap else math.inf
        if pending and (len(pending) >= _BATCH or top >= target()):
            flush()
            continue
        if top >= target():
            break
        if nodes >= MAX_NODES or evaluated >= MAX_SPLITS_EVALUATED:
            if pending:
                flush()
            exact = False
            break
        bound, cut, pref = heapq.heappop(heap)
        nodes += 1
        g, i = len(cut) - 1, cut[-1]
        if g == G:
            pending.append(cut)
            continue
        js = np.arange(i + 1, L - (G - g - 1) + 1)
        for j in js[costs.group_alone_fits(np.full(len(js), i), js)].tolist():
            p = pref + alpha[:, g] * (F[j] - F[i]) + beta[:, g] * (B[j] - B[i])
            b = float(_with_host(costs, (p + tab[:, g + 1, j]).max()))
            if b < target():
                heapq.heappush(heap, (b, cut + (j,), p))
    if not times:
        return None
    best = min(times, key=lambda b: (times[b], b))
    t = times[best]
    if t >= cutoff_s and exact:
        return None
    lower = t if exact else min(t, heap[0][0] if heap else math.inf)
    return ExactSplit(best, t, t, float(lower), exact, evaluated, nodes)


def _times(costs: RoundPipeCosts, splits: np.ndarray) -> np.ndarray:
    """Times of many splits, in batches of about 4 million node values."""
    nodes = len(roundpipe_graph(costs.num_gpus, costs.num_micro_batches, costs.num_groups)[0].col)
    batch = max(1, 4_000_000 // max(nodes, 1))
    return np.concatenate([np.atleast_1d(costs.time_s(splits[lo:lo + batch])) for lo in range(0, len(splits), batch)])


def _starts(costs: RoundPipeCosts) -> list[tuple[int, ...]]:
    """The even split, the split balancing ``F + B`` per group and the one
    balancing its weights, gradients and activations (each boundary at the
    prefix nearest ``g / G`` of the total)."""
    L, G = costs.num_layers, costs.num_groups
    out = [tuple(int(round(g * L / G)) for g in range(G + 1))]
    for prefix in (costs.fwd_prefix_s + costs.bwd_prefix_s,
                   4 * WEIGHT_BYTES_PER_PARAM * costs.param_prefix + costs.saved_prefix_bytes):
        cut = [0]
        for g in range(1, G):
            x = int(np.argmin(np.abs(prefix - prefix[-1] * g / G)))
            cut.append(min(max(x, cut[-1] + 1), L - (G - g)))
        out.append(tuple(cut) + (L,))
    return out


def _descent(costs: RoundPipeCosts, bound: float) -> ExactSplit | None:
    """:func:`roundpipe_split` past enumeration: from the starts
    (:func:`_starts`), while none fits, the neighbour (one boundary moved by
    one layer) of least peak GPU memory; then, while it is faster, the
    fastest fitting neighbour (at most :data:`DESCENT_STEPS` steps each).
    None when no split it visits fits (not a proof that none does)."""
    seen: dict[tuple[int, ...], float] = {}
    peak: dict[tuple[int, ...], float] = {}

    def run(cands) -> None:
        todo = np.array([c for c in dict.fromkeys(cands) if c not in seen and all(
            a < b for a, b in zip(c[:-1], c[1:]))], dtype=np.int64)
        if not len(todo):
            return
        ok = costs.fits(todo)
        times = np.full(len(todo), np.inf)
        if ok.any():
            times[ok] = _times(costs, todo[ok])
        peaks = costs.device_peak_bytes(todo).max(axis=1)
        for row, t, p in zip(todo, times, peaks):
            seen[tuple(int(x) for x in row)], peak[tuple(int(x) for x in row)] = float(t), float(p)

    def neighbours(cur):
        return [cur[:k] + (cur[k] + d,) + cur[k + 1:] for k in range(1, len(cur) - 1) for d in (-1, 1)]

    run(_starts(costs))
    for _ in range(DESCENT_STEPS):  # toward memory that fits
        if any(math.isfinite(t) for t in seen.values()):
            break
        cur = min(seen, key=lambda b: (peak[b], b))
        run(neighbours(cur))
        if min(peak[b] for b in seen) >= peak[cur]:
            break
    for _ in range(DESCENT_STEPS):  # toward time
        cur = min(seen, key=lambda b: (seen[b], b))
        if not math.isfinite(seen[cur]) or seen[cur] <= bound:
            break
        run(neighbours(cur))
        if min(seen.values()) >= seen[cur]:
            break
    fitting = {b: t for b, t in seen.items() if math.isfinite(t)}
    if not fitting:
        return None
    best = min(fitting, key=lambda b: (fitting[b], b))
    t = fitting[best]
    exact = t <= bound * (1 + 1e-12)
    return ExactSplit(best, t, t, t if exact else bound, exact, len(fitting), 0)


def plan_extra(costs: RoundPipeCosts, bounds) -> dict:
    """The plan's ``roundpipe`` option: what :func:`pipesearch.timemodel.stage_times_of`
    replays and what the GPUs and the host hold: ``tasks`` (``[kind,
    group, gpu]`` in dispatch order), ``act_copy_s`` (per boundary),
    ``weights_in_s`` and ``grads_out_s`` (per group), ``pcie_scale`` and
    ``device_peak_bytes`` (per GPU), ``host_memory_bytes``."""
    b = np.asarray(bounds, dtype=np.int64)
    times = costs.stage_times(b)
    return {"tasks": [[k, int(g), int(d)] for k, g, d in roundpipe_tasks(costs.num_groups, costs.num_gpus)],
            "act_copy_s": [float(x) for x in np.atleast_1d(times.p2p_s)],
            "weights_in_s": [float(x) for x in times.swap_in_s],
            "grads_out_s": [float(x) for x in times.swap_out_s],
            "pcie_scale": [float(x) for x in costs.pcie_scale],
            "device_peak_bytes": [float(x) for x in costs.device_peak_bytes(b)[0]],
            "host_memory_bytes": float(costs.host_bytes(b)[0].sum())}


def plan_point(variant, cluster: Cluster, job: Job, row: dict, gpus: np.ndarray, profiled_device,
               cutoff_s: float = math.inf, exhaustive: bool = False, split=None, notes: dict | None = None):
    """The :class:`pipesearch.types.Plan` of one RoundPipe search point (a
    pool of ``pp = len(gpus)`` GPUs, ``G = pp vp`` groups), or None with
    ``row["status"]`` set: ``schedule_refused`` for ``dp`` or ``tp`` above 1
    (RoundPipe's pool runs one model copy, no tensor parallelism), a layer
    table with recompute or offload options (RoundPipe re-runs each group's
    forward in its backward: the plain table), GPUs of different types or
    of more than one node (the pool shares one host's memory, optimizer and
    PCIe switches);
    ``out_of_memory``; ``pruned`` (its bound reaches ``cutoff_s``).
    ``split`` pins the layers per group; ``notes["host_overflow"]`` gets
    :func:`host_overflow_note` when host memory refuses the point."""
    from .placement import group_ids, node_ids
    from .point_plan import throughput_terms
    from .types import Plan, Prediction, StagePlan

    pp, vp, m, mbs = row["pp"], row["vp"], row["num_micro_batches"], row["micro_batch_size"]
    devices = np.asarray(gpus, dtype=np.int64)
    kinds = {cluster.groups[int(k)].device.name for k in group_ids(cluster)[devices]}
    nodes = np.unique(node_ids(cluster)[devices])  # one host: its memory, optimizer and PCIe switches
    if row["dp"] > 1 or variant.tp > 1 or variant.offload or variant.stream or variant.recompute not in (
            "none", None) or len(kinds) > 1 or len(nodes) > 1:
        row["status"] = "schedule_refused"
        return None
    costs = build_roundpipe_costs(variant.profile, cluster, job, gpus=devices, groups=pp * vp, micro_batch_size=mbs,
                                  num_micro_batches=m, profiled_device=profiled_device,
                                  precision=_precision(variant.profile))
    if split is not None:
        bounds = tuple(int(x) for x in np.concatenate([[0], np.cumsum(split)]))
        if len(split) != pp * vp or not costs.fits(np.array(bounds))[0]:
            row["status"] = "out_of_memory" if len(split) == pp * vp else "split_mismatch"
            return None
        t = float(costs.time_s(np.array(bounds)))
        found = ExactSplit(bounds, t, t, t, True, 1, 0)
    else:
        found = roundpipe_split(costs, math.inf if exhaustive else cutoff_s)
        if found is None:
            row["status"] = "pruned" if lower_bound_s(costs) >= cutoff_s and not exhaustive else "out_of_memory"
            if notes is not None and not notes.get("host_overflow") and costs.least_host_bytes() > \
                    costs.host_capacity_bytes:
                notes["host_overflow"] = host_overflow_note(costs)
            return None
    b = np.asarray(found.bounds, dtype=np.int64)
    t = found.iteration_time_s
    times = costs.stage_times(b)
    weights, transient = (x[0] for x in costs.group_bytes(b))
    tied = WEIGHT_BYTES_PER_PARAM * costs.group_tied_params(b)[0]  # in ``weights``; recorded as ``tied_copy``
    host = times.delayed_host_s if times.delayed_host_s is not None else times.allreduce_s
    names = [lay.name for lay in variant.profile.layers]
    peaks = costs.device_peak_bytes(b)[0]
    stages = tuple(StagePlan(
        index=g, layers=(int(b[g]), int(b[g + 1])), layer_names=tuple(names[b[g]:b[g + 1]]),
        devices=(int(devices[g % pp]),), device_type=next(iter(kinds)),
        compute_s=float(times.fwd_s[g] + times.bwd_s[g]), fwd_s=float(times.fwd_s[g]),
        comm_s=float(times.p2p_s[g]) if g + 1 < len(b) - 1 else 0.0,
        allreduce_s=float(times.allreduce_s[g]), host_step_s=float(host[g]),
        memory_bytes=float(2 * weights[g] + transient[g]),
        memory_breakdown=(("weights", float(weights[g] - tied[g])), ("gradients", float(weights[g] - tied[g])),
                          ("activations", float(transient[g])))
        + ((("tied_copy", float(2 * tied[g])),) if tied[g] > 0 else ()),
        send_bytes=float(costs.boundary_bytes(b)[0][g]) if g + 1 < len(b) - 1 else 0.0,
        saved_bytes=float(costs.saved_bytes(b[g], b[g + 1])),
        memory_option="roundpipe") for g in range(len(b) - 1))
    busy = np.zeros(pp)
    for kind, g, d in roundpipe_tasks(pp * vp, pp):
        busy[d] += m * (times.fwd_s[g] + (times.bwd_s[g] if kind != "F" else 0.0))
    predicted = Prediction(iteration_time_s=t, samples_per_s=job.global_batch_size / t if t > 0 else math.inf,
                           bubble_fraction=busiest_idle_fraction(float(busy.max()), t),
                           peak_memory_bytes=float(peaks.max()),
                           memory_capacity_bytes=float(stage_capacity_bytes(cluster, devices.reshape(-1, 1)).min()),
                           **throughput_terms(variant.profile, stages, job.global_batch_size, cluster, 1))
    moved = costs.pcie_bytes(b)[0]
    held = costs.host_bytes(b)[0]
    info = {"exact": found.exact, "lower_bound_s": found.lower_bound_s, "gap": found.gap,
            "splits_evaluated": found.splits_evaluated}
    if split is not None:
        info["pinned"] = True
    extra = (("placement", row["placement"]), ("recompute", "none"), ("split_search", info), ("simulated", True),
             ("analytic_iteration_time_s", t),
             ("host", {"host_memory_bytes": [float(x) for x in held], "pcie_bytes_per_iteration": [
                 float(x) for x in moved], "total_host_memory_bytes": float(held.sum()),
                 "total_pcie_bytes_per_iteration": float(moved.sum())}))
    if costs.delayed:
        extra += (("optimizer_step", "delayed"), ("optimizer_staleness_steps", 1))
    extra += (("roundpipe", plan_extra(costs, b)),)
    return Plan(rank=0, pp=pp, dp=1, tp=1, vp=vp, schedule="roundpipe", micro_batch_size=mbs, num_micro_batches=m,
                stages=stages, predicted=predicted, extra=extra)


def _precision(profile: ModelProfile) -> str:
    from .costs import profile_precision
    return profile_precision(profile)


def host_overflow_note(costs: RoundPipeCosts) -> str:
    """One line: the least host bytes of any split of the point
    (:meth:`RoundPipeCosts.least_host_bytes`) against the node's host memory."""
    from .units import format_bytes

    state = HOST_BYTES_PER_PARAM * costs.param_prefix[-1] + (
        TIED_HOST_BYTES_PER_PARAM * costs.tied_params if costs.num_groups > 1 else 0.0)
    return (f"host memory: schedule roundpipe keeps {format_bytes(costs.least_host_bytes())} in host memory (parameters' "
            f"state {format_bytes(state)}, the group inputs of {costs.num_micro_batches} micro-batches the rest) "
            f"against the node's {format_bytes(costs.host_capacity_bytes)}; use fewer micro-batches or groups, or a "
            "host with more memory ([host] memory_GB)")

