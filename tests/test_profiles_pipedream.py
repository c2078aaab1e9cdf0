"""PipeDream graph.txt reader: parsing, validation, chain blocks, batch size."""

from __future__ import annotations

import math
import re
import shutil
import sys
from pathlib import Path

import networkx as nx
import pytest

from pipesearch.errors import InputError
from pipesearch.profiles import load_model, read_profile_csv
from pipesearch.profiles.pipedream import chain_blocks, infer_batch_size, parse_graph_txt, read_graph_txt

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "pipedream"
FILES = sorted(DATA.glob("*.graph.txt"))
NODE_LINE = re.compile(r"^(\S+) -- (.*) -- forward_compute_time=([\d.]+), backward_compute_time=([\d.]+), "
                       r"activation_size=(\[.*\]|[\d.]+), parameter_size=([\d.]+)$")


def node(name, fwd, bwd, act, params=0.0, op="Op"):
    return (f"{name} -- {op} -- forward_compute_time={fwd}, backward_compute_time={bwd}, "
            f"activation_size={act}, parameter_size={params}\n")


DIAMOND = (
    node("a", 1.0, 0.0, 400.0, op="Input")
    + node("b", 2.0, 3.0, 100.0, 10.0, op="Conv2d(1, 1)")
    + node("c", 4.0, 5.0, 200.0, 20.0, op="Linear(in_features=1)")
    + node("d", 0.5, 0.25, 300.0, op="Add")
    + node("e", 6.0, 7.0, 50.0, 30.0, op="Linear(in_features=2)")
    + "\ta -- b\n\ta -- c\n\tb -- d\n\tc -- d\n\td -- e\n"
)


def file_nodes(path):
    """Independent parse: {node: (op, fwd, bwd, activation sum, params)} by regex."""
    out = {}
    for line in path.read_text().splitlines():
        m = NODE_LINE.match(line)
        if m:
            act = sum(float(x) for x in m.group(5).strip("[]").split(";"))
            out[m.group(1)] = (m.group(2), float(m.group(3)), float(m.group(4)), act, float(m.group(6)))
    return out


