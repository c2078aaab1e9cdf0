"""Stage-to-device mapping on heterogeneous and multi-node clusters (pure
Python + numpy; the CP-SAT model is in :mod:`pipesearch.ilp`).

The problem (one pipeline, ``dp = 1``)
--------------------------------------
A chain of ``L`` layers is cut into ``P`` contiguous, non-empty stages, and
stage ``k`` runs on a device ``d_k`` picked from ``D >= P`` candidates (each
device runs at most one stage). Per micro-batch, with stage ``k`` holding
layers ``[i, j)``:

* compute ``c_k = sum_{l in [i, j)} t[type(d_k)][l]`` (fwd+bwd seconds of layer
  ``l`` on that device type, :func:`scale_layer_times`);
* point-to-point ``p_k = 2 * (lat(d_k, d_{k+1}) + out[j-1] / bw(d_k, d_{k+1}))``
  for ``k < P-1`` (activation forward plus its gradient back, one direction
  each, alpha-beta model; ``p_{P-1} = 0``) -- exactly
  :meth:`pipesearch.costs.PipelineCosts.p2p_s`;
* ``a_k = c_k + p_k``; memory ``sum_{l in [i, j)} static[l] + in_flight[k] *
  act[l] <= cap[d_k]`` with ``in_flight`` the schedule's (1F1B: ``min(m, P-k)``).

Two objectives:

* ``"bottleneck"``: ``max_k a_k``, the steady-state time per micro-batch of the
  slowest stage (PipeDream's planner, Narayanan et al. SOSP'19 sec. 3.1;
  BaPipe, Zhao et al. 2020, arXiv:2012.12544);
* ``"iteration"``: pipesearch's analytic iteration time (:mod:`pipesearch.costs`)
  ``sum_k a_k + (m-1) max_k a_k`` (``dp = 1``: no all-reduce term).

A solution is evaluated through the :class:`pipesearch.costs.PipelineCosts`
of its order (:func:`costs_for_order`, :meth:`MappingProblem.costs`): the
one definition of these terms. This module solves it exactly by
enumerating device orders (up to device symmetry,
:mod:`pipesearch.device_orders`) and running the exact split DP of
:mod:`pipesearch.partition` on each order (:func:`order_enumeration_mapping`),
or by brute force over orders and
splits (:func:`exhaustive_mapping`, the test reference). Both are exponential
in ``P``; :func:`pipesearch.ilp.solve_mapping` is the CP-SAT model for large
instances. Metis (Um et al., ATC'24) and AMP (Li et al., NeurIPS'22) search
the same space of heterogeneous device groups with cost models of this kind.

How ``dp > 1`` composes
-----------------------
With ``dp`` replicas every stage runs on a *replica group* of ``dp`` devices
(a row of a ``(pp, dp)`` placement): its time is that of the slowest replica,
its capacity the smallest replica's, its boundary link the slowest pair, plus
the all-reduce term of :func:`pipesearch.costs.allreduce_model`.
:func:`pipesearch.placement.placement_candidates` lists placements
(pipeline-major and data-major over the slots, fastest type first);
:func:`pipesearch.placement_scores.evaluate_placement`
scores one exactly with :func:`pipesearch.partition.optimal_split` and the
per-type times, :func:`pipesearch.placement_scores.best_placement` keeps the fastest. To let CP-SAT choose
the groups' order too, make each replica group one device of a
:class:`MappingProblem` (its slowest type, smallest capacity, slowest link to
each other group); the all-reduce term ``r_k`` is then missing from the model
(exact for the bottleneck objective, which ignores it) and is added back by
re-scoring the chosen order with :func:`pipesearch.placement_scores.evaluate_placement`. Adding ``r_k`` to
the model is linear once the group is fixed (one enforced constraint per
group class), not done yet.

Layer times per device type
---------------------------
:func:`scale_layer_times`: measured per-type columns when given (``layer_times``
``{device name: fwd+bwd seconds per layer at the profiled batch}``), else the
profile's times scaled by the ratio of the profiled device's rate to the
target's. The rate follows the profile's precision: ``precision="auto"`` takes
``peak_fp32_flops`` when ``profile.bytes_per_param == 4`` (an fp32 profile,
such as PipeDream's, measured in fp32 on V100s) and ``peak_fp16_flops *
achieved_fraction`` otherwise (the rate :func:`pipesearch.costs.device_time_scale`
uses). Caveat: the fp32 ratio (A100/V100 = 19.5/15.7 = 1.24x) ignores TF32,
which PyTorch enables for cuDNN convolutions on Ampere by default, and
memory-bound layers; real A100 speed-ups on fp32 models lie between 1.24x and
the fp16 ratio (2.5x). Pass ``precision="fp16"`` when the job trains in mixed
precision and the profile's times are from a mixed-precision run.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields as dataclass_fields, replace
from typing import Iterable, Mapping, Sequence

import numpy as np

from .costs import PipelineCosts, device_rate_flops, in_flight_micro_batches, profile_precision, state_bytes_per_param
from .device_orders import count_orders, device_orders
from .errors import InfeasibleError, InputError
from .memory import usable_memory_bytes
from .partition import min_max_split, optimal_split
from .placement import class_links, link_class
from .types import Cluster, DeviceSpec, Job, ModelProfile

OBJECTIVES = ("bottleneck", "iteration")


# --------------------------------------------------------------------------- #
# layer times per device type


def _reference_device(profile: ModelProfile, profiled_device: DeviceSpec | None) -> DeviceSpec | None:
    if profiled_device is not None:
        return profiled_device
    name = (profile.profiled_device or "").strip()
    if not name or name == "unknown":
        return None
    from .hardware import load_device  # local: hardware imports the catalog

    try:
        return load_device(name)
    except InputError:
        return None


def scale_layer_times(
    profile: ModelProfile,
    device_types: Iterable[DeviceSpec],
    layer_times: Mapping[str, Sequence[float]] | None = None,
    *,
    profiled_device: DeviceSpec | None = None,
    precision: str = "auto",
) -> dict[str, np.ndarray]:
    """Forward+backward seconds of every layer on every device type.

    Args:
        profile: the model; its ``fwd_s + bwd_s`` are the reference times.
        device_types: device specs to produce times for (duplicates are fine).
        layer_times: optional measured columns ``{device name: (L,) seconds}``
            at the profile's batch size; these win over scaling.
        profiled_device: the device the profile was measured on; default: the
            catalog device named by ``profile.profiled_device``.
        precision: ``"auto"``, ``"fp32"`` or ``"fp16"`` (module docstring).

    Returns:
        ``{device name: float array (L,)}``, seconds at the profile's
        ``profiled_batch_size``.

    Raises:
        InputError: a ``layer_times`` column of the wrong length or with
            negative/non-finite values; an unknown precision; or more than one
            device type without measured columns and no known profiled device
            (times cannot be related across types: pass ``profiled_device``).
    """
    base = np.array([lay.fwd_s + lay.bwd_s for lay in profile.layers], dtype=float)
    prec = profile_precision(profile, precision)
    ref = _reference_device(profile, profiled_device)
    specs = {spec.name: spec for spec in device_types}
    given = dict(layer_times or {})
    out: dict[str, np.ndarray] = {}
    unscaled = [n for n in specs if n not in given]
    if ref is None and len(unscaled) > 1:
        raise InputError(
            f"model {profile.name!r}: profiled device {profile.profiled_device!r} is unknown, so its "
            f"layer times cannot be scaled to device types {', '.join(unscaled)}; pass "
            f"profiled_device=<DeviceSpec> (PipeDream profiles: v100-16gb) or per-type layer_times"
        )
    for name, spec in specs.items():
        if name in given:
            col = np.asarray(given[name], dtype=float)
            if col.shape != base.shape or not np.all(np.isfinite(col)) or np.any(col < 0):
                raise InputError(
                    f"layer_times[{name!r}]: expected {len(base)} finite seconds >= 0 "
                    f"(one per layer of {profile.name!r}), got shape {col.shape}"
                )
            out[name] = col.copy()
        elif ref is None or ref.name == name:
            out[name] = base.copy()
        else:
            out[name] = base * (device_rate_flops(ref, prec) / device_rate_flops(spec, prec))
    return out


# --------------------------------------------------------------------------- #
# the problem


@dataclass(frozen=True, eq=False)
class MappingProblem:
    """One pipeline to split and map onto candidate devices (units: s, bytes).

    Arrays (``T`` device types, ``L`` layers, ``D`` candidate devices, ``P``
    stages):
        layer_time_s: ``(T, L)`` fwd+bwd seconds per micro-batch of each layer
            on each type.
        device_type: ``(D,)`` type index of each candidate device.
        capacity_bytes: ``(D,)`` usable memory of each device (after reserve).
        static_bytes: ``(L,)`` bytes a layer holds whatever the schedule
            (parameters x state bytes).
        act_bytes: ``(L,)`` bytes a layer keeps per in-flight micro-batch
            (saved activations); zero for a per-layer constant memory.
        in_flight: ``(P,)`` micro-batches whose activations stage ``k`` holds.
        output_bytes: ``(L,)`` bytes sent forward after each layer.
        link_bandwidth_bytes_per_s, link_latency_s: ``(D, D)`` one direction
            of each device pair (diagonal unused; ``inf`` bandwidth is free).
        num_micro_batches: ``m`` of the ``"iteration"`` objective.
        type_names: name of each type; device_ids: cluster id of each
            candidate (reported in results); node_of: node of each candidate
            (for crossing counts), ``-1`` when unknown.
    """

    layer_time_s: np.ndarray
    device_type: np.ndarray
    capacity_bytes: np.ndarray
    static_bytes: np.ndarray
    act_bytes: np.ndarray
    in_flight: np.ndarray
    output_bytes: np.ndarray
    link_bandwidth_bytes_per_s: np.ndarray
    link_latency_s: np.ndarray
    num_micro_batches: int = 1
    type_names: tuple[str, ...] = ()
    device_ids: tuple[int, ...] = ()
    node_of: tuple[int, ...] = ()

    def __post_init__(self):
        f = lambda name, v: object.__setattr__(self, name, v)  # noqa: E731
        t = np.atleast_2d(np.asarray(self.layer_time_s, dtype=float))
        f("layer_time_s", t)
        T, L = t.shape
        f("device_type", np.asarray(self.device_type, dtype=np.int64).reshape(-1))
        D = len(self.device_type)
        for name, n in (("capacity_bytes", D), ("static_bytes", L), ("act_bytes", L), ("output_bytes", L)):
            v = np.asarray(getattr(self, name), dtype=float).reshape(-1)
            if v.shape != (n,):
                raise InputError(f"MappingProblem.{name}: expected {n} values, got {v.shape[0]}")
            f(name, v)
        f("in_flight", np.asarray(self.in_flight, dtype=np.int64).reshape(-1))
        for name in ("link_bandwidth_bytes_per_s", "link_latency_s"):
            v = np.asarray(getattr(self, name), dtype=float)
            if v.shape != (D, D):
                raise InputError(f"MappingProblem.{name}: expected shape ({D}, {D}), got {v.shape}")
            f(name, v)
        if L < 1 or D < 1 or len(self.in_flight) < 1:
            raise InputError(f"MappingProblem: need >= 1 layer, device and stage (got L={L}, D={D}, "
                             f"P={len(self.in_flight)})")
        if np.any(self.device_type < 0) or np.any(self.device_type >= T):
            raise InputError(f"MappingProblem.device_type: expected indices in [0, {T})")
        if not np.all(np.isfinite(t)) or np.any(t < 0):
            raise InputError("MappingProblem.layer_time_s: expected finite seconds >= 0")
        for name in ("static_bytes", "act_bytes", "output_bytes"):
            v = getattr(self, name)
            if not np.all(np.isfinite(v)) or np.any(v < 0):
                raise InputError(f"MappingProblem.{name}: expected finite bytes >= 0")
        off = ~np.eye(D, dtype=bool)
        if np.any(self.link_bandwidth_bytes_per_s[off] <= 0) or np.any(self.link_latency_s[off] < 0):
            raise InputError("MappingProblem links: expected bandwidth > 0 and latency >= 0")
        if np.any(self.in_flight < 0) or self.num_micro_batches < 1:
            raise InputError("MappingProblem: expected in_flight >= 0 and num_micro_batches >= 1")
        if not self.type_names:
            f("type_names", tuple(f"type{i}" for i in range(T)))
        if not self.device_ids:
            f("device_ids", tuple(range(D)))
        if not self.node_of:
            f("node_of", tuple([-1] * D))
        f("_time_prefix", np.concatenate([np.zeros((T, 1)), np.cumsum(t, axis=1)], axis=1))
        f("_static_prefix", np.concatenate([[0.0], np.cumsum(self.static_bytes)]))
        f("_act_prefix", np.concatenate([[0.0], np.cumsum(self.act_bytes)]))

    # -- sizes
    @property
    def num_layers(self) -> int:
        return self.layer_time_s.shape[1]

    @property
    def num_devices(self) -> int:
        return len(self.device_type)

    @property
    def num_types(self) -> int:
        return self.layer_time_s.shape[0]

    @property
    def pp(self) -> int:
        return len(self.in_flight)

    # -- exact evaluation of one solution: through the PipelineCosts of its
    #    order (costs_for_order), the one definition of compute, p2p, memory
    #    and fits (pipesearch.costs)
    def costs(self, order: Sequence[int]) -> PipelineCosts:
        """The :class:`pipesearch.costs.PipelineCosts` of stage ``k`` on
        candidate ``order[k]`` (:func:`costs_for_order`)."""
        return costs_for_order(self, order)

    def stage_times_s(self, order: Sequence[int], bounds: Sequence[int]) -> np.ndarray:
        """``a_k`` (compute + outgoing p2p) of every stage, seconds:
        :meth:`PipelineCosts.sum_term` of the order's costs."""
        s, b = np.arange(self.pp), np.asarray(bounds)
        return np.asarray(self.costs(order).sum_term(s, b[:-1], b[1:]), dtype=float)

    def fits(self, order: Sequence[int], bounds: Sequence[int]) -> bool:
        """:meth:`PipelineCosts.split_fits` of the order's costs."""
        return self.costs(order).split_fits(bounds)

    def objective_s(self, order: Sequence[int], bounds: Sequence[int], objective: str) -> float:
        return objective_value_s(self.stage_times_s(order, bounds), self.num_micro_batches, objective)

    def check_sizes(self) -> None:
        """InputError unless ``1 <= P <= min(L, D)``."""
        if self.pp > self.num_layers:
            raise InputError(f"pp={self.pp} stages > {self.num_layers} layers: every stage needs a layer")
        if self.pp > self.num_devices:
            raise InputError(f"pp={self.pp} stages > {self.num_devices} candidate devices "
                             f"(each device runs at most one stage)")

    def type_speed_rank(self) -> np.ndarray:
        """Candidate devices' total model time on their type (smaller = faster)."""
        return self._time_prefix[self.device_type, -1]


