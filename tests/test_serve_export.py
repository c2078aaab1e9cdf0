"""vLLM / SGLang exports of serving plans: the format the engines read
(``get_pp_indices`` of each engine: p integers summing to the decoder
layers), refusals, and the command line end to end."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from pipesearch.catalog import resolve
from pipesearch.cli import main
from pipesearch.errors import InputError
from pipesearch.profiles.transformer import load_transformer
from pipesearch.serve.export import engine_refusal, parse_partition


def llama3():
    return load_transformer(resolve("model", "llama3-70b"))


def test_engine_refusals():
    cfg = llama3()  # 64 query heads, 8 KV heads, FFN 28672, vocabulary 128256
    assert engine_refusal(cfg, 8, 10) is None
    assert "num_attention_heads 64" in engine_refusal(cfg, 3, 1)
    assert "exceeds the 80 decoder layers" in engine_refusal(cfg, 1, 81)
    gqa = load_transformer(resolve("model", "llama3-8b"))  # 32 heads, 8 KV heads
    assert engine_refusal(gqa, 16, 1) is None  # 16 ranks, each holding one replicated KV head
    assert engine_refusal(gqa, 32, 1) is None


def test_partition_round_trip_and_the_engines_checks():
    assert parse_partition("11,13,12,12", 48, 4, "vllm") == (11, 13, 12, 12)
    with pytest.raises(InputError, match="VLLM_PP_LAYER_PARTITION=11,13,12: 3 entries but pp is 4"):
        parse_partition("11,13,12", 36, 4, "vllm")
    with pytest.raises(InputError, match="sums to 47"):
        parse_partition("11,12,12,12", 48, 4, "sglang")
    with pytest.raises(InputError, match="invalid partition"):
        parse_partition("11;13", 24, 2, "vllm")


def _run(args, tmp_path):
    out = tmp_path / "serve.json"
    r = CliRunner().invoke(main, ["serve", *args, "-o", str(out), "--simulate-top", "1", "--num-requests", "60"])
    return r, out


def test_cli_writes_plans_with_both_engines_commands(tmp_path):
    r, out = _run(["--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8", "--tp", "1", "--pp", "8",
                   "--input-len", "1024", "--output-len", "128"], tmp_path)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "pipesearch.serve/1"
    plan = doc["plans"][0]
    split = plan["layers_per_stage"]
    assert sum(split) == 80 and len(split) == 8
    assert plan["stages"][0]["embedding"] and plan["stages"][-1]["head"]
    assert plan["kv_pool_tokens"] == min(s["kv_tokens"] for s in plan["stages"])
    assert plan["kv_pool_tokens"] > plan["engine_default"]["kv_pool_tokens"]
    assert plan["simulated"]["requests"] == 60
    v = plan["exports"]["vllm"]
    assert v["env"]["VLLM_PP_LAYER_PARTITION"] == ",".join(map(str, split))
    argv = v["argv"]
    assert argv[:3] == ["vllm", "serve", "llama3-70b"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "8"
    assert argv[argv.index("--quantization") + 1] == "fp8"
    assert shlex.split(v["command"])[0] == f"VLLM_PP_LAYER_PARTITION={','.join(map(str, split))}"
    # the engine's own check of the variable accepts it
    assert parse_partition(v["env"]["VLLM_PP_LAYER_PARTITION"], 80, 8, "vllm") == tuple(split)
    s = plan["exports"]["sglang"]
    assert s["env"]["SGLANG_PP_LAYER_PARTITION"] == ",".join(map(str, split))
    assert s["argv"][s["argv"].index("--tp-size") + 1] == "1" and s["argv"][s["argv"].index("--pp-size") + 1] == "8"
    assert "VLLM_PP_LAYER_PARTITION=" in r.output and "vs default" in r.output
    # the model's name in pipesearch is no checkpoint an engine can load: both commands say to replace it
    for engine in ("vllm", "sglang"):
        assert any("llama3-70b is the model's name in pipesearch" in n for n in plan["exports"][engine]["notes"])


def test_the_other_engine_s_command_runs_what_its_own_memory_holds(tmp_path):
    """SGLang and vLLM set the KV pool apart differently: on L4s Llama-3 8B
    at tp 1 x pp 2 holds 149 running sequences under SGLang and 148 under
    vLLM (each engine's own plan of the same tp, pp, split and step budget,
    2048 tokens, says so), and the vLLM command written into the SGLang plan
    asked for 149. Each command now asks for what its engine holds, at most
    the plan's limit."""
    def plan(engine):
        out = tmp_path / f"{engine}.json"
        res = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--tp", "1", "--pp",
                                        "2", "--engine", engine, "--max-num-batched-tokens", "2048", "--top", "1",
                                        "-q", "-o", str(out)])
        assert res.exit_code == 0, res.output
        return json.loads(out.read_text())["plans"][0]

    vllm, sglang = plan("vllm"), plan("sglang")
    assert vllm["max_num_seqs"] < sglang["max_num_seqs"]  # the case: vLLM holds fewer

    def limit(p, engine, flag):
        argv = p["exports"][engine]["argv"]
        return int(argv[argv.index(flag) + 1])

    assert limit(sglang, "vllm", "--max-num-seqs") == vllm["max_num_seqs"]
    assert limit(sglang, "sglang", "--max-running-requests") == sglang["max_num_seqs"]
    assert limit(vllm, "sglang", "--max-running-requests") == vllm["max_num_seqs"]  # the plan's limit binds


