"""Would a compiled kernel pay for itself? The simulated time's node walk
(pipesearch.timemodel._node_ends_by_node: each action's end is its
duration after the later of its two predecessors) against the same loop
compiled by numba, when numba is installed (skipped, exit 0, when not).

Usage: python benchmarks/bench_compiled_walk.py [--repeat N]

Prints, in one run, numba's import time, the compiled kernel's first call
in a fresh process (the first case compiles it; the later ones, of the
same argument types, load numba's on-disk cache), its steady call, the walk pipesearch runs, and
whether both give the same ends bit for bit, for the dependency graphs of
the planning cases of bench_scale.py (1,500 layers on 64 GPUs: interleaved
1F1B pp 64 v 2 with 512 micro-batches; the 3-type mixed cluster: ZB-H1 pp
16 with 1,024; the default plan: 1F1B pp 4 with 64). The fixed cost of a
process (import and first call) is to be set against the walks a search
runs (``iteration_time_s`` calls in a profile of that search).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import numpy as np  # noqa: E402

from pipesearch import timemodel  # noqa: E402

CASES = [("interleaved-1f1b", 64, 512, 2), ("zb-h1", 16, 1024, 1), ("1f1b", 4, 64, 1)]

KERNEL = textwrap.dedent('''
    from numba import njit

    @njit(cache=True)
    def node_ends(pred1, pred2, dur):
        """The walk of pipesearch.timemodel._node_ends_by_node, compiled."""
        end = dur.copy()
        for k in range(dur.shape[1]):
            for n in range(pred1.shape[0]):
                a = end[pred1[n], k]
                b = end[pred2[n], k]
                end[n, k] += a if a > b else b
        return end
''')

CHILD = textwrap.dedent('''
    import json
    import sys
    import time

    import numpy as np


    def timed(f, *args):
        t = time.perf_counter()
        f(*args)
        return time.perf_counter() - t


    t0 = time.perf_counter()
    import numba  # noqa: F401
    import_s = time.perf_counter() - t0
    sys.path.insert(0, sys.argv[1])
    from compiled_walk import node_ends
    data = np.load(sys.argv[2])
    p1, p2, dur = data["p1"], data["p2"], data["dur"]
    first_s = timed(node_ends, p1, p2, dur)
    steady_s = min(timed(node_ends, p1, p2, dur) for _ in range(int(sys.argv[3])))
    np.save(sys.argv[4], node_ends(p1, p2, dur))
    print(json.dumps({"import_s": import_s, "first_s": first_s, "steady_s": steady_s}))
''')


def durations(schedule: str, pp: int, m: int, vp: int):
    """``(graph, durations, times)``: the levelled graph of one schedule, its
    node durations and the stage times of a seeded random split."""
    g = timemodel._graph(schedule, pp, m, vp)
    S = pp * vp
    rng = np.random.default_rng(0)
    bwd = rng.uniform(2e-3, 4e-3, S)
    times = timemodel.StageTimes(fwd_s=rng.uniform(1e-3, 2e-3, S), bwd_s=bwd, bwd_input_s=bwd / 2,
                                 p2p_s=rng.uniform(0.0, 1e-4, S - 1), allreduce_s=np.zeros(S))
    return g, timemodel._durations(g, times), times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    try:
        import numba
    except ImportError:
        print("numba is not installed: nothing to compare (pip install numba to run this benchmark)")
        return 0
    print(f"# python {platform.python_version()}, numba {numba.__version__}, numpy {np.__version__}, "
          f"{platform.machine()}, best of {args.repeat}")
    print(f"{'schedule':>17} {'pp':>3} {'m':>5} {'vp':>2} {'nodes':>7} {'walk s':>8} {'compiled s':>10} "
          f"{'first call s':>12} {'import s':>8} {'same ends':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "compiled_walk.py").write_text(KERNEL)
        for schedule, pp, m, vp in CASES:
            g, dur, _ = durations(schedule, pp, m, vp)
            walk = float("inf")
            for _ in range(args.repeat):
                t = time.perf_counter()
                ends = timemodel._node_ends_by_node(g, dur)
                walk = min(walk, time.perf_counter() - t)
            np.savez(Path(tmp) / "graph.npz", p1=np.asarray(g.pred1), p2=np.asarray(g.pred2), dur=dur)
            out = subprocess.run([sys.executable, "-c", CHILD, tmp, str(Path(tmp) / "graph.npz"), str(args.repeat),
                                  str(Path(tmp) / "ends.npy")], capture_output=True, text=True, check=True)
            got = json.loads(out.stdout)
            same = np.array_equal(np.load(Path(tmp) / "ends.npy"), ends)
            print(f"{schedule:>17} {pp:>3} {m:>5} {vp:>2} {len(g.pred1):>7} {walk:>8.4f} {got['steady_s']:>10.5f} "
                  f"{got['first_s']:>12.3f} {got['import_s']:>8.3f} {str(same):>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
