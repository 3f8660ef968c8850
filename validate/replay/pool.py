"""Where every buffer's bytes are during a replay: the device pool (with
exact byte accounting), the host pool of swapped-out copies, and the data
versions that tell a valid host copy from a stale one.

One lock guards it all: the compute loop and the copy lanes both move
buffers in and out.

# NOTE [ Keep ]
As in the simulator (NOTE [ Event semantics ] in `sim/model.py`), a buffer
whose swap-out is queued or running stays usable, and needing it again
cancels the free: an op that needs it, or a `SwapIn` of it, puts it in
`keep`. A swap-out that finds it in `keep` when it would take the lane does
not start (no bytes move); one whose copy ends while it is in `keep`, or
while the op being run accesses it (`pinned`), makes the host copy and
leaves the device copy where it is. A `Release` of a leaving buffer takes it
out of `keep` again. A swap-out of a buffer whose host copy is still valid
moves no bytes either: the device copy is dropped (a discard), unless kept.

# NOTE [ Device bytes ]
The device pool is accounted, not measured: a buffer is on the device while
the pool holds its storage, and `current_bytes` is the sum of the trace's
`nbytes` of the buffers held (plus, while they exist, outputs an op makes
that are dropped at once). On CPU this is the only notion of device memory
there is; on CUDA the allocator's own peak is reported beside it. For a
vanilla replay the pool follows the trace's `memory_curve("framework")` to
the byte (counting the trace's sizes even where a real storage is larger,
see `ReplayResult.size_mismatches`). A swapped-out buffer leaves the pool
when its copy ends (NOTE [ Keep ] for when it stays). An op's outputs are
counted when it starts, as the simulator allocates them (`reserve`); a
swap-in's bytes when its copy starts. A buffer the framework frees while a
copy of it runs keeps its bytes until that copy ends (the copy engine still
reads or writes them; the simulator's `_framework_free`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import torch
from memplan.traces.model import Trace

if TYPE_CHECKING:
    from memplan.validate.replay.lanes import Transfer


class DevicePool:
    """Residency and bytes of every buffer of one trace on one device."""

    def __init__(self, trace: Trace, device: torch.device, buffer_dtype: tuple[torch.dtype, ...]):
        self.trace = trace
        self.device = device
        self.buffer_dtype = buffer_dtype
        self.nbytes = trace.nbytes
        n = trace.n_buffers
        self.lock = threading.RLock()
        self.storage: list[torch.UntypedStorage | None] = [None] * n
        self.host: list[torch.UntypedStorage | None] = [None] * n  # copies on the host
        self.host_version = np.full(n, -1, np.int64)  # version of the data `host` holds
        self.stale_by: dict[int, int] = {}  # op whose write made the host copy stale
        self.version = np.zeros(n, np.int64)  # bumped by every write, never reset
        self.writers: list[list[int]] = [[] for _ in range(n)]  # ops since creation
        self.dropped_writers: dict[int, tuple[int, ...]] = {}  # writers when last dropped
        self.dropped_version = np.full(n, -1, np.int64)  # version when last dropped
        self.lifetime = np.zeros(n, np.int64)  # bumped when the buffer is made or freed
        self.pinned: frozenset[int] = frozenset()  # what the op being run accesses
        self.keep: set[int] = set()  # NOTE [ Keep ]
        self.writing: frozenset[int] = frozenset()  # what the op being called writes
        self.writing_op = -1
        self.arriving: dict[int, Transfer] = {}  # swap-in queued or in flight
        self.leaving: dict[int, Transfer] = {}  # swap-out queued or in flight
        self.errors: list[str] = []  # found on a copy lane, raised by the compute loop
        self.current_bytes = 0
        self.iteration_peaks: list[int] = []  # per iteration so far: its peak
        self.host_bytes = 0
        self.host_peak_bytes = 0
        self._views_of: list[list[int]] = [[] for _ in range(n)]
        for v in trace.views:
            self._views_of[v.buffer].append(v.id)
        self._view_cache: dict[int, torch.Tensor] = {}

    # ---- device copies -------------------------------------------------------
    def on_device(self, b: int) -> bool:
        return self.storage[b] is not None

    def reserve(self, nbytes: int) -> None:
        """Count `nbytes` taken (an op's outputs as it starts); `bind(...,
        reserved=True)` or `unreserve` settles them."""
        with self.lock:
            self.current_bytes += nbytes
            if self.current_bytes > self.iteration_peaks[-1]:  # start_iteration came first
                self.iteration_peaks[-1] = self.current_bytes

    def start_iteration(self) -> None:
        """Start the next iteration's peak from what the pool holds now."""
        with self.lock:
            self.iteration_peaks.append(self.current_bytes)

    def unreserve(self, nbytes: int) -> None:
        with self.lock:
            self.current_bytes -= nbytes

    def bind(self, b: int, storage: torch.UntypedStorage, reserved: bool = False) -> None:
        """Make `storage` the device copy of `b` (a new output, a swap-in,
        a materialised input); its bytes enter the pool (already did if
        `reserved`)."""
        with self.lock:
            if self.storage[b] is not None:
                raise AssertionError(f"buffer {b} is already on the device")
            self.storage[b] = storage
            if not reserved:
                self.reserve(int(self.nbytes[b]))
            self._forget_views(b)

    def drop(self, b: int, counted: bool = True) -> None:
        """Free the device copy of `b` (its bytes too unless not `counted`:
        a running copy gives them back when it ends)."""
        with self.lock:
            if self.storage[b] is None:
                return
            self.storage[b] = None
            if counted:
                self.current_bytes -= int(self.nbytes[b])
            self.dropped_writers[b] = tuple(self.writers[b])
            self.dropped_version[b] = self.version[b]
            self._forget_views(b)

    def stays(self, b: int) -> bool:
        """Whether a swap-out of `b` ending now leaves it on the device
        (NOTE [ Keep ]); the keep is used up."""
        with self.lock:
            if b in self.keep:
                self.keep.discard(b)
                return True
            return b in self.pinned

    # ---- host copies -----------------------------------------------------------
    def set_host(self, b: int, data: torch.UntypedStorage, version: int) -> None:
        with self.lock:
            self.drop_host(b)
            self.stale_by.pop(b, None)
            self.host[b] = data
            self.host_version[b] = version
            self.host_bytes += int(self.nbytes[b])
            self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)

    def drop_host(self, b: int) -> None:
        with self.lock:
            if self.host[b] is not None:
                self.host[b] = None
                self.host_version[b] = -1
                self.host_bytes -= int(self.nbytes[b])

    def host_valid(self, b: int) -> bool:
        return self.host[b] is not None and self.host_version[b] == self.version[b]

    # ---- data versions ------------------------------------------------------------
    def created(self, b: int, op: int) -> None:
        with self.lock:
            self.version[b] += 1
            self.lifetime[b] += 1
            self.writers[b] = [op]
            self.stale_by.pop(b, None)
            self.drop_host(b)

    def written(self, b: int, op: int) -> None:
        """`op` modified `b` in place: a host copy no longer matches it."""
        with self.lock:
            self.version[b] += 1
            self.writers[b].append(op)
            if self.host[b] is not None:
                self.stale_by[b] = op
                self.drop_host(b)

    def restored(self, b: int) -> None:
        """A recompute brought back the data `b` held when it was dropped: it
        is that version again (a host copy of it, if any, is valid again)."""
        with self.lock:
            self.version[b] = self.dropped_version[b]
            self.writers[b] = list(self.dropped_writers[b])

    def kill(self, b: int) -> None:
        """The framework freed `b`: no copy of it survives anywhere. A copy
        of it that is running keeps the bytes until it ends (NOTE [ Device
        bytes ]); one that has not started will not."""
        with self.lock:
            running = False
            for table in (self.leaving, self.arriving):
                t = table.pop(b, None)
                if t is not None and t.running:
                    t.owns_bytes = running = True
            self.drop(b, counted=not running)
            self.keep.discard(b)
            self.drop_host(b)
            self.writers[b] = []
            self.lifetime[b] += 1
            self.stale_by.pop(b, None)

    # ---- tensors -------------------------------------------------------------------
    def bytes_of(self, b: int) -> torch.Tensor:
        """The device copy of `b` as a flat uint8 tensor."""
        storage = self.storage[b]
        if storage is None:
            raise AssertionError(f"buffer {b} is not on the device")
        return torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)

    def view(self, v: int) -> torch.Tensor:
        """View `v` over its buffer's current device storage."""
        t = self._view_cache.get(v)
        if t is None:
            view = self.trace.views[v]
            storage = self.storage[view.buffer]
            if storage is None:
                raise AssertionError(f"view {v}: buffer {view.buffer} is not on the device")
            t = torch.empty(0, dtype=getattr(torch, view.dtype), device=self.device)
            t.set_(storage, view.offset, view.shape, view.stride)
            self._view_cache[v] = t
        return t

    def _forget_views(self, b: int) -> None:
        for v in self._views_of[b]:
            self._view_cache.pop(v, None)

    def typed(self, b: int) -> torch.Tensor:
        """A host copy of `b`'s current data as a flat tensor of its dtype
        (from the device if there, else from a valid host copy)."""
        with self.lock:
            if self.storage[b] is not None:
                raw = self.bytes_of(b).cpu().clone()
            elif self.host_valid(b):
                raw = torch.empty(0, dtype=torch.uint8).set_(self.host[b]).clone()  # type: ignore[arg-type]
            else:
                raise AssertionError(f"buffer {b} has no valid copy")
        dtype = self.buffer_dtype[b]
        n = raw.numel() // dtype.itemsize
        return raw[: n * dtype.itemsize].view(dtype)
