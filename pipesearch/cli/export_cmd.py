"""``pipesearch export``: a plan in a runtime's own terms."""

from __future__ import annotations

import json

import click

from ..export import FORMATS, export_plan
from ..output import check_writable, write_text
from ..plan import load_plan_file, select_plan
from . import main


@main.command("export")
@click.argument("plans", type=click.Path(dir_okay=False))
@click.option("--rank", type=click.IntRange(min=1), default=1, show_default=True, help="Which plan of the file.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="Target runtime.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write the export (JSON) here instead of stdout.")
def export_command(plans, rank, fmt, output):
    """Export a plan for torch.distributed.pipelining, torchtitan, Megatron-LM,
    DeepSpeed or GPipe-style runners.

    The exporter checks the runtime's own rules and refuses (exit status 2,
    with the reason) rather than emit something the runtime would silently
    change, e.g. Megatron interleaving when the layers do not divide.

    \b
    Examples:
      pipesearch export plans.json --format torch
      pipesearch export plans.json --rank 2 --format deepspeed -o ds.json
      pipesearch export plans.json --format megatron
    """
    if output is not None:
        check_writable(output, "export (-o)")
    plan = select_plan(load_plan_file(plans), rank, plans)
    text = json.dumps(export_plan(plan, fmt), indent=2) + "\n"
    if output is not None:
        write_text(output, text, "export")
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=False)
