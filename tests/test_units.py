"""Sizes on the command line: what pipesearch prints as an option's value
parses back to the same number of bytes."""

from __future__ import annotations

import pytest

from pipesearch.errors import InputError
from pipesearch.units import format_size_option, parse_size_option


@pytest.mark.parametrize("num_bytes,text", [
    (0, "0"), (2**30, "1GiB"), (1.5 * 2**30, "1.5GiB"), (512 * 2**20, "512MiB"), (3 * 2**40, "3TiB"),
    (1000, "1KB"), (1e9, "1GB"), (2e9, "2GB"), (1.5e9, "1.5GB"), (123456789, "123456789B"),
    (1023.9999999, "1023.9999999B")])
def test_a_size_prints_as_the_option_that_gives_it_back(num_bytes, text):
    """The largest binary unit it is a short number of, then the largest
    decimal one (``--memory-reserve 2GB`` is echoed as typed, not as
    2000000000B), else bytes: 1e9 bytes is not a short number of MiB
    (953.674MiB parses to 999,999,668), 123456789 not of MB (123.457MB)."""
    assert format_size_option(num_bytes) == text
    assert parse_size_option("--memory-reserve", text) == num_bytes


@pytest.mark.parametrize("text,fix", [("8Gb", "write 8GB or 8GiB"), ("512Mb", "write 512MB or 512MiB"),
                                      ("1.5Tb", "write 1.5TB or 1.5TiB"), ("8Gib", "write 8GiB")])
def test_a_size_in_bits_is_refused_not_read_as_bytes(text, fix):
    """``8Gb`` (gigabits, as link speeds are written) was read as 8 GB,
    eight times the bytes meant; it is refused with the byte spellings."""
    with pytest.raises(InputError, match=f"--memory-reserve '{text}': .*bits; a size is in bytes: {fix}$"):
        parse_size_option("--memory-reserve", text)


@pytest.mark.parametrize("text,num_bytes", [("8GB", 8e9), ("8gb", 8e9), ("8GiB", 8 * 2**30), ("1kb", 1e3)])
def test_byte_units_in_any_case_still_parse(text, num_bytes):
    assert parse_size_option("--memory-reserve", text) == num_bytes
