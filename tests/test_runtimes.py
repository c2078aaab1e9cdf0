"""``plan --runtime``: only plans the runtime runs as written; pins it cannot
run are refused with the rule and the nearest valid values."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.errors import InputError
from pipesearch.runtimes import SCHEDULES, check_pins, schedules_for

LLAMA = ["plan", "--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "2", "-b", "512", "-q"]


def run(args):
    return CliRunner().invoke(main, args)


@pytest.mark.parametrize("runtime", ["megatron", "deepspeed", "torchtitan"])
def test_every_plan_runs_on_the_runtime(runtime, tmp_path):
    out = tmp_path / "p.json"
    res = run(LLAMA + ["--runtime", runtime, "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["inputs"]["runtime"] == runtime
    plans = doc["plans"]
    assert [p["rank"] for p in plans] == list(range(1, len(plans) + 1)) and len(plans) == 5
    for p in plans:
        assert p["schedule"]["name"] in SCHEDULES[runtime]
        assert "refused" not in p["exports"][runtime]


def test_default_search_ranks_plans_megatron_cannot_run_and_runtime_drops_them(tmp_path):
    # tp 1: no tensor-parallel collective for the zero-bubble input pass to wait for, ZB-H1 ranks among the first
    out = tmp_path / "all.json"
    assert run(LLAMA + ["--tp", "1", "-o", str(out)]).exit_code == 0
    doc = json.loads(out.read_text())
    assert any("refused" in p["exports"]["megatron"] for p in doc["plans"])  # e.g. a zb-h1 plan


def test_megatron_interleaved_m_rule_names_the_nearest_m(tmp_path):
    out = tmp_path / "p.json"
    res = run(LLAMA + ["--runtime", "megatron", "--pp", "6", "--schedule", "interleaved-1f1b",
                       "--num-micro-batches", "3", "-o", str(out)])
    assert res.exit_code == 2
    assert "m must be a multiple of 6: try --num-micro-batches 6 or 12" in res.output
    assert "Traceback" not in res.output and "raise --pp" not in res.output and not out.exists()


def test_interleaved_m_rules_per_runtime():
    # Megatron refuses m % pp != 0 itself; torch's ScheduleInterleaved1F1B would run m = 3 on pp = 2
    # (rounds = max(1, 3 // 2) = 1 divides 3) but pipesearch's own interleaved order needs m % pp == 0
    with pytest.raises(InputError, match="Megatron-LM schedules.py.*multiple of 2: try --num-micro-batches 2 or 4"):
        check_pins("megatron", schedules=("interleaved-1f1b",), pp=2, num_micro_batches=3, tp=None)
    with pytest.raises(InputError, match="would run 3 micro-batches on pp 2.*multiple of 2: try --num-micro-batches 2"):
        check_pins("torch", schedules=("interleaved-1f1b",), pp=2, num_micro_batches=3, tp=None)
    check_pins("torch", schedules=("interleaved-1f1b",), pp=2, num_micro_batches=4, tp=None)
    # torch's rounds rule: 10 micro-batches on pp 4 is 2 rounds, 10 % 2 == 0 but 10 % 4 != 0
    with pytest.raises(InputError, match="try --num-micro-batches 8 or 12"):
        check_pins("torchtitan", schedules=("interleaved-1f1b",), pp=4, num_micro_batches=10, tp=None)


def test_schedule_requests():
    assert schedules_for("deepspeed", ("gpipe", "1f1b"), explicit=False) == ("1f1b",)
    with pytest.raises(InputError, match="deepspeed has no 'gpipe' schedule; it runs 1f1b"):
        schedules_for("deepspeed", ("gpipe",), explicit=True)
    with pytest.raises(InputError, match="Schedule1F1B needs at least as many micro-batches"):
        check_pins("torch", schedules=("1f1b",), pp=4, num_micro_batches=2, tp=None)
    with pytest.raises(InputError, match="no tensor parallelism"):
        check_pins("gpipe", schedules=("gpipe",), pp=4, num_micro_batches=8, tp=2)


def test_gpipe_runtime_plans_without_tensor_parallelism(tmp_path):
    out = tmp_path / "g.json"
    res = run(["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "512", "--runtime", "gpipe",
               "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    plans = json.loads(out.read_text())["plans"]
    assert plans and all(p["parallelism"]["tp"] == 1 and p["schedule"]["name"] == "gpipe" for p in plans)
    assert all("refused" not in p["exports"]["gpipe"] for p in plans)


def test_gpipe_runtime_keeps_each_pipeline_on_one_node(tmp_path):
    """torchgpipe drives a replica's partitions from one process: on 4
    nodes of 4 V100s every kept plan's replicas each sit on one node (node
    = device // 4; the search tries the placement of consecutive stages
    only), and the export of a plan that spreads a replica over
    nodes (its 4 x 4 plan laid out stage-major: replica 0 on devices 0, 4,
    8, 12, nodes 0 to 3) is refused naming them."""
    from pipesearch.export import Inputs
    from pipesearch.export.gpipe import export_gpipe
    from pipesearch.plan import load_plan_file

    out = tmp_path / "g.json"
    res = run(["plan", "--model", "vgg16", "--cluster", "4x4-v100-10gbe", "-b", "1024", "--runtime", "gpipe",
               "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    loaded = load_plan_file(out)
    for plan in loaded.plans:
        for r in range(plan.dp):
            assert len({st.devices[r] // 4 for st in plan.stages}) == 1, (plan.rank, r)
    # pp 2 x dp 8 runs too, its replicas' stages on consecutive devices (not dropped with its other layout)
    assert [p.pp for p in loaded.plans if p.dp == 8] == [2]
    plan = next(p for p in loaded.plans if p.pp == 4 and p.dp == 4)
    # the same plan laid out stage-major: stage k on devices 4k .. 4k + 3 (its own node), replica r on r, 4 + r, ...
    plan = replace(plan, stages=tuple(replace(st, devices=tuple(range(4 * k, 4 * k + 4)))
                                      for k, st in enumerate(plan.stages)))
    with pytest.raises(InputError, match=r"replica 0's partitions are on devices \[0, 4, 8, 12\], "
                                         r"nodes \[0, 1, 2, 3\]"):
        export_gpipe(plan, inputs=Inputs.of(loaded.inputs))
    # the nodes in the order the partitions reach them (they were sorted: devices [12, 0, ...], nodes [0, 3, ...])
    back = replace(plan, stages=tuple(replace(st, devices=tuple(range(12 - 4 * k, 16 - 4 * k)))
                                      for k, st in enumerate(plan.stages)))
    with pytest.raises(InputError, match=r"devices \[12, 8, 4, 0\], nodes \[3, 2, 1, 0\]"):
        export_gpipe(back, inputs=Inputs.of(loaded.inputs))


def test_exports_refuse_overlap_their_runtime_does_not_run():
    """A plan timed with --overlap-grad-reduce charged the gradient reduce
    as hidden; DeepSpeed's pipeline engine and torchgpipe reduce after the
    pipeline, so their exports refuse it, while Megatron-LM, torch (DDP's
    reducer) and torchtitan (FSDP2) run it. --overlap-param-gather is
    Megatron-LM's and torchtitan's only."""
    from pipesearch.export import refuse_unplanned_overlap, Inputs

    grad = Inputs.of({"job": {"comm_overlap": {"grad_reduce": True}}})
    for fmt in ("deepspeed", "gpipe"):
        with pytest.raises(InputError, match=f"export {fmt}: .*--overlap-grad-reduce"):
            refuse_unplanned_overlap(fmt, grad)
    for fmt in ("megatron", "torch", "torchtitan"):
        refuse_unplanned_overlap(fmt, grad)
    gather = Inputs.of({"job": {"comm_overlap": {"param_gather": True}}})
    with pytest.raises(InputError, match="--overlap-param-gather"):
        refuse_unplanned_overlap("torch", gather)
    refuse_unplanned_overlap("deepspeed", Inputs.of({"job": {"comm_overlap": {}}}))


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan", "torch"])
def test_a_split_without_schedule_is_searched_one_stage_per_device_as_without_runtime(runtime):
    """--split of pp stages with --pp and no --schedule: one stage per device,
    as without --runtime (the runtime's interleaved schedule is not asked
    for), so the pins are scored with the runtime's one-stage schedules."""
    # torchtitan refuses a tied embedding over stages: an untied model of 34 layers there
    model, split = ("llama2-7b", (8, 9, 9, 8)) if runtime == "torchtitan" else ("gpt3-1.3b", (5, 7, 7, 7))
    args = ["plan", "--model", model, "--cluster", "2x8-a100-80gb", "-b", "64", "--pp", "4",
            "--split", ",".join(map(str, split)), "--json", "--top", "2", "--runtime", runtime]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    plans = json.loads(res.stdout)["plans"]
    assert plans
    for p in plans:
        assert p["schedule"]["name"] in SCHEDULES[runtime] and p["schedule"]["name"] != "interleaved-1f1b"
        assert [len(st["layer_names"]) for st in p["stages"]] == list(split)


