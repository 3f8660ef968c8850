"""Checked reading of one field of a JSON document: the type and range of
every value any memplan loader takes from a file (NOTE [ Fields from files ]).

Each function returns the value as the type it promises or raises the
loader's own `error` class with a message that starts with `where` (the
field's path, `ops[12].flops`) and says what was expected and what was
found, quoted safely whatever its characters. Writing goes the other way
through `record`, `json_value`, `nan_to_none` and `finite_or_none`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any

from memplan.traces.errors import MemplanError

# NOTE [ Fields from files ]
# JSON numbers arrive as Python ints of any size or as floats (NaN and
# Infinity included: Python's json accepts them). A loader keeps an integer
# only when it is a JSON integer (not a bool, not 3.0) within int64, so numpy
# arrays built from it cannot overflow; a float only when it is finite (an
# integer of 400 digits is refused, not turned into inf). Ranges are the
# loader's: 0 <= nbytes, 0 <= flops, ... Strings may hold any code point,
# lone surrogates included; they are printed through `printable`.
INT64_MAX = 2**63 - 1
MAX_DEPTH = 64  # deepest nesting any memplan document needs is well below


# ---- writing: numbers JSON can hold ---------------------------------------------------
def nan_to_none(x: float | None) -> float | None:
    """`x`, or None for NaN (a figure not measured: JSON's null)."""
    return None if x is None or math.isnan(x) else x


def finite_or_none(x: float | None) -> float | None:
    """`x`, or None where it is not finite (JSON has no NaN or infinity)."""
    return None if x is None or not math.isfinite(x) else x


def json_value(value: Any) -> Any:
    """`value` as JSON holds it: an enum by its value, a tuple or list as a
    list (of JSON values), NaN as None; anything else as it is."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [json_value(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def record(obj: Any, *, omit: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of the dataclass `obj` but `omit`, in the order the class
    declares them, as JSON values (`json_value`): a record a file holds field
    by field, with the field names as keys."""
    return {
        f.name: json_value(getattr(obj, f.name))
        for f in dataclasses.fields(obj)
        if f.name not in omit
    }


def shown(value: Any, limit: int = 40) -> str:
    """`value` as JSON, cut to `limit` characters, safe to print."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return printable(text)


def printable(text: str) -> str:
    """`text` with lone surrogates and other unencodable code points escaped,
    so printing it never raises UnicodeEncodeError."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def integer(
    value: Any, where: str, error: type[MemplanError], lo: int = 0, hi: int = INT64_MAX
) -> int:
    """A JSON integer in [lo, hi]."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{where}: expected an integer, got {shown(value)}")
    if not lo <= value <= hi:
        raise error(f"{where}: expected an integer in [{lo}, {hi}], got {shown(value)}")
    return value


def number(
    value: Any,
    where: str,
    error: type[MemplanError],
    lo: float = 0.0,
    hi: float = math.inf,
) -> float:
    """A finite JSON number in [lo, hi], as a float."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise error(f"{where}: expected a number, got {shown(value)}")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise error(f"{where}: expected a finite number, got {shown(value)}")
    if not lo <= x <= hi:
        raise error(f"{where}: expected a number in [{lo:g}, {hi:g}], got {shown(value)}")
    return x


def boolean(value: Any, where: str, error: type[MemplanError]) -> bool:
    """A JSON true or false (not "false", not 0)."""
    if not isinstance(value, bool):
        raise error(f"{where}: expected true or false, got {shown(value)}")
    return value


def string(value: Any, where: str, error: type[MemplanError]) -> str:
    """A JSON string."""
    if not isinstance(value, str):
        raise error(f"{where}: expected a string, got {shown(value)}")
    return value


def depth_at_most(value: Any, where: str, error: type[MemplanError], limit: int = MAX_DEPTH) -> Any:
    """`value` itself when its lists and objects nest at most `limit` deep
    (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, list | dict):
            if d > limit:
                raise error(f"{where}: nested more than {limit} levels deep")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, d + 1) for c in children)
    return value


def parse(raw: bytes | str, where: str, error: type[MemplanError]) -> Any:
    """The JSON document in `raw`; malformed or absurdly nested text is a
    one-line `error` naming `where`."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise error(f"{where}: nested too deeply to be a memplan file") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, 5000-digit integers
        raise error(f"{where}: not valid JSON: {e}") from None


def obj(value: Any, where: str, error: type[MemplanError]) -> dict[str, Any]:
    """A JSON object."""
    if not isinstance(value, dict):
        raise error(f"{where}: expected an object, got {shown(value)}")
    return value


def array(value: Any, where: str, error: type[MemplanError]) -> list[Any]:
    """A JSON list."""
    if not isinstance(value, list):
        raise error(f"{where}: expected a list, got {shown(value)}")
    return value


def enum_value(cls: type, value: Any, where: str, error: type[MemplanError]) -> Any:
    """`cls(value)` for a string naming a member of the enum `cls`, else
    `error` naming `where` and the allowed values."""
    allowed = ", ".join(m.value for m in cls)
    if not isinstance(value, str):
        raise error(f"{where}: expected a string (one of {allowed}), got {shown(value)}")
    try:
        return cls(value)
    except ValueError:
        raise error(f"{where}: unknown {cls.__name__} {shown(value)} (one of {allowed})") from None


def text(value: Any, where: str, error: type[MemplanError]) -> str:
    """A JSON string that is valid Unicode text: no lone surrogates (a name
    that must reach code outside Python, such as an operator to look up)."""
    s = string(value, where, error)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise error(
            f"{where}: not valid Unicode text (a lone surrogate at position {e.start}): {shown(s)}"
        ) from None
    return s
