"""The optimizer step on the CPU one iteration late (Job.delayed_optimizer_step,
pipesearch.timemodel.delayed_host_time_s): the steady-state iteration is
max(GPU iteration, host work) instead of their sum.

Oracles: a 1F1B timeline traced by hand and the offloaded step written out
from the host table (4 B per parameter over the PCIe share + CPU Adam).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from helpers import tiny_cluster
from pipesearch.search import search
from pipesearch.point_plan import simulate_plan
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, iteration_time_s, simulate_times
from pipesearch.types import HostSpec, Job, Layer, ModelProfile

GB = 1e9


def _case(adam_params_per_s: float):
    """Two layers of 1e9 parameters (2 B each), F 1 s, B 2 s; 12 GB GPUs
    (16 GB of state per stage on the GPU: both must offload); GPUs 0 and 1
    under one switch (12.5 GB/s each); CPU Adam shared by the two GPUs."""
    prof = ModelProfile(name="p", layers=tuple(
        Layer(name=f"l{k}", fwd_s=1.0, bwd_s=2.0, param_bytes=2e9, output_bytes=0.0, saved_bytes=0.0)
        for k in range(2)), profiled_batch_size=1, bytes_per_param=2.0)
    host = HostSpec(memory_bytes=800 * GB, pcie_generation=4, pcie_lanes_per_gpu=16,
                    host_to_device_bytes_per_s=25 * GB, switch_uplink_bytes_per_s=25 * GB,
                    pcie_switches=((0, 1, 2, 3),), cpu_adam_params_per_s=adam_params_per_s)
    cluster = replace(tiny_cluster(1, 4, memory_bytes=12 * GB), host=host)
    return prof, cluster


def _plan(adam, delayed):
    prof, cluster = _case(adam)
    job = Job(global_batch_size=2, memory_reserve_bytes=0, optimizer_offload=True, delayed_optimizer_step=delayed)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=2, schedules=("1f1b",), top=1)
    return search([ModelVariant(prof)], cluster, job, opts).plans[0]


@pytest.mark.parametrize("adam,step,plain,delayed", [
    (1e8, 20.32, 29.32, 20.32),  # host-bound: the step hides the GPU iteration
    (1e12, 0.322, 9.322, 9.0),  # GPU-bound: the step hides under the next iteration
])
def test_delayed_step_overlaps_the_next_iteration(adam, step, plain, delayed):
    """1F1B, pp 2, m 2, traced by hand: stage 0 F [0,1] [1,2], B [4,6]
    [7,9]; stage 1 F [1,2] [4,5], B [2,4] [5,7]: the GPUs end at 9 and 7.
    Each stage's step: 1e9 x (4 / 12.5e9 + 2 / adam). Step after the last
    backward: T = max(9, 7) + step... = 9 + step. Delayed: T = max(9,
    step) (each rank runs one stage's step per iteration)."""
    p = _plan(adam, False)
    assert [st.host_step_s for st in p.stages] == pytest.approx([step, step])
    assert p.predicted.iteration_time_s == pytest.approx(plain)
    d = _plan(adam, True)
    assert d.predicted.iteration_time_s == pytest.approx(delayed)
    assert [st.host_step_s for st in d.stages] == pytest.approx([step, step])
    assert [st.allreduce_s for st in d.stages] == pytest.approx([0.0, 0.0])  # nothing after the backward
    extra = dict(d.extra)
    assert extra["optimizer_step"] == "delayed" and extra["optimizer_staleness_steps"] == 1
    assert simulate_plan(d)[0] == pytest.approx(delayed)  # the plan replays with its delayed step


def test_time_model_takes_the_larger_of_gpu_and_host():
    """The definition on hand times: rank sums of the delayed host work
    (stages 0 and 2 on rank 0 of pp 2: 3 + 4 = 7 s) against the GPU
    iteration, in the graph evaluator, the simulator and GPipe's closed form."""
    S = 4
    base = StageTimes(fwd_s=np.ones(S), bwd_s=np.full(S, 2.0), bwd_input_s=np.ones(S), p2p_s=np.zeros(S - 1),
                      allreduce_s=np.zeros(S))
    gpu = iteration_time_s("looped-bfs", 2, 2, 2, base)
    slow = replace(base, delayed_host_s=np.array([3.0, 1.0, 4.0, 1.0]) * gpu)
    assert iteration_time_s("looped-bfs", 2, 2, 2, slow) == pytest.approx(7 * gpu)
    assert simulate_times("looped-bfs", 2, 2, 2, slow)[0] == pytest.approx(7 * gpu)
    fast = replace(base, delayed_host_s=np.full(S, 0.1))
    assert iteration_time_s("looped-bfs", 2, 2, 2, fast) == pytest.approx(gpu)
    g = StageTimes(fwd_s=np.ones(2), bwd_s=np.full(2, 2.0), bwd_input_s=np.ones(2), p2p_s=np.zeros(1),
                   allreduce_s=np.zeros(2), delayed_host_s=np.array([50.0, 1.0]))
    assert iteration_time_s("gpipe", 2, 3, 1, g) == pytest.approx(50.0)
    assert simulate_times("gpipe", 2, 3, 1, g)[0] == pytest.approx(50.0)


def test_delayed_flag_needs_a_host_step():
    from click.testing import CliRunner

    from pipesearch.cli import main

    r = CliRunner().invoke(main, ["plan", "--model", "vgg16", "--cluster", "1x8-rtx4090-pcie4",
                                  "--delayed-optimizer-step"])
    assert r.exit_code == 2
    assert "--delayed-optimizer-step" in r.output and "--optimizer-offload" in r.output
    assert "Traceback" not in r.output


def test_delayed_flag_where_no_stage_offloads_says_so():
    """--optimizer-offload lets a stage keep its optimizer on the host where
    it does not fit: GPT-3 1.3B on eight 24 GB RTX 4090 at dp 8 fits with
    every optimizer on the GPUs (a stage's host step is 0 in the plan file),
    so --delayed-optimizer-step delays nothing there, and a line says so
    (the flag passed without a word); Qwen3-32B on the same cluster
    offloads (a host step above 0) and gets no such line."""
    import json

    from click.testing import CliRunner

    from pipesearch.cli import main

    args = ["plan", "-q", "--cluster", "1x8-rtx4090-pcie4", "--optimizer-offload", "--delayed-optimizer-step",
            "--top", "2"]
    small = ["--model", "gpt3-1.3b", "-b", "64", "--pp", "1", "--dp", "8", "--sharding", "zero1"]
    plans = json.loads(CliRunner().invoke(main, [*args, *small, "--json"]).output)["plans"]
    assert plans and all(st.get("host_step_s", 0.0) == 0.0 for p in plans for st in p["stages"])
    out = CliRunner().invoke(main, [*args, *small]).output
    assert "--delayed-optimizer-step: plans 1, 2 keep every stage's optimizer on the GPUs" in out
    large = ["--model", "qwen3-32b", "--global-batch-size", "512"]
    plans = json.loads(CliRunner().invoke(main, [*args, *large, "--json"]).output)["plans"]
    assert all(any(st.get("host_step_s", 0.0) > 0 for st in p["stages"]) for p in plans)
    assert "--delayed-optimizer-step:" not in CliRunner().invoke(main, [*args, *large]).output
