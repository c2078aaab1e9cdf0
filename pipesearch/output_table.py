"""Fixed-width text tables for the terminal, without pandas.

:func:`format_table` lays a table out as pandas' ``DataFrame(rows).to_string(index=False)``
does for the tables pipesearch prints (columns of strings and of integers),
so the command's output is the same with or without pandas loaded: every
column as wide as its widest cell or its name, cells and names
right-justified, one space between columns; an integer column's name gets
one leading space (pandas leaves room for a sign); a cell a row lacks is
``NaN``.
"""

from __future__ import annotations


def format_table(columns: dict[str, list]) -> str:
    """The table ``{name: cells}`` (every list as long as the first) as text.

    Args:
        columns: column name -> one cell per row: ``str``, ``int`` (a column
            of ints only is an integer column) or ``None`` (printed ``NaN``).

    Returns:
        The lines joined by ``\\n``, no trailing newline: the header line,
        then one line per row.

    Raises:
        ValueError: columns of different lengths.
    """
    lengths = {len(cells) for cells in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"format_table: columns of different lengths {sorted(lengths)}")
    laid_out = []
    for name, cells in columns.items():
        integer = bool(cells) and all(isinstance(c, int) and not isinstance(c, bool) for c in cells)
        header = (" " + name) if integer else name
        texts = ["NaN" if c is None else str(c) for c in cells]
        width = max([len(header)] + [len(t) for t in texts])
        laid_out.append([header.rjust(width)] + [t.rjust(width) for t in texts])
    return "\n".join(" ".join(col[k] for col in laid_out) for k in range(len(laid_out[0]))) if laid_out else ""


#: a list of layers per stage longer than this many characters is written with runs
STAGE_COUNTS_WIDTH = 40


def stage_counts_label(counts) -> str:
    """Layers per stage as a table cell: ``14,12,6,8``; a list longer than
    :data:`STAGE_COUNTS_WIDTH` characters with each run of three or more
    equal counts as ``count*times`` (``2,1*126,2``: the 128 stages of a pp
    64 x vp 2 plan), so every stage stays in the cell without a 300-character
    line."""
    counts = [int(c) for c in counts]
    plain = ",".join(map(str, counts))
    if len(plain) <= STAGE_COUNTS_WIDTH:
        return plain
    parts, k = [], 0
    while k < len(counts):
        n = 1
        while k + n < len(counts) and counts[k + n] == counts[k]:
            n += 1
        parts += [f"{counts[k]}*{n}"] if n >= 3 else [str(counts[k])] * n
        k += n
    return ",".join(parts)
