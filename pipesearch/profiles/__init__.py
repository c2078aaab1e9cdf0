"""Model profile readers: load a model as a chain of layers (:class:`ModelProfile`).

``load_model(name_or_path)`` resolves a catalog name (``cost_models/``) or a
file path and dispatches on the file name:

* ``*.csv``: profile CSV (:mod:`pipesearch.profiles.csv_profile`, format in
  docs/formats.md "Profile CSV");
* ``*graph.txt``: PipeDream profiler output (:mod:`pipesearch.profiles.pipedream`),
  batch size inferred from the tensor sizes.

``.toml`` / ``.json`` transformer configs are reserved for
``pipesearch/profiles/transformer.py``; a reader plugs in with one entry in
:data:`READERS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..catalog import resolve, shadowing_note
from ..errors import InputError
from ..types import ModelProfile
from .csv_profile import read_profile_csv, write_profile_csv


def read_graph_txt(path: Path, **options) -> ModelProfile:
    """:func:`pipesearch.profiles.pipedream.read_graph_txt` (same arguments),
    imported on first use (it needs networkx, which no other input format
    loads)."""
    from .pipedream import read_graph_txt as read

    return read(path, **options)


#: file-name ending -> (reader, description); the longest matching ending wins.
READERS: dict[str, tuple[Callable[[Path], ModelProfile], str]] = {
    ".csv": (read_profile_csv, "profile CSV"),
    "graph.txt": (read_graph_txt, "PipeDream profile"),
}


def load_model(name_or_path: str) -> ModelProfile:
    """The model profile named ``name_or_path`` (catalog name or file path).

    Raises:
        CatalogError: neither a file nor a catalog name.
        InputError: an unsupported file type, or a malformed file (see the readers).
    """
    path = resolve("model", name_or_path)
    for ending in sorted(READERS, key=len, reverse=True):
        if path.name.lower().endswith(ending):
            return READERS[ending][0](path)
    supported = ", ".join(f"*{ending} ({what})" for ending, (_, what) in READERS.items())
    shadowed = shadowing_note("model", name_or_path, copies=True)  # a file here named like a catalog model
    raise InputError(f"{path}: unsupported model file type; supported formats: {supported}; `plan` also reads "
                     "a transformer TOML (*.toml) or a HuggingFace config (*.json)"
                     + (f"; {shadowed}" if shadowed else ""))


__all__ = ["READERS", "load_model", "read_graph_txt", "read_profile_csv", "write_profile_csv"]
