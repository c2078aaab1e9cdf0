"""Speed of `pipesearch serve`'s search (no simulation): 70B models on two
DGX A100 nodes (2 x 8 GPUs) and on 8 x L4, with and without a latency limit,
as the node count grows.

Usage: python benchmarks/bench_serve.py [--repeat 3]

Prints a Markdown table: case, configurations evaluated, best of N wall
seconds, the best plan.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesearch.catalog import resolve  # noqa: E402
from pipesearch.hardware import load_cluster  # noqa: E402
from pipesearch.profiles.transformer import load_transformer  # noqa: E402
from pipesearch.serve.dtypes import weight_format  # noqa: E402
from pipesearch.serve.engine import engine_spec  # noqa: E402
from pipesearch.serve.pipeline import Workload  # noqa: E402
from pipesearch.serve.search import ServeJob, search_serving  # noqa: E402

CASES = [
    ("llama2-70b", "2x8-a100-80gb", None, "bf16", 2048, 512, None),
    ("llama3-70b", "2x8-a100-80gb", None, "bf16", 2048, 512, None),
    ("llama3-70b", "2x8-a100-80gb", None, "bf16", 2048, 512, 0.1),
    ("llama3-70b", "1x8-l4", None, "fp8", 1024, 256, None),
    ("llama3-70b", "2x8-a100-80gb", 8, "bf16", 2048, 512, None),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| model | cluster | GPUs | weights | in / out | TPOT limit | configurations | search s | best plan |")
    print("|---|---|---:|---|---|---|---:|---:|---|")
    for model, cluster_name, nodes, wd, n_in, n_out, tpot in CASES:
        cfg = load_transformer(resolve("model", model))
        cluster = load_cluster(cluster_name, nodes=nodes)
        job = ServeJob(Workload(n_in, n_out), max_tpot_s=tpot)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = search_serving(cfg, cluster, job, engine=engine_spec("vllm"), weights=weight_format(wd), kv_bytes=2.0,
                               search_budget=True)  # as `pipesearch serve` plans it (no --max-num-batched-tokens)
            best = min(best, time.perf_counter() - t0)
        p = r.plans[0]
        print(f"| {model} | {cluster_name}{'' if nodes is None else f' x {nodes} nodes'} | {cluster.num_devices} | {wd} "
              f"| {n_in} / {n_out} | {'-' if tpot is None else f'{tpot * 1e3:.0f} ms'} | {r.evaluated} | {best:.3f} "
              f"| tp {p.tp} x pp {p.pp} x {p.replicas}, {p.total_output_tokens_per_s:,.0f} tok/s |")


if __name__ == "__main__":
    main()
