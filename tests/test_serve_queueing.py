"""Time to first token under Poisson arrivals (``--request-rate``): the
prompts queue for the steps' token budget, an M/D/1 queue whose mean wait
the closed form adds (``serve.queueing.prompt_wait_s``)."""

import heapq
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from pipesearch.catalog import resolve
from pipesearch.cli import main
from pipesearch.errors import InputError
from pipesearch.hardware import load_cluster
from pipesearch.profiles.transformer import load_transformer
from pipesearch.serve.dtypes import weight_format
from pipesearch.serve.engine import engine_spec
from pipesearch.serve.pipeline import Workload
from pipesearch.serve.queueing import admission_wait_s, prompt_wait_s
from pipesearch.serve.search import ServeJob, pipeline_for, search_serving
from pipesearch.serve.simulate import simulate_serving

GIB = 2**30


def test_prompt_wait_by_hand():
    """2 prompts/s of 0.25 s each: rho = 0.5, M/D/1 wait rho S / (2 (1 -
    rho)) = 0.125 s, and half a 0.1 s step that every arrival waits for the
    next step: 0.175 s. At rho = 1 and above: unbounded."""
    assert prompt_wait_s(2.0, 0.25, 0.1) == pytest.approx(0.175, rel=1e-12)
    assert prompt_wait_s(1.0, 0.1, 0.0) == pytest.approx(0.1 * 0.1 / (2 * 0.9), rel=1e-12)
    assert np.isinf(prompt_wait_s(4.0, 0.25, 0.1))
    assert np.isinf(prompt_wait_s(5.0, 0.25, 0.1))
    # the half step only for the arrivals that find the engine running steps: a quarter of them, 0.0125 s
    assert prompt_wait_s(2.0, 0.25, 0.1, 0.25) == pytest.approx(0.1375, rel=1e-12)


def test_prompt_wait_matches_a_lindley_simulation_of_the_queue():
    """An M/D/1 queue simulated by Lindley's recursion ``W_{k+1} = max(0,
    W_k + S - A_k)`` (A exponential inter-arrival times): its mean wait is
    the formula's at rho 0.3, 0.6 and 0.85 (within 3%, 400,000 customers)."""
    rng = np.random.default_rng(7)
    S = 0.2
    for rho in (0.3, 0.6, 0.85):
        lam = rho / S
        gaps = rng.exponential(1 / lam, 400_000)
        w, total = 0.0, 0.0
        for a in gaps:
            total += w
            w = max(0.0, w + S - a)
        assert prompt_wait_s(lam, S, 0.0) == pytest.approx(total / len(gaps), rel=0.03)


@pytest.mark.parametrize("steps_per_prompt", [1, 4])
def test_prompt_wait_matches_a_simulation_on_the_step_grid(steps_per_prompt):
    """Steps every 0.1 s, a prompt 1 or 4 whole steps of the budget,
    Poisson arrivals: a prompt starts at the first step after its arrival
    at which the prompt before it is done, ``start_k = max(ceil(a_k / d)
    d, start_{k-1} + S)``. Its mean wait is the M/D/1 wait plus half a step
    within 3.5% at rho 0.3, 0.6 and 0.85 (400,000 arrivals); with half a step
    only for the arrivals that find no prompt under way it was 21%, 24%
    and 13% under (one step a prompt), 11%, 8.5% and 3% (four)."""
    rng = np.random.default_rng(3)
    d = 0.1
    S = steps_per_prompt * d
    for rho in (0.3, 0.6, 0.85):
        lam = rho / S
        prev, total = -math.inf, 0.0
        arrivals = np.cumsum(rng.exponential(1 / lam, 400_000))
        for a, grid in zip(arrivals.tolist(), (np.ceil(arrivals / d) * d).tolist()):
            prev = max(grid, prev + S)
            total += prev - a
        assert prompt_wait_s(lam, S, d) == pytest.approx(total / len(arrivals), rel=0.035)


def test_arrival_rate_must_be_positive():
    with pytest.raises(InputError, match="request rate"):
        Workload(10, 10, arrival_rate_per_s=0.0)
    with pytest.raises(InputError, match="request rate"):
        Workload(10, 10, arrival_rate_per_s=math.inf)


