"""``pipesearch serve``: serving plans (tp x pp x replicas, the layer split,
the batch), simulated, with vLLM / SGLang command lines."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import click
import pandas as pd

from ..catalog import resolve
from ..errors import InputError
from ..hardware import describe_cluster, device_files, input_name_warnings, load_cluster
from ..limits import (MAX_REQUEST_RATE, MAX_SERVE_LAYERS, MAX_SIMULATED_REQUESTS, MAX_STEP_OVERHEAD_MS,
                      MIN_REQUEST_RATE)
from ..output import check_distinct_paths, check_suffix, check_writable, print_whole, short_path, write_outputs
from ..output_table import stage_counts_label
from ..pins import parse_split
from ..profiles.transformer import guessed_family_note, hf_checkpoint, hf_quantization_config, load_transformer
from ..serve.dtypes import (KV_DTYPES, WEIGHT_FORMATS, check_device_dtype, checkpoint_weight_dtype, kv_dtype_bytes,
                            runs_bf16, weight_format)
from ..serve.engine import ENGINES, engine_spec
from ..serve.export import export_serving
from ..serve.pipeline import Workload
from ..serve.search import (ServeJob, pipeline_for, replica_shares, rerank_by_simulation, search_serving,
                            simulated_over_limits, simulated_standing, split_pool_tokens)
from ..serve.simulate import simulate_serving
from ..units import format_bytes, parse_size_option
from .params import FiniteFloatRange, option_given
from .serve_report import idle_device_lines, rate_notes, running_limit_notes, simulation_notes, summary_lines
from . import main

FORMAT = "pipesearch.serve/1"
#: under a request rate, a simulated replica whose steady output tokens/s
#: fall below this share of what the requests arriving in the same window
#: ask for does not carry the rate (its queue grows); against the arrivals
#: the run drew, not the nominal rate, so a run's sampling noise is no flag
SIM_CARRY_SHARE = 0.95


def _split(ctx, param, value):
    """Decoder layers per stage; a run of ``K`` equal stages may be written
    ``N*K``, as the table writes long splits (:func:`pipesearch.pins.parse_split`)."""
    if value is None:
        return None
    try:  # plain counts as given (zero included: the search says what a stage needs)
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        pass
    try:
        layers, replicas = parse_split(value)
    except InputError:
        layers, replicas = None, None
    if layers is None or replicas is not None:
        raise click.BadParameter(f"{value!r}: expected decoder layers per stage like 20,21,21,18 (a run of K equal "
                                 "stages as N*K, as the table writes them: 2*15,3*16,2)") from None
    return layers


def _ms(x: float) -> str:
    if not math.isfinite(x):  # a TTFT whose queue grows without bound (arrivals above what the plan carries)
        return "unbounded"
    return f"{x * 1e3:,.0f} ms" if x >= 0.1 else f"{x * 1e3:.1f} ms"


def _checkpoint_dtype(path, weight_dtype: str, given: bool) -> str:
    """The weight format to plan for a HuggingFace config: the one its
    ``quantization_config`` stores (what the engine loads), which a given
    ``--weight-dtype`` must match; without one, ``weight_dtype``.

    Raises:
        InputError: ``--weight-dtype`` contradicts the checkpoint, or the
            checkpoint's format is not one these costs size and no
            ``--weight-dtype`` says which to plan.
    """
    quantization = hf_quantization_config(path)
    if quantization is None:
        return weight_dtype
    stored = checkpoint_weight_dtype(quantization)
    method = quantization.get("quant_method")
    if stored is None and not given:
        raise InputError(f"{path}: quantization_config.quant_method {method!r} is not a weight format pipesearch "
                         f"sizes ({', '.join(WEIGHT_FORMATS)}: 16-bit, FP8, 4-bit GPTQ / AWQ in groups of 128); give "
                         "--weight-dtype with the nearest")
    if stored is None:
        click.echo(f"warning: {path}: quantization_config.quant_method {method!r} is not read; planned with "
                   f"--weight-dtype {weight_dtype} as given", err=True)
        return weight_dtype
    if given and weight_dtype != stored:
        raise InputError(f"--weight-dtype {weight_dtype}, but {path}: quantization_config stores {stored} weights "
                         f"(quant_method {method!r}), which the engine loads; drop --weight-dtype or give {stored}")
    return stored


def serve_table(plans, output_len: int | None = None) -> str:
    """The ranked serving plans as a fixed-width text table (no TPOT with
    ``output_len`` 1: the only token is the prompt's, no decode step)."""
    decodes = output_len is None or output_len > 1
    rows = []
    for p in plans:
        layers = stage_counts_label(p.split)
        sim = p.simulated or {}
        gain = (p.total_output_tokens_per_s / p.default_total_output_tokens_per_s
                if p.default_total_output_tokens_per_s else math.inf)
        rows.append({
            "rank": p.rank,
            "tp x pp x r": f"{p.tp} x {p.pp} x {p.replicas}",
            "layers/stage": layers,
            "KV pool": f"{p.pool_tokens:,}",
            "batch": p.batch,
            "tok/s": f"{p.total_output_tokens_per_s:,.0f}" + ("*" if p.saturated else ""),
            "TPOT": _ms(p.steady.tpot_s) if decodes else "-",
            "TTFT": _ms(p.steady.ttft_s),
            "sim tok/s": f"{sim['total_output_tokens_per_s']:,.0f}" + (
                "*" if sim.get("carries_rate") is False else "") if sim else "-",
            "sim TPOT p90": _ms(sim["tpot_p90_s"]) if sim and decodes else "-",
            "sim TTFT p90": _ms(sim["ttft_p90_s"]) if sim else "-",
            "vs default": f"{gain:.2f}x" if math.isfinite(gain) else (
                "default OOM" if p.default_refusal == "out_of_memory" else "default over limits"),
        })
    return pd.DataFrame(rows).to_string(index=False)


#: requests per replica of a simulated run under --request-rate: a Poisson run's carried tokens follow its own
#: draw of arrivals, within about 2% of the mean rate at 2,000 (400 drew 9% under it on Llama-3 8B, 20 req/s)
RATE_REQUESTS = 2000


def _as_run_by(plan, spec, cfg, cluster, weights, kv_bytes: float, reserve: float, workload):
    """``plan``, made for another engine, as the engine ``spec`` runs it:
    its running limit at most the sequences that engine's own memory model
    fits in the plan's KV pool (SGLang and vLLM set the pool apart
    differently: a vLLM command in an SGLang plan asked for one sequence
    more than vLLM holds).

    Raises:
        InputError: that engine's pool holds no sequence of the workload."""
    pipe, _ = pipeline_for(cfg, cluster, plan.tp, plan.pp, weights, kv_bytes, spec, reserve)
    held = max(split_pool_tokens(pipe, plan.split), 0) // pipe.costs.tokens_per_sequence(workload.input_len,
                                                                                          workload.output_len)
    if held < 1:
        raise InputError(f"{spec.name}'s own memory model holds no sequence of {workload.input_len} + "
                         f"{workload.output_len} tokens on this split; plan with --engine {spec.name}")
    return replace(plan, max_num_seqs=min(plan.max_num_seqs, held))


