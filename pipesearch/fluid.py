"""The fluid split: stage loads that minimise the simulated time when work
divides freely, and the split of whole layers nearest to them.

With every stage's forward ``F_s = phi x_s``, backward ``B_s = (1 - phi)
x_s`` and input-gradient part ``I_s = psi B_s`` proportional to its load
``x_s`` (no transfers, no all-reduce), the simulated time ``T(x)``
(:func:`pipesearch.timemodel.iteration_time_s`, a longest path of the
schedule's dependency graph) is the largest of linear functions of ``x``,
one per path. Its minimum over the loads ``x >= 0`` that add up to the
work is a linear program with one constraint per path; Kelley's cutting
planes (Kelley 1960, J. SIAM 8(4), "The cutting-plane method for solving
convex programs") add the critical path at the current loads as a
constraint until the program's value reaches ``T`` there. The program is
solved with OR-Tools' GLOP.

Whole layers cannot follow such loads exactly, and transfers and all-reduce
move the optimum, so the split nearest to them is one more split that
:func:`pipesearch.split_search.exact_split` evaluates when its search
stops at its limits, never a bound: interleaved
1F1B's best loads are uneven (the last stage lighter, the first chunk's
stages heavier) where the branch and bound's starting splits are even.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .costs import PipelineCosts
from .timemodel import StageTimes, critical_path_counts, evaluation_cost

#: cutting planes added at most (a count, never seconds)
FLUID_CUTS = 64
#: graph work of all the cuts' evaluations at most, in
#: :func:`pipesearch.timemodel.evaluation_cost` units (a count); larger
#: graphs get no fluid split (the graph grows with the micro-batches, and
#: the fill and drain that make the best loads uneven weigh least there)
FLUID_WORK = 2**22
#: the schedules whose dependency graph the fluid split reads
FLUID_SCHEDULES = ("interleaved-1f1b",)



def fluid_loads(schedule: str, pp: int, m: int, vp: int, fwd_share: float, input_share: float = 0.5):
    """``(value, loads)``: the least simulated time found for stage loads
    that add up to 1 (the time of one micro-batch's whole work on one
    device), and those loads, ``(S,)`` with ``S = pp vp`` stages; ``None``
    when the graph is too large (:data:`FLUID_WORK`) or the schedule is not
    one of :data:`FLUID_SCHEDULES`.

    ``fwd_share`` is the forward's share of a stage's compute, ``input_share``
    the input gradient's share of its backward (zero-bubble schedules).
    ``value`` is the linear program's value when the cuts close (then it is
    the minimum of ``T`` over the loads), else the time at the best loads
    seen. Memoised on its arguments (rounded to 1e-6)."""
    return _fluid_loads(schedule, pp, m, vp, round(float(fwd_share), 6), round(float(input_share), 6))


@lru_cache(maxsize=256)
def _fluid_loads(schedule: str, pp: int, m: int, vp: int, phi: float, psi: float):
    fixed, per_split = evaluation_cost(schedule, pp, m, vp) if schedule in FLUID_SCHEDULES else (0, 0)
    if schedule not in FLUID_SCHEDULES or (fixed + per_split) * FLUID_CUTS > FLUID_WORK:
        return None
    from ortools.linear_solver import pywraplp  # only where a fluid split is sought

    S = pp * vp
    solver = pywraplp.Solver.CreateSolver("GLOP")
    x = [solver.NumVar(0.0, 1.0, f"x{s}") for s in range(S)]
    t = solver.NumVar(0.0, solver.infinity(), "t")
    solver.Add(solver.Sum(x) == 1.0)
    for q in range(pp):  # each rank runs its stages' m micro-batches one after another
        solver.Add(t >= m * solver.Sum([x[s] for s in range(q, S, pp)]))
    solver.Minimize(t)
    per_action = np.array([phi, 1.0 - phi, (1.0 - phi) * psi, (1.0 - phi) * (1.0 - psi)])  # F B I W
    best = (np.inf, None)
    for _ in range(FLUID_CUTS):
        if solver.Solve() != pywraplp.Solver.OPTIMAL:
            break
        loads = np.array([v.solution_value() for v in x])
        value, counts = critical_path_counts(schedule, pp, m, vp, _times(loads, phi, psi))
        if value <= t.solution_value() * (1 + 1e-9):  # no path is longer than the program allows: the minimum
            return t.solution_value(), loads
        if value < best[0]:
            best = (value, loads)
        coef = per_action @ counts  # (S,): the critical path's length per unit of each stage's load
        solver.Add(t >= solver.Sum([float(coef[s]) * x[s] for s in range(S) if coef[s] > 0]))
    return best if best[1] is not None else None


def _times(loads: np.ndarray, phi: float, psi: float) -> StageTimes:
    S = len(loads)
    bwd = (1.0 - phi) * loads
    return StageTimes(phi * loads, bwd, psi * bwd, np.zeros(S - 1), np.zeros(S))


def fluid_split(costs: PipelineCosts, schedule: str, pp: int, vp: int) -> tuple[int, ...] | None:
    """The split of whole layers nearest to :func:`fluid_loads` for this
    point: each stage's load divided by its device's time scale is a share
    of the layers' compute, each boundary the layer whose compute prefix is
    nearest to the shares' running sum (moved so that every stage keeps a
    layer). ``None`` when there are fewer layers than stages or no fluid
    loads (the schedule or the graph's size)."""
    L, S = costs.num_layers, costs.pp
    cp = np.asarray(costs.compute_prefix_s, dtype=float)
    if S > L or S < 2 or cp[-1] <= 0:
        return None
    phi = float(costs.fwd_prefix_s[-1] / cp[-1])
    bwd = cp[-1] - float(costs.fwd_prefix_s[-1])
    bwd_input = 0.0 if costs.bwd_input_prefix_s is None else float(costs.bwd_input_prefix_s[-1])
    psi = bwd_input / bwd if bwd > 0 else 0.0
    found = fluid_loads(schedule, pp, costs.num_micro_batches, vp, phi, psi)
    if found is None:
        return None
    work = found[1] / np.asarray(costs.time_scale, dtype=float)
    target = np.cumsum(work)[:-1] / work.sum() * cp[-1]
    right = np.clip(np.searchsorted(cp, target), 1, L)
    nearer = np.where(np.abs(cp[right - 1] - target) <= np.abs(cp[right] - target), right - 1, right)
    bounds = np.concatenate([[0], nearer, [L]])
    for s in range(1, S):  # every stage keeps a layer: first from the left, then from the right
        bounds[s] = max(bounds[s], bounds[s - 1] + 1)
    for s in range(S - 1, 0, -1):
        bounds[s] = min(bounds[s], bounds[s + 1] - 1)
    return tuple(int(b) for b in bounds)
