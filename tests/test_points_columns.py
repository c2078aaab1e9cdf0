"""The points table's column check (pipesearch.schema.semantics): the
whole-column test agrees with the cell-by-cell rule on every kind of cell,
and a bad cell anywhere in a long column is named by its index."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipesearch.schema.semantics import _POINT_COLUMNS, _column_passes, _point_columns

BOUNDS = (2**60, 10**30, 2**53)  # integers next to the float bounds (MAX_BYTES, MAX_PLAN_S) and float precision
CELLS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(2**62, 2**70), st.just(10**400),
                  st.sampled_from([b + d for b in BOUNDS for d in (-1, 0, 1)]),
                  st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1.0, 2.0, 1e29, 1e31]),
                  st.sampled_from(["ok", "pruned", "gpipe", "1f1b", "x", ""]), st.just([1]))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(_POINT_COLUMNS)), st.lists(CELLS, max_size=12))
@example("peak_memory_bytes", [1.0, 2**60 + 1])
@example("bubble_fraction", [True])
def test_whole_column_test_agrees_with_the_cell_rule(column, col):
    """Booleans in integer columns, NaN and infinities, integers past a
    float or one above a float bound (2**60 + 1 rounds to 2.0**60), numbers
    past a bound, unknown statuses and schedules, lists: the column passes
    exactly when every non-null cell passes its own check."""
    check = _POINT_COLUMNS[column][0]
    assert _column_passes(column, col) == all(check(v) for v in col if v is not None)


def test_a_bad_cell_deep_in_a_long_column_is_named():
    """40,000 good rows and one bad cell at row 31,337 of each checked
    column: the problem names that row."""
    columns = ["pp", "iteration_time_s", "status", "bubble_fraction"]
    good = {"pp": 4, "iteration_time_s": 1.5, "status": "ok", "bubble_fraction": 0.1}
    bad = {"pp": True, "iteration_time_s": math.nan, "status": "weird", "bubble_fraction": 1.5}
    for k, column in enumerate(columns):
        values = [[good[c]] * 40_000 for c in columns]
        values[k][31_337] = bad[column]
        problems = list(_point_columns(columns, values))
        assert len(problems) == 1 and problems[0].where == f"search.points.values[{k}][31337]", problems
    assert list(_point_columns(columns, [[good[c]] * 40_000 for c in columns])) == []
