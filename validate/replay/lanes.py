"""Copy lanes: worker threads that carry transfers between the device pool and
the host pool, one at a time per lane, like the simulator's PCIe lanes.

A transfer is queued when its trigger op ends and may not start before
`ready_s` (the trigger's end plus the plan's `delay_us`). The lane takes it
through its steps (`validate/replay/mover.py`): it arrives at its ready
time, queues for the lane, FIFO in order of ready time, starts when it gets
the lane, and ends when the lane has been busy for it."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import heapq
import math
import os
import sys
import threading
import time
from typing import Any, Protocol

import torch
from memplan.validate.replay.mover import Mover
from memplan.validate.replay.transfer import Transfer, TransferRecord

# NOTE [ Throttled copies ]
# On CPU a copy is a memcpy on the lane's thread, far faster than PCIe. Given
# `bandwidth_bytes_per_s`, the lane emulates the link on a schedule: a transfer occupies it
# from the later of its ready time and the link's previous end, for `nbytes / bandwidth`,
# and the lane holds it until then. The schedule is the link's, not the thread's: a thread
# that wakes late only ends that transfer late and catches up. The thread sleeps until the
# earlier of the copy's end and the next transfer's ready time; nothing polls. What the
# emulation adds (wake-up, bookkeeping) is the lane's fixed cost (NOTE [ The lane probe ] in
# `validate/calibrate/measure.py`); to keep it small and steady the lane thread asks for exact
# timer wake-ups (`PR_SET_TIMERSLACK`) and, where allowed, a higher priority than the compute
# thread (Linux only, best effort). On CUDA the copy runs on the lane's own stream with
# pinned host memory, and the lane waits for the copy's event before ending the transfer.
# Full text: docs/notes.md, "Throttled copies".

# NOTE [ Lean lanes ]
# On CPU the lane thread is Python: every step holds the GIL and every wake-up is a kernel
# round trip, a cost that lands on the compute thread and swings with the machine
# (NOTE [ Transfers cost the compute thread too ] in `validate/calibrate/measure.py`). So per
# transfer the lane does as little as it can:
# - a transfer ready when queued is handed over on the queueing thread; the lane thread is
#   woken only for a copy for an idle lane or an earlier ready time;
# - a copy up to `GIL_COPY_BYTES` (`validate/replay/mover.py`) is a `memmove` that keeps the
#   GIL, a larger one releases it; copies go between untyped storages;
# - `done` is a `Latch` (a held lock), not a `threading.Event`;
# - the pool's lock is taken once per step, never for the lane's records (NOTE [ One lock ]
#   in `validate/replay/pool.py`).
# Measured gains: docs/notes.md, "Lean lanes".

# NOTE [ Test synchronisation ]
# `LaneSync.copy_started(t)` is called on the lane thread once a copy holds
# the lane, `copy_ending(t)` when its span is over, before it ends: a test can
# hold the copy there (on a `threading.Event`) until the compute thread has
# reached a given op, or let the compute thread wait for it, to put the two
# threads in a chosen order without timing. Replays pass None.


# NOTE [ A lane that dies ]
# The compute thread waits on transfers that only a lane thread ends. If the
# lane thread itself raised -- outside a transfer's steps, which report
# their own errors (`Lane._step`) -- every transfer it held or had queued
# would never end, and the compute thread would wait for ever (a plan's
# delay of 1e308 us once made `acquire(timeout=1e302)` raise OverflowError
# there). So whatever escapes the lane's loop fails each of its transfers
# with that error and sets their `done`; the compute thread wakes and raises
# it (`pool.lane_error`) as a `ValidationError`, and a transfer submitted to
# a dead lane fails at once. Timed waits are clamped to
# `threading.TIMEOUT_MAX`: a later wake-up only looks again.


_PR_SET_TIMERSLACK = 29
LANE_NICE = -10  # the lane thread's nice value where the process may raise it


class LaneSync(Protocol):
    """NOTE [ Test synchronisation ]"""

    def copy_started(self, t: Transfer) -> None: ...

    def copy_ending(self, t: Transfer) -> None: ...


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
    """One copy lane: a worker thread taking one transfer at a time through
    the `mover`'s steps (it never touches the pool itself)."""

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
        self._current: Transfer | None = None  # the copy holding the lane
        self._dead: BaseException | None = None  # NOTE [ A lane that dies ]

    def _poke(self) -> None:
        with contextlib.suppress(RuntimeError):  # already released: the lane will look
            self._wake.release()

    def submit(self, t: Transfer) -> None:
        """Queue `t`; one that is ready already arrives on the calling thread
        (NOTE [ Lean lanes ]: the lane is woken only for what it must do
        before it would wake anyway)."""
        now = time.perf_counter()
        if self._dead is not None:  # NOTE [ A lane that dies ]
            self._fail(t, self._dead)
            return
        if t.ready_s <= now and not self._step(t, self.mover.arrive):
            self._finish(t, moved=False)
            return
        with self._lock:
            dead = self._dead
            item = (t.ready_s, self._seq, t)
            self._seq += 1
            if t.ready_s <= now:
                heapq.heappush(self._fifo, item)
                due = now if self._idle else math.inf  # a busy lane takes it when it ends
            else:
                heapq.heappush(self._queue, item)
                due = t.ready_s
            poke = due < self._wake_at
        if dead is not None:  # it died while `t` arrived: nobody takes the queues
            self._fail(t, dead)
        elif poke:
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
            self.mover.fail(t, e)
            return False

    def _fail(self, t: Transfer, error: BaseException) -> None:
        """End `t` as failed by `error` (NOTE [ A lane that dies ])."""
        try:
            self.mover.fail(t, RuntimeError(f"copy lane {self.index} stopped: {error!r}"))
        finally:
            t.done.set()

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # noqa: BLE001 -- handed to the compute thread
            with self._lock:
                self._dead = e
                orphans = [item[2] for item in (*self._fifo, *self._queue)]
                self._fifo.clear()
                self._queue.clear()
            if self._current is not None:
                orphans.insert(0, self._current)
            for t in orphans:
                self._fail(t, e)

    def _serve(self) -> None:
        """The lane's loop: transfers through their steps until closed."""
        _prompt_wakeups()
        if self.mover.cuda:
            torch.cuda.set_device(self.mover.device)
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
                current = self._current = None
                end_at = math.inf
            if current is None and fifo:
                with lock:
                    t = heapq.heappop(fifo)[2]
                t.start_s = clock()
                if not self._step(t, mover.start, self.index):
                    self._finish(t, moved=False)
                    continue
                current = self._current = t
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
                # a copy's end, a ready time, or news (NOTE [ A lane that dies ]: clamped)
                self._wake.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))
            with lock:
                self._wake_at = -math.inf

    def _finish(self, t: Transfer, moved: bool) -> None:
        """`t` is over (the mover took it off the pool's tables): record it if
        it moved bytes, and let its waiters go."""
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
