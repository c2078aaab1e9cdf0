"""Tests of the exact stage split (pipesearch.partition).

Every expected value is derived independently of the code under test: by hand
in the docstring, or by brute force over all splits with the objective written
out from the docstring of ``pipesearch/costs.py``
(:func:`helpers.reference_iteration_time`, which does not call
``PipelineCosts``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from helpers import (CostSpec, all_splits, reference_iteration_time, reference_optimum, reference_stage_terms, tiles,
                     time_limit)
from pipesearch.partition import balanced_split, even_split, exhaustive_split, min_max_split, optimal_split

INF = math.inf


def sizes(bounds):
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


# --------------------------------------------------------------- strategies


def _per_stage(values, P):
    """One value per stage: often the same for all stages (so stages that
    differ in a single term are common), else drawn per stage."""
    return st.one_of(values.map(lambda v: [v] * P), st.lists(values, min_size=P, max_size=P))


@st.composite
def dyadic_specs(draw, max_layers=10, max_stages=4, memory=None):
    """Random instances whose numbers are small multiples of 1/4 and whose
    bandwidths are powers of two, so that every sum the objective takes is
    exact in floating point: the optimum is then a well-defined number and
    ties are frequent (the hard case for strict / non-strict limits)."""
    L = draw(st.integers(1, max_layers))
    P = draw(st.integers(1, min(max_stages, L)))
    q = st.integers(0, 16).map(lambda x: x / 4)
    per_layer = lambda: draw(st.lists(q, min_size=L, max_size=L))  # noqa: E731
    per_stage = lambda s: draw(_per_stage(s, P))  # noqa: E731
    use_memory = draw(st.booleans()) if memory is None else memory
    return CostSpec(
        times=per_layer(), pp=P, m=draw(st.integers(1, 16)),
        params=draw(st.lists(st.sampled_from([0, 0, 0.5, 1, 2, 4]), min_size=L, max_size=L)),
        saved=per_layer(), outputs=per_layer(),
        capacity=per_stage(st.integers(0, 80).map(float)) if use_memory else INF,
        in_flight=draw(st.sampled_from(["gpipe", "1f1b"])),
        time_scale=per_stage(st.sampled_from([1.0, 1.0, 0.5, 2.0, 1.5])),
        link_bandwidth=per_stage(st.sampled_from([1.0, 2.0, 4.0, 0.5, INF])),
        link_latency=per_stage(st.sampled_from([0.0, 0.25, 1.0])),
        allreduce_per_byte=per_stage(st.sampled_from([0.0, 0.5, 1.0, 4.0])),
        allreduce_fixed=per_stage(st.sampled_from([0.0, 0.25, 2.0])),
        state_bytes_per_param_byte=draw(st.sampled_from([0.0, 1.0, 4.0])),
        grad_bytes_per_param_byte=draw(st.sampled_from([0.5, 1.0])),
    )


@st.composite
def realistic_specs(draw, max_layers=10, max_stages=4):
    """Random instances at the scales of real profiles: milliseconds, 10^8
    bytes, 1-10 GB/s links with microsecond latencies, 16 GB devices."""
    L = draw(st.integers(1, max_layers))
    P = draw(st.integers(1, min(max_stages, L)))
    unit = st.floats(0, 1, allow_nan=False)
    layer = lambda scale: [x * scale for x in draw(st.lists(unit, min_size=L, max_size=L))]  # noqa: E731
    per_stage = lambda s: draw(_per_stage(s, P))  # noqa: E731
    use_memory = draw(st.booleans())
    return CostSpec(
        times=layer(draw(st.sampled_from([1e-4, 1e-2, 1.0]))), pp=P, m=draw(st.sampled_from([1, 2, 5, 32, 512])),
        params=layer(4e8), saved=layer(5e8), outputs=layer(2e8),
        capacity=per_stage(st.floats(1e8, 8e9)) if use_memory else INF,
        in_flight=draw(st.sampled_from(["gpipe", "1f1b"])),
        time_scale=per_stage(st.sampled_from([1.0, 0.37, 2.9])),
        link_bandwidth=per_stage(st.sampled_from([1.25e9, 1e10, 2.5e10])),
        link_latency=per_stage(st.sampled_from([0.0, 1e-5, 5e-5])),
        allreduce_per_byte=per_stage(st.sampled_from([0.0, 1.5e-9, 2e-10])),
        allreduce_fixed=per_stage(st.sampled_from([0.0, 6e-5])),
        state_bytes_per_param_byte=4.0, grad_bytes_per_param_byte=draw(st.sampled_from([0.5, 1.0])),
    )


# --------------------------------------------------------------- exactness


def _check_result(spec, result):
    """The result is a valid split that fits, and its time is its objective."""
    costs = spec.costs()
    assert tiles(result.bounds, spec.num_layers) and len(result.bounds) == spec.pp + 1
    assert costs.split_fits(result.bounds)
    assert result.iteration_time_s == costs.iteration_time_s(result.bounds)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dyadic_specs())
def test_optimal_equals_exhaustive_exact_arithmetic(spec):
    """With exactly representable inputs the optimum is one number: the DP
    scan must hit it, not just come close; both say None when nothing fits."""
    costs = spec.costs()
    with time_limit(3, "optimal_split"):
        opt = optimal_split(costs)
    ex = exhaustive_split(costs)
    assert (opt is None) == (ex is None)
    if opt is not None:
        _check_result(spec, opt)
        assert opt.iteration_time_s == ex.iteration_time_s


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(realistic_specs())
def test_optimal_equals_exhaustive_real_scales(spec):
    costs = spec.costs()
    with time_limit(3, "optimal_split"):
        opt = optimal_split(costs)
    ex = exhaustive_split(costs)
    assert (opt is None) == (ex is None)
    if opt is not None:
        _check_result(spec, opt)
        # exhaustive is the minimum of the same function over a superset
        assert opt.iteration_time_s >= ex.iteration_time_s
        assert opt.iteration_time_s == pytest.approx(ex.iteration_time_s, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(dyadic_specs(memory=True))
def test_memory_limited_instances_agree_with_reference(spec):
    """Against the brute force written from the docstring formula (not
    ``PipelineCosts``): same feasibility, same optimum, and the returned split
    is one of the optimal ones."""
    ref = reference_optimum(spec)
    opt = optimal_split(spec.costs())
    assert (opt is None) == (ref is None)
    if ref is not None:
        best, argmins = ref
        assert opt.iteration_time_s == best
        assert opt.bounds in argmins


@settings(max_examples=40, deadline=None)
@given(dyadic_specs(max_layers=7, max_stages=4))
def test_cost_model_objective_is_the_docstring_formula(spec):
    """``PipelineCosts.iteration_time_s`` and ``split_fits`` equal the formula
    ``T = sum_k a_k + max_k ((m-1) a_k + r_k)`` and ``memory <= capacity``
    on every split."""
    costs = spec.costs()
    for bounds in all_splits(spec.num_layers, spec.pp):
        assert costs.iteration_time_s(bounds) == reference_iteration_time(spec, bounds)
        assert costs.split_fits(bounds) == all(f for *_, f in reference_stage_terms(spec, bounds))


@pytest.mark.parametrize("attribute,values", [
    ("link_latency", [0.0, 0.5, 2.0, 8.0]),
    ("link_bandwidth", [INF, 1.0, 0.25, 4.0]),
    ("allreduce_fixed", [0.0, 1.0, 4.0, 16.0]),
    ("allreduce_per_byte", [0.0, 0.5, 2.0, 8.0]),
    ("time_scale", [1.0, 0.5, 2.0, 4.0]),
    ("capacity", [INF, 12.0, 20.0, 40.0]),
])
def test_stages_that_differ_in_one_term_only(attribute, values):
    """Stages identical but for one term (one stage's link latency, one
    stage's all-reduce, ...): an implementation that shares per-stage work
    between "equal" stages must still tell them apart. 40 random chains per
    term, each against the exhaustive search."""
    rng = np.random.default_rng(abs(hash(attribute)) % 2**32)
    for _ in range(40):
        L = int(rng.integers(3, 10))
        P = int(rng.integers(2, min(4, L) + 1))
        per_stage = [values[0]] * P
        per_stage[int(rng.integers(P))] = values[int(rng.integers(1, len(values)))]
        kwargs = dict(link_latency=0.25, link_bandwidth=2.0, allreduce_fixed=0.5, allreduce_per_byte=1.0,
                      time_scale=1.0, capacity=INF)
        kwargs[attribute] = per_stage
        spec = CostSpec(times=list(rng.integers(0, 9, L) / 2), pp=P, m=int(rng.integers(1, 9)),
                        params=list(rng.integers(0, 3, L)), saved=list(rng.integers(0, 4, L)),
                        outputs=list(rng.integers(0, 9, L)), state_bytes_per_param_byte=1.0,
                        in_flight=[2] * P, **kwargs)
        costs = spec.costs()
        with time_limit(3, "optimal_split"):
            opt = optimal_split(costs)
        ex = exhaustive_split(costs)
        assert (opt is None) == (ex is None), spec
        if opt is not None:
            assert opt.iteration_time_s == ex.iteration_time_s, spec


REFERENCE_CASES = [
    # 5 layers, 3 stages, links with latency and finite bandwidth, all-reduce on every stage
    CostSpec(times=[1.0, 3.0, 2.0, 2.5, 0.5], pp=3, m=6, params=[1, 0, 2, 0, 3], outputs=[4, 2, 8, 1, 1],
             saved=[1, 1, 1, 1, 1], capacity=[40, 40, 40], link_bandwidth=[2.0, 4.0, 1.0],
             link_latency=[0.25, 0.5, 0.0], allreduce_per_byte=[0.5, 1.0, 0.25], allreduce_fixed=[0.25, 0.0, 1.0]),
    # device speeds differ per stage, GPipe memory with a binding cap
    CostSpec(times=[2, 2, 1, 1, 3, 1, 2], pp=3, m=4, params=[0, 1, 0, 1, 0, 1, 0], saved=[2, 1, 3, 1, 1, 2, 1],
             outputs=[1, 1, 1, 1, 1, 1, 1], capacity=[24, 24, 24], in_flight="gpipe", time_scale=[1.0, 0.5, 2.0],
             link_bandwidth=[1.0, 1.0, 1.0], link_latency=[0.125, 0.125, 0.125],
             allreduce_per_byte=[1.0, 1.0, 1.0], allreduce_fixed=[0.5, 0.5, 0.5], state_bytes_per_param_byte=2),
    # m = 1: no bottleneck term beyond the all-reduce
    CostSpec(times=[4, 1, 1, 1, 4], pp=2, m=1, params=[8, 0, 0, 0, 1], outputs=[1, 9, 9, 1, 1],
             link_bandwidth=1.0, link_latency=0.5, allreduce_per_byte=1.0, allreduce_fixed=0.0),
]


@pytest.mark.parametrize("spec", REFERENCE_CASES)
def test_optimum_matches_formula_brute_force(spec):
    best, argmins = reference_optimum(spec)
    opt = optimal_split(spec.costs())
    assert opt.iteration_time_s == pytest.approx(best, rel=1e-12)
    assert reference_iteration_time(spec, opt.bounds) == pytest.approx(best, rel=1e-12)


# --------------------------------------------------------------- by hand


def test_small_case_by_hand():
    """Layers of fwd+bwd time 1, 2, 3 s, two stages, m = 3 micro-batches.
    The link after stage 0 has latency 0.25 s and infinite bandwidth, so
    stage 0 pays p2p = 2 * 0.25 = 0.5 s per micro-batch. Parameters 1, 0, 1
    bytes; each stage's all-reduce costs 1 s/byte + 0.5 s.

    Split (1 | 2,3): a = (1 + 0.5, 5) = (1.5, 5); r = (1.5, 1.5);
        T = 6.5 + max(2*1.5 + 1.5, 2*5 + 1.5) = 6.5 + 11.5 = 18.
    Split (1,2 | 3): a = (3 + 0.5, 3) = (3.5, 3); r = (1.5, 1.5);
        T = 6.5 + max(2*3.5 + 1.5, 2*3 + 1.5) = 6.5 + 8.5 = 15.
    The optimum is 15 s at boundaries (0, 2, 3).
    """
    spec = CostSpec(times=[1, 2, 3], pp=2, m=3, params=[1, 0, 1], outputs=[7, 7, 7],
                    link_latency=0.25, allreduce_per_byte=1.0, allreduce_fixed=0.5)
    costs = spec.costs()
    assert costs.iteration_time_s((0, 1, 3)) == 18.0
    assert costs.iteration_time_s((0, 2, 3)) == 15.0
    res = optimal_split(costs)
    assert res.bounds == (0, 2, 3) and res.iteration_time_s == 15.0


def test_equal_stages_give_the_gpipe_formula():
    """4 layers of 1 s on 4 stages, free links, dp = 1: T = (m + p - 1) t =
    (8 + 4 - 1) * 1 = 11 s (Huang et al. 2019)."""
    res = optimal_split(CostSpec(times=[1, 1, 1, 1], pp=4, m=8).costs())
    assert res.bounds == (0, 1, 2, 3, 4) and res.iteration_time_s == 11.0


def test_link_cost_moves_the_cut_to_the_small_tensor():
    """Times 1,1,1,1 into 2 stages, m = 2, link 1 byte/s. Outputs 100, 1, 100:
    cutting after layer 2 (output 1 byte) costs 2 * 1 = 2 s on stage 0, so
    a = (2 + 2, 2), T = 6 + 4 = 10; cutting after layer 1 or 3 sends 100 bytes
    (200 s). The optimum is (0, 2, 4) at 10 s."""
    res = optimal_split(CostSpec(times=[1, 1, 1, 1], pp=2, m=2, outputs=[100, 1, 100, 0],
                                 link_bandwidth=1.0).costs())
    assert res.bounds == (0, 2, 4) and res.iteration_time_s == 10.0


# --------------------------------------------------------------- memory


def test_memory_cap_rules_out_the_even_split():
    """8 identical layers (fwd+bwd 1 s each), no weights, 1.25 units of saved
    activations per layer per micro-batch; 1F1B, pp = 4, m = 8, 9 units per
    device. 1F1B keeps min(m, p - s) = 4, 3, 2, 1 micro-batches on stages
    0..3, so a stage of n layers needs 5n, 3.75n, 2.5n, 1.25n units:

    * the even split (2,2,2,2) needs 2 * 1.25 * 4 = 10 > 9 on stage 0:
      infeasible;
    * stage 0 can hold 1 layer (5), stage 1 two (7.5; three need 11.25),
      stage 2 three (7.5; four need 10), stage 3 up to 7;
    * with zero communication T = 8 + (m - 1) * max_k n_k; stages of at most
      2 layers with s0 = 1 cover only 1+2+2+2 = 7 < 8, so the best bottleneck
      is 3: T = 8 + 7 * 3 = 29 s, reached by (1,1,3,3), (1,2,2,3), (1,2,3,2).
    """
    spec = CostSpec(times=[1.0] * 8, pp=4, m=8, saved=[1.25] * 8, capacity=9.0, in_flight="1f1b")
    costs = spec.costs()
    assert list(costs.in_flight) == [4, 3, 2, 1]
    even = even_split(8, 4)
    assert sizes(even) == (2, 2, 2, 2)
    assert float(costs.memory_bytes(0, 0, 2)) == 10.0
    assert not costs.split_fits(even)
    res = optimal_split(costs)
    assert res is not None and costs.split_fits(res.bounds)
    assert res.bounds != even
    assert res.iteration_time_s == 29.0 == exhaustive_split(costs).iteration_time_s
    assert sizes(res.bounds) in {(1, 1, 3, 3), (1, 2, 2, 3), (1, 2, 3, 2)}
    # GPipe keeps all 8 micro-batches everywhere: one layer needs 10 > 9, nothing fits
    assert optimal_split(CostSpec(times=[1.0] * 8, pp=4, m=8, saved=[1.25] * 8, capacity=9.0,
                                  in_flight="gpipe").costs()) is None


def test_weights_alone_overflow_every_split():
    """Each layer's weights need 4 bytes * 3 = 12 > 10 bytes: no split fits."""
    costs = CostSpec(times=[1, 1, 1], pp=3, m=2, params=[3, 3, 3], state_bytes_per_param_byte=4,
                     capacity=10.0).costs()
    assert optimal_split(costs) is None and exhaustive_split(costs) is None
    assert min_max_split(costs) == (INF, None)


def test_more_stages_than_layers_is_no_split():
    costs = CostSpec(times=[1, 1, 1], pp=4, m=4).costs()
    assert optimal_split(costs) is None and exhaustive_split(costs) is None


# --------------------------------------------------------------- bottlenecks


def _bottleneck_case(times, pp, m=1001):
    """With zero communication and no all-reduce, T = W + (m-1) B where W is
    the total time (fixed) and B the largest stage: minimizing T is
    minimizing B."""
    costs = CostSpec(times=times, pp=pp, m=m).costs()
    res = optimal_split(costs)
    stage_times = [sum(times[a:b]) for a, b in zip(res.bounds, res.bounds[1:])]
    return res, max(stage_times), sum(times)


@pytest.mark.parametrize("times,pp,expected,splits", [
    # 12 into 2: [2,2,2 | 2,1,1,1,1] = 6 | 6, the only split with max 6
    ([2, 2, 2, 2, 1, 1, 1, 1], 2, 6, {(3, 5)}),
    # the 7 alone bounds it: [1 | 7 | 3,3] = 1, 7, 6 is the only split with max 7
    ([1, 7, 3, 3], 3, 7, {(1, 1, 2)}),
    # 6 encoder layers of 1, 6 decoder layers of 2, total 18 into 4: a max of
    # 4 would cover at most 16 < 18, and [1x5 | 1,2,2 | 2,2 | 2,2] = 5,5,4,4
    ([1] * 6 + [2] * 6, 4, 5, None),
])
def test_bottleneck_by_hand(times, pp, expected, splits):
    m = 1001
    res, bottleneck, total = _bottleneck_case(times, pp, m)
    assert bottleneck == expected
    assert res.iteration_time_s == total + (m - 1) * expected
    if splits is not None:
        assert sizes(res.bounds) in splits
    assert min_max_split(CostSpec(times=times, pp=pp, m=m).costs())[0] == (m - 1) * expected


@pytest.mark.parametrize("times,pp,expected", [
    ([2, 2, 2, 2, 1, 1, 1, 1], 2, 6), ([1, 7, 3, 3], 3, 7), ([1] * 6 + [2] * 6, 4, 5),
])
def test_balanced_split_by_hand(times, pp, expected):
    bounds = balanced_split(times, pp)
    assert tiles(bounds, len(times)) and len(bounds) == pp + 1
    assert max(sum(times[a:b]) for a, b in zip(bounds, bounds[1:])) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=9), st.integers(1, 4))
