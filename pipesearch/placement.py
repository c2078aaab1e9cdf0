"""Where every stage runs: tensor-parallel slots, stage layouts, and the
links, capacities and speeds those devices give each stage.

A *slot* is one tensor-parallel group: ``tp`` consecutive devices of one
node (a node of ``n`` devices holds ``n // tp`` slots; the rest stay idle),
named by its first device, the *head*. A *layout* is an int array
``heads`` of shape ``(P, dp)``: the head of replica ``r`` of stage ``s``.
Every device of the stage is then ``heads[s, r] + t`` for ``t < tp``
(:func:`stage_devices`); distinct slots never share a device.

Slots are listed in one canonical order (:func:`slot_heads`): fastest
device type first (by :func:`device_rate_flops`), then larger memory, type
name, and the cluster's own group / node / id order. Every layout the search
builds is a pattern over this order, so swapping the ``[[groups]]`` of
different device types in a cluster file changes no result.

Link classes (alpha-beta, :class:`pipesearch.types.Link`): 0 = two devices
of one node (``intra_node``), 1 = two nodes of one group (``inter_node``),
2 = two groups (``inter_group``, ``inter_node`` when absent), as
:meth:`pipesearch.types.Cluster.link` defines them; every function here
works on arrays of node and group ids (no loop over devices).
"""

from __future__ import annotations

import numpy as np

from .errors import InputError
from .types import Cluster, DeviceSpec, Link

FREE_LINK = Link(float("inf"), 0.0)
#: message size by which the "slowest" of several links is chosen (1 MB)
PROBE_BYTES = 1e6
#: message size at which ring and hierarchical all-reduce are compared (100 MB)
ALLREDUCE_PROBE_BYTES = 1e8


def device_rate_flops(spec: DeviceSpec, precision: str) -> float:
    """The rate (FLOP/s) layer times are scaled by between device types:
    ``peak_fp32_flops`` for ``"fp32"`` profiles (measured without tensor
    cores, e.g. PipeDream's), ``peak_fp16_flops * achieved_fraction`` for
    ``"fp16"`` (mixed-precision training), ``peak_fp16_flops *
    achieved_fraction_at(N)`` for ``"fp16@N"`` (a transformer's layer
    table, computed at GEMM size ``N``: :func:`pipesearch.costs.profile_precision`).

    Raises:
        InputError: another precision.
    """
    base, at, size = precision.partition("@")
    if precision == "fp32":
        return spec.peak_fp32_flops
    if precision == "fp16":
        return spec.peak_fp16_flops * spec.achieved_fraction
    if base == "fp16" and at and size.replace(".", "", 1).isdigit():
        return spec.peak_fp16_flops * spec.achieved_fraction_at(float(size))
    raise InputError(f"precision {precision!r}: expected fp32, fp16 or fp16@<GEMM size>")


def node_ids(cluster: Cluster) -> np.ndarray:
    """``(D,)`` global node index of every device id (read-only, made once
    per cluster)."""
    return cluster._id_arrays[0]


def group_ids(cluster: Cluster) -> np.ndarray:
    """``(D,)`` group index of every device id (read-only, made once per
    cluster)."""
    return cluster._id_arrays[1]


def memory_bytes_of(cluster: Cluster) -> np.ndarray:
    """``(D,)`` memory of every device id, bytes."""
    return np.array([g.device.memory_bytes for g in cluster.groups], dtype=float)[group_ids(cluster)]


