"""Tests of the hardware catalog and its loader (pipesearch.hardware).

Expected values are derived by hand from the datasheets cited in the catalog
files, not from the loader: 80 GiB = 80 * 2**30 bytes, 312 TFLOPS = 312e12
FLOP/s, one 200 Gb/s HDR port per GPU = 25e9 bytes/s.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipesearch import catalog
from pipesearch.errors import CatalogError, InputError
from pipesearch.hardware import (
    describe_cluster,
    list_clusters,
    list_devices,
    load_cluster,
    load_device,
)

DEVICES = ["v100-16gb", "v100-32gb", "v100-pcie-16gb", "a100-40gb", "a100-80gb",
           "h100-80gb", "h200-141gb", "cpu"]
CLUSTERS = ["1x4-v100-pcie", "4x4-v100-10gbe", "2x8-v100-nvlink-25gbe", "1x8-a100-80gb",
            "2x8-a100-80gb", "4x8-h100", "1x2-cpu", "mixed-a100-v100"]


# --------------------------------------------------------------------------- #
# catalog contents


def test_catalog_lists_the_shipped_entries():
    assert set(DEVICES) <= set(list_devices())
    assert set(CLUSTERS) <= set(list_clusters())
    assert list_devices() == sorted(list_devices())


@pytest.mark.parametrize("name", DEVICES)
def test_every_catalog_device_loads(name):
    d = load_device(name)
    assert d.name == name  # the file's name key matches its catalog name
    assert d.memory_bytes > 1e9
    assert d.peak_fp16_flops >= d.peak_fp32_flops > 0
    assert d.hbm_bandwidth_bytes_per_s > 0
    assert 0 < d.achieved_fraction <= 1
    assert d.description


@pytest.mark.parametrize("name", CLUSTERS)
def test_every_catalog_cluster_loads(name):
    c = load_cluster(name)
    assert c.name == name
    assert c.num_devices >= 2
    assert c.intra_node.bandwidth_bytes_per_s > 0 and c.inter_node.latency_s >= 0
    info = describe_cluster(c)
    json.dumps(info)  # plain data
    assert info["devices"] == c.num_devices


def test_a100_80gb_datasheet_values():
    d = load_device("a100-80gb")
    assert d.memory_bytes == 80 * 2**30
    assert d.peak_fp16_flops == 312e12
    assert d.peak_fp32_flops == 19.5e12
    assert d.hbm_bandwidth_bytes_per_s == 2039e9


def test_memory_units_gib_and_gb(tmp_path):
    assert load_device("v100-pcie-16gb").memory_bytes == 16 * 1024**3
    assert load_device("h200-141gb").memory_bytes == 143771 * 2**20  # what nvidia-smi reports, as the A10's
    text = (Path(__file__).resolve().parents[1] / "hardware" / "devices" / "h200-141gb.toml").read_text()
    (tmp_path / "dec.toml").write_text(text.replace("memory_GiB = 140.4013671875", "memory_GB = 141"))
    assert load_device(str(tmp_path / "dec.toml")).memory_bytes == 141e9  # memory_GB: decimal gigabytes
    h100 = load_device("h100-80gb")
    assert h100.peak_fp16_flops == pytest.approx(1979e12 / 2, rel=1e-3)  # dense = sparse / 2


def test_v100_pcie_is_slower_than_sxm2():
    assert load_device("v100-pcie-16gb").peak_fp16_flops < load_device("v100-16gb").peak_fp16_flops


def test_load_device_by_path():
    path = catalog.resolve("device", "a100-80gb")
    assert load_device(path) == load_device(str(path)) == load_device("a100-80gb")


# --------------------------------------------------------------------------- #
# clusters


def test_2x8_a100_links():
    c = load_cluster("2x8-a100-80gb")
    assert c.num_devices == 16 and c.num_nodes == 2
    assert c.node_of(7) == 0 and c.node_of(8) == 1
    inter = c.link(7, 8)
    assert inter == c.inter_node
    assert inter.bandwidth_bytes_per_s == 25e9  # 200 Gb/s HDR per GPU
    assert c.link(0, 7).bandwidth_bytes_per_s == 300e9  # NVLink 3, per direction
    assert c.link(0, 7).latency_s == 5e-6
    assert c.device_spec(15).memory_bytes == 80 * 2**30


def test_nodes_override():
    c = load_cluster("2x8-a100-80gb", nodes=4)
    assert c.num_devices == 32 and c.num_nodes == 4
    assert c.link(31, 0) == c.inter_node
    assert c.name != "2x8-a100-80gb"  # says it was overridden
    # and so does the description, which named the file's node count
    assert c.description.endswith("; resized to 4 nodes of this kind (--nodes 4)")
    one = load_cluster("4x8-h100", nodes=1).description
    assert one.startswith("4 DGX H100 nodes") and one.endswith("resized to 1 node of this kind (--nodes 1)")
    same = load_cluster("2x8-a100-80gb", nodes=2)
    assert same.name == "2x8-a100-80gb" and same.description == load_cluster("2x8-a100-80gb").description


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "4"])
def test_nodes_override_must_be_positive_int(bad):
    with pytest.raises(InputError, match="nodes"):
        load_cluster("2x8-a100-80gb", nodes=bad)


def test_heterogeneous_cluster():
    c = load_cluster("mixed-a100-v100")
    assert c.num_devices == 8 and not c.is_homogeneous
    assert c.device_spec(3).name == "a100-40gb"
    assert c.device_spec(5).name == "v100-32gb"
    assert c.device_spec(5).memory_bytes == 32 * 2**30
    assert c.link(3, 4) == c.inter_group
    assert c.inter_group.bandwidth_bytes_per_s == 12.5e9  # 100 Gb/s
    info = describe_cluster(c)
    assert info["device_types"] == ["a100-40gb", "v100-32gb"]
    assert info["memory_bytes_per_device"]["a100-40gb"] == 40 * 2**30
    assert info["groups"][1]["first_device"] == 4
    assert "inter_group" in info["links"]


def test_heterogeneous_nodes_override_is_refused():
    with pytest.raises(InputError, match="not supported"):
        load_cluster("mixed-a100-v100", nodes=2)


def test_nodes_override_of_a_one_group_file_says_why_not_heterogeneous(tmp_path):
    """One [[groups]] entry of one device type was refused as "a
    heterogeneous cluster"; the refusal now says what the file is and the
    form that takes --nodes."""
    path = tmp_path / "one.toml"
    path.write_text('name = "one"\n[[groups]]\nnodes = 1\ndevices_per_node = 4\ndevice = "a100-40gb"\n'
                    "[intra_node]\nbandwidth_GBps = 100\nlatency_us = 5\n"
                    "[inter_node]\nbandwidth_GBps = 25\nlatency_us = 10\n")
    with pytest.raises(InputError, match=r"a cluster given as \[\[groups\]\].*top-level nodes") as err:
        load_cluster(path, nodes=2)
    assert "heterogeneous" not in str(err.value)


def test_describe_cluster_homogeneous():
    info = describe_cluster(load_cluster("4x4-v100-10gbe"))
    assert info["devices"] == 16 and info["nodes"] == 4 and info["homogeneous"]
    assert info["device_types"] == ["v100-pcie-16gb"]
    assert info["links"]["inter_node"]["bandwidth_bytes_per_s"] == 1.25e9  # 10 Gb/s
    assert info["total_memory_bytes"] == 16 * 16 * 2**30
    assert "inter_group" not in info["links"]


# --------------------------------------------------------------------------- #
# user files in tmp_path

GOOD_DEVICE = """\
name = "mydev"
memory_GiB = 24
peak_fp16_TFLOPS = 100
peak_fp32_TFLOPS = 20
hbm_bandwidth_GBps = 1000
"""

GOOD_CLUSTER = """\
name = "mine"
nodes = 2
devices_per_node = 4
device = "a100-40gb"

