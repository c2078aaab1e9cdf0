"""Read and write model profiles as CSV (``pipesearch profile v1``).

Format::

    # pipesearch profile v1
    # model: vgg16
    # batch_size: 128
    # device: v100-16gb
    # bytes_per_param: 4
    # source: PipeDream profiler output, github.com/msr-fiddle/pipedream
    # source: a second provenance line
    name,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes,bwd_input_ms
    conv1,22.307,24.613,7168,1644167168,1644167168,
    ...

* Lines starting with ``#`` are comments. A comment of the form
  ``# key: value`` is a header field; the keys are ``model`` (default: the
  file name without ``.csv``), ``batch_size`` (required, integer > 0: the
  samples per batch the times and byte counts were measured at), ``device``
  (catalog device name or free text, default ``unknown``), ``bytes_per_param``
  (number > 0, default 4), ``tied_param_bytes`` (number >= 0, default 0:
  bytes of parameters the last layer shares with the first, a tied
  embedding and LM head, counted once in the first layer's
  ``param_bytes``; a stage holding the last layer but not the first keeps a
  copy) and ``source`` (free-text provenance; may repeat, the lines are
  joined with newlines). Other comment lines are ignored.
* The table has one row per layer, in execution order. Columns: ``name``
  (unique), ``fwd_ms``, ``bwd_ms`` (forward / full backward time,
  milliseconds), ``param_bytes``, ``output_bytes`` (bytes of the layer's
  output, what a stage boundary after it sends), optional ``saved_bytes``
  (bytes kept for backward; default ``output_bytes``) and optional
  ``bwd_input_ms`` (the input-gradient part of ``bwd_ms``, for zero-bubble
  schedules; an empty cell means unknown) and optional
  ``recompute_saved_bytes`` (bytes the layer keeps when it is recomputed in
  backward, usually its input, the checkpoint; an empty cell: the layer is
  never recomputed) and optional ``shared_saved_bytes`` (bytes of what the
  layer saves that the layer before it saves too, the tensor between them:
  a ReLU keeps its output and the Linear after it keeps it as its input; a
  stage holding both counts it once, :attr:`pipesearch.types.Layer.shared_saved_bytes`;
  at most the layer's and the previous layer's ``saved_bytes``, empty or 0
  on the first layer, not with ``recompute_saved_bytes``; empty cell: 0).
  Byte counts are at ``batch_size``. A recomputed layer
  costs one extra forward in its backward (Chen et al. 2016, "Training Deep
  Nets with Sublinear Memory Cost", sec. 3; Korthikanti et al. 2022 sec. 4:
  full recompute re-runs the forward), so the search may recompute the
  layers of any stage (``docs/offload.md``).
* Optional ``fwd_fixed_ms``, ``bwd_fixed_ms`` (together) and
  ``bwd_input_fixed_ms`` (with ``bwd_input_ms``): the parts of ``fwd_ms``,
  ``bwd_ms``, ``bwd_input_ms`` that do not grow with the batch size, from a fit
  ``t(b) = fixed + per_sample * b`` over two or more batch sizes
  (``pipesearch profile --batch-sizes``); the time at batch size ``b`` is then
  ``fixed + (t - fixed) * b / batch_size``
  (:meth:`~pipesearch.types.ModelProfile.layer_times_at`), without them
  ``t * b / batch_size``. When present, given on every row (where the time
  they split is given), each at most its time.
* Every number must be finite and >= 0; ``bwd_input_ms <= bwd_ms``.

On load times become seconds (``Layer.fwd_s`` ...). Millisecond values are
converted with decimal arithmetic, so ``write_profile_csv`` then
``read_profile_csv`` returns an equal :class:`ModelProfile` (exact round trip).

Every malformed input raises :class:`~pipesearch.errors.InputError` with one
line naming the file, the line number (1-based, in the file), the column and
the value, and the fix.
"""

from __future__ import annotations

import csv
import io
import math
import re
from decimal import Decimal, InvalidOperation, Overflow
from pathlib import Path

from ..catalog import entry_name
from ..errors import InputError
from ..input_files import read_input_text
from ..limits import MAX_BYTES, MAX_COUNT, MAX_LAYER_S, MIN_LAYER_S, MIN_SAMPLE_S
from ..schema import show
from ..types import Layer, ModelProfile

