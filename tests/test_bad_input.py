"""Bad input never crashes, hangs or slips through.

Every case runs the command as a user does and asserts: exit status 2, one
line on stderr that names the file, the field and the value, no traceback,
and no file created or changed in the working directory. Cases that would
hang without their check (a FIFO, a node count of 2**63 - 1) run in a
subprocess with a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import pipesearch.cli.plan_cmd as plan_cmd
from pipesearch.cli import main

REPO = Path(__file__).resolve().parent.parent
GOOD_DEVICE = (REPO / "hardware" / "devices" / "v100-pcie-16gb.toml").read_text()
LINKS = "[intra_node]\nbandwidth_GBps = 10\nlatency_us = 10\n[inter_node]\nbandwidth_GBps = 1.25\nlatency_us = 50\n"
CSV_HEADER = "# pipesearch profile v1\n# batch_size: 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
#: a PipeDream node line; format with id and op
NODE = ("{id} -- {op} -- forward_compute_time=1.000, backward_compute_time=2.000, "
        "activation_size=602112.000, parameter_size={params}.000\n")


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes (FIFOs by name only)."""
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_fifo():
            out[str(p.relative_to(directory))] = b"<fifo>"
        elif p.is_file():
            out[str(p.relative_to(directory))] = p.read_bytes()
    return out


def run(args, cwd: Path):
    """The CLI in-process, in ``cwd``: ``(exit code, stdout, stderr)``."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(old)
    return result.exit_code, result.stdout, result.stderr


def run_subprocess(args, cwd: Path, timeout_s: float = 60):
    """The CLI in a fresh interpreter (a hang becomes a failed test)."""
    try:
        done = subprocess.run([sys.executable, "-m", "pipesearch", *map(str, args)], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout_s, env={**os.environ, "PIPESEARCH_DEBUG": ""})
    except subprocess.TimeoutExpired:
        pytest.fail(f"pipesearch {' '.join(map(str, args))} hung for {timeout_s} s")
    return done.returncode, done.stdout, done.stderr


def assert_refused(cwd: Path, args, *needles, subprocess_=False) -> str:
    """Run, then assert exit 2, one stderr line holding every needle, no
    traceback, nothing in ``cwd`` created or changed. Returns the line."""
    before = snapshot(cwd)
    code, out, err = (run_subprocess if subprocess_ else run)(args, cwd)
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in out + err
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    assert snapshot(cwd) == before, "a refused command created or changed a file"
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def fifo(path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(path)
    return path


def tiny_csv(path: Path, layers: int = 8, rows=None) -> Path:
    rows = rows or [f"l{k},{1 + k % 3},{2 + k % 2},{1000 * (k + 1)},4096" for k in range(layers)]
    return write(path, CSV_HEADER + "".join(r + "\n" for r in rows))


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory):
    """A valid plan file of an 8-layer model on 4 devices (pp 2 x dp 2),
    as JSON: what the edits below start from."""
    tmp = tmp_path_factory.mktemp("plan")
    model = tiny_csv(tmp / "tiny.csv")
    code, out, err = run(["plan", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "8", "--pp", "2",
                          "--dp", "2", "--schedule", "gpipe", "-q", "-o", tmp / "plan.json"], tmp)
    assert code == 0, err
    doc = json.loads((tmp / "plan.json").read_text())
    plan = doc["plans"][0]
    assert plan["parallelism"]["pp"] == 2 and plan["parallelism"]["dp"] == 2
    assert doc["inputs"]["model"]["num_layers"] == 8 and doc["inputs"]["cluster"]["devices"] == 4
    return doc


def edited(tmp_path: Path, doc: dict, edit, name="edited.json") -> Path:
    doc = copy.deepcopy(doc)
    edit(doc["plans"][0])
    return write(tmp_path / name, json.dumps(doc))


# ------------------------------------------------------------- crashes and hangs


def test_huge_device_memory_is_refused_not_a_json_crash(tmp_path):
    write(tmp_path / "dev.toml", GOOD_DEVICE.replace("memory_GiB = 16", "memory_GiB = 1e300"))
    write(tmp_path / "c.toml", f'name = "c"\nnodes = 1\ndevices_per_node = 4\ndevice = "./dev.toml"\n{LINKS}')
    assert_refused(tmp_path, ["plan", "--cluster", "c.toml", "-o", "p.json"], "dev.toml", "memory_GiB", "1e+300")


def test_the_slowest_plan_valid_inputs_make_is_written(tmp_path):
    """Two layers of 1e9 ms (the largest time a profile may give) at a
    batch of 10**6 on 4 GPUs: a sample takes 4e6 s through both layers, so
    at least 10**6 x 4e6 / 4 = 1e12 s on the busiest GPU. The plan format
    held times up to 1e12 s only, and the finished search ended in an
    internal error writing the file; its limit is now above what valid
    inputs can make, and the file is written and validates."""
    write(tmp_path / "huge.csv", "# batch_size: 1\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
                                 "l0,1e9,1e9,0,0\nl1,1e9,1e9,0,0\n")
    code, out, err = run(["plan", "-q", "--model", "huge.csv", "--cluster", "1x4-v100-pcie", "-b", "1000000",
                          "-o", "p.json"], tmp_path)
    assert code == 0, err
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["plans"][0]["predicted"]["iteration_time_s"] >= 1e12 * (1 - 1e-9)
    code, out, err = run(["validate", "p.json"], tmp_path)
    assert code == 0, err


def test_node_count_of_int64_max_is_refused_not_a_hang(tmp_path):
    write(tmp_path / "c.toml", f'name = "c"\nnodes = 9223372036854775807\ndevices_per_node = 4\n'
                               f'device = "v100-pcie-16gb"\n{LINKS}')
    assert_refused(tmp_path, ["plan", "--cluster", "c.toml", "-o", "p.json"], "c.toml", "'nodes'",
                   "9223372036854775807", subprocess_=True)


def test_node_override_beyond_the_device_limit(tmp_path):
    assert_refused(tmp_path, ["plan", "--cluster", "1x4-v100-pcie", "--nodes", "1000000", "-o", "p.json"],
                   "1x4-v100-pcie.toml", "nodes=1000000", "4000000 devices")


@pytest.mark.parametrize("command", [["simulate"], ["export", "--format", "torch"], ["plot"]])
def test_fifo_as_plan_file_is_refused_not_a_hang(tmp_path, command):
    fifo(tmp_path / "plans.json")
    args = [command[0], "plans.json", *command[1:]]
    assert_refused(tmp_path, args, "plans.json", "FIFO", subprocess_=True)


@pytest.mark.parametrize("command", ["simulate", "validate"])
def test_character_device_as_plan_file(tmp_path, command):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    assert_refused(tmp_path, [command, "/dev/zero"], "/dev/zero", "character device")


def test_100000_layer_profile_over_a_small_budget_stops_with_size_and_knob(tmp_path):
    tiny_csv(tmp_path / "long.csv", rows=[f"l{k},1,2,1000000,1000000" for k in range(100_000)])
    # pipesearch.budget: 256 MiB + the split tables' cap 2 GiB + 4 KiB x 1e5 layers (390.6 MiB): about 2.6 GiB
    assert_refused(tmp_path, ["plan", "--model", "long.csv", "-b", "8", "--max-search-memory", "1GiB", "-o", "p.json"],
                   "long.csv", "100000 layers", "2.6 GiB", "--max-search-memory 1.0 GiB", "merge layers into blocks")


def test_transformer_with_two_billion_layers_is_refused_before_building_them(tmp_path):
    text = (REPO / "cost_models" / "gpt3-1.3b.toml").read_text()
    lines = [("num_layers = 2000000000" if line.startswith("num_layers =") else line) for line in text.splitlines()]
    write(tmp_path / "deep.toml", "\n".join(lines) + "\n")
    # 2e9 blocks: more than a transformer config may have (each a row of every layer table), refused on reading
    assert_refused(tmp_path, ["plan", "--model", "deep.toml", "--cluster", "1x8-a100-80gb", "-b", "64",
                              "-o", "p.json"], "deep.toml", "num_layers' = 2000000000 makes 2000000000 blocks",
                   "more than the 100000", subprocess_=True)


def test_memory_budget_is_a_knob(tmp_path):
    # vgg16: 40 layers -> 256 MiB + 112 x 1600 bytes + 4096 x 40 bytes = 256.3 MiB > 1 MiB
    # a budget under the search's fixed 256 MiB: no block merging helps, the fix is the budget
    assert_refused(tmp_path, ["plan", "--model", "vgg16", "--max-search-memory", "1MiB", "-o", "p.json"],
                   "vgg16", "40 layers", "256.3 MiB", "--max-search-memory 1.0 MiB",
                   "raise --max-search-memory to at least 256.3 MiB")
    assert_refused(tmp_path, ["plan", "--max-search-memory", "lots", "-o", "p.json"], "--max-search-memory", "'lots'")


def test_an_allocation_failure_is_a_clear_message(tmp_path, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 74.5 GiB for an array with shape (100000, 100001) and data type float64")

    monkeypatch.setattr(plan_cmd, "search", no_memory)
    line = assert_refused(tmp_path, ["plan", "-o", "p.json"], "out of memory", "74.5 GiB", "--max-search-memory")
    assert "float64" in line


@pytest.mark.parametrize("name,text,args,needle", [
    ("plans.json", '{"schema": "pipesearch.plan/1", "x": 1' + "0" * 5000 + "}", ["validate", "plans.json"],
     "an integer with more than 4300 digits"),
    ("plans.json", "[" * 200_000, ["simulate", "plans.json"], "nested too deeply"),
    ("c.toml", 'name = "c"\nnodes = 1' + "0" * 5000 + "\n", ["plan", "--cluster", "c.toml", "-o", "p.json"],
     "an integer with more than 4300 digits"),
    ("c.toml", "x = " + "[" * 100_000 + "\n", ["plan", "--cluster", "c.toml", "-o", "p.json"], "nested too deeply"),
    ("config.json", '{"hidden_size": 1' + "0" * 5000 + "}", ["plan", "--model", "config.json", "-o", "p.json"],
     "an integer with more than 4300 digits"),
], ids=["plan-long-int", "plan-deep", "toml-long-int", "toml-deep", "hf-config-long-int"])
def test_parser_limits_are_bad_input_not_a_crash(tmp_path, name, text, args, needle):
    write(tmp_path / name, text)
    assert_refused(tmp_path, args, name, needle)


# ------------------------------------------------------------- wrong accepts


@pytest.mark.parametrize("command", [["simulate"], ["export", "--format", "torch"], ["validate"]])
@pytest.mark.parametrize("edit,needles", [
    (lambda p: p["stages"][-1].__setitem__("layers", [4, 7]), ["stages[1].layers", "[4, 7]", "8 layers"]),
    (lambda p: p["stages"][-1].__setitem__("layers", [4, 12]), ["stages[1].layers", "[4, 12]", "8 layers"]),
    (lambda p: p["stages"][-1].__setitem__("devices", [998, 999]), ["stages[1].devices", "998", "4 devices"]),
    (lambda p: p["stages"][-1].__setitem__("devices", list(p["stages"][0]["devices"])),
     ["stages[1].devices", "already serves stages[0]"]),
], ids=["short-of-the-model", "past-the-model", "devices-that-do-not-exist", "one-device-two-stages"])
def test_edited_plan_is_refused(tmp_path, plan_doc, command, edit, needles):
    assert plan_doc["plans"][0]["stages"][1]["layers"] == [4, 8], "the edits assume the split 4,4"
    path = edited(tmp_path, plan_doc, edit)
    assert_refused(tmp_path, [command[0], path, *command[1:]], path, *needles)


@pytest.mark.parametrize("command", [["simulate"], ["export", "--format", "torch"], ["validate"],
                                     ["plot", "--kind", "stages", "-o", "s.png"]])
@pytest.mark.parametrize("edit,needles", [
    (lambda p: p["parallelism"].__setitem__("pp", 2.0), ["plans[0].parallelism.pp", "expected an integer", "2.0"]),
    (lambda p: p["parallelism"].__setitem__("tp", 1.0), ["plans[0].parallelism.tp", "expected an integer", "1.0"]),
    (lambda p: p["stages"][0].__setitem__("layers", [0.0, 4.0]), ["plans[0].stages[0].layers[0]", "0.0"]),
    (lambda p: p["stages"][0].__setitem__("index", 0.0), ["plans[0].stages[0].index", "0.0"]),
], ids=["pp", "tp", "layers", "index"])
def test_whole_number_floats_are_not_counts(tmp_path, plan_doc, command, edit, needles):
    """JSON Schema counts 4.0 as an integer; a count or an index written
    with a fraction is refused by the schema check (it crashed the semantic
    checks and the stages plot with a TypeError / IndexError)."""
    path = edited(tmp_path, plan_doc, edit)
    assert_refused(tmp_path, [command[0], path, *command[1:]], path, *needles)


@pytest.mark.parametrize("args,needles", [
    (["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--memory-reserve", "2", "-o", "s.json"],
     ["--memory-reserve 2", "no unit", "2GiB"]),
    (["plan", "--max-search-memory", "1024", "-o", "p.json"], ["--max-search-memory 1024", "no unit"]),
    (["plan", "--memory-reserve", "abc", "-o", "p.json"], ["--memory-reserve 'abc'", "not a size", "80GiB"]),
], ids=["serve-reserve", "search-memory", "not-a-size"])
def test_sizes_on_the_command_line_need_a_unit(tmp_path, args, needles):
    """Every size flag of plan and serve refuses a bare number (serve took
    --memory-reserve 2 as 2 bytes) and names the flag and a fix."""
    assert_refused(tmp_path, args, *needles)


@pytest.mark.parametrize("args,needles", [
    (["plan", "--pp", "2", "--schedule", "interleaved-1f1b", "--split", "10,10,10,10", "--vp", "2", "--vp", "3",
      "-o", "p.json"], ["--vp 3", "--split of 4 stages", "--pp 2"]),
    (["plan", "--split", "20,20", "--replicate-stages", "-o", "p.json"], ["--replicate-stages with --split"]),
    (["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--simulate-top", "0", "--num-requests", "5",
      "-o", "s.json"], ["--num-requests with --simulate-top 0"]),
    (["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--simulate-top", "0", "--seed", "3", "-o", "s.json"],
     ["--seed with --simulate-top 0"]),
    (["plan", "--mapping-time-limit", "5", "-o", "p.json"], ["--mapping-time-limit 5", "one device type and one link model", "drop it"]),
    (["plan", "--no-sequence-parallel", "-o", "p.json"], ["--no-sequence-parallel", "layer profile", "drop it"]),
    (["plan", "--model", "gpt3-1.3b", "--tp", "1", "--sequence-parallel", "-o", "p.json"],
     ["--sequence-parallel with --tp 1", "drop one of them"]),
    (["plan", "--model", "resnet18", "--recompute", "per-stage", "-o", "p.json"],
     ["--recompute per-stage", "resnet18.csv has no recompute_saved_bytes column"]),
], ids=["vp-off-the-split", "replicate-a-pinned-split", "requests-not-simulated", "seed-not-simulated",
        "order-search-limit-on-one-type", "sequence-parallel-on-a-profile", "sequence-parallel-without-tp",
        "per-stage-without-the-column"])
def test_flags_that_would_be_ignored_are_refused(tmp_path, args, needles):
    """Each of these ran with the flag silently dropped (the vgg16 default
    has 40 layers, so 10,10,10,10 is a valid split of 4 stages; its cluster,
    like resnet18's default, has one device type; neither profile has a
    recompute_saved_bytes column)."""
    assert_refused(tmp_path, args, *needles)


def test_the_order_search_limit_is_taken_where_orders_differ(tmp_path):
    """Two groups of the same A100 nodes joined by a slower inter_group
    link: device orders differ (the search maps them), so
    --mapping-time-limit applies and is accepted (it was refused as "one
    type", the device name alone)."""
    write(tmp_path / "c.toml", 'name = "two"\n'
          + '[[groups]]\nnodes = 1\ndevices_per_node = 4\ndevice = "a100-80gb"\n' * 2
          + "[intra_node]\nbandwidth_GBps = 300\nlatency_us = 5\n"
          + "[inter_node]\nbandwidth_GBps = 25\nlatency_us = 10\n"
          + "[inter_group]\nbandwidth_GBps = 5\nlatency_us = 10\n")
    code, out, err = run(["plan", "-q", "--model", "resnet18", "--cluster", "c.toml", "-b", "16", "--top", "1",
                          "--mapping-time-limit", "2"], tmp_path)
    assert code == 0, err


def test_plot_rank_applies_to_one_plan_figures(tmp_path, plan_doc):
    path = write(tmp_path / "plan.json", json.dumps(plan_doc))
    for kind in ("space", "pareto"):
        assert_refused(tmp_path, ["plot", path, "--kind", kind, "--rank", "2", "-o", "f.png"], f"--kind {kind}")


def test_a_figure_path_that_cannot_be_written_leaves_every_output_alone(tmp_path):
    """plan wrote -o, --all-points and three figures before it found that
    the fourth figure's name is a directory; now nothing is written."""
    write(tmp_path / "p.json", "OLD\n")
    (tmp_path / "figs" / "timeline.png").mkdir(parents=True)
    assert_refused(tmp_path, ["plan", "--plot-dir", "figs", "-o", "p.json", "--all-points", "pts.csv"],
                   "figs/timeline.png", "is a directory")


@pytest.mark.parametrize("args,needles", [
    (["plan", "-o", "plan.png"], ["-o plan.png", "the plan file is JSON", "ending in .json"]),
    (["plan", "--all-points", "points.json"], ["--all-points points.json", "CSV", "ending in .csv"]),
    (["serve", "-o", "serve.png"], ["-o serve.png", "JSON", "ending in .json"]),
])
def test_an_output_name_with_another_format_s_suffix_is_refused(tmp_path, args, needles):
    """``plan -o plan.png`` wrote plan JSON under a figure's name, ``serve
    -o serve.png`` likewise, ``--all-points x.json`` CSV (export, plot and
    profile already refused theirs)."""
    assert_refused(tmp_path, args, *needles)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args,clash", [
    (["-o", "stages.png", "--plot-dir", "."], "--plot-dir stages.png: the same file as -o stages.png"),
    (["--all-points", "figs/space.png", "--plot-dir", "figs"],
     "--plot-dir figs/space.png: the same file as --all-points figs/space.png"),
    # the directory named like the plan file: it was written, then the figures failed (exit 2, a file left)
    (["-o", "new.json", "--plot-dir", "new.json"], "--plot-dir new.json: the same file as -o new.json"),
])
def test_an_output_that_is_a_figure_of_plot_dir_is_refused(tmp_path, args, clash):
    """``plan -o stages.png --plot-dir .`` wrote the plan file, then the
    figure over it (exit 0, the plans lost); --all-points likewise."""
    (tmp_path / "figs").mkdir()
    write(tmp_path / "stages.png", "OLD\n")
    assert_refused(tmp_path, ["plan", *args], clash)
    assert (tmp_path / "stages.png").read_text() == "OLD\n" and not list((tmp_path / "figs").iterdir())


