"""``pipesearch simulate`` of a hand-edited plan file replays what the file
records and says, in one stderr line, that the replay disagrees with the
file's ``predicted.iteration_time_s`` (naming the file and both times), the
same for every schedule; an unedited file gets no warning.

Oracle: a stage's ``compute_s`` raised by 50 % lengthens the replay (every
stage's compute lies on some rank's chain of m micro-batches), so the
replayed time is above the file's; the file's time is the one written
before the edit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.cli.simulate_cmd import time_disagreement
from pipesearch.units import format_bytes

PLANS = {
    "1f1b": ["--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "64", "--pp", "2", "--schedule", "1f1b"],
    "interleaved-1f1b": ["--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--pp", "2", "--vp", "2",
                         "--schedule", "interleaved-1f1b"],
    "roundpipe": ["--model", "qwen3-1.7b", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "-b", "16",
                  "--pp", "2", "--schedule", "roundpipe"],
    "mobius": ["--model", "qwen3-1.7b", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "-b", "32",
               "--pp", "2", "--vp", "2", "--schedule", "mobius"],
}


@pytest.mark.parametrize("schedule", sorted(PLANS))
def test_simulate_warns_once_when_the_replay_disagrees_with_the_file(tmp_path, schedule):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--top", "1", "-o", str(out)] + PLANS[schedule])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["plans"][0]["schedule"]["name"] == schedule
    clean = CliRunner().invoke(main, ["simulate", str(out)])
    assert clean.exit_code == 0 and clean.stderr == "", clean.stderr
    recorded = doc["plans"][0]["predicted"]["iteration_time_s"]
    doc["plans"][0]["stages"][0]["compute_s"] *= 1.5
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["simulate", str(bad)])
    assert r.exit_code == 0, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {bad}: plan of rank 1:"), r.stderr
    assert f"predicted.iteration_time_s is {recorded!r} s" in lines[0]
    replayed = float(re.search(r"the replay takes ([0-9.e+-]+) s", lines[0]).group(1))
    assert replayed > recorded * (1 + 1e-6)
    shown = re.search(r"simulated iteration: ([0-9.]+) (m?s)", r.stdout)  # the figures printed are the replay's
    assert float(shown.group(1)) * (1e-3 if shown.group(2) == "ms" else 1) == pytest.approx(replayed, rel=2e-3)


@pytest.mark.parametrize("kind", ["stages", "timeline"])
def test_plot_of_one_plan_warns_as_simulate_does(tmp_path, kind):
    """A plan whose stage time was edited: the one-plan figures say so in
    the same one warning line as simulate (they drew it silently); the
    figure is still written, and a clean file draws without a warning."""
    out = tmp_path / "p.json"
    assert CliRunner().invoke(main, ["plan", "-q", "--top", "1", "-o", str(out)] + PLANS["1f1b"]).exit_code == 0
    clean = CliRunner().invoke(main, ["plot", str(out), "--kind", kind, "-o", str(tmp_path / "clean.png")])
    assert clean.exit_code == 0 and clean.stderr == "", clean.stderr
    doc = json.loads(out.read_text())
    doc["plans"][0]["stages"][0]["compute_s"] *= 1.5
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["plot", str(bad), "--kind", kind, "-o", str(tmp_path / "f.png")])
    assert r.exit_code == 0 and (tmp_path / "f.png").exists(), r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {bad}: plan of rank 1:") and "replay takes" in lines[0]
    # which numbers the figure shows: the stages figure the file's, the timeline the replay's (both said "the
    # figures below are the replay's", and a RoundPipe timeline's host step ended at the file's time)
    assert lines[0].endswith("the timeline drawn is the replay's" if kind == "timeline" else
                             "the stages figure draws the file's own stage times and figures"), lines[0]


def test_time_disagreement_tolerance():
    """1e-9 relative: 1 + 1e-10 agrees, 1 + 1e-8 does not."""
    assert time_disagreement("f.json", 1, 1.0 + 1e-10, 1.0) is None
    line = time_disagreement("f.json", 2, 1.0 + 1e-8, 1.0)
    assert line.startswith("f.json: plan of rank 2:") and "1.00000001 s" in line and "is 1.0 s" in line


@pytest.mark.parametrize("schedule,noted", [("zb-h1", True), ("1f1b", False)])
def test_simulate_says_its_zero_bubble_activations_are_held_whole(tmp_path, schedule, noted):
    """The simulator counts a micro-batch's activations whole until its
    weight gradient ``W``; the plan keeps only the ``W`` inputs after ``I``
    (docs/schedules.md), so under a zero-bubble schedule ``simulate`` says its
    per-rank figure is that upper bound; a schedule without ``I`` / ``W``
    actions has no such note."""
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "llama3-8b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                    "--pp", "8", "--schedule", schedule, "--recompute", "selective", "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["simulate", str(out)])
    assert res.exit_code == 0, res.output
    assert ("counted whole until its weight gradient W: an upper bound" in res.output) == noted
    # each rank's line leads with the plan's own activations (its memory breakdown), the bound after it
    stages = json.loads(out.read_text())["plans"][0]["stages"]
    ranks = [line for line in res.output.splitlines() if line.strip().startswith("rank ")]
    assert len(ranks) == len(stages) == 8
    for line, stage in zip(ranks, stages):
        shown = line.split("peak activations on the device ")[1]
        if noted:
            assert shown.startswith(format_bytes(stage["memory_breakdown_bytes"]["activations"]) + " (")
            assert shown.endswith(" held whole)")
        else:
            assert "held whole" not in shown


def test_a_schedule_edited_to_hold_more_micro_batches_is_refused_by_validate_and_warned_by_simulate(tmp_path):
    """A 1F1B plan of pp 2 at m = 32 micro-batches holds at most 2 of them on
    rank 0 (its warm-up); edited to GPipe, every one of the 32 is in flight
    before the first backward, 16 times rank 0's recorded activations and
    far above its recorded memory: ``validate`` names rank 0's
    ``memory_bytes`` and the edit, ``simulate`` warns with the same line.
    The time is fixed up to the replay's, so it is not among the problems."""
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--top", "1", "-o", str(out), "--model", "gpt3-1.3b", "--cluster",
                                  "1x8-a100-80gb", "-b", "32", "--pp", "2", "--dp", "1", "--micro-batch-size", "1",
                                  "--schedule", "1f1b"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    plan = doc["plans"][0]
    assert plan["schedule"]["num_micro_batches"] == 32
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
    plan["schedule"]["name"] = "gpipe"
    edited = tmp_path / "gpipe.json"
    edited.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["validate", str(edited)])
    replay = re.search(r"s found, ([0-9.e+-]+) s expected", r.output)
    assert replay, r.output
    ratio = float(replay.group(1)) / plan["predicted"]["iteration_time_s"]
    plan["predicted"]["iteration_time_s"] = float(replay.group(1))
    for key in ("samples_per_s", "tokens_per_s", "tokens_per_s_per_device", "mfu"):
        if key in plan["predicted"]:
            plan["predicted"][key] /= ratio
    edited.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["validate", str(edited)])
    assert r.exit_code == 2, r.output
    assert "plans[0].stages[0].memory_bytes: rank 0's stages record" in r.output, r.output
    assert "at most 32 micro-batches in flight" in r.output
    assert "predicted.iteration_time_s" not in r.output.split("error:")[0]
    s = CliRunner().invoke(main, ["simulate", str(edited)])
    assert s.exit_code == 0 and "rank 0's stages record" in s.stderr, s.stderr