def _check_context(context: int | None, cfg_name: str, input_len: int, output_len: int) -> None:
    """Refuse a request longer than the model's context ``context`` (tokens;
    None: no limit known), naming --input-len and --output-len."""
    if context is not None and input_len + output_len > context:
        raise InputError(f"--input-len {input_len} + --output-len {output_len} = {input_len + output_len} tokens is "
                         f"more than {cfg_name}'s context of {context} (its position limit, max_position_embeddings or "
                         f"n_positions); an engine refuses such a max-model-len: lower them to a sum of {context} or "
                         "less")


def _plan_json(p, exports, decodes: bool = True) -> dict:
    """One plan of the serving plan file (docs/formats.md); ``decodes``:
    whether a request decodes at all (``--output-len`` above 1: else its
    only token is the prompt's, and every TPOT is null)."""
    simulated = dict(p.simulated) if p.simulated else None
    if simulated and not decodes:
        simulated.update(tpot_mean_s=None, tpot_p90_s=None)
        if isinstance(simulated.get("planned_budget"), dict):
            simulated["planned_budget"] = dict(simulated["planned_budget"], tpot_mean_s=None)
    refused = p.default_refusal is not None
    return {
        "rank": p.rank,
        "parallelism": {"tp": p.tp, "pp": p.pp, "replicas": p.replicas},
        "layers_per_stage": list(p.split),
        "stages": [{"index": s.index, "layers": [s.start, s.end], "embedding": s.embedding, "head": s.head,
                    "weight_bytes": s.weight_bytes, "kv_tokens": s.kv_tokens, "step_s": s.step_s,
                    "devices": list(s.devices)} for s in p.stages],
        "kv_pool_tokens": p.pool_tokens,
        "max_batch": p.max_batch,
        "batch": p.batch,
        "max_num_seqs": p.max_num_seqs,
        "max_num_batched_tokens": p.max_num_batched_tokens,
        "predicted": {"output_tokens_per_s": p.total_output_tokens_per_s,
                      "output_tokens_per_s_per_replica": p.steady.output_tokens_per_s,
                      "tpot_s": p.steady.tpot_s if decodes else None, "cycle_s": p.steady.cycle_s,
                      # null: the queue grows without bound (arrivals above what the plan carries)
                      "ttft_s": p.steady.ttft_s if math.isfinite(p.steady.ttft_s) else None,
                      "ring_s": p.steady.ring_s, "bottleneck_stage_s": p.steady.bottleneck_s,
                      "saturated": p.saturated},
        # null batch and throughput where the engine's defaults give no plan (refusal: out_of_memory, latency_limits)
        "engine_default": {"layers_per_stage": list(p.default_split), "kv_pool_tokens": p.default_pool_tokens,
                           "batch": None if refused else p.default_batch,
                           "output_tokens_per_s": None if refused else p.default_total_output_tokens_per_s,
                           "refusal": p.default_refusal},
        "simulated": simulated,
        "exports": exports,
    }


