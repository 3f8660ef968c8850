"""Copy lanes: workers that move buffers between the device pool and the host
pool, one transfer at a time per lane, like the simulator's PCIe lanes.

A transfer is queued when its trigger op ends and may not start before
`ready_s` (the trigger's end plus the plan's `delay_us`); each lane runs its
transfers in order of `ready_s`, then of submission.

# NOTE [ Throttled copies ]
On CPU a copy is a memcpy on the lane's thread, far faster than PCIe. Given
`bandwidth_bytes_per_s`, the lane sleeps after each copy for the rest of
`nbytes / bandwidth`, so a transfer occupies its lane as long as it would on
the emulated link. The sleep is the emulation of a device lane, not a wait
for a result: nothing polls. On CUDA the copy runs on the lane's own stream
into (or out of) pinned host memory; the lane thread waits for the copy's
event before it takes the next transfer, so the lane is busy exactly while
the copy engine is.
"""

from __future__ import annotations

import enum
import heapq
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from validate.pool import DevicePool


class Direction(enum.Enum):
    D2H = "swap_out"
    H2D = "swap_in"


@dataclass(slots=True)
class Transfer:
    """One queued copy. `done` is set when it ends (or failed)."""

    direction: Direction
    buffer: int
    iteration: int
    label: str  # how errors name it: "swap_in of buffer 7 after op 12 of iteration 0"
    queued_s: float  # perf_counter seconds: when its trigger op ended
    ready_s: float  # not started before (queued_s + the plan's delay)
    lifetime: int  # the buffer's lifetime when queued: a free in between cancels it
    version: int  # the data version when queued: a swap-out copies exactly that
    after: threading.Event | None = None  # a copy this one must follow (other lane)
    compute_ready: Any = None  # torch.cuda.Event after the trigger op, CUDA only
    done: threading.Event = field(default_factory=threading.Event)
    start_s: float = 0.0
    end_s: float = 0.0
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """A finished transfer; times in seconds since the replay started."""

    direction: Direction
    buffer: int
    iteration: int
    nbytes: int
    queued_s: float
    ready_s: float
    start_s: float
    end_s: float