def l4_plan(rate: float, tp: int, pp: int):
    """Plan 1 of Llama-3 70B fp8 on 8 x L4 (1024 in / 256 out) at ``rate``
    requests/s, pinned to ``tp x pp``, its pipeline as planned (the engine
    at the plan's budget and running limit) and its replica count."""
    cfg = load_transformer(resolve("model", "llama3-70b"))
    cluster = load_cluster("1x8-l4")
    eng = engine_spec("vllm", cluster.device_spec(0))
    job = ServeJob(Workload(1024, 256), request_rate=rate, memory_reserve_bytes=GIB)
    plan = search_serving(cfg, cluster, job, engine=eng, weights=weight_format("fp8"), kv_bytes=2.0, tp=tp, pp=pp,
                          top=1, search_budget=True).plans[0]
    ran = replace(eng, max_num_seqs=min(eng.max_num_seqs, plan.max_num_seqs),
                  max_num_batched_tokens=plan.max_num_batched_tokens)
    pipe, replicas = pipeline_for(cfg, cluster, tp, pp, weight_format("fp8"), 2.0, ran, GIB)
    return plan, pipe, replicas


@pytest.mark.parametrize("tp, pp", [(2, 4), (1, 8), (8, 1)])
def test_mean_ttft_under_a_request_rate_agrees_with_the_simulation(tp, pp):
    """At 1.5 requests/s the closed-form mean TTFT is within 10% of the
    simulated mean (2,000 Poisson arrivals). Without the prompts' queueing
    it was 20%, 17% and 57% under it (0.395 / 0.504, 0.556 / 0.669, 0.802
    / 1.861 s): tp 8 x pp 1 runs the 1024-token prompts in chunks of about
    900 tokens at a 1,090-token budget, the budget busy about half the time."""
    plan, pipe, replicas = l4_plan(1.5, tp, pp)
    assert not plan.saturated
    sim = simulate_serving(pipe, plan.split, Workload(1024, 256), num_requests=2000, pool_tokens=plan.pool_tokens,
                           request_rate=1.5 / replicas, seed=0)
    assert plan.steady.ttft_s == pytest.approx(sim.ttft_mean_s, rel=0.10)


