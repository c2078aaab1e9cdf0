"""Mobius and RoundPipe memory: one figure per GPU everywhere.

A Mobius stage's ``memory_bytes`` is what it holds on its GPU while it runs
(its activations, its 16-bit weights and gradients, 2 B per parameter byte,
and the tied copy when it is the last stage); a GPU's peak
(``options.mobius.device_peak_bytes``) is all its stages' activations and
fixed bytes plus the weights and gradients of its two largest stays in a
row, and that peak is what the fit check, ``predicted.peak_memory_bytes``
(the table's ``peak memory`` column), the ``stages`` plot and ``pipesearch
validate`` use. RoundPipe's per-GPU peaks and host memory likewise.

Oracles: every figure derived by hand in the docstrings from the layer
table (no figure copied from a run).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import pcie_host, tiny_cluster
from pipesearch.cli import main
from pipesearch.errors import InfeasibleError
from pipesearch.plots.stages import gpu_peaks, plot_stages
from pipesearch.roundpipe import device_peak_bytes, group_host_bytes
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job, Layer, ModelProfile

GB = 1e9
GIB = 2.0**30


def _profile(param_gb, saved_gb, tied_gb=0.0) -> ModelProfile:
    """One layer per stage: F 1 s, B 2 s, the given weight and saved bytes
    (GB), ``tied_gb`` of weights shared by the first and the last layer."""
    return ModelProfile(name="peaks", layers=tuple(
        Layer(name=f"l{k}", fwd_s=1.0, bwd_s=2.0, bwd_input_s=1.0, param_bytes=p * GB, output_bytes=0.0,
              saved_bytes=a * GB) for k, (p, a) in enumerate(zip(param_gb, saved_gb))),
        profiled_batch_size=1, bytes_per_param=2.0, tied_param_bytes=tied_gb * GB)


def _mobius(profile, pp, vp, m, capacity_gb):
    cluster = replace(tiny_cluster(1, pp, memory_bytes=capacity_gb * GB),
                      host=pcie_host(pcie_switches=(tuple(range(pp)),), cpu_adam_params_per_s=1e10))
    job = Job(global_batch_size=m, memory_reserve_bytes=0)
    opts = SearchOptions(pp=pp, dp=1, micro_batch_size=1, num_micro_batches=m, schedules=("mobius",), vps=(vp,),
                         top=1)
    return search([ModelVariant(profile)], cluster, job, opts).plans[0]


TIED = _profile([1, 2, 1.5, 0.5], [1, 1, 2, 1], tied_gb=0.5)


def test_mobius_gpu_peak_counts_the_tied_copy():
    """pp 2, vp 2, m 2, four one-layer stages (stage s on GPU s % 2):
    weights 1, 2, 1.5, 0.5 GB, saved 1, 1, 2, 1 GB per micro-batch, a tied
    matrix of 0.5 GB whose copy the last stage keeps with mixed-precision
    Adam's 16 B per parameter, 8 B per weight byte: 4 GB.

    Stage bytes (2 x weights + 2 x saved, + 4 GB on stage 3): 4, 6, 7, 7 GB.
    GPU 0 (stages 0, 2): 2 + 4 activations + 2 x (1 + 1.5) = 11 GB; GPU 1
    (stages 1, 3): 2 + 2 + 4 (tied copy) + 2 x (2 + 0.5) = 13 GB. On 14 GB
    GPUs the plan's peak is 13 GB of 14; the table reads those two."""
    plan = _mobius(TIED, 2, 2, 2, 14)
    assert [st.memory_bytes for st in plan.stages] == pytest.approx([4 * GB, 6 * GB, 7 * GB, 7 * GB])
    info = dict(plan.extra)["mobius"]
    assert info["device_peak_bytes"] == pytest.approx([11 * GB, 13 * GB])
    assert plan.predicted.peak_memory_bytes == pytest.approx(13 * GB)
    assert plan.predicted.memory_capacity_bytes == pytest.approx(14 * GB)
    parts = dict(plan.stages[3].memory_breakdown)
    assert parts["tied_copy"] == pytest.approx(4 * GB) and parts["swapped_buffers"] == pytest.approx(1 * GB)


