"""Waiting times of serving requests under Poisson arrivals (``--request-rate``).

A request waits twice before its first prompt chunk runs: for the steps'
token budget, which the prompts share first come, first served
(:func:`prompt_wait_s`, an M/D/1 queue), and for one of the engine's running
slots (:func:`admission_wait_s`, an M/D/c queue). Pure functions of rates
and times; :mod:`pipesearch.serve.pipeline` and
:mod:`pipesearch.serve.search` put them into the closed-form TTFT
(docs/serving_costs.md, "Queueing under a request rate").
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["prompt_wait_s", "admission_wait_s", "closed_loop_wait_s"]


def prompt_wait_s(rate_per_s: float, service_s, slot_s, busy_share=1.0):
    """Mean wait of a prompt for its first chunk under Poisson arrivals at
    ``rate_per_s``: the prompts share the steps' token budget first come,
    first served, so they queue at one server whose service is a prompt's
    tokens at the budget's prompt tokens a step, ``S = (n / P) C_P / m``
    (``service_s``; ``P = T - d`` the budget less the step's decode tokens,
    ``C_P`` the cycle of steps that carry ``P`` prompt tokens, a step a
    cycle over ``m`` apart: a prompt of several chunks, or several short
    prompts in one step; the next prompt fills what the last chunk leaves
    of a step), deterministic: the M/D/1 queue's
    mean wait ``rho S / (2 (1 - rho))``, ``rho = lambda S``
    (Pollaczek-Khinchine with ``E[S^2] = S^2``; Kleinrock, "Queueing
    Systems" vol. 1, 1975, eq. 5.87), plus half a step (``slot_s``: a
    cycle over ``m``) times ``busy_share``: while the engine runs, steps
    start at fixed times, and a Poisson arrival (which sees the time
    averages, PASTA; Wolff 1982, Operations Research 30(2)) falls at a
    uniform point of a step, so every prompt, whether it finds others
    queued or not, waits for the next step's schedule first (exact where
    ``S`` is a whole number of steps: the queue then moves a step at a
    time); an engine with no request runs no step and schedules an
    arrival at once, so the half step counts for the share
    ``busy_share`` of arrivals that find it running. Infinite where
    ``rho >= 1`` (the prompts arrive faster than the budget takes them).
    Arrays broadcast."""
    service = np.asarray(service_s, dtype=float)
    rho = rate_per_s * service
    with np.errstate(divide="ignore", invalid="ignore"):
        queue = np.where(rho < 1, rho * service / (2 * np.maximum(1 - rho, 1e-300)), np.inf)
    return queue + np.asarray(busy_share, dtype=float) * np.asarray(slot_s, dtype=float) / 2


def admission_wait_s(rate_per_s: float, mean_batch: float, servers: int) -> float:
    """Mean wait of an arrival for a running slot: ``servers`` (the
    engine's running limit) serve requests that arrive at ``rate_per_s``
    (Poisson) and each stay ``B / lambda`` (Little's law, ``B`` =
    ``mean_batch`` running on average); the requests' lives are nearly
    fixed, so the M/D/c queue's wait: half the M/M/c one (Allen-Cunneen,
    ``C(c, B) B / (lambda (c - B)) x (1 + 0) / 2``, with Erlang's C
    formula from Erlang B's recursion ``B_k = a B_{k-1} / (k + a
    B_{k-1})``, ``C = c B_c / (c - a (1 - B_c))``; Allen, "Probability,
    Statistics, and Queueing Theory", 1990, sec. 6.4), times Cosmetatos'
    correction for deterministic service ``1 + (1 - rho) (c - 1)
    (sqrt(4 + 5 c) - 2) / (16 rho c)``, ``rho = B / c`` (Cosmetatos 1976,
    Operational Research Quarterly 27(3), 615-620): Allen-Cunneen alone is
    optimistic for ``c > 1`` (12% and 15% under simulated waits at ``c =
    4``, ``rho = 0.5`` and ``c = 8``, ``rho = 0.6``,
    tests/test_serve_queueing.py); both are exact for
    ``c = 1``, the M/D/1 wait. Infinite where ``B >= c`` (the slots never
    free up)."""
    c, a = int(servers), float(mean_batch)
    if a >= c:
        return math.inf
    if a <= 0:
        return 0.0
    erlang_b = 1.0
    for k in range(1, c + 1):
        erlang_b = a * erlang_b / (k + a * erlang_b)
    erlang_c = c * erlang_b / (c - a * (1 - erlang_b))
    rho = a / c
    cosmetatos = 1 + (1 - rho) * (c - 1) * (math.sqrt(4 + 5 * c) - 2) / (16 * rho * c)
    return erlang_c * a / (rate_per_s * (c - a)) / 2 * cosmetatos


def closed_loop_wait_s(clients: int, running, life_s):
    """Mean wait for a running slot of a closed loop of ``clients`` that
    each send their next request when the last one finishes, ``running`` of
    them served at once, each ``life_s`` long: the loop's throughput is
    ``running / life_s`` and each client's cycle ``clients / throughput``
    (Little's law over the whole loop), so a request waits ``life_s
    (clients / running - 1)`` (0 when every client runs). ``running`` and
    ``life_s`` may be arrays (one wait per element); numbers give a float."""
    running, life = np.asarray(running, dtype=float), np.asarray(life_s, dtype=float)
    wait = np.where(clients > running, life * (clients / np.maximum(running, 1.0) - 1.0), 0.0)
    return float(wait) if wait.ndim == 0 else wait
