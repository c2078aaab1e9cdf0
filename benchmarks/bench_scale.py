"""pipesearch at scale: start-up, whole searches on large clusters and long
profiles, the exact split on long chains; each case against its target.

Usage: python benchmarks/bench_scale.py [--quick] [--timeout S]

Every case runs in its own child process; the table gives its wall time, its
CPU seconds (user + system, from the child's rusage: stable under load, unlike
wall time) and its peak resident memory (``ru_maxrss``); cases under a
second are run three times and the fastest kept. Children run with a
8 GiB address-space limit, so a case that would exhaust the machine fails
instead. ``--quick`` skips the slowest rows (16,384 GPUs, the
100,000-layer profile, the split of 10,000 layers into 128 stages). After
the table, the growth exponents of CPU time: ``k`` in ``t ~ n^k`` fitted
log-log (least squares) over a few sizes, in layers (a whole ``plan`` of a
synthetic profile, and the closed-form split) and in devices (GPT-3 175B as
the node count grows). For the split rows, ``split CPU s`` is the CPU time
of the split call alone (the child's rusage adds the interpreter start and
the imports), and the target is checked against it; for the others, against
the wall time.

Synthetic profiles are seeded (same files on every run): layers with
forward 0.05 to 0.15 ms, backward twice that, 1 to 4 MB of weights and
0.5 to 2 MB of output, at batch size 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
MEMORY_LIMIT_BYTES = 8 * 2**30


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    status: str  # "ok", "exit N: first line of stderr", "timeout"
    timed_s: float | None = None  # CPU seconds of the timed call itself, when the child reports it


def run_child(args: list[str], timeout_s: float, cwd: Path = ROOT) -> Run:
    """Run ``args`` (a command line) in a child in ``cwd``; its wall, CPU and peak RSS."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))

    start = time.perf_counter()
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=err, preexec_fn=limit,
                                env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                    filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))))
        deadline = start + timeout_s
        while True:
            pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                _, code, usage = os.wait4(proc.pid, 0)
                proc.returncode = -9
                wall = time.perf_counter() - start
                return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, "timeout")
            time.sleep(0.005)
        proc.returncode = os.waitstatus_to_exitcode(code)
        wall = time.perf_counter() - start
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
        out.seek(0)
        timed = [float(x.split("=", 1)[1]) for x in out.read().decode(errors="replace").split()
                 if x.startswith("timed_cpu_s=")]
    status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {(lines or [''])[-1][:110]}"
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, status, timed[0] if timed else None)


def plan_args(*extra: str) -> list[str]:
    return [PY, "-m", "pipesearch", "plan", "-q", *extra]


def write_profile(path: Path, num_layers: int, seed: int = 0, tiny: bool = False) -> Path:
    """A synthetic profile CSV (see the module docstring); ``tiny``: layers
    1000 times smaller in time and bytes (a model of that many layers that
    fits four 16 GB devices)."""
    rng = np.random.default_rng(seed)
    scale = 1e-3 if tiny else 1.0
    fwd = rng.uniform(0.05, 0.15, num_layers) * scale
    params = (rng.integers(1_000_000, 4_000_000, num_layers) * scale).astype(np.int64)
    out = (rng.integers(500_000, 2_000_000, num_layers) * scale * 8).astype(np.int64)  # above 4 KB: bytes, not MB
    rows = "".join(f"l{k},{fwd[k]:.6f},{2 * fwd[k]:.6f},{params[k]},{out[k]}\n" for k in range(num_layers))
    path.write_text("# batch_size: 1\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n" + rows)
    return path


SPLIT_CODE = """
import sys
sys.path.insert(0, "benchmarks")
from bench_split import instance
from pipesearch.{module} import {func}
import time
costs = instance({layers}, {stages})
start = time.process_time()
{call}
print(f"timed_cpu_s={{time.process_time() - start:.4f}}")
"""


def split_args(layers: int, stages: int, simulated: bool) -> list[str]:
    """The closed-form split (partition.optimal_split) or the exact split for
    the simulated time (split_search.exact_split, 1F1B) of bench_split's
    seeded instance, in a child."""
    if simulated:
        code = SPLIT_CODE.format(module="split_search", func="exact_split", layers=layers, stages=stages,
                                 call=f"assert exact_split(costs, '1f1b', {stages}, 1) is not None")
    else:
        code = SPLIT_CODE.format(module="partition", func="optimal_split", layers=layers, stages=stages,
                                 call="assert optimal_split(costs) is not None")
    return [PY, "-c", code]


