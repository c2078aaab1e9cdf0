"""The ``pipesearch`` command line: a click group, one module per command.

Exit status: 0 success; 1 an unexpected internal error (a bug: please report
it with the traceback shown by ``PIPESEARCH_DEBUG=1``); 2 bad input or an
impossible request (one line on stderr naming the file, field and value).
"""

from __future__ import annotations

import os
import sys

import click

from .. import __version__
from ..errors import PipesearchError


class _Group(click.Group):
    """Maps pipesearch errors and command-line usage errors to one line on
    stderr and exit status 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} -h`)" if ctx is not None else ""
            click.echo(f"error: {' '.join(exc.format_message().split())}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PipesearchError as exc:
            if os.environ.get("PIPESEARCH_DEBUG"):
                raise
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except MemoryError as exc:  # a resource limit, not a bug: say how large and what to change
            if os.environ.get("PIPESEARCH_DEBUG"):
                raise
            detail = " ".join(str(exc).split()) or "an allocation failed"
            click.echo(f"error: out of memory ({detail}); the input is too large for this machine: use a smaller "
                       "model or cluster, or lower `pipesearch plan --max-search-memory` to refuse it up front",
                       err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(version=__version__, prog_name="pipesearch")
def main():
    """pipesearch: exact search for pipeline-parallel training (and serving) plans.

    \b
    Quick start (built-in default model and cluster):
      pipesearch plan
    Your own model and cluster:
      pipesearch plan --model profile.csv --cluster cluster.toml -o plans.json
    Serving an LLM (tp x pp, layer split, vLLM / SGLang commands):
      pipesearch serve --model llama3-70b --cluster 1x8-l4 --weight-dtype fp8
    """


def _register():
    from . import catalog_cmd, plan_cmd, validate_cmd  # noqa: F401  (commands register themselves)

    for optional in ("simulate_cmd", "export_cmd", "plot_cmd", "profile_cmd", "serve_cmd"):
        try:
            __import__(f"{__name__}.{optional}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{optional}":
                raise


_register()
