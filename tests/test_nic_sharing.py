"""Transfers that leave (or enter) one node share its network ports
(``nics_per_node``): all-reduce and point-to-point terms by hand, and the
cluster-file key."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import tiny_cluster
from pipesearch.errors import InputError
from pipesearch.hardware import load_cluster
from pipesearch.placement import allreduce_terms, boundary_links, nic_share
from pipesearch.types import Link

INTRA, INTER = 1e10, 1e9  # bytes/s; latencies 0 so the terms are bandwidth only


def _cluster(nics):
    return tiny_cluster(2, 4, intra=Link(INTRA, 0.0), inter=Link(INTER, 0.0, nics_per_node=nics))


def test_hierarchical_allreduce_shares_the_node_nic():
    """8 replicas, 4 on each of 2 nodes. Hierarchical: reduce-scatter and
    all-gather in the node, 2 (3/4) / INTRA per byte, then the 4 per-device
    rings of bytes / 4 across the 2 nodes, 2 (1/2) bytes / 4 each: with a
    NIC per device they run at INTER each, 2 (1/2) / (4 INTER); through one
    shared NIC at INTER / 4 each, 2 (1/2) / INTER. The flat ring crosses
    nodes once each way: 2 (7/8) / INTER per byte, slower in both cases."""
    heads = np.arange(8).reshape(1, 8)
    own, _ = allreduce_terms(_cluster(None), heads)
    shared, _ = allreduce_terms(_cluster(1), heads)
    assert own[0] == pytest.approx(2 * 3 / 4 / INTRA + 2 * 1 / 2 / (4 * INTER))
    assert shared[0] == pytest.approx(2 * 3 / 4 / INTRA + 2 * 1 / 2 / INTER)
    two, _ = allreduce_terms(_cluster(2), heads)  # two ports: two rings at a time
    assert two[0] == pytest.approx(2 * 3 / 4 / INTRA + 2 * 1 / 2 / (2 * INTER))


def test_parallel_boundary_transfers_share_the_nic():
    """pp 2 x dp 4, stage 0 on node 0 (devices 0-3), stage 1 on node 1
    (4-7): the 4 replicas' activations leave node 0 together. One NIC per
    node: INTER / 4 each; a NIC per device: INTER each. A ring over devices
    0, 4, 1, 5 (alternating nodes) sends 2 transfers out of each node."""
    heads = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    bw_shared, _ = boundary_links(_cluster(1), heads)
    bw_own, _ = boundary_links(_cluster(None), heads)
    assert bw_shared[0] == pytest.approx(INTER / 4) and bw_own[0] == pytest.approx(INTER)
    assert np.isinf(bw_shared[1])  # after the last stage: no transfer
    ring = np.array([[0, 4, 1, 5]])
    assert nic_share(_cluster(1), ring, np.roll(ring, -1, axis=1))[0] == pytest.approx(0.5)
    assert nic_share(_cluster(4), ring, np.roll(ring, -1, axis=1))[0] == 1.0
    # transfers inside one node never share the network ports
    assert nic_share(_cluster(1), np.array([[0, 1]]), np.array([[1, 2]]))[0] == 1.0


def test_catalog_cluster_with_one_shared_nic():
    """The 4x4-v100-10gbe file says the four GPUs of a server share its
    10 GbE NIC; the DGX-style A100 cluster has a NIC per GPU."""
    assert load_cluster("4x4-v100-10gbe").inter_node.nics_per_node == 1
    assert load_cluster("2x8-a100-80gb").inter_node.nics_per_node is None


@pytest.mark.parametrize("value,words", [("0", "from 1 to"), ("true", "true"), ("1.5", "1.5")])
def test_bad_nics_per_node_is_refused(tmp_path, value, words):
    (tmp_path / "c.toml").write_text('name = "c"\nnodes = 2\ndevices_per_node = 4\ndevice = "v100-pcie-16gb"\n'
                                     "[intra_node]\nbandwidth_GBps = 10\nlatency_us = 10\n"
                                     f"[inter_node]\nbandwidth_GBps = 1.25\nlatency_us = 50\nnics_per_node = {value}\n")
    with pytest.raises(InputError, match="inter_node.nics_per_node") as err:
        load_cluster(str(tmp_path / "c.toml"))
    assert words in str(err.value).lower()


def test_nics_per_node_is_not_a_key_of_the_link_inside_a_node(tmp_path):
    (tmp_path / "c.toml").write_text('name = "c"\nnodes = 2\ndevices_per_node = 4\ndevice = "v100-pcie-16gb"\n'
                                     "[intra_node]\nbandwidth_GBps = 10\nlatency_us = 10\nnics_per_node = 1\n"
                                     "[inter_node]\nbandwidth_GBps = 1.25\nlatency_us = 50\n")
    with pytest.raises(InputError, match="intra_node"):
        load_cluster(str(tmp_path / "c.toml"))


def test_tensor_parallel_ranks_share_the_nic_too():
    """tp 2 slots (heads 0, 2 on node 0; 4, 6 on node 1), dp 4: each of the
    2 tp ranks of a slot reduces its own shard, so 2 slots x 2 ranks = 4
    rings leave each node through its one NIC: INTER / 4 each, as for 4
    tp-1 replicas. Hierarchical: 2 (1/2) / (2 x INTER x 1/4) per byte of a
    rank's shard across nodes; a boundary of 2 slots x 2 ranks: INTER / 4."""
    heads = np.array([[0, 2, 4, 6]])
    per_byte, _ = allreduce_terms(_cluster(1), heads, tp=2)
    assert per_byte[0] == pytest.approx(2 * 1 / 2 / INTRA + 2 * 1 / 2 / (2 * INTER / 4))
    own, _ = allreduce_terms(_cluster(None), heads, tp=2)
    assert own[0] == pytest.approx(2 * 1 / 2 / INTRA + 2 * 1 / 2 / (2 * INTER))
    bw, _ = boundary_links(_cluster(1), np.array([[0, 2], [4, 6]]), tp=2)
    assert bw[0] == pytest.approx(INTER / 4)