def cases(tmp: Path, quick: bool):
    """``(name, before, target_s or None, args, slow)``: ``before`` is the
    figure measured before this work (2 cores; see benchmarks/README.md)."""
    gpt = ["--model", "gpt3-175b", "--cluster", "2x8-a100-80gb", "-b", "1536"]
    yield ("`pipesearch --help`", "0.45 s", 0.15, [PY, "-m", "pipesearch", "--help"], False)
    yield ("`pipesearch plan` (default)", "1.07 s", 0.4, plan_args(), False)
    yield ("GPT-3 175B, 2x8-a100-80gb --nodes 128, -b 1536", "3.4-3.6 CPU s", 1.0,
           plan_args(*gpt, "--nodes", "128"), False)
    yield ("same at --nodes 2048 (16,384 GPUs)", "8.5-8.9 CPU s", 3.0, plan_args(*gpt, "--nodes", "2048"), True)
    yield ("closed-form split 1,000 layers x 64 stages", "0.114 s", 0.2, split_args(1000, 64, False), False)
    yield ("closed-form split 10,000 layers x 128 stages", "17.5 s", 1.0, split_args(10_000, 128, False), True)
    yield ("simulated-time split 1,000 layers x 64 stages", "-", 0.2, split_args(1000, 64, True), False)
    yield ("simulated-time split 10,000 layers x 128 stages", "-", 1.0, split_args(10_000, 128, True), True)
    csv1500 = write_profile(tmp / "l1500.csv", 1500)
    yield ("1,500-layer profile CSV on 64 A100, -b 512", "41.7 s, 333 MiB", 2.0,
           plan_args("--model", str(csv1500), "--cluster", "2x8-a100-80gb", "--nodes", "8", "-b", "512"), True)
    if not quick:
        csv100k = write_profile(tmp / "l100000.csv", 100_000, tiny=True)
        yield ("100,000-layer profile on 1x4-v100-pcie", "exit 1 after 2.8 s (74.5 GiB array)", 30.0,
               plan_args("--model", str(csv100k), "--cluster", "1x4-v100-pcie"), True)


def fit_exponent(sizes, times) -> float:
    """``k`` of the least-squares line ``log t = k log n + c``."""
    return float(np.polyfit(np.log(sizes), np.log(np.maximum(times, 1e-6)), 1)[0])


def growth(tmp: Path, timeout_s: float, quick: bool) -> list[str]:
    lines = []
    layers = [250, 500, 1000]
    runs = [run_child(plan_args("--model", str(write_profile(tmp / f"g{n}.csv", n)), "--cluster", "1x4-v100-pcie",
                                "-b", "64"), timeout_s) for n in layers]
    lines.append(_growth_line("`plan` of a synthetic profile on 1x4-v100-pcie, -b 64, in layers", layers, runs))
    layers = [1000, 2000, 4000]
    runs = [run_child(split_args(n, 16, False), timeout_s) for n in layers]
    runs = [Run(r.wall_s, r.timed_s if r.timed_s is not None else r.cpu_s, r.peak_rss_mib, r.status) for r in runs]
    lines.append(_growth_line("closed-form split into 16 stages (the call), in layers", layers, runs))
    nodes = [8, 16, 32] if quick else [16, 32, 64, 128]
    runs = [run_child(plan_args("--model", "gpt3-175b", "--cluster", "2x8-a100-80gb", "-b", "1536", "--nodes",
                                str(n)), timeout_s) for n in nodes]
    lines.append(_growth_line("GPT-3 175B `plan`, -b 1536, in devices", [8 * n for n in nodes], runs))
    return lines


def _growth_line(what: str, sizes, runs) -> str:
    cpu = ", ".join(f"{n}: {r.cpu_s:.2f} s" + ("" if r.status == "ok" else f" ({r.status[:40]})")
                    for n, r in zip(sizes, runs))
    ok = [(n, r.cpu_s) for n, r in zip(sizes, runs) if r.status == "ok"]
    k = f"{fit_exponent(*zip(*ok)):.2f}" if len(ok) >= 2 else "n/a"
    return f"| {what} | {cpu} | {k} |"


def machine() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the slowest rows")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    args = parser.parse_args()
    # bytecode written beforehand, as `pip install` does: no child compiles the package
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "pipesearch")], check=True, capture_output=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    print(f"{time.strftime('%Y-%m-%d')}, {machine()}\n")
    print("| case | before | target | wall s | CPU s | split CPU s | peak RSS MiB | status | target met |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, before, target, cmd, slow in cases(Path(tmp), args.quick):
            if slow and args.quick:
                print(f"| {name} | {before} | < {target:g} s | - | - | - | - | skipped (--quick) | - |", flush=True)
                continue
            r = run_child(cmd, args.timeout)
            if r.status == "ok" and r.wall_s < 1.0:  # start-up rows: best of 3 (wall time moves with load)
                r = min([r] + [run_child(cmd, args.timeout) for _ in range(2)], key=lambda x: x.wall_s)
            measured = r.wall_s if r.timed_s is None else r.timed_s  # a split: the call, not the interpreter
            met = "yes" if r.status == "ok" and measured < target else "no"
            timed = "-" if r.timed_s is None else f"{r.timed_s:.3f}"
            print(f"| {name} | {before} | < {target:g} s | {r.wall_s:.2f} | {r.cpu_s:.2f} | {timed} | "
                  f"{r.peak_rss_mib:.0f} | {r.status} | {met} |", flush=True)
        print("\n| growth of CPU time | CPU s by size | exponent k (t ~ n^k) |\n|---|---|---:|")
        for line in growth(Path(tmp), args.timeout, args.quick):
            print(line, flush=True)


if __name__ == "__main__":
    main()