MAGIC = "# pipesearch profile v1"
REQUIRED_COLUMNS = ("name", "fwd_ms", "bwd_ms", "param_bytes", "output_bytes")
OPTIONAL_COLUMNS = ("saved_bytes", "bwd_input_ms", "fwd_fixed_ms", "bwd_fixed_ms", "bwd_input_fixed_ms",
                    "recompute_saved_bytes", "shared_saved_bytes")
FIXED_COLUMNS = {"fwd_fixed_ms": "fwd_ms", "bwd_fixed_ms": "bwd_ms", "bwd_input_fixed_ms": "bwd_input_ms"}
HEADER_KEYS = ("model", "batch_size", "device", "bytes_per_param", "tied_param_bytes", "source")
_HEADER_RE = re.compile(r"#\s*([A-Za-z_]+)\s*:(.*)$")
#: a comment that is a header field written otherwise: '=' for the colon, spaces or dashes for the underscores
_NEAR_HEADER_RE = re.compile(r"#\s*([A-Za-z][A-Za-z_ -]*?)\s*[:=]\s*(\S.*)$")
_PLAIN_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # 12.5, 5e6 (docs/formats.md)


# ----------------------------------------------------------------- numbers


_PLAIN_PARTS = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:[eE]([+-]?[0-9]+))?")
"""A plain decimal (:data:`_PLAIN_DECIMAL`) as its mantissa and exponent."""


def parse_number(text: str, scale: int = 0) -> float:
    """Decimal string -> float, times ``10**scale``, correctly rounded once.

    A plain decimal of at most 28 digits with an exponent under 10^4 is
    read by ``float`` from the same digits with the exponent moved by
    ``scale``: ``float`` of a decimal string rounds its exact value once
    (IEEE 754-2008 sec. 5.12; CPython's ``float`` is Gay's correctly
    rounded ``strtod``), as does ``float(Decimal)`` (which reads
    ``str(Decimal)`` the same way), and ``scaleb`` is
    exact there (the decimal context's 28 digits), so both give the same
    float; anything else goes through :class:`decimal.Decimal`.

    A finite decimal beyond the floats (``1e999999``, a million digits)
    is ``+-inf``, as ``float`` reads ``1e400``.

    Raises:
        ValueError: not a number, or not finite.
    """
    plain = _PLAIN_PARTS.fullmatch(text.strip())
    if plain is not None:
        mantissa, exponent = plain.group(1), int(plain.group(2) or 0)
        if len(mantissa) <= 28 and abs(exponent) < 10_000:
            return float(f"{mantissa}e{exponent + scale}") if scale else float(plain.group(0))
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise ValueError(f"not finite: {text!r}")
    if not _PLAIN_DECIMAL.fullmatch(text.strip()):  # Decimal also takes digit groups such as "1_0"
        raise ValueError(f"not a plain decimal number: {text!r} (e.g. 12.5 or 5e6)")
    try:
        return float(value.scaleb(scale))
    except Overflow:  # past the decimal context's exponent range: beyond every float
        return math.copysign(math.inf, value)


def underflows(text: str, value: float) -> bool:
    """Whether ``value`` (:func:`parse_number` of ``text``) is 0 only
    because ``text`` is a nonzero number too small for a float
    (``1e-400``)."""
    plain = _PLAIN_PARTS.fullmatch(text.strip())
    return value == 0 and plain is not None and any(ch in "123456789" for ch in plain.group(1))


def shown(text: str) -> str:
    """``text`` as a message quotes it, stripped (:func:`pipesearch.schema.show`:
    its ``repr``, cut to 80 characters)."""
    return show(text.strip())


def writable_name(text: str) -> bool:
    """Whether a profile CSV can hold ``text`` as a name (the model's in a
    header line, a device's, a layer's cell) and read it back the same:
    one line, no leading or trailing blanks."""
    return "\n" not in text and "\r" not in text and text == text.strip()


def format_number(value: float, scale: int = 0) -> str:
    """Float ``value`` times ``10**scale`` as a short decimal string that
    :func:`parse_number` (with ``-scale``) turns back into ``value`` exactly."""
    text = format(Decimal(repr(float(value))).scaleb(scale).normalize(), "f")
    return text[:-2] if text.endswith(".0") else text


# ----------------------------------------------------------------- reading


def _fail(path: Path, where: str, message: str) -> InputError:
    return InputError(f"{path}: {where}: {message}")