def test_balanced_split_is_the_min_max(weights, pp):
    assume(pp <= len(weights))
    best = min(max(sum(weights[a:b]) for a, b in zip(s, s[1:])) for s in all_splits(len(weights), pp))
    bounds = balanced_split(weights, pp)
    assert tiles(bounds, len(weights)) and len(bounds) == pp + 1
    assert max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])) == best


@pytest.mark.parametrize("L,pp,expected", [
    (8, 4, (2, 2, 2, 2)), (10, 4, (3, 3, 2, 2)), (5, 5, (1, 1, 1, 1, 1)), (7, 1, (7,)), (40, 3, (14, 13, 13)),
])
def test_even_split(L, pp, expected):
    bounds = even_split(L, pp)
    assert sizes(bounds) == expected and bounds[0] == 0 and bounds[-1] == L
    assert all(isinstance(x, int) for x in bounds)


def test_single_stage_and_one_layer_per_stage():
    """pp = 1: one stage [0, L): T = W + (m-1) W = m W = 4 * 6 = 24.
    pp = L: boundaries 0..L; a = (1, 2, 3), T = 6 + (4-1) * 3 = 15."""
    assert optimal_split(CostSpec(times=[1, 2, 3], pp=1, m=4).costs()).iteration_time_s == 24.0
    res = optimal_split(CostSpec(times=[1, 2, 3], pp=3, m=4).costs())
    assert res.bounds == (0, 1, 2, 3) and res.iteration_time_s == 15.0


