"""A lower bound on the simulated time of every split of one interleaved
1F1B point, from its fluid relaxation: stages hold any share of the
model's forward and backward compute, not whole layers.

Every split's simulated time is at least each of these path lengths
(:func:`pipesearch.split_bounds.bound_families`, docs/schedules.md):

* rank ``q``'s whole work, ``m sum_{s on q} (F_s + B_s)``;
* the chain of stage ``k``: micro-batch 0's forward down to ``k``, the
  gradient back up (``sum_{s<k} (F_s + B_s)``), and the actions of ``k``'s
  rank between them (:func:`pipesearch.split_bounds.interleaved_chain`:
  ``n_F(k, s) F_s + n_B(k, s) B_s``).

Transfers and all-reduces only lengthen a path, so they are left out. A
stage of layers ``[i, j)`` on a device of time scale ``a_s`` computes at
least ``F_s >= a_s u_s`` and ``B_s >= a_s v_s``, where ``u_s`` and ``v_s``
are the sums of the layers' least forward and backward times (over the
stage options). The relaxation keeps of a split only what every split
satisfies: ``sum_s u_s`` and ``sum_s v_s`` are the model's totals, each
stage holds at least the least layer, and ``u_s / v_s`` lies between the
least and the greatest ratio of one layer. The least ``max`` of the paths
over it is a linear program (GLOP); its value is certified from the
program's dual values by weak duality with the variables' bounds (Neumaier
and Shcherbina 2004, Mathematical Programming 99(2), sec. 2), so a
solver's tolerance never makes the bound exceed the true minimum.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .costs import PipelineCosts

#: the schedules this bound covers (its paths are their chain families)
FLUID_BOUND_SCHEDULES = ("interleaved-1f1b",)
#: per-layer shares of one micro-batch's compute at most this are taken as 0
TINY_SHARE = 1e-12
#: the ratio cone's sides are left out where steeper than this (or flatter than its inverse)
MAX_RATIO = 1e3
#: simplex iterations of the program at most (a count: an unsolved program gives no bound, 0.0)
MAX_ITERATIONS = 100_000
#: the certified value is lowered by this relative margin (float rounding of its sums)
CERTIFIED_REL = 1e-12


def layer_times(costs: PipelineCosts) -> tuple[np.ndarray, np.ndarray]:
    """``(f, b)``: each layer's least forward and backward seconds on the
    profiled device, ``(L,)`` each: over the stage options (and stages, for
    per-stage prefixes) the least of each, so that a stage of layers ``[i,
    j)`` on a device of time scale ``a`` runs its forward in at least ``a
    sum f[i:j]`` (:meth:`PipelineCosts.fwd_s`) and its backward in at least
    ``a sum b[i:j]`` (:meth:`PipelineCosts.bwd_s`; the activation copies of
    an offloading option only add to both). Differences of prefix sums
    leave rounding residue (1e-20 s for a layer of no backward): times at
    most :data:`TINY_SHARE` of a micro-batch's whole compute are taken as 0,
    a smaller lower bound of the layer's time."""
    src = costs if costs.options is None else costs.options
    fwd = np.diff(np.asarray(src.fwd_prefix_s, dtype=float), axis=-1)
    bwd = np.diff(np.asarray(src.compute_prefix_s, dtype=float), axis=-1) - fwd
    L = costs.num_layers
    f, b = fwd.reshape(-1, L).min(axis=0), bwd.reshape(-1, L).min(axis=0)
    tiny = TINY_SHARE * float(f.sum() + b.sum())
    return np.where(f > tiny, f, 0.0), np.where(b > tiny, b, 0.0)


