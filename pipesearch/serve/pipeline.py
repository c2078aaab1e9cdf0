"""One replica's pipeline of stages and its steady-state closed form.

A replica runs ``pp`` stages of ``tp`` devices each; ``m = min(pp, B)``
micro-batches of ``B / m`` sequences circulate through the stages (vLLM's
batch queue and SGLang's ``pp`` micro-batches keep one in flight per stage).
A micro-batch's round trip is ``R = sum_s t_s + sum_k p2p_k + overhead``;
each stage and each link serves all ``m`` micro-batches once per cycle, so
the cycle is

    C = max(R, m * max_s t_s, m * max_k p2p_k)

(the pipeline bubble: with fewer micro-batches than stages, ``R`` rules).
With a workload of prompts of ``n`` tokens and ``o`` output tokens, a
prompt takes ``k = ceil(n / chunk)`` chunks of ``chunk = min(n,
max_num_batched_tokens - b (o - 1) / o)`` tokens, in consecutive
micro-batches (the engine counts a scheduled chunk as computed), the last
one's micro-batch sampling the first token, then ``o - 1`` decode cycles: a
request lives ``L = (k - 1) / m + o`` cycles. So ``B / L`` requests finish
per cycle and as many start, micro-batches carry ``b n / L`` prefill tokens
on average beside their ``d = b (o - 1) / L`` decode tokens (the
prefill/decode mix of continuous batching), and output tokens/s are ``B o
/ (L C)`` (``B / C`` when a prompt takes one step). The engine takes a new
prompt's chunk into one micro-batch, so a share ``(b n / L) / chunk`` of
the micro-batches carries a chunk
and the rest decode only; stage times are the mean over the two kinds
(a chunk step is compute-bound where a decode step is memory-bound, and the
roofline of the average would hide that). Decoding sequences hold ``n + o / 2``
tokens of context on average.
Time per output token: the cycle as a decoding sequence meets it, whose
steps carry the prompts of the other ``B - 1`` sequences only (their mean prompt tokens
scaled by ``(B - 1) / B``; at ``B = 1`` decode steps alone; under Poisson
arrivals the others' prompts at the rate, :meth:`ServePipeline._poisson_tpot`). Time to first
token: the prompt's ``ceil(n / chunk')`` chunks (``chunk'`` the budget less
the decode tokens of the micro-batch's other ``b - 1`` sequences: the
prompting one does not decode yet) follow one another a cycle over ``m``
apart, the last one's micro-batch a whole cycle, each cycle at least the
mean one ``C`` (where the prompts fill every step, a chunk's step carries
the other sequences' prompts too): ``(chunks - 1) max(C', C) / m +
max(C'_last, C)``, ``C'`` the cycle of micro-batches that each carry a full
chunk and ``C'_last`` that of the last chunk, what the full ones leave
(docs/serving_costs.md). Under Poisson arrivals (``Workload.arrival_rate_per_s``)
the chunks are ``max(C', C) / m`` apart with both cycles at the engine's
``m = min(pp, max_num_seqs)`` slots (free slots take the chunks of a
batch smaller than ``pp``), and TTFT adds the prompts' wait for the step
budget (:func:`pipesearch.serve.queueing.prompt_wait_s`, its half step for
the arrivals that find the engine running).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import InputError
from ..types import Link
from .costs import ServeCosts
from .queueing import prompt_wait_s

__all__ = ["Workload", "Step", "ServePipeline", "SteadyState"]

#: fixed-point iterations of the TPOT under Poisson arrivals (:meth:`ServePipeline._poisson_tpot`) at most,
#: and the relative change below which it stops
TPOT_ITERATIONS = 8
TPOT_REL_TOL = 1e-3


@dataclass(frozen=True)
class Workload:
    """One request class.

    Attributes:
        input_len: prompt tokens.
        output_len: generated tokens.
        prefill_mix: whether steady state includes the prefills of new
            requests (False: decode only, the sequences already prefilled).
        arrival_rate_per_s: Poisson arrivals at one replica, requests per
            second (its TTFT then includes the prompts' queueing,
            :meth:`ServePipeline.steady_arrays`); None: a closed loop (a
            client sends its next request when one finishes, at a step's end).
    """

    input_len: int
    output_len: int
    prefill_mix: bool = True
    arrival_rate_per_s: float | None = None

    def __post_init__(self) -> None:
        for key in ("input_len", "output_len"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"--{key.replace('_', '-')} {v!r}: expected an integer >= 1")
        rate = self.arrival_rate_per_s
        if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate < float("inf")):
            raise InputError(f"request rate {rate!r} per replica: expected a positive number")

    @property
    def mean_context(self) -> float:
        return self.input_len + self.output_len / 2

    @property
    def decode_share(self) -> float:
        """The share of running sequences that decode in a cycle: ``(o - 1) /
        o`` (the other ``1 / o`` are new, their prompt samples their first
        token)."""
        return (self.output_len - 1) / self.output_len


@dataclass(frozen=True)
class Step:
    """What one micro-batch carries through the stages (floats or arrays):
    ``decode`` tokens at mean context ``context``, ``prefill`` tokens of
    prompts of ``prompt_len``, ``sampled`` tokens that go through the LM
    head. ``share`` is the fraction of micro-batches that carry the prefill
    chunk (the others carry only the decode tokens and sample ``decode``);
    times are the mean over both kinds."""

    decode: object
    context: object
    prefill: object
    prompt_len: object
    sampled: object
    share: object = 1.0

    @property
    def tokens(self):
        if isinstance(self.decode, (int, float)) and isinstance(self.prefill, (int, float)):
            return float(self.decode + self.prefill)
        return np.asarray(self.decode, dtype=float) + np.asarray(self.prefill, dtype=float)


@dataclass(frozen=True)
class SteadyState:
    """Closed-form steady state of one replica at ``B`` running sequences
    (per-replica figures; seconds, tokens/s)."""

    batch: int
    cycle_s: float
    ring_s: float
    bottleneck_s: float
    output_tokens_per_s: float
    tpot_s: float
    ttft_s: float


@dataclass(frozen=True)
class ServePipeline:
    """``pp`` stages of :class:`ServeCosts` and the link after each stage
    (``len(boundary_links) == pp - 1``)."""

    costs: ServeCosts
    pp: int
    boundary_links: tuple[Link, ...]

    def __post_init__(self) -> None:
        if len(self.boundary_links) != self.pp - 1:
            raise ValueError("one boundary link per stage boundary")

    def stage_kind(self, s: int) -> tuple[bool, bool]:
        return s == 0, s == self.pp - 1

    @staticmethod
    def _mean(step: Step, with_chunk, without):
        """``share * with_chunk() + (1 - share) * without()``; only the first
        when every micro-batch carries the chunk."""
        share = step.share
        if (isinstance(share, float) and share == 1.0) or (np.ndim(share) == 0 and float(share) == 1.0):
            return with_chunk()
        share = np.asarray(share, dtype=float)
        return share * with_chunk() + (1 - share) * without()

    def _layer(self, step: Step):
        c = self.costs
        return self._mean(step, lambda: c.layer_s(step.decode, step.context, step.prefill, step.prompt_len),
                          lambda: c.layer_s(step.decode, step.context, 0.0, step.prompt_len))

    def _first(self, step: Step):
        c = self.costs
        return self._mean(step, lambda: c.first_extra_s(step.tokens), lambda: c.first_extra_s(step.decode))

    def _last(self, step: Step):
        c = self.costs
        return self._mean(step, lambda: c.last_extra_s(step.sampled), lambda: c.last_extra_s(step.decode))

    def stage_s(self, num_blocks, s: int, step: Step):
        """Seconds of stage ``s`` holding ``num_blocks`` decoder blocks."""
        first, last = self.stage_kind(s)
        out = np.asarray(num_blocks, dtype=float) * self._layer(step)
        if first:
            out = out + self._first(step)
        if last:
            out = out + self._last(step)
        return out

    def stage_times(self, split, step: Step) -> tuple[list[float], list[float]]:
        """Seconds of every stage of ``split`` and of every boundary for one
        micro-batch of scalars (the layer terms computed once)."""
        layer, first, last = float(self._layer(step)), float(self._first(step)), float(self._last(step))
        times = [n * layer for n in split]
        times[0] += first
        times[-1] += last
        return times, [float(x) for x in self._boundaries_s(step)]

    def _link_s(self, link: Link, step: Step):
        """Seconds a boundary over ``link`` takes for a micro-batch ``step``."""
        bw = link.bandwidth_bytes_per_s
        return link.latency_s + self._mean(step, lambda: self.costs.p2p_bytes(step.tokens) / bw,
                                           lambda: self.costs.p2p_bytes(step.decode) / bw)

    def _boundaries_s(self, step: Step) -> list:
        """Seconds of every boundary for a micro-batch ``step`` (:meth:`_link_s`),
        each kind of link computed once."""
        by_link = {link: self._link_s(link, step) for link in dict.fromkeys(self.boundary_links)}
        return [by_link[link] for link in self.boundary_links]

    def ring_s(self, step: Step):
        """Round trip of a micro-batch; independent of the split (every block
        costs the same on every stage of a homogeneous pipeline)."""
        c = self.costs
        total = c.num_layers * self._layer(step) + self._first(step) + self._last(step)
        for x in self._boundaries_s(step):
            total = total + x
        return total + c.engine.step_overhead_s

    def link_bottleneck_s(self, step: Step):
        out = np.zeros_like(np.asarray(step.tokens, dtype=float))
        for x in self._boundaries_s(step):
            out = np.maximum(out, x)
        return out

    # ------------------------------------------------------------ steady state
    @staticmethod
    def micro_batches(pp: int, batch):
        return np.minimum(pp, np.asarray(batch))

    def steady_step(self, batch, workload: Workload, others_only: bool = False, others_prompt_tokens=None) -> Step:
        """The mean micro-batch at ``batch`` running sequences (arrays ok);
        ``others_only``: as one decoding sequence meets it, with the prompts
        of the other ``B - 1`` sequences only (its own prompt was done
        before it decodes: at ``B = 1`` its decode steps carry no chunk), or
        ``others_prompt_tokens`` of them a micro-batch where given (Poisson
        arrivals: the others' prompts come at the rate whatever the batch)."""
        B = np.asarray(batch, dtype=float)
        m = self.micro_batches(self.pp, B)
        b = B / m
        if not workload.prefill_mix:
            return Step(decode=b, context=workload.mean_context, prefill=np.zeros_like(b),
                        prompt_len=workload.input_len, sampled=b)
        life = self.life_steps(B, workload)
        share_d = (workload.output_len - 1) / life  # the sequences that decode (the others prompt)
        decode = b * share_d
        mean_p = b * workload.input_len / life
        if others_only:  # one sequence of one micro-batch decodes its token (1 for its decode share)
            mean_p = mean_p * (B - 1) / B if others_prompt_tokens is None else np.asarray(others_prompt_tokens)
            decode = decode + (1 - share_d) / m
        chunk = np.clip(self.costs.engine.max_num_batched_tokens - decode, 1.0, workload.input_len)
        share = np.minimum(1.0, mean_p / chunk)
        p = np.where(share >= 1.0, mean_p, chunk)
        return Step(decode=decode, context=workload.mean_context, prefill=p, prompt_len=workload.input_len,
                    sampled=decode + p / workload.input_len, share=share)

    def prompt_steps(self, batch, workload: Workload):
        """``k``: the steps of its micro-batch a prompt takes, ``ceil(n /
        chunk)`` with ``chunk = min(n, T - b (o - 1) / o)`` (``T`` the step's
        token budget, ``b (o - 1) / o`` the decode tokens beside it when each
        prompt takes one step: the smallest chunk, so the most steps)."""
        B = np.asarray(batch, dtype=float)
        b = B / self.micro_batches(self.pp, B)
        n = workload.input_len
        chunk = np.clip(self.costs.engine.max_num_batched_tokens - b * workload.decode_share, 1.0, n)
        return np.ceil(n / chunk)

    def life_steps(self, batch, workload: Workload):
        """Cycles a request lives: its prompt's ``k`` chunks
        (:meth:`prompt_steps`) go into consecutive micro-batches (the engine
        counts a chunk computed once scheduled, vLLM
        ``_update_after_schedule``), ``(k - 1) / m`` cycles, the last one's
        micro-batch a cycle (it samples the first token), then ``o - 1``
        decode cycles: ``(k - 1) / m + o``; ``k + o - 1`` with one
        micro-batch."""
        B = np.asarray(batch, dtype=float)
        m = self.micro_batches(self.pp, B)
        return (self.prompt_steps(batch, workload) - 1) / m + workload.output_len

    def chunk_step(self, batch, workload: Workload) -> tuple[Step, object]:
        """The micro-batch that carries one prompt chunk beside the decode
        tokens of its other sequences (the prompting one does not decode
        yet: at ``B = 1`` a chunk takes the whole token budget), and the
        number of chunks of a prompt."""
        B = np.asarray(batch, dtype=float)
        b = B / self.micro_batches(self.pp, B)
        decode = np.maximum(b - 1.0, 0.0) * workload.decode_share
        budget = self.costs.engine.max_num_batched_tokens
        chunk = np.clip(budget - decode, 1, workload.input_len)
        chunks = np.ceil(workload.input_len / chunk)
        step = Step(decode=decode, context=workload.mean_context, prefill=chunk,
                    prompt_len=workload.input_len, sampled=decode + 1)
        return step, chunks

    def _cycle(self, split, step: Step, m):
        """(cycle, ring, bottleneck) arrays of ``split`` for micro-batches ``step``."""
        c = self.costs
        layer, first, last = self._layer(step), self._first(step), self._last(step)
        times = []
        for s, n in enumerate(split):
            x = n * layer
            if s == 0:
                x = x + first
            if s == self.pp - 1:
                x = x + last
            times.append(x)
        bottleneck = np.max(np.stack(np.broadcast_arrays(*times)), axis=0)
        p2p = self._boundaries_s(step)
        ring = c.num_layers * layer + first + last + sum(p2p) + c.engine.step_overhead_s
        link = np.max(np.stack(np.broadcast_arrays(*p2p)), axis=0) if p2p else 0.0
        cycle = np.maximum(np.maximum(ring, m * bottleneck), m * link)
        return cycle, ring, bottleneck

    def steady_arrays(self, split: tuple[int, ...], batches, workload: Workload) -> dict:
        """Closed form of ``split`` at every batch of ``batches`` (arrays):
        ``cycle_s``, ``ring_s``, ``bottleneck_s``, ``output_tokens_per_s``,
        ``tpot_s``, ``ttft_s``."""
        if len(split) != self.pp or sum(split) != self.costs.num_layers:
            raise InputError(f"split {','.join(map(str, split))}: needs {self.pp} stages summing to "
                             f"{self.costs.num_layers} layers")
        B = np.asarray(batches, dtype=float)
        m = self.micro_batches(self.pp, B)
        step = self.steady_step(B, workload)
        cycle, ring, bottleneck = self._cycle(split, step, m)
        out_tps = B * self.tokens_per_life(B, workload) / cycle
        tpot = cycle
        if workload.prefill_mix:  # a decoding sequence's steps carry the other sequences' prompts only
            tpot, _, _ = self._cycle(split, self.steady_step(B, workload, others_only=True), m)
            if workload.arrival_rate_per_s is not None:  # the prompts admitted: at most what the batch carries
                admitted = np.minimum(workload.arrival_rate_per_s, out_tps / workload.output_len)
                tpot = self._poisson_tpot(split, B, workload, m, tpot, admitted)
        cstep, chunks = self.chunk_step(B, workload)
        ccycle, _, _ = self._cycle(split, cstep, m)
        # the prompt's last chunk holds what the full ones leave (one token past the budget: a one-token step)
        last = workload.input_len - (chunks - 1) * np.asarray(cstep.prefill, dtype=float)
        lcycle, _, _ = self._cycle(split, replace(cstep, prefill=last), m)
        # the chunks go into consecutive micro-batches (a step of the pipeline, a cycle over m, apart), each at
        # least the mean one's (where the prompts fill every step, a chunk's step carries the other sequences'
        # prompts too); the last one's micro-batch a whole cycle, to its first token
        rate = workload.arrival_rate_per_s
        spacing = np.maximum(ccycle, cycle) / m
        slots = np.minimum(self.pp, self.costs.engine.max_num_seqs)
        if rate is not None and np.any(m < slots):  # the engine keeps min(pp, its running limit) slots, used or
            # not: with fewer sequences than stages the chunks take the free slots, a stage's step apart, not a
            # round trip (where m is the slots already, the spacing above is this one)
            spacing = np.where(m < slots, np.maximum(self._cycle(split, cstep, slots)[0],
                                                     self._cycle(split, step, slots)[0]) / slots, spacing)
        ttft = (chunks - 1) * spacing + np.maximum(lcycle, cycle)
        if rate is not None and workload.prefill_mix:  # Poisson arrivals: the prompts queue for the budget
            # the budget's prompt tokens a step, whole (several short prompts share a step), at that step's cycle
            full = np.maximum(self.costs.engine.max_num_batched_tokens - np.asarray(cstep.decode, dtype=float), 1.0)
            fcycle, _, _ = self._cycle(split, replace(cstep, prefill=full), m)
            # the engine runs steps while it holds a request: with requests in it independent (M/G/inf), an
            # arrival finds none with probability exp(-lambda W), W a request's life (service TTFT, then o - 1
            # tokens a TPOT apart)
            busy = 1.0 - np.exp(-rate * (ttft + (workload.output_len - 1) * tpot))
            wait = prompt_wait_s(rate, workload.input_len / full * np.maximum(fcycle, cycle) / m, cycle / m, busy)
            # a batch that carries fewer requests than arrive is no steady state: the queue grows without bound
            ttft = np.where(out_tps >= rate * workload.output_len, ttft + wait, np.inf)
        return {"cycle_s": cycle, "ring_s": ring, "bottleneck_s": bottleneck,
                "output_tokens_per_s": out_tps, "tpot_s": tpot, "ttft_s": ttft}

    def _poisson_tpot(self, split, B, workload: Workload, m, tpot, rate):
        """TPOT under Poisson arrivals at ``lambda`` (``rate``: the arrival
        rate, at most the requests the batch carries, which are all the
        prompts a saturated replica admits): the other requests'
        prompts come at the rate whatever this one does (PASTA, and requests
        arriving independently of it), ``lambda n C / m`` prompt tokens a
        micro-batch at the cycle ``C`` they lengthen, not the ``(B - 1) /
        B`` of the batch's mean load a closed loop gives (at a mean batch
        of 1 that is none; above the batch that carries the rate, more than
        arrive); the fixed point ``C = cycle(lambda n C / m)`` from the
        closed loop's, by iteration (the cycle grows with the prompt tokens,
        so the iterates move monotonically to the fixed point, up or down;
        stopped once a step moves it by less than :data:`TPOT_REL_TOL` or
        after :data:`TPOT_ITERATIONS`)."""
        n = workload.input_len
        tpot = np.asarray(tpot, dtype=float)
        settled = np.zeros(tpot.shape, dtype=bool)  # each batch's own iteration (the same in any array of them)
        for _ in range(TPOT_ITERATIONS):
            step = self.steady_step(B, workload, others_only=True, others_prompt_tokens=rate * n * tpot / m)
            nxt = np.asarray(self._cycle(split, step, m)[0], dtype=float)
            now = np.abs(nxt - tpot) <= tpot * TPOT_REL_TOL  # settled: a step more moves it by less
            tpot = np.where(settled, tpot, nxt)
            settled = settled | now
            if settled.all():
                break
        return tpot

    def tokens_per_life(self, batch, workload: Workload):
        """Output tokens per sequence per cycle: ``o / L``
        (:meth:`life_steps`), 1 when a prompt takes one step (every running
        sequence then gains a token a cycle); without the prefill mix, 1."""
        if not workload.prefill_mix:
            return np.ones_like(np.asarray(batch, dtype=float))
        return workload.output_len / self.life_steps(batch, workload)

    def steady_state(self, split: tuple[int, ...], batch: int, workload: Workload) -> SteadyState:
        """Closed form of one replica with ``split`` (decoder blocks per stage)
        at ``batch`` running sequences (see the module docstring)."""
        return self.steady_states([(split, batch)], workload)[0]

    def steady_states(self, pairs, workload: Workload) -> list[SteadyState]:
        """:meth:`steady_state` of every ``(split, batch)`` of ``pairs``, in
        their order: one :meth:`steady_arrays` call per distinct split."""
        by_split: dict = {}
        for k, (split, batch) in enumerate(pairs):
            by_split.setdefault(tuple(split), []).append((k, int(batch)))
        out: list = [None] * len(pairs)
        for split, items in by_split.items():
            batches = np.array([b for _, b in items])
            a = {key: np.broadcast_to(np.asarray(x, dtype=float).reshape(-1), batches.shape)
                 for key, x in self.steady_arrays(split, batches, workload).items()}
            for j, (k, b) in enumerate(items):
                out[k] = SteadyState(b, float(a["cycle_s"][j]), float(a["ring_s"][j]), float(a["bottleneck_s"][j]),
                                     float(a["output_tokens_per_s"][j]), float(a["tpot_s"][j]), float(a["ttft_s"][j]))
        return out
