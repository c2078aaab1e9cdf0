"""Tests of the plan file (pipesearch.plan): what `pipesearch plan -o` writes
reads back equal, dump/load/dump is stable, malformed files are refused with
a PlanFormatError that names the offending key."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import pipesearch.cli.plan_cmd as plan_cmd
from pipesearch import plan as planlib
from pipesearch.cli import main
from pipesearch.errors import InputError, PlanFormatError
from pipesearch.plan import (SCHEMA, PlanFile, dump_plan_file, load_plan_file, load_plan_text, normalize,
                             select_plan, to_json)
from pipesearch.types import Plan, Prediction, StagePlan


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Run `pipesearch plan -o plans.json` in-process, capturing the PlanFile
    object the CLI writes (the one its JSON text is made from). Returns
    (path, PlanFile)."""
    tmp = tmp_path_factory.mktemp("plan_json")
    captured = []
    real_text = plan_cmd._plan_text

    def spy(plan_file, plans):
        plan_file, text = real_text(plan_file, plans)
        captured.append(plan_file)
        return plan_file, text

    mp = pytest.MonkeyPatch()
    mp.setattr(plan_cmd, "_plan_text", spy)
    try:
        out = tmp / "plans.json"
        result = CliRunner().invoke(main, ["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie",
                                           "--top", "4", "-q", "-o", str(out)])
    finally:
        mp.undo()
    assert result.exit_code == 0, result.output + result.stderr
    assert len(captured) == 1
    return out, captured[0]


def test_cli_plan_file_loads_back_equal(written):
    path, plan_file = written
    loaded = load_plan_file(path)
    assert loaded == normalize(plan_file)
    # the plans themselves come back as the very values the search produced
    assert loaded.plans == plan_file.plans
    assert [p.rank for p in loaded.plans] == [1, 2, 3, 4]
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA == "pipesearch.plan/1"


def test_dump_load_dump_is_identical(written, tmp_path):
    path, _ = written
    text = path.read_text()
    assert to_json(load_plan_file(path)) == text
    again = tmp_path / "again.json"
    dump_plan_file(load_plan_file(path), again)
    assert again.read_text() == text
    assert load_plan_file(again) == load_plan_file(path)


def test_select_plan_by_rank(written):
    path, plan_file = written
    loaded = load_plan_file(path)
    assert select_plan(loaded, 2) == plan_file.plans[1]
    with pytest.raises(PlanFormatError, match="no plan of rank 9"):
        select_plan(loaded, 9)


def _plan(stages=((0, 3), (3, 5))):
    sts = tuple(StagePlan(index=k, layers=lay, layer_names=tuple(f"l{i}" for i in range(*lay)), devices=(k,),
                          compute_s=0.1 * (k + 1), comm_s=1e-6, allreduce_s=0.0, memory_bytes=2.0**33 + 0.5,
                          send_bytes=1e7, device_type="x", fwd_s=1 / 30, saved_bytes=123.0)
                for k, lay in enumerate(stages))
    return Plan(rank=1, pp=len(stages), dp=1, tp=1, schedule="1f1b", micro_batch_size=2, num_micro_batches=8,
                stages=sts, predicted=Prediction(0.7, 16 / 0.7, 0.125, 2.0**33 + 0.5, 16 * 2.0**30),
                extra=(("placement", "pipeline"), ("recompute", "none"), ("analytic_iteration_time_s", 0.6)))


def test_hand_made_plan_round_trips_exactly():
    """Floats such as 1/30 and 0.1 * 2 survive the JSON text bit for bit."""
    pf = PlanFile(inputs={"model": {"name": "m", "num_layers": 5, "layers": [1, 2]},
                          "cluster": {"name": "c", "devices": 2}, "job": {"global_batch_size": 16}},
                  search={"wall_s": 0.5}, plans=(_plan(),))
    back = load_plan_text(to_json(pf))
    assert back.plans == pf.plans
    assert back == normalize(pf) and normalize(back) == back
    assert to_json(back) == to_json(pf)


# ------------------------------------------------------------- malformed files


@pytest.fixture
def doc(written):
    return json.loads(written[0].read_text())


