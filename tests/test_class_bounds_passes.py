"""The suffix-minimum DP of ``order_bounds.ClassBounds`` runs, per level
and class of the stage, every (vector, next class) pair in one numpy pass,
or in passes of at most ``MAX_PASS_FLOATS`` floats where the pairs are many. The passes change
memory, never values: with a limit of one pair per pass (each pair's
terms from ``ClassBounds._stage``, the path the bounds of a prefix use)
every table and every prefix bound equals the one-pass one bit for bit.
A pass whose pairs and next states were sliced apart, or a pair's terms
taken from another class, would differ."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from pipesearch import order_bounds
from pipesearch.order_bounds import CLASS_BOUND_SCHEDULES, class_bounds
from pipesearch.placement import slot_classes, slot_heads
from pipesearch.types import Job

from test_order_search import _point, instances


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_passes_give_the_same_tables_and_bounds(inst):
    cluster, tp, pp, m, schedule, vp, prof = inst
    if schedule not in CLASS_BOUND_SCHEDULES or pp > prof.num_layers or len(slot_heads(cluster, tp)) < pp:
        return
    classes = slot_classes(cluster, tp)
    costs_of = _point(prof, cluster, Job(global_batch_size=m, memory_reserve_bytes=0), tp, pp, m, schedule, 1)
    one = class_bounds(classes, costs_of, schedule, pp)
    saved = order_bounds.MAX_PASS_FLOATS
    order_bounds.MAX_PASS_FLOATS = 1  # one pair per pass, terms from _stage
    try:
        many = class_bounds(classes, costs_of, schedule, pp)
    finally:
        order_bounds.MAX_PASS_FLOATS = saved
    assert one.V.keys() == many.V.keys()
    for left in one.V:
        assert np.array_equal(one.V[left], many.V[left]), left
    root_one, root_many = one.root(), many.root()
    for c in range(len(classes)):
        if one.allowed(root_one, c):
            assert one.extend(root_one, c).bound_s == many.extend(root_many, c).bound_s
