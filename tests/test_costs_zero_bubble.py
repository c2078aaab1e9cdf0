"""ZB-H1's count states in closed form (``costs._zero_bubble_counts``) and
the in-flight counts walked on plain order tuples
(``schedules.simultaneous_in_flight_of``), each against the walk of the
schedule's own action lists (``schedules.wgrad_states`` /
``simultaneous_in_flight`` of ``schedules.build``)."""

from __future__ import annotations

import numpy as np
import pytest

from pipesearch import costs, schedules


def walked_counts(p: int, m: int):
    states = schedules.wgrad_states(schedules.build("zb-h1", p, m, 1))
    Q = max(len(x) for x in states)
    A, B = np.zeros((p, Q)), np.zeros((p, Q))
    for k, xs in enumerate(states):
        for q, (a, b) in enumerate(xs):
            A[k, q], B[k, q] = a, b
    return A, B


@pytest.mark.parametrize("p", range(1, 13))
def test_closed_form_counts_are_the_walked_ones(p):
    for m in range(p, 2 * p + 3):
        A, B = costs._zero_bubble_counts(p, m)
        wa, wb = walked_counts(p, m)
        assert A.shape == wa.shape and np.array_equal(A, wa) and np.array_equal(B, wb), (p, m)
        assert not A.flags.writeable


def test_closed_form_by_hand():
    """p = 3: rank 0 holds (3 before I, 0 after) or (2, 1); rank 2 (1, 2) or (0, 3)."""
    A, B = costs._zero_bubble_counts(3, 6)
    assert A.tolist() == [[2, 3], [1, 2], [0, 1]]
    assert B.tolist() == [[1, 0], [2, 1], [3, 2]]


def test_fewer_micro_batches_than_ranks_is_refused_as_before():
    from pipesearch.errors import InputError

    with pytest.raises(InputError):
        costs._zero_bubble_counts(4, 3)


@pytest.mark.parametrize("name,vs", [("gpipe", (1,)), ("1f1b", (1,)), ("zb-h1", (1,)),
                                     ("interleaved-1f1b", (1, 2, 3)), ("looped-bfs", (1, 2))])
def test_in_flight_of_orders_is_bit_for_bit_the_action_walk(name, vs):
    for p in (1, 2, 3, 4, 6):
        for v in vs:
            for m in (p, p + 1, 2 * p, 2 * p + 3):
                if name == "interleaved-1f1b" and m % p:
                    continue
                for h in (1.0, 0.3, 0.0, 0.7):
                    try:
                        want = schedules.simultaneous_in_flight(schedules.build(name, p, m, v), h)
                    except Exception as exc:  # refused by the builder: refused alike
                        with pytest.raises(type(exc)):
                            schedules.simultaneous_in_flight_of(name, p, m, v, h)
                        continue
                    assert schedules.simultaneous_in_flight_of(name, p, m, v, h) == want, (p, m, v, h)
