"""The device-class DP (pipesearch.class_dp) against brute force over every
device order and every split (test_ilp.reference_optimum: the objective
written out from the mapping formulas), on random instances with
unstructured links (every device its own class) and on clusters of nodes
(devices of a node interchangeable, so the DP works on few classes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesearch.class_dp import class_dp_mapping, count_vectors
from pipesearch.errors import InfeasibleError
from pipesearch.device_orders import device_classes
from pipesearch.mapping import device_indices
from test_ilp import problem, reference_optimum, small_instances


def _check(inst, objective):
    ref = reference_optimum(inst["times"], inst["dtype"], inst["caps"], inst["static"], inst["act"],
                            inst["in_flight"], inst["out"], inst["bw"], inst["lat"], inst["P"], inst["m"],
                            objective)
    pr = problem(inst["times"], inst["dtype"], inst["caps"], P=inst["P"], static=inst["static"], act=inst["act"],
                 in_flight=inst["in_flight"], out=inst["out"], bw=np.array(inst["bw"]), lat=np.array(inst["lat"]),
                 m=inst["m"])
    if not np.isfinite(ref):
        with pytest.raises(InfeasibleError):
            class_dp_mapping(pr, objective)
        return
    res = class_dp_mapping(pr, objective)
    assert res.objective_s == pytest.approx(ref, rel=1e-9)
    assert res.status == "OPTIMAL" and res.best_bound_s == res.objective_s and res.gap == 0.0
    order = device_indices(pr, res)
    assert len(set(order)) == len(order) and pr.fits(order, res.bounds)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(), st.sampled_from(["bottleneck", "iteration"]))
def test_class_dp_matches_brute_force(inst, objective):
    _check(inst, objective)


@st.composite
def node_instances(draw):
    """2-3 nodes of 1-3 devices; a node's devices share type and capacity;
    links by node: 1e10 B/s inside, 1e9 across (symmetric), so a node is
    one class."""
    nodes = draw(st.lists(st.integers(1, 3), min_size=2, max_size=3))
    D = sum(nodes)
    P = draw(st.integers(1, min(D, 5)))
    L = draw(st.integers(P, 7))
    node_of = [n for n, k in enumerate(nodes) for _ in range(k)]
    ntype = draw(st.lists(st.integers(0, 1), min_size=len(nodes), max_size=len(nodes)))
    ncap = draw(st.lists(st.integers(3, 12), min_size=len(nodes), max_size=len(nodes)))
    quarters = st.integers(1, 8).map(lambda q: q / 4)
    m = draw(st.integers(1, 6))
    return dict(times=[draw(st.lists(quarters, min_size=L, max_size=L)) for _ in range(2)],
                dtype=[ntype[n] for n in node_of], caps=[ncap[n] for n in node_of],
                static=draw(st.lists(st.integers(0, 3), min_size=L, max_size=L)),
                act=draw(st.lists(st.integers(0, 2), min_size=L, max_size=L)),
                in_flight=[min(m, P - k) for k in range(P)],
                out=draw(st.lists(st.sampled_from([0.0, 1e8, 1e9]), min_size=L, max_size=L)),
                bw=[[np.inf if a == b else 1e10 if node_of[a] == node_of[b] else 1e9 for b in range(D)]
                    for a in range(D)],  # the diagonal is unused: no transfer to oneself
                lat=[[0.0 if a == b else 1e-4 if node_of[a] == node_of[b] else 1e-3 for b in range(D)]
                     for a in range(D)],
                P=P, m=m)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_instances(), st.sampled_from(["bottleneck", "iteration"]))
def test_class_dp_on_nodes_matches_brute_force(inst, objective):
    _check(inst, objective)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_instances(), st.sampled_from(["bottleneck", "iteration"]))
def test_class_dp_in_chunks_of_one_count_vector_matches_brute_force(inst, objective):
    """Each level's transitions one count vector at a time (the chunking of
    large levels, ``LEVEL_CHUNK``) give the brute-force optimum too."""
    import pipesearch.class_dp as class_dp

    old = class_dp.LEVEL_CHUNK
    class_dp.LEVEL_CHUNK = 1
    try:
        _check(inst, objective)
    finally:
        class_dp.LEVEL_CHUNK = old


def test_classes_are_nodes():
    """Three nodes of 3, 2, 1 identical devices: three classes, (3+1)(2+1)(1+1) = 24 count vectors."""
    D = 6
    node_of = [0, 0, 0, 1, 1, 2]
    bw = np.array([[1e10 if node_of[a] == node_of[b] else 1e9 for b in range(D)] for a in range(D)])
    pr = problem([[1.0] * 6], [0] * D, [10] * D, P=3, bw=bw, lat=np.zeros((D, D)))
    assert device_classes(pr) == [[0, 1, 2], [3, 4], [5]]
    assert count_vectors(pr) == 24


def _hog_cpu(seconds: float):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c",
                             f"import time\nt = time.time()\nwhile time.time() - t < {seconds}: pass"])


@pytest.mark.slow
def test_16_devices_3_types_optimal_and_repeatable():
    """The 64-layer, 16-device, 3-type instance of benchmarks/bench_ilp.py
    (4 fast, 8 medium, 4 slow devices, 4 per node; four nodes, so four
    classes and 5^4 = 625 count vectors), P = 16: map_pipeline's automatic
    method is the class DP, OPTIMAL with bound = objective; five runs, one
    beside a CPU-bound process, give the same devices, split and value; the
    optimum is no worse than CP-SAT's solution and no better than CP-SAT's
    proved bound (an independent solver of the same model)."""
    from pipesearch.ilp import solve_mapping
    from test_ilp import _synthetic_problem

    pr = _synthetic_problem()
    assert count_vectors(pr) == 625
    runs = []
    for i in range(5):
        hog = _hog_cpu(3.0) if i == 4 else None
        try:
            runs.append(class_dp_mapping(pr, "iteration"))
        finally:
            if hog is not None:
                hog.wait()
    assert len({(r.devices, r.bounds, r.objective_s) for r in runs}) == 1
    res = runs[0]
    assert res.status == "OPTIMAL" and res.best_bound_s == res.objective_s
    order = device_indices(pr, res)
    assert len(set(order)) == 16 and pr.fits(order, res.bounds)
    cp = solve_mapping(pr, objective="iteration", max_deterministic_time=5)
    assert cp.best_bound_s <= res.objective_s * (1 + 1e-9)
    assert res.objective_s <= cp.objective_s * (1 + 1e-12)
    bott = class_dp_mapping(pr, "bottleneck")
    cpb = solve_mapping(pr, objective="bottleneck", max_deterministic_time=5)
    assert cpb.best_bound_s <= bott.objective_s * (1 + 1e-9) and bott.objective_s <= cpb.objective_s * (1 + 1e-12)
