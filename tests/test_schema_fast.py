"""The plan schema check's fast paths (``schema._all_finite``: the C
encoder's refusal of NaN and infinities; ``schema._compact_names``: string
lists cut to one name for ``jsonschema``) report what the plain check
reports: every non-finite number walked in Python, then ``jsonschema`` over
the whole document, written out here from the library itself."""

from __future__ import annotations

import copy
import json
import math

import jsonschema
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesearch.cli import main
from pipesearch.schema import _describe, json_path, non_finite_problems, plan_schema, schema_problems

CSV = """# batch_size: 1
name,fwd_ms,bwd_ms,param_bytes,output_bytes
""" + "".join(f"l{k},{1 + k % 3}.0,{2 + k % 2}.0,{1000 * (k + 1)},{4096 * (1 + k % 4)}\n" for k in range(12))


def plain_problems(doc):
    """The check without its fast paths."""
    problems = list(non_finite_problems(doc))
    validator = jsonschema.Draft202012Validator(plan_schema())
    errors = sorted(validator.iter_errors(doc),
                    key=lambda e: (tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in e.absolute_path),
                                   e.validator))
    seen = {p.where for p in problems}
    for error in errors:
        if json_path(error.absolute_path) in seen and error.validator in ("minimum", "maximum", "type"):
            continue
        problems.append(_describe(error))
    return problems


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("schema_fast")
    (tmp / "m.csv").write_text(CSV)
    out = tmp / "p.json"
    result = CliRunner().invoke(main, ["plan", "--model", str(tmp / "m.csv"), "--cluster", "1x4-v100-pcie",
                                       "-b", "8", "--top", "3", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


_BAD = [3, None, 2.5, math.nan, ["x"], {"a": 1}, True, math.inf]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_fast_check_reports_what_the_plain_check_reports(doc, data):
    """Layer names replaced by non-strings at random places, and numbers by
    NaN / infinities: the same problems, in the same order."""
    mutated = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(0, 3))):
        plan = data.draw(st.sampled_from(mutated["plans"]))
        stage = data.draw(st.sampled_from(plan["stages"]))
        what = data.draw(st.sampled_from(["name", "number", "names_type"]))
        if what == "name" and isinstance(stage["layer_names"], list) and stage["layer_names"]:
            k = data.draw(st.integers(0, len(stage["layer_names"]) - 1))
            stage["layer_names"][k] = data.draw(st.sampled_from(_BAD))
        elif what == "number":
            stage["fwd_s"] = data.draw(st.sampled_from([math.nan, math.inf, -math.inf, "1", 0.5]))
        else:
            stage["layer_names"] = data.draw(st.sampled_from(["l0", 7, None, [], ["l0"]]))
    before = copy.deepcopy(mutated)
    assert schema_problems(mutated) == plain_problems(mutated)
    assert json.dumps(mutated, default=str) == json.dumps(before, default=str)  # not modified


def test_valid_document_has_no_problems_and_long_lists_are_cut(doc):
    from pipesearch.schema import _compact_names

    assert schema_problems(doc) == plain_problems(doc) == []
    cut = _compact_names(doc)
    assert all(len(s["layer_names"]) == 1 for p in cut["plans"] for s in p["stages"])
    assert any(len(s["layer_names"]) > 1 for p in doc["plans"] for s in p["stages"])


def test_non_finite_anywhere_is_found(doc):
    """A NaN deep inside an export (an untyped object to the schema) is
    still reported: the C encoder's refusal only decides when to walk."""
    mutated = copy.deepcopy(doc)
    mutated["plans"][0]["exports"] = {"torch": {"x": [1.0, math.nan]}}
    got = schema_problems(mutated)
    assert got == plain_problems(mutated)
    assert any(p.where == "plans[0].exports.torch.x[1]" for p in got)
