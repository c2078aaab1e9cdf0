"""Pipeline schedules as data: per-rank ordered lists of compute actions.

A schedule is a ``tuple[tuple[Action, ...], ...]``: one ordered tuple per
pipeline rank (device). Rank ``r`` executes its tuple front to back, one action
at a time. Every builder here is a pure function of ``(p, m[, v])`` that only
generates that order; timing is the job of :mod:`pipesearch.simulate`.

Vocabulary (the same as ``torch.distributed.pipelining``):

* ``p``: pipeline ranks (devices); ``m``: micro-batches per iteration;
  ``v``: virtual stages (model chunks) per rank, so ``p * v`` stages in all.
* ``F``: forward of one stage on one micro-batch; ``B``: its full backward;
  ``I``: the input-gradient part of the backward (what the previous stage
  waits for); ``W``: the weight-gradient part (no one waits for it).
* Stage ``s`` of a looped / interleaved schedule runs on rank ``s % p``.

Builders and their sources:

* :func:`gpipe`: Huang et al., "GPipe", NeurIPS 2019 (all forwards, then all
  backwards).
* :func:`one_f_one_b`: PipeDream-Flush / 1F1B, Narayanan et al., "Memory-
  Efficient Pipeline-Parallel DNN Training", ICML 2021.
* :func:`interleaved_1f1b`: Narayanan et al., "Efficient Large-Scale Language
  Model Training on GPU Clusters Using Megatron-LM", SC 2021 (Megatron-LM's
  ``forward_backward_pipelining_with_interleaving`` order).
* :func:`zb_h1`: Qi et al., "Zero Bubble Pipeline Parallelism", 2023
  (arXiv:2401.10241), handcrafted schedule ZB-H1.
* :func:`looped_bfs`: Lamy-Poirier, "Breadth-First Pipeline Parallelism",
  2022 (arXiv:2211.05953).
* :func:`mobius`: Feng et al., "Mobius", ASPLOS 2023 (looped BFS' compute
  order; its host-to-GPU copies are in the time model).
* :func:`roundpipe_tasks`: RoundPipe (arXiv 2604.27085): layer-group tasks
  dispatched round-robin over a stateless pool of GPUs (its graph, with the
  PCIe copies, is :func:`pipesearch.timemodel.roundpipe_graph`).

Refusals follow torch.distributed.pipelining's runtime: ``Schedule1F1B``
raises when ``n_microbatches < num_stages``; we refuse ``m < p`` for every
1F1B-style builder (1F1B, interleaved 1F1B, ZB-H1) and ``m % p != 0`` for
interleaved 1F1B (Megatron-LM's requirement). GPipe and looped BFS accept any
``m >= 1``.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputError

KINDS = ("F", "B", "I", "W")
"""Action kinds: forward, full backward, input-gradient backward, weight-gradient backward."""


@dataclass(frozen=True, slots=True)
class Action:
    """One compute action: ``kind`` of ``stage`` on ``microbatch``.

    Attributes:
        kind: ``"F"`` forward, ``"B"`` full backward, ``"I"`` input-gradient
            backward, ``"W"`` weight-gradient backward.
        stage: stage index, ``0 .. num_stages - 1``.
        microbatch: micro-batch index, ``0 .. m - 1``.

    ``str(action)`` is torch's compact form, e.g. ``"0F1"``.
    """

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


Schedule = tuple[tuple[Action, ...], ...]
"""One ordered tuple of actions per rank."""


# ---------------------------------------------------------------- checks


def _check_p_m_v(name: str, p: int, m: int, v: int = 1) -> None:
    for label, val in (("p (pipeline ranks)", p), ("m (micro-batches)", m), ("v (virtual stages per rank)", v)):
        if isinstance(val, bool) or not isinstance(val, int):
            raise InputError(f"{name}: {label} must be an integer, got {val!r}")
        if val < 1:
            raise InputError(f"{name}: {label} must be >= 1, got {val}")


def _check_1f1b_style(name: str, p: int, m: int) -> None:
    if m < p:
        raise InputError(
            f"{name}: m={m} micro-batches is fewer than p={p} pipeline ranks; 1F1B-style "
            f"schedules need m >= p (torch.distributed.pipelining's Schedule1F1B refuses "
            f"n_microbatches < num_stages). Use m >= {p} or the 'gpipe' schedule."
        )


# ---------------------------------------------------------------- builders


def _build(p: int, order: Callable[[int], Iterable[tuple[str, int, int]]]) -> Schedule:
    """Turn a per-rank order generator of ``(kind, stage, mb)`` into a Schedule."""
    return tuple(tuple(Action(k, s, mb) for k, s, mb in order(r)) for r in range(p))


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al., NeurIPS 2019): every rank runs the forwards of all
    ``m`` micro-batches in order, then their backwards in the same order (as
    ``torch.distributed.pipelining.ScheduleGPipe``).

    Args:
        p: pipeline ranks = stages (stage ``r`` on rank ``r``).
        m: micro-batches per iteration; any ``m >= 1``.

    Returns:
        One tuple of ``2 m`` actions per rank.

    Raises:
        InputError: ``p < 1`` or ``m < 1``.
    """
    return _build(p, _gpipe_order(p, m))


