"""The one time model: the iteration time of a split under a schedule.

Definition. One iteration is the makespan of the schedule's action lists
(:mod:`pipesearch.schedules`) replayed by the discrete-event simulator
(:func:`pipesearch.simulate.simulate`) with the split's per-stage times, plus
each rank's gradient all-reduce, which starts when the rank has finished its
last action (and its last blocking send):

    T = max_r (end_r + allreduce_r)

Everything that ranks plans (the exact split, the pruning of the search, the
ranked table, the plots) uses this quantity, through
:func:`iteration_time_s`. Nothing here approximates it: :func:`iteration_time_s`
evaluates the same longest path as the simulator, with numpy over the levels
of the schedule's dependency graph (a few vector operations per level instead
of a Python step per action); ``tests/test_timemodel.py`` checks it against
the simulator on random instances, and :func:`gpipe_time_s` is its closed form
for GPipe (derivation in docs/schedules.md).

Send model, per schedule (what torch.distributed.pipelining does; Megatron-LM
without ``--overlap-p2p-communication`` blocks like 1F1B):

* ``1f1b``: blocking sends. ``Schedule1F1B`` waits on each fused
  ``send + recv`` batch before the next compute, so the sender is busy for the
  transfer.
* ``gpipe``, ``interleaved-1f1b``, ``zb-h1``, ``looped-bfs``: overlapped
  sends. ``ScheduleGPipe`` and the multi-stage runtime wait only on receives
  (sends are waited at the end of the step), so a transfer runs beside the
  sender's compute, queued on its directed link.

:func:`send_overlap` states the choice; :func:`lower_bound_s` gives valid lower
bounds of ``T`` that the split search (:func:`pipesearch.partition.exact_split`)
and the search's pruning use.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from . import schedules as schedule_lib
from .errors import InputError
from .simulate import Timeline, simulate

#: schedules whose sends overlap the sender's compute (module docstring)
OVERLAPPED_SEND_SCHEDULES = ("gpipe", "interleaved-1f1b", "zb-h1", "looped-bfs", "mobius")


def busy_with_steps_s(busy_s, optimizer_step_s, pp: int) -> np.ndarray:
    """``(pp,)``: each rank's busy seconds (``busy_s``, its actions) plus
    its stages' optimizer steps on the GPU (``optimizer_step_s`` per stage,
    stage ``s`` on rank ``s % pp``): the step follows the rank's last
    backward and is the GPU's own work, so it is busy time, not bubble."""
    steps = np.asarray(optimizer_step_s, dtype=float)
    return np.asarray(busy_s, dtype=float) + np.bincount(np.arange(len(steps)) % pp, weights=steps, minlength=pp)


def busiest_idle_fraction(busiest_s: float, iteration_time_s: float) -> float:
    """The bubble of a plan: the share of the iteration its busiest rank
    (``busiest_s`` of work) sits idle, 0 for an iteration of no time."""
    return max(0.0, 1.0 - busiest_s / iteration_time_s) if iteration_time_s > 0 else 0.0


def send_overlap(schedule: str) -> bool:
    """Whether ``schedule``'s point-to-point sends overlap the sender's
    compute (``True``) or block it (``False``, 1F1B)."""
    return schedule in OVERLAPPED_SEND_SCHEDULES


@dataclass(frozen=True, eq=False)
class StageTimes:
    """Per-stage times of one split (``S`` stages, seconds, per micro-batch
    unless said otherwise).

    Attributes:
        fwd_s: ``(S,)`` forward compute.
        bwd_s: ``(S,)`` full backward compute (input + weight gradient).
        bwd_input_s: ``(S,)`` input-gradient part of the backward (zero-bubble
            schedules run it as ``I`` and the rest as ``W``).
        p2p_s: ``(S-1,)`` one transfer over boundary ``k`` (activation
            forward or its gradient back; both have the same size).
        allreduce_s: ``(S,)`` gradient all-reduce of the stage, once per
            iteration.
    """

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    bwd_input_s: np.ndarray
    p2p_s: np.ndarray
    allreduce_s: np.ndarray
    #: Mobius (``schedule="mobius"``, :func:`mobius_graph`): per stage, its
    #: weights copied from host memory before each stay on its GPU, and its
    #: gradients copied back after its backward (``(S,)`` or ``(n, S)``);
    #: ``swap_queue`` the PCIe queue (switch) of each rank, ``(pp,)`` ints
    swap_in_s: np.ndarray | None = None
    swap_out_s: np.ndarray | None = None
    swap_queue: tuple[int, ...] | None = None
    #: Mobius with activations in host memory (:func:`mobius_graph` with
    #: ``act``): per stage, one micro-batch's kept activations copied out
    #: after its forward or back before its backward (``(S,)`` or ``(n, S)``)
    act_copy_s: np.ndarray | None = None
    #: which stages keep their activations in host memory (``(S,)`` or
    #: ``(n, S)`` bools; ``None`` with ``act_copy_s``: all of them): only
    #: their copies are nodes of :func:`mobius_graph`
    act_host: np.ndarray | None = None
    #: per stage, host work of the iteration that runs beside the next one
    #: (a one-step delayed optimizer step on the CPU, :func:`delayed_host_time_s`)
    delayed_host_s: np.ndarray | None = None
    #: RoundPipe (``schedule="roundpipe"``, :func:`roundpipe_graph`): per GPU
    #: of the pool, how many times longer its PCIe copies take than at the
    #: rate ``p2p_s``, ``swap_in_s`` and ``swap_out_s`` are given in (``(n,)``:
    #: the GPUs under its switch sharing the uplink, :mod:`pipesearch.host`)
    pcie_scale: np.ndarray | None = None

    @property
    def num_stages(self) -> int:
        return len(self.fwd_s)


# ------------------------------------------------------------ the definition


def simulate_times(schedule: str, pp: int, m: int, vp: int, times: StageTimes,
                   act_bytes=None, act_resident=None) -> tuple[float, Timeline]:
    """The definition: replay the schedule in the discrete-event simulator.

    Returns ``(T, timeline)`` with ``T = max_r (end_r + allreduce_r)``, where
    ``end_r`` is when rank ``r`` finished its last action (and blocking send)
    and ``allreduce_r`` the sum of its stages' all-reduce. ``act_bytes``
    (per stage, the activation bytes one in-flight micro-batch holds) gives
    the timeline's peak activation memory per rank (zeros without it);
    ``act_resident`` (per stage, inf for all) caps the micro-batches a stage
    that offloads its activations keeps on the device.
    """
    if schedule == "mobius":  # its copies are nodes of the graph: the timeline comes from it
        return _mobius_simulate(pp, m, vp, times, act_bytes, act_resident)
    if schedule == schedule_lib.ROUNDPIPE:  # tasks move between GPUs: the timeline comes from its graph
        return roundpipe_simulate(pp, m, vp, times, act_bytes)
    actions = schedule_actions(schedule, pp, m, vp)
    tl = simulate(actions, fwd_s=times.fwd_s, bwd_s=times.bwd_s, p2p_s=times.p2p_s,
                  bwd_input_s=times.bwd_input_s, p2p_overlap=send_overlap(schedule), act_bytes=act_bytes,
                  act_resident=act_resident)
    ar = np.bincount(np.arange(times.num_stages) % pp, weights=times.allreduce_s, minlength=pp)
    total = max(tl.iteration_time_s, float(np.max(np.asarray(tl.rank_end_s) + ar)))
    if times.delayed_host_s is not None:
        total = max(total, float(delayed_host_time_s(times, pp)[0]))
    return total, tl


@dataclass(frozen=True, eq=False)
class _Graph:
    """The dependency graph of one (schedule, pp, m, vp), levelled.

    Nodes are the actions (and, with overlapped sends, the transfers). Node
    ``n``'s end is ``max(end[pred1[n]], end[pred2[n]]) + dur[n]``: ``pred1``
    is the node before it on its chain (its rank's previous action, or its
    link's previous transfer), ``pred2`` the one it waits for on another
    chain (the transfer it receives, or its producer); index ``N`` is a
    sentinel that ends at 0. Nodes are numbered level by level, every
    predecessor of a level lying in an earlier one.
    """

    col: np.ndarray       # per node: column of the duration table (_durations)
    sends: np.ndarray     # per node: boundary whose transfer a blocking send adds (-1 none)
    pred1: np.ndarray
    pred2: np.ndarray
    level_starts: tuple[int, ...]  # nodes are numbered level by level: level k is [starts[k], starts[k+1])
    last_of_rank: np.ndarray  # per rank: its last action node

    @property
    def num_levels(self) -> int:
        return len(self.level_starts) - 1

    @cached_property
    def level_preds(self) -> list[tuple[slice, np.ndarray, np.ndarray]]:
        """Per level: its nodes' slice and their ``pred1`` and ``pred2``
        (for :func:`_node_ends`' pass a level at a time)."""
        st = self.level_starts
        return [(slice(a, b), self.pred1[a:b], self.pred2[a:b]) for a, b in zip(st[:-1], st[1:])]

    @cached_property
    def before_every_last(self) -> np.ndarray:
        """``(N,)`` bool: the nodes from which every rank's last action is
        reached (through ``pred1`` / ``pred2`` edges, or the node itself),
        found walking the nodes once backwards with a bit per rank."""
        N, pp = len(self.pred1), len(self.last_of_rank)
        reach = [0] * (N + 1)
        for q, node in enumerate(self.last_of_rank.tolist()):
            reach[node] |= 1 << q
        p1, p2 = self.pred_lists
        for n in range(N - 1, -1, -1):
            bits = reach[n]
            if bits:
                reach[p1[n]] |= bits
                reach[p2[n]] |= bits
        every = (1 << pp) - 1
        return np.array([bits == every for bits in reach[:N]], dtype=bool)

    @cached_property
    def send_nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """The nodes whose blocking send adds a transfer and the boundary of
        each (for :func:`_durations`)."""
        nodes = np.flatnonzero(self.sends >= 0)
        return nodes, self.sends[nodes]

    @cached_property
    def pred_lists(self) -> tuple[list, list]:
        """``pred1`` and ``pred2`` as Python lists (for :func:`_node_ends`' walk node by node)."""
        return self.pred1.tolist(), self.pred2.tolist()


