"""Discrete-event simulation of a pipeline schedule.

Model (all times in seconds, sizes in bytes):

* Each rank runs its action list in order, one action at a time; an action
  starts when the rank is free and its input has arrived; it then runs for its
  stage's time (``fwd_s``, ``bwd_s``, ``bwd_input_s`` for ``I``,
  ``bwd_s - bwd_input_s`` for ``W``).
* ``F`` of stage ``s > 0`` needs the activation from ``F`` of stage ``s - 1``;
  ``B``/``I`` of stage ``s < S - 1`` needs the gradient from ``B``/``I`` of
  ``s + 1``. ``W`` needs only its own ``I`` (earlier on the same rank).
* Sending over boundary ``k`` (between stages ``k`` and ``k + 1``) takes
  ``p2p_s[k]`` in either direction. Stages on the same rank hand over for
  free. Two send models (``p2p_overlap``):

  - ``False`` (*blocking sends*): the sender is busy for the whole
    transfer, right after the action that produced the tensor, and the
    receiver has it when the transfer ends. This is what
    torch.distributed.pipelining's ``Schedule1F1B`` / ``ScheduleGPipe`` and
    Megatron-LM without ``--overlap-p2p-communication`` do: every batched
    ``isend``/``irecv`` is waited on before the next compute, and an NCCL send
    completes only once its data has moved. A rank's sends are therefore
    serial, and an action of a rank is compute plus its send: the iteration
    is the longest path of the schedule's dependency graph with those node
    weights (see docs/schedules.md).
  - ``True`` (default; *overlapped sends*, Megatron-LM's
    ``--overlap-p2p-communication``): the sender goes on computing; a
    transfer occupies its directed link (sender rank -> receiver rank) for its
    whole duration, so transfers on one link in one direction queue in issue
    order; opposite directions do not interfere.
* Activation memory: a stage's micro-batch holds ``act_bytes[stage]`` from the
  start of its ``F`` to the end of its ``B`` (or of its ``W`` when the backward
  is split).

Because every directed link has one sending rank, and that rank issues its
sends in list order, transfers can be timed when their sender finishes; the
simulation is a single ready-queue sweep over the ranks, O(actions).
"""

from __future__ import annotations

import math

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .errors import InputError
from .schedules import Action, validate

_KIND_CODE = {"F": 0, "B": 1, "I": 2, "W": 3}


class ActionRecord(NamedTuple):
    """When one action ran: on ``rank``, from ``start_s`` to ``end_s`` seconds
    after the iteration began."""

    rank: int
    kind: str
    stage: int
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    """Result of :func:`simulate`.

    Attributes:
        records: one :class:`ActionRecord` per action, rank by rank, each rank's
            in execution order.
        num_ranks: ranks (rows of the schedule).
        num_stages: stages.
        num_microbatches: micro-batches.
        stage_to_rank: rank of each stage, indexed by stage.
        iteration_time_s: end of the last action (the iteration starts at 0).
        busy_s: per rank, seconds spent computing (and in blocking sends).
        busy_fraction: per rank, ``busy_s / iteration_time_s``.
        bubble_fraction: idle share of the bottleneck (busiest) rank,
            ``1 - max(busy_s) / iteration_time_s``: the same definition as
            :class:`pipesearch.types.Prediction.bubble_fraction`.
        mean_bubble_fraction: idle share averaged over ranks,
            ``1 - mean(busy_s) / iteration_time_s``.
        peak_act_bytes: per rank, peak activation bytes held (sum over its
            stages at the worst moment).
        peak_in_flight: per stage, peak micro-batches whose activations are held.
        rank_end_s: per rank, when it finished its last action and blocking send.
    """

    records: tuple[ActionRecord, ...]
    num_ranks: int
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    iteration_time_s: float
    busy_s: tuple[float, ...]
    busy_fraction: tuple[float, ...]
    bubble_fraction: float
    mean_bubble_fraction: float
    peak_act_bytes: tuple[float, ...]
    peak_in_flight: tuple[int, ...]
    rank_end_s: tuple[float, ...] = ()

    def rank_records(self, rank: int) -> tuple[ActionRecord, ...]:
        """The records of one rank, in execution order."""
        return tuple(rec for rec in self.records if rec.rank == rank)


