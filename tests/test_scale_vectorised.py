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
from pipesearch.schema.digests import planned_digests
from pipesearch.errors import InputError
from pipesearch.placement import all_distinct, check_layout
from pipesearch.plan import PlanFile, _cell, _column_cells, points_block, to_json
from pipesearch.profiles import csv_profile
from pipesearch.search_bounds import packed_busiest_per_sample_s


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
    doc["digests"] = planned_digests(doc)  # (added since: the digests of what the plans were computed from)
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


def _parse_number_by_decimal(text: str, scale: int = 0) -> float:
    """The profile reader's number rule through :class:`decimal.Decimal`
    alone (the reader before its float fast path): the oracle. A value past
    the decimal context's exponent range is +-Infinity (its Overflow not
    trapped), as ``float`` reads ``1e400``."""
    from decimal import Decimal, InvalidOperation, Overflow, localcontext

    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise ValueError(f"not finite: {text!r}")
    if not csv_profile._PLAIN_DECIMAL.fullmatch(text.strip()):
        raise ValueError(f"not a plain decimal number: {text!r} (e.g. 12.5 or 5e6)")
    with localcontext() as ctx:
        ctx.traps[Overflow] = False
        return float(value.scaleb(scale))


def _outcome(fn, *args):
    try:
        return ("value", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the oracle's failures are compared, type and message
        return ("error", type(exc).__name__, str(exc))


def _random_number_text(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.5:  # well-formed: digits, a point, an exponent, signs, spaces around
        mant = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 35)))
        if rng.random() < 0.6:
            k = rng.randint(0, len(mant))
            mant = mant[:k] + "." + mant[k:]
        exp = rng.choice(["", f"e{rng.randint(-330, 330)}", f"E+{rng.randint(0, 20)}", f"e-{rng.randint(0, 400)}",
                          f"e{rng.randint(9_990, 10_010)}", "e0001"])
        return rng.choice(["", " ", "+", "-"]) + mant + exp + rng.choice(["", " ", "\t"])
    if pick < 0.6:
        return rng.choice(["inf", "-Infinity", "nan", "1_0", "0x10", "1e", "e5", ".", "+-1", "１２", "1.2.3", ""])
    return "".join(rng.choice("0123456789.eE+-_ x") for _ in range(rng.randint(0, 12)))


@pytest.mark.parametrize("seed", range(20))
def test_parse_number_matches_the_decimal_rule(seed):
    rng = random.Random(seed)
    for _ in range(400):
        text, scale = _random_number_text(rng), rng.choice([0, -3, 3, -9])
        got, want = _outcome(csv_profile.parse_number, text, scale), _outcome(_parse_number_by_decimal, text, scale)
        if got[0] == want[0] == "value" and got[1] == want[1] == 0.0:  # the sign of a zero too
            assert math.copysign(1, got[1]) == math.copysign(1, want[1]), text
        assert got == want, (text, scale)


def test_parse_number_hard_roundings():
    """Halfway and near-halfway decimals, subnormals and overflow, each
    scaled: the float path rounds once, as the decimal one."""
    texts = ["0.1", "2.5e-3", "9007199254740993", "1.00000000000000011102230246251565404236316680908203125",
             "4.9406564584124654e-324", "2.4703282292062327e-324", "1.7976931348623158e308", "1e309",
             "123456789012345678901234567", "0.30000000000000004", "5e-324", "1e-400", "-0.000"]
    for text in texts:
        for scale in (0, -3, 3):
            assert _outcome(csv_profile.parse_number, text, scale) == _outcome(_parse_number_by_decimal, text, scale)


def _csv_fields(line: str):
    import csv

    return next(csv.reader([line])), next(csv.reader([line], skipinitialspace=True))


@pytest.mark.parametrize("seed", range(20))
def test_row_fields_match_the_csv_module(seed):
    rng = random.Random(seed)
    for _ in range(300):
        line = "".join(rng.choice(['a', '1', ',', ' ', ' ', '\t', '"', 'x y', '.', '\x00'] if rng.random() < 0.2
                                  else ['a', '1', ',', ' ', '\t', '.', 'e'])
                       for _ in range(rng.randint(1, 30)))
        assert _outcome(csv_profile._row_fields, line) == _outcome(_csv_fields, line), repr(line)


