"""Split + device assignment + memory as one CP-SAT model (OR-Tools).

Solves the :class:`pipesearch.mapping.MappingProblem`: cut ``L`` layers into
``P`` contiguous stages and put stage ``k`` on one of ``D >= P`` candidate
devices (each device at most one stage, memory a hard limit), minimizing

* ``"bottleneck"``: ``max_k a_k`` with ``a_k = compute_k + p2p_k`` (BaPipe,
  Zhao et al. 2020, arXiv:2012.12544; PipeDream's planner, Narayanan et al.
  SOSP'19), or
* ``"iteration"``: ``sum_k a_k + (m-1) max_k a_k``, pipesearch's analytic
  iteration time for ``dp = 1`` (:mod:`pipesearch.costs`): the sum term is
  linear in the model's stage-time variables, so it is exact in CP-SAT too.

Related planners: Metis (Um et al., ATC'24) and AMP (Li et al., NeurIPS'22)
search heterogeneous device groupings with similar stage cost models; the
model here is the exact single-pipeline core.

Model (``T`` types, ``Q`` link classes = distinct (bandwidth, latency) pairs)
----------------------------------------------------------------------------
* ``x[l][k]`` (bool): layer ``l`` is in stage ``k``; created only for
  ``max(0, P-L+l) <= k <= min(l, P-1)``. ``sum_k x[l][k] = 1``. With
  ``u[l][k] = sum_{k' <= k} x[l][k']`` (a linear expression): ``u[l+1][k] <=
  u[l][k]`` (stage index non-decreasing along the chain) and ``sum_l x[l][k] >=
  1`` (no stage empty): stages are contiguous, non-empty and in order.
  ``e[l][k] = u[l][k] - u[l+1][k]`` (exactly 0/1, no variable): stage ``k``
  ends after layer ``l``.
* ``y[k][d]`` (bool): stage ``k`` on device ``d``; exactly one per stage, at
  most one per device. ``yt[k][t] = sum_{d of type t} y[k][d]`` (bool).
* ``lc[k][q]`` (bool, ``k < P-1``): the link from stage ``k``'s device to stage
  ``k+1``'s is of class ``q``: exactly one per ``k``, and ``lc[k][q] >= y[k][d]
  + sum_{d' : class(d, d') = q} y[k+1][d'] - 1`` for every ``d`` (``D * Q``
  linear constraints per boundary instead of ``D^2`` products ``z[k][d][d']``).
* ``comp[k] >= sum_l T[t][l] x[l][k]`` enforced by ``yt[k][t]``, plus the
  unconditional ``comp[k] >= sum_l min_t T[t][l] x[l][k]`` (LP strength);
  ``p2p[k] >= sum_l C[q][l] e[l][k]`` enforced by ``lc[k][q]``, plus the
  unconditional minimum over classes; ``B >= comp[k] + p2p[k]``.
* memory: ``sum_l M[k][l] x[l][k] <= sum_d cap[d] y[k][d]`` with ``M[k][l] =
  static[l] + in_flight[k] * act[l]`` (bytes; the in-flight count of stage
  ``k``, e.g. 1F1B's ``min(m, P-k)``; ``act = 0`` for a per-layer constant).
* symmetry breaking: inside a class of interchangeable devices
  (:func:`pipesearch.device_orders.device_classes`: same type, capacity and links)
  a device is used only if the previous one is, and on a later stage.
* ``B``'s domain starts at the fluid bound (:func:`fluid_lower_bound_s`: the
  work spread over the ``P`` fastest devices as if layers were divisible),
  which the LP relaxation of the enforced constraints does not see; it closes
  the gap of the 64-layer, 16-device benchmark from 57% to a proof.
* objective: ``B`` or ``sum_k (comp[k] + p2p[k]) + (m-1) B``.

Size: ``<= L*P`` + ``P*D`` + ``P*T`` + ``(P-1)*Q`` + ``D`` booleans and ``2P+1``
integers; about ``L*P + P*(T+Q+D) + D*Q*P`` constraints (``stats`` of the
result has the exact counts).

Integer scaling
---------------
Times become integers in units of ``unit = lb / resolution`` seconds, with
``lb = max(sum_l t_min[l] / P, max_l t_min[l])`` a lower bound of the
bottleneck (``t_min``: fastest candidate type) and ``resolution = 10**6`` by
default. Layer times are rounded as prefix sums, ``T[t][l] = round(S_t[l+1] /
unit) - round(S_t[l] / unit)``, so a stage's integer compute is within 1 unit
of the exact one whatever its length; each p2p term is rounded once (0.5
unit). Every stage time is thus within ``1.5 unit`` of exact: the bottleneck
objective within ``1.5 unit`` (``1.5e-6`` relative to the bound with the
default), the iteration objective within ``1.5 (P + m - 1)`` units
(``MappingResult.scale_error_s``), and a solution the solver proves optimal is
within twice that of the exact optimum. The returned ``objective_s`` is
re-evaluated in floating point, the split of the solver's device order is
re-optimized exactly with :func:`pipesearch.mapping.best_split_for_order`
(``polish``), and ``best_bound_s`` is the solver's bound minus the error bound,
hence a valid bound on the exact objective. Memory is in bytes, rounded the
same way (exact for integral byte counts, within 1 byte otherwise).

Determinism
-----------
``random_seed`` is fixed (default 0) and, with ``deterministic=True`` (default),
``interleave_search`` is set, the CP-SAT mode whose parallel search does not
depend on thread timing (the ``core`` subsolver is then left out: in that
mode a task runs to its end, and the core search crawls up the large integer
objective range in steps of a few units, 24 s instead of 0.1 s on VGG-16;
measured without interleaving the solver is no faster on the benchmarks of
docs/heterogeneous.md). There is no wall-clock limit: ``max_deterministic_time``
bounds the work in machine-independent units, so a run gives the same status,
objective, bound and plan on any machine under any load (which of several
optimal solutions comes back may change with the OR-Tools version).

Solver bug work-around
----------------------
OR-Tools 9.15's inclusion-detection presolve (``ProcessAtMostOneAndLinear``)
drops the optimum of some instances of this model and still reports OPTIMAL
(google/or-tools#5293; found by the brute-force comparison in
tests/test_ilp.py: 2 of 300 random instances). ``presolve_inclusion_work_limit
= 0`` turns that step off (``inclusion_presolve=True`` turns it back on); the
exact re-split and the greedy seed are kept as candidates as well, so a
returned plan is never worse than the greedy one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from .class_dp import class_dp_applies, class_dp_mapping
from .errors import InfeasibleError, InputError, PipesearchError
from .device_orders import canonical_order, count_orders, device_classes
from .mapping import (
    OBJECTIVES,
    MappingProblem,
    MappingResult,
    _no_fit_message,
    best_split_for_order,
    greedy_mapping,
    make_result,
    order_enumeration_mapping,
    problem_from_profile,
)
from .types import Cluster, DeviceSpec, Job, ModelProfile

if TYPE_CHECKING:  # CP-SAT (with pandas, which it imports) loads only when a model is built
    from ortools.sat.python import cp_model

__all__ = ["MappingResult", "CpSatModel", "build_model", "fluid_lower_bound_s", "solve_mapping", "map_pipeline"]

#: CP-SAT work limit (deterministic time units, about seconds of one core)
DEFAULT_DETERMINISTIC_TIME = 30.0
DEFAULT_RESOLUTION = 1_000_000


def _round_prefix(prefix: np.ndarray, unit: float) -> np.ndarray:
    """Per-item integers whose partial sums are ``round(prefix / unit)``."""
    r = np.rint(np.asarray(prefix, dtype=float) / unit).astype(np.int64)
    return np.diff(r, axis=-1)


@dataclass
class CpSatModel:
    """A built model with its variables and integer data (see module docstring)."""

    model: cp_model.CpModel
    objective: str
    unit_s: float
    scale_error_s: float
    x: dict
    y: list
    yt: list
    lc: list
    comp: list
    p2p: list
    bottleneck: cp_model.IntVar
    used: list
    time_int: np.ndarray      # (T, L)
    comm_int: np.ndarray      # (Q, L)
    mem_int: np.ndarray       # (P, L)
    cap_int: np.ndarray       # (D,)
    link_class: np.ndarray    # (D, D), -1 on the diagonal
    num_classes: int
    symmetry_classes: list
    fluid_bound_s: float = 0.0

    def stats(self) -> dict:
        proto = self.model.Proto()
        return {
            "variables": len(proto.variables),
            "constraints": len(proto.constraints),
            "booleans": sum(1 for v in proto.variables if list(v.domain) == [0, 1]),
            "unit_s": self.unit_s,
            "link_classes": self.num_classes,
            "symmetry_classes": len(self.symmetry_classes),
            "fluid_bound_s": self.fluid_bound_s,
        }

    def int_stage_times(self, problem: MappingProblem, order: Sequence[int], bounds: Sequence[int]):
        """Integer ``(comp, p2p)`` of a solution, as the model computes them."""
        P = problem.pp
        comp = [int(self.time_int[problem.device_type[order[k]], bounds[k]:bounds[k + 1]].sum()) for k in range(P)]
        p2p = [int(self.comm_int[self.link_class[order[k], order[k + 1]], bounds[k + 1] - 1])
               for k in range(P - 1)]
        return comp, p2p


def _lower_bound_s(problem: MappingProblem) -> float:
    types = np.unique(problem.device_type)
    tmin = problem.layer_time_s[types].min(axis=0)
    return float(max(tmin.sum() / problem.pp, tmin.max()))


def fluid_lower_bound_s(problem: MappingProblem) -> float:
    """A lower bound of the bottleneck's compute part: the work spread over the
    ``P`` fastest candidates as if layers were divisible.

    With ``t_ref[l] = min_t t[t][l]`` and ``s_t = min_l t[t][l] / t_ref[l]``
    (``s_t`` is the exact slow-down of type ``t`` when types are
    proportional), a stage of type ``t`` holding work ``W_k = sum t_ref[l]``
    computes at least ``s_t W_k``; ``max_k s_k W_k >= sum_k W_k / sum_k
    (1 / s_k)``, and the denominator is at most the sum of the ``P`` largest
    ``1 / s_d`` over candidates. Also at least the longest layer on its
    fastest type.
    """
    types = np.unique(problem.device_type)
    t = problem.layer_time_s[types]
    tref = t.min(axis=0)
    pos = tref > 0
    if not np.any(pos):
        return 0.0
    slow = {int(ty): float(np.min(t[i, pos] / tref[pos])) for i, ty in enumerate(types)}
    speed = np.sort([1.0 / slow[int(problem.device_type[d])] for d in range(problem.num_devices)])[::-1]
    return float(max(tref.sum() / speed[: problem.pp].sum(), tref.max()))


def build_model(problem: MappingProblem, objective: str = "bottleneck", *,
                resolution: int = DEFAULT_RESOLUTION, symmetry_breaking: bool = True,
                unit_s: float | None = None, min_bottleneck_s: float = 0.0) -> CpSatModel:
    """The CP-SAT model of ``problem`` (module docstring), without hints.

    Args:
        resolution: time units per lower bound of the bottleneck.
        unit_s: time unit in seconds (overrides ``resolution``).
        min_bottleneck_s: a known lower bound of ``max_k a_k`` over all
            feasible solutions (e.g. ``best_bound_s`` of a bottleneck solve),
            added to ``B``'s domain.

    Raises:
        InputError: unknown objective, ``P > L`` or ``P > D``.
    """
    if objective not in OBJECTIVES:
        raise InputError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    problem.check_sizes()
    L, P, D = problem.num_layers, problem.pp, problem.num_devices
    m = problem.num_micro_batches
    if unit_s is None:
        lb = _lower_bound_s(problem)
        unit_s = (lb if lb > 0 else 1.0) / resolution
    unit = float(unit_s)

    time_int, link_class, pairs, comm_int, mem_int, cap_int = _integer_data(problem, unit)
    Q = max(len(pairs), 1)

    from ortools.sat.python import cp_model

    md = cp_model.CpModel()
    md.SetName(f"pipesearch-mapping-{objective}")
    x, u = _split_vars(md, L, P)
    y, types, yt = _assignment_vars(md, problem, P, D)
    hi_comp = int(time_int[types].sum(axis=1).max())
    hi_comm = int(comm_int.max()) if comm_int.size else 0
    comp = _compute_vars(md, x, yt, time_int, types, hi_comp, L, P)
    p2p, lc = _p2p_vars(md, x, u, y, comm_int, hi_comm, link_class, Q, L, P, D, len(pairs) > 1)
    fluid_s = fluid_lower_bound_s(problem)
    lo_b = max(0, int(np.ceil(fluid_s / unit - 1.0 - 1e-9)), int(np.ceil(min_bottleneck_s / unit - 1.5 - 1e-9)))
    bottleneck = md.NewIntVar(min(lo_b, hi_comp + hi_comm), hi_comp + hi_comm, "B")
    for k in range(P):
        md.Add(bottleneck >= comp[k] + (p2p[k] if k < P - 1 else 0))
    for k in range(P):  # memory
        ls = [l for l in range(L) if (l, k) in x]
        md.Add(sum(int(mem_int[k, l]) * x[l, k] for l in ls) <= sum(int(cap_int[d]) * y[k][d] for d in range(D)))
    classes = device_classes(problem)
    used = _break_symmetry(md, y, classes, P, D) if symmetry_breaking else [None] * D
    if objective == "bottleneck":
        md.Minimize(bottleneck)
        err = 1.5 * unit
    else:
        md.Minimize(sum(comp) + sum(p2p) + (m - 1) * bottleneck)
        err = 1.5 * (P + m - 1) * unit
    return CpSatModel(model=md, objective=objective, unit_s=unit, scale_error_s=err, x=x, y=y, yt=yt, lc=lc,
                      comp=comp, p2p=p2p, bottleneck=bottleneck, used=used, time_int=time_int,
                      comm_int=comm_int, mem_int=mem_int, cap_int=cap_int, link_class=link_class,
                      num_classes=len(pairs), symmetry_classes=classes, fluid_bound_s=fluid_s)


def _integer_data(problem: MappingProblem, unit: float):
    """``(time_int (T, L), link_class (D, D), pairs, comm_int (Q, L),
    mem_int (P, L), cap_int (D,))``: layer-time prefixes in units of
    ``unit`` seconds, each ordered device pair's class among the distinct
    ``(bandwidth, latency)`` ``pairs`` (-1 on the diagonal), each class's
    round trip of a layer's output in units, memory prefixes and
    capacities in bytes."""
    D = problem.num_devices
    time_int = _round_prefix(problem._time_prefix, unit)
    bw, lat = problem.link_bandwidth_bytes_per_s, problem.link_latency_s
    pairs: dict[tuple[float, float], int] = {}
    link_class = np.full((D, D), -1, dtype=np.int64)
    for a in range(D):
        for b in range(D):
            if a != b:
                link_class[a, b] = pairs.setdefault((float(bw[a, b]), float(lat[a, b])), len(pairs))
    comm = np.zeros((max(len(pairs), 1), problem.num_layers))
    for (b_, l_), q in pairs.items():
        comm[q] = 2.0 * (l_ + problem.output_bytes / b_)
    comm_int = np.rint(comm / unit).astype(np.int64)
    mem_prefix = problem._static_prefix[None, :] + problem.in_flight[:, None] * problem._act_prefix[None, :]
    mem_int = _round_prefix(mem_prefix, 1.0)
    cap_int = np.floor(problem.capacity_bytes).astype(np.int64)
    return time_int, link_class, pairs, comm_int, mem_int, cap_int


def _split_vars(md, L: int, P: int):
    """``(x, u)``: ``x[l, k]``, layer ``l`` on stage ``k`` (only the pairs a
    split of ``L`` layers into ``P`` non-empty stages allows), each layer on
    one stage, stages in layer order and non-empty; ``u(l, k)``: layer
    ``l`` on a stage ``<= k`` (an expression, or the constant 0 / 1)."""
    x = {}
    for l in range(L):
        for k in range(max(0, P - L + l), min(l, P - 1) + 1):
            x[l, k] = md.NewBoolVar(f"x[{l},{k}]")
    for l in range(L):
        md.AddExactlyOne([x[l, k] for k in range(P) if (l, k) in x])

    def u(l: int, k: int):
        terms = [x[l, kk] for kk in range(k + 1) if (l, kk) in x]
        if not terms:
            return 0
        return sum(terms) if len(terms) < sum(1 for kk in range(P) if (l, kk) in x) else 1

    for l in range(L - 1):
        for k in range(P - 1):
            lhs, rhs = u(l + 1, k), u(l, k)
            if not (isinstance(lhs, int) and isinstance(rhs, int)):
                md.Add(lhs <= rhs)
    for k in range(P):
        md.Add(sum(x[l, k] for l in range(L) if (l, k) in x) >= 1)
    return x, u


def _assignment_vars(md, problem: MappingProblem, P: int, D: int):
    """``(y, types, yt)``: ``y[k][d]``, stage ``k`` on device ``d`` (one
    device per stage, at most one stage per device), the device types, and
    ``yt[k][t]``, stage ``k`` on a device of type ``t`` (1 with one type)."""
    y = [[md.NewBoolVar(f"y[{k},{d}]") for d in range(D)] for k in range(P)]
    for k in range(P):
        md.AddExactlyOne(y[k])
    for d in range(D):
        md.AddAtMostOne([y[k][d] for k in range(P)])
    types = sorted(set(int(t) for t in problem.device_type))
    yt: list[dict[int, object]] = []
    for k in range(P):
        row = {}
        for t in types:
            members = [y[k][d] for d in range(D) if problem.device_type[d] == t]
            if len(types) == 1:
                row[t] = 1
            else:
                v = md.NewBoolVar(f"yt[{k},{t}]")
                md.Add(v == sum(members))
                row[t] = v
        yt.append(row)
    return y, types, yt


def _compute_vars(md, x, yt, time_int, types, hi_comp: int, L: int, P: int) -> list:
    """``comp[k]``: stage ``k``'s compute in units (at most ``hi_comp``), at
    least its layers' on the fastest type and, with several types, their
    time on its own."""
    comp = [md.NewIntVar(0, hi_comp, f"comp[{k}]") for k in range(P)]
    tmin = time_int[types].min(axis=0)
    for k in range(P):
        ls = [l for l in range(L) if (l, k) in x]
        md.Add(comp[k] >= sum(int(tmin[l]) * x[l, k] for l in ls))
        if len(types) > 1:
            for t in types:
                md.Add(comp[k] >= sum(int(time_int[t, l]) * x[l, k] for l in ls)).OnlyEnforceIf(yt[k][t])
    return comp


def _p2p_vars(md, x, u, y, comm_int, hi_comm: int, link_class, Q: int, L: int, P: int, D: int, several: bool):
    """``(p2p, lc)``: ``p2p[k]``, the round trip over boundary ``k`` in
    units, at most ``hi_comm`` (the output of the stage's last layer over the link class of its
    two devices; the cheapest class when there is one), and ``lc[k][q]``,
    boundary ``k`` on link class ``q`` (``[1]`` with one class)."""
    lc: list[list] = []
    p2p = []
    for k in range(P - 1):
        ends = [(l, u(l, k) - u(l + 1, k)) for l in range(k, L - (P - 1 - k))]  # layer l ends stage k
        v = md.NewIntVar(0, hi_comm, f"p2p[{k}]")
        p2p.append(v)
        cmin = comm_int.min(axis=0)
        md.Add(v >= sum(int(cmin[l]) * e for l, e in ends))
        if several:
            row = [md.NewBoolVar(f"lc[{k},{q}]") for q in range(Q)]
            md.AddExactlyOne(row)
            for d in range(D):
                for q in range(Q):
                    nxt = [y[k + 1][d2] for d2 in range(D) if link_class[d, d2] == q]
                    if nxt:
                        md.Add(row[q] >= y[k][d] + sum(nxt) - 1)
            for q in range(Q):
                md.Add(v >= sum(int(comm_int[q, l]) * e for l, e in ends)).OnlyEnforceIf(row[q])
            lc.append(row)
        else:
            lc.append([1])
    return p2p, lc


def _break_symmetry(md, y, classes, P: int, D: int) -> list:
    """Order the interchangeable devices of each class: a device is used
    only if the one before it is, on a later stage; returns ``used[d]``
    (None for devices of a class of one)."""
    used = [None] * D
    for cls in classes:
        if len(cls) < 2:
            continue
        for d in cls:
            used[d] = md.NewBoolVar(f"used[{d}]")
            md.Add(used[d] == sum(y[k][d] for k in range(P)))
        for a, b in zip(cls, cls[1:]):
            md.AddImplication(used[b], used[a])
            pos_a = sum(k * y[k][a] for k in range(1, P))
            pos_b = sum(k * y[k][b] for k in range(1, P))
            md.Add(pos_a + 1 <= pos_b).OnlyEnforceIf(used[b])
    return used


def _add_hint(cm: CpSatModel, problem: MappingProblem, order: Sequence[int], bounds: Sequence[int]) -> None:
    """Hint every variable with the solution (order, bounds)."""
    md, P, D = cm.model, problem.pp, problem.num_devices
    md.ClearHints()
    stage = np.repeat(np.arange(P), np.diff(bounds))
    for (l, k), v in cm.x.items():
        md.AddHint(v, int(stage[l] == k))
    for k in range(P):
        for d in range(D):
            md.AddHint(cm.y[k][d], int(order[k] == d))
        for t, v in cm.yt[k].items():
            if not isinstance(v, int):
                md.AddHint(v, int(problem.device_type[order[k]] == t))
    for k in range(P - 1):
        q = int(cm.link_class[order[k], order[k + 1]])
        for qq, v in enumerate(cm.lc[k]):
            if not isinstance(v, int):
                md.AddHint(v, int(qq == q))
    for d in range(D):
        if cm.used[d] is not None:
            md.AddHint(cm.used[d], int(d in order))
    comp, p2p = cm.int_stage_times(problem, order, bounds)
    for k in range(P):
        md.AddHint(cm.comp[k], comp[k])
    for k in range(P - 1):
        md.AddHint(cm.p2p[k], p2p[k])
    md.AddHint(cm.bottleneck, max(c + (p2p[k] if k < P - 1 else 0) for k, c in enumerate(comp)))


def solve_mapping(
    problem: MappingProblem,
    *,
    objective: str = "bottleneck",
    num_workers: int = 2,
    random_seed: int = 0,
    deterministic: bool = True,
    max_deterministic_time: float = DEFAULT_DETERMINISTIC_TIME,
    resolution: int = DEFAULT_RESOLUTION,
    hint: bool = True,
    polish: bool = True,
    symmetry_breaking: bool = True,
    inclusion_presolve: bool = False,
    min_bottleneck_s: float = 0.0,
    log_search_progress: bool = False,
) -> MappingResult:
    """Split and map ``problem`` with CP-SAT.

    Args:
        problem: the instance (:func:`pipesearch.mapping.problem_from_profile`
            or built directly).
        objective: ``"bottleneck"`` (``max_k a_k``) or ``"iteration"``
            (``sum_k a_k + (m-1) max_k a_k``), seconds.
        num_workers: CP-SAT workers (``num_workers``; ``num_search_workers``
            is its deprecated alias).
        random_seed: CP-SAT ``random_seed``.
        deterministic: set ``interleave_search`` (see the module docstring).
        max_deterministic_time: work limit in CP-SAT's deterministic time
            units (about seconds on one core); there is no wall-clock limit,
            so the same input gives the same result on any machine under any
            load.
        resolution: time units per lower bound of the bottleneck.
        hint: seed the search with the best greedy order's exact split
            (:func:`pipesearch.mapping.greedy_mapping`).
        polish: re-split the solver's device order exactly in floating point.
        symmetry_breaking: order interchangeable devices.
        inclusion_presolve: leave CP-SAT's inclusion-detection presolve on
            (off by default: it returns wrong optima on this model in OR-Tools
            9.15, google/or-tools#5293).
        min_bottleneck_s: a proved lower bound of ``max_k a_k`` (seconds),
            e.g. a bottleneck solve's ``best_bound_s``; tightens the
            iteration objective's bound (its sum term relaxes poorly).
        log_search_progress: print CP-SAT's log.

    Returns:
        A :class:`MappingResult` (``method="cp-sat"``): status ``OPTIMAL`` or
        ``FEASIBLE``, ``objective_s`` re-evaluated exactly, ``best_bound_s``
        and ``gap``, ``wall_s`` (model building + hint + solve + polish) and
        ``stats`` (model size, unit, solver figures).

    Raises:
        InputError: bad objective, ``P > L``, ``P > D``, bad parameters.
        InfeasibleError: the solver proves no split/mapping fits in memory, or
            finds no solution within the limits and no greedy order fits.
    """
    start = time.perf_counter()
    if not max_deterministic_time > 0 or num_workers < 1:
        raise InputError(f"max_deterministic_time={max_deterministic_time}, num_workers={num_workers}: "
                         "expected > 0 and >= 1")
    cm = build_model(problem, objective, resolution=resolution, symmetry_breaking=symmetry_breaking,
                     min_bottleneck_s=min_bottleneck_s)
    seed = greedy_mapping(problem, objective) if hint else None
    if seed is not None:
        pos = {d: i for i, d in enumerate(problem.device_ids)}
        order = canonical_order(problem, [pos[d] for d in seed.devices])
        _add_hint(cm, problem, order, seed.bounds)
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = int(num_workers)
    prm.random_seed = int(random_seed)
    prm.log_search_progress = bool(log_search_progress)
    if deterministic and num_workers > 1:
        prm.interleave_search = True
        # In interleaved mode a worker's task runs to its own end: the
        # core-based worker then crawls up the large integer objective range in
        # steps of a few units (24 s instead of 0.1 s on VGG-16); leave it out.
        prm.ignore_subsolvers.append("core")
    if not inclusion_presolve:
        # OR-Tools 9.15: the inclusion-detection presolve (ProcessAtMostOneAndLinear)
        # can drop the optimum of models with exactly-one groups and enforced
        # linear constraints and still report OPTIMAL (google/or-tools#5293);
        # seen on random instances of this model. Off by default.
        prm.presolve_inclusion_work_limit = 0
    prm.max_deterministic_time = float(max_deterministic_time)
    solve_start = time.perf_counter()
    status = solver.Solve(cm.model)
    solve_s = time.perf_counter() - solve_start
    name = solver.StatusName(status)
    stats = cm.stats()
    stats.update(solve_s=solve_s, conflicts=solver.NumConflicts(), branches=solver.NumBranches(),
                 hint_objective_s=seed.objective_s if seed is not None else None)
    if status == cp_model.INFEASIBLE:
        raise InfeasibleError(_no_fit_message(problem))
    if status == cp_model.MODEL_INVALID:  # pragma: no cover - a bug in build_model
        raise PipesearchError(f"CP-SAT rejected the mapping model: {cm.model.Validate()}")
    P, L, D = problem.pp, problem.num_layers, problem.num_devices
    candidates: list[MappingResult] = []
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        order = tuple(next(d for d in range(D) if solver.BooleanValue(cm.y[k][d])) for k in range(P))
        stage = [next(k for k in range(P) if (l, k) in cm.x and solver.BooleanValue(cm.x[l, k])) for l in range(L)]
        bounds = tuple([0] + [l + 1 for l in range(L - 1) if stage[l + 1] != stage[l]] + [L])
        stats["solver_objective_int"] = solver.ObjectiveValue()
        if problem.fits(order, bounds):
            candidates.append(make_result(problem, order, bounds, objective))
        if polish:
            res = best_split_for_order(problem, order, objective)
            if res is not None:
                candidates.append(res)
        bound_int = solver.BestObjectiveBound()
        best_bound_s = max(0.0, bound_int * cm.unit_s - cm.scale_error_s)
    else:
        best_bound_s = 0.0
    if seed is not None:
        candidates.append(seed)
    if not candidates:
        raise InfeasibleError(
            f"CP-SAT found no mapping within deterministic time {max_deterministic_time} ({name}) and no "
            f"greedy order fits; {_no_fit_message(problem)} (or raise max_deterministic_time)"
        )
    best = min(candidates, key=lambda r: r.objective_s)
    value = best.objective_s
    best_bound_s = min(best_bound_s, value)
    optimal = status == cp_model.OPTIMAL
    gap = 0.0 if optimal else (max(0.0, (value - best_bound_s) / value) if value > 0 else 0.0)
    order = tuple(problem.device_ids.index(d) for d in best.devices)
    return make_result(
        problem, order, best.bounds, objective,
        status="OPTIMAL" if optimal else "FEASIBLE", best_bound_s=best_bound_s, gap=gap,
        wall_s=time.perf_counter() - start, method="cp-sat", solver_status=name,
        scale_error_s=cm.scale_error_s, candidates=1, stats=tuple(stats.items()),
    )


def map_pipeline(
    profile: ModelProfile,
    cluster: Cluster,
    job: Job,
    *,
    pp: int,
    micro_batch_size: int,
    num_micro_batches: int,
    schedule: str = "1f1b",
    devices: Sequence[int] | None = None,
    objective: str = "bottleneck",
    method: str = "auto",
    max_orders: int = 5_000,
    layer_times: Mapping[str, Sequence[float]] | None = None,
    profiled_device: DeviceSpec | None = None,
    precision: str = "auto",
    **solver_options,
) -> MappingResult:
    """Split a profiled model and map its stages onto (some of) a cluster.

    Builds the problem with :func:`pipesearch.mapping.problem_from_profile`
    and solves it with ``method``: ``"class-dp"`` (exact DP over device
    classes, :func:`pipesearch.class_dp.class_dp_mapping`), ``"orders"``
    (exact enumeration of device orders + exact split,
    :func:`pipesearch.mapping.order_enumeration_mapping`), ``"cp-sat"``
    (:func:`solve_mapping`, ``solver_options`` passed on), or ``"auto"``:
    the class DP when its size allows (:func:`pipesearch.class_dp.class_dp_applies`),
    else orders when there are at most ``max_orders`` of them up to
    symmetry, else CP-SAT.

    Raises:
        InputError, InfeasibleError: as the chosen method.
    """
    problem = problem_from_profile(profile, cluster, job, pp=pp, micro_batch_size=micro_batch_size,
                                   num_micro_batches=num_micro_batches, schedule=schedule, devices=devices,
                                   layer_times=layer_times, profiled_device=profiled_device,
                                   precision=precision)
    if method not in ("auto", "class-dp", "orders", "cp-sat"):
        raise InputError(f"method {method!r}: expected auto, class-dp, orders or cp-sat")
    if method == "auto":
        problem.check_sizes()
        method = ("class-dp" if class_dp_applies(problem) else
                  "orders" if count_orders(problem, pp) <= max_orders else "cp-sat")
    if method == "class-dp":
        return class_dp_mapping(problem, objective)
    if method == "orders":
        return order_enumeration_mapping(problem, objective, max_orders=max(max_orders, 1))
    return solve_mapping(problem, objective=objective, **solver_options)
