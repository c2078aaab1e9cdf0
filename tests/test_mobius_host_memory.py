"""Mobius' host-memory check: all stages of a node together against its host memory.

Four layers of 20, 5, 5 and 20 GB of 16-bit weights (10, 2.5, 2.5 and 10e9
parameters), one layer per stage, pp 2 x vp 2 on two GPUs of one node. The
host keeps 2 + 16 B per parameter (the 16-bit copy and ZeRO-Offload's fp32
weights, gradients and Adam moments; Feng et al., ASPLOS'23, sec. 3): 180,
45, 45 and 180 GB, 450 GB in all, whatever the split. The GPUs (120 GB):
GPU 0 holds stages 0 and 2, 2 micro-batches x 10 GB of activations each
plus both stays' weights and gradients 2 x (20 + 5) GB = 90 GB; GPU 1 the
same; so only the host decides.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from helpers import pcie_host, tiny_cluster
from pipesearch.errors import InfeasibleError
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job, Layer, ModelProfile

GB = 1e9
GIB = 2.0 ** 30


def _profile():
    return ModelProfile(name="mob", layers=tuple(
        Layer(name=f"l{k}", fwd_s=1.0, bwd_s=2.0, bwd_input_s=1.0, param_bytes=w * GB, output_bytes=0.0,
              saved_bytes=10 * GB) for k, w in enumerate((20, 5, 5, 20))), profiled_batch_size=1, bytes_per_param=2.0)


def _search(host_gb, split=None):
    cluster = replace(tiny_cluster(1, 2, memory_bytes=120 * GB),
                      host=pcie_host(memory_bytes=host_gb * GB, pcie_switches=((0, 1),), cpu_adam_params_per_s=1e10))
    job = Job(global_batch_size=2, memory_reserve_bytes=0)
    opts = SearchOptions(pp=2, dp=1, micro_batch_size=1, num_micro_batches=2, schedules=("mobius",), vps=(2,),
                         top=1, split=split)
    return search([ModelVariant(_profile())], cluster, job, opts)


def test_a_node_that_holds_all_its_stages_runs_the_plan():
    """Catches the check of each stage against the node's memory over its
    GPUs and over vp (460 / 2 / 2 = 115 GB < 180 GB: refused) instead of
    all stages together: 450 GB <= 460 GB fits."""
    plan = _search(460).plans[0]
    info = dict(plan.extra)["host"]
    assert info["host_memory_bytes"] == pytest.approx([180 * GB, 45 * GB, 45 * GB, 180 * GB])
    assert info["total_host_memory_bytes"] == pytest.approx(450 * GB)


@pytest.mark.parametrize("split", [None, (1, 1, 1, 1)])
def test_a_node_short_of_host_memory_is_refused_naming_it(split):
    """Catches a host check that passes each stage alone (180 GB <= 440 GB)
    but not the node's sum (450 GB > 440 GB), and a refusal that blames
    the GPU: the message names host memory, 450e9 B = 419.1 GiB against
    440e9 B = 409.8 GiB."""
    with pytest.raises(InfeasibleError) as err:
        _search(440, split)
    text = str(err.value)
    assert "host memory" in text and "419.1 GiB" in text and "409.8 GiB" in text
    assert "per device" not in text and "at its peak" not in text


def test_pinned_split_names_the_gpu_peak_that_does_not_fit():
    """Qwen3-32B, -b 32, pp 2 x tp 4 x vp 2, --split 10,23,23,10: every
    stage fits alone, the GPUs do not. Catches the note that named a stage
    at 15.8 GiB against 21.8 GiB usable (a figure that fits) and suggested
    a smaller micro-batch when every size down to 1 was searched: the note
    must name a GPU's peak above its usable memory, and no micro-batch fix."""
    import re

    from click.testing import CliRunner

    from pipesearch.cli import main

    r = CliRunner().invoke(main, ["plan", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "32",
                                  "--seq-len", "2048", "--schedule", "mobius", "--pp", "2", "--tp", "4", "--vp", "2",
                                  "--split", "10,23,23,10"])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    found = re.search(r"needs ([0-9.]+) GiB at its peak .* against ([0-9.]+) GiB usable", line)
    assert found and float(found.group(1)) > float(found.group(2)), line
    assert "lower the micro-batch size" not in line and "lower --micro-batch-size" not in line


def test_activation_choice_drops_what_the_host_refuses():
    """One GPU, two stages, 80 GB: keeping both stages' activations needs
    50 + 50 = 100 GB, offloading either one 20 + 50 = 70 GB. Offloading
    stage 0 is faster (1 s against 2 s) but the host cannot hold it; the
    choice must be stage 1 (catches a host check applied after the fastest
    choice, which would refuse the split, or not at all). A host that
    refuses even the forced choice (nothing offloaded) leaves no fit."""
    import numpy as np

    from pipesearch.stage_options import mobius_activation_choice

    first = np.zeros((1, 2), bool)
    yes = np.ones((1, 2), bool)
    own = np.array([[[50e9, 50e9]], [[20e9, 20e9]]])
    pairs = np.zeros((1, 1))

    def time_of(idx, sets):
        return np.where(sets[:, 0], 1.0, 2.0)

    act, fits = mobius_activation_choice(first, yes, yes, own, pairs, np.array([80e9]), 1, time_of,
                                         lambda idx, sets: ~sets[:, 0])
    assert fits.tolist() == [True] and act.tolist() == [[False, True]]
    act, fits = mobius_activation_choice(first, yes, yes, own, pairs, np.array([80e9]), 1, time_of)
    assert act.tolist() == [[True, False]]  # without a host limit, the faster one
    _, fits = mobius_activation_choice(first, yes, yes, own, pairs, np.array([80e9]), 1, time_of,
                                       lambda idx, sets: np.zeros(len(idx), bool))
    assert fits.tolist() == [False]
