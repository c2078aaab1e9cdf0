"""Placement on mixed clusters: tensor-parallel slots on real, distinct
devices; results independent of the order of ``[[groups]]``; the search's
best plan equal to brute force over every split and every placement, scored
by the time model (pipesearch.timemodel) from stage times built here by
hand."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesearch.hardware import load_cluster
from pipesearch.placement import allreduce_terms, boundary_links, count_layouts, layout_names, slot_heads
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, iteration_time_s
from pipesearch.types import Cluster, DeviceGroup, DeviceSpec, Job, Layer, Link, ModelProfile

DATA = Path(__file__).parent / "data"
GB = 1e9


def _spec(name: str, fp16_tflops: float, mem_gb: float = 1000.0) -> DeviceSpec:
    return DeviceSpec(name, mem_gb * GB, fp16_tflops * 1e12, fp16_tflops * 1e11, 1e12, achieved_fraction=0.5)


# ---------------------------------------------------------------- slots


def test_slots_are_distinct_devices_inside_nodes():
    """tp 2 on nodes of 3, 2 and 4 devices: 1 + 1 + 2 slots; the third
    device of the first node stays idle; no device is in two slots, no slot
    spans nodes; the fast type (node of 4) comes first. Layouts of the 4
    slots up to swaps of interchangeable ones: the fast node's two, and the
    two slow single-slot nodes (linked alike to everything: no inter-group
    link of their own): 4! / (2! 2!) = 6."""
    slow, fast = _spec("slow", 100), _spec("fast", 400)
    cluster = Cluster("c", (DeviceGroup(slow, 1, 3), DeviceGroup(slow, 1, 2), DeviceGroup(fast, 1, 4)),
                      Link(100 * GB, 1e-6), Link(10 * GB, 1e-5))
    heads = slot_heads(cluster, 2)
    assert heads.tolist() == [5, 7, 0, 3]
    devices = (heads[:, None] + np.arange(2)).ravel()
    assert len(set(devices.tolist())) == devices.size and devices.max() < cluster.num_devices
    assert count_layouts(cluster, 4, 2) == len(layout_names(cluster, 4, 1, 2)) == 4 * 3 * 2 / 4


def test_allreduce_and_boundary_links_by_hand():
    """2 nodes of 2 (intra 100 GB/s, 1 us; inter 10 GB/s, 10 us). Stage 0
    on devices 0, 2 (one per node): ring over the inter link, 2(d-1)/d =
    1 -> 1 / 10e9 s per byte and 2 x 10 us fixed. Stage 1 on 1, 3. The
    boundary 0 -> 1 stays inside nodes (0 -> 1, 2 -> 3): intra link."""
    c = Cluster("c", (DeviceGroup(_spec("x", 100), 2, 2),), Link(100 * GB, 1e-6), Link(10 * GB, 1e-5))
    heads = np.array([[0, 2], [1, 3]])
    per_byte, fixed = allreduce_terms(c, heads)
    assert per_byte.tolist() == pytest.approx([1 / 10e9] * 2) and fixed.tolist() == pytest.approx([2e-5] * 2)
    bw, lat = boundary_links(c, heads)
    assert bw[0] == 100 * GB and lat[0] == 1e-6 and bw[1] == np.inf


# ------------------------------------------------------ H100 + A100, tp 2


def _gpt3_search(cluster: Cluster, tp: int = 2):
    from pipesearch.models import load_model_source

    src = load_model_source("gpt3-13b", cluster, tp=tp, recompute="none")
    res = search(list(src.variants), cluster, Job(global_batch_size=1024), SearchOptions(pp=8, top=1),
                 profiled_device=src.profiled_device)
    return res.plans[0]


def _with_device(cluster: Cluster, spec: DeviceSpec) -> Cluster:
    return Cluster(cluster.name + "-" + spec.name, tuple(DeviceGroup(spec, g.nodes, g.devices_per_node)
                                                         for g in cluster.groups),
                   cluster.intra_node, cluster.inter_node, cluster.inter_group)


@pytest.mark.slow
def test_h100_a100_tp2_uses_all_sixteen_gpus_and_lies_between():
    """gpt3-13b, --pp 8 --tp 2 on one H100 node + one A100 node: 8 stages x
    tp 2 need all 16 GPUs, so 4 stages run on H100s and 4 on A100s; every
    device serves one stage once; listing the groups in the other order
    gives the same time; the time is no better than on 16 H100s and no
    worse than on 16 A100s with the same links (a plan on the mixed cluster
    runs at least as fast on faster devices, so these bound it)."""
    mixed = load_cluster(str(Path(__file__).parents[1] / "hardware/clusters/mixed-h100-a100.toml"))
    swapped = load_cluster(str(DATA / "mixed-a100-h100.toml"))
    plan = _gpt3_search(mixed)
    devices = [d + t for s in plan.stages for d in s.devices for t in range(2)]
    assert sorted(devices) == list(range(16))
    for s in plan.stages:
        assert {mixed.device_spec(d + t).name for d in s.devices for t in range(2)} == {s.device_type}
    assert sorted(s.device_type for s in plan.stages) == ["a100-80gb"] * 4 + ["h100-80gb"] * 4
    again = _gpt3_search(swapped)
    assert again.predicted.iteration_time_s == pytest.approx(plan.predicted.iteration_time_s, rel=1e-12)
    assert [s.layers for s in again.stages] == [s.layers for s in plan.stages]
    assert [s.device_type for s in again.stages] == [s.device_type for s in plan.stages]
    h100 = _gpt3_search(_with_device(mixed, mixed.groups[0].device)).predicted.iteration_time_s
    a100 = _gpt3_search(_with_device(mixed, mixed.groups[1].device)).predicted.iteration_time_s
    assert h100 < plan.predicted.iteration_time_s < a100


def test_swapped_groups_tp1_same_answer():
    """The same cluster listed both ways, tp 1, a small profile: same best
    time, same layers and device types per stage."""
    a, b = _spec("a", 300), _spec("b", 100)
    links = (Link(100 * GB, 1e-6), Link(20 * GB, 1e-5), Link(10 * GB, 2e-5))
    prof = _profile(np.full(6, 1e-3), np.full(6, 1e6), np.full(6, 1e6))
    plans = []
    for groups in ((DeviceGroup(a, 1, 2), DeviceGroup(b, 2, 2)), (DeviceGroup(b, 2, 2), DeviceGroup(a, 1, 2))):
        c = Cluster("c", groups, *links)
        plans.append(search([ModelVariant(prof)], c, Job(global_batch_size=8), SearchOptions(top=1),
                            profiled_device=a).plans[0])
    assert plans[0].predicted.iteration_time_s == pytest.approx(plans[1].predicted.iteration_time_s, rel=1e-12)
    assert [s.layers for s in plans[0].stages] == [s.layers for s in plans[1].stages]
    assert [s.device_type for s in plans[0].stages] == [s.device_type for s in plans[1].stages]


# ------------------------------------------------ brute force oracle


def _profile(t, out, params) -> ModelProfile:
    layers = tuple(Layer(f"l{i}", float(x) / 3, 2 * float(x) / 3, float(p), float(o), 0.0)
                   for i, (x, o, p) in enumerate(zip(t, out, params)))
    return ModelProfile("rand", layers, 1, profiled_device="a", bytes_per_param=2.0)


def _ring_or_hier(cluster: Cluster, devs: list[int]) -> tuple[float, float]:
    """Ring on the ring's slowest link, or hierarchical when every node holds
    the same k > 1 replicas over n > 1 nodes (consecutive nodes by id); the
    cheaper for 100 MB."""
    d = len(devs)
    if d == 1:
        return 0.0, 0.0
    ring = max((cluster.link(x, y) for x, y in zip(devs, devs[1:] + devs[:1])), key=lambda L: L.transfer_s(1e6))
    best = (2 * (d - 1) / d / ring.bandwidth_bytes_per_s, 2 * (d - 1) * ring.latency_s)
    nodes = sorted({cluster.node_of(x) for x in devs})
    counts = {n: sum(cluster.node_of(x) == n for x in devs) for n in nodes}
    n, k = len(nodes), d // len(nodes)
    if n > 1 and k > 1 and set(counts.values()) == {k}:
        rep = [next(x for x in devs if cluster.node_of(x) == nd) for nd in nodes]
        inter = max((cluster.link(x, y) for x, y in zip(rep, rep[1:])), key=lambda L: L.transfer_s(1e6))
        hier = (2 * (k - 1) / k / cluster.intra_node.bandwidth_bytes_per_s
                + 2 * (n - 1) / n / (k * inter.bandwidth_bytes_per_s),
                2 * (k - 1) * cluster.intra_node.latency_s + 2 * (n - 1) * inter.latency_s)
        if hier[0] * 1e8 + hier[1] < best[0] * 1e8 + best[1]:
            best = hier
    return best


def _brute_force(prof: ModelProfile, cluster: Cluster, ref: DeviceSpec, tp: int, batch: int) -> float:
    """Best simulated time over every (pp, dp), schedule (GPipe, 1F1B when m
    >= pp), injective map of (stage, replica) onto tensor-parallel groups of
    tp consecutive devices of one node, and split; micro-batch size 1; each
    stage's all-reduce, then its optimizer step, after its last backward."""
    groups, first = [], 0
    for g in cluster.groups:
        for node in range(g.nodes):
            groups += [first + node * g.devices_per_node + i for i in range(0, g.devices_per_node - tp + 1, tp)]
        first += g.num_devices
    L = prof.num_layers
    fwd = np.array([x.fwd_s for x in prof.layers])
    bwd = np.array([x.bwd_s for x in prof.layers])
    out = np.array([x.output_bytes for x in prof.layers])
    par = np.array([x.param_bytes for x in prof.layers])
    rate = lambda s: s.peak_fp16_flops * s.achieved_fraction  # noqa: E731
    best = np.inf
    for pp in range(1, min(L, len(groups)) + 1):
        cuts = np.array([(0, *c, L) for c in itertools.combinations(range(1, L), pp - 1)])
        for dp in range(1, len(groups) // pp + 1):
            if batch % dp:
                continue
            m = batch // dp
            for assign in itertools.permutations(groups, pp * dp):
                heads = np.array(assign).reshape(pp, dp)
                scale = np.array([max(rate(ref) / rate(cluster.device_spec(int(d))) for d in row) for row in heads])
                p2p = [max((cluster.link(int(a), int(b)) for a, b in zip(heads[s], heads[s + 1]) if a != b),
                           key=lambda x: x.transfer_s(1e6)) for s in range(pp - 1)]
                ar = [_ring_or_hier(cluster, [int(x) for x in row]) for row in heads]
                i, j = cuts[:, :-1], cuts[:, 1:]
                pf, pb, pp_ = (np.concatenate([[0], np.cumsum(v)]) for v in (fwd, bwd, par))
                grad = pp_[j] - pp_[i]
                # the optimizer step: 28 B streamed per parameter (mixed-precision Adam, unsharded) at 0.8 x the
                # slowest replica's memory bandwidth, after the reduce
                hbm = np.array([min(cluster.device_spec(int(d)).hbm_bandwidth_bytes_per_s for d in row)
                                for row in heads])
                step = grad / prof.bytes_per_param * 28 / (0.8 * hbm)
                times = StageTimes(
                    fwd_s=scale * (pf[j] - pf[i]), bwd_s=scale * (pb[j] - pb[i]),
                    bwd_input_s=scale * (pb[j] - pb[i]) / 2,
                    p2p_s=np.array([[p2p[s].latency_s + out[jj[s] - 1] / p2p[s].bandwidth_bytes_per_s
                                     for s in range(pp - 1)] for jj in j]).reshape(len(cuts), pp - 1),
                    allreduce_s=np.where(grad > 0, grad * np.array([a[0] for a in ar]) + np.array([a[1] for a in ar]),
                                         0.0) + step)
                for schedule in ("gpipe", "1f1b"):
                    if schedule == "1f1b" and m < pp:
                        continue
                    best = min(best, float(np.min(iteration_time_s(schedule, pp, m, 1, times))))
    return best


@st.composite
def mixed_instances(draw):
    L = draw(st.integers(2, 8))
    tp = draw(st.sampled_from([1, 2]))
    specs = [_spec("a", 300), _spec("b", draw(st.sampled_from([100, 150, 300]))), _spec("c", 60)]
    groups = []
    for k in range(draw(st.integers(2, 3))):
        groups.append(DeviceGroup(specs[k], draw(st.integers(1, 2)), draw(st.integers(tp, 2 * tp))))
    if sum(g.num_devices for g in groups) > 6:
        groups = [DeviceGroup(g.device, 1, g.devices_per_node) for g in groups]
    perm = draw(st.permutations(range(len(groups))))
    t = draw(st.lists(st.floats(0.5e-3, 4e-3), min_size=L, max_size=L))
    out = draw(st.lists(st.sampled_from([0.0, 1e6, 2e7, 1e8]), min_size=L, max_size=L))
    params = draw(st.lists(st.sampled_from([0.0, 1e7, 1e8]), min_size=L, max_size=L))
    return L, tp, groups, perm, t, out, params


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_instances())
def test_rank1_equals_brute_force_and_group_order_does_not_matter(inst):
    """Random mixed clusters (2-3 types, <= 6 devices, tp 1 or 2), <= 8
    layers, memory never binding (1000 GB devices): the search's best time
    equals the brute force over every split and placement, evaluated with
    pipesearch.timemodel on stage times built by hand; the same cluster with
    its groups permuted gives the same best time; every stage uses distinct,
    existing devices."""
    L, tp, groups, perm, t, out, params = inst
    links = (Link(200 * GB, 1e-6), Link(25 * GB, 1e-5), Link(10 * GB, 3e-5))  # each slower in both terms
    cluster = Cluster("r", tuple(groups), *links)
    if sum(g.nodes * (g.devices_per_node // tp) for g in groups) < 1:
        return
    prof = _profile(t, out, params)
    ref = groups[0].device
    opts = SearchOptions(micro_batch_size=1, schedules=("gpipe", "1f1b"), top=1, enumerate_layouts_up_to=10**6)
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    best = search([ModelVariant(prof, tp=tp)], cluster, job, opts, profiled_device=ref).plans[0]
    oracle = _brute_force(prof, cluster, ref, tp, 4)
    assert best.predicted.iteration_time_s == pytest.approx(oracle, rel=1e-9)
    used = [d + k for s in best.stages for d in s.devices for k in range(tp)]
    assert len(set(used)) == len(used) and max(used) < cluster.num_devices
    permuted = Cluster("p", tuple(groups[k] for k in perm), *links)
    again = search([ModelVariant(prof, tp=tp)], permuted, job, opts, profiled_device=ref).plans[0]
    assert again.predicted.iteration_time_s == pytest.approx(best.predicted.iteration_time_s, rel=1e-9)


# ------------------------------------------------ per-stage memory: A / B / C


def test_abc_each_stage_uses_its_own_device_memory():
    """Devices A (fp32 10 TFLOPS, 36 GB), B (6.7 TFLOPS, 36 GB), C (10
    TFLOPS, 10 GB); 40 layers of 0.9 GB of weights (state = the weights:
    4 bytes per 4-byte parameter, no optimizer state), 0.5 GB reserve, no
    activations or transfers; a layer takes t on A and C, t x 10/6.7 on B.

    By hand: C holds at most 10 layers (9.0 + 0.5 <= 10; 11 need 10.4 GB);
    with stage times at most 18 t, B holds at most 12 (12 x 1.4925 t =
    17.91 t; 13 give 19.4 t) and A at most 18, and 18 + 12 + 10 = 40: the
    only split with bottleneck 18 t, and none reaches below 18 t (A 17 would
    leave 13 for B or 11 for C). The memory pre-filter must not refuse it
    (a smallest-device bound would: 36 GB / 3 = 12 GB > 9.5 GB). The
    reported peak memory is A's 16.2 GB against A's own 36 GB."""
    from pipesearch.hardware import load_cluster

    cluster = load_cluster(str(DATA / "abc" / "cluster.toml"))
    t = 1e-3
    layers = tuple(Layer(f"l{i}", t / 3, 2 * t / 3, 0.9e9, 0.0, 0.0) for i in range(40))
    prof = ModelProfile("abc", layers, 1, profiled_device="device-a", bytes_per_param=4.0)
    job = Job(global_batch_size=64, state_bytes_per_param=4.0, optimizer_bytes_per_param=0.0,
              memory_reserve_bytes=0.5e9)
    a = cluster.groups[0].device
    plan = search([ModelVariant(prof)], cluster, job, SearchOptions(micro_batch_size=1, schedules=("1f1b",), top=1),
                  profiled_device=a).plans[0]
    per_type = {s.device_type: s.layers[1] - s.layers[0] for s in plan.stages}
    assert per_type == {"device-a": 18, "device-b": 12, "device-c": 10}
    assert max(s.compute_s for s in plan.stages) == pytest.approx(18 * t, rel=1e-9)
    assert plan.predicted.peak_memory_bytes == pytest.approx(18 * 0.9e9)
    assert plan.predicted.memory_capacity_bytes == 36e9


def test_groups_of_one_device_and_link_plan_as_one_group():
    """Two [[groups]] of the same device, node size and links (inter_group =
    inter_node) describe one uniform cluster: the search gives the plan of
    the one-group cluster of all their nodes (it used to treat them as a
    mixed cluster and search every device order, 40x longer); a slower
    inter_group link tells the groups apart again."""
    mixed = load_cluster(str(Path(__file__).parents[1] / "hardware/clusters/mixed-h100-a100.toml"))
    h100 = mixed.groups[0].device
    two = _with_device(mixed, h100)
    one = Cluster("one", (DeviceGroup(h100, 2, 8),), mixed.intra_node, mixed.inter_node, mixed.inter_group)
    assert two.is_uniform and one.is_uniform
    a, b = _gpt3_search(two), _gpt3_search(one)
    assert a.predicted.iteration_time_s == b.predicted.iteration_time_s
    assert [s.layers for s in a.stages] == [s.layers for s in b.stages]
    assert [s.devices for s in a.stages] == [s.devices for s in b.stages]
    slower = Cluster("slower", two.groups, two.intra_node, two.inter_node,
                     Link(two.inter_node.bandwidth_bytes_per_s / 2, two.inter_node.latency_s))
    assert not slower.is_uniform
    # no [inter_group]: the groups meet over inter_node (Cluster.link), alike as well
    assert Cluster("none", two.groups, two.intra_node, two.inter_node, None).is_uniform


def test_transformer_times_convert_between_types_at_their_gemm_size():
    """A transformer's layer table is computed at its hidden size's GEMM
    efficiency (``achieved_fraction_at``); a stage on another type is timed
    at that type's rate at the same size: GPT-3 1.3B's blocks planned on an
    H100 reference and placed on an A100 take the time of the A100's own
    layer table (3.094x here, not the flat fractions' 3.196x)."""
    from pipesearch.costs import device_time_scale, profile_precision
    from pipesearch.hardware import load_device
    from pipesearch.profiles.transformer import layer_table, load_transformer
    from pipesearch.catalog import resolve

    cfg = load_transformer(resolve("model", "gpt3-1.3b"))
    h100, a100 = load_device("h100-80gb"), load_device("a100-80gb")
    on_h100, on_a100 = layer_table(cfg, device=h100), layer_table(cfg, device=a100)
    scale = device_time_scale(h100, a100, profile_precision(on_h100))
    for mine, theirs in zip(on_h100.layers, on_a100.layers):
        assert mine.fwd_s * scale == pytest.approx(theirs.fwd_s, rel=1e-12)
        assert mine.bwd_s * scale == pytest.approx(theirs.bwd_s, rel=1e-12)
    assert profile_precision(on_h100) == "fp16@2048"
    # a measured profile (no GEMM size) converts at the flat fractions
    measured = ModelProfile(name="m", layers=on_h100.layers, profiled_batch_size=1, bytes_per_param=2.0)
    flat = (h100.peak_fp16_flops * h100.achieved_fraction) / (a100.peak_fp16_flops * a100.achieved_fraction)
    assert device_time_scale(h100, a100, profile_precision(measured)) == pytest.approx(flat, rel=1e-15)