def rank_memory(stages, pp: int, capacity_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(peak, capacity)``, each ``(pp,)``: every pipeline rank's stages'
    bytes added up (:attr:`pipesearch.types.StagePlan.memory_bytes`; with
    several stages per device each is its part of the device's peak) and
    the least memory among the devices of its first stage (its chunks share
    them); ``capacity_of``: bytes per device id (:func:`memory_bytes_of`)."""
    mem = np.bincount([st.index % pp for st in stages], weights=[st.memory_bytes for st in stages], minlength=pp)
    caps = np.array([capacity_of[np.asarray(st.devices, dtype=np.int64)].min() for st in stages[:pp]], dtype=float)
    return mem, caps


def class_links(cluster: Cluster) -> tuple[Link, Link, Link]:
    """The three link classes (intra-node, inter-node, inter-group)."""
    return cluster.intra_node, cluster.inter_node, cluster.inter_group or cluster.inter_node


def link_class(cluster: Cluster, a, b) -> np.ndarray:
    """Link class between devices ``a`` and ``b`` (broadcastable int arrays
    of device ids): 0, 1 or 2 (see the module docstring); -1 where ``a ==
    b`` (no transfer)."""
    a, b = np.asarray(a), np.asarray(b)
    node, group = node_ids(cluster), group_ids(cluster)
    kind = np.where(group[a] != group[b], 2, np.where(node[a] != node[b], 1, 0))
    return np.where(a == b, -1, kind)


def _worst(cluster: Cluster, kinds: np.ndarray, share: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bandwidth and latency of the slowest class (by time for
    :data:`PROBE_BYTES`) along the last axis of ``kinds`` (-1 entries are
    ignored; a free link where none is left). ``share`` (the shape of
    ``kinds`` without its last axis, from :func:`nic_share`) scales the
    bandwidth of the links between nodes (classes 1 and 2) of each row."""
    links = class_links(cluster)
    bw = np.array([link.bandwidth_bytes_per_s for link in links] + [np.inf])
    lat = np.array([link.latency_s for link in links] + [0.0])
    k = np.where(kinds < 0, 3, kinds)
    kbw = bw[k]
    if share is not None:
        kbw = np.where((k == 1) | (k == 2), kbw * np.asarray(share)[..., None], kbw)
    probe = np.where(k == 3, -1.0, lat[k] + PROBE_BYTES / kbw)
    pick = np.argmax(probe, axis=-1)[..., None]
    return np.take_along_axis(kbw, pick, axis=-1)[..., 0], np.take_along_axis(lat[k], pick, axis=-1)[..., 0]


def nic_share(cluster: Cluster, src: np.ndarray, dst: np.ndarray, tp: int = 1) -> np.ndarray:
    """Share of a link's bandwidth each of a row's simultaneous transfers
    ``src[..., i] -> dst[..., i]`` gets between nodes: with ``c`` of them
    leaving one node for other nodes (or entering it: ports are full duplex)
    and that node sending at most ``nics_per_node`` transfers at full rate
    (:class:`pipesearch.types.Link`), each gets ``min(1, nics_per_node / c)``
    (the node's ports split evenly; the worst node of the row counts). With
    ``tp > 1`` the ids are slot heads and each pair stands for ``tp``
    transfers at once (device ``t`` of one slot to device ``t`` of the
    other). 1 where the link has a NIC per device. Shape: ``src`` without
    its last axis."""
    src, dst = np.asarray(src), np.asarray(dst)
    rows_shape, flows = src.shape[:-1], src.shape[-1]
    src2, dst2 = src.reshape(-1, flows), dst.reshape(-1, flows)
    node = node_ids(cluster)
    row = np.repeat(np.arange(src2.shape[0]), flows)
    out = np.ones(src2.shape[0])
    for cls, link in ((1, cluster.inter_node), (2, cluster.inter_group or cluster.inter_node)):
        if link.nics_per_node is None:
            continue
        crossing = (link_class(cluster, src2, dst2) == cls).reshape(-1)
        worst = np.zeros(src2.shape[0], dtype=np.int64)
        for end in (src2, dst2):  # full duplex: a node's sends share its ports, and so do its receives
            counts = np.zeros((src2.shape[0], cluster.num_nodes), dtype=np.int64)
            np.add.at(counts, (row[crossing], node[end.reshape(-1)[crossing]]), 1)
            worst = np.maximum(worst, counts.max(axis=1))
        out = np.minimum(out, np.minimum(1.0, link.nics_per_node / np.maximum(tp * worst, 1)))
    return out.reshape(rows_shape)


def slot_heads(cluster: Cluster, tp: int = 1, precision: str = "fp16") -> np.ndarray:
    """First device of every tensor-parallel slot, in canonical order.

    Returns an int array of shape ``(S,)``, ``S = sum over nodes of
    devices_per_node // tp``. Order: faster type first (:func:`device_rate_flops`
    at ``precision``), larger memory, type name, then group, node and id.

    Raises:
        InputError: ``tp < 1``.
    """
    if tp < 1:
        raise InputError(f"tp = {tp}: expected >= 1")
    keys, heads, first = [], [], 0
    for gi, g in enumerate(cluster.groups):
        per_node = g.devices_per_node - g.devices_per_node % tp
        local = np.arange(g.nodes)[:, None] * g.devices_per_node + np.arange(0, per_node, tp)[None, :]
        ids = first + local.ravel()
        heads.append(ids)
        keys.append(np.full(len(ids), gi))
        first += g.num_devices
    ids = np.concatenate(heads) if heads else np.zeros(0, np.int64)
    rate = {g.device.name: device_rate_flops(g.device, precision) for g in cluster.groups}
    names = sorted(rate, key=lambda n: (-rate[n], -_memory_of(cluster, n), n))
    group_rank = np.array([names.index(g.device.name) for g in cluster.groups])[group_ids(cluster)[ids]]
    order = np.lexsort((ids, group_rank))  # ids already run group, node, id
    return ids[order].astype(np.int64)


def _memory_of(cluster: Cluster, name: str) -> float:
    return next(g.device.memory_bytes for g in cluster.groups if g.device.name == name)


def num_slots(cluster: Cluster, tp: int) -> int:
    """How many disjoint tensor-parallel groups of ``tp`` the cluster holds."""
    return sum(g.nodes * (g.devices_per_node // tp) for g in cluster.groups)


def pipeline_placement(pp: int, dp: int, order: str = "pipeline") -> np.ndarray:
    """Slot indices of each (stage, replica): int array of shape ``(pp, dp)``.

    ``order="pipeline"``: replica ``r``'s stages on consecutive slots
    ``r*pp .. r*pp+pp-1`` (point-to-point stays inside nodes, all-reduce
    crosses them); ``order="data"``: the replicas of stage ``s`` on
    consecutive slots ``s*dp .. s*dp+dp-1`` (the reverse).

    Raises:
        InputError: another order.
    """
    s = np.arange(pp)[:, None]
    r = np.arange(dp)[None, :]
    if order == "pipeline":
        return r * pp + s
    if order == "data":
        return s * dp + r
    raise InputError(f"unknown placement order {order!r} (expected pipeline or data)")


PLACEMENT_PATTERNS = {"pipeline": "pipeline", "data": "data", "pipeline-major": "pipeline", "data-major": "data"}


SLOTS_PREFIX = "slots:"


def layout(cluster: Cluster, pp: int, dp: int, tp: int, pattern: str, precision: str = "fp16") -> np.ndarray:
    """Heads ``(pp, dp)`` of a named layout over the canonical slots
    (:func:`slot_heads`): a pattern (``pipeline`` / ``pipeline-major`` or
    ``data`` / ``data-major``, :func:`pipeline_placement`), or
    ``slots:i,j,...``: the slot indices of stage 0's replicas, then stage
    1's, ... (:func:`layout_names`).

    Raises:
        InputError: unknown pattern, a slot list of the wrong length or with
            repeats, or ``pp * dp`` more slots than the cluster has.
    """
    heads = slot_heads(cluster, tp, precision)
    if pp < 1 or dp < 1 or pp * dp > len(heads):
        raise InputError(f"pp={pp} x dp={dp} = {pp * dp} groups of tp {tp}: cluster {cluster.name!r} holds "
                         f"{len(heads)}")
    if pattern.startswith(SLOTS_PREFIX):
        idx = np.array([int(x) for x in pattern[len(SLOTS_PREFIX):].split(",")], dtype=np.int64)
        if len(idx) != pp * dp or len(set(idx.tolist())) != len(idx) or idx.min() < 0 or idx.max() >= len(heads):
            raise InputError(f"placement {pattern!r}: expected {pp * dp} distinct slots of 0 .. {len(heads) - 1}")
        return heads[idx].reshape(pp, dp)
    if pattern not in PLACEMENT_PATTERNS:
        raise InputError(f"unknown placement {pattern!r} (expected one of {', '.join(PLACEMENT_PATTERNS)})")
    return heads[pipeline_placement(pp, dp, PLACEMENT_PATTERNS[pattern])]


def slot_classes(cluster: Cluster, tp: int, precision: str = "fp16") -> list[list[int]]:
    """Canonical slot indices grouped into interchangeable classes: the
    slots of one node (one type, and :meth:`Cluster.link` depends only on
    node and group), and all the nodes of one slot in a group together
    (single-GPU nodes: two of them are always linked across nodes, within
    their group, and alike to every other slot), so layouts that differ by
    a swap inside a class score the same; when groups are linked as
    nodes are (no ``inter_group`` link of their own), such nodes of one
    device type across groups form one class."""
    heads = slot_heads(cluster, tp, precision)
    node, group = node_ids(cluster)[heads], group_ids(cluster)[heads]
    per_node = np.bincount(node)
    # with one link between groups as within them, single-GPU nodes of one type in any group are alike too
    across = (cluster.inter_group or cluster.inter_node) == cluster.inter_node
    kind = [cluster.groups[g].device.name if across else int(g) for g in group.tolist()]
    classes: dict = {}  # in order of first slot
    for slot, (n, k) in enumerate(zip(node.tolist(), kind)):
        classes.setdefault((k, -1) if per_node[n] == 1 else (k, n), []).append(slot)
    return list(classes.values())


def count_layouts(cluster: Cluster, n: int, tp: int) -> int:
    """How many slot sequences of length ``n`` :func:`layout_names` yields:
    ``n! [x^n] prod_c sum_{i <= s_c} x^i / i!`` over the node sizes ``s_c``
    (exact integer arithmetic)."""
    from fractions import Fraction
    from math import factorial

    poly = [Fraction(1)]
    for cls in slot_classes(cluster, tp):
        new = [Fraction(0)] * min(len(poly) + len(cls), n + 1)
        for a, pa in enumerate(poly):
            for b in range(len(cls) + 1):
                if a + b <= n:
                    new[a + b] += pa / factorial(b)
        poly = new
    return int(poly[n] * factorial(n)) if n < len(poly) else 0


def layout_names(cluster: Cluster, pp: int, dp: int, tp: int, precision: str = "fp16") -> list[str]:
    """Every ``(pp, dp)`` layout up to swaps of slots inside a node, as
    ``slots:`` names (:func:`layout`): sequences of ``pp * dp`` distinct
    slots in which each node's slots appear in increasing order."""
    classes = slot_classes(cluster, tp, precision)
    n, used, seq, out = pp * dp, [0] * len(classes), [], []

    def rec():
        if len(seq) == n:
            out.append(SLOTS_PREFIX + ",".join(map(str, seq)))
            return
        for c, members in enumerate(classes):
            if used[c] < len(members):
                seq.append(members[used[c]])
                used[c] += 1
                rec()
                used[c] -= 1
                seq.pop()

    rec()
    return out


def placement_candidates(cluster: Cluster, pp: int, dp: int, tp: int = 1, precision: str = "fp16",
                         patterns: tuple[str, ...] = ("pipeline", "data")) -> list[tuple[str, np.ndarray]]:
    """Named ``(pp, dp)`` layouts (heads) for the search to loop over:
    ``pipeline-major`` and ``data-major`` over the canonical slots
    (:func:`layout`, fastest type first), then, where the largest memory
    does not come first already, the same two patterns over the slots with
    the largest memory first (``slots:`` names: a fast device of little
    memory first can leave the memory-heavy early stages nowhere to fit),
    and over the slots of each device type that holds ``pp x dp`` alone (a
    layout that mixes types runs its replicas at the slowest one's pace and
    its all-reduce over the links between groups: one type alone can be
    faster); each layout once; ``patterns``: those of ``pipeline`` and
    ``data`` to give.

    Raises:
        InputError: ``pp * dp`` exceeds the cluster's slots.
    """
    out: list[tuple[str, np.ndarray]] = []
    for name in (f"{PLACEMENT_PATTERNS[p]}-major" for p in patterns):
        arr = layout(cluster, pp, dp, tp, name, precision)
        if not any(np.array_equal(arr, other) for _, other in out):
            out.append((name, arr))
    heads = slot_heads(cluster, tp, precision)
    memory = memory_bytes_of(cluster)[heads]
    roomy = np.lexsort((np.arange(len(heads)), -memory))  # largest memory first, then the canonical order
    orders = [roomy] if not np.array_equal(roomy, np.arange(len(heads))) else []
    # and each device type alone where it holds the layout: its slots in canonical order (a layout that mixes
    # types runs its replicas at the slowest one's pace, and its all-reduce over the links between groups)
    kinds = np.array([cluster.groups[g].device.name for g in group_ids(cluster)[heads]])
    if len(set(kinds)) > 1:
        orders += [np.flatnonzero(kinds == kind) for kind in dict.fromkeys(kinds) if (kinds == kind).sum() >= pp * dp]
    for slots in orders if pp * dp <= len(heads) else ():
        for order in (PLACEMENT_PATTERNS[p] for p in patterns):  # the patterns over those slots
            idx = slots[pipeline_placement(pp, dp, order)]
            arr = heads[idx]
            if not any(np.array_equal(arr, other) for _, other in out):
                out.append((SLOTS_PREFIX + ",".join(map(str, idx.ravel().tolist())), arr))
    return out


def stage_devices(heads: np.ndarray, tp: int) -> np.ndarray:
    """Every device of every stage: ``(P, dp, tp)`` ids ``heads[..., None] + t``."""
    return np.asarray(heads)[..., None] + np.arange(tp)


def all_distinct(ids: np.ndarray) -> bool:
    """Whether no integer of ``ids`` (any shape) occurs twice: one
    ``np.bincount`` over its range when that range is at most a few times
    its size (device ids, O(n)), else ``np.unique`` (a sort)."""
    ids = np.asarray(ids).reshape(-1)
    if ids.size < 2:
        return True
    if ids.dtype.kind not in "iu":
        return len(np.unique(ids)) == ids.size
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo >= 4 * ids.size + 64:
        return len(np.unique(ids)) == ids.size
    return int(np.bincount(ids - lo).max()) <= 1


def check_layout(cluster: Cluster, heads: np.ndarray, tp: int) -> None:
    """InputError unless every stage's devices exist, no device serves two
    (stage, replica) slots (``heads`` of shape ``(pp, dp)``, one row per
    device's stage) and no slot spans two nodes."""
    heads = np.asarray(heads).reshape(-1)
    if not all_distinct(heads):
        raise InputError("layout: a tensor-parallel group serves two stages or replicas")
    devs = stage_devices(heads, tp)
    if devs.size and (devs.min() < 0 or devs.max() >= cluster.num_devices):
        raise InputError(f"layout uses device {int(devs.max())}: cluster {cluster.name!r} has ids 0 .. "
                         f"{cluster.num_devices - 1}")
    if not all_distinct(devs):
        raise InputError("layout: two tensor-parallel groups share a device")
    node = node_ids(cluster)[devs]
    if np.any(node != node[:, :1]):
        raise InputError("layout: a tensor-parallel group spans two nodes")


def boundary_links(cluster: Cluster, heads: np.ndarray, tp: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per stage of a ``(P, dp)`` layout: bandwidth (bytes/s) and latency (s)
    of the slowest link its boundary to the next stage crosses (replica ``r``
    sends to replica ``r``; a free link after the last stage). Shapes ``(P,)``."""
    heads = np.asarray(heads)
    P = heads.shape[0]
    if P == 1:
        return _worst(cluster, np.full(heads.shape, -1))
    kinds = np.concatenate([link_class(cluster, heads[:-1], heads[1:]), np.full((1, heads.shape[1]), -1)], axis=0)
    share = np.append(nic_share(cluster, heads[:-1], heads[1:], tp), 1.0)
    return _worst(cluster, kinds, share)


def allreduce_terms(cluster: Cluster, heads: np.ndarray, tp: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """All-reduce over each stage's ``dp`` replicas as ``(seconds per byte,
    seconds fixed)``, arrays of shape ``(P,)``.

    Ring: ``2(d-1)/d * bytes / bw + 2(d-1) * latency`` on the slowest link of
    the ring (Patarasuk & Yuan 2009; Thakur et al. 2005). Hierarchical (every
    node holds the same number ``k > 1`` of the replicas, ``n > 1`` nodes):
    reduce-scatter and all-gather inside nodes ``2(k-1)/k * bytes / bw_intra``
    plus ``k`` rings across nodes on ``bytes / k`` each: ``2(n-1)/n * bytes /
    (k * share * bw_inter)``, ``bw_inter`` the slowest link between
    consecutive nodes (by node id) and ``share = min(1, nics / (k tp))``
    with ``nics`` its ``nics_per_node`` (1 when each device has its own):
    the ``k`` rings of each of the ``tp`` ranks of a slot (each reducing its
    own shard) share the node's ports.
    The flat ring's hops that leave one node share its ports likewise
    (:func:`nic_share`). The cheaper of the two for
    :data:`ALLREDUCE_PROBE_BYTES` is used, as NCCL picks its algorithm by
    size.
    """
    heads = np.asarray(heads)
    P, d = heads.shape
    if d <= 1:
        return np.zeros(P), np.zeros(P)
    ring_next = np.roll(heads, -1, axis=1)
    bw, lat = _worst(cluster, link_class(cluster, heads, ring_next), nic_share(cluster, heads, ring_next, tp))
    per_byte, fixed = 2 * (d - 1) / d / bw, 2 * (d - 1) * lat
    sn = np.sort(node_ids(cluster)[heads], axis=1)
    n = 1 + np.sum(sn[:, 1:] != sn[:, :-1], axis=1)
    intra = cluster.intra_node
    node_group = np.zeros(cluster.num_nodes, dtype=np.int64)
    node_group[node_ids(cluster)] = group_ids(cluster)
    for nn in np.unique(n):
        k = d // int(nn)
        if nn < 2 or k < 2 or d % nn:
            continue
        rows = np.flatnonzero(n == nn)
        blocks = sn[rows].reshape(len(rows), int(nn), k)
        rows = rows[np.all(blocks == blocks[:, :, :1], axis=2).all(axis=1)]
        if not len(rows):
            continue
        reps = node_group[sn[rows, ::k]]
        kinds = np.where(reps[:, 1:] != reps[:, :-1], 2, 1)
        ibw, ilat = _worst(cluster, kinds)
        # the k per-device rings across nodes (k tp of them with tp ranks per slot, each ring of its
        # shard) share each node's ports: f = k tp flows at min(1, nics / f) each
        f = k * tp
        nics = np.array([cluster.inter_node.nics_per_node or f,
                         (cluster.inter_group or cluster.inter_node).nics_per_node or f])
        share = np.minimum(1.0, nics[np.max(kinds, axis=1) - 1] / f)
        hier_b = 2 * (k - 1) / k / intra.bandwidth_bytes_per_s + 2 * (nn - 1) / nn / (k * share * ibw)
        hier_f = 2 * (k - 1) * intra.latency_s + 2 * (nn - 1) * ilat
        probe = ALLREDUCE_PROBE_BYTES
        better = hier_b * probe + hier_f < per_byte[rows] * probe + fixed[rows]
        per_byte[rows[better]], fixed[rows[better]] = hier_b[better], hier_f[better]
    return per_byte, fixed


def stage_capacity_bytes(cluster: Cluster, heads: np.ndarray) -> np.ndarray:
    """``(P,)`` memory of each stage's smallest device (a stage's replicas
    run in lock-step, so each holds the same state), bytes."""
    return memory_bytes_of(cluster)[np.asarray(heads)].min(axis=1)


def stage_streaming_bandwidth(cluster: Cluster, heads: np.ndarray) -> np.ndarray:
    """``(P,)`` streaming memory bandwidth of each stage's slowest device
    (:attr:`pipesearch.types.DeviceSpec.streaming_bandwidth_bytes_per_s`;
    its replicas step in lock-step), bytes/s."""
    per_group = np.array([g.device.streaming_bandwidth_bytes_per_s for g in cluster.groups], dtype=float)
    return per_group[group_ids(cluster)[np.asarray(heads)]].min(axis=1)


def stage_time_scale(cluster: Cluster, heads: np.ndarray, profiled: DeviceSpec | None,
                     precision: str) -> np.ndarray:
    """``(P,)`` factor turning a time measured on ``profiled`` into one on
    each stage's slowest device: ``rate(profiled) / rate(device)``
    (:func:`device_rate_flops`); 1 for devices of the profiled type or when
    it is unknown."""
    specs = {g.device.name: g.device for g in cluster.groups}
    scale = {n: (1.0 if profiled is None or profiled.name == n
                 else device_rate_flops(profiled, precision) / device_rate_flops(s, precision))
             for n, s in specs.items()}
    per_group = np.array([scale[g.device.name] for g in cluster.groups])
    return per_group[group_ids(cluster)[np.asarray(heads)]].max(axis=1)


def placement_links(cluster: Cluster, heads: np.ndarray, tp: int = 1
                    ) -> tuple[list[Link], list[tuple[float, float]]]:
    """:func:`boundary_links` and :func:`allreduce_terms` of a ``(P, dp)``
    layout of tp-``tp`` slot heads as lists of :class:`Link` and ``(s/byte,
    s)`` pairs."""
    bw, lat = boundary_links(cluster, heads, tp)
    per_byte, fixed = allreduce_terms(cluster, heads, tp)
    return ([Link(float(b), float(t)) for b, t in zip(bw, lat)],
            [(float(a), float(b)) for a, b in zip(per_byte, fixed)])


def allreduce_model(cluster: Cluster, devices: np.ndarray, tp: int = 1) -> tuple[float, float]:
    """:func:`allreduce_terms` of one group of ``devices`` (shape ``(d,)``;
    slot heads of ``tp`` devices each, every shard reduced over the group)."""
    per_byte, fixed = allreduce_terms(cluster, np.asarray(devices).reshape(1, -1), tp)
    return float(per_byte[0]), float(fixed[0])


def reference_device(cluster: Cluster, precision: str = "fp16") -> DeviceSpec:
    """The device type layer tables are computed for when the profile names
    none: the first of the canonical order (:func:`slot_heads`: the fastest
    type), whatever order the cluster file lists its groups in."""
    return cluster.device_spec(int(slot_heads(cluster, 1, precision)[0]))


def replicated_stage_devices(cluster: Cluster, replicas, precision: str = "fp16", tp: int = 1,
                             slots=None) -> list[np.ndarray]:
    """Slot heads of each stage under per-stage replication: stage ``k``
    holds ``replicas[k]`` tensor-parallel slots of ``tp`` devices (one node
    each, :func:`slot_heads`; every device of a slot is ``head + t``,
    :func:`stage_devices`). Without ``slots`` the stages take consecutive
    runs of the canonical slot order (fastest type first): stage 0 the first
    ``replicas[0]`` slots, stage 1 the next ``replicas[1]``, and so on.
    ``slots`` (canonical slot indices, stage 0's then stage 1's, ...) names
    another placement (:func:`replicated_layout_names`); each stage's slots
    are kept in canonical order, the order the boundary pairs and the
    all-reduce ring follow (:func:`replicated_boundary_links`).

    Returns a list of ``P`` int arrays, array ``k`` of shape ``(replicas[k],)``.

    Raises:
        InputError: a count below 1, more slots than the cluster has, or
            ``slots`` of the wrong length, repeated or out of range.
    """
    replicas = [int(r) for r in replicas]
    order = slot_heads(cluster, tp, precision)
    if not replicas or min(replicas) < 1 or sum(replicas) > len(order):
        raise InputError(f"replicas {','.join(map(str, replicas))}: every stage needs >= 1 group of tp {tp} and "
                         f"they must sum to at most the {len(order)} such groups of cluster {cluster.name!r}")
    idx = np.arange(sum(replicas)) if slots is None else np.asarray(slots, dtype=np.int64)
    if len(idx) != sum(replicas) or len(np.unique(idx)) != len(idx) or (len(idx) and (
            idx.min() < 0 or idx.max() >= len(order))):
        raise InputError(f"replicated placement {list(idx.tolist())}: expected {sum(replicas)} distinct slots of "
                         f"0 .. {len(order) - 1}")
    ends = np.cumsum(replicas)
    return [order[np.sort(idx[e - r:e])] for r, e in zip(replicas, ends)]


def replicated_layout_names(cluster: Cluster, replicas, tp: int = 1, precision: str = "fp16",
                            limit: int | None = None) -> list[str]:
    """Every placement of a replica vector up to swaps of slots inside a
    node, as ``slots:`` names of canonical slot indices (stage 0's, then
    stage 1's, ...; :func:`replicated_stage_devices`): a stage's devices
    are a set, so a placement is how many slots of each node every stage
    takes, each node's slots dealt to the stages in stage order (slots of
    one node are interchangeable, :func:`slot_classes`, and the canonical
    order within a stage keeps its node sequence under such swaps). At most
    ``limit + 1`` names when ``limit`` is given (enough to tell that there
    are more)."""
    classes = slot_classes(cluster, tp, precision)
    reps = [int(r) for r in replicas]
    used, stages, out = [0] * len(classes), [], []

    def take(k: int, c: int, need: int, chosen: list[int]) -> None:
        if limit is not None and len(out) > limit:
            return
        if need == 0:
            stages.append(sorted(chosen))
            stage(k + 1)
            stages.pop()
            return
        for cc in range(c, len(classes)):
            free = len(classes[cc]) - used[cc]
            for n in range(min(free, need), 0, -1):
                got = classes[cc][used[cc]:used[cc] + n]
                used[cc] += n
                take(k, cc + 1, need - n, chosen + got)
                used[cc] -= n

    def stage(k: int) -> None:
        if k == len(reps):
            out.append(SLOTS_PREFIX + ",".join(str(i) for st in stages for i in st))
            return
        take(k, 0, reps[k], [])

    if reps and min(reps) >= 1 and sum(reps) <= sum(len(c) for c in classes):
        stage(0)
    return out


def spread_layout_name(cluster: Cluster, replicas, tp: int = 1, precision: str = "fp16") -> str | None:
    """A ``slots:`` placement of a replica vector (as
    :func:`replicated_layout_names` writes them) that spreads every
    stage's replicas over the nodes in proportion: the replicas of all
    stages dealt in the order of their share (replica ``j`` of stage ``k``
    at ``(j + 1/2) / r_k``) onto the canonical slots, node after node, so
    each node holds some of every stage and a boundary's transfers stay
    mostly inside nodes (``8,8`` on four nodes of four: two of each stage
    per node, as the uniform ``dp 8`` plan's data-major layout), where the
    consecutive slots put stage 0 on the first nodes and send every
    transfer over the inter-node links between them. None when the vector
    needs more slots than the cluster has."""
    reps = [int(r) for r in replicas]
    slots = [i for c in slot_classes(cluster, tp, precision) for i in c]
    if not reps or min(reps) < 1 or sum(reps) > len(slots):
        return None
    order = sorted(((j + 0.5) / r, k) for k, r in enumerate(reps) for j in range(r))
    per_stage: list[list[int]] = [[] for _ in reps]
    for slot, (_, k) in zip(slots, order):
        per_stage[k].append(slot)
    return SLOTS_PREFIX + ",".join(str(i) for st in per_stage for i in sorted(st))


def replicated_boundary_links(cluster: Cluster, stage_devs: list[np.ndarray], tp: int = 1
                              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per stage of a replicated layout (:func:`replicated_stage_devices`):
    the boundary to the next stage as ``(bandwidth bytes/s, latency s,
    pairs, shared bandwidth bytes/s, flows)``, arrays of shape ``(P,)``.
    Replica ``a`` of the larger side (``N`` replicas) exchanges its share of
    the micro-batch with replica ``a mod n`` of the smaller one (``n =
    min(r_k, r_{k+1})``): ``N`` flows at once, and each of the smaller
    side's ``n`` devices sends or receives a ``1 / n`` share (DAPPLE, Fan et
    al. PPoPP'21, stage replication: splitting and concatenating a
    micro-batch between stages of different replication; PipeDream,
    Narayanan et al. SOSP'19 sec. 3.1, round-robin between replicated
    stages). Two limits, :func:`pipesearch.replication.replicated_costs`
    takes the slower: each device's own link (``bandwidth``, ``pairs`` =
    ``n``: a ``1 / n`` share per device of the smaller side) and the
    nodes' ports (``shared bandwidth``, ``flows`` = ``N``: a ``1 / N``
    share per flow at the slowest flow's :func:`nic_share` of its link).
    ``bandwidth`` and ``latency`` are those of the slowest of the flows'
    links (by time for :data:`PROBE_BYTES`); a free link, 1 pair and 1 flow
    after the last stage. With ``tp > 1`` the ids are slot heads and each
    flow stands for ``tp`` transfers (shard ``t`` to shard ``t``) sharing
    the nodes' ports."""
    P = len(stage_devs)
    bw, lat, pairs = np.full(P, np.inf), np.zeros(P), np.ones(P, dtype=np.int64)
    shared, flows = np.full(P, np.inf), np.ones(P, dtype=np.int64)
    for k in range(P - 1):
        a, b = np.asarray(stage_devs[k]), np.asarray(stage_devs[k + 1])
        n = min(len(a), len(b))
        big, small = (a, b) if len(a) >= len(b) else (b, a)
        peer = small[np.arange(len(big)) % n]
        kinds = link_class(cluster, big, peer)[None, :]
        wb, wl = _worst(cluster, kinds)
        sb, _ = _worst(cluster, kinds, nic_share(cluster, big[None, :], peer[None, :], tp))
        bw[k], lat[k], pairs[k], shared[k], flows[k] = float(wb[0]), float(wl[0]), n, float(sb[0]), len(big)
    return bw, lat, pairs, shared, flows
