"""Read PipeDream profiler output (``graph.txt``) and turn its DAG into a chain.

PipeDream (Narayanan et al., SOSP'19, github.com/msr-fiddle/pipedream) writes
one line per node and one per edge::

    node4 -- Conv2d(64, 64, kernel_size=(3, 3)) -- forward_compute_time=46.201, backward_compute_time=113.330, activation_size=1644167168.000, parameter_size=147712.000
    \tnode3 -- node4

Times are milliseconds for one batch, sizes bytes (4 bytes per element: the
profiler multiplies element counts by 4). ``activation_size`` may be a list
``[a; b; c]`` for nodes with several outputs (LSTMs: output, h, c); its sum is
used. The batch size is not in the file; :func:`infer_batch_size` derives it.

Chain conversion (:func:`chain_blocks`). The *main* graph is the input node
that reaches most nodes (ties: first in the file) plus everything it reaches;
the remaining nodes (side inputs such as GNMT's source lengths, target tokens
and initial hidden state, and nodes computed only from them) are data any
stage can load, so their edges carry no live state. A main-graph node ``v``
is a block boundary when it is an ancestor of the model's output (the
main-graph sink with the most ancestors; ties: the last) and every edge
entering the set of its descendants comes from ``v``: cutting the graph
there leaves ``v``'s output as the only live tensor. With one input and one
output this is exactly "``v`` lies on every input-output path" (``v``
dominates the output); dead-end nodes (unused LSTM hidden states, auxiliary
heads, shape queries) stay on the side of the cut that produced them. These
boundaries are totally ordered; block ``k`` holds what lies after boundary
``k-1`` up to boundary ``k``, the last block the rest, and a side node joins
the earliest block that holds one of its main-graph descendants. Per block:
times and parameter bytes are sums, ``output_bytes`` is the boundary node's
activation size and ``saved_bytes`` the sum of its nodes' activation sizes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import networkx as nx

from ..catalog import entry_name
from ..errors import InputError
from ..input_files import read_input_text
from ..limits import MAX_BYTES, MAX_COUNT, MAX_LAYER_S, MIN_LAYER_S
from ..types import Layer, ModelProfile

_NODE_RE = re.compile(
    r"^\s*(\S+) -- (.*) -- forward_compute_time=([^,]*), backward_compute_time=([^,]*), "
    r"activation_size=(.*), parameter_size=([^,]*?)\s*$"
)
_EDGE_RE = re.compile(r"^\s*(\S+) -- (\S+)\s*$")
_IMAGE_SIZES = (224, 299, 331)


@dataclass(frozen=True)
class Node:
    """One profiled op. Times in milliseconds, sizes in bytes, at the profile's batch."""

    id: str
    op: str
    fwd_ms: float
    bwd_ms: float
    activation_bytes: tuple[float, ...]
    param_bytes: float
    line: int

    @property
    def output_bytes(self) -> float:
        return math.fsum(self.activation_bytes)


# ----------------------------------------------------------------- parsing


def _value(path: Path, number: int, field: str, text: str) -> float:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        value = None
    if value is None or not value.is_finite() or value < 0:
        raise InputError(f"{path}: line {number}: {field}={text.strip()!r} is not a finite "
                         "number >= 0; fix or regenerate the profile")
    high, unit = (MAX_LAYER_S * 1e3, "ms") if field.endswith("_time") else (MAX_BYTES, "bytes")
    if unit == "ms" and 0 < value < Decimal(repr(MIN_LAYER_S * 1e3)):
        raise InputError(f"{path}: line {number}: {field}={text.strip()!r} is less than {MIN_LAYER_S * 1e3:g} ms "
                         "(1 ns) but not 0; fix or regenerate the profile")
    if value > Decimal(repr(high)):
        raise InputError(f"{path}: line {number}: {field}={text.strip()!r} is more than {high:g} {unit}; "
                         "fix or regenerate the profile")
    return float(value)


