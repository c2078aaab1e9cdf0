"""Per-stage data-parallel replication (PipeDream / DAPPLE style): the
replica vectors the search visits, their cost terms and lower bounds.

A replicated point fixes ``pp`` stages, a tensor-parallel degree ``tp``
and a replica vector ``r = (r_0 .. r_{P-1})``: stage ``k`` runs on ``r_k``
replicas, each one tensor-parallel slot of ``tp`` devices inside one node
(no further data parallelism over the whole pipeline), ``tp sum_k r_k``
devices in all, never one twice. The stages take consecutive runs of the
canonical slot order (:func:`pipesearch.placement.replicated_stage_devices`)
or, where a vector has few enough placements, every placement up to swaps
inside a node (:func:`replicated_placements`), so on a mixed cluster each
stage's speed and capacity are those of its own devices. Schedule semantics are DAPPLE's synchronous ones (Fan et
al., PPoPP'21, the planner's stage replication): the pipeline runs the schedule of
``pp`` ranks on ``m`` micro-batches of ``b`` samples, and every micro-batch
is split over the replicas of each stage it passes, so

* stage ``k``'s forward and backward of one micro-batch take the time of
  ``ceil(b / r_k)`` samples (its replicas run in lock-step and the one with
  the most samples decides), by the profile's rule for a layer's time at a
  batch size (fixed part plus per-sample part,
  :meth:`pipesearch.types.ModelProfile.layer_times_at`; linear in the batch
  without a fixed part, PipeDream, Narayanan et al. SOSP'19 sec. 3.1):
  ``time_scale_k`` is the device factor times ``ceil(b / r_k) / b`` and
  the fixed part is added back whole (:func:`_fixed_time_terms`);
* one device of stage ``k`` keeps the saved activations of ``ceil(b / r_k)``
  samples per in-flight micro-batch (``activation_share``), and the whole
  training state of its layers (no sharding: PipeDream and DAPPLE replicate
  it, so a sharded optimizer is refused);
* the boundary after stage ``k`` moves the micro-batch's activation (and
  its gradient back) over ``n = min(r_k, r_{k+1})`` device pairs in
  parallel, each device of the smaller side carrying ``ceil(b / n)``
  samples' worth, in ``N = max(r_k, r_{k+1})`` flows of ``ceil(b / N)``
  samples that share the nodes' ports
  (:func:`pipesearch.placement.replicated_boundary_links`): the effective
  bandwidth is the smaller of the slowest pair's times ``b / ceil(b / n)``
  and the slowest flow's port share times ``b / ceil(b / N)``
  (:func:`boundary_bandwidth_bytes_per_s`);
* stage ``k``'s gradients are all-reduced over its own ``r_k`` replicas
  once per iteration, each of the ``tp`` shards over its ``r_k`` copies
  (:func:`pipesearch.placement.allreduce_model` of its slot heads; none for
  ``r_k = 1``); with ``tp > 1`` the layer table is the tensor-parallel one
  (per-device times and bytes of one shard, the uniform path's).

The point is then an ordinary :class:`pipesearch.costs.PipelineCosts` with
per-stage arrays, and :func:`pipesearch.split_search.exact_split` finds its
best split under the one time model (:mod:`pipesearch.timemodel`) unchanged.
A vector with all ``r_k = r`` and ``r`` dividing ``b`` is the uniform
data-parallel point ``dp = r`` at micro-batch ``b / r`` with the data-major
placement, which the search already visits; :func:`replica_vectors` leaves
those out.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import numpy as np

from .costs import build_pipeline_costs, device_step_terms, profile_precision, PipelineCosts
from .errors import InputError
from .memory import param_state_of, usable_memory_bytes
from .placement import (SLOTS_PREFIX, allreduce_model, memory_bytes_of, replicated_boundary_links,
                        replicated_layout_names, replicated_stage_devices, spread_layout_name,
                        stage_streaming_bandwidth, stage_time_scale)
from .types import Cluster, DeviceSpec, Job, ModelProfile

#: the largest pipeline degree whose replica vectors the search enumerates
#: when pp is not pinned (all compositions: C(D, pp) vectors for D devices)
MAX_REPLICATED_PP = 4

#: prefix of a replicated point's placement name in the points table
REPLICAS_PREFIX = "replicas:"

#: separates a replica vector from its slots in a placement name
SLOTS_SEPARATOR = ";"


def replicas_name(replicas, slots: str | None = None) -> str:
    """``replicas:15,1``: the placement name of a replica vector on the
    consecutive canonical slots; ``replicas:2,1;slots:0,2,1`` on the
    slots of a ``slots:`` name
    (:func:`pipesearch.placement.replicated_layout_names`)."""
    return REPLICAS_PREFIX + ",".join(map(str, replicas)) + ("" if slots is None else SLOTS_SEPARATOR + slots)


def parse_replicas_name(name: str) -> tuple[int, ...] | None:
    """The replica vector of a :func:`replicas_name`, or None for another placement."""
    if not isinstance(name, str) or not name.startswith(REPLICAS_PREFIX):
        return None
    return tuple(int(x) for x in name[len(REPLICAS_PREFIX):].split(SLOTS_SEPARATOR)[0].split(","))


def parse_replicas_slots(name: str) -> tuple[int, ...] | None:
    """The canonical slot indices of a :func:`replicas_name` with slots,
    or None (consecutive slots, or another placement)."""
    if parse_replicas_name(name) is None or SLOTS_SEPARATOR not in name:
        return None
    return tuple(int(x) for x in name.split(SLOTS_SEPARATOR, 1)[1][len(SLOTS_PREFIX):].split(","))


def replicated_placements(cluster: Cluster, replicas, tp: int, up_to: int, precision: str = "fp16") -> list[str]:
    """The placement names the search scores for one replica vector: every
    placement up to swaps inside a node
    (:func:`pipesearch.placement.replicated_layout_names`) when there are
    at most ``up_to`` (and more than one), so the search is exact over
    placements; else the consecutive canonical slots and the placement
    that spreads every stage over the nodes
    (:func:`pipesearch.placement.spread_layout_name`)."""
    names = replicated_layout_names(cluster, replicas, tp, precision, limit=up_to)
    if 1 < len(names) <= up_to:
        return [replicas_name(replicas, n) for n in names]
    out = [replicas_name(replicas)]
    spread = spread_layout_name(cluster, replicas, tp, precision) if len(names) > 1 else None
    if spread is not None and spread != SLOTS_PREFIX + ",".join(map(str, range(sum(replicas)))):
        out.append(replicas_name(replicas, spread))  # and every stage spread over the nodes
    return out


def replica_vectors(num_devices: int, pp: int) -> list[tuple[int, ...]]:
    """Every replica vector of ``pp`` stages on at most ``num_devices``
    devices: all compositions ``r_0 + ... + r_{pp-1} = n`` with ``r_k >= 1``
    for ``pp <= n <= num_devices`` (``C(num_devices, pp)`` vectors, by
    stars and bars), in lexicographic order."""
    out = []
    for n in range(pp, num_devices + 1):
        for cuts in combinations(range(1, n), pp - 1):
            edges = (0,) + cuts + (n,)
            out.append(tuple(edges[k + 1] - edges[k] for k in range(pp)))
    return sorted(out)


def is_uniform_point(replicas, micro_batch_size: int) -> bool:
    """Whether the replicated point is the uniform data-parallel point
    ``dp = r`` (every ``r_k = r`` and ``r`` divides the micro-batch size)."""
    r = set(replicas)
    return len(r) == 1 and micro_batch_size % next(iter(r)) == 0


def activation_share(replicas, micro_batch_size: int) -> np.ndarray:
    """``(P,)`` ``ceil(b / r_k) / b``: the share of a micro-batch one
    replica of stage ``k`` computes and keeps."""
    r = np.asarray(replicas, dtype=np.int64)
    return -(-micro_batch_size // r) / micro_batch_size


def check_replication_job(job: Job, what: str = "--replicate-stages") -> None:
    """Refuse a job whose training state is sharded: per-stage replication
    keeps each stage's whole state on every replica (PipeDream, DAPPLE).
    ``what``: the flag that asked for replication (``--replicate-stages``,
    or a ``--split`` with replicas).

    Raises:
        InputError: the job shards its state (ZeRO / FSDP).
    """
    state = param_state_of(job)
    if state.stage >= 1:
        raise InputError(f"per-stage replication with --sharding {state.sharding}: replicated stages keep their "
                         f"whole training state (PipeDream, DAPPLE); drop --sharding/--zero1 or {what}")


def replicated_lower_bound_s(work_per_sample_s: float, replicas, micro_batch_size: int, m: int, schedule: str,
                             fastest) -> float:
    """A valid lower bound on the simulated iteration time of any split of
    a replicated point, from the model's fwd+bwd work ``W`` per sample on
    the fastest device (factor ``fastest``, a float; or ``(P,)``: each
    stage's own slowest device on a placement,
    :func:`placement_time_scale`). Stage ``k`` takes ``W_k c_k``
    per micro-batch with ``c_k = ceil(b / r_k) * fastest_k``; over any split
    ``max_k W_k c_k >= W / H`` with ``H = sum_k 1 / c_k`` (equality when
    ``W_k`` is proportional to ``1 / c_k``), and links and all-reduce cost
    >= 0, so: the busiest rank ``m W / H`` for every schedule; GPipe also
    ``W min_k c_k + (m - 1) W / H`` (its closed form ``sum (F+B) + (m-1)
    (max F + max B)``, Huang et al. 2019)."""
    c = -(-micro_batch_size // np.asarray(replicas, dtype=np.int64)) * np.asarray(fastest, dtype=float)
    per_stage = work_per_sample_s / float(np.sum(1.0 / c))
    bound = m * per_stage
    if schedule == "gpipe":
        bound = max(bound, work_per_sample_s * float(c.min()) + (m - 1) * per_stage)
    return bound


def placement_time_scale(cluster: Cluster, name: str, tp: int, profiled_device: DeviceSpec | None,
                         precision: str) -> np.ndarray:
    """``(P,)`` each stage's time factor on a replicated placement (its
    slowest device against ``profiled_device``,
    :func:`pipesearch.placement.stage_time_scale`), for the lower bound."""
    devs = replicated_stage_devices(cluster, parse_replicas_name(name), precision, tp, parse_replicas_slots(name))
    return np.array([stage_time_scale(cluster, d[None, :], profiled_device, precision)[0] for d in devs])


def replicated_stage_terms(cluster: Cluster, replicas, precision: str, profiled_device: DeviceSpec | None,
                           cache: dict | None = None, tp: int = 1, slots=None) -> dict:
    """The terms of a replica vector on its slots (``tp`` devices each;
    ``slots`` as :func:`pipesearch.placement.replicated_stage_devices`)
    that do not depend on the micro-batch: ``devices`` (slot heads per
    stage), ``device_scale``, boundary ``bw`` / ``lat`` / ``pairs``,
    all-reduce ``ar_per_byte`` / ``ar_fixed`` and the ``smallest`` device
    memory of each stage (arrays of shape ``(P,)``); ``cache`` (a dict)
    keeps them per vector and placement."""
    key = ("replicated", tuple(int(r) for r in replicas), precision,
           None if profiled_device is None else profiled_device.name, tp,
           None if slots is None else tuple(int(x) for x in slots))
    if cache is not None and key in cache:
        return cache[key]
    devs = replicated_stage_devices(cluster, replicas, precision, tp, slots)
    bw, lat, pairs, shared, flows = replicated_boundary_links(cluster, devs, tp)
    ar = [allreduce_model(cluster, d, tp) if len(d) > 1 else (0.0, 0.0) for d in devs]
    terms = {"devices": devs, "bw": bw, "lat": lat, "pairs": pairs, "shared_bw": shared, "flows": flows,
             "device_scale": np.array([stage_time_scale(cluster, d[None, :], profiled_device, precision)[0]
                                       for d in devs]),
             "ar_per_byte": np.array([x[0] for x in ar]), "ar_fixed": np.array([x[1] for x in ar]),
             "smallest": np.array([memory_bytes_of(cluster)[d].min() for d in devs]),
             "streaming": np.array([stage_streaming_bandwidth(cluster, d[None, :])[0] for d in devs])}
    if cache is not None:
        cache[key] = terms
    return terms


def boundary_bandwidth_bytes_per_s(terms: dict, micro_batch_size: int) -> np.ndarray:
    """``(P,)``: the bandwidth at which a whole micro-batch of ``b`` samples
    crosses each boundary of a replicated layout (``terms`` of
    :func:`replicated_stage_terms`), the slower of two limits
    (:func:`pipesearch.placement.replicated_boundary_links`): each device of
    the smaller side moves ``ceil(b / n)`` samples over its own link, ``b /
    ceil(b / n)`` times the pair bandwidth; each of the ``N`` flows moves
    ``ceil(b / N)`` samples at its share of the nodes' ports, ``b / ceil(b
    / N)`` times the shared bandwidth (with fewer samples than flows every
    flow is counted, a bound on the high side)."""
    b = micro_batch_size
    return np.minimum(terms["bw"] * b / -(-b // terms["pairs"]), terms["shared_bw"] * b / -(-b // terms["flows"]))


def _fixed_time_terms(profile: ModelProfile, share: np.ndarray) -> dict:
    """The fixed parts of the layers' times for a replicated point's costs
    (:attr:`pipesearch.costs.PipelineCosts.fixed_time_prefix_s`): a replica
    of stage ``k`` computes ``c = ceil(b / r_k)`` samples, ``f + (t(b) - f)
    c / b`` for a layer of time ``t(b)`` at the micro-batch and fixed part
    ``f`` (:meth:`pipesearch.types.ModelProfile.layer_times_at`), which is
    ``(c / b) (t(b) + (b / c - 1) f)``: ``time_scale`` carries ``c / b`` and
    the fixed prefix weighs ``b / c - 1 = 1 / share - 1``. ``{}`` when no
    layer has a fixed part."""
    fixed = profile.fixed_time_arrays
    if not any(has.any() for has, _ in fixed.values()):
        return {}
    fwd, bwd, bwd_input = (fixed[k][1] for k in ("fwd_s", "bwd_s", "bwd_input_s"))
    prefix = np.array([np.concatenate([[0.0], np.cumsum(x)]) for x in (fwd + bwd, fwd, bwd_input)])
    return {"fixed_time_prefix_s": prefix, "fixed_time_weight": 1.0 / np.asarray(share, dtype=float) - 1.0}


def replicated_costs(profile: ModelProfile, cluster: Cluster, job: Job, replicas, *, micro_batch_size: int,
                     num_micro_batches: int, schedule: str, in_flight: np.ndarray | None = None,
                     profiled_device: DeviceSpec | None = None, cache: dict | None = None, tp: int = 1,
                     slots=None) -> tuple[list[np.ndarray], PipelineCosts]:
    """Slot heads per stage and the :class:`pipesearch.costs.PipelineCosts`
    of a replicated point (the rules of the module docstring).

    Args:
        replicas: ``(P,)`` replicas per stage.
        tp: devices per replica (``profile`` is the layer table at that
            tensor-parallel degree).
        slots: canonical slot indices of the stages
            (:func:`pipesearch.placement.replicated_stage_devices`; None:
            consecutive).
        in_flight: ``(P,)`` in-flight micro-batches per stage (default:
            GPipe's / 1F1B's, :func:`pipesearch.costs.in_flight_micro_batches`).
        cache: a dict keeping :func:`replicated_stage_terms` across points.

    Raises:
        InputError: a sharded job, or more devices than the cluster has.
    """
    check_replication_job(job)
    terms = replicated_stage_terms(cluster, replicas, profile_precision(profile), profiled_device, cache, tp, slots)
    devs, b = terms["devices"], micro_batch_size
    heads = np.array([d[0] for d in devs], dtype=np.int64)[:, None]
    base = build_pipeline_costs(profile, cluster, job, pp=len(devs), dp=1, micro_batch_size=b,
                                num_micro_batches=num_micro_batches, schedule=schedule, placement=heads,
                                profiled_device=profiled_device, in_flight=in_flight, tp=tp)
    share = activation_share(replicas, b)
    capacity = usable_memory_bytes(job, terms["smallest"]) - base.gathered_bytes - base.tied_copy_bytes
    # each stage steps at its slowest replica's memory (the state is whole on every replica: one share)
    step_rate, options = device_step_terms(param_state_of(job, len(devs)), 1, profile.bytes_per_param,
                                           terms["streaming"], base.options, job.delayed_optimizer_step)
    return devs, replace(
        base, device_step_rate=step_rate, options=options,
        time_scale=terms["device_scale"] * share, **_fixed_time_terms(profile, share),
        p2p_bandwidth_bytes_per_s=boundary_bandwidth_bytes_per_s(terms, b), p2p_latency_s=terms["lat"],
        allreduce_s_per_byte=terms["ar_per_byte"], allreduce_fixed_s=terms["ar_fixed"],
        capacity_bytes=capacity, activation_share=share)
