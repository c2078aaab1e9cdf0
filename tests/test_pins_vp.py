"""A pinned ``--vp`` is honoured or refused, for every schedule that runs
virtual stages (interleaved 1F1B, looped BFS, Mobius, RoundPipe).

Oracles: the plan's own vp (every returned plan must carry a pinned value),
and the stage count ``pp x vp`` against the layers (a virtual stage needs
a layer: with 3 layers no pp >= 2 point of vp 2 exists, so a pinned
``--vp 2`` has no plan and must say so, where unpinned vp would fall back to
pp 1's single stage).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import pcie_host, tiny_cluster, tiny_profile
from pipesearch.cli import main
from pipesearch.errors import InfeasibleError
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job

GB = 1e9
MULTI = ("interleaved-1f1b", "looped-bfs", "mobius", "roundpipe")


def _world(num_layers: int):
    """``num_layers`` equal layers (1 ms forward, 2 ms backward, 1e6
    parameters, 1 MB out) on 4 GPUs of 80 GB with a host table (two GPUs a
    PCIe switch), so that Mobius and RoundPipe run too."""
    prof = tiny_profile([1e-3] * num_layers, params=[4e6] * num_layers, outputs=[1e6] * num_layers,
                        bytes_per_param=4.0)
    host = pcie_host(pcie_switches=((0, 1), (2, 3)), cpu_adam_params_per_s=1e10)
    return prof, replace(tiny_cluster(1, 4, memory_bytes=80 * GB), host=host)


@pytest.mark.parametrize("schedule", MULTI)
def test_every_plan_has_the_pinned_vp(schedule):
    """8 layers, global batch 4, pinned vp 2 without pp: every plan of every
    schedule runs 2 virtual stages per device over pp >= 2 ranks. Unpinned,
    looped BFS, Mobius and RoundPipe also rank pp 1 (vp 1) plans here, which
    the pin must exclude (interleaved 1F1B refuses pp 1 by itself)."""
    prof, cluster = _world(8)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    base = SearchOptions(schedules=(schedule,), vps=(2,), top=10, exhaustive=True)
    pinned = search([ModelVariant(prof)], cluster, job, replace(base, vp_pinned=True)).plans
    assert pinned and all(p.vp == 2 and p.pp >= 2 and len(p.stages) == 2 * p.pp for p in pinned)
    free = search([ModelVariant(prof)], cluster, job, base).plans
    if schedule != "interleaved-1f1b":
        assert any(p.vp == 1 and p.pp == 1 for p in free)  # what the pin removes


@pytest.mark.parametrize("schedule", MULTI)
def test_a_pinned_vp_no_point_can_take_is_refused_naming_vp(schedule):
    """3 layers: pp 2 x vp 2 = 4 virtual stages already exceed them, so
    pinned vp 2 leaves no point; the refusal names --vp and pp >= 2. With vp
    1 also pinned, pp 1's plan honours the pin and is returned."""
    prof, cluster = _world(3)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    opts = SearchOptions(schedules=(schedule,), vps=(2,), top=3, vp_pinned=True)
    with pytest.raises(InfeasibleError, match=r"^--vp 2 needs pp >= 2 .*no plan with pp >= 2 fits"):
        search([ModelVariant(prof)], cluster, job, opts)
    if schedule != "interleaved-1f1b":  # interleaving refuses vp 1
        plans = search([ModelVariant(prof)], cluster, job, replace(opts, vps=(1, 2))).plans
        assert plans and all(p.vp in (1, 2) for p in plans)


def _csv(tmp_path: Path, num_layers: int) -> Path:
    path = tmp_path / "three.csv"
    rows = "\n".join(f"l{k},1.0,2.0,4000000,1000000,1000000" for k in range(num_layers))
    path.write_text("# pipesearch profile v1\n# model: three\n# batch_size: 1\n# bytes_per_param: 4\n"
                    "name,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes\n" + rows + "\n")
    return path


def _one_line_refusal(result, *needles):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "looped-bfs"])
def test_cli_pinned_vp_without_pp_is_refused_when_only_pp_1_fits(tmp_path, schedule):
    model = _csv(tmp_path, 3)
    r = CliRunner().invoke(main, ["plan", "-q", "--model", str(model), "--cluster", "1x4-v100-pcie", "-b", "4",
                                  "--vp", "2", "--schedule", schedule])
    _one_line_refusal(r, "--vp 2 needs pp >= 2", "no plan with pp >= 2 fits")


