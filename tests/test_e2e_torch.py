"""End to end on this machine's CPU: profile -> plan -> run with torch.distributed.pipelining.

Profiles the deliberately uneven model of ``e2e_model.py`` (batch 128, one
thread, CPU clock), writes and reads back the profile CSV, plans it for pp=2
on the ``1x2-cpu`` cluster (4 micro-batches of 128; 1F1B and GPipe), and runs
the planned split and the even 4,4 split for real in two gloo processes,
alternating configurations round by round (10 rounds of 1 step each).

Checked every time (comparisons inside one alternating run, robust to other
work on the host):

* the planner moves the split off 4,4 and predicts it faster;
* the planned split's busiest rank does less work per step (CPU time) than
  the even split's: the split balances the real stages.

Checked when the host had its cores to itself during the run (other
processes used at most ``num_cpus - 1.5`` cores, from ``/proc/stat``):

* the planned split's median step time is below the even split's;
* measured / predicted step time is within 0.5x-2x, and so is the busiest
  rank's CPU time per step against the plan's busiest-stage compute.

On an oversubscribed host the stages wait for a core at every micro-batch
hand-off, so wall-clock step times say little about the split, and co-runners
thrashing the caches move even CPU times by 2-3x within seconds, so a profile
and a run taken a few seconds apart disagree; the test then prints the
numbers and emits a warning naming the load instead of asserting those.
Total time: about 12 s on 2 idle cores, longer on a busy host.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from pipesearch.errors import InputError
from pipesearch.hardware import load_cluster
from pipesearch.runtime.torch_pipeline import schedule_class_name, stage_modules
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job, Layer, ModelProfile

try:
    import torch  # noqa: F401
except ImportError:
    e2e_model = None
else:
    import e2e_model  # tests/ is on sys.path; imports torch

BAND = (0.5, 2.0)


def _plan(counts=(2, 6), schedule="1f1b", m=4):
    """A pp=len(counts) plan of an 8-layer toy profile with the given split."""
    heavy = [10 if i < 3 else 1 for i in range(8)]
    layers = tuple(Layer(str(i), 0.001 * w, 0.002 * w, 1e6, 1e5, 1e5) for i, w in enumerate(heavy))
    profile = ModelProfile("toy", layers, profiled_batch_size=32, profiled_device="cpu")
    options = SearchOptions(pp=len(counts), dp=1, num_micro_batches=m, schedules=(schedule,), split=counts)
    return search([ModelVariant(profile)], load_cluster("1x2-cpu"), Job(global_batch_size=32 * m), options).plans[0]


def test_stage_modules_follow_the_plan_split():
    assert stage_modules(_plan((2, 6))) == [["0", "1"], ["2", "3", "4", "5", "6", "7"]]
    assert stage_modules(_plan((5, 3))) == [["0", "1", "2", "3", "4"], ["5", "6", "7"]]


def test_run_plan_refusals():
    plan = _plan()
    assert schedule_class_name(None, plan) == "Schedule1F1B"
    assert schedule_class_name("gpipe", plan) == "ScheduleGPipe"
    assert schedule_class_name("ScheduleGPipe", plan) == "ScheduleGPipe"
    with pytest.raises(InputError, match="not supported"):
        schedule_class_name("zb-h1", plan)
    with pytest.raises(InputError, match="num_micro_batches >= pp"):
        schedule_class_name("1f1b", replace(plan, num_micro_batches=1))
    with pytest.raises(InputError, match="pipeline parallelism only"):
        stage_modules(replace(plan, dp=2))


def _host_quiet(result) -> tuple[bool, str]:
    other = result.host_other_cores
    if other is None:
        return True, "host load unknown (no /proc/stat)"
    free = (result.num_cpus or 1) - other
    text = f"other processes used {other:.2f} of {result.num_cpus} cores during the run"
    return free >= 2 - 0.5, text


@pytest.mark.slow
@pytest.mark.skipif(e2e_model is None, reason="the end-to-end test needs PyTorch: pip install torch==2.13.0")
def test_planned_split_beats_even_split_on_cpu(tmp_path):
    profile, rows = e2e_model.run_comparison(tmp_path / "e2e.csv", rounds=10, steps=1)
    print()
    print(e2e_model.table(rows))
    quiet, load = _host_quiet(rows[0][3])
    print(load)
    assert profile.num_layers == 8 and profile.profiled_device == "cpu"
    assert [lay.name for lay in profile.layers] == [str(i) for i in range(8)]
    by = {(s, k): (p, r) for s, k, p, r in rows}
    failures = []
    for schedule in e2e_model.SCHEDULES:
        planned_plan, planned = by[(schedule, "planned")]
        even_plan, even = by[(schedule, "even")]
        assert even_plan.layers_per_stage == (4, 4)
        assert planned_plan.layers_per_stage != (4, 4), "the planner kept the even split of an uneven model"
        assert planned_plan.predicted.iteration_time_s < even_plan.predicted.iteration_time_s
        assert all(r.losses and all(loss == loss for loss in r.losses) for r in (planned, even))
        # work balance, compared within one alternating run: robust to other load on the host
        assert planned.busiest_cpu_s < even.busiest_cpu_s, (
            f"{schedule}: planned split's busiest rank CPU {planned.busiest_cpu_s:.3f} s/step "
            f">= even split's {even.busiest_cpu_s:.3f}")
        # wall clock, and measurements against the profile taken before the run
        if planned.median_step_s >= even.median_step_s:
            failures.append(f"{schedule}: planned {planned.median_step_s:.3f} s/step >= even "
                            f"{even.median_step_s:.3f} s/step")
        for res in (planned, even):
            if not BAND[0] <= res.ratio <= BAND[1]:
                failures.append(f"{res.label}: measured {res.median_step_s:.3f} s/step vs predicted "
                                f"{res.predicted_s:.3f} s (x{res.ratio:.2f})")
            if not BAND[0] <= res.busy_ratio <= BAND[1]:
                failures.append(f"{res.label}: busiest rank CPU {res.busiest_cpu_s:.3f} s/step vs predicted "
                                f"busiest stage {res.predicted_busy_s:.3f} s (x{res.busy_ratio:.2f})")
    if quiet:
        assert not failures, "; ".join(failures) + f" ({load})"
    elif failures:
        warnings.warn(f"wall-clock checks not asserted, host oversubscribed ({load}): " + "; ".join(failures),
                      stacklevel=1)
