"""Every ``$ pipesearch ...`` example in README.md runs and exits 0."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipesearch.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [line[2:].strip() for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("$ pipesearch ")]


def test_readme_has_examples():
    assert len(EXAMPLES) >= 10


@pytest.mark.slow
def test_readme_examples_run(tmp_path, monkeypatch):
    """Run in order in one scratch directory (later examples read the plan
    files earlier ones wrote); the repository's tests/ is linked in so file
    paths in the examples resolve."""
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for example in EXAMPLES:
        args = shlex.split(example)[1:]
        result = runner.invoke(main, args, catch_exceptions=False)
        assert result.exit_code == 0, f"{example}\n{result.output}"
    assert (tmp_path / "plans.json").is_file() and (tmp_path / "timeline.png").is_file()
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == [
        "pareto.png", "space.png", "stages.png", "timeline.png"]


def test_readme_set_up_commands_match_ci():
    """The README's test command is what .ci/run runs, as its last line."""
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    test_cmd = re.search(r"\$ (pip install \"\.\[test\]\" && python -m pytest)", text).group(1)
    assert ci[-1].strip() == test_cmd
    # nothing else is installed or run: the README's command alone sets up everything CI tests
    commands = [line.strip() for line in ci if line.strip() and not line.lstrip().startswith("#")]
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', test_cmd]
    assert "$ pip install . && pipesearch plan" in text


def test_test_extra_installs_the_runtimes_the_tests_use():
    """torch pinned to the CPU build's release (a bare requirement pulls a CUDA
    build) and every runtime whose own code checks the exports."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    names = {re.split(r"[=<>!~ ]", r, maxsplit=1)[0] for r in extra}
    assert "torch==2.13.0" in extra
    assert {"pytest", "hypothesis", "torchtitan", "triton", "deepspeed", "megatron-core"} <= names



def test_readme_sample_output_is_what_plan_prints():
    """The README's "What you get" block is ``pipesearch plan``'s output on
    the built-in default, line for line (the search's seconds aside): its
    figures went stale when the bubble began to count the optimizer step."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## What you get", 1)[1].split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    result = CliRunner().invoke(main, ["plan"], catch_exceptions=False)
    assert result.exit_code == 0, result.output

    def timeless(line: str) -> str:
        return re.sub(r"points searched in [0-9.]+ s", "points searched in (t) s", line)

    assert [timeless(x) for x in result.output.splitlines()] == [timeless(x) for x in block]
