"""Tests of pipesearch.schedules: builders, refusals, validation, torch CSV."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesearch.errors import InputError
from pipesearch.schedules import (
    SCHEDULES,
    Action,
    build,
    build_orders,
    format_order,
    from_torch_csv,
    gpipe,
    in_flight_peak,
    in_flight_peaks,
    interleaved_1f1b,
    looped_bfs,
    num_stages_of,
    one_f_one_b,
    stage_to_rank,
    to_torch_csv,
    validate,
    work_until_last_forward,
    zb_h1,
)


def _order(actions, rank):
    return " ".join(str(a) for a in actions[rank])


def test_registry_names():
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "looped-bfs", "mobius"}


def test_action_str_is_torch_form():
    assert str(Action("F", 0, 1)) == "0F1"
    assert str(Action("W", 12, 305)) == "12W305"


def test_gpipe_order():
    """GPipe: all forwards in micro-batch order, then all backwards in order."""
    a = gpipe(2, 3)
    assert _order(a, 0) == "0F0 0F1 0F2 0B0 0B1 0B2"
    assert _order(a, 1) == "1F0 1F1 1F2 1B0 1B1 1B2"


def test_1f1b_order():
    """1F1B, p=3, m=4. Rank r warms up with p-1-r forwards, then F/B pairs,
    then the remaining backwards:
    rank 0: 2 warm-up (F0 F1), pairs (F2 B0) (F3 B1), drain B2 B3;
    rank 1: 1 warm-up (F0), pairs (F1 B0) (F2 B1) (F3 B2), drain B3;
    rank 2: no warm-up, pairs (F0 B0) .. (F3 B3)."""
    a = one_f_one_b(3, 4)
    assert _order(a, 0) == "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3"
    assert _order(a, 1) == "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3"
    assert _order(a, 2) == "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"


def test_interleaved_order_megatron():
    """Interleaved 1F1B, p=2, m=4, v=2, derived from Megatron-LM's rules.

    Virtual micro-batch k: chunk c = (k mod p v) // p (backward: v-1-c),
    micro-batch (k // (p v)) p + k mod p, stage c p + r.
    Rank 0: warm-up = (v-1) p + 2 (p-1-r) = 2 + 2 = 4: k=0..3 ->
    (c0,mb0) (c0,mb1) (c1,mb0) (c1,mb1) = 0F0 0F1 2F0 2F1.
    Steady, k=0..3 (8 - 4 pairs): F(k+4), B(k):
    k=0: F4 = (c0, mb2) = 0F2; B0 = chunk 1-0 = 1 -> 2B0.
    k=1: F5 = 0F3; B1 = 2B1. k=2: F6 = (c1, mb2) = 2F2; B2 = chunk 1-1=0 -> 0B0.
    k=3: F7 = 2F3; B3 = 0B1. Cool-down k=4..7: 2B2 2B3 0B2 0B3.
    Rank 1: warm-up = 2 + 0 = 2: 1F0 1F1; steady k=0..5: F(k+2), B(k):
    (3F0, 3B0) (3F1, 3B1) (1F2, 1B0) (1F3, 1B1) (3F2, 3B2) (3F3, 3B3);
    cool-down k=6,7: 1B2 1B3."""
    a = interleaved_1f1b(2, 4, 2)
    assert _order(a, 0) == "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"
    assert _order(a, 1) == "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"
    assert stage_to_rank(a) == {0: 0, 1: 1, 2: 0, 3: 1}


def test_zb_h1_order():
    """ZB-H1, p=3, m=4. Rank r: p-1-r warm-up forwards, then F/I pairs, and
    the W of micro-batch j right after the I of micro-batch j + r.
    rank 0 (W delay 0): F0 F1 | F2 I0 W0 | F3 I1 W1 | I2 W2 | I3 W3
    rank 1 (delay 1):   F0 | F1 I0 | F2 I1 W0 | F3 I2 W1 | I3 W2 | W3
    rank 2 (delay 2):   F0 I0 | F1 I1 | F2 I2 W0 | F3 I3 W1 | W2 W3"""
    a = zb_h1(3, 4)
    assert _order(a, 0) == "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3"
    assert _order(a, 1) == "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3"
    assert _order(a, 2) == "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3"


def test_looped_bfs_order():
    """Looped BFS, p=2, m=2, v=2: rank 0 runs stages 0 and 2. Forwards stage by
    stage (all micro-batches), then backwards stage by stage in reverse with
    micro-batches reversed (torch ScheduleLoopedBFS)."""
    a = looped_bfs(2, 2, 2)
    assert _order(a, 0) == "0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0"
    assert _order(a, 1) == "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0"


# ------------------------------------------------------------ refusals


def test_gpipe_allows_fewer_microbatches_than_stages():
    a = gpipe(4, 2)
    validate(a, 4, 2)
    validate(looped_bfs(4, 2, 2), 8, 2)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_1f1b_style_refuses_m_below_p(name):
    with pytest.raises(InputError, match=r"m=3 micro-batches is fewer than p=4.*Schedule1F1B"):
        build(name, 4, 3)


def test_interleaved_refuses_m_not_multiple_of_p():
    with pytest.raises(InputError, match=r"m=6 .*not a multiple of p=4"):
        interleaved_1f1b(4, 6, 2)
    with pytest.raises(InputError, match="fewer than p"):
        interleaved_1f1b(4, 2, 2)


@pytest.mark.parametrize(
    "call",
    [
        lambda: gpipe(0, 4),
        lambda: gpipe(2, 0),
        lambda: one_f_one_b(-1, 4),
        lambda: interleaved_1f1b(2, 4, 0),
        lambda: looped_bfs(2, 4, 0),
        lambda: gpipe(2.0, 4),
    ],
)
def test_bad_sizes_refused(call):
    with pytest.raises(InputError, match=">= 1|integer"):
        call()


def test_build_refusals():
    with pytest.raises(InputError, match="unknown schedule 'pipedream'"):
        build("pipedream", 2, 4)
    with pytest.raises(InputError, match="one stage per rank, got v=2"):
        build("1f1b", 2, 4, v=2)
    assert build("interleaved-1f1b", 2, 4, v=2) == interleaved_1f1b(2, 4, 2)
    assert num_stages_of("looped-bfs", 4, 3) == 12
    assert num_stages_of("1f1b", 4) == 4


# ------------------------------------------------------------ memory


@pytest.mark.parametrize("p,m", [(1, 1), (2, 5), (4, 4), (4, 9), (8, 16)])
def test_in_flight_gpipe_m_1f1b_p_minus_s(p, m):
    """GPipe keeps every micro-batch alive until the backward phase: m per
    stage. 1F1B stage s runs p-1-s warm-up forwards plus one more forward
    before its first backward: min(m, p - s) = p - s (m >= p here)."""
    assert in_flight_peaks(gpipe(p, m)) == (m,) * p
    assert in_flight_peaks(one_f_one_b(p, m)) == tuple(min(m, p - s) for s in range(p))


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (6, 13)])
def test_zb_h1_peak_memory_equals_1f1b(p, m):
    """ZB-H1's W of micro-batch j runs after the I of j + r on rank r, so every
    rank holds at most p micro-batches (released at W); 1F1B's worst stage
    (stage 0) also holds p. Qi et al.: the maximum over workers equals 1F1B's."""
    zb = in_flight_peaks(zb_h1(p, m))
    ofob = in_flight_peaks(one_f_one_b(p, m))
    assert max(zb) == max(ofob) == p
    assert zb == (p,) * p


def test_in_flight_peak_single_stage():
    assert in_flight_peak(one_f_one_b(4, 8), 1) == 3


# ------------------------------------------------------------ validate


def test_validate_missing_backward():
    a = [list(r) for r in one_f_one_b(2, 2)]
    a[1].remove(Action("B", 1, 1))
    with pytest.raises(InputError, match=r"stage 1, micro-batch 1 \(rank 1\): missing backward 1B1"):
        validate(a, 2, 2)


def test_validate_duplicate_and_range():
    a = [list(r) for r in gpipe(2, 2)]
    a[0].insert(1, Action("F", 0, 0))
    with pytest.raises(InputError, match="second 0F0"):
        validate(a, 2, 2)
    with pytest.raises(InputError, match="micro-batch 5 outside 0..1"):
        validate([[Action("F", 0, 5)]], 1, 2)
    with pytest.raises(InputError, match="stage 3 outside"):
        validate([[Action("F", 3, 0)]], 2, 1)
    with pytest.raises(InputError, match="kind 'X'"):
        validate([[Action("X", 0, 0)]], 1, 1)


def test_validate_local_order():
    with pytest.raises(InputError, match="backward 0B0 at position 0 comes before its forward"):
        validate([[Action("B", 0, 0), Action("F", 0, 0)]], 1, 1)
    with pytest.raises(InputError, match="0W0 at position 1 comes before 0I0"):
        validate([[Action("F", 0, 0), Action("W", 0, 0), Action("I", 0, 0)]], 1, 1)
    with pytest.raises(InputError, match="has 0I0 but no 0W0"):
        validate([[Action("F", 0, 0), Action("I", 0, 0)]], 1, 1)
    with pytest.raises(InputError, match="mixes a full backward"):
        validate([[Action("F", 0, 0), Action("I", 0, 0), Action("B", 0, 0)]], 1, 1)


def test_validate_stage_on_two_ranks():
    a = [[Action("F", 0, 0)], [Action("B", 0, 0)]]
    with pytest.raises(InputError, match="stage 0 already runs on rank 0"):
        validate(a, 1, 1)


def test_validate_deadlock_reports_who_waits():
    """p=2, m=2. Rank 0: F0 B0 F1 B1; rank 1: F0 F1 B0 B1.
    Rank 0's B0 needs rank 1's B0, which comes after rank 1's F1, which needs
    rank 0's F1, which comes after rank 0's B0: a cycle."""
    a = [
        [Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1)],
        [Action("F", 1, 0), Action("F", 1, 1), Action("B", 1, 0), Action("B", 1, 1)],
    ]
    with pytest.raises(InputError) as exc:
        validate(a, 2, 2)
    msg = str(exc.value)
    assert "deadlock" in msg
    assert "rank 0 waits at position 1 (0B0) for 1B0" in msg
    assert "rank 1 waits at position 1 (1F1) for 0F1" in msg


