"""A transfer's steps against the device pool, as a copy lane takes them:
the simulator's three steps (`sim/transfers.py`) and the bytes copied
between them.

- ready (`Mover.arrive`): what needs no lane is settled at once, even while
  the lane is busy -- a swap-out of a buffer the framework freed meanwhile
  is dropped, one of a buffer whose host copy is still valid is a discard
  (NOTE [ Keep ] in `validate/replay/pool.py`); the rest queue for the lane,
  FIFO in order of ready time;
- start (`Mover.start`), when it gets the lane: a swap-out of a buffer
  needed again meanwhile does not start; a swap-in takes its device bytes;
  the bytes are copied (on CPU a memcpy on the lane's thread, on CUDA a
  copy on the lane's own stream into or out of pinned host memory);
- end (`Mover.end`), when the lane has been busy for `nbytes / bandwidth`
  (NOTE [ Throttled copies ] in `validate/replay/lanes.py`): a swap-out
  makes its host copy and frees the device copy (unless kept); a swap-in's
  buffer becomes usable.

Every state change is the pool's (NOTE [ One lock ] in
`validate/replay/pool.py`); the mover only copies bytes.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch
from memplan.validate.replay.pool import Allocate, DevicePool
from memplan.validate.replay.transfer import Direction, Transfer

GIL_COPY_BYTES = 64 * 1024  # CPU copies up to this size keep the GIL (NOTE [ Lean lanes ])


class Mover:
    """The steps of a transfer against `pool`: CPU memcpy, or CUDA side
    streams, one per lane. `arrive` and `start` return whether the transfer
    goes on; once they return False it is off the pool's tables."""

    def __init__(self, pool: DevicePool, lanes: int):
        self.pool = pool
        self.device = pool.device
        self.cuda = pool.device.type == "cuda"
        self.streams = [torch.cuda.Stream(pool.device) for _ in range(lanes)] if self.cuda else []
        self.compute_stream = torch.cuda.current_stream(pool.device) if self.cuda else None
        self._allocate: list[Allocate] = (
            [functools.partial(_allocate_on, stream, pool.device) for stream in self.streams]
            if self.cuda
            else [functools.partial(torch.UntypedStorage, device=pool.device)] * lanes
        )
        self.arrive = pool.ready  # its ready time has come: settle it if it needs no lane

    def start(self, t: Transfer, lane: int) -> bool:
        """It has the lane: start the copy (memory taken for a swap-in)."""
        if t.direction is Direction.D2H:
            return self._start_out(t, lane)
        return self._start_in(t, lane)

    def _start_out(self, t: Transfer, lane: int) -> bool:
        src = self.pool.start_swap_out(t)
        if src is None:
            return False
        if self.cuda:
            host = torch.empty(src.nbytes(), dtype=torch.uint8, pin_memory=True)
            stream = self.streams[lane]
            with torch.cuda.stream(stream):
                stream.wait_event(t.compute_ready)
                dev = torch.empty(0, dtype=torch.uint8, device=self.device).set_(src)
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
        started = self.pool.start_swap_in(t, self._allocate[lane])
        if started is None:
            return False
        host, storage = started
        if self.cuda:
            dev = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
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
        if t.direction is Direction.D2H:
            self.pool.finish_swap_out(t)
        else:
            self.pool.finish_swap_in(t)
        t.host = None

    def fail(self, t: Transfer, error: Exception) -> None:
        """A step of `t` raised: the compute loop reports it."""
        self.pool.fail(t, repr(error))


def _allocate_on(stream: Any, device: torch.device, nbytes: int) -> torch.UntypedStorage:
    """A device storage of `nbytes` allocated on a lane's CUDA `stream`."""
    with torch.cuda.stream(stream):
        return torch.empty(nbytes, dtype=torch.uint8, device=device).untyped_storage()


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
    [ Lean lanes ] in `validate/replay/lanes.py`)."""
    n = src.nbytes()
    if n == 0:
        return
    small = _memmove_holding_gil() if n <= GIL_COPY_BYTES else None
    (small or ctypes.memmove)(dst.data_ptr(), src.data_ptr(), n)
