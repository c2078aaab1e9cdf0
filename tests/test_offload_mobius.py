"""Mobius: more stages than GPUs, each stage copied in from host memory while
the previous one computes (pipesearch.timemodel.mobius_graph,
pipesearch.stage_options.swap_options, pipesearch.host.cross_mapping).

Oracles: timelines traced by hand (copies as link occupancy, one queue per
PCIe switch and direction), looped BFS in the discrete-event simulator (the
same compute order, no copies), and every split of a small model replayed.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from helpers import all_splits, mobius_gpus_fit, mobius_profile, pcie_host, tiny_cluster
from pipesearch import host as host_lib
from pipesearch.costs import build_pipeline_costs
from pipesearch.errors import InputError
from pipesearch.hardware import load_cluster
from pipesearch.search import search
from pipesearch.point_plan import simulate_plan
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, iteration_time_s, simulate_times
from pipesearch.types import HostSpec, Job

GB = 1e9


def _times(S, fwd=1.0, bwd=2.0, swap_in=3.0, swap_out=1.0, queue=None):
    return StageTimes(fwd_s=np.full(S, fwd), bwd_s=np.full(S, bwd), bwd_input_s=np.zeros(S),
                      p2p_s=np.zeros(S - 1), allreduce_s=np.zeros(S), swap_in_s=np.full(S, swap_in),
                      swap_out_s=np.full(S, swap_out), swap_queue=queue)


def test_two_gpus_under_one_switch_wait_twice_as_long_for_their_weights():
    """pp 2, one stage each, one micro-batch: F 1 s, B 2 s, weights in 3 s,
    gradients out 1 s.

    Different switches: both copies [0, 3]; F0 [3, 4], F1 [4, 5], B1 [5, 7],
    B0 [7, 9]; gradients out of stage 1 [7, 8], of stage 0 [9, 10]: T = 10.
    One switch: the copies take turns, [0, 3] and [3, 6] (stage 1's weights
    arrive at twice the time); F1 [6, 7], B1 [7, 9], out [9, 10], B0 [9,
    11], out [11, 12]: T = 12."""
    apart = _times(2, queue=(0, 1))
    shared = _times(2, queue=(0, 0))
    assert iteration_time_s("mobius", 2, 1, 1, apart) == pytest.approx(10.0)
    assert iteration_time_s("mobius", 2, 1, 1, shared) == pytest.approx(12.0)
    t, tl = simulate_times("mobius", 2, 1, 1, shared)
    assert t == pytest.approx(12.0)
    start = {(r.kind, r.stage): r.start_s for r in tl.records}
    assert start[("F", 1)] == pytest.approx(6.0) and start[("B", 0)] == pytest.approx(9.0)
    _, tl = simulate_times("mobius", 2, 1, 1, apart)
    assert {(r.kind, r.stage): r.start_s for r in tl.records}[("F", 1)] == pytest.approx(4.0)


def test_the_next_stage_is_prefetched_while_one_computes():
    """One GPU, two stages (vp 2), one micro-batch, F 1, B 2, in 3, out 1.
    Stays: stage 0 (forward), stage 1 (forward and backward), stage 0 again
    (backward). Copies in: stage 0 [0, 3], stage 1 [3, 6] (while F0 runs
    [3, 4]), stage 0 again once stage 0's first stay is over and the queue
    is free: [6, 9]. F1 [6, 7], B1 [7, 9], its gradients out [9, 10], B0
    [9, 11], out [11, 12]: T = 12 (without prefetch, 3 + 1 + 3 + 3 + 3 + 2
    + 1 = 16)."""
    assert iteration_time_s("mobius", 1, 1, 2, _times(2)) == pytest.approx(12.0)


def test_two_stays_fill_the_copy_queue_from_end_of_the_stay_two_before():
    """One GPU, three stages, m = 2, F 2, B 2, in 1, out 1 (copies hidden
    under compute). Stays 0, 1, 2 (+ backward), 1, 0. Weights in: s0 [0,
    1], s1 [1, 2], s2 after stay 0 ends (F0 of both micro-batches [1, 5])
    [5, 6]; F1 [5, 9]; F2 [9, 13]; B2 [13, 17]; stage 1 again after stay
    1 ends at 9: [9, 10]; B1 [17, 21]; out s2 [17, 18]; stage 0 again after
    stay 2's gradients are out (18): [18, 19]; B0 [21, 25], out s1 [21, 22],
    out s0 [25, 26]: T = 26."""
    t = _times(3, fwd=2.0, bwd=2.0, swap_in=1.0, swap_out=1.0)
    assert iteration_time_s("mobius", 1, 2, 3, t) == pytest.approx(26.0)


@pytest.mark.parametrize("pp,vp,m", [(2, 2, 3), (3, 2, 4), (2, 3, 2), (4, 1, 5), (1, 3, 2)])
def test_without_copies_mobius_is_looped_bfs(pp, vp, m):
    """Zero copy times: the same compute order and sends as looped BFS
    (discrete-event simulator); with copies never faster."""
    rng = np.random.default_rng(pp * 10 + vp)
    S = pp * vp
    base = StageTimes(fwd_s=rng.uniform(1, 2, S), bwd_s=rng.uniform(2, 4, S), bwd_input_s=np.zeros(S),
                      p2p_s=rng.uniform(0, 0.5, S - 1), allreduce_s=rng.uniform(0, 1, S))
    want = simulate_times("looped-bfs", pp, m, vp, base)[0]
    zero = replace(base, swap_in_s=np.zeros(S), swap_out_s=np.zeros(S))
    assert iteration_time_s("mobius", pp, m, vp, zero) == pytest.approx(want)
    assert simulate_times("mobius", pp, m, vp, zero)[0] == pytest.approx(want)
    copies = replace(base, swap_in_s=rng.uniform(0, 3, S), swap_out_s=rng.uniform(0, 3, S))
    t = iteration_time_s("mobius", pp, m, vp, copies)
    assert t >= want - 1e-12
    assert simulate_times("mobius", pp, m, vp, copies)[0] == pytest.approx(t)


def test_cross_mapping_alternates_switches():
    """8 RTX 4090s, GPUs 0-3 under switch 0 and 4-7 under switch 1 (the
    catalog's host table): ranks 0..7 go to 0, 4, 1, 5, 2, 6, 3, 7, so
    neighbours never share an uplink; queues alternate."""
    cluster = load_cluster("1x8-rtx4090-pcie4")
    heads = np.arange(8)[:, None]
    crossed = host_lib.cross_mapping(cluster, heads)
    assert crossed[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    queue, copies = host_lib.swap_queues(cluster, crossed)
    assert queue == (0, 1, 0, 1, 0, 1, 0, 1) and copies.tolist() == [1] * 8
    queue, _ = host_lib.swap_queues(cluster, heads)
    assert queue == (0, 0, 0, 0, 1, 1, 1, 1)


# ------------------------------------------------------------ search = brute force


def _host(**kw) -> HostSpec:
    return pcie_host(**{"pcie_switches": ((0, 1), (2, 3)), "cpu_adam_params_per_s": 1e10, **kw})


def _profile(rng, L):
    return mobius_profile(rng, L, saved_gb=(0.5, 2))


@pytest.mark.parametrize("seed,L,pp,vp,m,cap", [(0, 6, 2, 2, 2, 42), (1, 7, 2, 2, 3, 55), (2, 6, 2, 1, 2, 48),
                                                 (3, 8, 2, 3, 2, 44)])
def test_search_equals_brute_force_over_splits(seed, L, pp, vp, m, cap):
    """Every split of ``pp * vp`` stages: copy times by hand (2 B of weights
    and of gradients per parameter over the 25 GB/s link, one copy at a time
    per switch; cross mapping puts the two ranks under different switches),
    the GPU's peak by hand (activations of all its stages for all ``m``
    micro-batches + the largest pair of consecutive stays' weights and
    gradients), replayed in the time model; the search's best equals the
    least."""
    rng = np.random.default_rng(seed)
    prof = _profile(rng, L)
    cluster = replace(tiny_cluster(1, 4, memory_bytes=cap * GB), host=_host())
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    S = pp * vp
    best, refused = np.inf, 0
    for bounds in all_splits(L, S):
        lay = [prof.layers[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        w = np.array([sum(x.param_bytes for x in ls) for ls in lay])
        act = np.array([sum(x.saved_bytes for x in ls) for ls in lay]) * m
        fits = mobius_gpus_fit(w, act, pp, cap * GB)
        if not fits:
            refused += 1
            continue
        times = StageTimes(
            fwd_s=np.array([sum(x.fwd_s for x in ls) for ls in lay]),
            bwd_s=np.array([sum(x.bwd_s for x in ls) for ls in lay]), bwd_input_s=np.zeros(S), p2p_s=np.zeros(S - 1),
            allreduce_s=w / 2 * pp / 1e10,  # CPU Adam of the stage's parameters, the rate shared by pp GPUs
            swap_in_s=w / (25 * GB), swap_out_s=w / (25 * GB), swap_queue=(0, 1))
        best = min(best, iteration_time_s("mobius", pp, m, vp, times))
    assert np.isfinite(best) and refused > 0  # memory decides some splits
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("mobius",), vps=(vp,),
                         top=1)
    plan = search([ModelVariant(prof)], cluster, job, opts).plans[0]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    assert all(st.memory_option == "swap" for st in plan.stages)
    assert [st.devices[0] for st in plan.stages[:pp]] == [0, 2]  # cross mapping: ranks under different switches
    assert simulate_plan(plan)[0] == pytest.approx(best, rel=1e-9)


def test_mobius_needs_a_host_table():
    prof = _profile(np.random.default_rng(0), 4)
    with pytest.raises(InputError, match=r"\[host\]"):
        build_pipeline_costs(prof, tiny_cluster(1, 2), Job(global_batch_size=2), pp=4, dp=1, micro_batch_size=1,
                             num_micro_batches=2, schedule="gpipe", placement=np.array([[0], [1], [0], [1]]),
                             stages_per_device=2, weight_swapping=True)


def test_cli_plan_file_of_a_mobius_plan_replays(tmp_path):
    """A Mobius plan of Qwen3-32B on 8 RTX 4090s: valid plan file, the
    copies recorded, and `pipesearch simulate` replays the predicted time."""
    from click.testing import CliRunner

    from pipesearch.cli import main
    from pipesearch.plan import load_plan_file

    out = tmp_path / "m.json"
    r = CliRunner().invoke(main, ["plan", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "16",
                                  "--seq-len", "2048", "--schedule", "mobius", "--pp", "2", "--tp", "4",
                                  "--recompute", "full", "--top", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = load_plan_file(out).plans[0]
    info = dict(plan.extra)["mobius"]
    assert len(info["swap_in_s"]) == len(plan.stages) and all(x > 0 for x in info["swap_in_s"])
    assert max(info["device_peak_bytes"]) <= 24 * 2**30
    assert simulate_plan(plan)[0] == pytest.approx(plan.predicted.iteration_time_s, rel=1e-9)
    r = CliRunner().invoke(main, ["export", str(out), "--format", "torch"])
    assert r.exit_code == 2 and "stage 0 has option swap" in r.output


def test_cli_mobius_plan_of_an_fp32_profile_validates(tmp_path):
    """A Mobius plan of a profile of 4 B per parameter: each stage's host
    bytes are its parameters (its parameter bytes over 4) times Mobius' 2 +
    16 B per parameter (16-bit copy; mixed-precision Adam's fp32 master
    weights, moments and gradient copy), by hand 40 MB / 4 x 18 = 180 MB a
    stage here, and `pipesearch validate` accepts the file it was written
    to (it once recomputed them over 2 B per parameter: 360 MB)."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    profile = tmp_path / "fp32.csv"
    profile.write_text("# batch_size: 32\n# device: v100-pcie-16gb\n# bytes_per_param: 4\n"
                       "name,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes\n"
                       + "".join(f"l{k},5.0,10.0,40000000,8000000,16000000\n" for k in range(4)))
    cluster = tmp_path / "host2.toml"
    cluster.write_text('name = "host2"\nnodes = 1\ndevices_per_node = 2\ndevice = "rtx4090-24gb"\n'
                       "[intra_node]\nbandwidth_GBps = 12.5\nlatency_us = 20\n"
                       "[inter_node]\nbandwidth_GBps = 12.5\nlatency_us = 20\n"
                       "[host]\nmemory_GB = 256\npcie_generation = 4\npcie_lanes_per_gpu = 16\n"
                       "host_to_device_GBps = 25\nswitch_uplink_GBps = 25\npcie_switches = [[0], [1]]\n"
                       "cpu_adam_params_per_s = 1e9\n")
    out = tmp_path / "m.json"
    r = CliRunner().invoke(main, ["plan", "--model", str(profile), "--cluster", str(cluster), "-b", "8",
                                  "--schedule", "mobius", "--pp", "2", "--vp", "2", "--top", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["inputs"]["model"]["bytes_per_param"] == 4.0
    assert doc["plans"][0]["options"]["host"]["host_memory_bytes"] == [180e6] * 4
    r = CliRunner().invoke(main, ["validate", str(out)])
    assert r.exit_code == 0, r.output


def test_a_mobius_plan_on_a_mixed_cluster_checks_each_gpu_against_its_own_memory(tmp_path):
    """2 H100 80 GB + 2 A100 40 GB under one host: a Mobius plan whose H100
    holds 42.7 GB at its peak (more than an A100's usable 37 GiB, well
    within its own 75 GiB) was refused by the plan file's own check, which
    held every GPU to the smallest type's memory: ``-o`` and ``--json``
    were internal errors, the table alone printed. Each GPU is now held to
    its own device's memory, and the written file validates."""
    import json

    from click.testing import CliRunner

    from pipesearch.cli import main

    cluster = tmp_path / "c5.toml"
    cluster.write_text('name = "c5"\n[[groups]]\nnodes = 1\ndevices_per_node = 2\ndevice = "h100-80gb"\n'
                       '[[groups]]\nnodes = 1\ndevices_per_node = 2\ndevice = "a100-40gb"\n'
                       "[intra_node]\nbandwidth_GBps = 100\nlatency_us = 5\n"
                       "[inter_node]\nbandwidth_GBps = 25\nlatency_us = 10\n"
                       "[inter_group]\nbandwidth_GBps = 12.5\nlatency_us = 10\n"
                       "[host]\nmemory_GB = 512\npcie_generation = 4\npcie_lanes_per_gpu = 16\n"
                       "host_to_device_GBps = 25\nswitch_uplink_GBps = 25\npcie_switches = [[0, 1]]\n"
                       "cpu_adam_params_per_s = 1e9\n")
    out = tmp_path / "mob.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", str(cluster), "-b", "16",
                                  "--seq-len", "1024", "--schedule", "mobius", "--pp", "3", "--recompute", "none",
                                  "--micro-batch-size", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())["plans"][0]
    peaks = plan["options"]["mobius"]["device_peak_bytes"]
    types = [st["device_type"] for st in plan["stages"][:3]]
    a100_usable = 40 * 2**30 * 0.95 - 2**30
    assert any(p > a100_usable and t == "h100-80gb" for p, t in zip(peaks, types))  # the case: beyond an A100
    assert all(p <= a100_usable for p, t in zip(peaks, types) if t == "a100-40gb")
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
