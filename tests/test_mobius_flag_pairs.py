"""Flag pairs a Mobius or offload plan does not model are refused, one line, exit 2."""

from __future__ import annotations

from click.testing import CliRunner

from pipesearch.cli import main

BASE = ["plan", "--model", "llama3.1-8b", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "-b", "32"]


def test_mobius_refuses_per_stage_recompute():
    """Catches ``--recompute per-stage`` silently dropped under Mobius: the
    swap options were built from the first (no-recompute) layer table only,
    so the search answered "out of memory" where ``--recompute full`` fits
    (17.072 s). Refused instead, naming the flag, with exit status 2."""
    r = CliRunner().invoke(main, BASE + ["--schedule", "mobius", "--recompute", "per-stage"])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "\n" not in line and "Traceback" not in r.output
    assert "--recompute per-stage" in line and "--schedule mobius" in line


def test_stream_weights_with_activation_offload_is_refused():
    """Catches ``--activation-offload`` silently dropped with
    ``--stream-weights`` (Qwen3-32B ``-b 32`` planned streamed stages with
    no activations in host memory and no refusal): the pair is not
    modelled, so it is refused naming both flags, exit status 2."""
    r = CliRunner().invoke(main, ["plan", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "--seq-len",
                                  "2048", "-b", "32", "--stream-weights", "--activation-offload"])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "\n" not in line and "Traceback" not in r.output
    assert "--stream-weights" in line and "--activation-offload" in line