@lru_cache(maxsize=64)
def schedule_actions(schedule: str, pp: int, m: int, vp: int):
    """:func:`pipesearch.schedules.build`, memoised (the action lists are
    immutable tuples; the simulator replays them)."""
    return schedule_lib.build(schedule, pp, m, vp)


_KIND_CODE = {kind: code for code, kind in enumerate(schedule_lib.KINDS)}  # F 0, B 1, I 2, W 3


@lru_cache(maxsize=256)
def _graph(schedule: str, pp: int, m: int, vp: int) -> _Graph:
    """Build the levelled graph with array operations: nodes sit on a grid
    of chains (one row per rank, then one per directed link with overlapped
    sends), in order along each row."""
    orders = schedule_lib.build_orders(schedule, pp, m, vp)
    S = schedule_lib.num_stages_of(schedule, pp, vp)
    lens = np.array([len(seq) for seq in orders], dtype=np.int64)
    flat = np.array([(_KIND_CODE[k], st, j) for seq in orders for k, st, j in seq], dtype=np.int64).reshape(-1, 3)
    kind, stage, mb = flat.T
    rank = np.repeat(np.arange(pp), lens)
    pos = np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens)
    width = int(lens.max())
    slot = rank * width + pos  # grid slot of each action
    where = np.full((4, S, m), -1, dtype=np.int64)
    where[kind, stage, mb] = slot
    prod, consumer, boundary, dst_rank = _transfers(kind, stage, mb, where, pp)
    src_rank = rank[prod]
    remote = src_rank != dst_rank
    overlap = send_overlap(schedule)
    links = np.unique(src_rank[remote] * pp + dst_rank[remote], return_inverse=True)[1] if overlap \
        else np.zeros(0, dtype=np.int64)
    rows = pp + (int(links.max()) + 1 if len(links) else 0)
    size = rows * width
    col = np.full(size, -1, dtype=np.int64)
    sends = np.full(size, -1, dtype=np.int64)
    cross = np.full(size, -1, dtype=np.int64)
    col[slot] = kind * S + stage
    ps = slot[prod]
    cross[consumer[~remote]] = ps[~remote]  # same rank: free hand-over
    if not overlap:
        sends[ps[remote]] = boundary[remote]
        cross[consumer[remote]] = ps[remote]
    elif len(links):
        order = np.lexsort((pos[prod][remote], links))  # on each link, in the sender's issue order
        lk = links[order]
        at = np.arange(len(order)) - np.searchsorted(lk, lk)
        tslot = (pp + lk) * width + at
        col[tslot] = 4 * S + boundary[remote][order]
        cross[tslot] = ps[remote][order]
        cross[consumer[remote][order]] = tslot
    return _levelled(col, sends, cross, rows, width, np.arange(pp) * width + lens - 1)


def _transfers(kind, stage, mb, where, pp: int):
    """The hand-overs between stages: every forward below the last stage and
    every input gradient above the first feeds its neighbour stage's matching
    action. Returns ``(producers, consumers, boundary, consumer_rank)``:
    producer action indices, consumer grid slots, the boundary crossed and
    the consumer's rank."""
    S = where.shape[1]
    down = (kind == 0) & (stage < S - 1)
    up = ((kind == 1) | (kind == 2)) & (stage > 0)
    prod = np.flatnonzero(down | up)
    dst = np.where(down[prod], stage[prod] + 1, stage[prod] - 1)
    boundary = np.where(down[prod], stage[prod], stage[prod] - 1)
    full_b = where[1, dst, mb[prod]]
    consumer = np.where(down[prod], where[0, dst, mb[prod]], np.where(full_b >= 0, full_b, where[2, dst, mb[prod]]))
    return prod, consumer, boundary, dst % pp


def _levelled(col, sends, cross, rows: int, width: int, last_slots) -> _Graph:
    """Compact the grid to its nodes and level them by the longest
    unit-weight path from a source (:func:`_depth`)."""
    real = np.flatnonzero(col >= 0)
    N = len(real)
    node_of = np.full(rows * width + 1, N, dtype=np.int64)
    node_of[real] = np.arange(N)
    pred1 = np.where(real % width > 0, node_of[real - 1], N)
    pred2 = node_of[np.where(cross[real] >= 0, cross[real], rows * width)]
    depth = _depth(pred1, pred2, width)
    # renumber the nodes level by level, so each level is one slice
    order = np.argsort(depth, kind="stable")
    new_id = np.full(N + 1, N, dtype=np.int64)
    new_id[order] = np.arange(N)
    starts = np.flatnonzero(np.diff(depth[order], prepend=-1, append=depth.max(initial=0) + 1))
    return _Graph(col[real][order], sends[real][order], new_id[pred1[order]], new_id[pred2[order]],
                  tuple(int(x) for x in starts), new_id[node_of[last_slots]])


#: nodes per grid column above which :func:`_depth` levels a graph of at
#: least :data:`LEVEL_PASS_NODES` nodes a whole level per numpy pass (counts:
#: a level's passes cost about what 50 nodes walked one by one do, and a
#: graph has at least as many levels as its longest row of actions)
LEVEL_PASS_ROWS = 64
LEVEL_PASS_NODES = 2**15


def _depth(pred1: np.ndarray, pred2: np.ndarray, width: int = 0) -> np.ndarray:
    """Longest unit-weight path ending at each node (sources 0), by Kahn's
    algorithm over the two predecessor arrays (``N`` = none): node by node,
    or, when the graph has more than :data:`LEVEL_PASS_ROWS` nodes per
    column of its grid (``width``, the longest row; deep pipelines) and at
    least :data:`LEVEL_PASS_NODES` nodes, a whole level of nodes per numpy
    pass (:func:`_depth_by_levels`). Both give the same depths.

    Raises:
        InputError: the graph has a cycle.
    """
    N = len(pred1)
    src = np.concatenate([pred1, pred2])
    dst = np.concatenate([np.arange(N), np.arange(N)])
    has = src < N
    src, dst = src[has], dst[has]
    order = np.argsort(src, kind="stable")
    succ, start = dst[order], np.searchsorted(src[order], np.arange(N + 1))
    indeg = np.bincount(dst, minlength=N)
    if width and N > LEVEL_PASS_ROWS * width and N >= LEVEL_PASS_NODES:
        return _depth_by_levels(N, succ, start, indeg)
    succ, start, indeg = succ.tolist(), start.tolist(), indeg.tolist()
    depth = [0] * N
    queue = [n for n in range(N) if indeg[n] == 0]
    for n in queue:
        d = depth[n] + 1
        for q in succ[start[n]:start[n + 1]]:
            if depth[q] < d:
                depth[q] = d
            indeg[q] -= 1
            if indeg[q] == 0:
                queue.append(q)
    if len(queue) != N:
        raise InputError("schedule dependency graph has a cycle")
    return np.array(depth, dtype=np.int64)


def _depth_by_levels(N: int, succ: np.ndarray, start: np.ndarray, indeg: np.ndarray) -> np.ndarray:
    """:func:`_depth` a level at a time: the nodes without predecessors left
    are the next level (a node's level is one more than its deepest
    predecessor's: the longest unit-weight path to it); ``succ[start[n]:
    start[n + 1]]`` are node ``n``'s successors, ``indeg`` their counts of
    predecessors (counted down in place)."""
    depth = np.zeros(N, dtype=np.int64)
    level, seen = np.flatnonzero(indeg == 0), 0
    for d in range(N + 1):
        if not len(level):
            break
        depth[level] = d
        seen += len(level)
        counts = start[level + 1] - start[level]
        kids = succ[np.repeat(start[level] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))]
        np.subtract.at(indeg, kids, 1)
        kids = np.unique(kids)
        level = kids[indeg[kids] == 0]
    if seen != N:
        raise InputError("schedule dependency graph has a cycle")
    return depth


def _durations(g: _Graph, times: StageTimes) -> np.ndarray:
    """Node durations, shape ``(N + 1, n)`` for ``n`` splits (node-major, so
    a level is a contiguous block): compute (+ the blocking send) for
    actions, the p2p time for transfers, 0 for the sentinel."""
    fwd, bwd, bin_ = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (times.fwd_s, times.bwd_s, times.bwd_input_s))
    n, S = fwd.shape
    p2p = np.concatenate([np.asarray(times.p2p_s, dtype=float).reshape(n, S - 1), np.zeros((n, 1))], axis=1)
    cols = [fwd, bwd, bin_, bwd - bin_, p2p]
    if times.swap_in_s is not None:  # Mobius' copies (mobius_graph): columns 5 S .. 7 S
        cols += [np.broadcast_to(np.asarray(x, dtype=float), fwd.shape) for x in (times.swap_in_s, times.swap_out_s)]
    if times.act_copy_s is not None:  # Mobius' activation copies: columns 7 S .. 8 S out, 8 S .. 9 S in
        cols += [np.broadcast_to(np.asarray(times.act_copy_s, dtype=float), fwd.shape)] * 2
    table = np.ascontiguousarray(np.concatenate(cols, axis=1).T)  # (5 S, n), (7 S, n) with copies
    dur = np.zeros((len(g.col) + 1, n))
    table.take(g.col, axis=0, out=dur[:-1])
    nodes, boundary = g.send_nodes
    if len(nodes):
        dur[nodes] += np.ascontiguousarray(p2p.T).take(boundary, axis=0)
    return dur


