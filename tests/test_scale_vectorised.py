"""The search path's vectorised helpers against the simple loops they
replaced, on random inputs: the distinct-ids test of a layout
(``placement.all_distinct``), the layout check's refusals, the points
table's cells (``plan._column_cells``), the plan file's JSON text with the
points table thawed by column, and the packing bound's cache.

Oracles: a Python set walked id by id; ``[_cell(v) for v in col]`` (the
cell rule itself); the plan writer as it was (the whole search block thawed
by ``_thaw``, then each column dumped), written out below; the packing bound
evaluated from its formula by a loop over ``k``.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from helpers import tiny_cluster, tiny_profile
from pipesearch import plan as planlib
from pipesearch.errors import InputError
from pipesearch.placement import all_distinct, check_layout
from pipesearch.plan import PlanFile, _cell, _column_cells, points_block, to_json
from pipesearch.search import packed_busiest_per_sample_s


def _distinct_loop(ids) -> bool:
    seen = set()
    for x in np.asarray(ids).reshape(-1).tolist():
        if x in seen:
            return False
        seen.add(x)
    return True


@pytest.mark.parametrize("seed", range(40))
def test_all_distinct_matches_the_set_walk(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    span = int(rng.choice([2, n + 1, 4 * n + 70, 10**9]))
    ids = rng.integers(-span // 3, span, size=n)
    if seed % 3 == 0:  # a permutation: distinct, dense
        ids = rng.permutation(n) + int(rng.integers(-5, 5))
    if seed % 5 == 1 and n > 1:  # one repeat planted
        ids[int(rng.integers(n))] = ids[int(rng.integers(n))]
    shape = (n,) if seed % 2 else (1, n)
    assert all_distinct(ids.reshape(shape)) == _distinct_loop(ids)


def test_all_distinct_of_floats_and_tiny_inputs():
    assert all_distinct(np.array([0.5, 1.5, 2.5])) and not all_distinct(np.array([0.5, 1.5, 0.5]))
    assert all_distinct(np.array([], dtype=np.int64)) and all_distinct(np.array([7]))
    assert not all_distinct(np.array([3, 3])) and all_distinct(np.array([-(10**12), 10**12]))


def test_check_layout_refusals_in_their_order():
    cluster = tiny_cluster(nodes=2, devices_per_node=4)  # ids 0..7, nodes {0..3}, {4..7}
    check_layout(cluster, np.array([[0], [2], [4], [6]]), 2)  # four tp-2 slots: fine
    cases = [
        (np.array([[0], [0]]), 2, "serves two stages"),
        (np.array([[6], [8]]), 2, "uses device 9"),
        (np.array([[-2], [2]]), 2, "uses device"),
        (np.array([[0], [1]]), 2, "share a device"),
        (np.array([[1], [3]]), 4, "share a device"),
        (np.array([[3], [5]]), 2, "spans two nodes"),
    ]
    for heads, tp, needle in cases:
        with pytest.raises(InputError, match=needle):
            check_layout(cluster, heads, tp)


def _random_column(rng: random.Random, n: int) -> list:
    kind = rng.choice(["int", "float", "str", "mixed", "numpy"])
    out = []
    for _ in range(n):
        if kind == "int":
            out.append(rng.choice([rng.randint(-5, 10**6), None]))
        elif kind == "float":
            out.append(rng.choice([rng.random(), math.nan, float(rng.randint(0, 9)), -0.0]))
        elif kind == "str":
            out.append(rng.choice(["ok", "pruned", None, "pipeline"]))
        elif kind == "numpy":
            out.append(rng.choice([np.float64(rng.random()), np.float64("nan"), np.int64(rng.randint(0, 99)),
                                   np.float32(0.25)]))
        else:
            out.append(rng.choice([1, 2.5, math.nan, "x", None, True, np.int64(3), np.float64(math.nan)]))
    return out


def _same_cells(a: list, b: list) -> bool:
    return len(a) == len(b) and all(type(x) is type(y) and (x == y or x != x and y != y) for x, y in zip(a, b))


@pytest.mark.parametrize("seed", range(60))
def test_column_cells_match_the_cell_loop(seed):
    rng = random.Random(seed)
    col = _random_column(rng, rng.randint(0, 40))
    assert _same_cells(_column_cells(col), [_cell(v) for v in col])
    assert _same_cells(_column_cells(tuple(col)), [_cell(v) for v in col])


def _old_to_json(plan_file: PlanFile) -> str:
    """The plan writer before the points table was thawed by column: the
    oracle of :func:`pipesearch.plan.to_json`'s text."""
    exports = list(plan_file.exports) + [None] * (len(plan_file.plans) - len(plan_file.exports))
    search = planlib._thaw(plan_file.search)
    points = search.get("points")
    compact = isinstance(points, dict) and "values" in points
    if compact:
        search["points"] = planlib._POINTS_MARK
    doc = {"schema": planlib.SCHEMA, "inputs": planlib._thaw(plan_file.inputs), "search": search,
           "plans": [planlib.plan_to_dict(p, e) for p, e in zip(plan_file.plans, exports)]}
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    if not compact:
        return text
    inner = ",\n".join("        " + json.dumps(col, allow_nan=False, separators=(",", ":")) for col in points["values"])
    block = (f'{{\n      "columns": {json.dumps(points["columns"])},\n      "values": [\n{inner}\n      ]\n    }}'
             if points["values"] else f'{{"columns": {json.dumps(points["columns"])}, "values": []}}')
    return text.replace('"points": ' + json.dumps(planlib._POINTS_MARK), '"points": ' + block)


