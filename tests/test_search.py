"""Tests of the plan search (pipesearch.search) on tiny hand-made models and
on the catalog's real profiles.

Expected values come from hand derivations (docstrings) or from brute force:
every point of the space enumerated here, each split by the exhaustive
search, compared with what the pruned search returns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import COST_MODELS, tiles, tiny_cluster, tiny_profile
from pipesearch.catalog import list_entries
from pipesearch.costs import build_pipeline_costs, pipeline_placement
from pipesearch.errors import InfeasibleError, InputError
from pipesearch.hardware import load_cluster
from pipesearch.models import load_model_source
from pipesearch.partition import even_split, exhaustive_split, optimal_split
from pipesearch.schedules import build, in_flight_peaks
from pipesearch.split_search import exhaustive_simulated_split
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.search_space import divisors
from pipesearch.types import Job, Link

GIB = 2**30
ANALYTIC = ("gpipe", "1f1b")


def analytic(plan) -> float:
    """The plan's iteration time: the simulated one (the one time model)."""
    return plan.predicted.iteration_time_s


def check_plan_covers_model(plan, profile):
    """The stages tile [0, L) in order, every layer placed exactly once, and
    the stage layer names are the profile's names in order."""
    L = profile.num_layers
    bounds = (plan.stages[0].layers[0],) + tuple(st.layers[1] for st in plan.stages)
    assert tiles(bounds, L)
    assert all(a.layers[1] == b.layers[0] for a, b in zip(plan.stages, plan.stages[1:]))
    assert [st.index for st in plan.stages] == list(range(len(plan.stages)))
    names = [n for st in plan.stages for n in st.layer_names]
    assert names == [lay.name for lay in profile.layers]
    for st in plan.stages:
        assert len(st.layer_names) == st.layers[1] - st.layers[0]
        assert len(st.devices) == plan.dp
    assert sum(plan.layers_per_stage) == L
    assert len(plan.stages) == plan.pp * plan.vp


def check_plan_fits(plan, cluster, job):
    """Each device's stages fit in its memory less the reserve (a device of
    an interleaved plan holds the stages ``index % pp``)."""
    per_device: dict[int, float] = {}
    for st in plan.stages:
        for d in st.devices:
            per_device[d] = per_device.get(d, 0.0) + st.memory_bytes
    for d, used in per_device.items():
        cap = cluster.device_spec(d).memory_bytes - job.memory_reserve_bytes
        assert used <= cap * (1 + 1e-12), (d, used, cap)
    assert plan.predicted.peak_memory_bytes <= plan.predicted.memory_capacity_bytes
    assert math.isfinite(plan.predicted.iteration_time_s) and plan.predicted.iteration_time_s > 0


# ------------------------------------------------------------- tiny, by hand


def test_split_option_scores_the_given_split():
    """12 layers of fwd 1 s + bwd 2 s at batch 1; global batch 4, dp = 1,
    micro-batch 1: m = 4. Split 5,3,4 on 3 stages, free links, no weights:
    a = (15, 9, 12) s, T = 36 + (4 - 1) * 15 = 81 s (GPipe)."""
    prof = tiny_profile([1.0] * 12)
    res = search([ModelVariant(prof)], tiny_cluster(1, 4), Job(4), SearchOptions(
        split=(5, 3, 4), dp=1, micro_batch_size=1, schedules=("gpipe",)))
    plan = res.plans[0]
    assert plan.layers_per_stage == (5, 3, 4) and plan.pp == 3
    assert [st.compute_s for st in plan.stages] == [15.0, 9.0, 12.0]
    assert analytic(plan) == 81.0 == plan.predicted.iteration_time_s
    check_plan_covers_model(plan, prof)


def test_search_finds_the_hand_optimum():
    """Same model, pp = 3 pinned: the best split of 12 equal layers is 4,4,4,
    a = 12 each, T = 36 + 3 * 12 = 72 s, better than 5,3,4's 81 s."""
    prof = tiny_profile([1.0] * 12)
    res = search([ModelVariant(prof)], tiny_cluster(1, 4), Job(4), SearchOptions(
        pp=3, dp=1, micro_batch_size=1, schedules=("gpipe",)))
    assert res.plans[0].layers_per_stage == (4, 4, 4) and analytic(res.plans[0]) == 72.0