def objective_value_s(a: np.ndarray, m: int, objective: str) -> float:
    """``max_k a_k`` (``"bottleneck"``) or ``sum_k a_k + (m-1) max_k a_k``
    (``"iteration"``) of the stage times ``a`` (module docstring)."""
    if objective == "bottleneck":
        return float(a.max())
    if objective == "iteration":
        return float(a.sum() + (m - 1) * a.max())
    raise InputError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")


def _check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise InputError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")


def problem_from_profile(
    profile: ModelProfile,
    cluster: Cluster,
    job: Job,
    *,
    pp: int,
    micro_batch_size: int,
    num_micro_batches: int,
    schedule: str = "1f1b",
    devices: Sequence[int] | None = None,
    layer_times: Mapping[str, Sequence[float]] | None = None,
    profiled_device: DeviceSpec | None = None,
    precision: str = "auto",
) -> MappingProblem:
    """The :class:`MappingProblem` of a profiled model on (some of) a cluster.

    Terms follow :func:`pipesearch.costs.build_pipeline_costs` with ``dp = 1``:
    activations scale by ``micro_batch_size / profiled_batch_size``, times by
    :meth:`ModelProfile.time_ratio_at` (fixed + per-sample where profiled);
    ``static = param_bytes * state_bytes_per_param / bytes_per_param``;
    capacity ``= memory_bytes * (1 - job.memory_headroom_fraction) -
    job.memory_reserve_bytes`` (:func:`pipesearch.memory.usable_memory_bytes`); links from
    :meth:`Cluster.link`.

    Args:
        devices: candidate cluster device ids (default: all).
        layer_times, profiled_device, precision: see :func:`scale_layer_times`.

    Raises:
        InputError: bad device id, schedule or layer_times.
    """
    ids = list(range(cluster.num_devices)) if devices is None else [int(d) for d in devices]
    for d in ids:
        if not 0 <= d < cluster.num_devices:
            raise InputError(f"device id {d}: expected 0 .. {cluster.num_devices - 1} ({cluster.name})")
    if len(set(ids)) != len(ids):
        raise InputError(f"devices {ids}: duplicate ids")
    specs = [cluster.device_spec(d) for d in ids]
    names = list(dict.fromkeys(s.name for s in specs))
    times = scale_layer_times(profile, specs, layer_times, profiled_device=profiled_device,
                              precision=precision)
    ratio = micro_batch_size / profile.profiled_batch_size
    arr = np.array(ids, dtype=np.int64)
    kind = link_class(cluster, arr[:, None], arr[None, :])  # -1 on the diagonal
    classes = class_links(cluster)
    bw = np.array([link.bandwidth_bytes_per_s for link in classes] + [np.inf])[kind]
    lat = np.array([link.latency_s for link in classes] + [0.0])[kind]
    layers = profile.layers
    return MappingProblem(
        layer_time_s=np.array([times[n] for n in names]) * profile.time_ratio_at(micro_batch_size),
        device_type=np.array([names.index(s.name) for s in specs]),
        capacity_bytes=usable_memory_bytes(job, np.array([s.memory_bytes for s in specs])),
        static_bytes=np.array([lay.param_bytes for lay in layers], dtype=float)
        * (state_bytes_per_param(job, 1) / profile.bytes_per_param),
        act_bytes=np.array([lay.saved_bytes for lay in layers], dtype=float) * ratio,
        in_flight=in_flight_micro_batches(schedule, pp, num_micro_batches),
        output_bytes=np.array([lay.output_bytes for lay in layers], dtype=float) * ratio,
        link_bandwidth_bytes_per_s=bw,
        link_latency_s=lat,
        num_micro_batches=num_micro_batches,
        type_names=tuple(names),
        device_ids=tuple(ids),
        node_of=tuple(cluster.node_of(d) for d in ids),
    )


