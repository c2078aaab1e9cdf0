"""Exports put every stage on the devices the plan gives it: the runtime's
own rank numbering (DeepSpeed's ProcessTopology, megatron-core's
RankGenerator) checked against the plan's devices, both placements of a
homogeneous cluster; torchtitan, whose mesh runs one of them, refuses the
other (and ``--runtime torchtitan`` / ``--placement data`` plan for it)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.errors import InputError
from pipesearch.export import export_plan, process_grid, rank_order
from pipesearch.plan import load_plan_file

# llama3-8b on 2 nodes x 8 H100, pp 2 x tp 2: dp 4 replicas of 2 stages on 8 tensor-parallel slots
ARGS = ["--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "2", "-b", "512", "--pp", "2", "--tp", "2",
        "--schedule", "1f1b", "--top", "1", "-q"]


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory):
    out = {}
    for placement in ("pipeline", "data"):
        path = tmp_path_factory.mktemp(placement) / "plan.json"
        res = CliRunner().invoke(main, ["plan", *ARGS, "--placement", placement, "-o", str(path)])
        assert res.exit_code == 0, res.output
        out[placement] = path
    return out


def _plan_and_inputs(path):
    doc = load_plan_file(path)
    return doc.plans[0], doc.inputs


def test_both_placements_give_their_process_grid(plan_files):
    # by hand: tp slots 0..7 in device order; pipeline placement: replica k's stages on slots 2k, 2k+1;
    # data placement: stage r's replicas on slots 4r .. 4r+3
    want = {"pipeline": [[2 * k + r for k in range(4)] for r in range(2)],
            "data": [[4 * r + k for k in range(4)] for r in range(2)]}
    for placement, path in plan_files.items():
        plan, _ = _plan_and_inputs(path)
        assert (plan.pp, plan.dp, plan.tp) == (2, 4, 2)
        assert process_grid(plan) == want[placement]
        assert rank_order(plan) == placement


def test_deepspeed_topology_puts_each_stage_on_its_planned_ranks(plan_files):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, ProcessTopology

    for placement, path in plan_files.items():
        plan, inputs = _plan_and_inputs(path)
        topo = export_plan(plan, "deepspeed", inputs=inputs)["pipeline_module"]["topology"]
        if topo["class"] == "ProcessTopology":
            built = ProcessTopology(axes=topo["axes"], dims=topo["dims"])
        else:
            assert topo["class"] == "PipeModelDataParallelTopology"
            built = PipeModelDataParallelTopology(num_pp=topo["num_pp"], num_mp=topo["num_mp"], num_dp=topo["num_dp"])
        grid = process_grid(plan)
        for r in range(plan.pp):
            for k in range(plan.dp):
                for t in range(plan.tp):  # the tensor-parallel group of slot grid[r][k]: ranks tp * slot + t
                    assert built.get_rank(pipe=r, data=k, model=t) == plan.tp * grid[r][k] + t, placement


def test_megatron_rank_order_puts_each_stage_on_its_planned_ranks(plan_files):
    pytest.importorskip("megatron.core")
    from megatron.core.parallel_state import RankGenerator

    for placement, path in plan_files.items():
        plan, inputs = _plan_and_inputs(path)
        args = export_plan(plan, "megatron", inputs=inputs)["args"]
        order = "tp-cp-ep-pp-dp" if "--use-tp-pp-dp-mapping" in args else "tp-cp-ep-dp-pp"
        assert (order == "tp-cp-ep-pp-dp") == (placement == "pipeline")
        pipelines = RankGenerator(tp=plan.tp, ep=1, dp=plan.dp, pp=plan.pp, cp=1, order=order).get_ranks("pp")
        grid = process_grid(plan)
        want = {tuple(plan.tp * grid[r][k] + t for r in range(plan.pp)) for k in range(plan.dp) for t in range(plan.tp)}
        assert {tuple(p) for p in pipelines} == want, placement


def test_torchtitan_refuses_the_pipeline_placement_and_plans_for_its_own(plan_files, tmp_path):
    plan, inputs = _plan_and_inputs(plan_files["pipeline"])
    with pytest.raises(InputError, match=r"pp outermost.*--placement data"):
        export_plan(plan, "torchtitan", inputs=inputs)
    with pytest.raises(InputError, match=r"pp outermost"):
        export_plan(plan, "torchtitan", inputs=inputs, torchtitan_version="0.2")
    plan, inputs = _plan_and_inputs(plan_files["data"])
    assert export_plan(plan, "torchtitan", inputs=inputs)["parallelism"]["pipeline_parallel_degree"] == 2
    # --runtime torchtitan searches the data placement alone
    out = tmp_path / "t.json"
    res = CliRunner().invoke(main, ["plan", *ARGS, "--runtime", "torchtitan", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert rank_order(load_plan_file(out).plans[0]) == "data"


def test_placement_pins_are_honoured_or_refused(tmp_path):
    res = CliRunner().invoke(main, ["plan", "--schedule", "gpipe", "--placement", "data", "--runtime", "gpipe"])
    assert res.exit_code == 2 and "gpipe runs the pipeline placement only" in res.output
    # on a cluster of several groups the pin keeps its pattern (tests/test_search_mixed.py checks the layouts)
    out = tmp_path / "m.json"
    res = CliRunner().invoke(main, ["plan", "--cluster", "tests/data/mixed-16-3types.toml", "--model",
                                    "tests/data/synthetic-64.csv", "--placement", "data", "--pp", "4", "--dp", "4",
                                    "--top", "1", "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["plans"][0]["options"]["placement"] != "pipeline-major"


def test_custom_order_with_tp_is_pointed_at_the_stage_list():
    """A plan whose tensor-parallel groups run in an order of their own (on
    two nodes of 4 devices: stage 1 on the first node's first group, stage
    0 on its second, stage 2 on the second node: no launch order of whole
    nodes reproduces it). With tp = 1 the torch export's script places every
    stage (its GRID); with tp > 1 it writes no script, so the refusal points
    to the stage list (every stage's devices, ``stages-json``) instead, and
    that export works. On one node of one type any order of its devices
    runs the same times: no refusal."""
    from test_export import make_plan, transformer_names

    plan = make_plan([2, 2, 2], transformer_names(4), schedule="1f1b", m=4, tp=2)
    plan = replace(plan, stages=tuple(replace(st, devices=(d,)) for st, d in zip(plan.stages, (2, 0, 4))))
    inputs = {"cluster": {"groups": [{"device": "a100-80gb", "nodes": 2, "devices_per_node": 4, "first_device": 0}]}}
    assert rank_order(plan, inputs) is None
    with pytest.raises(InputError, match="--format stages-json") as info:
        export_plan(plan, "megatron", inputs=inputs)
    assert "--format torch" not in str(info.value)
    assert "pipeline rank 0 on device 2" in str(info.value)
    assert export_plan(plan, "stages-json", inputs=inputs)["stages"]
    one_node = {"cluster": {"groups": [{"device": "a100-80gb", "nodes": 1, "devices_per_node": 8, "first_device": 0}]}}
    assert export_plan(plan, "megatron", inputs=one_node)["args"]


def _two_node_cluster(tmp_path, first, second):
    path = tmp_path / f"{first}-{second}.toml"
    path.write_text(f'name = "two"\n[[groups]]\nnodes = 1\ndevices_per_node = 8\ndevice = "{first}"\n'
                    f'[[groups]]\nnodes = 1\ndevices_per_node = 8\ndevice = "{second}"\n'
                    '[intra_node]\nbandwidth_GBps = 300\nlatency_us = 5\n'
                    '[inter_node]\nbandwidth_GBps = 25\nlatency_us = 10\n'
                    '[inter_group]\nbandwidth_GBps = 25\nlatency_us = 10\n')
    return path


def test_a_runtime_plan_does_not_depend_on_the_order_of_the_groups(tmp_path):
    """One H100 node and one A100 node, listed either way: --runtime
    torchtitan keeps the same best plan (it dropped the data-major plan
    whose H100 node is the cluster's second, as not in mesh order, though
    launching that node first runs it), and the export says which node
    starts: NODE_RANK 0 on the H100 node (devices 8-15 when it is listed
    second; devices 0-7 when first: on nodes of two device types the
    index of each is what the split rests on, so it is said then too)."""
    times, notes = [], []
    for first, second in (("h100-80gb", "a100-80gb"), ("a100-80gb", "h100-80gb")):
        out = tmp_path / f"{first}.json"
        res = CliRunner().invoke(main, ["plan", "-q", "--model", "llama2-13b", "--cluster",
                                        str(_two_node_cluster(tmp_path, first, second)), "-b", "512", "--top", "1",
                                        "--runtime", "torchtitan", "--pp", "4", "--tp", "2", "-o", str(out)])
        assert res.exit_code == 0, res.output
        times.append(json.loads(out.read_text())["plans"][0]["predicted"]["iteration_time_s"])
        exp = CliRunner().invoke(main, ["export", str(out), "--format", "torchtitan"])
        assert exp.exit_code == 0, exp.output
        notes.append(" ".join(json.loads(exp.output)["notes"]))
    assert times[0] == times[1]
    assert "NODE_RANK 0 on node 0 of the cluster (devices 0-7, h100-80gb); 1 on node 1 of the cluster " \
           "(devices 8-15, a100-80gb)" in notes[0]
    assert "NODE_RANK 0 on node 1 of the cluster (devices 8-15, h100-80gb)" in notes[1]
    assert "NODE_RANK 1 on node 0 of the cluster (devices 0-7, a100-80gb)" in notes[1]


def test_a_job_on_the_second_node_names_it():
    """A plan on devices 8-15 of two nodes of 8 runs its processes 0..7
    there (the grid counts from that node) and the export says where."""
    from pipesearch.export import launch_note, process_grid, rank_order
    from test_export import make_plan

    plan = make_plan([4, 4], schedule="1f1b", m=4, dp=4)
    plan = replace(plan, stages=tuple(replace(st, devices=tuple(range(8 + 4 * s, 12 + 4 * s)))
                                      for s, st in enumerate(plan.stages)))
    inputs = {"cluster": {"groups": [{"device": "a100-80gb", "nodes": 1, "devices_per_node": 8, "first_device": 0},
                                     {"device": "h100-80gb", "nodes": 1, "devices_per_node": 8, "first_device": 8}]}}
    assert process_grid(plan, inputs) == [[0, 1, 2, 3], [4, 5, 6, 7]] and rank_order(plan, inputs) == "data"
    assert launch_note(plan, inputs) == "run it on node 1 of the cluster (devices 8-15, h100-80gb), where the plan " \
                                        "puts its stages."


def test_torchtitan_takes_any_order_of_one_node(tmp_path):
    """On one node of 8 H100 (one type, one NVLink between any two) the
    pipeline placement (replica k's stages on devices 2k, 2k+1) and
    torchtitan's mesh (stage r's replicas on devices 4r .. 4r+3) give every
    stage the same device type and links, so the export runs it."""
    out = tmp_path / "one.json"
    res = CliRunner().invoke(main, ["plan", *ARGS[:ARGS.index("--nodes")], "--nodes", "1", "-b", "512", "--pp", "2",
                                    "--tp", "1", "--schedule", "1f1b", "--top", "1", "-q", "--placement", "pipeline",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan, inputs = _plan_and_inputs(out)
    assert (plan.pp, plan.dp, plan.tp) == (2, 4, 1) and rank_order(plan, inputs) == "pipeline"
    assert export_plan(plan, "torchtitan", inputs=inputs)["parallelism"]["pipeline_parallel_degree"] == 2
