"""Time pipesearch.simulate on 1F1B schedules of growing size.

Usage: python benchmarks/bench_simulate.py [--repeat N] [--schedule NAME]

Prints a table: p (ranks), m (micro-batches), actions, seconds (best of
--repeat runs of simulate(), including its validate() pass; building the
schedule is not timed), actions/s.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from pipesearch.schedules import build, num_stages_of  # noqa: E402
from pipesearch.simulate import simulate  # noqa: E402

GRID = [(4, 8), (4, 64), (8, 32), (8, 256), (16, 64), (16, 512), (32, 128), (32, 512), (64, 256), (64, 512)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("-v", type=int, default=1, help="stages per rank (looped schedules)")
    args = ap.parse_args(argv)
    print(f"# python {platform.python_version()} on {platform.machine()}, schedule {args.schedule}, best of {args.repeat}")
    print(f"{'p':>4} {'m':>5} {'actions':>8} {'seconds':>9} {'actions/s':>11}")
    for p, m in GRID:
        actions = build(args.schedule, p, m, args.v)
        S = num_stages_of(args.schedule, p, args.v)
        n = sum(len(r) for r in actions)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            simulate(actions, fwd_s=[1e-3] * S, bwd_s=[2e-3] * S, bwd_input_s=[1e-3] * S,
                     p2p_s=[1e-4] * (S - 1), act_bytes=[1e6] * S)
            best = min(best, time.perf_counter() - t0)
        print(f"{p:>4} {m:>5} {n:>8} {best:>9.4f} {n / best:>11,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
