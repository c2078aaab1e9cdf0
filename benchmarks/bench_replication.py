"""Per-stage replication (PipeDream / DAPPLE style) against uniform data parallelism.

Usage: python benchmarks/bench_replication.py [--cluster 4x4-v100-10gbe] [--batch 1024]
       [--inter-node-gbps X] [--top 20] [--tp N] [MODEL ...]

The tensor-parallel row: python benchmarks/bench_replication.py --cluster
2x8-a100-80gb --batch 64 --tp 2 gpt3-1.3b (a catalog transformer, its tp-2
layer tables; each replica of a stage is then one tp-2 group of a node).

For each model (default: vgg16 and resnet50, the PipeDream profiles of
``cost_models/``) it runs the search twice on the same cluster and batch:
``pipesearch plan`` as it is (one data-parallel degree for all stages) and
with ``--replicate-stages`` (also every replica vector of pp 2 to 4,
:mod:`pipesearch.replication`), and prints, for each, the best plan's
simulated iteration time, throughput, degrees, replicas, split, schedule and
micro-batching, plus the CPU seconds of the search (this process's user +
system time around the call), and the best plan with per-stage replicas
among the replicated search's top ``--top``. Both searches rank by the same time model, so
the replicated search's rank 1 is never slower than the uniform one's; the
table says by how much it is faster.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesearch.hardware import load_cluster  # noqa: E402
from pipesearch.models import load_model_source  # noqa: E402
from pipesearch.search import search  # noqa: E402
from pipesearch.search_options import SearchOptions  # noqa: E402
from pipesearch.types import Job, Link  # noqa: E402


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def describe(plan) -> str:
    reps = ",".join(map(str, plan.stage_replicas)) if plan.stage_replicas else f"{plan.dp} each"
    return (f"{plan.predicted.iteration_time_s * 1e3:.1f} ms | {plan.predicted.samples_per_s:,.0f} | "
            f"{plan.pp} x {plan.dp} x {plan.tp} | {reps} | {','.join(map(str, plan.layers_per_stage))} | "
            f"{plan.schedule} | {plan.micro_batch_size} x {plan.num_micro_batches}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["vgg16", "resnet50"])
    parser.add_argument("--cluster", default="4x4-v100-10gbe")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--inter-node-gbps", type=float,
                        help="replace the cluster's inter-node bandwidth (GB/s; latency kept)")
    parser.add_argument("--top", type=int, default=20, help="plans the replicated search keeps (default 20)")
    parser.add_argument("--tp", type=int, help="pin the tensor-parallel degree (catalog transformers)")
    args = parser.parse_args()
    cluster = load_cluster(args.cluster)
    if args.inter_node_gbps:
        link = Link(args.inter_node_gbps * 1e9, cluster.inter_node.latency_s)
        cluster = replace(cluster, name=f"{cluster.name} at {args.inter_node_gbps:g} GB/s", inter_node=link)
    job = Job(global_batch_size=args.batch)
    print(f"{time.strftime('%Y-%m-%d')}, cluster {cluster.name}, global batch {args.batch}"
          f"{'' if args.tp is None else f', tp {args.tp}'}, default job "
          "(mixed-precision Adam state, 1 GiB reserve)\n")
    print("| model | search | iteration | samples/s | pp x dp x tp | replicas | layers/stage | schedule | "
          "mbs x m | search CPU s |")
    print("|---|---|---:|---:|---|---|---|---|---|---:|")
    for name in args.models:
        source = load_model_source(name, cluster, tp=args.tp)
        best = {}
        for label, replicate in (("uniform dp", False), ("--replicate-stages", True)):
            start = cpu_s()
            result = search(list(source.variants), cluster, job,
                            SearchOptions(replicate_stages=replicate, top=args.top if replicate else 5),
                            profiled_device=source.profiled_device)
            spent = cpu_s() - start
            best[label] = result.plans[0]
            print(f"| {name} | {label}, rank 1 | {describe(result.plans[0])} | {spent:.1f} |")
            replicated = [p for p in result.plans if p.stage_replicas is not None]
            if replicate and replicated:
                print(f"| {name} | best with per-stage replicas (rank {replicated[0].rank}) | "
                      f"{describe(replicated[0])} | |")
            elif replicate:
                print(f"| {name} | best with per-stage replicas | none in the top {args.top} | | | | | | | |")
        gain = best["uniform dp"].predicted.iteration_time_s / best["--replicate-stages"].predicted.iteration_time_s
        print(f"| {name} | speed-up of rank 1 | {gain:.3f}x | | | | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