@pytest.mark.parametrize("command", [["validate"], ["export", "--format", "torch"]])
def test_an_unknown_recompute_mode_is_refused_by_the_schema(tmp_path, plan_doc, command):
    """validate passed plans[0].options.recompute = "weird", which export
    then refused without naming the file or the field."""
    path = edited(tmp_path, plan_doc, lambda p: p["options"].__setitem__("recompute", "weird"))
    assert_refused(tmp_path, [command[0], path, *command[1:]], path, "plans[0].options.recompute", "'weird'",
                   "none, selective, full, per-stage")


def test_a_split_too_large_for_the_cluster_names_the_split(tmp_path):
    """--split pins pp; the refusal named "--pp 4", which was not given."""
    line = assert_refused(tmp_path, ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "--tp", "4",
                                     "--split", "5,5,6,10", "-o", "p.json"],
                          "--split of 4 stages (pp 4) x --tp 4 needs 16 devices", "1x8-a100-80gb has 8")
    assert "--pp 4" not in line


def test_a_header_field_without_its_colon_is_named(tmp_path):
    write(tmp_path / "p.csv", "# batch_size 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
          + "".join(f"l{k},1,2,1000,4096\n" for k in range(4)))
    assert_refused(tmp_path, ["plan", "--model", "p.csv", "-o", "x.json"], "p.csv", "line 1", "no colon",
                   "'# batch_size: 8'")


@pytest.mark.parametrize("args,needles", [
    (["--pp", "2", "--vp", "2", "--split", "20,20"], ["--split of 2 stages", "pp x vp = 2", "here pp 2 x vp 2 = 4"]),
    (["--split", "5,5,5,5,5,5,5,5"], ["--split of 8 stages", "add --pp and --vp", "--pp 4 --vp 2 or --pp 2 --vp 4"]),
    (["--split", "20x2,20x2"], ["replicas (NxR)", "one stage per device"]),
], ids=["pp-and-vp-given", "pp-from-the-split", "replicated"])
def test_a_split_for_interleaving_names_what_was_given(tmp_path, args, needles):
    """The message asked for "--pp and --vp with pp x vp = 2" when both were
    given (pp 2 x vp 2 = 4), and suggested pp x vp for replicated stages,
    which cannot interleave (vgg16, the default, has 40 layers). Without
    --pp, the pairs that fit the split are named."""
    assert_refused(tmp_path, ["plan", "--schedule", "interleaved-1f1b", *args, "-o", "p.json"], *needles)


@pytest.mark.parametrize("sep,name", [(";", "semicolons"), ("\t", "tabs")])
def test_a_profile_of_another_separator_names_it(tmp_path, sep, name):
    """A spreadsheet of a locale whose list separator is ';' (or a tab
    export) writes the right header row with the wrong separator: the
    message says so, not "no header row, add name,fwd_ms,...", which the
    file already has."""
    rows = ["name", "fwd_ms", "bwd_ms", "param_bytes", "output_bytes"], ["l0", "1", "2", "1000", "4096"]
    write(tmp_path / "p.csv", "# batch_size: 8\n" + "".join(sep.join(r) + "\n" for r in rows))
    text = assert_refused(tmp_path, ["plan", "--model", "p.csv", "-o", "x.json"], "p.csv", "line 2",
                          f"separated by {name}", "comma-separated")
    assert "no header row" not in text


@pytest.mark.parametrize("line,fix", [("# batch_size = 8", "# batch_size: 8"), ("# batch size: 8", "# batch_size: 8"),
                                      ("# bytes-per-param: 2", "# bytes_per_param: 2")])
def test_a_header_field_written_otherwise_is_named_with_its_line(tmp_path, line, fix):
    """'=' for the colon, spaces or dashes for the underscores: the line is
    named with the field as it must be written (it was taken for a comment,
    then the file refused for a missing batch_size without a line)."""
    head = line + "\n" + ("# batch_size: 8\n" if "batch" not in line else "")
    write(tmp_path / "p.csv", head + "name,fwd_ms,bwd_ms,param_bytes,output_bytes\nl0,1,2,1000,4096\n")
    assert_refused(tmp_path, ["plan", "--model", "p.csv", "-o", "x.json"], "p.csv", "line 1", repr(line), repr(fix))


def test_a_spreadsheets_empty_rows_and_repeated_header_are_named(tmp_path):
    """Trailing rows of bare commas and a header row pasted twice, both what
    spreadsheets leave, are named as such (not "empty layer name", not
    "'fwd_ms' is not a finite number")."""
    head = "# batch_size: 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\nl0,1,2,1000,4096\n"
    write(tmp_path / "p.csv", head + "l1,1,2,1000,4096\n,,,,\n,,,,\n")
    assert_refused(tmp_path, ["plan", "--model", "p.csv", "-o", "x.json"], "p.csv", "line 5", "an empty row")
    write(tmp_path / "p.csv", head + "name,fwd_ms,bwd_ms,param_bytes,output_bytes\nl1,1,2,1000,4096\n")
    assert_refused(tmp_path, ["plan", "--model", "p.csv", "-o", "x.json"], "p.csv", "line 4",
                   "the header row again (as on line 2)")


def test_a_profile_without_its_header_row_says_so(tmp_path):
    write(tmp_path / "p.csv", "# batch_size: 8\n" + "".join(f"l{k},1,2,1000,4096\n" for k in range(4)))
    assert_refused(tmp_path, ["plan", "--model", "p.csv", "-o", "x.json"], "p.csv", "line 2", "no header row",
                   "name,fwd_ms,bwd_ms,param_bytes,output_bytes")


def test_an_unexpected_exception_is_one_line_and_exit_1(tmp_path, monkeypatch):
    """A bug is exit status 1 with one line that says so and how to get the
    traceback (README, exit statuses), not a raw traceback."""
    def broken(*args, **kwargs):
        raise ValueError("something nobody expected")

    monkeypatch.setattr(plan_cmd, "search", broken)
    monkeypatch.delenv("PIPESEARCH_DEBUG", raising=False)
    code, out, err = run(["plan", "-q"], tmp_path)
    assert code == 1 and "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("internal error: ValueError: something nobody expected")
    assert "PIPESEARCH_DEBUG=1" in lines[0]


def test_per_stage_device_count_is_checked(tmp_path, plan_doc):
    """One device id for a stage of a dp-2 plan: only the per-stage count
    check (``len(devices) == dp``) can say what is wrong."""
    path = edited(tmp_path, plan_doc, lambda p: p["stages"][0].__setitem__("devices", p["stages"][0]["devices"][:1]))
    assert_refused(tmp_path, ["simulate", path], path, "stages[0].devices", "1 device id(s)", "parallelism.dp is 2")


def test_batch_product_is_checked(tmp_path, plan_doc):
    """micro_batch_size 1 x num_micro_batches 8 x dp 2 = 16 != the batch 8."""
    def edit(p):
        p["schedule"]["micro_batch_size"] = 1
        p["schedule"]["num_micro_batches"] = 8
    path = edited(tmp_path, plan_doc, edit)
    assert_refused(tmp_path, ["simulate", path], path, "micro_batch_size 1 x num_micro_batches 8 x dp 2 = 16",
                   "global_batch_size is 8")


def test_degrees_must_fit_the_cluster(tmp_path, plan_doc):
    path = edited(tmp_path, plan_doc, lambda p: p["parallelism"].__setitem__("tp", 2))
    assert_refused(tmp_path, ["export", path, "--format", "gpipe"], path, "pp 2 x dp 2 x tp 2 = 8 devices", "has 4")


def test_schedule_too_large_to_replay_is_refused_before_building(tmp_path, plan_doc):
    """pp 2 x vp 4096 x 16384 micro-batches = 2**27 stage micro-batches > 2**24:
    refused by size (building it would take minutes)."""
    def edit(p):
        p["parallelism"]["vp"] = 4096
        p["schedule"].update(name="interleaved-1f1b", num_micro_batches=16384)
    path = edited(tmp_path, plan_doc, edit)
    code, out, err = run(["validate", path], tmp_path)
    assert code == 2
    assert f"{path}: plans[0].schedule: pp 2 x vp 4096 x num_micro_batches 16384 = 134217728 stage micro-batches" \
        in out


def test_device_type_must_match_the_cluster(tmp_path):
    """On mixed-a100-v100 devices 0-3 are a100-40gb and 4-7 v100-32gb
    (hardware/clusters/mixed-a100-v100.toml): a stage relabelled is refused."""
    code, out, err = run(["plan", "--model", tiny_csv(tmp_path / "t.csv"), "--cluster", "mixed-a100-v100", "-b", "8",
                          "--pp", "2", "--dp", "1", "--top", "1", "-q", "-o", "p.json"], tmp_path)
    assert code == 0, err
    doc = json.loads((tmp_path / "p.json").read_text())
    stage = doc["plans"][0]["stages"][0]
    assert stage["device_type"] == ("a100-40gb" if stage["devices"][0] < 4 else "v100-32gb")
    stage["device_type"] = "h100-80gb"
    path = write(tmp_path / "relabelled.json", json.dumps(doc))
    assert_refused(tmp_path, ["validate", path], path, "stages[0].device_type", "'h100-80gb'")


def test_torch_export_of_a_valid_plan_still_works(tmp_path, plan_doc):
    path = write(tmp_path / "ok.json", json.dumps(plan_doc))
    code, out, err = run(["export", path, "--format", "torch"], tmp_path)
    assert code == 0, err
    code, out, err = run(["validate", path], tmp_path)
    assert code == 0 and "valid pipesearch.plan/1 file, " in out, err


def test_pipedream_graph_without_edges(tmp_path):
    text = NODE.format(id="node1", op="Input", params=0) + NODE.format(id="node2", op="Conv2d(3, 64)", params=1792) \
        + NODE.format(id="node3", op="ReLU()", params=0)
    write(tmp_path / "flat.graph.txt", text)
    assert_refused(tmp_path, ["plan", "--model", "flat.graph.txt", "-o", "p.json"], "flat.graph.txt",
                   "3 node lines but no edge lines")


def test_pipedream_node_connected_to_nothing(tmp_path):
    text = (NODE.format(id="node1", op="Input", params=0) + NODE.format(id="node2", op="Conv2d(3, 64)", params=1792)
            + NODE.format(id="node3", op="ReLU()", params=0) + NODE.format(id="node4", op="Linear(4, 4)", params=80)
            + "\tnode1 -- node2\n\tnode2 -- node3\n")
    write(tmp_path / "stray.graph.txt", text)
    assert_refused(tmp_path, ["plan", "--model", "stray.graph.txt", "-o", "p.json"], "stray.graph.txt", "line 4",
                   "'node4'", "connected to nothing")


def test_pipedream_ops_that_only_share_an_input(tmp_path):
    text = (NODE.format(id="node1", op="Input", params=0) + NODE.format(id="node2", op="Conv2d(3, 64)", params=1792)
            + NODE.format(id="node3", op="Linear(4, 4)", params=80)
            + "\tnode1 -- node2\n\tnode1 -- node3\n")
    write(tmp_path / "twins.graph.txt", text)
    assert_refused(tmp_path, ["plan", "--model", "twins.graph.txt", "-o", "p.json"], "twins.graph.txt",
                   "inputs (node1)", "2 separate graphs")


