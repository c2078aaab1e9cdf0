"""Offload only where memory requires it (docs/offload.md, "Only where
memory requires it"): at equal times a stage keeps its state on the GPU
(option_search.prefer_device_state), and near-tied plans rank by bytes
over PCIe before peak memory (ranking.rank_plans).

Oracles: stage memory, times, host step and PCIe bytes written out by hand
from the layer table and the host table.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from helpers import pcie_host, tiny_cluster
from pipesearch.search import search
from pipesearch.ranking import rank_plans
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job, Layer, ModelProfile

GB = 1e9


def _one_layer() -> ModelProfile:
    """One layer: 2e9 parameter bytes (1e9 parameters at 2 B: 16 GB of
    mixed-precision Adam state on the GPU, 4 GB offloaded), 2 GB saved per
    micro-batch, F 0.2 s, B 0.4 s; no recompute columns (chains ``on-device,
    act-host`` crossed with the optimizer offload)."""
    return ModelProfile(name="tie", layers=(Layer(name="l0", fwd_s=0.2, bwd_s=0.4, param_bytes=2e9,
                                                  output_bytes=0.0, saved_bytes=2 * GB),),
                        profiled_batch_size=1, bytes_per_param=2.0)


def _plan(capacity_gb: float):
    cluster = replace(tiny_cluster(1, 8, memory_bytes=capacity_gb * GB), host=pcie_host())
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True, optimizer_offload=True)
    opts = SearchOptions(pp=1, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("gpipe",), top=1)
    return search([ModelVariant(_one_layer())], cluster, job, opts).plans[0]


# host step (ZeRO-Offload): 1e9 parameters x (2 + 2 B over 25 GB/s + 1 / 1e9 Adam per s) = 0.16 + 1 = 1.16 s
STEP_S = 1e9 * (4 / 25e9 + 1 / 1e9)


def test_equal_times_keep_the_activations_on_the_gpu():
    """20 GB GPU, GPipe, m = 6 (6 micro-batches in flight). On the device:
    16 + 6 x 2 = 28 GB (no); activations on the host: 16 + 3 x 2 = 22 GB
    (no); optimizer offloaded: 4 + 12 = 16 GB (fits); both offloaded: 4 + 6
    = 10 GB (fits). The copy, 2 GB / 25 GB/s = 0.08 s, hides under F and B,
    so both fitting options take 6 x 0.6 + 1.16 = 4.76 s: the plan keeps
    the activations on the GPU and moves only the optimizer's 4 GB (2 B of
    gradients out, 2 B of weights in per parameter), not 4 + 2 x 6 x 2 =
    28 GB."""
    plan = _plan(20)
    assert [st.memory_option for st in plan.stages] == ["on-device+offload"]
    assert plan.predicted.iteration_time_s == pytest.approx(6 * 0.6 + STEP_S)
    assert plan.stages[0].memory_bytes == pytest.approx(16 * GB)
    host = dict(plan.extra)["host"]
    assert host["total_pcie_bytes_per_iteration"] == pytest.approx(4 * GB)
    assert "activation_pcie_bytes_per_iteration" not in host


def test_activations_go_to_the_host_where_memory_requires_it():
    """12 GB GPU: the optimizer offloaded alone needs 16 GB (no), with the
    activations on the host too 10 GB: both offload, at the same 4.76 s
    (the copies hide), 4 + 24 = 28 GB over PCIe."""
    plan = _plan(12)
    assert [st.memory_option for st in plan.stages] == ["act-host+offload"]
    assert plan.predicted.iteration_time_s == pytest.approx(6 * 0.6 + STEP_S)
    assert plan.stages[0].memory_bytes == pytest.approx(10 * GB)
    host = dict(plan.extra)["host"]
    assert host["total_pcie_bytes_per_iteration"] == pytest.approx(28 * GB)
    assert host["activation_pcie_bytes_per_iteration"] == pytest.approx([24 * GB])


def test_near_tied_plans_rank_fewer_pcie_bytes_before_lower_memory():
    """Two plans 0.05% apart (inside the 0.1% window): the one moving
    nothing over PCIe ranks first although the other needs less memory;
    outside the window time decides."""
    base = _plan(20)
    keep = replace(base, extra=tuple((k, v) for k, v in base.extra if k != "host"),
                   predicted=replace(base.predicted, iteration_time_s=10.005, peak_memory_bytes=18 * GB))
    offload = replace(base, predicted=replace(base.predicted, iteration_time_s=10.0, peak_memory_bytes=10 * GB))
    assert rank_plans([offload, keep])[0] is keep
    slow = replace(keep, predicted=replace(keep.predicted, iteration_time_s=10.02))
    assert rank_plans([slow, offload])[0] is offload


def _costs(capacity_gb: float):
    import numpy as np

    from pipesearch.costs import build_pipeline_costs

    cluster = replace(tiny_cluster(1, 8, memory_bytes=capacity_gb * GB), host=pcie_host())
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True, optimizer_offload=True)
    return job, build_pipeline_costs(_one_layer(), cluster, job, pp=1, dp=1, micro_batch_size=1,
                                     num_micro_batches=6, schedule="gpipe", placement=np.array([[0]]),
                                     optimizer_offload=True)


def test_the_tie_rule_moves_a_stage_to_the_chain_that_keeps_its_activations():
    """The device-first chain (``on-device, act-host, act-host+offload``)
    reaches ``act-host+offload`` at the same terms as the offload-first
    chain's ``on-device+offload`` (copies hidden): the rule moves the stage
    to offload-first (4 GB over PCIe instead of 28 GB); with 12 GB only the
    device-first option fits and it stays."""
    from pipesearch.option_search import prefer_device_state, with_policies
    from pipesearch.stage_options import DEVICE_FIRST

    bounds = (0, 1)
    job, costs = _costs(20)
    dev = with_policies(costs, (DEVICE_FIRST,))
    assert dev.option_name(0, 0, 1) == "act-host+offload"
    kept = prefer_device_state(dev, bounds, job, 1)
    assert kept.option_name(0, 0, 1) == "on-device+offload"
    assert float(kept.compute_s(0, 0, 1)) == pytest.approx(0.6) and float(kept.host_step_s(0, 0, 1)) == \
        pytest.approx(STEP_S)
    job, costs = _costs(12)
    dev = with_policies(costs, (DEVICE_FIRST,))
    assert prefer_device_state(dev, bounds, job, 1).option_name(0, 0, 1) == "act-host+offload"