def test_a_rate_above_what_a_plan_carries_has_no_bounded_ttft():
    """tp 8 x pp 1 carries at most about 430 output tokens/s; at 2.2
    requests/s x 256 tokens (563 wanted) the queue grows without bound: the
    table says "unbounded", the plan file null (JSON has no infinity), and
    a TTFT limit excludes it."""
    plan, _, _ = l4_plan(2.2, 8, 1)
    assert plan.saturated and math.isinf(plan.steady.ttft_s)
    args = ["serve", "--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8", "--input-len",
            "1024", "--output-len", "256", "--request-rate", "2.2", "--tp", "8", "--pp", "1", "--simulate-top", "0"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "unbounded" in r.output.splitlines()[2]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert json.loads(r.output)["plans"][0]["predicted"]["ttft_s"] is None
    r = CliRunner().invoke(main, [*args, "--max-ttft-ms", "5000"])
    assert r.exit_code == 2 and "latency" in r.output


def test_a_ttft_limit_the_engines_budget_misses_is_met_at_a_planned_budget():
    """At 2.2 requests/s with --max-ttft-ms 800, vLLM's 2048-token budget
    puts a 1024-token prompt whole into one step and no batch of tp 2 x pp
    4 meets the limit with the prompts' queueing; the budget sized from the
    batch planned without the limit does (the search once gave up on the
    configuration there). The engine's defaults are reported as over the
    limits, not out of memory."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8",
                                  "--input-len", "1024", "--output-len", "256", "--request-rate", "2.2",
                                  "--max-ttft-ms", "800", "--tp", "2", "--pp", "4", "--simulate-top", "0"])
    assert r.exit_code == 0, r.output
    row = r.output.splitlines()[2]
    assert "default over limits" in row
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8",
                                  "--input-len", "1024", "--output-len", "256", "--request-rate", "2.2",
                                  "--max-ttft-ms", "800", "--tp", "2", "--pp", "4", "--simulate-top", "0", "--json"])
    p = json.loads(r.output)["plans"][0]
    assert p["max_num_batched_tokens"] < 2048 and p["predicted"]["ttft_s"] <= 0.8
    assert p["engine_default"]["batch"] is None and p["engine_default"]["output_tokens_per_s"] is None
    assert p["engine_default"]["refusal"] == "latency_limits"


def test_admission_wait_by_hand():
    """One running slot (c = 1) is the M/D/1 queue, where half of Erlang C
    is exact (Cosmetatos' factor is 1): at a mean of 0.5 running (rho 0.5)
    and 2 arrivals/s (each request 0.25 s), a^2 / (2 lambda (1 - a)) = 0.25
    / 2 = 0.125 s; two slots at a = 1: Erlang B 1/5, C 1/3, half the M/M/2
    wait 1/3 x 1 / (2 x 1) / 2 at 2 arrivals/s = 1/12 s, times 1 + 0.5 x 1
    x (sqrt(14) - 2) / (16 x 0.5 x 2); a mean batch at the limit never frees
    a slot."""
    assert admission_wait_s(2.0, 0.5, 1) == pytest.approx(0.125, rel=1e-12)
    assert admission_wait_s(2.0, 1.0, 2) == pytest.approx(1 / 12 * (1 + 0.5 * (math.sqrt(14) - 2) / 16), rel=1e-12)
    assert math.isinf(admission_wait_s(2.0, 215.0, 215))


@pytest.mark.parametrize("servers, rho", [(4, 0.5), (8, 0.6)])
def test_admission_wait_matches_a_simulation_of_the_slots(servers, rho):
    """An M/D/c queue simulated first come, first served (each arrival
    takes the slot that frees first; service 1 s, 400,000 arrivals): its
    mean wait is the formula's within 6%. Half the M/M/c wait alone
    (Allen-Cunneen) is 12% and 15% under it."""
    rng = np.random.default_rng(2)
    lam = rho * servers
    free, total = [0.0] * servers, 0.0
    for a in np.cumsum(rng.exponential(1 / lam, 400_000)).tolist():
        start = max(a, heapq.heappop(free))
        total += start - a
        heapq.heappush(free, start + 1.0)
    assert admission_wait_s(lam, lam * 1.0, servers) == pytest.approx(total / 400_000, rel=0.06)


def test_a_ttft_limit_does_not_cut_the_running_limit_to_the_mean_batch():
    """Llama-3 70B fp8 on 8 x L4, 128 in / 2048 out at 0.2415 requests/s,
    --max-ttft-ms 245.3: the running limit of tp 8 was cut to its mean
    batch (42: a larger batch's TTFT is above the limit), so every burst
    queued (33.9 s simulated mean TTFT); it is set by TPOT alone (the TTFT
    limit holds for the mean batch), and the simulated mean TTFT is the
    closed form's within 10%."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8",
                                  "--input-len", "128", "--output-len", "2048", "--request-rate", "0.2415",
                                  "--max-ttft-ms", "245.3", "--tp", "8", "--pp", "1", "--simulate-top", "1", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    assert p["max_num_seqs"] > p["batch"] + 20
    assert p["simulated"]["ttft_mean_s"] == pytest.approx(p["predicted"]["ttft_s"], rel=0.10)


def test_a_plan_whose_slots_are_all_busy_is_flagged():
    """Llama-3 8B on 8 x L4, 128 in / 2048 out at 2.825 requests/s, tp 2 x
    pp 2: its mean batch, 215, is all its KV pool runs, so no slot ever
    frees and arrivals queue without bound (22.8 s simulated p90 TTFT where
    the closed form said 132 ms): TTFT unbounded, and the plan marked as not
    carrying the rate."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--input-len", "128",
                                  "--output-len", "2048", "--request-rate", "2.825", "--tp", "2", "--pp", "2",
                                  "--simulate-top", "0", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    assert p["batch"] == p["max_num_seqs"] and p["predicted"]["ttft_s"] is None and p["predicted"]["saturated"]


@pytest.mark.parametrize("tp, pp", [(4, 2), (8, 1)])
def test_ttft_at_a_low_request_rate_agrees_with_the_simulation(tp, pp):
    """Llama-3 70B fp8 on 8 x L4 at 0.02 requests/s (one request in the
    engine at a time, mostly none): an arrival to an idle engine is
    scheduled at once, and with fewer sequences than stages a prompt's
    chunks take the engine's free micro-batch slots a stage's step apart.
    The closed-form mean TTFT is within 5% of the simulated mean (300
    arrivals); it was 43% over at tp 4 x pp 2 (0.625 s against 0.437: the
    chunks a round trip apart, and half a step of waiting for every
    arrival) and 5% over at tp 8 x pp 1."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8",
                                  "--request-rate", "0.02", "--tp", str(tp), "--pp", str(pp), "--simulate-top", "1",
                                  "--num-requests", "300", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    assert p["predicted"]["ttft_s"] == pytest.approx(p["simulated"]["ttft_mean_s"], rel=0.05)


@pytest.mark.parametrize("tp", [4, 8])
def test_tpot_of_short_outputs_under_a_rate_agrees_with_the_simulation(tp):
    """Llama-3 8B on 8 x L4, 1024 in / 16 out at 4 requests/s, tp x pp 1: a
    mean batch of one or two, so a closed loop's "the other B - 1
    sequences' prompts" left the decode steps all but empty, while Poisson
    arrivals bring prompts into them at the rate whatever the batch. The
    closed-form TPOT is within 12% of the simulated mean; it was 24% and 25%
    under (0.0218 s against 0.0287, 0.0244 against 0.0324)."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--input-len", "1024",
                                  "--output-len", "16", "--request-rate", "4", "--tp", str(tp), "--pp", "1",
                                  "--simulate-top", "1", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    assert p["predicted"]["tpot_s"] == pytest.approx(p["simulated"]["tpot_mean_s"], rel=0.12)


def test_simulated_means_over_the_latency_limits_are_said():
    """Llama-3 8B on 8 x L4 at 15 requests/s with --max-ttft-ms 300: the
    search keeps plans whose closed-form mean TTFT meets 300 ms; a plan
    whose simulated mean misses it is marked (``meets_limits`` false) and
    named under the table, and one whose simulated mean meets it is not."""
    args = ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--request-rate", "15", "--max-ttft-ms", "300",
            "--simulate-top", "3"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    text = CliRunner().invoke(main, args).output
    for p in plans:
        assert p["predicted"]["ttft_s"] <= 0.3
        if p["simulated"]:
            over = p["simulated"]["ttft_mean_s"] > 0.3
            assert p["simulated"]["meets_limits"] is (not over)
            assert (f"plan {p['rank']}: its simulated mean TTFT" in text) is over
    assert any(p["simulated"] and not p["simulated"]["meets_limits"] for p in plans)


def test_a_batchs_closed_form_does_not_depend_on_the_batches_beside_it():
    """Under a rate the chunk spacing over the engine's slots applies to
    the batches smaller than them only: with max_num_seqs 2 below pp 4,
    batch 3's TTFT was another when batch 1 (smaller than the slots) shared
    its array (0.389 s alone, 0.503 s beside it)."""
    from pipesearch.serve.search import pipeline_for

    eng = replace(engine_spec("vllm", max_num_batched_tokens=2048), max_num_seqs=2)
    pipe = pipeline_for(load_transformer(resolve("model", "llama3-8b")), load_cluster("1x8-l4"), 2, 4,
                        weight_format("bf16"), 2.0, eng, GIB)[0]
    w = Workload(5000, 16, arrival_rate_per_s=0.2)
    split = (8, 8, 8, 8)
    alone = pipe.steady_states([(split, 3)], w)[0]
    assert pipe.steady_states([(split, 1), (split, 3)], w)[1] == alone
    assert pipe.steady_state(split, 1, w) == pipe.steady_states([(split, 1), (split, 3)], w)[0]


def test_clients_beyond_the_running_batch_wait_for_a_slot():
    """A closed loop of 333 clients on one tp 2 x pp 4 replica of Llama-3
    8B that runs 256 sequences: the other 77 wait for a slot. By Little's
    law over the loop a request waits life x (333 / 256 - 1); the closed
    form's TTFT was the service's alone (185 ms against 7.65 s simulated
    mean) and is now within 10% of the simulation."""
    from pipesearch.serve.queueing import closed_loop_wait_s

    assert closed_loop_wait_s(333, 256, 20.0) == pytest.approx(20.0 * 77 / 256, rel=1e-12)
    assert closed_loop_wait_s(200, 256, 20.0) == 0.0
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--concurrency", "333",
                                  "--tp", "2", "--pp", "4", "--simulate-top", "1", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    assert p["batch"] == 256 and p["simulated"]["replica_clients"] == [[333, 1]]
    assert p["predicted"]["ttft_s"] == pytest.approx(p["simulated"]["ttft_mean_s"], rel=0.10)


def test_a_plan_serving_the_rate_only_with_every_slot_busy_is_told_apart():
    """Llama-3 8B on 8 x L4 at 18 requests/s (4,608 output tok/s wanted):
    tp 1 x pp 4 serves 4,615 tok/s only at its running limit of 256, so
    no slot frees and TTFT is unbounded; it was listed as "cannot carry
    ... tok/s is the most they serve" beside a tok/s above the demand. Its
    own line says the slots are all busy; plans below the demand keep theirs."""
    args = ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--request-rate", "18", "--simulate-top", "0"]
    plans = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)["plans"]
    text = CliRunner().invoke(main, args).output
    full = [p for p in plans if p["predicted"]["saturated"] and p["predicted"]["output_tokens_per_s"] >= 18 * 256]
    short = [p for p in plans if p["predicted"]["saturated"] and p["predicted"]["output_tokens_per_s"] < 18 * 256]
    assert full and all(p["batch"] == p["max_num_seqs"] for p in full)
    line = next(x for x in text.splitlines() if "only with every running slot busy" in x)
    assert all(f" {p['rank']}" in line.split(" serve")[0] for p in full)
    if short:
        line = next(x for x in text.splitlines() if "cannot carry" in x)
        assert all(str(p["rank"]) in line.split(" cannot")[0] for p in short)


def test_a_run_shorter_than_its_clients_says_so():
    """The same replica with 2,000 clients and a run of 1,000 requests:
    the run ends before half the clients have asked once, so its TTFT
    misses their wait (100,000 clients on fp8 Llama gave 890 s simulated
    against 29,354 s closed-form, unexplained). The table says so and how
    to run longer; at 2,000 requests (every client asks once) it does not.
    Without --concurrency the loop's clients are the plan's batch: one
    request (6 simulated tok/s against 870) gets the same line."""
    args = ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--concurrency", "2000", "--tp", "2", "--pp", "4",
            "--simulate-top", "1", "--top", "1"]
    short = CliRunner().invoke(main, [*args, "--num-requests", "1000"])
    assert short.exit_code == 0, short.output
    line = next(x for x in short.output.splitlines() if x.startswith("sim columns of plan 1"))
    assert "run of 1,000 requests ends before its 2,000 clients per replica" in line
    assert "--num-requests 4000" in line
    enough = CliRunner().invoke(main, [*args, "--num-requests", "2000"])
    assert enough.exit_code == 0 and "sim columns of plan" not in enough.output, enough.output
    one = CliRunner().invoke(main, [*args[:5], *args[7:], "--num-requests", "1"])
    assert one.exit_code == 0, one.output
    assert "sim columns of plan 1: its run of 1 request ends before its 256 clients per replica" in one.output


@pytest.mark.parametrize("simulate_top", [0, 1])
def test_the_backlog_is_pointed_at_only_where_a_run_shows_it(simulate_top):
    """A rate no plan carries: the line under the table pointed at "the
    simulated columns" for the backlog even with --simulate-top 0, where
    every simulated column is empty."""
    r = CliRunner().invoke(main, ["serve", "--weight-dtype", "fp8", "--request-rate", "1000000", "--top", "2",
                                  "--simulate-top", str(simulate_top)])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "cannot carry --request-rate" in x)
    assert ("the simulated columns show the backlog" in line) == (simulate_top > 0), line
