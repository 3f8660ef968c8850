"""Sizes and rates on the command line."""

from __future__ import annotations

import pytest
from memplan.traces.errors import MemplanError

from memplan.units import format_bytes, parse_rate, parse_size


def test_sizes_by_hand():
    assert parse_size("8GiB") == 8 * 2**30
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("1.5G") == 3 * 2**29
    assert parse_size("4096") == 4096


def test_rates_by_hand():
    assert parse_rate("1.5GB/s") == 1.5e9
    assert parse_rate("500MiB/s") == 500 * 2**20
    assert parse_rate("2e9") == 2e9


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fast", "--bandwidth='fast': expected a rate such as 1.5GB/s, 500MiB/s or 2e9 (bytes/s)"),
        ("3 parsecs/s", "expected a rate such as"),
        ("0GB/s", "--bandwidth='0GB/s' must be > 0"),
    ],
)
def test_bad_rates_name_what_and_how(text, message):
    with pytest.raises(MemplanError) as e:
        parse_rate(text, "--bandwidth")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_sizes_say_size():
    with pytest.raises(MemplanError, match="expected a size such as 8GiB"):
        parse_size("lots", "--budget")


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**29) == "1.50 GiB"
