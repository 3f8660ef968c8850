"""Hardware profiles: what a device can hold and how fast it computes and copies.

Profiles are TOML files in `hwmodels/profiles/` (or a user's own path); every
figure carries a `source` line saying where it comes from. `load_hardware`
validates a file field by field and raises a one-line `LatencyError` naming
the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memplan.hwmodels.errors import LatencyError
from memplan.traces import fields
from memplan.traces.errors import TraceError
from memplan.traces.io import read_toml
from memplan.traces.target import (
    AttentionBackend,
    Target,
    TargetDevice,
    parse_compute_capability,
)

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

    Optional, 0 when a profile leaves them out (NOTE [ Profile sanity
    ranges ]): `context_reserve_bytes`, the device memory a process's CUDA
    context and library handles hold before it allocates a tensor; and the
    workspace a convolution / a matmul takes for its duration when its trace
    records none (`conv_workspace_bytes`, `matmul_workspace_bytes`; see
    `hwmodels.device.op_workspace_bytes`); and the GPU's L2 cache
    (`l2_cache_bytes`, NOTE [ Kernel model ] in hwmodels/kernels.py).
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
    context_reserve_bytes: int = 0
    conv_workspace_bytes: int = 0
    matmul_workspace_bytes: int = 0
    l2_cache_bytes: int = 0
    device: TargetDevice = TargetDevice.CUDA
    compute_capability: tuple[int, int] | None = None

    def target(self, attention: AttentionBackend = AttentionBackend.AUTO) -> Target:
        """This device as a capture target (traces/target.py): a CUDA profile
        needs its `compute_capability`, which picks the kernels emulated."""
        if self.device is TargetDevice.CUDA and self.compute_capability is None:
            raise LatencyError(
                f"hardware {self.name}: no compute_capability, so it cannot be a capture "
                'target (add compute_capability = "MAJOR.MINOR" to the profile)'
            )
        try:
            return Target(self.name, self.device, self.compute_capability, attention)
        except TraceError as e:
            raise LatencyError(str(e)) from None

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for `dtype`; float32's figure for dtypes the profile
        does not list (integer and bool ops count no FLOPs anyway)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        return self.peak_flops.get("float32", max(self.peak_flops.values()))


# ---- the TOML schema ---------------------------------------------------------
# NOTE [ Profile sanity ranges ]
# A profile's figures must be finite and within ranges wide enough for any device memplan
# models (a small CPU to GPUs a generation or two ahead) and narrow enough that a typo or a
# unit slip (bytes/s given as 1e-300) is refused instead of giving infinite times. The
# ranges are `_NUMBERS` and `_TABLE_RANGES` below (memory 1 MiB .. 64 TiB, copy bandwidth
# 1e6 .. 1e13 B/s, memory bandwidth 1e8 .. 1e14 B/s, peak 1e6 .. 1e18 FLOP/s, roofline
# efficiency 1e-3 .. 1e3); the optional reserves and `l2_cache_bytes` are 0 .. 64 GiB (0 when
# left out); `device` is "cuda" (default) or "cpu", `compute_capability` "MAJOR.MINOR"
# (cuda only). Whether reserves leave room in a budget is the simulator's check. Shipped
# profiles sit well inside; every field needs a line in [source] (an optional one when
# given). The full table: docs/notes.md, "Profile sanity ranges".
MiB, GiB, TiB = 2**20, 2**30, 2**40
_NUMBERS: dict[str, tuple[type, float, float]] = {
    "memory_bytes": (int, MiB, 64 * TiB),
    "h2d_bytes_per_s": (float, 1e6, 1e13),
    "d2h_bytes_per_s": (float, 1e6, 1e13),
    "transfer_fixed_s": (float, 0.0, 1.0),
    "copy_engines": (int, 1, 64),
    "h2d_duplex_factor": (float, 0.01, 1.0),
    "mem_bw_bytes_per_s": (float, 1e8, 1e14),
    "launch_overhead_s": (float, 0.0, 1.0),
}
_OPTIONAL = (
    "context_reserve_bytes",
    "conv_workspace_bytes",
    "matmul_workspace_bytes",
    "l2_cache_bytes",
)
_TABLE_RANGES = {"peak_flops": (1e6, 1e18), "roofline_efficiency": (1e-3, 1e3)}
_TABLES = ("peak_flops", "roofline_efficiency")
_KNOWN = {
    "name",
    "description",
    "source",
    "device",
    "compute_capability",
    *_NUMBERS,
    *_OPTIONAL,
    *_TABLES,
}


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
    path, doc = read_toml(profile_path(name_or_path), LatencyError, "hardware profile")
    return hardware_from_dict(doc, where=str(path), default_name=path.stem)


def hardware_from_dict(doc: dict[str, Any], where: str, default_name: str = "") -> Hardware:
    """Validate a parsed profile (NOTE [ Profile sanity ranges ]); `where`
    names the file in error messages."""
    fields.depth_at_most(doc, where, LatencyError, limit=8)
    unknown = sorted(set(doc) - _KNOWN)
    if unknown:
        raise LatencyError(f"{where}: unknown field {fields.shown(unknown[0])}")
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise LatencyError(f"{where}: name: expected a non-empty string, got {fields.shown(name)}")
    values: dict[str, Any] = {}
    for key, (kind, lo, hi) in _NUMBERS.items():
        if key not in doc:
            raise LatencyError(f"{where}: {key}: missing")
        at = f"{where}: {key}"
        if kind is int:
            values[key] = fields.integer(doc[key], at, LatencyError, int(lo), int(hi))
        else:
            values[key] = fields.number(doc[key], at, LatencyError, lo, hi)
    for key in _OPTIONAL:
        if key in doc:
            values[key] = fields.integer(doc[key], f"{where}: {key}", LatencyError, 0, 64 * GiB)
    peak = _table(doc, "peak_flops", where, required=True, keys=FLOPS_DTYPES)
    eff = _table(doc, "roofline_efficiency", where, required=False, keys=None)
    source = doc.get("source")
    if not isinstance(source, dict):
        raise LatencyError(f"{where}: table [source] missing (every figure needs a source line)")
    for key, text in source.items():
        fields.string(text, f"{where}: source.{fields.printable(key)}", LatencyError)
    given = [k for k in _OPTIONAL if k in doc]
    for key in (*_NUMBERS, *given, "peak_flops", *(["roofline_efficiency"] if eff else [])):
        if not source.get(key, "").strip():
            raise LatencyError(f"{where}: source.{key}: missing (every figure needs a source line)")
    description = doc.get("description", "")
    fields.string(description, f"{where}: description", LatencyError)
    values.update(_arch(doc, where, source))
    return Hardware(
        name=name,
        peak_flops=peak,
        source=dict(source),
        description=description,
        roofline_efficiency=eff,
        **values,
    )


def _arch(doc: dict[str, Any], where: str, source: dict[str, Any]) -> dict[str, Any]:
    """`device` and `compute_capability` (NOTE [ Profile sanity ranges ])."""
    device = fields.enum_value(
        TargetDevice, doc.get("device", "cuda"), f"{where}: device", LatencyError
    )
    out: dict[str, Any] = {"device": device}
    if "compute_capability" in doc:
        if device is not TargetDevice.CUDA:
            raise LatencyError(f"{where}: compute_capability: only a cuda device has one")
        text = fields.string(
            doc["compute_capability"], f"{where}: compute_capability", LatencyError
        )
        try:
            out["compute_capability"] = parse_compute_capability(
                text, f"{where}: compute_capability"
            )
        except TraceError as e:
            raise LatencyError(str(e)) from None
        if not str(source.get("compute_capability", "")).strip():
            raise LatencyError(
                f"{where}: source.compute_capability: missing (every figure needs a source line)"
            )
    return out


def _table(
    doc: dict[str, Any], key: str, where: str, required: bool, keys: frozenset[str] | None
) -> dict[str, float]:
    t = doc.get(key)
    if t is None:
        if required:
            raise LatencyError(f"{where}: table [{key}] missing")
        return {}
    if not isinstance(t, dict) or (required and not t):
        raise LatencyError(f"{where}: [{key}]: expected a table of name = number")
    lo, hi = _TABLE_RANGES[key]
    out: dict[str, float] = {}
    for k, v in t.items():
        if keys is not None and k not in keys:
            raise LatencyError(
                f"{where}: {key}.{fields.printable(k)}: unknown dtype "
                f"(known: {', '.join(sorted(keys))})"
            )
        out[k] = fields.number(v, f"{where}: {key}.{fields.printable(k)}", LatencyError, lo, hi)
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
    lines += [f"{key} = {getattr(hw, key)}" for key in _OPTIONAL if key in hw.source]
    if hw.device is not TargetDevice.CUDA:
        lines.append(f"device = {_q(hw.device.value)}")
    if hw.compute_capability is not None:
        major, minor = hw.compute_capability
        lines.append(f'compute_capability = "{major}.{minor}"')
    for key in _TABLES:
        table = getattr(hw, key)
        if table:
            lines += ["", f"[{key}]"] + [f"{k} = {v:.6g}" for k, v in table.items()]
    lines += ["", "[source]"] + [f"{k} = {_q(v)}" for k, v in hw.source.items()]
    return "\n".join(lines) + "\n"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
