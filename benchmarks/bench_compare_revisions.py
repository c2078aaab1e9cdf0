"""Search speed of two revisions side by side, in one run.

Usage: python benchmarks/bench_compare_revisions.py --base REV [--case NAME ...]

Checks out ``REV`` into a temporary git worktree, then runs each case's
``pipesearch plan`` command with the base revision's package and with this
checkout's, each in a fresh interpreter, alternating, ``--repeat`` times
(default 1), both packages compiled to bytecode first (as an installed one
is), and prints the least CPU seconds of each (user + system of the
child, which load on other cores does not inflate; the least of several
runs, because a shared virtual machine's speed drifts by 10-30% from run to
run), the rank-1 plan of both and the ranked plans whose split was not
proven optimal, with their gaps.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CASES = {
    "vgg16-default": ["plan", "-q", "--json"],
    "resnet50-4x4": ["plan", "-q", "--json", "--model", "resnet50", "--cluster", "4x4-v100-10gbe",
                     "--global-batch-size", "256"],
    "gpt3-1.3b-16gpu": ["plan", "-q", "--json", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb",
                        "--global-batch-size", "512", "--tp", "1", "--recompute", "none"],
    "gpt3-175b-128gpu": ["plan", "-q", "--json", "--model", "gpt3-175b", "--cluster", "2x8-a100-80gb",
                         "--nodes", "16", "--global-batch-size", "1536"],
    "gpt3-175b-512gpu": ["plan", "-q", "--json", "--model", "gpt3-175b", "--cluster", "2x8-a100-80gb",
                          "--nodes", "64", "--global-batch-size", "1536"],
}
DEFAULT_CASES = [name for name in CASES if name != "gpt3-175b-512gpu"]  # that one on request (--case)


def _run(tree: Path, args: list[str]) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-m", "pipesearch", *args], cwd=tree, env=env,
                         capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    first = "error: " + out.stderr.strip().splitlines()[-1] if out.returncode else _rank1(out.stdout)
    return cpu, first


def _rank1(text: str) -> str:
    """The rank-1 plan, then each ranked plan whose split was not proven
    optimal with its gap (``plan 5 gap 28.3%``; none: ``all proven``; a
    revision whose plans carry no ``split_search``: ``no split report``)."""
    import json

    try:
        plans = json.loads(text)["plans"]
        plan = plans[0]
    except (ValueError, KeyError, IndexError):
        return "?"
    par, sch = plan["parallelism"], plan["schedule"]
    infos = [p.get("options", {}).get("split_search") for p in plans]
    open_ = [f"plan {k} gap {100 * info['gap']:.1f}%" for k, info in enumerate(infos, 1)
             if info and not info.get("exact", True)]
    proofs = (", ".join(open_) or "all proven") if any(infos) else "no split report"
    return (f"pp {par['pp']} dp {par['dp']} tp {par['tp']} {sch['name']} m {sch['num_micro_batches']}: "
            f"{plan['predicted']['iteration_time_s'] * 1e3:.1f} ms; {proofs}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--case", nargs="+", default=DEFAULT_CASES, choices=list(CASES))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side, alternating (the least CPU counts)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.base],
                       check=True, capture_output=True)
        try:
            for tree in (base, REPO):  # bytecode written beforehand, as `pip install` does: no run compiles
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "pipesearch")], check=True,
                               capture_output=True, env={k: v for k, v in os.environ.items()
                                                         if k != "PYTHONDONTWRITEBYTECODE"})
            print(f"| case | base {args.base[:10]} CPU s | this checkout CPU s | ratio | base rank 1 | this rank 1 |")
            print("|---|---:|---:|---:|---|---|")
            for name in args.case:
                b_runs, n_runs = [], []
                for _ in range(max(1, args.repeat)):
                    b_runs.append(_run(base, CASES[name]))
                    n_runs.append(_run(REPO, CASES[name]))
                (b_cpu, b_plan), (n_cpu, n_plan) = min(b_runs), min(n_runs)
                print(f"| {name} | {b_cpu:.2f} | {n_cpu:.2f} | {n_cpu / b_cpu:.2f} | {b_plan} | {n_plan} |")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False,
                           capture_output=True)


if __name__ == "__main__":
    main()
