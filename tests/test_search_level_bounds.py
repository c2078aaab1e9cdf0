"""The search level's lower bounds and its start-up path.

Oracles: every split of every point enumerated and timed by the time model
(:func:`pipesearch.timemodel.iteration_time_s`) on small seeded models; the
min-max partition by enumerating every contiguous split; the busiest device
by enumerating every assignment of layers to devices; the schedules' own
action lists for the in-flight counts; pandas' ``DataFrame.to_string`` for
the text table; module lists of a fresh interpreter for the imports.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import tiny_cluster, tiny_device, tiny_profile
from pipesearch import schedules as schedule_lib
from pipesearch import split_search
from pipesearch.cli import main
from pipesearch.output_table import format_table
from pipesearch.in_flight import schedule_in_flight
from pipesearch.point_placement import point_costs
from pipesearch.search_bounds import (busiest_device_per_sample_s, busiest_stage_per_sample_s, capacity_time_scale,
                                      fill_drain_factor, forward_share_of, group_lower_bound_s,
                                      packed_busiest_per_sample_s, point_lower_bound_s)
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.search_space import expand_group, group_stages, in_bound_order, point_row
from pipesearch.timemodel import iteration_time_s
from pipesearch.types import Cluster, DeviceGroup, Job, Layer, Link, ModelProfile

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs")


def _splits(num_layers: int, stages: int):
    return [(0, *cut, num_layers) for cut in itertools.combinations(range(1, num_layers), stages - 1)]


def _profile(seed: int, num_layers: int, fixed: bool) -> ModelProfile:
    """Seeded layers at batch size 4: uneven times (one heavy layer), bytes
    that make links and the all-reduce cost something; with ``fixed``, a
    fixed part of each time (an affine fit)."""
    rng = np.random.default_rng(seed)
    fwd = rng.uniform(1e-3, 4e-3, num_layers)
    fwd[rng.integers(num_layers)] *= 4
    bwd = fwd * rng.uniform(1.5, 2.5, num_layers)
    base = tiny_profile(fwd, bwd, params=rng.uniform(1e6, 8e6, num_layers),
                        outputs=rng.uniform(1e5, 1e6, num_layers), batch_size=4)
    if not fixed:
        return base
    layers = tuple(Layer(name=lay.name, fwd_s=lay.fwd_s, bwd_s=lay.bwd_s, param_bytes=lay.param_bytes,
                         output_bytes=lay.output_bytes, saved_bytes=lay.saved_bytes,
                         fwd_fixed_s=0.3 * lay.fwd_s, bwd_fixed_s=0.2 * lay.bwd_s) for lay in base.layers)
    return ModelProfile(name="fixed", layers=layers, profiled_batch_size=4, bytes_per_param=4.0, source="test")


@pytest.mark.parametrize("seed,fixed", [(0, False), (1, True), (2, False), (3, True)])
def test_point_and_group_bounds_are_at_most_every_split(seed, fixed):
    """On 8 devices (two nodes of 4, finite links) and global batch 16,
    every point of every (pp, dp) group, every schedule (interleaved and
    looped BFS with vp 2): the point's bound (integral layers, fill and
    drain) is at most
    the simulated time of every split of the point (memory ignored), and the
    group's bound at most every point's. A bound that took ``B*`` over
    ``pp`` stages for an interleaved point (it has ``pp vp``), used the full
    time where only the per-sample part is safe, packed ``k`` instead of
    ``k + 1`` layers, or gave ZB-H1 the backward in its fill and drain
    (share 1) would exceed some split here."""
    prof = _profile(seed, 7, fixed)
    cluster = tiny_cluster(2, 4, intra=Link(50e9, 5e-6), inter=Link(2e9, 2e-5))
    job = Job(global_batch_size=16)
    options = SearchOptions(schedules=SCHEDULES, vps=(2,))
    variant = ModelVariant(prof)
    work, cache, checked, share = prof.compute_per_sample_s, {}, 0, forward_share_of(prof)
    for pp in range(1, 8):
        for dp in (d for d in (1, 2, 4, 8) if pp * d <= 8):
            group = group_lower_bound_s(work, pp, 16 // dp, 1.0,
                                        busiest_device_per_sample_s(prof, pp, group_stages(pp, options), cache))
            for mbs, m, schedule, vp, placement, status in expand_group(variant, pp, dp, job, options, cluster):
                if status is not None:
                    continue
                row = point_row(variant, pp, dp, mbs, m, schedule, vp, placement, None)
                _, costs = point_costs(variant, cluster, job, row, None, {}, {}, {"job": job, "profiled_device": None})
                bound = point_lower_bound_s(work, pp, mbs, m, schedule, 1.0,
                                            busiest_device_per_sample_s(prof, pp, pp * vp, cache), share)
                best = min(iteration_time_s(schedule, pp, m, vp, costs.stage_times(b)) for b in _splits(7, pp * vp))
                assert bound <= best * (1 + 1e-12), (pp, dp, mbs, schedule, vp, bound, best)
                assert group <= bound * (1 + 1e-12), (pp, dp, mbs, schedule, vp, group, bound)
                checked += 1
    assert checked > 150


def _two_speed_cluster() -> Cluster:
    """2 devices twice as fast as the 4 others (one node each): with times
    profiled on the slow type, time scales 0.5 and 1."""
    fast = DeviceGroup(replace(tiny_device(name="fast"), peak_fp16_flops=200e12), 1, 2)
    slow = DeviceGroup(tiny_device(name="slow"), 1, 4)
    return Cluster(name="two-speeds", groups=(slow, fast), intra_node=Link(math.inf, 0.0),
                   inter_node=Link(math.inf, 0.0))


def test_capacity_time_scale_by_hand():
    """Speeds (1 / scale) 2, 2, 1, 1, 1, 1: the fastest ``n`` slots sum to
    2, 4, 5, 6, 7, 8, so ``a = n / sum`` is 0.5, 0.5, 0.6, 2/3, 5/7, 0.75;
    with tp 2 the slots are one fast pair (speed 2) and two slow pairs (1
    each): 0.5, 2/3, 0.75. Past the slots there are, and on a cluster of one
    type, None."""
    cluster, slow = _two_speed_cluster(), tiny_device(name="slow")
    expected = [0.5, 0.5, 0.6, 2 / 3, 5 / 7, 0.75]
    assert [capacity_time_scale(cluster, slow, "fp16", n, 1) for n in range(1, 7)] == pytest.approx(expected)
    assert [capacity_time_scale(cluster, slow, "fp16", n, 2) for n in range(1, 4)] == pytest.approx([0.5, 2 / 3, 0.75])
    assert capacity_time_scale(cluster, slow, "fp16", 7, 1) is None
    assert capacity_time_scale(cluster, slow, "fp16", 4, 2) is None
    assert capacity_time_scale(tiny_cluster(1, 4), None, "fp16", 2, 1) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_capacity_bound_is_at_most_every_assignment(seed):
    """The busiest rank's compute on the mixed cluster above, by brute force:
    every choice of ``dp`` disjoint ordered ``pp``-tuples of devices, and for
    each pipeline its best split of 5 seeded layers (each pipeline its own,
    which can only be faster than one split for all), ``m W_stage a_device``
    at most over the ranks of the slowest pipeline, least over all of them.
    ``m W a / pp`` with ``a`` from :func:`capacity_time_scale` is at most
    that (a bound from the slowest devices, or without the ``dp``
    pipelines sharing the fastest ones, exceeds it), and above the
    fastest-type bound ``m W 0.5 / pp`` for some point."""
    rng = np.random.default_rng(seed)
    work = rng.uniform(1.0, 4.0, 5)
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    scale = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5]  # the slow group first, as the cluster lists them
    cluster, m, stronger = _two_speed_cluster(), 3, 0
    for pp in range(1, 5):
        splits = _splits(5, pp)

        def pipeline_s(devices):
            return min(max(m * (prefix[b[k + 1]] - prefix[b[k]]) * scale[d] for k, d in enumerate(devices))
                       for b in splits)

        for dp in (1, 2):
            if pp * dp > 6:
                continue
            best = math.inf
            for devices in itertools.permutations(range(6), pp * dp):
                best = min(best, max(pipeline_s(devices[r * pp:(r + 1) * pp]) for r in range(dp)))
            a = capacity_time_scale(cluster, tiny_device(name="slow"), "fp16", pp * dp, 1)
            bound = m * prefix[-1] * a / pp
            assert bound <= best * (1 + 1e-12), (pp, dp, bound, best)
            stronger += bound > m * prefix[-1] * 0.5 / pp * (1 + 1e-9)
    assert stronger >= 3


def test_fill_drain_factor_by_hand():
    """Two stages, two micro-batches, backward after forward (share 1):
    ``T >= 2 a0`` and ``T >= a0 + 2 a1``; the least max of the two over
    ``a0 + a1 = W`` is at ``a0 = 2 a1``: ``4 W / 3``. One stage: ``m W``.
    Forward share 0: the average ``m / pp``."""
    assert fill_drain_factor(2, 2, 1.0) == pytest.approx(4 / 3, rel=1e-11)
    assert fill_drain_factor(2, 2, 1.0) <= 4 / 3
    assert fill_drain_factor(1, 7, 1.0) == pytest.approx(7.0, rel=1e-11)
    assert fill_drain_factor(4, 8, 0.0) == 2.0
    # share 1/2, pp 2, m 1: T >= a0 and T >= a0 / 2 + a1, least max at a0 = 2 a1: 2 W / 3
    assert fill_drain_factor(2, 1, 0.5) == pytest.approx(2 / 3, rel=1e-11)


@pytest.mark.parametrize("seed", range(6))
def test_busiest_stage_is_the_min_max_partition(seed):
    """Against every contiguous split: at most the least largest stage, and
    within the bisection's tolerance of it."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(4, 10))
    per_sample = rng.uniform(0.1, 1.0, L) * np.where(rng.random(L) < 0.2, 5.0, 1.0)
    prof = tiny_profile(per_sample / 3, 2 * per_sample / 3)
    prefix = np.concatenate([[0.0], np.cumsum(per_sample)])
    for stages in range(1, L + 3):
        exact = min(max(prefix[b[k + 1]] - prefix[b[k]] for k in range(len(b) - 1))
                    for b in _splits(L, min(stages, L)))
        got = busiest_stage_per_sample_s(prof, stages)
        assert exact * (1 - 2e-6) <= got <= exact, (stages, got, exact)


