"""docs/examples/ is what docs/examples/generate.py writes now."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import script_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_docs_examples_are_up_to_date():
    mod = script_module("docs/examples/generate.py")
    assert mod.main_(["--check"]) == 0, "run: python docs/examples/generate.py"


@pytest.mark.parametrize("plans", sorted((ROOT / "docs" / "examples").glob("*/*/plans.json")),
                         ids=lambda p: p.parent.name)
def test_docs_example_plan_files_validate(plans):
    """The README's plan files pass `pipesearch validate` (and so export):
    generate.py shortens the model file's path after planning, and the
    file's digests held it as planned."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    res = CliRunner().invoke(main, ["validate", str(plans)])
    assert res.exit_code == 0, res.output
