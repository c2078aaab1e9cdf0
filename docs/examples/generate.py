"""Regenerate docs/examples/: the exported runtime files for Llama-3 8B on 2 nodes
of 8 H100, global batch 512 (sequence length 8192, the config's).

For each runtime, ``pipesearch plan --runtime R`` and then ``pipesearch
export --files`` of its best plan (``best/``) and of its best plan with
pipeline parallelism (``pipelined/``, pp > 1), plus the plan file itself.

    python docs/examples/generate.py            # rewrite docs/examples/llama3-8b-2x8-h100/
    python docs/examples/generate.py --check    # exit 1 if the committed files differ

The plan file's ``search.wall_s`` and absolute paths vary between machines;
they are normalised before writing so that the check compares only what the
planner decided; its ``search.points`` and per-plan ``exports`` are dropped
(the exports are the ``*.export.json`` files beside it).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

from pipesearch.cli import main

HERE = Path(__file__).resolve().parent
CASE = "llama3-8b-2x8-h100"
PLAN_ARGS = ["--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "2", "--global-batch-size", "512", "-q"]
RUNTIMES = ("torchtitan", "megatron", "deepspeed")


def _invoke(args: list[str]) -> None:
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    if res.exit_code != 0:
        raise SystemExit(f"pipesearch {' '.join(args)} failed:\n{res.output}")


def _normalise(plan_json: Path) -> None:
    doc = json.loads(plan_json.read_text())
    doc["search"]["wall_s"] = 0.0
    doc["search"].pop("points", None)  # every evaluated point: large and not what the example shows
    for plan in doc["plans"]:
        plan.pop("exports", None)  # the exports are the *.export.json files beside it
    doc["inputs"]["model"]["file"] = Path(doc["inputs"]["model"]["file"]).name
    plan_json.write_text(json.dumps(doc, indent=2) + "\n")


def generate(out: Path) -> None:
    """Write the example files under ``out/CASE``."""
    case = out / CASE
    if case.exists():
        shutil.rmtree(case)
    case.mkdir(parents=True)
    for runtime in RUNTIMES:
        d = case / runtime
        d.mkdir()
        plans = d / "plans.json"
        _invoke(["plan", *PLAN_ARGS, "--runtime", runtime, "-o", str(plans)])
        doc = json.loads(plans.read_text())
        ranks = {"best": 1}
        pipelined = [p["rank"] for p in doc["plans"] if p["parallelism"]["pp"] > 1]
        if pipelined:
            ranks["pipelined"] = pipelined[0]
        for label, rank in ranks.items():
            _invoke(["export", str(plans), "--rank", str(rank), "--format", runtime,
                     "-o", str(d / f"{label}.export.json"), "--files", str(d / label)])
            exp = json.loads((d / f"{label}.export.json").read_text())
            (d / f"{label}.export.json").write_text(json.dumps(exp, indent=2) + "\n")
        _normalise(plans)


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    args = ap.parse_args(argv)
    if not args.check:
        generate(HERE)
        print(f"wrote {HERE / CASE}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        cmp = filecmp.dircmp(Path(tmp) / CASE, HERE / CASE)
        diffs = _diffs(cmp, Path())
        if diffs:
            print("docs/examples differ from what the script generates: " + ", ".join(diffs), file=sys.stderr)
            return 1
    return 0


def _diffs(cmp: filecmp.dircmp, prefix: Path) -> list[str]:
    out = [str(prefix / n) for n in cmp.left_only + cmp.right_only + cmp.diff_files + cmp.funny_files]
    for name, sub in cmp.subdirs.items():
        out += _diffs(sub, prefix / name)
    return out


if __name__ == "__main__":
    sys.exit(main_())