def test_mobius_refuses_a_gpu_over_capacity_with_its_tied_copy():
    """The same on 12 GB GPUs: GPU 1 needs 13 GB (9 GB without the tied
    copy, which every stage alone would fit: the largest stage is 7 GB), so
    no plan fits."""
    with pytest.raises(InfeasibleError):
        _mobius(TIED, 2, 2, 2, 12)


def test_mobius_stage_bytes_are_its_own_weights_not_a_share():
    """pp 2, vp 3, m 2, six one-layer stages, weights 1, 1, 2, 1, 3, 1 GB,
    1 GB saved each (2 GB of activations per stage). A stage holds its
    whole weights and gradients while it runs: 2 x weights + 2 = 4, 4, 6,
    4, 8, 4 GB (not 1 / (vp - 1) of them: 3, 3, 4, 3, 5, 3). GPU 0 (stages
    0, 2, 4): 6 + max(2 x (1 + 2), 2 x (2 + 3)) = 16 GB; GPU 1 (1, 3, 5):
    6 + 2 x (1 + 1) = 10 GB, each at least its largest stage and at most
    the sum of its stages (18, 12 GB)."""
    plan = _mobius(_profile([1, 1, 2, 1, 3, 1], [1] * 6), 2, 3, 2, 20)
    assert [st.memory_bytes for st in plan.stages] == pytest.approx([g * GB for g in (4, 4, 6, 4, 8, 4)])
    assert dict(plan.extra)["mobius"]["device_peak_bytes"] == pytest.approx([16 * GB, 10 * GB])
    assert plan.predicted.peak_memory_bytes == pytest.approx(16 * GB)


def test_stages_plot_draws_each_gpus_peak(tmp_path):
    """The stages plot's memory bars are the GPUs' peaks: the tied case 11
    and 13 GB (activations 2 + 4 and 2 + 2 GB of them); the vp 3 case 16
    and 10 GB, where the sums of the GPUs' stages would be 18 and 12 GB;
    and the figure is written."""
    from pipesearch.plan import PlanFile

    plan = _mobius(TIED, 2, 2, 2, 14)
    got = gpu_peaks(plan)
    assert got["peak"] == pytest.approx([11 * GB, 13 * GB])
    assert got["activations"] == pytest.approx([6 * GB, 4 * GB])
    vp3 = _mobius(_profile([1, 1, 2, 1, 3, 1], [1] * 6), 2, 3, 2, 20)
    assert gpu_peaks(vp3)["peak"] == pytest.approx([16 * GB, 10 * GB])
    figure = PlanFile(inputs={"model": {"name": "peaks"}}, search={}, plans=(vp3,))
    assert plot_stages(figure, tmp_path / "s.png").exists()


def test_roundpipe_peak_over_task_pairs_by_hand():
    """3 groups on 2 GPUs: tasks F0 (GPU 0), F1 (1), FB2 (0), B1 (1), B0 (0).
    Weights 1, 2, 3 B, transient 10, 20, 30 B. GPU 0: F0 1 + 10 + the
    fused task's weights and gradients 6 = 17; FB2 6 + 30 + B0's 2 = 38; B0
    2 + 10 = 12: peak 38. GPU 1: F1 2 + 20 + B1's 4 = 26; B1 4 + 20 = 24:
    26. Host: 20 B per parameter and, from group 1 on, m = 4 saved inputs of
    the boundary before it (5, 7 B): 20, 40 + 20, 60 + 28 B."""
    assert device_peak_bytes([[1.0, 2.0, 3.0]], [[10.0, 20.0, 30.0]], 2)[0] == pytest.approx([38.0, 26.0])
    assert group_host_bytes([[1.0, 2.0, 3.0]], [[5.0, 7.0]], 4)[0] == pytest.approx([20.0, 60.0, 88.0])


# ----------------------------------------------------------- the CLI: table, plan file, validate

QWEN = ["--model", "qwen3-1.7b", "--cluster", "1x8-rtx4090-pcie4", "--seq-len", "2048", "-b", "32"]