def _split_lines(path: Path, text: str) -> tuple[dict[str, list[tuple[int, str]]], list[tuple[int, str]]]:
    """Header fields (key -> [(line number, value)]) and table lines [(line number, text)]."""
    header: dict[str, list[tuple[int, str]]] = {}
    table: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            m = _HEADER_RE.match(stripped)
            if m:
                key = m.group(1).lower()
                if key not in HEADER_KEYS:
                    raise _fail(path, f"line {number}", f"unknown header field {shown(m.group(1))} "
                                f"(known: {', '.join(HEADER_KEYS)}); fix the key or drop the line")
                header.setdefault(key, []).append((number, m.group(2).strip()))
            else:  # a comment, unless it is a numeric header field without its colon ('# batch_size 32')
                words = stripped.lstrip("#").split()
                if len(words) == 3 and words[:2] == ["pipesearch", "profile"] and stripped != MAGIC:
                    raise _fail(path, f"line {number}", f"{shown(stripped)}: a profile format this pipesearch does "
                                f"not read (it reads {shown(MAGIC)}); write it again with this pipesearch profile, "
                                f"or give its header as {shown(MAGIC)} if its columns are those of docs/formats.md")
                if len(words) == 2 and words[0].lower() in ("batch_size", "bytes_per_param") and \
                        words[1].replace(".", "", 1).isdigit():
                    raise _fail(path, f"line {number}", f"{shown(stripped)} is not a header field (no colon); write "
                                f"'# {words[0]}: {words[1]}'")
                near = _NEAR_HEADER_RE.match(stripped)  # '# batch_size = 8', '# batch size: 8'
                key = re.sub(r"[\s-]+", "_", near.group(1).strip()).lower() if near else ""
                if key in HEADER_KEYS:
                    raise _fail(path, f"line {number}", f"{shown(stripped)} is not a header field; write "
                                f"'# {key}: {near.group(2).strip()}'")
            continue
        table.append((number, line))
    return header, table


def _header_value(path: Path, header: dict, key: str) -> tuple[int, str] | None:
    entries = header.get(key)
    if not entries:
        return None
    if len(entries) > 1:
        lines = ", ".join(str(n) for n, _ in entries)
        raise _fail(path, f"lines {lines}", f"header field {key!r} given {len(entries)} times; keep one")
    return entries[0]


def _printable_value(path: Path, header: dict, key: str) -> tuple[int, str] | None:
    """:func:`_header_value` of a name (``model``, ``device``): one that
    holds a tab or another control character is refused (the table's
    heading and the exports print it)."""
    found = _header_value(path, header, key)
    if found is not None and not found[1].isprintable():
        example = "my model" if key == "model" else "a100-80gb"
        raise _fail(path, f"line {found[0]}", f"header field {key!r} {shown(found[1])} holds a control character "
                    f"(a tab?); write the name on one line, e.g. '# {key}: {example}'")
    return found


def _parse_header(path: Path, header: dict) -> dict:
    found = _header_value(path, header, "batch_size")
    if found is None:
        raise _fail(path, "header", "missing '# batch_size: N' line (the samples per batch the "
                    "times and sizes were measured at); add it above the table")
    line, text = found
    try:
        batch = parse_number(text)
    except ValueError:
        batch = float("nan")
    if not (0 < batch <= MAX_COUNT and batch.is_integer()):
        raise _fail(path, f"line {line}", f"batch_size {shown(text)} is not a positive integer <= {MAX_COUNT}; "
                    "write the profiled batch size, e.g. '# batch_size: 128'")
    bytes_per_param = _header_number(path, header, "bytes_per_param", 4.0, lambda v: 0.125 <= v <= 64,
                                     "is not a number in [0.125, 64] (1-bit to 512-bit parameters); write e.g. "
                                     "'# bytes_per_param: 4' (fp32), 2 (fp16) or 0.5 (int4)")
    tied = _header_number(path, header, "tied_param_bytes", 0.0, lambda v: 0 <= v < math.inf,
                          "is not a number >= 0; write the bytes the last layer shares with the first, e.g. "
                          "'# tied_param_bytes: 262144'")
    model, device = (_printable_value(path, header, key) for key in ("model", "device"))
    return {
        "name": model[1] if model and model[1] else entry_name(path),
        "profiled_batch_size": int(batch),
        "profiled_device": device[1] if device and device[1] else "unknown",
        "bytes_per_param": bytes_per_param,
        "tied_param_bytes": tied,
        "source": "\n".join(v for _, v in header.get("source", [])),
    }


