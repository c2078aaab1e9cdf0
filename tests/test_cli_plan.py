"""Tests of `pipesearch plan` as a user runs it: the default run, --json,
--split, and bad input (one line on stderr, exit status 2, no traceback, no
file left behind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import REPO, tiny_cluster, tiny_profile
from pipesearch.cli import main
from pipesearch.cli.plan_cmd import split_notes
from pipesearch.plan import SCHEMA, load_plan_file
from pipesearch.search import search
from pipesearch.search_options import ModelVariant, SearchOptions
from pipesearch.types import Job

PIPEDREAM = REPO / "tests" / "data" / "pipedream"
HEADER = "# pipesearch profile v1\n# batch_size: 32\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"


def run(args, cwd: Path):
    """Invoke the CLI in-process with ``cwd`` as the working directory."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, args)
    finally:
        os.chdir(old)


def csv_profile(tmp_path: Path, rows, name="model.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return path


def good_rows(n):
    return [f"l{k},{1 + k % 3},{2 + k % 5},{1000 * (k + 1)},{4096 * (1 + k % 4)}" for k in range(n)]


# ------------------------------------------------------------------ success


def test_no_arguments_prints_a_table_and_writes_no_file(tmp_path):
    result = run(["plan"], tmp_path)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "rank" in out and "layers/stage" in out and "samples/s" in out
    assert out.rstrip().splitlines()[-1] == "no plan file written (-o FILE writes one)"
    assert "vgg16 on 4x4-v100-10gbe" in out
    assert list(tmp_path.iterdir()) == []  # a plain `plan` leaves the directory as it was
    result = run(["plan", "-o", "plans.json"], tmp_path)
    assert result.stdout.rstrip().splitlines()[-1] == "wrote plans.json"
    plans = load_plan_file(tmp_path / "plans.json").plans
    assert [p.rank for p in plans] == [1, 2, 3, 4, 5]


def test_memory_reserve_without_unit_is_refused(tmp_path):
    result = run(["plan", "--memory-reserve", "2"], tmp_path)
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --memory-reserve 2: no unit; give one, e.g. 2GiB or 2MB"


def test_table_shows_full_splits_idle_devices_and_sequence_length(tmp_path):
    result = run(["plan", "--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "2", "-b", "480", "--pp", "15",
                  "--dp", "1", "--tp", "1", "--recompute", "full", "--top", "1"], tmp_path)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "llama3-8b (32 blocks + embedding + head: layers/stage counts all of them) on 4x8-h100" in out
    assert "global batch 480, sequence length 8192" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("1 "))
    vp = 2 if " v2 " in row else 1
    cell = next(tok for tok in row.split() if "," in tok)  # runs of equal counts as count*times, none elided
    split = [int(c) for part in cell.split(",") for c in [part.split("*")[0]] * int((part.split("*") + ["1"])[1])]
    assert len(split) == 15 * vp and sum(split) == 34 and "..." not in row
    assert "plan 1 uses 15 of the 16 devices (pp x dp x tp); 1 stays idle" in out


def test_json_prints_the_plan_and_writes_no_file(tmp_path):
    result = run(["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie", "--json"], tmp_path)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == SCHEMA == "pipesearch.plan/1"
    assert doc["plans"] and doc["plans"][0]["rank"] == 1
    assert doc["inputs"]["model"]["name"] == "gnmt"
    assert list(tmp_path.iterdir()) == []


def test_output_option_writes_there(tmp_path):
    result = run(["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie", "-q", "-o", "sub.json"], tmp_path)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub.json"]
    assert load_plan_file(tmp_path / "sub.json").plans


def test_split_scores_that_split(tmp_path):
    """A 12-layer profile and --split 5,3,4: every plan has those stages."""
    path = csv_profile(tmp_path, good_rows(12))
    result = run(["plan", "--model", str(path), "--cluster", "1x4-v100-pcie", "-b", "64", "--split", "5,3,4",
                  "--json"], tmp_path)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["plans"]
    for plan in doc["plans"]:
        assert [st["layers"] for st in plan["stages"]] == [[0, 5], [5, 8], [8, 12]]
        assert plan["parallelism"]["pp"] == 3
    table = run(["plan", "--model", str(path), "--cluster", "1x4-v100-pcie", "-b", "64", "--split", "5,3,4",
                 "-q"], tmp_path)
    assert table.exit_code == 0 and "5,3,4" in table.stdout


# ------------------------------------------------------------------ bad input


