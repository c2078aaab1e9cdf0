"""``pipesearch validate`` refuses impossible predictions and degrees: the
derived rates of ``predicted`` are recomputed from the plan's own time and
inputs, and ``tp`` must divide the model's heads.

The plan is Qwen3-32B, batch 32, sequence 2048, optimizer offloaded, on
1x8-rtx4090-pcie4 (8 GPUs of 330.3 TFLOP/s fp16 peak with fp16 accumulate,
half that with the fp32 accumulate of mixed-precision training): its best
plan is pp 2 x tp 4. Expected values are derived by hand: 32 x 2048 = 65536
tokens per iteration, tokens/s = 65536 / iteration_time_s, MFU = model FLOPs
/ (iteration_time_s x 8 x 330.3e12 / 2).
"""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("pred") / "p.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "--top", "1",
                                  "--model", "qwen3-32b", "-b", "32", "--optimizer-offload", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(main, ["validate", str(out)]).exit_code == 0
    d = json.loads(out.read_text())
    assert d["plans"][0]["parallelism"]["tp"] == 4
    return d


def _first(tmp_path, doc, key, value, parent="predicted"):
    bad = copy.deepcopy(doc)
    bad["plans"][0][parent][key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    return r.output.strip().splitlines()[0].removeprefix(f"{path}: ")


def _expected(line):
    return float(line.split(" found, ")[1].split(" ")[0])


def test_tokens_per_s_is_recomputed(tmp_path, doc):
    """Bug: tokens_per_s = 1e9 passed; it is 65536 / iteration_time_s (about 1006)."""
    t = doc["plans"][0]["predicted"]["iteration_time_s"]
    line = _first(tmp_path, doc, "tokens_per_s", 1e9)
    assert line.startswith("plans[0].predicted.tokens_per_s: 1000000000.0 found"), line
    assert _expected(line) == pytest.approx(65536 / t, rel=1e-12)


def test_mfu_is_recomputed(tmp_path, doc):
    """Bug: mfu = 5.0 (five times the devices' peak) passed."""
    pred = doc["plans"][0]["predicted"]
    line = _first(tmp_path, doc, "mfu", 5.0)
    assert line.startswith("plans[0].predicted.mfu: 5.0 found"), line
    want = pred["model_flops_per_iteration"] / (pred["iteration_time_s"] * 8 * 330.3e12 / 2)  # fp32 accumulate
    assert _expected(line) == pytest.approx(want, rel=1e-12)
    assert _expected(line) < 1


def test_peak_flops_and_devices_are_recomputed(tmp_path, doc):
    """Bug: peak_flops was never checked; 8 x 330.3e12 / 2 FLOP/s expected
    (the RTX 4090's fp32-accumulate rate: its catalog peak is fp16's)."""
    line = _first(tmp_path, doc, "peak_flops", 1.0)
    assert line.startswith("plans[0].predicted.peak_flops: 1.0 found"), line
    assert _expected(line) == pytest.approx(8 * 330.3e12 / 2, rel=1e-12)


def test_tp_that_does_not_divide_the_heads_is_refused(tmp_path, doc):
    """Bug: tp 3 on Qwen3-32B (64 heads, 8 KV heads) passed."""
    line = _first(tmp_path, doc, "tp", 3, parent="parallelism")
    assert line.startswith("plans[0].parallelism.tp: 3 does not divide num_attention_heads 64"), line


def test_tp_other_than_the_stages_were_timed_for_is_named(tmp_path, doc):
    """Bug: tp 2 (it divides the heads) on a plan timed for tp 4 was
    reported, if at all, as a wrong device count. The stages' 2 devices x
    tp 4 = 8 = predicted.num_devices and 8 x 330.3e12 / 2 = peak_flops: the
    edited field is tp."""
    line = _first(tmp_path, doc, "tp", 2, parent="parallelism")
    assert line.startswith("plans[0].parallelism.tp: 2, but predicted.num_devices 8"), line
    assert "tp 4" in line, line


def test_edited_device_count_is_named(tmp_path, doc):
    """The converse: num_devices 4 with tp 4 and 2 stage devices (8 expected)
    names num_devices, not tp (peak_flops still says 8 devices)."""
    line = _first(tmp_path, doc, "num_devices", 4)
    assert line.startswith("plans[0].predicted.num_devices: 4 found, 8 expected"), line


def test_bubble_fraction_is_the_replays(tmp_path, doc):
    """Bug: bubble_fraction 0.9 passed while ``simulate`` showed about 1%;
    the expected value is the replay's busiest-rank idle share, equal to the
    one the search wrote (computed from its own per-rank busy times,
    ``search.rank_busy_s``, not the replay's timeline)."""
    written = doc["plans"][0]["predicted"]["bubble_fraction"]
    line = _first(tmp_path, doc, "bubble_fraction", 0.9)
    assert line.startswith("plans[0].predicted.bubble_fraction: 0.9 found"), line
    assert _expected(line) == pytest.approx(written, abs=1e-12)
