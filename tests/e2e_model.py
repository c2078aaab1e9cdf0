"""The small, deliberately uneven model of the end-to-end CPU test.

An ``nn.Sequential`` of 8 blocks (``Linear`` + ``ReLU``), children ``"0"`` ..
``"7"``, a funnel: blocks 0-2 are heavy (1024 -> 1024, 1.05 M multiply-adds
per sample each), block 3 narrows (1024 -> 320, 0.33 M) and blocks 4-7 are
light (320 -> 320, 0.10 M each): a 10x spread of compute between the heaviest
and the lightest layer. An even 4,4 layer-count split puts all the heavy
blocks on stage 0 (90% of the work); the balanced split 2,6 gives stage 0
54%. The weights (16 MB in all) fit a server CPU's L3 cache, so the layers
stay compute-bound. With micro-batches of 128, one training step of 4
micro-batches (512 samples) takes about 160 ms of compute on one CPU thread.
"""

from __future__ import annotations

import torch
from torch import nn

INPUT_SHAPE = (1024,)
"""Shape of one sample (the batch dimension comes first)."""

WIDTHS = (1024, 1024, 1024, 1024, 320, 320, 320, 320, 320)
"""Block ``i`` maps ``WIDTHS[i]`` features to ``WIDTHS[i + 1]``."""


def make_model() -> nn.Sequential:
    """A fresh model (deterministic weights: seeded)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    try:
        blocks = [nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]
    finally:
        torch.random.set_rng_state(gen_state)
    return nn.Sequential(*blocks)


# ---------------------------------------------------------------- the comparison (test and benchmark)

CLUSTER = "1x2-cpu"
SCHEDULES = ("1f1b", "gpipe")
EVEN_SPLIT = (4, 4)


def plan_pair(profile, schedule: str, *, num_micro_batches: int = 4):
    """``(planned, even)``: the best pp=2 plan of ``profile`` on the 1x2-cpu
    cluster for ``schedule``, and the same point scored with the even 4,4 split.

    The global batch is ``profiled_batch_size * num_micro_batches``: the
    micro-batch is the profiled batch, so no time is scaled. The plans go
    through the plan JSON and back, as a runtime reading a plan file gets them.
    """
    from pipesearch.hardware import load_cluster, load_device
    from pipesearch.plan import PlanFile, normalize
    from pipesearch.search import search
    from pipesearch.search_options import ModelVariant, SearchOptions
    from pipesearch.types import Job

    cluster = load_cluster(CLUSTER)
    device = load_device(profile.profiled_device)
    job = Job(global_batch_size=profile.profiled_batch_size * num_micro_batches)
    plans = []
    for split in (None, EVEN_SPLIT):
        options = SearchOptions(pp=2, dp=1, num_micro_batches=num_micro_batches, schedules=(schedule,), split=split)
        plans.append(search([ModelVariant(profile)], cluster, job, options, profiled_device=device).plans[0])
    return tuple(normalize(PlanFile(inputs={"model": profile.name}, search={}, plans=(p,))).plans[0] for p in plans)


def run_comparison(profile_csv, *, batch_size: int = 128, num_micro_batches: int = 4, rounds: int = 10,
                   steps: int = 1, warmup: int = 1, repeats: int = 10):
    """Profile the model here, plan it for pp=2 (1F1B and GPipe), and run the
    planned and the even 4,4 splits with torch.distributed.pipelining,
    alternating round by round.

    Returns:
        ``(profile, rows)``: the profile (also written to ``profile_csv`` and
        read back) and one ``(schedule, kind, plan, RunResult)`` per run,
        ``kind`` in ``("planned", "even")``.
    """
    from pipesearch.profiler import profile_module
    from pipesearch.profiles import load_model, write_profile_csv
    from pipesearch.runtime import RunConfig, run_plans

    torch.manual_seed(0)
    measured = profile_module(make_model(), torch.randn(batch_size, *INPUT_SHAPE), batch_size=batch_size,
                              warmup=3, repeats=repeats, name="e2e_model")
    write_profile_csv(measured, profile_csv)
    profile = load_model(str(profile_csv))
    keys, configs = [], []
    for schedule in SCHEDULES:
        for kind, plan in zip(("planned", "even"), plan_pair(profile, schedule, num_micro_batches=num_micro_batches)):
            keys.append((schedule, kind, plan))
            configs.append(RunConfig(plan, schedule, f"{schedule} {kind}"))
    results = run_plans(make_model, configs, input_shape=INPUT_SHAPE, steps=steps, rounds=rounds, warmup=warmup)
    return profile, [(s, k, p, r) for (s, k, p), r in zip(keys, results)]


def table(rows) -> str:
    """The comparison as a Markdown table."""
    lines = ["| schedule | split | measured step s (median) | predicted s | measured / predicted "
             "| busiest rank CPU s | predicted busiest stage s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for schedule, kind, plan, res in rows:
        split = ",".join(map(str, plan.layers_per_stage))
        lines.append(f"| {schedule} | {kind} {split} | {res.median_step_s:.3f} | {res.predicted_s:.3f} "
                     f"| {res.ratio:.2f} | {res.busiest_cpu_s:.3f} | {res.predicted_busy_s:.3f} |")
    return "\n".join(lines)
