"""The one time model: the iteration time of a split under a schedule.

Definition. One iteration is the makespan of the schedule's action lists
(:mod:`pipesearch.schedules`) replayed by the discrete-event simulator
(:func:`pipesearch.simulate.simulate`) with the split's per-stage times, plus
each rank's gradient all-reduce, which starts when the rank has finished its
last action (and its last blocking send):

    T = max_r (end_r + allreduce_r)

Everything that ranks plans (the exact split, the pruning of the search, the
ranked table, the plots) uses this quantity, through
:func:`iteration_time_s`. Nothing here approximates it: :func:`iteration_time_s`
evaluates the same longest path as the simulator, with numpy over the levels
of the schedule's dependency graph (a few vector operations per level instead
of a Python step per action); ``tests/test_timemodel.py`` checks it against
the simulator on random instances, and :func:`gpipe_time_s` is its closed form
for GPipe (derivation in docs/schedules.md).

Send model, per schedule (what torch.distributed.pipelining does; Megatron-LM
without ``--overlap-p2p-communication`` blocks like 1F1B):

* ``1f1b``: blocking sends. ``Schedule1F1B`` waits on each fused
  ``send + recv`` batch before the next compute, so the sender is busy for the
  transfer.
* ``gpipe``, ``interleaved-1f1b``, ``zb-h1``, ``looped-bfs``: overlapped
  sends. ``ScheduleGPipe`` and the multi-stage runtime wait only on receives
  (sends are waited at the end of the step), so a transfer runs beside the
  sender's compute, queued on its directed link.

:func:`send_overlap` states the choice; :func:`lower_bound_s` gives valid lower
bounds of ``T`` that the split search (:func:`pipesearch.partition.exact_split`)
and the search's pruning use.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import schedules as schedule_lib
from .errors import InputError
from .simulate import Timeline, simulate

#: schedules whose sends overlap the sender's compute (module docstring)
OVERLAPPED_SEND_SCHEDULES = ("gpipe", "interleaved-1f1b", "zb-h1", "looped-bfs")


def send_overlap(schedule: str) -> bool:
    """Whether ``schedule``'s point-to-point sends overlap the sender's
    compute (``True``) or block it (``False``, 1F1B)."""
    return schedule in OVERLAPPED_SEND_SCHEDULES


@dataclass(frozen=True, eq=False)
class StageTimes:
    """Per-stage times of one split (``S`` stages, seconds, per micro-batch
    unless said otherwise).

    Attributes:
        fwd_s: ``(S,)`` forward compute.
        bwd_s: ``(S,)`` full backward compute (input + weight gradient).
        bwd_input_s: ``(S,)`` input-gradient part of the backward (zero-bubble
            schedules run it as ``I`` and the rest as ``W``).
        p2p_s: ``(S-1,)`` one transfer over boundary ``k`` (activation
            forward or its gradient back; both have the same size).
        allreduce_s: ``(S,)`` gradient all-reduce of the stage, once per
            iteration.
    """

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    bwd_input_s: np.ndarray
    p2p_s: np.ndarray
    allreduce_s: np.ndarray

    @property
    def num_stages(self) -> int:
        return len(self.fwd_s)


# ------------------------------------------------------------ the definition


def simulate_times(schedule: str, pp: int, m: int, vp: int, times: StageTimes) -> tuple[float, Timeline]:
    """The definition: replay the schedule in the discrete-event simulator.

    Returns ``(T, timeline)`` with ``T = max_r (end_r + allreduce_r)``, where
    ``end_r`` is when rank ``r`` finished its last action (and blocking send)
    and ``allreduce_r`` the sum of its stages' all-reduce.
    """
    actions = schedule_actions(schedule, pp, m, vp)
    tl = simulate(actions, fwd_s=times.fwd_s, bwd_s=times.bwd_s, p2p_s=times.p2p_s,
                  bwd_input_s=times.bwd_input_s, p2p_overlap=send_overlap(schedule))
    ar = np.bincount(np.arange(times.num_stages) % pp, weights=times.allreduce_s, minlength=pp)
    total = max(tl.iteration_time_s, float(np.max(np.asarray(tl.rank_end_s) + ar)))
    return total, tl


@dataclass(frozen=True, eq=False)
class _Graph:
    """The dependency graph of one (schedule, pp, m, vp), levelled.

    Nodes are the actions (and, with overlapped sends, the transfers). Node
    ``n``'s end is ``max(end[pred1[n]], end[pred2[n]]) + dur[n]``; index
    ``N`` is a sentinel that ends at 0. ``levels`` list node ids so that every
    predecessor of a level lies in an earlier one.
    """

    kind: np.ndarray      # per node: 0 F, 1 B, 2 I, 3 W, 4 transfer
    stage: np.ndarray     # per node: stage (for transfers: boundary k)
    sends: np.ndarray     # per action node: boundary it sends over blocking (-1 none)
    pred1: np.ndarray
    pred2: np.ndarray
    levels: tuple[np.ndarray, ...]
    last_of_rank: np.ndarray  # per rank: its last action node
    rank_of_stage: np.ndarray


@lru_cache(maxsize=64)
def schedule_actions(schedule: str, pp: int, m: int, vp: int):
    """:func:`pipesearch.schedules.build`, memoised (the action lists are
    immutable tuples; the graph and the split search's bounds share them)."""
    return schedule_lib.build(schedule, pp, m, vp)


@lru_cache(maxsize=256)
def _graph(schedule: str, pp: int, m: int, vp: int) -> _Graph:
    actions = schedule_actions(schedule, pp, m, vp)
    overlap = send_overlap(schedule)
    S = schedule_lib.num_stages_of(schedule, pp, vp)
    code = {"F": 0, "B": 1, "I": 2, "W": 3}
    rank_of = np.arange(S) % pp
    nid = {}
    kind, stage, sends, p1, p2 = [], [], [], [], []
    for r, seq in enumerate(actions):
        for a in seq:
            nid[(a.kind, a.stage, a.microbatch)] = len(kind)
            kind.append(code[a.kind])
            stage.append(a.stage)
            sends.append(-1)
            p1.append(-1)
            p2.append(-1)
    for r, seq in enumerate(actions):
        prev = -1
        for a in seq:
            n = nid[(a.kind, a.stage, a.microbatch)]
            p1[n] = prev
            prev = n
    link_last: dict = {}
    # producers in rank order so transfers on a link chain in issue order
    for r, seq in enumerate(actions):
        for a in seq:
            n = nid[(a.kind, a.stage, a.microbatch)]
            if a.kind == "F" and a.stage + 1 < S:
                dst, k, consumer = a.stage + 1, a.stage, nid[("F", a.stage + 1, a.microbatch)]
            elif a.kind in "BI" and a.stage > 0:
                dst, k = a.stage - 1, a.stage - 1
                consumer = nid.get(("B", dst, a.microbatch), nid.get(("I", dst, a.microbatch)))
            else:
                continue
            if rank_of[dst] == r:  # same rank: free hand-over
                p2[consumer] = n
                continue
            if not overlap:
                sends[n] = k
                p2[consumer] = n
                continue
            t = len(kind)
            key = (r, int(rank_of[dst]))
            kind.append(4)
            stage.append(k)
            sends.append(-1)
            p1.append(n)
            p2.append(link_last.get(key, -1))
            link_last[key] = t
            p2[consumer] = t
    N = len(kind)
    pred1 = np.array([x if x >= 0 else N for x in p1], dtype=np.int64)
    pred2 = np.array([x if x >= 0 else N for x in p2], dtype=np.int64)
    # level = longest unit-weight path from a source; nodes were appended so
    # that a topological order exists; compute it by repeated relaxation
    depth = np.zeros(N + 1, dtype=np.int64)
    order = _topological(pred1[:N], pred2[:N], N)
    for n in order:
        depth[n] = 1 + max(depth[pred1[n]] if pred1[n] < N else -1, depth[pred2[n]] if pred2[n] < N else -1)
    depth = depth[:N]
    idx = np.argsort(depth, kind="stable")
    cuts = np.flatnonzero(np.diff(depth[idx])) + 1
    levels = tuple(np.split(idx, cuts))
    last = np.array([nid[(seq[-1].kind, seq[-1].stage, seq[-1].microbatch)] for seq in actions], dtype=np.int64)
    return _Graph(np.array(kind), np.array(stage), np.array(sends), pred1, pred2, levels, last, rank_of)


def _topological(pred1: np.ndarray, pred2: np.ndarray, N: int) -> list[int]:
    """Kahn's algorithm over the two predecessor arrays (``N`` = none)."""
    succ: list[list[int]] = [[] for _ in range(N)]
    indeg = [0] * N
    for n in range(N):
        for p in (pred1[n], pred2[n]):
            if p < N:
                succ[p].append(n)
                indeg[n] += 1
    out = [n for n in range(N) if indeg[n] == 0]
    for n in out:
        for q in succ[n]:
            indeg[q] -= 1
            if indeg[q] == 0:
                out.append(q)
    if len(out) != N:
        raise InputError("schedule dependency graph has a cycle")
    return out


def _durations(g: _Graph, times: StageTimes) -> np.ndarray:
    """Node durations, shape ``(n, N + 1)`` for ``n`` splits: compute (+ the
    blocking send) for actions, the p2p time for transfers, 0 for the sentinel."""
    fwd, bwd, bin_ = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (times.fwd_s, times.bwd_s, times.bwd_input_s))
    n, S = fwd.shape
    p2p = np.concatenate([np.asarray(times.p2p_s, dtype=float).reshape(n, S - 1), np.zeros((n, 1))], axis=1)
    table = np.concatenate([fwd, bwd, bin_, bwd - bin_, p2p], axis=1)  # (n, 5 S)
    act = g.kind < 4
    col = np.where(act, g.kind * S + g.stage, 4 * S + g.stage)
    dur = np.zeros((n, len(g.kind) + 1))
    dur[:, :-1] = table[:, col]
    sends = np.flatnonzero(g.sends >= 0)
    if len(sends):
        dur[:, sends] += p2p[:, g.sends[sends]]
    return dur