def test_validate_missing_stage():
    with pytest.raises(InputError, match="stage 1 has no actions"):
        validate([[Action("F", 0, 0), Action("B", 0, 0)]], 2, 1)


# ------------------------------------------------------------ torch CSV


def test_torch_csv_exact_text():
    """torch's _dump_csv writes each rank's row with csv.writer (\\r\\n line
    ends), cells str(_Action) = stage + type + micro-batch."""
    assert to_torch_csv(gpipe(2, 2)) == "0F0,0F1,0B0,0B1\r\n1F0,1F1,1B0,1B1\r\n"


@pytest.mark.parametrize(
    "actions",
    [one_f_one_b(4, 8), interleaved_1f1b(4, 8, 2), zb_h1(4, 8), looped_bfs(4, 8, 3)],
    ids=["1f1b", "interleaved", "zb-h1", "looped-bfs"],
)
def test_torch_csv_round_trip(actions):
    text = to_torch_csv(actions)
    assert from_torch_csv(text) == actions
    assert len(text.splitlines()) == 4


def test_from_torch_csv_skips_idle_and_rejects_comms():
    """torch writes None (idle step) as an empty cell; from_str returns None."""
    assert from_torch_csv("0F0, ,0B0\n") == ((Action("F", 0, 0), Action("B", 0, 0)),)
    with pytest.raises(InputError, match=r"row 0 \(rank\), column 1: '0SEND_F0' is not a compute action"):
        from_torch_csv("0F0,0SEND_F0\n")
    with pytest.raises(InputError, match="not a compute action"):
        from_torch_csv("0UNSHARD\n")
    with pytest.raises(InputError, match="'F0' is not an action"):
        from_torch_csv("F0\n")