def _floats(name: str, values, n: int, *, allow_none: bool = False) -> list[float] | None:
    if values is None:
        if allow_none:
            return None
        raise InputError(f"simulate: {name} is required")
    try:
        out = [float(x) for x in values]
    except (TypeError, ValueError) as exc:
        raise InputError(f"simulate: {name} must be a sequence of numbers, got {values!r}") from exc
    if len(out) != n:
        raise InputError(f"simulate: {name} has {len(out)} entries, expected {n}")
    for i, x in enumerate(out):
        if not (x >= 0.0) or x == float("inf"):
            raise InputError(f"simulate: {name}[{i}] = {x} must be finite and >= 0")
    return out


def simulate(
    actions: Sequence[Sequence[Action]],
    *,
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    p2p_s: Sequence[float],
    bwd_input_s: Sequence[float] | None = None,
    act_bytes: Sequence[float] | None = None,
    stage_to_rank: Sequence[int] | Mapping[int, int] | None = None,
    p2p_overlap: bool = True,
    act_resident: Sequence[float] | None = None,
) -> Timeline:
    """Simulate one iteration of schedule ``actions``.

    Args:
        actions: one ordered action list per rank (see
            :mod:`pipesearch.schedules`). The number of stages is
            ``1 + max stage`` and of micro-batches ``1 + max micro-batch``.
        fwd_s: per stage, forward seconds of one micro-batch.
        bwd_s: per stage, full backward seconds (``I + W``) of one micro-batch.
        p2p_s: per boundary ``k`` (stages ``k`` and ``k + 1``; ``S - 1``
            entries), seconds to send one activation forward or one gradient
            back. Ignored between stages on the same rank.
        bwd_input_s: per stage, seconds of the input-gradient part ``I``; ``W``
            takes ``bwd_s - bwd_input_s``. Required when the schedule has
            ``I``/``W`` actions.
        act_bytes: per stage, activation bytes one in-flight micro-batch holds.
            Default zeros.
        stage_to_rank: optional expected stage -> rank map; checked against the
            ranks the action lists put the stages on.
        p2p_overlap: ``False``: blocking sends (the sender is busy for the
            transfer; ``busy_s`` includes it); ``True``: sends overlap the
            sender's compute and queue on their link (module docstring).
        act_resident: per stage, the most in-flight micro-batches whose
            activations stay on the device (a stage offloading them to host
            memory keeps a few, :data:`pipesearch.stage_options.ACT_HOST_RESIDENT`);
            ``peak_act_bytes`` counts ``min(in flight, act_resident) * act_bytes``.
            Default: all of them.

    Returns:
        A :class:`Timeline`.

    Raises:
        InputError: wrong lengths or negative times; ``bwd_input_s`` missing or
            larger than ``bwd_s`` where needed; ``stage_to_rank`` disagrees
            with the lists; or the schedule fails :func:`~pipesearch.schedules.validate`
            (incomplete, misordered, deadlocking).
    """
    S, M = _shape(actions)
    inputs = _stage_inputs(actions, S, fwd_s, bwd_s, p2p_s, bwd_input_s, act_bytes, act_resident)
    sweep = _Sweep(actions, M, _stage_ranks(actions, S, stage_to_rank), inputs, p2p_overlap)
    sweep.run()
    return sweep.timeline()


def _shape(actions: Sequence[Sequence[Action]]) -> tuple[int, int]:
    """``(stages, micro-batches)`` of valid action lists
    (:func:`pipesearch.schedules.validate`); raises InputError otherwise."""
    if len(actions) < 1:
        raise InputError("simulate: the schedule has no ranks")
    try:
        S = 1 + max((int(a.stage) for seq in actions for a in seq), default=-1)
        M = 1 + max((int(a.microbatch) for seq in actions for a in seq), default=-1)
    except (AttributeError, TypeError, ValueError) as exc:
        raise InputError(f"simulate: actions must be per-rank lists of Action: {exc}") from exc
    if S < 1 or M < 1:
        raise InputError("simulate: the schedule has no actions")
    validate(actions, S, M)
    return S, M


@dataclass(frozen=True)
class _StageInputs:
    """Per-stage lists of :func:`simulate`'s checked inputs: ``fwd``,
    ``bwd``, ``inp`` (``I``) and ``wgt`` (``W``) seconds, ``p2p`` seconds
    per boundary, ``act`` bytes and ``cap`` resident micro-batches."""

    fwd: list
    bwd: list
    inp: list
    wgt: list
    p2p: list
    act: list
    cap: list


