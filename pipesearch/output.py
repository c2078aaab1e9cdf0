"""Writing output files safely: all or nothing, with a clear error.

A regular file (or a new path) is written to a temporary file in the same
directory and renamed onto the target, so a failure never leaves a
half-written file and readers never see one. A path that is a symlink or a
special file (``/dev/stdout``, a FIFO) is written through, in place, since
renaming over it would replace the link or the device rather than write to it.
New files get the usual permissions (``0666`` less the umask).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

from .errors import InputError


def _written_through(p: Path) -> bool:
    """Whether ``p`` is written in place (a symlink or a special file such as
    ``/dev/stdout``), not through a temporary file renamed onto it."""
    return p.is_symlink() or (p.exists() and not stat.S_ISREG(p.stat().st_mode))


def check_writable(path: str | os.PathLike[str], what: str = "output") -> Path:
    """Check before any work is done that ``path`` can be written: for a
    regular file (or a new one), that a file can be made in its directory
    (one is made and removed at once).

    Raises:
        InputError: empty path, a directory, a missing or unwritable parent
            directory.
    """
    p = Path(path)
    if str(path) == "":
        raise InputError(f"{what}: empty file name")
    try:
        if p.is_dir():
            raise InputError(f"{what} {p}: is a directory; give a file name")
        parent = p.parent if str(p.parent) else Path(".")
        if parent.exists() and not parent.is_dir():
            raise InputError(f"{what} {p}: {parent} is not a directory")
        if not parent.is_dir():
            raise InputError(f"{what} {p}: directory {parent} does not exist; create it first")
        if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise InputError(f"{what} {p}: not writable")
        if not _written_through(p):
            # written through a temporary file beside it (write_output): one made and removed now
            # (a parent such as /proc or /sys that os.access calls writable refuses it here)
            fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{p.name[:64]}.", suffix=".probe")
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise InputError(f"{what} {short_path(p)}: cannot be written ({exc.strerror or exc})") from None
    return p


def check_directory(path: str | os.PathLike[str], what: str) -> Path:
    """Check before any work is done that files can be written into the
    directory ``path``: an existing writable directory, or one that can be
    made (it is made and removed at once, so a parent that refuses it, such
    as ``/proc``, or a name the file system refuses, is refused now and
    nothing is left behind).

    Raises:
        InputError: naming ``what`` (the option) and the path.
    """
    d = Path(path)
    shown = short_path(d)
    try:
        if d.exists() and not d.is_dir():
            raise InputError(f"{what} {shown}: is not a directory")
        if not d.is_dir() and d.parent.exists() and not d.parent.is_dir():
            raise InputError(f"{what} {shown}: {short_path(d.parent)} is not a directory")
        if not d.is_dir() and not d.parent.is_dir():
            raise InputError(f"{what} {shown}: its parent directory does not exist")
        writable = d if d.is_dir() else d.parent
        if not os.access(writable, os.W_OK | os.X_OK):
            raise InputError(f"{what} {shown}: directory {short_path(writable)} is not writable")
        if not d.exists():
            d.mkdir()
            d.rmdir()
    except OSError as exc:
        raise InputError(f"{what} {shown}: cannot create it ({exc.strerror or exc})") from None
    return d


def short_path(path, limit: int = 80) -> str:
    """``path`` for an error line: its first ``limit`` characters and a count of the rest."""
    text = str(path)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_output(path: str | os.PathLike[str], write: Callable[[Path], None], what: str = "output") -> Path:
    """Call ``write(file_path)`` so that ``path`` ends up holding its output.

    Raises:
        InputError: the path cannot be written (see :func:`check_writable`),
            or the operating system refused the write.
    """
    return write_outputs([(path, write, what)])[0]


def write_outputs(items, directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Several outputs of one command, all or none: ``items`` are ``(path,
    write, what)`` as for :func:`write_output`. Paths written in place
    (:func:`_written_through`) are written first; every other one to a
    temporary file beside it, and only when every write has succeeded are
    they renamed onto their paths, so a failure leaves none of them.
    ``directory``: the folder some of them go into, made first when missing
    and removed again when a failure leaves it empty.

    Raises:
        InputError: a path cannot be written, naming it and its option.
    """
    made = directory is not None and not Path(directory).exists()
    if made:
        try:
            Path(directory).mkdir()
        except OSError as exc:
            raise InputError(f"{short_path(directory)}: cannot create the directory ({exc.strerror or exc})") from None
    try:
        return _write_all(items)
    except BaseException:
        if made and not any(Path(directory).iterdir()):
            Path(directory).rmdir()
        raise


