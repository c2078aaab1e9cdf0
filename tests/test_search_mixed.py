"""The search on a cluster of mixed device types."""

from __future__ import annotations

import pytest

from pipesearch.ilp import map_pipeline
from pipesearch.models import load_model_source
from pipesearch.search import SearchOptions, search
from pipesearch.types import Cluster, DeviceGroup, Job, Link
from pipesearch.hardware import load_device


def mixed_cluster() -> Cluster:
    """Two nodes: 2 A100 40 GB, then 2 V100 16 GB (ids 0-1 fast, 2-3 slow)."""
    return Cluster(
        "2a100-2v100",
        (DeviceGroup(load_device("a100-40gb"), 1, 2), DeviceGroup(load_device("v100-16gb"), 1, 2)),
        intra_node=Link(100e9, 5e-6), inter_node=Link(12.5e9, 10e-6))


def test_single_pipeline_matches_exact_order_enumeration():
    """dp = 1, pp = 4, 1F1B: the device order comes from the exact order
    enumeration (pipesearch.ilp.map_pipeline with method="orders") for the
    closed-form objective, and the search then splits exactly for the
    simulated time, so its time is at most the simulated time of the
    enumeration's own split on that order. The profile's device is unknown,
    so both take its times as the first group's (A100) and scale the V100 by
    the fp32 peak ratio (an fp32 profile)."""
    cluster = mixed_cluster()
    src = load_model_source("vgg16", cluster)
    job = Job(global_batch_size=256)
    res = search(list(src.variants), cluster, job, SearchOptions(
        pp=4, dp=1, micro_batch_size=32, schedules=("1f1b",), top=1))
    best = res.plans[0]
    ref = map_pipeline(src.variants[0].profile, cluster, job, pp=4, micro_batch_size=32, num_micro_batches=8,
                       schedule="1f1b", objective="iteration", method="orders",
                       profiled_device=cluster.device_spec(0))  # the search's rule for unknown devices
    assert [d for st in best.stages for d in st.devices] == list(ref.devices)
    ref_plan = search(list(src.variants), cluster, job, SearchOptions(
        pp=4, dp=1, micro_batch_size=32, schedules=("1f1b",), top=1,
        split=tuple(b - a for a, b in zip(ref.bounds, ref.bounds[1:])))).plans[0]
    assert [d for st in ref_plan.stages for d in st.devices] == list(ref.devices)
    assert best.predicted.iteration_time_s <= ref_plan.predicted.iteration_time_s * (1 + 1e-12)
    # the fast devices take more of the model's compute than the slow ones
    fast = sum(st.compute_s for st in best.stages if st.device_type == "a100-40gb")
    assert {st.device_type for st in best.stages} == {"a100-40gb", "v100-16gb"}
    assert fast > 0


def test_plan_on_mixed_cluster_reports_device_types_and_beats_even_split():
    cluster = mixed_cluster()
    src = load_model_source("vgg16", cluster)
    job = Job(global_batch_size=256)
    opts = dict(pp=4, dp=1, micro_batch_size=32, schedules=("1f1b",), top=1)
    best = search(list(src.variants), cluster, job, SearchOptions(**opts)).plans[0]
    even = search(list(src.variants), cluster, job, SearchOptions(split=(10, 10, 10, 10), **opts)).plans[0]
    assert all(st.device_type in ("a100-40gb", "v100-16gb") for st in best.stages)
    assert best.predicted.iteration_time_s < even.predicted.iteration_time_s


@pytest.mark.slow
def test_16_devices_3_types_ranked_plans_proven():
    """The 16-device, 3-type case (4 H100 80 GB + 8 A100 40 GB + 4 V100 16 GB,
    4 per node; the 64-layer profile tests/data/synthetic-64.csv; global batch
    1024) as ``pipesearch plan --top 3`` runs it: every ranked plan's split is
    proven optimal and every mapped plan's device order is OPTIMAL. Points
    outside the table whose split search stopped at its limits (interleaved
    1F1B pp 4 x vp 2, whose splits are checked device by device, each chunk
    alone against its whole device while searching) are reported with their
    least bound, which is below the third plan's time (a point whose bound
    reaches it is settled, not open)."""
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from pipesearch.cli import main

    data = Path(__file__).parent / "data"
    res = CliRunner().invoke(main, ["plan", "-q", "--json", "--model", str(data / "synthetic-64.csv"), "--cluster",
                                    str(data / "mixed-16-3types.toml"), "--top", "3"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["plans"]) == 3
    for plan in out["plans"]:
        assert plan["options"]["split_search"]["exact"]
        if plan["options"]["placement"] == "mapped":
            assert plan["options"]["mapping"]["status"] == "OPTIMAL"
    if "unproven_points" in out["search"]:
        assert out["search"]["unproven_points"]["least_lower_bound_s"] < out["plans"][2]["predicted"][
            "iteration_time_s"]


def test_mapped_points_no_order_can_win_are_pruned_without_a_split(monkeypatch):
    """A mapped point whose order search proves that no order and split
    beats the search's cutoff (status ABOVE_CUTOFF, bound at least the
    cutoff) is pruned as it stands: no order that fits is looked for and no
    split search runs on one (its point costs are never built). The
    search's answer is the same as with every point split (exhaustive)."""
    import pipesearch.search as search_mod

    cluster = mixed_cluster()
    src = load_model_source("vgg16", cluster)
    job = Job(global_batch_size=256)
    ordered, costed = [], []
    order_of, costs_of = search_mod._mapped_order, search_mod._point_costs

    def key(row):
        return (row["pp"], row["micro_batch_size"], row["schedule"], row["vp"])

    def mapped_order(cluster, variant, row, ctx):
        ordered.append(key(row))
        return order_of(cluster, variant, row, ctx)

    def point_costs(variant, cluster, job, row, *args):
        if row["placement"] == "mapped":
            costed.append(key(row))
        return costs_of(variant, cluster, job, row, *args)

    monkeypatch.setattr(search_mod, "_mapped_order", mapped_order)
    monkeypatch.setattr(search_mod, "_point_costs", point_costs)
    opts = dict(dp=1, schedules=("gpipe", "1f1b"), top=1, enumerate_layouts_up_to=0)  # a mapped placement
    res = search(list(src.variants), cluster, job, SearchOptions(**opts))
    cols = res.point_columns
    rows = [dict(zip(cols, values)) for values in zip(*cols.values())]
    settled = [key(r) for r in rows if r["placement"] == "mapped" and r["status"] == "pruned" and key(r) in ordered]
    assert settled, "no mapped point was settled by its order search"
    assert not set(settled) & set(costed)
    monkeypatch.undo()
    every = search(list(src.variants), cluster, job, SearchOptions(exhaustive=True, **opts))
    assert res.plans[0].predicted.iteration_time_s == pytest.approx(every.plans[0].predicted.iteration_time_s,
                                                                     rel=1e-12)
