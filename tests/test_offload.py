"""Optimizer offload as a per-stage memory option, and PCIe sharing
(pipesearch.host, pipesearch.stage_options.stage_options).

Oracles: bandwidths and times written out by hand from the host table
(fair share of a switch's uplink), ZeRO-Offload's byte counts (Ren et al.
ATC'21 Fig. 2: 2 + 2 B per parameter on the GPU, 4 x 4 B on the CPU), and
the discrete-event simulator replaying every split x every per-stage option.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import all_splits, pcie_host, rtx4090_cluster_toml, tiny_cluster
from pipesearch import host as host_lib
from pipesearch.cli import main
from pipesearch.costs import build_pipeline_costs
from pipesearch.errors import InfeasibleError
from pipesearch.hardware import load_cluster
from pipesearch.memory import offload_bytes_per_param, preset
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, simulate_times
from pipesearch.types import Job, Layer, ModelProfile

GB = 1e9


def _cluster(device_bytes: float, **kw):
    return replace(tiny_cluster(1, 8, memory_bytes=device_bytes), host=pcie_host(**kw))


# ------------------------------------------------------------- PCIe sharing


def test_two_gpus_under_one_switch_take_twice_as_long_as_one():
    """1 GB to the host: alone 1 / 25 = 0.04 s; GPUs 0 and 1 share switch
    0's 25 GB/s uplink, 12.5 GB/s each: 0.08 s, twice as long; GPUs 0 and 4
    sit under different switches: 0.04 s each."""
    cluster = load_cluster("1x8-rtx4090-pcie4")
    alone = host_lib.concurrent_transfers_s(cluster, {0: GB})
    assert alone[0] == pytest.approx(0.04)
    shared = host_lib.concurrent_transfers_s(cluster, {0: GB, 1: GB})
    assert shared[0] == pytest.approx(2 * alone[0]) and shared[1] == pytest.approx(0.08)
    apart = host_lib.concurrent_transfers_s(cluster, {0: GB, 4: GB})
    assert apart == pytest.approx({0: 0.04, 4: 0.04})
    four = host_lib.concurrent_transfers_s(cluster, {d: GB for d in range(4)})
    assert four[3] == pytest.approx(0.16)  # 25 / 4 = 6.25 GB/s each


def test_uplink_wider_than_a_gpu_link_caps_at_the_gpu_link():
    """A 50 GB/s uplink: two GPUs get min(25, 50 / 2) = 25 GB/s each."""
    host = pcie_host(switch_uplink_bytes_per_s=50 * GB)
    assert host_lib.shared_bandwidth_bytes_per_s(host, 2) == pytest.approx(25 * GB)
    assert host_lib.shared_bandwidth_bytes_per_s(host, 4) == pytest.approx(12.5 * GB)


def test_contention_reaches_the_offload_step_of_the_cost_model():
    """Two stages that must offload (1e9 parameters of 2 bytes each, 2
    layers): each step moves 2 B of gradient down and 2 B of weights up per
    parameter and runs Adam at 1e12 / 2 params/s (two GPUs share the CPU).
    Under one switch: 1e9 x (4 / 12.5e9 + 2 / 1e12) = 0.322 s; under two
    switches: 1e9 x (4 / 25e9 + 2 / 1e12) = 0.162 s."""
    prof = ModelProfile(name="p", layers=tuple(
        Layer(name=f"l{k}", fwd_s=1.0, bwd_s=2.0, param_bytes=2e9, output_bytes=0.0, saved_bytes=0.0)
        for k in range(2)), profiled_batch_size=1, bytes_per_param=2.0)
    cluster = _cluster(12 * GB, cpu_adam_params_per_s=1e12)  # 16 GB of state per stage on the GPU: too much
    job = Job(global_batch_size=2, memory_reserve_bytes=0, optimizer_offload=True)
    for devices, want in (((0, 1), 0.322), ((0, 4), 0.162)):
        costs = build_pipeline_costs(prof, cluster, job, pp=2, dp=1, micro_batch_size=1, num_micro_batches=2,
                                     schedule="1f1b", placement=np.array([[d] for d in devices]),
                                     optimizer_offload=True)
        assert [costs.option_name(s, s, s + 1) for s in range(2)] == ["offload", "offload"]
        assert costs.host_step_s(0, 0, 1) == pytest.approx(want)
        assert costs.memory_bytes(0, 0, 1) == pytest.approx(4 * 1e9)  # 2 + 2 B on the GPU
        times = costs.stage_times(np.array([0, 1, 2]))
        assert times.allreduce_s == pytest.approx([want, want])


# ------------------------------------------------------------- memory


def test_offload_bytes_follow_zero_offload():
    """mixed-adam: GPU 2 + 2, host 4 + 8 + 4 = 16 (ZeRO-Offload Fig. 2);
    zero1 over 4 replicas: the host part is a quarter, 4 B."""
    assert offload_bytes_per_param(preset("mixed-adam"), 1) == (4.0, 16.0)
    assert offload_bytes_per_param(preset("mixed-adam", "zero1"), 4) == (4.0, 4.0)


def test_host_memory_is_checked_per_stage_share():
    """Two layers of 1e9 parameters on 2 of 8 GPUs (pp 2): 16 GB of host
    state per stage. A host of 40 GB gives each of the 2 GPUs of the plan
    20 GB: fits; a host of 30 GB gives 15 GB: no plan."""
    prof = ModelProfile(name="p", layers=tuple(
        Layer(name=f"l{k}", fwd_s=1.0, bwd_s=2.0, param_bytes=2e9, output_bytes=0.0, saved_bytes=0.0)
        for k in range(2)), profiled_batch_size=1, bytes_per_param=2.0)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=2, schedules=("1f1b",), top=1)
    job = Job(global_batch_size=2, memory_reserve_bytes=0, optimizer_offload=True)
    plan = search([ModelVariant(prof)], _cluster(10 * GB, memory_bytes=40 * GB), job, opts).plans[0]
    assert [st.memory_option for st in plan.stages] == ["offload", "offload"]
    with pytest.raises(InfeasibleError):
        search([ModelVariant(prof)], _cluster(10 * GB, memory_bytes=30 * GB), job, opts)
    # without the option nothing fits on the 10 GB GPUs (16 GB of state per stage)
    with pytest.raises(InfeasibleError):
        search([ModelVariant(prof)], _cluster(10 * GB, memory_bytes=40 * GB),
               replace(job, optimizer_offload=False), opts)


# ------------------------------------------------------------- brute force


def _hand(prof, bounds, options, in_flight, capacity, host_share, step_per_param):
    fwd, bwd, after, ok = [], [], [], True
    for s, (i, j) in enumerate(zip(bounds[:-1], bounds[1:])):
        lay = prof.layers[i:j]
        params = sum(x.param_bytes for x in lay) / 2  # 2 bytes per parameter
        off = options[s] == "offload"
        dev = params * (4 if off else 16) + sum(x.saved_bytes for x in lay) * in_flight[s]
        ok &= dev <= capacity and (params * 16 <= host_share if off else True)
        fwd.append(sum(x.fwd_s for x in lay))
        bwd.append(sum(x.bwd_s for x in lay))
        # offloaded: the CPU's step and its copies; on the device: 28 B per parameter at 0.8 x tiny_device's 1e12 B/s
        after.append(params * step_per_param if off else params * 28 / 0.8e12)
    S = len(fwd)
    return ok, StageTimes(fwd_s=np.array(fwd), bwd_s=np.array(bwd), bwd_input_s=np.array(bwd) / 2,
                          p2p_s=np.zeros(S - 1), allreduce_s=np.array(after))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_equals_brute_force_with_offload_options(seed):
    """Random layers on 3 GPUs under one switch: every split x every
    per-stage choice (on device / offloaded), times by hand (step = 4 B per
    parameter over 25 / 3 GB/s + 3 / 1e9 s of CPU Adam per parameter
    offloaded, 28 B per parameter at 0.8 TB/s on the GPU), simulated; the
    search's best equals the least."""
    rng = np.random.default_rng(seed)
    L, pp, m = 6, 3, 4
    params = (rng.uniform(0.1, 0.6, L) * 1e9 * 2).tolist()  # bytes
    saved = (rng.uniform(0.2, 1.0, L) * GB).tolist()
    prof = ModelProfile(name="p", layers=tuple(
        Layer(name=f"l{k}", fwd_s=float(rng.uniform(0.5, 2)), bwd_s=float(rng.uniform(1, 4)),
              param_bytes=params[k], output_bytes=0.0, saved_bytes=saved[k]) for k in range(L)),
        profiled_batch_size=1, bytes_per_param=2.0)
    capacity = 12 * GB
    cluster = replace(tiny_cluster(1, 3, memory_bytes=capacity),
                      host=pcie_host(pcie_switches=((0, 1, 2),), memory_bytes=60 * GB))
    step = 4 / (25 * GB / 3) + 3 / 1e9
    in_flight = [min(m, pp - s) for s in range(pp)]
    best, arg = np.inf, []
    for bounds in all_splits(L, pp):
        for options in itertools.product(("on-device", "offload"), repeat=pp):
            ok, times = _hand(prof, bounds, options, in_flight, capacity, 20 * GB, step)
            if ok:
                t = simulate_times("1f1b", pp, m, 1, times)[0]
                if t < best:
                    best, arg = t, [(bounds, options)]
    job = Job(global_batch_size=m, memory_reserve_bytes=0, optimizer_offload=True)
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("1f1b",), top=1)
    plan = search([ModelVariant(prof)], cluster, job, opts).plans[0]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    assert any("offload" in o for o in arg[0][1])  # the case needs offloading somewhere