def test_busiest_stage_of_identical_layers_is_the_rounded_up_share():
    """98 identical layers on 16 stages: some stage holds ceil(98 / 16) = 7
    layers (the average is 6.125); on 98 or more stages, one layer."""
    prof = tiny_profile([1.0] * 98, [2.0] * 98)
    assert busiest_stage_per_sample_s(prof, 16) == pytest.approx(7 * 3.0, rel=2e-6)
    assert busiest_stage_per_sample_s(prof, 16) <= 7 * 3.0
    assert busiest_stage_per_sample_s(prof, 120) == pytest.approx(3.0, rel=1e-8)


@pytest.mark.parametrize("seed", range(5))
def test_packed_bound_is_at_most_every_assignment(seed):
    """Every assignment of 7 layers to 3 devices (3^7 of them, contiguous or
    not): the packing bound is at most the least busiest device."""
    rng = np.random.default_rng(seed)
    per_sample = rng.uniform(0.1, 1.0, 7)
    prof = tiny_profile(per_sample / 3, 2 * per_sample / 3)
    least = min(np.bincount(a, weights=per_sample, minlength=3).max()
                for a in itertools.product(range(3), repeat=7))
    assert packed_busiest_per_sample_s(prof, 3) <= least


def test_packed_bound_by_hand():
    """Layers 5, 4, 3, 3, 1 on 2 devices: some device holds two of the
    three largest, at least 4 + 3 = 7; three of the five, at least 3 + 3 + 1
    = 7; the largest alone 5: the bound is 7 (the best assignment gets 8)."""
    times = [5.0, 4.0, 3.0, 3.0, 1.0]
    prof = tiny_profile([t / 3 for t in times], [2 * t / 3 for t in times])
    assert packed_busiest_per_sample_s(prof, 2) == pytest.approx(7.0, rel=1e-8)
    assert packed_busiest_per_sample_s(prof, 2) <= 7.0


