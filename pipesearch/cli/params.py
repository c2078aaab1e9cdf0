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
