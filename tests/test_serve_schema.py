"""The serving plan file's JSON Schema and rules: shipped in the package, a
valid draft 2020-12 schema whose bounds are pipesearch.limits, followed by
what `pipesearch serve` writes (checked with jsonschema directly, not
through pipesearch), and `pipesearch validate` names each hand edit that
breaks a rule, with the value the rule gives (computed here from the file's
other fields)."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from referencing import Registry, Resource

from pipesearch import limits
from pipesearch.cli import main
from pipesearch.schema import SERVE_SCHEMA_FILE, plan_schema, schema_text, serve_schema

REPO = Path(__file__).resolve().parent.parent
SERVE = ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "-q"]
FEW = ["--num-requests", "40"]  # a short simulated run


def _validator() -> jsonschema.Draft202012Validator:
    registry = Registry().with_resource(plan_schema()["$id"], Resource.from_contents(plan_schema()))
    return jsonschema.Draft202012Validator(serve_schema(), registry=registry)


def test_schema_is_draft_2020_12_and_inside_the_package():
    schema = json.loads(schema_text(SERVE_SCHEMA_FILE))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert (REPO / "pipesearch" / "schema" / SERVE_SCHEMA_FILE).is_file()
    # the cluster is the plan file's, by reference
    assert schema["properties"]["inputs"]["properties"]["cluster"] == {
        "$ref": "urn:pipesearch:schema:plan:1#/properties/inputs/properties/cluster"}


def test_schema_bounds_are_the_limits():
    s = serve_schema()
    assert s["properties"]["inputs"]["properties"]["model"]["properties"]["num_layers"]["maximum"] \
        == limits.MAX_SERVE_LAYERS
    assert s["$defs"]["seconds"]["maximum"] == limits.MAX_PLAN_S
    assert s["$defs"]["bytes"]["maximum"] == limits.MAX_BYTES
    assert s["$defs"]["count"]["maximum"] == limits.MAX_COUNT
    par = s["$defs"]["plan"]["properties"]["parallelism"]["properties"]
    assert par["tp"]["maximum"] == par["replicas"]["maximum"] == limits.MAX_DEVICES
    rate = s["properties"]["inputs"]["properties"]["workload"]["properties"]["request_rate"]["oneOf"][0]
    assert rate["maximum"] == limits.MAX_REQUEST_RATE


@pytest.mark.parametrize("args", [
    FEW,  # replicas, both engines' commands, simulated runs
    [*FEW, "--engine", "sglang", "--tp", "1", "--pp", "4"],  # SGLang planned (no memory reserve), one replica shape
    [*FEW, "--request-rate", "3"],  # a rate: offered tokens/s, carries_rate
    [*FEW, "--concurrency", "20"],  # a closed loop: replica_clients
    [*FEW, "--output-len", "1"],  # nothing decodes: every TPOT null
    ["--simulate-top", "0"],  # simulated null
    [*FEW, "--max-ttft-ms", "2000", "--request-rate", "2"],  # meets_limits
    [*FEW, "--split", "10,22", "--pp", "2"],  # a pinned split
])
def test_written_serving_files_follow_the_schema_and_validate(tmp_path, args):
    out = tmp_path / "s.json"
    result = CliRunner().invoke(main, [*SERVE, *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    errors = sorted(_validator().iter_errors(doc), key=str)
    assert errors == []
    check = CliRunner().invoke(main, ["validate", str(out)])
    assert check.exit_code == 0, check.output
    assert check.stdout == f"{out}: valid pipesearch.serve/1 file, {len(doc['plans'])} plan" \
                           f"{'s' if len(doc['plans']) != 1 else ''} (llama3-8b on 1x8-l4)\n"


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict:
    """A serving plan file of several plans with pp 2, the first with replicas (llama3-8b on 8 L4)."""
    out = tmp_path_factory.mktemp("serve") / "s.json"
    result = CliRunner().invoke(main, [*SERVE, *FEW, "--pp", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["plans"][0]["parallelism"]["pp"] == 2 and doc["plans"][0]["parallelism"]["replicas"] > 1
    assert len(doc["plans"]) > 1
    return doc


def _validate(tmp_path, doc) -> tuple[int, list[str]]:
    path = tmp_path / "e.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["validate", str(path)])
    return result.exit_code, [line.removeprefix(f"{path}: ") for line in result.stdout.splitlines()]


def _edited(doc: dict, edit) -> dict:
    out = copy.deepcopy(doc)
    edit(out)
    return out


def test_layers_per_stage_must_cover_the_model(tmp_path, written):
    doc = _edited(written, lambda d: d["plans"][0]["layers_per_stage"].__setitem__(0, 1))
    code, lines = _validate(tmp_path, doc)
    assert code == 2
    assert lines[0].startswith(f"plans[0].layers_per_stage: {json.dumps(doc['plans'][0]['layers_per_stage'])} "
                               "found, 2 stage(s) (parallelism.pp) of the model's 32 decoder layers")


def test_a_stage_must_hold_its_share_of_the_split(tmp_path, written):
    first = written["plans"][0]["layers_per_stage"][0]
    doc = _edited(written, lambda d: d["plans"][0]["stages"][1].__setitem__("layers", [first - 1, 32]))
    code, lines = _validate(tmp_path, doc)
    assert code == 2 and lines[0].startswith(f"plans[0].stages[1].layers: [{first - 1}, 32] found, [{first}, 32] "
                                             "expected")
    doc = _edited(written, lambda d: d["plans"][0]["stages"][1].__setitem__("head", False))
    assert _validate(tmp_path, doc)[1][0].startswith("plans[0].stages[1].head: false found, true expected")


def test_devices_serve_one_stage_and_exist(tmp_path, written):
    used = written["plans"][0]["stages"][0]["devices"]
    doc = _edited(written, lambda d: d["plans"][0]["stages"][1].__setitem__("devices", list(used)))
    code, lines = _validate(tmp_path, doc)
    assert code == 2 and lines[0] == (f"plans[0].stages[1].devices: {used}: device {used[0]} already serves "
                                      "stages[0]; each device serves one stage")
    moved = [8] + written["plans"][0]["stages"][1]["devices"][1:]
    doc = _edited(written, lambda d: d["plans"][0]["stages"][1].__setitem__("devices", moved))
    assert _validate(tmp_path, doc)[1][0] == (f"plans[0].stages[1].devices: {moved}: device 8 does not exist; the "
                                              "cluster (inputs.cluster.devices) has 8 devices, ids 0 .. 7")
    tp = written["plans"][0]["parallelism"]["tp"]
    replicas = 8 // (2 * tp) + 1  # one replica more than 8 devices hold
    doc = _edited(written, lambda d: d["plans"][0]["parallelism"].__setitem__("replicas", replicas))
    assert _validate(tmp_path, doc)[1][0] == (f"plans[0].parallelism: tp {tp} x pp 2 x replicas {replicas} = "
                                              f"{2 * tp * replicas} devices, the cluster has 8 "
                                              "(inputs.cluster.devices)")


def test_the_pool_is_the_least_stage_and_rates_follow(tmp_path, written):
    plan = written["plans"][0]
    least = min(st["kv_tokens"] for st in plan["stages"])
    doc = _edited(written, lambda d: d["plans"][0].__setitem__("kv_pool_tokens", least + 1))
    assert _validate(tmp_path, doc)[1][0].startswith(f"plans[0].kv_pool_tokens: {least + 1} found, {least} expected")
    total = plan["predicted"]["output_tokens_per_s_per_replica"] * plan["parallelism"]["replicas"]
    doc = _edited(written, lambda d: d["plans"][0]["predicted"].__setitem__("output_tokens_per_s", total * 1.01))
    assert _validate(tmp_path, doc)[1][0].startswith(
        f"plans[0].predicted.output_tokens_per_s: {total * 1.01!r} found, {total!r} expected")
    pred = plan["predicted"]
    cycle = max(pred["ring_s"], min(2, plan["batch"]) * pred["bottleneck_stage_s"])  # m = min(pp, batch)
    doc = _edited(written, lambda d: d["plans"][0]["predicted"].__setitem__("cycle_s", cycle / 2))
    assert _validate(tmp_path, doc)[1][0].startswith(f"plans[0].predicted.cycle_s: {cycle / 2!r} found, "
                                                     f"{cycle!r} expected")
    doc = _edited(written, lambda d: d["plans"][0]["predicted"].__setitem__("tpot_s", None))
    assert _validate(tmp_path, doc)[1][0].startswith("plans[0].predicted.tpot_s: null found, a time expected")


def test_engine_commands_run_the_plan(tmp_path, written):
    plan = written["plans"][0]
    engine = written["inputs"]["engine"]["name"]
    assert engine == "vllm"
    partition = ",".join(map(str, plan["layers_per_stage"]))
    assert plan["exports"]["vllm"]["env"] == {"VLLM_PP_LAYER_PARTITION": partition}
    doc = _edited(written, lambda d: d["plans"][0]["exports"]["vllm"]["env"].__setitem__(
        "VLLM_PP_LAYER_PARTITION", "1,31"))
    assert _validate(tmp_path, doc)[1][0].startswith(
        'plans[0].exports.vllm.env: {"VLLM_PP_LAYER_PARTITION": "1,31"} found, '
        f'{{"VLLM_PP_LAYER_PARTITION": "{partition}"}} expected')
    argv = plan["exports"]["vllm"]["argv"]
    k = argv.index("--max-num-seqs")
    edited = argv[:k + 1] + [str(plan["max_num_seqs"] + 1)] + argv[k + 2:]
    doc = _edited(written, lambda d: d["plans"][0]["exports"]["vllm"].__setitem__("argv", edited))
    assert _validate(tmp_path, doc)[1][0] == (f"plans[0].exports.vllm.argv: --max-num-seqs "
                                              f"'{plan['max_num_seqs'] + 1}' found, '{plan['max_num_seqs']}' expected "
                                              "(the plan and inputs it was made for); re-plan, or restore the command")
    # the command is the variable and argv as a shell reads them
    line = plan["exports"]["vllm"]["command"]
    assert shlex.split(line) == [f"VLLM_PP_LAYER_PARTITION={partition}", *argv]
    words = shlex.split(line)
    k = words.index("--tensor-parallel-size") + 1
    edited_line = shlex.join(words[:k] + ["8"] + words[k + 1:])
    doc = _edited(written, lambda d: d["plans"][0]["exports"]["vllm"].__setitem__("command", edited_line))
    assert _validate(tmp_path, doc)[1][0] == (f"plans[0].exports.vllm.command: word {k + 1}: '8' found, "
                                              f"'{plan['parallelism']['tp']}' expected (the command is env then argv "
                                              "as a shell reads them); restore the command")
    # the other engine sizes its own pool: its running limit may be lower, never higher
    other = plan["exports"]["sglang"]["argv"]
    k = other.index("--max-running-requests")
    assert int(other[k + 1]) <= plan["max_num_seqs"]
    edited = other[:k + 1] + [str(plan["max_num_seqs"] + 1)] + other[k + 2:]
    doc = _edited(written, lambda d: d["plans"][0]["exports"]["sglang"].__setitem__("argv", edited))
    assert _validate(tmp_path, doc)[1][0].startswith(
        f"plans[0].exports.sglang.argv: --max-running-requests '{plan['max_num_seqs'] + 1}' found, at most")


def test_schema_errors_name_the_field_and_wait_for_the_rules(tmp_path, written):
    doc = _edited(written, lambda d: (d["plans"][0].__setitem__("batch", 2.0),
                                      d["plans"][1]["predicted"].__setitem__("tpot_s", -1),
                                      d["plans"][0].__setitem__("kv_pool_tokens", 3)))
    code, lines = _validate(tmp_path, doc)
    assert code == 2
    assert lines == ["plans[0].batch: expected an integer, got 2.0",
                     "plans[1].predicted.tpot_s: must be >= 0, got -1 (or null)",
                     "the rules beyond the schema (layers, devices, pools, rates, engine commands) are checked once "
                     "these are fixed"]
    doc = _edited(written, lambda d: d.__setitem__("format", "pipesearch.serve/2"))
    assert _validate(tmp_path, doc)[1][0] == "format: 'pipesearch.serve/2', expected 'pipesearch.serve/1'"


def test_ranks_in_order(tmp_path, written):
    doc = _edited(written, lambda d: d["plans"][1].__setitem__("rank", 1))
    ranks = [p["rank"] for p in doc["plans"]]
    assert _validate(tmp_path, doc)[1] == [f"plans: ranks {ranks} found, 1 .. {len(ranks)} in order expected; give "
                                           "the plans their ranks in order"]


def _with_command(doc: dict, argv: list, engine: str = "vllm") -> dict:
    """``doc`` with plan 1's ``engine`` command run as ``argv`` (its
    ``command`` line rebuilt to match, as a careful hand edit would)."""
    out = copy.deepcopy(doc)
    export = out["plans"][0]["exports"][engine]
    export["argv"] = argv
    export["command"] = shlex.join([f"{k}={v}" for k, v in export["env"].items()] + argv)
    return out


@pytest.mark.parametrize("extra", [["--tensor-parallel-size", "8"], ["--tensor-parallel-size=8"], ["-tp", "8"]])
def test_a_setting_repeated_later_is_the_one_the_engine_takes(tmp_path, written, extra):
    """The engines' parsers keep the last value of a flag (argparse), in
    either spelling and under vLLM's alias: a tp given again after the
    planned one is a command for 8-way tensor parallelism."""
    plan = written["plans"][0]
    doc = _with_command(written, plan["exports"]["vllm"]["argv"] + extra)
    tp = plan["parallelism"]["tp"]
    assert _validate(tmp_path, doc)[1][0] == (f"plans[0].exports.vllm.argv: --tensor-parallel-size '{tp}' then '8' "
                                              f"found, '{tp}' expected (the plan and inputs it was made for) (the "
                                              "engine takes the last); re-plan, or restore the command")


def test_commands_follow_the_inputs(tmp_path, written):
    """The context is the request's length, the memory share the planned
    engine's, and fp8 weights or KV cache appear exactly when the workload
    says so."""
    plan, w = written["plans"][0], written["inputs"]["workload"]
    argv = plan["exports"]["vllm"]["argv"]
    length = w["input_len"] + w["output_len"]
    k = argv.index("--max-model-len") + 1
    assert argv[k] == str(length)
    doc = _with_command(written, argv[:k] + ["100"] + argv[k + 1:])
    assert _validate(tmp_path, doc)[1][0].startswith(f"plans[0].exports.vllm.argv: --max-model-len '100' found, "
                                                     f"'{length}' expected")
    assert w["weight_dtype"] == "bf16" and "--quantization" not in argv
    doc = _with_command(written, argv + ["--quantization", "fp8"])
    assert _validate(tmp_path, doc)[1][0].startswith("plans[0].exports.vllm.argv: --quantization 'fp8' found, not "
                                                     "expected")
    doc = _edited(written, lambda d: d["inputs"]["workload"].__setitem__("kv_dtype", "fp8"))
    assert _validate(tmp_path, doc)[1][0].startswith("plans[0].exports.vllm.argv: --kv-cache-dtype missing, 'fp8' "
                                                     "expected")
    doc = _edited(written, lambda d: d["inputs"]["engine"].__setitem__("memory_fraction", 0.5))
    assert _validate(tmp_path, doc)[1][0].startswith("plans[0].exports.vllm.argv: --gpu-memory-utilization '0.9' "
                                                     "found, '0.5' expected")


def test_the_planned_engine_has_its_command(tmp_path, written):
    doc = _edited(written, lambda d: d["plans"][0]["exports"].__setitem__("vllm", {"refused": "edited"}))
    assert _validate(tmp_path, doc)[1][0] == ('plans[0].exports.vllm: {"refused": "edited"} found, the command of '
                                              "the engine planned for (inputs.engine.name 'vllm') expected; re-plan, "
                                              "or restore it")


def test_a_tensor_parallel_group_stays_in_one_node(tmp_path):
    """Two 8-GPU nodes, tp 8: a stage's group [0..6, 8] would run its
    collectives across nodes, which the engines' tensor parallelism does
    not (serve refuses a group larger than a node for that reason)."""
    out = tmp_path / "s.json"
    result = CliRunner().invoke(main, ["serve", "--model", "llama3-70b", "--cluster", "2x8-a100-80gb", "--tp", "8",
                                       "--pp", "2", "--simulate-top", "0", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    first = doc["plans"][0]["stages"][0]["devices"]
    assert first == list(range(8))
    moved = first[:7] + [8]
    other = doc["plans"][0]["stages"][1]["devices"]
    doc["plans"][0]["stages"][1]["devices"] = [first[7] if d == 8 else d for d in other]
    doc["plans"][0]["stages"][0]["devices"] = moved
    code, lines = _validate(tmp_path, doc)
    assert code == 2 and lines[0] == (f"plans[0].stages[0].devices: {moved}: the stage's tensor-parallel group spans "
                                      "nodes of 8 devices; a group stays in one node (the engines' tensor parallelism "
                                      "runs over its NVLink or PCIe)")

