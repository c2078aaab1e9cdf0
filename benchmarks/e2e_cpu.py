"""Planned vs even pipeline split, run for real with torch.distributed.pipelining on CPU.

Usage: python benchmarks/e2e_cpu.py [--rounds N] [--steps N] [--repeats N] [--profile FILE]

The comparison of tests/test_e2e_torch.py with more repeats: profile the
uneven 8-block model of tests/e2e_model.py on this machine (batch 128, one
thread, CPU clock, median of --repeats interleaved passes), plan it for pp=2
on the 1x2-cpu cluster with 4 micro-batches of 128 (1F1B and GPipe), then run
the planned split and the even 4,4 split in two gloo processes (one thread
each), alternating the four configurations for --rounds rounds of --steps
timed steps after one warm-up step each. Prints a Markdown table: schedule,
split, measured step time (median, the slowest rank's schedule.step), the
plan's predicted iteration time, their ratio, the busiest rank's CPU time per
step and the plan's busiest-stage compute; then how much CPU other processes
of the host used meanwhile (wall-clock numbers need the cores free).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # run from a checkout without installing

import e2e_model  # noqa: E402


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20, help="profiling passes (median)")
    ap.add_argument("--profile", help="also keep the profile CSV here")
    args = ap.parse_args(argv)
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(args.profile) if args.profile else Path(tmp) / "e2e_model.csv"
        profile, rows = e2e_model.run_comparison(csv, rounds=args.rounds, steps=args.steps, repeats=args.repeats)
    first = rows[0][3]
    print(f"# {datetime.date.today().isoformat()}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"{cpu_model()}, {os.cpu_count()} cores; profile batch {profile.profiled_batch_size}, "
          f"{args.rounds} rounds x {args.steps} steps per configuration")
    print("# profile (ms, fwd+bwd): " + ", ".join(f"{lay.name}: {1e3 * (lay.fwd_s + lay.bwd_s):.1f}"
                                                   for lay in profile.layers))
    print(e2e_model.table(rows))
    if first.host_other_cores is not None:
        print(f"\nother processes used {first.host_other_cores:.2f} of {first.num_cpus} cores during the runs")
    for schedule in e2e_model.SCHEDULES:
        planned = next(r for s, k, _, r in rows if s == schedule and k == "planned")
        even = next(r for s, k, _, r in rows if s == schedule and k == "even")
        print(f"{schedule}: even / planned step time {even.median_step_s / planned.median_step_s:.2f}x "
              f"(predicted {even.predicted_s / planned.predicted_s:.2f}x); busiest rank CPU "
              f"{even.busiest_cpu_s / planned.busiest_cpu_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