def test_a_given_model_path_goes_in_the_commands_without_the_catalog_note(tmp_path):
    r, out = _run(["--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8", "--tp", "1", "--pp", "8",
                   "--input-len", "1024", "--output-len", "128", "--model-path", "meta-llama/Meta-Llama-3-70B"],
                  tmp_path)
    assert r.exit_code == 0, r.output
    v = json.loads(out.read_text())["plans"][0]["exports"]["vllm"]
    assert v["argv"][:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3-70B"]
    assert not any("name in pipesearch" in n for n in v["notes"])


@pytest.mark.parametrize("args,needle", [
    (["--tp", "3"], "--tp 3"),
    (["--concurrency", "4", "--request-rate", "1"], "give one"),
    (["--model", "vgg16"], "layer profile"),
    (["--split", "10,10"], "summing to 80"),
    (["--model", "llama2-70b", "--cluster", "1x8-l4", "--tp", "1", "--pp", "1"], "no serving plan"),
    (["--cluster", "mixed-a100-v100"], "one device type"),
    (["--pp", "9"], "--pp 9: tp x pp must fit in the 8 devices"),
    (["--memory-reserve", "-1GiB"], "a size must not be negative"),
    # V100 (compute capability 7.0): no engine loads FP8 weights there
    (["--cluster", "2x8-v100-nvlink-25gbe", "--weight-dtype", "fp8"], "v100-16gb (compute capability 7.0)"),
    # the engines would read these as an option, an empty argument, the end of the shell line
    (["--model-path", "--help"], "--model-path '--help': starts with '-'"),
    (["--model-path", " "], "--model-path ' ': blank"),
    (["--model-path", "a\nb"], "holds a control character"),
    # simulated arrivals so far apart that a step vanished in their sum (TPOT 11 ms read as 1 ms)
    (["--request-rate", "1e-13"], "'--request-rate': 1e-13 is not in the range"),
    (["--step-overhead-ms", "1e300"], "'--step-overhead-ms'"),
    # the reserve blamed alone for a fraction that leaves nothing
    (["--memory-fraction", "1e-300"], "at a memory fraction of 1e-300"),
])
def test_cli_bad_input_one_line_exit_2(tmp_path, args, needle):
    r, out = _run(args, tmp_path)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.output
    assert not out.exists()


def test_a_model_file_of_another_kind_is_named_as_such(tmp_path):
    """A HuggingFace config saved without its .json extension, or any other
    file, is named as neither a .toml nor a .json file (not as a layer
    profile, which a .csv is), with the fix: name it so."""
    config = tmp_path / "cfgnoext"
    config.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    r, out = _run(["--model", str(config)], tmp_path)
    assert r.exit_code == 2 and "cfgnoext is neither a .toml nor a .json file (its name has no extension)" in r.output
    assert "layer profile" not in r.output and "named so" in r.output and not out.exists()
    csv = tmp_path / "m.csv"
    csv.write_text("name,fwd_ms,bwd_ms\nl0,1,2\n")
    r, _ = _run(["--model", str(csv)], tmp_path)
    assert r.exit_code == 2 and "m.csv is a layer profile" in r.output


def test_a_config_of_too_many_layers_to_split_is_refused_before_the_search(tmp_path):
    """100,000 decoder layers reached the split search and failed there on
    a 74.5 GiB allocation, naming a knob of `plan`."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 100_000, "hidden_size": 4096,
                                  "intermediate_size": 11008, "num_attention_heads": 32, "vocab_size": 32000,
                                  "max_position_embeddings": 4096}))
    r, out = _run(["--model", str(config), "--cluster", "1x4-v100-pcie"], tmp_path)
    assert r.exit_code == 2 and "100000 decoder layers; serving plans split at most 4096" in r.output, r.output
    assert not out.exists()


def test_cli_timeline_needs_a_simulation(tmp_path):
    out = tmp_path / "serve.json"
    r = CliRunner().invoke(main, ["serve", "--timeline", str(tmp_path / "t.png"), "--simulate-top", "0",
                                  "-o", str(out)])
    assert r.exit_code == 2 and "--simulate-top 1" in r.output
    assert not out.exists() and not (tmp_path / "t.png").exists()


def test_vllm_parser_accepts_the_exported_arguments(tmp_path):
    cli_args = pytest.importorskip("vllm.entrypoints.openai.cli_args")
    from vllm.utils import FlexibleArgumentParser

    r, out = _run(["--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8"], tmp_path)
    assert r.exit_code == 0, r.output
    argv = json.loads(out.read_text())["plans"][0]["exports"]["vllm"]["argv"]
    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", argv[2], *argv[3:]])
    assert ns.tensor_parallel_size == int(argv[argv.index("--tensor-parallel-size") + 1])
    assert ns.pipeline_parallel_size == int(argv[argv.index("--pipeline-parallel-size") + 1])


def test_cli_request_rate_json_and_timeline(tmp_path):
    png = tmp_path / "tl.png"
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--request-rate", "3",
                                  "--input-len", "512", "--output-len", "64", "--num-requests", "80",
                                  "--simulate-top", "1", "--timeline", str(png), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["inputs"]["workload"]["request_rate"] == 3
    plan = doc["plans"][0]
    assert not plan["predicted"]["saturated"]
    # a plan that carries the rate: each replica's share of 3 req/s x 64 tokens
    per_replica = 3 / plan["parallelism"]["replicas"] * 64
    assert plan["predicted"]["output_tokens_per_s_per_replica"] >= per_replica
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_multi_node_replica_and_dtype_flags(tmp_path):
    r, out = _run(["--model", "llama2-70b", "--cluster", "2x8-a100-80gb", "--tp", "8", "--pp", "2",
                   "--weight-dtype", "int4", "--kv-dtype", "fp8"], tmp_path)
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())["plans"][0]
    assert plan["parallelism"] == {"tp": 8, "pp": 2, "replicas": 1}
    v, s = plan["exports"]["vllm"], plan["exports"]["sglang"]
    assert v["nodes_per_replica"] == 2 and "--distributed-executor-backend" in v["argv"]
    assert v["argv"][v["argv"].index("--kv-cache-dtype") + 1] == "fp8" and "--quantization" not in v["argv"]
    assert any("4-bit" in n for n in v["notes"])
    assert s["argv"][s["argv"].index("--nnodes") + 1] == "2"
    assert s["argv"][s["argv"].index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    # the stage boundary crosses the nodes: 8 x A100 per node, stage 1 on the second node
    assert plan["stages"][1]["devices"] == list(range(8, 16))


def test_devices_without_bf16_serve_the_model_in_fp16(tmp_path):
    """V100 has no bf16 (compute capability 7.0; the engines refuse a bf16
    run there): both commands say --dtype half and the header says fp16;
    on A100 (8.0) neither does."""
    for cluster, half in (("2x8-v100-nvlink-25gbe", True), ("1x8-a100-80gb", False)):
        r, out = _run(["--model", "llama3-8b", "--cluster", cluster, "--top", "1"], tmp_path)
        assert r.exit_code == 0, r.output
        plan = json.loads(out.read_text())["plans"][0]
        for engine in ("vllm", "sglang"):
            argv = plan["exports"][engine]["argv"]
            assert (argv[argv.index("--dtype") + 1] == "half") if half else "--dtype" not in argv, (cluster, argv)
        r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", cluster, "--top", "1"])
        assert ("weights fp16 (no bf16 on these devices), KV fp16" in r.output) == half, r.output


def test_simulated_plans_are_reranked_by_the_simulation(tmp_path):
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-70b", "--cluster", "1x8-l4", "--weight-dtype", "fp8",
                                  "--simulate-top", "3", "--num-requests", "80", "--json"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    assert [p["rank"] for p in plans] == list(range(1, len(plans) + 1))
    sim = [p["simulated"]["output_tokens_per_s"] * p["parallelism"]["replicas"] for p in plans[:3]]
    assert sim == sorted(sim, reverse=True)
    assert all(p["simulated"] is None for p in plans[3:])


def test_concurrency_spread_over_replicas_serves_only_the_clients_given():
    """A closed loop of C clients over R replicas (tp 2 on 8 L4s: R = 4)
    keeps C mod R replicas one client busier than the rest, never more
    sequences in flight than C: with 3 clients one replica idles, so the
    total is 3 of a 4-client run's (each replica at batch 1); with 6, two
    replicas run 2 and two run 1, the mean of the 4- and 8-client totals
    (every replica at 1, at 2). The same holds for the simulated totals.
    (The step budget is pinned: every replica runs the same command, and
    a budget planned for the busier replicas' batch would differ from the
    4- and 8-client runs' own.)"""
    def run(c):
        r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--tp", "2",
                                      "--pp", "1", "--concurrency", str(c), "--num-requests", "80",
                                      "--max-num-batched-tokens", "2048", "--json"])
        assert r.exit_code == 0, r.output
        p = json.loads(r.output)["plans"][0]
        return p["predicted"]["output_tokens_per_s"], p["simulated"]["total_output_tokens_per_s"], p["batch"]

    (t3, s3, b3), (t4, s4, b4), (t6, s6, b6), (t8, s8, b8) = run(3), run(4), run(6), run(8)
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--tp", "2", "--pp", "1",
                                  "--concurrency", "3", "--simulate-top", "0", "--json"])
    exp = json.loads(r.output)["plans"][0]["exports"]["vllm"]
    notes = exp["notes"]
    assert exp["replicas"] == 3
    run = [n for n in notes if n.startswith("run 3 replicas (2 devices each) behind a load balancer")]  # not 4
    assert len(run) == 1 and "CUDA_VISIBLE_DEVICES=0,1, then 2,3, ..." in run[0] and "--port 8000, 8001" in run[0]
    assert any("3 of the 4 replicas busy" in n and "(2 devices) would stay idle" in n for n in notes)
    assert (b3, b4, b6, b8) == (1, 1, 2, 2)
    assert t3 == pytest.approx(0.75 * t4, rel=1e-12) and s3 == pytest.approx(0.75 * s4, rel=1e-12)
    assert t6 == pytest.approx((t4 + t8) / 2, rel=1e-12) and s6 == pytest.approx((s4 + s8) / 2, rel=1e-12)


