"""Full search for GPT-3 175B on A100 80 GB DGX nodes of 8 (NVLink + 8x 200 Gb/s
InfiniBand): all schedules, tp in {1, 2, 4, 8}, every micro-batch size that
divides the replica batch, recompute none / selective / full.

Usage: python benchmarks/bench_search_gpt.py [--nodes 1 16 128 1024] [--batch 1536]

Prints wall time, points evaluated, points per second and the best plan, for
each node count (the growth table of benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesearch.hardware import load_cluster  # noqa: E402
from pipesearch.models import load_model_source  # noqa: E402
from pipesearch.search import search  # noqa: E402
from pipesearch.search_options import SearchOptions  # noqa: E402
from pipesearch.types import Job  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--batch", type=int, default=1536)
    ap.add_argument("--model", default="gpt3-175b")
    args = ap.parse_args()
    print("| nodes | GPUs | wall s | points visited | evaluated | pruned | points/s | best plan | samples/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for nodes in args.nodes:
        cluster = load_cluster("2x8-a100-80gb", nodes=nodes)
        t0 = time.perf_counter()
        src = load_model_source(args.model, cluster)
        try:
            res = search(list(src.variants), cluster, Job(args.batch), SearchOptions())
        except Exception as exc:  # a cluster too small for the model
            print(f"| {nodes} | {8 * nodes} | {time.perf_counter() - t0:.2f} | - | - | - | - | {exc} | - |")
            continue
        wall = time.perf_counter() - t0
        counts = dict(res.infeasible)
        visited = res.points_evaluated + sum(counts.values())
        p = res.plans[0]
        best = (f"pp {p.pp} x dp {p.dp} x tp {p.tp}, {p.schedule}"
                f"{' v' + str(p.vp) if p.vp > 1 else ''}, mbs {p.micro_batch_size} x {p.num_micro_batches}, "
                f"recompute {dict(p.extra).get('recompute')}")
        print(f"| {nodes} | {8 * nodes} | {wall:.2f} | {visited} | {res.points_evaluated} | "
              f"{counts.get('pruned', 0)} | {visited / wall:,.0f} | {best} | {p.predicted.samples_per_s:.1f} |")


if __name__ == "__main__":
    main()
