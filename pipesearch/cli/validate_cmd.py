"""``pipesearch validate``: check a plan file against the schema and the
semantic rules; list every problem."""

from __future__ import annotations

import click

from ..errors import PlanFormatError
from ..plan import document_problems, parse_document, read_plan_text
from . import main


@main.command("validate")
@click.argument("plans", metavar="PLANS.json", type=click.Path(dir_okay=False))
def validate_command(plans):
    """Check a plan file: the JSON Schema of pipesearch.plan/1 (shipped in the
    package) and the rules a schema cannot express (stages cover exactly the
    model's layers, devices exist and serve one pipeline slot, pp x dp x tp
    fits the cluster, micro-batch size x count x dp is the global batch).

    Prints one line per problem on stdout and exits with status 2 when there
    is any; prints a summary and exits 0 when the file is valid.

    \b
    Examples:
      pipesearch plan -o plans.json
      pipesearch validate plans.json
    """
    doc = parse_document(read_plan_text(plans), plans)
    problems = document_problems(doc)
    if problems:
        for problem in problems:
            click.echo(f"{plans}: {problem}")
        raise PlanFormatError(f"{plans}: {len(problems)} problem(s), the first: {problems[0]}")
    n = len(doc["plans"])
    click.echo(f"{plans}: valid {doc['schema']} file, {n} plan{'s' if n != 1 else ''} "
               f"({doc['inputs']['model']['name']} on {doc['inputs']['cluster']['name']})")