def fluid_lower_bound_s(costs: PipelineCosts, schedule: str, pp: int, vp: int, below_s: float = np.inf) -> float:
    """A lower bound on the simulated iteration time of every split of this
    point (module docstring), in seconds; 0.0 for schedules other than
    :data:`FLUID_BOUND_SCHEDULES`, or when the program ends unsolved.

    ``below_s``: when the longest of the paths at equal stage loads (a point
    of the relaxation, so at least its least value) is under it, the
    program's value is too: 0.0 is returned without solving it (a caller
    asking whether the bound reaches ``below_s``)."""
    S, m = costs.pp, costs.num_micro_batches
    if schedule not in FLUID_BOUND_SCHEDULES or S != pp * vp or S < 2:
        return 0.0
    f, b = layer_times(costs)
    unit = float(f.sum() + b.sum())
    if unit <= 0:
        return 0.0
    f, b = f / unit, b / unit  # one micro-batch's compute on the profiled device is 1
    scale = np.broadcast_to(np.asarray(costs.time_scale, dtype=float), (S,))
    if np.isfinite(below_s) and unit * _longest_at_equal_loads(f, b, scale, pp, m, vp) < below_s:
        return 0.0
    # a program the simplex leaves unsolved (a steep cone over times spanning many orders of magnitude) is
    # solved again without the cone: a weaker relaxation, better conditioned
    return unit * (_certified_min(f, b, scale, pp, m, vp) or _certified_min(f, b, scale, pp, m, vp, cone=False))


@lru_cache(maxsize=256)
def _chains(pp: int, m: int, vp: int) -> np.ndarray:
    """``(S, S, 2)``: the forwards and backwards of each stage ``s`` on the
    chain of stage ``k`` (:func:`pipesearch.split_bounds.interleaved_chain`), ``[k, s]``."""
    from .split_bounds import interleaved_chain

    out = np.array([interleaved_chain(pp, m, vp, k)[:, :2] for k in range(pp * vp)])
    out.flags.writeable = False
    return out


def _longest_at_equal_loads(f: np.ndarray, b: np.ndarray, scale: np.ndarray, pp: int, m: int, vp: int) -> float:
    """The longest of the paths when every stage holds ``1 / S`` of the
    forward and of the backward compute."""
    S = pp * vp
    u, v = scale * f.sum() / S, scale * b.sum() / S  # (S,) each stage's scaled forward and backward
    ranks = m * np.bincount(np.arange(S) % pp, weights=u + v, minlength=pp)
    n = _chains(pp, m, vp)
    before = np.concatenate([[0.0], np.cumsum(u + v)[:-1]])
    return float(max(ranks.max(), np.max(before + n[:, :, 0] @ u + n[:, :, 1] @ v)))