[intra_node]
bandwidth_GBps = 100
latency_us = 3

[inter_node]
bandwidth_GBps = 12.5
latency_us = 20
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_user_device_defaults_and_units(tmp_path):
    d = load_device(_write(tmp_path, "mydev.toml", GOOD_DEVICE))
    assert d.memory_bytes == 24 * 2**30
    assert d.peak_fp32_flops == 20e12
    assert d.hbm_bandwidth_bytes_per_s == 1e12
    assert d.achieved_fraction == 0.5 and d.description == ""


def test_user_cluster_units(tmp_path):
    c = load_cluster(_write(tmp_path, "c.toml", GOOD_CLUSTER))
    assert c.intra_node.bandwidth_bytes_per_s == 100e9 and c.intra_node.latency_s == 3e-6
    assert c.link(3, 4).latency_s == 20e-6
    assert c.device_spec(0).name == "a100-40gb"


def test_cluster_device_path_relative_to_cluster_file(tmp_path):
    (tmp_path / "devs").mkdir()
    _write(tmp_path / "devs", "mydev.toml", GOOD_DEVICE)
    (tmp_path / "clusters").mkdir()
    text = GOOD_CLUSTER.replace('"a100-40gb"', '"../devs/mydev.toml"')
    c = load_cluster(_write(tmp_path / "clusters", "c.toml", text))
    assert c.device_spec(7).name == "mydev"


