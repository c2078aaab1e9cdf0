"""Mixed clusters read from the user's own files: the profile's device
matched to a device type the cluster file defines, an unnamed device said
aloud, RoundPipe on a mixed cluster, a device file never overwritten, a
byte-order mark, a device type too small to hold anything left idle.

Oracles: a device of a tenth of the A100's FLOP rate that the profile was
measured on makes the same layers run at least several times faster on
A100s (the times scaled down by the rate ratio), where the bug took them as
A100 times (the same plan as a profile measured on an A100); the other
cases are the refusal, warning or plan a user expects, by hand.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from pipesearch.cli import main

LINKS = """
[intra_node]
bandwidth_GBps = 25
latency_us = 5
[inter_node]
bandwidth_GBps = 12.5
latency_us = 10
[inter_group]
bandwidth_GBps = 5
latency_us = 10
"""


def _files(tmp_path, device="a100-40gb", other='"slowdev.toml"', memory_gib=80):
    (tmp_path / "slowdev.toml").write_text(f'name = "slowdev"\nmemory_GiB = {memory_gib}\npeak_fp16_TFLOPS = 20\n'
                                           'peak_fp32_TFLOPS = 2\nhbm_bandwidth_GBps = 500\nachieved_fraction = 0.5\n')
    rows = "\n".join(f"l{k},{3 + k % 3},{6 + 2 * (k % 3)},100000000,4000000,50000000" for k in range(8))
    (tmp_path / "p.csv").write_text(f"# pipesearch profile v1\n# model: tiny\n# batch_size: 8\n# device: {device}\n"
                                    f"# bytes_per_param: 2\nname,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes\n"
                                    f"{rows}\n")
    (tmp_path / "mixed.toml").write_text('name = "mixed"\n[[groups]]\nnodes = 1\ndevices_per_node = 4\n'
                                         f'device = "a100-40gb"\n[[groups]]\nnodes = 1\ndevices_per_node = 4\n'
                                         f"device = {other}\n{LINKS}")
    (tmp_path / "a100.toml").write_text('name = "a100"\nnodes = 1\ndevices_per_node = 4\ndevice = "a100-40gb"\n'
                                        + LINKS.split("[inter_group]")[0])


def _best_s(tmp_path, *args):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--top", "1", "-b", "32", "-o", str(out), *args])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())["plans"][0]["predicted"]["iteration_time_s"], r


def test_a_profile_measured_on_the_clusters_own_device_type_is_scaled_from_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _files(tmp_path, device="slowdev")
    mixed, r = _best_s(tmp_path, "--model", "p.csv", "--cluster", "mixed.toml")
    assert "warning" not in r.stderr, r.stderr
    _files(tmp_path, device="a100-40gb")
    as_a100, _ = _best_s(tmp_path, "--model", "p.csv", "--cluster", "a100.toml")
    assert mixed < as_a100 / 4, (mixed, as_a100)


def test_an_unnamed_profile_device_on_a_mixed_cluster_is_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _files(tmp_path, device="unknown", other='"h100-80gb"')
    _, r = _best_s(tmp_path, "--model", "p.csv", "--cluster", "mixed.toml")
    assert "measured on an unnamed device" in r.stderr and "fastest type's (h100-80gb)" in r.stderr, r.stderr


def test_an_output_over_a_device_file_of_the_cluster_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _files(tmp_path)
    before = (tmp_path / "slowdev.toml").read_text()
    r = CliRunner().invoke(main, ["plan", "--model", "p.csv", "--cluster", "mixed.toml", "-b", "32",
                                  "-o", "slowdev.toml"])
    assert r.exit_code == 2 and "the same file as the device file of --cluster mixed.toml" in r.output, r.output
    assert (tmp_path / "slowdev.toml").read_text() == before


def test_a_byte_order_mark_before_a_cluster_file_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _files(tmp_path)
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "mixed.toml").read_bytes())
    with_bom, _ = _best_s(tmp_path, "--model", "p.csv", "--cluster", "bom.toml")
    plain, _ = _best_s(tmp_path, "--model", "p.csv", "--cluster", "mixed.toml")
    assert with_bom == plain


def test_a_device_type_the_reserve_leaves_nothing_of_stays_idle(tmp_path, monkeypatch):
    """Half a GiB of memory less a 1 GiB reserve: that type holds nothing.
    The whole cluster was refused; now the A100s plan alone (the same plan
    as the A100-only cluster) and a warning names the type."""
    monkeypatch.chdir(tmp_path)
    _files(tmp_path, memory_gib=0.5)
    mixed, r = _best_s(tmp_path, "--model", "p.csv", "--cluster", "mixed.toml")
    assert "leaves nothing of the 512.0 MiB of slowdev: its devices stay idle" in r.stderr, r.stderr
    alone, _ = _best_s(tmp_path, "--model", "p.csv", "--cluster", "a100.toml")
    assert mixed == alone


def test_roundpipe_on_a_mixed_cluster_with_a_host_table_plans(tmp_path, monkeypatch):
    """It failed inside the device-order search ("unknown schedule
    'roundpipe'", exit 2): RoundPipe's GPUs take the stages in turn, so no
    order is searched for it; its named layouts plan."""
    monkeypatch.chdir(tmp_path)
    _files(tmp_path, other='"v100-32gb"')
    host = ("\n[host]\nmemory_GB = 800\npcie_generation = 4\npcie_lanes_per_gpu = 16\nhost_to_device_GBps = 25\n"
            "switch_uplink_GBps = 25\ncpu_adam_params_per_s = 1e9\npcie_switches = [[0, 1], [2, 3]]\n")
    (tmp_path / "host.toml").write_text((tmp_path / "mixed.toml").read_text() + host)
    r = CliRunner().invoke(main, ["plan", "--model", "p.csv", "--cluster", "host.toml", "-b", "32",
                                  "--schedule", "roundpipe", "--top", "1"])
    assert r.exit_code == 0, r.output
    assert "roundpipe" in r.output
