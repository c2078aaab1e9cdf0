"""Reading input files safely: regular files only, checked before any read.

Opening a FIFO blocks until a writer appears and reading a character device
such as ``/dev/zero`` never ends, so every input (profile, cluster, device,
transformer config, plan file) is first checked with ``stat``: a path that
exists but is not a regular file is named as what it is, and nothing is
opened.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InputError

#: input files larger than this are refused before they are read (a profile of
#: 100,000 layers is about 10 MiB; a plan file with its points table a few MiB)
MAX_INPUT_BYTES = 256 * 2**20


def file_kind(mode: int) -> str:
    """What a ``stat`` mode is, in words: ``"a directory"``, ``"a FIFO (named
    pipe)"``, ``"a character device"``, ... or ``"a regular file"``."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def non_regular_kind(path: str | os.PathLike[str]) -> str | None:
    """``None`` when ``path`` is a regular file (after symlinks) or does not
    exist; else what it is (:func:`file_kind`)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)


def check_input_file(path: str | os.PathLike[str], what: str) -> Path:
    """Check that ``path`` is a readable regular file of sensible size.

    Args:
        path: the file.
        what: what the file is for, e.g. ``"plan file"``, ``"cluster file"``.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        InputError: missing, not a regular file (directory, FIFO, device,
            socket), or larger than :data:`MAX_INPUT_BYTES`.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise InputError(f"{p}: cannot read {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{p}: is {file_kind(st.st_mode)}, not a {what}; give the path of a regular file")
    if st.st_size > MAX_INPUT_BYTES:
        raise InputError(f"{p}: {st.st_size} bytes is larger than the {MAX_INPUT_BYTES // 2**20} MiB "
                         f"accepted for a {what}; is it the right file?")
    return p


def read_input_text(path: str | os.PathLike[str], what: str, encoding: str = "utf-8-sig") -> str:
    """The text of an input file, after :func:`check_input_file` (UTF-8; a
    leading byte-order mark, which some editors write, is not data).

    Raises:
        InputError: see :func:`check_input_file`; unreadable; not text in
            ``encoding``.
    """
    p = check_input_file(path, what)
    try:
        return p.read_text(encoding=encoding)
    except OSError as exc:
        raise InputError(f"{p}: cannot read {what} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        with p.open("rb") as f:
            head = f.read(2)
        if head in (b"\xff\xfe", b"\xfe\xff"):  # a UTF-16 byte-order mark: Windows PowerShell 5's `>` writes it
            written = ", or have pipesearch write it (-o FILE) rather than `>`" if what == "plan file" else ""
            raise InputError(f"{p}: not a {what} (UTF-16 text, as Windows PowerShell's `>` writes); save it as "
                             f"UTF-8{written}") from None
        raise InputError(not_utf8(p, what, p.read_bytes())) from None


def not_utf8(path, what: str, data: bytes) -> str:
    """The refusal of input bytes ``data`` that are not UTF-8: the line and
    the first byte that is not, and the fix."""
    try:
        data.decode("utf-8")
        at = 0
    except UnicodeDecodeError as exc:  # (a byte-order mark is UTF-8: the offset counts from the file's start)
        at = exc.start
    line = data[:at].count(b"\n") + 1
    return (f"{path}: not a {what} (not UTF-8 text: line {line} holds byte 0x{data[at]:02x}, as a Latin-1 or "
            f"Windows-1252 editor writes); save it as UTF-8")


def read_input_bytes(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of an input file, after :func:`check_input_file`.

    Raises:
        InputError: see :func:`check_input_file`; unreadable.
    """
    p = check_input_file(path, what)
    try:
        return p.read_bytes()
    except OSError as exc:
        raise InputError(f"{p}: cannot read {what} ({exc.strerror or exc})") from None


def parse_failure(exc: BaseException) -> str:
    """Why a JSON or TOML parser gave up other than on syntax, in words: an
    integer too long to convert (Python refuses over 4300 digits) or
    nesting deeper than the interpreter's recursion limit."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = " ".join(str(exc).split())
    if "integer string conversion" in text:
        return "an integer with more than 4300 digits"
    return text or type(exc).__name__


def unique_keys(source, error: type[InputError] = InputError):
    """A ``json.loads`` ``object_pairs_hook`` that refuses a key given twice
    in one object (json keeps the last one silently), raising ``error`` that
    names ``source``, the key and the fix."""
    def hook(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise error(f"{source}: key '{key}' appears twice in one object; keep one")
            seen[key] = value
        return seen
    return hook
