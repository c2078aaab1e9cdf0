"""Find catalog entries (model profiles, model configs, devices, clusters) by
name or by path.

The catalogs are plain data directories: ``cost_models/`` (models) and
``hardware/devices``, ``hardware/clusters`` (hardware). In an installed wheel
they live under ``pipesearch/_catalog/``; in a source checkout they are the
top-level directories of the repository.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from .errors import CatalogError, InputError
from .input_files import non_regular_kind
from .output import short_path

_PACKAGE_DIR = Path(__file__).resolve().parent

#: kind -> (directory relative to the catalog root, accepted suffixes)
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "model": ("cost_models", (".csv", ".toml", ".graph.txt", ".json")),
    "device": ("hardware/devices", (".toml",)),
    "cluster": ("hardware/clusters", (".toml",)),
}


def catalog_root() -> Path:
    """The directory holding ``cost_models/`` and ``hardware/``."""
    installed = _PACKAGE_DIR / "_catalog"
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent


def catalog_dir(kind: str) -> Path:
    """Directory of one catalog kind (``model``, ``device`` or ``cluster``)."""
    return catalog_root() / KINDS[kind][0]


def entry_name(path: Path) -> str:
    """Catalog name of a file: its name without the catalog suffix."""
    name = path.name
    for suffix in sorted((s for _, (_, ss) in KINDS.items() for s in ss), key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def list_entries(kind: str) -> dict[str, Path]:
    """All entries of a kind, name -> path, sorted by name."""
    directory = catalog_dir(kind)
    suffixes = KINDS[kind][1]
    found = {}
    if directory.is_dir():
        for p in sorted(directory.iterdir()):
            if p.is_file() and p.name.endswith(suffixes) and not p.name.startswith("_"):
                found.setdefault(entry_name(p), p)
    return dict(sorted(found.items()))


def shadowing_note(kind: str, name_or_path: str, copies: bool = False) -> str | None:
    """What to say when a bare name (no folder in it) that :func:`resolve`
    read as a file here is also a catalog entry with other contents
    (``copies``: or the same): the user may have meant the catalog's
    (``read the file ... not the catalog's ...``; the caller names the
    option). None otherwise (a path with a folder, ``./vgg16``, says which;
    an exact copy plans the same)."""
    text = str(name_or_path)
    entry = list_entries(kind).get(text.strip().lower())
    if entry is None or any(c in text for c in "/\\"):
        return None
    here = Path(text)
    try:
        if not here.is_file() or here.resolve() == entry.resolve() or (
                not copies and here.read_bytes() == entry.read_bytes()):
            return None
    except OSError:
        return None
    return (f"read the file {text} in this folder, not the catalog's {kind} {entry_name(entry)} "
            f"(write ./{text} for the file, or move it away for the catalog's)")


def resolve(kind: str, name_or_path: str) -> Path:
    """Path of a catalog entry given its name, or the given path if it is a file.

    A bare catalog name that is also a directory here (an output folder
    named after the model) is the catalog's entry; a model folder holding
    a ``config.json`` is refused, pointing at that file.

    Raises:
        InputError: the path exists but is not a regular file (a directory,
            a FIFO, a device such as ``/dev/null``).
        CatalogError: neither an existing file nor a catalog name; the message
            suggests close catalog names.
    """
    p = Path(name_or_path).expanduser()
    label = f"--{kind}" if kind in ("model", "cluster") else kind
    try:
        if p.is_file():
            return p
        what = non_regular_kind(p) if str(name_or_path) else None
    except OSError as exc:  # e.g. a name longer than the file system allows: neither a file nor a catalog name
        raise InputError(f"{label} {short_path(name_or_path)}: cannot be read ({exc.strerror or exc})") from None
    if what is not None:
        inside = p / "config.json"  # a model's folder, as the engines and transformers take it
        if kind == "model" and what == "a directory" and inside.is_file():
            raise InputError(f"{label} {name_or_path}: is a directory; give the model config in it: {label} {inside}")
        named = list_entries(kind).get(str(name_or_path).strip().lower())
        if what == "a directory" and named is not None and not any(c in str(name_or_path) for c in "/\\"):
            return named  # a folder named after a catalog entry (an output folder) is no model or cluster file
        raise InputError(f"{label} {name_or_path}: is {what}, not a {kind} file; give the path of a "
                         f"regular file or a catalog name (`{_listing(kind)}`)")
    if p.is_symlink():  # a link that leads nowhere (dangling, or a loop of links): not a missing name
        try:
            p.stat()
        except OSError as exc:
            raise InputError(f"{label} {name_or_path}: a symbolic link that leads to no file "
                             f"({exc.strerror or exc}); fix the link or give the file's own path") from None
    entries = list_entries(kind)
    key = name_or_path.strip().lower()
    if key in entries:
        return entries[key]
    close = difflib.get_close_matches(key, list(entries), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(entries)}"
    looks_like_path = any(c in name_or_path for c in "/\\") or "." in Path(name_or_path).name
    what = "no such file and no" if looks_like_path else "unknown"
    raise CatalogError(
        f"{what} {kind} {name_or_path!r} in the catalog ({hint}); "
        f"`{_listing(kind)}` lists the entries, or pass a file path"
    )


def _listing(kind: str) -> str:
    """The command that lists the catalog's entries of ``kind``."""
    return "pipesearch catalog models" if kind == "model" else "pipesearch catalog hardware"
