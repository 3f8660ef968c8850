"""Reading a PyTorch memory snapshot -- the pickle `torch.cuda.memory.
_dump_snapshot()` writes after `_record_memory_history()` on a real GPU, or
one `sim/snapshot.py` wrote -- and the allocated and reserved bytes it
shows over time (NOTE [ Reading a snapshot ]).

- `read_snapshot(path)`: the checked snapshot dict; any problem is a
  one-line `SnapshotError` naming the file and the place.
- `check_snapshot(doc, where)`: the structure checks alone.
- `device_peaks(doc)`: per device, allocated and reserved bytes after each
  trace entry, their peaks, and the state at the end.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from memplan.sim.errors import SimError
from memplan.traces import fields
from memplan.traces.io import MAX_JSON_BYTES, read_capped


class SnapshotError(SimError):
    """A file that is not a memory snapshot memplan can read; the message
    names the file and the place in it."""


# NOTE [ Reading a snapshot ]
# Unpickling runs whatever code the file names, so the reader's `Unpickler` refuses every class
# and function (`find_class`): only plain dicts, lists, tuples, str, bytes, int, float, bool and
# None come out, all a snapshot holds; a file naming any is refused in one line, nothing run.
# The file is bounded like a JSON file (NOTE [ File sizes ] in traces/io.py), and a pickle
# cannot repeat data, so what it builds is a small multiple of it. Every field the reader uses
# is checked where it is read, by traces/fields.py; unused fields may hold anything. A list
# alone is an old snapshot's segments, as torch's `_memory_viz` reads it.
# Bytes over time replay the trace backwards from the state at the end, as memory_viz does (the
# trace may start late or have wrapped): allocated = requested sizes (`alloc` adds,
# `free_completed` takes away) and the blocks active at the end; reserved = segments
# (`segment_alloc`, `segment_map` add; `segment_free`, `segment_unmap` take away). A trace that
# takes away more than the end state can have held is inconsistent (`consistent` says so).
# Full text: docs/notes.md, "Reading a snapshot".
MAX_SNAPSHOT_BYTES = MAX_JSON_BYTES
_ADDS = {"alloc": (1, 0), "free_completed": (-1, 0), "segment_alloc": (0, 1),
         "segment_map": (0, 1), "segment_free": (0, -1), "segment_unmap": (0, -1)}  # fmt: skip
_NO_ADDR = frozenset({"oom", "snapshot"})


class _PlainData(pickle.Unpickler):
    """Unpickles plain data only (NOTE [ Reading a snapshot ])."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{module}.{name}")