def test_memory_cap_search_avoids_the_even_split():
    """The memory case of test_partition at the search level: 8 layers of
    1.25 GiB saved activations (batch 1), no weights; 4 devices with 9 GiB
    usable (10 GiB, 1 GiB reserve); 1F1B, pp = 4, m = 8 (batch 8, micro-batch
    1). Stage s holds min(8, 4 - s) = 4, 3, 2, 1 micro-batches: the even split
    2,2,2,2 needs 2 * 1.25 * 4 = 10 GiB > 9 on stage 0, and the best
    feasible splits have a largest stage of 3 layers; the plan's time is the
    best simulated time over every feasible split (brute force)."""
    prof = tiny_profile([1.0] * 8, saved=[1.25 * GIB] * 8, outputs=[0.0] * 8)
    cluster = tiny_cluster(1, 4, memory_bytes=10 * GIB)
    job = Job(8, memory_reserve_bytes=GIB)
    opts = dict(pp=4, dp=1, micro_batch_size=1, schedules=("1f1b",))
    plan = search([ModelVariant(prof)], cluster, job, SearchOptions(**opts)).plans[0]
    assert max(plan.layers_per_stage) == 3 and plan.layers_per_stage[0] == 1
    costs = build_pipeline_costs(prof, cluster, job, pp=4, dp=1, micro_batch_size=1, num_micro_batches=8,
                                 schedule="1f1b", placement=pipeline_placement(4, 1),
                                 in_flight=np.array(in_flight_peaks(build("1f1b", 4, 8))))
    assert analytic(plan) == pytest.approx(exhaustive_simulated_split(costs, "1f1b", 4)[0], rel=1e-12)
    assert plan.stages[0].memory_bytes == 1.25 * GIB * 4
    check_plan_fits(plan, cluster, job)
    with pytest.raises(InfeasibleError):
        search([ModelVariant(prof)], cluster, job, SearchOptions(split=(2, 2, 2, 2), **opts))