# --------------------------------------------------------------------------- #
# results


@dataclass(frozen=True)
class MappingResult:
    """A split plus a device per stage.

    Attributes:
        bounds: stage boundaries ``0 = b_0 < ... < b_P = L`` (stage ``k`` holds
            layers ``[b_k, b_{k+1})``).
        devices: cluster device id of each stage (``problem.device_ids``).
        objective: ``"bottleneck"`` or ``"iteration"``.
        objective_s: the objective of this solution, seconds, evaluated in
            floating point (:meth:`MappingProblem.objective_s`).
        bottleneck_s: ``max_k a_k``; iteration_time_s: ``sum a_k + (m-1) max a_k``.
        stage_time_s: ``a_k`` per stage (compute + outgoing p2p).
        status: ``"OPTIMAL"`` (proved, up to ``scale_error_s`` for CP-SAT) or
            ``"FEASIBLE"``.
        best_bound_s: a proved lower bound on the objective, seconds.
        gap: ``(objective_s - best_bound_s) / objective_s`` (0 when optimal).
        wall_s: seconds spent.
        method: ``"cp-sat"``, ``"orders+dp"`` or ``"exhaustive"``.
        solver_status: the raw CP-SAT status name (empty for other methods).
        scale_error_s: bound on how far the integer-scaled CP-SAT objective of
            any solution is from its exact value (0 for exact methods).
        candidates: device orders (``"orders+dp"``) or orders x splits
            (``"exhaustive"``) examined; 1 for CP-SAT (its model size is in
            ``stats``).
        stats: extra figures as ``(name, value)`` pairs.
    """

    bounds: tuple[int, ...]
    devices: tuple[int, ...]
    objective: str
    objective_s: float
    bottleneck_s: float
    iteration_time_s: float
    stage_time_s: tuple[float, ...]
    status: str
    best_bound_s: float
    gap: float
    wall_s: float
    method: str
    solver_status: str = ""
    scale_error_s: float = 0.0
    candidates: int = 0
    stats: tuple[tuple[str, object], ...] = field(default=())

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.bounds, self.bounds[1:]))

    @property
    def pp(self) -> int:
        return len(self.devices)


