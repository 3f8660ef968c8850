"""Copy lanes: workers that move buffers between the device pool and the host
pool, one transfer at a time per lane, like the simulator's PCIe lanes.

A transfer is queued when its trigger op ends and may not start before
`ready_s` (the trigger's end plus the plan's `delay_us`). It goes through
the simulator's three steps (`sim/transfers.py`):
- ready (`Mover.arrive`): what needs no lane is settled at once, even while
  the lane is busy -- a swap-out of a buffer the framework freed meanwhile
  is dropped, one of a buffer whose host copy is still valid is a discard
  (NOTE [ Keep ] in `validate/replay/pool.py`); the rest queue for the lane, FIFO
  in order of ready time;
- start (`Mover.start`), when it gets the lane: a swap-out of a buffer
  needed again meanwhile does not start; a swap-in takes its device bytes;
  the bytes are copied;
- end (`Mover.end`), when the lane has been busy for `nbytes / bandwidth`:
  a swap-out makes its host copy and frees the device copy (unless kept); a
  swap-in's buffer becomes usable.

# NOTE [ Throttled copies ]
On CPU a copy is a memcpy on the lane's thread, far faster than PCIe. Given
`bandwidth_bytes_per_s`, the lane emulates the link on a schedule: a
transfer occupies the link from the later of its ready time and the end of
the link's previous transfer, for `nbytes / bandwidth`, and the lane holds
it until then, so its end (a swap-out's free, a swap-in's arrival) comes
when the link's would. The schedule is the link's, not the thread's: a
thread that wakes late (timer overshoot, the GIL, a busy CPU) does not push
every later transfer back by as much -- the link was free on time -- it
only ends that transfer late, and catches up. Waiting out the span is the
emulation of a device lane, not a wait for a result: the thread sleeps
until the earlier of the copy's end and the next transfer's ready time, and
wakes for either or for a new transfer; nothing polls. What the emulation
adds -- the thread's wake-up after the span, its bookkeeping, which bounds
how fast it can take transfers whose bytes take less (tens of us here) --
is the lane's fixed cost, measured by the lane probe (NOTE [ The lane
probe ] in `validate/calibrate/measure.py`). To keep it small and steady the lane
thread asks the kernel for exact timer wake-ups (`PR_SET_TIMERSLACK`; the
default slack lets every timed wait overshoot by up to 50 us) and, where
allowed, a higher scheduling priority than the compute thread (a copy
engine does not wait for a CPU); both Linux only, best effort. On CUDA the
copy runs on the lane's own stream into (or out of) pinned host memory; the
lane waits for the copy's event before it ends the transfer, so the lane is
busy at least while the copy engine is.

# NOTE [ Lean lanes ]
On CPU the lane thread is Python: every step of a transfer it runs holds the
GIL, and an op that returns meanwhile waits for it; every wake-up of the
lane thread is a kernel round trip. That cost lands on the compute thread,
which the simulator's copy engine never slows (NOTE [ Transfers cost the
compute thread too ] in `validate/calibrate/measure.py`), and it swings with the
machine, so the lane does as little as it can per transfer:
- a transfer that is ready when queued arrives on the queueing thread, and
  the lane thread is woken only for what it must do before it wakes anyway:
  a copy for an idle lane, an earlier ready time; a busy lane takes a new
  copy when its current one ends, without a wake-up of its own;
- a copy up to `GIL_COPY_BYTES` is a `memmove` that keeps the GIL (a few
  microseconds here, less than handing the GIL over and back), a larger one
  lets the compute thread run meanwhile; the copies go between untyped
  storages, with no tensor made per copy;
- a transfer's `done` is a `Latch` (a held lock), not a `threading.Event`.
Measured on tiny_resnet's TENSILE plan (about 135 transfers an iteration,
most under 1 KiB): the compute thread's extra wall time per transfer went
from 35 to 29 us, the lane thread's CPU from 28 to 25 us.

# NOTE [ Test synchronisation ]
`LaneSync.copy_started(t)` is called on the lane thread once a copy holds
the lane, `copy_ending(t)` when its span is over, before it ends: a test can
hold the copy there (on a `threading.Event`) until the compute thread has
reached a given op, or let the compute thread wait for it, to put the two
threads in a chosen order without timing. Replays pass None.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import heapq
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from memplan.validate.replay.pool import DevicePool

_PR_SET_TIMERSLACK = 29
LANE_NICE = -10  # the lane thread's nice value where the process may raise it
GIL_COPY_BYTES = 64 * 1024  # CPU copies up to this size keep the GIL (NOTE [ Lean lanes ])


class Latch:
    """Set once, waited on by any number of threads: a held lock that `set`
    releases (cheaper than a `threading.Event`: no Condition to make, no
    waiter list to notify, NOTE [ Lean lanes ])."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is set, waiting up to `timeout` seconds (None: for ever)."""
        if self._set:
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._lock.release()  # the next waiter passes too
        return True