def test_simulate_writes_its_outputs_all_or_none(tmp_path):
    """``--timeline`` and ``--torch-csv`` together: when the second cannot
    be written (a full device), the first is not left behind."""
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    out = tmp_path / "p.json"
    assert CliRunner().invoke(main, ["plan", "-q", "--top", "1", "-o", str(out)] + PLANS["1f1b"]).exit_code == 0
    full = tmp_path / "full.csv"  # a CSV name (--torch-csv wants one) on the full device
    full.symlink_to("/dev/full")
    r = CliRunner().invoke(main, ["simulate", str(out), "--timeline", str(tmp_path / "t.png"),
                                  "--torch-csv", str(full)])
    assert r.exit_code == 2 and "cannot write" in r.output, r.output
    assert not (tmp_path / "t.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.csv", "p.json"]


def test_a_plan_edited_to_take_no_time_replays_without_a_crash(tmp_path):
    """Every stage's times set to 0: the replay takes 0 s, each rank's busy
    share reads 0 % (it divided by the zero time: internal error), the
    warning names the edit, the timeline is drawn."""
    out = tmp_path / "p.json"
    assert CliRunner().invoke(main, ["plan", "-q", "--top", "1", "-o", str(out)] + PLANS["1f1b"]).exit_code == 0
    doc = json.loads(out.read_text())
    for st in doc["plans"][0]["stages"]:
        for key in ("compute_s", "fwd_s", "bwd_input_s", "comm_s", "allreduce_s", "dp_comm_s"):
            st[key] = 0.0
    bad = tmp_path / "zero.json"
    bad.write_text(json.dumps(doc))
    png = tmp_path / "t.png"
    r = CliRunner().invoke(main, ["simulate", str(bad), "--timeline", str(png)])
    assert r.exit_code == 0, r.output
    assert "rank 0: busy   0.0%" in r.stdout and "the replay takes 0 s" in r.stderr and png.exists()


