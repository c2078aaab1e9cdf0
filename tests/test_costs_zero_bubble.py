"""ZB-H1's count states in closed form (``costs._zero_bubble_counts``) and
the in-flight counts walked on plain order tuples
(``schedules.simultaneous_in_flight_of``), each against the walk of the
schedule's own action lists (``schedules.wgrad_states`` of ``schedules.build``; the in-flight walk
written out here)."""

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


def walked_in_flight(actions, h):
    """The simultaneous in-flight walk written out: per rank, per-stage
    counts in a dictionary, the rank's total their sum after every action,
    the counts at the first largest total."""
    n = 1 + max((a.stage for seq in actions for a in seq), default=-1)
    out = [0.0] * n
    for seq in actions:
        cur, best, at = {}, -1.0, {}
        for a in seq:
            if a.kind == "F":
                cur[a.stage] = cur.get(a.stage, 0.0) + 1.0
            elif a.kind == "I":
                cur[a.stage] -= 1.0 - h
            elif a.kind == "W":
                cur[a.stage] -= h
            elif a.kind == "B":
                cur[a.stage] -= 1.0
            total = sum(cur.values())
            if total > best + 1e-12:
                best, at = total, dict(cur)
        for stage, count in at.items():
            out[stage] = count
    return tuple(out)


@pytest.mark.parametrize("name,vs", [("gpipe", (1,)), ("1f1b", (1,)), ("zb-h1", (1,)),
                                     ("interleaved-1f1b", (1, 2, 3)), ("looped-bfs", (1, 2))])
def test_in_flight_of_orders_is_bit_for_bit_the_action_walk(name, vs):
    # one stage per rank: a deeper pipeline too (its walk stops at the rank's last forward)
    for p in (1, 2, 3, 4, 6) + ((13,) if vs == (1,) else ()):
        for v in vs:
            for m in (p, p + 1, 2 * p, 2 * p + 3):
                if name == "interleaved-1f1b" and m % p:
                    continue
                # the profiles' shares, and shares whose counts rise by less than the walk's 1e-12 tolerance
                for h in (1.0, 0.3, 0.0, 0.7, 0.2807017543859649, 1e-13, 1 - 1e-13):
                    try:
                        want = walked_in_flight(schedules.build(name, p, m, v), h)
                    except Exception as exc:  # refused by the builder: refused alike
                        with pytest.raises(type(exc)):
                            schedules.simultaneous_in_flight_of(name, p, m, v, h)
                        continue
                    assert schedules.simultaneous_in_flight_of(name, p, m, v, h) == want, (p, m, v, h)
                    assert schedules.simultaneous_in_flight(schedules.build(name, p, m, v), h) == want
