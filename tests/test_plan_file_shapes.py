"""A plan file whose recorded cluster or points table has the wrong shape is
refused by every command that reads it (exit 2, the field named), never an
internal error: ``validate``, ``simulate``, ``export`` and ``plot`` load it
through the same checks."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipesearch.cli import main


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes") / "p.json"
    r = CliRunner().invoke(main, ["plan", "-q", "--model", "gnmt", "--cluster", "1x4-v100-pcie", "-b", "64",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def _edited(tmp_path, doc, edit):
    bad = json.loads(json.dumps(doc))
    edit(bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    return path


COMMANDS = (["validate"], ["simulate"], ["export", "--format", "torch"], ["plot", "--kind", "stages", "-o", "x.png"])


@pytest.mark.parametrize("value, field, message", [
    (1, "inputs.cluster.groups", "expected an array, got 1"),
    (True, "inputs.cluster.groups", "expected an array, got true"),
    ([1], "inputs.cluster.groups[0]", "expected an object, got 1"),
])
def test_cluster_groups_of_the_wrong_type(tmp_path, doc, value, field, message):
    """Bug: groups 1 (or 0.5, true) was iterated by the MFU check: TypeError, exit 1, in all four commands."""
    path = _edited(tmp_path, doc, lambda d: d["inputs"]["cluster"].__setitem__("groups", value))
    for cmd in COMMANDS:
        r = CliRunner().invoke(main, [cmd[0], str(path), *cmd[1:]])
        assert r.exit_code == 2 and "internal error" not in r.output, (cmd, r.output)
        assert f"{field}: {message}" in r.output, (cmd, r.output)


def test_device_type_names_must_be_strings(tmp_path, doc):
    """Bug: device_types [null] made ``plot`` join None into its title (exit 1)."""
    path = _edited(tmp_path, doc, lambda d: d["inputs"]["cluster"].__setitem__("device_types", [None]))
    r = CliRunner().invoke(main, ["plot", str(path), "--kind", "stages", "-o", str(tmp_path / "s.png")])
    assert r.exit_code == 2 and "inputs.cluster.device_types[0]: expected a string" in r.output, r.output


@pytest.mark.parametrize("column, what", [("dp", "every point"), ("samples_per_s", "an ok point")])
def test_points_table_nulls_where_a_point_has_a_value(tmp_path, doc, column, what):
    """Bug: ``validate`` passed a points table whose dp (or samples_per_s)
    column was all null, and ``plot --kind space`` then failed converting
    NaN to an integer (exit 1). Every point has its dp; every ok point its
    samples/s; a point whose dp does not divide the batch has no schedule
    (null there is right)."""
    k = doc["search"]["points"]["columns"].index(column)

    def edit(d):
        d["search"]["points"]["values"][k] = [None] * len(d["search"]["points"]["values"][k])

    path = _edited(tmp_path, doc, edit)
    for cmd in (["validate"], ["plot", "--kind", "space", "-o", str(tmp_path / "s.png")]):
        r = CliRunner().invoke(main, [cmd[0], str(path), *cmd[1:]])
        assert r.exit_code == 2 and f"column '{column}' is null: {what} has one" in r.output, (cmd, r.output)


@pytest.mark.parametrize("key, value, message", [
    ("mfu", 0.5, "0.5 found, null expected"),
    ("tokens_per_s", 1000.0, "1000.0 found, null expected"),
    ("memory_capacity_bytes", 0, "0 found, the memory of one of the plan's devices expected (1.71799e+10 B)"),
])
def test_recorded_figures_a_layer_profile_plan_cannot_have(tmp_path, doc, key, value, message):
    """GNMT (a layer profile: no tokens, no model FLOPs) on four 16 GiB V100s:
    its MFU and tokens/s are null, and its memory capacity is a V100's 16
    GiB = 17,179,869,184 B. Bug: MFU 0.5, tokens/s 1000 and a capacity of 0
    (below the plan's peak) passed ``validate``."""
    path = _edited(tmp_path, doc, lambda d: d["plans"][0]["predicted"].__setitem__(key, value))
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 2 and f"plans[0].predicted.{key}: {message}" in r.output, r.output


def test_an_edited_embedded_export_is_named_by_validate(tmp_path, doc):
    """The plan file's ``exports`` are what ``pipesearch export`` writes for
    each plan (the README calls them runnable as written): validate
    re-exports each plan and names the first field that differs (an edited
    micro-batch count passed); ``export`` writes its own, from the plan."""
    m = doc["plans"][0]["schedule"]["num_micro_batches"]
    path = _edited(tmp_path, doc, lambda d: d["plans"][0]["exports"]["torch"].__setitem__("n_microbatches", m + 1))
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 2, r.output
    # a count reads as one (it read "5.0 found, 4.0 expected")
    assert f"plans[0].exports.torch.n_microbatches: {m + 1} found, {m} expected" in r.output, r.output
    r = CliRunner().invoke(main, ["export", str(path), "--format", "torch"])
    assert r.exit_code == 0 and json.loads(r.stdout)["n_microbatches"] == m, r.output


def test_an_edited_export_file_is_named_by_its_line(tmp_path, doc):
    """An edited line of an embedded script was reported as two JSON strings
    cut at 80 characters, the same prefix found and expected; validate now
    names the file's first line that differs and shows both versions of it.
    A list that lost an element names the first one missing."""
    text = doc["plans"][0]["exports"]["torch"]["files"]["pipeline_torch.py"]
    lines = text.splitlines()
    k = next(i for i, x in enumerate(lines) if x.startswith("N_MICROBATCHES, MICROBATCH_SIZE = "))
    edited = "\n".join(lines[:k] + ["N_MICROBATCHES, MICROBATCH_SIZE = 999, 1"] + lines[k + 1:]) + "\n"

    def edit(d):
        d["plans"][0]["exports"]["torch"]["files"]["pipeline_torch.py"] = edited

    r = CliRunner().invoke(main, ["validate", str(_edited(tmp_path, doc, edit))])
    assert r.exit_code == 2, r.output
    i = next(j for j, (x, y) in enumerate(zip("N_MICROBATCHES, MICROBATCH_SIZE = 999, 1", lines[k])) if x != y)
    assert (f'plans[0].exports.torch.files.pipeline_torch.py line {k + 1}, character {i + 1}: '
            f'"N_MICROBATCHES, MICROBATCH_SIZE = 999, 1" found, {json.dumps(lines[k])} expected') in r.output, r.output
    # an edit late in a long line shows the text around it (both were cut to one 80-character prefix), and a
    # dropped last newline is a difference of its own (the lines compared equal)
    long = next(j for j, x in enumerate(lines) if len(x) > 120)
    swapped = lines[long][:-3] + lines[long][-1] + lines[long][-2:-1] + lines[long][-3]
    assert swapped != lines[long]

    def edit_long(d):
        d["plans"][0]["exports"]["torch"]["files"]["pipeline_torch.py"] = "\n".join(
            lines[:long] + [swapped] + lines[long + 1:]) + "\n"

    r = CliRunner().invoke(main, ["validate", str(_edited(tmp_path, doc, edit_long))])
    assert f"line {long + 1}, character" in r.output and swapped[-20:] in r.output and '"...' in r.output, r.output
    r = CliRunner().invoke(main, ["validate", str(_edited(tmp_path, doc, lambda d: d["plans"][0]["exports"]["torch"][
        "files"].__setitem__("pipeline_torch.py", text.rstrip("\n"))))])
    assert "(end of text) found" in r.output, r.output
    notes = doc["plans"][0]["exports"]["torch"]["notes"]
    r = CliRunner().invoke(main, ["validate", str(_edited(
        tmp_path, doc, lambda d: d["plans"][0]["exports"]["torch"].__setitem__("notes", notes[:-1])))])
    assert f"plans[0].exports.torch.notes[{len(notes) - 1}]: (missing) found" in r.output, r.output


@pytest.mark.parametrize("column, value", [("pp", 131072), ("tp", 1000)])
def test_a_point_larger_than_the_cluster_is_named(tmp_path, doc, column, value):
    """A point of pp 131072 (or tp 1000) on a 4-device cluster passed
    validate, and the space figure drew a row of it."""
    k = doc["search"]["points"]["columns"].index(column)
    path = _edited(tmp_path, doc, lambda d: d["search"]["points"]["values"][k].__setitem__(0, value))
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 2 and "search.points.values[" in r.output, r.output
    assert (f"pp {value} x" if column == "pp" else "x tp 1000 =") in r.output, r.output
    assert "but the cluster (inputs.cluster.devices) has 4" in r.output, r.output