def _header_number(path: Path, header, key: str, default: float, valid, problem: str) -> float:
    """The number of header field ``key`` (``default`` when absent).

    Raises:
        InputError: not a number, or ``valid(value)`` false (the message: the
            field, its text and ``problem``).
    """
    found = _header_value(path, header, key)
    if found is None:
        return default
    line, text = found
    try:
        value = parse_number(text)
    except ValueError:
        value = float("nan")
    if not valid(value):
        raise _fail(path, f"line {line}", f"{key} {shown(text)} {problem}")
    return value


def _read_table(path: Path, table: list[tuple[int, str]]) -> tuple[list[dict[str, str]], list[int]]:
    """The table's rows as ``{column: cell text}`` (the csv module, blanks
    after a comma skipped, no NA conversion) and each row's file line number."""
    if not table:
        raise _fail(path, "table", "no header row and no layers; add 'name,fwd_ms,bwd_ms,"
                    "param_bytes,output_bytes' and one row per layer")
    header_line = table[0][0]
    try:
        columns = [c.strip() for c in next(csv.reader([table[0][1]]))]
    except csv.Error as exc:
        raise _fail(path, f"line {header_line}", f"cannot be read as CSV ({exc}); fix the header row "
                    f"{shown(table[0][1])}") from None
    if not set(columns) & set(REQUIRED_COLUMNS + OPTIONAL_COLUMNS):
        for sep, name in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars")):
            if set(c.strip() for c in table[0][1].split(sep)) & set(REQUIRED_COLUMNS):
                raise _fail(path, f"line {header_line}", f"the table's columns are separated by {name} "
                            f"({shown(table[0][1])}); pipesearch reads comma-separated values: save the file as CSV "
                            f"with commas (in a spreadsheet: comma as the list separator), or replace the "
                            f"{name} by commas")
        raise _fail(path, f"line {header_line}", f"no header row: the table's first line {shown(table[0][1])} "
                    f"names no column; add a line '{','.join(REQUIRED_COLUMNS)}' above the layers")
    for k, col in enumerate(columns):
        if not col:
            where = "a trailing comma" if k == len(columns) - 1 else "two commas in a row"
            raise _fail(path, f"line {header_line}", f"column {k + 1} of the header row has no name ({where}?): "
                        f"drop the extra comma from {shown(table[0][1])}")
        if col not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS:
            raise _fail(path, f"line {header_line}", f"unknown column {shown(col)} (allowed: "
                        f"{', '.join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)}); rename or drop it")
    _check_fixed_columns(path, header_line, columns)
    if len(set(columns)) != len(columns):
        dup = next(c for c in columns if columns.count(c) > 1)
        raise _fail(path, f"line {header_line}", f"column {shown(dup)} appears twice; keep one")
    for col in REQUIRED_COLUMNS:
        if col not in columns:
            raise _fail(path, f"line {header_line}", f"missing required column {col!r} (found: "
                        f"{', '.join(columns)}); the header row must contain "
                        f"{','.join(REQUIRED_COLUMNS)}")
    rows = table[1:]
    if not rows:
        raise _fail(path, f"line {header_line}", "the table has no layers; add one row per layer")
    records = []
    for number, line in rows:
        try:
            fields, cells = _row_fields(line)
        except csv.Error as exc:  # e.g. a quoted field past the csv module's field size limit
            raise _fail(path, f"line {number}", f"cannot be read as CSV ({exc}); fix the row {shown(line)}") from None
        if not any(c.strip() for c in cells):
            raise _fail(path, f"line {number}", f"an empty row ({shown(line)}: a spreadsheet's leftover); delete it")
        if [c.strip() for c in cells] == columns:
            raise _fail(path, f"line {number}", f"the header row again (as on line {header_line}); delete it: one "
                        "header row above the layers")
        if len(fields) != len(columns) or len(cells) != len(columns):
            raise _fail(path, f"line {number}", f"{len(fields)} fields, expected {len(columns)} "
                        f"({','.join(columns)}); fix the row {shown(line)}")
        records.append(dict(zip(columns, cells)))
    return records, [number for number, _ in rows]


