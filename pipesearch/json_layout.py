"""Pretty-printed JSON text, the bytes ``json.dumps(value, indent=2)`` writes,
without its per-element cost on long lists of strings.

``json.dumps`` with an indent runs the standard library's pure-Python
encoder, one generator step per element; a plan of a 100,000-layer profile
holds every layer's name in every plan's stages and exports (~10^6 strings).
:func:`dumps_indented` puts a placeholder in place of each list of at least
:data:`MIN_JOINED_ITEMS` strings (or lists of strings: an export's modules
per layer), lets ``json.dumps`` lay out the rest, and writes each list in
the same layout (one item a line, two more spaces than
the line that opens it, the bracket closing at that line's indent) with the
same string encoder (``json.encoder.encode_basestring_ascii``), mapped over
the list in C. When a placeholder's text also occurs in the document, the
whole value goes through ``json.dumps`` as it is.
"""

from __future__ import annotations

import json
import re
from itertools import chain
from json.encoder import encode_basestring_ascii

MIN_JOINED_ITEMS = 64
"""Lists of at least this many strings are written by :func:`dumps_indented` itself."""

_MARK = re.compile(r'"\\u0000L([0-9]+)\\u0000"')
_SPACES = re.compile(" *")


def dumps_indented(value, *, allow_nan: bool = False) -> str:
    """``json.dumps(value, indent=2, allow_nan=allow_nan)``, the same text.

    Raises:
        ValueError, TypeError: as ``json.dumps`` (a non-finite float with
            ``allow_nan`` False, a value JSON cannot hold).
    """
    lists: list = []
    marked = _marked(value, lists)
    if not lists:
        return json.dumps(value, indent=2, allow_nan=allow_nan)
    text = json.dumps(marked, indent=2, allow_nan=allow_nan)
    found = [int(m.group(1)) for m in _MARK.finditer(text)]
    if sorted(found) != list(range(len(lists))):  # a string of the document reads as a placeholder
        return json.dumps(value, indent=2, allow_nan=allow_nan)

    def joined(m: re.Match) -> str:
        start = text.rfind("\n", 0, m.start()) + 1
        pad = " " * (_SPACES.match(text, start).end() - start)
        items = lists[int(m.group(1))]
        return _strings_text(items, pad) if type(items[0]) is str else _nested_text(items, pad)

    return _MARK.sub(joined, text)


def _strings_text(items, pad: str) -> str:
    """A list of strings as ``json.dumps(indent=2)`` lays it out on a line indented by ``pad``."""
    if not items:
        return "[]"
    inner = pad + "  "
    return "[\n" + inner + (",\n" + inner).join(map(encode_basestring_ascii, items)) + "\n" + pad + "]"


def _nested_text(items, pad: str) -> str:
    """A list of lists of strings, laid out likewise (lists of one string
    each, an export's module per layer, in one join)."""
    inner = pad + "  "
    if set(map(len, items)) == {1}:
        leaf = inner + "  "
        between = "\n" + inner + "],\n" + inner + "[\n" + leaf
        return ("[\n" + inner + "[\n" + leaf + between.join(map(encode_basestring_ascii, chain.from_iterable(items)))
                + "\n" + inner + "]\n" + pad + "]")
    return "[\n" + inner + (",\n" + inner).join([_strings_text(x, inner) for x in items]) + "\n" + pad + "]"


def _marked(value, lists: list):
    """``value`` with each list (or tuple) of :data:`MIN_JOINED_ITEMS` or
    more items, all ``str`` or all lists of ``str``, replaced by the
    placeholder ``"\\x00L<k>\\x00"`` and appended to ``lists``; dicts and other
    lists copied, the rest as is."""
    if type(value) is dict:
        return {k: _marked(v, lists) for k, v in value.items()}
    if type(value) in (list, tuple):
        if len(value) >= MIN_JOINED_ITEMS:
            kinds = set(map(type, value))
            if kinds == {str} or kinds <= {list, tuple} and set(map(type, chain.from_iterable(value))) <= {str}:
                lists.append(value)
                return f"\x00L{len(lists) - 1}\x00"
        return [_marked(v, lists) for v in value]
    return value