def test_format_order():
    text = format_order(gpipe(2, 2))
    assert text.splitlines()[0] == "rank 0: 0F0 0F1 0B0 0B1"


# ------------------------------------------------------------ property


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 24), v=st.integers(1, 4), name=st.sampled_from(sorted(SCHEDULES)))
def test_every_builder_validates_or_refuses_as_documented(p, m, v, name):
    vv = v if name in ("interleaved-1f1b", "looped-bfs") else 1
    refuse = (name in ("1f1b", "zb-h1", "interleaved-1f1b") and m < p) or (name == "interleaved-1f1b" and m % p)
    if refuse:
        with pytest.raises(InputError):
            build(name, p, m, vv)
        return
    a = build(name, p, m, vv)
    S = num_stages_of(name, p, vv)
    assert len(a) == p
    validate(a, S, m)
    per_mb = 3 if name == "zb-h1" else 2
    assert sum(len(r) for r in a) == per_mb * S * m
    assert stage_to_rank(a) == {s: s % p for s in range(S)}


def _counted_until_last_forward(name, p, m, v):
    """Walk the built action lists: each rank's actions up to and including
    the forward of micro-batch m - 1 on its first stage."""
    actions = build(name, p, m, v)
    counts = {k: [0] * num_stages_of(name, p, v) for k in "FBIW"}
    for r, seq in enumerate(actions):
        for a in seq:
            counts[a.kind][a.stage] += 1
            if a.kind == "F" and a.stage == r and a.microbatch == m - 1:
                break
    return {k: tuple(c) for k, c in counts.items()}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_work_until_last_forward_counts_the_built_order(name):
    vs = (1, 2, 3) if name in ("interleaved-1f1b", "looped-bfs") else (1,)
    checked = 0
    for p in range(1, 6):
        for m in range(1, 17):
            for v in vs:
                try:
                    expected = _counted_until_last_forward(name, p, m, v)
                except InputError:
                    with pytest.raises(InputError):
                        work_until_last_forward(name, p, m, v)
                    continue
                assert work_until_last_forward(name, p, m, v) == expected, (p, m, v)
                checked += 1
    assert checked > 20


