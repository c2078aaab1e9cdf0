"""The torch export's pipeline_torch.py runs under torchrun on CPU (gloo):
the plan's stages, schedule class and, for interleaved plans, pipesearch's
own order loaded from the CSV."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dataclasses import replace

from pipesearch.export import export_plan
from pipesearch.runtime.torch_pipeline import free_port

from test_export import make_plan

pytest.importorskip("torch")

TESTS = Path(__file__).resolve().parent
NAMES = [str(i) for i in range(8)]  # children of tests/e2e_model.py's nn.Sequential


def _run_script(plan, tmp_path, name: str = "pipeline_torch.py", steps: int = 2) -> str:
    """Write the plan's pipeline_torch.py as ``name`` and run it under torchrun
    on CPU (gloo), one process per device of the plan; its stdout."""
    script = tmp_path / name
    script.write_text(export_plan(plan, "torch")["files"]["pipeline_torch.py"])
    env = dict(os.environ, PYTHONPATH=str(TESTS), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(plan.pp * plan.dp),
         "--master-port", str(free_port()), str(script), "e2e_model:make_model", "--sample-shape", "1024",
         "--steps", str(steps)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("plan", [
    make_plan([2, 6], NAMES, schedule="1f1b", m=4, mbs=8),
    make_plan([1, 3, 2, 2], NAMES, pp=2, vp=2, schedule="interleaved-1f1b", m=4, mbs=8),
    # one stage per rank in ScheduleInterleavedZeroBubble (what torchtitan builds for zb-h1 too)
    make_plan([2, 6], NAMES, schedule="zb-h1", m=4, mbs=8),
], ids=["1f1b", "interleaved", "zb-h1"])
def test_snippet_trains_the_plan(plan, tmp_path):
    out = _run_script(plan, tmp_path)
    exp = export_plan(plan, "torch")
    assert f"SCHEDULE_CLASS = \"{exp['schedule_class']}\"" in (tmp_path / "pipeline_torch.py").read_text()
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step ")]
    assert len(losses) == 2 and all(0 < x < 10 for x in losses)


def test_no_snippet_with_tensor_parallelism():
    exp = export_plan(make_plan([4, 4], NAMES, schedule="1f1b", m=4, tp=2), "torch")
    assert exp["files"] == {} and any("no pipeline_torch.py" in n for n in exp["notes"])
    assert exp["runtime_version"] == "2.13.0"


def _with_devices(plan, devices):
    return replace(plan, stages=tuple(replace(st, devices=tuple(d)) for st, d in zip(plan.stages, devices)))


@pytest.mark.slow
@pytest.mark.parametrize("plan, devices", [
    (make_plan([2, 3, 3], NAMES, schedule="1f1b", m=4, mbs=8), [(0,), (2,), (1,)]),
    (make_plan([1, 3, 2, 2], NAMES, pp=2, vp=2, schedule="interleaved-1f1b", m=4, mbs=8), [(1,), (0,)] * 2),
    (make_plan([2, 6], NAMES, schedule="1f1b", m=4, mbs=8, dp=2), [(2, 1), (0, 3)]),
], ids=["1f1b", "interleaved", "two-replicas"])
def test_a_pipeline_that_visits_its_processes_out_of_order_trains(plan, devices, tmp_path):
    """A mapped placement's pipeline can visit its devices out of order
    (stage 0 on device 0, stage 1 on device 2, stage 2 on device 1).
    torch numbers a process group's members in process order and sends
    stage s's activations to group rank s % pp, so the script deadlocked
    (every process waiting for a peer that waited for another). Each
    process still runs the stage the plan puts on its device, and the
    schedule trains."""
    plan = _with_devices(plan, devices)
    out = _run_script(plan, tmp_path, steps=2)
    found = re.findall(r"process (\d+): pipeline rank (\d+), replica (\d+)", out)
    assert {int(p): (int(r), int(k)) for p, r, k in found} == {
        d: (r % plan.pp, k) for r, devs in enumerate(devices[:plan.pp]) for k, d in enumerate(devs)}
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step ")]
    assert len(losses) == 2 and all(0 < x < 10 for x in losses)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [[(0, 1), (2, 3)], [(0, 2), (1, 3)]], ids=["stage-major", "replica-major"])
def test_snippet_places_each_process_where_the_plan_does(devices, tmp_path):
    """pp 2 x dp 2: process r runs the pipeline rank and replica whose device
    is the plan's r-th; the two layouts a plan can have (its ``data`` and
    ``pipeline`` placements) give different processes the same stage."""
    plan = _with_devices(make_plan([2, 6], NAMES, schedule="1f1b", m=4, mbs=8, dp=2), devices)
    out = _run_script(plan, tmp_path, steps=1)
    found = re.findall(r"process (\d+): pipeline rank (\d+), replica (\d+)", out)  # lines may interleave
    placed = {int(p): (int(r), int(k)) for p, r, k in found}
    expected = {d: (r, k) for r, devs in enumerate(devices) for k, d in enumerate(devs)}
    assert placed == expected


@pytest.mark.slow
def test_snippet_trains_a_token_id_model_named_by_its_file(tmp_path):
    """tests/gpt_model.py's TinyGPT (token ids in, 512-word vocabulary)
    split embedding + 2 blocks | 2 blocks + head, 1F1B: the script loads
    the factory from the file's path with no PYTHONPATH (as ``pipesearch
    profile`` does) and feeds random token ids below --vocab-size; with
    float inputs the embedding refuses them."""
    names = ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
    plan = make_plan([3, 3], names, schedule="1f1b", m=2, mbs=2)
    script = tmp_path / "pipeline_torch.py"
    script.write_text(export_plan(plan, "torch")["files"]["pipeline_torch.py"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1",
                                                                        "GLOO_SOCKET_IFNAME": "lo"}

    def run(*extra):
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
             str(free_port()), str(script), str(TESTS / "gpt_model.py") + ":make_gpt", "--sample-shape", "16",
             "--steps", "2", *extra], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    res = run("--input-dtype", "long", "--vocab-size", "512")
    assert res.returncode == 0, res.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in res.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 2 and all(0 < x < 10 for x in losses)
    assert run().returncode != 0


@pytest.mark.slow
def test_snippet_checkpoints_every_layer_of_a_full_recompute_plan(tmp_path):
    """A plan that recomputes (``--recompute full``) gets a script that runs
    every layer of its stages under torch.utils.checkpoint: it says so, and
    its losses are the plain script's to the last bit (recomputing a
    forward gives the same activations; the model's weights and the
    inputs come from the same seeds)."""
    def losses(plan, name):
        out = _run_script(plan, tmp_path, name)
        return out, [line.split()[-1] for line in out.splitlines() if line.startswith("step ")]

    plain = make_plan([2, 6], NAMES, schedule="1f1b", m=4, mbs=8)
    full = make_plan([2, 6], NAMES, schedule="1f1b", m=4, mbs=8, recompute="full")
    out_plain, plain_losses = losses(plain, "plain.py")
    out_full, full_losses = losses(full, "full.py")
    assert "every layer checkpointed" in out_full and "checkpointed" not in out_plain
    assert len(full_losses) == 2 and full_losses == plain_losses
    assert "STAGE_RECOMPUTE = ['full', 'full']" in (tmp_path / "full.py").read_text()
    # a plan whose stages chose on their own (--recompute per-stage, or a profile's stage options): the
    # script checkpoints the layers of the stage that recomputes only (it was refused: "torch applies one
    # recompute setting to every stage")
    mixed = make_plan([2, 6], NAMES, schedule="1f1b", m=4, mbs=8, recompute="per-stage")
    mixed = replace(mixed, stages=(replace(mixed.stages[0], memory_option="full"), mixed.stages[1]))
    out_mixed, mixed_losses = losses(mixed, "mixed.py")
    lines = {line.split(":")[0]: line for line in out_mixed.splitlines() if line.startswith("process ")}
    assert set(lines) == {"process 0", "process 1"}, out_mixed
    assert "checkpointed" in lines["process 0"] and "checkpointed" not in lines["process 1"]
    assert mixed_losses == plain_losses


def _param_sums(plan, tmp_path, name: str, seed_by_replica: bool) -> dict:
    """Run the plan's script (2 steps) with a line per process giving the
    sum of its parameters; ``seed_by_replica``: each replica draws its own
    inputs. ``{(pipeline rank, replica): sum}``."""
    script = export_plan(plan, "torch")["files"]["pipeline_torch.py"]
    script = script.replace("    dist.destroy_process_group()", "    print(f'sums {pp_rank} {replica} "
                            "{sum(float(p.double().sum()) for p in params)!r}', flush=True)\n"
                            "    dist.destroy_process_group()")
    if seed_by_replica:
        script = script.replace("torch.manual_seed(args.seed)", "torch.manual_seed(args.seed + replica)")
        assert "args.seed + replica" in script
    (tmp_path / name).write_text(script)
    env = dict(os.environ, PYTHONPATH=str(TESTS), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                          str(plan.pp * plan.dp), "--master-port", str(free_port()), str(tmp_path / name),
                          "e2e_model:make_model", "--sample-shape", "1024", "--steps", "2"],
                         capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    return {(int(r), int(k)): float(v) for r, k, v in re.findall(r"sums (\d+) (\d+) ([-+0-9.eE]+)", res.stdout)}


@pytest.mark.slow
@pytest.mark.parametrize("schedule,split,kw", [
    ("1f1b", [2, 6], {}), ("interleaved-1f1b", [1, 3, 2, 2], dict(pp=2, vp=2))])
def test_replicas_average_their_gradients(schedule, split, kw, tmp_path):
    """pp 2 x dp 2: replicas fed different inputs end with the same
    parameters (each stage's gradients are all-reduced over its replicas
    after the pipeline's step); replicas fed the same inputs end where the
    one-replica plan does, to the last digit (the reduce averages: (g + g)
    / 2 = g exactly)."""
    plan = make_plan(split, NAMES, schedule=schedule, m=4, mbs=8, dp=2, **kw)
    own = _param_sums(plan, tmp_path, "own.py", seed_by_replica=True)
    assert len(own) == 4 and all(own[r, 0] == own[r, 1] for r in range(2))
    if schedule != "1f1b":
        return
    same = _param_sums(plan, tmp_path, "same.py", seed_by_replica=False)
    one = _param_sums(replace(plan, dp=1, stages=tuple(replace(st, devices=st.devices[:1]) for st in plan.stages)),
                      tmp_path, "one.py", seed_by_replica=False)
    assert all(same[r, k] == one[r, 0] for r in range(2) for k in range(2))
    assert own[0, 0] != one[0, 0]  # the replicas' own inputs moved them elsewhere: the reduce mixed both


@pytest.mark.slow
def test_snippet_trains_a_transformer_planned_from_its_config(tmp_path):
    """A tiny Llama config.json planned on two CPUs at pp 2 and exported to
    torch: the script builds pipesearch's chain of the HuggingFace model
    from the config (``pipesearch.profiler:hf_model_from_config
    --factory-arg config.json``) and trains the plan's stages. Its stages
    named torchtitan's modules (tok_embeddings, layers.N, norm), which no
    model the script can chain has."""
    pytest.importorskip("transformers")
    import json as _json

    from click.testing import CliRunner

    from pipesearch.cli import main
    from test_profiler import TINY_LLAMA

    (tmp_path / "config.json").write_text(_json.dumps(TINY_LLAMA))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        r = CliRunner().invoke(main, ["plan", "--model", "config.json", "--cluster", "1x2-cpu", "-b", "8", "--pp",
                                      "2", "--schedule", "1f1b", "--seq-len", "32", "--recompute", "none", "-q",
                                      "-o", "p.json"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(main, ["export", "p.json", "--format", "torch", "--files", "ex"])
        assert r.exit_code == 0, r.output
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(tmp_path / "ex" / "pipeline_torch.py"), "pipesearch.profiler:hf_model_from_config", "--factory-arg",
         "config.json", "--sample-shape", "32", "--input-dtype", "long", "--vocab-size",
         str(TINY_LLAMA["vocab_size"]), "--steps", "2"],
        capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in res.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 2 and all(0 < x < 10 for x in losses)


def _factory_sums(tmp_path, plan, factory_body: str, name: str) -> dict:
    """Run ``plan``'s script (2 steps) on a model module written from
    ``factory_body`` (the body of ``make_model()``, ``os``, ``torch`` and
    ``nn`` imported), printing each process's parameter sum at the end:
    ``{(pipeline rank, replica): sum}``."""
    (tmp_path / f"{name}.py").write_text("import os\n\nimport torch\nfrom torch import nn\n\n\ndef make_model():\n"
                                         + "".join(f"    {line}\n" for line in factory_body.splitlines()))
    script = export_plan(plan, "torch")["files"]["pipeline_torch.py"]
    script = script.replace("    dist.destroy_process_group()", "    print(f'sums {pp_rank} {replica} "
                            "{sum(float(p.double().sum()) for p in params)!r}', flush=True)\n"
                            "    dist.destroy_process_group()")
    (tmp_path / "run.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(plan.pp * plan.dp),
                          "--master-port", str(free_port()), str(tmp_path / "run.py"), f"{name}:make_model",
                          "--input-shape", "1024", "--steps", "2"],  # pipesearch profile's name of --sample-shape
                         capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    return {(int(r), int(k)): float(v) for r, k, v in re.findall(r"sums (\d+) (\d+) ([-+0-9.eE]+)", res.stdout)}


CHAIN = "return nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(8)])"


@pytest.mark.slow
def test_replicas_of_a_model_built_differently_on_each_rank_start_equal(tmp_path):
    """Bug: each torchrun process built its own initial weights (torch seeds
    each from the OS), so a stage's replicas started, and stayed, apart
    (their gradients averaged, their weights not: stage 0's parameter sums
    32.70 and 30.48 after 2 steps). A factory seeded by the process's rank
    differs even after the script's seed: every replica must end where
    replica 0 does (each stage's weights broadcast from it)."""
    plan = make_plan([2, 6], NAMES, schedule="1f1b", m=4, mbs=8, dp=2)
    sums = _factory_sums(tmp_path, plan, "torch.manual_seed(int(os.environ['RANK']))\n" + CHAIN, "by_rank")
    assert len(sums) == 4 and all(sums[r, 0] == sums[r, 1] for r in range(2)), sums


@pytest.mark.slow
def test_an_unseeded_model_is_built_from_the_scripts_seed(tmp_path):
    """A factory that does not seed: two runs of the script end with the same
    weights (built after torch.manual_seed(--seed)); before, each run (and
    each process) drew its own."""
    plan = make_plan([2, 6], NAMES, schedule="1f1b", m=4, mbs=8)
    first = _factory_sums(tmp_path, plan, CHAIN, "unseeded")
    assert len(first) == 2 and first == _factory_sums(tmp_path, plan, CHAIN, "unseeded")


@pytest.mark.slow
def test_a_layer_the_model_lacks_stops_the_script_saying_how_to_map_it(tmp_path):
    """A plan whose layer names are not the model's modules (a PipeDream
    profile's, say) ended in torch's AttributeError; the script now stops
    with the stage, the missing name and the export option that maps
    names."""
    plan = make_plan([2, 6], [f"b{i:02d}_Linear" for i in range(8)], schedule="1f1b", m=4, mbs=8)
    script = tmp_path / "pipeline_torch.py"
    script.write_text(export_plan(plan, "torch")["files"]["pipeline_torch.py"])
    env = dict(os.environ, PYTHONPATH=str(TESTS), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(free_port()), str(script), "e2e_model:make_model", "--sample-shape", "1024",
                          "--steps", "1"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode != 0
    assert "stage 0:" in res.stderr and "b00_Linear" in res.stderr and "--module-names" in res.stderr