def test_a_request_rate_no_plan_carries_is_said_in_words():
    """100 requests/s x 256 output tokens = 25,600 tok/s, beyond what 8 L4s
    serve Llama 3 8B at: every row is starred and one line says why (the
    stars alone went unexplained); a rate of 0.5 is carried, no such line."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--request-rate", "100",
                                  "--simulate-top", "0", "--top", "2"])
    assert r.exit_code == 0, r.output
    assert "*: plans 1, 2 cannot carry --request-rate 100 (25,600 output tok/s wanted)" in r.output
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--request-rate", "0.5",
                                  "--simulate-top", "0", "--top", "2"])
    assert r.exit_code == 0 and "cannot carry" not in r.output, r.output


def test_a_carried_rate_is_judged_against_the_arrivals_drawn():
    """One request a second on 8 L4s is far below capacity; a run of 400
    requests whose Poisson arrivals happened to be fewer (seed 3: 225 output tok/s
    against 256 nominal) still carries them all: no flag, and the run
    reports the offered load it drew."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--request-rate", "1",
                                  "--simulate-top", "1", "--top", "1", "--seed", "3", "--num-requests", "400",
                                  "--json"])
    assert r.exit_code == 0, r.output
    sim = json.loads(r.output)["plans"][0]["simulated"]
    assert sim["carries_rate"] and sim["output_tokens_per_s"] < 0.95 * 256
    assert sim["output_tokens_per_s"] >= 0.95 * sim["offered_output_tokens_per_s"]


