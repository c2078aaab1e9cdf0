"""benchmarks/bench_compare_revisions.py's runner: CPU seconds from the
child's rusage, or with ``instructions`` the count callgrind prints, and
the rank-1 plan from the plan JSON; valgrind's own ``==pid==`` lines never
taken for the error of a failed run."""

from __future__ import annotations

import json
import subprocess

from helpers import script_module

PLAN = {"plans": [{"parallelism": {"pp": 2, "dp": 4, "tp": 1}, "schedule": {"name": "1f1b", "num_micro_batches": 8},
                   "predicted": {"iteration_time_s": 0.5}, "options": {"split_search": {"exact": True}}}]}


def _fake(stdout: str, stderr: str, returncode: int = 0, seen: list | None = None):
    def run(cmd, **kwargs):
        if seen is not None:
            seen.append(cmd)
        return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)
    return run


def test_instructions_are_read_from_callgrind_and_the_plan_from_stdout(monkeypatch, tmp_path):
    tool = script_module("benchmarks/bench_compare_revisions.py")
    seen: list = []
    callgrind = "==41== Events : Ir\n==41== Collected : 1234567\n"
    monkeypatch.setattr(tool.subprocess, "run", _fake(json.dumps(PLAN), callgrind, seen=seen))
    cost, rank1 = tool._run(tmp_path, ["plan", "-q", "--json"], instructions=True)
    assert cost == 1234567.0
    assert rank1 == "pp 2 dp 4 tp 1 1f1b m 8: 500.0 ms; all proven"
    assert seen[0][:2] == ["valgrind", "--tool=callgrind"]


def test_a_failed_run_reports_its_own_last_line_not_valgrinds(monkeypatch, tmp_path):
    tool = script_module("benchmarks/bench_compare_revisions.py")
    monkeypatch.setattr(tool.subprocess, "run", _fake("", "error: no such model\n==7== Collected : 99\n", 2))
    cost, rank1 = tool._run(tmp_path, ["plan"], instructions=True)
    assert (cost, rank1) == (99.0, "error: error: no such model")
    monkeypatch.setattr(tool.subprocess, "run", _fake("", "error: no such model\n", 2))
    assert tool._run(tmp_path, ["plan"])[1] == "error: error: no such model"