def iteration_time_s(schedule: str, pp: int, m: int, vp: int, times: StageTimes):
    """``T`` of the module docstring, evaluated as the longest path of the
    schedule's dependency graph (equal to :func:`simulate_times`' value).

    ``times`` holds one split (arrays of shape ``(S,)``; returns a float) or
    ``n`` splits at once (shape ``(n, S)``; returns an array of ``n``).

    Raises:
        InputError: the schedule refuses ``(pp, m, vp)``.
    """
    single = np.ndim(times.fwd_s) == 1
    if schedule == "gpipe":
        return gpipe_time_s(times, m)
    else:
        g = _graph(schedule, pp, m, vp)
        dur = _durations(g, times)
        end = np.zeros_like(dur)
        p1, p2 = g.pred1, g.pred2
        for lv in g.levels:
            end[:, lv] = np.maximum(end[:, p1[lv]], end[:, p2[lv]]) + dur[:, lv]
        ar = _rank_allreduce(times, pp)
        out = np.maximum(end[:, :-1].max(axis=1), np.max(end[:, g.last_of_rank] + ar, axis=1))
    return float(out[0]) if single else out


def _rank_allreduce(times: StageTimes, pp: int) -> np.ndarray:
    """``(n, pp)``: each rank's all-reduce seconds (its stages' sum; stage ``s``
    runs on rank ``s % pp``)."""
    r = np.atleast_2d(np.asarray(times.allreduce_s, dtype=float))
    return r.reshape(r.shape[0], -1, pp).sum(axis=1)