def test_cli_pinned_vp_is_honoured_by_looped_bfs(tmp_path):
    """vgg16 at global batch 1 (one micro-batch): unpinned, looped BFS ranks
    pp 1 first (one stage, no fill or drain); with --vp 2 every plan has vp 2."""
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "1",
                                  "--vp", "2", "--schedule", "looped-bfs", "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    import json
    plans = json.loads(r.output)["plans"]
    assert plans and all(p["parallelism"]["vp"] == 2 and p["parallelism"]["pp"] >= 2 for p in plans)
    assert not out.exists()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_cli_single_stage_schedule_beside_a_pinned_vp_is_refused(schedule):
    """A single-stage schedule runs vp 1: next to a multi-stage one and a
    pinned vp 2 its plans could not honour the pin; refused, naming both."""
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--vp", "2",
                                  "--schedule", schedule, "--schedule", "looped-bfs"])
    _one_line_refusal(r, "--vp 2", f"--schedule {schedule}", "vp 1")


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_cli_single_stage_schedule_alone_refuses_vp(schedule):
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--vp", "2",
                                  "--schedule", schedule])
    _one_line_refusal(r, "--vp 2", f"--schedule asks for {schedule}")


def test_cli_vp_with_a_split_and_no_schedule_names_the_split_not_a_schedule_flag():
    """A --split without --schedule is searched one stage per device; the
    refusal of --vp 2 said "--schedule asks for gpipe, 1f1b, zb-h1" though
    no --schedule was given."""
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--split",
                                  "10,10,10,10", "--pp", "2", "--vp", "2", "--vp", "1"])
    _one_line_refusal(r, "--vp 2,1", "--split 10,10,10,10 without --schedule is searched (one stage per device)")
    assert "--schedule asks for" not in r.output


def test_cli_vp_1_with_a_single_stage_schedule_is_honoured():
    """--vp 1 pins one stage per device: 1F1B and looped BFS both honour it."""
    import json

    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "64",
                                  "--vp", "1", "--schedule", "1f1b", "--schedule", "looped-bfs", "--top", "3",
                                  "--json"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    assert plans and all(p["parallelism"]["vp"] == 1 for p in plans)


def test_cli_vp_1_beside_interleaving_is_refused():
    """Interleaved 1F1B needs vp >= 2: with vp 1 the only pin, asking for it
    beside looped BFS is refused naming it (before, its points were all
    refused one by one and the plans came from looped BFS alone)."""
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--vp", "1",
                                  "--schedule", "interleaved-1f1b", "--schedule", "looped-bfs"])
    _one_line_refusal(r, "--vp 1 with --schedule interleaved-1f1b", "at least 2 virtual stages")


def test_cli_vp_1_alone_keeps_the_single_stage_defaults():
    """--vp 1 without --schedule: the default schedules that run vp 1
    (gpipe, 1f1b, zb-h1); every plan has vp 1."""
    import json

    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "64",
                                  "--vp", "1", "--top", "5", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert set(doc["inputs"]["job"]["schedules"]) == {"gpipe", "1f1b", "zb-h1"}
    assert all(p["parallelism"]["vp"] == 1 for p in doc["plans"])


def test_the_pin_is_part_of_the_fingerprint():
    """Same inputs, vp pinned or not: different answers, so different
    fingerprints (the plan file says which search produced it)."""
    prof, cluster = _world(8)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    base = SearchOptions(schedules=("looped-bfs",), vps=(2,), top=2)
    free = search([ModelVariant(prof)], cluster, job, base)
    pinned = search([ModelVariant(prof)], cluster, job, replace(base, vp_pinned=True))
    assert free.fingerprint != pinned.fingerprint
    assert search([ModelVariant(prof)], cluster, job, base).fingerprint == free.fingerprint


def test_cli_vp_1_with_interleaving_alone_is_refused_beside_vp_2():
    """--vp 1 --vp 2 with interleaved 1F1B alone: its plans all had vp 2 and
    the pinned 1 was dropped without a word; refused, naming vp 1."""
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--vp", "1",
                                  "--vp", "2", "--schedule", "interleaved-1f1b"])
    _one_line_refusal(r, "--vp 1,2 with --schedule interleaved-1f1b", "vp 1 could not be honoured")


def test_cli_vp_with_a_runtime_of_one_stage_per_device_names_the_runtime():
    """The gpipe runtime runs GPipe alone (vp 1): a pinned --vp 2 ended in
    "no plan fits ... use a larger cluster"; refused naming both pins."""
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--runtime",
                                  "gpipe", "--vp", "2"])
    _one_line_refusal(r, "--vp 2 with --runtime gpipe", "one stage per device", "drop --vp",
                      "runtime with virtual stages (torch)")  # not torchtitan or megatron: they build LLMs only
    assert "larger cluster" not in r.output