def test_a_rate_run_is_long_enough_to_carry_about_the_mean_rate():
    """Under --request-rate the simulated throughput is what the run's own
    Poisson arrivals asked for in its window: 400 requests drew 9% under
    the mean (2,325 of 2,560 tok/s on Llama-3 8B at 20 req/s, unexplained,
    as if no plan carried the load). A run of 2,000 requests per replica
    draws within 3% of it, and a line gives the draw against the mean."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-a100-80gb", "--input-len", "512",
                                  "--output-len", "128", "--request-rate", "20", "--top", "1", "--simulate-top", "1"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("sim tok/s under --request-rate 20"))
    assert "(on average 2,560;" in line
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-a100-80gb", "--input-len", "512",
                                  "--output-len", "128", "--request-rate", "20", "--top", "1", "--simulate-top", "1",
                                  "--json"])
    plan = json.loads(r.output)["plans"][0]
    assert plan["simulated"]["requests"] == 2000
    assert abs(plan["simulated"]["total_output_tokens_per_s"] - 2560) <= 0.03 * 2560


def test_simulation_runs_the_batch_the_plan_exports():
    """64 clients, a 25 ms TPOT limit: the plan runs 12 sequences
    (--max-num-seqs 12 in its command), so its simulation never runs more
    (it ran all 64, at twice the allowed TPOT); the other clients queue."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--tp", "8", "--pp", "1",
                                  "--concurrency", "64", "--max-tpot-ms", "25", "--num-requests", "200", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    assert f"--max-num-seqs {p['batch']}" in p["exports"]["vllm"]["command"] and p["batch"] < 64
    assert p["simulated"]["max_running"] <= p["batch"]
    assert p["simulated"]["tpot_p90_s"] <= 0.025 * 1.05


