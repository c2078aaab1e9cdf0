"""The host side of a node: PCIe transfers between host memory and GPUs, with
the sharing of a switch's uplink, and the offloaded optimizer step.

The one home of host and PCIe link logic (the cluster's ``[host]`` table,
:class:`pipesearch.types.HostSpec`). Model:

* a GPU copying to or from pinned host memory alone gets
  ``host_to_device_bytes_per_s`` (about 12.4 / 25 / 55 GB/s for PCIe 3.0 /
  4.0 / 5.0 x16: ``hardware/README.md``);
* ``n`` GPUs under one PCIe switch copying at the same time share the
  switch's uplink: each gets ``min(host_to_device_bytes_per_s,
  switch_uplink_bytes_per_s / n)`` (a fair share of a shared link; two Gen4
  GPUs behind one x16 uplink get about 12.5 GB/s each, half of one alone);
* GPUs under different switches do not slow each other (each switch has its
  own uplink to its root complex).

Which GPUs copy at the same time depends on the schedule; the cost model
takes the worst case, every GPU of the plan under the switch at once, so a
predicted offload time is an upper bound that is exact when all of them do
(as in an optimizer step that ends every stage's iteration).
"""

from __future__ import annotations

import numpy as np

from .types import Cluster, HostSpec


def shared_bandwidth_bytes_per_s(host: HostSpec, sharing: int | np.ndarray):
    """Bandwidth each of ``sharing`` GPUs under one switch gets when they all
    copy to or from host memory at once, bytes/s (same shape as ``sharing``).

    Raises:
        ValueError: ``sharing < 1``.
    """
    n = np.asarray(sharing)
    if np.any(n < 1):
        raise ValueError(f"sharing = {sharing!r}: at least the GPU itself copies")
    return np.minimum(host.host_to_device_bytes_per_s, host.switch_uplink_bytes_per_s / n)


def concurrent_transfers_s(cluster: Cluster, bytes_by_device: dict[int, float]) -> dict[int, float]:
    """Seconds each GPU's copy of ``bytes_by_device[d]`` bytes (to or from
    host memory) takes when all the listed GPUs copy at once: the GPUs under
    one switch of one node share its uplink (module docstring), so two GPUs
    under one switch take twice as long as one alone when the uplink is the
    bottleneck, and GPUs under different switches take as long as alone.

    Raises:
        ValueError: the cluster has no ``[host]`` table.
    """
    host = _host(cluster)
    sharing = switch_sharing(cluster, list(bytes_by_device))
    return {d: float(b / shared_bandwidth_bytes_per_s(host, sharing[d])) for d, b in bytes_by_device.items()}


def switch_sharing(cluster: Cluster, devices) -> dict[int, int]:
    """For each device of ``devices`` (global ids), how many of ``devices``
    sit under its PCIe switch (in its node), itself included."""
    host = _host(cluster)
    key = {d: (cluster.node_of(d), host.switch_of(_local(cluster, d))) for d in devices}
    counts: dict[tuple[int, int], int] = {}
    for k in key.values():
        counts[k] = counts.get(k, 0) + 1
    return {d: counts[k] for d, k in key.items()}


def stage_switch_sharing(cluster: Cluster, placement: np.ndarray, tp: int = 1) -> np.ndarray:
    """``(P,)`` for each stage of ``placement`` (``(P, dp)`` heads of
    tensor-parallel groups of ``tp`` consecutive devices): the most GPUs of
    the plan under one switch with one of the stage's GPUs (the worst-case
    sharing of the module docstring)."""
    placement = np.asarray(placement)
    used = sorted({int(h) + t for h in placement.ravel() for t in range(tp)})
    share = switch_sharing(cluster, used)
    return np.array([max(share[int(h) + t] for h in row for t in range(tp)) for row in placement],
                    dtype=np.int64)


def node_sharing(cluster: Cluster, placement: np.ndarray, tp: int = 1) -> np.ndarray:
    """``(P,)`` the most GPUs of the plan on one node with one of stage
    ``s``'s GPUs (they share the node's CPU and host memory)."""
    placement = np.asarray(placement)
    used = sorted({int(h) + t for h in placement.ravel() for t in range(tp)})
    nodes = np.bincount([cluster.node_of(d) for d in used], minlength=cluster.num_nodes)
    return np.array([max(nodes[cluster.node_of(int(h) + t)] for h in row for t in range(tp)) for row in placement],
                    dtype=np.int64)


def offload_step_s_per_param(host: HostSpec, switch_share: np.ndarray, node_share: np.ndarray,
                             grad_bytes: float, weight_bytes: float, share: float = 1.0,
                             flows: int = 1) -> np.ndarray:
    """Seconds per parameter of a stage's offloaded optimizer step (ZeRO-Offload,
    Ren et al. USENIX ATC'21, sec. 4.1): its gradients to the host
    (``grad_bytes`` per parameter), Adam on the CPU at the host's
    ``cpu_adam_params_per_s`` divided among the ``node_share`` GPUs that
    offload to it, and the updated ``weight_bytes`` per parameter back, one
    after the other, each copy at the switch's shared bandwidth
    (:func:`shared_bandwidth_bytes_per_s` with ``switch_share``); ``share`` is
    the part of the parameters the device updates (``1 / dp`` when the
    optimizer state is sharded); ``flows``: copies of the same GPU running
    at once in each direction (a fair share: each gets ``1 / flows`` of the
    bandwidth). Shape of ``switch_share``."""
    bw = shared_bandwidth_bytes_per_s(host, switch_share) / flows
    adam = np.asarray(node_share, dtype=float) / host.cpu_adam_params_per_s
    return share * ((grad_bytes + weight_bytes) / bw + adam)