@pytest.mark.parametrize("seed", range(30))
def test_plan_text_matches_the_whole_block_thaw(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 12)
    kinds = [_random_column(rng, n) for _ in range(rng.randint(0, 4))]
    kinds = [[None if isinstance(v, np.generic) and v != v else (v.item() if isinstance(v, np.generic) else v)
              for v in col] for col in kinds]  # JSON-able: numpy ints are refused by both writers alike
    columns = {f"c{k}": col for k, col in enumerate(kinds)}
    raw = {"columns": list(columns), "values": [list(c) for c in columns.values()]}  # NaNs left in
    block = points_block(columns) if seed % 2 else raw
    if seed % 3 == 0:  # as read back from a file: frozen to tuples
        block = planlib._freeze(block)
    search = {"points_evaluated": n, "points": block, "wall_s": math.inf if seed % 4 == 0 else 0.5}
    if seed % 5 == 0:
        search = {"points": block, "infeasible": {"pruned": 3}}  # the table first: its place is kept
    pf = PlanFile(inputs={"model": {"name": "m"}}, search=search, plans=())
    assert to_json(pf) == _old_to_json(pf)


def test_plan_text_refuses_numpy_integers_as_before():
    pf = PlanFile(inputs={}, search={"points": {"columns": ["a"], "values": [[np.int64(1)]]}}, plans=())
    for write in (to_json, _old_to_json):
        with pytest.raises(TypeError):
            write(pf)


def _packed_loop(per_sample: list[float], devices: int) -> float:
    a = sorted(per_sample, reverse=True)
    best = -math.inf
    for k in range((len(a) - 1) // devices + 1):
        t = k * devices + 1  # the t largest layers: some device holds k + 1 of them, at least the k + 1 smallest
        best = max(best, sum(a[t - k - 1:t]))
    return best * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_packing_bound_cached_per_devices_matches_its_formula(seed):
    rng = random.Random(seed)
    profiles = [tiny_profile([rng.uniform(0.1, 3.0) for _ in range(rng.randint(1, 30))]) for _ in range(2)]
    cache: dict = {}
    for _ in range(3):  # repeated calls read the cache: same numbers, per profile and device count
        for prof in profiles:
            per_sample = [lay.fwd_s + lay.bwd_s for lay in prof.layers]
            for devices in (1, 2, 3, 5, 8):
                got = packed_busiest_per_sample_s(prof, devices, cache)
                assert got == pytest.approx(_packed_loop(per_sample, devices), rel=1e-12)
                assert got == packed_busiest_per_sample_s(prof, devices)