def _row_fields(line: str) -> tuple[list[str], list[str]]:
    """A table line's fields as the csv module reads it, as they are and
    with the spaces after each comma skipped (``skipinitialspace``). A line
    with no quote and no NUL has no csv syntax but its commas (the lines
    come from ``str.splitlines``: no line breaks): split there, else the
    csv module itself."""
    if '"' in line or "\x00" in line:
        return next(csv.reader([line])), next(csv.reader([line], skipinitialspace=True))
    fields = line.split(",")
    return fields, [f.lstrip(" ") for f in fields]


def _cell_number(path: Path, line: int, column: str, text: str, scale: int) -> float:
    try:
        value = parse_number(text, scale)
    except ValueError:
        what = "empty" if not text.strip() else f"{shown(text)} is not a finite number"
        raise _fail(path, f"line {line}, column {column!r}", f"value {what}; write a plain "
                    "number >= 0 (times in ms, sizes in bytes)") from None
    if value < 0:
        raise _fail(path, f"line {line}, column {column!r}", f"value {shown(text)} is negative; "
                    "times and sizes must be >= 0")
    high, unit = (MAX_LAYER_S * 1e3, "ms") if column.endswith("_ms") else (MAX_BYTES, "bytes")
    if unit == "ms" and (0 < value < MIN_LAYER_S or underflows(text, value)):
        raise _fail(path, f"line {line}, column {column!r}", f"value {shown(text)} is less than "
                    f"{MIN_LAYER_S * 1e3:g} ms (1 ns) but not 0; check the unit (times in ms) or write 0")
    if value > (MAX_LAYER_S if unit == "ms" else MAX_BYTES):
        raise _fail(path, f"line {line}, column {column!r}", f"value {shown(text)} is more than "
                    f"{high:g} {unit}; check the unit (times in ms, sizes in bytes)")
    return value


def _check_fixed_columns(path: Path, header_line: int, columns) -> None:
    """The fixed-time columns come as ``fwd_fixed_ms`` with ``bwd_fixed_ms``;
    ``bwd_input_fixed_ms`` only with them and with ``bwd_input_ms``."""
    given = [c for c in FIXED_COLUMNS if c in columns]
    if not given:
        return
    needs = {"fwd_fixed_ms": "bwd_fixed_ms", "bwd_fixed_ms": "fwd_fixed_ms", "bwd_input_fixed_ms": "bwd_input_ms"}
    for col in given:
        if needs[col] not in columns:
            raise _fail(path, f"line {header_line}", f"column {col!r} needs column {needs[col]!r} too "
                        "(fixed times come for forward and backward, the input-gradient one with "
                        "bwd_input_ms); add it or drop the fixed columns")
    if "bwd_input_fixed_ms" in given and "fwd_fixed_ms" not in columns:
        raise _fail(path, f"line {header_line}", "column 'bwd_input_fixed_ms' needs columns 'fwd_fixed_ms' and "
                    "'bwd_fixed_ms' too; add them or drop the fixed columns")


def _fixed_parts(path: Path, line: int, row: dict, times_s: dict) -> dict:
    """``fwd_fixed_s`` ... of one row: empty when the file has no fixed
    columns, else every applicable cell given, each within its time at the
    batch size, the input-gradient part within the backward's."""
    out: dict = {}
    for col, time_col in FIXED_COLUMNS.items():
        if col not in row:
            continue
        text = row[col].strip()
        applies = times_s[time_col] is not None
        if not text and applies:
            raise _fail(path, f"line {line}, column {col!r}", "empty, but the column is there: fixed times must be "
                        "given on every row (0 for a time proportional to the batch size) or the column dropped")
        if text and not applies:
            raise _fail(path, f"line {line}, column {col!r}", f"value {text!r} without a {time_col} on the row; "
                        f"give {time_col} or leave {col} empty")
        if not text:
            continue
        value = _cell_number(path, line, col, text, -3)
        if value > times_s[time_col]:
            raise _fail(path, f"line {line}, column {col!r}", f"value {text!r} exceeds {time_col} "
                        f"{row[time_col].strip()!r}; the fixed part is part of the time at batch_size")
        out[col[:-3] + "_s"] = value
    if "bwd_input_fixed_s" in out:
        b, bf, i, if_ = times_s["bwd_ms"], out["bwd_fixed_s"], times_s["bwd_input_ms"], out["bwd_input_fixed_s"]
        if if_ > bf or i - if_ > b - bf:
            raise _fail(path, f"line {line}, column 'bwd_input_fixed_ms'", f"value {row['bwd_input_fixed_ms'].strip()!r}"
                        f" with bwd_input_ms {row['bwd_input_ms'].strip()!r} makes the input gradient exceed the "
                        "backward at some batch size; its fixed and per-sample parts must each be at most bwd's")
    return out


