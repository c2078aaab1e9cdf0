"""The exact device-class DP (pipesearch.class_dp) on the instances of
benchmarks/bench_ilp.py: 64 layers on 16 devices of 3 types (4 H100, 8
A100, 4 V100, 4 per node: four classes), P = 8 and 16, both objectives.

Prints a Markdown table: status, objective, DP passes, wall seconds (best of
``--repeat`` runs; the result itself never depends on time). With
``--simulated``, a second table: the same instances for the simulated time
(1F1B, ``m = 2P``): :func:`pipesearch.order_search.best_order` (the branch
and bound over classes) with its status, time, proven bound, gap, orders
split, prefixes expanded and CPU / wall seconds, beside the exact split of
the class DP's order for the closed-form iteration objective.

Usage: python benchmarks/bench_class_dp.py [--repeat N] [--simulated]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from bench_ilp import synthetic  # noqa: E402

from bench_ilp import A100, synthetic_cluster, synthetic_profile  # noqa: E402

from pipesearch.class_dp import class_dp_mapping, count_vectors  # noqa: E402
from pipesearch.costs import build_pipeline_costs  # noqa: E402
from pipesearch.order_search import best_order  # noqa: E402
from pipesearch.placement import slot_classes, slot_heads  # noqa: E402
from pipesearch.split_search import exact_split  # noqa: E402
from pipesearch.types import Job  # noqa: E402


def simulated(P: int) -> str:
    """One row of the ``--simulated`` table for ``synthetic(64, 16, P)``."""
    profile, cluster = synthetic_profile(64), synthetic_cluster(16)
    job, m = Job(global_batch_size=8 * 2 * P), 2 * P
    heads = slot_heads(cluster, 1)

    def costs_of(order):
        return build_pipeline_costs(profile, cluster, job, pp=P, dp=1, micro_batch_size=8, num_micro_batches=m,
                                    schedule="1f1b", placement=heads[np.asarray(order)][:, None],
                                    profiled_device=A100)

    closed = class_dp_mapping(synthetic(64, 16, P), "iteration")
    pos = {int(h): k for k, h in enumerate(heads)}
    closed_order = tuple(pos[d] for d in closed.devices)
    closed_split = exact_split(costs_of(closed_order), "1f1b", P)
    c0, w0 = time.process_time(), time.perf_counter()
    found = best_order(slot_classes(cluster, 1), costs_of, "1f1b", P, first=[closed_order])
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return (f"| 64 | 16 | {P} | {found.status} | {found.iteration_time_s:.5f} | {found.best_bound_s:.5f} | "
            f"{found.gap:.3%} | {found.orders_evaluated} | {found.prefixes_expanded} | "
            f"{closed_split.iteration_time_s:.5f} | {cpu:.2f} | {wall:.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--simulated", action="store_true", help="also the simulated-time table (best_order)")
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
    if args.simulated:
        print("\n| L | D | P | status | simulated s | bound s | gap | orders split | prefixes | "
              "class-DP order s | CPU s | wall s |")
        print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for P in (16, 8):
            print(simulated(P))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
