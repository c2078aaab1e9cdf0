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
    P = len(actions)
    if P < 1:
        raise InputError("simulate: the schedule has no ranks")
    try:
        S = 1 + max((int(a.stage) for seq in actions for a in seq), default=-1)
        M = 1 + max((int(a.microbatch) for seq in actions for a in seq), default=-1)
    except (AttributeError, TypeError, ValueError) as exc:
        raise InputError(f"simulate: actions must be per-rank lists of Action: {exc}") from exc
    if S < 1 or M < 1:
        raise InputError("simulate: the schedule has no actions")
    validate(actions, S, M)

    fwd = _floats("fwd_s", fwd_s, S)
    bwd = _floats("bwd_s", bwd_s, S)
    p2p = _floats("p2p_s", p2p_s, S - 1)
    bin_ = _floats("bwd_input_s", bwd_input_s, S, allow_none=True)
    act = _floats("act_bytes", act_bytes, S, allow_none=True) or [0.0] * S
    cap = [math.inf] * S if act_resident is None else [float(x) for x in act_resident]
    has_split = any(a.kind == "I" for seq in actions for a in seq)
    if has_split and bin_ is None:
        raise InputError("simulate: the schedule splits backward into I and W; give bwd_input_s (seconds of I per stage)")
    if bin_ is not None:
        for s in range(S):
            if bin_[s] > bwd[s]:
                raise InputError(f"simulate: bwd_input_s[{s}] = {bin_[s]} exceeds bwd_s[{s}] = {bwd[s]}")
    wgt = [bwd[s] - bin_[s] for s in range(S)] if bin_ is not None else [0.0] * S
    inp = bin_ if bin_ is not None else [0.0] * S

    s2r = [0] * S
    for r, seq in enumerate(actions):
        for a in seq:
            s2r[a.stage] = r
    if stage_to_rank is not None:
        given = dict(stage_to_rank) if isinstance(stage_to_rank, Mapping) else dict(enumerate(stage_to_rank))
        for s in range(S):
            if given.get(s) != s2r[s]:
                raise InputError(f"simulate: stage_to_rank[{s}] = {given.get(s)!r} but the schedule runs stage {s} on rank {s2r[s]}")

    # Per-rank columns (kind code, stage, microbatch).
    kinds = [[_KIND_CODE[a.kind] for a in seq] for seq in actions]
    stages = [[a.stage for a in seq] for seq in actions]
    mbs = [[a.microbatch for a in seq] for seq in actions]
    starts = [[0.0] * len(seq) for seq in actions]
    ends = [[0.0] * len(seq) for seq in actions]

    # Arrival time of stage s's F output at stage s+1 (index s*M+mb), and of
    # stage s's B/I gradient at stage s-1; None until produced.
    f_arr: list[float | None] = [None] * (S * M)
    b_arr: list[float | None] = [None] * (S * M)
    f_wait = [-1] * (S * M)
    b_wait = [-1] * (S * M)
    # Directed link free times: fwd link out of stage s (to s+1), bwd link out of s (to s-1).
    fwd_link_of = [(s2r[s], s2r[s + 1]) if s + 1 < S and s2r[s] != s2r[s + 1] else None for s in range(S)]
    bwd_link_of = [(s2r[s], s2r[s - 1]) if s > 0 and s2r[s] != s2r[s - 1] else None for s in range(S)]
    link_free: dict[tuple[int, int], float] = {}

    ptr = [0] * P
    free = [0.0] * P
    busy = [0.0] * P
    held = [0.0] * P
    peak_bytes = [0.0] * P
    inflight = [0] * S
    peak_inflight = [0] * S
    last = S - 1

    stack = list(range(P - 1, -1, -1))
    while stack:
        r = stack.pop()
        ks, ss, ms, st_r, en_r = kinds[r], stages[r], mbs[r], starts[r], ends[r]
        i, t, n = ptr[r], free[r], len(ks)
        b_busy, b_held, b_peak = busy[r], held[r], peak_bytes[r]
        while i < n:
            k, s, mb = ks[i], ss[i], ms[i]
            if k == 0:  # F
                if s:
                    a_in = f_arr[(s - 1) * M + mb]
                    if a_in is None:
                        f_wait[(s - 1) * M + mb] = r
                        break
                    if a_in > t:
                        t = a_in
                dur = fwd[s]
                inflight[s] += 1
                if inflight[s] > peak_inflight[s]:
                    peak_inflight[s] = inflight[s]
                if inflight[s] <= cap[s]:  # min(in flight, resident) micro-batches on the device
                    b_held += act[s]
                if b_held > b_peak:
                    b_peak = b_held
            elif k == 3:  # W
                dur = wgt[s]
            else:  # B or I
                if s != last:
                    a_in = b_arr[(s + 1) * M + mb]
                    if a_in is None:
                        b_wait[(s + 1) * M + mb] = r
                        break
                    if a_in > t:
                        t = a_in
                dur = bwd[s] if k == 1 else inp[s]
            st_r[i] = t
            t += dur
            en_r[i] = t
            b_busy += dur
            idx = s * M + mb
            if k == 0:
                if s != last:
                    link = fwd_link_of[s]
                    if link is None:
                        f_arr[idx] = t
                    elif not p2p_overlap:
                        t += p2p[s]
                        b_busy += p2p[s]
                        f_arr[idx] = t
                    else:
                        lf = link_free.get(link, 0.0)
                        arr = (t if t > lf else lf) + p2p[s]
                        link_free[link] = arr
                        f_arr[idx] = arr
                    w = f_wait[idx]
                    if w >= 0:
                        stack.append(w)
                        f_wait[idx] = -1
            else:
                if k != 2:  # B or W releases the activations
                    if inflight[s] <= cap[s]:
                        b_held -= act[s]
                    inflight[s] -= 1
                if k != 3 and s:  # B or I sends the gradient back
                    link = bwd_link_of[s]
                    if link is None:
                        b_arr[idx] = t
                    elif not p2p_overlap:
                        t += p2p[s - 1]
                        b_busy += p2p[s - 1]
                        b_arr[idx] = t
                    else:
                        lf = link_free.get(link, 0.0)
                        arr = (t if t > lf else lf) + p2p[s - 1]
                        link_free[link] = arr
                        b_arr[idx] = arr
                    w = b_wait[idx]
                    if w >= 0:
                        stack.append(w)
                        b_wait[idx] = -1
            i += 1
        ptr[r], free[r] = i, t
        busy[r], held[r], peak_bytes[r] = b_busy, b_held, b_peak

    for r in range(P):  # validate() rules deadlock out; keep a guard anyway
        if ptr[r] < len(kinds[r]):
            raise InputError(f"simulate: rank {r} stalled at position {ptr[r]} ({actions[r][ptr[r]]})")

    total = max((en[-1] for en in ends if en), default=0.0)
    records = tuple(
        ActionRecord(r, a.kind, a.stage, a.microbatch, starts[r][i], ends[r][i])
        for r, seq in enumerate(actions)
        for i, a in enumerate(seq)
    )
    busy_frac = tuple(b / total if total > 0 else 0.0 for b in busy)
    return Timeline(
        records=records,
        num_ranks=P,
        num_stages=S,
        num_microbatches=M,
        stage_to_rank=tuple(s2r),
        iteration_time_s=total,
        busy_s=tuple(busy),
        busy_fraction=busy_frac,
        bubble_fraction=(1.0 - max(busy) / total) if total > 0 else 0.0,
        mean_bubble_fraction=(1.0 - sum(busy) / P / total) if total > 0 else 0.0,
        peak_act_bytes=tuple(peak_bytes),
        peak_in_flight=tuple(peak_inflight),
        rank_end_s=tuple(free),
    )
