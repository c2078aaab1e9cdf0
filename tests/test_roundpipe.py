"""RoundPipe: layer-group tasks dispatched round-robin over a pool of GPUs,
weights and optimizer in host memory (pipesearch.schedules.roundpipe_tasks,
pipesearch.timemodel.roundpipe_graph, pipesearch.roundpipe).

Oracles: the dispatch order read from RoundPipe's ``forward_backward``; a
timeline traced by hand; copy times derived from bytes and the PCIe table;
every split of small models replayed in the time model with stage times and
memory computed here from the layer table.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from helpers import all_splits, mobius_profile, pcie_host, tiny_cluster, tiny_profile
from pipesearch import roundpipe as rp
from pipesearch.roundpipe import build_roundpipe_costs, lower_bound_s, roundpipe_split
from pipesearch.schedules import roundpipe_tasks
from pipesearch.search import search
from pipesearch.point_plan import simulate_plan
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, iteration_time_s, roundpipe_copy_spans, simulate_times
from pipesearch.types import Job

GB = 1e9


def test_dispatch_order_is_forwards_then_the_fused_last_group_then_backwards_round_robin():
    """RoundPipe.forward_backward: forward groups 0 .. G-2, the last group's
    fused forward and backward, backward groups G-2 .. 0, each on the next
    GPU of one counter: 3 groups on 2 GPUs give GPUs 0, 1, 0, 1, 0."""
    assert roundpipe_tasks(3, 2) == (("F", 0, 0), ("F", 1, 1), ("FB", 2, 0), ("B", 1, 1), ("B", 0, 0))
    assert [d for *_, d in roundpipe_tasks(4, 3)] == [0, 1, 2, 0, 1, 2, 0]
    assert roundpipe_tasks(1, 4) == (("FB", 0, 0),)


def _hand_times(scale=2.0, **kw):
    """Three groups: forward 1 s, backward 2 s (a backward task re-runs the
    forward: 3 s), one boundary copy 0.25 s, weights in and gradients out
    0.5 s at the link's rate; both GPUs under one switch copy at half of it
    (scale 2): 0.5 s, 1 s, and a weight chunk (m = 2) 0.5 s."""
    base = dict(fwd_s=np.array([1.0, 1, 1]), bwd_s=np.array([2.0, 2, 2]), bwd_input_s=np.zeros(3),
                p2p_s=np.array([0.25, 0.25]), allreduce_s=np.array([0.1, 0.2, 0.3]),
                swap_in_s=np.full(3, 0.5), swap_out_s=np.full(3, 0.5), pcie_scale=np.array([scale, scale]))
    base.update(kw)
    return StageTimes(**base)


def test_hand_traced_two_gpus_under_one_switch_two_micro_batches_three_groups():
    """Tasks t0 F(g0) GPU0, t1 F(g1) GPU1, t2 FB(g2) GPU0, t3 B(g1) GPU1,
    t4 B(g0) GPU0; m = 2. C = compute, I = copy in, O = copy out, W = weights
    in (whole for a GPU's first task, else chunk j after the copies in of
    micro-batch j of the GPU's previous task), G = gradients out.

    GPU0: W(g0) [0, 1]; C(t0,0) [1, 2], O [2, 2.5]; chunk 0 of W(g2) [1,
    1.5]; C(t0,1) waits for O(t0,0): [2.5, 3.5], O [3.5, 4]; chunk 1 [1.5, 2].
    GPU1: W(g1) [0, 1]; I(t1,0) waits for O(t0,0): [2.5, 3]; C [3, 4]; O [4,
    4.5]; chunk 0 of W(g1) again [3, 3.5]; I(t1,1) waits for O(t0,1): [4,
    4.5]; C waits for O(t1,0): [4.5, 5.5]; O [5.5, 6]; chunk 1 [4.5, 5].
    GPU0: I(t2,0) waits for O(t1,0): [4.5, 5]; C(t2,0) [5, 8]; O (its input
    gradient) [8, 8.5]; chunk 0 of W(g0) [5, 5.5]; I(t2,1) waits for
    O(t1,1): [6, 6.5]; C waits for O(t2,0): [8.5, 11.5]; O [11.5, 12]; chunk 1
    [6.5, 7]; G(g2) [12, 13].
    GPU1: saved input of g1 (micro-batch 0) after chunk 1 [5, 5.5]; output
    gradient after O(t2,0): [8.5, 9]; C(t3,0) [9, 12]; O [12, 12.5]; saved
    input (1) [9, 9.5]; gradient after O(t2,1): [12, 12.5]; C(t3,1) waits for
    O(t3,0): [12.5, 15.5]; O [15.5, 16]; G(g1) [16, 17].
    GPU0: I(t4,0) after O(t3,0): [12.5, 13]; C(t4,0) [13, 16] (no gradient
    out of group 0); I(t4,1) after O(t3,1): [16, 16.5]; C [16.5, 19.5];
    G(g0) [19.5, 20.5].
    GPU makespan 20.5 s; the CPU's step after it, 0.1 + 0.2 + 0.3: 21.1 s."""
    t = _hand_times()
    assert iteration_time_s("roundpipe", 2, 2, 1, t) == pytest.approx(21.1)
    total, tl = simulate_times("roundpipe", 2, 2, 1, t)
    assert total == pytest.approx(21.1)
    got = [(r.rank, r.kind, r.stage, r.microbatch, r.start_s, r.end_s) for r in tl.records]
    want = [(0, "F", 0, 0, 1, 2), (0, "F", 0, 1, 2.5, 3.5), (0, "B", 2, 0, 5, 8), (0, "B", 2, 1, 8.5, 11.5),
            (0, "B", 0, 0, 13, 16), (0, "B", 0, 1, 16.5, 19.5),
            (1, "F", 1, 0, 3, 4), (1, "F", 1, 1, 4.5, 5.5), (1, "B", 1, 0, 9, 12), (1, "B", 1, 1, 12.5, 15.5)]
    assert [g[:4] for g in got] == [w[:4] for w in want]
    assert np.allclose([g[4:] for g in got], [w[4:] for w in want])
    grads = [(c[0], c[3], c[4], c[5]) for c in roundpipe_copy_spans(t, 2, 2) if c[2] == "grads"]
    assert sorted(grads) == [(0, 0, 19.5, 20.5), (0, 2, 12.0, 13.0), (1, 1, 16.0, 17.0)]


def test_hand_traced_case_with_the_delayed_step():
    """The same GPU iteration (20.5 s); the host's step beside the next
    iteration: max(20.5, 1 + 1 + 1) = 20.5, and max(20.5, 10 + 10 + 5) = 25."""
    short = _hand_times(allreduce_s=np.zeros(3), delayed_host_s=np.ones(3))
    long = _hand_times(allreduce_s=np.zeros(3), delayed_host_s=np.array([10.0, 10, 5]))
    assert iteration_time_s("roundpipe", 2, 2, 1, short) == pytest.approx(20.5)
    assert iteration_time_s("roundpipe", 2, 2, 1, long) == pytest.approx(25.0)


def _contention_costs(gpus):
    """Two layers without compute or activations, 1 GB of 16-bit weights
    each (0.5e9 parameters at 2 B), on a pool of two GPUs of the PCIe table
    (25 GB/s per GPU and per switch uplink, switches {0..3} and {4..7})."""
    cluster = replace(tiny_cluster(1, 8), host=pcie_host(cpu_adam_params_per_s=1e18))
    prof = tiny_profile([0.0, 0.0], [0.0, 0.0], params=[1e9, 1e9], bytes_per_param=2.0)
    job = Job(global_batch_size=1, memory_reserve_bytes=0, delayed_optimizer_step=True)
    return build_roundpipe_costs(prof, cluster, job, gpus=np.array(gpus), groups=2, micro_batch_size=1,
                                 num_micro_batches=1)


def test_two_gpus_under_one_switch_copy_twice_as_long_as_under_two():
    """G = 2 on 2 GPUs, m = 1, no compute: GPU0 copies g0's weights in [0,
    w], prefetches them again for its backward task [w, 2w], runs it and
    copies g0's gradients out [2w, 3w]; GPU1's fused task ends at 2w. Each
    copy is 1 GB: w = 1 GB / 25 GB/s = 0.04 s for GPUs under different
    switches (T = 0.12 s) and 1 GB / 12.5 GB/s = 0.08 s for GPUs sharing one
    switch's uplink (T = 0.24 s)."""
    apart, shared = _contention_costs([0, 4]), _contention_costs([0, 1])
    assert list(shared.pcie_scale) == [2.0, 2.0] and list(apart.pcie_scale) == [1.0, 1.0]
    bounds = np.array([0, 1, 2])
    assert apart.time_s(bounds) == pytest.approx(0.12)
    assert shared.time_s(bounds) == pytest.approx(0.24)
    spans = roundpipe_copy_spans(shared.stage_times(bounds), 2, 1)
    assert all(e - s == pytest.approx(0.08) for *_, s, e in spans if e > s)


def _host_table(**kw):
    return pcie_host(**{"pcie_switches": ((0, 1), (2, 3)), "cpu_adam_params_per_s": 1e10, **kw})


def _by_hand(prof, bounds, m, scale):
    """Stage times and the memory check of one split from the layer table:
    sums of the layers' times, a boundary copy its last layer's output over
    25 GB/s, weights and gradients 2 B per parameter (param_bytes at 2 B per
    parameter: the same bytes) over 25 GB/s, the CPU's Adam at 1e10
    parameters/s; each GPU's task pairs (the one computing with its weights,
    gradients if a backward, one micro-batch's saved bytes and twice its
    input and output boundaries; the next task's weights and gradients):
    ``(times, peak bytes of the busiest GPU)``."""
    G = len(bounds) - 1
    lay = [prof.layers[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    w = np.array([sum(x.param_bytes for x in ls) for ls in lay])
    out = np.array([ls[-1].output_bytes for ls in lay[:-1]])
    edges = np.append(out, 0.0) + np.insert(out, 0, 0.0)
    act = np.array([sum(x.saved_bytes for x in ls) for ls in lay]) + 2 * edges
    tasks = roundpipe_tasks(G, len(scale))
    peak = 0.0
    for d in range(len(scale)):
        mine = [(k, g) for k, g, dd in tasks if dd == d]
        held = [(w[g] if k == "F" else 2 * w[g]) for k, g in mine]
        for a, (k, g) in enumerate(mine):
            peak = max(peak, held[a] + act[g] + (held[a + 1] if a + 1 < len(mine) else 0.0))
    times = StageTimes(fwd_s=np.array([sum(x.fwd_s for x in ls) for ls in lay]),
                       bwd_s=np.array([sum(x.bwd_s for x in ls) for ls in lay]), bwd_input_s=np.zeros(G),
                       p2p_s=out / 25e9, allreduce_s=w / 2 / 1e10, swap_in_s=w / 25e9, swap_out_s=w / 25e9,
                       pcie_scale=np.array(scale))
    return times, peak


def _profile(rng, L):
    prof = mobius_profile(rng, L, saved_gb=(0.5, 3))
    return replace(prof, layers=tuple(replace(x, output_bytes=float(rng.uniform(0.1, 2)) * GB) for x in prof.layers))


@pytest.mark.parametrize("seed,L,vp,m,enumerate_all", [(0, 6, 1, 2, True), (1, 7, 2, 3, True), (2, 8, 2, 2, False),
                                                      (3, 7, 2, 4, False)])
def test_search_equals_brute_force_over_every_split(monkeypatch, seed, L, vp, m, enumerate_all):
    """pp 2 (GPUs 0 and 1 share a switch: copies at half rate), G = 2 vp
    groups: every split replayed in the time model with times and memory
    from :func:`_by_hand`; the search (enumeration, or with enumeration off
    the branch and bound over its lower bounds) finds the least time,
    proven, and the lower bound of the point is below every split's time.
    The GPUs' memory is the median of the splits' peaks, so that memory
    decides some."""
    if not enumerate_all:
        monkeypatch.setattr(rp, "ENUMERATE_SPLITS", 0)
    rng = np.random.default_rng(seed)
    prof = _profile(rng, L)
    G = 2 * vp
    cases = [(_by_hand(prof, bounds, m, [2.0, 2.0])) for bounds in all_splits(L, G)]
    cap = float(np.median([peak for _, peak in cases]))
    cluster = replace(tiny_cluster(1, 4, memory_bytes=cap), host=_host_table())
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    times = [iteration_time_s("roundpipe", 2, m, vp, t) for t, _ in cases]
    best = min(t for t, (_, peak) in zip(times, cases) if peak <= cap)
    least = min(times)
    assert any(peak > cap for _, peak in cases)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("roundpipe",), vps=(vp,),
                         top=1)
    plan = search([ModelVariant(prof)], cluster, job, opts).plans[0]
    assert [st.devices[0] for st in plan.stages[:2]] == [0, 1]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    assert dict(plan.extra)["split_search"]["exact"]
    assert simulate_plan(plan)[0] == pytest.approx(best, rel=1e-9)
    costs = build_roundpipe_costs(prof, cluster, job, gpus=np.array([0, 1]), groups=G, micro_batch_size=1,
                                  num_micro_batches=m)
    assert lower_bound_s(costs) <= least * (1 + 1e-12)


def test_branch_and_bound_matches_enumeration_on_a_larger_model(monkeypatch):
    """Ten layers in six groups on three GPUs (C(9, 5) = 126 splits): the
    branch and bound's proven optimum equals enumeration's."""
    prof = _profile(np.random.default_rng(7), 10)
    cluster = replace(tiny_cluster(1, 4, memory_bytes=80 * GB), host=_host_table())
    job = Job(global_batch_size=4, memory_reserve_bytes=0)
    costs = build_roundpipe_costs(prof, cluster, job, gpus=np.array([0, 1, 2]), groups=6, micro_batch_size=1,
                                  num_micro_batches=4)
    full = roundpipe_split(costs)
    monkeypatch.setattr(rp, "ENUMERATE_SPLITS", 0)
    bnb = roundpipe_split(costs)
    assert full.exact and bnb.exact and bnb.splits_evaluated < full.splits_evaluated
    assert bnb.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)


def test_a_point_out_of_work_reports_its_bound_and_gap(monkeypatch):
    """With the branch and bound limited to one node, the split is the
    descent's, not proven: the plan says so with a lower bound below it."""
    monkeypatch.setattr(rp, "ENUMERATE_SPLITS", 0)
    monkeypatch.setattr(rp, "MAX_NODES", 1)
    prof = _profile(np.random.default_rng(7), 10)
    cluster = replace(tiny_cluster(1, 4, memory_bytes=80 * GB), host=_host_table())
    costs = build_roundpipe_costs(prof, cluster, Job(global_batch_size=4, memory_reserve_bytes=0),
                                  gpus=np.array([0, 1, 2]), groups=6, micro_batch_size=1, num_micro_batches=4)
    found = roundpipe_split(costs)
    assert not found.exact and 0 < found.lower_bound_s < found.iteration_time_s and found.gap > 0


def test_cli_llama_8b_on_8_rtx4090_against_mobius(tmp_path):
    """Llama-3.1-8B on 1x8-rtx4090-pcie4, -b 128 at sequence 2048, pp 8,
    16 groups (vp 2), one sequence per micro-batch. Mobius (looped BFS)
    keeps all 128 micro-batches' activations of each stage on its GPU and
    finds no plan; with them in host memory it does. RoundPipe's GPUs hold
    one micro-batch of one group each, so it fits without offloading, and:
    the CPU's Adam after the iteration covers Llama-3.1-8B's 8,030,261,248
    parameters (Meta's published count) at the box's CPU Adam rate; the plan
    file validates, replays to its time (`pipesearch simulate`), and every
    runtime exporter but stages-json refuses it in one line."""
    from click.testing import CliRunner

    from pipesearch.cli import main
    from pipesearch.hardware import load_cluster
    from pipesearch.plan import load_plan_file

    common = ["plan", "--model", "llama3.1-8b", "--cluster", "1x8-rtx4090-pcie4", "-b", "128", "--seq-len", "2048",
              "--pp", "8", "--vp", "2", "--micro-batch-size", "1", "--top", "1"]
    out = tmp_path / "rp.json"
    r = CliRunner().invoke(main, common + ["--schedule", "roundpipe", "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = load_plan_file(out).plans[0]
    assert plan.schedule == "roundpipe" and len(plan.stages) == 16 and plan.num_micro_batches == 128
    rate = load_cluster("1x8-rtx4090-pcie4").host.cpu_adam_params_per_s
    assert sum(st.host_step_s for st in plan.stages) == pytest.approx(8_030_261_248 / rate, rel=1e-9)
    info = dict(plan.extra)["roundpipe"]
    assert max(info["device_peak_bytes"]) <= 24e9 and list(info["pcie_scale"]) == [4.0] * 8  # four GPUs a switch
    total, tl = simulate_plan(plan)
    assert total == pytest.approx(plan.predicted.iteration_time_s, rel=1e-9)
    from pipesearch.plots.timeline import allreduce_spans  # the CPU's step after the last GPU, drawn on each
    assert all(s >= tl.iteration_time_s and d == pytest.approx(8_030_261_248 / rate)  # after the last gradients
               and s + d == pytest.approx(total) for s, d in allreduce_spans(plan, tl))
    from pipesearch.plots.timeline import pcie_copy_spans  # the timeline's PCIe rows: each group's gradients
    grads = sorted((lane, g) for lane, d, what, g, a, b in pcie_copy_spans(plan) if what == "gradients")
    assert grads == sorted(((30 - g) % 8 if g < 15 else 7, g) for g in range(16))  # out once, from its backward's GPU
    assert {d for _, d, what, *_ in pcie_copy_spans(plan) if what == "gradients"} == {"out"}
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
    import json
    doc = json.loads(out.read_text())  # a task moved off the round robin: refused
    doc["plans"][0]["options"]["roundpipe"]["tasks"][0][2] = 1
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["validate", str(tmp_path / "bad.json")])
    assert r.exit_code == 2 and "options.roundpipe" in r.output
    r = CliRunner().invoke(main, ["export", str(out), "--format", "torch"])
    assert r.exit_code == 2 and "schedule roundpipe dispatches" in r.output
    r = CliRunner().invoke(main, ["export", str(out), "--format", "stages-json", "-o", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "s.json").read_text())["stages"]
    # group g's forward is task g (GPU g mod 8), its backward task 30 - g (group 15's fused task is task 15)
    assert [(x["forward_gpu"], x["backward_gpu"]) for x in rows] == [
        (g % 8, (30 - g) % 8 if g < 15 else 7) for g in range(16)]
    assert all(x["weights"] == "dispatched" and x["optimizer_state"] == "host" for x in rows)
    mobius = common[:-8] + ["--top", "1", "--schedule", "mobius"]
    r = CliRunner().invoke(main, mobius)
    assert r.exit_code != 0 and "no plan" in r.output
    r = CliRunner().invoke(main, mobius + ["--activation-offload", "-o", str(tmp_path / "m.json")])
    assert r.exit_code == 0, r.output
    other = load_plan_file(tmp_path / "m.json").plans[0]
    assert other.schedule == "mobius" and other.predicted.iteration_time_s > 0


@pytest.mark.parametrize("flags,needle", [(["--tp", "2"], "--tp 2"), (["--recompute", "full"], "--recompute full"),
                                          (["--optimizer-offload"], "--optimizer-offload"),
                                          (["--stream-weights"], "--stream-weights"),
                                          (["--dp", "2"], "without data parallelism"),
                                          (["--pp", "1", "--vp", "30"], "--vp 30 with --pp 1"),
                                          (["--nodes", "2", "--pp", "12"], "a node of 1x8-rtx4090-pcie4@2nodes has 8")])
def test_cli_refuses_what_roundpipe_cannot_run_in_one_line(flags, needle):
    from click.testing import CliRunner

    from pipesearch.cli import main

    r = CliRunner().invoke(main, ["plan", "--model", "llama3.1-8b", "--cluster", "1x8-rtx4090-pcie4", "-b", "128",
                                  "--seq-len", "2048", "--schedule", "roundpipe"] + flags)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_no_plan_hint_never_names_a_flag_roundpipe_refuses():
    """llama2-7b as one RoundPipe group (--split 34) fits no RTX 4090: the
    hint named --optimizer-offload, --activation-offload and
    --stream-weights, each of which RoundPipe refuses (above); it now names
    the split, and each fix it names runs."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    base = ["plan", "-q", "--model", "llama2-7b", "--cluster", "1x8-rtx4090-pcie4", "-b", "64", "--seq-len", "1024",
            "--schedule", "roundpipe", "--top", "1"]
    r = CliRunner().invoke(main, base + ["--pp", "1", "--vp", "1", "--split", "34"])
    assert r.exit_code == 2 and "drop --split" in r.output and len(r.output.strip().splitlines()) == 1
    assert not any(f in r.output for f in ("--optimizer-offload", "--activation-offload", "--stream-weights"))
    assert CliRunner().invoke(main, base).exit_code == 0  # the fix: without the split


def test_cli_refuses_roundpipe_on_a_cluster_without_host_table():
    from click.testing import CliRunner

    from pipesearch.cli import main

    r = CliRunner().invoke(main, ["plan", "--model", "vgg16", "--cluster", "4x4-v100-10gbe", "--schedule",
                                  "roundpipe"])
    assert r.exit_code == 2 and "[host]" in r.output and len(r.output.strip().splitlines()) == 1


def test_host_memory_refusal_is_named():
    """Two layers of 10 GB of weights each (5e9 parameters each at 2 B): 20
    B per parameter on the host is 200 GB = 186.3 GiB against a host of 50
    GB, whatever the split: no plan, and the message says host memory."""
    from pipesearch.errors import InfeasibleError

    prof = tiny_profile([1.0, 1.0], params=[10e9, 10e9], bytes_per_param=2.0)
    cluster = replace(tiny_cluster(1, 4, memory_bytes=80 * GB), host=_host_table(memory_bytes=50e9))
    opts = SearchOptions(pp=1, dp=1, micro_batch_size=1, num_micro_batches=2, schedules=("roundpipe",), vps=(2,),
                         top=1)
    with pytest.raises(InfeasibleError, match="host memory: schedule roundpipe keeps 186.3 GiB"):
        search([ModelVariant(prof)], cluster, Job(global_batch_size=2, memory_reserve_bytes=0), opts)


def test_a_pool_never_spans_two_nodes():
    """RoundPipe's pool shares one host (memory, CPU optimizer, PCIe
    switches): on two 8-GPU boxes every RoundPipe plan's GPUs lie in one
    box, and a pinned pool larger than a box is refused (above)."""
    from pipesearch.hardware import load_cluster
    from pipesearch.models import load_model_source
    from pipesearch.search import search
    from pipesearch.search_options import SearchOptions
    from pipesearch.types import Job

    cluster = load_cluster("1x8-rtx4090-pcie4", nodes=2)
    src = load_model_source("qwen3-1.7b", cluster, seq_len=2048)
    res = search(list(src.variants), cluster, Job(16, memory_headroom_fraction=0.05),
                 SearchOptions(schedules=("roundpipe",), top=3), profiled_device=src.profiled_device)
    assert res.plans
    for plan in res.plans:
        devices = {d for st in plan.stages for d in st.devices}
        assert len({cluster.node_of(d) for d in devices}) == 1, devices


def test_mobius_refuses_optimizer_offload_it_already_does():
    from click.testing import CliRunner

    from pipesearch.cli import main

    r = CliRunner().invoke(main, ["plan", "--model", "qwen3-1.7b", "--cluster", "1x8-rtx4090-pcie4", "-b", "32",
                                  "--seq-len", "2048", "--schedule", "mobius", "--optimizer-offload"])
    assert r.exit_code == 2 and "Mobius keeps every stage's weights" in r.output
    assert len(r.output.strip().splitlines()) == 1



@pytest.mark.parametrize("schedule,flags,bad", [("roundpipe", ["--pp", "2", "-b", "16"], "none"),
                                                ("mobius", ["--pp", "2", "--vp", "2", "-b", "32"], "roundpipe"),
                                                ("1f1b", ["--pp", "2", "-b", "32"], "swap")])
def test_validate_refuses_a_memory_option_of_another_schedule(tmp_path, schedule, flags, bad):
    """RoundPipe stages are all ``roundpipe``, Mobius stages ``swap`` (or
    ``swap+act-host``), and no other schedule's stage takes either: a file
    whose stage 0 says otherwise is refused, naming the stage's field."""
    import json

    from click.testing import CliRunner

    from pipesearch.cli import main

    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "qwen3-1.7b", "--cluster", "1x8-rtx4090-pcie4",
                                  "--seq-len", "2048", "--schedule", schedule, "--top", "1", "-o", str(out)] + flags)
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
    doc = json.loads(out.read_text())
    doc["plans"][0]["stages"][0]["memory_option"] = bad
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["validate", str(tmp_path / "bad.json")])
    assert r.exit_code == 2 and "stages[0].memory_option" in r.output and repr(bad) in r.output, r.output


