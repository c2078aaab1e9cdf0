"""The exact device-class DP (pipesearch.class_dp) on the instances of
benchmarks/bench_ilp.py: 64 layers on 16 devices of 3 types (4 H100, 8
A100, 4 V100, 4 per node: four classes), P = 8 and 16, both objectives.

Prints a Markdown table: status, objective, DP passes, wall seconds (best of
``--repeat`` runs; the result itself never depends on time).

Usage: python benchmarks/bench_class_dp.py [--repeat N]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_ilp import synthetic  # noqa: E402

from pipesearch.class_dp import class_dp_mapping, count_vectors  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"python {platform.python_version()} on {platform.machine()}\n")
    print("| L | D | P | objective | status | objective s | passes | count vectors | wall s |")
    print("|---:|---:|---:|---|---|---:|---:|---:|---:|")
    for P in (16, 8):
        problem = synthetic(64, 16, P)
        for objective in ("bottleneck", "iteration"):
            walls, results = [], set()
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r = class_dp_mapping(problem, objective)
                walls.append(time.perf_counter() - t0)
                results.add((r.devices, r.bounds, r.objective_s))
            assert len(results) == 1, "the class DP gave different answers"
            print(f"| 64 | 16 | {P} | {objective} | {r.status} | {r.objective_s:.5f} | {r.candidates} | "
                  f"{count_vectors(problem)} | {min(walls):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
