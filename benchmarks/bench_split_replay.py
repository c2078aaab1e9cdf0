"""Replay the exact split searches of one ``pipesearch plan`` run on any tree.

Usage:
    python benchmarks/bench_split_replay.py capture OUT.pkl [PLAN ARGS ...]
    python benchmarks/bench_split_replay.py replay IN.pkl [--tree DIR] [--schedule S ...] [--repeat N]

``capture`` runs ``pipesearch plan -q PLAN ARGS`` in this process and pickles
every call of ``split_search.exact_split`` the search makes (the point's
``PipelineCosts``, schedule, pp, vp, keyword arguments) with its result; the
starting-split calls of the seed cutoff (``seeds_only``) are left out.

``replay`` loads them with ``DIR`` (default: this checkout) first on the
path, runs every call once to warm the caches (schedule graphs), then
``N`` times more (default 1), printing the CPU seconds of each round, and
stops with exit status 1 at the first result that differs from the
captured one (two proofs that no split beats the call's cutoff count as
the same, whichever splits they met on the way, and a proof where the
captured search stopped at its work limits above the cutoff is counted and
reported, a stronger answer, and so are searches that stopped above the
cutoff in both with other lower bounds; the counts of splits evaluated and of branch
and bound nodes are work, not the answer, and are not compared). The calls are pure
functions of their arguments, so a change that keeps every answer replays
identically, and the CPU seconds compare the split searches alone, without
the rest of the search.

On a shared machine CPU seconds move by a third from run to run; the
instruction count does not. Under callgrind (``valgrind --tool=callgrind
$(python -c 'import sys; print(sys.executable)')
benchmarks/bench_split_replay.py replay IN.pkl``; the interpreter itself,
not a shim script) one round of the default plan's 462 calls takes about
three minutes and prints ``Collected : <instructions>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def capture(out: Path, plan_args: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from pipesearch import option_search, search, split_search
    from pipesearch.cli import main

    original = split_search.exact_split
    calls = []

    def recording(costs, schedule, pp, vp=1, **kwargs):
        found = original(costs, schedule, pp, vp, **kwargs)
        if not kwargs.get("seeds_only"):
            calls.append((costs, schedule, pp, vp, kwargs, found))
        return found

    for module in (split_search, option_search, search):
        module.exact_split = recording
    try:
        main(["plan", "-q", *plan_args], standalone_mode=False)
    finally:
        for module in (split_search, option_search, search):
            module.exact_split = original
    out.write_bytes(pickle.dumps(calls))
    print(f"{len(calls)} exact_split calls written to {out}")
    return 0


def _above(found, kwargs, exact: bool = True) -> bool:
    """Whether ``found`` proves that no split beats the call's cutoff (two
    such answers are the same to the search whatever split, if any, they
    met on the way); with ``exact=False``, whether it stopped at its work
    limits without a split that beats it (what such a proof strengthens)."""
    cutoff = kwargs.get("cutoff_s", float("inf"))
    return (found is not None and found.exact == exact and found.best_time_s >= cutoff
            and not kwargs.get("value_above_cutoff") and cutoff < float("inf"))


def _answer(found):
    """``found`` without its counts of splits evaluated and of branch and
    bound nodes (work, not the answer: a change may evaluate fewer splits
    for the same result)."""
    return found if found is None else dataclasses.replace(found, splits_evaluated=0, nodes=0)


def replay(path: Path, tree: Path, schedules: list[str], repeat: int) -> int:
    sys.path.insert(0, str(tree))
    from pipesearch import split_search

    calls = [c for c in pickle.loads(path.read_bytes()) if not schedules or c[1] in schedules]
    proven: set[int] = set()
    stopped: set[int] = set()
    for rnd in range(repeat + 1):
        start = time.process_time()
        for k, (costs, schedule, pp, vp, kwargs, want) in enumerate(calls):
            got = split_search.exact_split(costs, schedule, pp, vp, **kwargs)
            if _answer(got) == _answer(want) or (_above(got, kwargs) and _above(want, kwargs)):
                continue
            if _above(got, kwargs) and _above(want, kwargs, exact=False):
                proven.add(k)  # a stronger answer: proven where the captured search stopped
                continue
            if _above(got, kwargs, exact=False) and _above(want, kwargs, exact=False):
                stopped.add(k)  # both stopped above the cutoff (their bounds may differ)
                continue
            print(f"call {k} ({schedule}, pp {pp}, vp {vp}): {got} != captured {want}")
            return 1
        label = "warm-up" if rnd == 0 else f"round {rnd}"
        also = f"; {len(proven)} proven above the cutoff where the captured search stopped" if proven else ""
        also += f"; {len(stopped)} stopped above the cutoff in both, bounds apart" if stopped else ""
        print(f"{label}: {len(calls)} calls, {time.process_time() - start:.3f} CPU s, every result as captured{also}")
    return 0


def cli(argv: list[str]) -> int:
    if argv[:1] == ["capture"] and len(argv) >= 2:
        return capture(Path(argv[1]), argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["replay"])
    parser.add_argument("calls", type=Path)
    parser.add_argument("--tree", type=Path, default=REPO)
    parser.add_argument("--schedule", action="append", default=[])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    return replay(args.calls, args.tree.resolve(), args.schedule, args.repeat)


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
