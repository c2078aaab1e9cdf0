"""The search evaluates its mapped points after every other point, the
least-bound point of each configuration first (``point_placement.mapped_visit_order``),
so that their order search starts from the lowest cutoff. The ranked plans
must not depend on that order: every point that can enter them is searched
exactly against a cutoff that only falls (docs/heterogeneous.md, "Point
order"). Checked here against the exhaustive search (no pruning, points in
the order of the space, every point evaluated with no cutoff)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from pipesearch.placement import slot_heads
from pipesearch.search import search
from pipesearch.point_placement import mapped_visit_order
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job

from test_order_search import instances


def test_visit_order_puts_each_configurations_least_bound_first():
    """Rows by hand: (pp, schedule, vp) and bounds. The heads are the least
    bound of each (variant, pp, schedule, vp): variant a pp 4 1f1b at 2.0
    (row 1), pp 4 zb-h1 at 1.5 (row 2), pp 3 1f1b at 3.0 (row 4), and
    variant b pp 3 1f1b at 9.0 (row 5, a configuration of its own). They
    come first by bound (rows 2, 1, 4, 5), then the others by bound; of
    the three at 2.5, ZB-H1 (row 3) before 1F1B (least bubble first), and
    the two 1F1B rows by index (0, then 6)."""
    a, b = object(), object()
    rows = [dict(pp=4, schedule="1f1b", vp=1), dict(pp=4, schedule="1f1b", vp=1),
            dict(pp=4, schedule="zb-h1", vp=1), dict(pp=4, schedule="zb-h1", vp=1),
            dict(pp=3, schedule="1f1b", vp=1), dict(pp=3, schedule="1f1b", vp=1),
            dict(pp=4, schedule="1f1b", vp=1)]
    points = [(2.5, 6, a), (2.5, 0, a), (2.0, 1, a), (1.5, 2, a), (2.5, 3, a), (3.0, 4, a), (9.0, 5, b)]
    order = [p[1] for p in mapped_visit_order(points, rows)]
    assert order == [2, 1, 4, 5, 3, 0, 6]


def _ranked(result):
    return [(p.pp, p.dp, p.schedule, p.vp, round(p.predicted.iteration_time_s, 12)) for p in result.plans]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_ranked_plans_equal_the_exhaustive_search(inst):
    """Random mixed clusters (2-3 types, <= 6 devices, memory often
    binding), every pp and dp, top 3: the pruned search, mapped points
    last, ranks the same configurations with the same times as the
    exhaustive one. A mapped point left out, pruned against a cutoff that
    counted a plan not yet kept, or split from a cutoff below its own
    optimum would change the list."""
    cluster, tp, pp, m, schedule, vp, prof = inst
    if len(slot_heads(cluster, tp)) < 2:
        return
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    opts = dict(micro_batch_size=1, schedules=(schedule,), vps=(vp,), top=3, enumerate_layouts_up_to=0)
    variant = [ModelVariant(prof, tp=tp)]
    try:
        exhaustive = search(variant, cluster, job, SearchOptions(**opts, exhaustive=True),
                            profiled_device=cluster.groups[0].device)
    except Exception:  # noqa: BLE001 - nothing fits: the pruned search must say so too
        with pytest.raises(Exception):
            search(variant, cluster, job, SearchOptions(**opts), profiled_device=cluster.groups[0].device)
        return
    pruned = search(variant, cluster, job, SearchOptions(**opts), profiled_device=cluster.groups[0].device)
    assert _ranked(pruned) == _ranked(exhaustive)