def test_offload_flag_needs_a_host_table(tmp_path):
    from click.testing import CliRunner

    from pipesearch.cli import main

    r = CliRunner().invoke(main, ["plan", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--optimizer-offload"])
    assert r.exit_code == 2
    assert "--optimizer-offload" in r.output and "[host]" in r.output


def test_offload_plan_file_round_trip_and_replay(tmp_path):
    """The plan file of an offloaded Qwen3-32B plan: valid, each stage's
    memory_option and host_step_s kept, and replaying its stages in the
    simulator (the host step is part of each stage's after-backward term)
    gives the predicted time."""
    from click.testing import CliRunner

    from pipesearch.cli import main
    from pipesearch.plan import load_plan_file
    from pipesearch.point_plan import simulate_plan

    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "64",
                                  "--pp", "8", "--tp", "1", "--dp", "1", "--schedule", "1f1b", "--recompute", "full",
                                  "--micro-batch-size", "1", "--optimizer-offload", "--top", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "optimizer offload" in r.output and "8/8 stages" in r.output
    plan = load_plan_file(out).plans[0]
    assert all(st.memory_option == "offload" and st.host_step_s > 0 for st in plan.stages)
    assert all(st.allreduce_s >= st.host_step_s for st in plan.stages)
    assert simulate_plan(plan)[0] == pytest.approx(plan.predicted.iteration_time_s, rel=1e-9)
    # 32.76e9 parameters x 16 B = 524e9 of host state within 800e9
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0


# ------------------------------------------------------------- streamed weights


def _stream_profile(fwd, bwd, param_bytes, saved):
    return ModelProfile(name="s", layers=tuple(
        Layer(name=f"l{k}", fwd_s=fwd[k], bwd_s=bwd[k], param_bytes=param_bytes[k], output_bytes=0.0,
              saved_bytes=saved[k]) for k in range(len(fwd))), profiled_batch_size=1, bytes_per_param=2.0)


def test_streamed_layer_times_by_hand():
    """Two GPUs under one switch (12.5 GB/s each), a stage of two layers of
    2.5e9 weight bytes (1.25e9 parameters): forward max(1 s, 2.5e9 / 12.5e9
    = 0.2 s) = 1 s and max(0.1 s, 0.2 s) = 0.2 s; backward max(2 s, 0.4 s)
    and max(0.2 s, 0.4 s) = 0.4 s. The device keeps 2 layers x (weights +
    gradients) = 2 x 5e9 = 10e9 bytes of buffers; Adam on the CPU: 2.5e9
    parameters x 2 GPUs / 1e10 params/s = 0.5 s after the last backward."""
    prof = _stream_profile([1.0, 0.1, 1.0, 1.0], [2.0, 0.2, 2.0, 2.0], [2.5e9] * 4, [0.0] * 4)
    cluster = _cluster(12 * GB, cpu_adam_params_per_s=1e10)  # 2 layers x 16 B x 1.25e9 = 40e9 do not fit
    job = Job(global_batch_size=2, memory_reserve_bytes=0, weight_streaming=True)
    costs = build_pipeline_costs(prof, cluster, job, pp=2, dp=1, micro_batch_size=1, num_micro_batches=2,
                                 schedule="1f1b", placement=np.array([[0], [1]]), weight_streaming=True)
    assert costs.option_name(0, 0, 2) == "stream"
    assert costs.fwd_s(0, 0, 2) == pytest.approx(1.2)
    assert costs.bwd_s(0, 0, 2) == pytest.approx(2.4)
    assert costs.memory_bytes(0, 0, 2) == pytest.approx(10e9)
    assert costs.host_step_s(0, 0, 2) == pytest.approx(0.5)
    # under different switches each GPU copies at 25 GB/s: the short layer's forward is max(0.1, 0.1)
    apart = build_pipeline_costs(prof, cluster, job, pp=2, dp=1, micro_batch_size=1, num_micro_batches=2,
                                 schedule="1f1b", placement=np.array([[0], [4]]), weight_streaming=True)
    assert apart.fwd_s(0, 0, 2) == pytest.approx(1.1)
    assert apart.bwd_s(0, 0, 2) == pytest.approx(2.2)


@pytest.mark.parametrize("seed,capacity_gb", [(0, 18), (1, 12), (2, 14)])
def test_search_equals_brute_force_with_streamed_weights(seed, capacity_gb):
    """Every split x every per-stage choice (on device / streamed) on 3
    GPUs under one switch (25 / 3 GB/s each), times by hand, simulated;
    the search (with --stream-weights) finds the least."""
    rng = np.random.default_rng(10 + seed)
    L, pp, m = 6, 3, 4
    params = (rng.uniform(0.2, 0.8, L) * 1e9 * 2).tolist()
    saved = (rng.uniform(0.2, 1.0, L) * GB).tolist()
    fwd, bwd = rng.uniform(0.1, 0.4, L).tolist(), rng.uniform(0.2, 0.8, L).tolist()
    prof = _stream_profile(fwd, bwd, params, saved)
    capacity = capacity_gb * GB
    host = pcie_host(pcie_switches=((0, 1, 2),), memory_bytes=300 * GB, cpu_adam_params_per_s=1e10)
    cluster = replace(tiny_cluster(1, 3, memory_bytes=capacity), host=host)
    bw = 25 * GB / 3
    in_flight = [min(m, pp - s) for s in range(pp)]
    best, arg = np.inf, []
    for bounds in all_splits(L, pp):
        for options in itertools.product(("on-device", "stream"), repeat=pp):
            F, B, I, R, ok = [], [], [], [], True
            for s, (i, j) in enumerate(zip(bounds[:-1], bounds[1:])):
                st = options[s] == "stream"
                f = [max(fwd[x], params[x] / bw) if st else fwd[x] for x in range(i, j)]
                b = [max(bwd[x], 2 * params[x] / bw) if st else bwd[x] for x in range(i, j)]
                F.append(sum(f))
                B.append(sum(b))
                I.append(sum(b) / 2)
                n = sum(params[i:j]) / 2
                R.append(n * 3 / 1e10 if st else 0.0)
                act = sum(saved[i:j]) * in_flight[s]
                dev = act + (2 * 2 * max(params[i:j]) if st else 16 * n)
                ok &= dev <= capacity and (n * 18 <= 100 * GB if st else True)
            if ok:
                t = simulate_times("1f1b", pp, m, 1, StageTimes(np.array(F), np.array(B), np.array(I),
                                                               np.zeros(pp - 1), np.array(R)))[0]
                if t < best:
                    best, arg = t, [(bounds, options)]
    job = Job(global_batch_size=m, memory_reserve_bytes=0, weight_streaming=True)
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("1f1b",), top=1)
    plan = search([ModelVariant(prof)], cluster, job, opts).plans[0]
    assert np.isfinite(best) and any("stream" in o for o in arg[0][1])
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)


