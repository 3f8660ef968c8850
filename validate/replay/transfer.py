"""A transfer: one copy of a buffer between the device pool and the host pool,
from its trigger to its end, and the record it leaves once it moved bytes.

The executor makes one when a plan's swap fires, the pool registers it as
leaving or arriving (`validate/replay/pool.py`), a copy lane carries it
through its steps (`validate/replay/lanes.py`), and whoever waits for it
waits on its `done` latch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memplan.hwmodels.device import Direction

if TYPE_CHECKING:
    import torch


class Latch:
    """Set once, waited on by any number of threads: a held lock that `set`
    releases (cheaper than a `threading.Event`: no Condition to make, no
    waiter list to notify, NOTE [ Lean lanes ] in `validate/replay/lanes.py`)."""

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
        wait = -1 if timeout is None else min(timeout, threading.TIMEOUT_MAX)
        if not self._lock.acquire(timeout=wait):
            return False
        self._lock.release()  # the next waiter passes too
        return True


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