def test_lazy_order_yields_groups_by_their_strengthened_bound():
    """The groups come out sorted by the strengthened bound, each group once,
    and a group the caller skips is never strengthened."""
    rng = np.random.default_rng(0)
    first = rng.uniform(0, 10, 40)
    strong = first + rng.uniform(0, 5, 40)
    groups = sorted((float(first[k]), k) for k in range(40))
    asked = []

    def strengthen(g):
        asked.append(g[1])
        return float(strong[g[1]])

    out = list(in_bound_order(groups, strengthen, skip=lambda b: b >= 9.0))
    assert sorted(g[1] for _, g in out) == list(range(40))
    kept = [b for b, g in out if b < 9.0]
    assert kept == sorted(kept)
    assert all(first[k] < 9.0 for k in asked) and len(asked) == len(set(asked))
    assert {g[1] for b, g in out if b < 9.0} == {k for k in range(40) if strong[k] < 9.0}


@pytest.mark.parametrize("held", [1.0, 0.5, 0.3, 1 / 3, 1.2])
def test_zb_h1_in_flight_counts_are_the_action_lists(held):
    """The search reads ZB-H1's counts at m = pp for every m >= pp: the
    same floats, bit for bit, as walking the action lists at that m."""
    cache: dict = {}
    for pp in range(1, 9):
        for m in range(pp, 2 * pp + 3):
            got = schedule_in_flight("zb-h1", pp, m, 1, cache, held)
            want = np.array(schedule_lib.simultaneous_in_flight(schedule_lib.build("zb-h1", pp, m), held))
            assert np.array_equal(got, want), (pp, m)


