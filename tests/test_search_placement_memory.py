"""Whether a split fits in memory does not depend on the placement when
every device has one spec (``point_placement.memory_key``): a point of another
placement whose twin no split fits is reported out of memory without its
own split search. Checked against the same search with that shortcut off:
every point's status, bound and time and the ranked plans equal, on random
8-layer profiles with one heavy layer under memory caps at which points
fit no split for the stage that holds it (past the search's memory
pre-filter), on two nodes whose links differ (so the placements differ);
and the shortcut fires. A key without the schedule (GPipe's overflow read
as 1F1B's, which holds fewer micro-batches) changes statuses on two of
these instances."""

from __future__ import annotations

import numpy as np

import pipesearch.search as search_mod
from helpers import tiny_cluster, tiny_profile
from pipesearch.errors import InfeasibleError
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job, Link


def _instance(seed: int):
    rng = np.random.default_rng(seed)
    L = 8
    fwd = rng.exponential(1e-3, L)
    params = rng.exponential(1e6, L)
    params[rng.integers(L)] *= 8
    saved = rng.exponential(1e6, L)
    prof = tiny_profile(fwd, 2 * fwd, params=params, outputs=0.3 * saved, saved=saved)
    cluster = tiny_cluster(2, 4, memory_bytes=float(rng.uniform(2e7, 6e7)), intra=Link(50e9, 5e-6),
                           inter=Link(5e9, 2e-5))
    return prof, cluster, Job(global_batch_size=32, memory_reserve_bytes=0)


def _ranked(result):
    return [(p.pp, p.dp, p.vp, p.schedule, p.micro_batch_size, tuple(p.layers_per_stage),
             p.predicted.iteration_time_s, dict(p.extra).get("placement")) for p in result.plans]


def test_points_no_split_fits_on_one_placement_fit_none_on_the_other(monkeypatch):
    skipped = 0
    for seed in range(28, 40):
        prof, cluster, job = _instance(seed)
        variant = [ModelVariant(prof)]
        calls = []
        evaluate = search_mod._evaluate

        def counted(*args, **kwargs):
            calls.append(args[4]["placement"])
            return evaluate(*args, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(search_mod, "_evaluate", counted)
            fast = _search_or_message(variant, cluster, job)
            n_fast = len(calls)
            m.setattr(search_mod, "memory_key", lambda *a: None)
            slow = _search_or_message(variant, cluster, job)
        skipped += (len(calls) - n_fast) - n_fast
        if isinstance(fast, str):  # no plan at all: the same counts by reason in the message
            assert fast == slow, seed
            continue
        assert {k: list(v) for k, v in fast.point_columns.items()} == {
            k: list(v) for k, v in slow.point_columns.items()}, seed
        assert _ranked(fast) == _ranked(slow), seed
    assert skipped > 0


def _search_or_message(variant, cluster, job):
    try:
        return search(variant, cluster, job, SearchOptions(top=3))
    except InfeasibleError as err:
        return str(err)


def test_devices_of_two_memory_sizes_get_no_shortcut():
    """Two groups whose devices differ in memory (here under one device
    name: a user's device file) hold a stage in different capacities on
    different placements: no key, each placement searched. One size: a key
    without the placement."""
    from helpers import tiny_device
    from pipesearch.types import Cluster, DeviceGroup

    def cluster(second_bytes):
        groups = (DeviceGroup(tiny_device(1e9), 1, 4), DeviceGroup(tiny_device(second_bytes), 1, 4))
        return Cluster(name="two", groups=groups, intra_node=Link(50e9, 5e-6), inter_node=Link(5e9, 2e-5))

    variant = ModelVariant(tiny_profile([1e-3] * 4))
    row = {"pp": 2, "dp": 2, "micro_batch_size": 1, "num_micro_batches": 4, "schedule": "1f1b", "vp": 1,
           "placement": "data"}
    assert search_mod.memory_key(cluster(2e9), variant, row, SearchOptions()) is None
    other = dict(row, placement="pipeline")
    assert search_mod.memory_key(cluster(1e9), variant, row, SearchOptions()) == search_mod.memory_key(
        cluster(1e9), variant, other, SearchOptions()) is not None
