"""``simulate``'s summary names the host optimizer step (CPU Adam and its
copies) as its own term (pipesearch.cli.simulate_cmd.host_step_terms,
delayed_host_note) instead of folding it into "no all-reduce: dp = 1".

Hand case: GPipe, pp 2, m 1, each stage forward 1 s, backward 2 s, no
transfers; stage 1 steps its optimizer on the host for 10 s (its
allreduce_s, dp 1). Timeline: F0 0-1, F1 1-2, B1 2-4, B0 4-6: the pipeline
ends at 6 s, rank 1's last action at 4 s, so T = 4 + 10 = 14 s, 8 s after
the pipeline.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesearch.cli.simulate_cmd import delayed_host_note, host_step_terms
from pipesearch.point_plan import simulate_plan
from pipesearch.types import Plan, Prediction, StagePlan


def _plan(host_s=(0.0, 10.0), schedule="gpipe", extra=()) -> Plan:
    stages = tuple(StagePlan(index=k, layers=(k, k + 1), layer_names=(f"l{k}",), devices=(k,), compute_s=3.0,
                             fwd_s=1.0, comm_s=0.0, allreduce_s=host_s[k], host_step_s=host_s[k], memory_bytes=0.0,
                             send_bytes=0.0) for k in range(2))
    return Plan(rank=0, pp=2, dp=1, tp=1, schedule=schedule, micro_batch_size=1, num_micro_batches=1, stages=stages,
                predicted=Prediction(14.0, 0.0, 0.0, 0.0, 0.0), vp=1, extra=tuple(extra))


def test_host_step_is_named_with_its_rank_and_time():
    """Catches: the 8 s after the pipeline left unexplained ("no all-reduce: dp = 1")."""
    plan = _plan()
    total_s, tl = simulate_plan(plan)
    assert total_s == pytest.approx(14.0) and tl.iteration_time_s == pytest.approx(6.0)
    text = host_step_terms(plan, tl, total_s)
    assert text == ("pipeline 6.000 s + 8.000 s after it: rank 1's host optimizer step (CPU Adam and its copies) "
                    "10.000 s from 4.000 s, after its last action and copies")


def test_data_parallel_part_is_separate():
    """Catches: an all-reduce beside the host step reported as host time.
    Stage 1's allreduce_s 10.5 = host step 10 + 0.5 s of gradient all-reduce: T = 4 + 10.5."""
    plan = _plan()
    plan = replace(plan, stages=(plan.stages[0], replace(plan.stages[1], allreduce_s=10.5)))
    total_s, tl = simulate_plan(plan)
    assert total_s == pytest.approx(14.5)
    text = host_step_terms(plan, tl, total_s)
    assert "host optimizer step (CPU Adam and its copies) 10.000 s" in text
    assert "data-parallel communication 500.00 ms" in text and "8.500 s after it" in text


def test_no_host_step_keeps_the_old_summary():
    """Catches: a host-step term printed for plans that step on the GPU."""
    plan = _plan(host_s=(0.0, 0.0))
    total_s, tl = simulate_plan(plan)
    assert host_step_terms(plan, tl, total_s) is None and delayed_host_note(plan) is None


def test_delayed_step_is_named_beside_the_next_iteration():
    """Catches: a delayed host step dropped from the summary. Rank 1's step 10 s, rank 0's 4 s."""
    plan = _plan(host_s=(4.0, 10.0), extra=(("optimizer_step", "delayed"),))
    plan = replace(plan, stages=tuple(replace(s, allreduce_s=0.0) for s in plan.stages))
    assert delayed_host_note(plan) == ("host optimizer step (CPU Adam and its copies) of rank 1 10.000 s (the "
                                       "longest), delayed beside the next iteration")
    total_s, tl = simulate_plan(plan)
    assert host_step_terms(plan, tl, total_s) is None  # not after the pipeline


def test_the_timeline_draws_the_host_step_where_the_simulator_runs_it():
    """The hand case: rank 1's host step spans 4-14 s, the iteration's end,
    labelled as the host step alone (dp 1: no all-reduce; it read "A
    all-reduce + host optimizer step"). Catches: a span drawn from another
    rule than the simulator's (Mobius': after the last gradient copy, which
    left the figure 35 ms short of the 41.328 s iteration it named)."""
    from pipesearch.plots.timeline import allreduce_label, allreduce_spans

    plan = _plan()
    total_s, tl = simulate_plan(plan)
    assert allreduce_spans(plan, tl) == [(0.0, 0.0), pytest.approx((4.0, 10.0))]
    assert allreduce_label(plan) == "A host optimizer step"
    assert allreduce_label(replace(plan, dp=2)) == "A all-reduce + host optimizer step"


@pytest.mark.slow
def test_a_mobius_timeline_ends_where_its_iteration_does(tmp_path):
    """Mobius (docs/offload.md's llama3.1-8b on eight RTX 4090s): each rank's
    host step starts after its last gradient copy to the host, so the spans
    drawn end at the simulated iteration time, which the title names."""
    from click.testing import CliRunner

    from pipesearch.cli import main
    from pipesearch.plan import load_plan_file
    from pipesearch.plots.timeline import allreduce_spans

    out = tmp_path / "m.json"
    res = CliRunner().invoke(main, ["plan", "--model", "llama3.1-8b", "--cluster", "1x8-rtx4090-pcie4", "-b", "128",
                                    "--seq-len", "2048", "--top", "1", "--schedule", "mobius", "--activation-offload",
                                    "-q", "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan = load_plan_file(out).plans[0]
    total_s, tl = simulate_plan(plan)
    assert max(a + d for a, d in allreduce_spans(plan, tl)) == pytest.approx(total_s, rel=1e-12)


def test_the_timeline_title_names_what_follows_the_pipeline():
    """A delayed host step runs beside the next iteration: the title said
    "then host optimizer step" for it (no bar is drawn; every allreduce_s
    is 0 there)."""
    from pipesearch.plots.common import after_pipeline

    plan = _plan()
    assert after_pipeline(plan) == ", then host optimizer step; dp = 1: no all-reduce"
    assert after_pipeline(replace(plan, dp=2)) == ", then gradient all-reduce and host optimizer step"
    delayed = replace(plan, extra=(("optimizer_step", "delayed"),))
    assert after_pipeline(delayed) == ", dp = 1: no all-reduce"
    assert after_pipeline(_plan(host_s=(0.0, 0.0))) == ", dp = 1: no all-reduce"


def test_a_roundpipe_step_bar_ends_at_the_replays_time():
    """RoundPipe's step bars ended at the file's recorded time, while the
    figure is the replay's (an edited file: 3.21268 against 3.21721 s)."""
    from types import SimpleNamespace as NS

    from pipesearch.plots.timeline import allreduce_spans

    plan = NS(schedule="roundpipe", stages=[NS(allreduce_s=1.0), NS(allreduce_s=2.0)],
              predicted=NS(iteration_time_s=10.0))
    tl = NS(num_ranks=2)
    assert allreduce_spans(plan, tl) == [(7.0, 3.0)] * 2
    assert allreduce_spans(plan, tl, 12.0) == [(9.0, 3.0)] * 2
