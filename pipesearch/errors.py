"""Typed errors. Every message names the input (file, field, value), says what
was expected and, where one exists, the fix. The CLI prints the message as one
line on stderr and exits with status 2."""

from __future__ import annotations


class PipesearchError(Exception):
    """Base class of every error pipesearch raises on bad input or an
    impossible request."""


class InputError(PipesearchError, ValueError):
    """A malformed or out-of-range input (profile, cluster, job, option)."""


class CatalogError(InputError, LookupError):
    """An unknown catalog name."""


class InfeasibleError(PipesearchError):
    """The request is well formed but no plan satisfies it (e.g. memory).
    ``point_columns``: the search's table of the points it looked at, as
    :attr:`pipesearch.search.SearchResult.point_columns` (None when the
    refusal came before the search)."""

    def __init__(self, *args, point_columns: dict | None = None):
        super().__init__(*args)
        self.point_columns = point_columns


class PlanFormatError(InputError):
    """A plan JSON file that does not follow the schema."""


def quoted_cause(text: str, limit: int = 200) -> str:
    """A library's error message as a part of one error line: its first
    sentence of its first line, cut at a word boundary to at most ``limit``
    characters ("..." where cut; transformers lists every config class it
    knows after its first sentence)."""
    line = " ".join((text.strip().splitlines() or [""])[0].split())
    first = line.split(". ", 1)[0]
    first = first if first.endswith(".") or first == line else first + "."
    if len(first) <= limit:
        return first
    return first[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