def _bad_device(tmp_path, text):
    path = _write(tmp_path, "baddev.toml", text)
    with pytest.raises(InputError) as info:
        load_device(path)
    msg = str(info.value)
    assert "baddev.toml" in msg and "\n" not in msg
    return msg


def _bad_cluster(tmp_path, text, **kwargs):
    path = _write(tmp_path, "badcluster.toml", text)
    with pytest.raises(InputError) as info:
        load_cluster(path, **kwargs)
    msg = str(info.value)
    assert "badcluster.toml" in msg and "\n" not in msg
    return msg


def test_syntax_error_names_line(tmp_path):
    msg = _bad_device(tmp_path, GOOD_DEVICE + "peak = = 3\n")
    assert "syntax" in msg and "line 6" in msg


def test_missing_key(tmp_path):
    msg = _bad_device(tmp_path, GOOD_DEVICE.replace("peak_fp32_TFLOPS = 20\n", ""))
    assert "missing key 'peak_fp32_TFLOPS'" in msg


def test_missing_memory(tmp_path):
    msg = _bad_device(tmp_path, GOOD_DEVICE.replace("memory_GiB = 24\n", ""))
    assert "memory_GiB" in msg and "memory_GB" in msg


def test_both_memory_units(tmp_path):
    msg = _bad_device(tmp_path, GOOD_DEVICE + "memory_GB = 24\n")
    assert "exactly one" in msg


@pytest.mark.parametrize("key, value, expected", [
    ("memory_GiB", '"24GB"', "positive number"),
    ("memory_GiB", "0", "positive number"),
    ("memory_GiB", "-8", "positive number"),
    ("hbm_bandwidth_GBps", "0", "positive number"),
    ("peak_fp16_TFLOPS", "true", "positive number"),
    ("peak_fp16_TFLOPS", "nan", "positive number"),
    ("name", "3", "string"),
])
def test_device_bad_values(tmp_path, key, value, expected):
    text = re.sub(rf"^{key} = .*$", f"{key} = {value}", GOOD_DEVICE, flags=re.M)
    msg = _bad_device(tmp_path, text)
    assert f"'{key}'" in msg and value.strip('"') in msg and expected in msg


def test_achieved_fraction_above_one(tmp_path):
    msg = _bad_device(tmp_path, GOOD_DEVICE + "achieved_fraction = 1.5\n")
    assert "'achieved_fraction' = 1.5" in msg and "[0.01, 1]" in msg


@pytest.mark.parametrize("value", ["1e-300", "1e-30", "0.005"])
def test_achieved_fraction_far_below_any_device_is_refused(tmp_path, value):
    """A fraction of 1e-300 of the peak made a plan's time overflow its
    format (an internal error on -o, 300-digit times without it): refused
    where the device file is read, below 0.01."""
    msg = _bad_device(tmp_path, GOOD_DEVICE + f"achieved_fraction = {value}\n")
    assert f"'achieved_fraction' = {value}" in msg and "[0.01, 1]" in msg


def test_device_unknown_key(tmp_path):
    msg = _bad_device(tmp_path, GOOD_DEVICE + "peak_fp4_TFLOPS = 3\n")
    assert "unknown key 'peak_fp4_TFLOPS'" in msg and "allowed keys" in msg
    assert "hbm_bandwidth_GBps" in msg