def test_offloaded_optimizer_takes_the_tied_copys_state_too():
    """GPT-3 6.7B, pp 4 on RTX 4090s: the last stage keeps a copy of the tied
    embedding, 50,304 (padded vocabulary) x 4,096 = 206,045,184 parameters.
    On the device with mixed-precision Adam it holds 16 B each
    (3,296,722,944 B); with the optimizer offloaded the 16-bit weights and
    gradients stay, 4 B each (824,180,736 B), and the rest moves to the host
    as the stage's own state does (ZeRO-Offload)."""
    args = ["plan", "--model", "gpt3-6.7b", "--cluster", "1x8-rtx4090-pcie4", "-b", "16", "--tp", "1", "--pp", "4",
            "--dp", "2", "--schedule", "1f1b", "--micro-batch-size", "1", "--num-micro-batches", "8",
            "--recompute", "full", "--split", "9,8,8,9", "--json"]
    res = CliRunner().invoke(main, args + ["--optimizer-offload"])
    assert res.exit_code == 0, res.output
    last = json.loads(res.output)["plans"][0]["stages"][3]
    assert last["memory_option"] == "offload"
    assert last["memory_breakdown_bytes"]["tied_copy"] == 206_045_184 * 4
    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-6.7b", "--cluster", "1x8-a100-80gb", *args[5:]])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["plans"][0]["stages"][3]["memory_breakdown_bytes"]["tied_copy"] == 206_045_184 * 16