def _write(tmp_path, obj, name="bad.json") -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def _expect_error(tmp_path, obj, *needles):
    path = _write(tmp_path, obj)
    with pytest.raises(PlanFormatError) as info:
        load_plan_file(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert isinstance(info.value, InputError)  # the CLI maps it to exit status 2
    return msg


def test_not_json(tmp_path):
    _expect_error(tmp_path, '{"schema": "pipesearch.plan/1", ', "not JSON")
    # a string cut short on line 2 (json says "Unterminated string starting at"): line and column, no "at at"
    msg = _expect_error(tmp_path, '{"schema":\n  "pipesearch.pl', "not JSON (Unterminated string starting at: line 2, column 3)")
    assert "at at" not in msg


def test_wrong_schema(tmp_path, doc):
    doc["schema"] = "pipesearch.plan/0"
    _expect_error(tmp_path, doc, "schema", "pipesearch.plan/0", "pipesearch.plan/1")


def test_not_an_object(tmp_path):
    _expect_error(tmp_path, "[1, 2]", "schema")


@pytest.mark.parametrize("path,key", [
    ((), "plans"),
    ((), "inputs"),
    (("plans", 0), "predicted"),
    (("plans", 0, "stages", 0), "compute_s"),
    (("plans", 0, "stages", 1), "layers"),
    (("plans", 0, "parallelism"), "pp"),
    (("plans", 0, "schedule"), "num_micro_batches"),
    (("plans", 0, "predicted"), "iteration_time_s"),
])
def test_missing_key(tmp_path, doc, path, key):
    obj = doc
    for p in path:
        obj = obj[p]
    if key == "layers" and len(doc["plans"][0]["stages"]) < 2:
        pytest.skip("single-stage plan")
    del obj[key]
    _expect_error(tmp_path, doc, f"missing key {key!r}")


@pytest.mark.parametrize("key", ["compute_s", "fwd_s", "comm_s", "memory_bytes"])
def test_negative_value(tmp_path, doc, key):
    doc["plans"][0]["stages"][0][key] = -0.5
    _expect_error(tmp_path, doc, key, "-0.5", ">= 0")


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_value(tmp_path, doc, token):
    """Python's json module reads the non-standard tokens NaN and Infinity;
    a plan file holding one must be refused (it could not be written back:
    to_json uses allow_nan=False)."""
    doc["plans"][0]["stages"][0]["compute_s"] = 12345.5
    text = json.dumps(doc).replace("12345.5", token)
    _expect_error(tmp_path, text, "stages[0].compute_s", "finite")


def test_negative_predicted_time(tmp_path, doc):
    doc["plans"][1]["predicted"]["iteration_time_s"] = -1.0
    _expect_error(tmp_path, doc, "plans[1]", "iteration_time_s")


def test_wrong_type(tmp_path, doc):
    doc["plans"][0]["parallelism"]["pp"] = "4"
    _expect_error(tmp_path, doc, "pp", "'4'")


def _multi_stage(doc):
    for k, plan in enumerate(doc["plans"]):
        if len(plan["stages"]) >= 2:
            return k, plan
    pytest.skip("no multi-stage plan in the file")


def test_non_contiguous_stages(tmp_path, doc):
    k, plan = _multi_stage(doc)
    plan["stages"][1]["layers"][0] += 1  # a gap: layer stages[0].layers[1] is in no stage
    _expect_error(tmp_path, doc, f"plans[{k}]", "stages[1].layers")


def test_overlapping_stages(tmp_path, doc):
    k, plan = _multi_stage(doc)
    plan["stages"][1]["layers"][0] -= 1
    _expect_error(tmp_path, doc, "stages[1].layers")


def test_first_stage_must_start_at_layer_0(tmp_path, doc):
    doc["plans"][0]["stages"][0]["layers"][0] = 1
    _expect_error(tmp_path, doc, "stages[0].layers")


def test_stage_count_must_match_pp(tmp_path, doc):
    k, plan = _multi_stage(doc)
    plan["parallelism"]["pp"] += 1
    _expect_error(tmp_path, doc, f"plans[{k}]", "pp x vp")


def test_missing_file(tmp_path):
    with pytest.raises(PlanFormatError, match="cannot read"):
        load_plan_file(tmp_path / "nope.json")


def test_original_document_is_valid(tmp_path, doc):
    """The mutations above start from a valid document."""
    assert load_plan_file(_write(tmp_path, copy.deepcopy(doc))).plans
    assert planlib.SCHEMA == doc["schema"]