def write(tmp_path, text, name="model.graph.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------- hand-made graphs


def test_diamond_blocks_by_hand(tmp_path):
    path = write(tmp_path, DIAMOND, "diamond.graph.txt")
    assert chain_blocks(parse_graph_txt(path)) == [["a"], ["b", "c", "d"], ["e"]]
    profile = read_graph_txt(path, batch_size=2, device="v100-16gb")
    assert profile.name == "diamond"
    assert profile.profiled_batch_size == 2 and profile.profiled_device == "v100-16gb"
    assert [layer.name for layer in profile.layers] == ["b00_Input", "b01_Linear", "b02_Linear"]
    a, bcd, e = profile.layers
    assert (a.fwd_s, a.bwd_s, a.param_bytes, a.output_bytes, a.saved_bytes) == (0.001, 0.0, 0.0, 400.0, 400.0)
    # b + c + d: fwd 2 + 4 + 0.5 ms, bwd 3 + 5 + 0.25 ms, params 10 + 20, out = d's 300,
    # saved 100 + 200 + 300; the dominant op is c (4 + 5 ms)
    assert bcd.name == "b01_Linear"
    assert (bcd.fwd_s, bcd.bwd_s) == (0.0065, 0.00825)
    assert (bcd.param_bytes, bcd.output_bytes, bcd.saved_bytes) == (30.0, 300.0, 600.0)
    assert (e.fwd_s, e.bwd_s, e.param_bytes, e.output_bytes, e.saved_bytes) == (0.006, 0.007, 30.0, 50.0, 50.0)


def test_dead_end_and_side_input(tmp_path):
    # x -> l (list output) -> g0 -> y ; l -> g1 (unused); side input s -> y
    text = (node("x", 1, 0, 8, op="Input0") + node("l", 2, 2, "[8.0; 1.0; 1.0]", 5, op="LSTM(2, 2)")
            + node("g0", 0, 0, 8, op="__getitem__(0)") + node("g1", 0, 0, 1, op="__getitem__(1)")
            + node("s", 0, 0, 0, op="Input1") + node("y", 3, 3, 4, 7, op="Linear(in_features=2)")
            + "\tx -- l\n\tl -- g0\n\tl -- g1\n\tg0 -- y\n\ts -- y\n")
    path = write(tmp_path, text)
    blocks = chain_blocks(parse_graph_txt(path))
    assert blocks == [["x"], ["l"], ["g1", "g0"], ["s", "y"]]
    profile = read_graph_txt(path, batch_size=1)
    assert profile.layers[1].output_bytes == 10.0  # list activation: 8 + 1 + 1
    assert profile.layers[2].name == "b02_getitem" and profile.layers[2].saved_bytes == 9.0


def test_skip_connection_is_not_cut(tmp_path):
    # a -> b -> c -> d, a -> d: only a and d bound blocks
    text = (node("a", 1, 1, 1) + node("b", 1, 1, 1) + node("c", 1, 1, 1) + node("d", 1, 1, 1)
            + "a -- b\nb -- c\nc -- d\na -- d\n")
    assert chain_blocks(parse_graph_txt(write(tmp_path, text))) == [["a"], ["b", "c", "d"]]


# ----------------------------------------------------------------- errors

GOOD_NODE = node("node1", 1, 1, 4)


@pytest.mark.parametrize(
    "text, needles",
    [
        (GOOD_NODE + "node2 -- Conv -- forward_compute_time=1\n", ["line 2", "cannot parse"]),
        (GOOD_NODE + "garbage\n", ["line 2", "'garbage'"]),
        (GOOD_NODE + node("node2", 1, -2.5, 4), ["line 2", "backward_compute_time='-2.5'"]),
        (GOOD_NODE + node("node2", "nan", 1, 4), ["line 2", "forward_compute_time='nan'"]),
        (GOOD_NODE + node("node2", 1, 1, "[1.0; inf]"), ["line 2", "activation_size='inf'"]),
        (GOOD_NODE + node("node2", 1, 1, 4, "x"), ["line 2", "parameter_size='x'"]),
        (GOOD_NODE + node("node1", 1, 1, 4), ["line 2", "'node1'", "line 1"]),
        (GOOD_NODE + "\tnode1 -- node9\n", ["line 2", "'node9'", "dangling"]),
        (GOOD_NODE + node("node2", 1, 1, 4) + node("node3", 1, 1, 4)
         + "\tnode1 -- node2\n\tnode2 -- node3\n\tnode3 -- node2\n", ["cycle", "node2", "node3"]),
        (GOOD_NODE + "\tnode1 -- node1\n", ["cycle", "node1 -> node1"]),
        ("", ["no node lines"]),
        ("\tnode1 -- node2\n", ["no node lines"]),
    ],
)
def test_bad_graph_names_file_and_line(tmp_path, text, needles):
    path = write(tmp_path, text, "broken.graph.txt")
    with pytest.raises(InputError) as info:
        read_graph_txt(path, batch_size=1)
    message = str(info.value)
    assert "broken.graph.txt" in message and "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_bad_batch_size(tmp_path):
    path = write(tmp_path, DIAMOND)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match="batch_size"):
            read_graph_txt(path, batch_size=bad)
    no_hint = write(tmp_path, node("n1", 1, 1, 12, op="Conv2d(1, 1)"), "nohint.graph.txt")
    with pytest.raises(InputError, match="nohint.graph.txt.*batch"):
        read_graph_txt(no_hint)


def test_an_inferred_batch_past_the_profile_limit_is_refused(tmp_path):
    """An Input node of 2^40 images of 3x224x224 fp32 (a corrupted size):
    the inferred batch is more than a profile may state (2^31 - 1), refused
    as a CSV's batch_size is; the fix for an uninferable batch names the
    CSV header that states it."""
    images = 2**40 * 4 * 3 * 224 * 224
    path = write(tmp_path, node("n1", 0, 0, images, op="Input") + node("n2", 1, 2, 1000, 10, op="Conv2d(3, 64)")
                 + "\tn1 -- n2\n", "huge.graph.txt")
    with pytest.raises(InputError, match=r"huge.graph.txt: batch size 1099511627776 is more than 2147483647"):
        read_graph_txt(path)
    no_hint = write(tmp_path, node("n1", 1, 1, 12, op="Conv2d(1, 1)"), "nohint.graph.txt")
    with pytest.raises(InputError, match="# batch_size: N"):
        read_graph_txt(no_hint)


