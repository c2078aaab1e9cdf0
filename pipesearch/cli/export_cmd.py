"""``pipesearch export``: a plan in a runtime's own terms."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import InputError, PlanFormatError
from ..export import DESCRIPTION_FORMATS, FORMATS, export_plan
from ..output import check_directory, check_distinct_paths, check_writable, print_whole, write_outputs
from ..plan import read_plan_file, select_plan
from . import main
from .validate_cmd import plan_file_problems, warn_missing_digests


def _executable_if_script(path: Path) -> None:
    """A launch script written (``.sh``) made executable, as the runtimes'
    own scripts are (``-o`` and ``--files`` alike)."""
    if path.suffix.lower() == ".sh" and path.is_file():
        path.chmod(path.stat().st_mode | 0o111)


def _output_text(export: dict, fmt: str, output: str) -> str:
    """What ``-o FILE`` holds, chosen by the file's suffix.

    ``.json``: the export (:func:`_export_text`). Any other suffix: the one file of the
    export's ``files`` with that suffix (``.sh``: the launch script of
    torchtitan or Megatron-LM; ``.py``: DeepSpeed's partition recipe).

    Raises:
        InputError: a suffix the export has no file for (e.g. ``.toml``:
            torchtitan 0.3.0 reads no TOML; 0.2.x exports have one), naming
            the suffixes it has.
    """
    suffix = Path(output).suffix.lower()
    if suffix == ".json":
        files = export.get("files") or {}
        # a file named like the runtime's own JSON file gets that file (ds_config.json, in any case), any other
        # the export
        name = Path(output).name.lower()
        own = next((body for f, body in files.items() if f.lower() == name), None)
        return own if own is not None else _export_text(export)
    matches = [name for name in (export.get("files") or {}) if Path(name).suffix.lower() == suffix]
    if len(matches) == 1:
        return export["files"][matches[0]]
    have = sorted({".json", *(Path(n).suffix for n in (export.get("files") or {}))})
    why = (" (torchtitan 0.3.0 reads no TOML: its jobs are --module/--config plus --section.key overrides; "
           "--torchtitan-version 0.2 writes the job TOML of the releases that read one)") \
        if suffix == ".toml" and fmt == "torchtitan" else ""
    more = ", or --files DIR for all of them" if export.get("files") else " (the export itself)"
    raise InputError(f"export -o {output}: a {fmt} export has no {suffix or 'suffix-less'} file{why}; "
                     f"use one of {', '.join(have)}{more}")


def _companion_note(export: dict, output: str | None, files_dir) -> str | None:
    """The note of ``-o`` writing one of two files that go together: a
    torchtitan 0.2 launch script reads the job file by its name beside it
    (``torchtitan.toml``, or ``$CONFIG_FILE``), so a job file written under
    another name, or a script written alone, is told how the two meet
    (``--files DIR`` writes both). None otherwise."""
    from ..export.torchtitan_toml import TOML_FILE

    if output is None or files_dir or TOML_FILE not in (export.get("files") or {}):
        return None
    path = Path(output)
    if path.suffix.lower() == ".toml" and path.name != TOML_FILE:
        return (f"note: the launch script (-o launch.sh) reads {TOML_FILE} beside it: name this file {TOML_FILE}, "
                f"or run the script with CONFIG_FILE={output}")
    if path.suffix.lower() == ".sh":
        return (f"note: {output} reads the job file {TOML_FILE} beside it (-o {TOML_FILE}), or the one "
                "$CONFIG_FILE names")
    return None


def _export_text(export: dict) -> str:
    """The JSON an export prints or writes to ``-o FILE.json``: the export
    object, or, when its one file is a JSON document (stages-json's
    ``stages.json``), that document (valid against its own schema, without
    the export's ``files`` around it)."""
    files = export.get("files") or {}
    if len(files) == 1 and Path(next(iter(files))).suffix.lower() == ".json":
        return next(iter(files.values()))
    return json.dumps(export, indent=2) + "\n"


def read_module_names(path: str) -> dict:
    """``--module-names``: a JSON object of layer name -> module name (a
    non-empty string) or a list of them.

    Raises:
        InputError: an unreadable file, bad JSON, or another shape, naming
            the file and the first offending entry.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"--module-names {path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"--module-names {path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not doc:
        raise InputError(f"--module-names {path}: expected a JSON object of layer name -> module name, e.g. "
                         '{"b01_Conv2d": "features.0"}')
    for key, value in doc.items():
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
            raise InputError(f"--module-names {path}: {key!r}: {json.dumps(value)}; expected a module name or a "
                             "non-empty list of them")
    return doc


#: the formats whose export reads --module-names (the others name or index layers their own way)
MODULE_NAME_FORMATS = ("torch", "torchtitan")
_NAMES_UNUSED = {"megatron": "builds Megatron-LM's own modules", "deepspeed": "indexes layers by position",
                 "gpipe": "splits the nn.Sequential by child position",
                 "stages-json": "names stages by the plan's layer names"}


@main.command("export")
@click.argument("plans", type=click.Path(dir_okay=False))
@click.option("--rank", type=click.IntRange(min=1), default=1, show_default=True, help="Which plan of the file.")
@click.option("--format", "fmt", type=click.Choice(FORMATS + DESCRIPTION_FORMATS), required=True,
              help="Target runtime (stages-json: a runtime-neutral per-stage description).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write here instead of stdout: .json the whole export (ds_config.json: DeepSpeed's config), "
                   ".sh the launch script, .py the Python file (torch: pipeline_torch.py; DeepSpeed: its partition "
                   "recipe), .toml torchtitan 0.2's job file.")
@click.option("--torchtitan-version", help="torchtitan release to target (with --format torchtitan): 0.3.0 "
              "(default: --module/--config plus overrides) or 0.2 / 0.2.0 .. 0.2.2 (a job TOML, -o torchtitan.toml).")
@click.option("--files", "files_dir", type=click.Path(file_okay=False),
              help="Write the runtime's own files (launch script, ds_config.json, ...) into this directory "
                   "(created if its parent exists); without -o nothing else is printed.")
@click.option("--module-names", "module_names_file", type=click.Path(dir_okay=False),
              help="A JSON file mapping the plan's layer names to your model's module names (one name, or a list "
                   "in execution order), e.g. {\"b01_Conv2d\": \"features.0\"}: for torch and torchtitan, when "
                   "the profile named its layers otherwise than the model's modules (PipeDream, a CSV).")
def export_command(plans, rank, fmt, output, torchtitan_version, files_dir, module_names_file):
    """Export a plan for torch.distributed.pipelining, torchtitan, Megatron-LM,
    DeepSpeed or GPipe-style runners.

    The exporter checks the runtime's own rules and refuses (exit status 2,
    with the reason) rather than emit something the runtime would silently
    change, e.g. Megatron interleaving when the layers do not divide.

    \b
    Examples:
      pipesearch export plans.json --format torch
      pipesearch export plans.json --format torchtitan -o launch.sh
      pipesearch export plans.json --format torchtitan --torchtitan-version 0.2 -o torchtitan.toml
      pipesearch export plans.json --rank 2 --format deepspeed -o ds_config.json
      pipesearch export plans.json --format megatron --files megatron/
    """
    if output is not None:
        check_writable(output, "export (-o)")
        check_distinct_paths([("-o", output)], {"PLANS": plans})  # (said before any warning of the export)
    if files_dir is not None and not str(files_dir).strip():
        raise InputError("export --files: empty directory name; give the directory to write the files into")
    if files_dir:
        check_directory(files_dir, "export --files")
    if torchtitan_version is not None and fmt != "torchtitan":
        raise InputError(f"export --torchtitan-version {torchtitan_version}: only with --format torchtitan "
                         f"(not {fmt})")
    if torchtitan_version is not None:  # an option's value, not the plan's: said before the plan is read
        from ..export.torchtitan import check_torchtitan_version

        check_torchtitan_version(torchtitan_version, "export --torchtitan-version")
    if module_names_file is not None and fmt not in MODULE_NAME_FORMATS:  # an option's value: before the plan
        unused = _NAMES_UNUSED.get(fmt, "reads none")
        raise InputError(f"export --module-names {module_names_file}: only with --format "
                         f"{' or '.join(MODULE_NAME_FORMATS)} (the {fmt} export {unused})")
    module_names = read_module_names(module_names_file) if module_names_file is not None else None
    doc, plan_file = read_plan_file(plans)
    problems = plan_file_problems(doc)  # every check validate runs
    if problems:
        raise PlanFormatError(f"{plans}: {len(problems)} problem(s), the first: {problems[0]} "
                              f"(pipesearch validate {plans} lists them)")
    warn_missing_digests(plans, doc)
    plan = select_plan(plan_file, rank, plans)
    options = {"torchtitan_version": torchtitan_version} if torchtitan_version is not None else {}
    try:
        export = export_plan(plan, fmt, inputs=plan_file.inputs, module_names=module_names, **options)
    except InputError as exc:  # the runtime's refusal, named by file and plan
        raise InputError(f"{plans}: plan of rank {rank}: {exc}") from None
    text = _output_text(export, fmt, output) if output is not None else _export_text(export)
    if files_dir and not export.get("files"):
        why = next((n for n in export.get("notes", []) if n.startswith("no ")), "this runtime reads no file of ours")
        raise InputError(f"export --files {files_dir}: the {fmt} export of plan {rank} has no files ({why.rstrip('.')}); "
                         f"-o FILE.json writes the export")
    # everything is computed, and every target checked, before anything is written (or warned)
    targets = [Path(files_dir) / name for name in (export.get("files") or {})] if files_dir else []
    for path in targets:
        if path.exists() or path.parent.is_dir():  # (the directory itself is made below)
            check_writable(path, "export --files")
    check_distinct_paths([("-o", output)] + [("--files", path) for path in targets], {"PLANS": plans})
    for note in export.get("notes", []) if (output is not None or files_dir) else ():  # else in the JSON printed
        if isinstance(note, str) and note.startswith("warning:"):
            click.echo(note, err=True)
    # the files and -o together, all or none (output.write_outputs)
    outputs = [(path, lambda f, body=body: f.write_text(body), "export --files")
               for path, body in zip(targets, (export.get("files") or {}).values())]
    if output is not None:
        outputs.append((Path(output), lambda f: f.write_text(text), "export"))
    if outputs:
        for path in write_outputs(outputs, directory=files_dir or None):
            _executable_if_script(path)
            click.echo(f"wrote {path}")
        note = _companion_note(export, output, files_dir)
        if note:
            click.echo(note, err=True)
    else:
        print_whole(text)
