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
    need = c.tokens_per_sequence(workload.input_len, workload.output_len)
    if pool_tokens < need:
        raise InputError(f"simulate: a KV pool of {pool_tokens} tokens does not hold one request ({need})")
    max_running = min(c.engine.max_num_seqs, pool_tokens // need)
    if steady_decode and num_requests > max_running:
        raise InputError(f"simulate: {num_requests} sequences at once exceed the {max_running} that fit")
    slots = max(1, min(pipe.pp, max_running if not steady_decode else num_requests))
    replica = _Replica(pipe, split, workload, need, max_running, slots, pool_tokens, record_events)
    if steady_decode:
        replica.start_decoding(num_requests)
    elif request_rate is not None:
        replica.poisson_arrivals(num_requests, request_rate, np.random.default_rng(seed))
    else:
        replica.closed_loop(num_requests, concurrency, client_spread_s)
    replica.run()
    return replica.result(request_rate)


class _Replica:
    """One replica's run (:func:`simulate_serving`): the requests, the
    queue, the micro-batch slots (per slot: its decoding requests, the sum of
    their generated tokens, its decode steps done and its heap of finishing
    steps), the prompts with tokens not yet scheduled (FIFO, every slot's: a
    chunk counts as computed once scheduled, so a prompt's next chunk goes
    into the next slot's step, vLLM's ``_update_after_schedule``), the free
    KV tokens, and when each stage and link is free."""

    def __init__(self, pipe: ServePipeline, split, workload: Workload, need: int, max_running: int, m: int,
                 pool_tokens: int, record_events: int):
        self.pipe, self.split, self.workload, self.need, self.max_running = pipe, split, workload, need, max_running
        self.record_events = record_events
        self.reqs: list[_Req] = []
        self.closed_loop_of = 0  # the requests a closed loop sends in all (0: not a closed loop)
        self.pending: list[tuple[float, int]] = []  # (time, request id) not yet arrived
        self.waiting: list[int] = []  # FIFO of arrived request ids
        self.dec: list[set[int]] = [set() for _ in range(m)]
        self.prompting: list[int] = []
        self.gsum, self.nsteps = [0] * m, [0] * m
        self.fin: list[list[tuple[int, int]]] = [[] for _ in range(m)]
        self.free_tokens, self.n_running, self.peak_running = pool_tokens, 0, 0
        self.stage_free = [0.0] * pipe.pp
        self.link_free = [0.0] * max(pipe.pp - 1, 0)
        self.slots = [(0.0, 0, k) for k in range(m)]  # (time, 0 busy / 1 idle wake-up, slot), a heap
        self.emitted: list[tuple[float, int]] = []
        self.events: list[StageEvent] = []
        self.done = self.steps = 0
        self.steady = False  # a steady-decode run (its requests' first token: the first step)

    def start_decoding(self, num_requests: int) -> None:
        """Steady decode: ``num_requests`` prefilled requests at time 0,
        dealt round-robin to the slots."""
        m, n_out = len(self.dec), self.workload.output_len
        for i in range(num_requests):
            r = _Req(0.0, prefilled=self.workload.input_len)
            r.slot = i % m
            self.reqs.append(r)
            self.dec[r.slot].add(i)
            self.fin[r.slot].append((n_out, i))
        for h in self.fin:
            heapq.heapify(h)
        self.free_tokens -= self.need * num_requests
        self.n_running = self.peak_running = num_requests
        self.steady = True

    def poisson_arrivals(self, num_requests: int, request_rate: float, rng) -> None:
        """Poisson arrivals of ``request_rate`` requests per second."""
        if not request_rate > 0:
            raise InputError(f"simulate: request_rate {request_rate}: expected a positive number")
        t = 0.0
        for i in range(num_requests):
            t += float(rng.exponential(1.0 / request_rate))
            self.reqs.append(_Req(t))
            self.pending.append((t, i))

    def closed_loop(self, num_requests: int, concurrency: int, client_spread_s: float) -> None:
        """A closed loop of ``concurrency`` clients whose first requests
        arrive evenly over ``client_spread_s`` seconds."""
        if concurrency < 1:
            raise InputError(f"simulate: concurrency {concurrency}: expected an integer >= 1")
        if not client_spread_s >= 0:
            raise InputError(f"simulate: client_spread_s {client_spread_s}: expected a number >= 0")
        clients = min(concurrency, num_requests)
        self.closed_loop_of = num_requests
        for i in range(clients):
            self.reqs.append(_Req(i * client_spread_s / clients))
            self.pending.append((self.reqs[-1].arrival, i))

    def run(self) -> None:
        """Serve until every request has finished: each slot back from the
        last stage forms its next micro-batch and sends it down, or waits."""
        heapq.heapify(self.pending)
        heapq.heapify(self.slots)
        while self.slots and (self.done < len(self.reqs) or self.pending):
            t, _, k = heapq.heappop(self.slots)
            while self.pending and self.pending[0][0] <= t:
                self.waiting.append(heapq.heappop(self.pending)[1])
            chunks, finishing = self._schedule(k)
            if not self.dec[k] and not chunks:  # idle: wake at the next arrival or the next busy slot's return
                wakes = [s[0] for s in self.slots if s[1] == 0] + [p[0] for p in self.pending[:1]]
                wake = min(wakes, default=math.inf)
                if math.isfinite(wake):
                    heapq.heappush(self.slots, (max(wake, t), 1, k))
                continue
            clock = self._through_stages(k, t, chunks, finishing)
            self._sample(k, clock, finishing)
            heapq.heappush(self.slots, (clock, 0, k))

    def _schedule(self, k: int) -> tuple[list[tuple[int, int]], list[int]]:
        """Slot ``k``'s next micro-batch besides its decoding requests: the
        prompt chunks ``(request, tokens)`` within the step's token budget
        (the prompts under way first, then new requests the pool and the
        running limit admit), and the requests whose prompt it completes
        (they decode in slot ``k`` from now on)."""
        L_ctx, reqs = self.workload.input_len, self.reqs
        budget = self.pipe.costs.engine.max_num_batched_tokens - len(self.dec[k])
        chunks: list[tuple[int, int]] = []
        for i in self.prompting:  # the prompts under way first, then new ones (the engine's running, then waiting)
            if budget <= 0:
                break
            n = min(L_ctx - reqs[i].prefilled, budget)
            chunks.append((i, n))
            budget -= n
        while self.waiting and budget > 0 and self.n_running < self.max_running and self.free_tokens >= self.need:
            i = self.waiting.pop(0)
            self.prompting.append(i)
            self.n_running += 1
            self.free_tokens -= self.need
            n = min(L_ctx, budget)
            chunks.append((i, n))
            budget -= n
        for i, n in chunks:  # scheduled: computed, as far as the next step's schedule goes
            reqs[i].prefilled += n
        finishing = [i for i, _ in chunks if reqs[i].prefilled >= L_ctx]
        for i in finishing:
            self.prompting.remove(i)
            reqs[i].slot = k
        self.peak_running = max(self.peak_running, self.n_running)
        return chunks, finishing

    def _through_stages(self, k: int, t: float, chunks, finishing) -> float:
        """Run slot ``k``'s step, ready at ``t``, through the stages and
        links (each serves one micro-batch at a time, in arrival order);
        returns when it is back, after the engine's step overhead."""
        d, P = len(self.dec[k]), self.pipe.pp
        ctx = (self.workload.input_len + self.gsum[k] / d) if d else 0.0
        p = sum(n for _, n in chunks)
        step = Step(decode=d, context=ctx, prefill=p, prompt_len=self.workload.input_len, sampled=d + len(finishing))
        clock = t
        stage_s, p2p_s = self.pipe.stage_times(self.split, step)
        for s in range(P):
            start = max(clock, self.stage_free[s])
            clock = self.stage_free[s] = start + stage_s[s]
            if len(self.events) < self.record_events:
                self.events.append(StageEvent(s, start, clock, k, d, p))
            if s < P - 1:
                clock = self.link_free[s] = max(clock, self.link_free[s]) + p2p_s[s]
        self.steps += 1
        return clock + self.pipe.costs.engine.step_overhead_s

    def _sample(self, k: int, clock: float, finishing: list[int]) -> None:
        """The tokens of slot ``k``'s step, back at ``clock``: every decoding
        request gains one (those at their last finish), and a prompt
        completed by the step samples its first and decodes in slot ``k``."""
        n_out, dec, h = self.workload.output_len, self.dec[k], self.fin[k]
        d = len(dec)
        self.nsteps[k] += 1
        self.gsum[k] += d
        if self.steady and self.nsteps[k] == 1:
            for i in dec:
                self.reqs[i].first = clock
        while h and h[0][0] <= self.nsteps[k]:
            _, i = heapq.heappop(h)
            dec.discard(i)
            self.gsum[k] -= n_out
            self.reqs[i].generated = n_out
            self._finish(i, clock)
        for i in finishing:
            r = self.reqs[i]
            r.first = clock
            r.generated = 1
            if n_out == 1:
                self._finish(i, clock)
            else:
                dec.add(i)
                self.gsum[k] += 1
                heapq.heappush(h, (self.nsteps[k] + n_out - 1, i))
        self.emitted.append((clock, d + len(finishing)))

    def _finish(self, i: int, clock: float) -> None:
        """Request ``i`` finishes at ``clock``: its KV tokens return to the
        pool; in a closed loop, its client sends the next request."""
        self.reqs[i].finish = clock
        self.n_running -= 1
        self.free_tokens += self.need
        self.done += 1
        if len(self.reqs) < self.closed_loop_of:
            self.reqs.append(_Req(clock))
            heapq.heappush(self.pending, (clock, len(self.reqs) - 1))

    def result(self, request_rate: float | None) -> SimResult:
        """Throughput, TTFT and TPOT of the finished run (the module
        docstring says over which requests and window)."""
        reqs, workload = self.reqs, self.workload
        finish = np.array([r.finish for r in reqs])
        first = np.array([r.first for r in reqs])
        arrival = np.array([r.arrival for r in reqs])
        times = np.array([x[0] for x in self.emitted])
        counts = np.array([x[1] for x in self.emitted])
        makespan = float(np.max(finish))
        steady = np.ones(len(reqs), dtype=bool)
        offered = None
        if self.steady:
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
                         float(np.quantile(tpot, 0.9)), makespan, int(self.peak_running), self.steps,
                         tuple(self.events), offered)