def _budget_may_win(p, alt, rate_given: bool) -> bool:
    """Whether ``alt`` (``p``'s configuration at another step budget: the
    engine's own, or the planned one with headroom for the prompts) may
    simulate better than ``p``'s run (the best so far) by the margin a
    swap needs (:func:`_other_budget_better`): a run that carries
    its load rarely beats the closed form's steady state of the same
    configuration (uneven micro-batches and bursts only cost), so it is
    simulated only where its closed form beats that run by
    :data:`BUDGET_SWAP_MARGIN` (more tok/s; under a rate, a lower TPOT) or
    that run misses the rate or the limits."""
    sim = p.simulated
    if any(simulated_standing(p)):
        return True
    if rate_given:
        return alt.steady.tpot_s < sim["tpot_mean_s"] * (1 - BUDGET_SWAP_MARGIN)
    return alt.total_output_tokens_per_s > sim["total_output_tokens_per_s"] * (1 + BUDGET_SWAP_MARGIN)


#: the relative margin by which another step budget must simulate better than the best run so far to replace it
#: (two runs of different budgets draw their steps differently: a smaller difference decides nothing)
BUDGET_SWAP_MARGIN = 0.01


def _other_budget_better(p, q, rate_given: bool) -> bool:
    """Whether ``q`` (the configuration at another step budget: the
    engine's own, or the planned one with headroom for the prompts)
    simulates better than ``p``: it carries the rate or meets the limits
    where ``p`` does not, or in the same standing does more tok/s (under a
    rate, a lower TPOT) by more than :data:`BUDGET_SWAP_MARGIN`."""
    if simulated_standing(q) != simulated_standing(p):
        return simulated_standing(q) < simulated_standing(p)
    if rate_given:
        return q.simulated["tpot_mean_s"] < p.simulated["tpot_mean_s"] * (1 - BUDGET_SWAP_MARGIN)
    return q.simulated["total_output_tokens_per_s"] > p.simulated["total_output_tokens_per_s"] * (1 + BUDGET_SWAP_MARGIN)


def best_budget_run(p, simulated, rate_given: bool):
    """``(plan, events)``: ``p`` simulated at its planned step budget
    (``simulated``: a plan -> ``(the plan with its run, the run's
    events)``), or its configuration at the engine's own budget
    (``p.engine_budget``) or at one with headroom for the prompts
    (``p.headroom_budget``), in that order, where :func:`_budget_may_win`
    lets it be simulated and :func:`_other_budget_better` says it does
    better than the best run so far; a replacement records the planned
    run under ``simulated["planned_budget"]``."""
    first, ran = simulated(p)
    best = first
    for other in (p.engine_budget, p.headroom_budget):
        if other is not None and _budget_may_win(best, other, rate_given):
            q, q_ran = simulated(other)
            if _other_budget_better(best, q, rate_given):
                best, ran = q, q_ran
    if best is first:
        return best, ran
    planned = {"max_num_batched_tokens": first.max_num_batched_tokens} | {
        k: first.simulated[k] for k in ("output_tokens_per_s", "total_output_tokens_per_s", "tpot_mean_s",
                                        "ttft_mean_s")}
    return replace(best, simulated=best.simulated | {"planned_budget": planned}), ran