def test_work_until_last_forward_by_hand():
    # 1F1B p=4, m=6, rank 1: 2 warm-up F, then (F, B) pairs; F of mb 5 is the
    # 4th pair's F, after 3 B: F 6, B 3 = m - p + r
    assert work_until_last_forward("1f1b", 4, 6)["B"] == (2, 3, 4, 5)
    # ZB-H1 p=3, m=5: I m-p+r; W of mb j after I of j+r: max(m-p, 0) = 2 before the last F
    counts = work_until_last_forward("zb-h1", 3, 5)
    assert counts["I"] == (2, 3, 4) and counts["W"] == (2, 2, 2) and counts["B"] == (0, 0, 0)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_build_orders_are_the_built_actions(name):
    v = 2 if name in ("interleaved-1f1b", "looped-bfs") else 1
    for p, m in [(1, 1), (2, 4), (3, 6), (4, 8)]:
        actions = build(name, p, m, v)
        assert build_orders(name, p, m, v) == tuple([(a.kind, a.stage, a.microbatch) for a in seq] for seq in actions)
    with pytest.raises(InputError):
        build_orders(name, 0, 4, v)


@pytest.mark.parametrize("name", [n for n in SCHEDULES if n != "roundpipe"])
def test_check_refuses_exactly_what_build_refuses(name):
    """``check`` (the plan validator's test that a schedule can run) raises
    for the same ``(p, m, v)`` as ``build``, over counts that cross each
    builder's rules (m below p, m not a multiple of p for interleaved 1F1B,
    v other than 1 for one-stage schedules, zero counts)."""
    from pipesearch.schedules import check

    for p, m, v in itertools.product((0, 1, 2, 3, 4), (0, 1, 2, 3, 4, 6, 8), (0, 1, 2, 3)):
        try:
            build(name, p, m, v)
            built = None
        except InputError as exc:
            built = str(exc)
        try:
            check(name, p, m, v)
            checked = None
        except InputError as exc:
            checked = str(exc)
        assert checked == built, (p, m, v)


@pytest.mark.parametrize("name", [n for n in SCHEDULES if n != "roundpipe"])
def test_torch_csv_of_plain_orders_equals_that_of_actions(name):
    v = 2 if name in ("interleaved-1f1b", "looped-bfs", "mobius") else 1
    assert to_torch_csv(build_orders(name, 4, 8, v)) == to_torch_csv(build(name, 4, 8, v))


@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (3, 5), (4, 4), (5, 9)])
def test_zb_h1_weight_grads_after_last_input_grad_count_the_order(p, m):
    """Every rank's W after its last I in zb_h1's own action order (counted
    here from the order) is what the bounds read from
    schedules.zb_h1_weight_grads_after_last_input_grad."""
    from pipesearch.schedules import _zb_h1_order, zb_h1_weight_grads_after_last_input_grad

    order = _zb_h1_order(p, m)
    for r in range(p):
        kinds = [a[0] for a in order(r)]
        last_i = max(k for k, x in enumerate(kinds) if x == "I")
        assert kinds[last_i + 1:].count("W") == len(kinds) - last_i - 1 == zb_h1_weight_grads_after_last_input_grad(r)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_one_stage_codes_from_closed_forms_are_the_walked_orders(name, p):
    """The codes written from each schedule's closed form are those of
    walking its order one action at a time (a warm-up count off by one, or
    ZB-H1's ``W`` placed after the wrong ``I``, moves a code), and the
    refusals are the builder's."""
    import numpy as np

    from pipesearch.schedules import _codes_of, build_orders, one_stage_codes

    for m in [*range(1, p + 9), 3 * p + 1, 64]:
        if name != "gpipe" and m < p:
            with pytest.raises(InputError):
                one_stage_codes(name, p, m)
            continue
        got = one_stage_codes(name, p, m)
        want = _codes_of(name, 1, build_orders(name, p, m))
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), (name, p, m)