def _stage_inputs(actions, S: int, fwd_s, bwd_s, p2p_s, bwd_input_s, act_bytes, act_resident) -> _StageInputs:
    """:func:`simulate`'s per-stage arguments checked (:func:`_floats`) and
    completed (``W = B - I``; zeros without ``I``, ``act_bytes``)."""
    fwd = _floats("fwd_s", fwd_s, S)
    bwd = _floats("bwd_s", bwd_s, S)
    p2p = _floats("p2p_s", p2p_s, S - 1)
    bin_ = _floats("bwd_input_s", bwd_input_s, S, allow_none=True)
    act = _floats("act_bytes", act_bytes, S, allow_none=True) or [0.0] * S
    cap = [math.inf] * S if act_resident is None else [float(x) for x in act_resident]
    if bin_ is None and any(a.kind == "I" for seq in actions for a in seq):
        raise InputError("simulate: the schedule splits backward into I and W; give bwd_input_s (seconds of I per stage)")
    if bin_ is None:
        return _StageInputs(fwd, bwd, [0.0] * S, [0.0] * S, p2p, act, cap)
    for s in range(S):
        if bin_[s] > bwd[s]:
            raise InputError(f"simulate: bwd_input_s[{s}] = {bin_[s]} exceeds bwd_s[{s}] = {bwd[s]}")
    return _StageInputs(fwd, bwd, bin_, [bwd[s] - bin_[s] for s in range(S)], p2p, act, cap)


def _stage_ranks(actions, S: int, stage_to_rank) -> list[int]:
    """The rank of each stage in the action lists, checked against the
    caller's ``stage_to_rank`` (a sequence or mapping) when given."""
    s2r = [0] * S
    for r, seq in enumerate(actions):
        for a in seq:
            s2r[a.stage] = r
    if stage_to_rank is not None:
        given = dict(stage_to_rank) if isinstance(stage_to_rank, Mapping) else dict(enumerate(stage_to_rank))
        for s in range(S):
            if given.get(s) != s2r[s]:
                raise InputError(f"simulate: stage_to_rank[{s}] = {given.get(s)!r} but the schedule runs stage {s} on rank {s2r[s]}")
    return s2r