def test_memory_reserve_is_refused_for_sglang():
    """SGLang sizes its pool by --mem-fraction-static alone: a --memory-reserve
    given with --engine sglang is refused (it changed nothing: the same pool
    with 0 and 10 GiB), and the default applies to vLLM only."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    args = ["serve", "--model", "qwen3-1.7b", "--cluster", "1x8-l4", "--tp", "1", "--pp", "2", "--simulate-top", "0",
            "--json"]
    res = CliRunner().invoke(main, args + ["--engine", "sglang", "--memory-reserve", "10GiB"])
    assert res.exit_code == 2 and "--memory-reserve 10GiB with --engine sglang" in res.output
    assert "Traceback" not in res.output
    assert CliRunner().invoke(main, args + ["--engine", "sglang"]).exit_code == 0


def test_out_of_memory_with_a_raised_step_names_it():
    """A step of 100,000 running sequences needs their fp32 logits on the
    last stage: the refusal names --max-num-seqs and --max-num-batched-tokens
    (it named only the weights and the KV cache)."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    res = CliRunner().invoke(main, ["serve", "--model", "qwen3-1.7b", "--cluster", "1x8-l4", "--tp", "1", "--pp", "1",
                                    "--max-num-seqs", "100000", "--max-num-batched-tokens", "200000",
                                    "--simulate-top", "0"])
    assert res.exit_code == 2 and "lower --max-num-seqs 100000 and --max-num-batched-tokens 200000" in res.output