def _plan_file(tmp_path, flags):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["plan"] + QWEN + flags + ["--top", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return r.output, json.loads(out.read_text())


def _validate(tmp_path, doc):
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    return CliRunner().invoke(main, ["validate", str(tmp_path / "bad.json")])


@pytest.fixture(scope="module")
def mobius_run(tmp_path_factory):
    return _plan_file(tmp_path_factory.mktemp("mob"), ["--schedule", "mobius", "--activation-offload", "--pp", "4",
                                                       "--vp", "2", "--tp", "1", "--micro-batch-size", "4"])


def test_mobius_table_shows_the_checked_gpu_peak(mobius_run, tmp_path):
    """With vp = 2 a GPU's peak is the sum of its two stages' memory_bytes
    (both stays' weights and gradients, both stages' activations and the
    tied copy): each recorded peak is that sum, the table's peak column
    their largest, within the GPU's usable memory (24 GiB x 0.95 - 1 GiB),
    and the file validates."""
    output, doc = mobius_run
    plan = doc["plans"][0]
    stages = plan["stages"]
    sums = [stages[r]["memory_bytes"] + stages[r + 4]["memory_bytes"] for r in range(4)]
    peaks = plan["options"]["mobius"]["device_peak_bytes"]
    assert peaks == pytest.approx(sums)
    assert plan["predicted"]["peak_memory_bytes"] == pytest.approx(max(sums))
    assert max(peaks) <= 25757220864.0 * 0.95 - GIB
    line = output.splitlines()[2]
    assert f"{max(sums) / GIB:.1f} GiB / 24.0 GiB" in line, output
    assert _validate(tmp_path, doc).exit_code == 0


def test_validate_refuses_a_mobius_peak_that_is_not_the_stages(mobius_run, tmp_path):
    """GPU 2's recorded peak 1 GB too high: refused in one line naming
    ``options.mobius.device_peak_bytes[2]`` and both values, exit 2."""
    _, doc = mobius_run
    doc = json.loads(json.dumps(doc))
    peaks = doc["plans"][0]["options"]["mobius"]["device_peak_bytes"]
    right = peaks[2]
    peaks[2] = right + 1e9
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2
    assert "plans[0].options.mobius.device_peak_bytes[2]" in r.output
    assert repr(right + 1e9) in r.output and repr(right) in r.output, r.output


def test_validate_refuses_a_mobius_gpu_that_does_not_fit(mobius_run, tmp_path):
    """The inputs' capacity lowered so that the usable memory, capacity x
    0.95 - 1 GiB, lies halfway between the largest stage and the largest GPU
    peak: every stage fits alone, the GPU does not; refused naming that
    GPU's ``device_peak_bytes`` entry."""
    _, doc = mobius_run
    doc = json.loads(json.dumps(doc))
    plan = doc["plans"][0]
    peaks = plan["options"]["mobius"]["device_peak_bytes"]
    largest = max(st["memory_bytes"] for st in plan["stages"])
    assert largest < max(peaks)
    usable = (largest + max(peaks)) / 2
    doc["inputs"]["cluster"]["memory_bytes_per_device"]["rtx4090-24gb"] = (usable + GIB) / 0.95
    r = _validate(tmp_path, doc)
    worst = int(np.argmax(peaks))
    assert r.exit_code == 2 and f"options.mobius.device_peak_bytes[{worst}]" in r.output, r.output
    assert "does not fit" in r.output


def test_validate_refuses_a_predicted_peak_that_is_not_the_largest_gpu(mobius_run, tmp_path):
    """``predicted.peak_memory_bytes`` set to the largest stage instead of
    the largest GPU peak: refused naming the field."""
    _, doc = mobius_run
    doc = json.loads(json.dumps(doc))
    plan = doc["plans"][0]
    plan["predicted"]["peak_memory_bytes"] = max(st["memory_bytes"] for st in plan["stages"])
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2 and "plans[0].predicted.peak_memory_bytes" in r.output, r.output


@pytest.fixture(scope="module")
def roundpipe_run(tmp_path_factory):
    return _plan_file(tmp_path_factory.mktemp("rp"), ["--schedule", "roundpipe", "--pp", "4"])


def test_roundpipe_peaks_and_host_recomputed(roundpipe_run, tmp_path):
    """Each GPU's recorded peak is :func:`device_peak_bytes` of the groups'
    recorded weights (the last group's with its tied copy's 16-bit
    weights, half its ``tied_copy``: Qwen3-1.7B ties its embedding) and
    transient bytes; the host memory 20 B per parameter (weights / 2 B),
    2 B per tied parameter (``tied_copy`` / 4 B) for the second use's
    gradient, plus m saved inputs of each group after the first (the
    boundary's ``send_bytes``), summed; the table shows the largest peak;
    the file validates."""
    output, doc = roundpipe_run
    plan = doc["plans"][0]
    stages, m = plan["stages"], plan["schedule"]["num_micro_batches"]
    tied = [st["memory_breakdown_bytes"].get("tied_copy", 0.0) for st in stages]
    assert tied[:-1] == [0.0] * (len(stages) - 1) and tied[-1] == pytest.approx(4 * 151936 * 2048)  # V h, 4 B each
    w = [[st["memory_breakdown_bytes"]["weights"] + x / 2 for st, x in zip(stages, tied)]]
    t = [[st["memory_breakdown_bytes"]["activations"] for st in stages]]
    peaks = plan["options"]["roundpipe"]["device_peak_bytes"]
    assert peaks == pytest.approx(device_peak_bytes(w, t, 4)[0])
    host = sum(20 * st["memory_breakdown_bytes"]["weights"] / 2 for st in stages) + 2 * tied[-1] / 4 + m * sum(
        st["send_bytes"] for st in stages[:-1])
    assert plan["options"]["roundpipe"]["host_memory_bytes"] == pytest.approx(host)
    assert f"{max(peaks) / GIB:.1f} GiB / 24.0 GiB" in output.splitlines()[2], output
    assert _validate(tmp_path, doc).exit_code == 0


@pytest.mark.parametrize("what", ["peak", "host_recorded", "host_capacity"])
def test_validate_refuses_roundpipe_memory(roundpipe_run, tmp_path, what):
    """A RoundPipe GPU peak 1 GB too high, a host total 1 GB too high, or a
    node whose host memory is 1 GB below the recorded total: each refused
    in one line naming the field, exit 2."""
    _, doc = roundpipe_run
    doc = json.loads(json.dumps(doc))
    info = doc["plans"][0]["options"]["roundpipe"]
    if what == "peak":
        info["device_peak_bytes"][1] += 1e9
        field = "options.roundpipe.device_peak_bytes[1]"
    elif what == "host_recorded":
        info["host_memory_bytes"] += 1e9
        field = "options.roundpipe.host_memory_bytes"
    else:
        doc["inputs"]["cluster"]["host"]["memory_bytes"] = info["host_memory_bytes"] - 1e9
        field = "options.roundpipe.host_memory_bytes"
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2 and f"plans[0].{field}" in r.output, r.output
    if what == "host_capacity":
        assert "does not fit" in r.output


def test_a_pinned_mobius_split_over_a_gpu_is_refused_naming_the_gpu(capsys):
    """The tied case pinned to its only split on 12 GB GPUs: every stage
    fits alone (at most 7 GB), GPU 1 needs 13 GB: refused (no plan with an
    infinite time), the message naming GPU 1 (stages 1,3) and 13 GB, i.e.
    12.1 GiB, against 12 GB = 11.2 GiB usable."""
    cluster = replace(tiny_cluster(1, 2, memory_bytes=12 * GB),
                      host=pcie_host(pcie_switches=((0, 1),), cpu_adam_params_per_s=1e10))
    job = Job(global_batch_size=2, memory_reserve_bytes=0)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=2, schedules=("mobius",), vps=(2,),
                         top=1, split=(1, 1, 1, 1))
    with pytest.raises(InfeasibleError) as err:
        search([ModelVariant(TIED)], cluster, job, opts)
    assert "GPU 1 (stages 1,3) needs 12.1 GiB" in str(err.value) and "11.2 GiB usable" in str(err.value)


def test_validate_refuses_a_mobius_plan_without_its_stage_bytes(mobius_run, tmp_path):
    """A stage's ``memory_breakdown_bytes`` removed: the GPU peaks cannot be
    rechecked, and the file is refused naming the stages, not passed."""
    _, doc = mobius_run
    doc = json.loads(json.dumps(doc))
    del doc["plans"][0]["stages"][1]["memory_breakdown_bytes"]
    r = _validate(tmp_path, doc)
    assert r.exit_code == 2 and "plans[0].stages: every stage of a mobius plan needs memory_breakdown_bytes" in \
        r.output, r.output