def gpipe_time_s(times: StageTimes, m: int):
    """Closed form of GPipe's ``T`` with overlapped sends (docs/schedules.md):

    ``sum_k F_k + sum_k c_k + (m-1) max(F, c)
    + max_s [sum_{k>=s} B_k + sum_{s<=k<S-1} c_k + (m-1) max(B_{>=s}, c_{s..S-2}) + r_s]``

    with ``F_k``, ``B_k`` a stage's forward and backward, ``c_k`` one transfer
    over boundary ``k`` and ``r_s`` the stage's all-reduce. The forward phase
    is a longest path through a grid whose rows are stages and links (each
    processes the ``m`` micro-batches in order), so it is the row sums plus
    ``m - 1`` times the slowest row; the backward phase is the same grid run
    upwards from the last stage, and stage ``s``'s all-reduce follows its last
    backward. Arrays of shape ``(S,)`` give a float, ``(n, S)`` an array.
    """
    single = np.ndim(times.fwd_s) == 1
    F, B, r = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (times.fwd_s, times.bwd_s, times.allreduce_s))
    n, S = F.shape
    c = np.concatenate([np.asarray(times.p2p_s, dtype=float).reshape(n, S - 1), np.zeros((n, 1))], axis=1)
    fwd = F.sum(axis=1) + c.sum(axis=1) + (m - 1) * np.maximum(F.max(axis=1), c.max(axis=1))
    row_sum = np.cumsum((B + c)[:, ::-1], axis=1)[:, ::-1]
    row_max = np.maximum.accumulate(np.maximum(B, c)[:, ::-1], axis=1)[:, ::-1]
    out = fwd + np.max(row_sum + (m - 1) * row_max + r, axis=1)
    return float(out[0]) if single else out


def rank_busy_s(schedule: str, pp: int, m: int, times: StageTimes) -> np.ndarray:
    """``(pp,)`` seconds each rank computes in one iteration, plus its sends
    when they block (1F1B): the ``busy_s`` of the simulator's timeline, in
    closed form (each stage runs ``m`` forwards and ``m`` backwards)."""
    work = m * (np.asarray(times.fwd_s, dtype=float) + np.asarray(times.bwd_s, dtype=float))
    if not send_overlap(schedule):
        c = np.asarray(times.p2p_s, dtype=float)
        work = work + m * (np.append(c, 0.0) + np.insert(c, 0, 0.0))  # sends forward and back
    return np.bincount(np.arange(len(work)) % pp, weights=work, minlength=pp)


def stage_times_of(plan) -> StageTimes:
    """The :class:`StageTimes` a :class:`pipesearch.types.Plan` records."""
    st = plan.stages
    return StageTimes(
        fwd_s=np.array([s.fwd_s for s in st]),
        bwd_s=np.array([s.compute_s - s.fwd_s for s in st]),
        bwd_input_s=np.array([s.bwd_input_s for s in st]),
        p2p_s=np.array([s.comm_s for s in st[:-1]]),
        allreduce_s=np.array([s.allreduce_s for s in st]),
    )
