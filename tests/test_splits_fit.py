"""``PipelineCosts.splits_fit``, the batched memory check of splits (the
local search's neighbours are checked with it), against each split checked
on its own the way a runtime would: every stage's range in its devices'
memory (one call per stage), every device's chunks together where devices
hold several stages, and for Mobius every GPU (a finite all-reduce term of
the split's stage times). Costs are those the search builds for real
points (captured from ``pipesearch plan`` runs): interleaved 1F1B with
several stages per device, and Mobius with its whole-GPU check."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from pipesearch import option_search, split_search
from pipesearch.cli import main

RUNS = {
    "interleaved": ["--model", "gpt3-1.3b", "--cluster", "1x8-rtx4090-pcie4", "-b", "64", "--schedule",
                    "interleaved-1f1b", "--vp", "2", "--pp", "4", "--tp", "1", "--recompute", "none"],
    "mobius": ["--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "16", "--seq-len", "2048",
               "--schedule", "mobius", "--pp", "2", "--tp", "4", "--vp", "2", "--recompute", "full",
               "--micro-batch-size", "1"],
}


def _costs_of(monkeypatch, flags, keep: int = 3):
    """The first ``keep`` points' costs the split search is given."""
    seen = []
    real = split_search.exact_split

    def spy(costs, *args, **kwargs):
        if len(seen) < keep:
            seen.append(costs)
        return real(costs, *args, **kwargs)

    monkeypatch.setattr(split_search, "exact_split", spy)
    monkeypatch.setattr(option_search, "exact_split", spy)
    result = CliRunner().invoke(main, ["plan", "-q", *flags])
    assert result.exit_code in (0, 2), result.output
    return seen


def _fits_alone(costs, bounds) -> bool:
    for s in range(costs.pp):
        if not bool(np.all(costs.fits(s, bounds[s], bounds[s + 1]))):
            return False
    if costs.chunk_states is not None and not bool(np.all(costs.device_fits(np.array(bounds)))):
        return False
    if costs.options is not None and costs.options.swap_in_s_per_param_byte is not None:
        return bool(np.all(np.isfinite(costs.stage_times(np.array(bounds)).allreduce_s)))
    return True


@pytest.mark.parametrize("run", sorted(RUNS))
def test_batched_check_equals_each_split_alone(run, monkeypatch):
    """200 random splits per captured point, plus the even split: the
    batched answer is each split's own, and both answers occur (a batch
    that checked only the stages, or only the first split, or dropped the
    device or GPU check, differs on some split here)."""
    costs_list = _costs_of(monkeypatch, RUNS[run])
    assert costs_list
    if run == "interleaved":  # several stages per device: the device check is exercised
        assert all(c.chunk_states is not None for c in costs_list)
    else:  # Mobius: the whole-GPU check is
        assert all(c.options.swap_in_s_per_param_byte is not None for c in costs_list)
    answers = set()
    for costs in costs_list:
        L, S = costs.num_layers, costs.pp
        rng = np.random.default_rng(L * 31 + S)
        splits = [tuple(int(x) for x in np.linspace(0, L, S + 1).round())]
        for _ in range(200):
            cut = np.sort(rng.choice(np.arange(1, L), S - 1, replace=False))
            splits.append((0, *map(int, cut), L))
        got = costs.splits_fit(np.array(splits))
        want = [_fits_alone(costs, b) for b in splits]
        assert got.tolist() == want
        assert [costs.split_fits(b) for b in splits] == want
        answers.update(want)
    assert answers == {True, False}