def test_min_max_split_matches_brute_force_on_a_long_chain():
    """A chain longer than the hypothesis cases (30 layers, 4 stages), where
    the band search has to widen: compare with the brute force max-term."""
    rng = np.random.default_rng(7)
    times = list(rng.integers(0, 20, size=30) / 4)
    spec = CostSpec(times=times, pp=4, m=9, params=list(rng.integers(0, 3, size=30)),
                    allreduce_per_byte=[3.0, 0.0, 1.0, 2.0], allreduce_fixed=1.0,
                    outputs=list(rng.integers(0, 5, size=30)), link_bandwidth=2.0, link_latency=0.25)
    costs = spec.costs()
    value, bounds = min_max_split(costs)
    ref = min(max((spec.m - 1) * a + r for a, r, _, _ in reference_stage_terms(spec, s))
              for s in all_splits(30, 4))
    assert value == ref
    assert optimal_split(costs).iteration_time_s == exhaustive_split(costs).iteration_time_s


@settings(max_examples=60, deadline=None)
@given(dyadic_specs(memory=True), st.integers(0, 3))
def test_fit_starts_are_the_first_fitting_start(spec, stage):
    """The earliest fitting start of every end layer (found by binary search)
    separates exactly the ranges that fit stage ``s``'s memory from those
    that do not, checked on every range ``[i, j)`` against the memory the
    docstring of ``pipesearch/costs.py`` states (state + in-flight saved
    activations, written out here)."""
    from pipesearch.partition import _fit_starts

    costs = spec.costs()
    s = min(stage, costs.pp - 1)
    starts = _fit_starts(costs, s)
    width = int(stage) + 1  # a narrow search finds the same starts within its width
    narrow = _fit_starts(costs, s, width)
    assert all(narrow[j] == max(starts[j], j - width) for j in range(costs.num_layers + 1))
    L = costs.num_layers
    for j in range(L + 1):
        for i in range(j + 1):
            state = sum(spec.params[i:j]) * costs.state_bytes_per_param_byte
            memory = state + sum(spec.saved[i:j]) * costs.in_flight[s]
            assert (i >= starts[j]) == (memory <= costs.capacity_bytes[s]), (i, j, starts[j])