def read_profile_csv(path: str | Path) -> ModelProfile:
    """Read a profile CSV (format in the module docstring).

    Args:
        path: the ``.csv`` file.

    Returns:
        The profile; times in seconds, sizes in bytes at ``profiled_batch_size``.

    Raises:
        InputError: unreadable file, missing/duplicate header field, bad batch
            size, missing or unknown column, wrong field count, empty table,
            non-numeric, NaN/inf or negative value, duplicate or empty layer
            name, ``bwd_input_ms > bwd_ms``; fixed columns (``fwd_fixed_ms``
            ...) without their partner, empty on some rows, or above their
            time.
    """
    path = Path(path)
    text = read_input_text(path, "profile CSV")
    header, table = _split_lines(path, text)
    meta = _parse_header(path, header)
    records, line_numbers = _read_table(path, table)
    layers = []
    seen: dict[str, int] = {}
    has_saved = "saved_bytes" in records[0]
    has_bwd_input = "bwd_input_ms" in records[0]
    for line, row in zip(line_numbers, records):
        name = row["name"].strip()
        if not name:
            raise _fail(path, f"line {line}, column 'name'", "empty layer name; give every layer a name")
        if not name.isprintable():  # a NUL or control character: the exports write names into scripts
            raise _fail(path, f"line {line}, column 'name'", f"layer name {shown(name)} holds a control character; "
                        "use printable characters")
        if name in seen:
            raise _fail(path, f"line {line}, column 'name'", f"duplicate layer name {shown(name)} "
                        f"(first on line {seen[name]}); layer names must be unique")
        seen[name] = line
        fwd = _cell_number(path, line, "fwd_ms", row["fwd_ms"], -3)
        bwd = _cell_number(path, line, "bwd_ms", row["bwd_ms"], -3)
        params = _cell_number(path, line, "param_bytes", row["param_bytes"], 0)
        output = _cell_number(path, line, "output_bytes", row["output_bytes"], 0)
        saved = output
        if has_saved and row["saved_bytes"].strip():
            saved = _cell_number(path, line, "saved_bytes", row["saved_bytes"], 0)
        bwd_input = None
        if has_bwd_input and row["bwd_input_ms"].strip():
            bwd_input = _cell_number(path, line, "bwd_input_ms", row["bwd_input_ms"], -3)
            if bwd_input > bwd:
                raise _fail(path, f"line {line}, column 'bwd_input_ms'", f"value "
                            f"{row['bwd_input_ms'].strip()!r} exceeds bwd_ms {row['bwd_ms'].strip()!r}; "
                            "the input-gradient time is part of the backward time")
        fixed = _fixed_parts(path, line, row, {"fwd_ms": fwd, "bwd_ms": bwd, "bwd_input_ms": bwd_input})
        recompute_saved = None
        if "recompute_saved_bytes" in row and row["recompute_saved_bytes"].strip():
            recompute_saved = _cell_number(path, line, "recompute_saved_bytes", row["recompute_saved_bytes"], 0)
            if recompute_saved > saved:
                raise _fail(path, f"line {line}, column 'recompute_saved_bytes'", f"value "
                            f"{row['recompute_saved_bytes'].strip()!r} exceeds the layer's saved bytes ({saved:g}); "
                            "a recomputed layer keeps part of what it saves (usually its input), never more")
        shared = _shared_saved(path, line, row, saved, layers[-1] if layers else None, recompute_saved)
        layers.append(Layer(name=name, fwd_s=fwd, bwd_s=bwd, param_bytes=params,
                            output_bytes=output, saved_bytes=saved, bwd_input_s=bwd_input,
                            recompute_saved_bytes=recompute_saved, shared_saved_bytes=shared, **fixed))
    _check_per_sample(path, line_numbers, layers, meta["profiled_batch_size"])
    if meta["tied_param_bytes"] > 0 and len(layers) == 1:
        raise _fail(path, "header", f"tied_param_bytes {format_number(meta['tied_param_bytes'])} with one layer: a "
                    "model of one layer shares nothing between its first and last layers; drop the header line")
    if meta["tied_param_bytes"] > layers[0].param_bytes:
        raise _fail(path, "header", f"tied_param_bytes {format_number(meta['tied_param_bytes'])} is more than the "
                    f"first layer's param_bytes ({format_number(layers[0].param_bytes)}), which holds the shared "
                    f"parameters once; fix the header")
    return ModelProfile(layers=tuple(layers), **meta)


