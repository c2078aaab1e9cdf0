"""Profile CSV reader/writer: exact values, every validation error, round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesearch.errors import InputError
from pipesearch.profiles import READERS, load_model, read_profile_csv, write_profile_csv
from pipesearch.types import Layer, ModelProfile

REPO = Path(__file__).resolve().parents[1]

GOOD = """\
# pipesearch profile v1
# model: tiny
# batch_size: 32
# device: v100-16gb
# bytes_per_param: 2
# source: hand-written
# source: for the tests
name,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes,bwd_input_ms
embed,1.5,3,1000,2048,4096,1.25
block,10,20.5,5e6,2048,,
head,0.25,0.5,0,100,100,0.5
"""


def write(tmp_path: Path, text: str, name: str = "model.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_hand_written_three_layers(tmp_path):
    profile = read_profile_csv(write(tmp_path, GOOD))
    assert profile == ModelProfile(
        name="tiny",
        layers=(
            Layer("embed", 0.0015, 0.003, 1000.0, 2048.0, 4096.0, bwd_input_s=0.00125),
            Layer("block", 0.01, 0.0205, 5_000_000.0, 2048.0, 2048.0),  # saved defaults to output
            Layer("head", 0.00025, 0.0005, 0.0, 100.0, 100.0, bwd_input_s=0.0005),
        ),
        profiled_batch_size=32,
        profiled_device="v100-16gb",
        bytes_per_param=2.0,
        source="hand-written\nfor the tests",
    )


def test_defaults_and_minimal_columns(tmp_path):
    text = "# batch_size: 8\nname,fwd_ms,bwd_ms,param_bytes,output_bytes\nx,17.972,0,4,8\n"
    profile = read_profile_csv(write(tmp_path, text, "mini.csv"))
    assert profile.name == "mini"  # file name without .csv
    assert profile.profiled_device == "unknown"
    assert profile.bytes_per_param == 4.0
    assert profile.source == ""
    assert profile.layers == (Layer("x", 0.017972, 0.0, 4.0, 8.0, 8.0),)
    assert profile.layers[0].fwd_s == float("0.017972")  # decimal conversion, no 1-ulp error


def test_whitespace_comments_and_blank_lines_are_ignored(tmp_path):
    text = ("# batch_size: 4\n\n# just a remark, no key\nname, fwd_ms, bwd_ms, param_bytes, output_bytes\n"
            "a, 1, 2, 3, 4\n\n# another remark\nb,1,2,3,4\n")
    profile = read_profile_csv(write(tmp_path, text))
    assert [layer.name for layer in profile.layers] == ["a", "b"]
    assert profile.layers[0] == Layer("a", 0.001, 0.002, 3.0, 4.0, 4.0)


HEAD = "# batch_size: 16\n"
COLS = "name,fwd_ms,bwd_ms,param_bytes,output_bytes\n"
FIXED = "name,fwd_ms,bwd_ms,param_bytes,output_bytes,fwd_fixed_ms,bwd_fixed_ms\n"


@pytest.mark.parametrize(
    "text, needles",
    [
        (HEAD + "name,fwd_ms,param_bytes,output_bytes\nx,1,2,3\n", ["line 2", "'bwd_ms'", "missing"]),
        (HEAD + COLS + "x,1,2,3,4\ny,1,fast,3,4\n", ["line 4", "'bwd_ms'", "'fast'"]),
        (HEAD + COLS + "x,1,-2,3,4\n", ["line 3", "'bwd_ms'", "'-2'", "negative"]),
        (HEAD + COLS + "x,nan,2,3,4\n", ["line 3", "'fwd_ms'", "'nan'"]),
        (HEAD + COLS + "x,1,2,inf,4\n", ["line 3", "'param_bytes'", "'inf'"]),
        (HEAD + COLS + "x,1,2,3,\n", ["line 3", "'output_bytes'", "empty"]),
        (HEAD + COLS + "x,1,2,3,4\nx,1,2,3,4\n", ["line 4", "duplicate", "'x'", "line 3"]),
        (HEAD + COLS + ",1,2,3,4\n", ["line 3", "empty layer name"]),
        (HEAD + COLS + "a\x00b,1,2,3,4\n", ["line 3", "control character"]),
        # a tab in the model's name was printed raw in the table's heading
        ("# model: my\tmodel\n" + HEAD + COLS + "x,1,2,3,4\n", ["line 1", "'model'", "'my\\tmodel'", "control"]),
        (HEAD + "# device: v100\x1b[31m\n" + COLS + "x,1,2,3,4\n", ["line 2", "'device'", "control"]),
        (HEAD + COLS, ["line 2", "no layers"]),
        (HEAD, ["no layers"]),
        (COLS + "x,1,2,3,4\n", ["batch_size", "missing"]),
        ("# batch_size: 0\n" + COLS + "x,1,2,3,4\n", ["line 1", "'0'", "positive integer"]),
        ("# batch_size: -4\n" + COLS + "x,1,2,3,4\n", ["line 1", "'-4'"]),
        ("# batch_size: 1.5\n" + COLS + "x,1,2,3,4\n", ["line 1", "'1.5'"]),
        ("# batch_size: many\n" + COLS + "x,1,2,3,4\n", ["line 1", "'many'"]),
        ("# batch_size: 4\n# batch_size: 8\n" + COLS + "x,1,2,3,4\n", ["lines 1, 2", "batch_size"]),
        ("# batch_size: 4\n# bytes_per_param: 0\n" + COLS + "x,1,2,3,4\n", ["line 2", "bytes_per_param"]),
        ("# batch_size: 4\n# tied_param_bytes: -1\n" + COLS + "x,1,2,3,4\n", ["line 2", "tied_param_bytes"]),
        ("# batch_size: 4\n# tied_param_bytes: 4\n" + COLS + "x,1,2,3,4\ny,1,2,3,4\n",
         ["tied_param_bytes 4", "first layer's param_bytes (3)"]),
        ("# batch_size: 4\n# tied_param_bytes: 2\n" + COLS + "x,1,2,3,4\n",
         ["tied_param_bytes 2 with one layer", "shares nothing", "drop the header line"]),
        ("# batch_size: 4\n# batchsize: 8\n" + COLS + "x,1,2,3,4\n", ["line 2", "'batchsize'"]),
        (HEAD + "name,fwd_ms,bwd_ms,param_bytes,output_bytes,bwd_input_ms\nx,1,2,3,4,2.5\n",
         ["line 3", "'bwd_input_ms'", "'2.5'", "'2'"]),
        (HEAD + "name,fwd_ms,bwd_ms,param_bytes,output_bytes,flops\nx,1,2,3,4,5\n", ["line 2", "'flops'"]),
        (HEAD + COLS + "x,1,2,3,4,5\n", ["line 3", "6 fields", "expected 5"]),
        # fixed + per-sample columns
        (HEAD + FIXED + "x,1,2,3,4,-0.5,1\n", ["line 3", "'fwd_fixed_ms'", "'-0.5'", "negative"]),
        (HEAD + FIXED + "x,1,2,3,4,0.5,1\ny,1,2,3,4,,1\n", ["line 4", "'fwd_fixed_ms'", "every row"]),
        (HEAD + FIXED + "x,1,2,3,4,1.5,1\n", ["line 3", "'fwd_fixed_ms'", "'1.5'", "exceeds fwd_ms '1'"]),
        (HEAD + FIXED + "x,1,2,3,4,0.5,2.5\n", ["line 3", "'bwd_fixed_ms'", "'2.5'", "exceeds bwd_ms '2'"]),
        (HEAD + COLS.strip() + ",fwd_fixed_ms\nx,1,2,3,4,0.5\n", ["line 2", "'fwd_fixed_ms'", "'bwd_fixed_ms'"]),
        (HEAD + FIXED.strip() + ",bwd_input_fixed_ms\nx,1,2,3,4,0.5,1,0.5\n",
         ["line 2", "'bwd_input_fixed_ms'", "'bwd_input_ms'"]),
        (HEAD + FIXED.strip() + ",bwd_input_ms,bwd_input_fixed_ms\nx,1,2,3,4,0.5,1,1,\n",
         ["line 3", "'bwd_input_fixed_ms'", "every row"]),
        # input gradient: fixed 1 <= 1 but per-sample 1.5 - 1 = 0.5 > bwd's 2 - 1.75 = 0.25
        (HEAD + FIXED.strip() + ",bwd_input_ms,bwd_input_fixed_ms\nx,1,2,3,4,0.5,1.75,1.5,1\n",
         ["line 3", "'bwd_input_fixed_ms'", "'1'", "exceed the backward"]),
    ],
)
def test_bad_input_names_file_line_and_value(tmp_path, text, needles):
    path = write(tmp_path, text, "broken_profile.csv")
    with pytest.raises(InputError) as info:
        read_profile_csv(path)
    message = str(info.value)
    assert "\n" not in message
    assert "broken_profile.csv" in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_unreadable_file(tmp_path):
    with pytest.raises(InputError, match="missing.csv"):
        read_profile_csv(tmp_path / "missing.csv")


def test_writer_output_is_readable_text(tmp_path):
    profile = read_profile_csv(write(tmp_path, GOOD))
    out = tmp_path / "out.csv"
    write_profile_csv(profile, out)
    lines = out.read_text().splitlines()
    assert lines[:7] == [
        "# pipesearch profile v1", "# model: tiny", "# batch_size: 32", "# device: v100-16gb",
        "# bytes_per_param: 2", "# source: hand-written", "# source: for the tests",
    ]
    assert lines[7] == "name,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes,bwd_input_ms"
    assert lines[8] == "embed,1.5,3,1000,2048,4096,1.25"
    assert lines[9] == "block,10,20.5,5000000,2048,2048,"


def test_writer_rejects_unwritable_names(tmp_path):
    bad = ModelProfile("m", (Layer("#x", 0, 0, 0, 0, 0),), 1)
    with pytest.raises(InputError, match="#x"):
        write_profile_csv(bad, tmp_path / "m.csv")


# -------------------------------------------------------------- round trip

_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.", min_size=1,
                max_size=12)
_size = st.floats(min_value=0, max_value=1e13, allow_nan=False, allow_infinity=False)
# times are 0 or at least 1 ns (pipesearch.limits.MIN_LAYER_S) and 0.1 ns per sample
# (limits.MIN_SAMPLE_S) at batch sizes up to 2**20: at least 0.2 ms
_time = st.one_of(st.just(0.0), st.floats(min_value=2e-4, max_value=1e4, allow_nan=False, allow_infinity=False))


@st.composite
def profiles(draw):
    names = draw(st.lists(_name, min_size=1, max_size=6, unique=True))
    with_bwd_input = draw(st.booleans())
    layers = []
    for name in names:
        bwd = draw(_time)
        bwd_input = None
        if with_bwd_input and draw(st.booleans()):
            bwd_input = 0.0 if bwd == 0 else draw(st.one_of(st.just(0.0), st.floats(min_value=1e-9, max_value=bwd)))
        layers.append(Layer(name, draw(_time), bwd, draw(_size), draw(_size), draw(_size),
                            bwd_input_s=bwd_input))
    source = "\n".join(draw(st.lists(_name, max_size=3)))
    tied = draw(st.one_of(st.just(0.0), st.floats(min_value=0, max_value=layers[0].param_bytes))) \
        if len(layers) > 1 else 0.0
    return ModelProfile(
        name=draw(_name), layers=tuple(layers),
        profiled_batch_size=draw(st.integers(min_value=1, max_value=1 << 20)),
        profiled_device=draw(_name),
        bytes_per_param=draw(st.floats(min_value=0.125, max_value=16, allow_nan=False)),
        source=source,
        tied_param_bytes=tied,
    )


@settings(max_examples=150, deadline=None)
@given(profile=profiles())
def test_round_trip(tmp_path_factory, profile):
    path = tmp_path_factory.mktemp("rt") / "p.csv"
    write_profile_csv(profile, path)
    assert read_profile_csv(path) == profile


@pytest.mark.parametrize("name", ["vgg16", "resnet50", "gnmt", "inception_v3"])
def test_catalog_profiles_round_trip(tmp_path, name):
    profile = load_model(name)
    assert profile.num_layers > 0 and profile.profiled_batch_size > 0
    write_profile_csv(profile, tmp_path / "copy.csv")
    assert read_profile_csv(tmp_path / "copy.csv") == profile


def test_load_model_dispatch(tmp_path):
    csv_path = write(tmp_path, GOOD, "tiny.csv")
    assert load_model(str(csv_path)) == read_profile_csv(csv_path)
    graph = load_model(str(REPO / "tests/data/pipedream/vgg16.graph.txt"))
    assert graph.name == "vgg16" and graph.profiled_batch_size == 128
    unsupported = [".yaml", ".txt"] + [s for s in (".toml", ".json") if s not in READERS]
    for suffix in unsupported:
        other = write(tmp_path, "x = 1\n", f"model{suffix}")
        with pytest.raises(InputError) as info:
            load_model(str(other))
        assert f"model{suffix}" in str(info.value)
        assert "*.csv" in str(info.value) and "graph.txt" in str(info.value)


# -------------------------------------------------------------- fixed + per-sample times

FIXED_PROFILE = """\
# pipesearch profile v1
# model: fit3
# batch_size: 4
# device: cpu
name,fwd_ms,bwd_ms,param_bytes,output_bytes,fwd_fixed_ms,bwd_fixed_ms
a,5,9,1000000,4096000,1,1
b,6,10,1000000,4096000,2,2
c,3,7,1000000,4096000,0,3
"""


def _drop_fixed(text: str) -> str:
    return "\n".join(",".join(line.split(",")[:5]) if not line.startswith("#") else line
                     for line in text.splitlines()) + "\n"


def test_fixed_columns_read_and_round_trip(tmp_path):
    profile = read_profile_csv(write(tmp_path, FIXED_PROFILE))
    assert profile.layers[0] == Layer("a", 0.005, 0.009, 1e6, 4.096e6, 4.096e6, fwd_fixed_s=0.001, bwd_fixed_s=0.001)
    assert profile.layers[2].fwd_fixed_s == 0.0 and profile.layers[2].bwd_fixed_s == 0.003
    write_profile_csv(profile, tmp_path / "again.csv")
    assert read_profile_csv(tmp_path / "again.csv") == profile
    with_input = ModelProfile("m", (Layer("x", 1e-3, 2e-3, 0, 0, 0, bwd_input_s=1e-3, fwd_fixed_s=0.0,
                                          bwd_fixed_s=1e-3, bwd_input_fixed_s=5e-4),
                                    Layer("y", 1e-3, 2e-3, 0, 0, 0, fwd_fixed_s=0.0, bwd_fixed_s=0.0)), 8)
    write_profile_csv(with_input, tmp_path / "input.csv")
    assert read_profile_csv(tmp_path / "input.csv") == with_input
    partial = ModelProfile("m", (Layer("x", 1e-3, 2e-3, 0, 0, 0, fwd_fixed_s=0.0, bwd_fixed_s=0.0),
                                 Layer("y", 1e-3, 2e-3, 0, 0, 0)), 8)
    with pytest.raises(InputError, match="every layer or on none"):
        write_profile_csv(partial, tmp_path / "partial.csv")


def _plan_stages(path: Path, micro_batch_size: int) -> list[dict]:
    import json

    from click.testing import CliRunner

    from pipesearch.cli import main

    result = CliRunner().invoke(main, [
        "plan", "--model", str(path), "--cluster", "1x2-cpu", "--pp", "2", "--dp", "1", "--split", "2,1",
        "--schedule", "gpipe", "--micro-batch-size", str(micro_batch_size), "--num-micro-batches", "4",
        "-b", str(4 * micro_batch_size), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plans"][0]["stages"]


@pytest.mark.parametrize("mbs", [1, 8])
def test_fixed_columns_give_fixed_plus_per_sample_stage_times(tmp_path, mbs):
    """Stage times of the split [a, b | c] by hand, profiled at B = 4: layer
    time at micro-batch b is fixed + (t - fixed) * b / 4.
    b = 1: forward a 1 + 4/4 = 2, b 2 + 4/4 = 3 -> stage 0 forward 5 ms;
    backward a 1 + 8/4 = 3, b 2 + 8/4 = 4 -> compute 5 + 7 = 12 ms; stage 1
    forward 0 + 3/4 = 0.75, backward 3 + 4/4 = 4 -> compute 4.75 ms.
    b = 8: forward 1 + 8 = 9 and 2 + 8 = 10 -> 19; backward 1 + 16 and 2 + 16
    -> compute 19 + 35 = 54; stage 1 forward 6, backward 3 + 8 = 11 -> 17.
    The same file without the fixed columns scales linearly: stage 0
    forward (5 + 6) * b / 4, compute (5 + 6 + 9 + 10) * b / 4."""
    fixed = _plan_stages(write(tmp_path, FIXED_PROFILE, "fit3.csv"), mbs)
    want = {1: [(5.0, 12.0), (0.75, 4.75)], 8: [(19.0, 54.0), (6.0, 17.0)]}[mbs]
    for stage, (fwd_ms, compute_ms) in zip(fixed, want):
        assert stage["fwd_s"] == pytest.approx(fwd_ms / 1e3, rel=1e-12)
        assert stage["compute_s"] == pytest.approx(compute_ms / 1e3, rel=1e-12)
    linear = _plan_stages(write(tmp_path, _drop_fixed(FIXED_PROFILE), "lin3.csv"), mbs)
    assert linear[0]["fwd_s"] == pytest.approx(11e-3 * mbs / 4, rel=1e-12)
    assert linear[0]["compute_s"] == pytest.approx(30e-3 * mbs / 4, rel=1e-12)
    assert linear[1]["compute_s"] == pytest.approx(10e-3 * mbs / 4, rel=1e-12)


def test_profile_without_fixed_parts_scales_linearly_bit_for_bit():
    """Old profiles keep the linear rule exactly: t * b / B, the same floats."""
    import numpy as np

    profile = load_model("vgg16")
    ratio = 3 / profile.profiled_batch_size
    times = profile.layer_times_at(3)
    for key in ("fwd_s", "bwd_s", "bwd_input_s"):
        assert np.array_equal(times[key], profile.layer_arrays[key] * ratio)
    assert np.array_equal(profile.time_ratio_at(3), np.full(profile.num_layers, ratio))
    assert profile.compute_per_sample_s == sum(lay.fwd_s + lay.bwd_s for lay in profile.layers) / 128


def test_bad_fixed_column_on_the_command_line_exits_2(tmp_path):
    from click.testing import CliRunner

    from pipesearch.cli import main

    path = write(tmp_path, FIXED_PROFILE.replace("a,5,9,1000000,4096000,1,1", "a,5,9,1000000,4096000,-1,1"),
                 "neg.csv")
    result = CliRunner().invoke(main, ["plan", "--model", str(path), "--cluster", "1x2-cpu", "-b", "4"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "neg.csv" in lines[0] and "'fwd_fixed_ms'" in lines[0] and "'-1'" in lines[0]
    assert "Traceback" not in result.output


def test_search_with_fixed_times_is_not_pruned_by_a_linear_bound():
    """Four layers, forward 1 ms + 1 ms per sample and backward 2 ms + 2 ms
    per sample (profiled at batch 1), batch 16 on 4 free-link devices. pp 1 x
    dp 4 with one micro-batch of 4: 4 layers x (1 + 4 + 2 + 8) ms = 60 ms;
    two micro-batches of 2 would take 2 x 4 x (1 + 2 + 2 + 4) = 72 ms. The
    pruned search must find what the exhaustive one finds (a bound that
    scaled the batch-1 time linearly, 9 ms x 4 per layer, would exceed 60 ms
    and prune the best point)."""
    from helpers import tiny_cluster

    from pipesearch.search import search
    from pipesearch.search_options import ModelVariant, SearchOptions
    from pipesearch.types import Job

    layers = tuple(Layer(f"l{k}", 2e-3, 4e-3, 0, 0, 0, fwd_fixed_s=1e-3, bwd_fixed_s=2e-3) for k in range(4))
    variants, cluster, job = [ModelVariant(ModelProfile("fixed", layers, 1))], tiny_cluster(1, 4), Job(16)
    pruned = search(variants, cluster, job, SearchOptions(top=1)).plans[0]
    exhaustive = search(variants, cluster, job, SearchOptions(top=1, exhaustive=True)).plans[0]
    assert exhaustive.predicted.iteration_time_s == pytest.approx(0.060, rel=1e-12)
    assert pruned.predicted.iteration_time_s == pytest.approx(0.060, rel=1e-12)
    assert (pruned.pp, pruned.dp, pruned.micro_batch_size) == (1, 4, 4)


def test_a_stage_with_no_backward_writes_a_valid_plan(tmp_path):
    """Layer l2 has no backward: its stage's backward, compute_s - fwd_s, is
    0 in exact arithmetic, but the two prefix sums it comes from round apart
    (0.102 + 8.032 + 0.408 + 9.954 + 0.374 ms before and after); the plan
    must still pass its own format check (a negative backward or
    input-gradient time is refused) and record a backward of 0."""
    from click.testing import CliRunner

    from pipesearch.cli import main

    path = write(tmp_path, "# batch_size: 32\n# bytes_per_param: 2\n"
                           "name,fwd_ms,bwd_ms,param_bytes,output_bytes,saved_bytes\n"
                           "l0,0.102,8.032,0,0,0\nl1,0.408,9.954,0,0,0\nl2,0.374,0.0,0,0,0\n", "zero_bwd.csv")
    result = CliRunner().invoke(main, ["plan", "-q", "--json", "--model", str(path), "--cluster", "1x4-v100-pcie",
                                       "-b", "16", "--pp", "3", "--split", "1,1,1", "--dp", "1",
                                       "--micro-batch-size", "1", "--schedule", "gpipe"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.stdout)["plans"][0]["stages"][2]
    assert last["compute_s"] - last["fwd_s"] == 0.0 and last["bwd_input_s"] == 0.0
