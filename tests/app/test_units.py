"""Sizes and rates on the command line."""

from __future__ import annotations

import argparse

import pytest
from memplan.traces.errors import MemplanError

from memplan.units import format_bytes, integer, number, parse_rate, parse_size


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
        ("fast", "--bandwidth='fast': expected a rate such as 1.5GB/s, 500MiB/s or 2e9 (bytes/s"),
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


# ---- issue 17: units required, finite, ranged; sizes and rates told apart ----
@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1B", 1),
        ("1.5GiB", 3 * 2**29),  # 1.5 x 2^30
        ("0.5KiB", 512),
        ("2.5KB", 2500),
        ("1024TiB", 2**50),  # the largest size: 2^10 x 2^40
        (" 64 MiB ", 64 * 2**20),
    ],
)
def test_sizes_with_units_by_hand(text, nbytes):
    assert parse_size(text, "--budget") == nbytes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.5", "give a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 1.5GiB"),
        ("1e9", "give a unit"),  # not whole bytes written out
        ("1e400", "give a unit"),
        ("1e400GiB", "expected a finite number"),
        ("0.5B", "bytes must be a whole number"),
        ("0", "must be > 0"),
        ("0.0001KiB", "at least 1 byte"),  # 0.1024 bytes rounds to 0
        ("1025TiB", "more than 1125899906842624 bytes"),
        ("9" * 41, "too large a number"),
        ("5GiB/s", "expected a size, not a rate (5GiB)"),
        ("-1GiB", "expected a size such as"),
        ("nan", "expected a size such as"),
        ("", "expected a size such as"),
    ],
)
def test_bad_sizes_are_one_line_naming_the_option(text, message):
    with pytest.raises(MemplanError) as e:
        parse_size(text, "--budget")
    assert message in str(e.value) and "--budget" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5GiB", "a size, not a rate; did you mean 5GiB/s?"),
        ("512MB", "did you mean 512MB/s?"),
        ("5", "expected a rate from 1e+06 to 1e+14 bytes/s"),  # 5 B/s: below 1 MB/s
        ("200TB/s", "expected a rate from"),  # 2e14 > 1e14
        ("1e400", "expected a finite number"),
        ("inf", "expected a rate such as"),
    ],
)
def test_rates_are_not_sizes_and_stay_in_range(text, message):
    with pytest.raises(MemplanError) as e:
        parse_rate(text, "--bandwidth")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_rate_range_ends_are_inclusive():
    assert parse_rate("1MB/s") == 1e6
    assert parse_rate("100TB/s") == 1e14


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (number(0, 10), "0", 0.0),
        (number(0, 10), "10", 10.0),
        (number(0, 10), "2.5e0", 2.5),
        (integer(1, 64), "64", 64),
        (integer(-3, 3), "-3", -3),
    ],
)
def test_argument_types_accept_their_range(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (number(0, 10), "nan", "finite number in [0, 10]"),
        (number(0, 10), "inf", "finite number in [0, 10]"),
        (number(0, 10), "-inf", "finite number in [0, 10]"),
        (number(0, 10), "1e400", "finite number in [0, 10]"),
        (number(0, 10), "10.5", "finite number in [0, 10]"),
        (number(0, 10, lo_open=True), "0", "finite number in (0, 10]"),
        (number(0, 10), "ten", "expected a number, got 'ten'"),
        (number(0, 10), "1" * 5000, "finite number in [0, 10]"),
        (integer(1, 64), "65", "whole number in [1, 64]"),
        (integer(1, 64), "1.0", "expected a whole number, got '1.0'"),
        (integer(1, 64), "", "expected a whole number"),
        (integer(1, 64), "\u0663", "expected a whole number"),  # an Arabic-Indic 3
        (integer(1, 64), "9" * 5000, "expected a whole number"),
    ],
)
def test_argument_types_refuse_in_one_line(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        parse(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_size_may_be_zero_where_the_caller_allows_it():
    # --context-reserve 0 is "no context"; everywhere else a size is >= 1 byte
    for text in ("0", "0B", "0MiB", "0.0GiB"):
        assert parse_size(text, "--context-reserve", least=0) == 0
    assert parse_size("1KiB", "x", least=0) == 1024
    with pytest.raises(MemplanError, match=r"x='0' must be > 0"):
        parse_size("0", "x")
    with pytest.raises(MemplanError, match="expected a size"):
        parse_size("-1", "x", least=0)
