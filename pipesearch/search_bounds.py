"""Lower bounds of a point's simulated time before any split, and the memory pre-filter."""

from __future__ import annotations

import bisect

import numpy as np

from .costs import device_time_scale
from .memory import offload_bytes_per_param, param_state_of
from .types import Job, ModelProfile


def point_lower_bound_s(work_s: float, pp: int, mbs: int, m: int, schedule: str, fastest: float,
                        busiest_s: float = 0.0, forward_share: float = 0.0, average: float | None = None) -> float:
    """A valid lower bound on the simulated iteration time
    (:func:`pipesearch.timemodel.iteration_time_s`) of any split, from the
    total work ``W`` of one micro-batch on the fastest device and ``A``, a
    lower bound on the compute of the busiest device per micro-batch: ``A =
    max(W' / pp, mbs x fastest x busiest_s)`` with ``W'`` the same work at
    ``average``, the time scale of the point's devices taken together
    (:func:`capacity_time_scale`; ``fastest`` when not given: some device
    has at least the average; ``busiest_s`` from
    :func:`busiest_device_per_sample_s`, 0 when unknown). Links and
    all-reduce cost >= 0.

    * every schedule: ``m A`` (the busiest rank does its ``m`` micro-batches
      one after another);
    * GPipe: ``W + (m-1) A`` (its closed form is ``sum (F+B) + (m-1)(max F
      + max B)``);
    * 1F1B: ``W + (2m-1-pp)/2 A`` (the 1F1B bound family of
      :func:`pipesearch.split_bounds.bound_families` at the busiest stage,
      with ``(m-1) max(f, b) + (m-pp) min(f, b) >= (2m-1-pp)/2 (f + b)``);
    * GPipe, 1F1B and ZB-H1: ``W x`` :func:`fill_drain_factor` (rank ``k``
      starts after the forwards of stages ``< k``, runs its ``m``
      micro-batches, and under GPipe and 1F1B its last backward is followed
      by the backwards of stages ``< k``; ``forward_share`` is the least
      share of a layer's time that is forward, used for ZB-H1 whose last
      action may be a weight gradient).
    """
    work = work_s * mbs * fastest
    spread = work if average is None else work_s * mbs * average
    busiest = max(spread / pp, busiest_s * mbs * fastest)
    bound = busiest * m
    if schedule == "gpipe":
        bound = max(bound, work + (m - 1) * busiest, work * fill_drain_factor(pp, m, 1.0))
    elif schedule == "1f1b":
        bound = max(bound, work + max(0.0, (2 * m - 1 - pp) / 2) * busiest, work * fill_drain_factor(pp, m, 1.0))
    elif schedule == "zb-h1":
        bound = max(bound, work * fill_drain_factor(pp, m, forward_share))
    return bound


