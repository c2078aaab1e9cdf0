"""RoundPipe with a tied input embedding and LM head (pipesearch.roundpipe).

RoundPipe's ``upload_layers`` copies every parameter of a task's layers to
its GPU, so the last group, holding the LM head without the embedding,
uploads the shared matrix with its own weights, accumulates its gradient
and downloads it into a host buffer of its own (``grad_cpu`` per layer),
summed with the embedding's before the CPU's step. The layer table counts
the matrix once, on the first layer.

Oracle: one case traced by hand (3 groups, 2 GPUs, 1 micro-batch), every
figure derived in the docstrings from the layer table below, tied and
untied.

Layers (one per group): forward 0.25 s, backward 0.5 s; 16-bit weights 1,
0.5, 1 GB (0.5e9, 0.25e9, 0.5e9 parameters at 2 B); outputs 0.25, 0.25, 0
GB; saved 2, 1, 0.5 GB per micro-batch. Tied matrix: 0.5 GB (0.25e9
parameters, part of layer 0's 1 GB). PCIe 1 GB/s per GPU, each GPU under a
switch of its own (``pcie_scale`` 1); the CPU's Adam at 5e9 parameters/s.
Tasks: t0 F(g0) GPU 0, t1 F(g1) GPU 1, t2 FB(g2) GPU 0, t3 B(g1) GPU 1,
t4 B(g0) GPU 0.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from helpers import pcie_host, tiny_cluster, tiny_profile
from pipesearch.roundpipe import build_roundpipe_costs
from pipesearch.timemodel import roundpipe_copy_spans, simulate_times
from pipesearch.types import Job

GB = 1e9
BOUNDS = np.array([0, 1, 2, 3])


def _costs(tied_gb: float):
    prof = tiny_profile([0.25] * 3, [0.5] * 3, params=[1 * GB, 0.5 * GB, 1 * GB],
                        outputs=[0.25 * GB, 0.25 * GB, 0.0], saved=[2 * GB, 1 * GB, 0.5 * GB], bytes_per_param=2.0)
    prof = replace(prof, tied_param_bytes=tied_gb * GB)
    host = pcie_host(host_to_device_bytes_per_s=1e9, switch_uplink_bytes_per_s=1e9, pcie_switches=((0,), (1,)),
                     cpu_adam_params_per_s=5e9)
    cluster = replace(tiny_cluster(1, 2), host=host)
    return build_roundpipe_costs(prof, cluster, Job(global_batch_size=1, memory_reserve_bytes=0),
                                 gpus=np.array([0, 1]), groups=3, micro_batch_size=1, num_micro_batches=1)


UNTIED, TIED = _costs(0.0), _costs(0.5)


def test_gpu_peaks_count_the_tied_matrix_on_the_last_groups_gpu():
    """Weights 1, 0.5, 1 GB untied; the last group's 1 + 0.5 = 1.5 GB tied.
    Transient bytes (saved + two micro-batches' input and output
    boundaries): g0 2 + 2 (0 + 0.25) = 2.5, g1 1 + 2 (0.25 + 0.25) = 2,
    g2 0.5 + 2 (0.25 + 0) = 1 GB.

    GPU 0 untied: F0 computing 1 + 2.5 with FB2's weights and gradients 2
    arriving = 5.5; FB2 2 + 1 + B0's 2 = 5; B0 2 + 2.5 = 4.5: peak 5.5.
    Tied: F0 1 + 2.5 + 3 = 6.5 (the tied matrix arriving); FB2 3 + 1 + 2 = 6;
    peak 6.5 (6 if only the computing task counted it, 5.5 if neither).
    GPU 1 both: F1 0.5 + 2 + B1's 1 = 3.5; B1 1 + 2 = 3: 3.5.
    The last group's backward task alone: 2 x 1 + 1 = 3 GB untied, 2 x 1.5 +
    1 = 4 GB tied; so on GPUs with 6.25 GB usable the untied split fits and
    the tied one does not."""
    assert UNTIED.tied_params == 0.0 and TIED.tied_params == pytest.approx(0.25e9)
    assert UNTIED.device_peak_bytes(BOUNDS)[0] == pytest.approx([5.5 * GB, 3.5 * GB])
    assert TIED.device_peak_bytes(BOUNDS)[0] == pytest.approx([6.5 * GB, 3.5 * GB])
    weights, transient = TIED.group_bytes(BOUNDS)
    assert weights[0] == pytest.approx([1 * GB, 0.5 * GB, 1.5 * GB])
    assert transient[0] == pytest.approx([2.5 * GB, 2 * GB, 1 * GB])
    assert TIED.group_alone_fits(np.array([2]), np.array([3]))[0]
    small = [replace(c, capacity_bytes=6.25 * GB) for c in (UNTIED, TIED)]
    assert [bool(c.fits(BOUNDS)[0]) for c in small] == [True, False]
    tight = replace(TIED, capacity_bytes=3.9 * GB)  # 4 GB needed by the last group alone, 3 without the tied matrix
    assert not tight.group_alone_fits(np.array([2]), np.array([3]))[0]
    assert replace(UNTIED, capacity_bytes=3.9 * GB).group_alone_fits(np.array([2]), np.array([3]))[0]


def test_copy_seconds_host_bytes_and_pcie_bytes():
    """Copies at 1 GB/s: weights in and gradients out 1, 0.5, 1 s untied;
    the last group's 1.5 s tied. Host: 20 B per parameter, 10, 5, 10 GB,
    plus the saved input of one micro-batch, 0, 0.25, 0.25 GB: 10, 5.25,
    10.25 = 25.5 GB untied; tied, the matrix's state once (in group 0's 20 B
    per parameter) and the last group's own 16-bit gradient buffer, 2 B x
    0.25e9 = 0.5 GB: 10, 5.25, 10.75 = 26 GB (30 GB if its whole state were
    counted twice). The least host bytes of any split are these 26 GB (the
    one split). PCIe per iteration: g0 weights twice and gradients once, 3 x
    1, and its output 2 x 0.25 (forward out, backward's output gradient in)
    = 3.5 GB; g1 3 x 0.5 + 3 x 0.25 + 2 x 0.25 = 2.75 GB; g2 (fused: weights
    in once, gradients out once) 2 x 1 + its input in and input gradient out
    2 x 0.25 = 2.5 GB untied, 2 x 1.5 + 0.5 = 3.5 GB tied. The CPU's Adam:
    1.25e9 parameters / 5e9 = 0.25 s either way (the matrix once)."""
    for costs, last in ((UNTIED, 1.0), (TIED, 1.5)):
        times = costs.stage_times(BOUNDS)
        assert times.swap_in_s == pytest.approx([1.0, 0.5, last])
        assert times.swap_out_s == pytest.approx([1.0, 0.5, last])
        assert times.p2p_s == pytest.approx([0.25, 0.25])
        assert np.sum(times.allreduce_s) == pytest.approx(0.25)
    assert UNTIED.host_bytes(BOUNDS)[0] == pytest.approx([10 * GB, 5.25 * GB, 10.25 * GB])
    assert TIED.host_bytes(BOUNDS)[0] == pytest.approx([10 * GB, 5.25 * GB, 10.75 * GB])
    assert TIED.least_host_bytes() == pytest.approx(26 * GB)
    assert UNTIED.least_host_bytes() == pytest.approx(25.5 * GB)
    assert UNTIED.pcie_bytes(BOUNDS)[0] == pytest.approx([3.5 * GB, 2.75 * GB, 2.5 * GB])
    assert TIED.pcie_bytes(BOUNDS)[0] == pytest.approx([3.5 * GB, 2.75 * GB, 3.5 * GB])


def test_iteration_time_traced_by_hand():
    """m = 1 (a prefetch is one chunk). W = weights in, C = compute, I = copy
    in, O = copy out, G = gradients out.

    Untied. GPU 0: W(g0) [0, 1]; C(t0) [1, 1.25]; O [1.25, 1.5]; W(g2)
    prefetched after W(g0): [1, 2]. GPU 1: W(g1) [0, 0.5]; I(t1) after
    O(t0): [1.5, 1.75]; C [1.75, 2]; O [2, 2.25]; W(g1) again [1.75, 2.25].
    GPU 0: I(t2) after O(t1) and W(g2): [2.25, 2.5]; C(t2) F + B [2.5,
    3.25]; O (input gradient) [3.25, 3.5]; W(g0) again [2.5, 3.5]; G(g2)
    [3.5, 4.5]. GPU 1: saved input [2.25, 2.5]; output gradient after
    O(t2): [3.5, 3.75]; C(t3) [3.75, 4.5]; O [4.5, 4.75]; G(g1) [4.75,
    5.25]. GPU 0: I(t4) after O(t3): [4.75, 5]; C(t4) [5, 5.75]; G(g0) [5.75,
    6.75]. T = 6.75 + Adam 0.25 = 7 s.

    Tied (g2's weights and gradients 1.5 s): W(g2) [1, 2.5], so I(t2)
    [2.5, 2.75] waits for it (O(t1) ends at 2.25); C(t2) [2.75, 3.5]; O
    [3.5, 3.75]; G(g2) [3.75, 5.25]; GPU 1: output gradient [3.75, 4]; C(t3)
    [4, 4.75]; O [4.75, 5]; G(g1) [5, 5.5]; GPU 0: I(t4) [5, 5.25]; C(t4)
    [5.25, 6]; G(g0) [6, 7]. T = 7 + 0.25 = 7.25 s."""
    assert float(UNTIED.time_s(BOUNDS)) == pytest.approx(7.0)
    assert float(TIED.time_s(BOUNDS)) == pytest.approx(7.25)
    for costs, want in ((UNTIED, [(0, 1, 1.25), (2, 2.5, 3.25), (0, 5.0, 5.75), (1, 1.75, 2.0), (1, 3.75, 4.5)]),
                        (TIED, [(0, 1, 1.25), (2, 2.75, 3.5), (0, 5.25, 6.0), (1, 1.75, 2.0), (1, 4.0, 4.75)])):
        total, tl = simulate_times("roundpipe", 2, 1, 1, costs.stage_times(BOUNDS))
        got = sorted((r.rank, r.start_s, r.stage, r.end_s) for r in tl.records)  # per GPU, in order
        assert total == pytest.approx(float(costs.time_s(BOUNDS)))
        assert np.array([(s, a, b) for _, a, s, b in got]) == pytest.approx(np.array(want, dtype=float))
    spans = {(c[0], c[2], c[3]): (c[4], c[5]) for c in roundpipe_copy_spans(TIED.stage_times(BOUNDS), 2, 1)
             if c[2] != "act"}
    assert spans[(0, "weights", 2)] == pytest.approx((1.0, 2.5))
    assert spans[(0, "grads", 2)] == pytest.approx((3.75, 5.25))
    assert spans[(0, "grads", 0)] == pytest.approx((6.0, 7.0))
