"""Enumerate the plan space, split each point exactly, rank by simulated time.

A *point* is (tp, recompute, pp, dp, micro-batch size, schedule, vp,
placement). For each point the exact split
(:func:`pipesearch.split_search.exact_split`) gives the point's best iteration
time under the one time model (:mod:`pipesearch.timemodel`: the simulator's
makespan of the schedule plus the all-reduce). Points are grouped by (tp,
recompute, pp, dp); groups are visited in order of a lower bound on any of
their points' simulated time, points within a group in order of their own
bound (:func:`_lower_bound_s`), and a group or point whose bound cannot enter
the top ``K`` is skipped (``pruned``) without losing exactness: the ranked
plans are the true top ``K`` configurations by simulated time.

Every visited point is a row of :attr:`SearchResult.points` (a pandas
DataFrame, built on first use from :attr:`SearchResult.point_columns`) with its status: ``ok``, ``out_of_memory``, ``batch_not_divisible``,
``schedule_refused``, ``too_many_stages`` or ``pruned``.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Iterable, NamedTuple

import numpy as np

from . import schedules as schedule_lib
from .costs import PipelineCosts, build_pipeline_costs, device_time_scale, in_flight_micro_batches, profile_precision
from .placement import (SLOTS_PREFIX, check_layout, count_layouts, group_ids, layout, layout_names, memory_bytes_of,
                        node_ids, num_slots, placement_candidates, placement_links, rank_memory,
                        reference_device, replicated_stage_devices, slot_classes, slot_heads)
from .errors import InfeasibleError, InputError
from .host import cross_mapping
from .pins import split_text
from .memory import offload_bytes_per_param, param_state_of, usable_memory_bytes
from .option_search import (best_policies_for_split, exact_split_over_policies, host_overflow_note, host_plan_info,
                            pin_mobius_activations, prefer_device_state)
from .roundpipe import plan_point as roundpipe_plan_point
from .replication import (MAX_REPLICATED_PP, check_replication_job, is_uniform_point, parse_replicas_name,
                          parse_replicas_slots, placement_time_scale, replica_vectors, replicated_costs,
                          replicated_lower_bound_s, replicated_placements)
from .split_search import CHAIN_SCHEDULES, EQUAL_TIME_REL, exact_split
from .stage_options import ACT_HOST_RESIDENT, offloads_activations
from .timemodel import busiest_idle_fraction, iteration_time_s, rank_busy_s, simulate_times, stage_times_of
from .types import MAX_MICRO_BATCHES, SCHEDULES, Cluster, DeviceSpec, Job, ModelProfile, Plan, Prediction, StagePlan
from .units import format_gib_pair

ANALYTIC_SCHEDULES = ("gpipe", "1f1b")
#: every schedule the search knows; the first two have an exact analytic split
ALL_SCHEDULES = SCHEDULES
DEFAULT_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "looped-bfs", "mobius", "roundpipe")


@dataclass(frozen=True)
class SearchOptions:
    """Pins and knobs of a search. ``None`` means "search over it".

    Attributes:
        pp, dp, micro_batch_size, num_micro_batches: pinned degrees.
        schedules: schedules to consider (see :data:`ALL_SCHEDULES`).
        vps: virtual stages per device to try for interleaved 1F1B and
            looped breadth-first.
        split: layers per stage to score instead of searching (implies pp).
        top: number of plans to return.
        placements: device placement orders to try when pp > 1 and dp > 1
            (see :func:`pipesearch.costs.pipeline_placement`).
        exhaustive: evaluate every point instead of skipping those whose
            lower bound cannot enter the top plans (for plots of the space).
        mapping_time_limit_s: work limit of the CP-SAT device-order search on
            mixed clusters, in CP-SAT's deterministic time (about seconds; the
            same limit gives the same answer on every machine under any
            load; there is no wall-clock limit): the closed-form order that
            the order search (:mod:`pipesearch.order_search`) splits first
            when a cluster has more orders than it visits, used only when
            neither order enumeration nor the device-class DP applies.
        enumerate_layouts_up_to: on mixed clusters, a (pp, dp) group with at
            most this many layouts (up to swaps inside a node,
            :func:`pipesearch.placement.count_layouts`) tries every one of
            them, so its best plan is exact over placements too.
        replicate_stages: also search per-stage replication (PipeDream /
            DAPPLE: stage ``k`` on its own ``r_k`` replicas, each one
            tensor-parallel slot, :mod:`pipesearch.replication`), every
            replica vector of ``pp`` up to
            :data:`pipesearch.replication.MAX_REPLICATED_PP` stages, on
            every placement when there are at most
            ``enumerate_layouts_up_to`` of them.
        split_replicas: replicas per stage of ``split`` (``--split
            17x15,6x1``): score that replicated point only.
        vp_pinned: ``vps`` was pinned (``--vp``): every plan has one of
            them, so a single-stage schedule or ``pp`` 1 (both vp 1) is
            searched only when 1 is among them (:func:`vp_choices`).
        placement_pinned: ``placements`` was pinned (``--placement``): on a
            cluster of several groups too, only those patterns
            (:func:`placement_names`).
        min_dp: the least data-parallel degree searched: 2 when the
            optimizer state is sharded over replicas at the user's request
            (``--sharding``, ``--zero1``), which one replica would not
            honour; the smaller degrees are counted as ``one_replica``.
    """

    pp: int | None = None
    dp: int | None = None
    micro_batch_size: int | None = None
    num_micro_batches: int | None = None
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    vps: tuple[int, ...] = (2,)
    split: tuple[int, ...] | None = None
    top: int = 5
    placements: tuple[str, ...] = ("pipeline", "data")
    exhaustive: bool = False
    mapping_time_limit_s: float = 0.5
    enumerate_layouts_up_to: int = 24
    replicate_stages: bool = False
    split_replicas: tuple[int, ...] | None = None
    vp_pinned: bool = field(default=False, repr=False)  # in the fingerprint only when set (search)
    placement_pinned: bool = field(default=False, repr=False)  # likewise
    min_dp: int = field(default=1, repr=False)  # likewise


def vp_choices(schedule: str, pp: int, options: SearchOptions) -> tuple[int, ...]:
    """The virtual stages per device a point of ``schedule`` at ``pp``
    takes: ``options.vps`` for a multi-stage schedule over ``pp > 1`` ranks,
    else vp 1 (one rank runs all its stages as one; a single-stage schedule
    runs one), or none when ``options.vp_pinned`` excludes 1."""
    if schedule in MULTI_STAGE_SCHEDULES and pp > 1:
        return tuple(options.vps)
    return (1,) if not options.vp_pinned or 1 in options.vps else ()


@dataclass(frozen=True)
class ModelVariant:
    """A layer table of the model under one (tp, recompute) choice."""

    profile: ModelProfile
    tp: int = 1
    recompute: str = "none"
    extra: tuple[tuple[str, object], ...] = ()
    #: per-stage recompute: ``(mode, layer table)`` pairs, fastest first, from
    #: which each stage takes the first that fits (``recompute = "per-stage"``;
    #: :func:`pipesearch.stage_options.stage_options`); empty: ``profile`` alone
    stage_tables: tuple[tuple[str, ModelProfile], ...] = ()
    #: offer stages the optimizer state in host memory (``Job.optimizer_offload``)
    offload: bool = False
    #: offer stages their weights streamed from host memory (``Job.weight_streaming``)
    stream: bool = False


@dataclass(frozen=True, eq=False)
class SearchResult:
    """Ranked plans plus the bookkeeping of the search.

    ``plans`` holds the best plan of each of the top configurations
    (:func:`plan_family`), ranked by simulated iteration time
    (:func:`rank_plans`).
    ``point_columns`` holds one list per column (:data:`POINT_COLUMNS`:
    tp, recompute, pp, dp, schedule, vp, micro_batch_size,
    num_micro_batches, placement, status, iteration_time_s, samples_per_s,
    peak_memory_bytes, bubble_fraction, lower_bound_s; NaN where a point was
    not evaluated), one value per visited point; ``points`` is the same table
    as a pandas DataFrame.
    """

    plans: tuple[Plan, ...]
    points_evaluated: int
    infeasible: tuple[tuple[str, int], ...]
    wall_s: float
    fingerprint: str
    point_columns: dict = field(repr=False)
    #: evaluated points outside the ranked plans whose split search stopped at
    #: its work limits with a proven lower bound below the final cutoff (the
    #: time a plan must beat to be ranked), and the least of those bounds (inf:
    #: none): a plan of theirs could be faster than the ranked plans slower
    #: than it
    unproven_points: int = 0
    unproven_bound_s: float = math.inf

    @cached_property
    def points(self):
        """The visited points as a pandas DataFrame (one row per point)."""
        return points_frame(self.point_columns)


def points_frame(point_columns: dict):
    """A points table (:attr:`SearchResult.point_columns`) as a pandas
    DataFrame, one row per point, columns in :data:`POINT_COLUMNS` order."""
    import pandas as pd

    return pd.DataFrame(point_columns, columns=list(POINT_COLUMNS))


#: the columns of the points table, in order
POINT_COLUMNS = ("tp", "recompute", "pp", "dp", "schedule", "vp", "micro_batch_size", "num_micro_batches",
                 "placement", "status", "iteration_time_s", "samples_per_s", "peak_memory_bytes",
                 "bubble_fraction", "lower_bound_s")


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def fingerprint(*parts) -> str:
    """``sha256:`` of the JSON of ``parts`` (dataclasses via ``repr``)."""
    text = json.dumps([repr(p) for p in parts], sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _lower_bound_s(work_s: float, pp: int, mbs: int, m: int, schedule: str, fastest: float,
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
      :func:`pipesearch.split_search.bound_families` at the busiest stage,
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


def _stage_plans(variant, costs: PipelineCosts, bounds, placement, cluster,
                 job: Job | None = None, replicated: bool = False) -> tuple[StagePlan, ...]:
    """The plan's stages under the split ``bounds``; with several stages
    per device each stage's memory is its part of its device's peak
    (:meth:`pipesearch.costs.PipelineCosts.at_device_peak`)."""
    costs = costs.at_device_peak(bounds)
    names = [lay.name for lay in variant.profile.layers]
    st, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    cols = {
        "compute_s": costs.compute_s(st, i, j),
        "comm_s": costs.send_s(st, j),
        "dp_comm_s": sum(costs.dp_comm_s(st, i, j)),
        "memory_bytes": costs.total_memory_bytes(st, i, j),
        "send_bytes": np.where(st + 1 < costs.pp, costs.output_bytes[j - 1], 0.0),
        "fwd_s": costs.fwd_s(st, i, j),
        "saved_bytes": costs.saved_bytes(st, i, j),
        "bwd_input_s": costs.bwd_input_s(st, i, j),
        "allreduce_s": costs.after_backward_s(st, i, j),
        "host_step_s": costs.host_step_s(st, i, j),
    }
    # the recorded backward is compute_s - fwd_s (two prefix sums apart, so a stage with no backward can
    # round to a forward past its compute): keep it, and the input-gradient part inside it, non-negative
    cols["fwd_s"] = np.minimum(cols["fwd_s"], cols["compute_s"])
    cols["bwd_input_s"] = np.minimum(cols["bwd_input_s"], cols["compute_s"] - cols["fwd_s"])
    cols = {k: v.tolist() for k, v in cols.items()}
    stages = []
    ranks = len({tuple(np.asarray(row).ravel().tolist()) for row in placement})  # stages of a rank share its slot
    state = param_state_of(job, ranks) if job is not None else None
    group_names = [g.device.name for g in cluster.groups]
    of_group = group_ids(cluster)
    for s in range(costs.pp):
        devices = tuple(np.asarray(placement[s], dtype=np.int64).tolist())
        gids = of_group[np.asarray(devices, dtype=np.int64)]
        firsts = gids[np.sort(np.unique(gids, return_index=True)[1])]  # groups in order of first appearance
        parts = costs.memory_breakdown(s, int(i[s]), int(j[s]), state, len(placement[s]),
                                       variant.profile.bytes_per_param)
        stages.append(StagePlan(
            index=s, layers=(int(i[s]), int(j[s])), layer_names=tuple(names[i[s]:j[s]]), devices=devices,
            device_type=",".join(dict.fromkeys(group_names[g] for g in firsts.tolist())),
            memory_breakdown=tuple(parts.items()), replicas=len(devices) if replicated else None,
            memory_option=costs.option_name(s, int(i[s]), int(j[s])),
            **{k: v[s] for k, v in cols.items()},
        ))
    return tuple(stages)


def _prediction(costs: PipelineCosts, stages, iteration_time_s: float, global_batch: int, cluster,
                pp: int, schedule: str, profile: ModelProfile | None = None, tp: int = 1) -> Prediction:
    m = costs.num_micro_batches
    busy = rank_busy_s(schedule, pp, m, costs.stage_times(
        (stages[0].layers[0],) + tuple(st.layers[1] for st in stages)))
    mem, caps = rank_memory(stages, pp, memory_bytes_of(cluster))  # caps: the peak device's own memory
    if schedule == "mobius":  # each GPU's peak over its stays, the figure its memory check uses
        mem = costs.mobius_device_peak_bytes((stages[0].layers[0],) + tuple(st.layers[1] for st in stages))
    busiest, k = float(busy.max()), int(np.argmax(mem))
    peak, cap = float(mem[k]), float(caps[k])
    return Prediction(
        iteration_time_s=iteration_time_s,
        samples_per_s=global_batch / iteration_time_s if iteration_time_s > 0 else math.inf,
        bubble_fraction=busiest_idle_fraction(busiest, iteration_time_s),
        peak_memory_bytes=peak,
        memory_capacity_bytes=cap,
        **_throughput_terms(profile, stages, global_batch, cluster, tp),
    )


def _throughput_terms(profile: ModelProfile | None, stages, global_batch: int, cluster, tp: int) -> dict:
    """The plan's devices (each stage device heads a group of ``tp``) and
    their fp16 peak (fp32 accumulate, the MFU denominator), and, for a model
    with tokens, tokens and PaLM model FLOPs per iteration (left out, 0, for
    a layer profile)."""
    devices = np.unique(np.concatenate([np.asarray(st.devices, dtype=np.int64) for st in stages]))
    flops = np.array([g.device.mfu_peak_flops for g in cluster.groups], dtype=float)[group_ids(cluster)[devices]]
    out = {"peak_flops": float(tp * sum(flops.tolist())),  # summed in device order, as a Python sum
           "num_devices": tp * len(devices)}
    if profile is not None and profile.tokens_per_sample:
        out.update(tokens_per_iteration=float(global_batch * profile.tokens_per_sample),
                   model_flops_per_iteration=float(global_batch * profile.model_flops_per_sample))
    return out


def simulate_plan(plan: Plan) -> tuple[float, object]:
    """Replay a plan's schedule with its stage times in the simulator
    (:func:`pipesearch.timemodel.simulate_times`): returns (iteration time
    including each rank's gradient all-reduce after its last action, Timeline)."""
    resident = [ACT_HOST_RESIDENT if offloads_activations(st.memory_option) else math.inf for st in plan.stages]
    return simulate_times(plan.schedule, plan.pp, plan.num_micro_batches, plan.vp, stage_times_of(plan),
                          act_bytes=[st.saved_bytes for st in plan.stages], act_resident=resident)


def enumerate_groups(variants: Iterable[ModelVariant], cluster: Cluster, job: Job, options: SearchOptions):
    """Yield ``(variant, pp, dp, status, count)`` over the (layer table,
    pipeline degree, data-parallel degree) groups of the space: ``status``
    None for one group to expand with :func:`expand_group` (``count`` 1), else
    ``count`` groups refused for that reason: ``too_many_stages``, or
    ``batch_not_divisible`` for the ``dp`` values of a ``pp`` that do not
    divide the global batch (counted, never enumerated: only divisors of the
    batch are visited; ``dp`` is then None)."""
    batch_divisors = divisors(job.global_batch_size)
    for variant in variants:
        L = variant.profile.num_layers
        slots = num_slots(cluster, variant.tp)
        pps = [options.pp] if options.pp else range(1, min(slots, L) + 1)
        for pp in pps:
            if not options.pp and not any(vp_choices(s, pp, options) for s in options.schedules):
                continue  # a pinned vp above 1: not pp 1 (vp_choices)
            if pp > L:
                yield variant, pp, None, "too_many_stages", 1
                continue
            if options.dp:
                if pp * options.dp <= slots:
                    refused = job.global_batch_size % options.dp != 0
                    yield variant, pp, options.dp, ("batch_not_divisible" if refused else None), 1
                continue
            dps = batch_divisors[:bisect.bisect_right(batch_divisors, slots // pp)]
            few = bisect.bisect_left(dps, options.min_dp)  # a sharded state needs replicas (SearchOptions.min_dp)
            if few:
                yield variant, pp, None, "one_replica", few
            yield from ((variant, pp, dp, None, 1) for dp in dps[few:])
            if slots // pp > len(dps):
                yield variant, pp, None, "batch_not_divisible", slots // pp - len(dps)


def micro_batch_sizes(per_replica: int, options: SearchOptions) -> list[int]:
    """Micro-batch sizes to try for a replica batch (empty when a pin does not divide it)."""
    if options.num_micro_batches:
        return [per_replica // options.num_micro_batches] if per_replica % options.num_micro_batches == 0 else []
    if options.micro_batch_size:
        return [options.micro_batch_size] if per_replica % options.micro_batch_size == 0 else []
    return divisors(per_replica)


def placement_names(cluster: Cluster, pp: int, dp: int, options: SearchOptions, tp: int = 1,
                    precision: str = "fp16") -> tuple[str, ...]:
    """Placements to try for a (pp, dp) group. Homogeneous clusters:
    ``options.placements`` (``pipeline``, ``data``; one when pp or dp is 1).
    Mixed clusters: every layout up to swaps inside a node
    (:func:`pipesearch.placement.layout_names`) when there are at most
    ``options.enumerate_layouts_up_to``, which makes the search exact over
    placements; else the candidates of
    :func:`pipesearch.placement.placement_candidates` (patterns over the
    slots, fastest type first) and, for a single pipeline (dp = 1),
    ``mapped``: the device order chosen by :func:`pipesearch.ilp.map_pipeline`
    (not with ``--placement``: its patterns only).
    ``precision``: the profile's (:func:`pipesearch.costs.profile_precision`),
    which orders the slots the names refer to (:func:`pipesearch.placement.layout`
    reads them in the same order)."""
    if cluster.is_uniform:
        return options.placements if (pp > 1 and dp > 1) else options.placements[:1]
    mapped = ("mapped",) if dp == 1 and pp > 1 else ()
    if options.placement_pinned:  # --placement: its patterns only, fastest and largest devices first
        return tuple(name for name, _ in placement_candidates(cluster, pp, dp, tp, precision, options.placements))
    if count_layouts(cluster, pp * dp, tp) <= options.enumerate_layouts_up_to:
        return tuple(layout_names(cluster, pp, dp, tp, precision))
    names = tuple(name for name, _ in placement_candidates(cluster, pp, dp, tp, precision))
    return names + mapped


def expand_group(variant: ModelVariant, pp: int, dp: int, job: Job, options: SearchOptions,
                 cluster: Cluster | None = None):
    """Yield ``(mbs, m, schedule, vp, placement, status)`` for every point of a
    (variant, pp, dp) group (placements from :func:`placement_names`, or
    ``options.placements`` when no cluster is given); ``status`` is None for points to evaluate, else
    the reason the point is refused (``batch_not_divisible``,
    ``schedule_refused``, ``too_many_stages``)."""
    L = variant.profile.num_layers
    per_replica = job.global_batch_size // dp
    mbss = micro_batch_sizes(per_replica, options)
    if not mbss:
        yield options.micro_batch_size, options.num_micro_batches, None, None, None, "batch_not_divisible"
        return
    placements = _placements(cluster, pp, dp, options, variant)
    for mbs in mbss:
        m = per_replica // mbs
        for schedule in group_schedules(pp, options):
            for vp in vp_choices(schedule, pp, options):
                refused = schedule_refusal(schedule, pp, m, vp, L)
                for placement in (_schedule_placements(placements, schedule) if refused is None else (None,)):
                    yield mbs, m, schedule, vp, placement, refused


def _schedule_placements(placements: tuple[str, ...], schedule: str) -> tuple[str, ...]:
    """The placements of a group that ``schedule`` is searched with:
    RoundPipe's GPUs take the stages in turn (a pool, :mod:`pipesearch.roundpipe`),
    so no device order is searched for it (``mapped``): the named layouts only."""
    return tuple(p for p in placements if p != "mapped") if schedule == "roundpipe" else placements


def one_rank_schedule(schedules) -> str:
    """The schedule ``pp = 1`` is searched with among ``schedules``: with
    one stage every schedule is plain gradient accumulation, 1F1B's order,
    so 1F1B, else the first that runs one stage per rank (interleaving
    refuses pp 1), else the first."""
    if "1f1b" in schedules:
        return "1f1b"
    return next((s for s in schedules if s not in MULTI_STAGE_SCHEDULES), schedules[0])


def group_schedules(pp: int, options: SearchOptions) -> tuple[str, ...]:
    """The schedules a group of ``pp`` ranks is searched with: all of
    them, but one for ``pp = 1`` (:func:`one_rank_schedule`)."""
    if pp == 1:
        return (one_rank_schedule(options.schedules),) if options.schedules else ()
    return tuple(options.schedules)


def accepted_points(schedule: str, pp: int, per_replica: int, num_layers: int, options: SearchOptions) -> int:
    """How many (micro-batch size, vp) choices of a replica batch of
    ``per_replica`` samples run ``schedule`` on ``pp`` ranks
    (:func:`schedule_refusal` accepts them)."""
    return sum(1 for mbs in micro_batch_sizes(per_replica, options) for vp in vp_choices(schedule, pp, options)
               if schedule_refusal(schedule, pp, per_replica // mbs, vp, num_layers) is None)


def count_points(variant: ModelVariant, pp: int, dp: int, job: Job, options: SearchOptions,
                 cluster: Cluster | None = None, cache: dict | None = None) -> int:
    """How many points of a group :func:`expand_group` yields with status
    None (the points a pruned group stands for), without building them:
    per schedule, its placements (:func:`_schedule_placements`) times the
    (micro-batch size, vp) choices that :func:`schedule_refusal` accepts.
    ``cache`` (a dict) keeps the choices per (layers, pp, replica batch)
    across groups."""
    L, per_replica = variant.profile.num_layers, job.global_batch_size // dp
    key = (L, pp, per_replica)
    per = None if cache is None else cache.get(key)
    if per is None:
        per = {schedule: accepted_points(schedule, pp, per_replica, L, options)
               for schedule in group_schedules(pp, options)}
        if cache is not None:
            cache[key] = per
    placements = _placements(cluster, pp, dp, options, variant)
    return sum(n * len(_schedule_placements(placements, schedule)) for schedule, n in per.items())


def _placements(cluster: Cluster | None, pp: int, dp: int, options: SearchOptions, variant) -> tuple[str, ...]:
    return (placement_names(cluster, pp, dp, options, variant.tp, profile_precision(variant.profile))
            if cluster is not None else options.placements if (pp > 1 and dp > 1) else options.placements[:1])


def placement_array(cluster: Cluster, variant: ModelVariant, row: dict, ctx: dict) -> np.ndarray:
    """``(pp, dp)`` heads (first device of each tensor-parallel group,
    :mod:`pipesearch.placement`) of a point's placement; ``ctx`` caches
    across points. Named patterns run over the cluster's canonical slots
    (:func:`pipesearch.placement.layout`); ``mapped`` is the order chosen by
    :func:`_mapped_order` (None when no order fits in memory)."""
    pp, dp, name = row["pp"], row["dp"], row["placement"]
    if name == "mapped":
        return _mapped_order(cluster, variant, row, ctx)
    return layout(cluster, pp, dp, variant.tp, name, profile_precision(variant.profile))


def _mapped_order(cluster: Cluster, variant: ModelVariant, row: dict, ctx: dict) -> np.ndarray | None:
    """Device order of one pipeline on a mixed cluster over its tensor-parallel
    slots: :func:`pipesearch.order_search.best_order`, the order and split of
    least simulated time over every order of slots up to swaps inside a node
    (OPTIMAL, or bound and gap under its deterministic count of orders), per
    point (micro-batching, schedule, vp), from the search's cutoff
    (``ctx["cutoff_s"]``; when no order beats it, the point is pruned,
    :func:`_mapped_above`); when the orders exceed its count, the
    closed-form optimum of :func:`_closed_form_order` is split first, so the
    result is never slower than that order's exact split. The status, bound
    and gap go into the plan's options. None when no order fits in memory
    or none was met that fits and none beats the cutoff."""
    from .order_search import MAX_ORDERS, best_order, total_orders

    key = _mapped_key(variant, row)
    if key not in ctx:
        precision = profile_precision(variant.profile)

        built: dict = {}  # the point's costs per order: its bounds read the same few orders' costs again

        def costs_of(order):
            if order not in built:
                named = dict(row, placement=SLOTS_PREFIX + ",".join(map(str, order)))
                built[order] = _point_costs(variant, cluster, ctx["job"], named, ctx["profiled_device"],
                                            ctx.get("in_flight_cache"), ctx.get("links_cache"), ctx)[1]
            return built[order]

        classes = slot_classes(cluster, variant.tp, precision)
        first = (lambda: _closed_form_order(cluster, variant, row, ctx)) if total_orders(
            classes, row["pp"]) > MAX_ORDERS else ()  # only for a point the rank-capacity bound does not settle
        found = best_order(classes, costs_of, row["schedule"], row["pp"], row["vp"],
                           cutoff_s=ctx.get("cutoff_s", math.inf), first=first)
        heads = None if found is None or not found.order else layout(
            cluster, row["pp"], 1, variant.tp, SLOTS_PREFIX + ",".join(map(str, found.order)), precision)
        ctx[key] = (heads, None if found is None else {
            "method": found.method + "+exact-split", "status": found.status, "objective_s": found.iteration_time_s,
            "best_bound_s": found.best_bound_s, "gap": found.gap, "orders_evaluated": found.orders_evaluated,
            "orders_total": found.orders_total})
    return ctx[key][0]


def _closed_form_order(cluster: Cluster, variant: ModelVariant, row: dict, ctx: dict) -> tuple:
    """The slots of the order :func:`pipesearch.ilp.map_pipeline` chooses for
    the closed-form 1F1B objective (once per variant and pp, at the first
    micro-batching asked), as the order search's first order when its orders
    are too many to visit; empty when none fits."""
    from .ilp import map_pipeline

    key = ("closed-form", id(variant), row["pp"])
    if key not in ctx:
        heads = slot_heads(cluster, variant.tp, profile_precision(variant.profile))
        try:
            result = map_pipeline(variant.profile, cluster, ctx["job"], pp=row["pp"],
                                  micro_batch_size=row["micro_batch_size"],
                                  num_micro_batches=row["num_micro_batches"], schedule="1f1b",
                                  objective="iteration", profiled_device=ctx["profiled_device"],
                                  devices=heads, max_deterministic_time=ctx["time_limit_s"])
            pos = {int(h): k for k, h in enumerate(heads)}
            ctx[key] = (tuple(pos[d] for d in result.devices),)
        except InfeasibleError:
            ctx[key] = ()
    return ctx[key]


#: among mapped points of equal bound, the schedules with the least bubble
#: first (their plans are likeliest to set a low cutoff for the others);
#: a schedule not listed comes last
BUBBLE_ORDER = ("zb-h1", "interleaved-1f1b", "looped-bfs", "1f1b", "gpipe")


def _mapped_visit_order(points: list, rows: list[dict]) -> list:
    """The order in which the search evaluates its mapped points ``(bound,
    row index, variant)``, after every other point: first the point of least
    bound of each family (variant, pp, schedule, vp: the likeliest best
    mapping of each configuration, so that the cutoff falls early), then
    the others; each part by bound, then schedule (:data:`BUBBLE_ORDER`:
    on a mixed cluster the bounds of one (pp, dp, m) often tie), then row
    index. Deterministic; the ranked plans do not depend on it
    (docs/heterogeneous.md, "Point order")."""
    def key(point):
        schedule = rows[point[1]]["schedule"]
        return (point[0], BUBBLE_ORDER.index(schedule) if schedule in BUBBLE_ORDER else len(BUBBLE_ORDER), point[1])

    heads: dict = {}
    for point in sorted(points, key=key):
        row = rows[point[1]]
        heads.setdefault((id(point[2]), row["pp"], row["schedule"], row["vp"]), point)
    first = {p[1] for p in heads.values()}
    return sorted(heads.values(), key=key) + sorted((p for p in points if p[1] not in first), key=key)


def _mapped_above(variant: ModelVariant, row: dict, ctx: dict, cutoff_s: float) -> bool:
    """Whether a mapped point's order search (:func:`_mapped_order`) proved
    that no order and split beats ``cutoff_s`` (status ``ABOVE_CUTOFF``,
    bound at least ``cutoff_s``): the point is then pruned as it stands,
    with no split search on any order (whether one fits does not matter)."""
    info = ctx.get(_mapped_key(variant, row), (None, None))[1]
    return info is not None and info["status"] == "ABOVE_CUTOFF" and info["best_bound_s"] >= cutoff_s


def _raise_bound(row: dict, proven_s: float) -> None:
    """A point pruned by its split or order search keeps the bound that
    proved it (at least the cutoff it was searched against) as its
    ``lower_bound_s``, not only the cheaper one it was visited with."""
    row["lower_bound_s"] = max(row.get("lower_bound_s", 0.0), float(proven_s))


def _mapped_key(variant: ModelVariant, row: dict) -> tuple:
    return ("mapped", id(variant), row["pp"], row["micro_batch_size"], row["num_micro_batches"], row["schedule"],
            row["vp"])


def _slots_and_links(cluster, variant, row, placement: str, placement_ctx: dict, links_cache: dict):
    """Heads of every (virtual) stage of a point under ``placement`` and
    their links (:func:`pipesearch.placement.placement_links`), cached per
    placement; ``(None, None)`` when a mapped placement found no order."""
    pp, dp, vp = row["pp"], row["dp"], row["vp"]
    heads = placement_array(cluster, variant, dict(row, placement=placement), placement_ctx)
    if heads is None:
        return None, None
    if row["schedule"] == "mobius":  # adjacent stages under different PCIe switches (host.cross_mapping)
        heads = cross_mapping(cluster, heads, variant.tp)
    slots = heads[np.arange(pp * vp) % pp]
    key = (pp, dp, vp, variant.tp, placement, row["schedule"] == "mobius") + (
        (tuple(heads.ravel()),) if placement == "mapped" else ())
    if key not in links_cache:
        check_layout(cluster, heads, variant.tp)  # distinct devices on the cluster, each group in one node
        links_cache[key] = placement_links(cluster, slots, variant.tp)
    return slots, links_cache[key]


def _memory_key(cluster, variant, row: dict, options) -> tuple | None:
    """The point without its placement, where whether a split fits does not
    depend on the placement: devices of one memory size (the same capacity
    on every stage, whichever devices hold it), no per-stage memory
    options, host-memory offload or weight streaming (whose host memory is
    counted per node), no Mobius or RoundPipe (their own GPU and host
    rules), no device order search or per-stage replicas, no pinned split.
    None elsewhere. The split search's memory test of a stage reads its layers,
    its micro-batches in flight and its devices' capacity, never a link,
    so a point of another placement that no split fits fits no split
    either (on GPT-3 175B on 1,024 GPUs, 16 of its 48 such split searches)."""
    if (len({g.device.memory_bytes for g in cluster.groups}) > 1 or variant.offload or variant.stream
            or variant.stage_tables or options.split
            or row["schedule"] in ("mobius", "roundpipe") or row["placement"] == "mapped"
            or parse_replicas_name(row["placement"]) is not None):
        return None
    return (id(variant), row["pp"], row["dp"], row["micro_batch_size"], row["num_micro_batches"], row["schedule"],
            row["vp"])


def _same_links(cluster, variant, row, first: str, placement_ctx: dict, links_cache: dict) -> bool:
    """Whether this point's placement puts every boundary and every all-reduce
    on the same devices' links as the group's first placement (then both score
    the same and only the first is evaluated)."""
    if not cluster.is_uniform:
        return False
    mine = _slots_and_links(cluster, variant, row, row["placement"], placement_ctx, links_cache)[1]
    return mine == _slots_and_links(cluster, variant, row, first, placement_ctx, links_cache)[1]


def _memory_totals(profile: ModelProfile, job: Job, stage_tables=()) -> tuple[np.ndarray, np.ndarray]:
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


def _surely_out_of_memory(totals, row: dict, in_flight: np.ndarray, slot_capacity_bytes: np.ndarray) -> bool:
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
    at once (:func:`_floor_in_flight`).
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


def schedule_refusal(schedule: str, pp: int, m: int, vp: int, num_layers: int) -> str | None:
    """Why a runtime would refuse this schedule at this point, or None.

    1F1B-style schedules need at least as many micro-batches as stages
    (torch.distributed.pipelining's Schedule1F1B refuses fewer); Megatron-LM's
    interleaved schedule needs ``m`` to be a multiple of ``pp`` and at least
    two virtual stages per device; every virtual stage needs at least one
    layer; more than :data:`pipesearch.types.MAX_MICRO_BATCHES` micro-batches
    are refused.
    """
    if m > MAX_MICRO_BATCHES:
        return "too_many_micro_batches"
    if schedule == "interleaved-1f1b" and vp < 2:
        return "schedule_refused"
    if schedule in ("1f1b", "zb-h1", "interleaved-1f1b") and m < pp:
        return "schedule_refused"
    if schedule == "interleaved-1f1b" and m % pp:
        return "schedule_refused"
    if pp * vp > num_layers:
        return "too_many_stages"
    return None


def group_stages(pp: int, options: SearchOptions) -> int:
    """The most stages a point of a ``pp`` group may have: ``pp`` times the
    largest vp when a multi-stage schedule is searched (and pp > 1), else
    ``pp``; the fewer stages, the larger the busiest one must be."""
    if pp > 1 and any(sch in MULTI_STAGE_SCHEDULES for sch in options.schedules):
        return pp * max(options.vps)
    return pp


def group_lower_bound_s(work_s: float, pp: int, per_replica: int, fastest: float, busiest_s: float,
                        average: float | None = None) -> float:
    """The least :func:`_lower_bound_s` of any point of a (pp, dp) group:
    its replica batch ``m x mbs = per_replica`` on the busiest device, which
    does at least ``max(W / pp x average, busiest_s x fastest)`` per sample
    (``busiest_s`` from :func:`busiest_device_per_sample_s` over
    :func:`group_stages` stages, the most a point of the group can have;
    ``average`` from :func:`capacity_time_scale`, ``fastest`` when None)."""
    if average is None:
        return fastest * per_replica * max(work_s / pp, busiest_s)
    return per_replica * max(work_s * average / pp, busiest_s * fastest)


def in_bound_order(groups: list, strengthen: Callable, skip: Callable[[float], bool] | None = None):
    """Yield ``(bound, group)`` for every group of ``groups`` (sorted by a
    first, weaker bound ``group[0]``) in order of its strengthened bound
    ``strengthen(group) >= group[0]``, computed only for a group about to be
    yielded: a lazy priority queue (heapq) whose entries carry either bound,
    so every strengthened bound yielded is at most every other group's.
    ``skip(first_bound)`` True yields the group with its first bound without
    strengthening it (a caller about to prune it anyway)."""
    heap = [(g[0], 0, g[1], g) for g in groups]
    heapq.heapify(heap)
    while heap:
        bound, strong, order, group = heapq.heappop(heap)
        if strong or (skip is not None and skip(bound)):
            yield bound, group
            continue
        heapq.heappush(heap, (max(bound, strengthen(group)), 1, order, group))


def search(
    variants: list[ModelVariant],
    cluster: Cluster,
    job: Job,
    options: SearchOptions = SearchOptions(),
    *,
    profiled_device: DeviceSpec | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Search the plan space and return the ranked plans.

    Args:
        variants: layer tables of the model (one per tp/recompute choice; a
            profiled model has one).
        cluster, job: where and what.
        options: pins and knobs.
        profiled_device: device the profile was measured on (for time
            scaling); on a mixed cluster ``None`` means the fastest type
            (:func:`pipesearch.placement.reference_device`, whatever the
            order of the cluster's groups).
        progress: called as ``progress(done, total)`` over the (variant, pp,
            dp) groups of the space.

    Raises:
        InputError: a pin that cannot hold (e.g. ``--split`` that does not sum
            to the number of layers, pp*dp larger than the cluster).
        InfeasibleError: no point of the space yields a plan; the message gives
            the counts by reason and the likely fix.
    """
    start = time.perf_counter()
    _check_options(variants, cluster, job, options)
    if job.optimizer_offload:  # each layer table also with the optimizer allowed in host memory
        variants = list(variants) + [replace(v, offload=True) for v in variants if not v.offload and not v.stream]
    if job.weight_streaming:  # and with the weights streamed from host memory
        variants = list(variants) + [replace(v, stream=True, offload=False) for v in variants
                                     if not v.offload and not v.stream]
    if profiled_device is None and not cluster.is_homogeneous:
        # times measured on an unknown device: take them as the fastest type's (one
        # choice whatever the order of the groups) and scale the others by FLOP rate
        profiled_device = reference_device(cluster, profile_precision(variants[0].profile))
    precision = profile_precision(variants[0].profile)
    fastest = min(device_time_scale(profiled_device, g.device, precision) for g in cluster.groups)
    rows: list[dict] = []
    counts: Counter = Counter()
    work = {id(v): v.profile.compute_per_sample_s for v in variants}
    floor_job = replace(job, weight_streaming=True) if {"mobius", "roundpipe"} & set(options.schedules) else job  # swap all
    memory_floor = {id(v): _memory_totals(v.profile, floor_job, v.stage_tables) for v in variants}
    # usable memory of every tensor-parallel slot, largest first (the memory pre-filter)
    capacity = {tp: np.sort(usable_memory_bytes(job, memory_bytes_of(cluster)[slot_heads(cluster, tp)]))[::-1]
                for tp in {v.tp for v in variants}}
    capacity_scales: dict = {}

    def average(variant, pp: int, dp: int) -> float | None:
        """:func:`capacity_time_scale` of a (pp, dp) point's slots (None on
        a cluster of one device type)."""
        key = (pp * dp, variant.tp)
        if key not in capacity_scales:
            capacity_scales[key] = capacity_time_scale(cluster, profiled_device, precision, pp * dp, variant.tp)
        return capacity_scales[key]

    groups = []
    uniform = [] if options.split_replicas else enumerate_groups(variants, cluster, job, options)
    for variant, pp, dp, status, count in uniform:  # a pinned replicated split: that point only
        if status is not None:
            counts[status] += count
            continue
        # smallest lower bound of any point of the group (see _lower_bound_s)
        bound = work[id(variant)] * (average(variant, pp, dp) or fastest) * (job.global_batch_size // dp) / pp
        groups.append((bound, len(groups), variant, pp, dp))
    groups.sort(key=lambda g: (g[0], g[1]))
    busiest_cache: dict = {}

    share = {id(v): forward_share_of(v.profile) for v in variants}

    def busiest_s(variant, pp: int, stages: int) -> float:
        if "roundpipe" in options.schedules:  # its tasks move between GPUs: only the average device holds
            return 0.0
        return busiest_device_per_sample_s(variant.profile, pp, stages, busiest_cache)

    def strong_group_bound(group) -> float:
        """The group's bound with integral layers (:func:`group_lower_bound_s`)."""
        _, _, variant, pp, dp = group
        return group_lower_bound_s(work[id(variant)], pp, job.global_batch_size // dp, fastest,
                                   busiest_s(variant, pp, group_stages(pp, options)), average(variant, pp, dp))

    keep = max(options.top, 1)
    best_of_family: dict[tuple, tuple[float, Plan]] = {}
    family_times: list[float] = []  # sorted best time of every family seen
    in_flight_cache: dict = {}
    links_cache: dict = {}
    count_cache: dict = {}
    placement_ctx: dict = {"job": job, "profiled_device": profiled_device, "time_limit_s": options.mapping_time_limit_s,
                           "in_flight_cache": in_flight_cache, "links_cache": links_cache}  # (the order search's too)

    offered: dict = {}

    def offers(variant, pp: int, dp: int, schedule: str) -> bool:
        """Whether the group searches ``schedule`` at some micro-batch count
        (:func:`group_schedules`, :func:`accepted_points`)."""
        per_replica = job.global_batch_size // dp
        key = (variant.profile.num_layers, pp, per_replica, schedule)
        if key not in offered:
            offered[key] = schedule in group_schedules(pp, options) and accepted_points(
                schedule, pp, per_replica, variant.profile.num_layers, options) > 0
        return offered[key]

    def seed_cutoff() -> tuple[float, dict]:
        """A cutoff from achievable plans, before any exact split: the best
        starting split of two points (its lowest bound, and its fewest
        micro-batches: the largest, which the bound ranks last for their
        bubble, but which often run fastest) of each family of the
        first groups in bound order, until SEED_FAMILIES x K families have
        one; then, for each schedule searched that those groups gave no
        family of (they may offer one schedule alone: with fewer
        micro-batches than stages only GPipe runs), K families from the next
        groups that offer it, looking at SEED_GROUPS more groups at most;
        their K-th best (with the tie window), raised by 2 TIE_REL so those
        plans stay strictly below it and are found exactly later. The seeds
        stop at the first group whose bound is at least the K-th best seed
        so far (groups come in bound order: none after it lowers it; on GPT-3
        1.3B on 16 A100s 7 seeds instead of 11, 0.09 -> 0.05 CPU s).
        Returns that cutoff and each seeded family's least seed time."""
        if options.exhaustive or options.split:
            return math.inf, {}
        seen: dict[tuple, float] = {}
        per_schedule: Counter = Counter()
        extra, missing = 0, None
        for group_bound, (_, _, variant, pp, dp) in in_bound_order(groups, strong_group_bound):
            if len(seen) >= keep and group_bound >= _kth_best(sorted(seen.values()), keep):
                break  # every point of this group and the later ones is at least the K-th seed: none lowers it
            if len(seen) >= SEED_FAMILIES * keep:
                if missing is None:  # the schedules the first groups gave no family of
                    missing = {s for s in options.schedules if s != "roundpipe" and not per_schedule[s]}
                short = {s for s in missing if per_schedule[s] < keep}
                if not short or extra >= SEED_GROUPS:
                    break
                short = {s for s in short if offers(variant, pp, dp, s)}
                if not short:  # e.g. fewer micro-batches than stages: GPipe alone
                    continue
                extra += 1
            else:
                short = set(options.schedules)
            first: dict[tuple, tuple[float, dict]] = {}
            fewest: dict[tuple, tuple[int, dict]] = {}  # and its point of fewest micro-batches (the largest)
            for mbs, m, schedule, vp, placement, status in expand_group(variant, pp, dp, job, options, cluster):
                if status is not None or schedule not in short:  # e.g. batch_not_divisible: no micro-batch count
                    continue
                key = (variant.tp, variant.recompute, pp, dp, schedule, vp)
                bound = _lower_bound_s(work[id(variant)], pp, mbs, m, schedule, fastest,
                                       busiest_s(variant, pp, pp * vp), share[id(variant)], average(variant, pp, dp))
                row = _point_row(variant, pp, dp, mbs, m, schedule, vp, placement, None)
                if key not in first or bound < first[key][0]:
                    first[key] = (bound, row)
                if key not in fewest or m < fewest[key][0]:
                    fewest[key] = (m, row)
            rows = [(key, row) for key, (_, row) in first.items()]
            rows += [(key, row) for key, (_, row) in fewest.items() if row is not first[key][1]]
            for key, row in rows:
                inflight = _floor_in_flight(row["schedule"], pp, row["num_micro_batches"], row["vp"],
                                            in_flight_cache, variant.profile.wgrad_saved_fraction)
                if row["schedule"] != "roundpipe" and _surely_out_of_memory(memory_floor[id(variant)], row, inflight,
                                                                            capacity[variant.tp]):
                    continue
                t = _seed_time_s(variant, cluster, job, row, profiled_device, in_flight_cache, links_cache,
                                 placement_ctx, seed_work)
                if t < math.inf:
                    per_schedule[row["schedule"]] += key not in seen
                    seen[key] = min(seen.get(key, math.inf), t)
        return _kth_best(sorted(seen.values()), keep) * (1 + 2 * TIE_REL), seen

    # and per family (tp, recompute, pp, dp, schedule, vp) a time its seeds achieve
    seed_work: dict = {}  # the seeded points' costs and starting splits, for their evaluation (_seed_time_s)
    initial_cutoff, seeded = seed_cutoff()

    def cutoff() -> float:
        """Time a point must beat to enter the ranked plans (near-ties of the
        best are kept for the tie-break of rank_plans); at most the seeds'.
        Infinite with ``exhaustive``: every point's split search then runs
        to its best split (against a cutoff it stopped once no split could
        beat it, and its row held the best split met so far)."""
        if options.exhaustive:
            return math.inf
        # raised by 2 EQUAL_TIME_REL: a point that ties the K-th plan to rounding may replace it within its
        # family (keep_plan's tie rule: fewer PCIe bytes, less memory), so it is searched, not pruned
        return min(initial_cutoff, _kth_best(family_times, keep) * (1 + 2 * EQUAL_TIME_REL))

    def pruned(bound: float) -> bool:
        return not options.exhaustive and bound >= cutoff()

    unproven: list[_Open] = []  # points whose split search stopped at its limits
    no_split_fits: set = set()  # _memory_key of the points of one placement no split fits

    def keep_plan(plan: Plan, idx: int, variant, cutoff_s: float) -> None:
        """Record an evaluated point's plan in its row and its family."""
        info = dict(plan.extra).get("split_search") or {}
        if not info.get("exact", True):
            unproven.append(_Open(plan, float(info["lower_bound_s"]), idx, variant, cutoff_s))
        row = rows[idx]
        t = plan.predicted.iteration_time_s
        row.update(status="ok", iteration_time_s=t, samples_per_s=plan.predicted.samples_per_s,
                   peak_memory_bytes=plan.predicted.peak_memory_bytes,
                   bubble_fraction=plan.predicted.bubble_fraction)
        key = plan_family(plan)
        if key not in best_of_family:
            bisect.insort(family_times, t)
            best_of_family[key] = (t, plan)
            return
        held_t, held = best_of_family[key]
        tied = abs(t - held_t) <= EQUAL_TIME_REL * max(t, held_t)
        if (tie_key(plan) < tie_key(held)) if tied else (t < held_t):
            # faster, or the same time up to rounding with less memory (the ranking's tie rule inside a family)
            family_times.pop(bisect.bisect_left(family_times, held_t))
            bisect.insort(family_times, t)
            best_of_family[key] = (t, plan)

    def keep_result(plan: Plan | None, idx: int, variant, cutoff_s: float) -> None:
        """An evaluated point's plan, or its bound when its split search
        stopped before any split fit (an open point, :data:`STOPPED`);
        ``cutoff_s`` the cutoff its split search ran against."""
        if plan is not None:
            keep_plan(plan, idx, variant, cutoff_s)
        elif rows[idx]["status"] == STOPPED:
            unproven.append(_Open(None, rows[idx]["split_lower_bound_s"], idx, variant, cutoff_s))

    def second_look() -> None:
        """Search again, against the final cutoff, the points outside the
        ranked plans whose split search stopped at its limits with a bound
        below it, when the cutoff has fallen since by at least
        :data:`SECOND_LOOK_SHARE` of the gap between the cutoff they were
        searched against and their bound (in bound order): a lower incumbent
        prunes more, so such points are mostly settled (proven unable to
        enter; their row keeps its plan) or yield a faster split."""
        def final(u: _Open) -> float:  # what the point must beat now (its family's plan too)
            return point_cutoff(rows[u.idx], u.variant)

        todo = sorted((u.bound_s, k) for k, u in enumerate(unproven)
                      if u.bound_s < final(u) and u.cutoff_s - final(u) >= SECOND_LOOK_SHARE * (u.cutoff_s - u.bound_s)
                      and (u.plan is None or u.plan.predicted.iteration_time_s >= final(u)))
        again = {k for _, k in todo}  # replaced by what the second search finds (a bound at the cutoff: dropped)
        for lb, k in todo:
            old, _, idx, variant, _ = unproven[k]
            if lb >= final(unproven[k]):  # the cutoff fell below it meanwhile
                continue
            status, now = rows[idx]["status"], final(unproven[k])
            plan, _ = _evaluate(variant, cluster, job, options, rows[idx], profiled_device, in_flight_cache,
                                links_cache, placement_ctx, cutoff_s=now)
            if plan is None and rows[idx]["status"] == "pruned" and status == "ok":
                rows[idx]["status"] = "ok"  # evaluated before; now proven unable to enter the ranked plans
            t_old = math.inf if old is None else old.predicted.iteration_time_s
            if plan is not None and plan.predicted.iteration_time_s >= t_old:  # no faster split: the first stays
                info = dict(plan.extra)["split_search"]
                if not info["exact"]:
                    unproven.append(_Open(old, max(lb, float(info["lower_bound_s"])), idx, variant, now))
                continue
            keep_result(plan, idx, variant, now)
        unproven[:] = [u for k, u in enumerate(unproven) if k not in again]

    def point_cutoff(row: dict, variant) -> float:
        """:func:`cutoff`, or lower where the point's family (:func:`plan_family`)
        already holds a plan: the ranking keeps one plan per family, so a
        point of it matters only if it beats that plan (or ties it within
        ``EQUAL_TIME_REL`` with a smaller tie key, :func:`keep_plan`); and
        below the time a seeded point of the family achieves
        (:func:`seed_cutoff`, raised by ``2 TIE_REL`` as the first cutoff
        is: that point, searched against it, finds its starting split at
        least). Only for variants whose plans' family is known before the
        search (no per-stage options, which may name the recompute
        ``per-stage``)."""
        now = cutoff()
        if variant.stage_tables or variant.offload or variant.stream or options.exhaustive:
            return now
        key = (variant.tp, variant.recompute, row["pp"], row["dp"], row["schedule"], row["vp"])
        held = best_of_family.get(key)
        if held is not None:
            now = min(now, held[0] * (1 + 2 * EQUAL_TIME_REL))
        return min(now, seeded.get(key, math.inf) * (1 + 2 * TIE_REL))

    def visit(bound: float, idx: int, variant) -> None:
        """Evaluate the point of ``rows[idx]`` unless pruned (against its
        family's plan too, :func:`point_cutoff`) or surely out of memory."""
        row = rows[idx]
        now = point_cutoff(row, variant)  # at most cutoff(); infinite with exhaustive
        if bound >= now:
            row["status"] = "pruned"
            return
        inflight = _floor_in_flight(row["schedule"], row["pp"], row["num_micro_batches"], row["vp"],
                                    in_flight_cache, variant.profile.wgrad_saved_fraction)
        if job.activation_offload:  # at most ACT_HOST_RESIDENT micro-batches' activations stay on the GPU
            inflight = np.minimum(inflight, ACT_HOST_RESIDENT)
        if not options.split and row["schedule"] != "roundpipe" and _surely_out_of_memory(
                memory_floor[id(variant)], row, inflight, capacity[variant.tp]):
            row["status"] = "out_of_memory"
            return
        if row["placement"] != options.placements[0] and _same_links(
                cluster, variant, row, options.placements[0], placement_ctx, links_cache):
            row["status"] = "same_as_other_placement"
            return
        key = _memory_key(cluster, variant, row, options)
        if key in no_split_fits:  # another placement's devices, the same memory: no split fits either
            row["status"] = "out_of_memory"
            return
        plan, costs = _evaluate(variant, cluster, job, options, row, profiled_device, in_flight_cache, links_cache,
                                placement_ctx, cutoff_s=now, seed_work=seed_work.pop(_seed_key(variant, row), None))
        keep_result(plan, idx, variant, now)
        if key is not None and row["status"] == "out_of_memory" and costs is not None and costs.options is None:
            no_split_fits.add(key)  # (no stage options: no host memory, which is counted per node)

    deferred: list = []  # points of DEFERRED_SCHEDULES, evaluated after all others
    mapped: list = []  # points of the mapped placement (their order search is costly), evaluated last
    for done, (group_bound, (_, _, variant, pp, dp)) in enumerate(
            in_bound_order(groups, strong_group_bound, pruned)):
        if progress:
            progress(done, len(groups))
        if pruned(group_bound):
            counts["pruned"] += count_points(variant, pp, dp, job, options, cluster, count_cache)
            continue
        todo = []
        for mbs, m, schedule, vp, placement, status in expand_group(variant, pp, dp, job, options, cluster):
            row = _point_row(variant, pp, dp, mbs, m, schedule, vp, placement, status)
            rows.append(row)
            if status is None:
                row["lower_bound_s"] = _lower_bound_s(work[id(variant)], pp, mbs, m, schedule, fastest,
                                                      busiest_s(variant, pp, pp * vp), share[id(variant)],
                                                      average(variant, pp, dp))
                todo.append((row["lower_bound_s"], len(rows) - 1))
        todo.sort()
        for bound, idx in todo:
            if rows[idx]["placement"] == "mapped" and not options.exhaustive:
                mapped.append((bound, idx, variant))  # after every layout: against the lowest cutoff
            elif rows[idx]["schedule"] in DEFERRED_SCHEDULES and not options.exhaustive:
                deferred.append((bound, idx, variant))  # after the others: against a lower cutoff
            else:
                visit(bound, idx, variant)
    for bound, idx, variant in deferred:
        visit(bound, idx, variant)
    for bound, idx, variant in _mapped_visit_order(mapped, rows):
        visit(bound, idx, variant)
    if options.replicate_stages or options.split_replicas:
        candidates = replicated_candidates(variants, cluster, job, options, work, fastest, profiled_device)
        for n, (bound, _, variant, row) in enumerate(candidates):
            if pruned(bound):  # sorted by bound: every later point is pruned too
                counts["pruned"] += len(candidates) - n
                break
            rows.append(row)
            row["lower_bound_s"] = bound
            now = cutoff()
            plan, _ = _evaluate(variant, cluster, job, options, row, profiled_device, in_flight_cache,
                                links_cache, placement_ctx, cutoff_s=now)
            keep_result(plan, len(rows) - 1, variant, now)
    if not options.exhaustive:
        second_look()
    if progress:
        progress(len(groups), len(groups))
    counts.update(r["status"] for r in rows if r["status"] != "ok")
    if not best_of_family:
        message = _no_plan_message(counts, variants, cluster, job, options,
                                   host_full=bool(placement_ctx.get("host_overflow")))
        if "split_overflow" in placement_ctx:
            message += "; " + placement_ctx["split_overflow"][1]
        if placement_ctx.get("host_overflow"):
            message += "; " + placement_ctx["host_overflow"]
        if options.vp_pinned and 1 not in options.vps and not options.pp:
            message = (f"--vp {','.join(map(str, options.vps))} needs pp >= 2 (one pipeline rank runs all its "
                       f"stages as one, vp 1); no plan with pp >= 2 fits: {message}")
        raise InfeasibleError(message, point_columns=_point_columns(rows))
    plans = rank_plans([p for _, p in best_of_family.values()])[:keep]  # ranked (ties too), then cut
    shown = {id(p) for p in plans[: options.top]}
    # the ranked ones report their own gap; a bound at the cutoff (or at its family's plan) already excludes a point
    outside = [u.bound_s for u in unproven
               if id(u.plan) not in shown and u.bound_s < point_cutoff(rows[u.idx], u.variant)]
    plans = [replace(p, rank=r + 1) for r, p in enumerate(plans[: options.top])]
    return SearchResult(
        unproven_points=len(outside),
        unproven_bound_s=min(outside, default=math.inf),
        plans=tuple(plans),
        points_evaluated=sum(1 for r in rows if r["status"] in ("ok", "out_of_memory", STOPPED)),
        infeasible=tuple(sorted((k, v) for k, v in counts.items() if k != "pruned"))
        + ((("pruned", counts["pruned"]),) if counts.get("pruned") else ()),
        wall_s=time.perf_counter() - start,
        fingerprint=fingerprint([v.profile for v in variants], cluster, job, options,
                                *(("delayed_optimizer_step",) if job.delayed_optimizer_step else ()),
                                *(("activation_offload",) if job.activation_offload else ()),
                                *(("vp_pinned",) if options.vp_pinned else ()),
                                *(("placement_pinned",) if options.placement_pinned else ()),
                                *((f"min_dp={options.min_dp}",) if options.min_dp > 1 else ())),
        point_columns=_point_columns(rows),
    )


def _point_columns(rows: list[dict]) -> dict:
    """The points table of :attr:`SearchResult.point_columns` from the search's rows."""
    return {c: [r[c] for r in rows] for c in POINT_COLUMNS}


def replicated_candidates(variants, cluster: Cluster, job: Job, options: SearchOptions, work: dict,
                          fastest: float, profiled_device: DeviceSpec | None = None
                          ) -> list[tuple[float, int, ModelVariant, dict]]:
    """The points of per-stage replication (:mod:`pipesearch.replication`)
    as ``(lower bound, order, variant, row)``, sorted by bound: every
    variant (each replica one slot of its tp), ``2 <= pp <=
    MAX_REPLICATED_PP`` (or the pinned pp), every replica vector on the
    cluster's slots (:func:`pipesearch.replication.replica_vectors`) on
    each of its placements
    (:func:`pipesearch.replication.replicated_placements`, up to
    ``options.enumerate_layouts_up_to``) but those the uniform search visits
    as a data-parallel point (:func:`_visited_as_uniform`),
    every micro-batch size dividing the global batch (no further data
    parallelism: ``m = batch / b``), the schedules with one stage per
    device; ``options.split_replicas`` alone when given. ``work`` maps
    ``id(variant)`` to its fwd+bwd seconds per sample; the bound takes each
    stage's devices on its placement (``profiled_device`` scales them)."""
    out, covered = [], {}
    schedules = tuple(s for s in options.schedules if s not in MULTI_STAGE_SCHEDULES and vp_choices(s, 2, options))
    for variant in variants:
        L, devices, scales = variant.profile.num_layers, num_slots(cluster, variant.tp), {}
        if options.split_replicas:
            vectors = [tuple(options.split_replicas)] if sum(options.split_replicas) <= devices else []
        else:
            pps = [options.pp] if options.pp else range(2, min(MAX_REPLICATED_PP, L, devices) + 1)
            vectors = [v for pp in pps if 2 <= pp <= L for v in replica_vectors(devices, pp)]
        for reps in vectors:
            names = replicated_placements(cluster, reps, variant.tp, options.enumerate_layouts_up_to,
                                          profile_precision(variant.profile))
            for mbs in micro_batch_sizes(job.global_batch_size, options):
                m = job.global_batch_size // mbs
                for name in names:
                    if (not options.split_replicas and is_uniform_point(reps, mbs)
                            and _visited_as_uniform(cluster, variant, reps, name, options, covered)):
                        continue
                    if name not in scales:
                        scales[name] = (fastest if cluster.is_homogeneous else placement_time_scale(
                            cluster, name, variant.tp, profiled_device, profile_precision(variant.profile)))
                    for schedule in schedules:
                        if schedule_refusal(schedule, len(reps), m, 1, L) is None:
                            out.append((replicated_lower_bound_s(work[id(variant)], reps, mbs, m, schedule,
                                                                 scales[name]),
                                        len(out), variant,
                                        _point_row(variant, len(reps), 1, mbs, m, schedule, 1, name, None)))
    out.sort(key=lambda x: (x[0], x[1]))
    return out


def _visited_as_uniform(cluster: Cluster, variant: ModelVariant, reps, name: str, options: SearchOptions,
                        cache: dict) -> bool:
    """Whether the uniform search visits this placement of a uniform
    replica vector ``(r, .., r)`` as the data-parallel point ``dp = r``
    (replica ``i`` of a stage sends to replica ``i`` of the next either
    way): one of its ``(pp, r)`` layouts (:func:`placement_names`) puts
    every replica on a slot of the same node, position by position (each
    stage's slots in canonical order), up to a renaming of the nodes of one
    group (same type and links), or ``mapped`` chooses the order of a
    single pipeline (``r = 1``). ``cache`` keeps the layouts' patterns."""
    pp, r, precision = len(reps), reps[0], profile_precision(variant.profile)
    key = (variant.tp, pp, r)
    if key not in cache:
        names = placement_names(cluster, pp, r, options, variant.tp, precision)
        cache[key] = ("mapped" in names and r == 1, {
            _node_pattern(cluster, layout(cluster, pp, r, variant.tp, n, precision)) for n in names if n != "mapped"})
    every, patterns = cache[key]
    if every:
        return True
    devs = replicated_stage_devices(cluster, reps, precision, variant.tp, parse_replicas_slots(name))
    return _node_pattern(cluster, np.array(devs)) in patterns


def _node_pattern(cluster: Cluster, heads: np.ndarray) -> tuple:
    """The nodes of a ``(P, d)`` layout position by position, each group's
    nodes renamed in order of first appearance (a canonical form under
    permutations of the nodes of one group)."""
    node, group = node_ids(cluster)[heads].ravel().tolist(), group_ids(cluster)[heads].ravel().tolist()
    names: dict = {}
    seq = tuple((g, names.setdefault((g, n), sum(1 for k in names if k[0] == g))) for n, g in zip(node, group))
    return heads.shape, seq


def plan_family(plan: Plan) -> tuple:
    """The configuration a plan stands for in the ranking: (tp, recompute,
    pp, dp, schedule, vp). The ranked list holds the best plan of each family
    (its micro-batch size, placement and split chosen inside it), so the top
    plans are distinct choices rather than near-copies. A plan with
    per-stage replication adds its replica vector."""
    family = (plan.tp, dict(plan.extra).get("recompute"), plan.pp, plan.dp, plan.schedule, plan.vp)
    return family + ((plan.stage_replicas,) if plan.stage_replicas is not None else ())


def schedule_in_flight(schedule: str, pp: int, m: int, vp: int, cache: dict | None = None,
                       held_after_input: float = 1.0) -> np.ndarray:
    """Micro-batches' worth of activations each of the ``pp * vp`` stages
    holds at its own peak, read off the schedule's own action lists
    (:func:`pipesearch.schedules.simultaneous_in_flight`; with several
    stages per device each chunk's own peak, the largest count of
    :func:`schedule_chunk_states`: the device's memory is then checked at
    each of its count states). For interleaved 1F1B and ZB-H1 the counts
    stop changing once ``m >= 2 pp`` (the warm-up depth is bounded), so they
    are computed at ``min(m, 2 pp)`` (ZB-H1: ``min(m, pp)``, the same counts
    bit for bit). ZB-H1 stage ``r`` holds ``pp - r (1 - h)`` with ``h =
    held_after_input`` the share of a micro-batch's activations kept between
    its input- and weight-gradient steps (``pp`` when ``h = 1``); looped
    breadth-first keeps all ``m``; GPipe ``m``; 1F1B ``min(m, pp - s)``."""
    if schedule in ANALYTIC_SCHEDULES:
        return in_flight_micro_batches(schedule, pp, m)
    if schedule in ("looped-bfs", "mobius"):
        return np.full(pp * vp, m, dtype=np.int64)
    if schedule == "roundpipe":  # a GPU computes one micro-batch of a group at a time (pipesearch.roundpipe)
        return np.ones(pp * vp, dtype=np.int64)
    if vp > 1:  # each chunk's own peak: stage c pp + r is chunk c of rank r
        return schedule_chunk_states(schedule, pp, m, vp, cache, held_after_input).max(axis=1).T.reshape(-1)
    # ZB-H1's counts are those of m = pp once m >= pp (its warm-up is pp - r
    # forwards deep; tests/test_search.py compares them bit for bit)
    m_eff = min(m, pp) if schedule == "zb-h1" else min(m, 2 * pp)
    key = (schedule, pp, m_eff, vp, held_after_input)
    if cache is None or key not in cache:
        codes = None  # the ranks' action kinds, the same for every held share (kept with the counts)
        if cache is not None and vp == 1:
            if ("codes",) + key[:4] not in cache:
                cache[("codes",) + key[:4]] = schedule_lib.one_stage_codes(schedule, pp, m_eff, vp)
            codes = cache[("codes",) + key[:4]]
        peaks = np.array(schedule_lib.simultaneous_in_flight_of(schedule, pp, m_eff, vp, held_after_input, codes),
                         dtype=float)
        if cache is None:
            return peaks
        cache[key] = peaks
    return cache[key]


def _floor_in_flight(schedule: str, pp: int, m: int, vp: int, cache: dict | None = None,
                     held_after_input: float = 1.0) -> np.ndarray:
    """In-flight counts per stage for :func:`_surely_out_of_memory`: those
    of :func:`schedule_in_flight` with one stage per rank; with several,
    every stage gets the least over the ranks of ``max_q min_c n_qc`` (the
    count states of :func:`schedule_chunk_states`): at its state ``q`` a
    device holds at least ``min_c n_qc`` micro-batches of each chunk, so
    the devices together hold at least that many of the whole model's."""
    states = schedule_chunk_states(schedule, pp, m, vp, cache, held_after_input)
    if states is None:
        return schedule_in_flight(schedule, pp, m, vp, cache, held_after_input)
    return np.full(pp * vp, float(states.min(axis=2).max(axis=1).min()))


def schedule_chunk_states(schedule: str, pp: int, m: int, vp: int, cache: dict | None = None,
                          held_after_input: float = 1.0) -> np.ndarray | None:
    """``(pp, Q, vp)``: the count states of each rank's ``vp`` chunks
    (:func:`pipesearch.schedules.chunk_states_of`, padded with zero
    vectors), for a schedule with several stages per rank whose memory the
    split search checks device by device
    (:attr:`pipesearch.costs.PipelineCosts.chunk_states`); None for one
    stage per rank, Mobius (its own per-GPU check) and RoundPipe. Looped
    breadth-first holds all ``m`` micro-batches of every chunk after its
    forwards; interleaved 1F1B's states stop changing once ``m >= 2 pp``
    (tests/test_search_schedules.py) and are read there."""
    if vp == 1 or schedule in ("mobius", "roundpipe"):
        return None
    if schedule == "looped-bfs":
        return np.full((pp, 1, vp), float(m))
    key = ("chunk-states", schedule, pp, min(m, 2 * pp), vp, held_after_input)
    if cache is not None and key in cache:
        return cache[key]
    states = schedule_lib.chunk_states_of(schedule, pp, min(m, 2 * pp), vp, held_after_input)
    out = np.zeros((pp, max(len(x) for x in states), vp))
    for r, xs in enumerate(states):
        out[r, :len(xs)] = xs
    out.flags.writeable = False
    if cache is not None:
        cache[key] = out
    return out


def analytic_time_s(schedule: str, costs: PipelineCosts, bounds, pp: int, vp: int) -> float:
    """The textbook closed form of a split's iteration time, reported beside
    the simulated time as a labelled secondary number (never used to rank).

    GPipe, 1F1B: ``sum a_k + max_k ((m-1) a_k + allreduce_k)`` with ``a_k``
    a stage's compute and both transfers (Narayanan et al. SC'21 sec. 2.2).
    Interleaved 1F1B and looped breadth-first, with device time per
    micro-batch ``tau_r``: ``(m + (pp-1)/vp) * max_r tau_r + max_r
    allreduce_r`` (SC'21 sec. 2.2.2); looped breadth-first with fewer
    micro-batches than ranks waits for the pipeline to fill at every
    chunk, ``((vp-1) max(m, pp) + m + pp - 1) / vp`` in place of ``m +
    (pp-1)/vp``. ZB-H1: the 1F1B form less ``(pp-1) min_k (W_k + min(I_k,
    W_k))``: 1F1B's bubble is ``(pp-1)(F+I+W)`` and ZB-H1's ``(pp-1)(F+I-W)``
    with ``I`` the input-gradient and ``W`` the weight-gradient part (Qi et
    al. 2023, sec. 3.1, bubble ``(p-1)(T_F + T_B - T_W)``), ``(pp-1) F``
    when ``W > I`` (the last rank still waits ``(p-1) F`` to start).
    """
    m = costs.num_micro_batches
    if schedule in ANALYTIC_SCHEDULES:
        return costs.iteration_time_s(bounds)
    S = costs.pp
    st, i, j = np.arange(S), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    a = costs.sum_term(st, i, j)
    ar = costs.after_backward_s(st, i, j)
    if schedule == "zb-h1":
        bin_ = costs.bwd_input_s(st, i, j)
        w = costs.bwd_s(st, i, j) - bin_
        return costs.iteration_time_s(bounds) - (pp - 1) * float((w + np.minimum(w, bin_)).min())
    tau = np.bincount(np.arange(S) % pp, weights=a, minlength=pp)
    ar_dev = np.bincount(np.arange(S) % pp, weights=ar, minlength=pp)
    steps = ((vp - 1) * max(m, pp) + m + pp - 1) / vp if schedule == "looped-bfs" else m + (pp - 1) / vp
    return float(steps * tau.max() + ar_dev.max())


def _kth_best(times: list[float], keep: int) -> float:
    """The time a point must beat to enter the ``keep`` best of the sorted
    family ``times``, near-ties of the best kept (:data:`TIE_REL`); inf while
    fewer than ``keep`` are known."""
    if len(times) < keep:
        return math.inf
    return max(times[keep - 1], times[0] * (1 + TIE_REL))


def _point_row(variant, pp: int, dp: int, mbs: int, m: int, schedule: str, vp: int, placement, status) -> dict:
    """One row of the points table, before evaluation (times unknown)."""
    return dict(tp=variant.tp, recompute=variant.recompute, pp=pp, dp=dp, schedule=schedule, vp=vp,
                micro_batch_size=mbs, num_micro_batches=m, placement=placement, status=status,
                iteration_time_s=np.nan, samples_per_s=np.nan, peak_memory_bytes=np.nan,
                bubble_fraction=np.nan, lower_bound_s=np.nan)


def _point_costs(variant, cluster, job, row, profiled_device, in_flight_cache, links_cache, placement_ctx):
    """``(slots, costs)`` of one search point (its placement's devices per
    stage and its :class:`pipesearch.costs.PipelineCosts`), or ``(None,
    None)`` when a mapped placement has no device order that fits."""
    pp, dp, mbs, m = row["pp"], row["dp"], row["micro_batch_size"], row["num_micro_batches"]
    schedule, vp = row["schedule"], row["vp"]
    replicas = parse_replicas_name(row["placement"])
    if replicas is not None:  # per-stage replication (pipesearch.replication)
        return replicated_costs(variant.profile, cluster, job, replicas, micro_batch_size=mbs, num_micro_batches=m,
                                schedule=schedule if schedule in ANALYTIC_SCHEDULES else "gpipe",
                                in_flight=schedule_in_flight(schedule, pp, m, 1, in_flight_cache,
                                                             variant.profile.wgrad_saved_fraction),
                                profiled_device=profiled_device, cache=links_cache, tp=variant.tp,
                                slots=parse_replicas_slots(row["placement"]))
    slots, links = _slots_and_links(cluster, variant, row, row["placement"], placement_ctx,
                                    {} if links_cache is None else links_cache)
    if slots is None:
        return None, None
    costs = build_pipeline_costs(
        variant.profile, cluster, job, pp=pp * vp, dp=dp, micro_batch_size=mbs, num_micro_batches=m,
        schedule=schedule if schedule in ANALYTIC_SCHEDULES else "gpipe", placement=slots,
        profiled_device=profiled_device, in_flight=schedule_in_flight(schedule, pp, m, vp, in_flight_cache,
                                                                      variant.profile.wgrad_saved_fraction),
        stages_per_device=vp, links=links, wgrad_window=schedule == "zb-h1", tp=variant.tp,
        chunk_states=schedule_chunk_states(schedule, pp, m, vp, in_flight_cache, variant.profile.wgrad_saved_fraction),
        optimizer_offload=variant.offload, option_profiles=variant.stage_tables or None,
        weight_streaming=variant.stream, weight_swapping=schedule == "mobius",
    )
    return slots, costs


def _seed_time_s(variant, cluster, job, row, profiled_device, in_flight_cache, links_cache, placement_ctx,
                 seed_work: dict | None = None) -> float:
    """An achievable simulated time of one point: its best starting split
    (:func:`pipesearch.split_search.exact_split` with ``seeds_only``), or
    inf when none fits. ``seed_work``: where the point's slots, costs and
    split cache are kept under :func:`_seed_key` for its
    :func:`_evaluate` (not for mapped or replicated placements, whose costs
    depend on the search's state)."""
    if row["schedule"] == "roundpipe":  # no cheap start: its split search runs in _evaluate
        return math.inf
    slots, costs = _point_costs(variant, cluster, job, row, profiled_device, in_flight_cache, links_cache,
                                placement_ctx)
    cache: dict = {}
    found = None if costs is None else exact_split(costs, row["schedule"], row["pp"], row["vp"], seeds_only=True,
                                                   cache=cache)
    key = _seed_key(variant, row)
    if seed_work is not None and costs is not None and key is not None:
        seed_work[key] = (slots, costs, cache)
    return math.inf if found is None else found.iteration_time_s


def _seed_key(variant, row) -> tuple | None:
    """The key of a point's kept seed work (:func:`_seed_time_s`), None for
    a mapped or replicated placement."""
    if row["placement"] == "mapped" or parse_replicas_name(row["placement"]) is not None:
        return None
    return (id(variant), row["pp"], row["dp"], row["micro_batch_size"], row["num_micro_batches"], row["schedule"],
            row["vp"], row["placement"])


def _evaluate(variant, cluster, job, options, row, profiled_device, in_flight_cache=None, links_cache=None,
              placement_ctx=None, cutoff_s: float = math.inf, seed_work: tuple | None = None):
    pp, dp, mbs, m = row["pp"], row["dp"], row["micro_batch_size"], row["num_micro_batches"]
    schedule, vp = row["schedule"], row["vp"]
    stages = pp * vp
    if placement_ctx is None:
        placement_ctx = {"job": job, "profiled_device": profiled_device}
    placement_ctx["cutoff_s"] = cutoff_s  # a mapped placement's order search starts from it
    if schedule == "roundpipe":  # its own costs and split: pipesearch.roundpipe
        slots, _ = _slots_and_links(cluster, variant, row, row["placement"], placement_ctx,
                                    {} if links_cache is None else links_cache)
        return roundpipe_plan_point(variant, cluster, job, row, np.asarray(slots)[:pp, 0], profiled_device, cutoff_s,
                                    options.exhaustive, options.split, placement_ctx), None
    if row["placement"] == "mapped":  # its order search first (cached)
        placement_array(cluster, variant, row, placement_ctx)
        if _mapped_above(variant, row, placement_ctx, cutoff_s):  # proven: no order beats the cutoff
            row["status"] = "pruned"
            _raise_bound(row, placement_ctx[_mapped_key(variant, row)][1]["best_bound_s"])
            return None, None
    slots, costs, split_cache = seed_work or (
        *_point_costs(variant, cluster, job, row, profiled_device, in_flight_cache, links_cache, placement_ctx), None)
    if slots is None:  # a mapped placement with no order that fits
        row["status"] = "out_of_memory"
        return None, None
    if options.split:
        bounds = tuple(int(x) for x in np.concatenate([[0], np.cumsum(options.split)]))
        if len(options.split) == stages:  # the stages' chains of options for this split (option_search)
            costs = best_policies_for_split(costs, bounds, schedule, pp, vp)
        if len(options.split) != stages or not costs.split_fits(bounds):
            row["status"] = "out_of_memory" if len(options.split) == stages else "split_mismatch"
            if len(options.split) == stages:
                _note_split_overflow(placement_ctx, costs, bounds, row)
            return None, costs
        t = iteration_time_s(schedule, pp, m, vp, costs.stage_times(bounds))
        split_info = {"exact": True, "lower_bound_s": t, "gap": 0.0, "splits_evaluated": 1, "pinned": True}
    else:
        found, costs = exact_split_over_policies(costs, schedule, pp, vp, cutoff_s=cutoff_s,
                                                 value_above_cutoff=options.exhaustive, cache=split_cache)
        if found is None:
            row["status"] = "out_of_memory"
            checks = placement_ctx.get("host_checks", 0)  # host memory the reason? (option_search.host_overflow_note)
            if not placement_ctx.get("host_overflow") and checks < 8:
                placement_ctx["host_checks"] = checks + 1
                placement_ctx["host_overflow"] = host_overflow_note(costs, schedule, pp, vp)
            return None, costs
        if found.exact and found.best_time_s >= cutoff_s and not options.exhaustive:
            row["status"] = "pruned"  # proven unable to enter the ranked plans
            _raise_bound(row, found.lower_bound_s)
            return None, costs
        if not np.isfinite(found.best_time_s):  # stopped at its work limits before any split fit (every GPU)
            row["status"] = STOPPED
            row["split_lower_bound_s"] = found.lower_bound_s
            return None, costs
        bounds, t = found.bounds, found.iteration_time_s
        split_info = {"exact": found.exact, "lower_bound_s": found.lower_bound_s, "gap": found.gap,
                      "splits_evaluated": found.splits_evaluated}
    # equal times: state kept on the GPU; Mobius' stages held to their activation choice
    tied = pin_mobius_activations(prefer_device_state(costs, bounds, job, dp, variant.tp), bounds)
    if tied is not costs:
        costs, t = tied, float(iteration_time_s(schedule, pp, m, vp, tied.stage_times(np.asarray(bounds))))
    analytic = analytic_time_s(schedule, costs, bounds, pp, vp)
    stage_plans = _stage_plans(variant, costs, bounds, slots, cluster, job,
                               replicated=parse_replicas_name(row["placement"]) is not None)
    mapping_info = ()
    if row["placement"] == "mapped":
        mapping_info = (("mapping", placement_ctx[_mapped_key(variant, row)][1]),)
    recompute = variant.recompute
    if recompute == "none" and costs.options is not None and any(
            n.split("+")[0] in ("full", "selective") for n in costs.options.names):
        recompute = "per-stage"  # the stages chose (StagePlan.memory_option)
    extra = (("placement", row["placement"]), ("recompute", recompute)) + variant.extra + mapping_info + (
        ("split_search", split_info), ("simulated", True), ("analytic_iteration_time_s", analytic)) + (
        host_plan_info(costs, bounds, job, dp, variant.tp))
    plan = Plan(
        rank=0, pp=pp, dp=dp, tp=variant.tp, vp=vp, schedule=schedule, micro_batch_size=mbs,
        num_micro_batches=m, stages=stage_plans,
        predicted=_prediction(costs, stage_plans, t, job.global_batch_size, cluster, pp, schedule,
                              variant.profile, variant.tp),
        extra=extra,
    )
    return plan, costs


class _Open(NamedTuple):
    """A point whose split search stopped at its work limits: its plan (None
    when no split fit before it stopped), proven lower bound (s), row index,
    model variant and the cutoff it was searched against (s)."""

    plan: Plan | None
    bound_s: float
    idx: int
    variant: object
    cutoff_s: float


#: the share of a stopped point's gap (the cutoff it was searched against
#: less its proven bound) the cutoff must have fallen by before the point is
#: searched again against the final cutoff (a ratio; a smaller fall rarely
#: settles it: the default plan's six stopped interleaved points, searched
#: again after a fall of 21% of their gap, all stopped again)
SECOND_LOOK_SHARE = 0.5

#: a point's status when its split search stopped at its work limits before
#: it met a split that fits every GPU (Mobius' whole-GPU check): neither a
#: plan nor proven out of memory; counted with the unproven points
STOPPED = "stopped_at_work_limits"

#: schedules whose points are evaluated after every other point (in the same
#: order among themselves): those whose split search needs the chain
#: families (split_search.CHAIN_SCHEDULES; interleaved 1F1B's bounds are the
#: weakest), the dearest to search, so a cutoff lowered by the other
#: schedules' plans first excludes more of them. The ranked plans do not
#: depend on the order: every point that can enter them is searched exactly
#: against a cutoff that only falls, and the points of one family keep
#: their order (the first of equal times stays its best)
DEFERRED_SCHEDULES = CHAIN_SCHEDULES

TIE_REL = 1e-3
"""Plans within this relative time of the best are ranked by tie-breaks."""

SEED_FAMILIES = 2
"""The search's first cutoff comes from the starting splits of this many
times ``top`` families (``search.seed_cutoff``)."""

SEED_GROUPS = 32
"""Groups the first cutoff looks at beyond those, for the schedules the
first ones gave no family of (a count, ``search.seed_cutoff``)."""


def rank_plans(plans: list[Plan]) -> list[Plan]:
    """Order plans by simulated iteration time; among those within
    :data:`TIE_REL` of the best, prefer fewer bytes over PCIe per iteration
    (state kept on the GPU: ``options.host.total_pcie_bytes_per_iteration``,
    0 without host options), then lower peak memory, then less time on
    links, then fewer stages (the rest follow by time); plans equal in all
    of those in a fixed order (:func:`_plan_key`), whatever order they
    come in."""
    plans = sorted(plans, key=lambda p: (p.predicted.iteration_time_s,) + _plan_key(p))
    if not plans:
        return plans
    best = plans[0].predicted.iteration_time_s
    near = [p for p in plans if p.predicted.iteration_time_s <= best * (1 + TIE_REL)]
    rest = plans[len(near):]
    near.sort(key=lambda p: tie_key(p) + (p.predicted.iteration_time_s,) + _plan_key(p))
    return near + rest


def _plan_key(plan: Plan) -> tuple:
    """What orders plans equal in every ranked respect, so that the order
    never follows the order they were found in (the search's and
    ``--exhaustive``'s differ): degrees, schedule, micro-batches, split,
    placement, recompute."""
    extra = dict(plan.extra or ())
    return (plan.pp, plan.dp, plan.tp, plan.vp, plan.schedule, plan.micro_batch_size, plan.num_micro_batches,
            tuple(plan.layers_per_stage), str(extra.get("placement", "")), str(extra.get("recompute", "")),
            tuple(st.memory_option for st in plan.stages))


def tie_key(plan: Plan) -> tuple:
    """What breaks a tie of time (:func:`rank_plans`): bytes over PCIe per
    iteration, peak memory, time on links, stages; smaller first."""
    return (round(_pcie_bytes(plan), 0), round(plan.predicted.peak_memory_bytes, 0),
            sum(st.comm_s for st in plan.stages), plan.pp * plan.vp)


def _pcie_bytes(plan: Plan) -> float:
    """Bytes ``plan`` moves over PCIe per iteration (its ``host`` option, 0 without)."""
    return float(dict(plan.extra or ()).get("host", {}).get("total_pcie_bytes_per_iteration", 0.0))


def _check_options(variants, cluster, job, options):
    if job.global_batch_size < 1:
        raise InputError(f"global batch size {job.global_batch_size} must be >= 1")
    L = variants[0].profile.num_layers
    for variant in variants:
        if not variant.profile.takes_time:
            raise InputError(f"model {variant.profile.name!r}: {variant.profile.NO_TIME}")
    if options.split is not None:
        reps = options.split_replicas
        text = ",".join(f"{x}x{r}" for x, r in zip(options.split, reps)) if reps else ",".join(map(str, options.split))
        if any(x < 1 for x in options.split):
            raise InputError(f"--split {text}: every stage needs >= 1 layer")
        if sum(options.split) != L:
            raise InputError(
                f"--split {text} covers {sum(options.split)} layers, the model has {L}: the counts must sum to {L}")
        n = len(options.split)
        chunked = any(sch in MULTI_STAGE_SCHEDULES for sch in options.schedules) and options.pp and any(
            n == options.pp * v for v in options.vps)
        if options.pp and options.pp != n and not chunked:
            raise InputError(f"--split has {n} stages but --pp is {options.pp} (a split of pp x vp stages needs a "
                             f"multi-stage --schedule and --vp {n // options.pp if n % options.pp == 0 else 'V'})")
    if options.pp is not None:
        if options.pp < 1:
            raise InputError(f"--pp {options.pp} must be >= 1")
        if options.pp > L:
            raise InputError(
                f"--pp {options.pp}: more stages than the model's {L} layer{'s' if L != 1 else ''}; use --pp {L} or fewer")
        if options.vp_pinned and all(options.pp * v > L for v in options.vps):
            v, most = min(options.vps), L // options.pp
            fix = (f"use --vp {most} or lower, or a lower --pp" if most > 1 else
                   f"use --pp {L // v} or lower for --vp {v}" if L // v >= 1 else "use a lower --vp and --pp")
            raise InputError(f"--pp {options.pp} x --vp {v} = {options.pp * v} stages, more than the model's {L} "
                             f"layer{'s' if L != 1 else ''} (each stage holds one); {fix}")
    for name in ("dp", "micro_batch_size", "num_micro_batches"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} {value} must be >= 1")
    tp_min = min(v.tp for v in variants)
    groups = num_slots(cluster, tp_min)  # tensor-parallel groups inside nodes
    # a --split of S stages pins pp = S (vp 1): name the flag the user gave, and its fix
    by_split = bool(options.split) and len(options.split) == options.pp
    pins = ((f"--split of {options.pp} stages (pp {options.pp})", "fewer stages", options.pp) if by_split else
            (f"--pp {options.pp}", "lower --pp", options.pp), (f"--dp {options.dp}", "lower --dp", options.dp))
    # Mobius and RoundPipe run more stages than GPUs as pp x vp, pp the GPUs
    stacked = next((sch for sch in options.schedules if sch in ("mobius", "roundpipe")), None)
    for shown, fix, value in pins:
        if value and value * tp_min > cluster.num_devices:
            gpus = cluster.num_devices // tp_min
            more = (f" ({stacked} runs pp x vp stages on pp GPUs: --pp {gpus} or fewer, and --vp for more stages)"
                    if stacked and shown.startswith("--pp") and gpus >= 1 else "")
            raise InputError(f"{shown}{f' x --tp {tp_min}' if tp_min > 1 else ''} needs {value * tp_min} devices, "
                             f"cluster {cluster.name} has {cluster.num_devices}{more}")
        if value and value > groups:
            raise InputError(f"{shown} needs {value} groups of tp {tp_min} devices inside one node, "
                             f"cluster {cluster.name} holds {groups}; {fix} or --tp")
    if tp_min > cluster.num_devices:
        raise InputError(f"--tp {tp_min} needs {tp_min} devices, cluster {cluster.name} has {cluster.num_devices}")
    if groups == 0:
        widest = max(g.devices_per_node for g in cluster.groups)
        raise InputError(f"--tp {tp_min}: a tensor-parallel group stays inside one node, and the nodes of "
                         f"{cluster.name} hold at most {widest} devices; use --tp {widest} or lower")
    if options.num_micro_batches and options.num_micro_batches > job.global_batch_size:
        raise InputError(f"--num-micro-batches {options.num_micro_batches} is more than the global batch "
                         f"{job.global_batch_size}: every micro-batch needs at least one sample")
    if options.pp and options.dp and options.pp * options.dp * tp_min > cluster.num_devices:
        tp_part = f" x --tp {tp_min}" if tp_min > 1 else ""
        pp_part = f"--split of {options.pp} stages" if by_split else f"--pp {options.pp}"
        raise InputError(
            f"{pp_part} x --dp {options.dp}{tp_part} needs {options.pp * options.dp * tp_min} devices, "
            f"cluster {cluster.name} has {cluster.num_devices}")
    b = job.global_batch_size
    if options.dp and b % options.dp:
        raise InputError(f"global batch size {b} is not divisible by --dp {options.dp}; use a --global-batch-size "
                         f"that --dp divides (e.g. {_multiple(b, options.dp)})")
    per = b // options.dp if options.dp else None
    for flag, value in (("--micro-batch-size", options.micro_batch_size), ("--num-micro-batches",
                                                                            options.num_micro_batches)):
        if per and value and per % value:
            raise InputError(f"per-replica batch {per} (--global-batch-size {b} / --dp {options.dp}) is not divisible "
                             f"by {flag} {value}; use a {flag} that divides {per} or a --global-batch-size of "
                             f"{_multiple(b, options.dp * value)}")
    if options.micro_batch_size and b % options.micro_batch_size:
        raise InputError(f"global batch size {b} is not divisible by --micro-batch-size {options.micro_batch_size}; "
                         f"use a --global-batch-size of {_multiple(b, options.micro_batch_size)}")
    unknown = [s for s in options.schedules if s not in ALL_SCHEDULES]
    if unknown:
        raise InputError(f"unknown schedule {unknown[0]!r}; expected one of {', '.join(ALL_SCHEDULES)}")
    if any(v < 1 for v in options.vps):
        raise InputError(f"--vp {min(options.vps)} must be >= 1")
    if options.pp == 1 and options.schedules and set(options.schedules) == {"interleaved-1f1b"}:
        raise InputError("--pp 1 with --schedule interleaved-1f1b: virtual stages interleave over at least 2 "
                         "pipeline ranks (one rank runs its stages as one); use --pp 2 or more, or --schedule 1f1b")
    if options.split is not None and any(s in MULTI_STAGE_SCHEDULES for s in options.schedules) and not (
            options.pp and any(len(options.split) == options.pp * v for v in options.vps)):
        n = len(options.split)
        if options.split_replicas:  # per-stage replicas run one stage per device
            raise InputError(f"--split with replicas (NxR) and --schedule "
                             f"{next(s for s in options.schedules if s in MULTI_STAGE_SCHEDULES)}: per-stage "
                             "replication runs one stage per device; choose --schedule gpipe, 1f1b or zb-h1")
        here = ", ".join(f"pp {options.pp} x vp {v} = {options.pp * v}" for v in options.vps) if options.pp else ""
        example = f"e.g. --pp {n // 2} --vp 2" if n % 2 == 0 and n >= 4 else ""
        hint = "; ".join(x for x in (f"here {here}" if here else "", example) if x)
        raise InputError(f"--split of {n} stages with a multi-stage schedule needs --pp and --vp with pp x vp = "
                         f"{n}{f' ({hint})' if hint else ''}, or --schedule gpipe, 1f1b or zb-h1"
                         + (" without --vp" if options.vp_pinned and 1 not in options.vps else ""))
    if options.replicate_stages or options.split_replicas:
        _check_replication_options(variants, cluster, job, options)


def _check_replication_options(variants, cluster: Cluster, job: Job, options: SearchOptions) -> None:
    """Refuse pins per-stage replication cannot honour: a pinned dp above 1,
    a sharded state, a replicated split whose replicas (tensor-parallel groups
    of the smallest tp) exceed the cluster's or do not match its stages."""
    what = (split_text(options.split or (), options.split_replicas)
            if options.split_replicas else "--replicate-stages")
    if options.dp is not None and options.dp != 1:  # 1: a replicated plan's own (its replicas split each batch)
        raise InputError(f"{what} with dp pinned to {options.dp} (--dp, or --micro-batch-size x "
                         "--num-micro-batches): per-stage replicas replace the data-parallel degree; drop the pin")
    if options.placement_pinned:  # the replicated plans would ignore it (their layout follows their replicas)
        raise InputError(f"{what} with --placement {options.placements[0]}: each replicated stage runs on its own "
                         f"replicas, placed stage after stage, so no pipeline- or data-major layout applies; drop "
                         f"--placement or {what}")
    check_replication_job(job, what)
    if options.vp_pinned and 1 not in options.vps:
        raise InputError(f"{what} with --vp {','.join(map(str, options.vps))}: replicated stages run one stage per "
                         f"device (vp 1); drop --vp or {what}")
    multi = [sch for sch in options.schedules if sch in MULTI_STAGE_SCHEDULES]
    if multi and len(multi) == len(options.schedules):
        raise InputError(f"{what}: replicated stages run one stage per device (gpipe, 1f1b or zb-h1), and "
                         f"--schedule asks for {', '.join(multi)} only; add one of those")
    if options.split_replicas:
        if options.split is None or len(options.split) != len(options.split_replicas):
            raise InputError(f"{what}: give replicas for every stage")
        tp = min(v.tp for v in variants)
        if sum(options.split_replicas) > num_slots(cluster, tp):
            raise InputError(f"{what} needs {sum(options.split_replicas) * tp} devices (the sum of the replicas"
                             f"{'' if tp == 1 else f' x tp {tp}'}, one node per tensor-parallel group), cluster "
                             f"{cluster.name} has {num_slots(cluster, tp) * tp} such; lower the replicas")


def _note_split_overflow(ctx: dict, costs: PipelineCosts, bounds, row: dict) -> None:
    """Keep in ``ctx["split_overflow"]`` the --split point closest to fitting
    in memory, as (overflow ratio, text naming its fullest stage)."""
    s, i, j = np.arange(costs.pp), np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    if costs.options is not None and costs.options.swap_queue is not None:
        _note_mobius_gpu_overflow(ctx, costs, bounds, row)
        return
    need = costs.least_memory_bytes(s, i, j)
    ratio = need / costs.capacity_bytes
    k = int(np.argmax(ratio))
    if costs.chunk_states is not None and ratio[k] <= 1:  # each stage fits alone: a device holding several does not
        _note_device_overflow(ctx, costs, bounds, row)
        return
    if "split_overflow" in ctx and ctx["split_overflow"][0] <= ratio[k]:
        return
    tied = float(costs.tied_copy_bytes[k]) if costs.tied_copy_bytes is not None else 0.0
    ctx["split_overflow"] = (float(ratio[k]), (
        f"closest: --split stage {k} (layers {int(i[k])}..{int(j[k]) - 1}) needs {need[k] / 2**30:.1f} GiB per "
        f"device against {costs.capacity_bytes[k] / 2**30:.1f} GiB usable"
        + (f" (after its tied embedding copy's {tied / 2**30:.1f} GiB)" if tied > 0 else "")
        + f", at pp {row['pp']} x dp {row['dp']}, "
        f"micro-batch size {row['micro_batch_size']}, {row['schedule']}; move layers off stage {k} or "
        + ("change the micro-batch size (with replicas a device keeps ceil(b / r) samples of each of its in-flight "
           "micro-batches)" if parse_replicas_name(row.get("placement")) else "lower the micro-batch size")))


def _note_device_overflow(ctx: dict, costs: PipelineCosts, bounds, row: dict) -> None:
    """:func:`_note_split_overflow` of a --split whose stages each fit
    alone but some device, holding several of them, does not at its peak
    (:meth:`PipelineCosts.device_memory_bytes`): that device, its stages
    and both figures."""
    need = costs.device_memory_bytes(np.asarray(bounds))
    R = len(need)
    ratio = need / costs.capacity_bytes[:R]
    r = int(np.argmax(ratio))
    if "split_overflow" in ctx and ctx["split_overflow"][0] <= ratio[r]:
        return
    stages = ", ".join(str(k) for k in range(r, costs.pp, R))
    ctx["split_overflow"] = (float(ratio[r]), (
        f"closest: --split: pipeline rank {r} holds stages {stages}, {need[r] / 2**30:.1f} GiB at its peak "
        f"(training state of its stages and the activations they hold at once) against "
        f"{costs.capacity_bytes[r] / 2**30:.1f} GiB usable, at pp {row['pp']} x dp {row['dp']}, micro-batch size "
        f"{row['micro_batch_size']}, {row['schedule']}; move layers off those stages or lower the micro-batch size"))


def _note_mobius_gpu_overflow(ctx: dict, costs: PipelineCosts, bounds, row: dict) -> None:
    """:func:`_note_split_overflow` of a Mobius --split: what refuses it,
    the host memory of a node (every stage keeping its activations on the
    GPU, the least host bytes: :meth:`PipelineCosts.mobius_node_host_bytes`)
    or else a GPU's peak over its usable memory
    (:meth:`PipelineCosts.mobius_device_peak_bytes`, every stage that can
    keeping its activations in host memory: the least peak), or, when each
    fits alone, the host memory under that least peak; the fixes named are
    the ones that can change the figure."""
    o = costs.options
    bounds = np.asarray(bounds)
    least = keep = costs
    if o.swap_act_copy_prefix_s is not None:
        every = np.stack([np.zeros(costs.pp, bool), np.ones(costs.pp, bool)])  # swap+act-host on every stage
        least = replace(costs, options=replace(o, allowed=every))
        keep = replace(costs, options=replace(o, allowed=~every))
    gib = 2.0 ** 30
    where = f"at pp {row['pp']} x dp {row['dp']}, micro-batch size {row['micro_batch_size']}, mobius"
    host, cap = keep.mobius_node_host_bytes(bounds), o.node_host_memory_bytes
    peaks, caps = least.mobius_device_peak_bytes(bounds), costs.mobius_gpu_capacity_bytes()
    if np.all(host <= cap) and np.all(peaks <= caps):  # each fits alone: the GPUs fit only with more on the host
        host = least.mobius_node_host_bytes(bounds)
    if np.any(host > cap):
        n = int(np.argmax(host / cap))
        ratio = float(host[n] / cap[n])
        acts = " and offloaded activations" if np.any(host != keep.mobius_node_host_bytes(bounds)) else ""
        need, have = format_gib_pair(host[n], cap[n])
        text = (f"closest: --split needs {need} of host memory on node {n} (its GPUs' stages' "
                f"16-bit weights and optimizer state{acts}) against its {have}, {where}; use a "
                "host with more memory ([host] memory_GB)" + (" or fewer micro-batches in flight" if acts else ""))
    else:
        r = int(np.argmax(peaks / caps))
        ratio = float(peaks[r] / caps[r])
        mine = ",".join(str(x) for x in range(r, costs.pp, len(peaks)))
        fixes = ["move layers off its stages"] + (["lower the micro-batch size"] if row["micro_batch_size"] > 1
                                                    else []) + (["add --activation-offload"]
                                                                if o.swap_act_copy_prefix_s is None else [])
        text = (f"closest: --split GPU {r} (stages {mine}) needs {peaks[r] / gib:.1f} GiB at its peak (its stages' "
                f"activations and fixed bytes, two stays' weights and gradients) against {caps[r] / gib:.1f} GiB "
                f"usable, {where}; " + ", ".join(fixes[:-1]) + (" or " if len(fixes) > 1 else "") + fixes[-1])
    if "split_overflow" in ctx and ctx["split_overflow"][0] <= ratio:
        return
    ctx["split_overflow"] = (ratio, text)


def _micro_batch_size_can_drop(options) -> bool:
    """Whether a smaller micro-batch is a fix the search has not tried: a
    pinned size above 1 or a pinned micro-batch count (unpinned, every
    divisor down to 1 was searched: :func:`micro_batch_sizes`)."""
    return bool(options.num_micro_batches) or (options.micro_batch_size or 1) > 1


def _either(fixes: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + " or " + fixes[-1]


#: host-memory flags each host schedule refuses, searched alone (it keeps that state on the host already)
_HOST_SCHEDULE_REFUSES = {"roundpipe": {"--optimizer-offload", "--activation-offload", "--stream-weights"},
                          "mobius": {"--optimizer-offload", "--stream-weights"}}


def _host_flags(job: Job, schedules=()) -> str:
    """The flags that keep state in host memory the job does not use yet and
    may add (activations on the host and streamed weights exclude each
    other; a host schedule searched alone refuses those it covers,
    :data:`_HOST_SCHEDULE_REFUSES`), as a hint ("add --optimizer-offload
    or --activation-offload"), or ""."""
    refused = _HOST_SCHEDULE_REFUSES.get(schedules[0], set()) if len(schedules) == 1 else set()
    unused = [flag for flag, on in (("--optimizer-offload", job.optimizer_offload),
                                    ("--activation-offload", job.activation_offload or job.weight_streaming),
                                    ("--stream-weights", job.weight_streaming or job.activation_offload))
              if not on and flag not in refused]
    return "add " + " or ".join(unused) + " (this cluster has host memory)" if unused and len(unused) == 3 else (
        "add " + " or ".join(unused) if unused else "")


def _pp_can_rise(options, cluster: Cluster, num_layers: int, tp: int) -> bool:
    """Whether a pipeline longer than the pinned ``--pp`` has room: fewer
    stages than layers and devices for one more stage of ``tp`` per replica."""
    return options.pp < num_layers and (options.pp + 1) * (options.dp or 1) * tp <= cluster.num_devices


def _multiple(n: int, k: int) -> int:
    """The multiple of ``k`` nearest ``n`` from above (a batch size that
    ``k`` divides, for a refusal's fix)."""
    return -(-n // k) * k


def _no_plan_message(counts: Counter, variants, cluster: Cluster, job: Job, options=None,
                     host_full: bool = False) -> str:
    """The no-plan line: the counts by reason and the likely fix (``host_full``:
    the host memory is what the offloading plans overflowed, so no flag that
    keeps more there is suggested)."""
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no points"
    prof = variants[0].profile
    params = sum(lay.param_bytes for lay in prof.layers) / prof.bytes_per_param
    state = params * (0.0 if job.weight_streaming else  # streamed: the state lives on the host
                      offload_bytes_per_param(param_state_of(job), cluster.num_devices)[0] if job.optimizer_offload
                      else param_state_of(job).floor_bytes_per_param())
    mem = usable_memory_bytes(job, float(memory_bytes_of(cluster).max()))
    on_host = options is not None and set(options.schedules) <= {"mobius", "roundpipe"}  # the state lives on the host
    host_flags = (_host_flags(job, options.schedules)
                  if options is not None and cluster.host is not None and not host_full else "")
    offload = ("" if cluster.host is None or job.weight_streaming else
               "add --optimizer-offload (this cluster has host memory), or " if not job.optimizer_offload else
               "add --stream-weights (weights and gradients on the host, streamed layer by layer), or ")
    kept = ("weights and gradients (the optimizer state offloaded)" if job.optimizer_offload else
            "weights and optimizer state")
    need, usable = format_gib_pair(state, mem * cluster.num_devices)
    hint = (f"the model's {kept} alone need {need} against {usable} usable on all "
            f"{cluster.num_devices} devices ({mem / 2**30:.1f} GiB each); {offload}"
            "use a cluster with more or larger devices" if state > mem * cluster.num_devices and not on_host else
            "the schedules asked for refused every point (1F1B and its variants need at least pp "
            "micro-batches, interleaved 1F1B a multiple of pp; pp x vp stages need a layer each): lower --pp "
            "or --vp, raise --num-micro-batches "
            "(or lower --micro-batch-size), or "
            + ("drop --vp" if options is not None and options.vp_pinned else "add --schedule gpipe")
            if (counts.get("schedule_refused") or counts.get("too_many_stages")) and not counts.get("out_of_memory")
            else
            _either(["lower --micro-batch-size"] * _micro_batch_size_can_drop(options)
                    + [f"raise --pp (pinned to {options.pp})"] * bool(options.pp and not options.split and _pp_can_rise(
                        options, cluster, prof.num_layers, min(v.tp for v in variants)))
                    + [host_flags] * bool(host_flags)
                    + ["drop --split (or pin smaller stages)"] * bool(options.split)
                    + ["use a larger cluster"])
            if options is not None  # only what the search could not try (it tried every unpinned pp and size)
            else
            "lower --micro-batch-size, raise --pp, or use a larger cluster")
    if counts.get("too_many_micro_batches") and len(counts) == 1:
        hint = (f"every point needs more than {MAX_MICRO_BATCHES:,} micro-batches per replica; raise "
                "--micro-batch-size or --dp")
    elif counts.get("too_many_micro_batches") and counts.get("out_of_memory"):
        # small micro-batches are too many, larger ones (the divisors of the batch) do not fit
        hint = (f"the micro-batch sizes that divide the global batch {job.global_batch_size:,} either need more than "
                f"{MAX_MICRO_BATCHES:,} micro-batches per replica or do not fit; choose a global batch with more "
                "divisors (e.g. a multiple of a power of two), or use a larger cluster")
    if counts.get(STOPPED):
        hint = (f"{counts[STOPPED]} points are not proven out of memory: their split search stopped at its work "
                f"limits before it met a split that fits every GPU; pin one with --split, or {hint}")
    if on_host and cluster.host is not None:
        # Mobius / RoundPipe's host copy of every parameter (a layer table of tp > 1 holds one device's shard): every
        # split keeps at least this on the hosts, so no split, pin or activation flag fits more than they hold
        host_need = min(params * v.tp for v in variants) * (2.0 + offload_bytes_per_param(param_state_of(job), 1)[1])
        host_total = cluster.num_nodes * cluster.host.memory_bytes
        if host_need > host_total:
            need, held = format_gib_pair(host_need, host_total)
            hint = (f"{' and '.join(options.schedules)} keep{'s' if len(options.schedules) == 1 else ''} the model's "
                    f"16-bit weights and optimizer state in host memory, {need} at the least, "
                    f"against {held} on the cluster's {cluster.num_nodes} "
                    f"node{'s' if cluster.num_nodes > 1 else ''}; use hosts with more memory ([host] memory_GB), more "
                    f"nodes, or another schedule")
    if counts.get("one_replica") and options is not None and options.min_dp > 1:
        others = set(counts) - {"one_replica", "pruned", "batch_not_divisible"}  # what else left no plan
        hint = ("the optimizer state is sharded over data-parallel replicas (--sharding / --zero1), so plans of one "
                "replica were not searched: drop that flag to plan them" + (f", or {hint}" if others else ""))
    return f"no plan fits {prof.name} on {cluster.name} ({reasons}); {hint}"
