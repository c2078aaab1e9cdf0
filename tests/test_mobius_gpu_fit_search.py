"""Mobius' whole-GPU memory check inside the split search.

A Mobius GPU holds all its stages' activations plus two stays' weights
(``options.mobius.device_peak_bytes``), a check that is not a per-stage one,
so the branch and bound meets leaves that fit every stage but not every GPU.
Such a leaf is no candidate and must not use up the work limit on evaluated
splits; and a point whose search stops before it meets a split that fits
every GPU is not proven out of memory: it is an open point, counted with the
points stopped at the work limits, never reported as ``out_of_memory``.

Oracles: a split of Qwen3-32B typed with ``--split`` (it fits, the search
times it), and the search with ``--top 1`` against ``--top 3`` (rank 1 of a
longer table cannot be slower).
"""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from pipesearch import split_search
from pipesearch.cli import main

QWEN = ["--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "16", "--seq-len", "2048",
        "--schedule", "mobius"]
POINT = ["--pp", "2", "--tp", "4", "--vp", "2", "--recompute", "full"]


def _plan(tmp_path, name, flags):
    out = tmp_path / f"{name}.json"
    r = CliRunner().invoke(main, ["plan"] + QWEN + flags + ["-o", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), r.output


def test_a_split_that_fits_every_gpu_is_found_without_a_cutoff(tmp_path):
    """pp 2 x tp 4, vp 2, micro-batches of 1: the split 13,16,23,14 fits
    every GPU (pinned, it is timed; 13,16,22,15 leaves GPU 1 0.2 GiB over
    once a recomputing block's transient counts); so the search of that point, with no
    cutoff from other points, must return a plan no slower, not call the
    point out of memory (it did when 300 leaves over a GPU's memory used up
    the split limit). Where the branch and bound stops at its work limits
    the plan says so, and its lower bound is then at most the pinned time."""
    pinned, _ = _plan(tmp_path, "pinned", POINT + ["--micro-batch-size", "1", "--split", "13,16,23,14"])
    searched, _ = _plan(tmp_path, "searched", POINT + ["--micro-batch-size", "1"])
    t_pinned = pinned["plans"][0]["predicted"]["iteration_time_s"]
    best = searched["plans"][0]
    assert best["schedule"]["micro_batch_size"] == 1
    split = best["options"]["split_search"]
    if split["exact"] or best["predicted"]["iteration_time_s"] > t_pinned * (1 + 1e-12):
        assert not split["exact"] and split["lower_bound_s"] <= t_pinned * (1 + 1e-12)


def test_rank_1_does_not_depend_on_the_table_length(tmp_path):
    """The best plan with ``--top 1`` and with ``--top 3`` is one plan (the
    cutoff of a longer table is higher, which must never lose a point)
    when both are proven; a split stopped at the work limits (the cutoff
    changes which nodes it visits) is at least the other's lower bound."""
    one, _ = _plan(tmp_path, "one", ["--top", "1"])
    three, _ = _plan(tmp_path, "three", ["--top", "3"])
    a, b = one["plans"][0], three["plans"][0]
    if not (a["options"]["split_search"]["exact"] and b["options"]["split_search"]["exact"]):
        for x, y in ((a, b), (b, a)):
            assert x["predicted"]["iteration_time_s"] >= y["options"]["split_search"]["lower_bound_s"] * (1 - 1e-12)
        return
    assert a["predicted"]["iteration_time_s"] == pytest.approx(b["predicted"]["iteration_time_s"], rel=1e-12)
    assert [s["layers"] for s in a["stages"]] == [s["layers"] for s in b["stages"]]


def test_a_point_stopped_before_any_split_fits_is_open_not_out_of_memory(tmp_path, monkeypatch):
    """With the work limits cut to 5 nodes, the points whose branch and
    bound stops before meeting a split that fits every GPU are listed as
    ``stopped_at_work_limits`` and counted in the note on unproven points;
    the same points with the default limits all have plans or proofs, so
    none of them may read ``out_of_memory`` with the small limits unless it
    does with the default ones."""
    def statuses(name):  # every point's status, from --all-points (written also when no plan fits)
        out = tmp_path / f"{name}.csv"
        r = CliRunner().invoke(main, ["plan"] + QWEN + POINT + ["--top", "3", "--all-points", str(out)])
        rows = list(csv.DictReader(out.open()))
        return r, {(row["micro_batch_size"], row["placement"]): row["status"] for row in rows}

    (full_run, before) = statuses("full")
    assert full_run.exit_code == 0, full_run.output
    monkeypatch.setattr(split_search, "MAX_NODES", 5)
    small_run, after = statuses("small")
    assert "stopped_at_work_limits" in after.values()
    for key, status in after.items():
        if status == "out_of_memory":
            assert before[key] == "out_of_memory", key
    if small_run.exit_code == 0:  # some point still has a plan: the note on unproven points counts the others
        assert "stopped at the split search's work limits" in small_run.output
    else:  # none has: the refusal says they are not proven out of memory
        assert small_run.exit_code == 2
        assert "not proven out of memory" in small_run.output and "stopped_at_work_limits" in small_run.output


def test_no_plan_message_says_which_points_are_not_proven():
    """Qwen3-32B at 32 sequences under Mobius: when no point yields a plan
    but some stopped before any split fit every GPU, the refusal says the
    space is not proven out of memory (exit 2, one line), and does not
    blame the weights' and optimizer state's size, which Mobius keeps in
    host memory."""
    r = CliRunner().invoke(main, ["plan", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "32",
                                  "--seq-len", "2048", "--schedule", "mobius"])
    assert r.exit_code == 2
    line = r.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "not proven out of memory" in line and "stopped_at_work_limits" in line
    assert "optimizer state alone" not in line