HF_8B = {"_name_or_path": "org/llama-3-8b-quant", "model_type": "llama", "hidden_size": 4096,
         "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
         "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}


@pytest.mark.parametrize("quantization,given,expect", [
    ({"quant_method": "fp8"}, None, "fp8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, None, "int4"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4", "int4"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}, None, "fp8"),
    ({"quant_method": "fp8"}, "int4", "error: --weight-dtype int4, but"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, None, "is not a weight format pipesearch sizes"),
    ({"quant_method": "gptq", "bits": 8}, None, "is not a weight format pipesearch sizes"),
])
def test_a_quantized_checkpoint_is_planned_in_its_own_format(tmp_path, quantization, given, expect):
    """A HuggingFace config's quantization_config is the format the engine
    loads: planned in it (the weights' bytes: 8B at fp8 about half of
    bf16's), a contradicting --weight-dtype refused, a format these costs do
    not size refused unless --weight-dtype says which to plan."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(HF_8B | {"quantization_config": quantization}))
    r, out = _run(["--model", str(cfg), "--cluster", "1x8-a100-80gb", "--top", "1"]
                  + (["--weight-dtype", given] if given else []), tmp_path)
    if " " in expect:
        assert r.exit_code == 2 and expect in r.output and not out.exists(), r.output
        return
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["inputs"]["workload"]["weight_dtype"] == expect
    sub = tmp_path / "plain"
    sub.mkdir()
    plain = sub / "config.json"
    plain.write_text(json.dumps(HF_8B))
    r2, out2 = _run(["--model", str(plain), "--cluster", "1x8-a100-80gb", "--top", "1"], sub)
    assert r2.exit_code == 0, r2.output
    w_q = doc["plans"][0]["stages"][0]["weight_bytes"]
    w_b = json.loads(out2.read_text())["plans"][0]["stages"][0]["weight_bytes"]
    assert w_q < 0.6 * w_b


def test_a_plan_file_given_as_the_model_is_named_as_such(tmp_path):
    """A serving or training plan file passed as --model: one line saying it
    is pipesearch's output, not a model config (it read as a config of
    unknown model_type)."""
    serve_out = tmp_path / "s.json"
    assert CliRunner().invoke(main, ["serve", "--top", "1", "--simulate-top", "0", "-o", str(serve_out)]).exit_code == 0
    plan_out = tmp_path / "p.json"
    assert CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "64",
                                     "--pp", "2", "--top", "1", "-q", "-o", str(plan_out)]).exit_code == 0
    for path, tag in ((serve_out, "pipesearch.serve/1"), (plan_out, "pipesearch.plan/1")):
        r = CliRunner().invoke(main, ["serve", "--model", str(path), "--cluster", "1x8-a100-80gb"])
        assert r.exit_code == 2 and f"a pipesearch output ({tag}), not a model config" in r.output, r.output


def test_a_pinned_pipeline_that_does_not_divide_the_cluster_runs_with_devices_idle(tmp_path):
    """vLLM runs pp 3 on eight GPUs (two replicas of three, two GPUs idle):
    the pin was refused ('does not divide'); it is planned, and the output
    says how many devices stay idle."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--tp", "1", "--pp", "3",
                                  "--simulate-top", "0"])
    assert r.exit_code == 0, r.output
    assert "    1   1 x 3 x 2" in r.output
    assert "plan 1 uses 6 of the 8 devices (tp x pp x replicas); 2 stay idle" in r.output