def activation_copy_s_per_byte(cluster: Cluster, placement: np.ndarray, tp: int = 1) -> np.ndarray:
    """``(P,)`` seconds per byte of one stage's activation copy to or from
    host memory (one direction; PCIe is full duplex), every GPU of the plan
    under the stage's switch copying at once (:func:`stage_switch_sharing`,
    the module docstring's worst case): ``1 / min(host_to_device,
    switch_uplink / n)``. Each GPU of a tensor-parallel group copies its own
    shard at that rate.

    Raises:
        ValueError: the cluster has no ``[host]`` table.
    """
    host = _host(cluster)
    return 1.0 / shared_bandwidth_bytes_per_s(host, stage_switch_sharing(cluster, placement, tp))


def host_memory_share_bytes(cluster: Cluster, placement: np.ndarray, tp: int = 1,
                            stages_per_device: int = 1) -> np.ndarray:
    """``(P,)`` host memory each stage may fill: its node's host memory
    divided equally among the plan's GPUs on that node (and among a device's
    ``stages_per_device`` stages), so the node's total never exceeds it
    whatever each stage stores. Zeros without a ``[host]`` table."""
    if cluster.host is None:
        return np.zeros(len(placement))
    return cluster.host.memory_bytes / node_sharing(cluster, placement, tp) / stages_per_device


def rank_gpus_per_node(cluster: Cluster, heads: np.ndarray, tp: int = 1) -> np.ndarray:
    """``(R, N)`` how many of rank ``r``'s GPUs sit on node ``n``: its
    ``dp`` replicas' heads ``heads[r]`` (``(R, dp)``) and each head's ``tp``
    consecutive GPUs. Each of them keeps the rank's per-GPU host bytes, so
    ``per_gpu_bytes @ rank_gpus_per_node(...)`` is what each node's host
    memory holds (:func:`pipesearch.stage_options.swap_options`)."""
    heads = np.asarray(heads)
    out = np.zeros((heads.shape[0], cluster.num_nodes), dtype=np.int64)
    for r, row in enumerate(heads):
        for h in row:
            for t in range(tp):
                out[r, cluster.node_of(int(h) + t)] += 1
    return out


def cross_mapping(cluster: Cluster, heads: np.ndarray, tp: int = 1) -> np.ndarray:
    """Mobius' cross mapping (Feng et al., ASPLOS'23, sec. 4.3): ``heads``
    (``(P, dp)`` heads of the pipeline's ranks) re-placed so that ranks next
    to each other sit under different PCIe switches where the node allows.
    Per node, the plan takes as many GPUs as before, chosen round robin over
    the node's switches (switch by switch in order, each switch's GPUs in id
    order), and gives them to the ranks in order, replica by replica.
    Adjacent stages prefetch at nearly the same time, so they then do not
    share an uplink. With ``tp > 1`` (groups of consecutive GPUs) the same
    heads are only reordered that way; without ``[host]``, ``heads``
    unchanged."""
    heads = np.asarray(heads)
    if cluster.host is None:
        return heads
    cells = [(r, c) for c in range(heads.shape[1]) for r in range(heads.shape[0])]
    by_node: dict[int, list[tuple[int, int]]] = {}
    for r, c in cells:
        by_node.setdefault(cluster.node_of(int(heads[r, c])), []).append((r, c))
    out = heads.copy()
    for node, where in by_node.items():
        pool = (sorted(int(heads[r, c]) for r, c in where) if tp > 1
                else [d for d in range(cluster.num_devices) if cluster.node_of(d) == node])
        lanes: dict[int, list[int]] = {}
        for d in pool:
            lanes.setdefault(cluster.host.switch_of(_local(cluster, d)), []).append(d)
        rows = [lanes[k] for k in sorted(lanes)]
        order = [lane[i] for i in range(max(map(len, rows))) for lane in rows if i < len(lane)]
        for (r, c), d in zip(where, order):
            out[r, c] = d
    return out


def swap_queues(cluster: Cluster, heads: np.ndarray, tp: int = 1) -> tuple[tuple[int, ...], np.ndarray]:
    """``(queue, copies)`` of a Mobius pipeline with ``heads`` (``(P, dp)``
    heads of ``tp``-GPU groups): per rank, the PCIe switch (a queue id,
    unique over the cluster's nodes) of its first replica's head, whose
    uplink its copies take turns on (:func:`pipesearch.timemodel.mobius_graph`);
    and ``(P,)`` how many of the rank's GPUs (replicas and tensor-parallel
    shards, each copying its own shard at the same time) sit under one
    switch at most: each of the rank's copies takes that many times as long.

    Raises:
        ValueError: no ``[host]`` table.
    """
    host = _host(cluster)
    heads = np.asarray(heads)
    per_node = len(host.pcie_switches)
    queue = tuple(cluster.node_of(int(row[0])) * per_node + host.switch_of(_local(cluster, int(row[0])))
                  for row in heads)
    copies = np.array([max(switch_sharing(cluster, [int(h) + t for h in row for t in range(tp)]).values())
                       for row in heads], dtype=np.int64)
    return queue, copies


def _local(cluster: Cluster, device: int) -> int:
    group = cluster.group_of(device)
    first = sum(g.num_devices for g in cluster.groups[:group])
    return (device - first) % cluster.groups[group].devices_per_node


def _host(cluster: Cluster) -> HostSpec:
    if cluster.host is None:
        raise ValueError(f"cluster {cluster.name!r} has no [host] table (host memory and PCIe links)")
    return cluster.host
