"""The plan file's JSON Schema: shipped in the package, a valid draft 2020-12
schema, its bounds those of pipesearch.limits, and what `pipesearch plan`
writes follows it (checked with jsonschema directly, not through pipesearch)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from pipesearch import limits
from pipesearch.cli import main
from pipesearch.schema import SCHEMA_FILE, plan_schema, schema_problems, schema_text
from pipesearch.types import MAX_MICRO_BATCHES, SCHEDULES

REPO = Path(__file__).resolve().parent.parent


def test_schema_is_draft_2020_12_and_inside_the_package():
    schema = json.loads(schema_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    stages = json.loads((REPO / "pipesearch" / "schema" / "stages-1.schema.json").read_text())
    assert stages["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(stages)  # the runtime skips these checks
    # the wheel ships the whole package directory (hatch `packages = ["pipesearch"]`)
    assert (REPO / "pipesearch" / "schema" / SCHEMA_FILE).is_file()
    wheel = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert "pipesearch" in wheel["packages"]
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("jsonschema") for d in deps)


def test_schema_bounds_are_the_limits():
    defs = plan_schema()["$defs"]
    assert defs["seconds"]["maximum"] == limits.MAX_PLAN_S
    assert defs["bytes"]["maximum"] == limits.MAX_BYTES == 2.0**60
    par = defs["plan"]["properties"]["parallelism"]["properties"]
    assert {k: v["maximum"] for k, v in par.items()} == dict.fromkeys(("pp", "dp", "tp", "vp"), limits.MAX_DEVICES)
    assert defs["plan"]["properties"]["predicted"]["properties"]["samples_per_s"]["maximum"] == limits.MAX_SAMPLES_PER_S
    sch = defs["plan"]["properties"]["schedule"]["properties"]
    assert sch["num_micro_batches"]["maximum"] == MAX_MICRO_BATCHES == 16384
    assert sch["name"]["enum"] == list(SCHEDULES)
    assert plan_schema()["properties"]["inputs"]["properties"]["cluster"]["properties"]["devices"]["maximum"] \
        == limits.MAX_DEVICES


@pytest.mark.parametrize("args", [
    ["--model", "gnmt", "--cluster", "1x4-v100-pcie", "--top", "3"],
    ["--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--tp", "2", "--pp", "2",
     "--schedule", "interleaved-1f1b", "--top", "2"],
    ["--model", "vgg16", "--cluster", "mixed-a100-v100", "-b", "64", "--top", "2"],
])
def test_written_plan_files_follow_the_schema(tmp_path, args):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["plan", *args, "-q", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, plan_schema(), cls=jsonschema.Draft202012Validator)
    assert schema_problems(doc) == []
    check = CliRunner().invoke(main, ["validate", str(out)])
    assert check.exit_code == 0 and check.stdout.startswith(f"{out}: valid pipesearch.plan/1 file")


def test_unknown_key_is_named_with_a_suggestion(tmp_path):
    out = tmp_path / "p.json"
    assert CliRunner().invoke(main, ["plan", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "64", "-q",
                                     "-o", str(out)]).exit_code == 0
    doc = json.loads(out.read_text())
    doc["plans"][0]["stages"][0]["compute_ms"] = doc["plans"][0]["stages"][0].pop("compute_s")
    problems = [str(p) for p in schema_problems(doc)]
    assert "plans[0].stages[0]: missing key 'compute_s'" in problems
    assert any(p.startswith("plans[0].stages[0]: unknown key 'compute_ms' (did you mean 'compute_s'?") for p in problems)


def test_every_missing_key_is_named_once(tmp_path):
    """Two keys gone from the top level and two from a plan: one problem at
    each place naming both (jsonschema reports each missing key as its own
    error; each was printed as the first key, once per key)."""
    out = tmp_path / "p.json"
    assert CliRunner().invoke(main, ["plan", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "64", "-q",
                                     "-o", str(out)]).exit_code == 0
    doc = json.loads(out.read_text())
    del doc["plans"][0]["schedule"], doc["plans"][0]["predicted"]
    assert [str(p) for p in schema_problems(doc)] == ["plans[0]: missing keys 'schedule', 'predicted'"]
    del doc["search"], doc["plans"]
    assert [str(p) for p in schema_problems(doc)] == ["missing keys 'search', 'plans'"]