def _check_per_sample(path: Path, line_numbers, layers, batch: int) -> None:
    """Every non-zero time's per-sample part, ``(t - fixed) / batch_size``,
    is at least :data:`pipesearch.limits.MIN_SAMPLE_S`."""
    for line, lay in zip(line_numbers, layers):
        for column, t, fixed in (("fwd_ms", lay.fwd_s, lay.fwd_fixed_s), ("bwd_ms", lay.bwd_s, lay.bwd_fixed_s)):
            per_sample = (t - (fixed or 0.0)) / batch
            if 0 < per_sample < MIN_SAMPLE_S:
                raise _fail(path, f"line {line}, column {column!r}", f"{t * 1e3:g} ms at batch_size {batch} is "
                            f"{per_sample:.3g} s per sample, under {MIN_SAMPLE_S:g} s; check '# batch_size' (the "
                            "samples the times were measured at)")


# ----------------------------------------------------------------- writing


def _with_fixed(path: Path, profile: ModelProfile) -> bool:
    """Whether the profile has fixed times; raises when only some layers (or
    directions) have them, which the format cannot hold."""
    def complete(lay):
        return (lay.fwd_fixed_s is not None and lay.bwd_fixed_s is not None
                and (lay.bwd_input_s is None) == (lay.bwd_input_fixed_s is None))

    def none(lay):
        return lay.fwd_fixed_s is None and lay.bwd_fixed_s is None and lay.bwd_input_fixed_s is None

    if all(none(lay) for lay in profile.layers):
        return False
    bad = next((lay for lay in profile.layers if not complete(lay)), None)
    if bad is not None:
        raise InputError(f"{path}: cannot write layer {bad.name!r}: fixed times must be given for forward and "
                         "backward (and the input gradient where it is given) on every layer or on none")
    return True


def _shared_saved(path: Path, line: int, row: dict, saved: float, previous: Layer | None,
                  recompute_saved: float | None) -> float | None:
    """The ``shared_saved_bytes`` cell of one row (None when absent or
    empty), checked by :func:`shared_saved_problem`."""
    cell = row.get("shared_saved_bytes", "").strip()
    if not cell:
        return None
    shared = _cell_number(path, line, "shared_saved_bytes", cell, 0)
    problem = shared_saved_problem(shared, saved, previous, recompute_saved is not None)
    if problem:
        raise _fail(path, f"line {line}, column 'shared_saved_bytes'", f"value {cell!r} {problem}")
    return shared


def shared_saved_problem(shared: float, saved: float, previous: Layer | None, recomputable: bool) -> str | None:
    """Why a layer's ``shared_saved_bytes`` (> 0) cannot be, or None: on the
    first layer (no layer before it to share with), next to a recomputable
    layer (a recomputed stage keeps its checkpoints, not what neighbours
    share), or above this layer's or the previous layer's ``saved_bytes``
    (the shared tensor is part of what both save)."""
    if shared <= 0:
        return None
    if previous is None:
        return ("on the first layer: it shares what it saves with the layer before it, and the first layer has "
                "none; leave the cell empty")
    if recomputable or previous.recompute_saved_bytes is not None:
        return "on a layer next to a recomputable one (recompute_saved_bytes): give one of the two columns"
    most = min(saved, previous.saved_bytes)
    if shared > most:
        return (f"exceeds the saved bytes of this layer or of the layer before it ({format_number(most)}); the "
                "shared tensor is part of what both save")
    return None