class Direction(enum.Enum):
    D2H = "swap_out"
    H2D = "swap_in"


@dataclass(slots=True)
class Transfer:
    """One queued copy. `done` is set when it ends, is dropped, or failed."""

    direction: Direction
    buffer: int
    iteration: int
    label: str  # how errors name it: "swap_in of buffer 7 after op 12 of iteration 0"
    nbytes: int  # by the trace: what the lane is busy for
    queued_s: float  # perf_counter seconds: when its trigger op ended
    ready_s: float  # not started before (queued_s + the plan's delay)
    lifetime: int  # the buffer's lifetime when queued: a free in between cancels it
    compute_ready: Any = None  # torch.cuda.Event after the trigger op, CUDA only
    done: Latch = field(default_factory=Latch)
    start_s: float = 0.0
    end_s: float = 0.0
    running: bool = False  # its copy holds the lane
    owns_bytes: bool = False  # the buffer died while it ran: its end frees them
    version: int = -1  # the data version when the copy started (swap-out)
    host: torch.UntypedStorage | None = None  # the host copy being made (swap-out)
    event: Any = None  # CUDA: the copy's event


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """A copy that moved bytes; times in seconds since the replay started."""

    direction: Direction
    buffer: int
    iteration: int
    nbytes: int
    queued_s: float
    ready_s: float
    start_s: float
    end_s: float


class LaneSync(Protocol):
    """NOTE [ Test synchronisation ]"""

    def copy_started(self, t: Transfer) -> None: ...

    def copy_ending(self, t: Transfer) -> None: ...


class Mover:
    """The three steps of a transfer against the pool: CPU memcpy, or CUDA
    side streams. `arrive` and `start` return whether the transfer goes on."""

    def __init__(self, pool: DevicePool, lanes: int):
        self.pool = pool
        self.cuda = pool.device.type == "cuda"
        self.streams = [torch.cuda.Stream(pool.device) for _ in range(lanes)] if self.cuda else []
        self.compute_stream = torch.cuda.current_stream(pool.device) if self.cuda else None

    def _table(self, t: Transfer) -> dict[int, Transfer]:
        return self.pool.leaving if t.direction is Direction.D2H else self.pool.arriving

    def _fail(self, t: Transfer, msg: str) -> bool:
        with self.pool.lock:
            self.pool.errors.append(f"{t.label}: {msg}")
            if self._table(t).get(t.buffer) is t:
                del self._table(t)[t.buffer]
        return False

    def _current(self, t: Transfer) -> bool:
        """Whether `t` still acts on its buffer (not freed by the framework)."""
        pool = self.pool
        return pool.lifetime[t.buffer] == t.lifetime and self._table(t).get(t.buffer) is t

    def arrive(self, t: Transfer) -> bool:
        """Its ready time has come: settle it if it needs no lane."""
        pool, b = self.pool, t.buffer
        with pool.lock:
            if not self._current(t):
                return False
            if t.direction is Direction.D2H and pool.host_valid(b):
                del pool.leaving[b]  # a discard: no bytes move (NOTE [ Keep ])
                if not pool.stays(b):
                    pool.drop(b)
                return False
        return True

    def start(self, t: Transfer, lane: int) -> bool:
        """It has the lane: start the copy (memory taken for a swap-in)."""
        if t.direction is Direction.D2H:
            return self._start_out(t, lane)
        return self._start_in(t, lane)

    def _start_out(self, t: Transfer, lane: int) -> bool:
        pool, b = self.pool, t.buffer
        with pool.lock:
            if not self._current(t):
                return False
            if b in pool.keep:  # needed again before the copy began: it stays
                pool.keep.discard(b)
                del pool.leaving[b]
                return False
            src = pool.storage[b]
            if src is None:
                return self._fail(t, "not on the device when the copy starts")
            t.version = int(pool.version[b])
            t.running = True
        if self.cuda:
            host = torch.empty(src.nbytes(), dtype=torch.uint8, pin_memory=True)
            stream = self.streams[lane]
            with torch.cuda.stream(stream):
                stream.wait_event(t.compute_ready)
                dev = torch.empty(0, dtype=torch.uint8, device=pool.device).set_(src)
                dev.record_stream(stream)
                host.copy_(dev, non_blocking=True)
                t.event = torch.cuda.Event()
                t.event.record(stream)
            t.host = host.untyped_storage()
        else:
            t.host = torch.UntypedStorage(src.nbytes())
            cpu_copy(t.host, src)
        return True

    def _start_in(self, t: Transfer, lane: int) -> bool:
        pool, b = self.pool, t.buffer
        with pool.lock:
            if not self._current(t):
                return False
            if pool.on_device(b):
                return self._fail(t, "already on the device when the copy starts")
            host = pool.host[b]
            if host is None or not pool.host_valid(b):
                stale = pool.stale_by.get(b)
                why = "it was never swapped out" if stale is None else f"op {stale} wrote it since"
                return self._fail(t, f"no valid host copy ({why})")
            if self.cuda:
                with torch.cuda.stream(self.streams[lane]):
                    dev = torch.empty(host.nbytes(), dtype=torch.uint8, device=pool.device)
                storage = dev.untyped_storage()
            else:
                storage = torch.UntypedStorage(host.nbytes(), device=pool.device)
            pool.bind(b, storage)  # memory is taken when the copy starts
            t.running = True
        if self.cuda:
            with torch.cuda.stream(self.streams[lane]):
                dev.copy_(torch.empty(0, dtype=torch.uint8).set_(host), non_blocking=True)
                t.event = torch.cuda.Event()
                t.event.record(self.streams[lane])
            dev.record_stream(self.compute_stream)
        else:
            cpu_copy(storage, host)
        return True

    def end(self, t: Transfer) -> None:
        """The copy's span is over: a swap-out frees the device copy (unless
        kept, NOTE [ Keep ]); a swap-in's buffer is usable."""
        if t.event is not None:
            t.event.synchronize()
        pool, b = self.pool, t.buffer
        with pool.lock:
            t.running = False
            if t.owns_bytes:  # the framework freed it meanwhile: give back its bytes
                pool.unreserve(t.nbytes)
                return
            if self._table(t).get(b) is t:
                del self._table(t)[b]
            if t.direction is Direction.H2D:
                return
            assert t.host is not None
            # a write that overlapped the copy in any way makes it stale
            fresh = pool.version[b] == t.version and b not in pool.writing
            if fresh:
                pool.set_host(b, t.host, t.version)
            else:
                pool.stale_by[b] = pool.writing_op if b in pool.writing else pool.writers[b][-1]
            if not pool.stays(b):
                pool.drop(b)
        t.host = None


