"""No command overwrites its own input, writes two outputs to one path, or
leaves part of its files behind: every target is checked before anything
is written (exit 2, one line naming both flags)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pipesearch.cli import main


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("paths") / "plans.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "gpt3-1.3b", "--cluster", "1x8-a100-80gb", "-b", "64",
                                    "--pp", "2", "--schedule", "1f1b", "-o", str(path)])
    assert res.exit_code == 0, res.output
    return path


def _refused(args, needle):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
    return res


def test_export_and_simulate_never_overwrite_the_plan_file(plan_file):
    before = plan_file.read_bytes()
    _refused(["export", str(plan_file), "--format", "torch", "-o", str(plan_file)], "the same file as PLANS")
    _refused(["simulate", str(plan_file), "--torch-csv", str(plan_file)], "give a name ending in .csv")
    _refused(["plot", str(plan_file), "--kind", "stages", "-o", str(plan_file)], "the same file as PLANS.json")
    assert plan_file.read_bytes() == before


def test_a_refused_output_path_is_the_only_line(tmp_path):
    """A plan of PipeDream-named layers makes the torch export warn (its
    layers are no modules of the model); -o onto the plan file itself is
    refused before the export is built: the refusal is the one line on
    stderr, no warning before it."""
    path = tmp_path / "plans.json"
    res = CliRunner().invoke(main, ["plan", "-q", "--model", "vgg16", "--cluster", "1x4-v100-pcie", "-b", "128",
                                    "--top", "1", "-o", str(path)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["export", str(path), "--format", "torch", "-o", str(tmp_path / "x.py")])
    assert res.exit_code == 0 and "warning:" in res.stderr  # the export of this plan warns
    res = _refused(["export", str(path), "--format", "torch", "-o", str(path)], "the same file as PLANS")
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and res.stderr.startswith("error:"), res.stderr


def test_export_files_that_would_replace_the_plan_file_are_refused(plan_file, tmp_path):
    own = tmp_path / "ds_config.json"  # the plan file under the name DeepSpeed's config gets
    own.write_bytes(plan_file.read_bytes())
    _refused(["export", str(own), "--format", "deepspeed", "--files", str(tmp_path)], "the same file as PLANS")
    assert own.read_bytes() == plan_file.read_bytes()


def test_export_files_check_every_target_before_writing_one(plan_file, tmp_path):
    (tmp_path / "partition.py").mkdir()  # DeepSpeed's second file cannot be written
    _refused(["export", str(plan_file), "--format", "deepspeed", "--files", str(tmp_path)], "is a directory")
    assert not (tmp_path / "ds_config.json").exists()


def test_two_outputs_on_one_path_are_refused(plan_file, tmp_path):
    out = tmp_path / "t.png"
    _refused(["simulate", str(plan_file), "--timeline", str(out), "--torch-csv", str(out)],
             "give a name ending in .csv")  # the CSV's name is refused first (a .png)
    _refused(["simulate", str(plan_file), "--torch-csv", "-"], "give a name ending in .csv")  # wrote a file named -
    _refused(["serve", "--model", "qwen3-1.7b", "--cluster", "1x8-l4", "--tp", "1", "--pp", "1",
              "--timeline", str(out), "-o", str(out)], "the same file as -o")
    assert not out.exists()


def test_profile_never_writes_over_the_model_source(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def make():\n    raise AssertionError('never built')\n")
    _refused(["profile", f"{src}:make", "--input-shape", "4", "--batch-size", "2", "-o", str(src)],
             "the same file as MODULE:FACTORY")
    assert "never built" in src.read_text()


def test_a_failed_write_inside_several_outputs_names_the_output_not_its_temporary_file(tmp_path):
    """Several outputs are written to temporary files beside them first; a
    writer that writes atomically itself (the figures) and fails (a full
    disk) named that temporary file (``.space.png.tj8q3tv3.png``): the
    line names the output, and nothing is left beside it."""
    from pipesearch.errors import InputError
    from pipesearch.output import write_output, write_outputs

    def full_disk(path):
        def fail(_):
            raise OSError(28, "No space left on device")
        return write_output(path, fail, "figure")

    with pytest.raises(InputError) as refused:
        write_outputs([(tmp_path / "p.json", lambda f: f.write_text("{}"), "plan file"),
                       (tmp_path / "space.png", full_disk, "figure")])
    assert str(refused.value) == f"figure {tmp_path / 'space.png'}: cannot write (No space left on device)"
    assert list(tmp_path.iterdir()) == []
