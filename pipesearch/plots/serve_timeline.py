"""Timeline of a simulated serving run: one row per pipeline stage, one bar
per micro-batch step, coloured by micro-batch slot, hatched when the step
carries prompt (prefill) tokens."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from ..errors import InputError
from .common import figure, save

_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
            "#CCB974", "#64B5CD")


def plot_serve_timeline(events, num_stages: int, path: str | PathLike[str], title: str = "") -> Path:
    """Draw ``events`` (:class:`~pipesearch.serve.simulate.StageEvent`) to
    ``path`` (png, svg or pdf). Raises InputError when there are no events."""
    if not events:
        raise InputError(f"{path}: no simulated steps to draw")
    with figure(9.0, 0.45 * num_stages + 1.4) as fig:
        ax = fig.add_subplot(1, 1, 1)
        for ev in events:
            ax.barh(ev.stage, ev.end_s - ev.start_s, left=ev.start_s, height=0.8,
                    color=_COLOURS[ev.slot % len(_COLOURS)], edgecolor="black", linewidth=0.3,
                    hatch="///" if ev.prefill_tokens else None)
        ax.set_yticks(range(num_stages))
        ax.set_yticklabels([f"stage {s}" for s in range(num_stages)])
        ax.invert_yaxis()
        ax.set_xlabel("time (s); colour: micro-batch slot; hatched: carries prompt tokens")
        ax.set_title(title or "simulated serving timeline")
        fig.tight_layout()
        return save(fig, path)