def _window(events, span_s: float):
    """The events that start in ``span_s`` seconds from the median start (the
    steady part of the run)."""
    if not events:
        return events
    starts = sorted(ev.start_s for ev in events)
    t0 = starts[len(starts) // 2]
    return tuple(ev for ev in events if t0 <= ev.start_s < t0 + span_s) or tuple(events[:1])


def _check_model_path(model_path: str, what: str) -> None:
    """Refuse a checkpoint the engines' command lines would misread: blank,
    starting with ``-`` (an option to vLLM and SGLang), or holding a control
    character (a newline would end the shell command)."""
    shown = short_path(repr(model_path))
    if not model_path.strip():
        raise InputError(f"{what} {shown}: blank; give the checkpoint (a Hugging Face id or a local path)")
    if model_path.startswith("-"):
        raise InputError(f"{what} {shown}: starts with '-', which the engines read as an option; give the "
                         f"checkpoint's path (./{model_path} for a local folder of that name)")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in model_path):
        raise InputError(f"{what} {shown}: holds a control character; give the checkpoint's id or path")


@main.command("serve")
@click.option("--model", default="llama3-70b", show_default=True,
              help="Catalog transformer (see `pipesearch catalog models`), a transformer TOML or a HuggingFace "
                   "config.json.")
@click.option("--cluster", "cluster_name", default="1x8-l4", show_default=True,
              help="Catalog name or cluster TOML (one device type).")
@click.option("--nodes", type=click.IntRange(min=1), help="Override the node count of the cluster.")
@click.option("--input-len", type=click.IntRange(min=1), default=1024, show_default=True, help="Prompt tokens.")
@click.option("--output-len", type=click.IntRange(min=1), default=256, show_default=True,
              help="Generated tokens per request.")
@click.option("--concurrency", type=click.IntRange(min=1),
              help="Closed loop of this many clients in total (default: as many as fit).")
@click.option("--request-rate", type=FiniteFloatRange(min=MIN_REQUEST_RATE, max=MAX_REQUEST_RATE),
              help="Poisson arrivals, requests per second in total.")
@click.option("--weight-dtype", type=click.Choice(tuple(WEIGHT_FORMATS)), default="bf16", show_default=True)
@click.option("--kv-dtype", type=click.Choice(tuple(KV_DTYPES)), default="bf16", show_default=True)
@click.option("--max-ttft-ms", type=FiniteFloatRange(min=0, min_open=True), help="Limit on mean time to first token.")
@click.option("--max-tpot-ms", type=FiniteFloatRange(min=0, min_open=True),
              help="Limit on mean time per output token.")
@click.option("--engine", type=click.Choice(ENGINES), default="vllm", show_default=True)
@click.option("--tp", type=click.IntRange(min=1), help="Pin the tensor-parallel degree.")
@click.option("--pp", type=click.IntRange(min=1), help="Pin the pipeline-parallel degree.")
@click.option("--split", callback=_split,
              help="Score this split (decoder layers per stage, embedding and head not counted) instead of "
                   "searching.")
@click.option("--memory-fraction", type=FiniteFloatRange(min=0, max=1, min_open=True),
              help="vLLM --gpu-memory-utilization (default 0.9) or SGLang --mem-fraction-static (default 0.85).")
@click.option("--memory-reserve", default="1GiB", show_default=True,
              help="vLLM: memory per device for CUDA context, NCCL buffers and CUDA graphs (not with --engine sglang, whose --memory-fraction holds weights and KV only).")
@click.option("--max-num-seqs", type=click.IntRange(min=1),
              help="Running sequences per replica (default: the engine's, vLLM 1024 on H100 / H200, else 256; "
                   "SGLang 4096).")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1),
              help="Token budget of one step, chunked prefill (default: the engine's for the device, vLLM 8192 "
                   "on H100 / H200, else 2048; SGLang 8192 from 35 GiB, 16384 from 160 GiB, else 2048; planned per "
                   "plan for vLLM unless given).")
@click.option("--step-overhead-ms", type=FiniteFloatRange(min=0, max=MAX_STEP_OVERHEAD_MS),
              help="Engine time per step outside the kernels (default 2).")
@click.option("--model-path", help="Checkpoint to put in the exported commands (default: the model name; for a "
                                   "HuggingFace config.json its _name_or_path, else its folder).")
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True, help="Plans to keep.")
@click.option("--simulate-top", type=click.IntRange(min=0), default=3, show_default=True,
              help="Simulate this many best plans (TTFT / TPOT p90).")
