"""Flags that RoundPipe or Mobius would drop are refused in one line naming
the flag, exit 2, no traceback (a pin is honoured or refused, never ignored).

RoundPipe (pipesearch.roundpipe) holds a fixed state in host memory (16-bit
weights and gradients, fp32 master weights, gradients and moments: 20 B per
parameter) on one model copy without tensor parallelism, so it has no
optimizer-state choice, nothing to shard and no collective to overlap;
Mobius swaps every stage's weights through host memory over PCIe, so it
needs a ``[host]`` table and already does what ``--stream-weights`` asks.
Before, each of these ran and silently returned plans without the flag's
effect (the optimizer state, the sharding) or, for Mobius on a cluster
without ``[host]``, reported every point out of memory.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pipesearch.cli import main

RTX = ["--model", "qwen3-1.7b", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "-b", "16"]


@pytest.mark.parametrize("flags,needles", [
    (["--schedule", "roundpipe", "--sharding", "zero1"], ["--sharding zero1", "one model copy (dp 1)"]),
    (["--schedule", "roundpipe", "--zero1"], ["--zero1", "dp 1"]),
    (["--schedule", "roundpipe", "--schedule", "1f1b", "--sharding", "zero3"], ["--sharding zero3"]),
    (["--schedule", "roundpipe", "--overlap-grad-reduce"], ["--overlap-grad-reduce", "dp 1"]),
    (["--schedule", "roundpipe", "--tp-comm-overlap"], ["--tp-comm-overlap", "tp 1"]),
    (["--schedule", "roundpipe", "--optimizer-state", "megatron"], ["--optimizer-state megatron", "20 B per parameter"]),
    (["--schedule", "roundpipe", "--optimizer-bytes-per-param", "12"], ["--optimizer-bytes-per-param 12"]),
    (["--schedule", "mobius", "--stream-weights"], ["--schedule mobius with --stream-weights"]),
])
def test_a_flag_the_schedule_would_drop_is_refused(flags, needles):
    r = CliRunner().invoke(main, ["plan", "-q"] + RTX + flags)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --schedule "), r.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("schedules", [["mobius"], ["mobius", "1f1b"]])
def test_mobius_on_a_cluster_without_host_table(schedules):
    """1x4-v100-pcie has no [host] table: refused up front naming it (before,
    Qwen3-1.7B came back as every point out of memory)."""
    args = ["plan", "-q", "--model", "qwen3-1.7b", "--cluster", "1x4-v100-pcie", "--seq-len", "2048"]
    for s in schedules:
        args += ["--schedule", s]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    (line,) = r.output.strip().splitlines()
    assert "--schedule mobius" in line and "'1x4-v100-pcie' has no [host] table" in line


def test_mobius_beside_another_schedule_keeps_stream_weights():
    """With 1F1B also asked for, --stream-weights applies to its plans: not
    refused (the refusal is for Mobius alone, which would drop it)."""
    r = CliRunner().invoke(main, ["plan", "-q", "--top", "1"] + RTX + ["--schedule", "mobius", "--schedule", "1f1b",
                                                                       "--stream-weights", "--pp", "2"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("pins", [["--schedule", "interleaved-1f1b"], ["--schedule", "looped-bfs", "--vp", "2"],
                                  ["--vp", "2"]])
def test_activation_offload_with_several_stages_per_device_is_refused(pins):
    """Activations in host memory are planned for one stage per device (and
    Mobius): a search that can only run several stages per device refuses
    --activation-offload (it was searched without it, silently)."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    res = CliRunner().invoke(main, ["plan", "-q", "--model", "llama3-8b", "--cluster", "1x8-rtx3090-pcie3", "-b", "32",
                                    "--seq-len", "2048", "--pp", "8", "--tp", "1", "--activation-offload", *pins])
    assert res.exit_code == 2 and "--activation-offload with" in res.output and "Traceback" not in res.output
    # the fix names what excludes one stage per device: the schedules, else the pinned vp
    assert ("drop --vp" in res.output) == ("--schedule" not in pins)