def test_a_micro_batch_count_the_replica_batch_cannot_take_names_both_fixes(tmp_path):
    """64 samples over --dp 4 is 16 per replica: 64 micro-batches do not
    divide it; the refusal names a count that does, and the global batch
    the pin needs (4 x 64 = 256)."""
    assert_refused(tmp_path, ["plan", "--model", "resnet18", "-b", "64", "--dp", "4", "--num-micro-batches", "64",
                              "-o", "p.json"],
                   "per-replica batch 16 (--global-batch-size 64 / --dp 4)", "divides 16",
                   "--global-batch-size of 256")


def test_three_batch_pins_must_make_the_batch(tmp_path):
    assert_refused(tmp_path, ["plan", "--cluster", "1x4-v100-pcie", "--micro-batch-size", "4", "--num-micro-batches",
                              "4", "--dp", "2", "-b", "64", "-o", "p.json"],
                   "--micro-batch-size 4 x --num-micro-batches 4 x --dp 2 = 32", "--global-batch-size is 64")


def test_two_batch_pins_fix_dp_and_are_honoured(tmp_path):
    code, out, err = run(["plan", "--model", tiny_csv(tmp_path / "t.csv"), "--cluster", "1x4-v100-pcie",
                          "--micro-batch-size", "1", "--num-micro-batches", "4", "-b", "8", "-q", "-o", "p.json"],
                         tmp_path)
    assert code == 0, err
    plans = json.loads((tmp_path / "p.json").read_text())["plans"]
    # 8 samples / (1 x 4) per replica = dp 2 in every plan
    assert {(p["schedule"]["micro_batch_size"], p["schedule"]["num_micro_batches"], p["parallelism"]["dp"])
            for p in plans} == {(1, 4, 2)}
    assert_refused(tmp_path, ["plan", "--cluster", "1x4-v100-pcie", "--micro-batch-size", "3",
                              "--num-micro-batches", "4", "-b", "64", "-o", "q.json"], "= 12 samples per replica",
                   "--global-batch-size 64")


def test_vp_without_a_schedule_that_uses_it(tmp_path):
    assert_refused(tmp_path, ["plan", "--vp", "3", "--schedule", "1f1b", "-o", "p.json"], "--vp 3",
                   "--schedule asks for 1f1b")


@pytest.mark.parametrize("args,needle", [
    (["plan", "-o", ""], "-o"),
    (["plan", "--json", "-o", ""], "-o"),
    (["plan", "--all-points", ""], "--all-points"),
    (["plan", "--plot-dir", ""], "--plot-dir"),
])
def test_empty_output_name_writes_nothing(tmp_path, args, needle):
    line = assert_refused(tmp_path, args, needle, "empty")
    assert not (tmp_path / "plans.json").exists(), line


@pytest.mark.parametrize("command,option", [
    (["simulate"], "--timeline"), (["simulate"], "--torch-csv"), (["export", "--format", "torch"], "-o"),
    (["plot"], "-o")])
def test_empty_output_name_of_plan_file_commands(tmp_path, plan_doc, command, option):
    path = write(tmp_path / "ok.json", json.dumps(plan_doc))
    assert_refused(tmp_path, [command[0], path, *command[1:], option, ""], option, "empty file name")


# ------------------------------------------------------------- unclear messages


def test_huge_forward_time_names_file_line_and_column(tmp_path):
    rows = [f"l{k},1,2,1000,4096" for k in range(4)]
    rows[2] = "l2,1e308,2,1000,4096"  # line 6: three header lines, then rows 0 and 1
    tiny_csv(tmp_path / "slow.csv", rows=rows)
    assert_refused(tmp_path, ["plan", "--model", "slow.csv", "-b", "8", "-o", "p.json"], "slow.csv", "line 6",
                   "fwd_ms", "1e308", "1e+09 ms")


def test_time_below_a_nanosecond_is_refused(tmp_path):
    """1e-300 ms would make a plan of 2e303 samples/s, a file the reader refuses."""
    rows = [f"l{k},1e-300,1e-300,1,1" for k in range(2)]
    tiny_csv(tmp_path / "fast.csv", rows=rows)
    assert_refused(tmp_path, ["plan", "--model", "fast.csv", "-b", "8", "-o", "p.json"], "fast.csv", "line 4",
                   "fwd_ms", "1e-300", "1e-06 ms")


def test_huge_parameter_size_is_one_line_without_warnings(tmp_path):
    rows = [f"l{k},1,2,1000,4096" for k in range(4)]
    rows[1] = "l1,1,2,1e308,4096"
    tiny_csv(tmp_path / "big.csv", rows=rows)
    assert_refused(tmp_path, ["plan", "--model", "big.csv", "-b", "8", "-o", "p.json"], "big.csv", "line 5",
                   "param_bytes", "1e308", subprocess_=True)


def test_pipedream_huge_value(tmp_path):
    text = (NODE.format(id="node1", op="Input", params=0)
            + NODE.format(id="node2", op="Conv2d(3, 64)", params=1792).replace("forward_compute_time=1.000",
                                                                                "forward_compute_time=1e308")
            + "\tnode1 -- node2\n")
    write(tmp_path / "slow.graph.txt", text)
    assert_refused(tmp_path, ["plan", "--model", "slow.graph.txt", "-o", "p.json"], "slow.graph.txt", "line 2",
                   "forward_compute_time='1e308'")


@pytest.mark.parametrize("column,value,expected", [
    ("iteration_time_s", "x", "a number in [0, 1e+30]"), ("iteration_time_s", -5, "a number in [0, 1e+30]"),
    ("iteration_time_s", 1e300, "a number in [0, 1e+30]"), ("samples_per_s", 1e300, "a number in [0, 1e+30]"),
    ("bubble_fraction", 1.5, "a number in [0, 1]"), ("status", "weird", "one of ok, pruned"),
    ("pp", "two", "an integer >= 1"), ("schedule", "bogus", "one of gpipe")])
def test_points_table_cells_are_checked(tmp_path, plan_doc, column, value, expected):
    doc = copy.deepcopy(plan_doc)
    points = doc["search"]["points"]
    k = points["columns"].index(column)
    points["values"][k][0] = value
    path = write(tmp_path / "points.json", json.dumps(doc))
    assert_refused(tmp_path, ["plot", path, "--kind", "space", "-o", "space.png"], path,
                   f"search.points.values[{k}][0]", f"column {column!r}", expected)


@pytest.mark.parametrize("column,value,expected", [("pp", "two", "an integer >= 1"),
                                                   ("schedule", "bogus", "one of gpipe")])
def test_points_table_by_row_cells_are_checked(tmp_path, plan_doc, column, value, expected):
    """Files with the table by row (``data``, the older layout) are checked the same way."""
    doc = copy.deepcopy(plan_doc)
    points = doc["search"]["points"]
    rows = [list(r) for r in zip(*points.pop("values"))]
    rows[0][points["columns"].index(column)] = value
    points["data"] = rows
    path = write(tmp_path / "points.json", json.dumps(doc))
    assert_refused(tmp_path, ["plot", path, "--kind", "space", "-o", "space.png"], path, "search.points.data[0]",
                   f"column {column!r}", expected)


def test_points_table_without_a_column_the_figures_read(tmp_path, plan_doc):
    """A table whose ``tp`` column was renamed passed ``validate`` and was
    refused only by ``plot``: both refuse it now, naming the column."""
    doc = copy.deepcopy(plan_doc)
    doc["search"]["points"]["columns"][doc["search"]["points"]["columns"].index("tp")] = "tensor_parallel"
    path = write(tmp_path / "points.json", json.dumps(doc))
    assert_refused(tmp_path, ["validate", path], path, "search.points.columns", "lacks tp")


def test_points_table_columns_of_different_lengths(tmp_path, plan_doc):
    doc = copy.deepcopy(plan_doc)
    doc["search"]["points"]["values"][2].pop()
    path = write(tmp_path / "points.json", json.dumps(doc))
    assert_refused(tmp_path, ["plot", path, "--kind", "space", "-o", "space.png"], path, "search.points.values",
                   "columns of different lengths")


def test_serving_requests_longer_than_the_context_are_refused(tmp_path):
    """Llama 3 8B's context is 8192 tokens (Llama Team 2024, Table 3): 100,000 + 256 cannot be served."""
    assert_refused(tmp_path, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--input-len", "100000",
                              "-o", "s.json"], "100256 tokens", "context of 8192")


def test_serving_an_encoder_decoder_model_is_refused_up_front(tmp_path):
    """T5 is an encoder-decoder model; serving plans model decoder-only
    transformers: one line naming the model and the command that does plan
    it, unpinned or pinned (a pinned tp 1 x pp 1 was refused for "pipeline
    parallelism" it does not have)."""
    for pins in ([], ["--tp", "1", "--pp", "1"]):
        assert_refused(tmp_path, ["serve", "--model", "t5-3b", "--cluster", "1x8-l4", "-o", "s.json", *pins],
                       "t5-3b is an encoder-decoder model", "pipesearch plan --model t5-3b")


def test_pinned_degrees_count_tensor_parallel_devices(tmp_path):
    """pp 2 x dp 8 x tp 2 = 32 devices, not the 16 of pp x dp."""
    assert_refused(tmp_path, ["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "256", "--pp", "2",
                              "--dp", "8", "--tp", "2", "-o", "p.json"],
                   "--pp 2 x --dp 8 x --tp 2 needs 32 devices", "has 16")


def test_a_pinned_pp_names_the_pinned_tp_whose_devices_it_counts(tmp_path):
    """pp 8 x tp 4 = 32 devices: the line names both pins (it named --pp 8
    alone, with a count of 32 the user could not place)."""
    assert_refused(tmp_path, ["plan", "--model", "gpt3-1.3b", "--cluster", "2x8-a100-80gb", "-b", "64", "--pp", "8",
                              "--tp", "4", "-o", "p.json"], "--pp 8 x --tp 4 needs 32 devices", "has 16")


def test_a_placement_with_pins_that_leave_one_replica_is_refused(tmp_path):
    """--pp 8 on 8 devices leaves dp 1, where every placement is the same
    one: refused as --dp 1 is (it ran, the pin meaning nothing); --pp 4
    leaves dp 2 and runs; --pp 16 leaves none, and says so."""
    assert_refused(tmp_path, ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64", "--placement",
                              "data", "--pp", "8", "-o", "p.json"],
                   "--placement data with --pp 8 on the 8 devices of 1x8-a100-80gb (dp 1)", "drop --placement")
    ok = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                   "--placement", "data", "--pp", "4", "--top", "1"])
    assert ok.exit_code == 0, ok.output
    # pins that need more devices than the cluster has are refused for that, with the pin the user gave
    for pins, needle in ((["--pp", "16"], "--pp 16 needs 16 devices"),
                         (["--split", "2,2,2,2,2,2,2,2,2,2,1,1,1,1,1,1"], "--split of 16 stages (pp 16) needs 16")):
        assert_refused(tmp_path, ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                  "--placement", "data", *pins, "-o", "p.json"], needle, "has 8")


def test_export_files_empty_or_under_a_file_is_refused(tmp_path, plan_doc):
    path = edited(tmp_path, plan_doc, lambda p: None)
    write(tmp_path / "afile", "x")
    assert_refused(tmp_path, ["export", path, "--format", "torch", "--files", ""], "--files", "empty")
    assert_refused(tmp_path, ["export", path, "--format", "torch", "--files", "afile/sub"], "afile is not a directory")
    assert_refused(tmp_path, ["export", path, "--format", "torch", "--files", "afile"], "afile", "is a file")


def test_export_files_into_a_directory_name_too_long_is_refused(tmp_path, plan_doc):
    """Path.exists raised on the name: an internal error (exit 1)."""
    path = edited(tmp_path, plan_doc, lambda p: None)
    assert_refused(tmp_path, ["export", path, "--format", "deepspeed", "--files", "b" * 300],
                   f"export --files {'b' * 80}... (300 characters): cannot create it")


def test_export_files_into_a_directory_that_cannot_be_made(tmp_path, plan_doc):
    """/proc exists but no directory can be made in it (even as root)."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    path = edited(tmp_path, plan_doc, lambda p: None)
    assert_refused(tmp_path, ["export", path, "--format", "torch", "--files", "/proc/pipesearch-out"],
                   "--files /proc/pipesearch-out", "cannot create it")


def test_a_plan_of_zero_time_is_refused_and_strict_bounds_are_said_in_words(tmp_path, plan_doc):
    """Every stage time and the iteration time set to 0 passed validate and
    crashed simulate (a division by the iteration time); a byte size of 0
    where it must be positive read "0 is less than or equal to the minimum
    of 0" (jsonschema's own words)."""
    def zero(p):
        for st in p["stages"]:
            st.update(fwd_s=0.0, compute_s=0.0, comm_s=0.0, allreduce_s=0.0)
        p["predicted"].update(iteration_time_s=0.0, analytic_iteration_time_s=0.0)

    path = edited(tmp_path, plan_doc, zero)
    for command in (["validate"], ["simulate"], ["export", "--format", "torch"]):
        assert_refused(tmp_path, [command[0], path, *command[1:]], "plans[0].predicted.iteration_time_s",
                       "must be > 0, got 0")
    doc = copy.deepcopy(plan_doc)
    doc["inputs"]["model"]["bytes_per_param"] = 0
    path = write(tmp_path / "bpp.json", json.dumps(doc))
    line = assert_refused(tmp_path, ["validate", path], "inputs.model.bytes_per_param", "must be > 0, got 0")
    assert "less than or equal" not in line


@pytest.mark.parametrize("edit,needle", [
    (("comm_overlap", "bucket_params", -1), "inputs.job.comm_overlap.bucket_params: must be >= 1, got -1"),
    (("comm_overlap", "grad_reduce", "no"), "inputs.job.comm_overlap.grad_reduce: expected true or false, got 'no'"),
    ((None, "memory_headroom_fraction", -0.5), "inputs.job.memory_headroom_fraction: must be >= 0, got -0.5"),
    ((None, "sequence_parallel", "true"), "inputs.job.sequence_parallel: expected true or false"),
    ((None, "schedules", ["zzz"]), "inputs.job.schedules[0]: 'zzz' is not one of gpipe"),
    (("optimizer_state", "bytes_per_param", {"weights": -2}),
     "inputs.job.optimizer_state.bytes_per_param.weights: must be >= 0, got -2"),
])
def test_hand_edited_job_settings_are_checked(tmp_path, plan_doc, edit, needle):
    """validate and export took a bucket of -1 parameters (into Megatron's
    --ddp-bucket-size), the string "no" as true, a negative headroom, an
    unknown schedule, negative bytes of state."""
    part, key, value = edit
    doc = copy.deepcopy(plan_doc)
    job = doc["inputs"]["job"]
    (job.setdefault(part, {}) if part else job)[key] = value
    path = write(tmp_path / "job.json", json.dumps(doc))
    for command in (["validate"], ["export", "--format", "megatron"]):
        assert_refused(tmp_path, [command[0], path, *command[1:]], needle)


@pytest.mark.parametrize("name", ["config.json", "model.toml"])
def test_a_transformer_config_not_in_utf8_names_its_file_once(tmp_path, name):
    """The reader's refusal was wrapped again: "f: cannot read JSON: f: not a ..."."""
    (tmp_path / name).write_bytes(b'{"model_type": "llama", "x": "\xe9"}' if name.endswith("json") else b'name = "\xe9"\n')
    line = assert_refused(tmp_path, ["plan", "--model", name], f"{name}: not a transformer config (not UTF-8 text")
    assert line.count(name) == 1


