"""Enumerate the plan space, split each point exactly, rank by simulated time.

A *point* is (tp, recompute, pp, dp, micro-batch size, schedule, vp,
placement). For each point the exact split
(:func:`pipesearch.split_search.exact_split`) gives the point's best iteration
time under the one time model (:mod:`pipesearch.timemodel`: the simulator's
makespan of the schedule plus the all-reduce). Points are grouped by (tp,
recompute, pp, dp); groups are visited in order of a lower bound on any of
their points' simulated time, points within a group in order of their own
bound (:func:`point_lower_bound_s`), and a group or point whose bound cannot enter
the top ``K`` is skipped (``pruned``) without losing exactness: the ranked
plans are the true top ``K`` configurations by simulated time.

Every visited point is a row of :attr:`SearchResult.points` (a pandas
DataFrame, built on first use from :attr:`SearchResult.point_columns`) with
its status: ``ok``, ``out_of_memory``, ``batch_not_divisible``,
``schedule_refused``, ``too_many_stages`` or ``pruned``.

The plan space itself is :mod:`pipesearch.search_space`, the bounds that
prune it :mod:`pipesearch.search_bounds`, a point's devices and costs
:mod:`pipesearch.point_placement`, a split's plan :mod:`pipesearch.point_plan`
and the ranking :mod:`pipesearch.ranking`; this module runs the search.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, NamedTuple

import numpy as np

from .costs import device_time_scale, profile_precision
from .errors import InfeasibleError
from .in_flight import floor_in_flight
from .memory import usable_memory_bytes
from .option_search import best_policies_for_split, exact_split_over_policies, host_overflow_note
from .placement import memory_bytes_of, reference_device, slot_heads
from .point_placement import (mapped_above, mapped_key, mapped_visit_order, memory_key, placement_array, point_costs,
                              same_links, slots_and_links)
from .point_plan import plan_of_split
from .ranking import TIE_REL, kth_best, plan_family, rank_plans, tie_key
from .replication import parse_replicas_name
from .roundpipe import plan_point as roundpipe_plan_point
from .search_bounds import (busiest_device_per_sample_s, capacity_time_scale, forward_share_of, group_lower_bound_s,
                            memory_totals, point_lower_bound_s, surely_out_of_memory)
from .search_checks import check_options
from .search_notes import infeasible_message, note_split_overflow
from .search_options import ModelVariant, SearchOptions
from .search_space import (STOPPED, accepted_points, count_points, enumerate_groups, expand_group, group_schedules,
                           group_stages, in_bound_order, point_columns_of, point_row, points_frame,
                           replicated_candidates)
from .split_search import EQUAL_TIME_REL, exact_split
from .split_bounds import CHAIN_SCHEDULES
from .stage_options import ACT_HOST_RESIDENT
from .timemodel import iteration_time_s
from .types import Cluster, DeviceSpec, Job, Plan


@dataclass(frozen=True, eq=False)
class SearchResult:
    """Ranked plans plus the bookkeeping of the search.

    ``plans`` holds the best plan of each of the top configurations
    (:func:`plan_family`), ranked by simulated iteration time
    (:func:`rank_plans`).
    ``point_columns`` holds one list per column (:data:`pipesearch.search_space.POINT_COLUMNS`:
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


def fingerprint(*parts) -> str:
    """``sha256:`` of the JSON of ``parts`` (dataclasses via ``repr``)."""
    text = json.dumps([repr(p) for p in parts], sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _raise_bound(row: dict, proven_s: float) -> None:
    """A point pruned by its split or order search keeps the bound that
    proved it (at least the cutoff it was searched against) as its
    ``lower_bound_s``, not only the cheaper one it was visited with."""
    row["lower_bound_s"] = max(row.get("lower_bound_s", 0.0), float(proven_s))


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
    check_options(variants, cluster, job, options)
    if job.optimizer_offload:  # each layer table also with the optimizer allowed in host memory
        variants = list(variants) + [replace(v, offload=True) for v in variants if not v.offload and not v.stream]
    if job.weight_streaming:  # and with the weights streamed from host memory
        variants = list(variants) + [replace(v, stream=True, offload=False) for v in variants
                                     if not v.offload and not v.stream]
    if profiled_device is None and not cluster.is_homogeneous:
        # times measured on an unknown device: take them as the fastest type's (one
        # choice whatever the order of the groups) and scale the others by FLOP rate
        profiled_device = reference_device(cluster, profile_precision(variants[0].profile))
    run = _Search(variants, cluster, job, options, profiled_device)
    run.visit_space(progress)
    return run.result(start)


class _Search:
    """One search's state: the visited points' rows, the best plan of each
    family (:func:`plan_family`), the cutoff a point must beat, the caches
    shared by the points, and the points whose split search stopped at its
    limits. :meth:`visit_space` visits the groups in bound order;
    :meth:`result` ranks what it kept."""

    def __init__(self, variants, cluster: Cluster, job: Job, options: SearchOptions, profiled_device):
        self.variants, self.cluster, self.job, self.options = variants, cluster, job, options
        self.profiled_device = profiled_device
        self.precision = profile_precision(variants[0].profile)
        self.fastest = min(device_time_scale(profiled_device, g.device, self.precision) for g in cluster.groups)
        self.rows: list[dict] = []
        self.counts: Counter = Counter()
        self.work = {id(v): v.profile.compute_per_sample_s for v in variants}
        self.share = {id(v): forward_share_of(v.profile) for v in variants}
        swap_all = {"mobius", "roundpipe"} & set(options.schedules)
        floor_job = replace(job, weight_streaming=True) if swap_all else job
        self.memory_floor = {id(v): memory_totals(v.profile, floor_job, v.stage_tables) for v in variants}
        # usable memory of every tensor-parallel slot, largest first (the memory pre-filter)
        self.capacity = {tp: np.sort(usable_memory_bytes(job, memory_bytes_of(cluster)[slot_heads(cluster, tp)]))[::-1]
                         for tp in {v.tp for v in variants}}
        self.keep = max(options.top, 1)
        self.best_of_family: dict[tuple, tuple[float, Plan]] = {}
        self.family_times: list[float] = []  # sorted best time of every family seen
        self.in_flight_cache: dict = {}
        self.links_cache: dict = {}
        self.placement_ctx: dict = {"job": job, "profiled_device": profiled_device,
                                    "time_limit_s": options.mapping_time_limit_s,
                                    "in_flight_cache": self.in_flight_cache,
                                    "links_cache": self.links_cache}  # (the order search's too)
        self._capacity_scales: dict = {}
        self._busiest_cache: dict = {}
        self._count_cache: dict = {}
        self._offered: dict = {}
        self.unproven: list[_Open] = []  # points whose split search stopped at its limits
        self.no_split_fits: set = set()  # memory_key of the points of one placement no split fits
        self.groups = self._groups()
        # the seeded points' costs and starting splits, for their evaluation (_seed_time_s); and per family
        # (tp, recompute, pp, dp, schedule, vp) a time its seeds achieve
        self.seed_work: dict = {}
        self.initial_cutoff, self.seeded = self.seed_cutoff()

    def _groups(self) -> list[tuple]:
        """The (variant, pp, dp) groups to expand, ``(bound, order, variant,
        pp, dp)`` sorted by the smallest :func:`point_lower_bound_s` of any
        of their points; refused groups are counted by status."""
        job, groups = self.job, []
        uniform = [] if self.options.split_replicas else enumerate_groups(self.variants, self.cluster, job,
                                                                          self.options)
        for variant, pp, dp, status, count in uniform:  # a pinned replicated split: that point only
            if status is not None:
                self.counts[status] += count
                continue
            scale = self.average(variant, pp, dp) or self.fastest
            groups.append((self.work[id(variant)] * scale * (job.global_batch_size // dp) / pp, len(groups),
                           variant, pp, dp))
        groups.sort(key=lambda g: (g[0], g[1]))
        return groups

    def average(self, variant, pp: int, dp: int) -> float | None:
        """:func:`capacity_time_scale` of a (pp, dp) point's slots (None on
        a cluster of one device type)."""
        key = (pp * dp, variant.tp)
        if key not in self._capacity_scales:
            self._capacity_scales[key] = capacity_time_scale(self.cluster, self.profiled_device, self.precision,
                                                             pp * dp, variant.tp)
        return self._capacity_scales[key]

    def busiest_s(self, variant, pp: int, stages: int) -> float:
        """:func:`busiest_device_per_sample_s` (0 with RoundPipe, whose tasks
        move between GPUs: only the average device holds)."""
        if "roundpipe" in self.options.schedules:
            return 0.0
        return busiest_device_per_sample_s(variant.profile, pp, stages, self._busiest_cache)

    def point_bound(self, variant, pp: int, dp: int, mbs: int, m: int, schedule: str, vp: int) -> float:
        """The point's :func:`point_lower_bound_s`."""
        return point_lower_bound_s(self.work[id(variant)], pp, mbs, m, schedule, self.fastest,
                                   self.busiest_s(variant, pp, pp * vp), self.share[id(variant)],
                                   self.average(variant, pp, dp))

    def strong_group_bound(self, group) -> float:
        """The group's bound with integral layers (:func:`group_lower_bound_s`)."""
        _, _, variant, pp, dp = group
        return group_lower_bound_s(self.work[id(variant)], pp, self.job.global_batch_size // dp, self.fastest,
                                   self.busiest_s(variant, pp, group_stages(pp, self.options)),
                                   self.average(variant, pp, dp))

    def offers(self, variant, pp: int, dp: int, schedule: str) -> bool:
        """Whether the group searches ``schedule`` at some micro-batch count
        (:func:`group_schedules`, :func:`accepted_points`)."""
        per_replica = self.job.global_batch_size // dp
        key = (variant.profile.num_layers, pp, per_replica, schedule)
        if key not in self._offered:
            self._offered[key] = schedule in group_schedules(pp, self.options) and accepted_points(
                schedule, pp, per_replica, variant.profile.num_layers, self.options) > 0
        return self._offered[key]

    def seed_cutoff(self) -> tuple[float, dict]:
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
        options, keep = self.options, self.keep
        if options.exhaustive or options.split:
            return math.inf, {}
        seen: dict[tuple, float] = {}
        per_schedule: Counter = Counter()
        extra, missing = 0, None
        for group_bound, (_, _, variant, pp, dp) in in_bound_order(self.groups, self.strong_group_bound):
            if len(seen) >= keep and group_bound >= kth_best(sorted(seen.values()), keep):
                break  # every point of this group and the later ones is at least the K-th seed: none lowers it
            if len(seen) >= SEED_FAMILIES * keep:
                if missing is None:  # the schedules the first groups gave no family of
                    missing = {s for s in options.schedules if s != "roundpipe" and not per_schedule[s]}
                short = {s for s in missing if per_schedule[s] < keep}
                if not short or extra >= SEED_GROUPS:
                    break
                short = {s for s in short if self.offers(variant, pp, dp, s)}
                if not short:  # e.g. fewer micro-batches than stages: GPipe alone
                    continue
                extra += 1
            else:
                short = set(options.schedules)
            for key, row in self._seed_points(variant, pp, dp, short):
                t = _seed_time_s(variant, self.cluster, self.job, row, self.profiled_device, self.in_flight_cache,
                                 self.links_cache, self.placement_ctx, self.seed_work)
                if t < math.inf:
                    per_schedule[row["schedule"]] += key not in seen
                    seen[key] = min(seen.get(key, math.inf), t)
        return kth_best(sorted(seen.values()), keep) * (1 + 2 * TIE_REL), seen

    def _seed_points(self, variant, pp: int, dp: int, schedules: set) -> list[tuple[tuple, dict]]:
        """The seed points of a group (:meth:`seed_cutoff`) among
        ``schedules``, ``(family, row)``: per family the point of lowest
        bound and the one of fewest micro-batches, those the memory
        pre-filter lets through."""
        first: dict[tuple, tuple[float, dict]] = {}
        fewest: dict[tuple, tuple[int, dict]] = {}  # and its point of fewest micro-batches (the largest)
        for mbs, m, schedule, vp, placement, status in expand_group(variant, pp, dp, self.job, self.options,
                                                                    self.cluster):
            if status is not None or schedule not in schedules:  # e.g. batch_not_divisible: no micro-batch count
                continue
            key = (variant.tp, variant.recompute, pp, dp, schedule, vp)
            bound = self.point_bound(variant, pp, dp, mbs, m, schedule, vp)
            row = point_row(variant, pp, dp, mbs, m, schedule, vp, placement, None)
            if key not in first or bound < first[key][0]:
                first[key] = (bound, row)
            if key not in fewest or m < fewest[key][0]:
                fewest[key] = (m, row)
        picked = [(key, row) for key, (_, row) in first.items()]
        picked += [(key, row) for key, (_, row) in fewest.items() if row is not first[key][1]]
        return [(key, row) for key, row in picked
                if row["schedule"] == "roundpipe" or not self._surely_out_of_memory(variant, row)]

    def _surely_out_of_memory(self, variant, row: dict) -> bool:
        """:func:`surely_out_of_memory` of the point (its schedule's least
        in-flight activations against the slots' capacities)."""
        inflight = floor_in_flight(row["schedule"], row["pp"], row["num_micro_batches"], row["vp"],
                                   self.in_flight_cache, variant.profile.wgrad_saved_fraction)
        if self.job.activation_offload:  # at most ACT_HOST_RESIDENT micro-batches' activations stay on the GPU
            inflight = np.minimum(inflight, ACT_HOST_RESIDENT)
        return surely_out_of_memory(self.memory_floor[id(variant)], row, inflight, self.capacity[variant.tp])

    def cutoff(self) -> float:
        """Time a point must beat to enter the ranked plans (near-ties of the
        best are kept for the tie-break of rank_plans); at most the seeds'.
        Infinite with ``exhaustive``: every point's split search then runs
        to its best split (against a cutoff it stopped once no split could
        beat it, and its row held the best split met so far)."""
        if self.options.exhaustive:
            return math.inf
        # raised by 2 EQUAL_TIME_REL: a point that ties the K-th plan to rounding may replace it within its
        # family (keep_plan's tie rule: fewer PCIe bytes, less memory), so it is searched, not pruned
        return min(self.initial_cutoff, kth_best(self.family_times, self.keep) * (1 + 2 * EQUAL_TIME_REL))

    def pruned(self, bound: float) -> bool:
        return not self.options.exhaustive and bound >= self.cutoff()

    def point_cutoff(self, row: dict, variant) -> float:
        """:meth:`cutoff`, or lower where the point's family (:func:`plan_family`)
        already holds a plan: the ranking keeps one plan per family, so a
        point of it matters only if it beats that plan (or ties it within
        ``EQUAL_TIME_REL`` with a smaller tie key, :meth:`keep_plan`); and
        below the time a seeded point of the family achieves
        (:meth:`seed_cutoff`, raised by ``2 TIE_REL`` as the first cutoff
        is: that point, searched against it, finds its starting split at
        least). Only for variants whose plans' family is known before the
        search (no per-stage options, which may name the recompute
        ``per-stage``)."""
        now = self.cutoff()
        if variant.stage_tables or variant.offload or variant.stream or self.options.exhaustive:
            return now
        key = (variant.tp, variant.recompute, row["pp"], row["dp"], row["schedule"], row["vp"])
        held = self.best_of_family.get(key)
        if held is not None:
            now = min(now, held[0] * (1 + 2 * EQUAL_TIME_REL))
        return min(now, self.seeded.get(key, math.inf) * (1 + 2 * TIE_REL))

    def keep_plan(self, plan: Plan, idx: int, variant, cutoff_s: float) -> None:
        """Record an evaluated point's plan in its row and its family."""
        info = dict(plan.extra).get("split_search") or {}
        if not info.get("exact", True):
            self.unproven.append(_Open(plan, float(info["lower_bound_s"]), idx, variant, cutoff_s))
        t = plan.predicted.iteration_time_s
        self.rows[idx].update(status="ok", iteration_time_s=t, samples_per_s=plan.predicted.samples_per_s,
                              peak_memory_bytes=plan.predicted.peak_memory_bytes,
                              bubble_fraction=plan.predicted.bubble_fraction)
        key, family_times = plan_family(plan), self.family_times
        if key not in self.best_of_family:
            bisect.insort(family_times, t)
            self.best_of_family[key] = (t, plan)
            return
        held_t, held = self.best_of_family[key]
        tied = abs(t - held_t) <= EQUAL_TIME_REL * max(t, held_t)
        if (tie_key(plan) < tie_key(held)) if tied else (t < held_t):
            # faster, or the same time up to rounding with less memory (the ranking's tie rule inside a family)
            family_times.pop(bisect.bisect_left(family_times, held_t))
            bisect.insort(family_times, t)
            self.best_of_family[key] = (t, plan)

    def keep_result(self, plan: Plan | None, idx: int, variant, cutoff_s: float) -> None:
        """An evaluated point's plan, or its bound when its split search
        stopped before any split fit (an open point, :data:`STOPPED`);
        ``cutoff_s`` the cutoff its split search ran against."""
        if plan is not None:
            self.keep_plan(plan, idx, variant, cutoff_s)
        elif self.rows[idx]["status"] == STOPPED:
            self.unproven.append(_Open(None, self.rows[idx]["split_lower_bound_s"], idx, variant, cutoff_s))

    def evaluate(self, variant, row: dict, cutoff_s: float, seed_work: tuple | None = None):
        """:func:`_evaluate` of the point of ``row`` with the search's caches."""
        return _evaluate(variant, self.cluster, self.job, self.options, row, self.profiled_device,
                         self.in_flight_cache, self.links_cache, self.placement_ctx, cutoff_s=cutoff_s,
                         seed_work=seed_work)

    def visit(self, bound: float, idx: int, variant) -> None:
        """Evaluate the point of ``rows[idx]`` unless pruned (against its
        family's plan too, :meth:`point_cutoff`) or surely out of memory."""
        row, options, cluster = self.rows[idx], self.options, self.cluster
        now = self.point_cutoff(row, variant)  # at most cutoff(); infinite with exhaustive
        if bound >= now:
            row["status"] = "pruned"
            return
        if not options.split and row["schedule"] != "roundpipe" and self._surely_out_of_memory(variant, row):
            row["status"] = "out_of_memory"
            return
        if row["placement"] != options.placements[0] and same_links(
                cluster, variant, row, options.placements[0], self.placement_ctx, self.links_cache):
            row["status"] = "same_as_other_placement"
            return
        key = memory_key(cluster, variant, row, options)
        if key in self.no_split_fits:  # another placement's devices, the same memory: no split fits either
            row["status"] = "out_of_memory"
            return
        plan, costs = self.evaluate(variant, row, now, self.seed_work.pop(_seed_key(variant, row), None))
        self.keep_result(plan, idx, variant, now)
        if key is not None and row["status"] == "out_of_memory" and costs is not None and costs.options is None:
            self.no_split_fits.add(key)  # (no stage options: no host memory, which is counted per node)

    def visit_space(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Visit every group in bound order (a group the cutoff prunes is
        counted, not expanded), its points in bound order; the chain
        schedules' points (:data:`DEFERRED_SCHEDULES`) after all others and
        the mapped placement's last (its order search is costly); then the
        replicated points and a second look at the stopped ones."""
        options = self.options
        deferred: list = []  # points of DEFERRED_SCHEDULES, evaluated after all others
        mapped: list = []  # points of the mapped placement, evaluated last: against the lowest cutoff
        for done, (group_bound, (_, _, variant, pp, dp)) in enumerate(
                in_bound_order(self.groups, self.strong_group_bound, self.pruned)):
            if progress:
                progress(done, len(self.groups))
            if self.pruned(group_bound):
                self.counts["pruned"] += count_points(variant, pp, dp, self.job, options, self.cluster,
                                                      self._count_cache)
                continue
            for bound, idx in self._expand(variant, pp, dp):
                if self.rows[idx]["placement"] == "mapped" and not options.exhaustive:
                    mapped.append((bound, idx, variant))
                elif self.rows[idx]["schedule"] in DEFERRED_SCHEDULES and not options.exhaustive:
                    deferred.append((bound, idx, variant))  # after the others: against a lower cutoff
                else:
                    self.visit(bound, idx, variant)
        for bound, idx, variant in deferred:
            self.visit(bound, idx, variant)
        for bound, idx, variant in mapped_visit_order(mapped, self.rows):
            self.visit(bound, idx, variant)
        if options.replicate_stages or options.split_replicas:
            self._visit_replicated()
        if not options.exhaustive:
            self.second_look()
        if progress:
            progress(len(self.groups), len(self.groups))

    def _expand(self, variant, pp: int, dp: int) -> list[tuple[float, int]]:
        """A group's points as rows (every one, refused ones with their
        status), and ``(bound, row index)`` of those to visit, in bound order."""
        todo = []
        for mbs, m, schedule, vp, placement, status in expand_group(variant, pp, dp, self.job, self.options,
                                                                    self.cluster):
            row = point_row(variant, pp, dp, mbs, m, schedule, vp, placement, status)
            self.rows.append(row)
            if status is None:
                row["lower_bound_s"] = self.point_bound(variant, pp, dp, mbs, m, schedule, vp)
                todo.append((row["lower_bound_s"], len(self.rows) - 1))
        return sorted(todo)

    def _visit_replicated(self) -> None:
        """The per-stage replication points (:func:`replicated_candidates`),
        in bound order until the cutoff prunes the rest."""
        candidates = replicated_candidates(self.variants, self.cluster, self.job, self.options, self.work,
                                           self.fastest, self.profiled_device)
        for n, (bound, _, variant, row) in enumerate(candidates):
            if self.pruned(bound):  # sorted by bound: every later point is pruned too
                self.counts["pruned"] += len(candidates) - n
                break
            self.rows.append(row)
            row["lower_bound_s"] = bound
            now = self.cutoff()
            plan, _ = self.evaluate(variant, row, now)
            self.keep_result(plan, len(self.rows) - 1, variant, now)

    def second_look(self) -> None:
        """Search again, against the final cutoff, the points outside the
        ranked plans whose split search stopped at its limits with a bound
        below it, when the cutoff has fallen since by at least
        :data:`SECOND_LOOK_SHARE` of the gap between the cutoff they were
        searched against and their bound (in bound order): a lower incumbent
        prunes more, so such points are mostly settled (proven unable to
        enter; their row keeps its plan) or yield a faster split."""
        rows, unproven = self.rows, self.unproven

        def final(u: _Open) -> float:  # what the point must beat now (its family's plan too)
            return self.point_cutoff(rows[u.idx], u.variant)

        todo = sorted((u.bound_s, k) for k, u in enumerate(unproven)
                      if u.bound_s < final(u) and u.cutoff_s - final(u) >= SECOND_LOOK_SHARE * (u.cutoff_s - u.bound_s)
                      and (u.plan is None or u.plan.predicted.iteration_time_s >= final(u)))
        again = {k for _, k in todo}  # replaced by what the second search finds (a bound at the cutoff: dropped)
        for lb, k in todo:
            old, _, idx, variant, _ = unproven[k]
            if lb >= final(unproven[k]):  # the cutoff fell below it meanwhile
                continue
            status, now = rows[idx]["status"], final(unproven[k])
            plan, _ = self.evaluate(variant, rows[idx], now)
            if plan is None and rows[idx]["status"] == "pruned" and status == "ok":
                rows[idx]["status"] = "ok"  # evaluated before; now proven unable to enter the ranked plans
            t_old = math.inf if old is None else old.predicted.iteration_time_s
            if plan is not None and plan.predicted.iteration_time_s >= t_old:  # no faster split: the first stays
                info = dict(plan.extra)["split_search"]
                if not info["exact"]:
                    unproven.append(_Open(old, max(lb, float(info["lower_bound_s"])), idx, variant, now))
                continue
            self.keep_result(plan, idx, variant, now)
        unproven[:] = [u for k, u in enumerate(unproven) if k not in again]

    def result(self, start: float) -> SearchResult:
        """The ranked plans (the top ``K`` families' best) and the search's
        bookkeeping; ``start`` the search's start (``time.perf_counter``).

        Raises:
            InfeasibleError: no point yielded a plan (:func:`infeasible_message`).
        """
        options, rows, counts = self.options, self.rows, self.counts
        counts.update(r["status"] for r in rows if r["status"] != "ok")
        if not self.best_of_family:
            raise InfeasibleError(self._infeasible_message(), point_columns=point_columns_of(rows))
        plans = rank_plans([p for _, p in self.best_of_family.values()])[:self.keep]  # ranked (ties too), then cut
        shown = {id(p) for p in plans[: options.top]}
        # the ranked ones report their own gap; a bound at the cutoff (or at its family's plan) already excludes a point
        outside = [u.bound_s for u in self.unproven
                   if id(u.plan) not in shown and u.bound_s < self.point_cutoff(rows[u.idx], u.variant)]
        plans = [replace(p, rank=r + 1) for r, p in enumerate(plans[: options.top])]
        job = self.job
        return SearchResult(
            unproven_points=len(outside),
            unproven_bound_s=min(outside, default=math.inf),
            plans=tuple(plans),
            points_evaluated=sum(1 for r in rows if r["status"] in ("ok", "out_of_memory", STOPPED)),
            infeasible=tuple(sorted((k, v) for k, v in counts.items() if k != "pruned"))
            + ((("pruned", counts["pruned"]),) if counts.get("pruned") else ()),
            wall_s=time.perf_counter() - start,
            fingerprint=fingerprint([v.profile for v in self.variants], self.cluster, job, options,
                                    *(("delayed_optimizer_step",) if job.delayed_optimizer_step else ()),
                                    *(("activation_offload",) if job.activation_offload else ()),
                                    *(("vp_pinned",) if options.vp_pinned else ()),
                                    *(("placement_pinned",) if options.placement_pinned else ()),
                                    *((f"min_dp={options.min_dp}",) if options.min_dp > 1 else ()),
                                    *((f"runtime={options.runtime}",) if options.runtime else ())),
            point_columns=point_columns_of(rows),
        )

    def _infeasible_message(self) -> str:
        """The one line of a search that found no plan: the counts by status
        and the likely fix, the closest --split and the host memory note."""
        options, ctx = self.options, self.placement_ctx
        message = infeasible_message(self.counts, self.variants, self.cluster, self.job, options,
                                     host_full=bool(ctx.get("host_overflow")))
        if "split_overflow" in ctx:
            message += "; " + ctx["split_overflow"][1]
        if ctx.get("host_overflow"):
            message += "; " + ctx["host_overflow"]
        if options.vp_pinned and 1 not in options.vps and not options.pp:
            message = (f"--vp {','.join(map(str, options.vps))} needs pp >= 2 (one pipeline rank runs all its "
                       f"stages as one, vp 1); no plan with pp >= 2 fits: {message}")
        return message


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
    slots, costs = point_costs(variant, cluster, job, row, profiled_device, in_flight_cache, links_cache,
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
    """Split the point of ``row`` exactly against ``cutoff_s`` (or score
    the pinned ``--split``) and return ``(plan, costs)``: the plan is None,
    and ``row["status"]`` says why, when no split fits (``out_of_memory``),
    none beats the cutoff (``pruned``, its proven bound in
    ``lower_bound_s``) or the split search stopped before any split fit
    every GPU (:data:`STOPPED`); ``costs`` None when no costs were built
    (RoundPipe, a mapped point settled by its order search). ``seed_work``:
    the point's slots, costs and split cache from :meth:`_Search.seed_cutoff`."""
    pp, m, schedule, vp = row["pp"], row["num_micro_batches"], row["schedule"], row["vp"]
    stages = pp * vp
    if placement_ctx is None:
        placement_ctx = {"job": job, "profiled_device": profiled_device}
    placement_ctx["cutoff_s"] = cutoff_s  # a mapped placement's order search starts from it
    if schedule == "roundpipe":  # its own costs and split: pipesearch.roundpipe
        slots, _ = slots_and_links(cluster, variant, row, row["placement"], placement_ctx,
                                   {} if links_cache is None else links_cache)
        return roundpipe_plan_point(variant, cluster, job, row, np.asarray(slots)[:pp, 0], profiled_device, cutoff_s,
                                    options.exhaustive, options.split, placement_ctx), None
    if row["placement"] == "mapped":  # its order search first (cached)
        placement_array(cluster, variant, row, placement_ctx)
        if mapped_above(variant, row, placement_ctx, cutoff_s):  # proven: no order beats the cutoff
            row["status"] = "pruned"
            _raise_bound(row, placement_ctx[mapped_key(variant, row)][1]["best_bound_s"])
            return None, None
    slots, costs, split_cache = seed_work or (
        *point_costs(variant, cluster, job, row, profiled_device, in_flight_cache, links_cache, placement_ctx), None)
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
                note_split_overflow(placement_ctx, costs, bounds, row)
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
    mapping = placement_ctx[mapped_key(variant, row)][1] if row["placement"] == "mapped" else None
    return plan_of_split(variant, cluster, job, row, costs, bounds, t, slots, split_info, mapping)


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


#: schedules whose points are evaluated after every other point (in the same
#: order among themselves): those whose split search needs the chain
#: families (split_bounds.CHAIN_SCHEDULES; interleaved 1F1B's bounds are the
#: weakest), the dearest to search, so a cutoff lowered by the other
#: schedules' plans first excludes more of them. The ranked plans do not
#: depend on the order: every point that can enter them is searched exactly
#: against a cutoff that only falls, and the points of one family keep
#: their order (the first of equal times stays its best)
DEFERRED_SCHEDULES = CHAIN_SCHEDULES


SEED_FAMILIES = 2
"""The search's first cutoff comes from the starting splits of this many
times ``top`` families (``search._Search.seed_cutoff``)."""

SEED_GROUPS = 32
"""Groups the first cutoff looks at beyond those, for the schedules the
first ones gave no family of (a count, ``search._Search.seed_cutoff``)."""