def make_result(problem: MappingProblem, order: Sequence[int], bounds: Sequence[int], objective: str,
                **kw) -> MappingResult:
    """A :class:`MappingResult` of candidate indices ``order`` and ``bounds``,
    with every time re-evaluated exactly; ``kw`` fills the solver fields."""
    a = problem.stage_times_s(order, bounds)
    bottleneck = objective_value_s(a, problem.num_micro_batches, "bottleneck")
    iteration = objective_value_s(a, problem.num_micro_batches, "iteration")
    value = bottleneck if objective == "bottleneck" else iteration
    kw.setdefault("status", "OPTIMAL")
    kw.setdefault("best_bound_s", value)
    kw.setdefault("gap", 0.0 if kw["status"] == "OPTIMAL" else
                  max(0.0, (value - kw["best_bound_s"]) / value) if value > 0 else 0.0)
    kw.setdefault("wall_s", 0.0)
    kw.setdefault("method", "")
    return MappingResult(
        bounds=tuple(int(b) for b in bounds),
        devices=tuple(problem.device_ids[d] for d in order),
        objective=objective, objective_s=value, bottleneck_s=bottleneck, iteration_time_s=iteration,
        stage_time_s=tuple(float(x) for x in a), **kw,
    )


def device_indices(problem: MappingProblem, result: MappingResult) -> tuple[int, ...]:
    """Candidate indices (rows of the problem) of a result's devices."""
    pos = {d: i for i, d in enumerate(problem.device_ids)}
    return tuple(pos[d] for d in result.devices)