@pytest.mark.parametrize("replication", [["--replicate-stages"], ["--split", "5x2,3x2"]])
def test_a_placement_pin_with_per_stage_replication_is_refused(tmp_path, replication):
    """--replicate-stages with --placement data ranked the replicated plans
    (laid out by their replicas) beside the data-major ones: the pin was
    ignored for them, and --placement pipeline gave the same ranking."""
    model = tiny_csv(tmp_path / "tiny.csv")
    assert_refused(tmp_path, ["plan", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "8", *replication,
                              "--placement", "data"],
                   f"{replication[-1]} with --placement data", "no pipeline- or data-major layout applies")


def test_export_of_inconsistent_plan_names_the_file(tmp_path, plan_doc):
    path = edited(tmp_path, plan_doc, lambda p: p["stages"][1]["layer_names"].pop())
    assert_refused(tmp_path, ["export", path, "--format", "torch"], path, "stages[1].layer_names",
                   "3 names for the 4 layers")


@pytest.mark.parametrize("option", ["--model", "--cluster"])
@pytest.mark.parametrize("kind", ["directory", "/dev/null", "fifo"])
def test_existing_path_that_is_not_a_file(tmp_path, option, kind):
    if kind == "directory":
        (tmp_path / "d").mkdir()
        target, what = "d", "is a directory"
    elif kind == "fifo":
        fifo(tmp_path / "f")
        target, what = "f", "is a FIFO"
    else:
        if not os.path.exists("/dev/null"):
            pytest.skip("no /dev/null")
        target, what = "/dev/null", "is a character device"
    line = assert_refused(tmp_path, ["plan", option, target, "-o", "p.json"], f"{option} {target}", what,
                          subprocess_=kind == "fifo")
    assert "no such file" not in line


def test_schedule_refused_advice_does_not_say_raise_pp(tmp_path):
    line = assert_refused(tmp_path, ["plan", "--model", tiny_csv(tmp_path / "t.csv"), "--cluster", "1x4-v100-pcie",
                                     "-b", "8", "--pp", "4", "--schedule", "1f1b", "--num-micro-batches", "2",
                                     "-o", "p.json"], "schedule_refused", "lower --pp")
    assert "raise --pp" not in line


def test_mobius_out_of_memory_names_the_host_flag_not_what_the_search_tried(tmp_path):
    """Llama-3 8B at batch 64 on eight 24 GB GPUs under Mobius: every point
    runs out of memory. The search tried every pp and micro-batch size
    (nothing pinned), and Mobius keeps the optimizer on the host already,
    so the fix left is the activations on the host (with it the plan
    fits): the hint says that, not 'lower --micro-batch-size, raise --pp'."""
    line = assert_refused(tmp_path, ["plan", "--model", "llama3-8b", "--cluster", "1x8-rtx4090-pcie4", "-b", "64",
                                     "--schedule", "mobius", "-o", "p.json"], "out_of_memory",
                          "add --activation-offload or use a larger cluster")
    assert "raise --pp" not in line and "--micro-batch-size" not in line and "--optimizer-offload" not in line


def test_out_of_memory_split_names_the_stage(tmp_path):
    # vgg16's 38 middle layers at micro-batch 4096 cannot fit a 16 GiB V100 (5% headroom and 1 GiB reserved:
    # 16 x 0.95 - 1 = 14.2 GiB usable)
    line = assert_refused(tmp_path, ["plan", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "4096",
                                     "--split", "1,38,1", "--micro-batch-size", "4096", "-o", "p.json"],
                          "out_of_memory", "--split stage 1 (layers 1..38)", "against 14.2 GiB usable")
    assert "move layers off stage 1" in line


def test_validate_lists_every_problem(tmp_path, plan_doc):
    def edit(p):
        p["stages"][1]["layers"] = [4, 7]
        p["stages"][0]["devices"] = [998, 999]
    path = edited(tmp_path, plan_doc, edit)
    before = snapshot(tmp_path)
    code, out, err = run(["validate", path], tmp_path)
    # [4, 7] leaves layer 7 out and leaves stage 1 with 4 names for 3 layers
    assert code == 2 and len(err.strip().splitlines()) == 1 and "3 problem(s)" in err
    *problems, later = out.strip().splitlines()
    assert len(problems) == 3 and all(line.startswith(f"{path}: plans[0].stages[") for line in problems)
    assert later == f"{path}: the recorded copies and host terms and the replay of each plan's time are checked " \
                    "once these are fixed"
    assert "stages[1].layers: [4, 7]" in problems[0]
    assert "stages[1].layer_names: 4 names for the 3 layers" in problems[1]
    assert "stages[0].devices: [998, 999]" in problems[2]
    assert snapshot(tmp_path) == before
    # a value the schema refuses (a negative time): the rules beyond it wait too, and the line says so
    path = edited(tmp_path, plan_doc, lambda p: p["stages"][0].update(compute_s=-1.0), "neg.json")
    code, out, err = run(["validate", path], tmp_path)
    *problems, later = out.strip().splitlines()
    assert code == 2 and len(problems) == 1 and "compute_s" in problems[0]
    assert later.startswith(f"{path}: the rules beyond the schema (layers, devices, degrees, batch, memory, rates)")


# ------------------------------------------------------------- further malformed inputs


def _device(key, value):
    return "\n".join((f"{key} = {value}" if line.startswith(f"{key} =") else line)
                     for line in GOOD_DEVICE.splitlines()) + "\n"


def _transformer(key, value):
    text = (REPO / "cost_models" / "gpt3-1.3b.toml").read_text()
    return "\n".join((f"{key} = {value}" if line.startswith(f"{key} =") else line) for line in text.splitlines()) + "\n"


CLUSTER = f'name = "c"\nnodes = 1\ndevices_per_node = 4\ndevice = "./dev.toml"\n{LINKS}'
ON_C = ["plan", "--model", "t.csv", "--cluster", "c.toml", "-b", "8", "-o", "p.json"]
ON_GPT = ["plan", "--model", "m.toml", "--cluster", "1x8-a100-80gb", "-b", "8", "-o", "p.json"]


@pytest.mark.parametrize("files,args,needles", [
    ({"dev.toml": _device("memory_GiB", "nan")}, ON_C, ["dev.toml", "'memory_GiB'", "nan"]),
    ({"dev.toml": _device("memory_GiB", '"16"')}, ON_C, ["dev.toml", "'memory_GiB'", "'16'"]),
    ({"dev.toml": _device("peak_fp16_TFLOPS", "-5")}, ON_C, ["dev.toml", "'peak_fp16_TFLOPS'", "-5"]),
    # no upper bound before: 1e308 TFLOP/s was accepted
    ({"dev.toml": GOOD_DEVICE + "peak_fp8_TFLOPS = 1e308\n"}, ON_C, ["dev.toml", "'peak_fp8_TFLOPS'", "1e+308",
                                                                      "[1e-09, 1e+06] TFLOP/s"]),
    # the message said "a positive number <= inf"
    ({"dev.toml": _device("achieved_fraction", "nan")}, ON_C, ["dev.toml", "'achieved_fraction'", "nan",
                                                               "a number in [0.01, 1]"]),
    ({"dev.toml": GOOD_DEVICE + "memroy_GiB = 3\n"}, ON_C, ["dev.toml", "unknown key 'memroy_GiB'", "memory_GiB"]),
    ({"dev.toml": ""}, ON_C, ["dev.toml", "missing key 'name'"]),
    ({"dev.toml": b"\x00\xff\xfe"}, ON_C, ["dev.toml", "not UTF-8"]),
    ({"c.toml": CLUSTER.replace("nodes = 1", "nodes = 1.5")}, ON_C, ["c.toml", "'nodes'", "1.5"]),
    ({"c.toml": CLUSTER.replace("bandwidth_GBps = 10", "bandwidth_GBps = nan")}, ON_C,
     ["c.toml", "'intra_node.bandwidth_GBps'", "nan"]),
    ({"c.toml": CLUSTER.replace("latency_us = 10", "latency_us = -1")}, ON_C, ["c.toml", "'intra_node.latency_us'", "-1"]),
    ({"c.toml": CLUSTER.replace('device = "./dev.toml"', "device = 3")}, ON_C, ["c.toml", "'device'", "3"]),
    ({"c.toml": "name = \n"}, ON_C, ["c.toml", "TOML syntax error", "line 1"]),
    ({"t.csv": CSV_HEADER + "l0,1,nan,1,1\n"}, ON_C, ["t.csv", "line 4", "'bwd_ms'", "'nan'"]),
    # 1 ms over 2**31 - 1 samples is 4.7e-13 s a sample: planned at micro-batch 1 the layer would take no time
    ({"t.csv": "# batch_size: 2147483647\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\nl0,1,2,3000000,400000\n"},
     ON_C, ["t.csv", "line 3", "'fwd_ms'", "per sample", "batch_size"]),
    # 1 ms over 1e9 samples: 1e-12 s a sample, under 0.1 ns
    ({"t.csv": "# batch_size: 1e9\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\nl0,1,2,3000000,400000\n"},
     ON_C, ["t.csv", "line 3", "'fwd_ms'", "per sample"]),
    ({"t.csv": CSV_HEADER + "l0,1,1,-5,1\n"}, ON_C, ["t.csv", "line 4", "'param_bytes'", "'-5'"]),
    ({"t.csv": CSV_HEADER + "l0,1\n"}, ON_C, ["t.csv", "line 4", "2 fields, expected 5"]),
    ({"t.csv": CSV_HEADER.replace("batch_size: 8", "batch_size: 1e30") + "l0,1,1,1,1\n"}, ON_C,
     ["t.csv", "line 2", "batch_size '1e30'"]),
    ({"t.csv": CSV_HEADER + "l0,1,1,1,1\nl0,1,1,1,1\n"}, ON_C, ["t.csv", "line 5", "duplicate layer name 'l0'"]),
    ({"t.csv": b"\x00\x01\xff"}, ON_C, ["t.csv", "not UTF-8"]),
    ({"m.toml": _transformer("hidden_size", "nan")}, ON_GPT, ["m.toml", "'transformer.hidden_size'", "nan"]),
    ({"m.toml": _transformer("seq_len", "99999999999")}, ON_GPT, ["m.toml", "'transformer.seq_len'", "99999999999"]),
    ({"m.toml": _transformer("vocab_size", '"big"')}, ON_GPT, ["m.toml", "'transformer.vocab_size'", "'big'"]),
    ({"m.toml": _transformer("tied_embeddings", "3")}, ON_GPT, ["m.toml", "'transformer.tied_embeddings'", "3"]),
    ({"m.toml": "x = 1\n"}, ON_GPT, ["m.toml", "no [transformer] table"]),
    ({"m.toml": "[[groups]]\ndevice = 'a100-80gb'\nnodes = 1\ndevices_per_node = 8\n"}, ON_GPT,
     ["m.toml", "no [transformer] table", "a cluster file", "--cluster"]),
    ({"m.toml": "name = 'x'\nmemory_GiB = 80\npeak_fp16_TFLOPS = 300\n"}, ON_GPT,
     ["m.toml", "no [transformer] table", "a device file"]),
    ({"config.json": "[1, 2]"}, ["plan", "--model", "config.json", "-o", "p.json"], ["config.json", "a JSON object"]),
    ({"p.json": "[]"}, ["simulate", "p.json"], ["p.json", "the top level is an array", "pipesearch.plan/1"]),
    ({"p.json": "NaN"}, ["export", "p.json", "--format", "torch"], ["p.json", "the top level is a number",
                                                                      "pipesearch.plan/1"]),
    ({"p.json": '{"schema": "x/2"}'}, ["validate", "p.json"], ["p.json", "schema is 'x/2'", "pipesearch.plan/1"]),
    ({"p.json": ""}, ["plot", "p.json"], ["p.json", "not JSON"]),
    ({"p.json": b"\x00\xff"}, ["validate", "p.json"], ["p.json", "not UTF-8"]),
], ids=lambda v: None)
def test_malformed_input_file(tmp_path, files, args, needles):
    files = {"dev.toml": GOOD_DEVICE, "c.toml": CLUSTER, "t.csv": CSV_HEADER + "l0,1,2,1000,4096\nl1,1,2,1000,4096\n",
             **files}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    assert_refused(tmp_path, args, *needles)


def test_device_file_that_is_a_directory(tmp_path):
    (tmp_path / "dev.toml").mkdir()
    write(tmp_path / "c.toml", CLUSTER)
    line = assert_refused(tmp_path, ["plan", "--cluster", "c.toml", "-o", "p.json"], "c.toml", "'device'",
                          "'./dev.toml'", "is a directory")
    assert "no such file" not in line


@pytest.mark.parametrize("args,option", [
    (["plan", "--memory-headroom", "nan", "-o", "p.json"], "--memory-headroom"),
    (["plan", "--optimizer-bytes-per-param", "inf", "-o", "p.json"], "--optimizer-bytes-per-param"),
    (["serve", "--request-rate", "nan"], "--request-rate"),
    (["serve", "--step-overhead-ms", "inf"], "--step-overhead-ms"),
    (["serve", "--max-tpot-ms", "nan"], "--max-tpot-ms"),
])
def test_nan_or_inf_option_is_refused(tmp_path, args, option):
    """click's FloatRange lets nan through (every comparison is false):
    ``--memory-headroom nan`` searched and ended in "no plan fits"."""
    value = args[args.index(option) + 1]
    assert_refused(tmp_path, args, option, f"'{value}' is not a finite number")


@pytest.mark.parametrize("args,needles", [
    (["serve", "--model", "llama3-8b", "-o", ""], ["-o", "empty file name"]),
    (["serve", "--model", "llama3-8b", "--timeline", ""], ["--timeline", "empty file name"]),
    (["serve", "--model", "llama3-8b", "--seed", "-1"], ["--seed", "-1"]),
    # 10**12 simulated requests would run for days
    (["serve", "--model", "llama3-8b", "--num-requests", "999999999999"], ["--num-requests", "999999999999",
                                                                          "1<=x<=100000"]),
    (["profile", "m.py:f", "-b", "2", "--input-shape", "4", "-o", ""], ["profile CSV (-o)", "empty file name"]),
    # one output token has no decode step: the limit filtered on a TPOT that does not exist
    (["serve", "--model", "qwen3-1.7b", "--output-len", "1", "--max-tpot-ms", "0.001", "-o", "serve.json"],
     ["--max-tpot-ms 0.001", "--output-len 1", "no decode step"]),
])
def test_serve_and_profile_options(tmp_path, args, needles):
    """``serve -o ''`` wrote ./serve.json and ``--timeline ''`` was dropped;
    a negative seed and ``profile -o ''`` ended in tracebacks."""
    write(tmp_path / "m.py", "def f():\n    raise AssertionError('not built')\n")
    assert_refused(tmp_path, args, *needles)
    assert not (tmp_path / "serve.json").exists()


# ------------------------------------------------------------- the search evaluates every schedule asked for


