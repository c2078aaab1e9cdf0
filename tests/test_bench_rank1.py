"""benchmarks/bench_rank1.py's proof column: the ranked plans whose split
was not proven optimal, with their gaps, and the points left unproven."""

from __future__ import annotations

import json

from helpers import script_module


def _doc(infos, unproven=None) -> str:
    plans = [{"options": {} if info is None else {"split_search": info}} for info in infos]
    return json.dumps({"plans": plans, "search": {} if unproven is None else {"unproven_points": unproven}})


def test_open_plans_and_unproven_points_are_named():
    tool = script_module("benchmarks/bench_rank1.py")
    text = _doc([{"exact": True}, {"exact": False, "gap": 0.123}, {"exact": False, "gap": 0.0049}],
                {"count": 3, "least_lower_bound_s": 1.5})
    assert tool.proofs(text) == "plan 2 gap 12.3%, plan 3 gap 0.5%; 3 points unproven, least bound 1.5 s"


def test_all_proven_and_plans_without_a_split_report():
    tool = script_module("benchmarks/bench_rank1.py")
    assert tool.proofs(_doc([{"exact": True}, {"exact": True}])) == "all proven"
    assert tool.proofs(_doc([None, None])) == "no split report"
