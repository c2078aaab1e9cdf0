"""``pipesearch export -o FILE`` writes what the file's suffix says, and
never JSON into a .toml."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from pipesearch.cli import main


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "llama.json"
    res = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "2",
                                    "-b", "512", "--pp", "2", "--schedule", "1f1b", "--placement", "data", "-q",
                                    "-o", str(out)])  # torchtitan's mesh runs the data placement only
    assert res.exit_code == 0, res.output
    return out


def export(plans, *args):
    return CliRunner().invoke(main, ["export", str(plans), *args])


def test_toml_is_refused_and_nothing_written(plans, tmp_path):
    out = tmp_path / "tt.toml"
    res = export(plans, "--format", "torchtitan", "-o", str(out))
    assert res.exit_code == 2 and not out.exists()
    assert "reads no TOML" in res.output and "Traceback" not in res.output
    assert "--torchtitan-version 0.2" in res.output


def test_torchtitan_02_writes_its_job_toml(plans, tmp_path):
    import tomllib

    out = tmp_path / "job.toml"
    res = export(plans, "--format", "torchtitan", "--torchtitan-version", "0.2", "-o", str(out))
    assert res.exit_code == 0, res.output
    plan = json.loads(plans.read_text())["plans"][0]
    job = tomllib.loads(out.read_text())
    deg = plan["parallelism"]
    assert job["parallelism"]["pipeline_parallel_degree"] == deg["pp"] == 2
    assert job["parallelism"]["data_parallel_replicate_degree"] == deg["dp"]
    assert job["parallelism"]["tensor_parallel_degree"] == deg["tp"]
    assert job["training"]["local_batch_size"] * deg["dp"] == 512
    sch = plan["schedule"]
    assert job["parallelism"]["pipeline_parallel_microbatch_size"] == sch["micro_batch_size"]
    assert job["training"]["local_batch_size"] == sch["micro_batch_size"] * sch["num_micro_batches"]
    assert job["training"]["global_batch_size"] == 512
    assert len(job["parallelism"]["module_fqns_per_model_part"]) == 2
    # the launch script reads torchtitan.toml beside it: a job file of another name, or a script alone, says so
    assert "name this file torchtitan.toml, or run the script with CONFIG_FILE=" in res.stderr
    script = tmp_path / "launch.sh"
    res = export(plans, "--format", "torchtitan", "--torchtitan-version", "0.2", "-o", str(script))
    assert res.exit_code == 0 and 'CONFIG_FILE="${CONFIG_FILE:-$(dirname "$0")/torchtitan.toml}"' in script.read_text()
    assert "reads the job file torchtitan.toml beside it" in res.stderr
    res = export(plans, "--format", "torchtitan", "--torchtitan-version", "0.2", "-o", str(tmp_path / "torchtitan.toml"))
    assert res.exit_code == 0 and "note:" not in res.stderr
    res = export(plans, "--format", "megatron", "--torchtitan-version", "0.2")
    assert res.exit_code == 2 and "only with --format torchtitan" in res.output
    res = export(plans, "--format", "torchtitan", "--torchtitan-version", "9.9")
    assert res.exit_code == 2 and "'9.9'" in res.output and "Traceback" not in res.output
    # the option's value, named as the option (it read "plans.json: plan of rank 1: torchtitan version ...")
    assert res.output.startswith("error: export --torchtitan-version '9.9': expected one of") and "rank" not in \
        res.output, res.output


def test_suffix_picks_the_file(plans, tmp_path):
    whole = json.loads(export(plans, "--format", "megatron").output)
    sh = tmp_path / "run.sh"
    assert export(plans, "--format", "megatron", "-o", str(sh)).exit_code == 0
    assert sh.read_text() == whole["files"]["launch_megatron.sh"]
    assert sh.read_text().startswith("#!/usr/bin/env bash")
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun" in sh.read_text()  # the plan has tp > 1
    ds = tmp_path / "ds_config.json"
    assert export(plans, "--format", "deepspeed", "-o", str(ds)).exit_code == 0
    cfg = json.loads(ds.read_text())
    plan = json.loads(plans.read_text())["plans"][0]
    mbs, m = plan["schedule"]["micro_batch_size"], plan["schedule"]["num_micro_batches"]
    assert cfg["train_batch_size"] == mbs * m * plan["parallelism"]["dp"] == 512
    assert cfg["gradient_accumulation_steps"] == m
    upper = tmp_path / "DS_CONFIG.JSON"  # the runtime's file name in another case: still that file
    assert export(plans, "--format", "deepspeed", "-o", str(upper)).exit_code == 0
    assert json.loads(upper.read_text()) == cfg
    other = tmp_path / "ds.json"  # any other .json: the whole export
    assert export(plans, "--format", "deepspeed", "-o", str(other)).exit_code == 0
    assert json.loads(other.read_text())["runtime"] == "deepspeed"


def test_files_dir(plans, tmp_path):
    d = tmp_path / "tt"
    res = export(plans, "--format", "torchtitan", "--files", str(d))
    assert res.exit_code == 0 and res.output.strip() == f"wrote {d / 'launch_torchtitan.sh'}"
    text = (d / "launch_torchtitan.sh").read_text()
    assert "--module llama3" in text and "norm,lm_head" in text and ",output" not in text
    assert (d / "launch_torchtitan.sh").stat().st_mode & 0o111


def test_files_dir_without_files_is_refused(plans, tmp_path):
    d = tmp_path / "t"
    res = export(plans, "--format", "torch", "--files", str(d))  # the plan has tp > 1: no pipeline_torch.py
    assert res.exit_code == 2 and "has no files (no pipeline_torch.py" in res.output and not d.exists()


def test_megatron_export_warns_when_the_plan_counted_less_state_than_megatron_keeps(plans, tmp_path):
    """The fixture's plan counts mixed-precision Adam's 16 bytes per
    parameter (2 weights + 2 gradients + 4 master + 8 moments); Megatron-LM
    keeps 18 (2 + 4 fp32 main gradients + 4 + 8): the launch script is
    written, with a warning on stderr naming both and the fix; a plan made
    with --optimizer-state megatron gets none."""
    res = export(plans, "--format", "megatron", "-o", str(tmp_path / "run.sh"))
    assert res.exit_code == 0
    assert "warning: the plan's memory counts 16 bytes of training state per parameter (mixed-adam); " \
           "Megatron-LM keeps 18" in res.stderr
    assert "--runtime megatron" in res.stderr and (tmp_path / "run.sh").exists()
    same = tmp_path / "megatron.json"
    made = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "2", "-b", "512",
                                     "--pp", "2", "--schedule", "1f1b", "--optimizer-state", "megatron", "-q",
                                     "-o", str(same)])
    assert made.exit_code == 0, made.output
    res = export(same, "--format", "megatron", "-o", str(tmp_path / "run2.sh"))
    assert res.exit_code == 0 and "warning" not in res.stderr


def test_torchtitan_placeholders_are_said_on_stderr_and_in_the_script(tmp_path):
    """A model pipesearch knows no torchtitan config for (Llama-2 7B): the
    launch script written with -o or --files runs ``--module MODULE
    --config CONFIG``, so a warning on stderr and a comment in the script
    say to replace them; the catalog's Llama-3 8B (a known config) gets
    neither."""
    made = tmp_path / "l2.json"
    res = CliRunner().invoke(main, ["plan", "--model", "llama2-7b", "--cluster", "2x8-a100-80gb", "-b", "512",
                                    "--pp", "2", "--schedule", "1f1b", "--placement", "data", "-q", "-o", str(made)])
    assert res.exit_code == 0, res.output
    for target in (["-o", str(tmp_path / "t.sh")], ["--files", str(tmp_path / "tt")]):
        res = export(made, "--format", "torchtitan", *target)
        assert res.exit_code == 0 and "warning: pipesearch knows no torchtitan config for model 'llama2-7b'" in res.stderr
    for script in (tmp_path / "t.sh", tmp_path / "tt" / "launch_torchtitan.sh"):
        text = script.read_text()
        assert "--module MODULE" in text and "# pipesearch knows no torchtitan config" in text


def test_torchtitan_export_of_a_known_model_warns_of_nothing(plans, tmp_path):
    res = export(plans, "--format", "torchtitan", "-o", str(tmp_path / "t.sh"))
    assert res.exit_code == 0 and "warning" not in res.stderr
    assert "MODULE" not in (tmp_path / "t.sh").read_text()


@pytest.mark.parametrize("fmt,extra", [("megatron", []), ("torchtitan", []), ("torchtitan", ["--torchtitan-version", "0.2"])])
def test_command_line_expands_the_rendezvous_variables(plans, fmt, extra):
    """The one-line ``command_line`` of a two-node export, run by bash with
    ``torchrun`` replaced by ``printf``, passes node 1's rank and node 0's
    address to torchrun (a quoted ``'"${NODE_RANK:?}"'`` would pass the
    text itself)."""
    import subprocess

    res = export(plans, "--format", fmt, *extra)
    assert res.exit_code == 0, res.output
    line = json.loads(res.output)["command_line"]
    out = subprocess.run(["bash", "-c", line.replace("torchrun", "printf '%s\\n'", 1)],
                         env={"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.2"}, capture_output=True, text=True)
    words = out.stdout.split()
    assert words[words.index("--node-rank") + 1] == "1"
    assert words[words.index("--master-addr") + 1] == "10.0.0.2"
    assert words[words.index("--master-port") + 1] == "29500"


def test_uniform_replicas_export_as_the_data_parallel_plan_they_are(tmp_path):
    """Every stage replicated twice with each replica computing 1 of a
    micro-batch's 2 samples is the data-parallel plan dp 2 of micro-batch 1
    on the same devices: its Megatron-LM export is that plan's, argument for
    argument; replicas 1,3 (unequal) stay refused with the reason."""
    common = ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--schedule", "1f1b",
              "--tp", "2", "--recompute", "none", "--top", "1"]
    rep, dp = tmp_path / "rep.json", tmp_path / "dp.json"
    for out, extra in ((rep, ["--split", "12x2,14x2", "--micro-batch-size", "2"]),
                       (dp, ["--split", "12,14", "--pp", "2", "--dp", "2", "--micro-batch-size", "1",
                             "--placement", "data"])):
        res = CliRunner().invoke(main, common + extra + ["-o", str(out)])
        assert res.exit_code == 0, res.output
    assert json.loads(rep.read_text())["plans"][0]["stages"][0]["replicas"] == 2
    a, b = (json.loads(export(p, "--format", "megatron").output) for p in (rep, dp))
    assert a["args"] == b["args"] and a["world_size"] == b["world_size"] == 8
    assert "--micro-batch-size" in a["args"] and a["args"][a["args"].index("--micro-batch-size") + 1] == "1"
    uneven = tmp_path / "uneven.json"
    res = CliRunner().invoke(main, [x if x != "64" else "63" for x in common]
                             + ["--split", "12x1,14x3", "--micro-batch-size", "3", "-o", str(uneven)])
    assert res.exit_code == 0, res.output
    res = export(uneven, "--format", "megatron")
    assert res.exit_code == 2 and "replicates its stages 1,3 times" in res.output


def test_a_refusal_names_the_plan_file_and_rank(plans):
    """A runtime's refusal starts with the file and the plan it refuses."""
    res = export(plans, "--format", "gpipe")  # the plan runs 1F1B; torchgpipe runs GPipe only
    assert res.exit_code == 2 and res.output.startswith(f"error: {plans}: plan of rank 1: gpipe:")