def test_every_requested_schedule_is_evaluated(tmp_path):
    """8 layers, 4 devices, batch 8, gpipe + 1f1b + zb-h1, --exhaustive: each
    schedule has one point per (pp > 1, dp, micro-batch size) of the grid,
    evaluated (``ok``) unless its rule refuses it (1F1B and ZB-H1 need at
    least pp micro-batches). The grid is written out here, not taken from
    the search."""
    code, out, err = run(["plan", "--model", tiny_csv(tmp_path / "t.csv"), "--cluster", "1x4-v100-pcie", "-b", "8",
                          "--schedule", "gpipe", "--schedule", "1f1b", "--schedule", "zb-h1", "--exhaustive", "-q",
                          "-o", "p.json"], tmp_path)
    assert code == 0, err
    points = json.loads((tmp_path / "p.json").read_text())["search"]["points"]
    rows = [dict(zip(points["columns"], r)) for r in zip(*points["values"])]
    expected = set()
    for schedule in ("gpipe", "1f1b", "zb-h1"):
        for pp in (2, 3, 4):
            for dp in (d for d in (1, 2, 4) if pp * d <= 4):
                for mbs in (s for s in (1, 2, 4, 8) if (8 // dp) % s == 0):
                    m = 8 // dp // mbs
                    ok = schedule == "gpipe" or m >= pp
                    expected.add((schedule, pp, dp, mbs, m, "ok" if ok else "schedule_refused"))
    got = {(r["schedule"], r["pp"], r["dp"], r["micro_batch_size"], r["num_micro_batches"], r["status"])
           for r in rows if r["pp"] > 1 and r["status"] != "same_as_other_placement"}
    assert got == expected
    assert all(r["iteration_time_s"] > 0 for r in rows if r["status"] == "ok")


def test_a_micro_batch_no_replica_count_divides_is_refused_not_a_crash(tmp_path):
    """vgg16's batch 1024 at micro-batch size 1024 leaves dp 1 only (every
    other dp does not divide the batch): those points are counted, never
    bounded (bounding them raised a TypeError); the dp 1 point runs out of
    memory, and with --pp pinned the hint names the pin where it suggests
    changing it (the search itself never tried another pp)."""
    out = assert_refused(tmp_path, ["plan", "--pp", "2", "--micro-batch-size", "1024", "--schedule", "gpipe",
                                    "-o", "p.json"], "no plan fits vgg16", "batch_not_divisible")
    assert "lower --micro-batch-size, raise --pp (pinned to 2) or use a larger cluster" in out
    assert "raise --pp," not in out and "raise --pp or" not in out  # never the unpinned hint
    # the micro-batch count pinned instead: the size follows from it, so the fix is more micro-batches
    out = assert_refused(tmp_path, ["plan", "--pp", "2", "--dp", "2", "--num-micro-batches", "1", "--schedule",
                                    "gpipe"], "no plan fits vgg16")
    assert "raise --num-micro-batches (pinned to 1; smaller micro-batches)" in out
    assert "lower --micro-batch-size" not in out


@pytest.mark.parametrize("args,needles", [
    (["--pp", "4", "--vp", "1", "--schedule", "interleaved-1f1b"], ("--vp 1", "at least 2 virtual stages")),
    (["--split", "10x4,10x4,10x4,10x4", "--schedule", "interleaved-1f1b", "--pp", "2", "--vp", "2"],
     ("--split 10x4,10x4,10x4,10x4", "one stage per device")),
])
def test_interleaving_pins_that_cannot_hold_name_the_rule(tmp_path, args, needles):
    """An interleaved schedule with one virtual stage per device, or with
    per-stage replicas, was refused only as "no points; lower
    --micro-batch-size, raise --pp"; now the rule is named up front."""
    assert_refused(tmp_path, ["plan", *args, "-o", "p.json"], *needles)


def test_a_profile_without_any_time_names_its_file(tmp_path):
    """Every layer 0 ms forward and backward: refused naming the profile's
    file, before any search (the CSV reader itself reads such a file back:
    the format can hold it)."""
    tiny_csv(tmp_path / "zero.csv", rows=["l0,0,0,1000000,1000000", "l1,0,0,1000000,1000000"])
    assert_refused(tmp_path, ["plan", "--model", "zero.csv", "-b", "8", "-o", "p.json"],
                   "zero.csv: every layer has zero forward and backward time")


def test_export_to_a_file_kind_the_runtime_lacks_offers_only_what_exists(tmp_path, plan_doc):
    """A gpipe export is one JSON object with no files of its own: -o x.sh
    is refused pointing at .json, not at --files (which gpipe refuses)."""
    path = edited(tmp_path, plan_doc, lambda p: None, "plan.json")
    line = assert_refused(tmp_path, ["export", path, "--format", "gpipe", "-o", "gp.sh"],
                          "a gpipe export has no .sh file", "use one of .json (the export itself)")
    assert "--files" not in line


def test_serve_split_that_cannot_fit_the_devices_is_named_as_given(tmp_path):
    """--split of 9 stages pins pp 9, more than 8 L4s hold (a pp that does
    not divide them runs with devices idle; one that does not fit cannot).
    The refusal names the --split the user typed, never a --pp they did
    not."""
    split = "4,4,4,4,4,3,3,3,3"
    base = ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--split", split, "-o", "s.json"]
    line = assert_refused(tmp_path, base, f"--split {split} (9 stages)", "8 devices of 1x8-l4")
    assert "--pp" not in line
    base = ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--split", "8,8,8,4,4", "-o", "s.json"]
    line = assert_refused(tmp_path, base + ["--tp", "2"], "--tp 2 x --split 8,8,8,4,4 (5 stages) = 10 devices",
                          "more than the 8 devices")
    assert "--pp" not in line


def test_an_output_that_would_overwrite_an_input_or_another_output_is_refused(tmp_path):
    """-o naming the --model profile would replace the profile by the plan;
    --all-points naming the -o file would replace one output by the other:
    both refused before anything is written, the profile intact."""
    model = tiny_csv(tmp_path / "m.csv")
    text = (tmp_path / "m.csv").read_text()
    assert_refused(tmp_path, ["plan", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "8", "-o", model],
                   f"-o {model}: the same file as --model")
    assert (tmp_path / "m.csv").read_text() == text
    assert_refused(tmp_path, ["plan", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "8", "-o", "p.json",
                              "--all-points", "p.json"], "--all-points p.json: the same file as -o p.json")


def test_a_figure_directory_that_cannot_be_made_is_refused_before_the_plan_file(tmp_path):
    """The parent is a writable directory but the directory cannot be made
    there (here: a name over the file system's limit; /proc/x did the same):
    plan wrote -o, then failed on the figures with exit 2; now it is refused
    before the search, naming the option."""
    name = "f" * 300
    assert_refused(tmp_path, ["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie", "-o", "p.json",
                              "--plot-dir", name], f"--plot-dir {'f' * 80}... (300 characters): cannot create it")


@pytest.mark.parametrize("flag", ["-o", "--all-points"])
def test_an_output_name_too_long_for_the_file_system_is_refused(tmp_path, flag):
    """Path.exists raised on it: an internal error (exit 1) instead of a refusal."""
    assert_refused(tmp_path, ["plan", "--model", "gnmt", "--cluster", "1x4-v100-pcie", flag, "g" * 300],
                   f"{flag}{')' if flag == '-o' else ''} {'g' * 80}... (300 characters): cannot be written")


@pytest.mark.parametrize("command,flag", [("plan", "--model"), ("plan", "--cluster"), ("serve", "--model")])
def test_an_input_name_too_long_for_the_file_system_is_refused(tmp_path, command, flag):
    """Neither a file nor a catalog name; the file check raised (exit 1)."""
    assert_refused(tmp_path, [command, flag, "g" * 300], f"{flag} {'g' * 80}... (300 characters): cannot be read")


def test_a_refused_plan_leaves_no_figure_directory(tmp_path):
    """--plot-dir is made when the figures are written, so a refused
    command (an unknown model) leaves no empty directory behind."""
    assert_refused(tmp_path, ["plan", "--model", "nosuch", "--plot-dir", "figs"], "unknown model 'nosuch'")
    assert not (tmp_path / "figs").exists()


@pytest.mark.parametrize("field,value,needle", [
    ("devices_per_node", 16, "groups[0].last_device: 3 found, 15 expected (1 nodes x 16 devices from id 0)"),
    ("devices_per_node", True, "groups[0].devices_per_node: expected an integer, got true"),
    # a group's fields are typed by the schema: a device type of another kind was an exporter's internal error
    ("device", {"a": 1}, 'groups[0].device: expected a string, got {"a": 1}'),
    ("memory_bytes", -1, "groups[0].memory_bytes: must be > 0, got -1"),
    ("first_device", 1, "groups[0].first_device: 1 found, 0 expected"),
])
def test_validate_refuses_an_edited_cluster_layout(tmp_path, plan_doc, field, value, needle):
    """The cluster's groups lay the 4 devices out node by node (1 node x 4
    devices, ids 0 .. 3); an edit that breaks the layout is named (the gpipe
    export reads nodes from it), not passed as valid."""
    doc = copy.deepcopy(plan_doc)
    doc["inputs"]["cluster"]["groups"][0][field] = value
    path = write(tmp_path / "g.json", json.dumps(doc))
    code, out, err = run(["validate", path], tmp_path)
    assert code == 2 and needle in out, out


def test_megatron_refuses_a_layer_profile_before_searching(tmp_path):
    """``--runtime megatron`` with a CNN profile (vgg16's layers are not
    embedding, block_00 .. head) is refused up front, naming the layers and
    the runtimes that take any layer table (it used to search the whole
    space first and then refuse every plan)."""
    assert_refused(tmp_path, ["plan", "--model", "vgg16", "--runtime", "megatron", "-o", "p.json"],
                   "--runtime megatron", "b00_Input", "not a transformer layer table", "torch or deepspeed")


def test_memory_reserve_of_zero_needs_no_unit(tmp_path):
    """0 is no memory in every unit, so ``--memory-reserve 0`` is taken
    (a bare non-zero number is refused, above); the plan's usable memory
    is then the capacity less the headroom alone."""
    res = CliRunner().invoke(main, ["plan", "-q", "--json", "--memory-reserve", "0", "--memory-headroom", "0.05"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["inputs"]["job"]["memory_reserve_bytes"] == 0


def test_two_devices_of_one_name_are_refused(tmp_path):
    """A device name is a device type (plans, tables and exports name devices
    by it): two groups whose devices share a name but not their memory
    would be told apart nowhere (the search took one for the other and its
    answer changed with the order of the groups), so the cluster file is
    refused, naming both groups and the name."""
    dev = 'name = "twin"\nmemory_GB = {}\npeak_fp16_TFLOPS = 80\npeak_fp32_TFLOPS = 20\nhbm_bandwidth_GBps = 900\n'
    (tmp_path / "a.toml").write_text(dev.format(48))
    (tmp_path / "b.toml").write_text(dev.format(70))
    (tmp_path / "c.toml").write_text('name = "c"\n[[groups]]\nnodes = 1\ndevices_per_node = 1\ndevice = "a.toml"\n'
                                     '[[groups]]\nnodes = 1\ndevices_per_node = 1\ndevice = "b.toml"\n'
                                     "[intra_node]\nbandwidth_GBps = 10\nlatency_us = 10\n"
                                     "[inter_node]\nbandwidth_GBps = 10\nlatency_us = 10\n")
    assert_refused(tmp_path, ["plan", "--cluster", "c.toml", "-o", "p.json"],
                   "c.toml", "groups[0] and groups[1]", "'twin'", "its own name")


@pytest.mark.parametrize("layout", ["values", "data"])
def test_points_table_column_named_twice(tmp_path, plan_doc, layout):
    """A column named twice (with its values) is refused by validate and plot
    alike; plot used to fail inside pandas (internal error, exit 1)."""
    doc = copy.deepcopy(plan_doc)
    points = doc["search"]["points"]
    k = points["columns"].index("pp")
    points["columns"].append("pp")
    points["values"].append(list(points["values"][k]))
    if layout == "data":
        points["data"] = [list(r) for r in zip(*points.pop("values"))]
    path = write(tmp_path / "points.json", json.dumps(doc))
    assert_refused(tmp_path, ["plot", path, "--kind", "space", "-o", "space.png"], path, "search.points.columns",
                   "'pp' more than once")
    assert_refused(tmp_path, ["validate", path], path, "search.points.columns", "'pp' more than once")


def test_no_plan_hints_name_what_can_change(tmp_path):
    """The fix a refusal names is one that exists: a tp wider than every node
    says so (it said 'lower --micro-batch-size, raise --pp'); a batch that
    needs more micro-batches than allowed names the micro-batch size and
    dp; a pinned pipeline that already fills the devices is not told to
    grow; a cluster with host memory offers the offload flags."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    def refused(*args):
        res = CliRunner().invoke(main, ["plan", "-q", *args])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        return res.output

    out = refused("--model", "gpt3-1.3b", "--cluster", "4x4-v100-10gbe", "-b", "64", "--tp", "8")
    assert "--tp 8: a tensor-parallel group stays inside one node" in out and "at most 4 devices" in out
    csv = tmp_path / "small.csv"
    csv.write_text("# batch_size: 1\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
                   + "".join(f"l{k},1,2,1000000,100000\n" for k in range(4)))
    out = refused("--model", str(csv), "--cluster", "1x4-v100-pcie", "--pp", "2", "--dp", "1", "--schedule", "1f1b",
                  "-b", "65536", "--micro-batch-size", "2")
    assert "more than 16,384 micro-batches per replica; raise --micro-batch-size or --dp" in out
    # a prime global batch: micro-batches of 1 are too many, of the whole batch out of memory (the hint said
    # "lower --micro-batch-size", which only adds micro-batches)
    out = refused("--model", "gnmt", "--cluster", "1x4-v100-pcie", "-b", str(2**31 - 1))
    assert "choose a global batch with more divisors" in out and "lower --micro-batch-size" not in out
    out = refused("--model", "llama3-8b", "--cluster", "1x8-rtx3090-pcie3", "-b", "32", "--seq-len", "2048", "--pp",
                  "8", "--tp", "1", "--schedule", "1f1b", "--recompute", "none")
    assert "raise --pp" not in out and "--optimizer-offload" in out
    # activations on the host and streamed weights exclude each other: the hint offers neither beside the other
    out = refused("--model", "gpt3-13b", "--cluster", "1x8-rtx4090-pcie4", "-b", "16", "--pp", "2", "--dp", "1",
                  "--tp", "1", "--schedule", "1f1b", "--optimizer-offload", "--activation-offload")
    assert "--stream-weights" not in out


def test_profile_refuses_a_device_name_plans_cannot_use_and_a_file_plan_cannot_read(tmp_path):
    """--device-name names the device the profile's times are rescaled from:
    an unknown one is refused with the catalog's names (it was written into
    the CSV and plans later warned it was unknown); -o with another suffix
    than .csv writes a file `plan --model` does not read."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    base = ["profile", "tests/e2e_model.py:make_model", "--input-shape", "1024", "--batch-size", "2"]
    res = CliRunner().invoke(main, base + ["--device-name", "bogus", "-o", str(tmp_path / "p.csv")])
    assert res.exit_code == 2 and "--device-name bogus: unknown device 'bogus'" in res.output
    res = CliRunner().invoke(main, base + ["-o", str(tmp_path / "p.txt")])
    assert res.exit_code == 2 and "name it p.csv" in res.output
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.txt").exists()


@pytest.mark.parametrize("edit,field,needle", [
    (lambda d: d["inputs"]["model"]["transformer"].update(num_attention_heads=6), "inputs.model.transformer",
     "not divisible by 'num_kv_heads'"),
    (lambda d: d["inputs"]["model"]["transformer"].update(num_layers=40), "inputs.model.transformer.num_layers",
     "runs 28 blocks"),
    (lambda d: d["inputs"]["model"]["transformer"].update(foo=1), "inputs.model.transformer.foo",
     "not a transformer config key"),
    # was TransformerConfig.__init__()'s own words: "missing 1 required positional argument"
    (lambda d: d["inputs"]["model"]["transformer"].pop("hidden_size"), "inputs.model.transformer.hidden_size",
     "missing (a transformer config key with no default)"),
    (lambda d: d["inputs"]["cluster"]["links"]["intra_node"].update(bandwidth_bytes_per_s=0),
     "inputs.cluster.links.intra_node.bandwidth_bytes_per_s", "must be > 0, got 0"),
    (lambda d: d["plans"][0]["options"].update(placement="bogus"), "plans[0].options.placement", "'bogus'"),
    (lambda d: d["plans"][0]["options"].update(sequence_parallel="yes"), "plans[0].options.sequence_parallel",
     "true or false"),
    (lambda d: d["inputs"]["cluster"].update(nodes=0), "inputs.cluster.nodes", ">= 1"),
    (lambda d: d["inputs"]["cluster"]["links"]["intra_node"].update(bandwidth_bytes_per_s=0),
     "inputs.cluster.links.intra_node.bandwidth_bytes_per_s", "0"),
    (lambda d: d["inputs"]["job"]["optimizer_state"].update(name="sgd"), "inputs.job.optimizer_state.name", "'sgd'"),
    (lambda d: d["inputs"]["job"]["optimizer_state"].update(sharding="zero9"), "inputs.job.optimizer_state.sharding",
     "'zero9'"),
])
def test_plan_file_with_an_impossible_model_or_option_is_refused(tmp_path, edit, field, needle):
    """A plan file's transformer config obeys the config files' own rules
    (TransformerConfig) and its blocks are the plan's; the placement and
    sequence-parallel options are what the search writes. Each edit used
    to validate, and the Megatron export then wrote arguments Megatron-LM
    refuses (--num-attention-heads 6 with --num-query-groups 8)."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    plans = tmp_path / "q.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "qwen3-1.7b", "--cluster", "1x8-a100-80gb", "-b", "16",
                                    "--tp", "2", "--pp", "2", "--dp", "2", "--schedule", "1f1b", "-o", str(plans)])
    assert res.exit_code == 0, res.output
    doc = json.loads(plans.read_text())
    edit(doc)
    path = str(write(tmp_path / "edited.json", json.dumps(doc)))
    for args in (["validate", path], ["export", path, "--format", "megatron"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and field in res.output and needle in res.output, res.output


def test_out_of_memory_refusal_quotes_what_the_offloaded_stage_needs():
    """With --optimizer-offload the 'closest' stage's need is that of its
    offloaded option (weights and gradients on the GPU): below the
    on-device figure by the optimizer state, 12 B per parameter of mixed
    Adam. Qwen3-32B's stage 0 here (embedding + 20 blocks over tp 2):
    (151,936 x 5120 + 20 x 487.6M) / 2 = 5.26e9 parameters per GPU by hand,
    58.8 GiB of state. It quoted the on-device figure, and the
    weights-and-optimizer total the offload had already removed."""
    import re

    from click.testing import CliRunner

    from pipesearch.cli import main

    args = ["plan", "-q", "--model", "qwen3-32b", "--cluster", "1x8-rtx4090-pcie4", "-b", "32", "--seq-len", "2048",
            "--pp", "4", "--tp", "2", "--schedule", "1f1b", "--micro-batch-size", "4", "--split", "21,15,15,15",
            "--recompute", "selective"]
    needs = []
    for extra in ([], ["--optimizer-offload"]):
        res = CliRunner().invoke(main, args + extra)
        assert res.exit_code == 2, res.output
        needs.append(float(re.search(r"closest: --split stage 0 \(layers 0\.\.20\) needs ([\d.]+) GiB", res.output)[1]))
    assert "optimizer state alone" not in res.output  # the offloaded state is not quoted as the device's
    block = 5120 * 64 * 128 * 2 + 2 * 5120 * 8 * 128 + 3 * 5120 * 25600  # q, o; k, v; gate, up, down
    params = (151936 * 5120 + 20 * block) / 2
    assert needs[0] - needs[1] == pytest.approx(12 * params / 2**30, rel=0.02)


def test_a_refusal_says_when_the_tied_copy_takes_part_of_the_usable_memory(tmp_path):
    """Qwen3-1.7B ties its embedding and LM head: the last stage keeps a copy
    of the matrix, and the memory a --split stage is refused against is what
    is left after it; the refusal says so (4.7 GiB 'usable' read as a wrong
    figure beside the 6.6 GiB the footnote gives the device)."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    (tmp_path / "tiny.toml").write_text('name = "tiny-8gb"\nmemory_GiB = 8\npeak_fp16_TFLOPS = 100\n'
                                        'peak_fp32_TFLOPS = 10\nhbm_bandwidth_GBps = 500\n')
    cluster = tmp_path / "c.toml"
    cluster.write_text('name = "c"\n[[groups]]\nnodes = 1\ndevices_per_node = 4\ndevice = "h100-80gb"\n'
                       '[[groups]]\nnodes = 1\ndevices_per_node = 4\ndevice = "tiny.toml"\n'
                       '[intra_node]\nbandwidth_GBps = 100\nlatency_us = 5\n'
                       '[inter_node]\nbandwidth_GBps = 25\nlatency_us = 10\n')
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "qwen3-1.7b", "--cluster", str(cluster), "-b", "64",
                                    "--pp", "2", "--dp", "4", "--tp", "1", "--split", "2,28", "--schedule", "1f1b"])
    assert res.exit_code == 2, res.output
    assert "closest: --split stage 1" in res.output and "(after its tied embedding copy's" in res.output