def test_roundpipe_is_searched_at_vp_1_without_a_vp_pin():
    """Without --vp, RoundPipe points take vp 1 as well as the default 2 (no
    other schedule runs its vp 1; on llama3-8b at sequence 2048 on
    1x8-rtx4090-pcie4 vp 1 ran 24.580 s against vp 2's 25.308 s, and the
    search never tried it): rank 1 is the fastest split of either, every
    split of 2 and of 4 groups replayed in the time model (:func:`_by_hand`)."""
    rng = np.random.default_rng(4)
    prof, m = _profile(rng, 6), 2
    cluster = replace(tiny_cluster(1, 4, memory_bytes=1e15), host=_host_table())
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    best = {vp: min(iteration_time_s("roundpipe", 2, m, vp, _by_hand(prof, bounds, m, [2.0, 2.0])[0])
                    for bounds in all_splits(6, 2 * vp)) for vp in (1, 2)}
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("roundpipe",), top=2)
    plans = search([ModelVariant(prof)], cluster, job, opts).plans
    assert sorted(p.vp for p in plans) == [1, 2]
    assert plans[0].predicted.iteration_time_s == pytest.approx(min(best.values()), rel=1e-9)
    assert {p.vp: p.predicted.iteration_time_s for p in plans} == pytest.approx(best, rel=1e-9)