def _brute_force_family_times(prof, cluster, job):
    """Every (pp, dp, micro-batch, schedule, placement) point of the GPipe /
    1F1B space, every split simulated (memory from the schedule builder's own
    in-flight peaks); the best time of each (pp, dp, schedule) family, sorted.
    Rules written from the search's documentation: dp
    divides the batch, the micro-batch size divides the replica batch, 1F1B
    needs m >= pp, a single stage is run as 1F1B, both placement orders
    only when pp > 1 and dp > 1."""
    best: dict[tuple, float] = {}
    L, n = prof.num_layers, cluster.num_devices
    for pp in range(1, min(L, n) + 1):
        for dp in range(1, n // pp + 1):
            if job.global_batch_size % dp:
                continue
            per = job.global_batch_size // dp
            for mbs in divisors(per):
                m = per // mbs
                for schedule in (("1f1b",) if pp == 1 else ANALYTIC):
                    if schedule == "1f1b" and m < pp:
                        continue
                    for order in (("pipeline", "data") if pp > 1 and dp > 1 else ("pipeline",)):
                        costs = build_pipeline_costs(
                            prof, cluster, job, pp=pp, dp=dp, micro_batch_size=mbs, num_micro_batches=m,
                            schedule=schedule, placement=pipeline_placement(pp, dp, order),
                            in_flight=np.array(in_flight_peaks(build(schedule, pp, m))))
                        res = exhaustive_simulated_split(costs, schedule, pp)
                        if res is None:
                            continue
                        key = (pp, dp, schedule)
                        best[key] = min(best.get(key, math.inf), res[0])
    return sorted(best.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("memory_gib", [12, 7])
@pytest.mark.parametrize("exhaustive", [False, True])
def test_pruned_ranking_equals_brute_force(exhaustive, memory_gib):
    """A 7-layer model on 2 nodes x 2 devices with slow links between nodes,
    weights worth all-reducing and a memory cap that rules some points out:
    the search's top analytic plans (pruned or not) are exactly the best
    families of the brute force, in order."""
    rng = np.random.default_rng(3)
    L = 7
    prof = tiny_profile(list(rng.uniform(1e-3, 8e-3, L)), params=list(rng.uniform(0, 4e8, L)),
                        outputs=list(rng.uniform(1e6, 4e7, L)), saved=list(rng.uniform(1e8, 6e8, L)), batch_size=8)
    cluster = tiny_cluster(2, 2, memory_bytes=memory_gib * GIB, intra=Link(1e10, 1e-5),
                           inter=Link(1.25e9, 5e-5))
    job = Job(32, memory_reserve_bytes=GIB)
    expected = _brute_force_family_times(prof, cluster, job)
    top = min(6, len(expected))
    assert top >= 4
    res = search([ModelVariant(prof)], cluster, job, SearchOptions(
        schedules=ANALYTIC, top=top, exhaustive=exhaustive))
    got = [(p.pp, p.dp, p.schedule) for p in res.plans]
    times = [analytic(p) for p in res.plans]
    assert len(res.plans) == top
    # near-ties (0.1 %) are ordered by memory, so compare the sets of times
    assert sorted(times) == pytest.approx([t for _, t in expected[:top]], rel=1e-12)
    # the families may tie; each returned family has the time brute force gives it
    table = dict(expected)
    for fam, t in zip(got, times):
        assert table[fam] == pytest.approx(t, rel=1e-12)
    for plan in res.plans:
        check_plan_covers_model(plan, prof)
        check_plan_fits(plan, cluster, job)


@pytest.mark.parametrize("seed", [0, 2, 5])
@pytest.mark.parametrize("exhaustive", [False, True])
def test_pruned_ranking_with_tight_bounds_equals_brute_force(seed, exhaustive):
    """Free links, no weights, near-equal layers: the search's lower bound
    W (1 + (m-1)/pp) is almost the true time, so many points sit just above
    the best and pruning has to compare with the K-th best plan, not the
    first. 6 GiB devices make GPipe (m micro-batches in flight) differ from
    1F1B."""
    rng = np.random.default_rng(seed)
    L = 8
    prof = tiny_profile(list(rng.uniform(1e-3, 2e-3, L)), saved=list(rng.uniform(1e8, 6e8, L)),
                        outputs=[0.0] * L, batch_size=8)
    cluster = tiny_cluster(1, 4, memory_bytes=6 * GIB)
    job = Job(32, memory_reserve_bytes=GIB)
    expected = _brute_force_family_times(prof, cluster, job)
    top = min(6, len(expected))
    res = search([ModelVariant(prof)], cluster, job, SearchOptions(
        schedules=ANALYTIC, top=top, exhaustive=exhaustive))
    assert sorted(analytic(p) for p in res.plans) == pytest.approx([t for _, t in expected[:top]], rel=1e-12)


def test_more_stages_than_layers_is_refused():
    cluster = load_cluster("1x4-v100-pcie")
    src = load_model_source("alexnet", cluster)
    with pytest.raises(InputError, match=r"--pp 100.*22 layers"):
        search(list(src.variants), cluster, Job(1024), SearchOptions(pp=100))


def test_model_that_fits_nowhere_says_so():
    """10 layers of 1e12 bytes of fp32 weights: 16 bytes of state per 4-byte
    parameter = 4e12 bytes per layer, far beyond 15 GiB."""
    prof = tiny_profile([1e-3] * 10, params=[1e12] * 10)
    cluster = tiny_cluster(1, 4, memory_bytes=16 * GIB)
    with pytest.raises(InfeasibleError, match="no plan fits"):
        search([ModelVariant(prof)], cluster, Job(64), SearchOptions())


def test_zero_time_model_is_refused():
    """A profile whose layers all take 0 s has iteration time 0 and an
    infinite throughput: a clear input error, not a crash later."""
    prof = tiny_profile([0.0] * 4, times_bwd=[0.0] * 4, outputs=[8.0] * 4)
    with pytest.raises(InputError, match="zero"):
        search([ModelVariant(prof)], tiny_cluster(1, 4), Job(8), SearchOptions())


# ------------------------------------------------------------- real profiles


CSV_MODELS = sorted(name for name, path in list_entries("model").items() if path.suffix == ".csv")


def test_catalog_has_the_csv_profiles():
    assert {p.stem for p in COST_MODELS.glob("*.csv")} == set(CSV_MODELS)
    assert {"vgg16", "resnet50", "gnmt", "alexnet"} <= set(CSV_MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("cluster_name", ["1x4-v100-pcie", "4x4-v100-10gbe"])
def test_every_catalog_profile_plans(cluster_name):
    """Every profile in cost_models/*.csv loads and plans; every plan places
    each layer once and fits in memory."""
    cluster = load_cluster(cluster_name)
    job = Job(1024)
    for name in CSV_MODELS:
        src = load_model_source(name, cluster)
        prof = src.variants[0].profile
        res = search(list(src.variants), cluster, job, SearchOptions(top=3),
                     profiled_device=src.profiled_device)
        assert res.plans, name
        for plan in res.plans:
            check_plan_covers_model(plan, prof)
            check_plan_fits(plan, cluster, job)


@pytest.mark.parametrize("model,cluster_name", [
    ("vgg16", "4x4-v100-10gbe"), ("resnet50", "1x4-v100-pcie"), ("gnmt", "4x4-v100-10gbe"),
])
def test_real_search_plans_cover_the_model(model, cluster_name):
    """Every plan of a real search (top 10, all schedules) tiles the layers
    and its layer names are the profile's."""
    cluster = load_cluster(cluster_name)
    job = Job(1024)
    src = load_model_source(model, cluster)
    res = search(list(src.variants), cluster, job, SearchOptions(top=10),
                 profiled_device=src.profiled_device)
    assert len(res.plans) >= 3
    for plan in res.plans:
        check_plan_covers_model(plan, src.variants[0].profile)
        check_plan_fits(plan, cluster, job)


POINTS = [  # model, cluster, pp, dp, micro-batch size, schedule
    ("vgg16", "4x4-v100-10gbe", 4, 4, 8, "1f1b"),
    ("vgg16", "1x4-v100-pcie", 4, 1, 16, "1f1b"),
    ("vgg16", "1x4-v100-pcie", 2, 2, 16, "1f1b"),
    ("resnet50", "1x4-v100-pcie", 4, 1, 32, "1f1b"),
    ("resnet50", "4x4-v100-10gbe", 2, 8, 8, "gpipe"),
    ("gnmt", "1x4-v100-pcie", 4, 1, 16, "1f1b"),
    ("gnmt", "4x4-v100-10gbe", 4, 4, 8, "1f1b"),
]


@pytest.mark.parametrize("model,cluster_name,pp,dp,mbs,schedule", POINTS)
def test_best_split_no_worse_than_even(model, cluster_name, pp, dp, mbs, schedule):
    """At a fixed (pp, dp, micro-batch, schedule, placement) the searched
    split's analytic time is at most the even split's (scored with
    SearchOptions(split=...)), and fits in memory."""
    cluster = load_cluster(cluster_name)
    job = Job(1024)
    src = load_model_source(model, cluster)
    prof = src.variants[0].profile
    common = dict(dp=dp, micro_batch_size=mbs, schedules=(schedule,), placements=("pipeline",),
                  top=1)
    best = search(list(src.variants), cluster, job, SearchOptions(pp=pp, **common),
                  profiled_device=src.profiled_device).plans[0]
    check_plan_covers_model(best, prof)
    check_plan_fits(best, cluster, job)
    sizes = tuple(b - a for a, b in zip(even_split(prof.num_layers, pp), even_split(prof.num_layers, pp)[1:]))
    try:
        even = search(list(src.variants), cluster, job, SearchOptions(split=sizes, **common),
                      profiled_device=src.profiled_device).plans[0]
    except InfeasibleError as exc:
        # the even split does not fit (and the searched one, which does, differs from it)
        assert "out_of_memory" in str(exc) and best.layers_per_stage != sizes
        return
    assert even.layers_per_stage == sizes
    assert analytic(best) <= analytic(even)


@pytest.mark.parametrize("model,cluster_name,pp,dp,mbs,schedule", [
    ("gnmt", "1x4-v100-pcie", 4, 1, 16, "1f1b"),
    ("gnmt", "4x4-v100-10gbe", 4, 4, 8, "gpipe"),
    ("vgg16", "4x4-v100-10gbe", 3, 4, 8, "1f1b"),
    ("resnet50", "4x4-v100-10gbe", 3, 4, 8, "gpipe"),
])
def test_real_profile_split_is_exact(model, cluster_name, pp, dp, mbs, schedule):
    """On real cost terms (catalog profile and cluster), the exact split
    equals the exhaustive one (C(10,3) = 120 or C(39,2) = 741 splits)."""
    cluster = load_cluster(cluster_name)
    job = Job(1024)
    src = load_model_source(model, cluster)
    m = 1024 // dp // mbs
    costs = build_pipeline_costs(src.variants[0].profile, cluster, job, pp=pp, dp=dp, micro_batch_size=mbs,
                                 num_micro_batches=m, schedule=schedule,
                                 placement=pipeline_placement(pp, dp, "pipeline"),
                                 profiled_device=src.profiled_device)
    opt, ex = optimal_split(costs), exhaustive_split(costs)
    assert (opt is None) == (ex is None)
    if opt is not None:
        assert opt.iteration_time_s == pytest.approx(ex.iteration_time_s, rel=1e-12)
        assert opt.iteration_time_s >= ex.iteration_time_s


def test_default_search_ranks_five_plans_in_time_order():
    """The default CLI search (vgg16 on 4x4-v100-10gbe, batch 1024) returns
    the five plans the table shows, in nondecreasing simulated time, each
    on the cluster's 16 devices or fewer. Its speed is measured in
    benchmarks/ (bench_scale.py), not here: a timed test fails under load."""
    cluster = load_cluster("4x4-v100-10gbe")
    src = load_model_source("vgg16", cluster)
    res = search(list(src.variants), cluster, Job(1024), SearchOptions(), profiled_device=src.profiled_device)
    assert len(res.plans) == 5
    times = [p.predicted.iteration_time_s for p in res.plans]
    assert times == sorted(times)
    assert all(p.pp * p.dp * p.tp <= 16 for p in res.plans)


def test_equal_times_within_a_family_go_to_the_least_memory(tmp_path):
    """One device, 16 samples: 16 x 1, 8 x 2, ..., 1 x 16 run the same
    compute one micro-batch after another, so every micro-batching takes the
    same time (up to rounding: 0.24 and 0.2400000000000001 s), while the
    activations grow with the micro-batch. The ranking's tie rule (least
    memory) picks micro-batches of 1 inside the family too; the first point
    evaluated, or a rounding error's faster one, did before."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    profile = tmp_path / "p.csv"
    profile.write_text("# batch_size: 32\n# device: v100-pcie-16gb\n# bytes_per_param: 4\n"
                       "name,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes\n"
                       "embed,2.0,4.0,40000000,8000000,8000000\nl1,5.0,10.0,20000000,8000000,16000000\n"
                       "l2,5.0,10.0,20000000,8000000,16000000\nhead,3.0,6.0,40000000,1000000,4000000\n")
    points = tmp_path / "pts.csv"
    r = CliRunner().invoke(main, ["plan", "--model", str(profile), "--cluster", "1x4-v100-pcie", "--pp", "1",
                                  "--dp", "1", "-b", "16", "--schedule", "1f1b", "--all-points", str(points), "--json"])
    assert r.exit_code == 0, r.output
    import json

    import pandas as pd

    plan = json.loads(r.output)["plans"][0]
    ok = pd.read_csv(points).query("status == 'ok'")
    assert len(ok) == 5 and ok.iteration_time_s.max() <= ok.iteration_time_s.min() * (1 + 1e-12)
    assert plan["schedule"]["micro_batch_size"] == 1
    assert plan["predicted"]["peak_memory_bytes"] == ok.peak_memory_bytes.min()


def test_pp_1_runs_a_schedule_that_takes_one_stage_per_rank():
    """--schedule interleaved-1f1b --schedule gpipe: pp 1 was searched with
    the first schedule listed, interleaving, which refuses pp 1, so no pp 1
    point was evaluated (the order of the flags changed the answer's space);
    it runs GPipe's order there."""
    import json

    from click.testing import CliRunner

    from pipesearch.cli import main

    def pp1(*schedules):
        args = ["plan", "-q", "--json", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "64", "--pp", "1",
                "--top", "1"]
        for s in schedules:
            args += ["--schedule", s]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["plans"][0]

    first, second = pp1("interleaved-1f1b", "gpipe"), pp1("gpipe", "interleaved-1f1b")
    assert first["schedule"]["name"] == second["schedule"]["name"] == "gpipe"
    assert first["predicted"]["iteration_time_s"] == second["predicted"]["iteration_time_s"]