#: node-by-split cells per level of a graph below which :func:`_node_ends`
#: walks the nodes one by one in Python rather than a level per numpy pass
#: (a level's passes cost about what this many cells walked one by one do)
NODE_WALK_CELLS_PER_LEVEL = 12


def _node_ends(g: _Graph, dur: np.ndarray) -> np.ndarray:
    """Each node's end (same shape as ``dur``, :func:`_durations`): its
    duration after the later of its two predecessors, level by level (a
    level per numpy pass), or node by node for few splits on a graph of
    narrow levels (the same sums in the same order: equal values)."""
    if dur.ndim == 1:  # one split: the same walk on a column
        return _node_ends(g, dur[:, None])[:, 0]
    if len(g.pred1) * dur.shape[1] < NODE_WALK_CELLS_PER_LEVEL * g.num_levels:
        return _node_ends_by_node(g, dur)
    end = dur.copy()
    take, larger = end.take, np.maximum
    for nodes, p1, p2 in g.level_preds:
        level = end[nodes]  # a view: the sum lands in ``end``
        level += larger(take(p1, axis=0), take(p2, axis=0))
    return end


def _node_ends_by_node(g: _Graph, dur: np.ndarray) -> np.ndarray:
    """:func:`_node_ends` one split (column) and one node at a time (nodes
    are numbered in level order, so every predecessor comes first)."""
    p1, p2 = g.pred_lists
    end = np.empty_like(dur)
    for k in range(dur.shape[1]):
        e = dur[:, k].tolist()
        for n, a, b in zip(range(len(p1)), p1, p2):
            a, b = e[a], e[b]
            e[n] += a if a > b else b
        end[:, k] = e
    return end


def iteration_time_s(schedule: str, pp: int, m: int, vp: int, times: StageTimes):
    """``T`` of the module docstring, evaluated as the longest path of the
    schedule's dependency graph (equal to :func:`simulate_times`' value).

    ``times`` holds one split (arrays of shape ``(S,)``; returns a float) or
    ``n`` splits at once (shape ``(n, S)``; returns an array of ``n``).

    Raises:
        InputError: the schedule refuses ``(pp, m, vp)``.
    """
    single = np.ndim(times.fwd_s) == 1
    if schedule == "mobius" and len(_act_patterns(times)) > 1:  # one graph per set of offloading stages
        return _mobius_grouped_time_s(times, pp, m, vp)
    if schedule == schedule_lib.ROUNDPIPE:
        return roundpipe_time_s(times, pp, m, vp)
    if schedule == "gpipe":
        return gpipe_time_s(times, m)
    else:
        g = _graph(schedule, pp, m, vp) if schedule != "mobius" else _mobius_graph_of(times, pp, m, vp)
        out = times_of_ends(g, _node_ends(g, _durations(g, times)), times, pp)
    if times.delayed_host_s is not None:  # steady state: max(GPU iteration, host work beside it)
        out = np.maximum(out, delayed_host_time_s(times, pp))
    return float(out[0]) if single else out


def graph_ends(schedule: str, pp: int, m: int, vp: int, times: StageTimes):
    """``(g, ends)``: the dependency graph of a graph schedule (1F1B,
    interleaved 1F1B, ZB-H1, looped BFS) and every node's end for ``n``
    splits (``times`` of shape ``(n, S)``; ``ends`` ``(N + 1, n)``), the
    pass both :func:`iteration_time_s` and :func:`critical_path` make:
    :func:`times_of_ends` and :func:`paths_of_ends` read it."""
    g = _graph(schedule, pp, m, vp)
    return g, _node_ends(g, _durations(g, times))


def times_of_ends(g: _Graph, ends: np.ndarray, times: StageTimes, pp: int) -> np.ndarray:
    """``(n,)`` iteration times of the splits whose node ends are ``ends``
    (:func:`graph_ends`): the last action, or a rank's last action and its
    all-reduce (a delayed host step, :func:`delayed_host_time_s`, not
    included)."""
    ar = _rank_allreduce(times, pp)
    return np.maximum(ends[:-1].max(axis=0), np.max(ends[g.last_of_rank].T + ar, axis=1))


def critical_path_counts(schedule: str, pp: int, m: int, vp: int, times: StageTimes) -> tuple[float, np.ndarray]:
    """``(T, counts)`` for one split of a graph schedule (not Mobius or
    RoundPipe): the longest path's length to the last action of any rank
    (without all-reduce) and ``counts[kind, s]``, how many actions of each
    kind (``F``, ``B``, ``I``, ``W``) of stage ``s`` that path runs. Read back
    from each node to the predecessor that ended later (either one on a
    tie), so the path's durations add up to ``T``."""
    g = _graph(schedule, pp, m, vp)
    end = _node_ends(g, _durations(g, times)[:, :1])[:, 0]
    node = int(np.argmax(end[:-1]))
    return float(end[node]), _trace(g, end, node, len(np.atleast_1d(times.fwd_s)))[:4].astype(np.int64)


#: rows of :func:`critical_path`'s coefficients: per stage, its ``F``, ``B``,
#: ``I`` and ``W`` actions, the transfers over the boundary after it, and
#: whether its all-reduce ends the path
PATH_TERMS = ("fwd", "bwd", "bwd_input", "bwd_weight", "p2p", "allreduce")


def critical_path(schedule: str, pp: int, m: int, vp: int, times: StageTimes) -> tuple[float, np.ndarray]:
    """``(T, coef)`` for one split of a graph schedule (1F1B, interleaved
    1F1B, ZB-H1, looped BFS; not GPipe's closed form, Mobius or RoundPipe):
    ``T`` of :func:`iteration_time_s` and ``coef`` ``(6, S)``, the longest
    path as counts per stage of each term of :data:`PATH_TERMS` (a blocking
    send counts as a transfer over its boundary; the all-reduce row is 1 on
    the stages of the rank whose all-reduce ends the path, else 0).
    ``times`` may hold ``n`` splits (``(n, S)`` arrays, one graph pass for
    all): then a list of ``n`` such pairs.

    The graph does not depend on the split, so for every split the same
    path has length ``sum_s coef[:, s] . (F_s, B_s, I_s, B_s - I_s, c_s,
    r_s)``, at most that split's ``T``: a lower bound of every split, equal
    to ``T`` at this one (a cutting plane, as in Kelley 1960, J. SIAM 8(4))."""
    out = paths_of_ends(*graph_ends(schedule, pp, m, vp, times), times, pp)
    return out[0] if np.ndim(times.fwd_s) == 1 else out


def paths_of_ends(g: _Graph, ends: np.ndarray, times: StageTimes, pp: int) -> list:
    """:func:`critical_path`'s ``(T, coef)`` of each split whose node ends
    are a column of ``ends`` (:func:`graph_ends`; ``times`` those splits',
    ``(n, S)``)."""
    ends = ends.reshape(len(ends), -1)
    S = np.shape(times.fwd_s)[-1]
    finish = np.atleast_2d(ends[g.last_of_rank].T + _rank_allreduce(times, pp))  # (n, pp)
    out = []
    for k in range(ends.shape[1]):
        end = ends[:, k]
        node, q = int(np.argmax(end[:-1])), int(np.argmax(finish[k]))
        if finish[k, q] > end[node]:  # a rank's all-reduce ends the iteration
            coef = _trace(g, end, int(g.last_of_rank[q]), S)
            coef[5] = np.arange(S) % pp == q
            out.append((float(finish[k, q]), coef))
        else:
            out.append((float(end[node]), _trace(g, end, node, S)))
    return out


def path_before_all_reduces(g: _Graph, end: np.ndarray, S: int, node: int | None = None) -> np.ndarray | None:
    """``(6, S)`` coefficients (:data:`PATH_TERMS`, all-reduce row 0) of the
    longest path, for one split's node ends ``end`` (a column of
    :func:`graph_ends`), to the node that ends last among those from which
    every rank's last action is reached (:attr:`_Graph.before_every_last`);
    None when there is none. Every rank's all-reduce starts after its last
    action (:func:`times_of_ends`), so for every split ``T >= len(path) +
    max_q R_q >= len(path) + max_s r_s`` (``R_q`` rank ``q``'s all-reduce,
    the sum of its stages' ``r_s``), ``len(path)`` the path's terms of that
    split (the graph does not depend on the split). ``node``: that node,
    when :func:`node_before_all_reduces` already found it."""
    node = node_before_all_reduces(g, end) if node is None else node
    return None if node is None else _trace(g, end, node, S)


def node_before_all_reduces(g: _Graph, end: np.ndarray) -> int | None:
    """The node of :func:`path_before_all_reduces` (the one that ends last,
    the first of equals, among those every rank's last action follows), or
    None."""
    mask = g.before_every_last
    if not mask.any():
        return None
    return int(np.flatnonzero(mask)[np.argmax(end[:-1][mask])])