def test_profile_records_a_device_file_by_its_full_path(tmp_path, monkeypatch):
    """--device-name naming a device file relative to the working directory is
    recorded by its absolute path, so a plan run from elsewhere still finds
    the device its times are rescaled from."""
    from pathlib import Path

    from click.testing import CliRunner

    from pipesearch.cli import main

    model = str(Path(__file__).parent / "e2e_model.py") + ":make_model"
    (tmp_path / "dev.toml").write_text('name = "dev"\nmemory_GiB = 16\npeak_fp16_TFLOPS = 100\npeak_fp32_TFLOPS = 10\n'
                                       'hbm_bandwidth_GBps = 500\n')
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["profile", model, "--input-shape", "1024", "--batch-size", "2", "--repeats", "1",
                                    "--warmup", "0", "--device-name", "dev.toml", "-o", "p.csv"])
    assert res.exit_code == 0, res.output
    assert f"# device: {tmp_path / 'dev.toml'}" in (tmp_path / "p.csv").read_text()


# ------------------------------------------------ numbers past float range, huge and odd inputs


@pytest.mark.parametrize("cell, column, needle", [
    ("1e999999999999", "fwd_ms", "more than 1e+09 ms"),  # past the decimal context: was decimal.Overflow, exit 1
    ("1" * 5000, "fwd_ms", "more than 1e+09 ms"),
    ("100e999999999999", "param_bytes", "more than"),
    ("1e-400", "fwd_ms", "less than 1e-06 ms"),  # a positive time that rounds to 0.0 was taken as 0
    ("1e-999999999999", "fwd_ms", "less than 1e-06 ms"),
])
def test_profile_numbers_beyond_floats_are_refused(tmp_path, cell, column, needle):
    row = {"fwd_ms": "1", "bwd_ms": "2", "param_bytes": "100", "output_bytes": "100"}
    row[column] = cell
    write(tmp_path / "m.csv", CSV_HEADER + "l0,1,2,100,100\nl1," + ",".join(row.values()) + "\n")
    line = assert_refused(tmp_path, ["plan", "--model", "m.csv", "--cluster", "1x4-v100-pcie"],
                          "m.csv", "line 5", column, needle)
    assert len(line) < 400, line  # the echoed value is cut short


def test_csv_field_past_the_csv_modules_limit_is_refused(tmp_path):
    """A quoted field over 131,072 characters (or a file padded with NUL
    bytes, which the csv module reads the same way) made csv.Error escape
    as an internal error."""
    write(tmp_path / "m.csv", CSV_HEADER + "l0,1,2,100,100\n\"" + "x" * 200_000 + "\",1,2,100,100\n")
    line = assert_refused(tmp_path, ["plan", "--model", "m.csv", "--cluster", "1x4-v100-pcie"],
                          "m.csv", "line 5", "cannot be read as CSV", "field larger than field limit")
    assert len(line) < 400, line


def test_long_values_are_cut_short_in_the_error_line(tmp_path):
    write(tmp_path / "m.csv", CSV_HEADER.replace("batch_size: 8", "batch_size: " + "9" * 100_000)
          + "l0,1,2,100,100\n")
    line = assert_refused(tmp_path, ["plan", "--model", "m.csv", "--cluster", "1x4-v100-pcie"],
                          "m.csv", "batch_size", "999...", "positive integer")
    assert len(line) < 400, line
    line = assert_refused(tmp_path, ["plan", "--memory-reserve", "9" * 5000 + "GiB"], "--memory-reserve", "characters")
    assert len(line) < 1000, line


def test_a_path_with_a_line_break_stays_on_one_line(tmp_path):
    tiny_csv(tmp_path / "a\nb.csv", rows=["l0,-1,2,100,4096"])
    assert_refused(tmp_path, ["plan", "--model", "a\nb.csv", "--cluster", "1x4-v100-pcie"],
                   "a\\nb.csv", "negative")


@pytest.mark.parametrize("target", ["loop", "missing"])
def test_a_link_to_no_file_is_named_as_such(tmp_path, target):
    if target == "loop":
        os.symlink("b.csv", tmp_path / "a.csv")
        os.symlink("a.csv", tmp_path / "b.csv")
    else:
        os.symlink("gone.csv", tmp_path / "a.csv")
    assert_refused(tmp_path, ["plan", "--model", "a.csv"], "--model a.csv", "symbolic link that leads to no file")


@pytest.mark.parametrize("memory", ["1e-9", "0.0005"])
def test_device_memory_below_a_mebibyte_is_a_unit_mistake(tmp_path, memory):
    write(tmp_path / "dev.toml", GOOD_DEVICE.replace("memory_GiB = 16", f"memory_GiB = {memory}"))
    write(tmp_path / "c.toml", f'name = "c"\nnodes = 1\ndevices_per_node = 4\ndevice = "./dev.toml"\n{LINKS}')
    assert_refused(tmp_path, ["plan", "--cluster", "c.toml"], "dev.toml", "memory_GiB", memory.lstrip("0") if
                   memory.startswith("0.") else "1e-09")


@pytest.mark.parametrize("name", ['""', '"  "', '"a\\nb"'])
def test_a_cluster_needs_a_name(tmp_path, name):
    write(tmp_path / "c.toml", f'name = {name}\nnodes = 1\ndevices_per_node = 4\ndevice = "v100-pcie-16gb"\n{LINKS}')
    assert_refused(tmp_path, ["plan", "--cluster", "c.toml"], "c.toml", "'name'", "non-empty one-line name")


def test_replicated_stages_refuse_a_pinned_vp(tmp_path):
    tiny_csv(tmp_path / "m.csv")
    assert_refused(tmp_path, ["plan", "--model", "m.csv", "--cluster", "1x4-v100-pcie", "--replicate-stages",
                              "--vp", "2"], "--replicate-stages with --vp 2", "drop --vp")


def test_mobius_past_the_hosts_memory_says_so_not_to_pin_or_offload_more(tmp_path):
    """Mobius keeps every parameter's 16-bit copy and ZeRO-Offload's fp32
    weights, gradients and moments (2 + 16 bytes) in host memory: Qwen3-32B,
    32.76e9 parameters, needs 32.76e9 x 18 / 2**30 = 549 GiB whatever the
    split, against the RTX 3090 box's 512 GB (476.8 GiB). The refusal said
    to pin a split or add --activation-offload (which only adds host
    bytes); it now says what the hosts lack."""
    for pins in ([], ["--pp", "4", "--vp", "2", "--tp", "2", "--micro-batch-size", "1", "--recompute", "full",
                      "--split", "8,8,8,8,8,9,9,8"]):
        line = assert_refused(tmp_path, ["plan", "--model", "qwen3-32b", "--cluster", "1x8-rtx3090-pcie3", "-b", "32",
                                         "--seq-len", "2048", "--schedule", "mobius", *pins],
                              "keeps the model's 16-bit weights and optimizer state in host memory, 549.",
                              "against 476.8 GiB", "[host] memory_GB")
        assert "add --activation-offload" not in line and "pin one with --split" not in line


def test_a_plan_file_with_a_key_given_twice_is_refused(tmp_path, plan_doc):
    """JSON keeps the last of two equal keys silently: a plan edited to
    ``"name": "1f1b", "name": "gpipe"`` (or two ``pp``) validated and
    exported as whichever came last. Every reader of plan files refuses it,
    naming the key."""
    text = json.dumps(plan_doc, indent=1)
    name = f'"name": "{plan_doc["plans"][0]["schedule"]["name"]}"'
    assert name in text
    path = write(tmp_path / "dup.json", text.replace(name, '"name": "1f1b", ' + name, 1))
    for command in (["validate"], ["simulate"], ["export", "--format", "torch"], ["plot"]):
        assert_refused(tmp_path, [command[0], path, *command[1:]], "dup.json", "key 'name' appears twice",
                       "keep one")


def test_a_profile_header_below_one_bit_per_parameter_is_refused(tmp_path):
    """``# bytes_per_param: 1e-300`` passed (0, 64] and the refusal blamed
    the cluster with a 290-digit size; now the header line is refused."""
    model = write(tmp_path / "bpp.csv", "# bytes_per_param: 1e-300\n" + CSV_HEADER + "l0,1,2,1000,4096\n")
    assert_refused(tmp_path, ["plan", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "8"], "bpp.csv",
                   "bytes_per_param", "1e-300", "[0.125, 64]")


def test_a_failed_output_leaves_none_of_the_commands_other_files(tmp_path):
    """``-o`` onto a dangling link (the write fails) with ``--all-points``,
    ``--plot-dir``, or serve's ``--timeline``: the command's other files were
    written before (points CSV, figures, timeline) and stayed. Every file
    of a command is written all or none, and a figure directory it made is
    removed again."""
    model = tiny_csv(tmp_path / "tiny.csv", rows=[f"l{k},{1 + k % 3},{2 + k % 2},{100000 * (1 + k % 2)},4096"
                                                  for k in range(8)])
    (tmp_path / "plan.json").symlink_to("/nonexistent/dir/plan.json")
    base = ["plan", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "8", "-q", "--top", "1"]
    assert_refused(tmp_path, [*base, "--all-points", "pts.csv", "-o", "plan.json"], "plan.json", "cannot write")
    assert_refused(tmp_path, [*base, "--all-points", "pts.csv", "-o", "plan.json", "--plot-dir", "figs"],
                   "plan.json", "cannot write")
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "timeline.png").symlink_to("/nonexistent/dir/x.png")
    assert_refused(tmp_path, [*base, "--all-points", "pts.csv", "-o", "ok.json", "--plot-dir", "figs"],
                   "figs/timeline.png", "cannot write")
    (tmp_path / "serve.json").symlink_to("/nonexistent/dir/serve.json")
    assert_refused(tmp_path, ["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "-q", "--top", "1",
                              "--simulate-top", "1", "--num-requests", "50", "--timeline", "t.png", "-o",
                              "serve.json"], "serve.json", "cannot write")


