"""The serving table's note on the engine's running limit: plans whose batch
is the engine's default ``--max-num-seqs`` while their KV pool holds more
sequences are named, with the pools' figures, from the plan file's own
fields; a limit given on the command line, or a workload of its own
(--request-rate, --concurrency), gets no such note."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pipesearch.cli import main

# Llama-3 70B with an fp8 KV cache on four 8 x H100 nodes: pools of thousands of sequences, vLLM's default
# limit of 1,024 on 80 GB devices
BASE = ["serve", "--model", "llama3-70b", "--cluster", "4x8-h100", "--kv-dtype", "fp8", "--simulate-top", "0"]


def _run(*extra):
    text = CliRunner().invoke(main, [*BASE, *extra])
    doc = CliRunner().invoke(main, [*BASE, *extra, "--json"])
    assert text.exit_code == doc.exit_code == 0, text.output
    return text.output, json.loads(doc.stdout)


def test_plans_held_by_the_default_running_limit_are_named():
    out, doc = _run()
    limit = doc["inputs"]["engine"]["max_num_seqs"]
    capped = [p for p in doc["plans"] if p["batch"] == limit < p["max_batch"]]
    assert capped  # the case holds some
    lines = [line for line in out.splitlines() if "default running limit" in line]
    assert len(lines) == 1
    ranks = ", ".join(str(p["rank"]) for p in capped)
    assert lines[0].startswith(f"plan{'s' if len(capped) > 1 else ''} {ranks} run")
    assert f"{limit:,} sequences a replica" in lines[0]
    assert ", ".join(f"{p['max_batch']:,}" for p in capped) in lines[0]
    assert f"--max-num-seqs {max(p['max_batch'] for p in capped)}" in lines[0]


def test_no_note_where_the_limit_is_given_or_the_workload_sets_the_batch():
    for extra in (["--max-num-seqs", "1024"], ["--concurrency", "64"], ["--request-rate", "5"]):
        out, _ = _run(*extra)
        assert "default running limit" not in out, extra