def test_replicas_that_leave_devices_idle_stay_inside_nodes():
    """tp 2 x pp 3 on four nodes of eight H100: one replica of six per node
    (four, eight devices idle; a fifth would straddle two nodes, and the
    command ran as if one; the note's device list crashed there), each
    replica's stages on devices 0-5 of its node; tp 4 x pp 3 (12, more than
    a node) is refused."""
    from pipesearch.hardware import load_cluster
    from pipesearch.serve.search import replica_count, replica_device

    cluster = load_cluster("4x8-h100")
    assert replica_count(cluster, 2, 3) == 4 and replica_count(cluster, 1, 3) == 8 and replica_count(cluster, 4, 3) == 0
    assert [replica_device(cluster, 2, 3, 1, s) for s in range(3)] == [8, 10, 12]
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "4x8-h100", "--tp", "2", "--pp", "3",
                                  "--simulate-top", "0", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    assert p["parallelism"] == {"tp": 2, "pp": 3, "replicas": 4}
    assert [s["devices"] for s in p["stages"]] == [[0, 1], [2, 3], [4, 5]]
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--cluster", "4x8-h100", "--tp", "4", "--pp", "3"])
    assert r.exit_code == 2 and "a replica that leaves devices idle must fit in a node" in r.output


def test_the_other_engines_command_keeps_the_pinned_settings():
    """A pinned step budget and memory fraction hold in both engines'
    commands: the SGLang command of a vLLM plan at --max-num-batched-tokens
    512 said --chunked-prefill-size 2048 (its default), the vLLM command of
    an SGLang plan at --memory-fraction 0.7 said 0.9."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--max-num-batched-tokens", "512",
                                  "--simulate-top", "0", "--json"])
    assert r.exit_code == 0, r.output
    ex = json.loads(r.output)["plans"][0]["exports"]
    assert "--chunked-prefill-size 512" in ex["sglang"]["command"]
    assert "--max-num-batched-tokens 512" in ex["vllm"]["command"]
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--engine", "sglang", "--memory-fraction", "0.7",
                                  "--max-num-batched-tokens", "1024", "--simulate-top", "0", "--json"])
    assert r.exit_code == 0, r.output
    ex = json.loads(r.output)["plans"][0]["exports"]
    assert "--gpu-memory-utilization 0.7" in ex["vllm"]["command"]
    assert "--max-num-batched-tokens 1024" in ex["vllm"]["command"]
    assert "--mem-fraction-static 0.7" in ex["sglang"]["command"]


def test_the_table_prints_what_the_command_needs_under_it():
    """The command of plan 1 is pasted from the table: the notes it needs
    to run as planned (a 4-bit checkpoint for int4 weights, the replicas
    behind a load balancer, the catalog name to replace) are printed under
    it, not only in the JSON: on 8 A100s, Llama-3 70B in int4 fits one GPU
    a replica, 8 replicas."""
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-70b", "--cluster", "1x8-a100-80gb", "--weight-dtype",
                                  "int4", "--kv-dtype", "fp8", "--tp", "1", "--pp", "1", "--simulate-top", "0"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    at = next(k for k, x in enumerate(lines) if x.startswith("vllm: "))
    notes = [x for x in lines[at + 1:] if x.startswith("  note: ")]
    assert any("4-bit" in x and "checkpoint" in x for x in notes), r.output
    assert any("run 8 replicas" in x and "load balancer" in x for x in notes), r.output
    assert any("not a checkpoint" in x for x in notes), r.output


def test_nothing_decodes_at_one_output_token_and_no_figure_says_otherwise():
    """With --output-len 1 a request's only token is its prompt's: no TPOT
    in the table, and null (not a cycle time, not 0.0) in the plan file's
    prediction and simulated run; SGLang keeps no memory reserve, so its
    plan file records none."""
    table = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--output-len", "1", "--simulate-top", "1",
                                      "--top", "1"])
    assert table.exit_code == 0, table.output
    header, row = table.output.splitlines()[1:3]
    end = header.index(" TPOT") + len(" TPOT")  # the column's cells are right-aligned under its name
    assert row[:end].split()[-1] == "-", table.output
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--output-len", "1", "--simulate-top", "1",
                                  "--top", "1", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["plans"][0]
    assert p["predicted"]["tpot_s"] is None
    assert p["simulated"]["tpot_mean_s"] is None and p["simulated"]["tpot_p90_s"] is None
    assert p["predicted"]["ttft_s"] > 0 and p["engine_default"]["refusal"] is None
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--engine", "sglang", "--top", "1",
                                  "--simulate-top", "0", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["inputs"]["engine"]["memory_reserve_bytes"] is None
