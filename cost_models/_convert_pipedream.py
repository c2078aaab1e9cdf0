"""Convert PipeDream ``graph.txt`` profiles into catalog profile CSVs.

Usage::

    python cost_models/_convert_pipedream.py SOURCE_DIR [--out DIR] [--device NAME]

``SOURCE_DIR`` holds ``<model>.graph.txt`` files as published in
github.com/msr-fiddle/pipedream (``profiler/*/profiles/<model>/graph.txt``,
renamed). Every file becomes ``<out>/<model>.csv`` (default: this script's
directory, i.e. ``cost_models/``) via :func:`pipesearch.profiles.read_graph_txt`
(batch size inferred from the tensor sizes, branchy graphs cut into a chain of
single-tensor blocks) and :func:`pipesearch.profiles.write_profile_csv`.
Prints one line per model: nodes, blocks, batch size.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipesearch.catalog import entry_name  # noqa: E402
from pipesearch.profiles import read_graph_txt, write_profile_csv  # noqa: E402
from pipesearch.profiles.pipedream import parse_graph_txt  # noqa: E402

TRANSLATION_MODELS = ("gnmt", "gnmt_large")
DEVICE_NOTE = (
    "device not stated by PipeDream; fp32 (4-byte) sizes, CUDA 10 / PyTorch 19.05 era; the "
    "throughput fits one NVIDIA V100 16 GB (the GPU of the paper's clusters A and B), see "
    "cost_models/README.md"
)


def provenance(model: str) -> list[str]:
    """Source lines naming the original file of ``model``."""
    task = "translation" if model in TRANSLATION_MODELS else "image_classification"
    return [
        "PipeDream (Narayanan et al., SOSP'19) profiler output as published in "
        f"github.com/msr-fiddle/pipedream profiler/{task}/profiles/{model}/graph.txt",
        "times: milliseconds per batch measured by PipeDream; the Input node's forward time is "
        "PipeDream's data-loading time",
        DEVICE_NOTE,
    ]


def convert(source_dir: Path, out_dir: Path, device: str = "unknown") -> list[tuple[str, int, int, int]]:
    """Convert every ``*.graph.txt`` of ``source_dir``; returns (model, nodes, blocks, batch)."""
    rows = []
    files = sorted(source_dir.glob("*.graph.txt"))
    if not files:
        raise SystemExit(f"no *.graph.txt files in {source_dir}")
    for path in files:
        model = entry_name(path)
        profile = read_graph_txt(path, device=device)
        source = "\n".join(provenance(model) + [profile.source])
        profile = replace(profile, source=source)
        write_profile_csv(profile, out_dir / f"{model}.csv")
        rows.append((model, parse_graph_txt(path).number_of_nodes(), profile.num_layers,
                     profile.profiled_batch_size))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source_dir", type=Path, help="directory of <model>.graph.txt files")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="output directory (default: cost_models/)")
    parser.add_argument("--device", default="unknown",
                        help="device name to record in the CSV headers (default: unknown)")
    args = parser.parse_args(argv)
    for model, nodes, blocks, batch in convert(args.source_dir, args.out, args.device):
        print(f"{model:16s} {nodes:5d} nodes -> {blocks:4d} blocks, batch {batch}")


if __name__ == "__main__":
    main()
