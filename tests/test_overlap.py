"""Communication overlap (pipesearch.overlap): the exposed part of a
bucketed collective, its place in the time model, the exact split with it,
and the runtime presets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import tiny_cluster, tiny_profile
from pipesearch.cli import main
from pipesearch.costs import build_pipeline_costs
from pipesearch.memory import ParamState
from pipesearch.overlap import CommOverlap, exposed_s
from pipesearch.placement import pipeline_placement
from pipesearch.schedules import build, in_flight_peaks
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.split_search import exact_split, exhaustive_simulated_split
from pipesearch.types import Job, Link


def _bucket_queue_s(comm_s: float, window_s: float, k: int) -> float:
    """The definition, replayed event by event: bucket ``q = 1..k`` is ready
    at ``q W / k``; the network runs one bucket's collective (``C / k``) at a
    time, in order. Returns how long the last one ends after the window."""
    free = 0.0
    for q in range(1, k + 1):
        free = max(free, q * window_s / k) + comm_s / k
    return free - window_s


def test_exposed_by_hand():
    """C = 6, W = 4, K = 2: buckets ready at 2 and 4, each reduce 3 s:
    2 -> 5, then 5 -> 8, 4 s after the window. K = 1: all 6 s. C = 3, W = 6,
    K = 3: ready at 2, 4, 6, each 1 s: the last ends at 7, 1 s after."""
    assert exposed_s(6.0, 4.0, 2) == pytest.approx(4.0)
    assert exposed_s(6.0, 4.0, 1) == pytest.approx(6.0)
    assert exposed_s(3.0, 6.0, 3) == pytest.approx(1.0)
    assert exposed_s(0.0, 6.0, 3) == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_exposed_equals_the_bucket_queue(seed):
    rng = np.random.default_rng(seed)
    c, w, k = float(rng.exponential(1.0)), float(rng.exponential(1.0)), int(rng.integers(1, 50))
    assert exposed_s(c, w, k) == pytest.approx(_bucket_queue_s(c, w, k), rel=1e-12, abs=1e-12)


def _one_stage_time(state: ParamState, overlap: CommOverlap | None) -> float:
    """One layer (forward 10 ms, backward 20 ms, 1 GB of parameters at 2
    bytes each = 0.5e9 parameters), pp 1, dp 2 on one node at 100 GB/s with
    no latency, one micro-batch per replica."""
    prof = tiny_profile([0.010], [0.020], params=[1e9], bytes_per_param=2.0)
    cluster = tiny_cluster(1, 2, intra=Link(100e9, 0.0))
    job = Job(global_batch_size=2, memory_reserve_bytes=0, param_state=state, comm_overlap=overlap)
    res = search([ModelVariant(prof)], cluster, job, SearchOptions(pp=1, dp=2, micro_batch_size=1,
                                                                   schedules=("1f1b",)))
    return res.plans[0].predicted.iteration_time_s


MIXED = ParamState(2, 2, 0, 4, 8, "none")
#: the one-layer job's optimizer step after its reduce, ms: 0.5e9 parameters x 28 B streamed each (2 B gradient
#: read, 4 B master and 8 B moments read and written, 2 B weights written) at 0.8 x tiny_device's 1e12 B/s;
#: half of them under ZeRO-1 (each replica steps its shard), 30 B each with Megatron's fp32 main gradient
STEP_MS = 0.5e9 * 28 / 0.8e12 * 1e3  # 17.5
STEP_ZERO1_MS = STEP_MS / 2
STEP_MEGATRON_ZERO1_MS = 0.25e9 * 30 / 0.8e12 * 1e3  # 9.375
MIXED_ZERO1 = ParamState(2, 2, 0, 4, 8, "zero1")
MEGATRON_ZERO1 = ParamState(2, 0, 4, 4, 8, "zero1")


def test_overlap_in_the_time_model_by_hand():
    """The one-layer job of :func:`_one_stage_time`. Ring all-reduce of the
    1 GB of 16-bit gradients over 2 ranks: 2 (1/2) 1e9 / 100e9 = 10 ms; 40 M
    parameters per bucket: K = ceil(0.5e9 / 40e6) = 13.

    * no overlap: 10 + 20 + 10 = 40 ms;
    * gradient reduce under the 20 ms backward: max(10/13, 10 - 20 (12/13))
      = 10/13 ms exposed;
    * ZeRO-1: reduce-scatter 5 ms and all-gather 5 ms. Reduce overlapped
      only: 5/13 + 5; both: the all-gather under the 10 ms forward,
      max(5/13, 5 - 10 (12/13)) = 5/13, so 10/13 in all;
    * Megatron's state reduces its fp32 main gradients (4 B/param): a 2 GB
      reduce-scatter, 10 ms, and the 1 GB bf16 all-gather, 5 ms; no overlap:
      45 ms; both overlapped: max(10/13, 10 - 20 (12/13)) + 5/13 = 15/13;
    * each then adds its optimizer step (``STEP_MS`` and its ZeRO-1 shares)."""
    ms = 1e-3
    step, step1, step_m = STEP_MS, STEP_ZERO1_MS, STEP_MEGATRON_ZERO1_MS
    assert _one_stage_time(MIXED, None) == pytest.approx((40 + step) * ms, rel=1e-9)
    assert _one_stage_time(MIXED, CommOverlap(grad_reduce=True)) == pytest.approx((30 + 10 / 13 + step) * ms,
                                                                                  rel=1e-9)
    assert _one_stage_time(MIXED_ZERO1, CommOverlap(grad_reduce=True)) == pytest.approx(
        (30 + 5 / 13 + 5 + step1) * ms, rel=1e-9)
    both = CommOverlap(grad_reduce=True, param_gather=True)
    assert _one_stage_time(MIXED_ZERO1, both) == pytest.approx((30 + 10 / 13 + step1) * ms, rel=1e-9)
    assert _one_stage_time(MEGATRON_ZERO1, None) == pytest.approx((45 + step_m) * ms, rel=1e-9)
    assert _one_stage_time(MEGATRON_ZERO1, both) == pytest.approx((30 + 15 / 13 + step_m) * ms, rel=1e-9)
    # one bucket per layer: K = 1, nothing hides
    assert _one_stage_time(MIXED, CommOverlap(grad_reduce=True, bucket_params=None)) == pytest.approx(
        (40 + step) * ms)


def test_zero2_and_zero3_without_a_pipeline_recur_every_micro_batch():
    """The one-layer job (forward 10 ms, backward 20 ms, 1 GB of 16-bit
    gradients; a reduce-scatter or an all-gather over 2 ranks 5 ms each),
    pp 1 with m micro-batches per replica. ZeRO-1: one reduce-scatter and one
    all-gather per iteration, 30 m + 10 ms. ZeRO-2 reduce-scatters every
    micro-batch and gathers once: 30 m + 5 m + 5. ZeRO-3 also gathers the
    weights for every forward and again for every backward: 30 m + 15 m ms
    (ZeRO SC'20 sec. 7.2.2: 3 Psi against 2 Psi for m = 1). Overlapped in
    K = 13 buckets, ZeRO-3's backward carries its reduce-scatter and
    re-gather (10 ms) under 20 ms: max(10/13, 10 - 20 (12/13)) = 10/13 each,
    the forward gather 5/13 each: 30 m + 15 m / 13. Each then steps its
    half of the parameters once, ``STEP_ZERO1_MS``."""
    prof = tiny_profile([0.010], [0.020], params=[1e9], bytes_per_param=2.0)
    cluster = tiny_cluster(1, 2, intra=Link(100e9, 0.0))

    def t(sharding, m, overlap=None):
        job = Job(global_batch_size=2 * m, memory_reserve_bytes=0, param_state=ParamState(2, 2, 0, 4, 8, sharding),
                  comm_overlap=overlap)
        res = search([ModelVariant(prof)], cluster, job, SearchOptions(pp=1, dp=2, micro_batch_size=1,
                                                                       schedules=("1f1b",)))
        return res.plans[0].predicted.iteration_time_s

    ms, step = 1e-3, STEP_ZERO1_MS
    for m in (1, 3):
        assert t("zero1", m) == pytest.approx((30 * m + 10 + step) * ms, rel=1e-9)
        assert t("zero2", m) == pytest.approx((35 * m + 5 + step) * ms, rel=1e-9)
        assert t("zero3", m) == pytest.approx((45 * m + step) * ms, rel=1e-9)
        both = CommOverlap(grad_reduce=True, param_gather=True)
        assert t("zero3", m, both) == pytest.approx((30 * m + 15 * m / 13 + step) * ms, rel=1e-9)


def test_every_bucket_pays_the_latency():
    """The one-layer job with 100 us links: ring all-reduce over 2 ranks
    2 (1/2) 1e9 / 100e9 + 2 (1) 1e-4 = 10.2 ms without overlap (T = 40.2 ms).
    Overlapped in buckets of 1e8 parameters (K = 5): each bucket pays the
    0.2 ms latency, C = 10 + 5 (0.2) = 11 ms, exposed max(11/5, 11 - 20 (4/5))
    = 2.2 ms: T = 32.2 ms. One-parameter buckets (K = 5e8) pay 5e8 latencies:
    far slower than no overlap. Each adds the optimizer step,
    ``STEP_MS``."""
    prof = tiny_profile([0.010], [0.020], params=[1e9], bytes_per_param=2.0)
    cluster = tiny_cluster(1, 2, intra=Link(100e9, 1e-4))

    def t(overlap):
        job = Job(global_batch_size=2, memory_reserve_bytes=0, param_state=MIXED, comm_overlap=overlap)
        return search([ModelVariant(prof)], cluster, job, SearchOptions(pp=1, dp=2, micro_batch_size=1,
                                                                        schedules=("1f1b",))).plans[0]

    ms = 1e-3
    assert t(None).predicted.iteration_time_s == pytest.approx((40.2 + STEP_MS) * ms, rel=1e-9)
    assert t(CommOverlap(grad_reduce=True, bucket_params=1e8)).predicted.iteration_time_s == pytest.approx(
        (32.2 + STEP_MS) * ms, rel=1e-9)
    assert t(CommOverlap(grad_reduce=True, bucket_params=1)).predicted.iteration_time_s > 1000.0


def test_zero_bubble_hides_the_reduce_under_the_weight_gradient_only():
    """Two identical stages of one layer, ZB-H1, m = 2, dp = 2, one node of
    4 devices at 100 GB/s (the layers send nothing): forward 1 s, backward 2 s of which
    the input gradient is 1.5 s, so the weight gradient (the window the
    reduce can hide in: zero-bubble schedules accumulate weight gradients in
    W) is 0.5 s. 100 GB of 16-bit parameters per stage: ring all-reduce
    2 (1/2) 100e9 / 100e9 = 1 s. One bucket per parameter (K = 5e10): exposed
    max(1/K, 1 - (1 - 1/K) 0.5) = 0.5 s + 1e-11 per stage (under the whole
    2 s backward it would be 1/K), so the iteration is 0.5 s shorter. Each
    stage then steps its 50e9 parameters: 50e9 x 28 B / 0.8e12 B/s = 1.75 s."""
    prof = tiny_profile([1.0, 1.0], [2.0, 2.0], params=[100e9, 100e9], bytes_per_param=2.0)
    prof = type(prof)(**{**prof.__dict__, "layers": tuple(
        type(lay)(**{**lay.__dict__, "bwd_input_s": 1.5}) for lay in prof.layers)})
    cluster = tiny_cluster(1, 4, memory_bytes=1e15, intra=Link(100e9, 0.0))
    opts = SearchOptions(pp=2, dp=2, micro_batch_size=1, schedules=("zb-h1",), split=(1, 1))

    def plan(overlap):
        job = Job(4, memory_reserve_bytes=0, param_state=MIXED, comm_overlap=overlap)
        return search([ModelVariant(prof)], cluster, job, opts).plans[0]

    plain, over = plan(None), plan(CommOverlap(grad_reduce=True, bucket_params=1))
    assert [st.allreduce_s for st in plain.stages] == pytest.approx([1.0 + 1.75, 1.0 + 1.75])
    assert [st.allreduce_s for st in over.stages] == pytest.approx([0.5 + 1e-11 + 1.75] * 2, rel=1e-9)
    assert [st.optimizer_step_s for st in over.stages] == pytest.approx([1.75] * 2, rel=1e-12)
    assert [st.dp_comm_s for st in over.stages] == pytest.approx([1.0, 1.0])  # all of it, before overlap
    assert over.predicted.iteration_time_s == pytest.approx(plain.predicted.iteration_time_s - 0.5, rel=1e-9)


def _random_costs(seed: int):
    rng = np.random.default_rng(seed)
    schedule = ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")[seed % 4]
    pp = int(rng.integers(2, 4))
    vp = 2 if schedule == "interleaved-1f1b" else 1
    L = int(rng.integers(pp * vp, 9))
    m = pp * int(rng.integers(1, 3)) if vp > 1 else int(rng.integers(pp, pp + 4))
    prof = tiny_profile(rng.exponential(1e-3, L), rng.exponential(2e-3, L), params=rng.exponential(1e7, L),
                        outputs=rng.exponential(1e6, L), bytes_per_param=2.0)
    cluster = tiny_cluster(2, pp, intra=Link(1e10, 1e-5), inter=Link(float(rng.choice([1e8, 1e9])), 1e-4))
    state = ParamState(2, 2, 0, 4, 8, str(rng.choice(["none", "zero1", "zero3"])))
    overlap = CommOverlap(grad_reduce=bool(rng.random() < 0.8), param_gather=bool(rng.random() < 0.5),
                          bucket_params=float(rng.choice([1e5, 1e6, 1e7])) if rng.random() < 0.7 else None)
    job = Job(global_batch_size=2 * m, memory_reserve_bytes=0, param_state=state, comm_overlap=overlap)
    peaks = np.array(in_flight_peaks(build(schedule, pp, m, vp)))
    costs = build_pipeline_costs(prof, cluster, job, pp=pp * vp, dp=2, micro_batch_size=1, num_micro_batches=m,
                                 schedule=schedule, placement=pipeline_placement(pp, 2)[np.arange(pp * vp) % pp],
                                 in_flight=peaks, stages_per_device=vp)
    return costs, schedule, pp, vp


@pytest.mark.parametrize("seed", range(24))
def test_exact_split_with_overlap_equals_brute_force(seed):
    """The exposed all-reduce depends on the stage's backward and forward,
    so the split search's bound families see a different per-stage term:
    with random overlap settings the branch and bound still equals the best
    simulated split over every split."""
    costs, schedule, pp, vp = _random_costs(seed)
    ref = exhaustive_simulated_split(costs, schedule, pp, vp)
    got = exact_split(costs, schedule, pp, vp)
    assert got is not None and got.exact
    assert got.iteration_time_s == pytest.approx(ref[0], rel=1e-9)


def _plan_json(*args, model="gpt3-1.3b"):
    res = CliRunner().invoke(main, ["plan", "--model", model, "--cluster", "2x8-a100-80gb", "-b", "512",
                                    "--pp", "2", "--tp", "2", "--json", "--top", "1", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_runtime_presets_and_their_overrides():
    """--runtime megatron trains with Megatron's state sharded (the
    distributed optimizer) and both data-parallel collectives overlapped, and
    the export writes the flags that turn them on; --no-overlap-grad-reduce
    overrides the preset; with overlap the step is shorter."""
    meg = _plan_json("--runtime", "megatron")
    job = meg["inputs"]["job"]
    assert job["optimizer_state"]["name"] == "megatron" and job["optimizer_state"]["sharding"] == "zero1"
    assert job["comm_overlap"]["grad_reduce"] and job["comm_overlap"]["param_gather"]
    args = meg["plans"][0]["exports"]["megatron"]["args"]
    assert {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"} <= set(args)
    off = _plan_json("--runtime", "megatron", "--no-overlap-grad-reduce", "--no-overlap-param-gather")
    assert not off["inputs"]["job"]["comm_overlap"]["grad_reduce"]
    assert "--overlap-grad-reduce" not in off["plans"][0]["exports"]["megatron"]["args"]
    assert meg["plans"][0]["predicted"]["iteration_time_s"] < off["plans"][0]["predicted"]["iteration_time_s"]


def test_runtime_refuses_overlap_it_does_not_have():
    res = CliRunner().invoke(main, ["plan", "--runtime", "deepspeed", "--overlap-grad-reduce", "-q"])
    assert res.exit_code == 2
    assert "deepspeed cannot overlap it" in res.output and "Traceback" not in res.output


def test_tp_comm_overlap_shortens_the_forward():
    """--tp-comm-overlap hides a block's forward collectives under its GEMMs:
    with tp 2 every block's forward is shorter, and by at most its
    collectives (the table of a plan does not show them: compare plans)."""
    a = _plan_json("--split", "14,12")
    b = _plan_json("--split", "14,12", "--tp-comm-overlap")
    fa, fb = (sum(st["fwd_s"] for st in p["plans"][0]["stages"]) for p in (a, b))
    assert fb < fa


def test_megatron_refuses_sharding_its_distributed_optimizer_does_not_do():
    """Megatron-LM's distributed optimizer is ZeRO-1; a plan whose memory
    assumes sharded gradients or weights is refused, with the reason."""
    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "512",
                                    "--pp", "2", "--tp", "2", "--runtime", "megatron", "--sharding", "zero3", "-q"])
    assert res.exit_code == 2
    assert "--sharding zero3" in res.output and "none / zero1" in res.output


def test_torchtitan_runs_fsdp_and_exports_its_shard_degree():
    """--runtime torchtitan plans with FSDP (its default) and the export
    shards over all data-parallel ranks; ZeRO-1 it cannot run."""
    tt = _plan_json("--runtime", "torchtitan", model="llama2-7b")  # untied: torchtitan refuses a tie over stages
    assert tt["inputs"]["job"]["optimizer_state"]["sharding"] == "fsdp"
    plan = tt["plans"][0]
    ov = plan["exports"]["torchtitan"]["overrides"]
    dp = plan["parallelism"]["dp"]
    assert ov[ov.index("--parallelism.data_parallel_shard_degree") + 1] == str(dp)
    assert ov[ov.index("--parallelism.data_parallel_replicate_degree") + 1] == "1"
    for runtime, sharding in (("torchtitan", "zero1"), ("deepspeed", "zero2")):
        res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "512",
                                        "--pp", "2", "--tp", "2", "--runtime", runtime, "--sharding", sharding, "-q"])
        assert res.exit_code == 2, (runtime, res.output)
        assert f"--sharding {sharding}" in res.output


@pytest.mark.parametrize("args,needle", [
    (["--runtime", "megatron", "--no-overlap-grad-reduce"], "--overlap-param-gather needs --overlap-grad-reduce"),
    (["--runtime", "megatron", "--tp-comm-overlap", "--no-sequence-parallel"], "needs sequence parallelism"),
    (["--runtime", "megatron", "--grad-bucket-params", "layer"], "sizes its gradient buckets in parameters"),
    (["--runtime", "torchtitan", "--sharding", "zero1"], "--sharding zero1"),
    (["--overlap-param-gather"], "no parameter all-gather"),
    (["--grad-bucket-params", "1000"], "add --overlap-grad-reduce"),
    (["--grad-bucket-params", "1.5"], "number of parameters"),
    (["--overlap-grad-reduce", "--grad-bucket-params", "1e16"], "from 1 to 1e+15"),  # the plan format's maximum
    (["--tp-comm-overlap", "--tp", "1"], "no tensor-parallel collectives"),
    (["--num-micro-batches", "3"], "--num-micro-batches 3 does not divide --global-batch-size 512"),
])
def test_settings_that_would_not_run_as_planned_are_refused(args, needle):
    """Each of these was accepted (or crashed) and would have planned what
    the runtime does not run, or an option with no effect: one line, exit 2,
    before the search."""
    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "512",
                                    "--top", "1", "-q", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("args,needle", [
    (["--sharding", "zero1", "--overlap-param-gather"], "--overlap-param-gather needs --overlap-grad-reduce"),
    (["--tp-comm-overlap", "--no-sequence-parallel"], "--tp-comm-overlap needs sequence parallelism"),
])
def test_megatron_export_refuses_overlap_its_validate_args_refuses(tmp_path, args, needle):
    """A plan made without --runtime megatron may overlap what Megatron-LM
    refuses to (its validate_args asserts both rules): the export refuses it,
    exit 2, nothing written; with the overlap it does run, the flags are
    written."""
    doc = _plan_json(*args)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "m.sh"
    res = CliRunner().invoke(main, ["export", str(path), "--format", "megatron", "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output and not out.exists()
    ok = _plan_json("--sharding", "zero1", "--overlap-param-gather", "--overlap-grad-reduce")
    path.write_text(json.dumps(ok))
    res = CliRunner().invoke(main, ["export", str(path), "--format", "megatron", "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "--overlap-param-gather" in text and "--overlap-grad-reduce" in text


@pytest.mark.parametrize("edit,needle", [
    (lambda job, stages: job.update(zero1=False), "inputs.job.zero1: false found, but optimizer_state.sharding is "
                                                  "'zero1'"),
    (lambda job, stages: job["comm_overlap"].update(grad_reduce=False, param_gather=False),
     "less than its dp_comm_s"),
])
def test_validate_refuses_a_job_edited_against_its_plans(tmp_path, edit, needle):
    """--runtime megatron's plan shards the optimizer (zero1 true) and hides
    most of the gradient reduce under the backward (allreduce_s well below
    dp_comm_s): a file edited to say zero1 false, or no overlap, contradicts
    itself and is refused by validate and export."""
    doc = _plan_json("--runtime", "megatron")
    stage = doc["plans"][0]["stages"][0]
    assert stage["allreduce_s"] < 0.5 * stage["dp_comm_s"]  # the premise: overlap hides most of it
    edit(doc["inputs"]["job"], doc["plans"][0]["stages"])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    for cmd in (["validate", str(path)], ["export", str(path), "--format", "megatron"]):
        res = CliRunner().invoke(main, cmd)
        assert res.exit_code == 2, (cmd, res.output)
        assert needle in res.output and "Traceback" not in res.output


def test_the_bucket_option_limit_is_the_plan_formats():
    """--grad-bucket-params takes what a plan file may hold: above the
    format's maximum it was accepted and the finished search crashed
    writing the file."""
    import json
    from importlib import resources

    from pipesearch.limits import MAX_BUCKET_PARAMS

    schema = json.loads(resources.files("pipesearch.schema").joinpath("plan-1.schema.json").read_text())

    def find(node):
        if isinstance(node, dict):
            if "bucket_params" in node.get("properties", {}):
                return node["properties"]["bucket_params"]
            return next((x for x in map(find, node.values()) if x), None)
        if isinstance(node, list):
            return next((x for x in map(find, node) if x), None)
        return None

    assert find(schema)["maximum"] == MAX_BUCKET_PARAMS