# --------------------------------------------------------------------------- #
# fixed order -> exact split (partition.optimal_split / min_max_split)


@dataclass(frozen=True, eq=False)
class StageTimeCosts(PipelineCosts):
    """:class:`PipelineCosts` whose stages have their own per-layer times
    (device types whose times are not proportional to each other).

    ``stage_compute_prefix_s`` is ``(P, L+1)``; ``compute_prefix_s`` must be
    the prefix of the element-wise minimum over stages and ``time_scale[s] <=
    1``, so that the DP's band pruning (which uses ``time_scale[s] *
    (compute_prefix_s[j] - compute_prefix_s[i])`` as a lower bound of a stage's
    compute) stays valid; and stages with different rows must have different
    ``time_scale`` values (the DP caches a stage's terms by it).
    :func:`with_stage_times` builds it that way.
    """

    stage_compute_prefix_s: np.ndarray = None  # type: ignore[assignment]

    def compute_s(self, s, i, j):
        """Like :meth:`PipelineCosts.compute_s`; ``s`` may be an int or an
        array broadcastable with ``i`` and ``j``."""
        p = self.stage_compute_prefix_s
        return p[s, j] - p[s, i]


def with_stage_times(costs: PipelineCosts, stage_layer_time_s: np.ndarray) -> PipelineCosts:
    """``costs`` with stage ``s``'s per-micro-batch layer times replaced by row
    ``s`` of ``stage_layer_time_s`` (``(P, L)``, seconds).

    When every row is a multiple of ``costs``' own per-layer times the result
    is ``costs`` with a new ``time_scale``; when every row is a multiple of one
    of the rows, a plain :class:`PipelineCosts` with that row as
    ``compute_prefix_s``; otherwise a :class:`StageTimeCosts` (whose
    ``fwd_prefix_s`` and ``bwd_input_prefix_s`` keep the original times:
    only ``compute_s`` is per stage).
    """
    t = np.asarray(stage_layer_time_s, dtype=float)
    zero = np.zeros(1)
    if not np.any(t):
        return replace(costs, compute_prefix_s=np.zeros(t.shape[1] + 1), time_scale=np.zeros(len(t)))
    # multiples of the costs' own per-layer times: keep them (and fwd_prefix_s,
    # bwd_input_prefix_s stay consistent with time_scale)
    for ref, keep in ((np.diff(costs.compute_prefix_s), True), (t[int(np.argmax(t.sum(axis=1)))], False)):
        total = ref.sum()
        if total > 0:
            scale = t.sum(axis=1) / total
            if np.allclose(t, scale[:, None] * ref[None, :], rtol=1e-12, atol=0.0):
                if keep:
                    return replace(costs, time_scale=scale)
                return replace(costs, compute_prefix_s=np.concatenate([zero, np.cumsum(ref)]), time_scale=scale)
    low = t.min(axis=0)
    # time_scale: one distinct value <= 1 per distinct row. partition's band
    # cache keys a stage's terms by time_scale[s] (with its links), and its
    # pruning uses time_scale[s] * (prefix of `low`) as a lower bound of the
    # stage's compute: both hold with these values.
    _, row_id = np.unique(t, axis=0, return_inverse=True)
    fields = {f.name: getattr(costs, f.name) for f in dataclass_fields(PipelineCosts) if f.init}
    fields.update(compute_prefix_s=np.concatenate([zero, np.cumsum(low)]),
                  time_scale=1.0 - 1e-6 * np.asarray(row_id, dtype=float).reshape(-1))
    return StageTimeCosts(
        **fields,
        stage_compute_prefix_s=np.concatenate([np.zeros((len(t), 1)), np.cumsum(t, axis=1)], axis=1),
    )


