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

import bisect
import os
import pickle
from dataclasses import dataclass
from typing import Any, Protocol

from memplan.sim.allocations import Allocation, MemEvent, allocations, as_blocks
from memplan.sim.allocator import Block, CachingAllocator
from memplan.sim.log import LogKind
from memplan.sim.metrics import SimResult
from memplan.sim.smartpool import Lifetimes
from memplan.sim.state import Allocator
from memplan.traces.io import atomic_write_bytes

# NOTE [ Snapshot format ]
# What `snapshot` writes, as `torch.cuda.memory._snapshot()` documents it and MemoryViz.js reads:
# - `segments`, the state at the snapshot's time (NOTE [ Snapshot time ]): `device` 0, `address`,
#   `total_size`, `stream`, `segment_type` (small up to 1 MiB), `allocated_size`, `active_size`,
#   `requested_size`, `segment_pool_id` (0, 0), and `blocks` covering it in address order
#   (`size`, `requested_size`, `state` "active_allocated" or "inactive", `frames`);
# - `device_traces[0]`, per allocator action in time order: `segment_alloc`, `alloc`,
#   `free_requested` + `free_completed` (at one time), `segment_free`, `oom` (`size`: the failed
#   allocation's first buffer, `device_free`: the budget less the bytes allocated), each with
#   `addr`, `size` (requested bytes), `stream`, `time_us` (simulated, whole us), `frames`;
# - job j allocates on stream j; `frames`, innermost first: `<op target>:<op index>:<why>
#   <buffer>` (create, input, persistent, swap_in, fetch, recompute, workspace), `<module
#   path>:<op index>:<phase>` if the op names its module, `job <j> <name>:<iteration>:iteration
#   <iteration>`; none holds `_start`. `memplan`: what wrote it. Pickle protocol 4, plain types.
# Full text: docs/notes.md, "Snapshot format".
PICKLE_PROTOCOL = 4
SMALL_SEGMENT = 1 << 20  # PyTorch's small pool: requests up to 1 MiB


# ---- addresses -------------------------------------------------------------------
Action = tuple[str, int, int, int]  # (segment_alloc | segment_free, address, bytes, job)
Part = tuple[int, int, "Allocation | None"]  # a block: (address, bytes, its allocation)
Segment = tuple[int, int, int, bool, list[Part]]  # (address, bytes, job, small pool?, blocks)


class Layout(Protocol):
    """Where allocations go (NOTE [ Snapshot layout ]). `plan` sees every
    event first; `alloc` returns the block's address and the segment actions
    before it, `free` those after it (`leaving`: its job is leaving);
    `context` counts a job's context bytes (+/-) that share the device;
    `reserved` is the bytes of the segments mapped now; `segments` the state
    at the end as (address, bytes, job, small pool?, blocks in address order)."""

    reserved: int

    def plan(self, events: list[MemEvent]) -> None: ...

    def alloc(self, a: Allocation) -> tuple[int, list[Action]]: ...

    def free(self, a: Allocation, leaving: bool) -> list[Action]: ...

    def context(self, job: int, nbytes: int) -> None: ...

    def segments(self) -> list[Segment]: ...


# NOTE [ Snapshot layout ]
# Addresses of a snapshot, per memory model of the simulation (`layout_for`):
# - `exact` counts bytes, not addresses. `DirectLayout` does what PyTorch does with its cache
#   off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): each allocation a segment of its own, mapped at
#   `alloc` and returned at the free (reserved = allocated), 512-byte aligned in one range; a
#   free range is reused by the next allocation of its aligned size, else the range grows.
# - `caching`: `CachingLayout` replays each job's allocations and frees through its own
#   `CachingAllocator` with the simulator's rules (NOTE [ One process per job ] in
#   sim/ledger.py), each job's addresses moved to a range of its own. The blocks are the
#   simulator's while the calls come in its order (NOTE [ Which buffer a memory change is ],
#   NOTE [ Copies in flight ]); under `dtr` what one remake frees may come in another order.
# - `smartpool`: `SmartPoolLayout` lays out each job's lifetimes offline (sim/smartpool.py),
#   one segment of its footprint from its first allocation until it leaves. A job whose pool
#   was not admitted (NOTE [ SmartPool in the simulator ] in sim/simulate.py) has an `oom`.
# Full text: docs/notes.md, "Snapshot layout".
ALIGN = 512
BASE_ADDRESS = 0x7F0000000000  # looks like a device pointer
JOB_RANGE = 1 << 40  # the address range of each job under caching and smartpool


