"""Placements of ``(pp, dp)`` on a mixed cluster scored with per-type layer
times (the closed-form reference of :mod:`pipesearch.mapping`).

Every stage runs on a replica group of ``dp`` devices (a row of a ``(pp,
dp)`` placement): its time per layer is the slowest replica's type
(:func:`pipesearch.mapping.scale_layer_times`: measured per-type columns, or
the profile's times scaled by FLOP rate), its capacity the smallest
replica's, its boundary link and all-reduce those of
:func:`pipesearch.costs.build_pipeline_costs`; the split is
:func:`pipesearch.partition.optimal_split` (the closed-form iteration time of
:mod:`pipesearch.costs`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from .costs import PipelineCosts, build_pipeline_costs
from .errors import InfeasibleError
from .mapping import scale_layer_times, with_stage_times
from .memory import usable_memory_bytes
from .partition import SplitResult, optimal_split
from .placement import placement_candidates
from .types import Cluster, DeviceSpec, Job, ModelProfile


def evaluate_placement(
    profile: ModelProfile,
    cluster: Cluster,
    job: Job,
    placement: np.ndarray,
    *,
    micro_batch_size: int,
    num_micro_batches: int,
    schedule: str = "1f1b",
    layer_times: Mapping[str, Sequence[float]] | None = None,
    profiled_device: DeviceSpec | None = None,
    precision: str = "auto",
) -> tuple[PipelineCosts, SplitResult | None]:
    """Cost terms and exact split of one ``(pp, dp)`` placement.

    :func:`pipesearch.costs.build_pipeline_costs` with per-type layer times
    (:func:`scale_layer_times`): a stage's time per layer is the slowest of its
    replicas' types and its capacity the smallest replica's (synchronous data
    parallelism waits for the slowest replica). Returns ``(costs, split)``;
    split is None when nothing fits.
    """
    pp, dp = placement.shape
    costs = build_pipeline_costs(profile, cluster, job, pp=pp, dp=dp, micro_batch_size=micro_batch_size,
                                 num_micro_batches=num_micro_batches, schedule=schedule,
                                 placement=np.asarray(placement), profiled_device=None)
    specs = {cluster.device_spec(int(d)).name: cluster.device_spec(int(d)) for d in np.ravel(placement)}
    times = scale_layer_times(profile, specs.values(), layer_times, profiled_device=profiled_device,
                              precision=precision)
    rows = np.array([np.max([times[cluster.device_spec(int(d)).name] for d in placement[s]], axis=0)
                     for s in range(pp)]) * profile.time_ratio_at(micro_batch_size)
    caps = usable_memory_bytes(job, np.array([min(cluster.device_spec(int(d)).memory_bytes for d in placement[s])
                                              for s in range(pp)])) - costs.fixed_bytes(np.arange(pp))
    costs = with_stage_times(replace(costs, capacity_bytes=caps), rows)
    return costs, optimal_split(costs)


def best_placement(
    profile: ModelProfile,
    cluster: Cluster,
    job: Job,
    *,
    pp: int,
    dp: int,
    micro_batch_size: int,
    num_micro_batches: int,
    schedule: str = "1f1b",
    layer_times: Mapping[str, Sequence[float]] | None = None,
    profiled_device: DeviceSpec | None = None,
    precision: str = "auto",
) -> list[tuple[str, np.ndarray, float]]:
    """Every candidate of :func:`placement_candidates` scored by the cost model
    (:func:`evaluate_placement`), fastest first: ``(name, placement,
    iteration_time_s)``; ``inf`` for a placement where nothing fits.

    Raises:
        InfeasibleError: no placement fits.
    """
    scored = []
    for name, placement in placement_candidates(cluster, pp, dp):
        _, split = evaluate_placement(profile, cluster, job, placement, micro_batch_size=micro_batch_size,
                                      num_micro_batches=num_micro_batches, schedule=schedule,
                                      layer_times=layer_times, profiled_device=profiled_device,
                                      precision=precision)
        scored.append((name, placement, split.iteration_time_s if split else float("inf")))
    scored.sort(key=lambda x: x[2])
    if not np.isfinite(scored[0][2]):
        raise InfeasibleError(f"{profile.name!r} with pp={pp}, dp={dp}, micro-batch {micro_batch_size}: no "
                              f"placement on {cluster.name!r} fits in memory")
    return scored
