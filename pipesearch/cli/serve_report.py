"""``pipesearch serve``'s lines below the ranked table: what a request rate
the plans cannot carry means, where a simulated run and the closed form
disagree, and (unless ``--quiet``) plan 1's stages, the engine's default
split, its command and the search's summary."""

from __future__ import annotations

from ..limits import MAX_SIMULATED_REQUESTS
from ..serve.search import simulated_over_limits
from ..units import format_bytes


def _plans(ranks: list) -> str:
    """``plan 2`` or ``plans 1, 3`` (ranks as text)."""
    return f"plan{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def rate_notes(plans, request_rate: float | None, output_len: int, quiet: bool) -> list[str]:
    """Under ``--request-rate``: the plans that cannot carry it (saturated),
    those that carry it only with every running slot busy, the output
    tokens the simulated runs' Poisson arrivals asked for (unless
    ``quiet``), and the plans the closed form says carry it where the
    simulation does not."""
    lines = []
    demand = None if request_rate is None else request_rate * output_len
    full = [p for p in plans if p.saturated and p.total_output_tokens_per_s >= demand]  # every slot busy
    saturated = [str(p.rank) for p in plans if p.saturated and p not in full]
    if saturated:  # the rate is more than those plans carry: their figures are the most they serve
        backlog = any(p.simulated for p in plans if str(p.rank) in saturated)
        lines.append(f"*: {_plans(saturated)} cannot carry --request-rate {request_rate:g} ({demand:,.0f} output "
                     f"tok/s wanted): tok/s is the most they serve, and requests queue without bound"
                     f"{' (the simulated columns show the backlog)' if backlog else ''}; add devices or lower the rate")
    if full:  # they serve the tokens, but only with their mean batch at the running limit: no slot ever frees
        lines.append(f"*: {_plans([p.rank for p in full])} serve{'' if len(full) > 1 else 's'} the {demand:,.0f} "
                     f"output tok/s of --request-rate {request_rate:g} only with every running slot busy (mean batch "
                     f"{', '.join(str(p.batch) for p in full)} = the running limit), so no slot frees for a burst and "
                     f"requests queue without bound; add devices or lower the rate")
    drawn = [p.simulated["offered_output_tokens_per_s"] * p.replicas for p in plans
             if (p.simulated or {}).get("offered_output_tokens_per_s")]
    if drawn and not quiet:  # the run's own draw of the Poisson arrivals, which its carried tok/s follows
        low, high = min(drawn), max(drawn)
        span = f"{low:,.0f}" if round(low) == round(high) else f"{low:,.0f}-{high:,.0f}"
        lines.append(f"sim tok/s under --request-rate {request_rate:g}: what each run carried of the output tokens "
                     f"its Poisson arrivals asked for in its steady window, {span} tok/s here (on average "
                     f"{request_rate * output_len:,.0f}; --num-requests sets the run's length)")
    short = [str(p.rank) for p in plans if not p.saturated and (p.simulated or {}).get("carries_rate") is False]
    if short:
        lines.append(f"sim tok/s *: {_plans(short)} carr{'y' if len(short) > 1 else 'ies'} --request-rate "
                     f"{request_rate:g} ({request_rate * output_len:,.0f} output tok/s wanted) in the closed form but "
                     f"not in the simulation (bursts and prompt chunks): requests queue without bound; prefer a plan "
                     f"that carries it in both, or add devices")
    return lines


def simulation_notes(plans, job, eng, engine: str) -> list[str]:
    """Where the simulated runs qualify the table: a closed loop whose run
    ends before every client asked once, simulated means over the latency
    limits, no simulated plan within them, unsimulated plans of a tight
    step budget, the step budget a simulation chose (the engine's, or a
    roomier one than planned), devices a pinned tp x pp leaves idle."""
    lines = []
    request_rate = job.request_rate

    def loop_clients(p) -> int | None:  # a simulated closed loop's clients per replica (its batch by default)
        if not p.simulated or request_rate is not None:
            return None
        return p.simulated["replica_clients"][0][0] if "replica_clients" in p.simulated else p.batch

    for p in [p for p in plans if loop_clients(p) is not None and p.simulated["requests"] < loop_clients(p)]:
        # a closed loop whose run ends before every client has asked once: its TTFT misses their wait
        clients, n = loop_clients(p), p.simulated["requests"]
        lines.append(f"sim columns of plan {p.rank}: its run of {n:,} request{'s' if n > 1 else ''} ends before its "
                     f"{clients:,} clients per replica have each sent one, so it never reaches the steady state the "
                     f"closed form describes, and its TTFT misses the others' wait; --num-requests "
                     f"{min(2 * clients, MAX_SIMULATED_REQUESTS)} runs longer"
                     + ("" if 2 * clients <= MAX_SIMULATED_REQUESTS else
                        f" (at most {MAX_SIMULATED_REQUESTS:,}: fewer clients per replica measure it)"))
    for p in plans:  # the limits hold for the closed form's means, which the search checks, not the simulation's
        over = simulated_over_limits(p.simulated, job) if p.simulated else []
        if over:
            lines.append(f"plan {p.rank}: its simulated {' and '.join(over)} (the closed form's means meet the "
                         f"limits, the run's do not); ranked after the simulated plans that meet them")
    simulated_plans = [p for p in plans if p.simulated]
    rest = [p for p in plans if not p.simulated]
    if simulated_plans and rest and all(simulated_over_limits(p.simulated, job) for p in simulated_plans):
        lines.append(f"no simulated plan meets the latency limits; {_plans([p.rank for p in rest])} "
                     f"{'are' if len(rest) > 1 else 'is'} not simulated (--simulate-top {len(plans)} simulates "
                     f"{'them' if len(rest) > 1 else 'it'})")
    tight = [p for p in rest if p.headroom_budget is not None]
    if tight:  # the budget the headroom rule would re-plan: the closed form's weakest case, not checked by a run
        lines.append(f"{_plans([p.rank for p in tight])}, not simulated, plan{'' if len(tight) > 1 else 's'} a "
                     f"step budget whose room for prompt tokens is about their mean demand, where a run can fall far "
                     f"short of the closed form's tok/s, TPOT and TTFT (--simulate-top {max(p.rank for p in tight)} "
                     f"simulates {'them' if len(tight) > 1 else 'it'}, and runs a roomier budget where that does "
                     f"better)")
    lines += [_budget_note(p, eng, request_rate, engine) for p in plans if "planned_budget" in (p.simulated or {})]
    return lines