class DirectLayout:
    """One segment per allocation (NOTE [ Snapshot layout ])."""

    def __init__(self) -> None:
        self.top = BASE_ADDRESS
        self.reserved = 0
        self.free_ranges: dict[int, list[int]] = {}
        self.live: dict[int, tuple[int, Allocation]] = {}  # token -> (address, allocation)

    def plan(self, events: list[MemEvent]) -> None:
        pass

    def context(self, job: int, nbytes: int) -> None:
        pass

    def alloc(self, a: Allocation) -> tuple[int, list[Action]]:
        span = -(-a.nbytes // ALIGN) * ALIGN
        ranges = self.free_ranges.get(span)
        if ranges:
            addr = ranges.pop()
        else:
            addr, self.top = self.top, self.top + span
        self.live[a.token] = (addr, a)
        self.reserved += a.nbytes
        return addr, [("segment_alloc", addr, a.nbytes, a.job)]

    def free(self, a: Allocation, leaving: bool) -> list[Action]:
        addr, _ = self.live.pop(a.token)
        self.free_ranges.setdefault(-(-a.nbytes // ALIGN) * ALIGN, []).append(addr)
        self.reserved -= a.nbytes
        return [("segment_free", addr, a.nbytes, a.job)]

    def segments(self) -> list[Segment]:
        return [
            (addr, a.nbytes, a.job, a.nbytes <= SMALL_SEGMENT, [(addr, a.nbytes, a)])
            for addr, a in sorted(self.live.values())
        ]


class CachingLayout:
    """PyTorch's caching allocator per job, replayed (NOTE [ Snapshot layout ])."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.contexts = self.reserved = 0
        self.backs: dict[int, CachingAllocator] = {}
        self.blocks: dict[int, Block] = {}  # token -> its block
        self.owner: dict[tuple[int, int], Allocation] = {}  # (job, block address) -> allocation

    def plan(self, events: list[MemEvent]) -> None:
        pass

    def context(self, job: int, nbytes: int) -> None:
        self.contexts += nbytes

    def _at(self, job: int, addr: int) -> int:
        return BASE_ADDRESS + job * JOB_RANGE + addr % JOB_RANGE

    def _segments(self, job: int) -> set[tuple[int, int]]:
        return {(s.addr, s.size) for s in self.backs[job].segments()}

    def _release(self, job: int) -> list[Action]:
        before = self._segments(job)
        self.reserved -= self.backs[job].empty_cache()
        gone = sorted(before - self._segments(job))
        return [("segment_free", self._at(job, addr), n, job) for addr, n in gone]

    def alloc(self, a: Allocation) -> tuple[int, list[Action]]:
        j = a.job
        back = self.backs.setdefault(j, CachingAllocator())
        out: list[Action] = []
        need = back.growth(a.nbytes)
        if need and need > self.budget - self.contexts - self.reserved:  # PyTorch's retry
            for k in sorted(self.backs):
                out += self._release(k)
        r0 = back.reserved
        block = self.blocks[a.token] = back.malloc(a.nbytes)
        self.owner[(j, block.addr)] = a
        if back.reserved != r0:  # a new segment, the block at its front
            self.reserved += back.reserved - r0
            out.append(("segment_alloc", self._at(j, block.addr), back.reserved - r0, j))
        return self._at(j, block.addr), out

    def free(self, a: Allocation, leaving: bool) -> list[Action]:
        block = self.blocks.pop(a.token)
        del self.owner[(a.job, block.addr)]
        self.backs[a.job].free(block)
        return self._release(a.job) if leaving else []

    def segments(self) -> list[Segment]:
        out = []
        for j, back in sorted(self.backs.items()):
            for seg in back.segments():
                parts = [(self._at(j, addr), n, None if free else self.owner[(j, addr)])
                         for addr, n, free in seg.blocks]  # fmt: skip
                out.append((self._at(j, seg.addr), seg.size, j, seg.small, parts))
        return out


class SmartPoolLayout:
    """SmartPool's offline offsets, one pool per job (NOTE [ Snapshot layout ])."""

    def __init__(self) -> None:
        self.reserved = 0
        self.offset: dict[int, int] = {}  # token -> offset in its job's pool
        self.footprint: dict[int, int] = {}
        self.mapped: set[int] = set()
        self.live: dict[int, dict[int, Allocation]] = {}  # job -> token -> allocation

    def plan(self, events: list[MemEvent]) -> None:
        pools: dict[int, Lifetimes] = {}
        handle: dict[int, tuple[int, int]] = {}  # token -> (job, lifetime)
        for ev in events:
            a = ev.alloc
            if ev.action == "alloc":
                handle[a.token] = (a.job, pools.setdefault(a.job, Lifetimes()).malloc(a.nbytes))
            elif ev.action == "free":
                pools[a.job].free(handle[a.token][1])
        offsets = {}
        for j, pool in pools.items():
            lay = pool.layout()
            self.footprint[j] = lay.footprint
            offsets[j] = lay.offsets
        self.offset = {tok: int(offsets[j][k]) for tok, (j, k) in handle.items()}

    def context(self, job: int, nbytes: int) -> None:
        pass

    def _base(self, job: int) -> int:
        return BASE_ADDRESS + job * JOB_RANGE

    def alloc(self, a: Allocation) -> tuple[int, list[Action]]:
        j, out = a.job, []
        if j not in self.mapped:
            self.mapped.add(j)
            self.reserved += self.footprint[j]
            out.append(("segment_alloc", self._base(j), self.footprint[j], j))
        self.live.setdefault(j, {})[a.token] = a
        return self._base(j) + self.offset[a.token], out

    def free(self, a: Allocation, leaving: bool) -> list[Action]:
        j = a.job
        del self.live[j][a.token]
        if not (leaving and not self.live[j] and j in self.mapped):
            return []
        self.mapped.discard(j)
        self.reserved -= self.footprint[j]
        return [("segment_free", self._base(j), self.footprint[j], j)]

    def segments(self) -> list[Segment]:
        out = []
        for j in sorted(self.mapped):
            base, at, parts = self._base(j), 0, []
            for a in sorted(self.live[j].values(), key=lambda a: self.offset[a.token]):
                off = self.offset[a.token]
                if off > at:
                    parts.append((base + at, off - at, None))
                parts.append((base + off, a.nbytes, a))
                at = off + a.nbytes
            if at < self.footprint[j]:
                parts.append((base + at, self.footprint[j] - at, None))
            out.append((base, self.footprint[j], j, self.footprint[j] <= SMALL_SEGMENT, parts))
        return out


def layout_for(result: SimResult) -> Layout:
    """The layout of `result`'s memory model (NOTE [ Snapshot layout ])."""
    if result.allocator is Allocator.CACHING:
        return CachingLayout(result.budget_bytes)
    if result.allocator is Allocator.SMARTPOOL:
        return SmartPoolLayout()
    return DirectLayout()


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


def snapshot(result: SimResult, layout: Layout | None = None) -> dict[str, Any]:
    """The snapshot dict of `result` (NOTE [ Snapshot format ]), with
    addresses from `layout` (default: `layout_for(result)`)."""
    layout = layout if layout is not None else layout_for(result)
    events = as_blocks(allocations(result))
    layout.plan(events)
    if isinstance(layout, SmartPoolLayout):
        events = _admitted(result, events, layout)
    namer = _Namer(result)
    frames: dict[int, list] = {}
    addrs: dict[int, int] = {}
    trace: list[dict[str, Any]] = []
    contexts = 0

    def actions(acts: list[Action], a: Allocation, f: list) -> None:
        trace.extend(_entry(act, addr, n, a._replace(job=j), f) for act, addr, n, j in acts)

    for ev in events:
        a = ev.alloc
        if ev.action in ("context", "context_end"):
            delta = a.nbytes if ev.action == "context" else -a.nbytes
            contexts += delta
            layout.context(a.job, delta)
        elif ev.action == "oom":
            free = max(result.budget_bytes - contexts - layout.reserved, 0)
            e = {"action": "oom", "size": a.nbytes, "device_free": free, "stream": a.job}
            trace.append({**e, "time_us": int(round(ev.t_us)), "frames": namer.frames(a)})
        elif ev.action == "alloc":
            f = frames[a.token] = namer.frames(a)
            addr, before = layout.alloc(a)
            addrs[a.token] = addr
            actions(before, a, f)
            trace.append(_entry("alloc", addr, a.nbytes, a, f))
        else:  # a free (of the block `a` took: NOTE [ Copies in flight ])
            f, addr = frames.pop(a.token), addrs.pop(a.token)
            at_free = a._replace(t_us=ev.t_us)
            trace.append(_entry("free_requested", addr, a.nbytes, at_free, f))
            trace.append(_entry("free_completed", addr, a.nbytes, at_free, f))
            actions(layout.free(a, ev.leaving), at_free, f)
    return {
        "segments": [_segment(seg, frames) for seg in layout.segments()],
        "device_traces": [trace],
        "memplan": {
            "written_by": "memplan simulate",
            "hardware": result.hardware,
            "budget_bytes": result.budget_bytes,
            "allocator": result.allocator.value,
            "context_reserve_bytes": result.context_reserve_bytes,
            "peak_bytes": result.peak_bytes,
            "jobs": [{"index": j.index, "name": j.name, "stream": j.index} for j in result.jobs],
        },
    }


def _admitted(result: SimResult, events: list[MemEvent], pools: SmartPoolLayout) -> list[MemEvent]:
    """`events` without the jobs whose pool was not admitted
    (NOTE [ SmartPool in the simulator ] in sim/simulate.py): an `oom` for
    their pool and context at their arrival instead."""
    logged = {e.job for e in result.log if e.kind is LogKind.OOM}
    refused = {j.index for j in result.jobs if j.oom_at == (0, -1, -1)} - logged
    if not refused:
        return events
    out = [ev for ev in events if ev.alloc.job not in refused]
    for j in sorted(refused):
        t = result.jobs[j].start_s * 1e6
        n = pools.footprint.get(j, 0) + result.context_reserve_bytes
        k = bisect.bisect_right([ev.t_us for ev in out], t)
        out.insert(k, MemEvent(t, "oom", Allocation(-1, t, j, n, -1, -1, 0, "oom")))
    return out


def _segment(seg: Segment, frames: dict[int, list]) -> dict[str, Any]:
    addr, total, stream, small, parts = seg
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
        "segment_type": "small" if small else "large",
        "segment_pool_id": (0, 0),
        "allocated_size": active,
        "active_size": active,
        "requested_size": sum(b["requested_size"] for b in blocks),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


def write_snapshot(
    result: SimResult, path: str | os.PathLike[str], layout: Layout | None = None
) -> None:
    """`snapshot(result, layout)` pickled to `path`, atomically."""
    atomic_write_bytes(path, pickle.dumps(snapshot(result, layout), protocol=PICKLE_PROTOCOL))


__all__ = [
    "CachingLayout",
    "DirectLayout",
    "Layout",
    "SmartPoolLayout",
    "layout_for",
    "snapshot",
    "write_snapshot",
]
