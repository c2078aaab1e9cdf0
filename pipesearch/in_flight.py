"""Micro-batches' activations each stage of a schedule holds at its peak."""

from __future__ import annotations


import numpy as np

from . import schedules as schedule_lib
from .costs import in_flight_micro_batches
from .search_options import ANALYTIC_SCHEDULES


def schedule_in_flight(schedule: str, pp: int, m: int, vp: int, cache: dict | None = None,
                       held_after_input: float = 1.0) -> np.ndarray:
    """Micro-batches' worth of activations each of the ``pp * vp`` stages
    holds at its own peak, read off the schedule's own action lists
    (:func:`pipesearch.schedules.simultaneous_in_flight`; with several
    stages per device each chunk's own peak, the largest count of
    :func:`schedule_chunk_states`: the device's memory is then checked at
    each of its count states). For interleaved 1F1B and ZB-H1 the counts
    stop changing once ``m >= 2 pp`` (the warm-up depth is bounded), so they
    are computed at ``min(m, 2 pp)`` (ZB-H1: ``min(m, pp)``, the same counts
    bit for bit). ZB-H1 stage ``r`` holds ``pp - r (1 - h)`` with ``h =
    held_after_input`` the share of a micro-batch's activations kept between
    its input- and weight-gradient steps (``pp`` when ``h = 1``); looped
    breadth-first keeps all ``m``; GPipe ``m``; 1F1B ``min(m, pp - s)``."""
    if schedule in ANALYTIC_SCHEDULES:
        return in_flight_micro_batches(schedule, pp, m)
    if schedule in ("looped-bfs", "mobius"):
        return np.full(pp * vp, m, dtype=np.int64)
    if schedule == "roundpipe":  # a GPU computes one micro-batch of a group at a time (pipesearch.roundpipe)
        return np.ones(pp * vp, dtype=np.int64)
    if vp > 1:  # each chunk's own peak: stage c pp + r is chunk c of rank r
        return schedule_chunk_states(schedule, pp, m, vp, cache, held_after_input).max(axis=1).T.reshape(-1)
    # ZB-H1's counts are those of m = pp once m >= pp (its warm-up is pp - r
    # forwards deep; tests/test_search.py compares them bit for bit)
    m_eff = min(m, pp) if schedule == "zb-h1" else min(m, 2 * pp)
    key = (schedule, pp, m_eff, vp, held_after_input)
    if cache is None or key not in cache:
        codes = None  # the ranks' action kinds, the same for every held share (kept with the counts)
        if cache is not None and vp == 1:
            if ("codes",) + key[:4] not in cache:
                cache[("codes",) + key[:4]] = schedule_lib.one_stage_codes(schedule, pp, m_eff, vp)
            codes = cache[("codes",) + key[:4]]
        peaks = np.array(schedule_lib.simultaneous_in_flight_of(schedule, pp, m_eff, vp, held_after_input, codes),
                         dtype=float)
        if cache is None:
            return peaks
        cache[key] = peaks
    return cache[key]


def floor_in_flight(schedule: str, pp: int, m: int, vp: int, cache: dict | None = None,
                    held_after_input: float = 1.0) -> np.ndarray:
    """In-flight counts per stage for :func:`surely_out_of_memory`: those
    of :func:`schedule_in_flight` with one stage per rank; with several,
    every stage gets the least over the ranks of ``max_q min_c n_qc`` (the
    count states of :func:`schedule_chunk_states`): at its state ``q`` a
    device holds at least ``min_c n_qc`` micro-batches of each chunk, so
    the devices together hold at least that many of the whole model's."""
    states = schedule_chunk_states(schedule, pp, m, vp, cache, held_after_input)
    if states is None:
        return schedule_in_flight(schedule, pp, m, vp, cache, held_after_input)
    return np.full(pp * vp, float(states.min(axis=2).max(axis=1).min()))


def schedule_chunk_states(schedule: str, pp: int, m: int, vp: int, cache: dict | None = None,
                          held_after_input: float = 1.0) -> np.ndarray | None:
    """``(pp, Q, vp)``: the count states of each rank's ``vp`` chunks
    (:func:`pipesearch.schedules.chunk_states_of`, padded with zero
    vectors), for a schedule with several stages per rank whose memory the
    split search checks device by device
    (:attr:`pipesearch.costs.PipelineCosts.chunk_states`); None for one
    stage per rank, Mobius (its own per-GPU check) and RoundPipe. Looped
    breadth-first holds all ``m`` micro-batches of every chunk after its
    forwards; interleaved 1F1B's states stop changing once ``m >= 2 pp``
    (tests/test_search_schedules.py) and are read there."""
    if vp == 1 or schedule in ("mobius", "roundpipe"):
        return None
    if schedule == "looped-bfs":
        return np.full((pp, 1, vp), float(m))
    key = ("chunk-states", schedule, pp, min(m, 2 * pp), vp, held_after_input)
    if cache is not None and key in cache:
        return cache[key]
    states = schedule_lib.chunk_states_of(schedule, pp, min(m, 2 * pp), vp, held_after_input)
    out = np.zeros((pp, max(len(x) for x in states), vp))
    for r, xs in enumerate(states):
        out[r, :len(xs)] = xs
    out.flags.writeable = False
    if cache is not None:
        cache[key] = out
    return out
