"""Per-stage recompute chosen by the search (pipesearch.stage_options.StageOptions).

Oracles: memory and stage times written out by hand from the layer table
(recompute = one extra forward in backward, Chen et al. 2016 sec. 3; a
recomputed stage keeps its checkpoints per in-flight micro-batch plus one
layer's full activations while that layer's backward runs), and the
discrete-event simulator (pipesearch.timemodel.simulate_times) replaying
every split with every per-stage option, enumerated here.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from helpers import all_splits, tiny_cluster
from pipesearch.costs import build_pipeline_costs
from pipesearch.stage_options import range_max, range_max_table
from pipesearch.profiles.csv_profile import read_profile_csv, write_profile_csv
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.timemodel import StageTimes, simulate_times
from pipesearch.types import Job, Layer, ModelProfile

UNIT = 2**30  # one unit of memory: 1 GiB


def _profile(fwd, bwd, saved, ckpt, params=None) -> ModelProfile:
    L = len(fwd)
    params = params or [0.0] * L
    layers = tuple(Layer(name=f"l{k}", fwd_s=fwd[k], bwd_s=bwd[k], param_bytes=params[k], output_bytes=0.0,
                         saved_bytes=saved[k], recompute_saved_bytes=ckpt[k]) for k in range(L))
    return ModelProfile(name="rc", layers=layers, profiled_batch_size=1, bytes_per_param=2.0, source="test")


def _by_hand(profile: ModelProfile, bounds, options, in_flight, state_per_param_byte: float):
    """Stage times and device bytes of a split with per-stage options
    ("none" / "full"), straight from the layer table."""
    fwd, bwd, bin_, mem = [], [], [], []
    for s, (i, j) in enumerate(zip(bounds[:-1], bounds[1:])):
        lay = profile.layers[i:j]
        rc = [x.recompute_saved_bytes is not None for x in lay]
        full = options[s] == "full"
        f = sum(x.fwd_s for x in lay)
        extra = sum(x.fwd_s for x, r in zip(lay, rc) if r) if full else 0.0
        fwd.append(f)
        bwd.append(sum(x.bwd_s for x in lay) + extra)
        bin_.append(sum(x.bwd_s / 2 for x in lay) + extra)
        keep = sum((x.recompute_saved_bytes if (full and r) else x.saved_bytes) for x, r in zip(lay, rc))
        transient = max((x.saved_bytes for x, r in zip(lay, rc) if full and r), default=0.0)
        params = sum(x.param_bytes for x in lay)
        mem.append(params * state_per_param_byte + keep * in_flight[s] + transient)
    S = len(fwd)
    times = StageTimes(fwd_s=np.array(fwd), bwd_s=np.array(bwd), bwd_input_s=np.array(bin_),
                       p2p_s=np.zeros(S - 1), allreduce_s=np.zeros(S))
    return times, mem


def _brute_force(profile, pp, m, schedule, capacity, state_per_param_byte=0.0):
    """Least simulated time over every split x every per-stage option that
    fits, by enumeration; and every (split, options) attaining it."""
    in_flight = [min(m, pp - s) for s in range(pp)] if schedule == "1f1b" else [m] * pp
    best, arg = np.inf, []
    for bounds in all_splits(profile.num_layers, pp):
        for options in itertools.product(("none", "full"), repeat=pp):
            times, mem = _by_hand(profile, bounds, options, in_flight, state_per_param_byte)
            if max(mem) > capacity:
                continue
            t, _ = simulate_times(schedule, pp, m, 1, times)
            if t < best - 1e-12:
                best, arg = t, [(bounds, options)]
            elif abs(t - best) <= 1e-12:
                arg.append((bounds, options))
    return best, arg


def _search(profile, pp, m, capacity, schedule="1f1b", split=None):
    cluster = tiny_cluster(1, pp, memory_bytes=capacity)
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=(schedule,), top=1,
                         split=split)
    return search([ModelVariant(profile)], cluster, job, opts).plans[0]


def test_recompute_on_stage_zero_only_hand_checked():
    """8 layers, P = 4, m = 8, 1F1B (stage s holds 4 - s micro-batches),
    capacity 8 units. Each layer: forward 1 s, backward 2 s, 1.25 units of
    activations, a 0.25-unit checkpoint when recomputed.

    Split [2, 2, 2, 2]: stage 0 without recompute needs 2 x 1.25 x 4 = 10
    units > 8; with it 2 x 0.25 x 4 = 2 (1 unit per layer) + 1.25 (one
    layer re-created) = 3.25 <= 8. Stage 1 needs 2 x 1.25 x 3 = 7.5 <= 8,
    stage 2 5, stage 3 2.5: no recompute there. So stage 0 runs F = 2 s,
    B = 2 x (2 + 1) = 6 s, the others F = 2 s, B = 4 s. A global switch
    cannot do this: all-recompute makes every stage's B 6 s; no recompute
    cannot hold two layers on stage 0 at all."""
    prof = _profile([1.0] * 8, [2.0] * 8, [1.25 * UNIT] * 8, [0.25 * UNIT] * 8)
    plan = _search(prof, 4, 8, 8 * UNIT)
    assert plan.layers_per_stage == (2, 2, 2, 2)
    assert [st.memory_option for st in plan.stages] == ["full", "none", "none", "none"]
    assert dict(plan.extra)["recompute"] == "per-stage"  # exporters refuse what they cannot express
    assert [st.fwd_s for st in plan.stages] == [2.0, 2.0, 2.0, 2.0]
    assert [st.compute_s - st.fwd_s for st in plan.stages] == [6.0, 4.0, 4.0, 4.0]
    assert plan.stages[0].memory_bytes == pytest.approx(3.25 * UNIT)
    assert plan.stages[1].memory_bytes == pytest.approx(7.5 * UNIT)
    hand = StageTimes(fwd_s=np.full(4, 2.0), bwd_s=np.array([6.0, 4, 4, 4]), bwd_input_s=np.array([4.0, 2, 2, 2]),
                      p2p_s=np.zeros(3), allreduce_s=np.zeros(4))
    assert plan.predicted.iteration_time_s == pytest.approx(simulate_times("1f1b", 4, 8, 1, hand)[0])
    # and it is the best of every split x per-stage option (enumerated)
    best, arg = _brute_force(prof, 4, 8, "1f1b", 8 * UNIT)
    assert plan.predicted.iteration_time_s == pytest.approx(best)
    assert ((0, 2, 4, 6, 8), ("full", "none", "none", "none")) in arg
    # a global switch is strictly worse: all stages recomputed on the same split
    allrc = StageTimes(fwd_s=np.full(4, 2.0), bwd_s=np.full(4, 6.0), bwd_input_s=np.full(4, 4.0),
                       p2p_s=np.zeros(3), allreduce_s=np.zeros(4))
    assert simulate_times("1f1b", 4, 8, 1, allrc)[0] > plan.predicted.iteration_time_s


CASES = [  # (seed, layers, pp, m, schedule, capacity in units): each optimum mixes options
    (0, 6, 3, 4, "1f1b", 6.0), (1, 7, 3, 6, "1f1b", 3.0), (2, 6, 2, 3, "gpipe", 8.0),
    (3, 8, 4, 8, "1f1b", 3.0), (4, 5, 2, 4, "1f1b", 4.0), (5, 7, 3, 3, "gpipe", 5.0),
    (6, 9, 3, 5, "1f1b", 4.0),
]


@pytest.mark.parametrize("seed,L,pp,m,schedule,cap", CASES)
def test_search_equals_brute_force_over_splits_and_options(seed, L, pp, m, schedule, cap):
    """Random layer tables (some layers not recomputable): the search's best
    time equals the least simulated time over every split x every
    per-stage option that fits (the brute force above)."""
    rng = np.random.default_rng(seed)
    fwd = rng.uniform(0.5, 2.0, L).round(3).tolist()
    bwd = (np.array(fwd) * rng.uniform(1.5, 2.5, L)).round(3).tolist()
    saved = (rng.uniform(0.3, 1.5, L) * UNIT).tolist()
    ckpt = [None if rng.random() < 0.25 else 0.1 * s for s in saved]
    prof = _profile(fwd, bwd, saved, ckpt)
    best, arg = _brute_force(prof, pp, m, schedule, cap * UNIT)
    assert any(len(set(options)) > 1 for _, options in arg)  # the case needs a per-stage choice
    plan = _search(prof, pp, m, cap * UNIT, schedule)
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    bounds = (0,) + tuple(np.cumsum(plan.layers_per_stage))
    options = tuple(st.memory_option for st in plan.stages)
    assert (bounds, options) in arg or plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-3)


def test_pinned_split_gets_its_per_stage_options():
    """--split [2, 2, 2, 2] of the hand case: the options are those derived
    by hand above, without a search."""
    prof = _profile([1.0] * 8, [2.0] * 8, [1.25 * UNIT] * 8, [0.25 * UNIT] * 8)
    plan = _search(prof, 4, 8, 8 * UNIT, split=(2, 2, 2, 2))
    assert [st.memory_option for st in plan.stages] == ["full", "none", "none", "none"]


def test_profile_without_recompute_column_has_no_options(tmp_path):
    """A profile without the column keeps one option (the costs are those
    of before): the hand case then has no plan with two layers on stage 0."""
    prof = _profile([1.0] * 8, [2.0] * 8, [1.25 * UNIT] * 8, [None] * 8)
    plan = _search(prof, 4, 8, 8 * UNIT)
    assert all(st.memory_option == "" for st in plan.stages)
    assert plan.layers_per_stage[0] == 1  # 2 x 1.25 x 4 = 10 units > 8


def test_csv_round_trip_of_recompute_saved_bytes(tmp_path):
    prof = _profile([1.0, 2.0], [2.0, 3.0], [100.0, 200.0], [10.0, None])
    path = tmp_path / "p.csv"
    write_profile_csv(prof, path)
    text = path.read_text()
    assert next(x for x in text.splitlines() if x.startswith("name,")).endswith(",recompute_saved_bytes")
    back = read_profile_csv(path)
    assert [x.recompute_saved_bytes for x in back.layers] == [10.0, None]


def test_csv_bad_recompute_saved_bytes(tmp_path):
    from pipesearch.errors import InputError

    path = tmp_path / "bad.csv"
    path.write_text("# batch_size: 1\nname,fwd_ms,bwd_ms,param_bytes,output_bytes,recompute_saved_bytes\n"
                    "a,1,2,0,10,-3\n")
    with pytest.raises(InputError, match=r"line 3, column 'recompute_saved_bytes'.*negative"):
        read_profile_csv(path)
    # more than the layer saves (saved_bytes defaults to output_bytes, 10)
    path.write_text("# batch_size: 1\nname,fwd_ms,bwd_ms,param_bytes,output_bytes,recompute_saved_bytes\n"
                    "a,1,2,0,10,100\n")
    with pytest.raises(InputError, match=r"line 3, column 'recompute_saved_bytes'.*exceeds the layer's saved"):
        read_profile_csv(path)


def test_range_max_matches_python_max():
    rng = np.random.default_rng(7)
    values = rng.uniform(0, 10, 13)
    table = range_max_table(values)
    i, j = np.meshgrid(np.arange(14), np.arange(14), indexing="ij")
    got = range_max(table, i, j)
    want = np.array([[max(values[a:b], default=0.0) for b in range(14)] for a in range(14)])
    assert np.array_equal(got, want)


def test_costs_choose_the_first_fitting_option_per_range():
    """fits / memory_bytes / fwd_s / bwd_s over a grid of (i, j) against the
    hand formulas: the fastest option that fits."""
    prof = _profile([1.0] * 4, [2.0] * 4, [1.0 * UNIT] * 4, [0.25 * UNIT, None, 0.25 * UNIT, 0.25 * UNIT])
    cluster = tiny_cluster(1, 2, memory_bytes=3 * UNIT)
    job = Job(global_batch_size=2, memory_reserve_bytes=0)
    costs = build_pipeline_costs(prof, cluster, job, pp=2, dp=1, micro_batch_size=1, num_micro_batches=2,
                                 schedule="1f1b", placement=np.array([[0], [1]]))
    i, j = np.meshgrid(np.arange(5), np.arange(5), indexing="ij")
    for s in range(2):
        flight = min(2, 2 - s)
        for a in range(5):
            for b in range(a + 1, 5):
                opts = []
                for full in (False, True):
                    _, mem = _by_hand(prof, (a, b), ["full" if full else "none"], [flight], 0.0)
                    opts.append(mem[0])
                k = 0 if opts[0] <= 3 * UNIT else (1 if opts[1] <= 3 * UNIT else None)
                got_fit = costs.fits(s, i, j)[a, b]
                assert got_fit == (k is not None)
                kk = k or 0
                rc_f = sum(1.0 for x in prof.layers[a:b] if x.recompute_saved_bytes is not None) if kk else 0.0
                assert costs.bwd_s(s, i, j)[a, b] == pytest.approx(2.0 * (b - a) + rc_f)
                assert costs.fwd_s(s, i, j)[a, b] == pytest.approx(1.0 * (b - a))
                assert costs.memory_bytes(s, i, j)[a, b] == pytest.approx(opts[kk])


TINY = """[transformer]
kind = "decoder"
num_layers = 6
hidden_size = 512
num_attention_heads = 8
ffn_hidden_size = 2048
vocab_size = 4096
seq_len = 1024
tied_embeddings = false
"""


def _gpu_step_s(layers) -> float:
    """The optimizer step of a stage holding ``layers`` on tiny_device: 28 B
    per parameter (mixed-precision Adam; 2 B each in the tables) at 0.8 x
    1e12 B/s, after its last backward."""
    return sum(x.param_bytes for x in layers) / 2 * 28 / 0.8e12


def _transformer_brute_force(tables, pp, m, capacity):
    """Every split x every per-stage mode of the none / selective / full
    tables: stage times and memory summed from each table's layers (16 B of
    state per parameter, the table's saved bytes per in-flight micro-batch,
    the largest backward transient of its layers; its optimizer step
    after its last backward, :func:`_gpu_step_s`), simulated."""
    in_flight = [min(m, pp - s) for s in range(pp)]
    L = tables[0][1].num_layers
    best, arg = np.inf, []
    for bounds in all_splits(L, pp):
        for choice in itertools.product(range(len(tables)), repeat=pp):
            fwd, bwd, bin_, step, ok = [], [], [], [], True
            for s, (i, j) in enumerate(zip(bounds[:-1], bounds[1:])):
                lay = tables[choice[s]][1].layers[i:j]
                step.append(_gpu_step_s(lay))
                fwd.append(sum(x.fwd_s for x in lay))
                bwd.append(sum(x.bwd_s for x in lay))
                bin_.append(sum(x.bwd_s / 2 if x.bwd_input_s is None else x.bwd_input_s for x in lay))
                # the stage's largest backward transient (what a recomputing block holds once more) on top
                mem = (sum(x.param_bytes for x in lay) / 2 * 16 + sum(x.saved_bytes for x in lay) * in_flight[s]
                       + max(x.backward_transient_bytes or 0.0 for x in lay))
                ok &= mem <= capacity
            if not ok:
                continue
            t, _ = simulate_times("1f1b", pp, m, 1, StageTimes(np.array(fwd), np.array(bwd), np.array(bin_),
                                                               np.zeros(pp - 1), np.array(step)))
            if t < best * (1 - 1e-12):
                best, arg = t, [(bounds, tuple(tables[c][0] for c in choice))]
    return best, arg


@pytest.mark.parametrize("capacity_mib", [220, 280, 300, 400])
def test_transformer_per_stage_recompute_equals_brute_force(tmp_path, capacity_mib):
    """A 6-block decoder (8 layers with embedding and head), pp 3, m 6, 1F1B,
    micro-batch 1: --recompute per-stage takes per stage the first of the
    none / selective / full tables that fits; its best time is the least
    over every split x every per-stage mode (enumerated, simulated)."""
    from pipesearch.models import load_model_source

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    cluster = tiny_cluster(1, 3, memory_bytes=capacity_mib * 2**20)
    src = load_model_source(str(path), cluster, tp=1, recompute="per-stage")
    (variant,) = src.variants
    assert [n for n, _ in variant.stage_tables] == ["none", "selective", "full"]
    best, arg = _transformer_brute_force(variant.stage_tables, 3, 6, capacity_mib * 2**20)
    assert np.isfinite(best) and any(len(set(o)) > 1 for _, o in arg)
    job = Job(global_batch_size=6, memory_reserve_bytes=0)
    opts = SearchOptions(pp=3, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("1f1b",), top=1)
    plan = search(list(src.variants), cluster, job, opts, profiled_device=src.profiled_device).plans[0]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    assert dict(plan.extra)["recompute"] == "per-stage"


def test_recompute_pin_none_turns_the_column_off(tmp_path):
    """--recompute none on a profile with the column: the pin is honoured
    (no layer recomputed, so the hand case puts one layer on stage 0);
    --recompute full is refused for a profile."""
    from pipesearch.errors import InputError
    from pipesearch.models import load_model_source

    prof = _profile([1.0] * 8, [2.0] * 8, [1.25 * UNIT] * 8, [0.25 * UNIT] * 8)
    path = tmp_path / "rc.csv"
    write_profile_csv(prof, path)
    cluster = tiny_cluster(1, 4, memory_bytes=8 * UNIT)
    (free,) = load_model_source(str(path), cluster).variants
    (pinned,) = load_model_source(str(path), cluster, recompute="none").variants
    assert free.recompute == "per-stage" and pinned.recompute == "none"
    job = Job(global_batch_size=8, memory_reserve_bytes=0)
    opts = SearchOptions(pp=4, dp=1, micro_batch_size=1, num_micro_batches=8, schedules=("1f1b",), top=1)
    assert search([free], cluster, job, opts).plans[0].layers_per_stage == (2, 2, 2, 2)
    plan = search([pinned], cluster, job, opts).plans[0]
    assert plan.layers_per_stage[0] == 1 and all(st.memory_option == "" for st in plan.stages)
    with pytest.raises(InputError, match="--recompute full: needs a transformer config"):
        load_model_source(str(path), cluster, recompute="full")


def _transformer_act_brute_force(tables, pp, m, capacity, bw):
    """Every split x every per-stage choice of the none / selective / full
    tables and full with its activations in host memory (GPipe: ``m`` in
    flight, 3 kept on the GPU when offloaded, each action ``max(compute,
    saved / bw)``, the largest backward transient of a stage's layers on
    top), replayed by the time model."""
    from pipesearch.timemodel import iteration_time_s

    L = tables[0][1].num_layers
    names = [n for n, _ in tables] + ["full+act-host"]
    best, arg = np.inf, []
    for bounds in all_splits(L, pp):
        for choice in itertools.product(range(len(names)), repeat=pp):
            fwd, bwd, bin_, step, ok = [], [], [], [], True
            for s, (i, j) in enumerate(zip(bounds[:-1], bounds[1:])):
                act = names[choice[s]].endswith("act-host")
                lay = tables[min(choice[s], len(tables) - 1)][1].layers[i:j]
                step.append(_gpu_step_s(lay))
                f, b = sum(x.fwd_s for x in lay), sum(x.bwd_s for x in lay)
                bi = sum(x.bwd_s / 2 if x.bwd_input_s is None else x.bwd_input_s for x in lay)
                kept = sum(x.saved_bytes for x in lay)
                x = kept / bw if act else 0.0
                fwd.append(max(f, x))
                bwd.append(max(b, x))
                bin_.append(bi * max(b, x) / b if b > 0 else bi)
                mem = (sum(x.param_bytes for x in lay) / 2 * 16 + kept * (min(m, 3) if act else m)
                       + max(x.backward_transient_bytes or 0.0 for x in lay))  # the recomputing block's, once
                ok &= mem <= capacity
            if not ok:
                continue
            t = iteration_time_s("gpipe", pp, m, 1, StageTimes(np.array(fwd), np.array(bwd), np.array(bin_),
                                                                np.zeros(pp - 1), np.array(step)))
            if t < best * (1 - 1e-12):
                best, arg = t, [(bounds, tuple(names[c] for c in choice))]
            elif t <= best * (1 + 1e-12):
                arg.append((bounds, tuple(names[c] for c in choice)))
    return best, arg


@pytest.mark.parametrize("capacity_mib", [190, 210])  # from 220 MiB full recomputation fits without the offload
def test_transformer_per_stage_recompute_with_activation_offload(tmp_path, capacity_mib):
    """The 6-block decoder, pp 3, GPipe, m 6, GPUs 0-2 under one switch of
    20 GB/s (20 / 3 GB/s each: a block's 1 MiB checkpoint takes 0.16 ms, its
    forward 0.17 ms, the head's 18 MiB 2.8 ms against 0.09 ms):
    --recompute per-stage --activation-offload takes per stage the first of
    none / selective / full / full+act-host that fits; its best time is the
    least over every split x every per-stage choice, replayed by the time
    model, and the least needs the offload somewhere."""
    from pipesearch.models import load_model_source
    from pipesearch.types import HostSpec

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    host = HostSpec(memory_bytes=1e12, pcie_generation=4, pcie_lanes_per_gpu=16, host_to_device_bytes_per_s=20e9,
                    switch_uplink_bytes_per_s=20e9, pcie_switches=((0, 1, 2),), cpu_adam_params_per_s=1e9)
    cluster = replace(tiny_cluster(1, 3, memory_bytes=capacity_mib * 2**20), host=host)
    src = load_model_source(str(path), cluster, tp=1, recompute="per-stage")
    (variant,) = src.variants
    best, arg = _transformer_act_brute_force(variant.stage_tables, 3, 6, capacity_mib * 2**20, 20e9 / 3)
    assert np.isfinite(best) and all(any("act-host" in o for o in opts) for _, opts in arg)
    job = Job(global_batch_size=6, memory_reserve_bytes=0, activation_offload=True)
    opts = SearchOptions(pp=3, dp=1, micro_batch_size=1, num_micro_batches=6, schedules=("gpipe",), top=1)
    plan = search(list(src.variants), cluster, job, opts, profiled_device=src.profiled_device).plans[0]
    assert plan.predicted.iteration_time_s == pytest.approx(best, rel=1e-9)
    got = ((0,) + tuple(int(x) for x in np.cumsum(plan.layers_per_stage)),
           tuple(st.memory_option for st in plan.stages))
    assert got in arg


def test_range_max_over_a_stack_of_tables_is_each_tables_own():
    """``range_max`` of a ``(K, levels, L)`` stack (every option's table at
    once) equals ``max(values[i:j])`` of each option's values, by brute
    force over every range, 0 on empty ranges."""
    rng = np.random.default_rng(7)
    values = rng.exponential(1.0, (4, 13)) * (rng.random((4, 13)) < 0.8)
    stack = np.stack([range_max_table(v) for v in values])
    i, j = np.meshgrid(np.arange(14), np.arange(14), indexing="ij")
    got = range_max(stack, i, j)
    assert got.shape == (4, 14, 14)
    for k in range(4):
        for a in range(14):
            for b in range(14):
                assert got[k, a, b] == (values[k, a:b].max() if b > a else 0.0)
