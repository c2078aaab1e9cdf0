"""The ranking keeps one plan per configuration (its family: tp, recompute,
pp, dp, schedule, vp), so a point of a family that already holds a plan
matters only if it beats that plan: the search prunes it, or splits it,
against that plan's time where it is below the K-th best
(``search._Search.point_cutoff``). Checked against the exhaustive search (no
pruning, every point split to its best): the same ranked plans, and every
pruned point's bound at least what it had to beat, the K-th best family
time or its own family's best, whichever is lower."""

from __future__ import annotations

import math

import numpy as np

from helpers import tied_or_random_profile, tiny_cluster
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job, Link

TOP = 3


def _instance(seed: int, layers: int, batch: int):
    """A seeded profile (identical layers for odd seeds, random ones for
    even), 2 nodes of 4 devices with transfers, the global batch."""
    rng = np.random.default_rng(seed)
    prof, _, _ = tied_or_random_profile(rng, layers, bool(seed % 2))
    cluster = tiny_cluster(2, 4, intra=Link(50e9, 5e-6), inter=Link(5e9, 2e-5))
    return prof, cluster, Job(global_batch_size=batch, memory_reserve_bytes=0)


def _ranked(result):
    return [(p.pp, p.dp, p.tp, p.vp, p.schedule, p.micro_batch_size, p.num_micro_batches,
             tuple(p.layers_per_stage), round(p.predicted.iteration_time_s, 12)) for p in result.plans]


def _family_best(result) -> dict:
    """Per family, the least time over the points the search split (the
    exhaustive search splits every point to its best)."""
    cols = result.point_columns
    best: dict = {}
    for k, status in enumerate(cols["status"]):
        if status == "ok":
            key = tuple(cols[c][k] for c in ("tp", "recompute", "pp", "dp", "schedule", "vp"))
            best[key] = min(best.get(key, math.inf), cols["iteration_time_s"][k])
    return best


def test_points_of_a_held_family_are_pruned_against_its_plan():
    """Random 7-layer profiles (tied and random layers, transfers on a
    2-node cluster) on 8 devices, global batch 32 (several micro-batch
    sizes per family), top 3. A family key taken from the wrong row or
    fields would prune points that enter the ranking (the list differs
    from the exhaustive one); a pruned point whose bound is below what it
    had to beat is caught point by point; and at least one point must be
    pruned below the K-th best (the rule at work)."""
    fired = 0
    for seed in range(8):
        prof, cluster, job = _instance(900 + seed, 7, 32)
        variant = [ModelVariant(prof)]
        exhaustive = search(variant, cluster, job, SearchOptions(top=TOP, exhaustive=True))
        pruned = search(variant, cluster, job, SearchOptions(top=TOP))
        assert _ranked(pruned) == _ranked(exhaustive), seed
        family = _family_best(exhaustive)
        kth = sorted(family.values())[TOP - 1]
        cols = pruned.point_columns
        for k, status in enumerate(cols["status"]):
            if status != "pruned":
                continue
            key = tuple(cols[c][k] for c in ("tp", "recompute", "pp", "dp", "schedule", "vp"))
            need = min(kth, family.get(key, math.inf))
            assert cols["lower_bound_s"][k] >= need * (1 - 1e-9), (seed, key, cols["lower_bound_s"][k], need)
            fired += cols["lower_bound_s"][k] < kth * (1 - 1e-9)
    assert fired > 0


