"""Per-stage memory placement in the outputs: the runtime-neutral
``stages-json`` export (pipesearch.export.stages_json, checked against
pipesearch/schema/stages-1.schema.json), the runtimes' one-line refusals,
the plan table's host columns and the plan options' host memory and PCIe
bytes (pipesearch.option_search.host_plan_info).

Oracles: the hand case of tests/test_offload_mixed.py (stage 0 recomputes on
the GPU, stage 1 offloads 0.25e9 parameters: 16 B each on the host, 2 + 2 B
each over PCIe per iteration, ZeRO-Offload Fig. 2).
"""

from __future__ import annotations

import copy

import pytest

from pipesearch.errors import InputError
from pipesearch.export import FORMATS, export_plan
from pipesearch.export.stages_json import stage_placement, stages_problems
from test_offload_mixed import _hand_case, _search


@pytest.fixture(scope="module")
def mixed_plan():
    prof, cap, host = _hand_case()
    return _search(prof, 2, 4, cap, host)


def test_plan_options_record_host_memory_and_pcie_bytes(mixed_plan):
    """Stage 1: 0.25e9 params x 16 B = 4 GB on the host, 0.25e9 x (2 + 2)
    B = 1 GB over PCIe per iteration; stage 0 nothing."""
    host = dict(mixed_plan.extra)["host"]
    assert host["host_memory_bytes"] == pytest.approx([0.0, 4e9])
    assert host["pcie_bytes_per_iteration"] == pytest.approx([0.0, 1e9])
    assert host["total_host_memory_bytes"] == pytest.approx(4e9)


def test_stages_json_describes_each_stage(mixed_plan):
    doc = export_plan(mixed_plan, "stages-json")
    assert stages_problems({k: v for k, v in doc.items() if k != "files"}) == []
    s0, s1 = doc["stages"]
    assert (s0["recompute"], s0["optimizer_state"], s0["weights"], s0["prefetch"]) == ("full", "device", "device",
                                                                                       "none")
    assert (s1["recompute"], s1["optimizer_state"], s1["weights"]) == ("none", "host", "device")
    assert s0["layers"] == [0, 1] and s1["layers"] == [1, 2]
    assert s1["host_memory_bytes"] == pytest.approx(4e9) and s1["pcie_bytes_per_iteration"] == pytest.approx(1e9)
    assert doc["optimizer_step"] == {"when": "after-backward", "staleness_steps": 0}
    assert "stages.json" in doc["files"]


def test_schema_refuses_what_it_does_not_know(mixed_plan):
    doc = {k: v for k, v in export_plan(mixed_plan, "stages-json").items() if k != "files"}
    bad = copy.deepcopy(doc)
    bad["stages"][0]["recompute"] = "partial"
    assert any("stages.0.recompute" in p for p in stages_problems(bad))
    bad = copy.deepcopy(doc)
    del bad["stages"][1]["weights"]
    assert stages_problems(bad)


@pytest.mark.parametrize("option,want", [
    ("none+offload", ("none", "host", "device", "none")),
    ("selective", ("selective", "device", "device", "none")),
    ("stream", ("full", "host", "streamed", "next-layer")),
    ("swap", ("full", "host", "swapped", "next-stage")),
    ("on-device", ("full", "device", "device", "none")),
])
def test_stage_placement_of_each_option(option, want):
    got = stage_placement(option, "full")
    assert (got["recompute"], got["optimizer_state"], got["weights"], got["prefetch"]) == want
    with pytest.raises(InputError, match="memory_option"):
        stage_placement("sideways", "none")


def test_every_runtime_refuses_the_mixed_plan_in_one_line(mixed_plan):
    """No runtime exporter can run stage 0 on the GPU with recompute and
    stage 1 offloaded: each refuses, naming the stage."""
    for fmt in FORMATS:
        with pytest.raises(InputError) as err:
            export_plan(mixed_plan, fmt)
        text = str(err.value)
        assert "\n" not in text and "stage" in text and "1" in text, (fmt, text)


def test_table_shows_host_memory_and_pcie(mixed_plan):
    from pipesearch.cli.plan_cmd import plans_table

    table = plans_table([mixed_plan])
    assert "host memory" in table and "PCIe / iteration" in table
    assert "full,none" in table  # each stage's recompute


def test_cli_export_stages_json(tmp_path):
    from click.testing import CliRunner

    from pipesearch.cli import main

    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "64",
                                  "--pp", "8", "--tp", "1", "--dp", "1", "--schedule", "1f1b", "--recompute", "full",
                                  "--micro-batch-size", "1", "--optimizer-offload", "--delayed-optimizer-step",
                                  "--top", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "delayed 1" in r.output
    r = CliRunner().invoke(main, ["export", str(out), "--format", "stages-json", "-o", str(tmp_path / "stages.json")])
    assert r.exit_code == 0, r.output
    import json

    doc = json.loads((tmp_path / "stages.json").read_text())  # the export's own file, as ds_config.json
    assert stages_problems(doc) == []
    assert doc["optimizer_step"] == {"when": "delayed", "staleness_steps": 1}
    assert all(st["optimizer_state"] == "host" for st in doc["stages"])
    # 32.8e9 parameters of Qwen3-32B, 16 B each on the host
    assert doc["totals"]["host_memory_bytes"] == pytest.approx(16 * 32.8e9, rel=0.01)