def test_runtime_torch_plans_the_reduce_its_script_runs():
    """pipeline_torch.py all-reduces each stage's gradients after the
    pipeline's step: ``--runtime torch`` planned DDP's overlapped reduce,
    and its own export then warned that the script runs slower than
    planned. Planned as the script runs it, every stage's reduce is exposed
    (allreduce_s = dp_comm_s + the stage's optimizer step) and the export
    says nothing of it; asked for with --overlap-grad-reduce, the overlap
    is planned and the export warns."""
    from pipesearch.export import export_plan
    from pipesearch.plan import load_plan_text

    args = ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--tp", "1", "--pp", "4",
            "--schedule", "1f1b", "--top", "1", "--json", "-q", "--runtime", "torch"]
    for extra, overlapped in (([], False), (["--overlap-grad-reduce"], True)):
        res = CliRunner().invoke(main, args + extra)
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert bool(doc["inputs"]["job"]["comm_overlap"].get("grad_reduce")) == overlapped
        stages = doc["plans"][0]["stages"]
        assert any(st["dp_comm_s"] > 0 for st in stages)
        assert all(st["optimizer_step_s"] > 0 for st in stages)
        exposed = all(st["allreduce_s"] == pytest.approx(st["dp_comm_s"] + st["optimizer_step_s"], rel=1e-12)
                      for st in stages)
        assert exposed != overlapped
        pf = load_plan_text(res.stdout)
        notes = export_plan(pf.plans[0], "torch", inputs=pf.inputs)["notes"]
        assert any("overlapped with the backward" in n for n in notes) == overlapped