def capacity_time_scale(cluster, profiled_device, precision: str, slots: int, tp: int) -> float | None:
    """The time scale ``a`` with ``m W a / pp`` a lower bound of the busiest
    rank's compute when a point runs on ``slots`` tensor-parallel slots of
    ``tp`` devices (``pp x dp`` of them) of a mixed cluster: rank ``d``
    does its share ``W_d`` of each micro-batch's work in ``m W_d a_d``
    (``a_d`` its device's :func:`pipesearch.costs.device_time_scale`), so
    the busiest takes at least ``m W / sum_d (1 / a_d)`` of one pipeline's
    ``pp`` ranks; the ``dp`` pipelines hold distinct slots, so the slowest
    of them has at most ``1 / dp`` of the ``slots`` fastest slots' ``sum 1 /
    a``: ``a = pp dp / sum``. At least the fastest type's scale; None on a
    cluster of one device type (the fastest's scale then), or when the
    cluster has fewer slots."""
    if cluster.is_homogeneous:
        return None
    speeds = np.concatenate([np.full(g.nodes * (g.devices_per_node // tp),
                                     1.0 / device_time_scale(profiled_device, g.device, precision))
                             for g in cluster.groups])
    if slots > len(speeds) or slots < 1:
        return None
    return float(slots / np.sort(speeds)[::-1][:slots].sum())


def fill_drain_factor(pp: int, m: int, share: float) -> float:
    """``c`` with ``T >= c W`` for one stage per rank, ``W = sum_k a_k`` the
    compute of one micro-batch over the ``pp`` stages (``a_k = F_k + B_k``).

    Rank ``k`` cannot start before some micro-batch's forward has passed
    the stages before it, then runs ``m a_k``; under GPipe and 1F1B its last
    action is a backward whose gradient must then pass back through those
    stages: ``T >= sum_{j<k} a_j + m a_k`` (``share = 1``). With only the
    forward part known to precede (ZB-H1, and ``share = min F / (F + B)``
    over layers): ``T >= share sum_{j<k} a_j + m a_k``. Averaging these
    ``pp`` inequalities with weights ``w_k >= 0`` that sum to 1 and give
    every stage the same coefficient ``m w_k + share sum_{k'>k} w_k' = c``
    (a split-free bound: every layer weighs ``c``) gives ``c = share / (1 -
    (1 - share / m)^pp)``; ``m / pp`` (the average) when ``share = 0``.
    """
    if share <= 0 or m <= 0:
        return m / pp
    return share / (1.0 - (1.0 - share / m) ** pp) * (1 - 1e-12)  # lowered against rounding


BUSIEST_REL_TOL = 1e-6
"""Relative width at which :func:`busiest_stage_per_sample_s` stops bisecting."""


BUSIEST_DP_LAYERS = 128
"""Profiles of at most this many layers get the min-max partition value of
every stage count from one DP (:func:`_min_max_partitions`), larger ones by
bisection per stage count."""


def busiest_stage_per_sample_s(profile: ModelProfile, stages: int, cache: dict | None = None) -> float:
    """A lower bound on the largest stage, in per-sample compute seconds
    (the part of ``fwd_s + bwd_s`` that grows with the batch, as in
    :attr:`pipesearch.types.ModelProfile.compute_per_sample_s`), of every
    split of the layers into ``stages`` contiguous stages: the min-max
    partition value ``B*``, lowered by ``1e-9`` relative against rounding.
    Profiles of at most :data:`BUSIEST_DP_LAYERS` layers: ``B*`` of every
    stage count at once by the partition DP (:func:`_min_max_partitions`,
    ``O(L^2)`` per stage count); larger ones: ``B*`` bracketed by bisection
    on the greedy test "cut each stage as late as it stays within ``c``"
    (which uses the fewest stages for a cap ``c``, so it decides ``B* <=
    c`` exactly), the lower end of the bracket (within
    :data:`BUSIEST_REL_TOL` of ``B*``); ``B* >= max(total / stages,
    largest layer)`` starts it. ``cache`` (a dict) keeps results per
    (profile, stages) and the prefix sums per profile.

    Integral layers are what this adds over ``total / stages``: GPT-3's 96
    blocks plus embedding and head on 16 stages leave some stage 7 blocks'
    worth where the average is 6.1.
    """
    cache = {} if cache is None else cache
    key = (id(profile), stages)
    if key in cache:
        return cache[key]
    if (id(profile),) not in cache:
        per_sample = _per_sample_s(profile)
        cache[(id(profile),)] = (np.concatenate([[0.0], np.cumsum(per_sample)]).tolist(),
                                 float(per_sample.max()))
    prefix, largest = cache[(id(profile),)]
    if len(prefix) - 1 <= BUSIEST_DP_LAYERS:
        if ("partitions", id(profile)) not in cache:
            cache[("partitions", id(profile))] = _min_max_partitions(np.asarray(prefix))
        values = cache[("partitions", id(profile))]
        cache[key] = float(values[min(stages, len(values)) - 1]) * (1 - 1e-9)
        return cache[key]
    lo = max(prefix[-1] / stages, largest)
    if not _fits_in_stages(prefix, stages, lo):  # else B* = lo
        hi = lo + largest  # a greedy split within total / stages + largest layer always exists
        if not _fits_in_stages(prefix, stages, hi):
            hi = prefix[-1]
        while hi - lo > BUSIEST_REL_TOL * hi:
            mid = 0.5 * (lo + hi)
            if _fits_in_stages(prefix, stages, mid):
                hi = mid
            else:
                lo = mid
    cache[key] = lo * (1 - 1e-9)
    return cache[key]


def _min_max_partitions(prefix: np.ndarray) -> np.ndarray:
    """``B*(k)`` for ``k = 1 .. L``: the least largest stage of a split of
    the ``L`` layers of ``prefix`` (prefix sums, ``L + 1``) into ``k``
    contiguous non-empty stages, by the partition DP ``D_k(j) = min_{i < j}
    max(D_{k-1}(i), P_j - P_i)`` (Bokhari 1988, IEEE Trans. Computers
    37(1)), one ``(L+1, L+1)`` step per ``k`` (``D_L(L)`` is the largest
    layer, the value of every ``k >= L`` that :func:`busiest_stage_per_sample_s`
    reads)."""
    L = len(prefix) - 1
    span = prefix[None, :] - prefix[:, None]  # [i, j]: layers i .. j-1
    span[np.tril_indices(L + 1)] = np.inf  # i >= j: no layer
    d = span[0].copy()  # one stage: layers 0 .. j-1
    out = np.empty(L)
    out[0] = d[L]
    for k in range(1, L):
        d = np.maximum(d[:, None], span).min(axis=0)
        out[k] = d[L]
    return out


def packed_busiest_per_sample_s(profile: ModelProfile, devices: int, cache: dict | None = None) -> float:
    """A lower bound on the busiest of ``devices`` devices, in per-sample
    compute seconds, whatever layers each device holds (contiguous or not:
    interleaved chunks too). With the per-sample layer times sorted
    largest first, ``a_1 >= a_2 >= ...``: among the ``t = k devices + 1``
    largest layers some device holds ``k + 1`` (pigeonhole), at least the
    ``k + 1`` smallest of them, ``a_{t-k} + ... + a_t``; the bound is the
    largest of these over ``k`` (bin packing's counting bound, Martello and
    Toth 1990, "Knapsack Problems", sec. 8.3), lowered by ``1e-9`` relative
    against rounding. ``cache`` keeps the sorted prefix sums per profile and
    the result per (profile, devices)."""
    cache = {} if cache is None else cache
    if ("packed", id(profile), devices) in cache:
        return cache[("packed", id(profile), devices)]
    key = ("sorted", id(profile))
    if key not in cache:
        per_sample = _per_sample_s(profile)
        cache[key] = np.concatenate([[0.0], np.cumsum(np.sort(per_sample)[::-1])])
    prefix = cache[key]
    k = np.arange((len(prefix) - 2) // devices + 1)
    t = k * devices + 1
    cache[("packed", id(profile), devices)] = float(np.max(prefix[t] - prefix[t - k - 1])) * (1 - 1e-9)
    return cache[("packed", id(profile), devices)]


def busiest_device_per_sample_s(profile: ModelProfile, pp: int, stages: int, cache: dict | None = None) -> float:
    """A lower bound on the busiest device's per-sample compute seconds over
    every split of the layers into ``stages`` contiguous stages on ``pp``
    devices (stage ``s`` on device ``s % pp``): the largest stage
    (:func:`busiest_stage_per_sample_s`) and, with several stages per device,
    also the packing bound (:func:`packed_busiest_per_sample_s`)."""
    bound = busiest_stage_per_sample_s(profile, stages, cache)
    return bound if stages <= pp else max(bound, packed_busiest_per_sample_s(profile, pp, cache))


def forward_share_of(profile: ModelProfile) -> float:
    """The least share of a layer's per-sample compute that is forward,
    ``min F / (F + B)`` over layers with compute (per-sample parts, as
    :func:`_per_sample_s`; 1 when no layer has any)."""
    fwd = np.array([lay.fwd_s - (lay.fwd_fixed_s or 0.0) for lay in profile.layers]) / profile.profiled_batch_size
    total = _per_sample_s(profile)
    busy = total > 0
    return float(np.min(fwd[busy] / total[busy])) if busy.any() else 1.0


def _per_sample_s(profile: ModelProfile) -> np.ndarray:
    """Per layer, the part of ``fwd_s + bwd_s`` that grows with the batch,
    per sample (:attr:`pipesearch.types.ModelProfile.compute_per_sample_s`)."""
    return np.array([lay.fwd_s + lay.bwd_s - ((lay.fwd_fixed_s or 0.0) + (lay.bwd_fixed_s or 0.0))
                     for lay in profile.layers]) / profile.profiled_batch_size


def _fits_in_stages(prefix: list[float], stages: int, cap: float) -> bool:
    """Whether the layers of ``prefix`` (prefix sums) split into at most
    ``stages`` contiguous stages of at most ``cap`` each (greedy: each stage
    ends at the last layer that keeps it within ``cap``)."""
    pos, last = 0, len(prefix) - 1
    for _ in range(stages):
        pos = bisect.bisect_right(prefix, prefix[pos] + cap, pos) - 1
        if pos >= last:
            return True
    return False


def memory_totals(profile: ModelProfile, job: Job, stage_tables=()) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: weights + gradients + optimizer bytes, and saved activation
    bytes per sample (the least over the per-stage options' tables)."""
    arrays = profile.layer_arrays
    # sharding divides parts of the state by dp; the floor is what is left as dp -> infinity
    floor = param_state_of(job).floor_bytes_per_param()
    # per-stage recompute keeps at least the checkpoints (stage_options.stage_options)
    saved = np.minimum(arrays["saved_bytes"], arrays["recompute_saved_bytes"])
    for _, table in stage_tables:
        saved = np.minimum(saved, table.layer_arrays["saved_bytes"])
    if job.optimizer_offload:  # the optimizer state may leave the device (memory.offload_bytes_per_param)
        floor = min(floor, offload_bytes_per_param(param_state_of(job), 1 << 30)[0])
    if job.weight_streaming:  # all of it may (stage_options.stream_options)
        floor = 0.0
    return (arrays["param_bytes"] * floor / profile.bytes_per_param,
            saved / profile.profiled_batch_size)


def surely_out_of_memory(totals, row: dict, in_flight: np.ndarray, slot_capacity_bytes: np.ndarray) -> bool:
    """True when no split on any placement can fit.

    Stage ``k`` needs ``M_k = static_k + f_k act_k`` (``f_k`` in-flight
    micro-batches, ``P`` stages, ``S`` and ``A`` the model's totals) within
    its capacity ``c_k``, the smallest of its ``dp`` replicas' slots. Over any
    placement on distinct slots, the ``pp`` device capacities are at most
    ``g_1 >= g_2 >= ...``, ``g_k`` the ``k dp``-th largest slot capacity
    (``slot_capacity_bytes``, sorted largest first: grouping the slots in
    that order maximises every sum of group minima). Necessary conditions:
    ``S + min f A <= sum_k g_k``; ``S / max f + A <= sum_k M_k / f_k <=
    sum_k c_k / f_k``, at most the largest ``g`` paired with the smallest
    ``f`` (rearrangement inequality); the largest single layer with ``min f``
    micro-batches within ``g_1``. Stages of an interleaved device share its
    memory, so there only the first condition is used, over the ``P / vp``
    devices, with ``f`` the counts every device holds of each of its chunks
    at once (:func:`floor_in_flight`).
    """
    static, act = totals
    act = act * row["micro_batch_size"]
    f = np.maximum(in_flight, 1)
    dp, devices = row["dp"], len(f) // row["vp"]
    g = np.asarray(slot_capacity_bytes, dtype=float)[dp - 1::dp][:devices]
    if len(g) < devices:
        return True
    total_s, total_a = float(static.sum()), float(act.sum())
    if total_s + f.min() * total_a > g.sum():
        return True
    if row["vp"] > 1:
        return False
    weighted = float(np.sum(g / np.sort(f)))
    return ((total_s / f.max() + total_a) > weighted
            or float(np.max(static + f.min() * act)) > g[0])


def group_lower_bound_s(work_s: float, pp: int, per_replica: int, fastest: float, busiest_s: float,
                        average: float | None = None) -> float:
    """The least :func:`point_lower_bound_s` of any point of a (pp, dp) group:
    its replica batch ``m x mbs = per_replica`` on the busiest device, which
    does at least ``max(W / pp x average, busiest_s x fastest)`` per sample
    (``busiest_s`` from :func:`busiest_device_per_sample_s` over
    :func:`group_stages` stages, the most a point of the group can have;
    ``average`` from :func:`capacity_time_scale`, ``fastest`` when None)."""
    if average is None:
        return fastest * per_replica * max(work_s / pp, busiest_s)
    return per_replica * max(work_s * average / pp, busiest_s * fastest)
