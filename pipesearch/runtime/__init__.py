"""Runtimes that execute pipesearch plans for real.

* :mod:`pipesearch.runtime.torch_pipeline`: ``torch.distributed.pipelining``
  on CPU processes talking over gloo (``run_plan``, ``run_plans``).

The modules import torch lazily; importing this package needs no torch.
"""

from __future__ import annotations

__all__ = ["RunConfig", "RunResult", "run_plan", "run_plans"]


def __getattr__(name):
    if name in __all__:
        from . import torch_pipeline

        return getattr(torch_pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