def test_seeds_stop_at_the_first_group_that_cannot_lower_the_kth(monkeypatch):
    """The first cutoff's seeds stop at the first group (in bound order)
    whose bound is at least the K-th best seed time so far: its points and
    every later group's are at least that slow. Against the same search
    with every group's bound read as 0 (no group stops the seeds): the
    seeds taken are the first of the seeds taken there, fewer on at least
    one instance, and their K-th best (the first cutoff) is the same."""
    import pipesearch.search as search_mod

    def seeds(patch_bounds: bool, prof, cluster, job):
        taken = []
        seed_time = search_mod._seed_time_s

        def record(variant, cluster_, job_, row, *rest):
            t = seed_time(variant, cluster_, job_, row, *rest)
            taken.append((row["pp"], row["dp"], row["schedule"], row["vp"], row["num_micro_batches"], t))
            return t
        with monkeypatch.context() as m:
            m.setattr(search_mod, "_seed_time_s", record)
            if patch_bounds:
                order = search_mod.in_bound_order
                m.setattr(search_mod, "in_bound_order",
                          lambda groups, strengthen, skip=None: ((0.0, g) for _, g in order(groups, strengthen, skip)))
            search([ModelVariant(prof)], cluster, job, SearchOptions(top=TOP))
        return taken

    fewer = 0
    for seed in range(6):
        prof, cluster, job = _instance(950 + seed, 9, 64)
        stopped, every = seeds(False, prof, cluster, job), seeds(True, prof, cluster, job)
        assert stopped == every[:len(stopped)], seed
        assert _kth_family_time(stopped) == _kth_family_time(every), seed
        fewer += len(stopped) < len(every)
    assert fewer > 0


def _kth_family_time(seeds) -> float:
    """The K-th best of the least seed time of each family (pp, dp,
    schedule, vp) among ``seeds`` (the first cutoff before its tie margin)."""
    best: dict = {}
    for pp, dp, schedule, vp, _, t in seeds:
        best[pp, dp, schedule, vp] = min(best.get((pp, dp, schedule, vp), math.inf), t)
    times = sorted(best.values())
    return times[TOP - 1] if len(times) >= TOP else math.inf


def test_a_point_tying_the_kth_plan_is_searched_for_the_tie_break():
    """Six random layers on 4 devices of 17 GB with weight streaming from a
    PCIe host, top 2, 1F1B and interleaved 1F1B: rank 2's configuration
    (pp 1, dp 4) runs micro-batches 1 x 2 and 2 x 1 in exactly the same
    time, and the tie rule inside a configuration keeps 2 x 1 (half the
    bytes over PCIe). With the cutoff exactly the K-th plan's time the
    tying point was pruned (its bound equals its time) and the search kept
    1 x 2; the exhaustive search keeps 2 x 1, and so must the search."""
    from dataclasses import replace

    from helpers import pcie_host
    from pipesearch.types import Layer, ModelProfile

    rng = np.random.default_rng(70)
    L = int(rng.integers(3, 9))
    fwd = rng.uniform(0.5, 2.0, L).round(3).tolist()
    bwd = (np.array(fwd) * rng.uniform(1.5, 2.5, L)).round(3).tolist()
    params = (rng.uniform(0.1, 0.5, L) * 2e9).tolist()
    saved = (rng.uniform(0.5, 3.0, L) * 1e9).tolist()
    rng.random()
    outs = [float(rng.uniform(0, 0.2)) * 1e9 for _ in range(L)]
    prof = ModelProfile(name="mix", layers=tuple(
        Layer(name=f"l{k}", fwd_s=fwd[k], bwd_s=bwd[k], param_bytes=params[k], output_bytes=outs[k],
              saved_bytes=saved[k]) for k in range(L)), profiled_batch_size=1, bytes_per_param=2.0)
    cap = float(rng.uniform(6, 30)) * 1e9
    ndev = int(rng.choice([2, 4, 8]))
    host = pcie_host(cpu_adam_params_per_s=float(rng.choice([2.5e8, 1e9])))
    cluster = replace(tiny_cluster(1, ndev, memory_bytes=cap, intra=Link(20e9, 5e-6)), host=host)
    job = Job(global_batch_size=8, memory_reserve_bytes=0, optimizer_offload=False, weight_streaming=True)
    opts = dict(top=2, schedules=("1f1b", "interleaved-1f1b"))
    exhaustive = search([ModelVariant(prof)], cluster, job, SearchOptions(**opts, exhaustive=True))
    pruned = search([ModelVariant(prof)], cluster, job, SearchOptions(**opts))
    assert (exhaustive.plans[1].micro_batch_size, exhaustive.plans[1].num_micro_batches) == (2, 1)
    assert _ranked(pruned) == _ranked(exhaustive)