def rank_work_before(g: _Graph, node: int, S: int) -> np.ndarray:
    """``(6, S)`` counts of the actions ``node`` follows (itself included)
    on the ranks' chains, per stage: its ``F``, ``B``, ``I`` and ``W``
    actions, then its blocking sends down (over the boundary after it) and
    up (over the one before it). A rank runs its actions one after another,
    so for every split ``end(node) >= max_q sum_{s on q} (n_F F_s + n_B B_s
    + n_I I_s + n_W W_s + n_down c_s + n_up c_{s-1})``: a ``device``
    component. Transfers on the links' chains are not counted."""
    keep = bytearray(len(g.col) + 1)
    keep[node] = 1
    p1, p2 = g.pred_lists
    for n in range(node, -1, -1):
        if keep[n]:
            keep[p1[n]] = 1
            keep[p2[n]] = 1
    nodes = np.flatnonzero(np.frombuffer(bytes(keep[:-1]), dtype=np.uint8))
    kind, stage = np.divmod(g.col[nodes], S)
    act = kind < 4
    nodes, kind, stage = nodes[act], kind[act], stage[act]
    coef = np.zeros((6, S))
    np.add.at(coef, (kind, stage), 1.0)
    sends = g.sends[nodes]
    sent = sends >= 0
    np.add.at(coef, (np.where(sends[sent] == stage[sent], 4, 5), stage[sent]), 1.0)
    return coef


#: graphs of at most this many nodes get the path families before every
#: all-reduce (:func:`path_before_all_reduces`, :func:`rank_work_before`:
#: finding their node is a Python walk over the nodes)
COMMON_NODE_GRAPHS = 2**16


def _trace(g: _Graph, end: np.ndarray, node: int, S: int) -> np.ndarray:
    """``(6, S)`` counts (:data:`PATH_TERMS`, all-reduce row 0) of the path
    read back from ``node`` to a source, each node to the predecessor that
    ended later (either one on a tie)."""
    N = len(g.col)
    back = np.where(end[g.pred1] >= end[g.pred2], g.pred1, g.pred2).tolist()  # the sentinel N ends at 0
    path = []
    while node < N:
        path.append(node)
        node = back[node]
    nodes = np.array(path, dtype=np.int64)
    kind, stage = np.divmod(g.col[nodes], S)
    coef = np.zeros((6, S))
    np.add.at(coef, (np.minimum(kind, 4), stage), 1.0)  # kind 4: a transfer over boundary ``stage``
    sends = g.sends[nodes]
    np.add.at(coef[4], sends[sends >= 0], 1.0)  # a blocking send adds its transfer
    return coef


def evaluation_cost(schedule: str, pp: int, m: int, vp: int) -> tuple[int, int]:
    """``(fixed, per_split)``: the work of one :func:`iteration_time_s` call
    in comparable units: a fixed part per graph level (one vector operation
    each costs about as much as 300 node updates) and a part per split and
    node (GPipe's closed form: about ten vector operations over the stages)."""
    if schedule == "gpipe":
        return 300 * 10, schedule_lib.num_stages_of(schedule, pp, vp)
    if schedule == schedule_lib.ROUNDPIPE:  # the search's G = pp vp groups
        g = roundpipe_graph(pp, m, pp * vp)[0]
        return 300 * g.num_levels, len(g.col)
    g = _graph(schedule, pp, m, vp) if schedule != "mobius" else mobius_graph(pp, m, vp, tuple(range(pp)))
    return 300 * g.num_levels, len(g.col)


def _rank_allreduce(times: StageTimes, pp: int) -> np.ndarray:
    """``(n, pp)``: each rank's all-reduce seconds (its stages' sum; stage ``s``
    runs on rank ``s % pp``)."""
    r = np.atleast_2d(np.asarray(times.allreduce_s, dtype=float))
    return r.reshape(r.shape[0], -1, pp).sum(axis=1)


def delayed_host_time_s(times: StageTimes, pp: int):
    """The host side of a steady-state iteration with a one-step delayed
    optimizer step (ZeRO-Offload's delayed parameter update, Ren et al.
    USENIX ATC'21; RoundPipe's CPU step of iteration ``t`` beside iteration
    ``t + 1``'s compute): each rank's stages' host work in a row
    (``delayed_host_s``: gradients out, CPU Adam, weights back), its largest
    over the ranks; ``T = max(GPU iteration, this)`` (docs/offload.md).
    Shape: a float per split (``(n,)`` for ``n`` splits)."""
    h = np.atleast_2d(np.asarray(times.delayed_host_s, dtype=float))
    out = h.reshape(h.shape[0], -1, pp).sum(axis=1).max(axis=1)
    return out


def gpipe_time_s(times: StageTimes, m: int):
    """Closed form of GPipe's ``T`` with overlapped sends (docs/schedules.md):

    ``sum_k F_k + sum_k c_k + (m-1) max(F, c)
    + max_s [sum_{k>=s} B_k + sum_{s<=k<S-1} c_k + (m-1) max(B_{>=s}, c_{s..S-2}) + r_s]``

    with ``F_k``, ``B_k`` a stage's forward and backward, ``c_k`` one transfer
    over boundary ``k`` and ``r_s`` the stage's all-reduce. The forward phase
    is a longest path through a grid whose rows are stages and links (each
    processes the ``m`` micro-batches in order), so it is the row sums plus
    ``m - 1`` times the slowest row; the backward phase is the same grid run
    upwards from the last stage, and stage ``s``'s all-reduce follows its last
    backward. Arrays of shape ``(S,)`` give a float, ``(n, S)`` an array.
    """
    single = np.ndim(times.fwd_s) == 1
    F, B, r = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (times.fwd_s, times.bwd_s, times.allreduce_s))
    n, S = F.shape
    c = np.concatenate([np.asarray(times.p2p_s, dtype=float).reshape(n, S - 1), np.zeros((n, 1))], axis=1)
    fwd = F.sum(axis=1) + c.sum(axis=1) + (m - 1) * np.maximum(F.max(axis=1), c.max(axis=1))
    row_sum = np.cumsum((B + c)[:, ::-1], axis=1)[:, ::-1]
    row_max = np.maximum.accumulate(np.maximum(B, c)[:, ::-1], axis=1)[:, ::-1]
    out = fwd + np.max(row_sum + (m - 1) * row_max + r, axis=1)
    if times.delayed_host_s is not None:
        out = np.maximum(out, delayed_host_time_s(times, S))
    return float(out[0]) if single else out


def rank_busy_s(schedule: str, pp: int, m: int, times: StageTimes) -> np.ndarray:
    """``(pp,)`` seconds each rank computes in one iteration, plus its sends
    when they block (1F1B): the ``busy_s`` of the simulator's timeline, in
    closed form (each stage runs ``m`` forwards and ``m`` backwards)."""
    work = m * (np.asarray(times.fwd_s, dtype=float) + np.asarray(times.bwd_s, dtype=float))
    if not send_overlap(schedule):
        c = np.asarray(times.p2p_s, dtype=float)
        work = work + m * (np.append(c, 0.0) + np.insert(c, 0, 0.0))  # sends forward and back
    return np.bincount(np.arange(len(work)) % pp, weights=work, minlength=pp)


def stage_times_of(plan) -> StageTimes:
    """The :class:`StageTimes` a :class:`pipesearch.types.Plan` records."""
    st = plan.stages
    bwd_s = np.array([s.compute_s - s.fwd_s for s in st])
    delayed = dict(plan.extra or ()).get("optimizer_step") == "delayed"
    swap = dict(plan.extra or ()).get("mobius") if plan.schedule == "mobius" else None
    swaps = {} if not swap else dict(swap_in_s=np.array(swap["swap_in_s"], dtype=float),
                                      swap_out_s=np.array(swap["swap_out_s"], dtype=float),
                                      swap_queue=tuple(int(q) for q in swap["pcie_queue"]))
    if swap and "act_copy_s" in swap:  # activations in host memory (mobius_graph with act)
        swaps["act_copy_s"] = np.array(swap["act_copy_s"], dtype=float)
        if "act_host" in swap:  # the stages that offload (all of them in files without it)
            swaps["act_host"] = np.array(swap["act_host"], dtype=bool)
    rp = dict(plan.extra or ()).get("roundpipe") if plan.schedule == schedule_lib.ROUNDPIPE else None
    if rp:  # RoundPipe's copies (roundpipe_graph): per boundary, per group, per GPU
        swaps.update(swap_in_s=np.array(rp["weights_in_s"], dtype=float),
                     swap_out_s=np.array(rp["grads_out_s"], dtype=float),
                     pcie_scale=np.array(rp["pcie_scale"], dtype=float))
    if delayed:  # the host step runs beside the next iteration (delayed_host_time_s)
        swaps["delayed_host_s"] = np.array([s.host_step_s for s in st])
    return StageTimes(
        fwd_s=np.array([s.fwd_s for s in st]),
        bwd_s=bwd_s,
        # a file's input-gradient part may pass the backward by rounding (the loader allows 1e-9)
        bwd_input_s=np.minimum(np.array([s.bwd_input_s for s in st]), bwd_s),
        p2p_s=np.array(rp["act_copy_s"], dtype=float) if rp else np.array([s.comm_s for s in st[:-1]]),
        allreduce_s=np.array([s.allreduce_s for s in st]),
        **swaps,
    )


# ------------------------------------------------------------ Mobius: stages swapped over PCIe


def _queues(times: StageTimes, pp: int) -> tuple[int, ...]:
    """Each rank's PCIe queue (``StageTimes.swap_queue``; own queue each when unset)."""
    return tuple(int(q) for q in times.swap_queue) if times.swap_queue is not None else tuple(range(pp))


