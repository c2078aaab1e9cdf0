"""CP-SAT split + device mapping (pipesearch.ilp) on synthetic heterogeneous clusters.

Prints a Markdown table.

Usage: python benchmarks/bench_ilp.py [--deterministic-time T] [--workers N] [--table] [--nondeterministic]
                                      [--only LxDxP ...]

Instance ``synthetic(L, D, P)``: a chain of ``L`` transformer-like layers
(fp16 profile measured on an A100 40 GB: fwd+bwd 8-14 ms per layer at the
profiled batch, the first and last layers 3x (embedding, head); 0.2 GB of fp16
parameters per layer, i.e. 1.6 GB of Adam state; 0.25 GB of saved activations
and 40 MB of output per micro-batch) on ``D`` devices of 3 types: a quarter
H100 80 GB, half A100 40 GB, a quarter V100 16 GB, 4 per node, NVLink 100 GB/s
inside a node, 25 GB/s between nodes of a type, 12.5 GB/s between types;
1F1B with ``m = 2P`` micro-batches, ``P`` stages. Device specs are written
inline (not read from the catalog) so the numbers stay comparable.

The main run is 64 layers on 16 devices, ``P = 16`` and ``P = 8``, with the
bottleneck and the iteration objective; ``--table`` adds a layers x devices
scaling table (``P = D / 2``). For each: CP-SAT status, objective, proved
bound, gap, wall seconds, the greedy seed's objective, and the model size.
``iteration+B`` (64 x 16 x 16 only) is the iteration objective with the
bottleneck solve's proved bound as ``min_bottleneck_s``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from pipesearch.ilp import solve_mapping  # noqa: E402
from pipesearch.device_orders import count_orders  # noqa: E402
from pipesearch.mapping import problem_from_profile  # noqa: E402
from pipesearch.types import Cluster, DeviceGroup, DeviceSpec, Job, Layer, Link, ModelProfile  # noqa: E402

GB = 1e9
GIB = 2**30
H100 = DeviceSpec("h100-80gb", 80 * GIB, 989.4e12, 67e12, 3350e9, 0.5)
A100 = DeviceSpec("a100-40gb", 40 * GIB, 312e12, 19.5e12, 1555e9, 0.5)
V100 = DeviceSpec("v100-16gb", 16 * GIB, 125e12, 15.7e12, 900e9, 0.5)


def synthetic_profile(num_layers: int, seed: int = 0) -> ModelProfile:
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(num_layers):
        t = float(rng.uniform(8e-3, 14e-3)) * (3.0 if i in (0, num_layers - 1) else 1.0)
        layers.append(Layer(f"l{i:02d}", fwd_s=t / 3, bwd_s=2 * t / 3, param_bytes=0.2 * GB,
                            output_bytes=0.04 * GB, saved_bytes=0.25 * GB))
    return ModelProfile("synthetic", tuple(layers), profiled_batch_size=8, profiled_device="a100-40gb",
                        bytes_per_param=2.0)


def synthetic_cluster(num_devices: int) -> Cluster:
    """``D/4`` H100, ``D/2`` A100, ``D/4`` V100 (at least one of each), 4 per node."""
    q = max(1, num_devices // 4)
    counts = [(H100, q), (A100, num_devices - 2 * q), (V100, q)]
    groups = tuple(DeviceGroup(spec, nodes=max(1, n // 4), devices_per_node=min(n, 4)) for spec, n in counts)
    return Cluster(f"synthetic-{num_devices}", groups, intra_node=Link(100 * GB, 5e-6),
                   inter_node=Link(25 * GB, 10e-6), inter_group=Link(12.5 * GB, 10e-6))


def synthetic(num_layers: int, num_devices: int, pp: int, seed: int = 0):
    """The :class:`MappingProblem` of the module docstring."""
    profile = synthetic_profile(num_layers, seed)
    cluster = synthetic_cluster(num_devices)
    return problem_from_profile(profile, cluster, Job(global_batch_size=8 * 2 * pp), pp=pp, micro_batch_size=8,
                                num_micro_batches=2 * pp, schedule="1f1b", profiled_device=A100)


def run(problem, objective, args, **kw):
    t0 = time.perf_counter()
    r = solve_mapping(problem, objective=objective, max_deterministic_time=args.deterministic_time,
                      num_workers=args.workers,
                      deterministic=not args.nondeterministic, **kw)
    wall = time.perf_counter() - t0
    st = dict(r.stats)
    return r, wall, st


HEADER = ("| L | D | P | objective | status | objective s | bound s | gap | wall s | greedy seed s | vars | "
          "constraints | orders |\n|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(L, D, P, objective, r, wall, st, orders):
    greedy = st["hint_objective_s"]
    greedy = f"{greedy:.5f}" if greedy is not None else "none fits"
    return (f"| {L} | {D} | {P} | {objective} | {r.status} | {r.objective_s:.5f} | {r.best_bound_s:.5f} | "
            f"{r.gap:.2%} | {wall:.1f} | {greedy} | {st['variables']} | {st['constraints']} | {orders:,} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deterministic-time", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--table", action="store_true", help="also the layers x devices scaling table")
    ap.add_argument("--nondeterministic", action="store_true", help="no interleave_search")
    ap.add_argument("--only", nargs="*", help="cases as LxDxP, e.g. 64x4x2")
    args = ap.parse_args(argv)
    import ortools

    print(f"python {platform.python_version()} on {platform.machine()}, ortools {ortools.__version__}, "
          f"{args.workers} workers, deterministic time {args.deterministic_time}, "
          f"{'non' if args.nondeterministic else ''}deterministic\n")
    print(HEADER)
    cases = [(64, 16, 16), (64, 16, 8)]
    if args.table:
        cases += [c for c in ((L, D, D // 2) for L in (16, 32, 64) for D in (4, 8, 16)) if c not in cases]
    if args.only:
        cases = [tuple(int(v) for v in c.split("x")) for c in args.only]
    plans: list[str] = []
    for L, D, P in cases:
        problem = synthetic(L, D, P)
        orders = count_orders(problem, P)
        bound = 0.0
        for objective in ("bottleneck", "iteration", "iteration+B"):
            if objective == "iteration+B" and (L, D, P) != (64, 16, 16):
                continue
            # iteration+B: the iteration objective with B >= the bottleneck solve's proved bound
            r, wall, st = run(problem, objective.split("+")[0], args,
                              min_bottleneck_s=bound if objective == "iteration+B" else 0.0)
            if objective == "bottleneck":
                bound = r.best_bound_s
            print(row(L, D, P, objective, r, wall, st, orders), flush=True)
            if (L, D, P) == (64, 16, 16):
                plans.append(f"{L}x{D}x{P} {objective}: layers per stage {r.layers_per_stage}, "
                             f"devices {r.devices}")
    print()
    for line in plans:
        print(f"* {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
