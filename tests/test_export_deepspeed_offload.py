"""DeepSpeed export of ZeRO-Offload plans (``--optimizer-offload``): it writes
only what DeepSpeed runs as planned.

Oracles, from DeepSpeed 0.19.8's source (deepspeed/runtime/zero/offload_config.py):
``offload_optimizer`` is "Valid with stage 1, 2, and 3", and stage 1 shards the
optimizer state (and so the CPU step) over the dp replicas; the offload config
has no delayed parameter update, so DeepSpeed steps the CPU optimizer
synchronously.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main

PLAN = ["plan", "--model", "llama3.1-8b", "-b", "512", "--optimizer-offload", "--dp", "2", "--pp", "4",
        "--schedule", "1f1b", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "-q"]


def _plan(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    res = CliRunner().invoke(main, [*PLAN, *extra, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _export(path, *args):
    return CliRunner().invoke(main, ["export", str(path), "--format", "deepspeed", *args])


def _one_line_refusal(res):
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_delayed_optimizer_step_is_refused(tmp_path):
    """Catches: the export dropping --delayed-optimizer-step (the config
    DeepSpeed would run steps synchronously, so the planned time is wrong)."""
    res = _export(_plan(tmp_path, "delayed", "--delayed-optimizer-step"))
    _one_line_refusal(res)
    assert "--delayed-optimizer-step" in res.output and "synchronously" in res.output


def test_unsharded_offload_with_dp_2_is_refused(tmp_path):
    """Catches: writing ZeRO stage 1 (which shards the optimizer over dp = 2,
    halving host memory and CPU work) for a plan that shards nothing."""
    res = _export(_plan(tmp_path, "plain"))
    _one_line_refusal(res)
    assert "dp=2" in res.output and "--sharding zero1" in res.output


def test_zero1_offload_plan_writes_stage_1_offload_that_deepspeed_accepts(tmp_path, monkeypatch):
    """Catches: refusing the plan DeepSpeed does run as planned (ZeRO-1 over
    dp = 2 with the optimizer on the CPU), or a config DeepSpeed reads
    differently."""
    path = _plan(tmp_path, "zero1", "--sharding", "zero1")
    plans = json.loads(path.read_text())["plans"]
    # the plan whose every stage offloads (a mixed one is refused for another reason)
    rank = next(i + 1 for i, p in enumerate(plans) if all("offload" in s["memory_option"] for s in p["stages"]))
    out = tmp_path / "ds_config.json"
    res = _export(path, "--rank", str(rank), "-o", str(out))
    assert res.exit_code == 0, res.output
    cfg = json.loads(out.read_text())
    assert cfg["zero_optimization"] == {"stage": 1, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert cfg["train_batch_size"] == 512 and cfg["gradient_accumulation_steps"] * 2 == 512
    assert _export(path, "--rank", str(rank), "-o", str(tmp_path / "x.json")).exit_code == 0
    notes = json.loads((tmp_path / "x.json").read_text())["notes"]
    assert not any("names no optimizer" in n for n in notes)  # its optimizer is in the config
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    from test_runtime_parsers import _Grid

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    parsed = DeepSpeedConfig(cfg, mpu=_Grid(4, 2, 1))
    assert parsed.zero_optimization_stage == 1
    assert parsed.zero_config.offload_optimizer.device == "cpu"
    # the optimizer comes from the config (DeepSpeedCPUAdam for the offload): with a torch optimizer passed to
    # deepspeed.initialize instead, the engine raises ZeRORuntimeException (engine._configure_optimizer)
    assert parsed.optimizer_name == "adamw" and parsed.optimizer_params["lr"] > 0


def test_a_config_without_an_optimizer_says_where_it_comes_from(tmp_path):
    """deepspeed.initialize needs an optimizer from the config or the caller;
    a plan without offload writes none, and a user launching ds_config.json
    as written met "no optimizer" with nothing in the export saying so."""
    out = tmp_path / "p.json"
    assert CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                     "--pp", "2", "--schedule", "1f1b", "-q", "-o", str(out)]).exit_code == 0
    res = _export(out, "-o", str(tmp_path / "x.json"))
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "x.json").read_text())
    assert "optimizer" not in json.loads(doc["files"]["ds_config.json"])
    assert any("names no optimizer" in n and "deepspeed.initialize" in n for n in doc["notes"])