@click.option("--num-requests", type=click.IntRange(min=1, max=MAX_SIMULATED_REQUESTS),
              help="Requests per simulated run (default: 16 x the smaller of the plan's batch and the clients of "
                   "a replica under --concurrency, at least 400; "
                   f"under --request-rate {RATE_REQUESTS} per replica).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the simulated arrivals.")
@click.option("--timeline", type=click.Path(dir_okay=False), help="Draw plan 1's simulated timeline here (png/svg/pdf).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the serving plans JSON here (none without it).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON instead of the table.")
@click.option("--quiet", "-q", is_flag=True, help="No summary lines.")
def serve_command(model, cluster_name, nodes, input_len, output_len, concurrency, request_rate, weight_dtype,
                  kv_dtype, max_ttft_ms, max_tpot_ms, engine, tp, pp, split, memory_fraction, memory_reserve,
                  max_num_seqs, max_num_batched_tokens, step_overhead_ms, model_path, top, simulate_top,
                  num_requests, seed, timeline, output, as_json, quiet):
    """Plan tensor- and pipeline-parallel LLM serving: ranked plans with the
    layer split, per-stage weights and KV capacity, the batch that fits, and
    predicted output tokens/s, TTFT and TPOT; the best are simulated request
    by request; each plan carries its vLLM and SGLang command.

    \b
    Examples:
      pipesearch serve --model llama3-70b --cluster 1x8-l4 --weight-dtype fp8
      pipesearch serve --model llama2-70b --cluster 2x8-a100-80gb --input-len 2048 --output-len 512 --max-tpot-ms 60
      pipesearch serve --model llama3-70b --cluster 1x8-l4 --weight-dtype fp8 --tp 1 --pp 8 --engine sglang
      pipesearch serve --model llama3-8b --cluster 1x8-l4 --request-rate 4 --json
    """
    if concurrency is not None and request_rate is not None:
        raise InputError("--concurrency and --request-rate: give one (a closed loop of clients, or an arrival rate)")
    out = _checked_outputs(output, timeline, simulate_top, model, cluster_name)
    if engine == "sglang" and option_given(click.get_current_context(), "memory_reserve"):
        raise InputError(f"--memory-reserve {memory_reserve} with --engine sglang: SGLang sizes weights and KV pool "
                         "by its --mem-fraction-static (--memory-fraction here) of each device and leaves the rest to "
                         "activations and the CUDA context, so no reserve applies; drop --memory-reserve (it sets "
                         "vLLM's)")
    reserve = parse_size_option("--memory-reserve", memory_reserve)
    cluster = load_cluster(cluster_name, nodes=nodes)
    path, cfg = _serving_model(model, cluster_name, input_len, output_len)
    given = model_path is not None
    if model_path is None and path.suffix == ".json":  # a HuggingFace config: what an engine can load
        model_path = hf_checkpoint(path)
    if model_path is not None:
        _check_model_path(model_path, "--model-path" if given else f"{path}: _name_or_path")
    eng = engine_spec(engine, cluster.device_spec(0), memory_fraction=memory_fraction, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens,
                      step_overhead_s=None if step_overhead_ms is None else step_overhead_ms / 1e3)
    engine_bytes = cluster.device_spec(0).memory_bytes * eng.memory_fraction  # what the engine takes of a device
    if reserve >= engine_bytes:
        raise InputError(f"--memory-reserve {memory_reserve} leaves nothing of the devices of {cluster.name} at a "
                         f"memory fraction of {eng.memory_fraction:g} ({format_bytes(engine_bytes)} each): lower "
                         "--memory-reserve or raise --memory-fraction")
    _check_context(cfg.max_position_embeddings, cfg.name, input_len, output_len)
    if max_tpot_ms is not None and output_len == 1:
        raise InputError(f"--max-tpot-ms {max_tpot_ms:g} with --output-len 1: the one output token comes from the "
                         "prefill, no decode step has a time per output token to limit; drop --max-tpot-ms (or "
                         "limit the prefill with --max-ttft-ms)")
    workload = Workload(input_len, output_len)
    job = ServeJob(workload, concurrency=concurrency, request_rate=request_rate,
                   max_ttft_s=None if max_ttft_ms is None else max_ttft_ms / 1e3,
                   max_tpot_s=None if max_tpot_ms is None else max_tpot_ms / 1e3, memory_reserve_bytes=reserve)
    if path.suffix == ".json":
        weight_dtype = _checkpoint_dtype(path, weight_dtype, option_given(click.get_current_context(), "weight_dtype"))
    weights = weight_format(weight_dtype)
    check_device_dtype(cluster.device_spec(0), weight_dtype)
    half = not runs_bf16(cluster.device_spec(0))  # a bf16 model served in fp16 (the same bytes)
    kv_bytes = kv_dtype_bytes(kv_dtype)
    # an unpinned step budget is planned per configuration (search_serving's uniform budget); a given one is kept
    result = search_serving(cfg, cluster, job, engine=eng, weights=weights, kv_bytes=kv_bytes, tp=tp, pp=pp,
                            split=split, top=top,
                            search_budget=not option_given(click.get_current_context(), "max_num_batched_tokens"))
    run = _Run(cfg, cluster, job, eng, weights, kv_bytes, num_requests, seed, record=bool(timeline))
    plans, events = list(result.plans), {}
    for i, p in enumerate(plans[:simulate_top]):
        p, ran = best_budget_run(p, run.simulated, request_rate is not None)
        events[(p.tp, p.pp, p.split)] = ran
        plans[i] = p
    plans = rerank_by_simulation(plans, rate_given=request_rate is not None)
    exports = [_engine_commands(p, run, engine, memory_fraction, max_num_batched_tokens, model_path, weight_dtype,
                                kv_dtype, half) for p in plans]
    text = json.dumps(_serving_doc(run, path, weight_dtype, kv_dtype, result, plans, exports), indent=2) + "\n"
    outputs = [(out, lambda f: f.write_text(text), "serving plans")] if out else []
    if timeline:
        from ..plots.serve_timeline import plot_serve_timeline

        first = events[(plans[0].tp, plans[0].pp, plans[0].split)]
        # a cycle as the simulation ran it (its mean time per output token), not the closed form's
        cycle_s = max(plans[0].simulated.get("tpot_mean_s") or 0.0, plans[0].steady.cycle_s)
        outputs.append((timeline, lambda f: plot_serve_timeline(
            _window(first, 3 * cycle_s), plans[0].pp, f,
            f"{cfg.name} on {cluster.name}: plan 1 (tp {plans[0].tp} x pp {plans[0].pp}), "
            f"about three simulated cycles from the run's median start"), "--timeline"))
    if outputs:  # all or none (output.write_outputs)
        write_outputs(outputs)
    if as_json:
        print_whole(text)
        return
    if not quiet:
        shown_weights = "fp16 (no bf16 on these devices)" if half and weight_dtype == "bf16" else weight_dtype
        click.echo(f"{cfg.name} on {cluster.name} ({cluster.num_devices} x {cluster.device_spec(0).name}), "
                   f"{engine}, weights {shown_weights}, KV {'fp16' if half and kv_dtype == 'bf16' else kv_dtype}, "
                   f"{input_len} in / {output_len} out")
    click.echo(serve_table(plans, output_len))
    limit_given = option_given(click.get_current_context(), "max_num_seqs")
    own_batch = request_rate is not None or concurrency is not None  # the workload sets the batch
    for line in (rate_notes(plans, request_rate, output_len, quiet) + simulation_notes(plans, job, eng, engine)
                 + running_limit_notes(plans, eng, engine, limit_given, own_batch)
                 + idle_device_lines(plans, cluster.num_devices)):
        click.echo(line)
    if not quiet:
        for line in summary_lines(plans, exports, engine, result, (out, timeline)):
            click.echo(line)