def test_megatron_export_without_a_model_shape_says_so_in_the_script(plans, tmp_path):
    """A plan file whose inputs lack the model's transformer shape (edited,
    or written by a tool of its own) exports a launch without
    --hidden-size and the other shape flags, which Megatron-LM's
    validate_args refuses: the export still writes it (the split and
    degrees are right), with a warning on stderr and the same line as a
    comment in the script; the script is executable whether written with
    -o or --files."""
    doc = json.loads(plans.read_text())
    del doc["inputs"]["model"]["transformer"]
    del doc["digests"]  # a tool of its own writes none (an edit of pipesearch's file is named: tests/test_plan_digests.py)
    made = tmp_path / "bare.json"
    made.write_text(json.dumps(doc))
    for target, script in ((["-o", str(tmp_path / "m.sh")], tmp_path / "m.sh"),
                           (["--files", str(tmp_path / "mm")], tmp_path / "mm" / "launch_megatron.sh")):
        res = export(made, "--format", "megatron", *target)
        assert res.exit_code == 0, res.output
        assert "warning: no model shape in the export's inputs" in res.stderr
        text = script.read_text()
        assert "\n# warning: no model shape" in text and "\n    --hidden-size" not in text  # (only the comment names it)
        assert os.access(script, os.X_OK)