def expect_input_error(result, tmp_path: Path, *needles, files_before=()):
    """Exit status 2, exactly one line on stderr starting with 'error:', no
    traceback, nothing on stdout, no plan file created."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files_before)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize("rows,needles", [
    (["a,1,2,0,10", "b,1,2,0"], ["line 5", "4 fields, expected 5"]),        # malformed row
    (["a,1,2,0,10", "b,-1,2,0,5"], ["line 5", "fwd_ms", "negative"]),       # negative time
    (["a,1,2,0,10", "b,1,nan,0,5"], ["line 5", "bwd_ms", "finite"]),        # NaN time
    (["a,1,2,0,10", "b,1,2,x,5"], ["line 5", "param_bytes"]),               # not a number
    (["a,1,2,0,10", "b,1_0,2,0,5"], ["line 5", "fwd_ms", "'1_0'"]),         # digit groups: not a plain decimal
])
def test_bad_profile_csv(tmp_path, rows, needles):
    path = csv_profile(tmp_path, rows, "bad.csv")
    result = run(["plan", "--model", str(path), "-o", "out.json"], tmp_path)
    expect_input_error(result, tmp_path, "bad.csv", *needles, files_before=["bad.csv"])


def _graph(tmp_path: Path, extra_edge: str) -> Path:
    text = (PIPEDREAM / "alexnet.graph.txt").read_text()
    path = tmp_path / "alexnet.graph.txt"
    path.write_text(text.rstrip("\n") + f"\n\t{extra_edge}\n")
    return path


def test_graph_with_a_cycle(tmp_path):
    """alexnet's graph has the edge node4 -- node5; adding node5 -- node4 closes a cycle: the message names
    the line of the edge added (the file's last) and both edges' lines (docs/formats.md: the file, the line and
    the node)."""
    text = (PIPEDREAM / "alexnet.graph.txt").read_text()
    assert "\tnode4 -- node5\n" in text
    first = text.splitlines().index("\tnode4 -- node5") + 1
    path = _graph(tmp_path, "node5 -- node4")
    added = len(path.read_text().splitlines())
    result = run(["plan", "--model", "alexnet.graph.txt"], tmp_path)
    expect_input_error(result, tmp_path, "alexnet.graph.txt", f"line {added}: the edge node5 -- node4 closes a cycle",
                       f"lines {first}, {added}", files_before=["alexnet.graph.txt"])


def test_graph_with_a_dangling_edge(tmp_path):
    _graph(tmp_path, "node5 -- node999")
    result = run(["plan", "--model", "alexnet.graph.txt"], tmp_path)
    expect_input_error(result, tmp_path, "alexnet.graph.txt", "node999", files_before=["alexnet.graph.txt"])


def test_unknown_model_suggests_close_names(tmp_path):
    line = expect_input_error(run(["plan", "--model", "vgg61"], tmp_path), tmp_path, "vgg61")
    assert "did you mean" in line and "vgg16" in line


def test_unknown_cluster_suggests_close_names(tmp_path):
    line = expect_input_error(run(["plan", "--cluster", "4x4-v100-10gb"], tmp_path), tmp_path, "4x4-v100-10gb")
    assert "did you mean" in line and "4x4-v100-10gbe" in line


def test_batch_not_divisible_by_pinned_dp(tmp_path):
    expect_input_error(run(["plan", "--dp", "3"], tmp_path), tmp_path, "1024", "--dp 3")


def test_model_that_fits_on_no_split(tmp_path):
    """1e15 bytes of fp32 weights per layer: 4e15 bytes of state, > 15 GiB."""
    path = csv_profile(tmp_path, [f"l{k},1,2,1e15,10" for k in range(4)], "huge.csv")
    line = expect_input_error(run(["plan", "--model", str(path), "--cluster", "1x4-v100-pcie"], tmp_path),
                              tmp_path, files_before=["huge.csv"])
    assert "no plan fits" in line and "huge" in line and "GiB" in line


def test_a_profiles_device_file_is_read_beside_the_profile_whatever_the_working_directory(tmp_path):
    """``# device: d.toml`` names a device TOML beside the profile (as a
    cluster file's device paths are read beside it): the plan is the same
    run from the profile's folder or from its parent, and its times are
    rescaled from that device (a device of half an A100's fp32 peak, so the
    iteration is shorter than with the times taken unscaled as an A100's);
    a device file that does not read as one (memory 0) or does not exist
    is refused naming the profile, its 'device' key and the value; a value
    with a '/' that names no file beside the profile is free text (times
    unscaled), though the working directory holds a device file of that
    path."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "d.toml").write_text('name = "d"\nmemory_GB = 36\npeak_fp16_TFLOPS = 80\npeak_fp32_TFLOPS = 9.75\n'
                                   'hbm_bandwidth_GBps = 900\n')
    (folder / "bad.toml").write_text('name = "b"\nmemory_GB = 0\npeak_fp16_TFLOPS = 80\npeak_fp32_TFLOPS = 9.75\n'
                                     'hbm_bandwidth_GBps = 900\n')
    rows = "".join(r + "\n" for r in good_rows(8))
    for name, device in (("dev.csv", "d.toml"), ("plain.csv", "unknown"), ("bad.csv", "bad.toml"),
                         ("gone.csv", "missing.toml")):
        (folder / name).write_text(HEADER.replace("# batch_size: 32\n", f"# batch_size: 32\n# device: {device}\n")
                                   + rows)
    args = ["--cluster", "1x8-a100-80gb", "-b", "64", "--top", "1", "--json"]

    def time_of(model, cwd):
        res = run(["plan", "-q", "--model", model, *args], cwd)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["plans"][0]["predicted"]["iteration_time_s"]

    here, above, unscaled = time_of("dev.csv", folder), time_of("in/dev.csv", tmp_path), time_of("plain.csv", folder)
    assert here == above and here < unscaled
    for name, needles in (("bad.csv", ["'device' = 'bad.toml'", "memory_GB"]),
                          ("gone.csv", ["'device' = 'missing.toml'", "no such file"])):
        line = expect_input_error(run(["plan", "--model", f"in/{name}", *args], tmp_path), tmp_path, *needles,
                                  files_before=["in"])
        assert line.startswith(f"error: in/{name}: key")
    # a path-like value with no file beside the profile is free text, whatever the working directory holds
    (tmp_path / "devs").mkdir()
    (tmp_path / "devs" / "d").write_text((folder / "d.toml").read_text())
    (folder / "text.csv").write_text(HEADER.replace("# batch_size: 32\n", "# batch_size: 32\n# device: devs/d\n")
                                     + rows)
    assert time_of("in/text.csv", tmp_path) == time_of("text.csv", folder) == unscaled


def test_a_profile_measured_on_the_clusters_own_device_file_is_not_said_rescaled(tmp_path):
    """``# device: dev/d.toml`` naming the very device file the cluster uses:
    the times are the cluster's device's, so no warning says they are
    rescaled (the header's path is not the device's name: the device the
    file defines is what counts); a profile whose device file defines
    another device still gets the warning."""
    (tmp_path / "dev").mkdir()
    spec = 'memory_GB = 36\npeak_fp16_TFLOPS = 80\npeak_fp32_TFLOPS = 9.75\nhbm_bandwidth_GBps = 900\n'
    (tmp_path / "dev" / "d.toml").write_text('name = "d"\n' + spec)
    (tmp_path / "dev" / "e.toml").write_text('name = "e"\n' + spec.replace("80", "160"))
    (tmp_path / "c.toml").write_text('name = "c"\nnodes = 1\ndevices_per_node = 4\ndevice = "dev/d.toml"\n'
                                     '[intra_node]\nbandwidth_GBps = 50\nlatency_us = 5\n'
                                     '[inter_node]\nbandwidth_GBps = 10\nlatency_us = 10\n')
    rows = "".join(r + "\n" for r in good_rows(8))
    for name, device in (("own.csv", "dev/d.toml"), ("other.csv", "dev/e.toml")):
        (tmp_path / name).write_text(HEADER.replace("# batch_size: 32\n", f"# batch_size: 32\n# device: {device}\n")
                                     + rows)
    own = run(["plan", "--model", "own.csv", "--cluster", "c.toml", "-b", "64", "--top", "1"], tmp_path)
    assert own.exit_code == 0, own.output
    assert "measured on" not in own.stderr and "rescaled" not in own.stderr
    other = run(["plan", "--model", "other.csv", "--cluster", "c.toml", "-b", "64", "--top", "1"], tmp_path)
    assert other.exit_code == 0, other.output
    assert "other.csv: measured on dev/e.toml, planned on d: its times are rescaled" in other.stderr


def test_all_points_are_written_when_no_plan_fits(tmp_path):
    """The points table is what says why no plan fits: with --all-points the
    refusal (one line, exit 2) still writes it, one row per point looked at,
    none with a plan: out of memory (4 layers of 1e15 bytes of weights: no
    stage fits a 16 GB V100) or refused by its schedule or stage count; the
    line says where it is; no other file is written."""
    path = csv_profile(tmp_path, [f"l{k},1,2,1e15,10" for k in range(4)], "huge.csv")
    result = run(["plan", "--model", str(path), "--cluster", "1x4-v100-pcie", "--all-points", "pts.csv"], tmp_path)
    line = expect_input_error(result, tmp_path, "no plan fits", "pts.csv lists every point",
                              files_before=["huge.csv", "pts.csv"])
    assert "Traceback" not in line
    rows = (tmp_path / "pts.csv").read_text().splitlines()
    assert rows[0].startswith("tp,recompute,pp,dp,schedule")
    status = [r.split(",")[9] for r in rows[1:]]
    assert "out_of_memory" in status and set(status) <= {"out_of_memory", "schedule_refused", "too_many_stages"}


def test_split_must_sum_to_the_layer_count(tmp_path):
    expect_input_error(run(["plan", "--split", "5,3,4"], tmp_path), tmp_path, "5,3,4", "12", "40")


def test_more_stages_than_layers(tmp_path):
    expect_input_error(run(["plan", "--model", "alexnet", "--pp", "100"], tmp_path), tmp_path,
                       "--pp 100", "22 layers")


def test_zero_time_profile(tmp_path):
    path = csv_profile(tmp_path, ["a,0,0,0,10", "b,0,0,0,10"], "zero.csv")
    expect_input_error(run(["plan", "--model", str(path), "--cluster", "1x4-v100-pcie", "-b", "8"], tmp_path),
                       tmp_path, "zero", files_before=["zero.csv"])


# ------------------------------------------------------------------ the real entry point


def _python_m(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PIPESEARCH_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "pipesearch", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_python_m_pipesearch_plan(tmp_path):
    proc = _python_m(["plan", "-o", "plans.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "wrote plans.json" in proc.stdout and (tmp_path / "plans.json").is_file()


def test_python_m_bad_input_is_one_line_exit_2(tmp_path):
    proc = _python_m(["plan", "--model", "vgg61"], tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: ")
    assert "vgg16" in proc.stderr and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_hf_config_long_context_warns_and_says_so_in_the_json(tmp_path):
    """A HuggingFace config's max_position_embeddings is a maximum context,
    not a training length: planning it unasked gets a warning (stderr and
    inputs.model.warnings); --seq-len silences it."""
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
           "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 4, "num_attention_heads": 14,
           "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 131072,
           "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    args = ["plan", "--model", "config.json", "--cluster", "1x8-a100-80gb", "-b", "16", "--top", "1"]
    result = run(args + ["-o", "p.json"], tmp_path)
    assert result.exit_code == 0, result.stderr
    assert "warning: config.json: sequence length 131072 is the config's maximum context" in result.stderr
    assert "sequence length 131072" in result.stdout
    doc = json.loads((tmp_path / "p.json").read_text())
    assert any("--seq-len" in w for w in doc["inputs"]["model"]["warnings"])
    quiet = run(args + ["--seq-len", "4096"], tmp_path)
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr and "sequence length 4096" in quiet.stdout
    # when nothing fits at that length, the refusal's one line says why the length is what it is
    tiny = run(["plan", "--model", "config.json", "--cluster", "1x2-cpu", "-b", "16", "--top", "1"], tmp_path)
    assert tiny.exit_code == 2 and len(tiny.stderr.strip().splitlines()) == 1
    assert "no plan fits" in tiny.stderr and "note: config.json: sequence length 131072" in tiny.stderr


def test_profile_warnings_running_sums_megabytes_and_device_kind(tmp_path):
    # per-layer parameter sizes [6, 5, 4, 3, 2, 1] MB written as running totals, output sizes in MB
    sums = [6e6, 11e6, 15e6, 18e6, 20e6, 21e6]
    mb = [3.2, 3.2, 1.6, 1.6, 0.8, 0.1]
    rows = [f"l{k},1,2,{int(sums[k])},{mb[k]}" for k in range(6)]
    path = tmp_path / "m.csv"
    path.write_text(HEADER.replace("# batch_size: 32\n", "# batch_size: 32\n# device: v100-16gb\n")
                    + "".join(r + "\n" for r in rows))
    result = run(["plan", "--model", "m.csv", "--cluster", "1x8-a100-80gb", "-b", "64", "--top", "1",
                  "-o", "p.json"], tmp_path)
    assert result.exit_code == 0, result.stderr
    err = result.stderr
    assert "m.csv: column param_bytes never decreases over the 6 layers" in err
    assert "(as differences: [6e+06, 5e+06, 4e+06, 3e+06, 2e+06, 1e+06])" in err
    assert "m.csv: every value of column output_bytes is below 4096 bytes (largest 3.2)" in err
    assert "m.csv: measured on v100-16gb, planned on a100-80gb: its times are rescaled" in err
    warnings = json.loads((tmp_path / "p.json").read_text())["inputs"]["model"]["warnings"]
    # saved_bytes, not written, defaults to output_bytes: said once, of the column written (it named both)
    assert len(warnings) == 3 and all(w.startswith("m.csv: ") for w in warnings) and "saved_bytes" not in err
    clean = run(["plan", "--model", "vgg16", "--cluster", "4x4-v100-10gbe", "--top", "1"], tmp_path)
    assert clean.exit_code == 0 and "warning" not in clean.stderr


def test_simulate_names_the_all_reduce_only_with_data_parallelism(tmp_path):
    assert run(["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie", "--pp", "4", "--dp", "1",
                "--schedule", "1f1b", "--top", "1", "-o", "one.json"], tmp_path).exit_code == 0
    out = run(["simulate", "one.json"], tmp_path).stdout
    # dp = 1: what follows the last backward is each stage's optimizer step alone
    assert "+ optimizer step left after the last backward" in out and "dp = 1: no all-reduce" in out
    assert "communication" not in out.split("simulated iteration:")[1].split(";")[0]
    assert run(["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie", "--pp", "2", "--dp", "2",
                "--schedule", "1f1b", "--top", "1", "-o", "two.json"], tmp_path).exit_code == 0
    out = run(["simulate", "two.json"], tmp_path).stdout
    assert "data-parallel communication and optimizer step left after the last backward" in out


def test_timeline_draws_the_all_reduce_and_zooms(tmp_path):
    from pipesearch.plan import load_plan_file
    from pipesearch.plots.timeline import allreduce_spans
    from pipesearch.point_plan import simulate_plan

    assert run(["plan", "--model", "vgg16", "--pp", "2", "--dp", "8", "--schedule", "gpipe", "--top", "1",
                "-o", "v.json"], tmp_path).exit_code == 0
    plan = load_plan_file(tmp_path / "v.json").plans[0]
    total, tl = simulate_plan(plan)
    spans = allreduce_spans(plan, tl)
    # each rank's all-reduce lasts its stages' allreduce_s and ends the iteration at the latest
    assert [d for _, d in spans] == pytest.approx([st.allreduce_s for st in plan.stages])
    assert max(a + d for a, d in spans) == pytest.approx(total)
    res = run(["simulate", "v.json", "--timeline", "z.png", "--window", "0:100"], tmp_path)
    assert res.exit_code == 0 and (tmp_path / "z.png").stat().st_size > 0
    bad = run(["simulate", "v.json", "--timeline", "y.png", "--window", "9:3"], tmp_path)
    assert bad.exit_code == 2 and "FROM_MS:TO_MS" in bad.stderr and not (tmp_path / "y.png").exists()
    late = f"{total * 1e3 + 1:.0f}:"  # a window from after the iteration's end: nothing to draw
    bad = run(["simulate", "v.json", "--timeline", "y.png", "--window", late], tmp_path)
    assert bad.exit_code == 2 and "after the timeline ends at" in bad.stderr and not bad.stdout
    assert not (tmp_path / "y.png").exists()


def test_split_notes_name_plans_whose_split_is_not_proven():
    """A plan whose split search stopped at its work limit gets one line with
    its best time, bound and gap (200 ms found, 150 ms bound: gap 25.0%); a
    proven one gets none."""
    res = search([ModelVariant(tiny_profile([1e-3] * 4, [2e-3] * 4))], tiny_cluster(1, 2), Job(4),
                 SearchOptions(schedules=("1f1b",), top=1))
    proven = res.plans[0]
    assert split_notes([proven]) == []
    info = {"exact": False, "lower_bound_s": 0.150, "gap": 0.25, "splits_evaluated": 300}
    pred = replace(proven.predicted, iteration_time_s=0.200)
    stopped = replace(proven, rank=3, predicted=pred,
                      extra=tuple((k, info if k == "split_search" else v) for k, v in proven.extra))
    assert split_notes([stopped]) == ["plan 3: split not proven optimal within the search's work limits "
                                      "(best found 200.00 ms, lower bound 150.00 ms, gap 25.0%)"]
    # a gap below 0.05% keeps two significant digits: (2.5730 - 2.5729) / 2.5730 = 0.0039%, not 0.0%
    info = {"exact": False, "lower_bound_s": 2.5729, "gap": (2.5730 - 2.5729) / 2.5730, "splits_evaluated": 300}
    near = replace(stopped, predicted=replace(pred, iteration_time_s=2.5730),
                   extra=tuple((k, info if k == "split_search" else v) for k, v in proven.extra))
    assert split_notes([near])[0].endswith("gap 0.0039%)")
    # a gap within the tie window (1e-12: times equal up to rounding) proves the time; only the
    # tie-break among equal-time splits stopped (the 16,384-GPU GPT-3 run: bound = best = 2.573 s)
    for gap in (0.0, 6.8e-16, 1e-12):
        info = {"exact": False, "lower_bound_s": 2.5730 * (1 - gap), "gap": gap, "splits_evaluated": 300}
        tied = replace(near, extra=tuple((k, info if k == "split_search" else v) for k, v in proven.extra))
        assert split_notes([tied]) == ["plan 3: iteration time proven optimal (2.573 s equals its lower bound), but the "
                                       "search's work limits stopped the tie-break among splits of that time before "
                                       "it saw every one: a split with lower peak memory may exist"]
    info = {"exact": False, "lower_bound_s": 2.5730 * (1 - 2e-12), "gap": 2e-12, "splits_evaluated": 300}
    open_ = replace(near, extra=tuple((k, info if k == "split_search" else v) for k, v in proven.extra))
    assert split_notes([open_])[0].startswith("plan 3: split not proven optimal")
    # a mixed cluster's device order: every order tried, or some, said in words (it printed CP-SAT's "FEASIBLE")
    every = "every one of its 70 device orders was tried, but the split searches of some stopped at their work limits"
    for done, words in ((70, every), (12, "12 of 70 device orders tried within the search's work limits")):
        mapping = {"status": "FEASIBLE", "orders_evaluated": done, "orders_total": 70, "best_bound_s": 0.190,
                   "gap": 0.05}
        mapped = replace(stopped, extra=stopped.extra + (("mapping", mapping),))
        assert split_notes([mapped])[1] == (f"plan 3: device order not proven optimal ({words}; lower bound 190.00 ms, "
                                            "gap 5.0%)")


def test_split_of_interleaved_chunks_is_scored():
    """--split with pp x vp stages and the interleaved schedule scores that
    split (Megatron's even division of GPT-3 1.3B's 24 blocks into 2 x 2
    chunks: 6 each, the embedding with the first, the head with the last);
    a count that is not pp x vp is refused in one line."""
    from click.testing import CliRunner
    from pipesearch.cli import main as cli

    args = ["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "512", "--pp", "2", "--vp", "2",
            "--schedule", "interleaved-1f1b", "--json", "--top", "1"]
    res = CliRunner().invoke(cli, [*args, "--split", "7,6,6,7"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)["plans"][0]
    assert [st["layers"][1] - st["layers"][0] for st in plan["stages"]] == [7, 6, 6, 7]
    assert plan["parallelism"]["vp"] == 2
    bad = CliRunner().invoke(cli, [*args, "--split", "9,9,8"])
    assert bad.exit_code == 2 and "pp x vp" in bad.output


def test_a_pinned_vp_without_schedule_is_honoured(tmp_path):
    """``--vp 2`` alone keeps the default schedules that run virtual stages:
    every ranked plan has two stages per device (before, the single-stage
    schedules were searched too and ranked first with vp 1)."""
    out = tmp_path / "p.json"
    res = run(["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--vp", "2", "-q",
               "-o", str(out)], tmp_path)
    assert res.exit_code == 0, res.output
    plans = json.loads(out.read_text())["plans"]
    assert plans and all(p["parallelism"]["vp"] == 2 and p["schedule"]["name"] == "interleaved-1f1b" for p in plans)


def test_unproven_note_names_the_ranks_that_hold():
    """Ranked plans at 1, 2 and 3 s and unproven points bounded from 2.5 s:
    ranks 1-2 hold over the whole space, rank 3 only over the points searched
    to the end; with the bound at 3 s or more, or no unproven point, no line."""
    from types import SimpleNamespace

    from pipesearch.cli.plan_cmd import unproven_note

    plans = [SimpleNamespace(rank=r, predicted=SimpleNamespace(iteration_time_s=float(r)), extra=())
             for r in (1, 2, 3)]
    (line,) = unproven_note(SimpleNamespace(plans=plans, unproven_points=4, unproven_bound_s=2.5))
    assert line.startswith("4 points outside the table") and "2.500 s" in line
    assert "ranks 1-2 hold over the whole space, rank 3 over the points searched to the end" in line
    (line,) = unproven_note(SimpleNamespace(plans=plans, unproven_points=1, unproven_bound_s=0.5))
    assert line.startswith("1 point outside") and "ranks 1-3 over the points searched" in line and "hold" not in line
    assert unproven_note(SimpleNamespace(plans=plans, unproven_points=2, unproven_bound_s=3.0)) == []
    assert unproven_note(SimpleNamespace(plans=plans, unproven_points=0, unproven_bound_s=float("inf"))) == []


def test_unproven_note_counts_the_table_own_unproven_plans():
    """Plans at 1..5 s, plan 4's split search stopped with a bound of 1.5 s:
    its family may hold a split faster than plans 2 and 3, so ranks 2-4 hold
    only over the points searched to the end and ranks 1 and 5 over the
    whole space (the line counted points outside the table only and said
    nothing: a pinned split once beat such a rank 1 by 0.7%). A bound of
    3.5 s (only plan 4's own time open): no line, its own line says so."""
    from types import SimpleNamespace

    from pipesearch.cli.plan_cmd import unproven_note

    def plans(bound):
        return [SimpleNamespace(rank=r, predicted=SimpleNamespace(iteration_time_s=float(r)),
                                extra=(("split_search", {"exact": False, "lower_bound_s": bound}),) if r == 4 else ())
                for r in range(1, 6)]

    (line,) = unproven_note(SimpleNamespace(plans=plans(1.5), unproven_points=0, unproven_bound_s=float("inf")))
    assert line.startswith("plan 4's split or device-order search stopped with a lower bound below the time of a "
                           "plan ranked above")
    assert "ranks 1, 5 hold over the whole space, ranks 2-4 over the points searched to the end" in line
    assert unproven_note(SimpleNamespace(plans=plans(3.5), unproven_points=0, unproven_bound_s=float("inf"))) == []
    (line,) = unproven_note(SimpleNamespace(plans=plans(1.5), unproven_points=2, unproven_bound_s=4.5))
    assert line.startswith("2 points outside the table") and "; plan 4's split or device-order search" in line
    assert "rank 1 holds over the whole space, ranks 2-5 over the points" in line
    # a device order not proven (a mixed cluster's order search stopped) with its bound at 2.5 s: ranks 3-4 open
    order = [SimpleNamespace(rank=p.rank, predicted=p.predicted, extra=(("mapping", {
        "status": "FEASIBLE", "best_bound_s": 2.5}),) if p.rank == 4 else ()) for p in plans(9.0)]
    (line,) = unproven_note(SimpleNamespace(plans=order, unproven_points=0, unproven_bound_s=float("inf")))
    assert "ranks 1-2, 5 hold over the whole space, ranks 3-4 over the points searched to the end" in line


def test_slow_rates_keep_three_significant_digits():
    """A plan of 0.029 samples/s read "0.0" in the table (a 131,072-token
    context); below 1 the rate keeps three significant digits."""
    from pipesearch.cli.plan_cmd import format_rate

    assert format_rate(1388.93) == "1,388.9"
    assert format_rate(0.02912) == "0.0291"
    assert format_rate(0.0) == "0.0"


def test_the_table_says_what_memory_the_plans_may_fill(tmp_path):
    """The capacity column is the device's memory; the limit a plan is held
    to is 16 GiB x (1 - 0.05) - 1 GiB = 14.2 GiB on the default cluster's
    V100s, and 16 x 0.9 - 2 = 12.4 GiB with --memory-headroom 0.1
    --memory-reserve 2GiB: a line under the table says so, naming the two
    options as the command line takes them (copied back, they give the same
    limit)."""
    res = run(["plan", "--top", "1"], tmp_path)
    assert res.exit_code == 0, res.stderr
    assert "usable memory: 14.2 GiB of 16.0 GiB on v100-pcie-16gb" in res.stdout
    res = run(["plan", "--top", "1", "--memory-headroom", "0.1", "--memory-reserve", "2GiB"], tmp_path)
    assert res.exit_code == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if "usable memory" in x)
    assert line.endswith("12.4 GiB of 16.0 GiB on v100-pcie-16gb (--memory-headroom 0.1, --memory-reserve 2GiB)")
    options = line[line.rindex("(") + 1:-1].replace(",", "").split()
    again = run(["plan", "--top", "1", *options], tmp_path)
    assert again.exit_code == 0, again.stderr
    assert line in again.stdout


def test_a_reader_that_goes_away_or_a_full_disk_is_no_bug():
    """Output to a reader that has gone away (``pipesearch plan --json |
    head``) stops quietly with 128 + SIGPIPE (as other tools do), and standard output on a full disk
    (``/dev/full``) is one line and exit 2, never 'internal error'."""
    import os
    import subprocess
    import sys

    args = [sys.executable, "-m", "pipesearch", "plan", "-q", "--json", "--model", "gpt3-1.3b", "--cluster",
            "1x8-a100-80gb", "-b", "64"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # gone before the search ends: its output meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and "error" not in err, err
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            res = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True)
        assert res.returncode == 2 and "cannot write the output" in res.stderr and "internal" not in res.stderr


def test_memory_column_shows_the_device_nearest_its_own_capacity(tmp_path):
    """On V100s of 16 and 32 GB the column shows, per plan, the device whose
    peak is the largest share of its own memory (computed here from the
    plan file: each rank's stages added up, over the least memory among
    their devices), not the largest peak over another device's capacity."""
    import json
    import re

    from click.testing import CliRunner

    from pipesearch.cli import main

    cluster = tmp_path / "vv.toml"
    cluster.write_text('name = "vv"\n[[groups]]\nnodes = 1\ndevices_per_node = 4\ndevice = "v100-16gb"\n'
                       '[[groups]]\nnodes = 1\ndevices_per_node = 4\ndevice = "v100-32gb"\n'
                       '[intra_node]\nbandwidth_GBps = 25\nlatency_us = 5\n'
                       '[inter_node]\nbandwidth_GBps = 12.5\nlatency_us = 10\n')
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "--model", "gpt3-1.3b", "--cluster", str(cluster), "-b", "64",
                                    "--top", "3", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    groups = doc["inputs"]["cluster"]["groups"]
    capacity = {d: g["memory_bytes"] for g in groups for d in range(g["first_device"], g["last_device"] + 1)}
    shown = re.findall(r"([\d.]+) GiB / ([\d.]+) GiB", res.output)
    assert len(shown) == len(doc["plans"]) == 3
    differs = False
    for plan, (peak_gib, cap_gib) in zip(doc["plans"], shown):
        pp = plan["parallelism"]["pp"]
        mem, cap = [0.0] * pp, [float("inf")] * pp
        for st in plan["stages"]:
            r = st["index"] % pp
            mem[r] += st["memory_bytes"]
            cap[r] = min([cap[r]] + [capacity[d] for d in st["devices"]])
        r = max(range(pp), key=lambda q: mem[q] / cap[q])
        assert float(peak_gib) == pytest.approx(mem[r] / 2**30, abs=0.051)
        assert float(cap_gib) == pytest.approx(cap[r] / 2**30, abs=0.051)
        differs |= abs(mem[r] - plan["predicted"]["peak_memory_bytes"]) > 2**27
    assert differs  # some plan's fullest device is not its largest peak


def test_sequences_longer_than_the_context_are_warned_of():
    """Qwen3-1.7B's rotary positions reach 40,960 tokens: --seq-len 100000
    plans (a model can be extended) with a warning naming both lengths, as
    serve refuses such a request length."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    res = CliRunner().invoke(main, ["plan", "-q", "--model", "qwen3-1.7b", "--cluster", "1x8-a100-80gb", "-b", "16",
                                    "--seq-len", "100000", "--top", "1"])
    assert res.exit_code == 0, res.output
    assert "--seq-len 100000 is longer than qwen3-1.7b's context of 40960 tokens" in res.output


def test_a_config_whose_sequence_is_longer_than_its_context_is_warned_of(tmp_path):
    """The same length written in the TOML (rotary positions, so not refused)
    planned with no warning at all."""
    text = (REPO / "cost_models" / "qwen3-1.7b.toml").read_text()
    assert "\nseq_len = " in text
    lines = [("seq_len = 100000" if line.startswith("seq_len = ") else line) for line in text.splitlines()]
    (tmp_path / "long.toml").write_text("\n".join(lines) + "\n")
    res = run(["plan", "-q", "--model", "long.toml", "--cluster", "1x8-a100-80gb", "-b", "16", "--top", "1"], tmp_path)
    assert res.exit_code == 0, res.output
    assert "long.toml: seq_len = 100000 is longer than long's context of 40960 tokens" in res.output


def test_a_plan_above_a_faster_one_is_explained():
    """The tie rule may rank a plan above a faster one within 0.1%: a line
    says which ranks and why; none when the near-ties are in time order."""
    from types import SimpleNamespace as NS

    from pipesearch.cli.plan_cmd import tie_note

    def plans(*times):
        return [NS(rank=k + 1, predicted=NS(iteration_time_s=t)) for k, t in enumerate(times)]

    note = tie_note(plans(55.082, 55.074, 56.0))  # 55.082 / 55.074 - 1 = 0.015%
    assert len(note) == 1 and note[0].startswith("ranks 1-2 lie within 0.1% of the best time (55.074 s)")
    assert tie_note(plans(55.074, 55.082, 56.0)) == [] and tie_note(plans(55.0)) == []


def test_stages_of_two_device_types_are_listed_stage_by_stage():
    """A plan whose stage replicas span two types gets a line with every
    stage's types; the table's column lists each type once (it repeated
    them, stage by stage, without saying where one stage ends)."""
    from types import SimpleNamespace as NS

    from pipesearch.cli.plan_cmd import mixed_stage_note

    stages = [NS(device_type=t) for t in ("h100-80gb", "h100-80gb,a100-40gb", "a100-40gb,v100-16gb", "v100-16gb")]
    note = mixed_stage_note([NS(rank=1, stages=stages), NS(rank=2, stages=stages[:1])])
    assert note == ["plan 1: its stages run on h100-80gb | h100-80gb+a100-40gb | a100-40gb+v100-16gb | v100-16gb "
                    "(a stage of two types runs at its slowest replica's pace and within its smallest one's memory)"]


def test_the_device_type_column_follows_the_stages():
    """The column listed each type once in order of first use
    (``a100-40gb,v100-32gb`` for stages on A100, V100 x4, A100 x3), which
    reads as if the later stages ran on V100s; it now runs stage by stage,
    each run of one type as its range of stages."""
    from types import SimpleNamespace as NS

    from pipesearch.cli.plan_cmd import stage_types_label

    stages = [NS(device_type=t) for t in ["a100-40gb"] + ["v100-32gb"] * 4 + ["a100-40gb"] * 3]
    # runs as stage ranges: "v100-32gb x4" read as four replicas
    assert stage_types_label(stages) == "0 a100-40gb, 1-4 v100-32gb, 5-7 a100-40gb"
    assert stage_types_label([NS(device_type="h100-80gb,a100-40gb"), NS(device_type="h100-80gb,a100-40gb")]) \
        == "0-1 h100-80gb+a100-40gb"


@pytest.mark.parametrize("cluster", ["4x4-v100-10gbe", "1x8-a100-80gb"])
def test_an_unnamed_profile_device_is_said_on_one_device_type(tmp_path, cluster):
    """The catalog's PipeDream profiles name no device: on a cluster of one
    type their times are used unscaled, so vgg16 plans the same on V100s and
    on A100s; a line under the table says so, naming the device, and a
    profile that names its device, or a transformer config, gets none."""
    res = run(["plan", "--model", "vgg16", "--cluster", cluster, "--top", "1"], tmp_path)
    assert res.exit_code == 0, res.stderr
    dev = "v100-pcie-16gb" if "v100" in cluster else "a100-80gb"
    assert f"the profile names no device ('# device: unknown'): its times are used as {dev}'s, unscaled" in res.stdout
    for model in ("tests/data/synthetic-64.csv", "llama3-8b"):
        res = run(["plan", "--model", str(REPO / model) if model.endswith(".csv") else model, "--cluster", cluster,
                   "--top", "1", "-b", "64"], tmp_path)
        assert res.exit_code == 0, res.stderr
        assert "names no device" not in res.stdout


def test_decoder_seq_len_flag(tmp_path):
    """--decoder-seq-len sets T5's decoder tokens: the header says so, the
    plan file records it and a sample counts 512 + 114 tokens (tokens/s =
    samples/s x 626); a decoder-only model or a profile refuses it in one
    line."""
    args = ["plan", "--model", "t5-3b", "--cluster", "2x8-a100-80gb", "-b", "256", "--pp", "2", "--dp", "8",
            "--schedule", "1f1b", "--top", "1"]
    res = run(args + ["--decoder-seq-len", "114"], tmp_path)
    assert res.exit_code == 0, res.output
    assert "sequence length 512 (decoder 114)" in res.output
    doc = json.loads(run(args + ["--decoder-seq-len", "114", "--json", "-q"], tmp_path).output)
    assert doc["inputs"]["model"]["decoder_seq_len"] == 114
    predicted = doc["plans"][0]["predicted"]
    assert predicted["tokens_per_s"] == pytest.approx(predicted["samples_per_s"] * (512 + 114), rel=1e-9)
    for model, says in (("gpt3-1.3b", "gpt3-1.3b is a decoder-only model"), ("vgg16", "vgg16.csv is a layer profile")):
        bad = run(["plan", "--model", model, "--decoder-seq-len", "114", "-q"], tmp_path)
        assert bad.exit_code == 2 and says in bad.output and len(bad.output.strip().splitlines()) == 1


def test_a_split_with_pp_fixes_vp_when_vp_is_not_given(tmp_path):
    """``--schedule mobius --pp 8 --split`` of 8 stages (one per GPU) was
    refused for "pp 8 x vp 2 = 16", a vp the user never gave (the default
    searched for multi-stage schedules); the split and --pp fix vp 1, and
    the search runs (here to its memory refusal, which names the stage)."""
    res = run(["plan", "--model", "qwen3-1.7b", "--cluster", "1x8-rtx4090-pcie4", "-b", "64", "--schedule", "mobius",
               "--pp", "8", "--split", "1,1,1,1,1,1,1,23"], tmp_path)
    assert res.exit_code == 2 and "vp 2" not in res.output and "pp x vp" not in res.output, res.output
    assert "no plan fits" in res.output and "--split GPU 7 (stages 7) needs" in res.output


def test_micro_batches_below_the_profiled_batch_are_noted(tmp_path):
    """A measured profile without fixed times scales a layer's time in
    proportion to the micro-batch: VGG-16's (measured at 128) ranked
    micro-batch size 1 first with nothing said. A line names the plans whose
    micro-batches are smaller than the profiled batch; pinned to the
    profile's batch, a profile with fixed times, or a transformer: none. Its
    fix: a pin, a larger one where the pinned size is below the profile's,
    none where replicas split a micro-batch of the profile's size."""
    def note(args):
        res = run(["plan", "--top", "2", *args], tmp_path)
        assert res.exit_code == 0, res.output
        return [x for x in res.stdout.splitlines() if "smaller than the profile's batch" in x]

    line = note([])
    assert len(line) == 1 and line[0].startswith("plans 1, 2 run micro-batches (or replicas' shares of them) "
                                                 "smaller than the profile's batch of 128")
    assert line[0].endswith("or pin --micro-batch-size")
    assert note(["--micro-batch-size", "128"]) == []
    # pinned below the profile's batch: the fix is a larger pin, not the pin already given
    line = note(["--micro-batch-size", "4"])
    assert len(line) == 1 and line[0].endswith(
        "or pin a --micro-batch-size of 128 or more (--micro-batch-size 4 is below it)")
    # a stage of 15 replicas runs ceil(128 / 15) = 9 samples of each micro-batch of 128 on each: no pin helps
    line = note(["--split", "32x15,8x1", "--micro-batch-size", "128"])
    assert len(line) == 1 and line[0].startswith("plans 1, 2 run")
    assert line[0].endswith("measure several sizes (pipesearch profile --batch-sizes)")
    assert note(["--model", "llama3-8b", "--cluster", "1x8-a100-80gb", "-b", "64"]) == []
    rows = ["name,fwd_ms,bwd_ms,fwd_fixed_ms,bwd_fixed_ms,param_bytes,output_bytes"] + [
        f"l{k},4.0,8.0,0.5,1.0,1000000,1000000" for k in range(8)]
    (tmp_path / "fixed.csv").write_text("# batch_size: 32\n" + "\n".join(rows) + "\n")
    assert note(["--model", "fixed.csv", "--cluster", "1x4-v100-pcie", "-b", "64"]) == []


@pytest.mark.parametrize("flags, message", [
    (["--sharding", "zero1"], "--sharding zero1 with dp 1: one data-parallel replica has no replicas to shard"),
    (["--zero1"], "--zero1 with dp 1"),
    (["--overlap-grad-reduce"], "--overlap-grad-reduce with dp 1: one data-parallel replica has no gradient reduce"),
    (["--sharding", "zero1", "--overlap-param-gather"], "--sharding zero1 with dp 1"),
])
def test_data_parallel_flags_with_one_replica_are_refused(flags, message):
    """Bug: --dp 1 with --sharding zero1, --overlap-grad-reduce or
    --overlap-param-gather planned as if they were not given (exit 0), where
    --tp 1 --tp-comm-overlap and --dp 1 --placement data are refused; with
    --dp 2 they are planned."""
    base = ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--top", "1"]
    r = CliRunner().invoke(main, [*base, "--dp", "1", *flags])
    assert r.exit_code == 2 and message in r.output, r.output
    assert CliRunner().invoke(main, [*base, "--dp", "2", *flags]).exit_code == 0


@pytest.mark.parametrize("flags", [["--overlap-grad-reduce"], ["--overlap-param-gather", "--zero1"],
                                   ["--sharding", "fsdp"]])
def test_data_parallel_flags_where_the_pp_pin_fills_the_cluster_are_refused(flags):
    """Bug: --pp 8 on 8 GPUs leaves every plan one replica (dp 1), yet
    --overlap-grad-reduce was recorded in every plan and written into the
    Megatron command (exit 0), where --dp 1 refuses it. The same refusal,
    naming the pins; with --pp 4 some plans have dp 2, and it plans."""
    base = ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--top", "1"]
    r = CliRunner().invoke(main, [*base, "--pp", "8", *flags])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert r.output.startswith("error: --") and any(f in r.output.split(" with ")[0] for f in flags), r.output
    assert "with --pp 8 on the 8 devices of 1x8-a100-80gb (dp 1): one data-parallel replica" in r.output
    assert CliRunner().invoke(main, [*base, "--pp", "4", "--tp", "1", *flags]).exit_code == 0


@pytest.mark.parametrize("flags", [["--sharding", "zero1"], ["--zero1"]])
def test_sharding_asked_for_leaves_plans_of_one_replica_out(flags):
    """Bug: with --sharding zero1 and dp free, plans of dp 1 were ranked
    beside the others, labelled zero1 with their state unsharded; with --pp 4
    on 4 devices every plan had dp 1 (exit 0). Every plan now has dp >= 2,
    the dp 1 groups are counted as one_replica, and --pp 4 is refused saying
    that the sharding left no plan and how to plan one replica."""
    import json

    base = ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "256", *flags]
    doc = json.loads(CliRunner().invoke(main, [*base, "--top", "10", "--json"]).output)
    assert doc["plans"] and all(p["parallelism"]["dp"] >= 2 for p in doc["plans"])
    assert doc["search"]["infeasible"]["one_replica"] == 4  # dp 1 of pp 1, 2, 3, 4
    free = json.loads(CliRunner().invoke(main, base[:-len(flags)] + ["--top", "10", "--json"]).output)
    assert any(p["parallelism"]["dp"] == 1 for p in free["plans"])  # what the pin removes
    r = CliRunner().invoke(main, [*base, "--pp", "4"])  # 4 stages on 4 devices: one replica, refused up front
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "with --pp 4 on the 4 devices of 1x4-v100-pcie (dp 1): one data-parallel replica has no replicas to " \
           "shard" in r.output and "larger cluster" not in r.output
    r = CliRunner().invoke(main, [*base, "--pp", "4", "--dp", "2"])  # the device count is the reason here
    assert r.exit_code == 2 and "--pp 4 x --dp 2 needs 8 devices" in r.output, r.output


@pytest.mark.parametrize("replicas", [["--split", "20x2,20x2"], ["--replicate-stages", "--pp", "2"]])
def test_per_stage_replicas_refuse_any_dp_pin(replicas):
    """Bug: --split 20x2,20x2 --dp 1 planned (4 devices, dp reported 1)
    while --dp 2 was refused, and --replicate-stages --dp 1 planned replicas
    (2, 1) reported as dp 1: per-stage replicas fix each stage's degree."""
    base = ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", *replicas]
    for dp in ("1", "2"):
        r = CliRunner().invoke(main, [*base, "--dp", dp])
        assert r.exit_code == 2 and f"{replicas[0]}{' 20x2,20x2' if len(replicas) == 2 else ''} with --dp {dp}" \
            in r.output and "drop --dp" in r.output, r.output
    assert CliRunner().invoke(main, base).exit_code == 0


def test_ctrl_c_exits_130_and_writes_nothing(tmp_path):
    """Ctrl-C (SIGINT) during a search: "aborted", exit 130 (128 + SIGINT,
    as shells report it; it was 1, the status of a bug) and no plan file."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "p.json"
    args = [sys.executable, "-m", "pipesearch", "plan", "-q", "--model", "vgg16", "--cluster",
            str(REPO / "tests" / "data" / "mixed-16-3types.toml"), "-b", "1024", "--exhaustive", "-o", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3.0)  # imports done, the (minutes-long) exhaustive search under way
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "aborted" in err and "internal error" not in err, err
    assert not out.exists()


def test_micro_batches_above_a_fitted_profiles_sizes_are_noted(tmp_path):
    """A profile fitted over several batch sizes (fixed + per-sample times,
    measured up to its batch_size 16) planned at micro-batch 128 extrapolates
    the fit: a line says so; at micro-batch 16 or below, none."""
    model = tmp_path / "fit.csv"
    model.write_text("# batch_size: 16\nname,fwd_ms,bwd_ms,param_bytes,output_bytes,fwd_fixed_ms,bwd_fixed_ms\n"
                     "l0,0.5,1.0,1000000,30000,0.1,0.2\nl1,0.5,1.0,1000000,30000,0.1,0.2\n")

    def note(*pins):
        res = run(["plan", "--model", str(model), "--cluster", "1x2-cpu", "-b", "256", "--pp", "2", *pins], tmp_path)
        assert res.exit_code == 0, res.output
        return [x for x in res.stdout.splitlines() if "larger than the largest the profile was measured at" in x]

    pinned = note("--micro-batch-size", "128")
    assert len(pinned) == 1
    # the pin it names is one of at most 16 (128 is pinned already), not "pin --micro-batch-size"
    assert pinned[0].endswith("or pin a --micro-batch-size of 16 or less (--micro-batch-size 128 is above it)")
    assert note("--micro-batch-size", "16") == []
    free = note("--num-micro-batches", "2")  # micro-batches of 128 searched, not pinned: any size is the advice
    assert len(free) == 1 and free[0].endswith("or pin --micro-batch-size")


def test_a_mixed_cluster_lists_the_stages_device_types_even_of_one_type():
    """vgg16 pp 2 x dp 1 on mixed-a100-v100 (4 A100 40 GB, 4 V100 32 GB):
    the plans run on A100s alone, and the column of the stages' types was
    left out (shown only where a plan mixed types), so which devices ran
    was in the JSON only. It is listed on every mixed cluster."""
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "mixed-a100-v100", "--pp", "2",
                                  "--dp", "1", "-b", "64", "--top", "2"])
    assert r.exit_code == 0, r.output
    header = next(line for line in r.stdout.splitlines() if line.lstrip().startswith("rank"))
    assert "device types by stage" in header
    row = r.stdout.splitlines()[r.stdout.splitlines().index(header) + 1]
    assert " a100-40gb " in f" {row} " or "v100-32gb" in row
    homogeneous = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "--pp",
                                            "2", "--dp", "1", "-b", "64", "--top", "1"])
    assert "device types by stage" not in homogeneous.stdout


def test_plans_keeping_the_attention_scores_say_what_a_flashattention_run_plans(tmp_path):
    """llama3-8b at 8,192 tokens on one H100 node: the search ranks plans of
    recompute none (every block keeps its s^2 attention scores, unfused
    attention) and says which, with the pin that plans a FlashAttention
    run; pinned, or on a profile model, nothing is said."""
    args = ["plan", "--model", "llama3-8b", "--cluster", "4x8-h100", "--nodes", "1", "-b", "256"]
    result = run(args, tmp_path)
    assert result.exit_code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    none = [int(r[0]) for r in rows if "none" in r]
    assert none  # the premise: the search ranked some
    note = [line for line in result.stdout.splitlines() if "attention scores" in line]
    assert len(note) == 1 and "--recompute selective plans it" in note[0]
    ranks = note[0].split(" keep")[0].split(" ", 1)[1]
    assert [int(x) for part in ranks.split(", ") for x in (
        range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))] == none
    for more in (["--recompute", "selective"], ["--recompute", "none"]):
        assert "attention scores" not in run(args + more, tmp_path).stdout
    assert "attention scores" not in run(["plan"], tmp_path).stdout  # the default: a profile (vgg16)


def test_the_summary_line_counts_each_point_once(tmp_path):
    """The line under the table counts the points with a plan and the others
    by reason, each once: its "with a plan" count is the --all-points table's
    rows of status ok (not the ok and out-of-memory ones together), and each
    reason the table lists row by row (all but the ones left out a group at a
    time) has the table's count of that status."""
    import csv
    import re

    res = run(["plan", "--all-points", "points.csv"], tmp_path)
    assert res.exit_code == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if " points searched in " in x)
    total = int(line.split()[0].replace(",", ""))
    planned = int(re.search(r": (\d+) with a plan;", line).group(1))
    skipped = {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", line.split("skipped: ")[1])}
    assert total == planned + sum(skipped.values())
    rows = list(csv.DictReader((tmp_path / "points.csv").open()))
    statuses = [r["status"] for r in rows]
    assert planned == statuses.count("ok") > 0
    for reason, count in skipped.items():
        if reason not in ("pruned", "batch_not_divisible"):
            assert statuses.count(reason) == count, reason
    assert statuses.count("pruned") <= skipped.get("pruned", 0)


def test_a_gpu_optimizer_step_is_busy_time_not_bubble(tmp_path):
    """One V100, no pipeline, no data parallelism: two layers of 10 ms
    forward and 20 ms backward at batch 8 and 2 GB of parameters. The
    GPU's optimizer step after the last backward is its own work, so the
    one GPU never idles: bubble 0 (not the step's share of the iteration,
    24.5%) in the plan, in its replay and in validate's check."""
    model = tmp_path / "one.csv"
    model.write_text("# batch_size: 8\n# device: v100-pcie-16gb\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
                     "a,10,20,1000000000,8000000\nb,10,20,1000000000,8000000\n")
    out = tmp_path / "one.json"
    res = run(["plan", "--model", str(model), "--cluster", "1x4-v100-pcie", "-b", "8", "--pp", "1", "--dp", "1",
               "-o", str(out)], tmp_path)
    assert res.exit_code == 0, res.output
    plan = json.loads(out.read_text())["plans"][0]
    assert plan["stages"][0]["optimizer_step_s"] > 0.01
    assert plan["predicted"]["bubble_fraction"] == pytest.approx(0.0, abs=1e-12)
    res = run(["simulate", str(out)], tmp_path)
    assert "bubble (busiest rank idle): 0.0%" in res.output and "rank 0: busy 100.0%" in res.output, res.output
    assert run(["validate", str(out)], tmp_path).exit_code == 0
