"""A simulation as a PyTorch memory snapshot: the pickle that
`torch.cuda.memory._snapshot()` returns after `_record_memory_history()`,
which `python -m torch.cuda._memory_viz trace_plot` and the memory_viz page
(pytorch.org/memory_viz) open.

- `snapshot(result, layout)`: the snapshot dict (NOTE [ Snapshot format ]);
  addresses come from a `Layout` (NOTE [ Snapshot layout ]).
- `write_snapshot(result, path)`: the pickle, written atomically.

The allocations come from `sim/allocations.py`; reading a snapshot (one
memplan wrote, or one from a real run) is `sim/snapshot_read.py`.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any, Protocol

from memplan.sim.allocations import Allocation, allocations
from memplan.sim.metrics import SimResult
from memplan.traces.io import atomic_write_bytes

# NOTE [ Snapshot format ]
# What `snapshot` writes, as `torch.cuda.memory._snapshot()` documents it
# (torch/cuda/memory.py) and as torch/utils/viz/MemoryViz.js reads it:
# - `segments`: the state at the snapshot's time (NOTE [ Snapshot time ]),
#   each with `device` 0, `address`, `total_size`, `stream`, `segment_type`
#   (small up to 1 MiB, else large), `allocated_size`, `active_size`,
#   `requested_size`, `segment_pool_id` (0, 0), and `blocks` in address order
#   covering the segment: `size`, `requested_size`, `state`
#   ("active_allocated" or "inactive"), `frames`.
# - `device_traces[0]`: one entry per allocator action, in time order:
#   `segment_alloc`, `alloc`, `free_requested` + `free_completed` (at the
#   same time: the simulator frees at once), `segment_free`, and `oom` for a
#   job that ran out of memory (`size` = the first buffer of the allocation
#   that failed, `device_free` = the budget less the bytes allocated then).
#   Each has `addr`, `size` (the bytes the buffer asked for, as PyTorch
#   records the requested size), `stream`, `time_us` (simulated time, whole
#   microseconds) and `frames`.
# - Jobs are told apart by stream: job j allocates on stream j (one job: all
#   on stream 0, which the viewer leaves unprinted), and by the outermost
#   frame, which names the job.
# - `frames`, innermost first, as the viewer prints `filename:line:name`:
#   `<op target>:<op index>:<why> <buffer>` (why: create, input, persistent,
#   swap_in, fetch, recompute, or workspace for bytes that are no buffer of
#   the trace), then `<module path>:<op index>:<phase>` when the op names
#   its module, then `job <j> <name>:<iteration>:iteration <iteration>`.
#   The viewer drops frames whose name holds `_start`; none of these do.
# - `memplan`: what wrote it (hardware, budget, allocator, jobs); the viewer
#   and torch's tools ignore keys they do not know.
# The pickle uses protocol 4 and only plain dicts, lists, tuples, str, int,
# float, bool and None: the viewer's own unpickler (`unpickle` in
# MemoryViz.js) knows protocols 2 to 4 and no classes.
PICKLE_PROTOCOL = 4
SMALL_SEGMENT = 1 << 20  # PyTorch's small pool: requests up to 1 MiB


# ---- addresses -------------------------------------------------------------------
class Layout(Protocol):
    """Where allocations go: `alloc` returns the block's address and the
    segments it maps first, `free` the segments it unmaps after; `blocks`
    lists each segment at the end as (address, size, stream, [(address,
    size, allocation or None)]) in address order."""

    def alloc(self, a: Allocation) -> tuple[int, list[tuple[int, int]]]: ...

    def free(self, a: Allocation) -> list[tuple[int, int]]: ...

    def segments(self) -> list[tuple[int, int, int, list[tuple[int, int, Allocation | None]]]]: ...


# NOTE [ Snapshot layout ]
# The simulator's `exact` memory counts bytes, not addresses, so a snapshot
# of it needs an invented layout. `DirectLayout` is what PyTorch does with
# its cache turned off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): every allocation
# is a segment of its own, mapped at `alloc` and returned at the free, so
# reserved equals allocated at every instant, as the `exact` model counts.
# Addresses are 512-byte aligned in one address range: a free range is
# reused by the next allocation of the same aligned size, else the range
# grows. An allocator model that places blocks in segments (the caching
# allocator, SmartPool's offsets) is another `Layout`.
ALIGN = 512
BASE_ADDRESS = 0x7F0000000000  # looks like a device pointer


class DirectLayout:
    """One segment per allocation (NOTE [ Snapshot layout ])."""

    def __init__(self) -> None:
        self.top = BASE_ADDRESS
        self.free_ranges: dict[int, list[int]] = {}
        self.live: dict[int, tuple[int, Allocation]] = {}  # token -> (address, allocation)

    def alloc(self, a: Allocation) -> tuple[int, list[tuple[int, int]]]:
        span = -(-a.nbytes // ALIGN) * ALIGN
        ranges = self.free_ranges.get(span)
        if ranges:
            addr = ranges.pop()
        else:
            addr, self.top = self.top, self.top + span
        self.live[a.token] = (addr, a)
        return addr, [(addr, a.nbytes)]

    def free(self, a: Allocation) -> list[tuple[int, int]]:
        addr, _ = self.live.pop(a.token)
        self.free_ranges.setdefault(-(-a.nbytes // ALIGN) * ALIGN, []).append(addr)
        return [(addr, a.nbytes)]

    def segments(self) -> list[tuple[int, int, int, list[tuple[int, int, Allocation | None]]]]:
        return [
            (addr, a.nbytes, a.job, [(addr, a.nbytes, a)]) for addr, a in sorted(self.live.values())
        ]


# ---- the snapshot ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Namer:
    """Frames per allocation (NOTE [ Snapshot format ]), shared by its entries."""

    result: SimResult

    def frames(self, a: Allocation) -> list[dict[str, Any]]:
        trace = self.result.traces[a.job]
        job = self.result.jobs[a.job]
        what = a.why
        if a.buffer >= 0:
            buf = trace.buffers[a.buffer]
            what += f" {buf.kind.value} #{buf.id}" + (f" {buf.name}" if buf.name else "")
        frames = []
        if 0 <= a.op < trace.n_ops:
            op = trace.ops[a.op]
            frames.append(_frame(op.target, a.op, what))
            if op.module:
                frames.append(_frame(op.module, a.op, op.phase.value))
        else:
            where = "iteration" if a.why == "input" else "arrival"
            frames.append(_frame(where, -1, what))
        frames.append(_frame(f"job {a.job} {job.name}", a.iteration, f"iteration {a.iteration}"))
        return frames


def _frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def _entry(action: str, addr: int, size: int, a: Allocation, frames: list) -> dict[str, Any]:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": a.job,
        "time_us": int(round(a.t_us)),
        "frames": frames,
    }


def snapshot(
    result: SimResult, layout: Layout | None = None, allocator: str = "exact"
) -> dict[str, Any]:
    """The snapshot dict of `result` (NOTE [ Snapshot format ]), with
    addresses from `layout` (default `DirectLayout`); `allocator` names the
    memory model in the `memplan` key."""
    layout = layout if layout is not None else DirectLayout()
    namer = _Namer(result)
    frames: dict[int, list] = {}
    addrs: dict[int, int] = {}
    trace: list[dict[str, Any]] = []
    for ev in allocations(result):
        a = ev.alloc
        if ev.action == "oom":
            f = namer.frames(a)
            e = {"action": "oom", "size": a.nbytes, "device_free": ev.free_bytes}
            trace.append({**e, "stream": a.job, "time_us": int(round(ev.t_us)), "frames": f})
        elif ev.action == "alloc":
            f = frames[a.token] = namer.frames(a)
            addr, mapped = layout.alloc(a)
            addrs[a.token] = addr
            trace += [_entry("segment_alloc", s, n, a, f) for s, n in mapped]
            trace.append(_entry("alloc", addr, a.nbytes, a, f))
        else:
            f, addr = frames.pop(a.token), addrs.pop(a.token)
            at_free = a._replace(t_us=ev.t_us)
            trace.append(_entry("free_requested", addr, a.nbytes, at_free, f))
            trace.append(_entry("free_completed", addr, a.nbytes, at_free, f))
            trace += [_entry("segment_free", s, n, at_free, f) for s, n in layout.free(a)]
    return {
        "segments": [_segment(seg, frames) for seg in layout.segments()],
        "device_traces": [trace],
        "memplan": {
            "written_by": "memplan simulate",
            "hardware": result.hardware,
            "budget_bytes": result.budget_bytes,
            "allocator": allocator,
            "peak_bytes": result.peak_bytes,
            "jobs": [{"index": j.index, "name": j.name, "stream": j.index} for j in result.jobs],
        },
    }


def _segment(seg: tuple, frames: dict[int, list]) -> dict[str, Any]:
    addr, total, stream, parts = seg
    blocks = []
    for b_addr, size, a in parts:
        if a is None:
            blocks.append({"address": b_addr, "size": size, "requested_size": 0,
                           "state": "inactive", "frames": []})  # fmt: skip
        else:
            blocks.append({"address": b_addr, "size": size, "requested_size": a.nbytes,
                           "state": "active_allocated", "frames": frames[a.token]})  # fmt: skip
    active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {
        "device": 0,
        "address": addr,
        "total_size": total,
        "stream": stream,
        "segment_type": "small" if total <= SMALL_SEGMENT else "large",
        "segment_pool_id": (0, 0),
        "allocated_size": active,
        "active_size": active,
        "requested_size": sum(b["requested_size"] for b in blocks),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


def write_snapshot(
    result: SimResult,
    path: str | os.PathLike[str],
    layout: Layout | None = None,
    allocator: str = "exact",
) -> None:
    """`snapshot(result, layout, allocator)` pickled to `path`, atomically."""
    data = pickle.dumps(snapshot(result, layout, allocator), protocol=PICKLE_PROTOCOL)
    atomic_write_bytes(path, data)


__all__ = ["DirectLayout", "Layout", "snapshot", "write_snapshot"]
