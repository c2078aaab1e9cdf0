"""Wall time of the exact split (partition.optimal_split) as layers and stages grow,
and of a whole `plan` search on each PipeDream profile for 16 devices.

Usage: python benchmarks/bench_split.py [--quick]

Instances for the split: L layers with random fwd+bwd times in [0.5, 1.5) ms,
random saved activations (up to 10 MB) and outputs (up to 50 MB) crossing a 10 GB/s link, random weights,
1F1B with m = 4 * pp micro-batches, devices of 80 GiB; seeded, so every run
times the same instances. Each cell is the best of 3 runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesearch.costs import PipelineCosts, in_flight_micro_batches  # noqa: E402
from pipesearch.partition import optimal_split  # noqa: E402


def instance(num_layers: int, pp: int, seed: int = 0) -> PipelineCosts:
    rng = np.random.default_rng(seed)
    times = rng.uniform(0.5e-3, 1.5e-3, num_layers)
    params = rng.uniform(0, 4e6, num_layers)
    saved = rng.uniform(0, 10e6, num_layers)
    out = rng.uniform(0, 50e6, num_layers)
    m = 4 * pp
    z = np.zeros(1)
    return PipelineCosts(
        num_micro_batches=m,
        compute_prefix_s=np.concatenate([z, np.cumsum(times)]),
        fwd_prefix_s=np.concatenate([z, np.cumsum(times / 3)]),
        param_prefix_bytes=np.concatenate([z, np.cumsum(params)]),
        saved_prefix_bytes=np.concatenate([z, np.cumsum(saved)]),
        output_bytes=out,
        time_scale=np.ones(pp),
        p2p_bandwidth_bytes_per_s=np.full(pp, 10e9),
        p2p_latency_s=np.full(pp, 10e-6),
        allreduce_s_per_byte=np.zeros(pp),
        allreduce_fixed_s=np.zeros(pp),
        in_flight=in_flight_micro_batches("1f1b", pp, m),
        capacity_bytes=np.full(pp, 80 * 2**30),
        state_bytes_per_param_byte=4.0,
        grad_bytes_per_param_byte=1.0,
    )


def best_of(fn, repeats: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def split_table(layers, stages) -> None:
    print("| layers | stages | split s | DP passes |")
    print("|---:|---:|---:|---:|")
    for L in layers:
        for pp in stages:
            if pp > L:
                continue
            costs = instance(L, pp)
            t, res = best_of(lambda: optimal_split(costs))
            passes = res.dp_passes if res else "no split fits"
            print(f"| {L} | {pp} | {t:.4f} | {passes} |")


def plan_table() -> None:
    from pipesearch.catalog import list_entries
    from pipesearch.hardware import load_cluster
    from pipesearch.models import load_model_source
    from pipesearch.search import search
    from pipesearch.types import Job

    cluster = load_cluster("4x4-v100-10gbe")
    print("| model | layers | points evaluated | pruned | plan s |")
    print("|---|---:|---:|---:|---:|")
    for name, path in list_entries("model").items():
        if path.suffix != ".csv":
            continue
        src = load_model_source(name, cluster)
        job = Job(global_batch_size=src.variants[0].profile.profiled_batch_size * 8)
        t, res = best_of(lambda: search(list(src.variants), cluster, job), repeats=1)
        pruned = dict(res.infeasible).get("pruned", 0)
        print(f"| {name} | {src.variants[0].profile.num_layers} | {res.points_evaluated} | {pruned} | {t:.2f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    args = ap.parse_args()
    if args.quick:
        split_table([100, 500], [4, 16])
    else:
        split_table([100, 500, 1000, 2000], [4, 16, 64, 128])
        print()
        plan_table()