def _act_stages(times: StageTimes) -> bool | tuple[bool, ...]:
    """The stages whose activation copies are nodes of :func:`mobius_graph`
    for ``times`` of one split: ``False`` (none), ``True`` (all: ``act_copy_s``
    without ``act_host``) or a tuple of ``S`` bools."""
    if times.act_copy_s is None:
        return False
    if times.act_host is None:
        return True
    return tuple(bool(x) for x in np.asarray(times.act_host).reshape(-1, times.fwd_s.shape[-1])[0])


def _act_patterns(times: StageTimes) -> dict:
    """Rows of ``times`` by their set of offloading stages
    (``StageTimes.act_host``): ``{pattern: row indices}``, one entry when
    all rows share it."""
    if times.act_copy_s is None or times.act_host is None or np.ndim(times.act_host) == 1:
        return {None: None}
    rows: dict = {}
    for n, row in enumerate(np.asarray(times.act_host, dtype=bool)):
        rows.setdefault(tuple(bool(x) for x in row), []).append(n)
    return rows


def _mobius_grouped_time_s(times: StageTimes, pp: int, m: int, vp: int) -> np.ndarray:
    """:func:`iteration_time_s` of Mobius splits whose stages keep their
    activations in host memory in different sets: each set's rows with its
    own graph (:func:`mobius_graph` with ``act`` a tuple of stages)."""
    from dataclasses import fields

    n = np.shape(times.fwd_s)[0]
    out = np.zeros(n)
    for pattern, rows in _act_patterns(times).items():
        idx = np.asarray(rows)
        part = {}
        for f in fields(times):
            v = getattr(times, f.name)
            part[f.name] = v if v is None or f.name == "swap_queue" or np.ndim(v) < 2 else np.asarray(v)[idx]
        part["p2p_s"] = np.asarray(times.p2p_s).reshape(n, -1)[idx]
        out[idx] = iteration_time_s("mobius", pp, m, vp, StageTimes(**part))
    return out


def _mobius_graph_of(times: StageTimes, pp: int, m: int, vp: int) -> _Graph:
    """:func:`mobius_graph` of ``times``: its queues, and activation copies
    of the stages :func:`_act_stages` names."""
    return mobius_graph(pp, m, vp, _queues(times, pp), act=_act_stages(times))


def mobius_residencies(pp: int, vp: int, rank: int) -> list[tuple[int, bool]]:
    """The stays of rank ``rank``'s stages on its GPU under Mobius, in order:
    ``(stage, with_backward)``. Stage ``c pp + r`` runs its ``m`` forwards
    (looped BFS order, :func:`pipesearch.schedules.looped_bfs`); the last one
    stays for its backwards, then the others come back in reverse for
    theirs: ``2 vp - 1`` stays (Feng et al., ASPLOS'23, sec. 3.2)."""
    fwd = [(c * pp + rank, c == vp - 1) for c in range(vp)]
    return fwd + [(c * pp + rank, True) for c in reversed(range(vp - 1))]


def mobius_graph(pp: int, m: int, vp: int, queues: tuple[int, ...], act: bool | tuple[bool, ...] = False) -> _Graph:
    """The dependency graph of Mobius (Feng et al., ASPLOS'23, "Mobius: Fine
    Tuning Large-Scale Models on Commodity GPU Servers", sec. 3): the looped
    BFS action lists of ``pp * vp`` stages with overlapped sends, plus, per
    stay of a stage on its GPU (:func:`mobius_residencies`):

    * a copy of its weights in (``swap_in_s``) on the host-to-device queue of
      its rank's PCIe switch (``queues[rank]``); it starts when the stay two
      before has ended and its gradients are out (the GPU holds the stage
      computing and the one prefetched), and the stay's first action waits
      for it;
    * after a stay with backwards, its gradients out (``swap_out_s``) on the
      device-to-host queue of that switch.

    Each queue runs its copies one after another at the link's bandwidth,
    stay by stay, and within a stay in the order the ranks reach it (rank
    0 first for copies that follow forwards, the last rank first for those
    that follow backwards, which run from the last stage down): ranks under
    one switch share it (copies that would overlap take turns, so two GPUs
    prefetching at once under one switch finish the second copy at twice
    the time of one alone), ranks under different switches do not. A rank's all-reduce and host step
    follow its last gradient copy. ``queues`` has one entry per rank.

    With ``act`` (activations in host memory, ``act_copy_s``; Mobius sec.
    3 and ZeRO-Infinity sec. 5 keep activation checkpoints on the CPU),
    every micro-batch's kept activations go out after its forward and come
    back before its backward, copies on the same queues
    (:func:`_mobius_act_waits`); ``act`` a tuple of ``pp * vp`` bools: only
    those stages' activations (docs/offload.md: per stage, where the GPU's
    memory requires it). Each stage's copies are inserted into the queues
    and waits of the graph without them, so the graph of a set of stages
    holds every path of the graph of any subset.
    """
    return _mobius_build(pp, m, vp, tuple(queues), _act_tuple(act, pp * vp))[0]


def _act_tuple(act, S: int) -> tuple[bool, ...]:
    """``act`` of :func:`mobius_graph` as ``S`` bools."""
    if isinstance(act, (bool, np.bool_)):
        return (bool(act),) * S
    return tuple(bool(x) for x in act)


#: graph nodes the Mobius graphs kept for reuse hold at most (a count; about
#: 120 bytes of memory each, 250 MB in all): the sets of offloading stages a search times
#: (:func:`pipesearch.stage_options.mobius_activation_choice`) come back
#: from split to split, hundreds per point
MOBIUS_GRAPH_NODES_KEPT = 2**21


class _GraphsKept:
    """Graphs kept for reuse, least recently used first, dropped once they
    hold more than ``limit()`` nodes (a callable: the module constant,
    read when a graph is added)."""

    def __init__(self, limit) -> None:
        self.graphs: OrderedDict = OrderedDict()
        self.nodes, self.limit = 0, limit

    def get(self, key, build):
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return self.graphs[key]
        out = self.graphs[key] = build(*key)
        self.nodes += len(out[0].col)
        while self.nodes > self.limit() and len(self.graphs) > 1:
            self.nodes -= len(self.graphs.popitem(last=False)[1][0].col)
        return out


_MOBIUS_GRAPHS = _GraphsKept(lambda: MOBIUS_GRAPH_NODES_KEPT)  # (pp, m, vp, queues, act_copies) -> (graph, ids)


def _mobius_build(pp: int, m: int, vp: int, queues: tuple[int, ...], act_copies: tuple[bool, ...] = ()):
    """``(graph, action node ids)``: :func:`mobius_graph` and, per rank, the
    node of each action of the looped BFS order (``act_copies``: per stage,
    whether its activation copies of :func:`_mobius_act_waits` are nodes;
    ``()`` none). The least recently used graphs are dropped once those kept
    hold more than :data:`MOBIUS_GRAPH_NODES_KEPT` nodes (Llama 3 8B on
    1x8-rtx4090-pcie4 with activations offloaded times 1,027 sets; a cache
    of 64 graphs rebuilt 2,824 of them, half the search's time)."""
    return _MOBIUS_GRAPHS.get((pp, m, vp, queues, act_copies), _mobius_built)