def costs_for_order(problem: MappingProblem, order: Sequence[int], num_micro_batches: int | None = None
                    ) -> PipelineCosts:
    """The :class:`PipelineCosts` of ``problem`` with stage ``k`` on candidate
    ``order[k]`` (dp = 1: no all-reduce). ``num_micro_batches`` overrides
    ``problem.num_micro_batches`` (2 turns ``max_term`` into ``a_k``)."""
    P = problem.pp
    if len(order) != P:
        raise InputError(f"device order {tuple(order)}: expected {P} devices")
    o = np.asarray(order, dtype=np.int64)
    nxt = np.append(o[1:], o[-1])
    bw = np.where(np.arange(P) < P - 1, problem.link_bandwidth_bytes_per_s[o, nxt], np.inf)
    lat = np.where(np.arange(P) < P - 1, problem.link_latency_s[o, nxt], 0.0)
    L = problem.num_layers
    base = PipelineCosts(
        num_micro_batches=int(num_micro_batches or problem.num_micro_batches),
        compute_prefix_s=np.zeros(L + 1),
        fwd_prefix_s=np.zeros(L + 1),
        param_prefix_bytes=problem._static_prefix,
        saved_prefix_bytes=problem._act_prefix,
        output_bytes=problem.output_bytes,
        time_scale=np.ones(P),
        p2p_bandwidth_bytes_per_s=bw,
        p2p_latency_s=lat,
        allreduce_s_per_byte=np.zeros(P),
        allreduce_fixed_s=np.zeros(P),
        in_flight=problem.in_flight,
        capacity_bytes=problem.capacity_bytes[o],
        state_bytes_per_param_byte=1.0,
        grad_bytes_per_param_byte=0.0,
    )
    return with_stage_times(base, problem.layer_time_s[problem.device_type[o]])


