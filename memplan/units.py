"""Human sizes and rates on the command line: `8GiB`, `512MB`, `2GB/s`, plain bytes."""

from __future__ import annotations

import re

from memplan.traces.errors import MemplanError

_UNITS = {
    "": 1,
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
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str, what: str = "size") -> int:
    """Bytes from `8GiB`, `512MB`, `1.5G`, `4096`; MemplanError naming `what` otherwise."""
    return int(round(_parse(text, text, what, "a size such as 8GiB, 512MB or 4096")))


def parse_rate(text: str, what: str = "bandwidth") -> float:
    """Bytes per second from `2GB/s`, `500MiB/s` or a plain number of bytes/s."""
    body = text.strip()
    if body.lower().endswith("/s"):
        body = body[:-2]
    return _parse(body, text, what, "a rate such as 1.5GB/s, 500MiB/s or 2e9 (bytes/s)")


def _parse(body: str, text: str, what: str, example: str) -> float:
    """The positive number of bytes `body` says; errors quote `text`."""
    m = _SIZE.match(body)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise MemplanError(f"{what}={text!r}: expected {example}")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise MemplanError(f"{what}={text!r} must be > 0")
    return value


def format_bytes(n: float) -> str:
    """`1.50 GiB` style, binary units."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