def test_format_table_is_pandas_layout():
    """Integer and string columns, a missing cell, a wide cell: the same
    text as pandas' ``DataFrame(rows).to_string(index=False)``."""
    pd = pytest.importorskip("pandas")
    rows = [{"rank": 1, "pp x dp": "2 x 8", "layers": "18,22", "MFU": "51.2%"},
            {"rank": 10, "pp x dp": "16 x 128", "layers": "1,2,3,4,5,6,7,8,9"},
            {"rank": 123456, "pp x dp": "1 x 1", "layers": "", "MFU": "x"}]
    names = list(dict.fromkeys(k for r in rows for k in r))
    text = format_table({k: [r.get(k) for r in rows] for k in names})
    assert text == pd.DataFrame(rows).to_string(index=False)
    assert format_table({"rank": [1], "a": ["x"]}) == " rank a\n    1 x"  # by hand: a sign's room before 'rank'


def _modules_after(code: str) -> set[str]:
    probe = (f"import sys\n{code}\n"
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    return set(done.stderr.strip().splitlines()[-1].split())


def test_plan_on_a_profile_csv_imports_no_pandas(tmp_path):
    """The default ``plan`` (a profile CSV) loads no pandas; ``--all-points``
    (the CSV table) does."""
    run = ("from pipesearch.cli import main\ntry:\n    main({args!r})\n"
           "except SystemExit as e:\n    assert e.code == 0, e.code")
    args = ["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie", "--pp", "2", "-q"]
    assert "pandas" not in _modules_after(run.format(args=args))
    table = str(tmp_path / "points.csv")
    assert "pandas" in _modules_after(run.format(args=args + ["--all-points", table]))
    assert open(table).readline().startswith("tp,recompute,pp,dp")


@pytest.mark.parametrize("memory_gib", [6, 8, 16])
def test_first_cutoff_with_gpipe_only_first_groups_keeps_the_exhaustive_ranking(memory_gib):
    """Batch 4 on 8 devices: the groups of the lowest bounds (dp 4 x pp 2,
    dp 2 x pp 4, dp 1 x pp 8) have fewer micro-batches than stages, so they
    offer GPipe alone, and the first cutoff also seeds the 1F1B-style
    schedules from later groups (search._Search.seed_cutoff). Whatever it seeds, the
    ranked plans are those of the exhaustive search (every point evaluated,
    no cutoff)."""
    from pipesearch.search import search
    from pipesearch.search_space import expand_group

    layers = tuple(Layer(f"l{k}", 1e-3 * (1 + k % 3), 2e-3 * (1 + k % 2), 400_000_000, 1_000_000, 2_000_000)
                   for k in range(12))
    cluster = tiny_cluster(2, 4, memory_bytes=memory_gib * 2**30, intra=Link(50e9, 5e-6), inter=Link(5e9, 20e-6))
    variants, job = [ModelVariant(ModelProfile("seed", layers, 1))], Job(4)
    offered = {row[2] for row in expand_group(variants[0], 4, 2, job, SearchOptions(), cluster) if row[5] is None}
    assert offered == {"gpipe"}
    fast = search(variants, cluster, job, SearchOptions(top=3)).plans
    every = search(variants, cluster, job, SearchOptions(top=3, exhaustive=True)).plans
    key = [(p.pp, p.dp, p.schedule, p.vp, p.micro_batch_size, p.predicted.iteration_time_s) for p in fast]
    assert key == [(p.pp, p.dp, p.schedule, p.vp, p.micro_batch_size, p.predicted.iteration_time_s) for p in every]
    assert {p.schedule for p in every} - {"gpipe"}  # the best plans are not all GPipe's


def test_first_cutoff_seeds_each_family_at_its_fewest_micro_batches(monkeypatch):
    """The default plan (vgg16, 4x4-v100-10gbe, batch 1024): its best
    plans for 1F1B and ZB-H1 run 2 micro-batches of 64 (ranks 2 and 3 of
    the table), where the lowest bound of those families lies at 128 of 1,
    whose starting splits take 1.26-1.28 s. Seeding each family's lowest-
    bound point alone gave a first cutoff of 1.15 s; with its point of
    fewest micro-batches too, the first split search already runs against
    a cutoff below 1.0 s (and the ranked plans are those the table shows:
    the seeds only raise the pruning)."""
    from pipesearch import option_search

    cutoffs = []
    real = split_search.exact_split

    def spy(costs, *args, **kwargs):
        cutoffs.append(kwargs.get("cutoff_s", np.inf))
        return real(costs, *args, **kwargs)

    monkeypatch.setattr(split_search, "exact_split", spy)
    monkeypatch.setattr(option_search, "exact_split", spy)
    result = CliRunner().invoke(main, ["plan", "-q", "--json"])
    assert result.exit_code == 0, result.output
    first = next(c for c in cutoffs if np.isfinite(c))
    assert first < 1.0
    plans = json.loads(result.stdout)["plans"]
    assert first >= plans[-1]["predicted"]["iteration_time_s"]  # a cutoff from achievable plans


def test_busiest_stage_bisection_agrees_with_the_partition_dp():
    """Above BUSIEST_DP_LAYERS layers the bound bisects per stage count: at
    most the partition DP's min-max value (itself checked against every
    split above) and within the bisection's tolerance of it."""
    from pipesearch.search_bounds import BUSIEST_DP_LAYERS, _min_max_partitions
    rng = np.random.default_rng(3)
    L = BUSIEST_DP_LAYERS + 12
    per_sample = rng.uniform(0.1, 1.0, L) * np.where(rng.random(L) < 0.1, 8.0, 1.0)
    prof = tiny_profile(per_sample / 3, 2 * per_sample / 3)
    exact = _min_max_partitions(np.concatenate([[0.0], np.cumsum(per_sample)]))
    for stages in (1, 2, 7, 16, 63, L - 1, L, L + 5):
        got = busiest_stage_per_sample_s(prof, stages)
        want = exact[min(stages, L) - 1]
        assert want * (1 - 2e-6) <= got <= want, (stages, got, want)
