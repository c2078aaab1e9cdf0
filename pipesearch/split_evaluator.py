"""Exact simulated times of splits, memoised and evaluated in vectorised batches."""

from __future__ import annotations

import math

import numpy as np

from .costs import PipelineCosts
from .split_bounds import CHAIN_SCHEDULES
from .timemodel import evaluation_cost, graph_ends, iteration_time_s, times_of_ends


_BATCH = 256


class SplitEvaluator:
    """Exact times of splits, memoised, evaluated in vectorized batches."""

    def __init__(self, costs: PipelineCosts, schedule: str, pp: int, vp: int):
        self.costs, self.schedule, self.pp, self.vp = costs, schedule, pp, vp
        self.times: dict[tuple[int, ...], float] = {}
        self.feasible = 0  # finite times: a split over a whole GPU's memory (Mobius) is no work limit's split
        self.kept = None  # (splits, graph, node ends) of a pass run with keep (the starting splits)

    def batch_size(self) -> int:
        """Splits per vectorized evaluation: about two million graph nodes."""
        nodes = 4 * self.costs.pp * self.costs.num_micro_batches
        return int(max(1, min(_BATCH, 2_000_000 // max(nodes, 1))))

    def first_chunk(self) -> int:
        """Splits in the first evaluation of a batch of leaves (later ones
        double): about as many as cost one graph pass on their own
        (:func:`pipesearch.timemodel.evaluation_cost`), so a pass is never
        spent on one split while larger chunks cost little more."""
        fixed, per_split = evaluation_cost(self.schedule, self.pp, self.costs.num_micro_batches, self.vp)
        return int(min(self.batch_size(), max(1, fixed // max(per_split, 1))))

    def run(self, splits, keep: bool = False) -> None:
        """Evaluate the splits not evaluated yet. ``keep``: a chain
        schedule's splits that take one pass keep that pass's node ends
        (:attr:`kept`), for the critical paths of :func:`pipesearch.split_search._start_paths`."""
        todo = list(dict.fromkeys(tuple(b) for b in splits if tuple(b) not in self.times))
        if not todo:
            return
        step = self.batch_size()  # memory: about two million graph nodes per pass, whatever the count asked
        for at in range(0, len(todo), step):
            chunk = todo[at:at + step]
            bounds = np.array(chunk, dtype=np.int64)
            if bounds.shape[1] != self.costs.pp + 1 or np.any(bounds[:, 0] != 0) or np.any(
                    bounds[:, -1] != self.costs.num_layers) or np.any(np.diff(bounds, axis=1) < 1):
                raise RuntimeError(f"internal error: a split search evaluated {chunk[0]}, not a split of "
                                   f"{self.costs.num_layers} layers into {self.costs.pp} stages")
            times = self.costs.stage_times(bounds)
            if keep and len(todo) <= step and self.schedule in CHAIN_SCHEDULES and times.delayed_host_s is None:
                g, ends = graph_ends(self.schedule, self.pp, self.costs.num_micro_batches, self.vp, times)
                self.kept = (chunk, g, ends)
                t = times_of_ends(g, ends, times, self.pp)
            else:
                t = iteration_time_s(self.schedule, self.pp, self.costs.num_micro_batches, self.vp, times)
            t = [float(x) for x in np.atleast_1d(t)]
            self.times.update(zip(chunk, t))
            self.feasible += sum(1 for x in t if math.isfinite(x))

    def times_of(self, splits) -> list[float]:
        """The times of ``splits`` (evaluated by :meth:`run` where new)."""
        self.run(splits)
        return [self.times[tuple(b)] for b in splits]
