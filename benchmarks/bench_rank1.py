"""The rank-1 plan of every catalog model on its typical cluster, the
README default and the ``bench_compare_revisions`` cases, one line each.

Usage: python benchmarks/bench_rank1.py [--tree DIR] [--case NAME ...] [--list]

Each case runs ``pipesearch plan -q --json`` in a fresh interpreter with
``DIR`` (default: this checkout) first on ``PYTHONPATH``, and prints the
rank-1 plan's degrees, schedule, micro-batching, recompute, placement,
layers per stage and simulated iteration time (``repr`` of the float, so two
trees agree only when the times are bit-identical), then the ranked plans
whose split is not proven optimal with their gaps and the points left
unproven (:func:`proofs`), then the CPU seconds of the child. Run it on two
trees and ``diff`` the outputs without the last two columns (``cut -d'|'
-f1-3``) to check that a change kept every answer.

Typical clusters: the profile CSVs (PipeDream's and torchvision's CNNs,
GNMT) on 4x4-v100-10gbe at global batch 1024; transformers up to 13B
parameters on 2x8-a100-80gb at 512; the 32B to 175B ones on 2x8-a100-80gb
with 16 nodes (128 GPUs) at 1536.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LARGE = ("gpt3-175b", "llama2-70b", "llama3-70b", "qwen3-32b")


def cases(tree: Path) -> dict[str, list[str]]:
    """Case name -> ``pipesearch`` arguments (after ``plan -q --json``)."""
    out = {
        "readme-default": [],
        "resnet50-4x4": ["--model", "resnet50", "--cluster", "4x4-v100-10gbe", "--global-batch-size", "256"],
        "gpt3-1.3b-16gpu": ["--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "--global-batch-size", "512",
                            "--tp", "1", "--recompute", "none"],
        "gpt3-175b-128gpu": ["--model", "gpt3-175b", "--cluster", "2x8-a100-80gb", "--nodes", "16",
                             "--global-batch-size", "1536"],
        "gpt3-175b-1024gpu": ["--model", "gpt3-175b", "--cluster", "2x8-a100-80gb", "--nodes", "128",
                              "--global-batch-size", "1536"],
    }
    for path in sorted((tree / "cost_models").iterdir()):
        if path.name.startswith("_") or path.suffix not in (".csv", ".toml"):
            continue
        name = path.stem
        if path.suffix == ".csv":
            out[name] = ["--model", name, "--cluster", "4x4-v100-10gbe", "--global-batch-size", "1024"]
        elif name in LARGE:
            out[name] = ["--model", name, "--cluster", "2x8-a100-80gb", "--nodes", "16",
                         "--global-batch-size", "1536"]
        else:
            out[name] = ["--model", name, "--cluster", "2x8-a100-80gb", "--global-batch-size", "512"]
    return out


def rank1(text: str) -> str:
    """One line naming the rank-1 plan (see the module docstring)."""
    plan = json.loads(text)["plans"][0]
    par, sch, opt = plan["parallelism"], plan["schedule"], plan.get("options", {})
    layers = ",".join(str(st["layers"][1] - st["layers"][0]) for st in plan["stages"])
    return (f"pp {par['pp']} dp {par['dp']} tp {par['tp']} vp {par['vp']} {sch['name']} "
            f"mbs {sch['micro_batch_size']} m {sch['num_micro_batches']} {opt.get('recompute')} "
            f"{opt.get('placement')} [{layers}] {plan['predicted']['iteration_time_s']!r} s")


def open_plans(plans: list) -> str:
    """Each ranked plan whose split was not proven optimal, with its gap
    (``plan 5 gap 28.3%``), ``all proven`` when none, ``no split report``
    when the plans carry no ``split_search`` (an older revision)."""
    infos = [p.get("options", {}).get("split_search") for p in plans]
    open_ = [f"plan {k} gap {100 * info['gap']:.1f}%" for k, info in enumerate(infos, 1)
             if info and not info.get("exact", True)]
    return (", ".join(open_) or "all proven") if any(infos) else "no split report"


def proofs(text: str) -> str:
    """:func:`open_plans` of a plan file, then the points the search left
    unproven (``search.unproven_points``: their count and least bound)."""
    doc = json.loads(text)
    unproven = doc.get("search", {}).get("unproven_points")
    points = (f"; {unproven['count']} points unproven, least bound {unproven['least_lower_bound_s']:.4g} s"
              if unproven else "")
    return open_plans(doc["plans"]) + points


def run_case(tree: Path, args: list[str]) -> tuple[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "pipesearch", "plan", "-q", "--json", *args], cwd=tree,
                          env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if done.returncode:
        return "exit %d: %s | -" % (done.returncode, (done.stderr.strip().splitlines() or [""])[-1][:160]), cpu
    return f"{rank1(done.stdout)} | {proofs(done.stdout)}", cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=REPO, help="source tree to run (default: this checkout)")
    ap.add_argument("--case", nargs="+", help="only these cases (default: all)")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    args = ap.parse_args()
    tree = args.tree.resolve()
    table = cases(tree)
    if args.list:
        print("\n".join(table))
        return
    for name in args.case or table:
        line, cpu = run_case(tree, table[name])
        print(f"{name} | {' '.join(table[name]) or '(defaults)'} | {line} | {cpu:.2f} CPU s", flush=True)


if __name__ == "__main__":
    main()