def _mobius_built(pp: int, m: int, vp: int, queues: tuple[int, ...], act_copies: tuple[bool, ...] = ()):
    """:func:`_mobius_build` without reuse."""
    S, NONE = pp * vp, -1
    act_copies = act_copies or (False,) * S
    orders = schedule_lib.build_orders("looped-bfs", pp, m, vp)
    col: list[int] = []
    p1: list[int] = []
    p2: list[int] = []

    def node(c: int) -> int:
        col.append(c)
        p1.append(NONE)
        p2.append(NONE)
        return len(col) - 1

    zero = 4 * S + S - 1  # the p2p column past the last stage: always 0
    act = {(k, st, j): node(_KIND_CODE[k] * S + st) for seq in orders for k, st, j in seq}
    for seq in orders:  # each rank's chain
        for a, b in zip(seq[:-1], seq[1:]):
            p1[act[b]] = act[a]
    links: dict[tuple[int, int], int] = {}
    for r, seq in enumerate(orders):  # hand-overs, each link in its sender's issue order
        for k, st, j in seq:
            dst = st + 1 if k == "F" else st - 1
            if not 0 <= dst < S:
                continue
            consumer = act[(k, dst, j)]
            if dst % pp == r:
                p2[consumer] = act[(k, st, j)]
                continue
            t = node(4 * S + min(st, dst))
            p2[t], p1[t] = act[(k, st, j)], links.get((r, dst % pp), NONE)
            links[(r, dst % pp)] = t
            p2[consumer] = t
    stays = [mobius_residencies(pp, vp, r) for r in range(pp)]
    first = {(r, n): act[("F" if n < vp else "B", st, 0 if n < vp else m - 1)]
             for r in range(pp) for n, (st, _) in enumerate(stays[r])}
    last = {(r, n): act[("B", st, 0)] if bwd else act[("F", st, m - 1)]
            for r in range(pp) for n, (st, bwd) in enumerate(stays[r])}
    out: dict[tuple[int, int], int] = {}
    tail_in: dict[int, int] = {}
    tail_out: dict[int, int] = {}
    act_out: dict[tuple[int, int], int] = {}
    act_in: dict[tuple[int, int], int] = {}

    def queued(c: int, tails: dict, r: int, after: int) -> int:  # a copy node on rank r's queue
        x = node(c)
        p1[x], p2[x] = tails.get(queues[r], NONE), after
        tails[queues[r]] = x
        return x

    def copies_in(n: int, js) -> None:  # stay n's activations back, last rank first (backward order)
        if not any(act_copies) or not stays[0][n][1]:
            return
        for j in js:
            for r in reversed(range(pp)):
                st = stays[r][n][0]
                if not act_copies[st]:
                    continue
                after = act_out[(st, j)]
                if j + 2 < m:  # room: the backward two before it is done
                    after = node(zero)
                    p1[after], p2[after] = act[("B", st, j + 2)], act_out[(st, j)]
                act_in[(st, j)] = queued(8 * S + st, tail_in, r, after)

    for n in range(2 * vp - 1):  # gradients out, in the order the ranks finish their backwards
        if n < vp:  # the stay's forwards' activations out, rank 0 first
            for j in range(m):
                for r in range(pp):
                    st = stays[r][n][0]
                    if not act_copies[st]:
                        continue
                    act_out[(st, j)] = queued(7 * S + st, tail_out, r, act[("F", st, j)])
        for r in reversed(range(pp)):
            st, bwd = stays[r][n]
            if bwd:
                o = node(6 * S + st)
                p1[o], p2[o] = tail_out.get(queues[r], NONE), last[(r, n)]
                tail_out[queues[r]] = o
                out[(r, n)] = o
    for n in range(2 * vp - 1):  # weights in, in the order the ranks free a buffer
        freed_by_backward = n >= 2 and stays[0][n - 2][1]
        for r in (reversed(range(pp)) if freed_by_backward else range(pp)):
            st, _ = stays[r][n]
            load = node(5 * S + st)
            p1[load] = tail_in.get(queues[r], NONE)
            tail_in[queues[r]] = load
            if n >= 2:
                p2[load] = out.get((r, n - 2), last[(r, n - 2)])
            wait = node(zero)
            p1[wait], p2[wait] = (last[(r, n - 1)] if n else NONE), load
            p1[first[(r, n)]] = wait
        if n:
            copies_in(n - 1, range(m - 3, -1, -1))
        copies_in(n, [j for j in (m - 1, m - 2) if j >= 0])
    copies_in(2 * vp - 2, range(m - 3, -1, -1))
    if any(act_copies):
        _mobius_act_waits(orders, act, act_out, act_in, p1, p2, node, zero)
    N = len(col)
    pred1 = np.array([x if x >= 0 else N for x in p1], dtype=np.int64)
    pred2 = np.array([x if x >= 0 else N for x in p2], dtype=np.int64)
    ends = np.array([out[(r, 2 * vp - 2)] for r in range(pp)], dtype=np.int64)
    g, new_id = _renumbered(np.array(col, dtype=np.int64), pred1, pred2, ends)
    return g, tuple(tuple(int(new_id[act[a]]) for a in seq) for seq in orders)


def _mobius_act_waits(orders, act, act_out, act_in, p1, p2, node, zero) -> None:
    """The compute actions' waits for their activation copies: ``F(s, j)``
    for the copy out of ``j - 2``, ``B(s, j)`` for its copy in; each a
    zero-time node between the action and its chain predecessor.

    Mobius with activations in host memory (:func:`mobius_graph` with
    ``act``; the copies are nodes of :func:`_mobius_build`, column ``7 S +
    s`` out and ``8 S + s`` in, duration ``act_copy_s[s]``):

    * **out**: after ``F(s, j)``, stage ``s``'s kept activations of
      micro-batch ``j`` go to the host on the device-to-host queue of the
      rank's switch, queued per forward stay micro-batch by micro-batch
      (ranks in order, rank 0 first), before the stay's gradients;
      ``F(s, j)`` waits for the copy out of ``j - 2`` (the GPU holds the
      micro-batch computing and the one leaving);
    * **in**: before ``B(s, j)``, they come back on the host-to-device
      queue once ``B(s, j + 2)`` is done (backwards run ``m - 1`` down to
      0: the one computing and the one arriving) and their copy out is
      over; ``B(s, j)`` waits for it. A backward stay's first two copies
      in follow its weights on the queue, then the next stay's weights,
      then its other copies in (last rank first): the prefetch of the next
      stage is not held behind the whole stay.

    So a GPU holds at most two micro-batches' kept activations of each of
    the two stays around a stay boundary, at most ``min(m, 3)`` per stage
    summed over its stages (the device check of
    :func:`pipesearch.stage_options.swap_device_bytes` with
    :data:`pipesearch.stage_options.ACT_HOST_RESIDENT`). The queues are
    FIFO links as for the weights: copies take turns, so activation and
    weight copies of GPUs under one switch share its bandwidth.
    """
    for seq in orders:
        for k, st, j in seq:
            copy = act_out.get((st, j - 2)) if k == "F" else act_in.get((st, j))
            if copy is None:
                continue
            a = act[(k, st, j)]
            w = node(zero)
            p1[w], p2[w] = p1[a], copy
            p1[a] = w


def _renumbered(col: np.ndarray, pred1: np.ndarray, pred2: np.ndarray, last_nodes: np.ndarray) -> _Graph:
    """``(graph, new ids)``: a :class:`_Graph` of nodes given with
    predecessors (``N``: none), numbered level by level (:func:`_depth`); no
    blocking sends."""
    N = len(col)
    depth = _depth(pred1, pred2)
    order = np.argsort(depth, kind="stable")
    new_id = np.full(N + 1, N, dtype=np.int64)
    new_id[order] = np.arange(N)
    starts = np.flatnonzero(np.diff(depth[order], prepend=-1, append=depth.max(initial=0) + 1))
    return _Graph(col[order], np.full(N, -1, dtype=np.int64), new_id[pred1[order]], new_id[pred2[order]],
                  tuple(int(x) for x in starts), new_id[last_nodes]), new_id


def _mobius_simulate(pp: int, m: int, vp: int, times: StageTimes, act_bytes=None,
                     act_resident=None) -> tuple[float, Timeline]:
    """:func:`simulate_times` for Mobius: ``T`` and a :class:`Timeline` of
    the compute actions read from :func:`mobius_graph`'s node ends."""
    from .simulate import ActionRecord

    g, ids = _mobius_build(pp, m, vp, _queues(times, pp), _act_tuple(_act_stages(times), pp * vp))
    dur = _durations(g, times)[:, 0]
    end = _node_ends(g, dur)
    T = float(max(end[:-1].max(), np.max(end[g.last_of_rank] + _rank_allreduce(times, pp)[0])))
    if times.delayed_host_s is not None:
        T = max(T, float(delayed_host_time_s(times, pp)[0]))
    S = pp * vp
    orders = schedule_lib.build_orders("looped-bfs", pp, m, vp)
    records = [ActionRecord(r, k, st, j, float(end[n] - dur[n]), float(end[n]))
               for r, seq in enumerate(orders) for (k, st, j), n in zip(seq, ids[r])]
    busy = [float(sum(dur[n] for n in ids[r])) for r in range(pp)]
    act = np.zeros(S) if act_bytes is None else np.asarray(act_bytes, dtype=float)
    cap = np.full(S, np.inf) if act_resident is None else np.asarray(act_resident, dtype=float)
    return T, _timeline(records, pp, S, m, busy, act, cap)


def mobius_copy_spans(times: StageTimes, pp: int, m: int, vp: int) -> list[tuple[int, str, int, float, float]]:
    """Mobius' weight and gradient copies under ``times`` (with ``swap_in_s``,
    ``swap_out_s`` and ``swap_queue``) of ``pp`` ranks, ``m`` micro-batches
    and ``vp`` stages per rank: :func:`mobius_pcie_spans` without the
    activation copies, as ``(queue, direction, stage, start_s, end_s)``
    (direction ``"in"``: weights, ``"out"``: gradients) sorted by queue,
    direction and start."""
    return [(q, d, st, a, b) for q, d, what, st, a, b in mobius_pcie_spans(times, pp, m, vp) if what != "activations"]


def mobius_pcie_spans(times: StageTimes, pp: int, m: int, vp: int) -> list[tuple[int, str, str, int, float, float]]:
    """Every PCIe copy of Mobius under ``times``, read from
    :func:`mobius_graph`'s copy nodes evaluated as :func:`simulate_times`
    evaluates them (a node ends its duration after the later of its two
    predecessors): ``(queue, direction, what, stage, start_s, end_s)`` with
    ``direction`` ``"in"`` (host to GPU) or ``"out"``, ``what``
    ``"weights"`` (column ``5 S + s``), ``"gradients"`` (``6 S + s``) or
    ``"activations"`` (one micro-batch's kept activations: out ``7 S + s``,
    in ``8 S + s``), sorted by queue, direction and start."""
    S = pp * vp
    queues = _queues(times, pp)
    g, _ = _mobius_build(pp, m, vp, queues, _act_tuple(_act_stages(times), S))
    dur = _durations(g, times)[:, 0]
    end = _node_ends(g, dur)
    kinds = (("in", "weights"), ("out", "gradients"), ("out", "activations"), ("in", "activations"))
    out = []
    for n in np.flatnonzero((g.col >= 5 * S) & (g.col < 9 * S)):
        block, stage = divmod(int(g.col[n]) - 5 * S, S)
        direction, what = kinds[block]
        out.append((int(queues[stage % pp]), direction, what, stage, float(end[n] - dur[n]), float(end[n])))
    return sorted(out, key=lambda c: (c[0], c[1], c[4], c[3]))


