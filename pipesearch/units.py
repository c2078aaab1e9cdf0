"""Parse and format quantities with units: ``"80GiB"``, ``"600GB/s"``, ``"2.5ms"``."""

from __future__ import annotations

import math
import re

from .errors import InputError

_BYTES = {
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUM = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"


def parse_bytes(text: str | float | int) -> float:
    """``"80GiB"`` -> 85899345920.0; a bare number is bytes.

    Raises:
        InputError: not a size.
    """
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(_NUM + r"([a-zA-Z]*)\s*", str(text))
    unit = (m.group(2).lower() or "b") if m else None
    if not m or unit not in _BYTES:
        raise InputError(f"not a size: {text!r} (expected e.g. 80GiB, 512MB, 1024)")
    return float(m.group(1)) * _BYTES[unit]


def parse_size_option(option: str, text: str) -> float:
    """A size given on the command line (``--memory-reserve 2GiB``) in bytes:
    a bare number other than zero is refused (``2`` means 2 GiB to some users
    and 2 bytes to others; ``0`` is none in every unit), as is anything
    :func:`parse_bytes` refuses.

    Raises:
        InputError: naming ``option``, the value and the fix."""
    bare = str(text).strip()
    if bare.replace(".", "", 1).isdigit():
        if float(bare) == 0:
            return 0.0
        raise InputError(f"{option} {bare}: no unit; give one, e.g. {bare}GiB or {bare}MB")
    if bare.startswith("-"):
        raise InputError(f"{option} {text!r}: a size must not be negative; give 0 for none, or e.g. 1GiB")
    bits = re.fullmatch(_NUM + r"([KMGT])(i?)b\s*", bare)  # 8Gb: gigabits, as link speeds are written
    if bits:
        num, prefix, binary = bits.groups()
        name = {"K": "kilo", "M": "mega", "G": "giga", "T": "tera"}[prefix]
        name = name[:2] + "bi" if binary else name
        raise InputError(f"{option} {text!r}: {prefix}{binary}b is {name}bits; a size is in bytes: "
                         f"write {num}{prefix}{binary}B" + ("" if binary else f" or {num}{prefix}iB"))
    try:
        return parse_bytes(text)
    except InputError:
        raise InputError(f"{option} {text!r}: not a size; expected a number and a unit, e.g. 80GiB or 512MB") from None


def parse_seconds(text: str | float | int) -> float:
    """``"2.5ms"`` -> 0.0025; a bare number is seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(_NUM + r"([a-zµ]*)\s*", str(text))
    unit = (m.group(2) or "s") if m else None
    if not m or unit not in _TIME:
        raise InputError(f"not a duration: {text!r} (expected e.g. 2.5ms, 10us, 1.2)")
    return float(m.group(1)) * _TIME[unit]


def format_bytes(num_bytes: float) -> str:
    """Binary units: 85899345920 -> ``"80.0 GiB"``."""
    if not math.isfinite(num_bytes):
        return str(num_bytes)
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_size_option(num_bytes: float) -> str:
    """A size as the command line takes it back (:func:`parse_size_option`
    gives ``num_bytes`` again): the largest binary unit it is a short
    number of (up to 6 significant digits), then the largest decimal one,
    else bytes: 1073741824 -> ``"1GiB"``, 2e9 -> ``"2GB"``, 123456789 ->
    ``"123456789B"``, 0 -> ``"0"``."""
    value = float(num_bytes)
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    for base, units in ((1024, ("TiB", "GiB", "MiB", "KiB")), (1000, ("TB", "GB", "MB", "KB"))):
        for power, unit in zip((4, 3, 2, 1), units):
            text = f"{value / base ** power:.6g}{unit}"
            if abs(value) >= base ** power and "e" not in text and parse_bytes(text) == value:
                return text
    return f"{int(value)}B" if value.is_integer() else f"{value!r}B"


def format_gib_pair(need_bytes: float, have_bytes: float) -> tuple[str, str]:
    """Two byte counts in GiB (``"25.64 GiB"``, ``"25.61 GiB"``) with the
    fewest decimals (1 to 4) that tell them apart, for a message that a
    need exceeds what there is."""
    gib = 2.0 ** 30
    for digits in range(1, 5):
        a, b = f"{need_bytes / gib:.{digits}f}", f"{have_bytes / gib:.{digits}f}"
        if a != b or need_bytes == have_bytes:
            return f"{a} GiB", f"{b} GiB"
    return f"{need_bytes:,.0f} B", f"{have_bytes:,.0f} B"  # apart by less than 0.0001 GiB: the bytes


def format_seconds(seconds: float) -> str:
    """0.0123 -> ``"12.3 ms"``."""
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"