class _Sweep:
    """The ready-queue sweep of :func:`simulate`: each rank runs its list
    until an action waits for an input not yet sent; the producer of that
    input puts the rank back on the queue when it sends it."""

    def __init__(self, actions, M: int, s2r: list[int], inputs: _StageInputs, overlap: bool):
        P, S = len(actions), len(s2r)
        self.actions, self.M, self.s2r, self.x, self.overlap = actions, M, s2r, inputs, overlap
        self.last = S - 1  # the last stage (no output sent down, no gradient received)
        # per-rank columns (kind code, stage, micro-batch) and each action's start and end
        self.kinds = [[_KIND_CODE[a.kind] for a in seq] for seq in actions]
        self.stages = [[a.stage for a in seq] for seq in actions]
        self.mbs = [[a.microbatch for a in seq] for seq in actions]
        self.starts = [[0.0] * len(seq) for seq in actions]
        self.ends = [[0.0] * len(seq) for seq in actions]
        # arrival of stage s's F output at stage s+1 (index s*M+mb) and of its
        # B/I gradient at stage s-1 (None until sent), and the rank waiting for it
        self.f_arr: list[float | None] = [None] * (S * M)
        self.b_arr: list[float | None] = [None] * (S * M)
        self.f_wait, self.b_wait = [-1] * (S * M), [-1] * (S * M)
        # the directed link out of stage s forward (to s+1) and backward (to s-1); None on one rank
        self.fwd_link = [(s2r[s], s2r[s + 1]) if s + 1 < S and s2r[s] != s2r[s + 1] else None for s in range(S)]
        self.bwd_link = [(s2r[s], s2r[s - 1]) if s > 0 and s2r[s] != s2r[s - 1] else None for s in range(S)]
        self.link_free: dict[tuple[int, int], float] = {}
        self.ptr, self.free, self.busy = [0] * P, [0.0] * P, [0.0] * P
        self.held, self.peak_bytes = [0.0] * P, [0.0] * P
        self.inflight, self.peak_inflight = [0] * S, [0] * S
        self.stack = list(range(P - 1, -1, -1))

    def run(self) -> None:
        """Sweep until every rank is done; raises InputError on a stall."""
        while self.stack:
            self._advance(self.stack.pop())
        for r, ks in enumerate(self.kinds):  # validate() rules deadlock out; keep a guard anyway
            at = self.ptr[r]
            if at < len(ks):
                raise InputError(f"simulate: rank {r} stalled at position {at} ({self.actions[r][at]})")

    def _advance(self, r: int) -> None:
        """Run rank ``r`` from where it stopped until an action's input has
        not arrived (registering the wait) or its list ends."""
        ks, ss, ms, st_r, en_r = self.kinds[r], self.stages[r], self.mbs[r], self.starts[r], self.ends[r]
        i, t, n, last = self.ptr[r], self.free[r], len(ks), self.last
        while i < n:
            k, s, mb = ks[i], ss[i], ms[i]
            if k == 0 and s:  # F: the activation from stage s - 1
                arrived = self.f_arr[(s - 1) * self.M + mb]
                if arrived is None:
                    self.f_wait[(s - 1) * self.M + mb] = r
                    break
                t = max(t, arrived)
            elif (k == 1 or k == 2) and s != last:  # B / I: the gradient from stage s + 1
                arrived = self.b_arr[(s + 1) * self.M + mb]
                if arrived is None:
                    self.b_wait[(s + 1) * self.M + mb] = r
                    break
                t = max(t, arrived)
            dur = self._begin(r, k, s)
            st_r[i] = t
            t += dur
            en_r[i] = t
            self.busy[r] += dur
            t = self._end(r, k, s, mb, t)
            i += 1
        self.ptr[r], self.free[r] = i, t

    def _begin(self, r: int, k: int, s: int) -> float:
        """The duration of rank ``r``'s action ``k`` of stage ``s``; a
        forward takes a micro-batch's activations in (counted on the device
        up to the stage's resident cap)."""
        x = self.x
        if k == 0:
            self.inflight[s] += 1
            self.peak_inflight[s] = max(self.peak_inflight[s], self.inflight[s])
            if self.inflight[s] <= x.cap[s]:  # min(in flight, resident) micro-batches on the device
                self.held[r] += x.act[s]
                self.peak_bytes[r] = max(self.peak_bytes[r], self.held[r])
            return x.fwd[s]
        return x.bwd[s] if k == 1 else x.inp[s] if k == 2 else x.wgt[s]

    def _end(self, r: int, k: int, s: int, mb: int, t: float) -> float:
        """After rank ``r``'s action ends at ``t``: release the activations
        (``B``, ``W``) and send the output (``F`` down, ``B`` / ``I`` up);
        returns when the rank is free (later with blocking sends)."""
        idx = s * self.M + mb
        if k == 0:
            if s != self.last:
                t = self._send(r, self.fwd_link[s], self.x.p2p[s], t, self.f_arr, self.f_wait, idx)
            return t
        if k != 2:  # B or W releases the activations
            if self.inflight[s] <= self.x.cap[s]:
                self.held[r] -= self.x.act[s]
            self.inflight[s] -= 1
        if k != 3 and s:  # B or I sends the gradient back
            t = self._send(r, self.bwd_link[s], self.x.p2p[s - 1], t, self.b_arr, self.b_wait, idx)
        return t

    def _send(self, r: int, link, p2p_s: float, t: float, arrivals: list, waits: list, idx: int) -> float:
        """Send tensor ``idx`` produced by rank ``r`` at ``t`` over ``link``
        (None: the same rank, free): record its arrival, wake the rank
        waiting for it, and return when the sender is free."""
        if link is None:
            arrivals[idx] = t
        elif not self.overlap:  # blocking: the sender is busy for the transfer
            t += p2p_s
            self.busy[r] += p2p_s
            arrivals[idx] = t
        else:  # overlapped: the transfer queues on its directed link
            arrivals[idx] = self.link_free[link] = max(t, self.link_free.get(link, 0.0)) + p2p_s
        if waits[idx] >= 0:
            self.stack.append(waits[idx])
            waits[idx] = -1
        return t

    def timeline(self) -> Timeline:
        """The :class:`Timeline` of the finished sweep."""
        P, busy = len(self.actions), self.busy
        total = max((en[-1] for en in self.ends if en), default=0.0)
        records = tuple(
            ActionRecord(r, a.kind, a.stage, a.microbatch, self.starts[r][i], self.ends[r][i])
            for r, seq in enumerate(self.actions)
            for i, a in enumerate(seq)
        )
        return Timeline(
            records=records,
            num_ranks=P,
            num_stages=len(self.s2r),
            num_microbatches=self.M,
            stage_to_rank=tuple(self.s2r),
            iteration_time_s=total,
            busy_s=tuple(busy),
            busy_fraction=tuple(b / total if total > 0 else 0.0 for b in busy),
            bubble_fraction=(1.0 - max(busy) / total) if total > 0 else 0.0,
            mean_bubble_fraction=(1.0 - sum(busy) / P / total) if total > 0 else 0.0,
            peak_act_bytes=tuple(self.peak_bytes),
            peak_in_flight=tuple(self.peak_inflight),
            rank_end_s=tuple(self.free),
        )