def test_device_fp8_peak_optional_and_checked(tmp_path):
    path = tmp_path / "dev.toml"
    path.write_text(GOOD_DEVICE + "peak_fp8_TFLOPS = 3\n")
    assert load_device(path).peak_fp8_flops == 3e12
    path.write_text(GOOD_DEVICE)
    assert load_device(path).peak_fp8_flops == 0.0
    msg = _bad_device(tmp_path, GOOD_DEVICE + "peak_fp8_TFLOPS = 0\n")
    assert "peak_fp8_TFLOPS" in msg and "positive" in msg


def test_unknown_catalog_device_suggests():
    with pytest.raises(CatalogError, match="a100-80gb"):
        load_device("a100-80")


@pytest.mark.parametrize("old, new, key, value, expected", [
    ("nodes = 2", "nodes = 0", "nodes", "0", "positive integer"),
    ("nodes = 2", "nodes = 2.5", "nodes", "2.5", "positive integer"),
    ("nodes = 2", 'nodes = "two"', "nodes", "two", "positive integer"),
    ("devices_per_node = 4", "devices_per_node = -4", "devices_per_node", "-4", "positive integer"),
    ("bandwidth_GBps = 100", "bandwidth_GBps = 0", "intra_node.bandwidth_GBps", "0", "positive"),
    ("bandwidth_GBps = 12.5", "bandwidth_GBps = -1", "inter_node.bandwidth_GBps", "-1", "positive"),
    ("latency_us = 3", "latency_us = -3", "intra_node.latency_us", "-3", ">= 0"),
    ("[intra_node]\nbandwidth_GBps = 100\nlatency_us = 3\n", "intra_node = 5\n", "intra_node", "5",
     "table"),
])
def test_cluster_bad_values(tmp_path, old, new, key, value, expected):
    assert old in GOOD_CLUSTER
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace(old, new, 1))
    assert f"'{key}'" in msg and value in msg and expected in msg


def test_cluster_zero_latency_is_fine(tmp_path):
    text = GOOD_CLUSTER.replace("latency_us = 3", "latency_us = 0")
    c = load_cluster(_write(tmp_path, "c.toml", text))
    assert c.intra_node.latency_s == 0


def test_cluster_missing_link_key(tmp_path):
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace("latency_us = 20\n", ""))
    assert "missing key 'inter_node.latency_us'" in msg


def test_cluster_missing_link_table(tmp_path):
    text = GOOD_CLUSTER.split("[inter_node]")[0]
    msg = _bad_cluster(tmp_path, text)
    assert "missing key 'inter_node'" in msg


def test_cluster_missing_device(tmp_path):
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace('device = "a100-40gb"\n', ""))
    assert "missing key 'device'" in msg


def test_cluster_missing_everything(tmp_path):
    msg = _bad_cluster(tmp_path, 'name = "x"\n' + GOOD_CLUSTER.split("\n\n", 1)[1])
    assert "[[groups]]" in msg and "nodes" in msg


def test_cluster_unknown_key(tmp_path):
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace("nodes = 2", "node = 2"))
    assert "unknown key 'node'" in msg and "did you mean 'nodes'" in msg


def test_cluster_unknown_link_key(tmp_path):
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace("latency_us = 3", "latency_ms = 3"))
    assert "unknown key 'intra_node.latency_ms'" in msg and "intra_node.latency_us" in msg


def test_cluster_unknown_device_name(tmp_path):
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace('"a100-40gb"', '"a100-40"'))
    assert "'device' = 'a100-40'" in msg and "did you mean" in msg and "a100-40gb" in msg
    with pytest.raises(CatalogError):
        load_cluster(tmp_path / "badcluster.toml")


def test_cluster_missing_device_file(tmp_path):
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace('"a100-40gb"', '"devs/nope.toml"'))
    assert "'device' = 'devs/nope.toml'" in msg and "no such file" in msg