def best_split_for_order(problem: MappingProblem, order: Sequence[int], objective: str = "bottleneck"
                         ) -> MappingResult | None:
    """The exact best split for a fixed stage -> device order.

    ``"iteration"``: :func:`pipesearch.partition.optimal_split`; ``"bottleneck"``:
    :func:`pipesearch.partition.min_max_split` on costs with ``m = 2`` (so that
    ``max_term = a_k``). ``order`` holds candidate indices (rows of the
    problem). Returns None when no split fits in memory.
    """
    _check_objective(objective)
    if problem.pp > problem.num_layers:
        return None
    if objective == "iteration":
        res = optimal_split(costs_for_order(problem, order))
        if res is None:
            return None
        bounds = res.bounds
    else:
        _, bounds = min_max_split(costs_for_order(problem, order, num_micro_batches=2))
        if bounds is None:
            return None
    return make_result(problem, order, bounds, objective, method="orders+dp", candidates=1)


# --------------------------------------------------------------------------- #
# heuristic orders


def greedy_orders(problem: MappingProblem) -> list[tuple[int, ...]]:
    """A few heuristic orders of ``P`` candidates (seeds for the solvers):
    fastest devices first (ties: larger memory, same node, lower index), the
    same set with the largest memory on the first stage (1F1B's stage 0 holds
    the most activations), the largest-memory devices, and the
    node-contiguous prefix of the candidates."""
    P, D = problem.pp, problem.num_devices
    speed = problem.type_speed_rank()
    node = np.asarray(problem.node_of)
    cap = problem.capacity_bytes
    fast = sorted(range(D), key=lambda d: (speed[d], -cap[d], node[d], d))[:P]
    orders = [tuple(sorted(fast, key=lambda d: (speed[d], node[d], d)))]
    orders.append(tuple(sorted(fast, key=lambda d: (-cap[d], speed[d], node[d], d))))
    big = sorted(range(D), key=lambda d: (-cap[d], speed[d], node[d], d))[:P]
    orders.append(tuple(sorted(big, key=lambda d: (-cap[d], speed[d], node[d], d))))
    orders.append(tuple(sorted(range(D), key=lambda d: (node[d], d))[:P]))
    return list(dict.fromkeys(orders))