def test_runtime_deepspeed_plans_the_zero1_state_its_export_runs():
    """Without ZeRO a bf16 DeepSpeed pipeline runs its BF16_Optimizer (the
    fp32 master weights and moments split over the replicas, an all-gather
    after the step): ``--runtime deepspeed`` planned the whole state on
    every replica and its own export warned of the difference. It plans
    ZeRO-1 now (2 + 2 + 12/dp bytes per parameter, by hand below), which
    the export runs as written (stage 1, no warning)."""
    from pipesearch.export import export_plan
    from pipesearch.plan import load_plan_text

    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--tp",
                                    "1", "--pp", "2", "--dp", "4", "--schedule", "1f1b", "--top", "1", "--json", "-q",
                                    "--runtime", "deepspeed"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["inputs"]["job"]["zero1"] is True
    stage = doc["plans"][0]["stages"][0]
    parts = stage["memory_breakdown_bytes"]
    weights = parts["weights"]  # 2 bytes per parameter
    assert parts["grads"] == pytest.approx(weights, rel=1e-12)
    assert parts["master_weights"] + parts["optimizer_moments"] == pytest.approx(weights / 2 * 12 / 4, rel=1e-12)
    pf = load_plan_text(res.stdout)
    exp = export_plan(pf.plans[0], "deepspeed", inputs=pf.inputs)
    assert exp["config"]["zero_optimization"]["stage"] == 1
    assert not any("BF16_Optimizer" in n for n in exp["notes"])


