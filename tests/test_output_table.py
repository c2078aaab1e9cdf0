"""The layers-per-stage cell of the plan and serve tables."""

from __future__ import annotations

from pipesearch.output_table import STAGE_COUNTS_WIDTH, stage_counts_label


def _expanded(label: str) -> list[int]:
    out: list[int] = []
    for part in label.split(","):
        count, _, times = part.partition("*")
        out += [int(count)] * int(times or 1)
    return out


def test_short_lists_stay_plain_and_long_ones_keep_every_stage_in_runs():
    assert stage_counts_label([14, 12, 6, 8]) == "14,12,6,8"
    assert stage_counts_label([12] * 8) == "12,12,12,12,12,12,12,12"  # 23 characters: as written
    pp64 = [2] + [1] * 126 + [2]  # 128 stages of a pp 64 x vp 2 plan of 130 layers
    assert stage_counts_label(pp64) == "2,1*126,2"
    mixed = [5, 5] + [3] * 20 + [4, 4, 4] + [7] + [2] * 40
    assert stage_counts_label(mixed) == "5,5,3*20,4*3,7,2*40"  # a run of two stays two numbers
    for counts in (pp64, mixed, list(range(1, 30))):
        label = stage_counts_label(counts)
        assert _expanded(label) == counts
    assert len(",".join(map(str, range(1, 30)))) > STAGE_COUNTS_WIDTH  # no runs: nothing to shorten
