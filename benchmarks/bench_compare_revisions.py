"""Search speed of two revisions side by side, in one run.

Usage: python benchmarks/bench_compare_revisions.py --base REV [--case NAME ...] [--instructions]

Checks out ``REV`` into a temporary git worktree, then runs each case's
``pipesearch plan`` command with the base revision's package and with this
checkout's, each in a fresh interpreter, alternating, ``--repeat`` times
(default 1), both packages compiled to bytecode first (as an installed one
is), and prints the least CPU seconds of each (user + system of the
child, which load on other cores does not inflate; the least of several
runs, because a shared virtual machine's speed drifts by 10-30% from run to
run), the rank-1 plan of both and the ranked plans whose split was not
proven optimal, with their gaps.

``--instructions`` runs each side once under callgrind (``valgrind
--tool=callgrind``, which must be installed) and prints the instructions
each executes instead of CPU seconds: a count that neither machine load nor
a drifting virtual machine moves (two runs of one tree differ by about 1%,
hash seeds reordering sets and dicts), at about 80 times the run time.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
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


def _run(tree: Path, args: list[str], instructions: bool = False) -> tuple[float, str]:
    """``(cost, rank 1)`` of one ``pipesearch`` run on ``tree``: CPU seconds,
    or with ``instructions`` the instructions callgrind counts."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONPATH=str(tree))
    tool = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] if instructions else []
    out = subprocess.run([*tool, sys.executable, "-m", "pipesearch", *args], cwd=tree, env=env,
                         capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cost = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if instructions:
        counted = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
        cost = float(counted.group(1)) if counted else float("nan")
    lines = [line for line in out.stderr.strip().splitlines() if not line.startswith("==")]
    first = "error: " + (lines[-1] if lines else "?") if out.returncode else _rank1(out.stdout)
    return cost, first


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
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_rank1 import open_plans

    par, sch = plan["parallelism"], plan["schedule"]
    return (f"pp {par['pp']} dp {par['dp']} tp {par['tp']} {sch['name']} m {sch['num_micro_batches']}: "
            f"{plan['predicted']['iteration_time_s'] * 1e3:.1f} ms; {open_plans(plans)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--case", nargs="+", default=DEFAULT_CASES, choices=list(CASES))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side, alternating (the least CPU counts)")
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions under callgrind (one run of each side) instead of CPU seconds")
    args = ap.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (callgrind) on the PATH")
    unit = "instructions (10^9)" if args.instructions else "CPU s"
    scale = 1e-9 if args.instructions else 1.0
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.base],
                       check=True, capture_output=True)
        try:
            for tree in (base, REPO):  # bytecode written beforehand, as `pip install` does: no run compiles
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "pipesearch")], check=True,
                               capture_output=True, env={k: v for k, v in os.environ.items()
                                                         if k != "PYTHONDONTWRITEBYTECODE"})
            print(f"| case | base {args.base[:10]} {unit} | this checkout {unit} | ratio | base rank 1 | this rank 1 |")
            print("|---|---:|---:|---:|---|---|")
            for name in args.case:
                b_runs, n_runs = [], []
                for _ in range(1 if args.instructions else max(1, args.repeat)):
                    b_runs.append(_run(base, CASES[name], args.instructions))
                    n_runs.append(_run(REPO, CASES[name], args.instructions))
                (b_cost, b_plan), (n_cost, n_plan) = min(b_runs), min(n_runs)
                print(f"| {name} | {b_cost * scale:.2f} | {n_cost * scale:.2f} | {n_cost / b_cost:.3f} | {b_plan} "
                      f"| {n_plan} |")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False,
                           capture_output=True)


if __name__ == "__main__":
    main()