# ------------------------------------------------------- JSON text of long lists


def _random_json(rng: random.Random, depth: int = 0):
    """Nested JSON-able data with long lists of strings (flat, one string per
    item, of mixed lengths, as tuples), short lists, placeholders' look-alikes,
    non-ASCII text, numbers."""
    pick = rng.random()
    names = ["l0", "ü", "a\"b", "\x00L0\x00", "\x00L1\x00x", "", "tab\t", "\u2028"]
    if depth >= 3 or pick < 0.25:
        return rng.choice([rng.random(), rng.randint(-9, 10**12), True, None, rng.choice(names), -0.0])
    if pick < 0.45:
        n = rng.choice([1, 63, 64, 65, 200])
        flat = [rng.choice(names[:3] + [f"m{k}" for k in range(5)]) for _ in range(n)]
        return tuple(flat) if rng.random() < 0.3 else flat
    if pick < 0.6:
        n = rng.choice([10, 64, 150])
        if rng.random() < 0.5:
            return [[f"layers.{k}"] for k in range(n)]
        return [tuple(f"x{k}" for k in range(rng.randint(0, 3))) for _ in range(n)]
    if pick < 0.75:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{k}": _random_json(rng, depth + 1) for k in range(rng.randint(0, 4))}


def _thaw_loop(value):
    """The plan writer's conversion as first written: the oracle of ``_thaw``."""
    if isinstance(value, (tuple, list)):
        if all(type(v) is str for v in value):
            return list(value)
        return [_thaw_loop(v) for v in value]
    if isinstance(value, dict):
        return {k: _thaw_loop(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _same_data(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same_data, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_data(a[k], b[k]) for k in a)
    return a == b or a != a and b != b


@pytest.mark.parametrize("seed", range(40))
def test_thaw_matches_the_recursive_rule(seed):
    rng = random.Random(seed)
    value = planlib._freeze({"v": _random_json(rng), "w": [math.inf, (1.5, math.nan), ("a", "b")]})
    assert _same_data(planlib._thaw(value), _thaw_loop(value))
    text = json.dumps(planlib._thaw(value, copy_strings=False), allow_nan=False)
    assert text == json.dumps(_thaw_loop(value), allow_nan=False)


def _hand_plan(names: int):
    from pipesearch.types import Plan, Prediction, StagePlan

    bounds = ((0, names // 2), (names // 2, names))
    stages = tuple(StagePlan(index=k, layers=lay, layer_names=tuple(f"l{i}" for i in range(*lay)), devices=(k,),
                             compute_s=0.1 * (k + 1), comm_s=1e-6, allreduce_s=0.0, memory_bytes=2.0**33,
                             send_bytes=1e7, device_type="x", fwd_s=1 / 30, saved_bytes=123.0)
                   for k, lay in enumerate(bounds))
    return Plan(rank=1, pp=2, dp=1, tp=1, schedule="1f1b", micro_batch_size=2, num_micro_batches=8, stages=stages,
                predicted=Prediction(0.7, 16 / 0.7, 0.125, 2.0**33, 16 * 2.0**30),
                extra=(("placement", "pipeline"), ("recompute", "none"), ("analytic_iteration_time_s", 0.6)))


@pytest.mark.parametrize("names", [3, 200])
def test_plan_text_with_exports_matches_the_whole_block_thaw(names):
    """Plans whose stages and exports hold long name lists (frozen, as read
    back; and as the exporters make them), beside a by-column points table."""
    modules = [[f"layers.{k}"] for k in range(names)]
    exports = ({"torch": {"layer_modules": modules, "argv": ["--a", "1"], "x": math.inf}},
               planlib._freeze({"titan": {"layer_modules": modules, "per_stage": [modules[:5], []]}}))
    pf = PlanFile(inputs={"model": {"name": "m"}},
                  search={"points": points_block({"t": [1.0, math.nan]}), "wall_s": 0.1},
                  plans=(_hand_plan(names), _hand_plan(names)), exports=exports)
    assert to_json(pf) == _old_to_json(pf)