@functools.cache
def _memmove_holding_gil() -> Any:
    """libc's `memmove` called without releasing the GIL (NOTE [ Lean
    lanes ]); None where the process's symbols cannot be loaded."""
    try:
        fn = ctypes.PyDLL(None).memmove  # a PyDLL call keeps the GIL; a CDLL call drops it
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    fn.restype = ctypes.c_void_p
    return fn


def cpu_copy(dst: torch.UntypedStorage, src: torch.UntypedStorage) -> None:
    """Copy `src` into `dst` (as large) on the calling thread: a small copy
    keeps the GIL, a large one lets the compute thread run meanwhile (NOTE
    [ Lean lanes ])."""
    n = src.nbytes()
    if n == 0:
        return
    small = _memmove_holding_gil() if n <= GIL_COPY_BYTES else None
    (small or ctypes.memmove)(dst.data_ptr(), src.data_ptr(), n)


@functools.cache
def _prctl() -> Any:
    """libc's `prctl` (Linux), None elsewhere; looked up once, as the lookup
    is slow for a lane's first transfer."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).prctl  # the process's own symbols include libc's
    except (OSError, AttributeError):
        return None


def _prompt_wakeups() -> None:
    """NOTE [ Throttled copies ]: exact timer wake-ups and, if allowed, a
    higher priority for the calling thread (Linux: a thread is a task)."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    with contextlib.suppress(OSError):  # raising a priority needs CAP_SYS_NICE
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LANE_NICE)