@pytest.mark.parametrize("seed", range(20))
def test_fit_starts_at_rounding_ties(seed):
    """Capacities equal to the memory of some range, with real-valued
    (non-dyadic) bytes: the prefix sums round differently from the range
    sums, so the first guess (a ``searchsorted`` of the prefix sums) can be
    one off and must be corrected. Every end layer's first fitting start is
    the first ``i`` at which the stage's own memory check holds, found here
    by trying every ``i``."""
    from pipesearch.partition import _fit_starts, _stage_fits

    rng = np.random.default_rng(seed)
    L, P = 40, 3
    spec = CostSpec(times=[1.0] * L, pp=P, m=8, params=list(rng.uniform(0, 1, L) * 0.1),
                    saved=list(rng.uniform(0, 1, L) * 0.3), capacity=1.0, state_bytes_per_param_byte=3.0)
    base = spec.costs()
    fixed = []
    for s in range(P):  # a capacity that is exactly the memory of a range, as the check computes it
        i, j = sorted(rng.choice(L + 1, 2, replace=False))
        fixed.append(float((base.param_prefix_bytes[j] - base.param_prefix_bytes[i]) * base.state_bytes_per_param_byte
                           + (base.saved_prefix_bytes[j] - base.saved_prefix_bytes[i]) * base.in_flight[s]))
    costs = CostSpec(**{**spec.__dict__, "capacity": fixed}).costs()
    for s in range(P):
        starts = _fit_starts(costs, s)
        for j in range(L + 1):
            first = next((i for i in range(j + 1) if _stage_fits(costs, s, i, j)), j + 1)
            assert starts[j] == first, (s, j)