def _checked_outputs(output, timeline, simulate_top: int, model, cluster_name):
    """The serving plan file's path (None without ``-o``) once every output
    is checked before the search: writable, distinct from each other and
    from the inputs, a JSON suffix; ``--timeline`` and the simulation
    options need a simulated run (``--simulate-top`` 1 or more).

    Raises:
        InputError: the path or option and the fix.
    """
    out = None if output is None else check_writable(output, "serving plans (-o)")
    if timeline is not None:
        from ..plots.common import check_output

        check_output(check_writable(timeline, "--timeline"))
        if simulate_top < 1:
            raise InputError(f"--timeline {timeline}: draws a simulated run; needs --simulate-top 1 or more")
    check_distinct_paths({"-o": output, "--timeline": timeline},
                         [("--model", model), ("--cluster", cluster_name), *device_files(cluster_name)])
    check_suffix(output, "-o", ".json", "the serving plan file is JSON")
    if simulate_top < 1:
        given = [f"--{name.replace('_', '-')}" for name in ("num_requests", "seed")
                 if option_given(click.get_current_context(), name)]
        if given:
            raise InputError(f"{given[0]} with --simulate-top 0: it sets the simulated run of the workload, and "
                             "--simulate-top 0 simulates none; give --simulate-top 1 or more, or drop it")
    return out


