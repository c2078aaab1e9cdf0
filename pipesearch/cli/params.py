"""Option types shared by the commands.

click's ``FloatRange`` lets ``nan`` through (every comparison with it is
false) and ``inf`` through an open upper end; a number option here is a
finite real number in its range, or the command is refused naming the
option and the value.
"""

from __future__ import annotations

import math

import click


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``±inf``."""

    name = "float range"

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def option_given(ctx: click.Context, name: str) -> bool:
    """Whether the user gave option ``name`` (a parameter name), rather than
    it taking its default: a flag whose effect another option cancels is
    refused only when given."""
    return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
