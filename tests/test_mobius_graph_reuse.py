"""The Mobius graphs kept for reuse (timemodel._mobius_build): a kept graph
is the one its arguments build, and the kept graphs stay within their node
budget."""

import numpy as np

from pipesearch import timemodel


def _same(a, b) -> bool:
    (ga, ia), (gb, ib) = a, b
    return (ia == ib and ga.level_starts == gb.level_starts
            and all(np.array_equal(getattr(ga, f), getattr(gb, f))
                    for f in ("col", "sends", "pred1", "pred2", "last_of_rank")))


def test_reused_graphs_are_the_built_ones_and_stay_within_the_budget(monkeypatch):
    monkeypatch.setattr(timemodel, "_MOBIUS_GRAPHS", timemodel._GraphsKept(lambda: timemodel.MOBIUS_GRAPH_NODES_KEPT))
    keys = [(2, 4, 2, (0, 1), ()), (2, 4, 2, (0, 0), ()),  # one PCIe switch shared or one each
            (2, 4, 2, (0, 1), (True, False, False, False)), (2, 4, 2, (0, 1), (False, False, False, True)),
            (3, 6, 2, (0, 1, 2), ())]
    built = [timemodel._mobius_built(*k) for k in keys]
    assert not _same(built[0], built[1]) and not _same(built[2], built[3])  # the arguments all matter
    budget = len(built[4][0].col) + len(built[0][0].col)  # room for the largest graph and one more
    monkeypatch.setattr(timemodel, "MOBIUS_GRAPH_NODES_KEPT", budget)
    for _ in range(2):
        for k, want in zip(keys, built):
            assert _same(timemodel._mobius_build(*k), want)
            kept = timemodel._MOBIUS_GRAPHS
            assert sum(len(g.col) for g, _ in kept.graphs.values()) == kept.nodes <= budget
    assert len(timemodel._MOBIUS_GRAPHS.graphs) < len(keys)  # some were dropped