def _serving_model(model, cluster_name, input_len: int, output_len: int):
    """``(path, config)`` of ``--model`` loaded at a request's length, once
    refused where it cannot be served: a layer profile, a context shorter
    than a request, an encoder-decoder model, more layers than the split
    search takes. Warns where the config's family was guessed, and where a
    cluster file shadows a catalog name.

    Raises:
        InputError: the model and the fix.
    """
    path = resolve("model", model)
    if path.suffix not in (".toml", ".json"):  # a layer profile (.csv, graph.txt) or any other file
        what = "a layer profile" if path.suffix == ".csv" or path.name.endswith("graph.txt") else (
            f"neither a .toml nor a .json file (its name ends {path.suffix!r})" if path.suffix else
            "neither a .toml nor a .json file (its name has no extension)")
        raise InputError(f"--model {model}: {path.name} is {what}; serving plans need a transformer config "
                         f"(catalog TOML or HuggingFace config.json, named so)")
    try:  # the model's own context first: a learned position table refuses a longer seq_len, naming --seq-len
        own = load_transformer(path, seq_len=1)  # (a one-token length: any config's context holds it)
    except InputError:  # the load below says what is wrong
        own = None
    if own is not None:
        _check_context(own.max_position_embeddings, own.name, input_len, output_len)
    # a request's tokens as the sequence length: a config with no context of its own loads (serving needs no
    # training length; --seq-len is plan's)
    cfg = load_transformer(path, seq_len=input_len + output_len)
    if path.suffix == ".json" and (note := guessed_family_note(path)):
        click.echo(f"warning: {note}", err=True)
    for note in input_name_warnings(model, cluster_name):
        click.echo(f"warning: {note}", err=True)
    if cfg.is_encoder_decoder:
        raise InputError(f"--model {model}: {cfg.name} is an encoder-decoder model; serving plans cover "
                         f"decoder-only transformers (a KV cache per decoder layer, prefill then decode); "
                         f"plan its training with `pipesearch plan --model {model}`")
    if cfg.num_layers > MAX_SERVE_LAYERS:
        raise InputError(f"--model {model}: {cfg.num_layers} decoder layers; serving plans split at most "
                         f"{MAX_SERVE_LAYERS} (the split search's tables grow with the square of the count)")
    if own is not None and own.max_position_embeddings is None:  # nothing to check the request against
        click.echo(f"warning: {path.name} gives no context length (max_position_embeddings): planned for --input-len "
                   f"{input_len} + --output-len {output_len} = {input_len + output_len} tokens as asked; check them "
                   "against the model's own limit", err=True)
    return path, cfg


@dataclass(frozen=True)
class _Run:
    """What a serving plan's simulated run and engine commands need: the
    model, cluster, job (workload, rate or clients, limits, reserve), the
    engine as asked for, the weight and KV formats, and the run's length,
    seed and whether it records events (``--timeline``)."""

    cfg: object
    cluster: object
    job: ServeJob
    eng: object
    weights: object
    kv_bytes: float
    num_requests: int | None
    seed: int
    record: bool

    def simulated(self, p):
        """``p`` with its simulated run (one replica per share of the clients) and that run's events."""
        job, workload = self.job, self.job.workload
        request_rate, concurrency, output_len = job.request_rate, job.concurrency, workload.output_len
        # the engine as exported: at most the plan's running limit (--max-num-seqs), the other requests queue
        ran = replace(self.eng, max_num_seqs=min(self.eng.max_num_seqs, p.max_num_seqs),
                      max_num_batched_tokens=p.max_num_batched_tokens)
        pipe, replicas = pipeline_for(self.cfg, self.cluster, p.tp, p.pp, self.weights, self.kv_bytes, ran,
                                      job.memory_reserve_bytes)
        rate = None if request_rate is None else request_rate / replicas
        shares = replica_shares(concurrency, replicas) if rate is None else ((0, replicas),)
        runs = []  # per share of clients (the larger first): its replicas' count and one replica's run
        for clients, count in shares:
            k = None if rate is not None else (clients or p.batch)
            n_req = self.num_requests or (RATE_REQUESTS if rate is not None else
                                          max(400, 16 * min(k or p.batch, p.batch)))
            runs.append((count, simulate_serving(pipe, p.split, workload, num_requests=n_req,
                                                 pool_tokens=p.pool_tokens, concurrency=k, request_rate=rate,
                                                 seed=self.seed, record_events=500_000 if self.record and not runs
                                                 else 0)))
        figures = [(count, run.as_dict()) for count, run in runs]
        total = sum(count * f["output_tokens_per_s"] for count, f in figures)
        # a rate the closed form carries can still outrun the simulated replica (bursts, prefill interference)
        first = figures[0][1]
        offered = first.get("offered_output_tokens_per_s") or rate * output_len if rate is not None else None
        carries = {} if rate is None else {
            "carries_rate": bool(first["output_tokens_per_s"] >= SIM_CARRY_SHARE * offered)}
        limits = {} if job.max_ttft_s is None and job.max_tpot_s is None else {
            "meets_limits": not simulated_over_limits(first, job)}
        return replace(p, simulated=figures[0][1] | {"total_output_tokens_per_s": total} | carries | limits | (
            {"replica_clients": [[c, n] for c, n in shares]} if concurrency is not None else {})), runs[0][1].events