def _timeline(records, pp: int, S: int, m: int, busy, act, cap) -> Timeline:
    """A :class:`Timeline` from action records (activations held from a
    forward's start to its backward's end; on the device at most ``cap[s]``
    micro-batches' worth of stage ``s``)."""
    total = max((rec.end_s for rec in records), default=0.0)
    events = sorted([(rec.start_s, 1, rec.stage) for rec in records if rec.kind == "F"]
                    + [(rec.end_s, -1, rec.stage) for rec in records if rec.kind == "B"], key=lambda e: (e[0], e[1]))
    held, peak_bytes, inflight, peak_in = [0.0] * pp, [0.0] * pp, [0] * S, [0] * S
    for _, step, st in events:
        r = st % pp
        on_device = min(inflight[st], cap[st])
        inflight[st] += step
        held[r] += (min(inflight[st], cap[st]) - on_device) * act[st]
        peak_in[st] = max(peak_in[st], inflight[st])
        peak_bytes[r] = max(peak_bytes[r], held[r])
    ends = [max((rec.end_s for rec in records if rec.rank == r), default=0.0) for r in range(pp)]
    return Timeline(records=tuple(records), num_ranks=pp, num_stages=S, num_microbatches=m,
                    stage_to_rank=tuple(st % pp for st in range(S)), iteration_time_s=total, busy_s=tuple(busy),
                    busy_fraction=tuple(b / total if total > 0 else 0.0 for b in busy),
                    bubble_fraction=(1.0 - max(busy) / total) if total > 0 else 0.0,
                    mean_bubble_fraction=(1.0 - sum(busy) / pp / total) if total > 0 else 0.0,
                    peak_act_bytes=tuple(peak_bytes), peak_in_flight=tuple(peak_in), rank_end_s=tuple(ends))


def host_copy_spans(timeline: Timeline, allreduce_s, host_step_s, *, activation_copy_s=None, weight_copy_s=None,
                    optimizer_copy_s=None) -> list[tuple[int, str, str, int, float, float]]:
    """The PCIe copies that the stage times of the other schedules hold
    (docs/offload.md), placed on the simulated ``timeline`` as the time
    model counts them: ``(rank, direction, what, stage, start_s, end_s)``,
    ``direction`` ``"in"`` (host to GPU) or ``"out"``, sorted by rank,
    direction and start. Per stage (``(S,)`` seconds of one GPU's copy, 0
    or None where it has none):

    * ``activation_copy_s`` (activations in host memory): micro-batch
      ``k``'s kept activations go out during the stage's action after
      ``F(k)``, and come back during the action before its backward (``B``,
      or ``I`` under ZB-H1); each action lasts at least the copy
      (:meth:`pipesearch.costs.PipelineCosts.fwd_s`), so a copy starts with
      its action;
    * ``weight_copy_s`` (streamed weights): the stage's weights in during
      each forward, in and then its gradients out during each backward
      (ZB-H1: weights in during ``I``, gradients out during ``W``), from the
      action's start, the link busy that long (layer by layer, each layer's
      copy overlapping the previous layer's compute);
    * ``optimizer_copy_s`` (offloaded optimizer step, not delayed): after
      the rank's last action and the stage's gradient all-reduce, the
      gradients out, then the CPU's Adam, then the weights in, ending with
      the stage's ``host_step_s`` (``allreduce_s`` holds both; a rank's
      stages take their turn in stage order, as its all-reduce bar).
    """
    S, pp = timeline.num_stages, timeline.num_ranks
    act, wts, opt = (np.zeros(S) if x is None else np.asarray(x, dtype=float)
                     for x in (activation_copy_s, weight_copy_s, optimizer_copy_s))
    by_rank: dict[int, list] = {}
    for rec in sorted(timeline.records, key=lambda r: (r.rank, r.start_s, r.end_s)):
        by_rank.setdefault(rec.rank, []).append(rec)
    out = []
    for r, seq in by_rank.items():
        for p, rec in enumerate(seq):
            s, a = rec.stage, rec.start_s
            if act[s] > 0 and rec.kind == "F" and p + 1 < len(seq):
                out.append((r, "out", "activations", s, seq[p + 1].start_s, seq[p + 1].start_s + act[s]))
            if act[s] > 0 and rec.kind in ("B", "I") and p > 0:
                out.append((r, "in", "activations", s, seq[p - 1].start_s, seq[p - 1].start_s + act[s]))
            if wts[s] > 0 and rec.kind in ("F", "B", "I"):
                out.append((r, "in", "weights", s, a, a + wts[s]))
            if wts[s] > 0 and rec.kind in ("B", "W"):
                start = a + wts[s] if rec.kind == "B" else a
                out.append((r, "out", "gradients", s, start, start + wts[s]))
    ends = dict(enumerate(timeline.rank_end_s))
    clock = {r: ends.get(r, 0.0) for r in range(pp)}
    for s in range(S):
        r = s % pp
        step = float(np.asarray(host_step_s, dtype=float)[s])
        start = clock[r] + float(np.asarray(allreduce_s, dtype=float)[s]) - step  # after the all-reduce
        if opt[s] > 0:
            out.append((r, "out", "gradients", s, start, start + opt[s]))
            out.append((r, "in", "weights", s, start + step - opt[s], start + step))
        clock[r] = start + step
    return sorted(out, key=lambda c: (c[0], c[1], c[4], c[3]))


# ------------------------------------------------------------ RoundPipe: tasks dispatched round-robin over GPUs

#: node kinds of :func:`roundpipe_graph` (column ``kind * G n + group * n + gpu`` of its table)
RP_FWD, RP_FWD_BWD, RP_ACT, RP_WEIGHTS, RP_GRADS, RP_WAIT, RP_CHUNK, RP_ACT_OUT = range(8)


