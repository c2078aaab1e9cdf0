"""Exports put every stage on the devices the plan gives it: the runtime's
own rank numbering (DeepSpeed's ProcessTopology, megatron-core's
RankGenerator) checked against the plan's devices, both placements of a
homogeneous cluster; torchtitan, whose mesh runs one of them, refuses the
other (and ``--runtime torchtitan`` / ``--placement data`` plan for it)."""

from __future__ import annotations

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
    res = CliRunner().invoke(main, ["plan", "--cluster", "tests/data/mixed-16-3types.toml", "--model",
                                    "tests/data/synthetic-64.csv", "--placement", "data", "-q"])
    assert res.exit_code == 2 and "clusters of one group" in res.output and "Traceback" not in res.output


def test_custom_order_with_tp_is_pointed_at_the_stage_list(tmp_path):
    """A mixed-cluster plan orders its tensor-parallel slots by its own
    mapping, which no runtime's rank numbering reproduces. With tp = 1 the
    torch export's script places every stage (its GRID); with tp > 1 it
    writes no script, so the refusal points to the stage list (every
    stage's devices, ``stages-json``) instead, and that export works."""
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "llama3-8b", "--cluster", "tests/data/mixed-16-3types.toml",
                                    "--tp", "2", "-b", "64", "--top", "1", "--schedule", "1f1b", "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan = load_plan_file(out).plans[0]
    assert plan.tp == 2 and rank_order(plan) is None
    res = CliRunner().invoke(main, ["export", str(out), "--format", "megatron", "-o", str(tmp_path / "m")])
    assert res.exit_code == 2
    assert "--format stages-json" in res.output and "--format torch" not in res.output
    res = CliRunner().invoke(main, ["export", str(out), "--format", "stages-json", "-o", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
