"""The exact serving split against brute force, the planned split against
vLLM's default on 8x L4, and the search's pins and speed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipesearch.catalog import resolve
from pipesearch.errors import InputError
from pipesearch.hardware import load_cluster
from pipesearch.profiles.transformer import TransformerConfig, load_transformer
from pipesearch.serve.costs import ServeCosts
from pipesearch.serve.dtypes import weight_format
from pipesearch.serve.engine import engine_spec
from pipesearch.serve.pipeline import ServePipeline, Workload
from pipesearch.serve.search import ServeJob, pipeline_for, search_serving
from pipesearch.serve.split import brute_force_split, max_pool_split, optimal_splits, stage_capacities
from pipesearch.types import DeviceSpec, Link

GIB = 2**30


def small_pipe(pp, memory_gib, vocab, tied=False):
    cfg = TransformerConfig(name="tiny", num_layers=12, hidden_size=1024, num_attention_heads=16,
                            ffn_hidden_size=4096, vocab_size=vocab, seq_len=2048, num_kv_heads=4,
                            gated_mlp=True, tied_embeddings=tied, position_embedding="rotary", norm="rmsnorm",
                            bias=False, dropout=False)
    dev = DeviceSpec("d", memory_gib * GIB, 50e12, 10e12, 200e9, 0.5)
    c = ServeCosts(cfg, dev, 1, weight_format("bf16"), 2.0, engine_spec("vllm", max_num_seqs=64), Link(20e9, 1e-5),
                   0.1 * GIB)
    return ServePipeline(c, pp, (Link(20e9, 1e-5),) * (pp - 1))


@pytest.mark.parametrize("pp,memory_gib,vocab", [(2, 1.0, 128_000), (3, 0.9, 256_000), (4, 0.8, 200_000),
                                                 (4, 2.0, 32_000), (5, 0.7, 300_000), (1, 1.5, 50_000)])
def test_dp_matches_brute_force(pp, memory_gib, vocab):
    pipe = small_pipe(pp, memory_gib, vocab)
    w = Workload(512, 128)
    tps = pipe.costs.tokens_per_sequence(512, 128)
    pool, _ = max_pool_split(pipe)
    # the largest pool is the brute-force maximum of the per-split minimum
    cap = stage_capacities(pipe)
    import itertools
    best_pool = -1
    for cuts in itertools.combinations(range(1, 12), pp - 1):
        b = (0, *cuts, 12)
        best_pool = max(best_pool, min(int(cap[s, y - x]) for s, (x, y) in enumerate(zip(b, b[1:]))))
    assert pool == best_pool
    batches = np.array([1, 2, 5, 17, 40, 64])
    step = pipe.steady_step(batches, w)
    levels = optimal_splits(pipe, batches, step, batches * tps)
    for k, B in enumerate(batches):
        one = pipe.steady_step(np.array([B]), w)
        ref = brute_force_split(pipe, int(B), one, B * tps)
        got = levels[k]
        if ref is None:
            assert got is None
            continue
        assert got is not None
        assert got.bottleneck_s == pytest.approx(ref.bottleneck_s, rel=1e-9)
        assert got.pool_tokens == ref.pool_tokens


def test_planned_split_beats_vllm_default_llama3_70b_fp8_on_8x_l4():
    cfg = load_transformer(resolve("model", "llama3-70b"))
    cluster = load_cluster("1x8-l4")
    job = ServeJob(Workload(1024, 256))
    r = search_serving(cfg, cluster, job, engine=engine_spec("vllm"), weights=weight_format("fp8"), kv_bytes=2.0,
                       tp=1, pp=8)
    plan = r.plans[0]
    assert plan.default_split == (10,) * 8  # vLLM: 80 // 8, no remainder
    assert plan.split != plan.default_split
    assert plan.split[0] < 10 and plan.split[-1] < 10  # the embedding and LM-head stages carry fewer layers
    assert plan.pool_tokens > plan.default_pool_tokens
    assert plan.max_batch > plan.default_batch or plan.batch > plan.default_batch
    assert plan.total_output_tokens_per_s > plan.default_total_output_tokens_per_s


def test_split_pin_is_scored_not_searched():
    cfg = load_transformer(resolve("model", "llama3-70b"))
    cluster = load_cluster("1x8-l4")
    job = ServeJob(Workload(1024, 256))
    split = (12, 10, 10, 10, 10, 10, 10, 8)
    r = search_serving(cfg, cluster, job, engine=engine_spec("vllm"), weights=weight_format("fp8"), kv_bytes=2.0,
                       split=split)
    assert [p.split for p in r.plans] == [split] * len(r.plans)
    with pytest.raises(InputError, match="summing to 80"):
        search_serving(cfg, cluster, job, engine=engine_spec("vllm"), weights=weight_format("fp8"), kv_bytes=2.0,
                       split=(10,) * 7)


def test_tp_pin_the_engine_refuses():
    cfg = load_transformer(resolve("model", "llama3-70b"))
    cluster = load_cluster("1x8-l4")
    with pytest.raises(InputError, match="--tp 3"):
        search_serving(cfg, cluster, ServeJob(Workload(128, 128)), engine=engine_spec("vllm"),
                       weights=weight_format("fp8"), kv_bytes=2.0, tp=3)


def test_latency_limit_lowers_the_batch():
    cfg = load_transformer(resolve("model", "llama3-70b"))
    cluster = load_cluster("1x8-l4")
    free = search_serving(cfg, cluster, ServeJob(Workload(1024, 256)), engine=engine_spec("vllm"),
                          weights=weight_format("fp8"), kv_bytes=2.0, tp=2, pp=4).plans[0]
    limit = free.steady.tpot_s / 2
    tight = search_serving(cfg, cluster, ServeJob(Workload(1024, 256), max_tpot_s=limit), engine=engine_spec("vllm"),
                           weights=weight_format("fp8"), kv_bytes=2.0, tp=2, pp=4).plans[0]
    assert tight.steady.tpot_s <= limit < free.steady.tpot_s
    assert tight.batch < free.batch


def test_request_rate_picks_the_smallest_batch_that_carries_it():
    cfg = load_transformer(resolve("model", "llama3-8b"))
    cluster = load_cluster("1x8-l4")
    rate = 2.0
    r = search_serving(cfg, cluster, ServeJob(Workload(512, 128), request_rate=rate), engine=engine_spec("vllm"),
                       weights=weight_format("bf16"), kv_bytes=2.0, tp=1, pp=1)
    p = r.plans[0]
    assert not p.saturated
    per_replica = rate / p.replicas * 128
    pipe, _ = pipeline_for(cfg, cluster, 1, 1, weight_format("bf16"), 2.0, engine_spec("vllm"), GIB)
    assert p.steady.output_tokens_per_s >= per_replica
    if p.batch > 1:
        assert pipe.steady_state(p.split, p.batch - 1, Workload(512, 128)).output_tokens_per_s < per_replica


def test_serve_70b_on_2x8_gpus_plans():
    """A 70B model on 16 GPUs gets plans (its search speed is measured by
    benchmarks/bench_serve.py, not here)."""
    cfg = load_transformer(resolve("model", "llama3-70b"))
    cluster = load_cluster("2x8-a100-80gb")
    r = search_serving(cfg, cluster, ServeJob(Workload(2048, 512)), engine=engine_spec("vllm"),
                       weights=weight_format("bf16"), kv_bytes=2.0)
    assert r.evaluated >= 10 and r.plans


def test_rate_beyond_capacity_is_marked_saturated():
    cfg = load_transformer(resolve("model", "llama3-70b"))
    cluster = load_cluster("1x8-l4")
    r = search_serving(cfg, cluster, ServeJob(Workload(1024, 256), request_rate=1000.0), engine=engine_spec("vllm"),
                       weights=weight_format("fp8"), kv_bytes=2.0)
    assert all(p.saturated for p in r.plans)
    # saturated plans rank by the throughput they do reach
    totals = [p.total_output_tokens_per_s for p in r.plans]
    assert totals == sorted(totals, reverse=True)


def test_concurrency_caps_the_batch_per_replica():
    cfg = load_transformer(resolve("model", "llama3-8b"))
    cluster = load_cluster("1x8-l4")
    r = search_serving(cfg, cluster, ServeJob(Workload(512, 128), concurrency=20), engine=engine_spec("vllm"),
                       weights=weight_format("bf16"), kv_bytes=2.0)
    for p in r.plans:
        assert p.batch <= -(-20 // p.replicas)


def test_huggingface_config_is_served(tmp_path):
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 8192, "tie_word_embeddings": False}))
    cfg = load_transformer(cfg_path)
    r = search_serving(cfg, load_cluster("1x8-l4"), ServeJob(Workload(512, 128)), engine=engine_spec("sglang"),
                       weights=weight_format("bf16"), kv_bytes=1.0)
    assert r.plans and all(sum(p.split) == 32 for p in r.plans)


@pytest.mark.parametrize("name_or_path", [None, "meta-llama/Meta-Llama-3-8B"])
def test_huggingface_config_commands_name_a_loadable_model(tmp_path, monkeypatch, name_or_path):
    """`serve --model config.json` (a relative path, as a user types it in the
    checkpoint's folder): the engine commands load the config's
    ``_name_or_path`` (a Hub id) or else the folder that holds it, never the
    file's stem 'config'; the plans are named after the folder."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    folder = tmp_path / "Llama-3-8B"
    folder.mkdir()
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192, "tie_word_embeddings": False}
    if name_or_path:
        cfg["_name_or_path"] = name_or_path
    (folder / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(folder)
    res = CliRunner().invoke(main, ["serve", "--model", "config.json", "--cluster", "1x8-l4", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    export = doc["plans"][0]["exports"]["vllm"]
    want = name_or_path or str(folder.resolve())
    assert export["argv"][:3] == ["vllm", "serve", want], export["command"]
    assert f" vllm serve {want} " in f" {export['command']}", export["command"]
    assert doc["inputs"]["model"]["name"] == (name_or_path.rsplit("/", 1)[-1] if name_or_path else "Llama-3-8B")


def test_serve_refuses_a_context_beyond_a_huggingface_config(tmp_path):
    """A LLaMA config.json (rotary positions) carries its context in
    ``max_position_embeddings`` (2048 here): 1792 + 256 tokens fit and the
    engine gets ``--max-model-len 2048``; 4096 + 256 are refused with exit
    2 naming the context, as for a catalog model (the limit was dropped for
    rotary configs, and an engine would refuse the command)."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    cfg = {"model_type": "llama", "num_hidden_layers": 6, "hidden_size": 2048, "num_attention_heads": 32,
           "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000,
           "max_position_embeddings": 2048, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    base = ["serve", "--model", str(path), "--cluster", "1x8-l4", "--output-len", "256", "--json", "--input-len"]
    res = CliRunner().invoke(main, base + ["1792"])
    assert res.exit_code == 0, res.output
    assert "--max-model-len 2048" in json.loads(res.stdout)["plans"][0]["exports"]["vllm"]["command"]
    res = CliRunner().invoke(main, base + ["4096"])
    assert res.exit_code == 2 and "context of 2048 (its position limit" in res.output, res.output
    # linear rope scaling by 4: the engine serves 8192 tokens from it, so nothing is refused here
    path.write_text(json.dumps(cfg | {"rope_scaling": {"type": "linear", "factor": 4.0}}))
    res = CliRunner().invoke(main, base + ["4096"])
    assert res.exit_code == 0, res.output


def test_batch_stays_below_the_step_token_budget():
    """Every running sequence decodes one token a step and a prompt chunk
    needs one more beside them, so a replica runs at most
    ``max_num_batched_tokens - 1`` sequences (vLLM refuses --max-num-seqs
    above --max-num-batched-tokens); a budget of 1 is refused."""
    cfg = load_transformer(resolve("model", "qwen3-1.7b"))
    cluster = load_cluster("1x8-a100-80gb")
    r = search_serving(cfg, cluster, ServeJob(Workload(256, 256)), engine=engine_spec("vllm", max_num_seqs=4096,
                       max_num_batched_tokens=100), weights=weight_format("bf16"), kv_bytes=2.0, top=3)
    assert r.plans and all(p.batch <= 99 and p.max_num_seqs <= 99 for p in r.plans)
    with pytest.raises(InputError, match="max-num-batched-tokens 1"):
        engine_spec("vllm", max_num_batched_tokens=1)


def test_request_rate_plan_lets_the_engine_run_bursts():
    """Under a request rate the plan's figures are at the rate's batch, but
    the engine's running limit is the largest batch the KV pool, the engine
    and the token budget allow (here no latency limit): min(256, 2047,
    pool // 640), 640 = (512 + 128) tokens in whole 16-token blocks. With a
    TPOT limit it is the largest batch whose closed-form TPOT meets it, the
    TPOT under the rate (each of the 8 replicas' share of it: the other
    requests' prompts come at the rate, whatever the batch)."""
    cfg = load_transformer(resolve("model", "llama3-8b"))
    cluster = load_cluster("1x8-l4")
    w = Workload(512, 128)
    eng = engine_spec("vllm")
    p = search_serving(cfg, cluster, ServeJob(w, request_rate=2.0), engine=eng, weights=weight_format("bf16"),
                       kv_bytes=2.0, tp=1, pp=1).plans[0]
    assert p.max_num_seqs == min(256, 2047, p.pool_tokens // 640) > p.batch
    pipe, _ = pipeline_for(cfg, cluster, 1, 1, weight_format("bf16"), 2.0, eng, GIB)
    assert p.replicas == 8
    at_rate = Workload(512, 128, arrival_rate_per_s=2.0 / 8)
    limit = pipe.steady_state(p.split, p.batch + 10, at_rate).tpot_s
    q = search_serving(cfg, cluster, ServeJob(w, request_rate=2.0, max_tpot_s=limit), engine=eng,
                       weights=weight_format("bf16"), kv_bytes=2.0, tp=1, pp=1).plans[0]
    assert pipe.steady_state(q.split, q.max_num_seqs, at_rate).tpot_s <= limit
    assert pipe.steady_state(q.split, q.max_num_seqs + 1, at_rate).tpot_s > limit


def test_plans_the_simulation_finds_short_of_the_rate_rank_last():
    """Two plans under a rate: the one with the lower simulated TPOT falls
    short of the rate in the simulation (``carries_rate`` False), so the
    other ranks first."""
    from dataclasses import replace

    from pipesearch.serve.search import rerank_by_simulation

    cfg = load_transformer(resolve("model", "llama3-8b"))
    p = search_serving(cfg, load_cluster("1x8-l4"), ServeJob(Workload(512, 128), request_rate=2.0),
                       engine=engine_spec("vllm"), weights=weight_format("bf16"), kv_bytes=2.0, tp=1, pp=1).plans[0]
    short = replace(p, simulated={"tpot_mean_s": 0.01, "carries_rate": False})
    carries = replace(p, tp=2, simulated={"tpot_mean_s": 0.02, "carries_rate": True})
    ranked = rerank_by_simulation([short, carries], rate_given=True)
    assert [x.tp for x in ranked] == [2, 1] and [x.rank for x in ranked] == [1, 2]
    # both carry it; the faster one's simulated means miss the latency limits: the other ranks first
    fast = replace(p, simulated={"tpot_mean_s": 0.01, "carries_rate": True, "meets_limits": False})
    meets = replace(p, tp=2, simulated={"tpot_mean_s": 0.02, "carries_rate": True, "meets_limits": True})
    assert [x.tp for x in rerank_by_simulation([fast, meets], rate_given=True)] == [2, 1]
    fast = replace(fast, simulated={"total_output_tokens_per_s": 900.0, "meets_limits": False})
    meets = replace(meets, simulated={"total_output_tokens_per_s": 800.0, "meets_limits": True})
    assert [x.tp for x in rerank_by_simulation([fast, meets], rate_given=False)] == [2, 1]


def test_unmeetable_latency_limit_is_named_before_memory():
    """Llama-3-70B on 8 L4 (24 GB): tp x pp of 1 or 2 devices cannot hold
    its 141 GB of bf16 weights, the others fit but no batch meets a TPOT of
    0.1 ms (one decode step reads at least the weights: 141 GB / 8 / 300
    GB/s, about 60 ms). The refusal names the limit that binds."""
    from pipesearch.errors import InfeasibleError

    cfg = load_transformer(resolve("model", "llama3-70b"))
    with pytest.raises(InfeasibleError, match="no batch meets --max-ttft-ms / --max-tpot-ms") as info:
        search_serving(cfg, load_cluster("1x8-l4"), ServeJob(Workload(512, 128), max_tpot_s=1e-4),
                       engine=engine_spec("vllm"), weights=weight_format("bf16"), kv_bytes=2.0)
    assert "out_of_memory" in str(info.value) and "latency_limits" in str(info.value)


def test_the_step_budget_bounds_the_batch_it_sustains():
    """A request takes input + output = 1,280 tokens of the step budget over
    its life, 256 of them decodes: 16 tokens a step sustain 16 x 256 /
    1,280 = 3.2 decoding sequences on one stage, so the batch is at most 3
    (the closed form ran 15 and predicted 4x the simulated throughput)."""
    cfg = load_transformer(resolve("model", "llama3-8b"))
    r = search_serving(cfg, load_cluster("1x8-l4"), ServeJob(Workload(1024, 256)),
                       engine=engine_spec("vllm", max_num_batched_tokens=16), weights=weight_format("bf16"),
                       kv_bytes=2.0, tp=1, pp=1)
    assert r.plans[0].batch == 3


def test_a_learned_position_models_context_names_the_serve_options(tmp_path):
    """GPT-3's learned position table (2048 positions) refused a 2049-token
    request as "key 'seq_len (--seq-len)' = 2049 exceeds ...", an option
    serve has not: it is refused as for a rotary model, naming --input-len
    and --output-len and the sum that fits."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    res = CliRunner().invoke(main, ["serve", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "--input-len",
                                    "2048", "--output-len", "1"])
    assert res.exit_code == 2, res.output
    assert "--input-len 2048 + --output-len 1 = 2049 tokens is more than gpt3-1.3b's context of 2048" in res.output
    assert "--seq-len" not in res.output
    # the same model in a TOML without seq_len (which serve does not need) is refused the same way
    root = Path(__file__).resolve().parents[1]
    text = (root / "cost_models" / "gpt3-1.3b.toml").read_text()
    model = tmp_path / "g.toml"
    model.write_text("\n".join(x for x in text.splitlines() if not x.startswith("seq_len")) + "\n")
    res = CliRunner().invoke(main, ["serve", "--model", str(model), "--cluster", "1x8-a100-80gb", "--input-len",
                                    "2048", "--output-len", "1"])
    assert res.exit_code == 2 and "= 2049 tokens is more than g's context of 2048" in res.output, res.output
    assert "--seq-len" not in res.output


def test_a_transformer_toml_without_seq_len_serves_and_plans_with_seq_len(tmp_path):
    """seq_len is a training length: serve takes a request's tokens as its
    length and refused a TOML without one; plan refuses it naming the
    option that gives one, and plans with --seq-len."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    root = Path(__file__).resolve().parents[1]
    text = (root / "cost_models" / "llama3-8b.toml").read_text()
    lines = [x for x in text.splitlines() if not x.startswith("seq_len")]
    assert len(lines) == len(text.splitlines()) - 1
    path = tmp_path / "m.toml"
    path.write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(main, ["serve", "--model", str(path), "--simulate-top", "0", "--top", "1"])
    assert r.exit_code == 0, r.output
    base = ["plan", "--model", str(path), "--cluster", "1x8-a100-80gb", "-b", "64", "-q", "--top", "1"]
    r = CliRunner().invoke(main, base)
    assert r.exit_code == 2 and "missing key 'transformer.seq_len'" in r.output and "--seq-len" in r.output
    assert CliRunner().invoke(main, base + ["--seq-len", "2048"]).exit_code == 0


def test_split_written_as_the_table_writes_it():
    """``--split`` takes a run of K equal stages as ``N*K``, the notation the
    table uses for long splits: ``16*2`` is ``16,16``; a part with replicas
    (a training split's ``NxR``) is refused with the serving form."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    base = ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--pp", "2", "--simulate-top", "0", "--json"]
    a = CliRunner().invoke(main, base + ["--split", "16*2"])
    b = CliRunner().invoke(main, base + ["--split", "16,16"])
    assert a.exit_code == b.exit_code == 0, a.output
    assert json.loads(a.stdout)["plans"][0]["layers_per_stage"] == [16, 16]
    assert json.loads(a.stdout)["plans"] == json.loads(b.stdout)["plans"]
    r = CliRunner().invoke(main, base + ["--split", "16x2,16"])
    assert r.exit_code == 2 and "expected decoder layers per stage like 20,21,21,18" in r.output