ONE_4090 = rtx4090_cluster_toml(1, "[[0]]", host_memory_gb=128, name="one-4090")


def test_out_of_memory_names_the_next_host_flag_that_plans(tmp_path):
    """Llama-2 7B on one 24 GB GPU with host memory: its 16 B/param state
    (100 GiB) needs --optimizer-offload; offloaded, its 16-bit weights and
    gradients (4 B/param, 25 GiB) still exceed the 21.8 GiB usable, so the
    refusal names --stream-weights, with which a plan comes back."""
    cluster = tmp_path / "c.toml"
    cluster.write_text(ONE_4090)
    base = ["plan", "--model", "llama2-7b", "--cluster", str(cluster), "-b", "32", "-q"]
    res = CliRunner().invoke(main, base)
    assert res.exit_code == 2 and "add --optimizer-offload" in res.output, res.output
    res = CliRunner().invoke(main, base + ["--optimizer-offload"])
    assert res.exit_code == 2 and "add --stream-weights" in res.output, res.output
    assert "--optimizer-offload (this" not in res.output
    res = CliRunner().invoke(main, base + ["--optimizer-offload", "--stream-weights"])
    assert res.exit_code == 0, res.output



GPT_10_LAYERS = """[transformer]
kind = "decoder"
num_layers = 10
hidden_size = 4096
num_attention_heads = 16
ffn_hidden_size = 16384
vocab_size = 50257
tied_embeddings = true
seq_len = 1024
max_position_embeddings = 1024
"""