@pytest.mark.parametrize("vp, needles", [
    (2, ["--split of 4 stages with --vp 2: add --pp 2"]),
    (4, ["--split of 4 stages with --vp 4", "2 or more ranks", "drop --vp"]),
])
def test_cli_split_and_vp_without_pp_name_the_pp_to_add(vp, needles):
    """--split of 4 stages with --vp and no --pp: the split alone reads as pp
    4, and the refusal said "needs --pp and --vp with pp x vp = 4 (here pp 4
    x vp 2 = 8 ...)", a pp nobody gave; it now names the --pp to add (4 / 2),
    or, with --vp 4 (one rank would hold all 4), says the split cannot be.
    With the --pp it names, the plan runs pp 2 x vp 2 on the split."""
    import json

    base = ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "64", "--split", "10,10,10,10",
            "--vp", str(vp)]
    _one_line_refusal(CliRunner().invoke(main, base), *needles)
    if vp == 2:
        r = CliRunner().invoke(main, [*base, "--pp", "2", "--top", "2", "--json"])
        assert r.exit_code == 0, r.output
        plans = json.loads(r.output)["plans"]
        assert plans and all((p["parallelism"]["pp"], p["parallelism"]["vp"]) == (2, 2) for p in plans)


@pytest.mark.parametrize("schedules, split, needles", [
    (["interleaved-1f1b"], "10,10,10,10", ["add --pp and --vp with pp x vp = 4 (--pp 2 --vp 2)"]),
    (["interleaved-1f1b"], "5,5,5,5,5,5,5,5", ["pp x vp = 8 (--pp 4 --vp 2 or --pp 2 --vp 4)"]),
    (["looped-bfs"], "13,13,14", ["pp and vp of 2 or more", "--schedule gpipe, 1f1b or zb-h1"]),
    (["interleaved-1f1b", "1f1b"], "10,10,10,10", ["1f1b would run it one stage per rank (pp 4)", "add --pp"]),
])
def test_cli_split_for_virtual_stages_without_pp_names_the_pins_to_add(schedules, split, needles):
    """A split and only schedules of several stages per rank (or both
    kinds), no --pp: the fix named is one that works (--schedule 1f1b was
    suggested beside a pinned --vp, which then refused it)."""
    args = ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--split", split]
    for schedule in schedules:
        args += ["--schedule", schedule]
    _one_line_refusal(CliRunner().invoke(main, args), *needles)


@pytest.mark.parametrize("schedule, split, pins, needles", [
    ("mobius", "10,10,10,10", ["--activation-offload"],
     ["--vp 1 for one each (pp 4)", "pp x vp = 4 (e.g. --pp 2 --vp 2)"]),
    ("roundpipe", "20,20", [], ["--vp 1 for one each (pp 2), or --pp and --vp with pp x vp = 2"]),
])
def test_cli_split_for_a_host_schedule_names_vp_1(schedule, split, pins, needles):
    """Mobius and RoundPipe also run a split one stage per rank: the refusal
    of a split without its stages per rank asked for --pp and --vp, where
    --vp 1 alone plans it. It names --vp 1 first, and --vp 1 plans the
    split on as many ranks as it has stages."""
    import json

    args = ["plan", "-q", "--model", "vgg16", "--cluster", "1x8-rtx4090-pcie4", "-b", "64", "--split", split,
            "--schedule", schedule, *pins]
    _one_line_refusal(CliRunner().invoke(main, args), *needles)
    r = CliRunner().invoke(main, [*args, "--vp", "1", "--json", "--top", "1"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)["plans"][0]
    assert plan["parallelism"]["pp"] == len(split.split(",")) and plan["parallelism"]["vp"] == 1
    assert [s["layers"][1] - s["layers"][0] for s in plan["stages"]] == [int(x) for x in split.split(",")]


@pytest.mark.parametrize("once, twice", [
    (["--schedule", "1f1b"], ["--schedule", "1f1b", "--schedule", "1f1b"]),
    (["--schedule", "interleaved-1f1b", "--vp", "2"], ["--schedule", "interleaved-1f1b", "--vp", "2", "--vp", "2"]),
    (["--cluster", "4x4-v100-10gbe", "--placement", "data"],
     ["--cluster", "4x4-v100-10gbe", "--placement", "data", "--placement", "data"]),
])
def test_cli_repeated_values_are_one_pin(once, twice):
    """--schedule 1f1b twice searched every 1F1B point twice (more points
    evaluated, doubled skip counts) and recorded the schedule twice; --vp 2
    twice evaluated 16 interleaved points instead of 8."""
    import json

    args = ["plan", "-q", "--model", "vgg16", "-b", "64", "--json"]
    args += [] if "--cluster" in once else ["--cluster", "1x4-v100-pcie"]
    one = json.loads(CliRunner().invoke(main, args + once).output)
    two = json.loads(CliRunner().invoke(main, args + twice).output)
    assert two["inputs"]["job"]["schedules"] == one["inputs"]["job"]["schedules"]
    assert two["search"]["points_evaluated"] == one["search"]["points_evaluated"]
    assert two["search"]["infeasible"] == one["search"]["infeasible"]