@pytest.mark.parametrize("command", [["simulate"], ["plot", "--kind", "stages"], ["plot", "--kind", "timeline"]])
def test_a_layer_moved_between_stages_is_warned_by_simulate_and_plot(tmp_path, command):
    """``validate`` and ``export`` refuse a plan whose stages' layers were
    edited after planning (their digest differs); ``simulate`` and ``plot``
    replay and draw the file's recorded stage times, which are those of
    the split as planned: they now say so, one line naming the file and the
    edited part, for the plan drawn (plan 2, unedited, draws without it)."""
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--top", "2", "-o", str(out)] + PLANS["1f1b"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    first, second = doc["plans"][0]["stages"][:2]
    first["layers"][1] -= 1
    second["layers"][0] -= 1
    second["layer_names"].insert(0, first["layer_names"].pop())
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(doc))
    extra = ["-o", str(tmp_path / "f.png")] if command[0] == "plot" else []
    r = CliRunner().invoke(main, [*command, str(bad), *extra])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.strip().splitlines() if x]
    assert len(lines) == 1 and lines[0].startswith(f"warning: {bad}: plans[0].stages: edited after planning"), r.stderr
    r = CliRunner().invoke(main, [*command, str(bad), "--rank", "2", *extra])
    assert r.exit_code == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("kind", ["space", "pareto"])
def test_figures_of_every_point_warn_of_edited_inputs(tmp_path, kind):
    """The space and pareto figures draw every point searched for the
    file's inputs: an edited model (its digest differs) is said in one line,
    as for the one-plan figures; an unedited file draws without it."""
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--top", "2", "-o", str(out)] + PLANS["1f1b"])
    assert r.exit_code == 0, r.output
    clean = CliRunner().invoke(main, ["plot", str(out), "--kind", kind, "-o", str(tmp_path / "c.png")])
    assert clean.exit_code == 0 and clean.stderr == "", clean.stderr
    doc = json.loads(out.read_text())
    doc["inputs"]["model"]["name"] = "another-model"
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["plot", str(bad), "--kind", kind, "-o", str(tmp_path / "f.png")])
    assert r.exit_code == 0, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {bad}: inputs.model: edited after planning"), r.stderr
