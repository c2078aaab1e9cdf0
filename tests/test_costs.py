"""Cost-model pieces checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pipesearch.costs import allreduce_model, state_bytes_per_param
from pipesearch.types import Cluster, DeviceGroup, DeviceSpec, Job, Link


def test_zero1_shards_only_the_optimizer_state():
    """Mixed-precision Adam: 16 bytes per parameter, 12 of them optimizer
    state (fp32 master, momentum, variance). ZeRO-1 with dp = 4 keeps
    4 + 12 / 4 = 7 bytes per parameter on each device (Rajbhandari et al.)."""
    assert state_bytes_per_param(Job(64), 4) == 16
    assert state_bytes_per_param(Job(64, zero1=True), 4) == pytest.approx(7.0)
    assert state_bytes_per_param(Job(64, zero1=True), 1) == 16


def _cluster(nodes, per_node, intra_gbps=100.0, inter_gbps=10.0):
    dev = DeviceSpec("d", 16 * 2**30, 100e12, 10e12, 1e12)
    return Cluster("c", (DeviceGroup(dev, nodes, per_node),), Link(intra_gbps * 1e9, 0.0), Link(inter_gbps * 1e9, 0.0))


def test_ring_allreduce_inside_a_node():
    """4 devices on one node, 100 GB/s: ring all-reduce of B bytes takes
    2 (d-1)/d B / bw = 1.5 B / 1e11 s (Patarasuk & Yuan 2009)."""
    per_byte, fixed = allreduce_model(_cluster(1, 4), np.arange(4))
    assert per_byte == pytest.approx(1.5 / 100e9) and fixed == 0.0


def test_hierarchical_allreduce_across_nodes():
    """2 nodes x 4 devices (intra 100 GB/s, inter 10 GB/s). A flat ring is
    paced by the inter-node link: 2 * 7/8 / 10e9 = 1.75e-10 s per byte.
    Hierarchical: reduce-scatter + all-gather inside nodes 2 * 3/4 / 100e9 =
    1.5e-11, plus a ring across the 2 nodes on a quarter of the bytes
    2 * 1/2 / (4 * 10e9) = 2.5e-11: 4.0e-11 s per byte, which wins."""
    per_byte, _ = allreduce_model(_cluster(2, 4), np.arange(8))
    assert per_byte == pytest.approx(4.0e-11)


def test_device_memory_shares_of_interleaved_chunks():
    """6 stages on 2 devices (vp 3, stage s on device s % 2), model state
    S = 6 layers x 1 param x 4 B/param = 24 B, activations A = 6 B per
    micro-batch, in-flight 3, 2, 1, 1, 1, 1: device 0 (stages 0, 2, 4; N = 5)
    gives its chunks (S + n A) / (3 S + N A) = 42/102, 30/102, 30/102;
    device 1 (N = 4) 36/96, 30/96, 30/96. Without state or activations: 1/3."""
    from helpers import tiny_profile
    from pipesearch.costs import device_memory_shares

    prof = tiny_profile([1e-3] * 6, params=[1.0] * 6, saved=[1.0] * 6)
    got = device_memory_shares(prof, np.array([3, 2, 1, 1, 1, 1.0]), 3, 4.0, 1.0)
    assert np.allclose(got, [42 / 102, 36 / 96, 30 / 102, 30 / 96, 30 / 102, 30 / 96])
    assert np.allclose(device_memory_shares(tiny_profile([1e-3] * 6), np.ones(6), 3, 4.0, 1.0), 1 / 3)
    assert np.allclose(device_memory_shares(prof, np.ones(2), 1, 4.0, 1.0), 1.0)


def test_send_s_by_hand():
    """One transfer over the boundary after stage ``s`` ending at layer
    ``j``: ``latency_s + output_bytes[j - 1] / bandwidth_s`` (layer 0's
    output for ``j = 0``), 0 after the last stage and at or past the last
    layer; stage 0's link 1 KB/s and 1 ms, stage 1's 2 KB/s and 0, outputs
    100 .. 500 bytes over 5 layers, 3 stages."""
    from helpers import make_costs

    costs = make_costs(times=(1.0,) * 5, pp=3, m=4, outputs=(100, 200, 300, 400, 500),
                       link_bandwidth=(1e3, 2e3, 5e3), link_latency=(1e-3, 0.0, 7.0))
    assert costs.send_s(0, 2) == pytest.approx(1e-3 + 200 / 1e3)
    assert costs.send_s(1, 4) == pytest.approx(400 / 2e3)
    assert costs.send_s(0, 0) == pytest.approx(1e-3 + 100 / 1e3)
    assert costs.send_s(2, 3) == 0.0  # the last stage sends nothing, whatever its link
    assert costs.send_s(0, 5) == 0.0 and costs.send_s(1, 7) == 0.0  # at or past the last layer
    got = costs.send_s(np.array([[0], [1], [2]]), np.array([[1, 3, 5]]))
    want = [[1e-3 + 100 / 1e3, 1e-3 + 300 / 1e3, 0.0], [100 / 2e3, 300 / 2e3, 0.0], [0.0, 0.0, 0.0]]
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_a_stage_of_layers_without_backward_has_zero_backward():
    """Forward 0.1 s each, backward 0.1, 0 and 0 s: the prefix sums of
    forward + backward (0.2, 0.3, 0.4) minus those of forward (0.1, 0.2,
    0.3) leave -2.8e-17 and -5.6e-17 for the stages of the last two layers
    and of the last one; their backward is 0, never negative (the simulator
    refuses negative times), and the first layer's is 0.1 s."""
    from pipesearch.costs import build_pipeline_costs, pipeline_placement
    from pipesearch.timemodel import simulate_times

    from helpers import tiny_cluster, tiny_profile

    prof = tiny_profile([0.1, 0.1, 0.1], [0.1, 0.0, 0.0])
    job = Job(global_batch_size=2, state_bytes_per_param=2.0, memory_reserve_bytes=0)
    costs = build_pipeline_costs(prof, tiny_cluster(1, 2, memory_bytes=1e15), job, pp=2, dp=1, micro_batch_size=1,
                                 num_micro_batches=2, schedule="1f1b", placement=pipeline_placement(2, 1),
                                 in_flight=np.array([2, 1]))
    assert costs.bwd_s(1, 1, 3) == 0.0 and costs.bwd_s(1, 2, 3) == 0.0
    assert costs.bwd_s(0, 0, 1) == pytest.approx(0.1, rel=1e-12)
    simulate_times("1f1b", 2, 2, 1, costs.stage_times(np.array([0, 2, 3])))
