"""The ``pipesearch`` command line: a click group, one module per command.

Exit status: 0 success; 1 an unexpected internal error (a bug: please report
it with the traceback shown by ``PIPESEARCH_DEBUG=1``); 2 bad input or an
impossible request (one line on stderr naming the file, field and value).
"""

from __future__ import annotations

import importlib
import io
import os
import sys

import click

from .. import __version__
from ..errors import PipesearchError


#: command -> (module under pipesearch.cli that registers it, its one-line help). A command's module
#: (and what it imports: numpy, pandas, the search) loads only when that command runs or shows its help, so
#: ``pipesearch --help`` costs click and nothing else; tests/test_cli_startup.py checks that each line
#: equals the command's own docstring.
COMMANDS: dict[str, tuple[str, str]] = {
    "catalog": ("catalog_cmd", "List and show the built-in models and hardware."),
    "export": ("export_cmd", "Export a plan for torch.distributed.pipelining, torchtitan, Megatron-LM, DeepSpeed "
                             "or GPipe-style runners."),
    "plan": ("plan_cmd", "Search pipeline plans for a model on a cluster and rank them."),
    "plot": ("plot_cmd", "Draw a figure of a plan file written by `pipesearch plan -o`."),
    "profile": ("profile_cmd", "Profile a PyTorch model on this machine (CPU, or a CUDA GPU), one layer at a time."),
    "serve": ("serve_cmd", "Plan tensor- and pipeline-parallel LLM serving: ranked plans with the layer split, "
                           "per-stage weights and KV capacity, the batch that fits, and predicted output tokens/s, "
                           "TTFT and TPOT; the best are simulated request by request; each plan carries its vLLM "
                           "and SGLang command."),
    "simulate": ("simulate_cmd", "Replay a plan's schedule in the discrete-event simulator."),
    "validate": ("validate_cmd", "Check a plan file: the JSON Schema of pipesearch.plan/1 (shipped in the package) "
                                 "and the rules a schema cannot express (stages cover exactly the model's layers, "
                                 "devices exist and serve one pipeline slot, pp x dp x tp fits the cluster, "
                                 "micro-batch size x count x dp is the global batch)."),
}


