"""Human sizes, rates and numbers on the command line: `8GiB`, `512MB`,
`2GB/s`, whole bytes; finite, ranged numbers for every other option."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from memplan.traces.errors import MemplanError

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}
UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_MAX_DIGITS = 40  # longer numbers are refused before Python converts them

# NOTE [ Sanity ranges ]
# A size or rate on the command line is a figure of real hardware, so it must
# be finite and inside a range no real machine leaves: sizes from 1 byte to
# 1 PiB (2**50 B, well above any device or host memory), rates from 1 MB/s
# (slower copies would make a replay run for hours) to 100 TB/s (far above any
# link). A plain number is taken as whole bytes (or bytes/s) only: `1.5`
# alone is refused, as it is almost always a forgotten unit (GiB), not 2 bytes.
# A size is not a rate: `5GiB` for a rate is refused with the hint `5GiB/s`,
# and `5GiB/s` for a size is refused too. The same ranges are in the README.
MAX_SIZE_BYTES = 2**50
MIN_RATE_BYTES_PER_S = 1e6
MAX_RATE_BYTES_PER_S = 1e14


def parse_size(text: str, what: str = "size", *, least: int = 1) -> int:
    """Bytes from `8GiB`, `512MB`, `1.5G` or whole bytes `4096`, at least
    `least`; a MemplanError naming `what` otherwise (NOTE [ Sanity ranges ])."""
    example = f"a size such as 8GiB, 512MB or 4096 (units {UNIT_NAMES}; no unit: whole bytes)"
    body = str(text).strip()
    if body.lower().endswith("/s"):
        raise MemplanError(f"{what}={text!r}: expected a size, not a rate ({body[:-2]})")
    value = _number(body, text, what, example, whole_without_unit=True, zero=least <= 0)
    nbytes = round(value)
    if nbytes > MAX_SIZE_BYTES:
        raise MemplanError(f"{what}={text!r}: more than {MAX_SIZE_BYTES} bytes (1 PiB)")
    if nbytes < least:
        raise MemplanError(f"{what}={text!r} must be at least {least} byte{'s' * (least != 1)}")
    return nbytes


def parse_rate(text: str, what: str = "bandwidth") -> float:
    """Bytes per second from `2GB/s`, `500MiB/s` or a plain number of bytes/s
    (NOTE [ Sanity ranges ])."""
    example = f"a rate such as 1.5GB/s, 500MiB/s or 2e9 (bytes/s; units {UNIT_NAMES} per s)"
    body = str(text).strip()
    per_second = body.lower().endswith("/s")
    if per_second:
        body = body[:-2]
    m = _NUMBER.match(body)
    if not per_second and m and m.group(2).lower() in _UNITS:
        raise MemplanError(f"{what}={text!r}: a size, not a rate; did you mean {body}/s?")
    value = _number(body, text, what, example, whole_without_unit=False)
    if not MIN_RATE_BYTES_PER_S <= value <= MAX_RATE_BYTES_PER_S:
        raise MemplanError(
            f"{what}={text!r}: expected a rate from {MIN_RATE_BYTES_PER_S:.0e} to "
            f"{MAX_RATE_BYTES_PER_S:.0e} bytes/s (1MB/s to 100TB/s)"
        )
    return value


def _number(
    body: str, text: str, what: str, example: str, *, whole_without_unit: bool, zero: bool = False
) -> float:
    """The positive (or, with `zero`, non-negative), finite number of bytes
    `body` says; errors quote `text`."""
    m = _NUMBER.match(body)
    unit = m.group(2).lower() if m else None
    if not m or (unit and unit not in _UNITS):
        raise MemplanError(f"{what}={text!r}: expected {example}")
    digits = m.group(1)
    if len(digits) > _MAX_DIGITS:
        raise MemplanError(f"{what}={text!r}: too large a number")
    if whole_without_unit and not unit and not digits.isdigit():
        example = f"{digits}GiB" if "e" not in digits.lower() else "1.5GiB"
        raise MemplanError(
            f"{what}={text!r}: give a unit ({UNIT_NAMES}), e.g. {example}, or whole bytes"
        )
    if unit == "b" and not digits.isdigit():
        raise MemplanError(f"{what}={text!r}: bytes must be a whole number")
    value = float(digits) * _UNITS[unit or "b"]
    if not math.isfinite(value):
        raise MemplanError(f"{what}={text!r}: expected a finite number")
    if value < 0 or (value == 0 and not zero):
        raise MemplanError(f"{what}={text!r} must be > 0")
    return value


def number(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse `type`: a finite float in [lo, hi] ((lo, hi] with
    `lo_open`); the message names the range, argparse names the option."""

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= _MAX_DIGITS else math.inf
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_ok = value > lo if lo_open else value >= lo
        if not (math.isfinite(value) and low_ok and value <= hi):
            bracket = "(" if lo_open else "["
            raise argparse.ArgumentTypeError(
                f"expected a finite number in {bracket}{lo:g}, {hi:g}], got {text!r}"
            )
        return value

    parse.__name__ = "number"
    return parse


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number in [lo, hi]."""

    def parse(text: str) -> int:
        body = text.strip()
        digits = body.removeprefix("-").removeprefix("+")
        if not (digits.isascii() and digits.isdigit()) or len(digits) > _MAX_DIGITS:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
        value = int(body)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"expected a whole number in [{lo}, {hi}], got {text!r}"
            )
        return value

    parse.__name__ = "integer"
    return parse


def format_bytes(n: float) -> str:
    """`1.50 GiB` style, binary units."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