def _engine_commands(p, run: _Run, engine: str, memory_fraction, max_num_batched_tokens, model_path, weight_dtype,
                     kv_dtype, half: bool) -> dict:
    """Each engine's command for plan ``p`` (:func:`pipesearch.serve.export.export_serving`),
    or its refusal: the engine asked for as planned, the other at its
    defaults but for what the user pinned (:func:`_as_run_by`)."""
    cfg, cluster, job = run.cfg, run.cluster, run.job
    ex = {}
    for name in ENGINES:  # the other engine's command at its defaults, but for what the user pinned
        spec = run.eng if name == engine else engine_spec(name, cluster.device_spec(0),
                                                          memory_fraction=memory_fraction,
                                                          max_num_batched_tokens=max_num_batched_tokens)
        try:
            planned = p if name == engine else _as_run_by(p, spec, cfg, cluster, run.weights, run.kv_bytes,
                                                          job.memory_reserve_bytes, job.workload)
            ex[name] = export_serving(planned, cfg, engine=name, model_path=model_path or cfg.name,
                                      weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                      memory_fraction=spec.memory_fraction,
                                      max_model_len=job.workload.input_len + job.workload.output_len,
                                      max_num_batched_tokens=p.max_num_batched_tokens if name == engine
                                      else spec.max_num_batched_tokens,
                                      devices_per_node=cluster.groups[0].devices_per_node,
                                      concurrency=job.concurrency, model_name_only=model_path is None, half=half)
        except InputError as exc:
            ex[name] = {"refused": str(exc)}
    return ex


def _serving_doc(run: _Run, path, weight_dtype, kv_dtype, result, plans, exports) -> dict:
    """The serving plan file (:data:`FORMAT`): inputs (model, cluster,
    engine, workload), the search's counts and the ranked plans with their
    engine commands."""
    cfg, eng, job = run.cfg, run.eng, run.job
    workload = job.workload
    return {
        "format": FORMAT,
        "inputs": {
            "model": {"name": cfg.name, "file": str(path), "num_layers": cfg.num_layers,
                      "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
                      "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size},
            "cluster": describe_cluster(run.cluster) | {"name": run.cluster.name},
            "engine": {"name": eng.name, "memory_fraction": eng.memory_fraction,
                       "block_size_tokens": eng.block_size_tokens, "max_num_seqs": eng.max_num_seqs,
                       "max_num_batched_tokens": eng.max_num_batched_tokens, "step_overhead_s": eng.step_overhead_s,
                       # SGLang sizes its pool from a fraction of the memory alone (no reserve: null)
                       "memory_reserve_bytes": job.memory_reserve_bytes if eng.activation_in_budget else None},
            "workload": {"input_len": workload.input_len, "output_len": workload.output_len,
                         "concurrency": job.concurrency, "request_rate": job.request_rate,
                         "max_ttft_s": job.max_ttft_s, "max_tpot_s": job.max_tpot_s,
                         "weight_dtype": weight_dtype, "kv_dtype": kv_dtype},
        },
        "search": {"configurations_evaluated": result.evaluated, "skipped": dict(result.skipped),
                   "wall_s": round(result.wall_s, 4)},
        "plans": [_plan_json(p, ex, workload.output_len > 1) for p, ex in zip(plans, exports)],
    }