def _gpipe_order(p: int, m: int):
    """Rank -> its ``(kind, stage, micro-batch)`` order for :func:`gpipe`
    (the builder's checks first)."""
    _check_p_m_v("gpipe", p, m)

    def order(r: int):
        yield from (("F", r, i) for i in range(m))
        yield from (("B", r, i) for i in range(m))

    return order


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al., ICML 2021).

    Rank ``r`` runs ``p - 1 - r`` warm-up forwards, then alternates one forward
    and one backward, then drains the remaining backwards; so stage ``r`` holds
    at most ``p - r`` micro-batches' activations (the same order as Megatron-LM's
    ``forward_backward_pipelining_without_interleaving`` and torch's
    ``Schedule1F1B``).

    Args:
        p: pipeline ranks = stages. m: micro-batches, ``m >= p``.

    Raises:
        InputError: ``p < 1``, ``m < 1`` or ``m < p``.
    """
    return _build(p, _one_f_one_b_order(p, m))


def _one_f_one_b_order(p: int, m: int):
    """Rank -> its ``(kind, stage, micro-batch)`` order for :func:`one_f_one_b`
    (the builder's checks first)."""
    _check_p_m_v("1f1b", p, m)
    _check_1f1b_style("1f1b", p, m)

    def order(r: int):
        warm = p - 1 - r
        yield from (("F", r, i) for i in range(warm))
        for j in range(m - warm):
            yield ("F", r, warm + j)
            yield ("B", r, j)
        yield from (("B", r, j) for j in range(m - warm, m))

    return order


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., SC 2021), Megatron-LM's order.

    Stage ``s`` (of ``p v``) runs on rank ``s % p``. Rank ``r`` walks "virtual
    micro-batches" ``k = 0 .. m v - 1``: ``k`` belongs to model chunk
    ``(k mod p v) // p`` (reversed for backward) and micro-batch
    ``(k // (p v)) p + k mod p``. It runs ``min((v - 1) p + 2 (p - 1 - r), m v)``
    warm-up forwards, then forward ``k + warm`` / backward ``k`` pairs, then the
    remaining backwards (Megatron-LM ``schedules.py``,
    ``forward_backward_pipelining_with_interleaving``; torch's
    ``ScheduleInterleaved1F1B`` with ``m`` a multiple of ``p``).

    With ``v = 1`` this is a valid schedule but not :func:`one_f_one_b`: the
    warm-up is ``2 (p - 1 - r)`` forwards, as in Megatron-LM.

    Args:
        p: pipeline ranks. m: micro-batches, a multiple of ``p``. v: model
            chunks (virtual stages) per rank, ``>= 1``.

    Raises:
        InputError: ``p, m, v < 1``, ``m < p`` or ``m % p != 0``.
    """
    return _build(p, _interleaved_1f1b_order(p, m, v))


def _interleaved_1f1b_order(p: int, m: int, v: int):
    """Rank -> its ``(kind, stage, micro-batch)`` order for :func:`interleaved_1f1b`
    (the builder's checks first)."""
    _check_p_m_v("interleaved-1f1b", p, m, v)
    _check_1f1b_style("interleaved-1f1b", p, m)
    if m % p:
        raise InputError(
            f"interleaved-1f1b: m={m} micro-batches is not a multiple of p={p} pipeline "
            f"ranks; Megatron-LM's interleaved schedule requires m % p == 0 "
            f"(e.g. m={m // p * p} or m={(m // p + 1) * p})"
        )
    total = m * v
    group = p * v

    def stage(k: int, r: int, forward: bool) -> int:
        chunk = (k % group) // p
        return (chunk if forward else v - 1 - chunk) * p + r

    def mb(k: int) -> int:
        return (k // group) * p + k % p

    def order(r: int):
        warm = min((v - 1) * p + 2 * (p - 1 - r), total)
        yield from (("F", stage(k, r, True), mb(k)) for k in range(warm))
        for k in range(total - warm):
            yield ("F", stage(k + warm, r, True), mb(k + warm))
            yield ("B", stage(k, r, False), mb(k))
        yield from (("B", stage(k, r, False), mb(k)) for k in range(total - warm, total))

    return order


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023, sec. 3.1).

    1F1B with the backward split into ``I`` (input gradient) and ``W`` (weight
    gradient). Rank ``r`` runs ``p - 1 - r`` warm-up forwards, then ``F, I``
    pairs; the ``W`` of micro-batch ``j`` follows the ``I`` of micro-batch
    ``j + r`` (its start is delayed by ``r`` steps), and the leftover ``W`` fill
    the cool-down. Every rank therefore keeps up to ``p`` micro-batches in
    flight: the peak over ranks equals 1F1B's (rank 0's ``p``), as the paper
    states ("the maximum peak memory usage over all workers doesn't exceed
    that of 1F1B"). With ``T_F = T_I = T_W`` and no link delay, the bubble is
    ``(p - 1)(T_F + T_I - T_W)``. The same order as torch's
    ``ScheduleInterleavedZeroBubble`` with one stage per rank.

    Args:
        p: pipeline ranks = stages. m: micro-batches, ``m >= p``.

    Raises:
        InputError: ``p < 1``, ``m < 1`` or ``m < p``.
    """
    return _build(p, _zb_h1_order(p, m))


def zb_h1_weight_grads_after_last_input_grad(rank):
    """How many ``W`` rank ``rank`` runs after its last ``I`` in
    :func:`zb_h1`'s order (``m >= p``): the ``W`` that follows the ``I`` of
    micro-batch ``m - 1``, and the ``rank`` left for the cool-down (the
    ``W`` of micro-batch ``j`` follows the ``I`` of ``j + rank``):
    ``rank + 1`` (arrays ok)."""
    return rank + 1


def _zb_h1_order(p: int, m: int):
    """Rank -> its ``(kind, stage, micro-batch)`` order for :func:`zb_h1`
    (the builder's checks first)."""
    _check_p_m_v("zb-h1", p, m)
    _check_1f1b_style("zb-h1", p, m)

    def order(r: int):
        warm = p - 1 - r
        yield from (("F", r, i) for i in range(warm))
        w_next = 0
        for j in range(m):
            if warm + j < m:
                yield ("F", r, warm + j)
            yield ("I", r, j)
            if j >= r:
                yield ("W", r, w_next)
                w_next += 1
        yield from (("W", r, i) for i in range(w_next, m))

    return order


def looped_bfs(p: int, m: int, v: int) -> Schedule:
    """Breadth-first looped pipeline (Lamy-Poirier, 2022, arXiv:2211.05953).

    Stage ``s`` (of ``p v``) runs on rank ``s % p``. Each rank runs the forwards
    of all ``m`` micro-batches on its first local stage, then on its next local
    stage, and so on; then the backwards stage by stage in reverse, micro-batches
    in reverse order (the order of torch's ``ScheduleLoopedBFS``). With ``v = 1``
    it is GPipe with the backward micro-batch order reversed.

    Args:
        p: pipeline ranks. m: micro-batches, ``>= 1``. v: stages per rank.

    Raises:
        InputError: ``p, m, v < 1``.
    """
    return _build(p, _looped_bfs_order(p, m, v))


def _looped_bfs_order(p: int, m: int, v: int):
    """Rank -> its ``(kind, stage, micro-batch)`` order for :func:`looped_bfs`
    (the builder's checks first)."""
    _check_p_m_v("looped-bfs", p, m, v)

    def order(r: int):
        for c in range(v):
            yield from (("F", c * p + r, i) for i in range(m))
        for c in reversed(range(v)):
            yield from (("B", c * p + r, i) for i in reversed(range(m)))

    return order


def mobius(p: int, m: int, v: int) -> Schedule:
    """Mobius (Feng et al., "Mobius: Fine Tuning Large-Scale Models on
    Commodity GPU Servers", ASPLOS'23, sec. 3): ``p v`` stages, stage ``s`` on
    rank ``s % p``, each rank running its stages in turn with all ``m``
    micro-batches per stage, the compute order of :func:`looped_bfs`. The
    stages live in host memory: each is copied to its GPU while the previous
    one computes (:func:`pipesearch.timemodel.mobius_graph` adds the copies).

    Raises:
        InputError: ``p, m, v < 1``.
    """
    return _build(p, _mobius_order(p, m, v))


def _mobius_order(p: int, m: int, v: int):
    """Rank -> its order for :func:`mobius` (looped BFS' order)."""
    _check_p_m_v("mobius", p, m, v)
    return _looped_bfs_order(p, m, v)


_ORDERS: dict[str, Callable[..., Callable[[int], Iterable[tuple[str, int, int]]]]] = {
    "gpipe": _gpipe_order,
    "1f1b": _one_f_one_b_order,
    "interleaved-1f1b": _interleaved_1f1b_order,
    "zb-h1": _zb_h1_order,
    "looped-bfs": _looped_bfs_order,
    "mobius": _mobius_order,
}


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "looped-bfs": looped_bfs,
    "mobius": mobius,
}
"""Registry: schedule name -> builder."""

_MULTI_STAGE = frozenset({"interleaved-1f1b", "looped-bfs", "mobius"})

ROUNDPIPE = "roundpipe"
"""RoundPipe's dispatch (:func:`roundpipe_tasks`): not a per-rank action list
(a layer group's forward and backward run on different GPUs), so not in
:data:`SCHEDULES`; its ``p v`` layer groups count as stages."""


def roundpipe_tasks(groups: int, gpus: int) -> tuple[tuple[str, int, int], ...]:
    """RoundPipe's tasks of one training iteration in dispatch order, as
    ``(kind, group, gpu)``.

    RoundPipe (arXiv 2604.27085; ``RoundPipe.forward_backward`` in
    RoundPipe/RoundPipe.py of the ITcarrot/RoundPipe repository) runs the
    layer groups' forwards ``0 .. G-2`` (kind ``"F"``), then the last group's
    fused forward, loss and backward (``"FB"``), then the backwards of
    groups ``G-2 .. 0`` (``"B"``, each re-running its group's forward
    first); each task is handed to the next GPU of a global round-robin
    counter (``device.get_next_device``), so task ``t`` runs on GPU ``t mod
    gpus`` and a group's backward usually runs on another GPU than its
    forward. Each task runs all the micro-batches, in order, on its GPU.

    Raises:
        InputError: ``groups`` or ``gpus`` below 1.
    """
    _check_p_m_v(ROUNDPIPE, gpus, 1, groups)
    kinds = [("F", g) for g in range(groups - 1)] + [("FB", groups - 1)]
    kinds += [("B", g) for g in reversed(range(groups - 1))]
    return tuple((kind, g, t % gpus) for t, (kind, g) in enumerate(kinds))


def build(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """Build schedule ``name`` for ``p`` ranks, ``m`` micro-batches, ``v``
    stages per rank.

    Raises:
        InputError: unknown name; ``v != 1`` for a single-stage-per-rank
            schedule; or the builder's own refusals.
    """
    return _build(p, _order_of(name, p, m, v))


def build_orders(name: str, p: int, m: int, v: int = 1) -> tuple[list[tuple[str, int, int]], ...]:
    """The order :func:`build` returns, as plain ``(kind, stage, micro-batch)``
    tuples per rank (no :class:`Action` objects: for the array form of large
    schedules).

    Raises:
        InputError: as :func:`build`.
    """
    order = _order_of(name, p, m, v)
    return tuple(list(order(r)) for r in range(p))


def check(name: str, p: int, m: int, v: int = 1) -> None:
    """Refuse what :func:`build` refuses, without building the action lists.

    Raises:
        InputError: as :func:`build`.
    """
    _order_of(name, p, m, v)


def _order_of(name: str, p: int, m: int, v: int):
    """The per-rank order generator of schedule ``name`` after every check
    :func:`build` makes (name, ``v``, then the builder's own)."""
    if name not in SCHEDULES:
        raise InputError(f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}")
    if name in _MULTI_STAGE:
        return _ORDERS[name](p, m, v)
    if v != 1:
        raise InputError(
            f"{name}: runs one stage per rank, got v={v}; use v=1 or one of "
            f"{', '.join(sorted(_MULTI_STAGE))}"
        )
    return _ORDERS[name](p, m)


def num_stages_of(name: str, p: int, v: int = 1) -> int:
    """Stages a schedule built by :func:`build` has: ``p v`` for looped ones
    (and RoundPipe's layer groups), else ``p``."""
    return p * v if name in _MULTI_STAGE or name == ROUNDPIPE else p


def work_until_last_forward(name: str, p: int, m: int, v: int = 1) -> dict[str, tuple[int, ...]]:
    """Per stage ``k``: how many ``F``, ``B``, ``I`` and ``W`` actions of stage
    ``k`` its rank ``r = k % p`` runs up to and including the forward of
    micro-batch ``m - 1`` on stage ``r`` (the rank's first stage), in the order
    :func:`build` produces; counted from each builder's order in closed form,
    without building the action lists.

    * GPipe, looped BFS: the ``m`` forwards of the first stage come first.
    * 1F1B: ``p - 1 - r`` warm-up forwards, then (F, B) pairs: ``m`` F and
      ``m - p + r`` B.
    * ZB-H1: ``m`` F, ``m - p + r`` I and, the W of micro-batch ``j`` after the
      I of ``j + r``, ``max(m - p, 0)`` W.
    * Interleaved 1F1B: the forward of micro-batch ``m - 1`` on chunk 0 is
      virtual micro-batch ``k* = (m / p - 1) p v + p - 1``; all forwards
      ``0 .. k*`` ran, and the backwards ``0 .. k* - warm - 1`` when ``k*`` is
      past the warm-up (each steady pair runs its F before its B).

    Returns:
        ``{"F": counts, "B": ..., "I": ..., "W": ...}``, each a tuple of
        length :func:`num_stages_of`.

    Raises:
        InputError: what :func:`build` refuses.
    """
    _order_of(name, p, m, v)  # the builder's refusals; nothing is generated
    S = num_stages_of(name, p, v)
    out = {kind: [0] * S for kind in "FBIW"}
    if name in ("gpipe", "looped-bfs", "mobius"):
        out["F"][:p] = [m] * p
    elif name in ("1f1b", "zb-h1"):
        for r in range(p):
            out["F"][r] = m
            out["B" if name == "1f1b" else "I"][r] = m - p + r
            if name == "zb-h1":
                out["W"][r] = max(m - p, 0)
    else:  # interleaved-1f1b
        group, last = p * v, (m // p - 1) * p * v + p - 1
        for r in range(p):
            warm = min((v - 1) * p + 2 * (p - 1 - r), m * v)
            n_bwd = max(last - warm, 0)
            for c in range(v):
                out["F"][c * p + r] = _chunk_count(last + 1, c, p, group)
                out["B"][c * p + r] = _chunk_count(n_bwd, v - 1 - c, p, group)
    return {kind: tuple(counts) for kind, counts in out.items()}


def _chunk_count(n: int, chunk: int, p: int, group: int) -> int:
    """How many virtual micro-batches ``k < n`` belong to ``chunk``
    (``(k mod group) // p == chunk``)."""
    return (n // group) * p + min(max(n % group - chunk * p, 0), p)


# ---------------------------------------------------------------- helpers


def stage_to_rank(actions: Sequence[Sequence[Action]]) -> dict[int, int]:
    """Stage -> the rank whose list holds its actions.

    Raises:
        InputError: a stage appears on two ranks.
    """
    out: dict[int, int] = {}
    for r, seq in enumerate(actions):
        for a in seq:
            q = out.setdefault(a.stage, r)
            if q != r:
                raise InputError(f"stage {a.stage} has actions on rank {q} and rank {r}; a stage lives on one rank")
    return out


def in_flight_peak(actions: Sequence[Sequence[Action]], stage: int) -> int:
    """Peak number of micro-batches of ``stage`` whose activations are held:
    counted +1 when its ``F`` starts, -1 when its ``B`` (or ``W``, for a split
    backward) ends. Exact in time because one rank runs one action at a time.
    """
    peak = cur = 0
    for seq in actions:
        for a in seq:
            if a.stage != stage:
                continue
            if a.kind == "F":
                cur += 1
                peak = max(peak, cur)
            elif a.kind in ("B", "W"):
                cur -= 1
    return peak


def in_flight_peaks(actions: Sequence[Sequence[Action]]) -> tuple[int, ...]:
    """:func:`in_flight_peak` for every stage ``0 .. max stage``, in one pass."""
    n = 1 + max((a.stage for seq in actions for a in seq), default=-1)
    peak = [0] * n
    cur = [0] * n
    for seq in actions:
        for a in seq:
            if a.kind == "F":
                cur[a.stage] += 1
                if cur[a.stage] > peak[a.stage]:
                    peak[a.stage] = cur[a.stage]
            elif a.kind in ("B", "W"):
                cur[a.stage] -= 1
    return tuple(peak)


def wgrad_states(actions: Sequence[Sequence[Action]]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per stage of a schedule with one stage per rank: the micro-batch
    counts ``(a, b)`` it can hold at once, ``a`` between the start of a
    micro-batch's ``F`` and the end of its ``B`` or ``I``, ``b`` between the
    end of its ``I`` and the end of its ``W`` (the accounting of
    :func:`simultaneous_in_flight`), reduced to the states no other state
    exceeds in both counts. A stage holding ``S`` bytes per micro-batch
    before ``I`` and ``H`` after it peaks at ``max (a S + b H)`` over them,
    exactly, whatever ``S`` and ``H`` are.

    Raises:
        InputError: a rank runs more than one stage.
    """
    out = {}
    for seq in actions:
        stages = {a.stage for a in seq}
        if len(stages) > 1:
            raise InputError(f"wgrad_states: rank runs stages {sorted(stages)}; one stage per rank only")
        a = b = 0
        states = {(0, 0)}
        for act in seq:
            if act.kind == "F":
                a += 1
            elif act.kind == "I":
                a, b = a - 1, b + 1
            elif act.kind == "W":
                b -= 1
            elif act.kind == "B":
                a -= 1
            states.add((a, b))
        for stage in stages:
            out[stage] = tuple(sorted(_undominated(states)))
    return tuple(out[k] for k in range(len(out)))


def _undominated(states) -> list[tuple]:
    """The count vectors of ``states`` no other one reaches in every
    component, in decreasing order of their total (a vector another one
    reaches has a smaller total, or is that vector: it is met after it)."""
    ordered = sorted(states, key=lambda y: (-sum(y), y))
    if ordered and len(ordered[0]) == 2:  # two chunks: the staircase, in one sweep by the first count
        front, most = set(), -float("inf")
        for x in sorted(states, reverse=True):  # first count falling, then the second
            if x[1] > most:  # no vector before it reaches its second count
                front.add(x)
                most = x[1]
        return [x for x in ordered if x in front]
    kept: list[tuple] = []
    for x in ordered:
        if not any(all(b >= a for a, b in zip(x, y)) for y in kept):
            kept.append(x)
    return kept


def simultaneous_in_flight(actions: Sequence[Sequence[Action]], held_after_input: float = 1.0) -> tuple[float, ...]:
    """Per stage: the micro-batches' worth of activations it holds at the
    moment its rank holds the most, summed over the rank's stages.

    :func:`in_flight_peaks` gives each stage's own peak; on a rank with several
    stages (interleaved 1F1B, looped BFS) those peaks happen at different
    times, so their sum over-counts the rank's memory. Here each rank's list
    is walked once: a micro-batch counts 1 from the start of its ``F`` until
    its ``B`` (or ``I``) ends, then ``held_after_input`` until its ``W`` ends
    (zero-bubble schedules: after the input gradient only the inputs of the
    weight-gradient GEMMs remain; Qi et al. 2023, Table 1). The returned
    per-stage counts are those at the first moment the rank's total is
    largest, so they sum to that rank's simultaneous peak.

    Example: Megatron-LM's interleaved order with ``p = 8``, ``v = 3``: rank 0
    runs ``2 (p - 1) + (v - 1) p = 30`` warm-up forwards, then one more before
    its first backward: 31 chunk-micro-batches (15 of chunk 0, 8 each of
    chunks 1 and 2), where the chunks' own peaks 16 + 15 + 8 sum to 39.

    Args:
        actions: one ordered action list per rank.
        held_after_input: share of a micro-batch's activations still held
            between its ``I`` and ``W`` (1 keeps it all until ``W``).

    Returns:
        One float per stage ``0 .. max stage``.
    """
    return _simultaneous_in_flight([[(a.kind, a.stage) for a in seq] for seq in actions], held_after_input)


def simultaneous_in_flight_of(name: str, p: int, m: int, v: int = 1,
                              held_after_input: float = 1.0, codes: np.ndarray | None = None) -> tuple[float, ...]:
    """:func:`simultaneous_in_flight` of ``build(name, p, m, v)``, the same
    numbers, walked on :func:`build_orders`' plain tuples (no
    :class:`Action` objects: ``O(p m v)`` of them for large pipelines).
    ``codes``: :func:`one_stage_codes` of the same arguments, when the
    caller keeps them (they do not depend on ``held_after_input``).

    Raises:
        InputError: as :func:`build`.
    """
    if codes is None and v == 1 and name in _CLOSED_FORM_CODES:
        codes = one_stage_codes(name, p, m, v)
    if codes is None:
        orders = build_orders(name, p, m, v)
        codes = _codes_of(name, v, orders)
        if codes is None:  # several stages on a rank: the walk of each rank's counts per stage
            return _simultaneous_in_flight([[(k, s) for k, s, _ in seq] for seq in orders], held_after_input)
    return _one_stage_peaks(codes, held_after_input)  # rank r runs stage r alone: all ranks at once


def one_stage_codes(name: str, p: int, m: int, v: int = 1) -> np.ndarray | None:
    """``(p, n)`` int8: rank ``r``'s action kinds in order (codes of
    :data:`KINDS`, padded with ``len(KINDS)``: no change) when every rank
    ``r`` runs stage ``r`` alone, first an ``F``; None otherwise.

    GPipe, 1F1B and ZB-H1 are written directly from their orders' closed
    forms (:func:`_closed_form_codes`), the same arrays as walking
    :func:`build_orders` (tests/test_schedules.py), without its ``O(p m)``
    tuples.

    Raises:
        InputError: as :func:`build`.
    """
    if v == 1 and name in _CLOSED_FORM_CODES:
        check(name, p, m, v)
        return _closed_form_codes(name, p, m)
    return _codes_of(name, v, build_orders(name, p, m, v))


#: the schedules whose :func:`one_stage_codes` are written from closed forms
_CLOSED_FORM_CODES = ("gpipe", "1f1b", "zb-h1")


def _closed_form_codes(name: str, p: int, m: int) -> np.ndarray:
    """:func:`one_stage_codes` of GPipe, 1F1B or ZB-H1 (``m >= p`` for the
    last two, checked by the caller), rank ``r`` with ``w = p - 1 - r``
    warm-up forwards: GPipe ``F^m B^m``; 1F1B ``F^w (F B)^(m-w) B^w``
    (:func:`one_f_one_b`); ZB-H1 ``F^w (F I)^r (F I W)^(m-p+1) (I W)^w W^r``
    (:func:`zb_h1`: the ``W`` of micro-batch ``j`` follows the ``I`` of
    ``j + r``, and forward ``w + j`` exists while ``w + j < m``). Every
    rank runs ``2 m`` (``3 m``) actions: no padding."""
    F, B, I, W = (np.int8(KINDS.index(k)) for k in KINDS)
    if name == "gpipe":
        return np.repeat(np.array([[F, B]], dtype=np.int8), m, axis=1).repeat(p, axis=0)
    out = np.empty((p, (2 if name == "1f1b" else 3) * m), dtype=np.int8)
    runs = {x: np.full(m, x, dtype=np.int8) for x in (F, B, W)}
    pairs = {x: np.tile(np.array(x, dtype=np.int8), m) for x in ((F, B), (F, I), (I, W), (F, I, W))}
    for r in range(p):  # each row from slices of the patterns above (views), one copy
        w = p - 1 - r
        if name == "1f1b":
            parts = (runs[F][:w], pairs[F, B][:2 * (m - w)], runs[B][:w])
        else:
            parts = (runs[F][:w], pairs[F, I][:2 * r], pairs[F, I, W][:3 * (m - p + 1)], pairs[I, W][:2 * w],
                     runs[W][:r])
        np.concatenate(parts, out=out[r])
    return out


def _codes_of(name: str, v: int, orders) -> np.ndarray | None:
    """:func:`one_stage_codes` of :func:`build_orders`' ``orders``."""
    if v != 1 or name in _MULTI_STAGE or not all(seq and seq[0][:2] == ("F", r) for r, seq in enumerate(orders)):
        return None
    code = {k: c for c, k in enumerate(KINDS)}
    out = np.full((len(orders), max(len(seq) for seq in orders)), len(KINDS), dtype=np.int8)
    for r, seq in enumerate(orders):
        out[r, :len(seq)] = [code[k] for k, _, _ in seq]
    return out


def _one_stage_peaks(codes: np.ndarray, held_after_input: float) -> tuple[float, ...]:
    """:func:`_one_stage_peak` of every rank of ``codes``
    (:func:`one_stage_codes`), the same floats: each rank's count is the
    running sum of its changes (``cumsum`` adds left to right, as the walk
    does), and the walk's peak is its last count above the peak before by
    more than ``1e-12``, which is the largest count when every new largest
    count clears the one before by that much (the rank walked one action at
    a time otherwise)."""
    change = _held_changes(held_after_input)
    counts = np.cumsum(np.array([change[k] for k in KINDS] + [0.0])[codes], axis=1)
    before = np.maximum.accumulate(np.concatenate([np.full((len(codes), 1), -1.0), counts[:, :-1]], axis=1), axis=1)
    clear = np.all((counts <= before) | (counts > before + 1e-12), axis=1)  # the walk's own test, as it computes it
    peaks = counts.max(axis=1)  # a rank's first action is an F: its count starts at 1
    return tuple(float(peaks[r]) if clear[r] else
                 _one_stage_peak([KINDS[c] for c in codes[r] if c < len(KINDS)], held_after_input)
                 for r in range(len(codes)))


def _held_changes(held_after_input: float) -> dict[str, float]:
    """How many micro-batches' worth of activations a stage holds more after
    each kind of action: ``F`` +1 (from its start), ``B`` -1 (at its end),
    ``I`` ``-(1 - h)`` and ``W`` ``-h`` with ``h = held_after_input`` (the
    accounting of :func:`simultaneous_in_flight`; subtracting ``y`` and
    adding ``-y`` are the same float operation)."""
    return {"F": 1.0, "B": -1.0, "I": -(1.0 - held_after_input), "W": -held_after_input}


def chunk_states_of(name: str, p: int, m: int, v: int = 1,
                    held_after_input: float = 1.0) -> tuple[tuple[tuple[float, ...], ...], ...]:
    """Per rank ``r`` of ``build(name, p, m, v)``: the micro-batches' worth
    of activations each of its ``v`` chunks (stage ``r + c p`` is chunk
    ``c``) holds at one moment, for every moment of the rank's list (the
    accounting of :func:`simultaneous_in_flight`), reduced to the count
    vectors no other one reaches in every chunk (each in decreasing order
    of its total).

    A rank whose chunk ``c`` saves ``a_c`` bytes per micro-batch peaks at
    exactly ``max over the states of sum_c n_c a_c``, whatever the ``a_c``:
    the moment with the most micro-batches (:func:`simultaneous_in_flight`)
    is one of the states, but when the chunks save different bytes another
    may hold more. With ``p = 8``, ``v = 3`` rank 0 holds ``(15, 8, 8)``
    after its warm-up (:func:`simultaneous_in_flight`'s example), then
    ``(16, 8, 7)``, ``(16, 9, 6)``, ... ``(16, 15, 0)``: when chunk 0 saves
    more bytes per micro-batch than chunk 2 the rank peaks at ``(16, 8, 7)``.

    Raises:
        InputError: as :func:`build`.
    """
    out, change = [], _held_changes(held_after_input)
    for seq in build_orders(name, p, m, v):
        cur = [0.0] * v
        states = {tuple(cur)}
        for kind, stage, _ in seq:
            cur[stage // p] += change.get(kind, 0.0)
            states.add(tuple(cur))
        out.append(tuple(_undominated(states)))
    return tuple(out)


def _simultaneous_in_flight(ranks, held_after_input: float) -> tuple[float, ...]:
    """:func:`simultaneous_in_flight` over ``(kind, stage)`` pairs per rank."""
    n = 1 + max((s for seq in ranks for _, s in seq), default=-1)
    out, change = [0.0] * n, _held_changes(held_after_input)
    for seq in ranks:
        if seq and seq[0][0] == "F" and all(s == seq[0][1] for _, s in seq):
            out[seq[0][1]] = _one_stage_peak([k for k, _ in seq], held_after_input)
            continue
        cur: dict[int, float] = {}
        best, at = -1.0, {}
        for kind, stage in seq:
            cur[stage] = cur.get(stage, 0.0) + change.get(kind, 0.0)
            total = sum(cur.values())
            if total > best + 1e-12:
                best, at = total, dict(cur)
        for stage, count in at.items():
            out[stage] = count
    return tuple(out)


def _one_stage_peak(kinds, held_after_input: float) -> float:
    """:func:`_simultaneous_in_flight` of a rank running one stage, its
    first action an ``F``: the same float operations on one count (the
    rank's total is that count) without the per-action dictionary."""
    x, best, at, change = 0.0, -1.0, 0.0, _held_changes(held_after_input)
    rising = "".join(k for k, c in change.items() if c > 0)
    if rising == "F":  # after the rank's last forward its count only falls: the walk stops there
        kinds = kinds[:"".join(kinds).rfind("F") + 1]
    for kind in kinds:
        x = x + change.get(kind, 0.0)
        if x > best + 1e-12:
            best, at = x, x
    return at


def format_order(actions: Sequence[Sequence[Action]], limit: int = 40) -> str:
    """A short text view: one line per rank, actions in torch's ``0F1`` form."""
    lines = []
    for r, seq in enumerate(actions):
        cells = [str(a) for a in seq[:limit]]
        more = f" ... (+{len(seq) - limit})" if len(seq) > limit else ""
        lines.append(f"rank {r}: " + " ".join(cells) + more)
    return "\n".join(lines)


# ---------------------------------------------------------------- validation


def validate(actions: Sequence[Sequence[Action]], num_stages: int, m: int) -> None:
    """Check that ``actions`` is a complete, runnable schedule.

    Checks, in order:

    1. every action has a kind in ``F, B, I, W``, ``0 <= stage < num_stages``,
       ``0 <= microbatch < m``; each stage lives on one rank;
    2. every ``(stage, microbatch)`` has exactly one ``F`` and either exactly
       one ``B`` or exactly one ``I`` and one ``W``;
    3. on its rank, ``F`` comes before the backward (``B`` or ``I``) and ``I``
       before ``W``;
    4. the cross-stage dependencies (``F`` of stage ``s`` needs ``F`` of
       ``s - 1``; ``B``/``I`` of ``s`` needs ``B``/``I`` of ``s + 1``; the last
       stage's backward needs its own ``F``) can all be met: ranks are run with
       zero times and any stall is reported with what each stuck rank waits
       for.

    Raises:
        InputError: the first failed check, naming rank, position and action.
    """
    if num_stages < 1 or m < 1:
        raise InputError(f"validate: num_stages={num_stages} and m={m} must be >= 1")
    S, M = num_stages, m
    owner: dict[int, int] = {}
    # position of each action: index = s*M + mb
    pos_f = [-1] * (S * M)
    pos_b = [-1] * (S * M)  # B or I
    pos_w = [-1] * (S * M)
    split = [0] * (S * M)  # 1 = B, 2 = I/W
    for r, seq in enumerate(actions):
        for i, a in enumerate(seq):
            if not isinstance(a, Action):
                raise InputError(f"rank {r}, position {i}: {a!r} is not an Action")
            if a.kind not in KINDS:
                raise InputError(f"rank {r}, position {i}: kind {a.kind!r} not in {KINDS}")
            if not (0 <= a.stage < S):
                raise InputError(f"rank {r}, position {i}: {a} has stage {a.stage} outside 0..{S - 1}")
            if not (0 <= a.microbatch < M):
                raise InputError(f"rank {r}, position {i}: {a} has micro-batch {a.microbatch} outside 0..{M - 1}")
            q = owner.setdefault(a.stage, r)
            if q != r:
                raise InputError(f"rank {r}, position {i}: stage {a.stage} already runs on rank {q}; a stage lives on one rank")
            k = a.stage * M + a.microbatch
            if a.kind == "F":
                if pos_f[k] >= 0:
                    raise InputError(f"rank {r}, position {i}: second {a} (first at position {pos_f[k]})")
                pos_f[k] = i
                continue
            want = 1 if a.kind == "B" else 2
            if split[k] and split[k] != want:
                raise InputError(f"rank {r}, position {i}: {a} mixes a full backward B with a split I/W for stage {a.stage}, micro-batch {a.microbatch}")
            split[k] = want
            if a.kind == "W":
                if pos_w[k] >= 0:
                    raise InputError(f"rank {r}, position {i}: second {a} (first at position {pos_w[k]})")
                pos_w[k] = i
            else:
                if pos_b[k] >= 0:
                    raise InputError(f"rank {r}, position {i}: second {a} (first at position {pos_b[k]})")
                pos_b[k] = i
    for s in range(S):
        if s not in owner:
            raise InputError(f"stage {s} has no actions on any rank (expected {M} F and {M} B or I/W)")
        r = owner[s]
        for mb in range(M):
            k = s * M + mb
            name = f"stage {s}, micro-batch {mb} (rank {r})"
            if pos_f[k] < 0:
                raise InputError(f"{name}: missing forward {s}F{mb}")
            if pos_b[k] < 0:
                raise InputError(f"{name}: missing backward {s}B{mb} (or {s}I{mb} + {s}W{mb})")
            if split[k] == 2 and pos_w[k] < 0:
                raise InputError(f"{name}: has {s}I{mb} but no {s}W{mb}")
            if pos_b[k] < pos_f[k]:
                bk = "B" if split[k] == 1 else "I"
                raise InputError(f"{name}: backward {s}{bk}{mb} at position {pos_b[k]} comes before its forward {s}F{mb} at position {pos_f[k]}")
            if split[k] == 2 and pos_w[k] < pos_b[k]:
                raise InputError(f"{name}: {s}W{mb} at position {pos_w[k]} comes before {s}I{mb} at position {pos_b[k]}")
    _check_deadlock(actions, S, M, owner, pos_f, pos_b)


def _check_deadlock(actions, S, M, owner, pos_f, pos_b) -> None:
    """Run ranks with zero times; raise InputError naming who waits for what."""
    P = len(actions)
    done_f = [False] * (S * M)
    done_b = [False] * (S * M)
    ptr = [0] * P
    waiter_f = [-1] * (S * M)
    waiter_b = [-1] * (S * M)
    stack = list(range(P - 1, -1, -1))
    while stack:
        r = stack.pop()
        seq = actions[r]
        i = ptr[r]
        n = len(seq)
        while i < n:
            a = seq[i]
            s, mb, kind = a.stage, a.microbatch, a.kind
            if kind == "F":
                if s > 0 and not done_f[(s - 1) * M + mb]:
                    waiter_f[(s - 1) * M + mb] = r
                    break
                k = s * M + mb
                done_f[k] = True
                if waiter_f[k] >= 0:
                    stack.append(waiter_f[k])
                    waiter_f[k] = -1
            elif kind in ("B", "I"):
                if s < S - 1 and not done_b[(s + 1) * M + mb]:
                    waiter_b[(s + 1) * M + mb] = r
                    break
                k = s * M + mb
                done_b[k] = True
                if waiter_b[k] >= 0:
                    stack.append(waiter_b[k])
                    waiter_b[k] = -1
            i += 1
        ptr[r] = i
    stuck = [r for r in range(P) if ptr[r] < len(actions[r])]
    if not stuck:
        return
    lines = []
    for r in stuck:
        a = actions[r][ptr[r]]
        if a.kind == "F":
            ds, dpos, dep = a.stage - 1, pos_f[(a.stage - 1) * M + a.microbatch], f"{a.stage - 1}F{a.microbatch}"
        else:
            ds, dpos = a.stage + 1, pos_b[(a.stage + 1) * M + a.microbatch]
            dep = f"{ds}B{a.microbatch} (or {ds}I{a.microbatch})"
        q = owner[ds]
        blocker = actions[q][ptr[q]] if ptr[q] < len(actions[q]) else None
        lines.append(
            f"rank {r} waits at position {ptr[r]} ({a}) for {dep} at rank {q} position {dpos}, "
            f"while rank {q} is stuck at position {ptr[q]} ({blocker})"
        )
    raise InputError("schedule deadlocks: " + "; ".join(lines))


# ---------------------------------------------------------------- torch CSV

# torch.distributed.pipelining (torch/distributed/pipelining/schedules.py):
# * ``_Action.__repr__`` prints ``str(stage_index) + computation_type.value +
#   str(microbatch_index)``, e.g. ``2F0``; ``_ComputationType`` values are
#   "F" (FORWARD), "I" (BACKWARD_INPUT), "W" (BACKWARD_WEIGHT),
#   "B" (FULL_BACKWARD), plus comm/FSDP kinds (SEND_F, RECV_B, UNSHARD, ...).
# * ``_Action.from_str`` strips the cell, returns None for "", and otherwise
#   matches ``(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)``.
# * ``PipelineScheduleMulti._dump_csv`` writes ``csv.writer(f).writerow(
#   pipeline_order[rank])`` for each rank; ``_load_csv(filename,
#   format="compute_only")`` reads ``csv.reader`` rows, row index = rank, each
#   cell through ``_Action.from_str``. The "compute_only" format allows only
#   F/B/I/W (``_prepare_schedule_with_comms`` rejects comm actions there).
_TORCH_CELL = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")


def to_torch_csv(actions) -> str:
    """The schedule in the compute-only CSV that torch's ``_load_csv`` reads:
    one row per rank, one cell per action (``0F1`` = stage 0 forward of
    micro-batch 1), rows ending in ``\\r\\n`` as ``csv.writer`` writes them.
    ``actions``: per rank its :class:`Action` objects (:func:`build`) or
    ``(kind, stage, micro-batch)`` tuples (:func:`build_orders`)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    for seq in actions:
        writer.writerow([str(a) if isinstance(a, Action) else f"{a[1]}{a[0]}{a[2]}" for a in seq])
    return buf.getvalue()


def from_torch_csv(text: str) -> Schedule:
    """Parse torch's compute-only CSV (see :func:`to_torch_csv`).

    Empty cells (torch's ``None`` idle steps) are skipped.

    Raises:
        InputError: a cell that is not ``<stage><F|B|I|W><microbatch>``
            (communication or FSDP actions included), naming row and column.
    """
    out = []
    for r, row in enumerate(csv.reader(io.StringIO(text))):
        seq = []
        for c, cell in enumerate(row):
            cell = cell.strip()
            if not cell:
                continue
            mt = _TORCH_CELL.fullmatch(cell)
            if not mt:
                raise InputError(f"torch CSV row {r} (rank), column {c}: {cell!r} is not an action like 0F1")
            stage, kind, mb = mt.groups()
            if kind not in KINDS or mb == "":
                raise InputError(
                    f"torch CSV row {r} (rank), column {c}: {cell!r} is not a compute action "
                    f"(only F, B, I, W with a micro-batch index belong in a compute-only schedule)"
                )
            seq.append(Action(kind, int(stage), int(mb)))
        out.append(tuple(seq))
    return tuple(out)