class Mover:
    """Executes copies against the pool: CPU memcpy, or CUDA side streams."""

    def __init__(self, pool: DevicePool, lanes: int):
        self.pool = pool
        self.cuda = pool.device.type == "cuda"
        self.streams = [torch.cuda.Stream(pool.device) for _ in range(lanes)] if self.cuda else []
        self.compute_stream = torch.cuda.current_stream(pool.device) if self.cuda else None

    def run(self, t: Transfer, lane: int) -> int:
        """Copy `t`; returns the bytes moved (0 if the buffer died meanwhile)."""
        if t.direction is Direction.D2H:
            return self._swap_out(t, lane)
        return self._swap_in(t, lane)

    def _fail(self, t: Transfer, msg: str) -> int:
        with self.pool.lock:
            self.pool.errors.append(f"{t.label}: {msg}")
        return 0

    def _swap_out(self, t: Transfer, lane: int) -> int:
        pool, b = self.pool, t.buffer
        with pool.lock:
            if pool.lifetime[b] != t.lifetime:
                t.cancelled = True  # the framework freed it first: nothing to keep
                return 0
            if not pool.on_device(b):
                return self._fail(t, "not on the device when the copy starts")
            if pool.version[b] != t.version:
                return self._fail(t, f"op {pool.writers[b][-1]} wrote it before the copy started")
            src = pool.bytes_of(b)
            version = t.version
        host = torch.empty(src.numel(), dtype=torch.uint8, pin_memory=self.cuda)
        if self.cuda:
            stream = self.streams[lane]
            with torch.cuda.stream(stream):
                stream.wait_event(t.compute_ready)
                src.record_stream(stream)
                host.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            event.synchronize()
        else:
            host.copy_(src)
        del src
        with pool.lock:
            if pool.lifetime[b] != t.lifetime:
                t.cancelled = True
                return 0
            if pool.version[b] != version:
                return self._fail(t, f"op {pool.writers[b][-1]} wrote it during the copy")
            pool.set_host(b, host, version)
            pool.drop(b)  # now, or when the op holding it ends
        return host.numel()

    def _swap_in(self, t: Transfer, lane: int) -> int:
        pool, b = self.pool, t.buffer
        with pool.lock:
            if pool.lifetime[b] != t.lifetime:
                t.cancelled = True
                return 0
            if pool.on_device(b):
                return self._fail(t, "already on the device when the copy starts")
            if not pool.host_valid(b):
                stale = pool.stale_by.get(b)
                why = "it was never swapped out" if stale is None else f"op {stale} wrote it since"
                return self._fail(t, f"no valid host copy ({why})")
            host = pool.host[b]
            assert host is not None
        if self.cuda:
            stream = self.streams[lane]
            with torch.cuda.stream(stream):
                dev = torch.empty(host.numel(), dtype=torch.uint8, device=pool.device)
                pool.bind(b, dev.untyped_storage())  # memory is taken when the copy starts
                dev.copy_(host, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            event.synchronize()
            dev.record_stream(self.compute_stream)
        else:
            dev = torch.empty(host.numel(), dtype=torch.uint8, device=pool.device)
            pool.bind(b, dev.untyped_storage())
            dev.copy_(host)
        return host.numel()


class Lane(threading.Thread):
    """One copy lane: a worker thread taking one transfer at a time."""

    def __init__(self, index: int, mover: Mover, bandwidth_bytes_per_s: float | None, t0: float):
        super().__init__(name=f"memplan-copy-lane-{index}", daemon=True)
        self.index = index
        self.mover = mover
        self.bandwidth = bandwidth_bytes_per_s
        self.t0 = t0
        self.records: list[TransferRecord] = []
        self._queue: list[tuple[float, int, Transfer]] = []
        self._seq = 0
        self._cond = threading.Condition()
        self._closed = False

    def submit(self, t: Transfer) -> None:
        with self._cond:
            heapq.heappush(self._queue, (t.ready_s, self._seq, t))
            self._seq += 1
            self._cond.notify()

    def close(self) -> None:
        """Finish the queued transfers, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _next(self) -> Transfer | None:
        with self._cond:
            while True:
                if self._queue:
                    ready = self._queue[0][0]
                    now = time.perf_counter()
                    if ready <= now:
                        return heapq.heappop(self._queue)[2]
                    self._cond.wait(ready - now)  # a delayed transfer, or an earlier one arrives
                elif self._closed:
                    return None
                else:
                    self._cond.wait()

    def run(self) -> None:
        if self.mover.cuda:
            torch.cuda.set_device(self.mover.pool.device)
        while (t := self._next()) is not None:
            if t.after is not None:
                t.after.wait()
            t.start_s = time.perf_counter()
            try:
                nbytes = self.mover.run(t, self.index)
            except Exception as e:  # reported by the compute loop, never lost
                nbytes = 0
                with self.mover.pool.lock:
                    self.mover.pool.errors.append(f"{t.label}: {e!r}")
            if self.bandwidth and nbytes:
                rest = nbytes / self.bandwidth - (time.perf_counter() - t.start_s)
                if rest > 0:
                    time.sleep(rest)  # NOTE [ Throttled copies ]
            t.end_s = time.perf_counter()
            self._finish(t, nbytes)

    def _finish(self, t: Transfer, nbytes: int) -> None:
        pool = self.mover.pool
        with pool.lock:
            table = pool.leaving if t.direction is Direction.D2H else pool.arriving
            if table.get(t.buffer) is t:
                del table[t.buffer]
            if not t.cancelled:
                self.records.append(
                    TransferRecord(
                        t.direction,
                        t.buffer,
                        t.iteration,
                        nbytes,
                        t.queued_s - self.t0,
                        t.ready_s - self.t0,
                        t.start_s - self.t0,
                        t.end_s - self.t0,
                    )
                )
        t.done.set()