def parse_graph_txt(path: str | Path) -> nx.DiGraph:
    """Parse a PipeDream ``graph.txt`` into a DAG.

    Returns:
        ``nx.DiGraph`` whose nodes carry a ``node`` attribute (:class:`Node`),
        added in file order.

    Raises:
        InputError: unreadable file, malformed line (with its number), negative
            or NaN/inf value, duplicate node, edge naming an unknown node, a
            cycle (naming its nodes), no nodes, a graph that is not one
            connected model (:func:`check_connected`).
    """
    path = Path(path)
    text = read_input_text(path, "PipeDream profile")
    graph = nx.DiGraph()
    edges: list[tuple[int, str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = _NODE_RE.match(line)
        if m:
            node_id, op, fwd, bwd, act, params = m.groups()
            if node_id in graph:
                first = graph.nodes[node_id]["node"].line
                raise InputError(f"{path}: line {number}: node {node_id!r} defined again "
                                 f"(first on line {first}); node ids must be unique")
            act = act.strip()
            parts = act[1:-1].split(";") if act.startswith("[") and act.endswith("]") else [act]
            node = Node(
                id=node_id, op=op.strip(),
                fwd_ms=_value(path, number, "forward_compute_time", fwd),
                bwd_ms=_value(path, number, "backward_compute_time", bwd),
                activation_bytes=tuple(_value(path, number, "activation_size", p) for p in parts),
                param_bytes=_value(path, number, "parameter_size", params),
                line=number,
            )
            graph.add_node(node_id, node=node)
            continue
        m = _EDGE_RE.match(line)
        if m:
            edges.append((number, m.group(1), m.group(2)))
            continue
        raise InputError(f"{path}: line {number}: cannot parse {line.strip()[:80]!r}; expected "
                         "'nodeN -- <op> -- forward_compute_time=F, backward_compute_time=B, "
                         "activation_size=A, parameter_size=P' or 'nodeA -- nodeB'")
    if graph.number_of_nodes() == 0:
        raise InputError(f"{path}: no node lines; not a PipeDream graph.txt profile")
    for number, a, b in edges:
        for end in (a, b):
            if end not in graph:
                raise InputError(f"{path}: line {number}: edge {a} -- {b} names unknown node "
                                 f"{end!r} (dangling edge); add its node line or drop the edge")
        graph.add_edge(a, b, line=number)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        check_connected(graph, path)
        return graph
    names = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
    last = max(cycle, key=lambda e: graph.edges[e[0], e[1]]["line"])
    at = graph.edges[last[0], last[1]]["line"]
    raise InputError(f"{path}: line {at}: the edge {last[0]} -- {last[1]} closes a cycle {names} (its edges on "
                     f"lines {', '.join(map(str, sorted(graph.edges[u, v]['line'] for u, v in cycle)))}); a profile "
                     "must be a DAG: drop the edge that goes back")


def _line_of(graph: nx.DiGraph, node_id: str) -> int:
    return graph.nodes[node_id]["node"].line


def check_connected(graph: nx.DiGraph, path: str | Path = "profile") -> None:
    """Check that a profile DAG is one model: connected (ignoring edge
    direction), with edges unless it is a single node, and still connected once its inputs
    (the nodes without predecessors) are removed, so that every op computes
    from the same stream of data rather than from nothing.

    Raises:
        InputError: no edges; a node or group of nodes connected to nothing
            else (named with its line); ops that only share an input.
    """
    if graph.number_of_edges() == 0 and graph.number_of_nodes() > 1:
        raise InputError(f"{path}: {graph.number_of_nodes()} node lines but no edge lines "
                         "('nodeA -- nodeB'); a profile is a graph of ops, regenerate it with its edges")
    parts = sorted(nx.weakly_connected_components(graph), key=lambda c: min(map(_line_of_in(graph), c)))
    if len(parts) > 1:
        stray = min(parts[1:], key=len)
        first = min(stray, key=_line_of_in(graph))
        others = f" and {len(stray) - 1} node(s) linked to it are" if len(stray) > 1 else " is"
        raise InputError(f"{path}: line {_line_of(graph, first)}: node {first!r}{others} connected to nothing else; the graph has {len(parts)} separate parts, "
                         "a profile must be one model: add the missing edges or drop the nodes")
    inputs = [n for n in graph if graph.in_degree(n) == 0]
    ops = graph.subgraph(n for n in graph if graph.in_degree(n) > 0)
    pieces = list(nx.weakly_connected_components(ops))
    if len(pieces) > 1:
        heads = sorted((min(c, key=_line_of_in(graph)) for c in pieces), key=_line_of_in(graph))
        raise InputError(f"{path}: once the inputs ({', '.join(inputs)}) are removed the ops form "
                         f"{len(pieces)} separate graphs (first in the file: {', '.join(heads)}); a profile must be "
                         "one model whose ops are connected")


def _line_of_in(graph: nx.DiGraph):
    return lambda n: _line_of(graph, n)


# ----------------------------------------------------------------- batch size


def _op_name(op: str) -> str:
    """``'Conv2d(3, 64, ...)'`` -> ``'Conv2d'``; ``'__getitem__(0)'`` -> ``'getitem'``."""
    name = re.sub(r"[^A-Za-z0-9]", "", op.split("(", 1)[0])
    return name or "node"


def infer_batch_size(graph: nx.DiGraph, path: str | Path = "profile") -> tuple[int, str]:
    """Batch size of a profile, from its tensor sizes (4 bytes per element).

    Tries, in order: an ``Input`` node holding ``B x 3 x S x S`` images for
    ``S`` in 224, 299, 331; then an ``LSTM(in, hidden)`` node with outputs
    ``[output; h; c]`` where ``h`` is ``1 x B x hidden``.

    Returns:
        ``(batch_size, explanation)``.

    Raises:
        InputError: neither rule applies; pass the batch size explicitly.
    """
    nodes = [graph.nodes[n]["node"] for n in graph]
    for node in nodes:
        if node.op == "Input" and node.output_bytes > 0:
            for size in _IMAGE_SIZES:
                per_sample = 4 * 3 * size * size
                batch = node.output_bytes / per_sample
                if batch.is_integer() and batch >= 1:
                    return int(batch), (f"batch size {int(batch)}: input {node.id} holds "
                                        f"{node.output_bytes:.0f} bytes = {int(batch)} x 3x{size}x{size} "
                                        "fp32 images")
    for node in nodes:
        m = re.match(r"LSTM\((\d+), (\d+)", node.op)
        if m and len(node.activation_bytes) == 3:
            hidden = int(m.group(2))
            batch = node.activation_bytes[1] / (4 * hidden)
            if batch.is_integer() and batch >= 1:
                batch = int(batch)
                text = (f"batch size {batch}: hidden state h of {node.id} {node.op} holds "
                        f"{node.activation_bytes[1]:.0f} bytes = 1 x {batch} x {hidden} fp32")
                for emb in nodes:
                    e = re.match(r"Embedding\((\d+), (\d+)", emb.op)
                    if e and emb.output_bytes > 0:
                        length = emb.output_bytes / (4 * batch * int(e.group(2)))
                        text += (f"; {emb.id} {emb.op.split(',')[0]}, {e.group(2)}) output "
                                 f"{emb.output_bytes:.0f} bytes = {batch} sequences x {length:g} tokens")
                return batch, text
    raise InputError(f"{path}: cannot infer the batch size from the tensor sizes (no Input node of "
                     "3x224x224, 3x299x299 or 3x331x331 fp32 images, no LSTM hidden state); write the profile "
                     "as a CSV with a '# batch_size: N' line (docs/formats.md)")


# ----------------------------------------------------------------- chain


def _main_and_side(graph: nx.DiGraph, topo: list[str]) -> tuple[str, set[str]]:
    """The primary input (reaches most nodes; ties: first in the file) and the main graph."""
    sources = [n for n in topo if graph.in_degree(n) == 0]
    reach = {s: nx.descendants(graph, s) | {s} for s in sources}
    primary = max(sources, key=lambda s: len(reach[s]))
    return primary, reach[primary]


def chain_blocks(graph: nx.DiGraph) -> list[list[str]]:
    """Partition a profile DAG into a chain of blocks (rules in the module docstring).

    A boundary ``v`` is found as: ``v`` is an ancestor of the output and
    dominates (from the primary input) every one of its descendants, i.e. its
    dominator-tree subtree has as many nodes as ``v`` and its descendants.

    Returns:
        Blocks in execution order, each a list of node ids in a topological
        order whose last element is the block's boundary node (for the last
        block: its last node). Every node is in exactly one block.
    """
    order = {n: i for i, n in enumerate(graph)}
    topo = list(nx.lexicographical_topological_sort(graph, key=lambda n: order[n]))
    primary, main = _main_and_side(graph, topo)
    sub = graph.subgraph(main)
    main_topo = [n for n in topo if n in main]
    bit = {n: 1 << i for i, n in enumerate(main_topo)}
    above = {}  # ancestors as bit sets
    for n in main_topo:
        above[n] = 0
        for p in sub.predecessors(n):
            above[n] |= above[p] | bit[p]
    below = {}  # descendants as bit sets
    for n in reversed(main_topo):
        below[n] = 0
        for c in sub.successors(n):
            below[n] |= below[c] | bit[c]
    sinks = [n for n in main_topo if sub.out_degree(n) == 0]
    output = max(reversed(sinks), key=lambda t: above[t].bit_count())
    idom = nx.immediate_dominators(sub, primary)
    dominated = dict.fromkeys(main_topo, 1)  # dominator-subtree sizes
    for n in reversed(main_topo):
        if n != primary:
            dominated[idom[n]] += dominated[n]
    cuts = [v for v in main_topo if above[output] & bit[v]
            and dominated[v] == below[v].bit_count() + 1]
    blocks: list[set[str]] = []
    done, every = 0, (1 << len(main_topo)) - 1  # bit sets over main_topo
    for v in cuts:  # cuts above one output are totally ordered
        prefix = every & ~below[v]  # the main nodes that do not follow v
        assert done & ~prefix == 0 and done != prefix, "single-tensor cuts above one output are nested"
        blocks.append(set(_members(prefix & ~done, main_topo)))
        done = prefix
    blocks.append(set(_members(every & ~done, main_topo)))
    index = {n: k for k, block in enumerate(blocks) for n in block}
    for n in (n for n in topo if n not in main):
        index[n] = min((index[d] for d in nx.descendants(graph, n) if d in main), default=0)
        blocks[index[n]].add(n)
    at = {n: i for i, n in enumerate(topo)}
    result = []
    for k, block in enumerate(blocks):
        ordered = sorted(block, key=at.__getitem__)
        if k < len(cuts):  # the boundary has no successor inside its block
            ordered.remove(cuts[k])
            ordered.append(cuts[k])
        result.append(ordered)
    placed = [n for block in result for n in block]
    assert len(placed) == len(set(placed)) == graph.number_of_nodes(), "blocks must partition the graph"
    return result


def _members(bits: int, names: list[str]) -> list[str]:
    """The names at the set bits of ``bits`` (bit ``i``: ``names[i]``), in
    increasing order of bit (each found from the lowest set bit: linear in
    the members, not in the names)."""
    out = []
    while bits:
        low = bits & -bits
        out.append(names[low.bit_length() - 1])
        bits ^= low
    return out


def _ms_sum_to_s(values) -> float:
    """Sum of millisecond floats, in seconds, rounded once (decimal arithmetic),
    so a single 17.972 ms node becomes exactly float('0.017972')."""
    return float(sum((Decimal(repr(v)) for v in values), Decimal(0)).scaleb(-3))


def blocks_to_layers(graph: nx.DiGraph, blocks: list[list[str]]) -> tuple[Layer, ...]:
    """One :class:`Layer` per block; ms -> s, bytes unchanged."""
    width = max(2, len(str(len(blocks) - 1)))
    layers = []
    for k, block in enumerate(blocks):
        nodes = [graph.nodes[n]["node"] for n in block]
        if len(nodes) == 1:
            label = _op_name(nodes[0].op)
        else:  # the op with the most compute; ties: the later one
            label = _op_name(max(reversed(nodes), key=lambda nd: nd.fwd_ms + nd.bwd_ms).op)
        layers.append(Layer(
            name=f"b{k:0{width}d}_{label}",
            fwd_s=_ms_sum_to_s(nd.fwd_ms for nd in nodes),
            bwd_s=_ms_sum_to_s(nd.bwd_ms for nd in nodes),
            param_bytes=math.fsum(nd.param_bytes for nd in nodes),
            output_bytes=nodes[-1].output_bytes,
            saved_bytes=math.fsum(nd.output_bytes for nd in nodes),
        ))
    return tuple(layers)


def read_graph_txt(path: str | Path, batch_size: int | None = None,
                   device: str | None = None) -> ModelProfile:
    """Read a PipeDream ``graph.txt`` as a chain :class:`ModelProfile`.

    Args:
        path: the profile; the model name is the file name without
            ``.graph.txt`` (or ``graph.txt``'s parent directory name).
        batch_size: samples per batch the profile was measured at; None infers
            it (:func:`infer_batch_size`).
        device: device the times were measured on; None means ``"unknown"``.

    Returns:
        One layer per block (:func:`chain_blocks`), times in seconds, sizes in
        bytes at the batch size; ``bytes_per_param`` 4 (fp32); ``source``
        names the file, the node and block counts and the batch derivation.

    Raises:
        InputError: see :func:`parse_graph_txt`; batch size not positive or
            not inferable.
    """
    path = Path(path)
    graph = parse_graph_txt(path)
    if batch_size is None:
        batch_size, how = infer_batch_size(graph, path)
        if batch_size > MAX_COUNT:
            raise InputError(f"{path}: {how.split(':')[0]} is more than {MAX_COUNT} (the largest a profile "
                             "states); the Input node's activation_size is not a batch of images")
    else:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise InputError(f"{path}: batch_size {batch_size!r} must be a positive integer")
        how = f"batch size {batch_size}: given by the caller"
    blocks = chain_blocks(graph)
    name = entry_name(path) if path.name != "graph.txt" else path.parent.name
    source = "\n".join([
        f"PipeDream profile {path.name}: {graph.number_of_nodes()} nodes, "
        f"{graph.number_of_edges()} edges -> {len(blocks)} chain blocks "
        "(single-tensor cuts, pipesearch.profiles.pipedream)",
        how,
    ])
    return ModelProfile(name=name, layers=blocks_to_layers(graph, blocks),
                        profiled_batch_size=batch_size, profiled_device=device or "unknown",
                        bytes_per_param=4.0, source=source)