def test_cluster_whose_device_file_is_a_cluster_names_the_key(tmp_path):
    """``device`` pointing at the cluster file itself: the refusal says the
    cluster's key named a file that is not a device (it named only the
    file's 'unknown key nodes', a valid cluster key)."""
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace('"a100-40gb"', '"badcluster.toml"'))
    assert "badcluster.toml: key 'device' = 'badcluster.toml' names a device file that does not read as one" in msg
    assert "unknown key 'nodes'" in msg


def test_inter_group_with_one_group_is_refused(tmp_path):
    """[inter_group] next to a single [[groups]] entry names no link (the
    top-level form refuses it too): refused, not ignored."""
    text = ('name = "g"\n[[groups]]\nnodes = 2\ndevices_per_node = 4\ndevice = "a100-40gb"\n'
            "[intra_node]\nbandwidth_GBps = 300\nlatency_us = 5\n[inter_node]\nbandwidth_GBps = 25\n"
            "latency_us = 10\n[inter_group]\nbandwidth_GBps = 12.5\nlatency_us = 10\n")
    msg = _bad_cluster(tmp_path, text)
    assert "key 'inter_group' with one [[groups]] entry" in msg


def test_cluster_syntax_error(tmp_path):
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER.replace("[inter_node]", "[inter_node"))
    assert "syntax" in msg and "line 10" in msg


HETERO = """\
name = "het"

[[groups]]
nodes = 1
devices_per_node = 2
device = "a100-80gb"

[[groups]]
nodes = 2
devices_per_node = 2
device = "v100-16gb"

[intra_node]
bandwidth_GBps = 100
latency_us = 3

[inter_node]
bandwidth_GBps = 12.5
latency_us = 20
"""


def test_heterogeneous_without_inter_group_uses_inter_node(tmp_path):
    c = load_cluster(_write(tmp_path, "het.toml", HETERO))
    assert c.num_devices == 6 and c.inter_group is None
    assert c.link(1, 2) == c.inter_node
    assert c.link(2, 4) == c.inter_node and c.link(2, 3) == c.intra_node


def test_heterogeneous_bad_group_value(tmp_path):
    msg = _bad_cluster(tmp_path, HETERO.replace("nodes = 2", "nodes = 0"))
    assert "'groups[1].nodes' = 0" in msg


def test_heterogeneous_unknown_group_key(tmp_path):
    msg = _bad_cluster(tmp_path, HETERO.replace("nodes = 2", "nodes = 2\ngpus = 3"))
    assert "unknown key 'groups[1].gpus'" in msg


def test_both_forms_is_an_error(tmp_path):
    msg = _bad_cluster(tmp_path, "nodes = 3\n" + HETERO)
    assert "'nodes'" in msg and "not both" in msg


def test_inter_group_only_with_groups(tmp_path):
    link = "[inter_group]\nbandwidth_GBps = 1\nlatency_us = 1\n"
    msg = _bad_cluster(tmp_path, GOOD_CLUSTER + link)
    assert "'inter_group'" in msg


def test_groups_must_be_array_of_tables(tmp_path):
    msg = _bad_cluster(tmp_path, 'name = "x"\ngroups = [1, 2]\n' + GOOD_CLUSTER.split("\n\n", 1)[1])
    assert "'groups'" in msg and "array of tables" in msg


def test_unknown_cluster_name_suggests():
    with pytest.raises(CatalogError, match="2x8-a100-80gb"):
        load_cluster("2x8-a100")


def test_the_h200_computes_as_the_h100():
    """The H200 SXM has the H100 SXM's GH100 compute (989.4 dense TFLOP/s
    on both datasheets) and faster HBM3e: its GEMM efficiency curve is the
    H100's (a flat 0.5 placeholder made Llama-3 70B 10% slower on H200s
    than on H100s at the same pins, and GPT-3 1.3B faster)."""
    h100, h200 = load_device("h100-80gb"), load_device("h200-141gb")
    assert h200.peak_fp16_flops == h100.peak_fp16_flops
    assert (h200.achieved_fraction, h200.gemm_half_efficiency_size) == (h100.achieved_fraction,
                                                                        h100.gemm_half_efficiency_size)
    assert h200.hbm_bandwidth_bytes_per_s > h100.hbm_bandwidth_bytes_per_s