def test_megatron_launch_is_a_run_with_a_schedule(plans):
    """validate_args accepts a command without --lr and --train-iters, but
    training then stops (no learning rate, no end): the synthetic-data run
    the export writes has both."""
    exp = json.loads(export(plans, "--format", "megatron").stdout)
    run = exp["data_args"]
    assert run[:3] == ["--mock-data", "--tokenizer-type", "NullTokenizer"]
    flags = dict(zip(run[3::2], run[4::2]))
    assert int(flags["--train-iters"]) > 0 and float(flags["--lr"]) > 0
    assert "--train-iters" in exp["command_line"] and "--lr" in exp["command_line"]


def test_deepspeed_bf16_without_zero_warns_of_its_bf16_optimizer(plans):
    """DeepSpeed 0.19.8 runs a bf16 pipeline without ZeRO through
    BF16_Optimizer (engine._do_optimizer_sanity_check): bf16 gradient
    accumulation, and the fp32 master weights and Adam moments split over
    the dp replicas (2 + 2 + 12/dp bytes per parameter on a rank, against
    the plan's 16)."""
    doc = json.loads(plans.read_text())
    dp, m = doc["plans"][0]["parallelism"]["dp"], doc["plans"][0]["schedule"]["num_micro_batches"]
    assert dp > 1
    exp = json.loads(export(plans, "--format", "deepspeed").stdout)
    assert exp["config"]["zero_optimization"]["stage"] == 0 and exp["config"]["bf16"] == {"enabled": True}
    note = next(n for n in exp["notes"] if n.startswith("warning: DeepSpeed runs bf16 pipelines without ZeRO"))
    assert f"over the {m} micro-batches" in note and f"dp={dp} replicas" in note
    assert f"2 + 2 + 12/{dp} bytes per parameter instead of 16" in note


