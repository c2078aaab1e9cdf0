"""Regenerate the figures in docs/figures from real searches.

    python scripts/make_figures.py            # from the repository root
    python scripts/make_figures.py --out DIR  # elsewhere

Writes, from ``pipesearch plan --exhaustive`` runs:

* ``space.png``, ``pareto.png``, ``stages.png``, ``timeline.png``: vgg16 on
  4x4-v100-10gbe, global batch 1024;
* ``gpt3-1.3b_space.png``, ``gpt3-1.3b_pareto.png``, ``gpt3-1.3b_stages.png``,
  ``gpt3-1.3b_timeline.png``: gpt3-1.3b on 2x8-a100-80gb, global batch 512.

stages and timeline show the best-ranked plan with more than one pipeline
stage (searching the top 16 when the default top 5 has none). The output is deterministic: running it twice
gives identical files.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipesearch.cli import main as cli  # noqa: E402
from pipesearch.plots.common import load, render  # noqa: E402

EXAMPLES = (
    # (file prefix, plan arguments)
    ("", ["--model", "vgg16", "--cluster", "4x4-v100-10gbe", "--global-batch-size", "1024"]),
    ("gpt3-1.3b_", ["--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "--global-batch-size", "512"]),
)
#: plans kept for the stages and timeline figures when the default top 5 has
#: no plan with pp > 1 (for gpt3-1.3b the first nine are pure data parallelism)
PIPELINED_TOP = "16"


def _search(args: list[str], path: Path):
    with contextlib.redirect_stdout(io.StringIO()):  # the plans table
        cli(["plan", *args, "--exhaustive", "--quiet", "-o", str(path)], standalone_mode=False)
    return load(path)


def make(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for prefix, args in EXAMPLES:
            name = prefix or "vgg16_"
            ranked = _search(args, Path(tmp) / f"{name}plans.json")
            for kind in ("space", "pareto"):
                written.append(render(kind, ranked, out / f"{prefix}{kind}.png"))
            deep = ranked
            if not any(p.pp > 1 for p in ranked.plans):
                deep = _search(args + ["--top", PIPELINED_TOP], Path(tmp) / f"{name}plans_top.json")
            rank = next((p.rank for p in deep.plans if p.pp > 1), 1)
            for kind in ("stages", "timeline"):
                written.append(render(kind, deep, out / f"{prefix}{kind}.png", rank=rank))
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures", help="output directory")
    for path in make(parser.parse_args().out):
        print(f"wrote {path}")