class _Refused(pickle.UnpicklingError):
    pass


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The snapshot in `path`, checked (NOTE [ Reading a snapshot ])."""
    p = Path(path)

    def too_big(n: int) -> str:
        return f"{p}: {n} bytes, more than a snapshot may have ({MAX_SNAPSHOT_BYTES}; NOTE [ File sizes ])"

    raw = read_capped(p, SnapshotError, "snapshot file", MAX_SNAPSHOT_BYTES, too_big)
    try:
        doc = _PlainData(io.BytesIO(raw)).load()
    except _Refused as e:
        raise SnapshotError(
            f"{p}: the pickle names the Python object {fields.shown(str(e), 80)}; a memory "
            "snapshot holds plain data only, so it was refused unrun (NOTE [ Reading a snapshot ])"
        ) from None
    except Exception as e:  # noqa: BLE001 -- any failure of untrusted bytes is bad input
        why = " ".join(str(e).split())[:120] or "no detail"
        raise SnapshotError(f"{p}: not a readable pickle ({type(e).__name__}: {why})") from None
    return check_snapshot(doc, str(p))


def check_snapshot(doc: Any, where: str) -> dict[str, Any]:
    """`doc` as a snapshot dict with every field the reader uses checked,
    else `SnapshotError` naming `where` and the place."""
    E = SnapshotError
    if isinstance(doc, list):  # segments only (an old snapshot)
        doc = {"segments": doc, "device_traces": []}
    if not isinstance(doc, dict):
        raise E(f"{where}: expected a snapshot (a dict with segments and device_traces), "
                f"got {type(doc).__name__}")  # fmt: skip
    if "segments" not in doc:
        raise E(f"{where}: no 'segments': not a PyTorch memory snapshot")
    for i, seg in enumerate(fields.array(doc["segments"], f"{where}: segments", E)):
        _check_segment(seg, f"{where}: segments[{i}]")
    traces = fields.array(doc.get("device_traces", []), f"{where}: device_traces", E)
    for d, entries in enumerate(traces):
        for k, e in enumerate(fields.array(entries, f"{where}: device_traces[{d}]", E)):
            _check_entry(e, f"{where}: device_traces[{d}][{k}]")
    return doc


def _check_segment(seg: Any, at: str) -> None:
    E = SnapshotError
    seg = fields.obj(seg, at, E)
    for key in ("address", "total_size"):
        fields.integer(seg.get(key), f"{at}.{key}", E)
    fields.integer(seg.get("device", 0), f"{at}.device", E, hi=1 << 16)
    total = 0
    for j, b in enumerate(fields.array(seg.get("blocks"), f"{at}.blocks", E)):
        b = fields.obj(b, f"{at}.blocks[{j}]", E)
        total += fields.integer(b.get("size"), f"{at}.blocks[{j}].size", E)
        fields.string(b.get("state"), f"{at}.blocks[{j}].state", E)
        if "requested_size" in b:
            fields.integer(b["requested_size"], f"{at}.blocks[{j}].requested_size", E)
    if seg["blocks"] and total != seg["total_size"]:
        raise E(f"{at}.blocks: sizes add up to {total}, not the segment's total_size "
                f"{seg['total_size']}")  # fmt: skip


def _check_entry(e: Any, at: str) -> None:
    E = SnapshotError
    e = fields.obj(e, at, E)
    action = fields.string(e.get("action"), f"{at}.action", E)
    if action in _NO_ADDR:
        return
    fields.integer(e.get("size"), f"{at}.size", E)
    if action in _ADDS or action == "free_requested":
        fields.integer(e.get("addr"), f"{at}.addr", E)
    if "time_us" in e:
        fields.number(e["time_us"], f"{at}.time_us", E, lo=-float(fields.INT64_MAX))


# ---- bytes over time -----------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DevicePeaks:
    """One device of a snapshot. `allocated[k]` and `reserved[k]` are the
    bytes after trace entry k-1 (index 0: before the first entry, the last:
    the end state). Peaks are over all of them; `*_peak_entry` is the index
    of the trace entry that reached the peak (-1: before the trace)."""

    device: int
    allocated: np.ndarray
    reserved: np.ndarray
    allocated_peak: int
    reserved_peak: int
    allocated_peak_entry: int
    reserved_peak_entry: int
    allocated_end: int
    reserved_end: int
    segments: int
    actions: dict[str, int]
    time_us: np.ndarray  # per entry, NaN where absent
    consistent: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "allocated_peak_bytes": self.allocated_peak,
            "reserved_peak_bytes": self.reserved_peak,
            "allocated_peak_entry": self.allocated_peak_entry,
            "reserved_peak_entry": self.reserved_peak_entry,
            "allocated_end_bytes": self.allocated_end,
            "reserved_end_bytes": self.reserved_end,
            "segments": self.segments,
            "entries": len(self.time_us),
            "actions": self.actions,
            "consistent": self.consistent,
        }


def device_peaks(doc: dict[str, Any]) -> list[DevicePeaks]:
    """Per device with segments or trace entries, in device order
    (NOTE [ Reading a snapshot ]); `doc` as `check_snapshot` returns it."""
    traces = doc.get("device_traces", [])
    ends: dict[int, list[int]] = {}  # device -> [allocated, reserved, segments]
    for seg in doc["segments"]:
        end = ends.setdefault(seg.get("device", 0), [0, 0, 0])
        end[1] += seg["total_size"]
        end[2] += 1
        for b in seg["blocks"]:
            if b["state"].startswith("active"):
                end[0] += b.get("requested_size", b["size"])
    devices = sorted(set(ends) | {d for d, t in enumerate(traces) if t})
    return [_replay(d, traces[d] if d < len(traces) else [], ends.get(d, [0, 0, 0]))
            for d in devices]  # fmt: skip


def _replay(device: int, entries: list[dict], end: list[int]) -> DevicePeaks:
    n = len(entries)
    d_alloc = np.zeros(n, np.int64)
    d_res = np.zeros(n, np.int64)
    times = np.full(n, np.nan)
    actions: dict[str, int] = {}
    for k, e in enumerate(entries):
        a = e["action"]
        actions[a] = actions.get(a, 0) + 1
        sign = _ADDS.get(a)
        if sign is not None:
            d_alloc[k] = sign[0] * e["size"]
            d_res[k] = sign[1] * e["size"]
        if "time_us" in e:
            times[k] = e["time_us"]
    allocated = _backwards(d_alloc, end[0])
    reserved = _backwards(d_res, end[1])
    ia, ir = int(np.argmax(allocated)), int(np.argmax(reserved))
    return DevicePeaks(
        device=device,
        allocated=allocated,
        reserved=reserved,
        allocated_peak=int(allocated[ia]),
        reserved_peak=int(reserved[ir]),
        allocated_peak_entry=ia - 1,
        reserved_peak_entry=ir - 1,
        allocated_end=end[0],
        reserved_end=end[1],
        segments=end[2],
        actions=actions,
        time_us=times,
        consistent=bool(allocated.min() >= 0 and reserved.min() >= 0),
    )


def _backwards(delta: np.ndarray, end: int) -> np.ndarray:
    """Levels before the first change and after each, ending at `end`."""
    after = np.concatenate(([0], np.cumsum(delta)))
    return after + (end - after[-1])