def greedy_mapping(problem: MappingProblem, objective: str = "bottleneck", *, enumerate_up_to: int = 200
                   ) -> MappingResult | None:
    """Best of :func:`greedy_orders` (or of every order, up to symmetry, when
    there are at most ``enumerate_up_to``), each with its exact split; None
    when none fits."""
    if problem.pp > min(problem.num_layers, problem.num_devices):
        return None
    orders: Iterable[tuple[int, ...]] = greedy_orders(problem)
    if count_orders(problem, problem.pp) <= enumerate_up_to:
        orders = device_orders(problem, problem.pp)
    best = None
    for order in orders:
        res = best_split_for_order(problem, order, objective)
        if res is not None and (best is None or res.objective_s < best.objective_s):
            best = res
    return best


# --------------------------------------------------------------------------- #
# exact methods for small instances


def order_enumeration_mapping(problem: MappingProblem, objective: str = "iteration", *,
                              max_orders: int = 200_000) -> MappingResult:
    """Exact mapping: every device order (up to symmetry) with its exact split.

    Exact for both objectives, since the split of each order is exact
    (:func:`best_split_for_order`). Cost: :func:`count_orders` DPs.

    Raises:
        InputError: ``P > L``, ``P > D``, or more than ``max_orders`` orders.
        InfeasibleError: no order has a split that fits in memory.
    """
    import time

    _check_objective(objective)
    problem.check_sizes()
    n = count_orders(problem, problem.pp)
    if n > max_orders:
        raise InputError(f"{n} device orders > max_orders={max_orders}: use pipesearch.ilp.solve_mapping")
    start = time.perf_counter()
    best, seen = None, 0
    for order in device_orders(problem, problem.pp):
        seen += 1
        res = best_split_for_order(problem, order, objective)
        if res is not None and (best is None or res.objective_s < best.objective_s):
            best = res
    if best is None:
        raise InfeasibleError(_no_fit_message(problem))
    return replace(best, wall_s=time.perf_counter() - start, method="orders+dp", candidates=seen)


def exhaustive_mapping(problem: MappingProblem, objective: str = "bottleneck") -> MappingResult:
    """Brute force over every ordered ``P``-subset of devices and every split
    (``D!/(D-P)! * C(L-1, P-1)`` candidates; the reference for tests on tiny
    instances). Ties keep the first found.

    Raises:
        InputError: ``P > L`` or ``P > D``.
        InfeasibleError: nothing fits in memory.
    """
    import time

    _check_objective(objective)
    problem.check_sizes()
    start = time.perf_counter()
    L, P = problem.num_layers, problem.pp
    best = None
    seen = 0
    s = np.arange(P)
    for order in itertools.permutations(range(problem.num_devices), P):
        costs = problem.costs(order)
        for cut in itertools.combinations(range(1, L), P - 1):
            seen += 1
            bounds = np.array((0, *cut, L))
            if not costs.split_fits(bounds):
                continue
            a = np.asarray(costs.sum_term(s, bounds[:-1], bounds[1:]), dtype=float)
            value = objective_value_s(a, problem.num_micro_batches, objective)
            if best is None or value < best[0]:
                best = (value, order, tuple(int(x) for x in bounds))
    if best is None:
        raise InfeasibleError(_no_fit_message(problem))
    return make_result(problem, best[1], best[2], objective, method="exhaustive", candidates=seen,
                       wall_s=time.perf_counter() - start)


def _no_fit_message(problem: MappingProblem) -> str:
    static = float(problem._static_prefix[-1])
    act = float(problem._act_prefix[-1])
    caps = np.sort(problem.capacity_bytes)[::-1][: problem.pp]
    return (
        f"no split of {problem.num_layers} layers into {problem.pp} stages fits on any {problem.pp} of "
        f"the {problem.num_devices} candidate devices: the model needs {static / 2**30:.2f} GiB of "
        f"parameters/state plus {act / 2**30:.2f} GiB of activations per in-flight micro-batch, the "
        f"{problem.pp} largest devices hold {caps.sum() / 2**30:.2f} GiB in all; use more stages, "
        f"smaller micro-batches, recomputation or larger devices"
    )
