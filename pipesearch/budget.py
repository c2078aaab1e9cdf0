"""The host-memory guard of a search: refuse, before any work, an input whose
search would need more memory than the user's budget.

The exact split for the simulated time (:mod:`pipesearch.split_search`)
keeps suffix tables over (stage length, end layer) and a rank-counting table
over layer pairs: they grow with the square of the layer count, up to
:data:`pipesearch.bound_tables.MAX_TABLED_FLOATS`, above which a split is
the best of its starting splits with a table-free bound (the closed-form
split of :mod:`pipesearch.partition` is linear in layers x stages).
:data:`BYTES_PER_LAYER_PAIR` is the measured growth of the peak resident
memory of ``pipesearch plan`` on chains of 1,000, 2,000 and 4,000 layers on
four devices (about 0.2, 0.54 and 1.66 GB: 93 to 112 bytes per additional
layer pair; ``/usr/bin/time -f %M``), taken at its upper end;
:data:`BYTES_PER_LAYER` bounds the rest (a 20,000-layer chain on four V100
planned in 174 MB).
"""

from __future__ import annotations

from .errors import InputError
from .bound_tables import MAX_TABLED_FLOATS
from .units import format_bytes

#: peak host memory of a search per (layer, layer) pair, bytes (see module docstring)
BYTES_PER_LAYER_PAIR = 112
#: memory of everything else (interpreter, libraries, the points table), bytes
BASE_BYTES = 256 * 2**20
#: per-layer arrays of the profile, the costs and the closed-form split, bytes per layer
BYTES_PER_LAYER = 4096
#: the largest the split tables grow: their floats and as many temporaries, bytes
TABLE_CAP_BYTES = 2 * 8 * MAX_TABLED_FLOATS
#: default of ``--max-search-memory``
DEFAULT_BUDGET_BYTES = 8 * 2**30


def search_memory_bytes(num_layers: int) -> float:
    """Estimated peak host memory of a search over a chain of ``num_layers``
    layers, bytes: ``BASE_BYTES + min(BYTES_PER_LAYER_PAIR * L**2,
    TABLE_CAP_BYTES) + BYTES_PER_LAYER * L``."""
    L = float(num_layers)
    return BASE_BYTES + min(BYTES_PER_LAYER_PAIR * L ** 2, TABLE_CAP_BYTES) + BYTES_PER_LAYER * L


def check_search_memory(num_layers: int, budget_bytes: float, model: str, knob: str = "--max-search-memory") -> None:
    """Refuse a search whose estimate (:func:`search_memory_bytes`) exceeds
    ``budget_bytes``.

    Raises:
        InputError: the estimate is over budget; the message names the model,
            its layer count, the estimate, the budget and the knob.
    """
    need = search_memory_bytes(num_layers)
    if need > budget_bytes:
        # fewer layers help only where the layers' part, not the search's fixed part, is over the budget
        fix = (f"merge layers into blocks, or raise {knob} if this machine has the memory"
               if search_memory_bytes(1) <= budget_bytes else
               f"raise {knob} to at least {format_bytes(need)} (a search needs about {format_bytes(BASE_BYTES)} "
               f"whatever its layer count)")
        raise InputError(
            f"{model}: {num_layers} layers would need about {format_bytes(need)} of host memory for the search "
            f"(its split tables, at most {format_bytes(TABLE_CAP_BYTES)}, and about {format_bytes(BYTES_PER_LAYER)} "
            f"per layer), more than {knob} {format_bytes(budget_bytes)}; {fix}")
