"""Bounds on every number pipesearch reads, and the check that applies them.

Each bound is far outside any real hardware or model and far inside the
range where float64 arithmetic over a whole search stays finite: a value
beyond it is a typo or a unit mistake (``1e300`` GiB of memory, a node count
of ``2**63 - 1``), refused with the file, field and value before it can
overflow to ``inf`` or make a loop run for ever.
"""

from __future__ import annotations

import math
from typing import Any

#: devices in one cluster (the largest training clusters hold about 10**5)
MAX_DEVICES = 2**17
#: any size in bytes: memory of a device, a layer's parameters or activations (1 EiB)
MAX_BYTES = float(2**60)
#: memory of one device: 1 MiB (a value below it is a unit mistake: ``memory_GiB = 1e-9`` for 1 byte)
MIN_DEVICE_MEMORY_BYTES = float(2**20)
#: one layer's forward or backward time at its profiled batch, seconds (11.6 days)
MAX_LAYER_S = 1e6
#: the shortest non-zero layer time, seconds (1 ns: no kernel is faster; shorter
#: values are unit mistakes and would make throughputs astronomically large)
MIN_LAYER_S = 1e-9
#: the shortest non-zero per-sample part of a layer time, seconds (0.1 ns,
#: ten billion samples a second through one layer: a time at the profiled
#: batch divided by the batch size below this is a batch-size mistake;
#: planned at a small micro-batch it would vanish)
MIN_SAMPLE_S = 1e-10
#: samples per second of a plan
MAX_SAMPLES_PER_S = 1e30
#: any time in a plan file, seconds: above what the inputs' limits can make (a layer's 1e6 s
#: at a batch of MAX_COUNT over millions of layers is below 1e23 s), so every plan of valid
#: inputs can be written; the limit catches values edited in
MAX_PLAN_S = 1e30
#: a link's bandwidth, GB/s: (1 kB/s, 1 PB/s]
MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS = 1e-6, 1e6
#: a link's latency, microseconds (1000 s)
MAX_LATENCY_US = 1e9
#: a device's peak rate, TFLOP/s: (1 kFLOP/s, 1 EFLOP/s]
MIN_TFLOPS, MAX_TFLOPS = 1e-9, 1e6
#: a device's ``achieved_fraction`` at least this (with the least peak, plans
#: of the largest models stay far below :data:`MAX_PLAN_S`)
MIN_ACHIEVED_FRACTION = 0.01
#: requests in one simulated serving run (``serve --num-requests``): 10**5 take
#: seconds per plan; far more would look like a hang
MAX_SIMULATED_REQUESTS = 100_000
#: a serving workload's arrival rate, requests per second: below the least, the simulated
#: arrivals lie so far apart that a step's milliseconds vanish in their float sum (1e-13/s
#: turned a TPOT of 11 ms into 1 ms); 1e-5/s, about one a day, is far below any served load
MIN_REQUEST_RATE, MAX_REQUEST_RATE = 1e-5, 1e9
#: an inference engine's time per step outside the kernels, milliseconds (a minute)
MAX_STEP_OVERHEAD_MS = 60_000.0
#: decoder layers a serving plan splits (its split tables grow with the square of the count)
MAX_SERVE_LAYERS = 4096
#: blocks of a transformer config (every layer table the search builds holds one row per block;
#: 100,000 plan in about 6 s, 500 times the deepest published model)
MAX_TRANSFORMER_BLOCKS = 100_000
#: a host CPU's optimizer throughput, parameters per second: [1e3, 1e15] (a thousand a second is
#: far below any CPU, and keeps a step of the largest model finite; 1e15 far above any)
MIN_PARAMS_PER_S, MAX_PARAMS_PER_S = 1e3, 1e15
#: parameters per gradient bucket (``--grad-bucket-params``; the plan format's maximum)
MAX_BUCKET_PARAMS = 1e15
#: counts such as a batch size, a hidden size or a sequence length (int32)
MAX_COUNT = 2**31 - 1
#: dimensions of one profiled sample (``profile --input-shape``; torch allows 64 with the batch)
MAX_INPUT_DIMS = 16
#: elements of one profiled batch (``profile``: batch size x input shape; 2**40 floats are 4 TiB)
MAX_PROFILE_ELEMENTS = 2**40


def out_of_range(value: Any, low: float, high: float, *, low_inclusive: bool = True) -> bool:
    """Whether ``value`` is not a finite real number in ``[low, high]``
    (``(low, high]`` when not ``low_inclusive``); booleans and non-numbers are
    out of range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        return True
    if not math.isfinite(v):
        return True
    return not ((v >= low if low_inclusive else v > low) and v <= high)


def range_text(low: float, high: float, *, low_inclusive: bool = True, unit: str = "") -> str:
    """The range in words: ``"a positive number <= 1e+06 GB/s"``,
    ``"a number >= 0 and <= 1e+09 us"``, ``"a positive number in [1e-06, 1e+06] GB/s"``."""
    unit = f" {unit}" if unit else ""
    if low == 0 and not low_inclusive:
        return f"a positive number <= {high:g}{unit}"
    if low == 0:
        return f"a number >= 0 and <= {high:g}{unit}"
    return f"a positive number in {'[' if low_inclusive else '('}{low:g}, {high:g}]{unit}"
