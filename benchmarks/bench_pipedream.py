"""PipeDream's optimizer against `pipesearch plan` on the same graph.txt profiles.

Usage: python benchmarks/bench_pipedream.py --pipedream DIR [--cluster 4x4-v100-10gbe] [--timeout S]

``DIR`` is the ``optimizer/`` folder of a PipeDream checkout
(github.com/msr-fiddle/pipedream; its scripts import ``graph`` from the
folder above, so keep the checkout whole, and ``graph`` imports the
``graphviz`` Python package: ``pip install graphviz``). Without it the script says so and
exits 0. For every PipeDream profile in ``tests/data/pipedream/`` it runs, each
in a child process:

* ``optimizer_graph_hierarchical.py -f GRAPH -n PER_NODE NODES -b INTRA INTER
  --activation_compression_ratio 1`` (PipeDream's two-level DP over the
  graph's antichains, its own analytic time; the machine counts and link
  bandwidths, bytes/s, are the cluster's);
* ``pipesearch plan --model GRAPH --cluster CLUSTER -q`` (the full default
  search: pp, dp, micro-batching, four schedules, placements, exact splits
  for the simulated time);

and prints the CPU seconds of each (user + system, from the child's rusage)
and their ratio. The two answer different questions (PipeDream: one
partition with replication per stage under its own cost model; pipesearch:
ranked plans over the whole space), so the ratio is of search cost, not of
plan quality.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_scale import PY, ROOT, run_child  # noqa: E402
from pipesearch.hardware import load_cluster  # noqa: E402

PROFILES = ROOT / "tests" / "data" / "pipedream"


def pipedream_args(optimizer_dir: Path, graph: Path, cluster) -> list[str]:
    """PipeDream's optimizer on ``graph`` for ``cluster``'s two levels."""
    group = cluster.groups[0]
    return [PY, str(optimizer_dir / "optimizer_graph_hierarchical.py"), "-f", str(graph),
            "-n", str(group.devices_per_node), str(group.nodes),
            "-b", f"{cluster.intra_node.bandwidth_bytes_per_s:.0f}", f"{cluster.inter_node.bandwidth_bytes_per_s:.0f}",
            "--activation_compression_ratio", "1"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipedream", type=Path, help="the optimizer/ folder of a PipeDream checkout")
    parser.add_argument("--cluster", default="4x4-v100-10gbe", help="catalog cluster (one device type)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    args = parser.parse_args()
    script = args.pipedream / "optimizer_graph_hierarchical.py" if args.pipedream else None
    if script is None or not script.is_file():
        where = f"{args.pipedream} has no optimizer_graph_hierarchical.py" if args.pipedream else "no --pipedream DIR"
        print(f"skipped: {where}; clone github.com/msr-fiddle/pipedream and pass --pipedream pipedream/optimizer")
        return 0
    cluster = load_cluster(args.cluster)
    if len(cluster.groups) != 1:
        print(f"skipped: {args.cluster} mixes device types; PipeDream's optimizer takes one machine type")
        return 0
    print(f"{time.strftime('%Y-%m-%d')}, cluster {args.cluster}, CPU seconds per run\n")
    print("| profile | PipeDream s | pipesearch plan s | pipesearch / PipeDream | status |")
    print("|---|---:|---:|---:|---|")
    for graph in sorted(PROFILES.glob("*.graph.txt")):
        # PipeDream's scripts find ``graph`` through ``sys.path.append("..")``: run them in their folder
        pd_run = run_child(pipedream_args(args.pipedream.resolve(), graph.resolve(), cluster), args.timeout,
                           cwd=args.pipedream.resolve())
        ps_run = run_child([PY, "-m", "pipesearch", "plan", "--model", str(graph), "--cluster", args.cluster, "-q"],
                           args.timeout)
        both = pd_run.status == ps_run.status == "ok"
        ratio = f"{ps_run.cpu_s / pd_run.cpu_s:.2f}" if both and pd_run.cpu_s > 0 else "-"
        status = "ok" if both else \
            f"PipeDream {pd_run.status}; pipesearch {ps_run.status}"
        print(f"| {graph.name.removesuffix('.graph.txt')} | {pd_run.cpu_s:.2f} | {ps_run.cpu_s:.2f} | {ratio} | "
              f"{status} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