def _program(f: np.ndarray, b: np.ndarray, scale: np.ndarray, pp: int, m: int, vp: int, cone: bool = True):
    """The relaxation as ``min t`` s.t. ``lo <= A x <= hi``, ``x_lo <= x <=
    x_hi`` over ``x = (u, v, P, t)``: ``u``, ``v`` ``(S,)`` each stage's
    forward and backward share, ``P`` ``(S,)`` the scaled compute of the
    stages before each (``P_0 = 0``, ``P_{k+1} = P_k + a_k (u_k + v_k)``),
    ``t`` the time. Rows: every rank's work and every stage's chain below
    ``t`` (dual values ``>= 0``), the prefix and total equalities (free),
    the ratio cone (``>= 0``; left out unless ``cone``). Returns ``(A, lo,
    hi, x_lo, x_hi)``."""
    S = pp * vp
    U, V, P, T = 0, S, 2 * S, 3 * S  # column offsets
    total_u, total_v = float(f.sum()), float(b.sum())
    # u_s / v_s lies between the least and the greatest f / b of a layer (a layer of no backward only adds to
    # u_s: no upper side then; one of no forward has ratio 0)
    has_b = b > 0
    lo_r = float(np.min(f[has_b] / b[has_b])) if np.any(has_b) else 0.0
    hi_r = float(np.max(f[has_b] / b[has_b])) if np.all(has_b | (f <= 0)) and np.any(has_b) else np.inf
    # a side of the cone steeper than MAX_RATIO only ill-conditions the program: left out (a weaker relaxation)
    lo_r = lo_r if lo_r >= 1 / MAX_RATIO else 0.0
    hi_r = hi_r if hi_r <= MAX_RATIO else np.inf
    stage, inf = np.arange(S), np.inf
    ranks = np.zeros((pp, 3 * S + 1))  # t >= rank q's work
    ranks[:, T] = 1.0
    ranks[stage % pp, U + stage] = ranks[stage % pp, V + stage] = -m * scale
    n = _chains(pp, m, vp)
    chains = np.zeros((S, 3 * S + 1))  # t >= stage k's chain
    chains[:, T], chains[stage, P + stage] = 1.0, -1.0
    on = ((n[:, :, 0] > 0) | (n[:, :, 1] > 0))[..., None]  # the stages on the chain (both counts written)
    chains[:, U:U + S], chains[:, V:V + S] = np.moveaxis(np.where(on, -n * scale[:, None], 0.0), 2, 0)
    prefix = np.zeros((S - 1, 3 * S + 1))  # P_{k+1} = P_k + a_k (u_k + v_k)
    k = stage[:-1]
    prefix[k, P + k + 1], prefix[k, P + k] = 1.0, -1.0
    prefix[k, U + k] = prefix[k, V + k] = -scale[:-1]
    totals = np.zeros((2, 3 * S + 1))
    totals[0, U:U + S], totals[1, V:V + S] = 1.0, 1.0
    sides = 2 if np.isfinite(hi_r) else 1
    ratios = np.zeros((S * sides if cone else 0, 3 * S + 1))  # lo_r v_s <= u_s <= hi_r v_s, stage by stage
    if len(ratios):
        at = stage * sides
        ratios[at, U + stage], ratios[at, V + stage] = 1.0, -lo_r
        if sides == 2:
            ratios[at + 1, U + stage], ratios[at + 1, V + stage] = -1.0, hi_r
    A = np.concatenate([ranks, chains, prefix, totals, ratios])
    lo = np.concatenate([np.zeros(pp + S + S - 1), [total_u, total_v], np.zeros(len(ratios))])
    hi = np.concatenate([np.full(pp + S, inf), np.zeros(S - 1), [total_u, total_v], np.full(len(ratios), inf)])
    top = float(np.max(scale)) * (total_u + total_v)
    x_lo = np.concatenate([np.full(S, f.min()), np.full(S, b.min()), np.zeros(S + 1)])
    x_hi = np.concatenate([np.full(S, total_u), np.full(S, total_v), [0.0], np.full(S - 1, top), [np.inf]])
    return A, lo, hi, x_lo, x_hi


def _certified_min(f: np.ndarray, b: np.ndarray, scale: np.ndarray, pp: int, m: int, vp: int,
                   cone: bool = True) -> float:
    """The least ``t`` over the relaxation (module docstring; ``f``, ``b``
    per-layer times in units of their sum), certified from the dual values:
    for any ``y`` (``>= 0`` on the ``>=`` rows), ``lo . y + sum_j min(r_j
    x_lo_j, r_j x_hi_j)`` with ``r = c - A^T y`` is at most the least ``t``."""
    from ortools.linear_solver import pywraplp  # only where the bound is sought

    A, lo, hi, x_lo, x_hi = _program(f, b, scale, pp, m, vp, cone)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    solver.SetSolverSpecificParametersAsString(f"max_number_of_iterations: {MAX_ITERATIONS}")
    inf = solver.infinity()
    x = [solver.NumVar(float(a), float(z) if np.isfinite(z) else inf, "") for a, z in zip(x_lo, x_hi)]
    cons = []
    for r, a, z in zip(A, lo, hi):
        c = solver.Constraint(float(a), float(z) if np.isfinite(z) else inf)
        for col in np.flatnonzero(r):
            c.SetCoefficient(x[col], float(r[col]))
        cons.append(c)
    solver.Minimize(x[-1])
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return 0.0
    y = np.array([c.dual_value() for c in cons])
    y = np.where(np.isfinite(hi), y, np.maximum(y, 0.0))  # a ">=" row's dual is never negative
    on_t = float(A[:, -1] @ y)
    if on_t > 1.0 - CERTIFIED_REL:  # t's reduced cost stays positive (t has no upper bound)
        y = y * ((1.0 - CERTIFIED_REL) / on_t)
    reduced = -(A.T @ y)
    reduced[-1] += 1.0
    if reduced[-1] < 0:
        return 0.0
    # t's own term is least at t = 0; every other variable has finite bounds
    bound = float(lo @ y + np.sum(np.minimum(reduced[:-1] * x_lo[:-1], reduced[:-1] * x_hi[:-1])))
    return max(0.0, bound * (1.0 - CERTIFIED_REL))