class Lane(threading.Thread):
    """One copy lane: a worker thread taking one transfer at a time."""

    def __init__(
        self,
        index: int,
        mover: Mover,
        bandwidth_bytes_per_s: float | None,
        t0: float,
        sync: LaneSync | None = None,
    ):
        super().__init__(name=f"memplan-copy-lane-{index}", daemon=True)
        self.index = index
        self.mover = mover
        self.bandwidth = bandwidth_bytes_per_s
        self.t0 = t0
        self.sync = sync
        self.records: list[TransferRecord] = []
        # Both heaps hold (ready_s, seq, transfer) and are guarded by `_lock`,
        # as are `_closed`, `_idle` and `_wake_at`.
        self._queue: list[tuple[float, int, Transfer]] = []  # not ready yet
        self._fifo: list[tuple[float, int, Transfer]] = []  # ready: FIFO by ready time
        self._seq = 0
        self._lock = threading.Lock()
        # A binary semaphore: released by whoever has news for the lane thread,
        # which sleeps on it (cheaper than a Condition: one C-level lock, no
        # waiter allocation per wait). Never a lost wake-up: news that comes
        # while the lane is awake leaves it released, and the next sleep ends
        # at once.
        self._wake = threading.Lock()
        self._wake.acquire()
        self._closed = False
        self._idle = True  # no copy holds the lane
        self._wake_at = -math.inf  # when the sleeping lane wakes anyway; -inf: awake

    def _poke(self) -> None:
        with contextlib.suppress(RuntimeError):  # already released: the lane will look
            self._wake.release()

    def submit(self, t: Transfer) -> None:
        """Queue `t`; one that is ready already arrives on the calling thread
        (NOTE [ Lean lanes ]: the lane is woken only for what it must do
        before it would wake anyway)."""
        now = time.perf_counter()
        if t.ready_s <= now and not self._step(t, self.mover.arrive):
            self._finish(t, moved=False)
            return
        with self._lock:
            item = (t.ready_s, self._seq, t)
            self._seq += 1
            if t.ready_s <= now:
                heapq.heappush(self._fifo, item)
                due = now if self._idle else math.inf  # a busy lane takes it when it ends
            else:
                heapq.heappush(self._queue, item)
                due = t.ready_s
            poke = due < self._wake_at
        if poke:
            self._poke()

    def close(self) -> None:
        """Finish the queued transfers, then stop."""
        with self._lock:
            self._closed = True
        self._poke()

    def _step(self, t: Transfer, step: Any, *args: Any) -> Any:
        try:
            return step(t, *args)
        except Exception as e:  # reported by the compute loop, never lost
            with self.mover.pool.lock:
                self.mover.pool.errors.append(f"{t.label}: {e!r}")
            return False

    def run(self) -> None:
        _prompt_wakeups()
        if self.mover.cuda:
            torch.cuda.set_device(self.mover.pool.device)
        clock, mover, sync, lock = time.perf_counter, self.mover, self.sync, self._lock
        queue, fifo = self._queue, self._fifo
        current: Transfer | None = None
        end_at = math.inf
        free_at = -math.inf  # when the emulated link finished its last transfer
        while True:
            if queue:  # delayed transfers whose ready time has come arrive
                with lock:
                    now, due = clock(), []
                    while queue and queue[0][0] <= now:
                        due.append(heapq.heappop(queue))
                for item in due:
                    if self._step(item[2], mover.arrive):
                        with lock:
                            heapq.heappush(fifo, item)
                    else:
                        self._finish(item[2], moved=False)
            if current is not None and clock() >= end_at:
                if sync is not None:
                    self._step(current, sync.copy_ending)
                self._step(current, mover.end)
                current.end_s = clock()
                self._finish(current, moved=True)
                current, end_at = None, math.inf
            if current is None and fifo:
                with lock:
                    t = heapq.heappop(fifo)[2]
                t.start_s = clock()
                if not self._step(t, mover.start, self.index):
                    self._finish(t, moved=False)
                    continue
                current = t
                if self.bandwidth:  # NOTE [ Throttled copies ]
                    end_at = free_at = max(t.ready_s, free_at) + t.nbytes / self.bandwidth
                else:
                    end_at = t.start_s
                if sync is not None:
                    self._step(t, sync.copy_started)
            with lock:
                if current is None and fifo:
                    continue  # the next copy takes the lane at once
                if self._closed and current is None and not queue:
                    return
                wake = min(end_at, queue[0][0] if queue else math.inf)
                self._idle = current is None
                self._wake_at = wake
            if wake == math.inf:
                self._wake.acquire()  # a new transfer, or the close
            elif (timeout := wake - clock()) > 0:
                self._wake.acquire(timeout=timeout)  # a copy's end, a ready time, or news
            with lock:
                self._wake_at = -math.inf

    def _finish(self, t: Transfer, moved: bool) -> None:
        pool = self.mover.pool
        with pool.lock:
            table = pool.leaving if t.direction is Direction.D2H else pool.arriving
            if table.get(t.buffer) is t and not t.running:
                del table[t.buffer]
            if moved:
                self.records.append(
                    TransferRecord(
                        t.direction,
                        t.buffer,
                        t.iteration,
                        t.nbytes,
                        t.queued_s - self.t0,
                        t.ready_s - self.t0,
                        t.start_s - self.t0,
                        t.end_s - self.t0,
                    )
                )
        t.done.set()