@pytest.mark.parametrize("args,needle", [
    (["plan", "--pp", "2", "--pp", "4"], "--pp given 2 times (2, 4)"),
    (["plan", "--micro-batch-size=1", "--micro-batch-size", "2"], "--micro-batch-size given 2 times (1, 2)"),
    (["plan", "-o", "a.json", "--output", "b.json"], "--output given 2 times (a.json, b.json)"),
    (["plan", "-qo", "a.json", "-ob.json"], "--output given 2 times (a.json, b.json)"),
    (["serve", "--model", "llama3-8b", "--cluster", "1x8-l4", "--tp", "2", "--tp", "4"], "--tp given 2 times (2, 4)"),
    (["export", "plans.json", "--format", "torch", "--rank", "2", "--rank", "3"], "--rank given 2 times (2, 3)"),
])
def test_a_single_valued_option_given_twice_is_refused(tmp_path, args, needle):
    """click keeps the last of two values silently (``--pp 2 --pp 4``
    planned pp 4; ``-o a.json -o b.json`` wrote only b.json): refused before
    anything runs, naming the option and both values."""
    assert_refused(tmp_path, args, needle, "give it once", f" {args[0]} -h`)")


def test_options_that_collect_or_repeat_the_same_value_still_run(tmp_path):
    """``--schedule`` collects its values, and a flag or value given twice
    alike pins nothing twice: these run."""
    for extra in (["--schedule", "gpipe", "--schedule", "1f1b"], ["-q", "-q"], ["--top", "1", "--top", "1"]):
        code, out, err = run(["plan", "--top", "1", "-q", *extra], tmp_path)
        assert code == 0, (extra, err)


@pytest.mark.parametrize("pin", [["--pp", "1"], ["--dp", "1"]])
def test_a_placement_with_one_stage_or_one_replica_is_refused(tmp_path, pin):
    """``--placement data`` orders each stage's replicas on the devices: with
    pp 1 or dp 1 every layout is the same, and the pin was silently
    ignored (the plan file still said ``placement: data``)."""
    assert_refused(tmp_path, ["plan", "--placement", "data", *pin], "--placement data", f"with {' '.join(pin)}",
                   "pp > 1 and dp > 1", "drop --placement")


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["search"].update(points_evaluted=d["search"].pop("points_evaluated")), "search: unknown key 'points_evaluted'"),
    (lambda d: d["search"].update(comment="x"), "search: unknown key 'comment'"),
    (lambda d: d["search"]["points"].update(rows=[]), "search.points: unknown key 'rows'"),
    (lambda d: d["inputs"].update(foo=0), "inputs: unknown key 'foo'"),
    (lambda d: d["inputs"].update(runtime="tensorflow"), "inputs.runtime"),
    (lambda d: d["plans"][0].update(exports={"torch": 5}), "plans[0].exports.torch"),
    (lambda d: d["plans"][0].update(exports={"foo": {}}), "plans[0].exports"),
])
def test_unknown_keys_of_a_plan_files_fixed_objects_are_refused(tmp_path, plan_doc, edit, needle):
    """The plan format has no unknown keys in its fixed objects
    (docs/formats.md): a misspelled ``search.points_evaluated``, an extra
    ``inputs`` key, an export that is not one of the runtimes' were valid."""
    doc = copy.deepcopy(plan_doc)
    edit(doc)
    path = write(tmp_path / "keys.json", json.dumps(doc))
    assert_refused(tmp_path, ["validate", path], needle)


def test_the_schemas_runtime_names_are_the_exporters():
    """inputs.runtime and the exports' keys name exactly the runtimes the
    exporters write (a format added there and not here would fail every
    plan file it is in)."""
    from pipesearch.export import FORMATS
    from pipesearch.runtimes import RUNTIMES
    from pipesearch.schema import plan_schema

    s = plan_schema()
    assert tuple(s["properties"]["inputs"]["properties"]["runtime"]["enum"]) == RUNTIMES == FORMATS
    assert tuple(s["$defs"]["plan"]["properties"]["exports"]["propertyNames"]["enum"]) == FORMATS


def test_a_profile_given_as_the_cluster_says_what_it_is(tmp_path):
    """``--cluster model.csv`` said 'TOML syntax error: Expected = after a
    key': the file is named as the kind it is."""
    model = tiny_csv(tmp_path / "m.csv")
    assert_refused(tmp_path, ["plan", "--model", "vgg16", "--cluster", model], "m.csv", "a layer profile (CSV)",
                   "not a TOML file")


def test_a_device_file_given_as_the_cluster_says_what_it_is(tmp_path):
    """``--cluster hardware/devices/a100-80gb.toml`` said "unknown key
    'memory_GiB' (allowed keys: ...)": the file is named as a device
    description, with the cluster line that uses it."""
    from helpers import REPO

    device = str(REPO / "hardware" / "devices" / "a100-80gb.toml")
    assert_refused(tmp_path, ["plan", "--model", "vgg16", "--cluster", device], "a100-80gb.toml",
                   "a device description", 'device = "a100-80gb"')


def test_a_null_value_in_a_huggingface_config_is_named_as_null(tmp_path):
    """``"intermediate_size": null`` was reported as a missing key."""
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": None, "vocab_size": 100, "max_position_embeddings": 128}
    path = write(tmp_path / "config.json", json.dumps(cfg))
    assert_refused(tmp_path, ["plan", "--model", path], "config.json", "key 'intermediate_size' = null")


def test_a_header_with_a_trailing_comma_says_so(tmp_path):
    """A header row ending in a comma was an 'unknown column ''' refusal."""
    model = write(tmp_path / "tc.csv", "# batch_size: 1\nname,fwd_ms,bwd_ms,param_bytes,output_bytes,\n"
                                       "l0,1,2,3000000,40000,\n")
    assert_refused(tmp_path, ["plan", "--model", model], "tc.csv", "line 2", "column 6 of the header row has no name",
                   "a trailing comma")


def test_an_option_given_twice_with_one_value_written_two_ways_runs(tmp_path):
    """``--top 1 --top 01`` and ``--max-ttft-ms 100 --max-ttft-ms 100.0``
    pin the same value: no contradiction, so they run."""
    code, _, err = run(["plan", "-q", "--top", "1", "--top", "01"], tmp_path)
    assert code == 0, err
    code, _, err = run(["serve", "--model", "llama3-8b", "--cluster", "1x8-a100-80gb", "-q", "--simulate-top", "0",
                        "--max-tpot-ms", "100", "--max-tpot-ms", "100.0"], tmp_path)
    assert code == 0, err


def test_validating_an_export_names_what_it_is(tmp_path):
    """`pipesearch validate` reads plan files; given what `pipesearch
    export` wrote (the stage description, torch's JSON, DeepSpeed's
    config) it said "schema is None, expected 'pipesearch.plan/1'". It
    names the export and the file it reads instead."""
    assert run(["plan", "-q", "--schedule", "1f1b", "-o", "p.json"], tmp_path)[0] == 0
    for fmt, name, kind in (("stages-json", "s.json", "a stage description ('pipesearch.stages/1')"),
                            ("torch", "t.json", "an export for torch.distributed.pipelining"),
                            ("deepspeed", "ds_config.json", "a DeepSpeed config")):
        assert run(["export", "p.json", "--format", fmt, "-o", name], tmp_path)[0] == 0
        assert_refused(tmp_path, ["validate", name], name, kind, "pipesearch plan -o")


SMALL_LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 8192}


@pytest.mark.parametrize("extra, key, value", [
    ({"rope_scaling": {"type": "linear", "factor": 0.5}}, "rope_scaling.factor", "0.5"),
    ({"rope_scaling": {"type": "linear"}}, "rope_scaling.factor", "None"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": "8192"}},
     "rope_scaling.original_max_position_embeddings", "'8192'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 0}},
     "rope_scaling.original_max_position_embeddings", "0"),
    ({"sliding_window": -1}, "sliding_window", "-1"),
    ({"sliding_window": "x"}, "sliding_window", "'x'"),
    # a bad context beside a rotary scaling: an internal error (text, lists), accepted (0, 1.5, true: the
    # scaled value), or refused under the value scaled (-1 reported as -2)
    *(({"max_position_embeddings": bad, "rope_scaling": {"type": "linear", "factor": 2.0}}, "max_position_embeddings",
       shown) for bad, shown in (("x", "'x'"), ([1], "[1]"), (0, "0"), (1.5, "1.5"), (True, "true"), (-1, "-1"))),
    ({"max_position_embeddings": {"a": 1}, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                            "original_max_position_embeddings": 8192}},
     "max_position_embeddings", "{'a': 1}"),
])
def test_rotary_scaling_and_window_keys_are_checked(tmp_path, extra, key, value):
    """A linear rope_scaling factor below 1 (or none) took the model's
    context away (a 60,100-token request was served with --max-model-len
    60100); a bad original_max_position_embeddings or sliding_window was
    passed over; a bad max_position_embeddings beside a scaling was
    multiplied or compared before it was checked. Each is refused naming
    the key and its value."""
    path = write(tmp_path / "config.json", json.dumps(SMALL_LLAMA | extra))
    for cmd in (["plan", "--model", path], ["serve", "--model", path, "--input-len", "60000", "--output-len", "100"]):
        assert_refused(tmp_path, cmd, "config.json", f"key '{key}' = {value}")


def test_serving_a_config_without_a_context_and_other_small_refusals(tmp_path):
    """A config with no max_position_embeddings was refused by serve with
    "pass --seq-len", an option serve has not: it serves (a request's tokens
    are the sequence). A blank
    transformer name gave a vLLM command for ''. A profile seed beyond 64
    bits was an internal error."""
    cfg = {k: v for k, v in SMALL_LLAMA.items() if k != "max_position_embeddings"}
    path = write(tmp_path / "config.json", json.dumps(cfg))
    code, out, err = run(["serve", "--model", path, "--cluster", "1x8-l4", "--simulate-top", "0", "-q"], tmp_path)
    assert code == 0, err
    # nothing checks the request's length against the model: said once
    assert err.count("warning: config.json gives no context length (max_position_embeddings)") == 1
    code, _, err = run(["serve", "--model", write(tmp_path / "own.json", json.dumps(SMALL_LLAMA)), "--cluster",
                        "1x8-l4", "--simulate-top", "0", "-q"], tmp_path)
    assert code == 0 and "context length" not in err
    toml = write(tmp_path / "blank.toml", '[transformer]\nname = " "\nnum_layers = 2\nhidden_size = 64\n'
                                         'num_attention_heads = 4\nffn_hidden_size = 128\nvocab_size = 100\n'
                                         'seq_len = 128\n')
    assert_refused(tmp_path, ["serve", "--model", toml], "blank.toml", "key 'transformer.name' = ' '",
                   "a non-blank one-line string")
    tab = write(tmp_path / "tab.toml", (tmp_path / "blank.toml").read_text().replace('" "', '"my\\tmodel"'))
    assert_refused(tmp_path, ["plan", "--model", tab], "tab.toml", "key 'transformer.name' = 'my\\tmodel'",
                   "without tabs or control characters")  # it was printed raw in the table's heading
    ref = write(tmp_path / "ref.json", json.dumps(SMALL_LLAMA | {"_name_or_path": "org/my\tllama"}))
    assert_refused(tmp_path, ["plan", "--model", ref], "ref.json", "key '_name_or_path' = 'my\\tllama'")
    code, _, err = run(["profile", "m.py:f", "--input-shape", "4", "--seed", str(2**64)], tmp_path)
    assert code == 2 and "--seed" in err and "Traceback" not in err


def test_int4_tensor_parallelism_needs_whole_weight_groups(tmp_path):
    """Llama-2 13B's MLP is 13,824 wide: at tp 8 each rank's share of the
    down projection's input is 1,728 = 13.5 groups of 128 int4 weights,
    which vLLM's GPTQ / AWQ loaders refuse ("The input size is not aligned
    with the quantized weight shape"); the plan was exported all the same.
    At tp 2 (6,912 = 54 groups) it plans, and bf16 weights at tp 8 too."""
    args = ["serve", "--model", "llama2-13b", "--cluster", "1x8-l4", "--simulate-top", "0", "-q"]
    assert_refused(tmp_path, [*args, "--weight-dtype", "int4", "--tp", "8"], "--tp 8",
                   "down projection's input of 13824 splits into 1728 per rank")
    for pins in (["--weight-dtype", "int4", "--tp", "2"], ["--tp", "8"]):
        code, _, err = run([*args, *pins], tmp_path)
        assert code == 0, err


def test_an_unknown_profile_device_gets_a_suggestion_and_no_contradiction(tmp_path):
    """A profile measured on 'h900-80gb' (no such device): the warning
    suggests the catalog's near names, and the summary no longer also said
    "the profile names no device ('# device: unknown')"."""
    model = write(tmp_path / "p.csv", "# batch_size: 8\n# device: h900-80gb\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
                                      "l0,1,2,3000000,40000\nl1,1,2,3000000,40000\n")
    code, out, err = run(["plan", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "64"], tmp_path)
    assert code == 0, err
    assert "'h900-80gb' is no catalog device (did you mean h100-80gb" in err
    assert "names no device" not in out


def test_a_misspelt_profile_device_on_a_mixed_cluster_gets_a_suggestion(tmp_path):
    """On a cluster of two device types a profile's unknown device makes the
    search take its times as the fastest type's (a factor of about 3 on
    A100 + H100 for an A100 profile): the warning names the catalog device
    one letter away ('a100-80g' for a100-80gb)."""
    model = write(tmp_path / "p.csv", "# batch_size: 8\n# device: a100-80g\n"
                                      "name,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
                                      "l0,1,2,3000000,40000\nl1,1,2,3000000,40000\n")
    cluster = str(Path(__file__).parent / "data" / "mixed-a100-h100.toml")
    code, _, err = run(["plan", "--model", model, "--cluster", cluster, "-b", "64", "--top", "1"], tmp_path)
    assert code == 0, err
    assert "'a100-80g', a device neither the cluster nor the catalog defines (did you mean a100-80gb" in err


def test_a_profile_of_another_format_version_is_refused(tmp_path):
    """'# pipesearch profile v2' (or vX) was read as a v1 profile without a
    word; '# pipesearch profile v1' and no such line at all still read."""
    rows = "# batch_size: 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\nl0,1,2,3000000,40000\nl1,1,2,3000000,40000\n"
    for version in ("v2", "vX"):
        model = write(tmp_path / f"{version}.csv", f"# pipesearch profile {version}\n" + rows)
        assert_refused(tmp_path, ["plan", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "64"],
                       f"{version}.csv", "line 1", "a profile format this pipesearch does not read")
    for head in ("# pipesearch profile v1\n", ""):
        model = write(tmp_path / "ok.csv", head + rows)
        code, _, err = run(["plan", "-q", "--model", model, "--cluster", "1x4-v100-pcie", "-b", "64"], tmp_path)
        assert code == 0, err


