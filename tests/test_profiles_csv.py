"""Profile CSV reader/writer: exact values, every validation error, round trip."""

from __future__ import annotations

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
        (HEAD + COLS, ["line 2", "no layers"]),
        (HEAD, ["no layers"]),
        (COLS + "x,1,2,3,4\n", ["batch_size", "missing"]),
        ("# batch_size: 0\n" + COLS + "x,1,2,3,4\n", ["line 1", "'0'", "positive integer"]),
        ("# batch_size: -4\n" + COLS + "x,1,2,3,4\n", ["line 1", "'-4'"]),
        ("# batch_size: 1.5\n" + COLS + "x,1,2,3,4\n", ["line 1", "'1.5'"]),
        ("# batch_size: many\n" + COLS + "x,1,2,3,4\n", ["line 1", "'many'"]),
        ("# batch_size: 4\n# batch_size: 8\n" + COLS + "x,1,2,3,4\n", ["lines 1, 2", "batch_size"]),
        ("# batch_size: 4\n# bytes_per_param: 0\n" + COLS + "x,1,2,3,4\n", ["line 2", "bytes_per_param"]),
        ("# batch_size: 4\n# batchsize: 8\n" + COLS + "x,1,2,3,4\n", ["line 2", "'batchsize'"]),
        (HEAD + "name,fwd_ms,bwd_ms,param_bytes,output_bytes,bwd_input_ms\nx,1,2,3,4,2.5\n",
         ["line 3", "'bwd_input_ms'", "'2.5'", "'2'"]),
        (HEAD + "name,fwd_ms,bwd_ms,param_bytes,output_bytes,flops\nx,1,2,3,4,5\n", ["line 2", "'flops'"]),
        (HEAD + COLS + "x,1,2,3,4,5\n", ["line 3", "6 fields", "expected 5"]),
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
# times are 0 or at least 1 ns (pipesearch.limits.MIN_LAYER_S)
_time = st.one_of(st.just(0.0), st.floats(min_value=1e-9, max_value=1e4, allow_nan=False, allow_infinity=False))


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
    return ModelProfile(
        name=draw(_name), layers=tuple(layers),
        profiled_batch_size=draw(st.integers(min_value=1, max_value=1 << 20)),
        profiled_device=draw(_name),
        bytes_per_param=draw(st.floats(min_value=0.125, max_value=16, allow_nan=False)),
        source=source,
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
