"""What the outputs say about offloaded activations: the plan JSON (schema
and semantic checks), the table, the stages plot, the stages-json
description, the runtime exporters' refusals, and DeepSpeed's
``activation_checkpointing.cpu_checkpointing`` checked by DeepSpeed's own
config class.

The plan is the hand case of tests/test_offload_activations.py (stage 0's
activations on the host: 36 GB held, 72 GB over PCIe per iteration).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from helpers import pcie_host, tiny_cluster
from pipesearch.errors import InputError
from pipesearch.export import FORMATS, export_plan
from pipesearch.export.stages_json import stage_placement, stages_problems
from pipesearch.plan import PlanFile, document_problems, to_json
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job
from test_offload_activations import GB, _hand_profile, _profile, _search


@pytest.fixture(scope="module")
def act_plan():
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB), host=pcie_host())
    return _search(_hand_profile(), cluster, 2, 6, "gpipe")


def _document(plan) -> dict:
    inputs = {"model": {"name": "act", "num_layers": 2}, "cluster": {"name": "tiny", "devices": 8},
              "job": {"global_batch_size": 6}}
    return json.loads(to_json(PlanFile(inputs=inputs, search={}, plans=(plan,))))


def test_plan_json_records_the_offloaded_activations(act_plan):
    doc = _document(act_plan)
    assert document_problems(doc) == []
    st = doc["plans"][0]["stages"]
    assert [s["memory_option"] for s in st] == ["act-host", "on-device"]
    host = doc["plans"][0]["options"]["host"]
    assert host["activation_pcie_bytes_per_iteration"] == pytest.approx([72 * GB, 0.0])
    assert host["activation_host_memory_bytes"] == pytest.approx([36 * GB, 0.0])


def test_plan_json_checks_refuse_what_does_not_hold(act_plan):
    doc = _document(act_plan)
    bad = copy.deepcopy(doc)
    bad["plans"][0]["stages"][0]["memory_option"] = "act-disk"
    assert any("memory_option" in p.where for p in document_problems(bad))
    bad = copy.deepcopy(doc)
    del bad["plans"][0]["options"]["host"]["activation_pcie_bytes_per_iteration"]
    assert any("options.host" in p.where for p in document_problems(bad))
    bad = copy.deepcopy(doc)  # the on-device stage cannot move activations
    bad["plans"][0]["options"]["host"]["activation_pcie_bytes_per_iteration"][1] = 1e9
    assert any("activation_pcie_bytes_per_iteration[1]" in p.where for p in document_problems(bad))
    bad = copy.deepcopy(doc)
    bad["plans"][0]["options"]["host"]["activation_host_memory_bytes"][0] = -1.0
    assert document_problems(bad)


def test_stages_json_says_where_each_stage_keeps_its_activations(act_plan):
    doc = export_plan(act_plan, "stages-json")
    body = {k: v for k, v in doc.items() if k != "files"}
    assert stages_problems(body) == []
    s0, s1 = doc["stages"]
    assert (s0["activations"], s1["activations"]) == ("host", "device")
    assert s0["activation_host_memory_bytes"] == pytest.approx(36 * GB)
    assert s0["activation_pcie_bytes_per_iteration"] == pytest.approx(72 * GB)
    assert s1["activation_pcie_bytes_per_iteration"] == 0.0
    assert doc["totals"]["pcie_bytes_per_iteration"] == pytest.approx(72 * GB)
    bad = copy.deepcopy(body)
    bad["stages"][0]["activations"] = "disk"
    assert any("stages.0.activations" in p for p in stages_problems(bad))


@pytest.mark.parametrize("option,want", [
    ("act-host", ("none", "host", "host")), ("full+act-host", ("full", "host", "device")),
    ("full+act-host+offload", ("full", "host", "host")), ("act-host+offload", ("none", "host", "host")),
    ("none+offload", ("none", "device", "host")),
])
def test_stage_placement_of_activation_options(option, want):
    got = stage_placement(option, "none")
    assert (got["recompute"], got["activations"], got["optimizer_state"]) == (
        want[0], want[1], want[2] if "offload" in option else "device")
    with pytest.raises(InputError, match="memory_option"):
        stage_placement("act-host+stream", "none")


def test_every_runtime_refuses_offloaded_activations_in_one_line(act_plan):
    for fmt in FORMATS:
        with pytest.raises(InputError) as err:
            export_plan(act_plan, fmt)
        text = str(err.value)
        assert "\n" not in text and "stage 0" in text and "act-host" in text, (fmt, text)


def test_table_and_stages_plot_show_the_offload(act_plan, tmp_path):
    from pipesearch.cli.plan_cmd import plans_table
    from pipesearch.plan import load_plan_text
    from pipesearch.plots.stages import plot_stages

    table = plans_table([act_plan])
    assert "activations on host" in table and "1/2 stages" in table
    assert "PCIe / iteration" in table and "67.1 GiB" in table  # 72e9 B
    plan_file = load_plan_text(json.dumps(_document(act_plan)))
    out = plot_stages(plan_file, tmp_path / "stages.png")
    assert out.exists() and out.stat().st_size > 0


def _all_offloaded_plan():
    """One stage (pp 1, GPipe, 6 micro-batches) of two recomputable layers
    (0.5e9 parameters: 8 GB of state): on the device 8 + 6 x (6 + 1) = 50
    GB, fully recomputed 8 + 6 x (2 + 0.5) + 6 = 29 GB, its checkpoints
    offloaded 8 + 3 x 2.5 + 6 = 21.5 GB: 24 GB GPUs leave only
    full+act-host."""
    prof = _profile([0.2, 0.2], [0.4, 0.4], [0.5e9, 0.5e9], [6 * GB, 1 * GB], [2 * GB, 0.5 * GB])
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB), host=pcie_host())
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True)
    opts = SearchOptions(pp=1, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("gpipe",), top=1)
    return search([ModelVariant(prof)], cluster, job, opts).plans[0]


def test_deepspeed_writes_cpu_checkpointing_and_its_parser_reads_it(monkeypatch):
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    from test_runtime_parsers import _Grid

    plan = _all_offloaded_plan()
    assert [st.memory_option for st in plan.stages] == ["full+act-host"]
    exp = export_plan(plan, "deepspeed")
    assert exp["pipeline_module"]["activation_checkpoint_interval"] == 1
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    cfg = DeepSpeedConfig(json.loads(exp["files"]["ds_config.json"]), mpu=_Grid(plan.pp, plan.dp, plan.tp))
    assert cfg.activation_checkpointing_config.cpu_checkpointing is True
    assert any("cpu_checkpointing" in n for n in exp["notes"])
    # the hand case (one stage offloads, one does not) is refused by DeepSpeed too
    cluster = replace(tiny_cluster(1, 8, memory_bytes=24 * GB), host=pcie_host())
    with pytest.raises(InputError, match="cpu_checkpointing"):
        export_plan(_search(_hand_profile(), cluster, 2, 6, "gpipe"), "deepspeed")


@pytest.mark.parametrize("option,plan_recompute,want", [
    # Mobius with its activations in host memory: weights swapped per stay, checkpoints on the host
    ("swap+act-host", "full", {"recompute": "full", "activations": "host", "optimizer_state": "host",
                               "weights": "swapped", "prefetch": "next-stage"}),
    # streamed weights with a recompute level of its own
    ("full+stream", "none", {"recompute": "full", "activations": "device", "optimizer_state": "host",
                             "weights": "streamed", "prefetch": "next-layer"}),
    ("none+stream", "full", {"recompute": "none", "activations": "device", "optimizer_state": "host",
                             "weights": "streamed", "prefetch": "next-layer"}),
])
def test_stage_placement_of_swapped_and_streamed_options(option, plan_recompute, want):
    assert stage_placement(option, plan_recompute) == want