def test_runtime_torch_plans_without_tensor_parallelism_unless_pinned():
    """The torch export writes no script for tp > 1: ``--runtime torch``
    ranked Llama-3 8B plans of tp 4 only, whose export --files then failed.
    It plans tp 1 (as gpipe); a pinned --tp 2 is planned as given."""
    base = ["plan", "--model", "llama3-8b", "--cluster", "1x8-a100-80gb", "-b", "64", "--top", "3", "--json", "-q",
            "--runtime", "torch"]
    for extra, tp in (([], 1), (["--tp", "2"], 2)):
        res = CliRunner().invoke(main, base + extra)
        assert res.exit_code == 0, res.output
        assert {p["parallelism"]["tp"] for p in json.loads(res.stdout)["plans"]} == {tp}


def _configuration(plan) -> tuple:
    """A plan's degrees, schedule, micro-batches and time (a :class:`pipesearch.types.Plan`)."""
    return (plan.pp, plan.dp, plan.tp, plan.schedule, plan.vp, plan.micro_batch_size, plan.num_micro_batches,
            round(plan.predicted.iteration_time_s, 12))


def test_runtime_torch_ranks_the_best_plans_torch_runs_with_top_configurations_only(tmp_path):
    """--runtime torch skips the points torch's schedule classes refuse
    (their rules depend on the point only) and keeps --top configurations:
    its 2 plans are the best torch-runnable ones of a search over torch's
    schedules that keeps 20, torch's refusals (the exporter's) dropped
    afterwards. A search that counted a refused point towards its top 2
    (the best plan is ZB-H1's) would rank a plan fewer; one that skipped a
    point torch runs would rank a slower plan in its place."""
    from pipesearch.plan import load_plan_file
    from pipesearch.runtimes import filter_plans

    # pp 3, 64 micro-batches: torch's ScheduleInterleavedZeroBubble runs rounds of max(1, 64 // 3) = 21
    base = ["plan", "--model", "gpt3-1.3b", "--cluster", "1x4-v100-pcie", "-b", "64", "--pp", "3", "-q"]
    schedules = [x for s in SCHEDULES["torch"] for x in ("--schedule", s)]
    wide, narrow = tmp_path / "wide.json", tmp_path / "narrow.json"
    assert run(base + schedules + ["--top", "20", "-o", str(wide)]).exit_code == 0
    res = run(base + ["--runtime", "torch", "--top", "2", "-o", str(narrow)])
    assert res.exit_code == 0, res.output
    wide_file = load_plan_file(wide)
    kept, refused = filter_plans("torch", wide_file.plans, 2, wide_file.inputs)
    assert refused  # the wide search ranks plans torch refuses (ZB-H1's)
    assert kept and [_configuration(p) for p in load_plan_file(narrow).plans] == [_configuration(p) for p in kept]


def test_runtime_torch_finds_the_micro_batch_count_torch_runs_in_a_pinned_family():
    """vgg16 on 2x8-a100-80gb, ZB-H1 pinned at pp 4 x dp 4, global batch
    252: 63 samples a replica, so m is 63, 21, 9, 7, 3 or 1 and
    ScheduleInterleavedZeroBubble (rounds max(1, m // 4)) with ZB-H1's m >=
    pp runs only m = 7 (63 % 15, 21 % 5, 9 % 2 are not 0; 3 and 1 are
    below 4). A search that kept the family's fastest plan and filtered
    afterwards refused its only plan (m = 63) and found none."""
    res = run(["plan", "--model", "vgg16", "--cluster", "2x8-a100-80gb", "-b", "252", "--pp", "4", "--dp", "4",
               "--schedule", "zb-h1", "--runtime", "torch", "--json", "-q"])
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)["plans"]
    assert [(p["schedule"]["micro_batch_size"], p["schedule"]["num_micro_batches"]) for p in plans] == [(9, 7)]
