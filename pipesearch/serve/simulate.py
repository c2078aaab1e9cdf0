"""Discrete-event simulation of a serving replica with continuous batching.

Requests arrive (Poisson at a rate, a closed loop of ``K`` clients, or all at
once already prefilled for a steady-decode run) and wait in a FIFO queue.
``m = min(pp, max running)`` micro-batch slots circulate through the
``pp`` stages, as vLLM's batch queue and SGLang's pipeline micro-batches do.
When a slot comes back from the last stage (after the engine's per-step
overhead), the scheduler forms its next micro-batch: every decoding request of
the slot (one token each), the next chunks of the prompts under way (in
arrival order: a chunk counts as computed once scheduled, so a prompt's next
chunk goes into the next micro-batch scheduled, as vLLM's
``_update_after_schedule`` does; a prompt decodes in the slot of its last
chunk), then new requests from the queue while the KV pool holds their
longest footprint (prompt + output, whole blocks; a request keeps its
reservation until it finishes, so there is no preemption), the replica's
running limit allows, and the step's token budget (chunked prefill) has
room. The
micro-batch then runs through the stages: each stage and each link serves
micro-batches one at a time in arrival order, each step's time is the cost
model's (:class:`~pipesearch.serve.pipeline.ServePipeline`) for exactly what
it carries (decode tokens and their current contexts, prompt chunks).

So TTFT (arrival to the end of the step that finishes the prompt) and TPOT
(first to last token over ``output_len - 1``) come from the simulation, with
queueing, uneven micro-batches and prefill interference. Throughput is the
output tokens emitted between the 10th percentile of completion times and
the earlier of the 90th percentile and the last arrival, per second (the
steady part of the run: later, the load only drains); for a steady-decode
run, all tokens over the makespan. TTFT and TPOT statistics are over the requests
that arrive in that steady part (all of them when fewer than 10 do), so a
closed loop's start-up burst does not dominate them.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .pipeline import ServePipeline, Step, Workload

__all__ = ["SimResult", "StageEvent", "simulate_serving"]


@dataclass(frozen=True)
class StageEvent:
    """One micro-batch on one stage: seconds, slot, tokens carried."""

    stage: int
    start_s: float
    end_s: float
    slot: int
    decode_tokens: int
    prefill_tokens: int


@dataclass(frozen=True)
class SimResult:
    """Outcome of a simulated run (one replica)."""

    requests: int
    output_tokens_per_s: float
    ttft_mean_s: float
    ttft_p90_s: float
    tpot_mean_s: float
    tpot_p90_s: float
    makespan_s: float
    max_running: int
    steps: int
    events: tuple[StageEvent, ...] = field(default=(), compare=False, repr=False)
    #: under a request rate: the output tokens the requests arriving in the
    #: throughput's window ask for, per second of it (the offered load as
    #: this run drew it); None otherwise
    offered_output_tokens_per_s: float | None = None

    def as_dict(self) -> dict:
        out = {"requests": self.requests, "output_tokens_per_s": self.output_tokens_per_s,
               "ttft_mean_s": self.ttft_mean_s, "ttft_p90_s": self.ttft_p90_s,
               "tpot_mean_s": self.tpot_mean_s, "tpot_p90_s": self.tpot_p90_s,
               "makespan_s": self.makespan_s, "max_running": self.max_running, "steps": self.steps}
        if self.offered_output_tokens_per_s is not None:
            out["offered_output_tokens_per_s"] = self.offered_output_tokens_per_s
        return out


class _Req:
    __slots__ = ("arrival", "prefilled", "generated", "first", "finish", "slot")

    def __init__(self, arrival: float, prefilled: int = 0):
        self.arrival = arrival
        self.prefilled = prefilled
        self.generated = 0
        self.first = math.nan
        self.finish = math.nan
        self.slot = -1


def simulate_serving(pipe: ServePipeline, split: tuple[int, ...], workload: Workload, *, num_requests: int,
                     pool_tokens: int, concurrency: int | None = None, request_rate: float | None = None,
                     steady_decode: bool = False, seed: int = 0, record_events: int = 0,
                     client_spread_s: float = 0.0) -> SimResult:
    """Simulate one replica of ``pipe`` with ``split`` serving ``num_requests``.

    Args:
        pool_tokens: the replica's KV pool (the minimum over stages).
        concurrency: closed loop of this many clients (each sends its next
            request when the last one finished).
        request_rate: Poisson arrivals, requests per second (seeded).
        steady_decode: all requests present at time 0, already prefilled (a
            steady decode run; ``num_requests`` of them run at once).
        record_events: keep the first this many stage events for a timeline.
        client_spread_s: closed loop: the clients' first requests arrive
            evenly over this many seconds (client ``i`` at ``i / K`` of it);
            0, all at once (a benchmark's start: with one request class
            the clients then stay in step, their prompts landing together).

    Raises:
        InputError: no or several arrival modes, a pool smaller than one
            request, non-positive counts.
    """
    modes = sum(x is not None for x in (concurrency, request_rate)) + bool(steady_decode)
    if modes != 1:
        raise InputError("simulate: give exactly one of concurrency, request_rate, steady_decode")
    if num_requests < 1:
        raise InputError(f"simulate: num_requests {num_requests}: expected an integer >= 1")
    c = pipe.costs
    e = c.engine
    need = c.tokens_per_sequence(workload.input_len, workload.output_len)
    if pool_tokens < need:
        raise InputError(f"simulate: a KV pool of {pool_tokens} tokens does not hold one request ({need})")
    max_running = min(e.max_num_seqs, pool_tokens // need)
    if steady_decode and num_requests > max_running:
        raise InputError(f"simulate: {num_requests} sequences at once exceed the {max_running} that fit")
    P = pipe.pp
    m = max(1, min(P, max_running if not steady_decode else num_requests))
    rng = np.random.default_rng(seed)

    # arrivals
    pending: list[tuple[float, int]] = []  # (time, request id) not yet arrived
    reqs: list[_Req] = []
    if steady_decode:
        for i in range(num_requests):
            r = _Req(0.0, prefilled=workload.input_len)
            r.slot = i % m
            reqs.append(r)
    elif request_rate is not None:
        if not request_rate > 0:
            raise InputError(f"simulate: request_rate {request_rate}: expected a positive number")
        t = 0.0
        for i in range(num_requests):
            t += float(rng.exponential(1.0 / request_rate))
            reqs.append(_Req(t))
            pending.append((t, i))
    else:
        if concurrency < 1:  # type: ignore[operator]
            raise InputError(f"simulate: concurrency {concurrency}: expected an integer >= 1")
        if not client_spread_s >= 0:
            raise InputError(f"simulate: client_spread_s {client_spread_s}: expected a number >= 0")
        clients = min(concurrency, num_requests)  # type: ignore[type-var]
        for i in range(clients):
            reqs.append(_Req(i * client_spread_s / clients))
            pending.append((reqs[-1].arrival, i))
    heapq.heapify(pending)
    waiting: list[int] = []  # FIFO of arrived request ids
    # per slot: decoding requests, the sum of their generated tokens, decode
    # steps done, finish heap; prompts with tokens not yet scheduled (FIFO,
    # every slot's: a chunk counts as computed once scheduled, so a prompt's
    # next chunk goes into the next slot's step, vLLM's _update_after_schedule)
    dec: list[set[int]] = [set() for _ in range(m)]
    prompting: list[int] = []
    gsum = [0] * m
    nsteps = [0] * m
    fin: list[list[tuple[int, int]]] = [[] for _ in range(m)]
    n_out = workload.output_len
    if steady_decode:
        for i, r in enumerate(reqs):
            dec[r.slot].add(i)
            fin[r.slot].append((n_out, i))
        for h in fin:
            heapq.heapify(h)
    free_tokens = pool_tokens - (need * num_requests if steady_decode else 0)
    n_running = num_requests if steady_decode else 0
    stage_free = [0.0] * P
    link_free = [0.0] * max(P - 1, 0)
    slots = [(0.0, 0, k) for k in range(m)]  # (time, 0 busy / 1 idle wake-up, slot)
    heapq.heapify(slots)
    emitted: list[tuple[float, int]] = []
    events: list[StageEvent] = []
    done = 0
    steps = 0
    peak_running = n_running
    L_ctx = workload.input_len
    chunk_budget = e.max_num_batched_tokens

    def finish_request(i: int, clock: float) -> None:
        nonlocal n_running, free_tokens, done
        reqs[i].finish = clock
        n_running -= 1
        free_tokens += need
        done += 1
        if concurrency is not None and len(reqs) < num_requests:
            reqs.append(_Req(clock))
            heapq.heappush(pending, (clock, len(reqs) - 1))

    while slots and (done < len(reqs) or pending):
        t, _, k = heapq.heappop(slots)
        while pending and pending[0][0] <= t:
            waiting.append(heapq.heappop(pending)[1])
        d = len(dec[k])
        budget = chunk_budget - d
        chunks: list[tuple[int, int]] = []
        for i in prompting:  # the prompts under way first, then new ones (the engine's running, then waiting)
            if budget <= 0:
                break
            n = min(L_ctx - reqs[i].prefilled, budget)
            chunks.append((i, n))
            budget -= n
        while waiting and budget > 0 and n_running < max_running and free_tokens >= need:
            i = waiting.pop(0)
            prompting.append(i)
            n_running += 1
            free_tokens -= need
            n = min(L_ctx, budget)
            chunks.append((i, n))
            budget -= n
        for i, n in chunks:  # scheduled: computed, as far as the next step's schedule goes
            reqs[i].prefilled += n
        finishing = [i for i, _ in chunks if reqs[i].prefilled >= L_ctx]
        for i in finishing:
            prompting.remove(i)
            reqs[i].slot = k
        peak_running = max(peak_running, n_running)
        if not d and not chunks:
            # idle: wake at the next arrival or the next busy slot's return
            wakes = [s[0] for s in slots if s[1] == 0] + ([pending[0][0]] if pending else [])
            wake = min(wakes, default=math.inf)
            if math.isfinite(wake):
                heapq.heappush(slots, (max(wake, t), 1, k))
            continue
        ctx = (L_ctx + gsum[k] / d) if d else 0.0
        p = sum(n for _, n in chunks)
        step = Step(decode=d, context=ctx, prefill=p, prompt_len=L_ctx, sampled=d + len(finishing))
        clock = t
        stage_s, p2p_s = pipe.stage_times(split, step)
        for s in range(P):
            start = max(clock, stage_free[s])
            end = start + stage_s[s]
            stage_free[s] = end
            if len(events) < record_events:
                events.append(StageEvent(s, start, end, k, d, p))
            clock = end
            if s < P - 1:
                le = max(clock, link_free[s]) + p2p_s[s]
                link_free[s] = le
                clock = le
        clock += e.step_overhead_s
        steps += 1
        # every decoding request of the slot gains a token
        nsteps[k] += 1
        gsum[k] += d
        if steady_decode and nsteps[k] == 1:
            for i in dec[k]:
                reqs[i].first = clock
        h = fin[k]
        while h and h[0][0] <= nsteps[k]:
            _, i = heapq.heappop(h)
            dec[k].discard(i)
            gsum[k] -= n_out
            reqs[i].generated = n_out
            finish_request(i, clock)
        # a prompt whose last chunk this step ran samples its first token, and decodes in this slot
        for i in finishing:
            r = reqs[i]
            r.first = clock
            r.generated = 1
            if n_out == 1:
                finish_request(i, clock)
            else:
                dec[k].add(i)
                gsum[k] += 1
                heapq.heappush(h, (nsteps[k] + n_out - 1, i))
        emitted.append((clock, d + len(finishing)))
        heapq.heappush(slots, (clock, 0, k))

    finish = np.array([r.finish for r in reqs])
    first = np.array([r.first for r in reqs])
    arrival = np.array([r.arrival for r in reqs])
    times = np.array([x[0] for x in emitted])
    counts = np.array([x[1] for x in emitted])
    makespan = float(np.max(finish))
    steady = np.ones(len(reqs), dtype=bool)
    offered = None
    if steady_decode:
        rate = float(counts.sum()) / makespan
    else:
        lo, hi = np.quantile(finish, [0.1, 0.9])
        hi = min(hi, float(arrival.max()))  # after the last arrival the load only drains
        sel = (times > lo) & (times <= hi)
        rate = float(counts[sel].sum()) / (hi - lo) if hi > lo else float(counts.sum()) / makespan
        if request_rate is not None and hi > lo:
            offered = float(((arrival > lo) & (arrival <= hi)).sum()) * workload.output_len / (hi - lo)
        # latencies of the requests that arrive in the steady part (not the start-up burst)
        later = (arrival >= lo) & (arrival <= hi)
        if later.sum() >= 10:
            steady = later
    ttft = (first - arrival)[steady]
    tpot = ((finish - first) / max(workload.output_len - 1, 1))[steady]
    return SimResult(len(reqs), rate, float(ttft.mean()), float(np.quantile(ttft, 0.9)), float(tpot.mean()),
                     float(np.quantile(tpot, 0.9)), makespan, int(peak_running), steps, tuple(events), offered)