@lru_cache(maxsize=32)
def roundpipe_graph(n: int, m: int, G: int):
    """The dependency graph of one RoundPipe iteration (arXiv 2604.27085;
    the ITcarrot/RoundPipe runtime: RoundPipe/RoundPipe.py
    ``forward_backward``, run.py ``run_forward`` / ``run_backward`` /
    ``run_forward_backward``, transfer.py ``async_h2d`` / ``async_d2h`` /
    ``upload_layers`` / ``download_layer``, device.py ``get_next_device``):
    ``G`` layer groups, ``n`` GPUs, ``m`` micro-batches, the tasks of
    :func:`pipesearch.schedules.roundpipe_tasks` (task ``t`` on GPU ``t mod
    n``, each running all micro-batches in order). Per GPU three chains:
    compute, host-to-device link, device-to-host link (PCIe is full duplex).

    * compute of micro-batch ``j`` of a task: ``fwd_s`` (``"F"``) or
      ``fwd_s + bwd_s`` (``"FB"``, and ``"B"``, which re-runs the group's
      forward from its input before the backward); it waits for its input
      copies (and so the task's weights, ahead of them on the link) and for
      the copy out of the GPU's previous micro-batch (``async_d2h`` makes the
      compute stream wait for the download stream);
    * copies in (``p2p_s`` of the boundary, on the GPU's host-to-device
      link): a forward's input (the previous group's output, after that
      copy out is over; none for group 0, whose input is the batch itself),
      a backward's saved input (the group boundary, kept in host memory
      since its forward) and its output gradient (after the next group's
      backward copied it out); the first copy of the GPU's ``k``-th
      micro-batch waits for its ``(k-2)``-th compute (the upload stream
      waits for the compute issued before: the GPU holds the micro-batch
      computing and the one arriving);
    * copies out (``p2p_s``, device-to-host link): a forward's output, a
      backward's input gradient (none for group 0); after a backward task's
      last micro-batch, its gradients (``swap_out_s``, accumulated on the GPU
      over the micro-batches);
    * weights in (``swap_in_s``): a GPU's first task copies them whole; a
      later task's weights are prefetched in ``m`` chunks, chunk ``j`` after
      the copies in of micro-batch ``j`` of the GPU's previous task
      (``upload_layers`` spreads them over the pending activation uploads),
      once the task two before on the GPU is done and its gradients are out
      (two groups' weights on the GPU).

    Copies on a GPU's link run one after another in this order; their
    durations are scaled per GPU by ``pcie_scale`` (its share of the switch
    uplink). Returns ``(graph, node kinds, groups, gpus, tasks,
    micro-batches)``, the last five ``(N,)`` arrays (-1 where not applicable).
    """
    NONE = -1
    tasks = schedule_lib.roundpipe_tasks(G, n)
    col: list[int] = []
    p1: list[int] = []
    p2: list[int] = []
    info: list[tuple[int, int, int]] = []

    def node(kind: int, g: int, d: int, a: int = NONE, b: int = NONE, task: int = NONE, mb: int = NONE) -> int:
        col.append((kind * G + max(g, 0)) * n + d)
        p1.append(a)
        p2.append(b)
        info.append((task, mb, kind))
        return len(col) - 1

    comp: list[list[int]] = [[] for _ in range(n)]
    outs: list[list[int]] = [[] for _ in range(n)]
    h2d = [NONE] * n
    d2h = [NONE] * n
    chunks: dict[int, list[int]] = {}
    end_of: dict[int, int] = {}
    out_of: dict[tuple[int, int], int] = {}
    for t, (kind, g, d) in enumerate(tasks):
        if t < n:  # the GPU's first task: its weights whole
            h2d[d] = node(RP_WEIGHTS, g, d, h2d[d], task=t)
            weights = h2d[d]
        else:
            weights = chunks[t][-1]
        nxt = t + n if t + n < len(tasks) else None
        freed = end_of.get(t - n, NONE)  # the buffer the next task's weights take
        for j in range(m):
            k = len(comp[d])
            room = comp[d][k - 2] if k >= 2 else NONE
            last_in = NONE
            if kind == "B" and g > 0:  # its saved input, from host memory
                h2d[d] = last_in = node(RP_ACT, g - 1, d, h2d[d], room, t, j)
                room = NONE
            boundary = {"F": g - 1, "FB": G - 2, "B": g}[kind]
            if 0 <= boundary < G - 1:  # the input (forward) or output gradient (backward) another task copied out
                dep = out_of[(t - 1, j)]
                if room != NONE:
                    dep = node(RP_WAIT, 0, d, room, dep)
                h2d[d] = last_in = node(RP_ACT, boundary, d, h2d[d], dep, t, j)
            ready = weights if last_in == NONE else last_in
            wait = node(RP_WAIT, 0, d, ready, outs[d][k - 1] if k else NONE)
            c = node(RP_FWD if kind == "F" else RP_FWD_BWD, g, d, comp[d][-1] if k else NONE, wait, t, j)
            comp[d].append(c)
            out_boundary = {"F": g, "FB": G - 2, "B": g - 1}[kind]
            if 0 <= out_boundary < G - 1:
                d2h[d] = node(RP_ACT_OUT, out_boundary, d, d2h[d], c, t, j)
            else:  # nothing to copy out (the first group's input gradient; one group)
                d2h[d] = node(RP_WAIT, 0, d, d2h[d], c, t, j)
            outs[d].append(d2h[d])
            out_of[(t, j)] = d2h[d]
            if nxt is not None:
                h2d[d] = node(RP_CHUNK, tasks[nxt][1], d, h2d[d], freed, nxt, j)
                chunks.setdefault(nxt, []).append(h2d[d])
        if kind != "F":  # the gradients accumulated over the micro-batches go to host memory
            d2h[d] = node(RP_GRADS, g, d, d2h[d], comp[d][-1], t)
            end_of[t] = d2h[d]
        else:
            end_of[t] = comp[d][-1]
    N = len(col)
    pred1 = np.array([x if x >= 0 else N for x in p1], dtype=np.int64)
    pred2 = np.array([x if x >= 0 else N for x in p2], dtype=np.int64)
    last = np.array([comp[d][-1] if comp[d] else 0 for d in range(n)], dtype=np.int64)
    g, new_id = _renumbered(np.array(col, dtype=np.int64), pred1, pred2, last)
    order = np.argsort(new_id[:N])
    arr = np.array(info, dtype=np.int64).reshape(-1, 3)[order]
    kinds = g.col // (G * n)
    return g, kinds, (g.col // n) % G, g.col % n, arr[:, 0], arr[:, 1]


def _roundpipe_durations(g: _Graph, times: StageTimes, n: int, m: int, G: int) -> np.ndarray:
    """Node durations of :func:`roundpipe_graph`, ``(N + 1, k)`` for ``k``
    splits: a table of its eight node kinds per (group, GPU), copies scaled
    by the GPU's ``pcie_scale``, a weight chunk ``swap_in_s / m``."""
    fwd, bwd = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (times.fwd_s, times.bwd_s))
    k = fwd.shape[0]
    act = np.concatenate([np.asarray(times.p2p_s, dtype=float).reshape(k, G - 1), np.zeros((k, 1))], axis=1)
    w_in = np.broadcast_to(np.asarray(times.swap_in_s, dtype=float), fwd.shape)
    g_out = np.broadcast_to(np.asarray(times.swap_out_s, dtype=float), fwd.shape)
    scale = np.ones(n) if times.pcie_scale is None else np.asarray(times.pcie_scale, dtype=float)
    ones = np.ones(n)
    per_kind = [(fwd, ones), (fwd + bwd, ones), (act, scale), (w_in, scale), (g_out, scale),
                (np.zeros_like(fwd), ones), (w_in / m, scale), (act, scale)]  # in the order RP_FWD .. RP_ACT_OUT
    table = np.concatenate([(x[:, :, None] * f[None, None, :]).reshape(k, G * n) for x, f in per_kind], axis=1).T
    dur = np.zeros((len(g.col) + 1, k))
    dur[:-1] = table[g.col]
    return dur


def _roundpipe_total(end_gpu, times: StageTimes):
    """``T`` from the GPU makespan: the CPU's optimizer step over all groups
    after it (``allreduce_s`` summed: RoundPipe's ``step(is_async=False)``
    waits for every gradient), or with ``delayed_host_s`` beside the next
    iteration (:func:`delayed_host_time_s` over one host)."""
    if times.delayed_host_s is not None:
        return np.maximum(end_gpu, delayed_host_time_s(times, 1))
    return end_gpu + np.atleast_2d(np.asarray(times.allreduce_s, dtype=float)).sum(axis=1)


def roundpipe_time_s(times: StageTimes, n: int, m: int, vp: int | None = None):
    """RoundPipe's ``T`` (:func:`roundpipe_graph` of the ``G`` layer groups
    of ``times`` on ``n`` GPUs; the search takes ``G = n vp``): the longest
    path of its graph, then the host's optimizer step
    (:func:`_roundpipe_total`). ``times`` of one split (``(G,)``: a float)
    or of ``k`` (``(k, G)``: an array)."""
    G = int(np.shape(times.fwd_s)[-1])
    single = np.ndim(times.fwd_s) == 1
    g = roundpipe_graph(n, m, G)[0]
    end = _node_ends(g, _roundpipe_durations(g, times, n, m, G))
    out = _roundpipe_total(end[:-1].max(axis=0), times)
    return float(out[0]) if single else out


def roundpipe_simulate(n: int, m: int, vp: int | None, times: StageTimes, act_bytes=None) -> tuple[float, Timeline]:
    """:func:`simulate_times` for RoundPipe: ``T`` and a :class:`Timeline`
    of its compute nodes (rank = GPU; a fused or backward task's nodes as
    ``B``). Each GPU holds one micro-batch's activations of the group it
    computes (the backward re-runs the forward): ``peak_act_bytes`` is the
    largest ``act_bytes`` of a group that GPU runs a backward of (a forward
    keeps none: its saved input is the host's copy)."""
    from .simulate import ActionRecord

    G = int(np.shape(times.fwd_s)[-1])
    g, kinds, groups, gpus, tasks, mbs = roundpipe_graph(n, m, G)
    dur = _roundpipe_durations(g, times, n, m, G)[:, 0]
    end = _node_ends(g, dur)
    T = float(_roundpipe_total(end[:-1].max(keepdims=True), times)[0])
    comp = np.flatnonzero((kinds == RP_FWD) | (kinds == RP_FWD_BWD))
    comp = comp[np.lexsort((end[comp], gpus[comp]))]
    records = tuple(ActionRecord(int(gpus[x]), "F" if kinds[x] == RP_FWD else "B", int(groups[x]), int(mbs[x]),
                                 float(end[x] - dur[x]), float(end[x])) for x in comp)
    busy = [float(dur[comp[gpus[comp] == d]].sum()) for d in range(n)]
    act = np.zeros(G) if act_bytes is None else np.asarray(act_bytes, dtype=float)
    peak = [max([float(act[r.stage]) for r in records if r.rank == d and r.kind == "B"], default=0.0)
            for d in range(n)]
    ends = [max((r.end_s for r in records if r.rank == d), default=0.0) for d in range(n)]
    total = max(ends, default=0.0)
    tasks_of = schedule_lib.roundpipe_tasks(G, n)
    return T, Timeline(records=records, num_ranks=n, num_stages=G, num_microbatches=m,
                       stage_to_rank=tuple(next(d for kind, gg, d in tasks_of if gg == s) for s in range(G)),
                       iteration_time_s=total, busy_s=tuple(busy),
                       busy_fraction=tuple(b / total if total > 0 else 0.0 for b in busy),
                       bubble_fraction=(1.0 - max(busy) / total) if total > 0 else 0.0,
                       mean_bubble_fraction=(1.0 - sum(busy) / n / total) if total > 0 else 0.0,
                       peak_act_bytes=tuple(peak), peak_in_flight=tuple([1] * G), rank_end_s=tuple(ends))


def roundpipe_copy_spans(times: StageTimes, n: int, m: int, vp: int | None = None
                         ) -> list[tuple[int, str, str, int, float, float]]:
    """RoundPipe's PCIe copies under ``times``, from :func:`roundpipe_graph`'s
    copy nodes: ``(gpu, direction, what, group, start_s, end_s)`` with
    direction ``"in"`` / ``"out"`` and what ``"weights"``, ``"grads"`` or
    ``"act"`` (``group`` is the boundary for ``"act"``), sorted by GPU,
    direction and start; a prefetch's chunks are listed one by one."""
    G = int(np.shape(times.fwd_s)[-1])
    g, kinds, groups, gpus, tasks, mbs = roundpipe_graph(n, m, G)
    dur = _roundpipe_durations(g, times, n, m, G)[:, 0]
    end = _node_ends(g, dur)
    out = []
    names = {RP_ACT: ("in", "act"), RP_WEIGHTS: ("in", "weights"), RP_CHUNK: ("in", "weights"),
             RP_GRADS: ("out", "grads"), RP_ACT_OUT: ("out", "act")}
    for x in np.flatnonzero(np.isin(kinds, list(names))):
        direction, what = names[int(kinds[x])]
        out.append((int(gpus[x]), direction, what, int(groups[x]), float(end[x] - dur[x]), float(end[x])))
    return sorted(out, key=lambda c: (c[0], c[1], c[4]))