def test_a_byte_order_mark_is_not_part_of_the_first_node(tmp_path):
    """A file saved with a UTF-8 byte-order mark reads as without it (the
    mark had become part of the first node's id: a dangling edge)."""
    plain = write(tmp_path, DIAMOND, "plain.graph.txt")
    marked = tmp_path / "marked.graph.txt"
    marked.write_bytes(b"\xef\xbb\xbf" + DIAMOND.encode())
    assert read_graph_txt(marked, batch_size=1).layers == read_graph_txt(plain, batch_size=1).layers


def test_a_long_chain_is_one_block_per_node(tmp_path):
    """A chain of 6,000 nodes is 6,000 blocks, one per node, its times and
    sizes those of its nodes (each block used to be found by a pass over
    every node: quadratic, minutes at 30,000)."""
    n = 6000
    text = node("n0", 0, 0, 4 * 3 * 224 * 224 * 8, op="Input") + "".join(
        node(f"n{k}", k % 7 + 1, k % 5 + 1, 1000 + k, k, op="Conv2d(3, 3)") for k in range(1, n))
    text += "".join(f"\tn{k} -- n{k + 1}\n" for k in range(n - 1))
    prof = read_graph_txt(write(tmp_path, text, "chain.graph.txt"))
    assert prof.profiled_batch_size == 8 and len(prof.layers) == n
    assert [lay.output_bytes for lay in prof.layers[1:4]] == [1001, 1002, 1003]
    assert prof.layers[-1].param_bytes == n - 1


# ----------------------------------------------------------------- real profiles


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_node_in_one_block_and_totals_preserved(path):
    nodes = file_nodes(path)
    graph = parse_graph_txt(path)
    assert set(graph) == set(nodes)
    blocks = chain_blocks(graph)
    placed = [n for block in blocks for n in block]
    assert sorted(placed) == sorted(nodes)  # each node exactly once
    position = {n: k for k, block in enumerate(blocks) for n in block}
    for u, w in graph.edges:  # the chain respects every dependency
        assert position[u] <= position[w]
    profile = read_graph_txt(path)
    assert profile.num_layers == len(blocks)
    assert len({layer.name for layer in profile.layers}) == len(blocks)
    assert math.isclose(sum(lay.fwd_s for lay in profile.layers), sum(v[1] for v in nodes.values()) / 1e3)
    assert math.isclose(sum(lay.bwd_s for lay in profile.layers), sum(v[2] for v in nodes.values()) / 1e3)
    assert math.isclose(sum(lay.saved_bytes for lay in profile.layers), sum(v[3] for v in nodes.values()))
    assert math.isclose(sum(lay.param_bytes for lay in profile.layers), sum(v[4] for v in nodes.values()))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_cut_leaves_one_live_tensor(path):
    """Independent check of the cut rule: an edge that crosses the cut after
    block k starts at block k's last node, or at a node the primary input
    does not reach (a side input)."""
    graph = parse_graph_txt(path)
    blocks = chain_blocks(graph)
    sources = [n for n in graph if graph.in_degree(n) == 0]
    primary = max(sources, key=lambda s: len(nx.descendants(graph, s)))
    main = nx.descendants(graph, primary) | {primary}
    position = {n: k for k, block in enumerate(blocks) for n in block}
    for k, block in enumerate(blocks[:-1]):
        crossing = {u for u, w in graph.edges if u in main and position[u] <= k < position[w]}
        assert crossing == {block[-1]}, (k, crossing)