def _write_all(items) -> list[Path]:
    """:func:`write_outputs` once the directories exist."""
    paths = [check_writable(path, what) for path, _, what in items]
    order = sorted(range(len(items)), key=lambda k: not _written_through(paths[k]))  # in place first
    pending: list[tuple[str, Path, str]] = []
    current = (paths[0], items[0][2]) if items else None
    try:
        for k in order:
            p, (_, write, what) = paths[k], items[k]
            current = (p, what)
            if _written_through(p):
                write(p)
                continue
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:64]}.", suffix=p.suffix)
            os.close(fd)
            pending.append((tmp, p, what))
            try:
                write(Path(tmp))
            except InputError as exc:  # a writer's own refusal names the file it was given: name the output
                raise InputError(str(exc).replace(tmp, str(p))) from None
            os.chmod(tmp, stat.S_IMODE(p.stat().st_mode) if p.exists() else _umask_mode())
        for tmp, p, what in pending:
            current = (p, what)
            os.replace(tmp, p)
    except OSError as exc:
        p, what = current
        raise InputError(f"{what} {p}: cannot write ({exc.strerror or exc})") from None
    finally:
        for tmp, _, _ in pending:
            Path(tmp).unlink(missing_ok=True)
    return paths


def write_text(path: str | os.PathLike[str], text: str, what: str = "output") -> Path:
    """:func:`write_output` of a text."""
    return write_output(path, lambda f: f.write_text(text), what)


def check_suffix(path: str | os.PathLike[str] | None, flag: str, suffix: str, what: str) -> None:
    """Refuse an output name that does not end in ``suffix`` (any case):
    ``what`` says what the file holds (a ``.png`` name for a plan file is
    a slip, and the commands that read it back go by the content).

    Raises:
        InputError: naming the flag, the path and the suffix to give.
    """
    if path and Path(path).suffix.lower() != suffix:
        raise InputError(f"{flag} {path}: {what}; give a name ending in {suffix}")


def check_distinct_paths(outputs, inputs) -> None:
    """Refuse an output path that is another output's or an input file's
    (it would be overwritten), before anything is written: ``{flag: path or
    None}`` or ``(flag, path or None)`` pairs each (an input that is not a
    file, e.g. a catalog name, is skipped).

    Raises:
        InputError: naming both flags and paths.
    """
    outputs, inputs = (list(x.items()) if isinstance(x, dict) else list(x) for x in (outputs, inputs))
    seen: dict = {}
    for flag, path, given in [(f, p, False) for f, p in inputs] + [(f, p, True) for f, p in outputs]:
        try:
            if not path or (not given and not Path(path).is_file()):
                continue
            key = Path(path).resolve()
        except OSError:  # a name the file system refuses: no file to be overwritten (reading or writing it says why)
            continue
        if key in seen and given:
            other, other_path, other_given = seen[key]
            raise InputError(f"{flag} {path}: the same file as {other} {other_path}; "
                             f"give {'two paths' if other_given else 'another path'} (it would be overwritten)")
        seen.setdefault(key, (flag, path, given))


def print_whole(text: str) -> None:
    """Write ``text`` to standard output whole: a stream over the raw file
    (``PYTHONUNBUFFERED=1``, ``python -u``) writes what one ``write`` call
    takes and drops the rest, so a reader that goes away in the middle of a
    large plan left exit status 0 and a cut document; the bytes are written
    until none are left, and such a reader raises ``BrokenPipeError`` (exit
    status 141, pipesearch.cli). Text as the stream would encode it."""
    stream = sys.stdout
    binary = getattr(stream, "buffer", None)
    if binary is None:  # a stream of text only (a test's capture)
        stream.write(text)
        stream.flush()
        return
    stream.flush()
    data = memoryview(text.encode(stream.encoding or "utf-8", errors=stream.errors or "strict"))
    while len(data):
        written = binary.write(data)
        data = data[written or 0:]  # None: nothing taken yet (a non-blocking stream)
    binary.flush()