def _budget_note(p, eng, request_rate, engine: str) -> str:
    """The step budget plan ``p``'s simulation chose over the planned one:
    the engine's own, kept, or a tenth more room than the prompts' mean
    demand, with what each did in the run."""
    was = p.simulated["planned_budget"]
    measure = ("its mean TPOT {:.1f} ms against {:.1f}".format(p.simulated["tpot_mean_s"] * 1e3,
                                                               was["tpot_mean_s"] * 1e3)
               if request_rate is not None else
               f"{p.simulated['total_output_tokens_per_s']:,.0f} against "
               f"{was['total_output_tokens_per_s']:,.0f} simulated tok/s")
    if p.max_num_batched_tokens == eng.max_num_batched_tokens:
        return (f"plan {p.rank} keeps {engine}'s step budget of {p.max_num_batched_tokens} tokens: "
                f"{measure} at the planned {was['max_num_batched_tokens']}, which the closed form rates "
                f"higher (it gives every micro-batch the same load, which the simulated run's did not "
                f"have)")
    return (f"plan {p.rank} runs a step budget of {p.max_num_batched_tokens} tokens (the one its "
            f"command asks for), a tenth more room for prompt tokens than their mean demand, "
            f"instead of the {was['max_num_batched_tokens']} planned first: {measure} at "
            f"{was['max_num_batched_tokens']}, whose room is about that demand (the prompts' "
            f"chunks then queue at a utilisation near 1, and sequences wait for them instead of "
            f"decoding)")


def running_limit_notes(plans, eng, engine: str, limit_given: bool, open_loop: bool) -> list[str]:
    """A line when plans run as many sequences a replica as the engine's
    default running limit (``--max-num-seqs`` not given; a closed loop of as
    many clients as fit) while a split of theirs holds more in its KV pool
    (``max_batch``): the limit, not memory, sets their batch, and a larger
    one lets the search plan more sequences (more tok/s where decoding is
    memory-bound, a longer TPOT)."""
    if limit_given or open_loop:
        return []
    capped = [p for p in plans if p.batch == eng.max_num_seqs < p.max_batch]
    if not capped:
        return []
    one = len(capped) == 1
    return [f"{_plans([p.rank for p in capped])} run{'s' if one else ''} {eng.max_num_seqs:,} sequences a replica, "
            f"{engine}'s default running limit here, where {'its' if one else 'their'} KV pool{'' if one else 's'} "
            f"hold{'s' if one else ''} up to {', '.join(f'{p.max_batch:,}' for p in capped)}: --max-num-seqs "
            f"{max(p.max_batch for p in capped)} lets the search plan larger batches (more tok/s where decoding is "
            f"memory-bound, a longer TPOT)"]


def idle_device_lines(plans, num_devices: int) -> list[str]:
    """One line per plan whose tp x pp x replicas leaves some of the
    cluster's ``num_devices`` idle (a pinned tp x pp that does not divide it)."""
    out = []
    for p in plans:
        used = p.tp * p.pp * p.replicas
        if used < num_devices:
            out.append(f"plan {p.rank} uses {used} of the {num_devices} devices (tp x pp x replicas); "
                       f"{num_devices - used} stay{'s' if num_devices - used == 1 else ''} idle")
    return out


def summary_lines(plans, exports, engine: str, result, written) -> list[str]:
    """Plan 1's stages (weights and KV capacity per device), the engine's
    default split and what it serves, plan 1's command and its notes, the
    search's count and time, and what was written (``written``: the -o and
    --timeline paths, None where not given)."""
    best = plans[0]
    stage_line = ", ".join(f"{format_bytes(s.weight_bytes)} + {s.kv_tokens:,} tok" for s in best.stages[:8])
    lines = [f"plan 1 per stage (weights + KV capacity per device): {stage_line}"]
    served = {"out_of_memory": "no batch fits", "latency_limits": "no batch meets the latency limits"}.get(
        best.default_refusal, f"{best.default_total_output_tokens_per_s:,.0f} tok/s")
    lines.append(f"engine default split {','.join(map(str, best.default_split))}: KV pool "
                 f"{best.default_pool_tokens:,} tokens, {served}")
    ex = exports[0].get(engine, {})
    if "command" in ex:
        lines.append(f"{engine}: {ex['command']}")
        # what the command needs to run as planned (the checkpoint, replicas)
        lines += [f"  note: {note}" for note in ex.get("notes", ())]
    skipped = ", ".join(f"{k} {v}" for k, v in result.skipped) or "none"
    lines.append(f"{result.evaluated} configuration{'' if result.evaluated == 1 else 's'} in {result.wall_s:.2f} s; "
                 f"skipped: {skipped}")
    shown = [str(x) for x in written if x]
    if shown:
        lines.append(f"wrote {', '.join(shown)}")
    if not written[0]:
        lines.append("no serving plan file written (-o FILE writes one)")
    return lines