class _Group(click.Group):
    """Loads each command's module on first use (:data:`COMMANDS`); maps
    pipesearch errors and command-line usage errors to one line on stderr and
    exit status 2."""

    def list_commands(self, ctx):
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx, name):
        if name not in self.commands and name in COMMANDS:
            try:
                importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")  # registers itself on ``main``
            except ModuleNotFoundError as exc:  # an optional command whose module is absent
                if exc.name != f"{__name__}.{COMMANDS[name][0]}":
                    raise
        return self.commands.get(name)

    def resolve_command(self, ctx, args):
        name = click.utils.make_str(args[0]) if args else ""
        if args and self.get_command(ctx, name) is None and not ctx.resilient_parsing and not name.startswith("-"):
            # click suggests close names from the commands loaded so far; offer every command
            raise click.exceptions.NoSuchCommand(name, possibilities=self.list_commands(ctx), ctx=ctx)
        cmd_name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not ctx.resilient_parsing:
            repeated = repeated_option(cmd.get_params(ctx), rest)
            if repeated:
                raise click.UsageError(f"{repeated} (see `{ctx.command_path} {cmd_name} -h`)")
        return cmd_name, cmd, rest

    def format_commands(self, ctx, formatter):
        """The command list from :data:`COMMANDS`, as click writes it, without importing the commands."""
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = []
        for name in self.list_commands(ctx):
            if name in self.commands:
                if self.commands[name].hidden:
                    continue
                text = self.commands[name].get_short_help_str(limit)
            else:
                text = click.utils.make_default_short_help(COMMANDS[name][1], limit)
            rows.append((name, text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        # a console that cannot encode a name (a model called 模型 on cp1252) shows it escaped, as stderr does
        if isinstance(sys.stdout, io.TextIOWrapper):
            sys.stdout.reconfigure(errors="backslashreplace")
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} -h`)" if ctx is not None else ""
            click.echo(f"error: {error_line(' '.join(exc.format_message().split()))}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort): 128 + SIGINT, as shells report it
            click.echo("aborted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PipesearchError as exc:
            if os.environ.get("PIPESEARCH_DEBUG"):
                raise
            click.echo(f"error: {error_line(str(exc))}", err=True)
            sys.exit(2)
        except MemoryError as exc:  # a resource limit, not a bug: say how large and what to change
            if os.environ.get("PIPESEARCH_DEBUG"):
                raise
            detail = " ".join(str(exc).split()) or "an allocation failed"
            click.echo(f"error: out of memory ({detail}); the input is too large for this machine: use a smaller "
                       "model or cluster, or lower `pipesearch plan --max-search-memory` to refuse it up front",
                       err=True)
            sys.exit(2)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own: usage errors (exit 2), --help and --version, Ctrl-C
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)  # 128 + SIGPIPE
        except Exception as exc:  # a bug: one line, the traceback on request (README, exit status 1)
            if os.environ.get("PIPESEARCH_DEBUG"):
                raise
            if isinstance(exc, OSError) and exc.filename is None and exc.strerror:  # standard output cannot be
                click.echo(f"error: cannot write the output ({exc.strerror})", err=True)  # written (a full disk)
                sys.exit(2)
            detail = " ".join(str(exc).split())[:300]
            click.echo(f"internal error: {type(exc).__name__}: {detail} (a bug in pipesearch: please report it with "
                       "the traceback that PIPESEARCH_DEBUG=1 shows)", err=True)
            sys.exit(1)


def repeated_option(params, args) -> str | None:
    """The refusal of a single-valued option given more than once with
    different values in ``args`` (click keeps the last value silently:
    ``--pp 2 --pp 4`` planned pp 4; a flag and its ``--no-`` form alike), or
    None. ``params``: the command's click parameters; options
    that collect their values (``multiple``, ``count``) may repeat. Reads
    ``--name value``, ``--name=value``, ``-x value``, ``-xvalue`` and
    grouped flags (``-qo FILE``), up to ``--``."""
    def as_read(opt, text: str):  # as the option reads it (100 and 100.0 alike), else as written
        try:
            return opt.type.convert(text, opt, None)
        except Exception:  # a value the option refuses: click says so after this check
            return text

    by_opt = {o: p for p in params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
    seen: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        token = str(args[i])
        i += 1
        if token == "--":
            break
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            found = [(name, eq, value)]
        elif token.startswith("-") and len(token) > 1:
            found, k = [], 1
            while k < len(token):
                opt = by_opt.get("-" + token[k])
                if opt is None or opt.is_flag or opt.count:
                    found.append(("-" + token[k], "", ""))
                    k += 1
                    continue
                rest = token[k + 1:]
                found.append(("-" + token[k], "=" if rest else "", rest))
                break
        else:
            continue
        for name, eq, value in found:
            opt = by_opt.get(name)
            if opt is None:
                continue
            if not (opt.is_flag or opt.count) and not eq and i < len(args):  # its value is the next word
                value = str(args[i])
                i += 1
            if opt.multiple or opt.count:
                continue
            seen.setdefault(opt.name, []).append(name if opt.is_flag else value)
    for opt_name, values in seen.items():
        opt = next(p for p in params if isinstance(p, click.Option) and p.name == opt_name)
        if len({v in opt.secondary_opts for v in values} if opt.is_flag else {as_read(opt, v) for v in values}) > 1:
            return f"{max(opt.opts, key=len)} given {len(values)} times ({', '.join(values)}); give it once"
    return None


#: characters of an error line kept from its start and from its end when it
#: is longer than their sum (an echoed input value of any length stays readable)
ERROR_HEAD, ERROR_TAIL = 600, 300


def error_line(text: str) -> str:
    """An error message as one line of bounded length: line breaks (a path
    that holds one) written as ``\\n``, and a message longer than
    ``ERROR_HEAD + ERROR_TAIL`` characters cut in the middle (its start names
    the file and field, its end the fix)."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if len(text) > ERROR_HEAD + ERROR_TAIL:
        cut = len(text) - ERROR_HEAD - ERROR_TAIL
        text = f"{text[:ERROR_HEAD]} [... {cut:,} characters ...] {text[-ERROR_TAIL:]}"
    return text


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