def test_vgg16_is_one_block_per_node_but_the_shape_query():
    path = DATA / "vgg16.graph.txt"
    nodes = file_nodes(path)
    profile = read_graph_txt(path)
    blocks = chain_blocks(parse_graph_txt(path))
    sizes = [n for n, v in nodes.items() if v[0].startswith("Size")]
    assert sizes == ["node33"]  # Size(0) feeds View(-1) beside the MaxPool output
    assert len(blocks) == len(nodes) - 1 == profile.num_layers == 40
    assert [b for b in blocks if len(b) > 1] == [["node33", "node34"]]
    total_fwd_ms = sum(float(x) for x in re.findall(r"forward_compute_time=([\d.]+)", path.read_text()))
    assert math.isclose(sum(layer.fwd_s for layer in profile.layers), total_fwd_ms / 1000)
    assert profile.layers[0].name == "b00_Input" and profile.layers[-1].name == "b39_Linear"


def test_alexnet_chain():
    nodes = file_nodes(DATA / "alexnet.graph.txt")
    blocks = chain_blocks(parse_graph_txt(DATA / "alexnet.graph.txt"))
    assert len(blocks) == len(nodes) - sum(v[0].startswith("Size") for v in nodes.values())


def test_batch_sizes_from_tensor_sizes():
    vgg = file_nodes(DATA / "vgg16.graph.txt")
    conv = next(v for v in vgg.values() if v[0].startswith("Conv2d(128, 256"))
    assert conv[3] == 256 * 56 * 56 * 4 * 128  # fp32 output at 56x56, batch 128
    assert read_graph_txt(DATA / "vgg16.graph.txt").profiled_batch_size == 128
    assert read_graph_txt(DATA / "resnet50.graph.txt").profiled_batch_size == 128
    assert read_graph_txt(DATA / "alexnet.graph.txt").profiled_batch_size == 256
    assert read_graph_txt(DATA / "inception_v3.graph.txt").profiled_batch_size == 128  # 299x299
    gnmt = file_nodes(DATA / "gnmt.graph.txt")
    classifier = next(v for v in gnmt.values() if v[0].startswith("Classifier"))
    assert classifier[3] == 32 * 47 * 32320 * 4  # batch 32 x 47 target tokens x vocabulary, fp32
    batch, how = infer_batch_size(parse_graph_txt(DATA / "gnmt.graph.txt"))
    assert batch == 32 and "48 tokens" in how


def test_gnmt_side_inputs_and_blocks():
    graph = parse_graph_txt(DATA / "gnmt.graph.txt")
    blocks = chain_blocks(graph)
    ops = {n: graph.nodes[n]["node"].op for n in graph}
    block_of = {n: k for k, block in enumerate(blocks) for n in block}
    # Input1 (source lengths) joins its first consumer, the bidirectional encoder LSTM
    assert block_of["node2"] == block_of["node5"]
    # the decoder's attention context feeds every decoder layer: no cut inside it
    assert block_of["node24"] == block_of["node47"]
    assert ops[blocks[-1][-1]].startswith("Classifier")


def test_catalog_matches_test_data():
    for path in FILES:
        name = path.name.removesuffix(".graph.txt")
        catalog = read_profile_csv(REPO / "cost_models" / f"{name}.csv")
        fresh = read_graph_txt(path)
        assert catalog.layers == fresh.layers
        assert catalog.profiled_batch_size == fresh.profiled_batch_size
        assert "msr-fiddle/pipedream" in catalog.source
    assert load_model("vgg16").layers == read_graph_txt(DATA / "vgg16.graph.txt").layers


def test_convert_script(tmp_path):
    sys.path.insert(0, str(REPO / "cost_models"))
    try:
        import _convert_pipedream as convert
    finally:
        sys.path.remove(str(REPO / "cost_models"))
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(DATA / "gnmt.graph.txt", src)
    rows = convert.convert(src, tmp_path)
    assert rows == [("gnmt", 48, len(chain_blocks(parse_graph_txt(DATA / "gnmt.graph.txt"))), 32)]
    profile = read_profile_csv(tmp_path / "gnmt.csv")
    assert profile.layers == read_graph_txt(DATA / "gnmt.graph.txt").layers
    assert "profiler/translation/profiles/gnmt/graph.txt" in profile.source
