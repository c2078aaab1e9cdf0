"""Sizes on the command line: what pipesearch prints as an option's value
parses back to the same number of bytes."""

from __future__ import annotations

import pytest

from pipesearch.units import format_size_option, parse_size_option


@pytest.mark.parametrize("num_bytes,text", [
    (0, "0"), (2**30, "1GiB"), (1.5 * 2**30, "1.5GiB"), (512 * 2**20, "512MiB"), (3 * 2**40, "3TiB"),
    (1000, "1000B"), (1e9, "1000000000B"), (123456789, "123456789B"), (1023.9999999, "1023.9999999B")])
def test_a_size_prints_as_the_option_that_gives_it_back(num_bytes, text):
    """The largest binary unit it is a short number of, else bytes: 1e9
    bytes is not a short number of MiB (953.674MiB parses to 999,999,668)."""
    assert format_size_option(num_bytes) == text
    assert parse_size_option("--memory-reserve", text) == num_bytes
