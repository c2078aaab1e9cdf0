"""Per-stage data-parallel replication (PipeDream / DAPPLE style).

The brute force below states the time model of a replicated point from the
profile by the rules of :mod:`pipesearch.replication` (DAPPLE's synchronous
semantics), without calling the cost builder: stage ``k`` on ``r_k``
consecutive devices of the canonical order (fastest type first), compute of
``ceil(b / r_k)`` samples on its slowest device, saved activations of that
many samples per in-flight micro-batch, the boundary over ``min(r_k,
r_{k+1})`` device pairs each carrying ``ceil(b / n)`` samples on the slowest
pair link, and the all-reduce of the stage's gradients over its own
devices; then :func:`pipesearch.timemodel.iteration_time_s` (and the
simulator for the optimum) on those terms.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from helpers import tiny_profile
from pipesearch.errors import InputError
from pipesearch.export import FORMATS, RUNTIME_NAMES, export_plan
from pipesearch.pins import parse_split
from pipesearch.placement import allreduce_model
from pipesearch.plan import document_problems, load_plan_file
from pipesearch.search import search
from pipesearch.ranking import TIE_REL
from pipesearch.search_options import SearchOptions
from pipesearch.point_plan import simulate_plan
from pipesearch.search_options import ModelVariant
from pipesearch.timemodel import StageTimes, iteration_time_s, simulate_times
from pipesearch.types import Cluster, DeviceGroup, DeviceSpec, Job, Link

SCHEDULES = ("gpipe", "1f1b")


def _device(name: str, fp32_flops: float, memory_bytes: float) -> DeviceSpec:
    return DeviceSpec(name=name, memory_bytes=memory_bytes, peak_fp16_flops=8 * fp32_flops,
                      peak_fp32_flops=fp32_flops, hbm_bandwidth_bytes_per_s=1e12, achieved_fraction=0.5)


def _random_instance(rng):
    """A profile of 3..8 layers (fp32, profiled at batch 1) and a cluster of
    at most 6 devices on 1-2 nodes, homogeneous or with a slow type listed
    first (so the canonical order, fastest first, is not the id order)."""
    L = int(rng.integers(3, 9))
    fwd = rng.uniform(0.2, 2.0, L)
    params = rng.choice([0.0, 1.0, 5.0, 40.0], L) * 1e6
    outputs = rng.uniform(0.1, 4.0, L) * 1e6
    saved = rng.uniform(0.5, 3.0, L) * 1e6
    profile = tiny_profile(fwd, 2 * fwd, params=params, outputs=outputs, saved=saved, batch_size=1)
    memory = float(rng.choice([2.5e9, 0.4e9, 0.25e9]))
    fast = _device("fast", 10e12, memory)
    slow = _device("slow", 5e12, memory)
    intra, inter = Link(float(rng.choice([50e9, 5e9])), 1e-5), Link(float(rng.choice([1e9, 0.2e9])), 5e-5)
    kind = int(rng.integers(0, 3))
    if kind == 0:
        groups = (DeviceGroup(fast, 1, int(rng.integers(3, 6))),)
    elif kind == 1:
        groups = (DeviceGroup(fast, 2, 3),)
    else:
        groups = (DeviceGroup(slow, 1, int(rng.integers(2, 4))), DeviceGroup(fast, 1, 3))
    cluster = Cluster("rand", groups, intra_node=intra, inter_node=inter)
    return profile, cluster, fast


def _canonical_order(cluster: Cluster) -> list[int]:
    """Fastest type first, then by id (the test's clusters have one group per type)."""
    ids = list(range(cluster.num_devices))
    return sorted(ids, key=lambda d: (-cluster.device_spec(d).peak_fp32_flops, d))


def _compositions(num_devices: int, pp: int):
    for n in range(pp, num_devices + 1):
        for cuts in itertools.combinations(range(1, n), pp - 1):
            e = (0,) + cuts + (n,)
            yield tuple(e[k + 1] - e[k] for k in range(pp))


def _splits(L: int, pp: int):
    for cuts in itertools.combinations(range(1, L), pp - 1):
        yield (0,) + cuts + (L,)


def _slowest_link(cluster, pairs) -> Link:
    links = [cluster.link(int(a), int(b)) for a, b in pairs]
    return max(links, key=lambda link: link.transfer_s(1e6))


def _replicated_terms(profile, cluster, profiled, reps, b, m, schedule, job):
    """Per-stage factors of one replicated point, by the stated rules."""
    order = _canonical_order(cluster)
    ends = np.cumsum(reps)
    devs = [order[e - r:e] for r, e in zip(reps, ends)]
    per_sample = [math.ceil(b / r) for r in reps]
    scale = [max(profiled.peak_fp32_flops / cluster.device_spec(d).peak_fp32_flops for d in ds) for ds in devs]
    links = []
    for k in range(len(reps) - 1):
        a, c = devs[k], devs[k + 1]
        n = min(len(a), len(c))
        big, small = (a, c) if len(a) >= len(c) else (c, a)
        links.append((_slowest_link(cluster, [(big[i], small[i % n]) for i in range(len(big))]),
                      math.ceil(b / n)))
    ar = [allreduce_model(cluster, np.array(ds)) if len(ds) > 1 else (0.0, 0.0) for ds in devs]
    pp = len(reps)
    in_flight = [m] * pp if schedule == "gpipe" else [min(m, pp - k) for k in range(pp)]
    capacity = [min(cluster.device_spec(d).memory_bytes for d in ds) for ds in devs]
    return per_sample, scale, links, ar, in_flight, capacity


def _replica_bandwidths(cluster, reps) -> list[float]:
    """Each stage's slowest memory bandwidth over its replicas (laid out as
    :func:`_replicated_terms` lays them)."""
    order = _canonical_order(cluster)
    return [min(cluster.device_spec(d).hbm_bandwidth_bytes_per_s for d in order[e - r:e])
            for r, e in zip(reps, np.cumsum(reps))]


def _brute_force_replicated(profile, cluster, profiled, job):
    """min over (pp in 2..4, replica vector, micro-batch size, schedule,
    split) of the simulated time of every split that fits, by the stated rules."""
    lay = profile.layers
    fwd = np.array([x.fwd_s for x in lay])
    bwd = np.array([x.bwd_s for x in lay])
    params = np.array([x.param_bytes for x in lay])
    outputs = np.array([x.output_bytes for x in lay])
    saved = np.array([x.saved_bytes for x in lay])
    state_per_param_byte = job.state_bytes_per_param / profile.bytes_per_param
    L, D, G = len(lay), cluster.num_devices, job.global_batch_size
    best = (math.inf, None)
    for pp in range(2, min(4, L, D) + 1):
        bounds = np.array(list(_splits(L, pp)))
        for reps in _compositions(D, pp):
            for b in [d for d in range(1, G + 1) if G % d == 0]:
                m = G // b
                for schedule in SCHEDULES:
                    if schedule == "1f1b" and m < pp:
                        continue
                    per_sample, scale, links, ar, in_flight, capacity = _replicated_terms(
                        profile, cluster, profiled, reps, b, m, schedule, job)
                    hbm = _replica_bandwidths(cluster, reps)
                    f = np.zeros((len(bounds), pp))
                    bw_ = np.zeros((len(bounds), pp))
                    ar_s = np.zeros((len(bounds), pp))
                    p2p = np.zeros((len(bounds), pp - 1))
                    fits = np.ones(len(bounds), bool)
                    for n, bd in enumerate(bounds):
                        for k in range(pp):
                            i, j = bd[k], bd[k + 1]
                            c = scale[k] * per_sample[k]
                            f[n, k], bw_[n, k] = c * fwd[i:j].sum(), c * bwd[i:j].sum()
                            grad = params[i:j].sum()  # gradients in the profile's dtype
                            ar_s[n, k] = grad * ar[k][0] + ar[k][1] if grad > 0 else 0.0
                            # then the optimizer step: 28 B per parameter (mixed-precision Adam, the default
                            # 16 B state unsharded) at 0.8 x the slowest replica's memory bandwidth
                            ar_s[n, k] += grad / profile.bytes_per_param * 28 / (0.8 * hbm[k])
                            need = (params[i:j].sum() * state_per_param_byte
                                    + saved[i:j].sum() * per_sample[k] * in_flight[k])
                            fits[n] &= need <= capacity[k]
                            if k < pp - 1:
                                link, share = links[k]
                                p2p[n, k] = link.latency_s + outputs[j - 1] * share / link.bandwidth_bytes_per_s
                    if not fits.any():
                        continue
                    t = iteration_time_s(schedule, pp, m, 1, StageTimes(
                        fwd_s=f, bwd_s=bw_, bwd_input_s=bw_ / 2, p2p_s=p2p, allreduce_s=ar_s))
                    t = np.where(fits, t, np.inf)
                    n = int(np.argmin(t))
                    if t[n] < best[0]:
                        one = StageTimes(fwd_s=f[n], bwd_s=bw_[n], bwd_input_s=bw_[n] / 2, p2p_s=p2p[n],
                                         allreduce_s=ar_s[n])
                        best = (float(t[n]), (reps, b, schedule, tuple(bounds[n])), schedule, pp, m, one)
    if best[1] is not None:  # the levelled evaluator is the simulator's longest path
        _, _, schedule, pp, m, one = best
        assert simulate_times(schedule, pp, m, 1, one)[0] == pytest.approx(best[0], rel=1e-9)
    return best[0], best[1]


def test_rank_one_equals_brute_force_over_splits_placements_and_replicas():
    """Random instances (<= 8 layers, <= 6 devices, 1-2 nodes, one or two
    device types): the search's rank 1 with per-stage replication equals the
    minimum of the brute force over every replicated point (pp 2..4, every
    replica vector, micro-batch size, schedule and split) and the uniform
    data-parallel search's rank 1 (whose exactness tests/test_search.py and
    tests/test_search_mixed.py establish); where a replicated point is
    strictly best, rank 1 is that point. Fails on a wrong compute share
    (b / r instead of ceil), a wrong boundary rule, a wrong all-reduce
    group, a wrong device order, a missed vector or an unsound bound."""
    rng = np.random.default_rng(12)
    replicated_wins = 0
    for _ in range(14):
        profile, cluster, fast = _random_instance(rng)
        job = Job(global_batch_size=int(rng.choice([4, 6, 8])), memory_reserve_bytes=0.0)
        variants = [ModelVariant(profile)]
        # one placement per replica vector, the consecutive one (the enumeration of every placement is
        # tests/test_mapping_property.py's)
        uniform = min(search(variants, cluster, job, SearchOptions(schedules=SCHEDULES, top=3,
                                                                   enumerate_layouts_up_to=1),
                             profiled_device=fast).plans, key=lambda p: p.predicted.iteration_time_s)
        res = search(variants, cluster, job, SearchOptions(schedules=SCHEDULES, top=3, replicate_stages=True,
                                                           enumerate_layouts_up_to=1), profiled_device=fast)
        brute_t, brute_point = _brute_force_replicated(profile, cluster, fast, job)
        expect = min(brute_t, uniform.predicted.iteration_time_s)
        # rank 1 is the tie rule's pick among the plans within TIE_REL of the fastest (ranking.rank_plans)
        got = min(res.plans, key=lambda p: p.predicted.iteration_time_s)
        assert got.predicted.iteration_time_s == pytest.approx(expect, rel=1e-9), (brute_point, got.stage_replicas)
        assert res.plans[0].predicted.iteration_time_s <= expect * (1 + TIE_REL)
        if brute_t < uniform.predicted.iteration_time_s * (1 - 1e-6):
            replicated_wins += 1
            assert got.stage_replicas is not None and got.dp == 1
            assert [len(st.devices) for st in got.stages] == list(got.stage_replicas)
            assert sum(got.stage_replicas) <= cluster.num_devices
    assert replicated_wins >= 3  # the instances exercise replication, not only the uniform family


def test_hand_derived_three_to_one():
    """Two layers, the first 3x the work of the second (per sample: forward
    1 s and 1/3 s, backward twice that), free links, no parameters, 4
    devices, global batch 6, micro-batch 3, GPipe, pp 2. GPipe's time is
    ``sum_k (F_k + B_k) + (m - 1)(max F + max B)`` (Huang et al. 2019).
    Replicas (3, 1), m = 2: stage 0 computes ceil(3/3) = 1 sample (F 1, B 2),
    stage 1 all 3 (F 1, B 2): T = 6 + 1 x 3 = 9 s. The others: (2, 2)
    F = 2, 2/3: 8 + 6 = 14; (2, 1): F = 2, 1: 9 + 6 = 15; (1, 3): F = 3,
    1/3: 10 + 9 = 19; uniform dp 2 (m = 1): F = 3, 1: 12; dp 1 (m = 2): 21."""
    profile = tiny_profile([1.0, 1.0 / 3.0], [2.0, 2.0 / 3.0], batch_size=1)
    dev = _device("dev", 10e12, 16e9)
    cluster = Cluster("four", (DeviceGroup(dev, 1, 4),), intra_node=Link(math.inf, 0.0),
                      inter_node=Link(math.inf, 0.0))
    job = Job(global_batch_size=6, memory_reserve_bytes=0.0)
    res = search([ModelVariant(profile)], cluster, job, SearchOptions(
        pp=2, micro_batch_size=3, schedules=("gpipe",), top=10, replicate_stages=True), profiled_device=dev)
    best = res.plans[0]
    assert best.stage_replicas == (3, 1)
    assert best.predicted.iteration_time_s == pytest.approx(9.0, rel=1e-12)
    assert [st.devices for st in best.stages] == [(0, 1, 2), (3,)]
    times = {p.stage_replicas or ("dp", p.dp): p.predicted.iteration_time_s for p in res.plans}
    assert times[(2, 2)] == pytest.approx(14.0) and times[(2, 1)] == pytest.approx(15.0)
    assert times[(1, 3)] == pytest.approx(19.0) and times[("dp", 2)] == pytest.approx(12.0)
    assert times[("dp", 1)] == pytest.approx(21.0)
    pinned = search([ModelVariant(profile)], cluster, job, SearchOptions(
        pp=2, micro_batch_size=3, schedules=("gpipe",), split=(1, 1), split_replicas=(2, 2)),
        profiled_device=dev).plans
    assert len(pinned) == 1 and pinned[0].stage_replicas == (2, 2)
    assert pinned[0].predicted.iteration_time_s == pytest.approx(14.0)


def test_replicas_time_their_samples_with_the_fixed_part_whole():
    """Two layers profiled at batch 8: forward 10 ms of which 8 fixed,
    backward 20 ms of which 16 fixed (docs/formats.md: ``f + (t - f) b /
    B`` at ``b`` samples). Micro-batch 8, GPipe, m = 1, free links, no
    weights: the time is the sum of the stages' F + B. Replicas (1, 3):
    stage 0 computes 8 samples, 10 + 20 ms; stage 1 ceil(8/3) = 3 samples,
    F = 8 + 2 x 3/8 = 8.75, B = 16 + 4 x 3/8 = 17.5 ms: 56.25 ms (scaling
    the 8-sample time by 3/8 would give 41.25). Replicas (2, 2) at
    micro-batch 8 and uniform dp 2 at micro-batch 4 both compute 4 samples
    a stage, 9 + 18 ms each: 54 ms both."""
    from pipesearch.types import Layer, ModelProfile

    layers = tuple(Layer(f"l{k}", 10e-3, 20e-3, 0.0, 0.0, 0.0, fwd_fixed_s=8e-3, bwd_fixed_s=16e-3)
                   for k in range(2))
    profile = ModelProfile("fixed", layers, 8, bytes_per_param=4.0)
    dev = _device("dev", 10e12, 16e9)
    cluster = Cluster("four", (DeviceGroup(dev, 1, 4),), intra_node=Link(math.inf, 0.0),
                      inter_node=Link(math.inf, 0.0))
    job = Job(global_batch_size=8, memory_reserve_bytes=0.0)

    def pinned(replicas, mbs, dp=None):
        opts = SearchOptions(pp=2, dp=dp, micro_batch_size=mbs, schedules=("gpipe",), split=(1, 1),
                             split_replicas=replicas)
        return search([ModelVariant(profile)], cluster, job, opts, profiled_device=dev).plans[0]

    assert pinned((1, 3), 8).predicted.iteration_time_s == pytest.approx(56.25e-3, rel=1e-12)
    assert pinned((2, 2), 8).predicted.iteration_time_s == pytest.approx(54e-3, rel=1e-12)
    assert pinned(None, 4, dp=2).predicted.iteration_time_s == pytest.approx(54e-3, rel=1e-12)


def _run(*args):
    proc = subprocess.run([sys.executable, "-m", "pipesearch", *args], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def replicated_plan_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "plan.json"
    code, stdout, err = _run("plan", "--model", "vgg16", "--cluster", "4x4-v100-10gbe", "-b", "1024",
                             "--split", "18x12,22x4", "--micro-batch-size", "32", "--schedule", "gpipe",
                             "-o", str(out))
    assert code == 0, err
    return out, stdout


def test_split_with_replicas_plan_json_and_table(replicated_plan_file):
    path, stdout = replicated_plan_file
    assert "replicas" in stdout.splitlines()[1] and "12,4" in stdout
    doc = json.loads(path.read_text())
    plan = doc["plans"][0]
    assert [st["replicas"] for st in plan["stages"]] == [12, 4]
    assert plan["parallelism"]["dp"] == 1
    assert [len(st["devices"]) for st in plan["stages"]] == [12, 4]
    assert sorted(d for st in plan["stages"] for d in st["devices"]) == list(range(16))
    loaded = load_plan_file(path).plans[0]
    assert loaded.stage_replicas == (12, 4)
    # the plan's per-replica stage times replay to its own time in the simulator
    assert simulate_plan(loaded)[0] == pytest.approx(loaded.predicted.iteration_time_s, rel=1e-9)
    code, out, err = _run("simulate", str(path))
    assert code == 0 and "replicas 12,4" in out, err
    assert "data-parallel communication and optimizer step left after the last" in out
    bad = json.loads(path.read_text())
    bad["plans"][0]["stages"][0]["replicas"] = 11
    assert any("replicas is 11" in str(p) for p in document_problems(bad))
    bad = json.loads(path.read_text())
    del bad["plans"][0]["stages"][1]["replicas"]
    assert any("has no replicas" in str(p) for p in document_problems(bad))
    bad = json.loads(path.read_text())
    bad["plans"][0]["stages"][0]["devices"] += [16, 17]
    bad["plans"][0]["stages"][0]["replicas"] = 14
    assert any("= 18 devices" in str(p) for p in document_problems(bad))


def test_exporters_refuse_per_stage_replicas(replicated_plan_file):
    path, _ = replicated_plan_file
    plan = load_plan_file(path).plans[0]
    for fmt in FORMATS:
        with pytest.raises(InputError) as exc:
            export_plan(plan, fmt)
        assert RUNTIME_NAMES[fmt] in str(exc.value) and "12,4" in str(exc.value)
    doc = json.loads(path.read_text())
    assert all("refused" in e for e in doc["plans"][0]["exports"].values())
    code, _, err = _run("export", str(path), "--format", "megatron")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Megatron-LM runs one data-parallel" in err


def test_stages_json_says_each_stages_replicas(replicated_plan_file):
    """The runtime-neutral description keeps per-stage replication: each
    stage's replicas (12 and 4, its 12 and 4 devices), dp 1 (the stage
    device lists were left unexplained), valid against its schema."""
    path, _ = replicated_plan_file
    doc = export_plan(load_plan_file(path).plans[0], "stages-json")
    assert [st["replicas"] for st in doc["stages"]] == [12, 4]
    assert [len(st["devices"]) for st in doc["stages"]] == [12, 4] and doc["pipeline"]["dp"] == 1
    from pipesearch.export.stages_json import stages_problems
    assert stages_problems({k: v for k, v in doc.items() if k != "files"}) == []


@pytest.mark.parametrize("value", ["3x", "x2", "3x2x1", "3x0", "0x2", "20x2,20", "a,b", "20x-1,20x1"])
def test_split_parse_errors(value):
    code, _, err = _run("plan", "--model", "vgg16", "--split", value)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--split" in err, err


def test_split_parser_and_refusals():
    assert parse_split("5,3,4") == ((5, 3, 4), None)
    assert parse_split("17x15,6x1") == ((17, 6), (15, 1))
    # P*K: K stages of P, as the plan table writes a long split (output_table.stage_counts_label)
    assert parse_split("2,1*3,2") == ((2, 1, 1, 1, 2), None)
    assert parse_split("17x15*2,6x1") == ((17, 17, 6), (15, 15, 1))
    for bad in ("1*0", "1*x", "1**2", "*3", "1*1000000000"):
        with pytest.raises(InputError, match="--split"):
            parse_split(bad)
    code, _, err = _run("plan", "--model", "vgg16", "--split", "20x10,20x7")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "needs 17 devices" in err
    code, _, err = _run("plan", "--model", "vgg16", "--replicate-stages", "--sharding", "zero1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "sharding zero1" in err
    code, _, err = _run("plan", "--model", "gpt3-1.3b", "--replicate-stages", "--runtime", "megatron")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "one data-parallel degree" in err
    code, _, err = _run("plan", "--model", "vgg16", "--split", "20x8,20x8", "--dp", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "with --dp 2" in err and "drop --dp" in err
    code, _, err = _run("plan", "--model", "gpt3-2.7b", "--cluster", "2x8-a100-80gb", "-b", "64", "--tp", "2",
                        "--split", "10x5,24x4")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "needs 18 devices" in err and "x tp 2" in err
    # pins a replicated split cannot honour are refused, not ignored
    code, _, err = _run("plan", "--model", "vgg16", "--split", "20x8,20x8", "--placement", "data")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--split 20x8,20x8 with --placement data" in err
    code, _, err = _run("plan", "--model", "vgg16", "--split", "20x8,20x8", "--vp", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--split 20x8,20x8 with --vp 2" in err


def test_replicated_plans_honour_micro_batch_pins_that_leave_dp_1():
    """--micro-batch-size x --num-micro-batches = the global batch pins dp 1,
    what a replicated plan has (its replicas split each micro-batch): the
    pins are honoured, not refused as a data-parallel pin."""
    code, out, err = _run("plan", "--model", "vgg16", "-b", "256", "--split", "20x8,20x8", "--micro-batch-size", "4",
                          "--num-micro-batches", "64", "--json")
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert plans and all(p["schedule"]["micro_batch_size"] == 4 and p["schedule"]["num_micro_batches"] == 64
                         for p in plans)
    assert all([st.get("replicas") for st in p["stages"]] == [8, 8] for p in plans)


def test_hand_derived_tp2_replicas_on_their_own_type():
    """Tensor parallelism 2 on a mixed cluster listed slow type first: 4
    slow devices (ids 0-3, half the fast rate, so each layer takes twice as
    long) and 2 fast ones (ids 4-5) in two nodes, so the tp-2 groups are
    heads 0, 2 (slow) and 4 (fast). Two layers of forward 1 s and 3 s per
    sample on the fast type (backward twice that), free links, no
    parameters; global batch 2, micro-batch 2 (m = 1: GPipe's time is the
    sum of the stages' forward + backward), the split pinned to 1 layer x 2
    replicas, then 1 layer x 1. Stage 0 on both slow groups computes 1
    sample at factor 2: 2 + 4 = 6 s; stage 1 on the fast group 2 samples of
    3 s: 6 + 12 = 18 s; T = 24 s. The consecutive placement (fastest first:
    heads 4, 0 for stage 0, 2 for stage 1) takes 6 + (12 + 24) = 42 s, and
    stage 0 on a slow and the fast group 6 + 36 = 42 s."""
    profile = tiny_profile([1.0, 3.0], [2.0, 6.0], batch_size=1)
    fast, slow = _device("fast", 10e12, 16e9), _device("slow", 5e12, 16e9)
    free = Link(math.inf, 0.0)
    groups = (DeviceGroup(slow, 1, 4), DeviceGroup(fast, 1, 2))
    for order in (groups, groups[::-1]):
        cluster = Cluster("mixed", order, intra_node=free, inter_node=free)
        plans = search([ModelVariant(profile, tp=2)], cluster, Job(global_batch_size=2, memory_reserve_bytes=0.0),
                       SearchOptions(schedules=("gpipe",), micro_batch_size=2, split=(1, 1), split_replicas=(2, 1)),
                       profiled_device=fast).plans
        best = plans[0]
        assert best.stage_replicas == (2, 1) and best.tp == 2
        assert best.predicted.iteration_time_s == pytest.approx(24.0, rel=1e-12)
        slow_heads = (0, 2) if order == groups else (2, 4)
        assert [st.devices for st in best.stages] == [slow_heads, (4,) if order == groups else (0,)]
        assert [st.device_type for st in best.stages] == ["slow", "fast"]


@pytest.fixture(scope="module")
def tp2_plan_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("reptp") / "plan.json"
    code, stdout, err = _run("plan", "--model", "gpt3-2.7b", "--cluster", "2x8-a100-80gb", "-b", "64", "--tp", "2",
                             "--split", "10x3,24x1", "--schedule", "1f1b", "-o", str(out))
    assert code == 0, err
    return out, stdout


def test_split_with_replicas_and_tp2(tp2_plan_file):
    """--split 10x3,24x1 --tp 2: stage 0 on 3 tensor-parallel pairs, stage
    1 on one; the plan names each pair by its first device, 8 devices in
    all, each in one node; the table and JSON show replicas and tp; the
    plan replays to its own time; exporters refuse it in one line."""
    path, stdout = tp2_plan_file
    header, row = stdout.splitlines()[1], stdout.splitlines()[2]
    assert "replicas" in header and " 2 x 1 x 2 " in row and "3,1" in row
    doc = json.loads(path.read_text())
    plan = doc["plans"][0]
    assert plan["parallelism"]["tp"] == 2 and plan["parallelism"]["dp"] == 1
    assert [st["replicas"] for st in plan["stages"]] == [3, 1]
    used = [d + t for st in plan["stages"] for d in st["devices"] for t in range(2)]
    assert len(used) == 8 == len(set(used)) and all(0 <= d < 16 for d in used)
    assert all(d % 2 == 0 and (d // 8) == ((d + 1) // 8) for st in plan["stages"] for d in st["devices"])
    assert document_problems(doc) == []
    loaded = load_plan_file(path).plans[0]
    assert simulate_plan(loaded)[0] == pytest.approx(loaded.predicted.iteration_time_s, rel=1e-9)
    assert all("refused" in e for e in plan["exports"].values())
    code, _, err = _run("export", str(path), "--format", "torch")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "3,1" in err and "tp 2" in err
    bad = json.loads(path.read_text())
    bad["plans"][0]["stages"][1]["devices"] = [plan["stages"][0]["devices"][0] + 1]
    assert any("already serves" in str(p) for p in document_problems(bad))


@pytest.mark.parametrize("tp,reps", [(1, (1, 1)), (1, (2, 1)), (1, (2, 2, 1)), (2, (1, 2)), (1, (3, 3))])
def test_replicated_layouts_are_every_node_pattern_once(tp, reps):
    """replicated_layout_names against every choice of disjoint sets of
    tp groups (tp consecutive devices of one node from a multiple of tp),
    told apart by the interchangeable classes of nodes each stage takes
    (:func:`pipesearch.placement.slot_classes`: a node, or with tp 2, where
    every node is one slot, the two fast nodes together): one name per
    pattern, every pattern named, no group twice, no device off the
    cluster; on 2 + 4 devices of two types in three nodes (ids 0-1 slow,
    2-5 fast)."""
    from pipesearch.placement import (node_ids, replicated_layout_names, replicated_stage_devices, slot_classes,
                                      slot_heads)
    from pipesearch.replication import parse_replicas_slots, replicated_placements

    slow, fast = _device("slow", 5e12, 16e9), _device("fast", 10e12, 16e9)
    cluster = Cluster("m", (DeviceGroup(slow, 1, 2), DeviceGroup(fast, 2, 2)), intra_node=Link(1e9, 0.0),
                      inter_node=Link(1e8, 0.0))
    groups = [(d // 2, d) for d in range(0, 6, tp)]  # (node, head): nodes of 2 devices
    node = node_ids(cluster)
    heads = slot_heads(cluster, tp, "fp32")
    label = {int(node[heads[k]]): c for c, members in enumerate(slot_classes(cluster, tp, "fp32")) for k in members}
    assert len(set(label.values())) == (2 if tp == 2 else 3)
    ends, want = np.cumsum(reps), set()
    for combo in itertools.permutations(range(len(groups)), sum(reps)):  # every assignment of groups
        want.add(tuple(tuple(sorted(label[groups[c][0]] for c in combo[e - r:e])) for r, e in zip(reps, ends)))
    names = replicated_layout_names(cluster, reps, tp, "fp32")
    got = []
    for name in names:
        devs = replicated_stage_devices(cluster, reps, "fp32", tp, [int(x) for x in name[6:].split(",")])
        used = [int(h) + t for d in devs for h in d for t in range(tp)]
        assert len(used) == len(set(used)) == sum(reps) * tp and max(used) < 6
        assert all(node[int(h)] == node[int(h) + tp - 1] for d in devs for h in d)
        got.append(tuple(tuple(sorted(label[int(x)] for x in node[d])) for d in devs))
    assert len(got) == len(set(got)) and set(got) == want
    chosen = replicated_placements(cluster, reps, tp, 10**6, "fp32")
    assert len(chosen) == len(want) and all(parse_replicas_slots(c) is not None for c in chosen)
    # over the limit: the consecutive slots, and the spread one where it differs (one of the named patterns)
    over = replicated_placements(cluster, reps, tp, len(want) - 1, "fp32")
    assert over[0] == "replicas:" + ",".join(map(str, reps)) and len(over) <= 2
    if len(over) == 2:  # a valid placement: its pattern is one of the named ones
        devs = replicated_stage_devices(cluster, reps, "fp32", tp, list(parse_replicas_slots(over[1])))
        used = [int(h) + t for d in devs for h in d for t in range(tp)]
        assert len(used) == len(set(used)) == sum(reps) * tp and max(used) < 6
        assert tuple(tuple(sorted(label[int(x)] for x in node[d])) for d in devs) in want


@pytest.mark.parametrize("nics, expected", [(1, 1.25e9), (4, 5e9), (None, 5e9)])
def test_boundary_bandwidth_through_shared_ports_by_hand(nics, expected):
    """Stage 0 on 8 replicas (servers 0 and 1, 4 devices each), stage 1 on
    4 (server 2), 1.25 GB/s between servers, micro-batch 8: the 8 replicas
    each send their one sample to replica ``a mod 4``, 8 flows into server
    2. With one NIC there, all 8 samples pass 1.25 GB/s: the micro-batch
    crosses at 1.25 GB/s. With 4 NICs (or one per device) each of server
    2's devices takes its 2 samples over its own 1.25 GB/s: 4 x 1.25 = 5
    GB/s. (Counting 4 pairs of 2 samples, each at 1/8 of one NIC, gives
    half the first figure.)"""
    from pipesearch.replication import boundary_bandwidth_bytes_per_s, replicated_stage_terms

    dev = _device("dev", 10e12, 16e9)
    cluster = Cluster("three", (DeviceGroup(dev, 3, 4),), intra_node=Link(math.inf, 0.0),
                      inter_node=Link(1.25e9, 0.0, nics_per_node=nics))
    terms = replicated_stage_terms(cluster, (8, 4), "fp16", dev)
    assert [list(d) for d in terms["devices"]] == [list(range(8)), [8, 9, 10, 11]]
    assert boundary_bandwidth_bytes_per_s(terms, 8)[0] == pytest.approx(expected, rel=1e-12)
    # 4 replicas sending to 8: the same flows the other way (ports are full duplex)
    back = replicated_stage_terms(cluster, (4, 8), "fp16", dev, slots=None)
    assert boundary_bandwidth_bytes_per_s(back, 8)[0] == pytest.approx(expected, rel=1e-12)


def test_spread_layout_puts_every_stage_on_every_server():
    """8,8 on four servers of four V100s: the spread placement gives each
    server two replicas of each stage (the consecutive one puts stage 0 on
    servers 0-1 and stage 1 on servers 2-3)."""
    from pipesearch.hardware import load_cluster
    from pipesearch.placement import SLOTS_PREFIX, spread_layout_name

    cluster = load_cluster("4x4-v100-10gbe")
    name = spread_layout_name(cluster, (8, 8))
    slots = [int(x) for x in name[len(SLOTS_PREFIX):].split(",")]
    assert sorted(slots) == list(range(16))
    for stage in (slots[:8], slots[8:]):
        assert sorted(cluster.node_of(d) for d in stage) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert spread_layout_name(cluster, (10, 8)) is None  # 18 replicas on 16 devices


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_equal_replicas_spread_score_as_the_uniform_plan(schedule):
    """20x8,20x8 is the uniform pp 2 x dp 8 plan with split 20,20 run as
    replicated stages: with every stage spread over the servers (two
    replicas of each per server, as the uniform data-major layout) its time
    is the uniform plan's with each pipeline's two stages side by side
    (pipeline-major); on consecutive servers every boundary crossed the one
    10 GbE NIC and it scored 1.5x slower (as the data-major uniform plan
    does)."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    def time_of(*args):
        res = CliRunner().invoke(main, ["plan", "-q", "--json", "--model", "vgg16", "--cluster", "4x4-v100-10gbe",
                                        "-b", "1024", "--schedule", schedule, "--top", "1", *args])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["plans"][0]["predicted"]["iteration_time_s"]

    uniform = time_of("--pp", "2", "--dp", "8", "--split", "20,20", "--micro-batch-size", "32",
                      "--placement", "pipeline")
    replicated = time_of("--split", "20x8,20x8", "--micro-batch-size", "256")
    assert replicated == pytest.approx(uniform, rel=1e-9)


def test_a_point_whose_stages_cannot_cover_the_layers_is_searched_not_a_crash():
    """resnet50 on 4x4-v100-10gbe, replicated pp 2, 1F1B, 2 micro-batches of
    512: on some replica vectors the closed form's memory rule (every
    sample's activations on each device) lets no stage hold 20 of the 40
    layers, so its DP's first stage had no end layer and raised a numpy
    broadcast error (exit 1); the closed form now finds no split there and
    the exact search, whose memory counts each replica's share of the
    samples, plans the point."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    res = CliRunner().invoke(main, ["plan", "-q", "--json", "--model", "resnet50", "--cluster", "4x4-v100-10gbe",
                                    "-b", "1024", "--replicate-stages", "--pp", "2", "--schedule", "1f1b",
                                    "--micro-batch-size", "512", "--top", "20"])
    assert res.exit_code == 0, res.output
    plans = json.loads(res.stdout)["plans"]
    assert len(plans) == 20 and all(p["schedule"]["num_micro_batches"] == 2 for p in plans)


def test_a_replicated_split_that_does_not_fit_names_its_replicas(tmp_path):
    """--split 6x4 (6 layers on 4 replicas) that does not fit: the refusal's
    closest point read "at pp 1 x dp 1" (a replicated plan's dp is 1); it
    names the replicas the split asked for."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    (tmp_path / "p.csv").write_text("# batch_size: 8\n# bytes_per_param: 2\n"
                                    "name,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes\n"
                                    + "".join(f"l{k},5,10,4000000000,1000000,2000000000\n" for k in range(6)))
    res = CliRunner().invoke(main, ["plan", "-q", "--model", str(tmp_path / "p.csv"), "--cluster", "1x4-v100-pcie",
                                    "-b", "32", "--split", "6x4"])
    assert res.exit_code == 2 and "at pp 1, replicas 4, micro-batch size" in res.output, res.output
