"""The ``[host]`` table's ``switch_uplink_GBps`` is capped by the PCIe
generation like ``host_to_device_GBps`` (pipesearch.hardware._host).

Cap by hand: a switch uplink is at most x16; Gen4 runs 16 GT/s per lane with
128b/130b coding: 16 x 16 x 128/130 / 8 = 31.5 GB/s per direction (Gen3:
8 GT/s, 15.75 GB/s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipesearch.cli import main
from pipesearch.errors import InputError
from pipesearch.hardware import load_cluster

SHIPPED = Path(__file__).resolve().parents[1] / "hardware" / "clusters" / "1x8-rtx4090-pcie4.toml"


def _copy(tmp_path, old, new) -> Path:
    text = SHIPPED.read_text()
    assert old in text
    path = tmp_path / "c.toml"
    path.write_text(text.replace(old, new))
    return path


def test_uplink_above_gen4_x16_is_refused(tmp_path):
    """Catches: switch_uplink_GBps = 400 with pcie_generation = 4 accepted."""
    path = _copy(tmp_path, "switch_uplink_GBps = 25", "switch_uplink_GBps = 400")
    with pytest.raises(InputError, match=r"key 'host.switch_uplink_GBps' = 400.*31\.5 GB/s") as info:
        load_cluster(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value) and "Gen4" in str(info.value)


def test_uplink_at_the_cap_is_accepted(tmp_path):
    """Catches: a cap below the link's 31.5 GB/s (31.5 is a real Gen4 x16 uplink)."""
    assert load_cluster(_copy(tmp_path, "switch_uplink_GBps = 25", "switch_uplink_GBps = 31.5")).host.\
        switch_uplink_bytes_per_s == 31.5e9


def test_cli_refuses_in_one_line_with_exit_2(tmp_path):
    path = _copy(tmp_path, "switch_uplink_GBps = 25", "switch_uplink_GBps = 400")
    res = CliRunner().invoke(main, ["plan", "--model", "qwen3-1.7b", "--cluster", str(path), "--seq-len", "2048",
                                    "-b", "64", "-q"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "switch_uplink_GBps" in res.output and len(res.output.strip().splitlines()) == 1, res.output