def test_the_all_points_csv_given_for_a_plan_file_says_which_file_it_is(tmp_path):
    """The --all-points CSV passed where the plan file goes read "not JSON
    (Expecting value: line 1, column 1)"; it now says it is that table."""
    code, out, err = run(["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "64", "--top", "1",
                          "-o", "p.json", "--all-points", "points.csv"], tmp_path)
    assert code == 0, err
    for cmd in (["validate"], ["simulate"], ["export", "--format", "torch"], ["plot", "--kind", "space"]):
        line = assert_refused(tmp_path, [cmd[0], "points.csv", *cmd[1:]], "points.csv", "not JSON",
                              "--all-points CSV", "pipesearch plan -o")
        assert "Traceback" not in line


@pytest.mark.parametrize("name,text,needle", [
    ("p.csv", "# batch_size: 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\nl0,1,2,1000,4096\n",
     "it is a layer profile (CSV): `pipesearch plan --model p.csv -o plans.json`"),
    ("g.txt", "node1 -- Conv2d -- forward_compute_time=1, backward_compute_time=2, activation_size=4, "
              "parameter_size=8\n", "it is a PipeDream graph.txt profile"),
    ("c.toml", 'name = "x"\nnodes = 1\ndevices_per_node = 4\n', "it is a TOML file, a cluster: give it to "
                                                                  "`pipesearch plan --cluster c.toml`"),
    ("m.toml", '[transformer]\nnum_layers = 2\n', "it is a TOML file, a transformer config: `pipesearch plan "
                                                    "--model m.toml"),
    ("d.toml", 'name = "g"\nmemory_GiB = 16\n', "it is a TOML file, a device: a cluster TOML names it"),
    ("config.json", '{"model_type": "llama", "hidden_size": 4096}', "a model config (HuggingFace config.json), "
                                                                      "not a plan file"),
])
@pytest.mark.parametrize("command", [["validate"], ["simulate"]])
def test_another_input_given_as_a_plan_file_is_named(tmp_path, name, text, needle, command):
    """A profile, a graph.txt, a TOML file or a model config given where a
    plan file goes: what it is, and the command that takes it (it said
    "not JSON (Expecting value: line 1, column 1)", or for a config
    "schema is None")."""
    write(tmp_path / name, text)
    line = assert_refused(tmp_path, [*command, name], name, needle)
    assert "None" not in line


def test_a_utf16_plan_file_gets_its_fix(tmp_path, plan_doc):
    """Windows PowerShell 5's `pipesearch plan --json > p.json` writes
    UTF-16 with a byte-order mark: the message says so and how to mend it."""
    (tmp_path / "p.json").write_bytes(json.dumps(plan_doc).encode("utf-16"))
    assert_refused(tmp_path, ["simulate", "p.json"], "p.json", "UTF-16", "save it as UTF-8", "-o FILE")


@pytest.mark.parametrize("command", [["plan"], ["serve"]])
def test_a_model_folder_names_the_config_in_it(tmp_path, command):
    """vLLM and transformers take a model's folder; pipesearch reads its
    config.json: the refusal of the folder names that file as the fix."""
    (tmp_path / "mdl").mkdir()
    write(tmp_path / "mdl" / "config.json", '{"model_type": "llama"}')
    assert_refused(tmp_path, [*command, "--model", "mdl"], "--model mdl: is a directory",
                   f"--model {Path('mdl') / 'config.json'}")


def test_pins_name_what_the_user_gave_and_the_fix(tmp_path):
    """A --split of 3 stages pins pp 3 (the message names the split, not a
    --pp never given); --pp x --vp past the layer count is refused up front
    with the stage count (vgg16 has 40 layers: 8 x 6 = 48), not as refused
    schedules; Mobius over more GPUs than there are points to --vp."""
    assert_refused(tmp_path, ["plan", "--split", "10,20,10", "--dp", "8", "-o", "p.json"],
                   "--split of 3 stages x --dp 8 needs 24 devices", "has 16")
    assert_refused(tmp_path, ["plan", "--pp", "8", "--vp", "6", "-o", "p.json"],
                   "--pp 8 x --vp 6 = 48 stages, more than the model's 40 layers", "use --vp 5 or lower")
    assert_refused(tmp_path, ["plan", "--cluster", "1x8-rtx4090-pcie4", "--pp", "32", "--schedule", "mobius",
                              "-o", "p.json"],
                   "--pp 32 needs 32 devices", "mobius runs pp x vp stages on pp GPUs: --pp 8 or fewer, and --vp")
    # a tp wider than the cluster: no GPUs to run a pipeline on, no hint (it divided by zero)
    assert_refused(tmp_path, ["plan", "--cluster", "1x8-rtx3090-pcie3", "-b", "64", "--model", "gpt3-1.3b",
                              "--tp", "16", "--pp", "2", "--schedule", "mobius", "-o", "p.json"],
                   "needs 32 devices, cluster 1x8-rtx3090-pcie3 has 8")
    # one layer per rank at most: the fix is a lower --pp for the vp asked for
    assert_refused(tmp_path, ["plan", "--pp", "30", "--vp", "2", "-o", "p.json"],
                   "--pp 30 x --vp 2 = 60 stages", "use --pp 20 or lower for --vp 2")


@pytest.mark.parametrize("groups", ["5", "true", "0.5"])
def test_cluster_groups_of_another_type_are_refused(tmp_path, groups):
    """``groups = 5`` (a number, not an array of tables) was an internal
    error: the device-file scan iterated it before the loader checked it."""
    path = write(tmp_path / "g.toml", f'name = "g"\ngroups = {groups}\n[intra_node]\nbandwidth_GBps = 100\n'
                                      'latency_us = 5\n[inter_node]\nbandwidth_GBps = 25\nlatency_us = 10\n')
    assert_refused(tmp_path, ["plan", "--model", "vgg16", "--cluster", path], "g.toml", f"key 'groups' = {groups}",
                   "expected a non-empty array of tables [[groups]]")


def test_a_console_that_cannot_encode_the_model_name_shows_it_escaped(tmp_path):
    """A profile named with characters the console's encoding lacks (cp1252
    has no 模型) was an internal error after the plan file was written; the
    table now shows the name escaped, as error lines are, and exits 0."""
    csv = (Path(__file__).parents[1] / "cost_models" / "resnet18.csv").read_text()
    write(tmp_path / "uni.csv", csv.replace("# model: resnet18", "# model: tíny→模型"))
    done = subprocess.run([sys.executable, "-m", "pipesearch", "plan", "--model", "uni.csv", "--cluster",
                           "1x4-v100-pcie", "-b", "64", "-o", "u.json"], cwd=tmp_path, capture_output=True, timeout=120,
                          env={**os.environ, "PIPESEARCH_DEBUG": "", "PYTHONIOENCODING": "cp1252"})
    assert done.returncode == 0, done.stderr
    assert "\\u6a21\\u578b on 1x4-v100-pcie" in done.stdout.decode("cp1252").splitlines()[0]


def test_an_output_folder_named_after_a_catalog_entry_does_not_hide_it(tmp_path):
    """``mkdir llama3-8b`` (an output folder) then ``--model llama3-8b`` was
    refused as "a directory, not a model file ... give a catalog name",
    though a catalog name was given; with a folder ``4x4-v100-10gbe`` even
    the bare ``pipesearch plan`` failed. A bare catalog name is the catalog's
    entry; ``./NAME`` still names the folder."""
    (tmp_path / "vgg16").mkdir()
    (tmp_path / "4x4-v100-10gbe").mkdir()
    code, out, err = run(["plan", "-q", "--model", "vgg16", "--top", "1"], tmp_path)
    assert code == 0, err
    assert_refused(tmp_path, ["plan", "--model", "./vgg16"], "--model ./vgg16: is a directory, not a model file")


def test_a_file_here_named_like_a_catalog_entry_is_said(tmp_path):
    """A file in the working folder named exactly as a catalog entry (no
    ending) was read in its place without a word. An edited cluster copy is
    planned with a warning naming both readings; an exact copy, or the
    name given as ./name, says nothing; a model file without a known ending
    is refused, the refusal naming the catalog's model the name also is."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "hardware" / "clusters" / "1x4-v100-pcie.toml").read_text()
    edited = write(tmp_path / "1x4-v100-pcie", text.replace('name = "1x4-v100-pcie"', 'name = "mine"'))
    args = ["plan", "-q", "--model", "alexnet", "-b", "64", "--top", "1"]
    code, _, err = run([*args, "--cluster", "1x4-v100-pcie"], tmp_path)
    assert code == 0 and "--cluster 1x4-v100-pcie: read the file 1x4-v100-pcie in this folder, not the catalog's " \
                         "cluster 1x4-v100-pcie" in err, err
    code, _, err = run([*args, "--cluster", "./1x4-v100-pcie"], tmp_path)
    assert code == 0 and "read the file" not in err, err
    edited.write_text(text)  # an exact copy plans as the catalog's would
    code, _, err = run([*args, "--cluster", "1x4-v100-pcie"], tmp_path)
    assert code == 0 and "read the file" not in err, err
    write(tmp_path / "alexnet", (root / "cost_models" / "alexnet.csv").read_text())
    assert_refused(tmp_path, args, "unsupported model file type", "not the catalog's model alexnet")


def test_a_pinned_micro_batch_count_every_schedule_refuses_is_named(tmp_path):
    """Interleaved 1F1B at pp 3 needs a multiple of 3 micro-batches: with
    --num-micro-batches 16 pinned the refusal said "raise
    --num-micro-batches", a pin the user had set; it names the pin and what
    the schedule needs. Unpinned, the general hint stays."""
    out = assert_refused(tmp_path, ["plan", "--pp", "3", "--num-micro-batches", "16", "--schedule",
                                    "interleaved-1f1b"], "refused every point")
    assert "change --num-micro-batches (pinned to 16) to at least pp, a multiple of it for interleaved 1F1B" in out
    out = assert_refused(tmp_path, ["plan", "--pp", "3", "-b", "2", "--schedule", "interleaved-1f1b"],
                         "refused every point")
    assert "raise --num-micro-batches (or lower --micro-batch-size)" in out


def test_pinned_layout_that_cannot_hold_the_state_says_so(tmp_path):
    """``--pp 1 --tp 1`` with llama3-8b on A100 80 GB: every device keeps
    the whole model's weights and mixed-precision Adam state, 8,030,261,248
    parameters x 16 B = 119.7 GiB, against 80 x 0.95 - 1 = 75.0 GiB usable
    (the memory headroom and reserve): no micro-batch size fits, so the fix
    is not a smaller micro-batch (it said "lower --micro-batch-size or use a
    larger cluster") but more tensor parallelism or a sharded state."""
    line = assert_refused(tmp_path, ["plan", "--model", "llama3-8b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                     "--pp", "1", "--tp", "1", "--dp", "8", "--micro-batch-size", "8"],
                          "119.7 GiB", "75.0 GiB usable", "raise --tp", "--sharding zero1")
    assert "--micro-batch-size" not in line and "larger cluster" not in line


def test_optimizer_offload_that_overflows_the_host_says_so(tmp_path):
    """llama2-70b with ``--optimizer-offload`` on 1x8-rtx4090-pcie4 (800 GB
    of host memory = 745.1 GiB): the offloaded state, fp32 master weights,
    Adam's two moments and an fp32 gradient copy, 16 B x 68.98e9 parameters
    = 1027.8 GiB, cannot fit the host whatever the split (it said "use a
    larger cluster")."""
    assert_refused(tmp_path, ["plan", "--model", "llama2-70b", "--cluster", "1x8-rtx4090-pcie4", "-b", "64",
                              "--optimizer-offload", "--stream-weights"],
                   "1027.8 GiB at the least", "745.1 GiB", "memory_GB")


def test_dp_fixed_by_the_micro_batch_pins_is_named_as_such(tmp_path):
    """``-b 64 --micro-batch-size 1 --num-micro-batches 8`` fixes dp = 8
    (the user typed no --dp); with --pp 4 and --tp 2 that is 4 x 8 x 2 = 64
    devices. It said "--dp 8 x --tp 2 needs 16 devices"."""
    line = assert_refused(tmp_path, ["plan", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                     "--micro-batch-size", "1", "--num-micro-batches", "8", "--tp", "2", "--pp", "4"],
                          "fixes dp = 64 / 8 = 8", "needs 64 devices", "has 8")
    assert "--dp 8" not in line


def test_serving_out_of_memory_suggests_only_dtypes_the_devices_run(tmp_path):
    """qwen3-32b on four V100 16 GB: 32.8e9 parameters x 2 B of bf16 weights
    = 61 GiB do not fit 4 x 16 GB with room to serve; the fix names int4
    weights and an fp8 KV cache, not fp8 weights, which a V100 (compute
    capability 7.0) cannot load and which serve then refused."""
    line = assert_refused(tmp_path, ["serve", "--model", "qwen3-32b", "--cluster", "1x4-v100-pcie", "-q",
                                     "--simulate-top", "0"], "--weight-dtype int4", "--kv-dtype fp8")
    assert "fp8/" not in line and "--weight-dtype fp8" not in line


def test_a_latin1_profile_names_the_line_and_the_fix(tmp_path):
    """A CSV saved as Latin-1 (an 'µ' in a layer name, byte 0xb5 on line 3):
    the line, the byte and "save it as UTF-8" (it said only "not UTF-8
    text", where the UTF-16 case named the fix)."""
    (tmp_path / "l.csv").write_bytes(b"# batch_size: 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
                                     b"\xb5a,1,2,100000,5000\n")
    assert_refused(tmp_path, ["plan", "--model", "l.csv", "--cluster", "1x4-v100-pcie"],
                   "l.csv: not a profile CSV (not UTF-8 text: line 3 holds byte 0xb5", "save it as UTF-8")


def test_a_toml_date_is_shown_as_toml_writes_it(tmp_path):
    """``latency_us = 1979-05-27`` (a TOML date): the value as the file has
    it, not Python's ``datetime.date(1979, 5, 27)``."""
    write(tmp_path / "c.toml", 'name = "c"\nnodes = 1\ndevices_per_node = 2\ndevice = "a100-80gb"\n'
                               "[intra_node]\nbandwidth_GBps = 100\nlatency_us = 1979-05-27\n"
                               "[inter_node]\nbandwidth_GBps = 10\nlatency_us = 5\n")
    line = assert_refused(tmp_path, ["plan", "--cluster", "c.toml"], "key 'intra_node.latency_us' = 1979-05-27:")
    assert "datetime" not in line


def test_a_reserve_that_idles_a_device_type_says_so_in_the_refusal(tmp_path):
    """mixed-a100-v100 (4 A100 40 GB + 4 V100 32 GB) with --memory-reserve
    35GiB: nothing is left of a V100's 32 GiB, so --dp 8 finds only the 4
    A100s; the refusal names that (it said "use a larger cluster")."""
    code, out, err = run(["plan", "--model", "resnet18", "--cluster", "mixed-a100-v100", "--memory-reserve", "35GiB",
                          "--dp", "8", "-q"], tmp_path)
    assert code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert "leave nothing of v100-32gb's memory" in line and "only 4 of the 8 devices" in line, err
    assert "larger cluster" not in line
