"""benchmarks/bench_split_replay.py: the split searches of a plan captured
and replayed on this tree give every captured result again, and a replay
that meets a different result says so and fails (the check the speed
changes of the split search are held to)."""

from __future__ import annotations

import dataclasses
import pickle

from helpers import script_module


def _tool():
    return script_module("benchmarks/bench_split_replay.py")


def test_capture_then_replay_matches_and_a_changed_result_fails(tmp_path, capsys):
    tool = _tool()
    calls = tmp_path / "calls.pkl"
    assert tool.cli(["capture", str(calls), "--model", "resnet18", "--cluster", "1x4-v100-pcie",
                     "--schedule", "1f1b", "--top", "2"]) == 0
    captured = pickle.loads(calls.read_bytes())
    assert captured and all(c[1] == "1f1b" for c in captured)
    assert tool.cli(["replay", str(calls)]) == 0
    assert "every result as captured" in capsys.readouterr().out
    costs, schedule, pp, vp, kwargs, found = captured[0]
    fewer = dataclasses.replace(found, splits_evaluated=found.splits_evaluated + 1)  # work, not the answer
    calls.write_bytes(pickle.dumps([(costs, schedule, pp, vp, kwargs, fewer)] + captured[1:]))
    assert tool.cli(["replay", str(calls)]) == 0
    capsys.readouterr()
    wrong = dataclasses.replace(found, iteration_time_s=found.iteration_time_s * (1 + 1e-9))
    calls.write_bytes(pickle.dumps([(costs, schedule, pp, vp, kwargs, wrong)] + captured[1:]))
    assert tool.cli(["replay", str(calls)]) == 1
    assert "!= captured" in capsys.readouterr().out