def _plan(tmp_path, name, *args):
    out = tmp_path / name
    res = CliRunner().invoke(main, ["plan", "-q", *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("fmt", ["torch", "torchtitan", "deepspeed", "gpipe"])
def test_an_encoder_decoder_is_refused_by_the_stage_chains(tmp_path, fmt):
    """T5-3B split over 2 stages (the encoder and 4 decoder blocks on stage
    0): each of these runtimes passes one tensor from stage to stage, and a
    decoder stage also needs the encoder's output; they exported it as a
    decoder-only chain with no note."""
    made = _plan(tmp_path, "t5.json", "--model", "t5-3b", "--cluster", "4x8-h100", "-b", "256", "--pp", "2",
                 "--schedule", "1f1b")
    res = export(made, "--format", fmt, "-o", str(tmp_path / "x.json"))
    assert res.exit_code == 2 and "model kind 'encoder-decoder'" in res.output
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("runtime", ["torch", "torchtitan", "deepspeed", "gpipe", "megatron"])
def test_plan_refuses_a_runtime_no_plan_of_an_encoder_decoder_runs_on_before_searching(tmp_path, runtime,
                                                                                      monkeypatch):
    """Every runtime refuses every plan of T5 (the stage chains above;
    Megatron's command is pretrain_gpt.py's), so `plan --runtime` says so
    at once, in one line naming the runtime and the model kind, exit 2,
    no file, and never starts the search (which it ran in full, 7 to 10 s,
    before refusing every plan it found)."""
    import pipesearch.cli.plan_cmd as plan_cmd

    def no_search(*args, **kwargs):
        raise AssertionError("searched")

    monkeypatch.setattr(plan_cmd, "search", no_search)
    res = CliRunner().invoke(main, ["plan", "--model", "t5-3b", "--cluster", "2x8-a100-80gb", "-b", "512",
                                    "--runtime", runtime, "-o", str(tmp_path / "p.json")])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith(f"error: --runtime {runtime}: model kind 'encoder-decoder'") and "\n" not in line
    assert "drop --runtime" in line and not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("fmt", ["torch", "gpipe"])
def test_a_sharded_optimizer_state_is_refused_where_the_loop_keeps_it_whole(tmp_path, fmt):
    """A ZeRO-2 plan (each replica holds a quarter of the optimizer state)
    exported to a loop that steps every replica's whole optimizer: the
    planner refuses --runtime torch/gpipe with --sharding zero2, and now so
    does the export."""
    made = _plan(tmp_path, "z2.json", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--tp", "1",
                 "--pp", "2", "--dp", "4", "--sharding", "zero2", "--schedule", "1f1b")
    res = export(made, "--format", fmt, "-o", str(tmp_path / "x.json"))
    assert res.exit_code == 2 and "shards the optimizer state (--sharding zero2)" in res.output


def test_a_tied_embedding_over_stages_is_refused_by_torchtitan_and_warned_by_torch(tmp_path):
    """GPT-3 1.3B ties its embedding and LM head; on 2 stages the head's
    stage keeps a copy (the plan counts it). torchtitan's model config
    raises "Weight tying is not supported with Pipeline Parallel" at start;
    torch.distributed.pipelining updates the two copies apart."""
    made = _plan(tmp_path, "tied.json", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--tp", "1",
                 "--pp", "2", "--dp", "4", "--schedule", "1f1b", "--placement", "data")
    doc = json.loads(made.read_text())
    assert any(dict(b)["tied_copy"] > 0 for st in doc["plans"][0]["stages"]
               for b in [st.get("memory_breakdown_bytes", {})] if "tied_copy" in b)
    res = export(made, "--format", "torchtitan", "-o", str(tmp_path / "t.sh"))
    assert res.exit_code == 2 and "torchtitan refuses weight tying with pipeline parallelism" in res.output
    res = export(made, "--format", "torch", "--files", str(tmp_path / "t"))
    assert res.exit_code == 0 and "warning: the model ties its input embedding and LM head" in res.stderr


def test_megatron_exports_a_one_stage_plan_whatever_its_schedule_name(tmp_path):
    """pp 1: no pipeline schedule runs (Megatron accumulates the
    micro-batches' gradients), so a one-stage ZB-H1 plan is not refused for
    its schedule's name."""
    made = _plan(tmp_path, "zb1.json", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--pp", "1",
                 "--schedule", "zb-h1", "--top", "1")
    res = export(made, "--format", "megatron", "-o", str(tmp_path / "m.sh"))
    assert res.exit_code == 0, res.output
    assert "--pipeline-model-parallel-size 1" in (tmp_path / "m.sh").read_text()


@pytest.fixture(scope="module")
def vgg_plans(tmp_path_factory):
    return _vgg_plan_file(tmp_path_factory)


def _vgg_plan_file(tmp_path_factory, *extra: str):
    """The plan file of vgg16 on 1x4-v100-pcie, pp 2, 1F1B (and ``extra`` options)."""
    out = tmp_path_factory.mktemp("v") / "vgg.json"
    res = CliRunner().invoke(main, ["plan", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--pp", "2",
                                    "--schedule", "1f1b", *extra, "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_module_names_map_a_pipedream_profiles_layers(vgg_plans, tmp_path):
    """vgg16's layers are named as in PipeDream's graph (b00_Input0, ...),
    which no torch model has: the torch export says so (a warning, on
    stderr with -o), and --module-names maps them: split_spec and the
    script's STAGE_LAYERS then name the given modules, a list in order."""
    res = export(vgg_plans, "--format", "torch", "-o", str(tmp_path / "t.json"))
    assert res.exit_code == 0, res.output
    assert "warning:" in res.output and "--module-names" in res.output and "PipeDream" in res.output
    doc = json.loads((tmp_path / "t.json").read_text())
    layers = json.loads(vgg_plans.read_text())["plans"][0]["stages"]
    assert doc["layer_modules"][:2] == [["b00_Input"], ["b01_Conv2d"]]  # the profile's own names
    first_of_stage_1 = layers[1]["layer_names"][0]
    mapping = {n: f"m{k}" for k, n in enumerate(layer for st in layers for layer in st["layer_names"])}
    mapping[first_of_stage_1] = ["pre", "body"]
    (tmp_path / "names.json").write_text(json.dumps(mapping))
    res = export(vgg_plans, "--format", "torch", "--module-names", str(tmp_path / "names.json"), "-o",
                 str(tmp_path / "m.json"))
    assert res.exit_code == 0, res.output
    assert "warning:" not in res.output
    mapped = json.loads((tmp_path / "m.json").read_text())
    assert list(mapped["split_spec"]) == ["pre"]  # the split before the first module of stage 1
    assert "['pre', 'body']" in mapped["files"]["pipeline_torch.py"]
    # a map of some layers leaves the others named as PipeDream named them: still a warning, naming those
    del mapping["b00_Input"]
    (tmp_path / "part.json").write_text(json.dumps(mapping))
    res = export(vgg_plans, "--format", "torch", "--module-names", str(tmp_path / "part.json"), "-o",
                 str(tmp_path / "p.json"))
    assert res.exit_code == 0 and "warning:" in res.output and "not in module_names" in res.output, res.output
    assert "(b00_Input, ...)" in res.output


@pytest.mark.parametrize("body, needle", [
    ("[1, 2]", "expected a JSON object"),
    ('{"b00_Input0": ""}', "'b00_Input0'"),
    ('{"b00_Input0": []}', "non-empty list"),
    ("{not json", "not JSON"),
    ('{"no_such_layer": "x"}', "not a layer of the plan"),
])
def test_bad_module_names_are_refused_in_one_line(vgg_plans, tmp_path, body, needle):
    path = tmp_path / "names.json"
    path.write_text(body)
    out = tmp_path / "t.json"
    res = export(vgg_plans, "--format", "torch", "--module-names", str(path), "-o", str(out))
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("fmt", ["gpipe", "deepspeed", "megatron", "stages-json"])
def test_module_names_for_an_export_that_reads_none_are_refused(plans, tmp_path, fmt):
    """--module-names maps layer names to torch modules for the torch and
    torchtitan exports; the others name or index their layers their own way
    and used to accept the file unread (a note inside the JSON only): now
    exit 2 naming the option and the formats that read it, nothing written."""
    names = tmp_path / "names.json"
    names.write_text('{"zzz": "a"}')
    out = tmp_path / "out.json"
    res = export(plans, "--format", fmt, "--module-names", str(names), "-o", str(out))
    assert res.exit_code == 2, res.output
    assert f"--module-names {names}: only with --format torch or torchtitan" in res.output
    assert not out.exists()


@pytest.fixture(scope="module")
def vgg_titan_plans(tmp_path_factory):
    """vgg16 planned for torchtitan's device mesh (the replicas of a stage on consecutive devices)."""
    return _vgg_plan_file(tmp_path_factory, "--placement", "data")


@pytest.mark.parametrize("version,out", [("0.3.0", "l.sh"), ("0.2", "t.toml")])
def test_torchtitan_warns_of_layer_names_no_model_of_its_registry_has(vgg_titan_plans, tmp_path, version, out):
    """torchtitan builds the models of its own registry: a plan of vgg16
    (PipeDream's layer names, b00_Input, ...) exported for it warns that
    its FQNs are the plan's layer names, and the 0.2 job file that its
    [model] is a placeholder (it warned of neither); a map of every layer
    leaves only the placeholder warning; a map of some names the others."""
    res = export(vgg_titan_plans, "--format", "torchtitan", "--torchtitan-version", version, "-o", str(tmp_path / out))
    assert res.exit_code == 0, res.output
    assert "warning: " in res.output and "by the plan's layer name (b00_Input, b01_Conv2d, ...)" in res.output
    assert "PipeDream" in res.output and "--module-names" in res.output
    if version == "0.2":
        assert "warning: pipesearch knows no torchtitan 0.2 flavor for model 'vgg16'" in res.output
    names = [n for st in json.loads(vgg_titan_plans.read_text())["plans"][0]["stages"] for n in st["layer_names"]]
    (tmp_path / "all.json").write_text(json.dumps({n: f"m{k}" for k, n in enumerate(names)}))
    res = export(vgg_titan_plans, "--format", "torchtitan", "--torchtitan-version", version, "--module-names",
                 str(tmp_path / "all.json"), "-o", str(tmp_path / ("all_" + out)))
    assert res.exit_code == 0 and "by the plan's layer name" not in res.output, res.output
    (tmp_path / "part.json").write_text(json.dumps({n: f"m{k}" for k, n in enumerate(names) if k != 1}))
    res = export(vgg_titan_plans, "--format", "torchtitan", "--torchtitan-version", version, "--module-names",
                 str(tmp_path / "part.json"), "-o", str(tmp_path / ("part_" + out)))
    assert res.exit_code == 0 and "not in module_names by the plan's layer name (b01_Conv2d, ...)" in res.output


def test_megatron_export_of_an_fp32_state_compares_per_device_bytes(tmp_path):
    """``--optimizer-state fp32-adam`` under ``--runtime megatron`` (its
    distributed optimizer: ZeRO-1): the plan counts 4 B weights + 4 B
    gradients + 8 B moments / dp per device; Megatron-LM's ``--bf16`` keeps
    2 + 4 (fp32 main gradients) + (4 master + 8 moments) / dp, fewer at any
    dp > 1. It warned "Megatron-LM keeps 18 ... may not fit" from the
    unsharded totals (16 < 18); now a note with both per-device figures."""
    out = tmp_path / "f32.json"
    made = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "4x8-h100", "--runtime", "megatron",
                                     "--optimizer-state", "fp32-adam", "--top", "1", "-q", "-o", str(out)])
    assert made.exit_code == 0, made.output
    dp = json.loads(out.read_text())["plans"][0]["parallelism"]["dp"]
    assert dp > 1
    res = export(out, "--format", "megatron")
    assert res.exit_code == 0, res.output
    notes = " ".join(json.loads(res.stdout)["notes"])
    assert "may not fit" not in res.stderr + notes
    assert (f"keeps {6 + 12 / dp:g} bytes of training state per parameter on each device at dp={dp}" in notes
            and f"against the {8 + 8 / dp:g} planned" in notes), notes


def test_megatron_export_says_its_attention_keeps_no_scores_where_the_plan_does(plans, tmp_path):
    """The fixture's plan (llama3-8b, recompute none) keeps every block's
    attention scores, as unfused attention does; Megatron-LM's default
    Transformer Engine attention keeps none: a note says so (the torchtitan
    export had one, the Megatron one none). A plan of selective recompute
    (the scores dropped) gets none."""
    assert json.loads(plans.read_text())["plans"][0]["options"]["recompute"] == "none"
    res = export(plans, "--format", "megatron")
    assert res.exit_code == 0, res.output
    notes = " ".join(json.loads(res.stdout)["notes"])
    assert "the plan stores the attention scores" in notes and "Megatron-LM's default attention" in notes
    selective = tmp_path / "s.json"
    made = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "2", "-b",
                                     "512", "--pp", "2", "--schedule", "1f1b", "--recompute", "selective", "--top", "1",
                                     "-q", "-o", str(selective)])
    assert made.exit_code == 0, made.output
    res = export(selective, "--format", "megatron")
    assert res.exit_code == 0 and "attention scores" not in " ".join(json.loads(res.stdout)["notes"])
