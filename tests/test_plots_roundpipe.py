"""The ``stages`` plot of a RoundPipe plan charges each task to the GPU it
runs on (pipesearch.plots.stages.roundpipe_gpu_breakdown), not each layer
group to ``index mod pp``.

Hand case: 3 groups on 2 GPUs, m = 2 micro-batches, fwd_s = (1, 2, 3),
compute_s = (3, 6, 9) (so backward 2, 4, 6), comm_s = 0.5 for groups 0, 1,
host step 0.25 per group. RoundPipe's tasks (schedules.roundpipe_tasks(3,
2)): F0 on GPU 0, F1 on GPU 1, FB2 on GPU 0, B1 on GPU 1, B0 on GPU 0.
GPU 0: forward 2*1 + 2*3 = 8, backward 2*6 + 2*2 = 16, re-run 2*1 = 2,
p2p 2*0.5 = 1, host 0.25 + 0.25 = 0.5 (B0, FB2). GPU 1: forward 2*2 = 4,
backward 2*4 = 8, re-run 2*2 = 4, p2p 1, host 0.25. Per-stage charging would
put group 1's forward and backward together on GPU 1 and group 2's on GPU 0.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipesearch.plots.stages import _columns, roundpipe_gpu_breakdown, stage_breakdown
from pipesearch.schedules import roundpipe_tasks
from pipesearch.types import Plan, Prediction, StagePlan


def _plan(delayed=False) -> Plan:
    fwd, comp, comm = (1.0, 2.0, 3.0), (3.0, 6.0, 9.0), (0.5, 0.5, 0.0)
    stages = tuple(StagePlan(index=g, layers=(g, g + 1), layer_names=(f"l{g}",), devices=(g % 2,), compute_s=comp[g],
                             fwd_s=fwd[g], comm_s=comm[g], allreduce_s=0.0 if delayed else 0.25, host_step_s=0.25,
                             memory_bytes=0.0, send_bytes=0.0, memory_option="roundpipe") for g in range(3))
    tasks = [list(t) for t in roundpipe_tasks(3, 2)]
    assert tasks == [["F", 0, 0], ["F", 1, 1], ["FB", 2, 0], ["B", 1, 1], ["B", 0, 0]]
    extra = (("roundpipe", {"tasks": tasks}),) + ((("optimizer_step", "delayed"),) if delayed else ())
    return Plan(rank=0, pp=2, dp=1, tp=1, schedule="roundpipe", micro_batch_size=1, num_micro_batches=2,
                stages=stages, predicted=Prediction(30.0, 0.0, 0.0, 0.0, 0.0), vp=1, extra=extra)


def test_each_task_on_its_gpu():
    """Catches: a group's backward charged to its forward's GPU (index mod pp)."""
    parts = roundpipe_gpu_breakdown(_plan())
    assert parts["forward"] == pytest.approx([8.0, 4.0])
    assert parts["backward"] == pytest.approx([16.0, 8.0])
    assert parts["recompute"] == pytest.approx([2.0, 4.0])
    assert parts["p2p"] == pytest.approx([1.0, 1.0])
    assert parts["host"] == pytest.approx([0.5, 0.25])
    assert parts["allreduce"] == pytest.approx([0.0, 0.0])
    # the per-stage breakdown (other schedules) sums differently: the bug's figures
    per_stage = stage_breakdown(_plan())
    wrong = np.bincount([0, 1, 0], weights=per_stage["forward"] + per_stage["backward"], minlength=2)
    assert wrong == pytest.approx([24.0, 12.0])
    compute = parts["forward"] + parts["backward"] + parts["recompute"]
    assert compute == pytest.approx([26.0, 16.0])


def test_delayed_host_step_takes_no_gpu_time():
    """Catches: a delayed host step (beside the next iteration) still drawn."""
    parts = roundpipe_gpu_breakdown(_plan(delayed=True))
    assert parts["host"] == pytest.approx([0.0, 0.0]) and parts["allreduce"] == pytest.approx([0.0, 0.0])


def test_columns_name_each_gpus_tasks():
    """Catches: tick labels listing stages index mod pp instead of the tasks' groups."""
    _, labels, xlabel = _columns(_plan())
    assert labels == ["0\nF 0,2\nB 2,0", "1\nF 1\nB 1"]
    assert xlabel.startswith("GPU")


def test_other_schedules_have_no_task_breakdown():
    from dataclasses import replace

    assert roundpipe_gpu_breakdown(replace(_plan(), schedule="gpipe")) is None


def test_state_legend_says_what_is_on_the_device():
    """Catches: "weights + gradients + optimizer state" on stages whose optimizer
    state is in host memory (memory_option offload)."""
    from dataclasses import replace

    from pipesearch.plots.stages import state_label

    base = _plan()
    on_device = replace(base, schedule="1f1b", stages=tuple(replace(s, memory_option="none") for s in base.stages))
    assert state_label(on_device) == "weights + gradients + optimizer state"
    offloaded = replace(on_device, stages=tuple(replace(s, memory_option="offload") for s in base.stages))
    assert state_label(offloaded) == "weights + gradients (optimizer state in host memory)"
    mixed = replace(on_device, stages=(replace(base.stages[0], memory_option="full"),) + tuple(
        replace(s, memory_option="none+offload") for s in base.stages[1:]))
    assert "on the stages that keep it on the device" in state_label(mixed)