def write_profile_csv(profile: ModelProfile, path: str | Path) -> None:
    """Write ``profile`` as a profile CSV (format in the module docstring).

    ``saved_bytes`` is always written; ``bwd_input_ms`` only when some layer
    has ``bwd_input_s`` (empty cells for the others); ``fwd_fixed_ms``,
    ``bwd_fixed_ms`` (and ``bwd_input_fixed_ms`` with ``bwd_input_ms``) when
    the layers have fixed times; ``recompute_saved_bytes`` and
    ``shared_saved_bytes`` each only when some layer has one (empty cells
    for the others). ``Layer.flops`` is not
    stored. Reading the file back gives an equal profile.

    Raises:
        InputError: a name or header value that the format cannot hold (a
            newline; a layer name starting with ``#``; a non-finite number).
    """
    path = Path(path)
    texts = [profile.name, profile.profiled_device, *[layer.name for layer in profile.layers]]
    for text in texts:
        if not writable_name(text):
            raise InputError(f"{path}: cannot write name {text!r}: names must be one line "
                             "without leading/trailing blanks")
    for layer in profile.layers:
        if layer.name.startswith("#") or not layer.name:
            raise InputError(f"{path}: cannot write layer name {layer.name!r}: it must be "
                             "non-empty and not start with '#'")
        values = (layer.fwd_s, layer.bwd_s, layer.param_bytes, layer.output_bytes, layer.saved_bytes)
        if not all(math.isfinite(v) for v in values):
            raise InputError(f"{path}: layer {layer.name!r} has a non-finite value")
    for k, layer in enumerate(profile.layers):  # what the reader would refuse is not written
        problem = shared_saved_problem(layer.shared_saved_bytes or 0.0, layer.saved_bytes,
                                       profile.layers[k - 1] if k else None, layer.recompute_saved_bytes is not None)
        if problem:
            raise InputError(f"{path}: layer {layer.name!r}: shared_saved_bytes "
                             f"{format_number(layer.shared_saved_bytes)} {problem}")
    lines = [MAGIC, f"# model: {profile.name}", f"# batch_size: {profile.profiled_batch_size}",
             f"# device: {profile.profiled_device}",
             f"# bytes_per_param: {format_number(profile.bytes_per_param)}"]
    if profile.tied_param_bytes:
        lines.append(f"# tied_param_bytes: {format_number(profile.tied_param_bytes)}")
    if profile.source:
        lines += [f"# source: {part.strip()}" for part in profile.source.split("\n")]
    with_bwd_input = any(layer.bwd_input_s is not None for layer in profile.layers)
    with_fixed = _with_fixed(path, profile)
    with_recompute = any(layer.recompute_saved_bytes is not None for layer in profile.layers)
    with_shared = any(layer.shared_saved_bytes is not None for layer in profile.layers)
    columns = (list(REQUIRED_COLUMNS) + ["saved_bytes"] + (["bwd_input_ms"] if with_bwd_input else [])
               + (["fwd_fixed_ms", "bwd_fixed_ms"] if with_fixed else [])
               + (["bwd_input_fixed_ms"] if with_fixed and with_bwd_input else [])
               + (["recompute_saved_bytes"] if with_recompute else [])
               + (["shared_saved_bytes"] if with_shared else []))
    rows = []
    for layer in profile.layers:
        row = {
            "name": layer.name,
            "fwd_ms": format_number(layer.fwd_s, 3),
            "bwd_ms": format_number(layer.bwd_s, 3),
            "param_bytes": format_number(layer.param_bytes),
            "output_bytes": format_number(layer.output_bytes),
            "saved_bytes": format_number(layer.saved_bytes),
        }
        if with_bwd_input:
            row["bwd_input_ms"] = "" if layer.bwd_input_s is None else format_number(layer.bwd_input_s, 3)
        if with_fixed:
            row["fwd_fixed_ms"] = format_number(layer.fwd_fixed_s, 3)
            row["bwd_fixed_ms"] = format_number(layer.bwd_fixed_s, 3)
            if with_bwd_input:
                row["bwd_input_fixed_ms"] = ("" if layer.bwd_input_s is None
                                             else format_number(layer.bwd_input_fixed_s, 3))
        if with_recompute:
            row["recompute_saved_bytes"] = ("" if layer.recompute_saved_bytes is None
                                            else format_number(layer.recompute_saved_bytes))
        if with_shared:
            row["shared_saved_bytes"] = ("" if layer.shared_saved_bytes is None
                                         else format_number(layer.shared_saved_bytes))
        rows.append(row)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    table = out.getvalue()
    path.write_text("\n".join(lines) + "\n" + table, encoding="utf-8")