def test_closed_form_split_with_stage_options_is_the_brute_force_one(tmp_path, monkeypatch):
    """A 10-layer GPT (h 4096) on 1x8-rtx3090-pcie3 with the optimizer in
    host memory and its step delayed: every closed-form split
    (partition.optimal_split, a starting split of each search) is the best
    split under the analytic time and the closed form's own memory test,
    found by brute force over every split, and the plan ends. The band's
    terms were once shared by stages of the same links and device whatever
    their memory, so a stage read the option another stage's memory chose:
    the passes never ended on this command (now an internal error would
    say so)."""
    import math

    from pipesearch import partition, split_search
    from pipesearch.partition import _stage_fits

    checked, wrong = [], []
    closed_form = partition.optimal_split

    def checked_split(costs):
        got = closed_form(costs)
        L, pp = costs.num_layers, costs.pp
        if costs.options is not None and math.comb(L - 1, pp - 1) <= 500:
            fitting = [b for b in all_splits(L, pp) if all(_stage_fits(costs, s, b[s], b[s + 1]) for s in range(pp))]
            want = min((costs.iteration_time_s(b) for b in fitting), default=None)
            checked.append(pp)
            if (got is None) != (want is None) or (got is not None and got.iteration_time_s > want * (1 + 1e-12)):
                wrong.append((pp, got, want))
        return got

    monkeypatch.setattr(split_search, "optimal_split", checked_split)
    (tmp_path / "gpt.toml").write_text(GPT_10_LAYERS)
    r = CliRunner().invoke(main, ["plan", "-q", "--model", str(tmp_path / "gpt.toml"), "--cluster",
                                  "1x8-rtx3090-pcie3", "--optimizer-offload", "--delayed-optimizer-step"])
    assert r.exit_code == 0, r.output
    assert len(checked) >= 10 and 8 in checked and not wrong
