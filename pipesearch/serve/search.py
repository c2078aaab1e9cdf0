"""Search serving plans: tp x pp x replicas, the exact split, the batch.

For every tensor-parallel degree ``tp`` (a divisor of a node's devices the
engine accepts, :func:`pipesearch.serve.export.engine_refusal`) and pipeline
degree ``pp`` with ``tp * pp`` dividing the cluster, :func:`search` finds

1. the largest pool any split reaches (:func:`~pipesearch.serve.split.max_pool_split`),
   hence the largest batch ``B_max`` that fits;
2. the batch and split to run: without a request rate, the highest
   throughput ``B o / (L C(B))`` (a request lives ``L`` cycles, :meth:`ServePipeline.life_steps`)
   over ``B <= min(B_max, max_num_seqs, concurrency)`` under the latency
   limits; the same with the round trip ``R(B)`` for ``C(B)`` bounds the
   throughput of every split at ``B`` (the cycle is at least the round
   trip), so levels are visited in
   the order of that bound and the scan stops when the bound cannot beat the
   best found (exact); with a request rate, the smallest batch whose
   throughput carries the rate (Little's law), or the saturated maximum;
3. the engine's default split scored the same way, for comparison.

Plans are ranked by total output tokens/s (the replicas' sum: with
``concurrency`` clients, ``concurrency mod replicas`` replicas serve one
client more than the others, and a replica runs at most its share,
:func:`replica_shares`); with a request rate, plans that carry it come
first, by time per output token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InfeasibleError, InputError
from ..profiles.transformer import TransformerConfig
from ..types import Cluster, Link
from .costs import ServeCosts
from .dtypes import WeightFormat
from .engine import EngineSpec, default_split
from .export import engine_refusal
from .pipeline import ServePipeline, SteadyState, Workload
from .queueing import admission_wait_s, closed_loop_wait_s
from .split import max_pool_split, optimal_splits, split_metrics, stage_capacities

__all__ = ["ServeJob", "StageReport", "ServePlan", "ServeSearchResult", "search_serving", "evaluate_split",
           "pipeline_for", "rerank_by_simulation", "replica_shares", "running_limit"]

_CHUNK = 8


@dataclass(frozen=True)
class ServeJob:
    """What to serve and how fast.

    Attributes:
        workload: the request class.
        concurrency: closed loop of this many clients in total (None: as many
            as fit).
        request_rate: requests per second in total (Poisson), or None.
        max_ttft_s / max_tpot_s: latency limits (mean), or None.
        memory_reserve_bytes: kept free per device.
    """

    workload: Workload
    concurrency: int | None = None
    request_rate: float | None = None
    max_ttft_s: float | None = None
    max_tpot_s: float | None = None
    memory_reserve_bytes: float = 2**30


@dataclass(frozen=True)
class StageReport:
    """One stage of a plan: decoder blocks ``[start, end)``, whether it holds
    the embedding / LM head, weights and KV capacity per device, step time of
    the steady-state micro-batch, the devices of replica 0."""

    index: int
    start: int
    end: int
    embedding: bool
    head: bool
    weight_bytes: float
    kv_tokens: int
    step_s: float
    devices: tuple[int, ...]


@dataclass(frozen=True)
class ServePlan:
    """A ranked serving plan (per-replica figures unless ``total``).

    ``batch`` is the running sequences the figures are for; ``max_num_seqs``
    the engine's running limit to export (:func:`running_limit`): ``batch``,
    or with a request rate the most the latency limits allow;
    ``max_num_batched_tokens`` the step's token budget the figures are for
    and the export sets (:func:`uniform_budget` where it was searched).
    ``default_refusal``: why the engine's defaults (split, budget) give no
    plan (``"out_of_memory"``, ``"latency_limits"``), None when they do."""

    rank: int
    tp: int
    pp: int
    replicas: int
    split: tuple[int, ...]
    stages: tuple[StageReport, ...]
    pool_tokens: int
    max_batch: int
    batch: int
    steady: SteadyState
    total_output_tokens_per_s: float
    saturated: bool
    default_split: tuple[int, ...]
    default_pool_tokens: int
    default_batch: int
    default_total_output_tokens_per_s: float
    max_num_seqs: int
    max_num_batched_tokens: int = 2048
    default_refusal: str | None = None
    simulated: dict = field(default_factory=dict, compare=False)
    #: where the budget was planned (:func:`uniform_budget`): the same
    #: configuration at the engine's own step budget, which the command
    #: keeps instead when its simulation does better (the closed form's
    #: mean load per micro-batch can miss how the prompts' chunks fall)
    engine_budget: "ServePlan | None" = field(default=None, compare=False, repr=False)
    #: where the planned budget leaves the prompts less than a tenth more
    #: room than their mean demand (:func:`headroom_budget`): the same
    #: configuration at that much room, which the command keeps instead
    #: when its simulation does better
    headroom_budget: "ServePlan | None" = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ServeSearchResult:
    plans: tuple[ServePlan, ...]
    evaluated: int
    skipped: tuple[tuple[str, int], ...]
    wall_s: float


def replica_count(cluster: Cluster, tp: int, pp: int) -> int:
    """Replicas of ``tp x pp`` devices the cluster holds: all its devices in
    turn where ``tp pp`` divides them, else (a pinned layout) as many as fit
    in each node (none straddles two), the rest idle; 0 when a replica that
    does not divide the cluster is larger than a node."""
    n, per = cluster.num_devices, cluster.groups[0].devices_per_node
    devices = tp * pp
    if n % devices == 0:
        return n // devices
    return (n // per) * (per // devices)


def replica_device(cluster: Cluster, tp: int, pp: int, r: int, s: int) -> int:
    """The first device of stage ``s`` of replica ``r`` (:func:`replica_count`'s
    layout: ``(r pp + s) tp`` where the replicas divide the cluster, else
    node by node, ``per // (tp pp)`` replicas each from its first device)."""
    devices, per = tp * pp, cluster.groups[0].devices_per_node
    if cluster.num_devices % devices == 0:
        return (r * pp + s) * tp
    each = per // devices
    return (r // each) * per + (r % each) * devices + s * tp


def _boundary_links(cluster: Cluster, tp: int, pp: int, replicas: int) -> tuple[Link, ...]:
    """The slowest link each stage boundary uses over the replicas (stage
    ``s`` of replica ``r`` from device :func:`replica_device`, node by node)."""
    links = []
    for k in range(pp - 1):
        cross = any(cluster.node_of(replica_device(cluster, tp, pp, r, k))
                    != cluster.node_of(replica_device(cluster, tp, pp, r, k + 1)) for r in range(replicas))
        links.append(cluster.inter_node if cross else cluster.intra_node)
    return tuple(links)


def pipeline_for(cfg: TransformerConfig, cluster: Cluster, tp: int, pp: int, weights: WeightFormat,
                 kv_bytes: float, engine: EngineSpec, reserve: float) -> tuple[ServePipeline, int]:
    """The pipeline of one replica and the replica count."""
    replicas = replica_count(cluster, tp, pp)
    costs = ServeCosts(cfg, cluster.device_spec(0), tp, weights, kv_bytes, engine, cluster.intra_node, reserve)
    return ServePipeline(costs, pp, _boundary_links(cluster, tp, pp, replicas)), replicas


def replica_shares(concurrency: int | None, replicas: int) -> tuple[tuple[int, int], ...]:
    """How a closed loop of ``concurrency`` clients spreads over the
    replicas: ``((clients, replicas with that many), ...)``, the larger
    share first, shares of no client left out (those replicas idle); one
    share of every replica when no concurrency is given (``clients`` 0:
    unbounded)."""
    if concurrency is None:
        return ((0, replicas),)
    q, r = divmod(concurrency, replicas)
    return tuple((c, n) for c, n in ((q + 1, r), (q, replicas - r)) if c > 0 and n > 0)


def per_replica(job: ServeJob, replicas: int) -> ServeJob:
    """``job`` as one of ``replicas`` replicas meets it: under a request
    rate, its share of the arrivals in the workload
    (:attr:`Workload.arrival_rate_per_s`, for the prompts' queueing in
    TTFT); else ``job`` itself."""
    if job.request_rate is None:
        return job
    return replace(job, workload=replace(job.workload, arrival_rate_per_s=job.request_rate / replicas))


def _total(pipe: ServePipeline, split, st: SteadyState, job: ServeJob, replicas: int) -> float:
    """Output tokens/s of all replicas: each runs the chosen batch, or its
    share of the clients when that is fewer (:func:`replica_shares`)."""
    total = 0.0
    for clients, n in replica_shares(job.concurrency, replicas):
        b = st.batch if not clients else min(st.batch, clients)
        total += n * (st if b == st.batch else pipe.steady_state(split, b, job.workload)).output_tokens_per_s
    return total


def _batch_cap(job: ServeJob, engine: EngineSpec, replicas: int, b_max: int, pp: int) -> int:
    """The largest batch a replica may run: what its KV pool holds
    (``b_max``), ``max_num_seqs``, one less than the step's token budget
    (every running sequence decodes one token a step, and a prompt chunk
    needs at least one beside them; vLLM refuses ``max_num_seqs`` above
    ``max_num_batched_tokens``), what the budget sustains (a request takes
    ``input_len + output_len`` tokens of it over its life, so the ``pp``
    micro-batches in flight carry at most ``pp T out / (in + out)``
    decoding sequences; at least 1), and the replica's share of the
    clients."""
    w = job.workload
    sustained = max(1, pp * engine.max_num_batched_tokens * w.output_len // (w.input_len + w.output_len))
    return min(_pool_cap(job, engine, replicas, b_max), engine.max_num_batched_tokens - 1, sustained)


def _pool_cap(job: ServeJob, engine: EngineSpec, replicas: int, b_max: int) -> int:
    """:func:`_batch_cap` but for the step budget's limits: what the KV pool
    holds, ``max_num_seqs`` and the replica's share of the clients."""
    cap = min(engine.max_num_seqs, b_max)
    if job.concurrency is not None:
        cap = min(cap, -(-job.concurrency // replicas))
    return cap


def uniform_budget(pipe: ServePipeline, batch: int, workload: Workload) -> int:
    """The step token budget that gives every micro-batch the same load at
    ``batch`` running sequences: ``ceil(b (n + o) / o)`` with ``b =
    ceil(B / m)`` sequences per micro-batch (``m = min(pp, B)``), the
    decode tokens ``b (o - 1) / o`` and the prompt tokens ``b n / o`` that
    start per step in the steady state (:meth:`ServePipeline.steady_step`),
    so a prompt is spread in chunks over several steps rather than landing
    whole in one; at least ``B + 1`` (vLLM refuses a budget below
    ``max_num_seqs``, and a chunk needs a token beside the decodes).

    With a larger budget a prompt goes whole into one micro-batch: a share
    of the micro-batches carries the prompts and runs compute-bound while
    the others decode memory-bound, and with ``m = pp`` the heavy ones hold
    up the light ones behind them at every stage (the pipeline's stages
    idle: Sarathi-Serve's pipeline bubbles from uneven micro-batches,
    Agrawal et al., OSDI 2024, sec. 3.3). Sarathi-Serve keeps the batches
    uniform with a token budget (stall-free batching, sec. 4.2) that it
    picks by profiling against a latency target (sec. 4.3); this formula,
    the steady state's mean load per micro-batch, is pipesearch's."""
    b = _per_micro_batch(pipe, batch)
    n, o = workload.input_len, workload.output_len
    return max(-(-b * (n + o) // o), int(batch) + 1)


def _per_micro_batch(pipe: ServePipeline, batch: int) -> int:
    """``b = ceil(B / m)``, the sequences of the fullest micro-batch of
    ``B = batch`` running ones over ``m = min(pp, B)`` micro-batches."""
    B = int(batch)
    return -(-B // min(pipe.pp, B))


#: the room for prompt tokens a :func:`headroom_budget` adds over their mean demand, in tenths of it
PROMPT_HEADROOM_TENTHS = 1


def headroom_budget(pipe: ServePipeline, batch: int, workload: Workload) -> int | None:
    """A step budget with a tenth more room for prompt tokens than their
    mean demand, ``b + ceil(1.1 b n / o)`` (:data:`PROMPT_HEADROOM_TENTHS`;
    ``b = ceil(B / min(pp, B))`` as in :func:`uniform_budget`), when the
    pipeline's own budget ``T`` leaves them less (``T - b < 1.1 b n /
    o``); None otherwise.

    A budget at the mean makes the prompts' chunks a queue at utilisation
    1, whose backlog has no bound (Kingman 1961: the mean wait grows as
    ``1 / (1 - rho)``), and one just above it a queue that drains slowly:
    sequences wait for their chunks instead of decoding (GPT-3 1.3B on 8
    A100 80 GB, tp 1 x pp 4 at 256 sequences, 1030 in / 256 out: 17,501
    simulated tok/s at the uniform 322 tokens, whose room for prompts is
    258 against a demand of 257.5). Qwen3-32B on 8 x L4, tp 2 x pp 4 at 256 sequences (1024
    in / 256 out): at the uniform 320 tokens (64 decode + 256 prompt), 886
    simulated tok/s against 1,208 in the closed form; at 346, 1,145
    simulated. More room is not free: prompts then land in larger chunks,
    unevenly (with the clients' starts spread over a request's life, 207
    sequences of Llama-3 70B fp8 on the same cluster simulate 5% under
    the closed form at 281 tokens, within 2% at 260), so the command
    keeps this budget only where its simulation does better."""
    b = _per_micro_batch(pipe, batch)
    n, o = workload.input_len, workload.output_len
    roomy = b - (-b * n * (10 + PROMPT_HEADROOM_TENTHS) // (10 * o))
    return roomy if pipe.costs.engine.max_num_batched_tokens < roomy else None


#: re-plannings of a configuration at a larger :func:`headroom_budget` for the batch it then runs (a count)
HEADROOM_ROUNDS = 3


def _with_headroom(planned, split, job: ServeJob, replicas: int, engine_budget: int, pipe_at):
    """``planned`` (``(pipe, chosen, max_batch, saturated)`` at its planned
    budget) planned again at :func:`headroom_budget` of its batch (``pipe_at``:
    the pipeline at a budget), and again at that of the batch it then runs
    while that needs more (a larger budget lets a larger batch fit, whose
    prompts take back the room), at most :data:`HEADROOM_ROUNDS` times;
    None when the planned budget has the room already, when the budget
    would reach the engine's, or when no batch fits there."""
    out = None
    for _ in range(HEADROOM_ROUNDS):
        pipe, chosen = planned[0], planned[1]
        budget = headroom_budget(pipe, chosen[1].batch, job.workload) if chosen is not None else None
        if budget is None or budget >= engine_budget:
            break
        upipe = pipe_at(budget)
        alt, alt_max, alt_sat = _plan_configuration(upipe, split, job, replicas)
        if alt is None:
            break
        planned = out = (upipe, alt, alt_max, alt_sat)
    return out


def running_limit(pipe: ServePipeline, split, job: ServeJob, replicas: int, batch: int, pool: int) -> int:
    """The engine's running-sequence limit for a plan running ``batch``
    sequences on ``split`` (KV pool ``pool`` tokens): ``batch`` itself,
    except under a request rate, where the engine's batch follows the
    arrivals (Little's law puts its mean at ``batch``) and a limit at that
    mean would hold every burst in the queue (the replica at utilisation 1,
    its queue without bound): there the largest batch up to the split's cap
    (:func:`_batch_cap`) whose TPOT meets ``--max-tpot-ms``, at least
    ``batch`` (the TTFT limit holds for the mean batch: a burst's larger
    batch is no TTFT of the mean's, and a lower running limit would only
    keep arrivals waiting)."""
    if job.request_rate is None:
        return batch
    c = pipe.costs
    cap = _batch_cap(job, c.engine, replicas,
                     max(pool, 0) // c.tokens_per_sequence(job.workload.input_len, job.workload.output_len), pipe.pp)
    if cap <= batch:
        return batch
    batches = np.arange(batch, cap + 1)
    # a burst runs at the TPOT of its batch; the mean TTFT is the mean batch's (a lower limit only queues the
    # arrivals: one at the mean batch holds every burst back, 33.9 s of simulated TTFT for a 245 ms limit)
    ok = _within_limits(replace(job, max_ttft_s=None), pipe.steady_arrays(split, batches, job.workload), batches)
    ok[0] = True
    return int(batches[np.flatnonzero(ok)[-1]])


def _within_limits(job: ServeJob, a: dict, batches, replicas: int = 1) -> np.ndarray:
    """Which batch levels ``batches`` of the closed-form arrays ``a``
    (:meth:`ServePipeline.steady_arrays`) meet the latency limits (the TTFT
    with a closed loop's wait for a running slot, :func:`_loop_ttft_s`)."""
    ok = np.ones(np.shape(a["tpot_s"]), dtype=bool)
    if job.max_tpot_s is not None:
        ok &= a["tpot_s"] <= job.max_tpot_s
    if job.max_ttft_s is not None:
        ok &= _loop_ttft_s(job, replicas, batches, a["ttft_s"], a["tpot_s"]) <= job.max_ttft_s
    return ok


def _meets(job: ServeJob, st: SteadyState, replicas: int = 1) -> bool:
    return ((job.max_tpot_s is None or st.tpot_s <= job.max_tpot_s)
            and (job.max_ttft_s is None
                 or float(_loop_ttft_s(job, replicas, st.batch, st.ttft_s, st.tpot_s)) <= job.max_ttft_s))


def _loop_ttft_s(job: ServeJob, replicas: int, batch, ttft_s, tpot_s):
    """TTFT at ``batch`` running sequences (arrays or numbers) as the
    clients of a closed loop see it (``--concurrency`` without a request
    rate): with more clients on a replica than it runs, each request first
    waits for a running slot (:func:`pipesearch.serve.queueing.closed_loop_wait_s`,
    the wait :func:`_configuration_result` adds); else ``ttft_s``."""
    if job.request_rate is not None or job.concurrency is None:
        return ttft_s
    life = np.asarray(ttft_s) + (job.workload.output_len - 1) * np.asarray(tpot_s)
    return ttft_s + closed_loop_wait_s(-(-job.concurrency // replicas), batch, life)  # (the larger share)


def _carrying_rate(job: ServeJob, replicas: int, cap: int, score_levels):
    """Under a request rate: the smallest batch level whose throughput carries
    the replica's share of the rate, ``(level, False)``; else the
    highest-throughput level, ``(level, True)`` (saturated). Levels are
    ``score_levels(batches) -> [(split, steady) | None]``, visited upwards
    eight at a time; only levels meeting the latency limits count."""
    if cap < 1:
        return None, False
    demand = job.request_rate / replicas * job.workload.output_len
    best_any = None
    for lo in range(1, cap + 1, _CHUNK):
        batches = np.arange(lo, min(cap, lo + _CHUNK - 1) + 1)
        for r in score_levels(batches):
            if r is None or not _meets(job, r[1], replicas):
                continue
            if r[1].output_tokens_per_s >= demand:
                return r, False
            if best_any is None or r[1].output_tokens_per_s > best_any[1].output_tokens_per_s:
                best_any = r
    return best_any, True


def _best_throughput(job, candidates, score_levels, upper, replicas: int = 1):
    """The highest-throughput level among ``candidates`` (batch sizes) under
    the limits, visiting them by decreasing ``upper`` bound, eight at a time,
    until the bound cannot beat the best found."""
    if len(candidates) == 0:
        return None
    ub = upper(candidates)
    order = np.argsort(-ub, kind="stable")
    best = None
    for k in range(0, len(order), _CHUNK):
        idx = order[k:k + _CHUNK]
        if best is not None and ub[idx[0]] <= best[1].output_tokens_per_s * (1 + 1e-12):
            break
        for r in score_levels(candidates[idx]):
            if r is None or not _meets(job, r[1], replicas):
                continue
            if best is None or r[1].output_tokens_per_s > best[1].output_tokens_per_s * (1 + 1e-12):
                best = r
    return best


def split_pool_tokens(pipe: ServePipeline, split: tuple[int, ...]) -> int:
    """KV-cache tokens a replica on ``split`` holds: the least over its
    stages of what each holds beside its layers (:func:`stage_capacities`;
    negative when a stage's layers do not fit)."""
    cap_table = stage_capacities(pipe)
    return int(min(cap_table[s, n] for s, n in enumerate(split)))


def evaluate_split(pipe: ServePipeline, split: tuple[int, ...], job: ServeJob, replicas: int):
    """The best batch level of a fixed split.

    Returns:
        ``(chosen, pool_tokens, max_batch, saturated)``: ``chosen`` is
        ``(split, SteadyState)`` or None when no batch fits (memory) or meets
        the latency limits; ``saturated`` when a request rate is more than the
        split carries.
    """
    c = pipe.costs
    tps = c.tokens_per_sequence(job.workload.input_len, job.workload.output_len)
    pool = split_pool_tokens(pipe, split)
    b_max = max(pool, 0) // tps
    cap = _batch_cap(job, c.engine, replicas, b_max, pipe.pp)

    def score(batches):
        return [(split, st) for st in pipe.steady_states([(split, b) for b in batches], job.workload)]

    if job.request_rate is None and cap >= 1:
        batches = np.arange(1, cap + 1)
        a = pipe.steady_arrays(split, batches, job.workload)
        ok = _within_limits(job, a, batches, replicas)
        if not ok.any():
            return None, pool, b_max, False
        k = int(np.argmax(np.where(ok, a["output_tokens_per_s"], -np.inf)))
        return (split, pipe.steady_state(split, int(batches[k]), job.workload)), pool, b_max, False
    chosen, saturated = _carrying_rate(job, replicas, cap, score)
    return chosen, pool, b_max, saturated


def _optimal(pipe: ServePipeline, job: ServeJob, replicas: int):
    c = pipe.costs
    w = job.workload
    tps = c.tokens_per_sequence(w.input_len, w.output_len)
    max_pool, _ = max_pool_split(pipe)
    b_max = max(max_pool, 0) // tps
    cap = _batch_cap(job, c.engine, replicas, b_max, pipe.pp)

    def score(batches):
        step = pipe.steady_step(batches, w)
        levels = optimal_splits(pipe, batches, step, batches * tps)
        states = iter(pipe.steady_states([(lv.split, lv.batch) for lv in levels if lv is not None], w))
        return [None if lv is None else (lv.split, next(states)) for lv in levels]

    def upper(batches):  # the throughput B o / (L C) with the cycle C at least the round trip
        step = pipe.steady_step(batches, w)
        return batches * pipe.tokens_per_life(batches, w) / np.asarray(pipe.ring_s(step), dtype=float)

    if job.request_rate is None:
        batches = np.arange(cap, 0, -1)
        if len(batches) and (job.max_tpot_s is not None or job.max_ttft_s is not None):
            # the round trip bounds TPOT and TTFT from below for every split
            ring = np.asarray(pipe.ring_s(pipe.steady_step(batches, w, others_only=True)), dtype=float)
            ok = np.ones(len(batches), dtype=bool)
            if job.max_tpot_s is not None:
                ok &= ring <= job.max_tpot_s * (1 + 1e-12)
            if job.max_ttft_s is not None:  # the chunks a step of the pipeline (a cycle over m) apart, then the last
                cstep, chunks = pipe.chunk_step(batches, w)
                last = replace(cstep, prefill=w.input_len - (chunks - 1) * np.asarray(cstep.prefill, dtype=float))
                m = pipe.micro_batches(pipe.pp, batches)
                ttft = ((chunks - 1) * np.asarray(pipe.ring_s(cstep), dtype=float) / m
                        + np.asarray(pipe.ring_s(last), dtype=float))
                ok &= ttft <= job.max_ttft_s * (1 + 1e-12)
            batches = batches[ok]
        return _best_throughput(job, batches, score, upper, replicas), b_max, False
    chosen, saturated = _carrying_rate(job, replicas, cap, score)
    return chosen, b_max, saturated


def _better(job: ServeJob, a, b, replicas: int) -> bool:
    """Whether configuration plan ``a`` beats ``b`` (each ``(pipe, (split,
    steady), saturated)``) as the ranking orders plans: by total output
    tokens/s; under a request rate, carrying it first, then by time per
    output token (both relative 1e-9 better)."""
    (pa, ca, sat_a), (pb, cb, sat_b) = a, b
    if job.request_rate is None:
        return _total(pa, *ca, job, replicas) > _total(pb, *cb, job, replicas) * (1 + 1e-9)
    if sat_a != sat_b:
        return not sat_a
    if sat_a:
        return _total(pa, *ca, job, replicas) > _total(pb, *cb, job, replicas) * (1 + 1e-9)
    return ca[1].tpot_s < cb[1].tpot_s * (1 - 1e-9)


def _plan_configuration(pipe: ServePipeline, split, job: ServeJob, replicas: int):
    """``(chosen, max_batch, saturated)`` of one configuration: the given
    ``split`` scored (:func:`evaluate_split`), or the best split searched
    (:func:`_optimal`)."""
    if split is not None:
        chosen, _, b_max, saturated = evaluate_split(pipe, split, job, replicas)
        return chosen, b_max, saturated
    return _optimal(pipe, job, replicas)


#: step token budgets planned at most per configuration beside the engine's (:func:`_at_planned_budget`; a count)
MAX_BUDGETS = 6


def _at_planned_budget(current, split, job: ServeJob, replicas: int, pipe_at):
    """``current`` (``(pipe, chosen, max_batch, saturated)`` at the engine's
    step budget) or the configuration planned again at a
    :func:`uniform_budget` (``pipe_at(budget)``: the pipeline at that
    budget), whichever :func:`_better` ranks first, a uniform budget on a
    tie (the closed form's mean over uneven micro-batches hides their
    bubbles: Llama-3 8B on 8 H100s, tp 1 x pp 2, 52,662 tok/s at either
    budget in the closed form, 43,437 simulated at 8192 against 52,554 at
    1,990), the first of them on a tie between them. The budgets tried are
    sized for the sequences the engine may run (under a request rate its
    running limit: the bursts above the mean batch) of three batches: the
    one planned at the engine's budget, the one planned there without the
    latency limits (a prompt in one step holds up the others: at a smaller
    budget the limits may hold for more sequences), and the most the KV
    pool and the engine's limits allow there, then at each budget tried
    (a smaller budget leaves more room for the KV pool; at most
    :data:`MAX_BUDGETS`): a batch planned at the engine's budget sized a
    budget that capped it (Llama-3 70B on 8 L4s, pp 8: a budget of 25 held
    the batch at 24 where the pool at that budget holds 31, 37 tok/s where a
    budget sized for 31 gives 48)."""
    pipe, chosen, b_max, saturated = current
    bases = [chosen]
    if job.max_ttft_s is not None or job.max_tpot_s is not None:
        bases.append(_plan_configuration(pipe, split, replace(job, max_ttft_s=None, max_tpot_s=None), replicas)[0])
    sizes = [basis[1].batch if job.request_rate is None else running_limit(
        pipe, basis[0], job, replicas, basis[1].batch, split_pool_tokens(pipe, basis[0]))
        for basis in bases if basis is not None]
    if sizes:
        sizes.append(_pool_cap(job, pipe.costs.engine, replicas, b_max))
    best, tried = current, set()
    for sized in sizes:  # (grows: a smaller budget leaves the KV pool more room, so its cap is tried next)
        budget = uniform_budget(pipe, sized, job.workload)
        if budget >= pipe.costs.engine.max_num_batched_tokens or budget in tried or len(tried) >= MAX_BUDGETS:
            continue
        tried.add(budget)
        upipe = pipe_at(budget)
        alt, alt_max, alt_sat = _plan_configuration(upipe, split, job, replicas)
        sizes.append(_pool_cap(job, upipe.costs.engine, replicas, alt_max))
        if alt is None:
            continue
        cand, held = (upipe, alt, alt_sat), (best[0], best[1], best[3])
        # over the engine's budget: unless it is better; over an earlier uniform budget: if better
        wins = best[1] is None or (not _better(job, held, cand, replicas) if best is current
                                   else _better(job, cand, held, replicas))
        if wins:
            best = (upipe, alt, alt_max, alt_sat)
    return best


def _stages(pipe: ServePipeline, split, step, tp: int) -> tuple[StageReport, ...]:
    cap = stage_capacities(pipe)
    out, start = [], 0
    for s, n in enumerate(split):
        first, last = pipe.stage_kind(s)
        out.append(StageReport(
            s, start, start + n, first, last, float(pipe.costs.stage_weight_bytes(n, first, last)),
            int(cap[s, n]), float(np.asarray(pipe.stage_s(n, s, step)).reshape(-1)[0]),
            tuple(range(s * tp, (s + 1) * tp))))
        start += n
    return tuple(out)


def _smaller_dtypes(cluster: Cluster, weights: WeightFormat, kv_bytes: float) -> list[str]:
    """The ``--weight-dtype`` and ``--kv-dtype`` choices smaller than the
    ones asked for that every device of ``cluster`` runs (FP8 weights from
    :data:`pipesearch.serve.dtypes.MIN_FP8_WEIGHT_CAPABILITY`),
    as the fixes of a hint (``["--weight-dtype int4", "--kv-dtype fp8"]``)."""
    from .dtypes import KV_DTYPES, MIN_FP8_WEIGHT_CAPABILITY, WEIGHT_FORMATS

    caps = [g.device.compute_capability for g in cluster.groups]
    fp8_ok = all(c is None or c >= MIN_FP8_WEIGHT_CAPABILITY for c in caps)
    names = [n for n, f in WEIGHT_FORMATS.items() if f.gemm_bytes_per_param < weights.gemm_bytes_per_param
             and (n != "fp8" or fp8_ok)]
    return ([f"--weight-dtype {'/'.join(names)}"] * bool(names)
            + [f"--kv-dtype {n}" for n, b in KV_DTYPES.items() if b < kv_bytes][:1])


def search_serving(cfg: TransformerConfig, cluster: Cluster, job: ServeJob, *, engine: EngineSpec,
                   weights: WeightFormat, kv_bytes: float, tp: int | None = None, pp: int | None = None,
                   split: tuple[int, ...] | None = None, top: int = 5,
                   search_budget: bool = False) -> ServeSearchResult:
    """Ranked serving plans of ``cfg`` on ``cluster``.

    Args:
        tp, pp: pins (refused with the engine's reason when it would reject them).
        split: score these decoder blocks per stage instead of searching
            (sets ``pp``).
        top: plans to keep.
        search_budget: for vLLM, also plan each configuration at the
            :func:`uniform_budget` of its best batch (the engine's
            ``max_num_batched_tokens`` is then an upper bound, not a pin) and
            keep the better of the two (:func:`_better`).

    Raises:
        InputError: a pin the engine or the cluster refuses, a bad split.
        InfeasibleError: no plan fits (with the most common reason).
    """
    t0 = time.perf_counter()
    if not cluster.is_homogeneous:
        raise InputError(f"--cluster {cluster.name}: serving plans need one device type "
                         f"(mixed clusters are planned for training only)")
    L = cfg.num_layers
    pp_named = pp is not None
    if split is not None:
        if pp is not None and pp != len(split):
            raise InputError(f"--split {','.join(map(str, split))} has {len(split)} stages but --pp is {pp}")
        pp = len(split)
        if min(split) < 1 or sum(split) != L:
            raise InputError(f"--split {','.join(map(str, split))}: needs positive decoder layers per stage "
                             f"summing to {L} (embedding and head are not counted)")
    N = cluster.num_devices
    per_node = cluster.groups[0].devices_per_node
    # the pins as the user gave them: a --split without --pp pins pp to its stages
    pp_pin = (f"--split {','.join(map(str, split))} ({pp} stages)" if split is not None and not pp_named
              else f"--pp {pp}" if pp else None)
    if tp and (tp > per_node or per_node % tp):
        raise InputError(f"--tp {tp}: a tensor-parallel group must divide the {per_node} devices of a node "
                         f"of {cluster.name}")
    tps = [tp] if tp else [t for t in range(1, per_node + 1) if per_node % t == 0]
    pps = [pp] if pp else [p for p in range(1, min(L, N) + 1)]
    skipped: dict[str, int] = {}
    first_refusal = None
    results = []
    evaluated = 0
    for t in tps:
        for p in pps:
            if N % (t * p) and not pp_pin:  # searched: only layouts that use every device
                continue
            if not replica_count(cluster, t, p):  # larger than the cluster, or than a node without dividing it
                if tp:
                    raise InputError(f"--tp {t} x {pp_pin} = {t * p} devices "
                                     + (f"is more than the {N} devices of {cluster.name}" if t * p > N else
                                        f"does not divide the {N} devices of {cluster.name} and is more than a "
                                        f"node's {per_node}: a replica that leaves devices idle must fit in a node"))
                continue
            reason = engine_refusal(cfg, t, p, engine.name, weights.name)
            if reason:
                first_refusal = first_refusal or f"tp {t} x pp {p}: {reason}"
                skipped["engine_refused"] = skipped.get("engine_refused", 0) + 1
                continue
            evaluated += 1
            pipe, replicas = pipeline_for(cfg, cluster, t, p, weights, kv_bytes, engine, job.memory_reserve_bytes)
            cjob = per_replica(job, replicas)  # its TTFT with the prompts' queueing under a request rate
            dsplit = default_split(engine.name, L, p)
            dchosen, dpool, dmax, _ = evaluate_split(pipe, dsplit, cjob, replicas)  # the engine's own defaults
            dtotal = _total(pipe, dsplit, dchosen[1], cjob, replicas) if dchosen else 0.0
            at_engine = (pipe, *_plan_configuration(pipe, split, cjob, replicas))
            planned = at_engine

            def pipe_at(budget: int, t=t, p=p) -> ServePipeline:  # this configuration at another step budget
                return pipeline_for(cfg, cluster, t, p, weights, kv_bytes,
                                    replace(engine, max_num_batched_tokens=budget), job.memory_reserve_bytes)[0]

            if search_budget and engine.name == "vllm":
                planned = _at_planned_budget(at_engine, split, cjob, replicas, pipe_at)
            default = dict(dsplit=dsplit, dpool=max(dpool, 0), dbatch=dchosen[1].batch if dchosen else 0,
                           dtotal=dtotal,
                           drefusal=None if dchosen else "out_of_memory" if dmax < 1 else "latency_limits")
            r = _configuration_result(planned, cjob, t, p, replicas, default)
            if isinstance(r, str):
                skipped[r] = skipped.get(r, 0) + 1
                continue
            if planned is not at_engine:  # the engine's own budget beside it: the simulation may prefer it
                r["engine_budget"] = _configuration_result(at_engine, cjob, t, p, replicas, default)
                roomy = _with_headroom(planned, split, cjob, replicas, engine.max_num_batched_tokens, pipe_at)
                if roomy is not None:
                    r["headroom_budget"] = _configuration_result(roomy, cjob, t, p, replicas, default)
            results.append(r)
    pins = " ".join(x for x in (f"--tp {tp}" if tp else None, pp_pin) if x)
    if not results and (tp or pp) and first_refusal and set(skipped) == {"engine_refused"}:
        raise InputError(f"{pins}: {engine.name} would refuse {first_refusal}")
    if not results and (tp or pp) and not skipped:
        raise InputError(f"{pins}: tp x pp must fit in the {N} devices of {cluster.name} "
                         f"(tp at most the {per_node} devices of a node)")
    if not results:
        # a configuration the latency limits exclude fits in memory: the limits are what bind, whatever the count
        why = ("latency_limits" if "latency_limits" in skipped else
               max(skipped.items(), key=lambda kv: kv[1])[0] if skipped else "no_configuration")
        raised = [f"--{k.replace('_', '-')} {getattr(engine, k)}" for k in ("max_num_seqs", "max_num_batched_tokens")
                  if getattr(engine, k) > getattr(EngineSpec, k)]
        fixes = ["more devices", *_smaller_dtypes(cluster, weights, kv_bytes), "shorter sequences"]
        hint = {"out_of_memory": "the weights (or one sequence's KV cache) do not fit; use "
                                 + ", ".join(fixes[:-1]) + " or " + fixes[-1]
                                 + (f", or lower {' and '.join(raised)}: the engine keeps room for the activations of "
                                    "a step that large (the last stage's fp32 logits of every running sequence)"
                                    if raised else ""),
                "latency_limits": "no batch meets --max-ttft-ms / --max-tpot-ms; relax them" + (
                    f" (with --concurrency {job.concurrency} a TTFT includes the wait of the clients a replica does "
                    f"not run: fewer clients, or a larger --max-num-seqs where the KV cache holds more, may meet it)"
                    if job.concurrency is not None and job.max_ttft_s is not None and job.request_rate is None
                    else ""),
                "engine_refused": f"the engine rejects every tp x pp here ({first_refusal})"}.get(why, why)
        raise InfeasibleError(f"no serving plan for {cfg.name} on {cluster.name}: {hint} "
                              f"(skipped: {', '.join(f'{k} {v}' for k, v in skipped.items()) or 'none'})")
    if job.request_rate is not None:
        results.sort(key=lambda r: (r["saturated"], r["steady"].tpot_s if not r["saturated"] else -r["total"]))
    else:
        results.sort(key=lambda r: (-r["total"], r["steady"].tpot_s))
    plans = tuple(_serve_plan(i + 1, r) for i, r in enumerate(results[:top]))
    return ServeSearchResult(plans, evaluated, tuple(sorted(skipped.items())), time.perf_counter() - t0)


def _configuration_result(planned, job: ServeJob, tp: int, pp: int, replicas: int, default: dict) -> dict | str:
    """The figures of one configuration (``planned``: ``(pipe, chosen,
    max_batch, saturated)`` of :func:`_plan_configuration`) as a result row,
    with its running limit and, under a request rate, the wait for a
    running slot in its TTFT; the reason it gives no plan
    (``"out_of_memory"``, ``"latency_limits"``) otherwise. ``default``: the
    engine defaults' figures."""
    pipe, chosen, b_max, saturated = planned
    if chosen is None:
        return "out_of_memory" if b_max < 1 else "latency_limits"
    sp, st = chosen
    w = job.workload
    step = pipe.steady_step(st.batch, w)
    _, pool, _ = split_metrics(pipe, sp, step)
    limit = running_limit(pipe, sp, job, replicas, st.batch, pool)
    wait = 0.0  # for a running slot
    if job.request_rate is not None and not saturated:
        wait = admission_wait_s(w.arrival_rate_per_s, st.batch, limit)
        saturated = not math.isfinite(wait)  # its slots busy all the time: the queue has no bound
    elif job.request_rate is None and job.concurrency is not None:  # a closed loop of more clients than it runs
        wait = closed_loop_wait_s(-(-job.concurrency // replicas), st.batch, st.ttft_s + (w.output_len - 1) * st.tpot_s)
    if wait:
        st = replace(st, ttft_s=st.ttft_s + wait)
        if job.max_ttft_s is not None and not st.ttft_s <= job.max_ttft_s:
            return "latency_limits"
    return dict(tp=tp, pp=pp, replicas=replicas, split=sp, stages=_stages(pipe, sp, step, tp), pool=pool,
                b_max=b_max, steady=st, total=_total(pipe, sp, st, job, replicas), saturated=saturated,
                limit=limit, budget=pipe.costs.engine.max_num_batched_tokens, **default)


def _serve_plan(rank: int, r: dict) -> ServePlan:
    """The :class:`ServePlan` of a result row of :func:`_configuration_result`
    (with its ``engine_budget`` and ``headroom_budget`` rows, when it has
    ones that give a plan)."""
    alt, roomy = r.get("engine_budget"), r.get("headroom_budget")
    return ServePlan(rank=rank, tp=r["tp"], pp=r["pp"], replicas=r["replicas"], split=r["split"],
                     stages=r["stages"], pool_tokens=r["pool"], max_batch=r["b_max"], batch=r["steady"].batch,
                     steady=r["steady"], total_output_tokens_per_s=r["total"], saturated=r["saturated"],
                     default_split=r["dsplit"], default_pool_tokens=r["dpool"], default_batch=r["dbatch"],
                     default_total_output_tokens_per_s=r["dtotal"], max_num_seqs=r["limit"],
                     default_refusal=r["drefusal"], max_num_batched_tokens=r["budget"],
                     engine_budget=_serve_plan(rank, alt) if isinstance(alt, dict) else None,
                     headroom_budget=_serve_plan(rank, roomy) if isinstance(roomy, dict) else None)


def rerank_by_simulation(plans, *, rate_given: bool) -> list[ServePlan]:
    """Re-rank the simulated plans (those with ``simulated``) by the
    simulation: total output tokens/s, or with a request rate the mean time
    per output token after the plans that carry the rate (closed form and
    simulation, ``carries_rate``); in either, the plans whose simulated
    means meet the latency limits (``meets_limits``, where limits were
    given) before those that do not; the others keep their order after
    them. Ranks are renumbered from 1."""
    sim = [p for p in plans if p.simulated]
    rest = [p for p in plans if not p.simulated]
    sim.sort(key=lambda p: (*simulated_standing(p), p.simulated["tpot_mean_s"] if rate_given
                            else -p.simulated["total_output_tokens_per_s"]))
    return [replace(p, rank=i + 1) for i, p in enumerate(sim + rest)]


def simulated_standing(plan: ServePlan) -> tuple[bool, bool]:
    """``(misses the rate, misses the limits)`` of a simulated plan: it
    cannot carry the request rate in the closed form or its simulation
    (``carries_rate``), its simulated means miss the latency limits
    (``meets_limits``); ``(False, False)`` is the best standing."""
    return (plan.saturated or not plan.simulated.get("carries_rate", True),
            not plan.simulated.get("meets_limits", True))


def simulated_over_limits(simulated: dict, job: ServeJob) -> list[str]:
    """The latency limits of ``job`` a simulated run's means miss (the
    search checks them on the closed form), as ``"mean TTFT 329 ms over
    --max-ttft-ms 300"`` phrases; empty when it meets them all."""
    out = []
    for key, limit, flag in (("ttft_mean_s", job.max_ttft_s, "--max-ttft-ms"),
                             ("tpot_mean_s", job.max_tpot_s, "--max-tpot-ms")):
        if limit is not None and simulated[key] > limit:
            out.append(f"mean {key[:4].upper()} {simulated[key] * 1e3:,.1f} ms over {flag} {limit * 1e3:g}")
    return out