def test_catalog_servers_with_one_network_port_say_so():
    """A p3.16xlarge-like server has one 25 Gbps interface for its eight
    GPUs (AWS EC2 P3 page), PipeDream's four V100 servers one 10 GbE port:
    their transfers between servers share it (``nics_per_node = 1``), where
    the DGX-like A100 and H100 nodes give every GPU its own port."""
    assert load_cluster("2x8-v100-nvlink-25gbe").inter_node.nics_per_node == 1
    assert load_cluster("4x4-v100-10gbe").inter_node.nics_per_node == 1
    assert load_cluster("2x8-a100-80gb").inter_node.nics_per_node is None


def test_nvswitch_is_read_inside_nodes_only(tmp_path):
    """``nvswitch = true`` in ``[intra_node]`` marks NVSwitch nodes (the
    catalog's DGX-like A100 and H100 clusters); anything but a boolean, or
    the key between nodes, is refused naming it."""
    assert load_cluster("4x8-h100").intra_node.nvswitch and load_cluster("2x8-a100-80gb").intra_node.nvswitch
    assert not load_cluster("1x8-l4").intra_node.nvswitch
    assert not load_cluster("2x8-v100-nvlink-25gbe").intra_node.nvswitch  # hybrid cube-mesh: not every pair
    base = ('name = "c"\nnodes = 1\ndevices_per_node = 2\ndevice = "a100-80gb"\n'
            '[inter_node]\nbandwidth_GBps = 25\nlatency_us = 10\n')
    (tmp_path / "ok.toml").write_text(base + "[intra_node]\nbandwidth_GBps = 300\nlatency_us = 5\nnvswitch = true\n")
    assert load_cluster(str(tmp_path / "ok.toml")).intra_node.nvswitch
    (tmp_path / "bad.toml").write_text(base + "[intra_node]\nbandwidth_GBps = 300\nlatency_us = 5\nnvswitch = 1\n")
    with pytest.raises(InputError, match="intra_node.nvswitch' = 1: expected true or false"):
        load_cluster(str(tmp_path / "bad.toml"))
    (tmp_path / "inter.toml").write_text(base.replace("latency_us = 10\n", "latency_us = 10\nnvswitch = true\n")
                                         + "[intra_node]\nbandwidth_GBps = 300\nlatency_us = 5\n")
    with pytest.raises(InputError, match="nvswitch"):
        load_cluster(str(tmp_path / "inter.toml"))


def test_an_edited_copy_of_a_catalog_cluster_that_keeps_its_name_is_warned_about(tmp_path):
    """A copy of 1x4-v100-pcie with 3 devices a node that still names itself
    1x4-v100-pcie would put that name and description in its plans: one
    warning; an exact copy, the catalog name and a renamed edit: none."""
    from pipesearch.hardware import catalog_name_clash

    text = catalog.resolve("cluster", "1x4-v100-pcie").read_text()
    (tmp_path / "same.toml").write_text(text)
    (tmp_path / "three.toml").write_text(text.replace("devices_per_node = 4", "devices_per_node = 3"))
    (tmp_path / "mine.toml").write_text(text.replace("devices_per_node = 4", "devices_per_node = 3")
                                        .replace('name = "1x4-v100-pcie"', 'name = "my-3-v100"'))
    assert "three.toml names itself '1x4-v100-pcie'" in catalog_name_clash(tmp_path / "three.toml")
    for name in (tmp_path / "same.toml", tmp_path / "mine.toml", "1x4-v100-pcie"):
        assert catalog_name_clash(name) is None


def test_parts_of_one_silicon_share_the_fitted_curve():
    """The A100 40 GB and the H200 take the GEMM-efficiency curve fitted to
    the A100 80 GB and the H100 (their files and docs/transformer_costs.md
    say so): a refit of one part must move the other (the A100 80 GB's
    refit to 950 had left the 40 GB part at 980)."""
    for part, fitted in (("a100-40gb", "a100-80gb"), ("h200-141gb", "h100-80gb")):
        a, b = load_device(part), load_device(fitted)
        assert (a.achieved_fraction, a.gemm_half_efficiency_size) == (b.achieved_fraction,
                                                                       b.gemm_half_efficiency_size), part
