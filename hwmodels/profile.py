"""Hardware profiles: what a device can hold and how fast it computes and copies.

Profiles are TOML files in `hwmodels/profiles/` (or a user's own path); every
figure carries a `source` line saying where it comes from. `load_hardware`
validates a file field by field and raises a one-line `LatencyError` naming
the file and the field.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memplan.hwmodels.errors import LatencyError

PROFILES_DIR = Path(__file__).parent / "profiles"

# dtypes a `peak_flops` table may name; "tfloat32" is the tensor-core rate
# PyTorch uses for float32 convolutions by default (cudnn.allow_tf32).
FLOPS_DTYPES: frozenset[str] = frozenset(
    {"float64", "float32", "tfloat32", "float16", "bfloat16", "float8", "int8"}
)


@dataclass(frozen=True, slots=True)
class Hardware:
    """One device. Bandwidths in bytes/s, times in seconds, FLOP/s per dtype.

    `h2d_duplex_factor` multiplies the H2D bandwidth while a D2H copy runs at
    the same time on another copy engine (about 0.5 on PCIe GPUs).
    `roofline_efficiency` overrides the roofline's per-op-class efficiency
    factors (keys are `OpClass` values, see `hwmodels.latency.Roofline`).
    """

    name: str
    memory_bytes: int
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    transfer_fixed_s: float
    copy_engines: int
    h2d_duplex_factor: float
    peak_flops: dict[str, float]
    mem_bw_bytes_per_s: float
    launch_overhead_s: float
    source: dict[str, str] = field(default_factory=dict)
    description: str = ""
    roofline_efficiency: dict[str, float] = field(default_factory=dict)

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for `dtype`; float32's figure for dtypes the profile
        does not list (integer and bool ops count no FLOPs anyway)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        return self.peak_flops.get("float32", max(self.peak_flops.values()))


# ---- the TOML schema ---------------------------------------------------------
# field -> (kind, lower bound, lower bound inclusive). Every field here needs
# a line in [source].
_NUMBERS: dict[str, tuple[type, float, bool]] = {
    "memory_bytes": (int, 0, False),
    "h2d_bytes_per_s": (float, 0, False),
    "d2h_bytes_per_s": (float, 0, False),
    "transfer_fixed_s": (float, 0, True),
    "copy_engines": (int, 1, True),
    "h2d_duplex_factor": (float, 0, False),
    "mem_bw_bytes_per_s": (float, 0, False),
    "launch_overhead_s": (float, 0, True),
}
_TABLES = ("peak_flops", "roofline_efficiency")
_KNOWN = {"name", "description", "source", *_NUMBERS, *_TABLES}


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def profile_path(name_or_path: str | Path) -> Path:
    """The file behind a shipped profile name, or the given path itself."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text or Path(text).is_file():
        return Path(text)
    path = PROFILES_DIR / f"{text}.toml"
    if not path.is_file():
        known = ", ".join(list_profiles())
        raise LatencyError(f"unknown hardware {text!r}; known: {known} (or pass a .toml path)")
    return path


def load_hardware(name_or_path: str | Path) -> Hardware:
    """A shipped profile by name (`a100-pcie-40gb`) or a user's TOML file by path."""
    path = profile_path(name_or_path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise LatencyError(f"{path}: no such hardware profile") from None
    except OSError as e:
        raise LatencyError(f"{path}: cannot read: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise LatencyError(f"{path}: not valid TOML: {e}") from None
    return hardware_from_dict(doc, where=str(path), default_name=path.stem)


def hardware_from_dict(doc: dict[str, Any], where: str, default_name: str = "") -> Hardware:
    """Validate a parsed profile; `where` names the file in error messages."""
    unknown = sorted(set(doc) - _KNOWN)
    if unknown:
        raise LatencyError(f"{where}: unknown field {unknown[0]!r}")
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise LatencyError(f"{where}: field 'name': expected a non-empty string, got {name!r}")
    values: dict[str, Any] = {}
    for key, (kind, lo, inclusive) in _NUMBERS.items():
        values[key] = _number(doc, key, kind, lo, inclusive, where)
    if values["h2d_duplex_factor"] > 1:
        raise LatencyError(
            f"{where}: field 'h2d_duplex_factor': expected a factor in (0, 1], "
            f"got {values['h2d_duplex_factor']}"
        )
    peak = _table(doc, "peak_flops", where, required=True, keys=FLOPS_DTYPES)
    eff = _table(doc, "roofline_efficiency", where, required=False, keys=None)
    source = doc.get("source")
    if not isinstance(source, dict):
        raise LatencyError(f"{where}: table [source] missing (every figure needs a source line)")
    for key in (*_NUMBERS, "peak_flops", *(["roofline_efficiency"] if eff else [])):
        text = source.get(key)
        if not isinstance(text, str) or not text.strip():
            raise LatencyError(f"{where}: source.{key}: missing (every figure needs a source line)")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise LatencyError(f"{where}: field 'description': expected a string")
    return Hardware(
        name=name,
        peak_flops=peak,
        source={str(k): str(v) for k, v in source.items()},
        description=description,
        roofline_efficiency=eff,
        **values,
    )


def _number(doc: dict[str, Any], key: str, kind: type, lo: float, inclusive: bool, where: str):
    if key not in doc:
        raise LatencyError(f"{where}: field {key!r}: missing")
    v = doc[key]
    ok_type = isinstance(v, int) if kind is int else isinstance(v, int | float)
    if isinstance(v, bool) or not ok_type or not math.isfinite(v):
        what = "an integer" if kind is int else "a number"
        raise LatencyError(f"{where}: field {key!r}: expected {what}, got {v!r}")
    if v < lo or (v == lo and not inclusive):
        op = ">=" if inclusive else ">"
        raise LatencyError(f"{where}: field {key!r}: expected {op} {lo:g}, got {v!r}")
    return kind(v)


def _table(
    doc: dict[str, Any], key: str, where: str, required: bool, keys: frozenset[str] | None
) -> dict[str, float]:
    t = doc.get(key)
    if t is None:
        if required:
            raise LatencyError(f"{where}: table [{key}] missing")
        return {}
    if not isinstance(t, dict) or (required and not t):
        raise LatencyError(f"{where}: [{key}]: expected a table of dtype = FLOP/s")
    out: dict[str, float] = {}
    for k, v in t.items():
        if keys is not None and k not in keys:
            raise LatencyError(
                f"{where}: {key}.{k}: unknown dtype (known: {', '.join(sorted(keys))})"
            )
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise LatencyError(f"{where}: {key}.{k}: expected a number > 0, got {v!r}")
        out[k] = float(v)
    return out


# ---- writing -----------------------------------------------------------------
def to_toml(hw: Hardware, header: str = "") -> str:
    """The TOML text of a profile (the inverse of `load_hardware`)."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [f"name = {_q(hw.name)}"]
    if hw.description:
        lines.append(f"description = {_q(hw.description)}")
    for key in _NUMBERS:
        v = getattr(hw, key)
        lines.append(f"{key} = {v}" if isinstance(v, int) else f"{key} = {v:.6g}")
    for key in _TABLES:
        table = getattr(hw, key)
        if table:
            lines += ["", f"[{key}]"] + [f"{k} = {v:.6g}" for k, v in table.items()]
    lines += ["", "[source]"] + [f"{k} = {_q(v)}" for k, v in hw.source.items()]
    return "\n".join(lines) + "\n"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
