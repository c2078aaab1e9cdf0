"""How hard the exact split works inside a whole search, per schedule.

Usage: python benchmarks/bench_split_gaps.py [--case NAME ...]

Runs each case's ``pipesearch plan`` in this interpreter (the ``pipesearch``
on ``sys.path``: this checkout, or another revision's tree first on
``PYTHONPATH``) and records every call of the exact split the search makes:
per schedule the calls, the branch-and-bound nodes, the CPU seconds spent in
the exact split, how many calls stopped at a work limit (not proven) and the
largest gap those reported. The cases are those of
``bench_compare_revisions.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

from bench_compare_revisions import CASES


def measure(args: list[str]) -> dict[str, list]:
    """``{schedule: [calls, nodes, cpu_s, not_proven, worst_gap]}`` of one plan command."""
    import pipesearch.search as search_mod
    from pipesearch.cli import main

    inner = search_mod.exact_split
    stats: dict[str, list] = {}

    def counted(costs, schedule, pp, vp=1, **kw):
        t0 = time.process_time()
        found = inner(costs, schedule, pp, vp, **kw)
        if not kw.get("seeds_only"):
            row = stats.setdefault(schedule, [0, 0, 0.0, 0, 0.0])
            row[0] += 1
            row[2] += time.process_time() - t0
            if found is not None:
                row[1] += found.nodes
                if not found.exact:
                    row[3] += 1
                    row[4] = max(row[4], found.gap)
        return found

    search_mod.exact_split = counted
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main.main(args=args, standalone_mode=False)
    finally:
        search_mod.exact_split = inner
    return stats


def main_() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", nargs="+", default=[c for c in CASES if c != "gpt3-175b-512gpu"], choices=list(CASES))
    args = ap.parse_args()
    print("| case | schedule | exact-split calls | nodes | CPU s in them | not proven | largest gap |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.case:
        for schedule, (calls, nodes, cpu, open_, gap) in sorted(measure(CASES[name]).items()):
            print(f"| {name} | {schedule} | {calls} | {nodes} | {cpu:.2f} | {open_} | {100 * gap:.1f}% |")


if __name__ == "__main__":
    main_()
