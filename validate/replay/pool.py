"""Where every buffer's bytes are during a replay: the device pool (with
exact byte accounting), the host pool of swapped-out copies, and the data
versions that tell whether an op wrote a buffer while its bytes moved.

The pool drives the transition function (`planners.core.lifecycle`): each
transition below asks it what happens to the buffer, and does that with
real storages; the state is its `Buffers`, nowhere else."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import numpy as np
import torch
from memplan.planners.core.lifecycle import (
    ARRIVING,
    DEV,
    LEAVING,
    NO_CTX,
    OFF,
    Buffers,
    Ctx,
    Do,
    Event,
    State,
)
from memplan.traces.model import Trace
from memplan.validate.replay.transfer import Direction, Transfer
from memplan.validate.replay.views import ViewCache

# NOTE [ One lock ]
# The compute loop and the copy lanes both move buffers in and out. The pool
# owns the lock that orders them: every state transition is a method that
# takes it once, for exactly the checks and moves that must be seen together,
# and no other module touches the lock or the state. Readers of one value (is
# a buffer on the device, the bytes held now) need no lock: one load under
# the GIL. An op's argument views are made after `begin_op`, outside the
# lock: the buffers an op needs cannot move while it runs (an arriving one
# was waited for, a leaving one is kept or pinned, NOTE [ Keep ]).

# NOTE [ Keep ]
# As in the simulator (NOTE [ Event semantics ] in `sim/model.py`), a buffer
# whose swap-out is queued or running stays usable, and needing it again
# cancels the free: an op that needs it, or a `SwapIn` of it, sets its
# `keep` flag. A swap-out whose copy ends while it is kept -- however early
# the keep came, even before the copy took the lane -- or while the op being
# run accesses it (`pinned`), makes the host copy and leaves the device copy
# where it is: a later `Release` may rely on that host copy, as the checker
# assumes. A `Release` of a leaving buffer clears
# the flag again. A swap-out of a buffer whose host copy is still valid
# moves no bytes either: the device copy is dropped (a discard), unless kept.

# NOTE [ Device bytes ]
# The device pool is accounted, not measured: a buffer is on the device while
# the pool holds its storage, and `current_bytes` is the sum of the trace's
# `nbytes` of the buffers held (plus, while they exist, outputs an op makes
# that are dropped at once). On CPU this is the only notion of device memory
# there is; on CUDA the allocator's own peak is reported beside it. For a
# vanilla replay the pool follows the trace's `memory_curve("framework")` to
# the byte (counting the trace's sizes even where a real storage is larger,
# see `ReplayResult.size_mismatches`). A swapped-out buffer leaves the pool
# when its copy ends (NOTE [ Keep ] for when it stays). An op's outputs are
# counted when it starts, as the simulator allocates them (`begin_op`); a
# swap-in's bytes when its copy starts. A buffer the framework frees while a
# copy of it runs keeps its bytes until that copy ends (the copy engine still
# reads or writes them; the simulator's `framework_free`).

NOTHING: frozenset[int] = frozenset()

# a transfer for a buffer, made when the pool queues one: called with the buffer's lifetime
MakeTransfer = Callable[[int], Transfer]
# a device storage of so many bytes, for a swap-in (on the lane's stream on CUDA)
Allocate = Callable[[int], torch.UntypedStorage]


class NotOnDevice(LookupError):
    """A plan event acts on a buffer that is not on the device."""


class NoHostCopy(LookupError):
    """A `SwapIn` of a buffer that is off the device with no valid host copy:
    `why` says what happened to it."""

    def __init__(self, b: int, why: str):
        super().__init__(b, why)
        self.why = why


class DevicePool:
    """Residency and bytes of every buffer of a trace on a device (NOTE [ One lock ])."""

    def __init__(self, trace: Trace, device: torch.device, buffer_dtype: tuple[torch.dtype, ...]):
        self.trace = trace
        self.device = device
        self.buffer_dtype = buffer_dtype
        n = trace.n_buffers
        self._nbytes = trace.nbytes
        self._lock = threading.Lock()
        self._storage: list[torch.UntypedStorage | None] = [None] * n
        self._state = Buffers(n)  # where each buffer is, and its flags
        self._host: list[torch.UntypedStorage | None] = [None] * n  # copies on the host
        self._stale_by: dict[int, int] = {}  # op whose write made the host copy stale
        self._version = np.zeros(n, np.int64)  # bumped by every write, never reset
        self._writers: list[list[int]] = [[] for _ in range(n)]  # ops since creation
        self._dropped_writers: dict[int, tuple[int, ...]] = {}  # writers when last dropped
        self._dropped_version = np.full(n, -1, np.int64)  # version when last dropped
        self._pinned: frozenset[int] = NOTHING  # what the op being run accesses
        self._writing: frozenset[int] = NOTHING  # what the op being called writes
        self._writing_op = -1
        self._arriving: dict[int, Transfer] = {}  # the swap-in of an ARRIVING buffer
        self._leaving: dict[int, Transfer] = {}  # the swap-out of a LEAVING buffer
        self._errors: list[str] = []  # found on a copy lane, raised by the compute loop
        self._current_bytes = 0
        self._iteration_peaks: list[int] = []  # per iteration so far: its peak
        self._host_bytes = 0
        self._host_peak_bytes = 0
        self._views = ViewCache(trace, device, self._storage)
        self.view = self._views.get  # view `v` over its buffer's current device storage

    # ---- readers (one value each, no lock) -------------------------------------------
    def on_device(self, b: int) -> bool:
        return self._storage[b] is not None

    def state(self, b: int) -> State:
        """`b`'s state as the transition function sees it."""
        return self._state.state(b)

    def gone(self, b: int) -> bool:
        """Neither on the device nor arriving: only a recompute brings it back."""
        return self._state.where[b] == OFF

    def has_host_copy(self, b: int) -> bool:
        return self._host[b] is not None

    def host_valid(self, b: int) -> bool:
        return self._state.host[b]

    def version(self, b: int) -> int:
        return int(self._version[b])

    def last_writer(self, b: int) -> int:
        return self._writers[b][-1]

    def dropped_writers(self, b: int) -> tuple[int, ...] | None:
        """The ops that had written `b` when it was last dropped (None: never)."""
        return self._dropped_writers.get(b)

    @property
    def current_bytes(self) -> int:
        """Device bytes held now (NOTE [ Device bytes ])."""
        return self._current_bytes

    @property
    def pinned(self) -> frozenset[int]:
        return self._pinned

    @property
    def iteration_peaks(self) -> tuple[int, ...]:
        """Per iteration so far: its peak device bytes."""
        return tuple(self._iteration_peaks)

    @property
    def host_peak_bytes(self) -> int:
        return self._host_peak_bytes

    @property
    def lane_error(self) -> str | None:
        """The first error a copy lane found (the compute loop raises it)."""
        return self._errors[0] if self._errors else None

    # ---- the compute thread: iterations, ops, recomputes -----------------------------
    def start_iteration(self) -> None:
        """Start the next iteration's peak from what the pool holds now."""
        with self._lock:
            self._iteration_peaks.append(self._current_bytes)

    def materialise(self, b: int, storage: torch.UntypedStorage) -> None:
        """`b` exists at iteration start (a parameter, an input) as `storage`:
        a new lifetime, on the device, its bytes counted."""
        with self._lock:
            self._apply(b, Event.CREATE)
            self._created(b, -1)
            self._bind(b, storage)

    def pin(self, accesses: frozenset[int]) -> None:
        """What the op being run accesses: a swap-out ending meanwhile leaves
        it on the device (NOTE [ Keep ])."""
        with self._lock:
            self._pinned = accesses

    def need(self, b: int) -> Transfer | bool:
        """An op (or a recompute for it) needs `b`: True if it is usable now
        (a leaving one is kept, NOTE [ Keep ]), the swap-in to wait for if
        it is arriving, False if it is gone (the replay fetches nothing on
        demand: the executor recomputes it as the plan says, or rejects)."""
        with self._lock:
            if self._state.where[b] == OFF:
                return False
            if self._apply(b, Event.NEED) & Do.STALL:
                return self._arriving[b]
            return True

    def begin_op(
        self, op: int, needs: tuple[int, ...], writes: Iterable[int], create_bytes: int
    ) -> int | None:
        """Op `op` starts: the first of `needs` that is not usable (None: all
        are). If all are, its outputs' `create_bytes` are counted (NOTE
        [ Device bytes ]) and its `writes` count from here for a copy that
        ends meanwhile."""
        with self._lock:
            where = self._state.where
            for b in needs:
                if where[b] != DEV and where[b] != LEAVING:
                    return b
            self._reserve(create_bytes)
            self._writing = frozenset(writes)
            self._writing_op = op
        return None

    def end_op(
        self,
        op: int,
        creates: tuple[int, ...],
        storages: list[torch.UntypedStorage],
        bind: frozenset[int] | None,
        writes: Iterable[int],
    ) -> None:
        """Op `op` returned: the outputs it `creates` (in `bind`, if given:
        a recompute's, whose buffers are made again in the life they had)
        become those buffers' device copies, the others are dropped at once
        (their counted bytes given back); it modified `writes` in place."""
        with self._lock:
            for b, s in zip(creates, storages, strict=True):
                if bind is None:
                    self._apply(b, Event.CREATE)
                    self._created(b, op)
                    self._bind(b, s, reserved=True)
                elif b in bind:
                    self._apply(b, Event.REMAKE)
                    self._version[b] += 1  # until `restore` tells which version it is
                    self._writers[b] = [op]
                    self._bind(b, s, reserved=True)
                else:  # made for a moment and dropped (a recompute's output still present)
                    self._current_bytes -= int(self._nbytes[b])
            for b in writes:
                self._written(b, op)
            self._writing = NOTHING

    def op_failed(self) -> None:
        """The op being called raised: it writes nothing any more."""
        with self._lock:
            self._writing = NOTHING

    def restore(self, b: int) -> None:
        """A recompute brought back the data `b` held when it was dropped: it
        is that version again (a valid host copy of it stays valid, as the
        transition function's REMAKE keeps it)."""
        with self._lock:
            self._version[b] = self._dropped_version[b]
            self._writers[b] = list(self._dropped_writers[b])

    def drop(self, b: int) -> None:
        """Free the device copy of `b`, a recompute's intermediate: its life
        goes on (DROP) if the framework has not freed it, else the life it was
        made again for ends here (FREE), as in the simulator."""
        with self._lock:
            if self._state.alive[b]:
                self._apply(b, Event.DROP)
                self._drop(b)
            else:
                self._free(b)

    def framework_free(self, b: int) -> None:
        """The framework freed `b`: no copy of it survives anywhere. A copy
        of it that is running keeps the bytes until it ends (NOTE [ Device
        bytes ]); one that has not started will not."""
        with self._lock:
            self._free(b)

    # ---- the compute thread: a plan's events -----------------------------------------
    def release(self, b: int) -> None:
        """A `Release`: free the device copy of `b`; of a leaving buffer undo
        a keep, of an arriving one nothing. `NotOnDevice` if it is absent."""
        with self._lock:
            where = self._state.where[b]
            do = self._apply(b, Event.RELEASE)  # of a leaving one: its free is back
            if do & Do.DROP:
                self._drop(b)
            elif where == OFF:
                raise NotOnDevice(b)

    def begin_swap_out(self, b: int, at_once: bool, make: MakeTransfer) -> Transfer | None:
        """A `SwapOut` of `b` fires: the transfer queued for it (made by
        `make`), or None if no copy is needed -- one of a leaving or arriving
        buffer is a skip, and one that fires `at_once` (no delay) while the
        host copy is still valid is a discard (NOTE [ Keep ]). `NotOnDevice`
        if it is absent."""
        with self._lock:
            where = self._state.where[b]
            do = self._apply(b, Event.SWAP_OUT, Ctx(delayed=not at_once))
            if do & Do.DROP:  # a discard, at once as in the simulator
                self._drop(b)
            elif do & Do.COPY_D2H:
                t = self._leaving[b] = make(self._state.epoch[b])
                return t
            elif where == OFF:
                raise NotOnDevice(b)
        return None

    def begin_swap_in(self, b: int, make: MakeTransfer) -> tuple[Transfer | None, bool]:
        """A `SwapIn` of `b` fires: (the transfer to wait for, whether it is
        new and must be queued). A copy in flight serves this one too; a
        leaving buffer is kept (NOTE [ Keep ], no copy either way) and a
        resident one needs nothing (a periodic plan's first iteration):
        (None, False). `NoHostCopy` for an absent one with no valid host copy."""
        with self._lock:
            where = self._state.where[b]
            do = self._apply(b, Event.SWAP_IN)
            if do & Do.JOIN:
                return self._arriving[b], False
            if do & Do.COPY_H2D:
                t = self._arriving[b] = make(self._state.epoch[b])
                return t, True
            if where == OFF:
                stale = self._stale_by.get(b)
                raise NoHostCopy(
                    b, "it was never swapped out" if stale is None else f"op {stale} wrote it since"
                )
        return None, False

    # ---- a copy lane: a transfer's steps -----------------------------------------------
    def ready(self, t: Transfer) -> bool:
        """`t`'s ready time has come: whether it still needs the lane. One the
        framework's free cancelled is dropped; a swap-out of a buffer whose
        host copy is still valid is a discard (NOTE [ Keep ])."""
        b = t.buffer
        with self._lock:
            if not self._current(t, self._table(t)):
                return False
            if t.direction is Direction.H2D:
                return True
            do = self._apply(b, Event.COPY_OUT, Ctx(in_use=b in self._pinned))
            if do & Do.LEAVE:
                return True
            del self._leaving[b]  # a discard: no bytes move
            if do & Do.DROP:
                self._drop(b)
        return False

    def start_swap_out(self, t: Transfer) -> torch.UntypedStorage | None:
        """Swap-out `t` takes the lane: the device copy to read, or None if
        it does not start (cancelled, needed again meanwhile, failed)."""
        b = t.buffer
        with self._lock:
            if not self._current(t, self._leaving):
                return None
            src = self._storage[b]
            if src is None:
                self._fail(t, "not on the device when the copy starts")
                return None
            self._apply(b, Event.D2H_START)
            t.version = int(self._version[b])
            t.running = True
        return src

    def start_swap_in(
        self, t: Transfer, allocate: Allocate
    ) -> tuple[torch.UntypedStorage, torch.UntypedStorage] | None:
        """Swap-in `t` takes the lane: (the host copy, the new device copy,
        from `allocate`, whose bytes are taken now), or None if it does not
        start (cancelled, failed)."""
        b = t.buffer
        with self._lock:
            if not self._current(t, self._arriving):
                return None
            if self._storage[b] is not None:
                self._fail(t, "already on the device when the copy starts")
                return None
            host = self._host[b]
            if host is None or not self.host_valid(b):
                stale = self._stale_by.get(b)
                why = "it was never swapped out" if stale is None else f"op {stale} wrote it since"
                self._fail(t, f"no valid host copy ({why})")
                return None
            storage = allocate(host.nbytes())
            self._bind(b, storage)  # memory is taken when the copy starts
            t.running = True
        return host, storage

    def finish_swap_out(self, t: Transfer) -> None:
        """Swap-out `t`'s copy is over: the host copy is made (or marked stale
        by a write that overlapped it) and the device copy freed, unless kept
        (NOTE [ Keep ])."""
        b = t.buffer
        with self._lock:
            if not self._end(t, self._leaving):
                return
            assert t.host is not None
            # a write that overlapped the copy in any way makes it stale
            written = self._version[b] != t.version or b in self._writing
            if written:
                self._stale_by[b] = self._writing_op if b in self._writing else self._writers[b][-1]
            else:
                self._set_host(b, t.host)
            do = self._apply(b, Event.D2H_END, Ctx(written=written, in_use=b in self._pinned))
            if do & Do.DROP:
                self._drop(b)

    def finish_swap_in(self, t: Transfer) -> None:
        """Swap-in `t`'s copy is over: its buffer is usable."""
        with self._lock:
            if self._end(t, self._arriving):
                self._apply(t.buffer, Event.H2D_END)

    def fail(self, t: Transfer, msg: str) -> None:
        """Something went wrong with `t` on a lane: the compute loop raises
        it (`lane_error`); a transfer that does not hold the lane is off."""
        with self._lock:
            self._fail(t, msg)

    # ---- tensors -------------------------------------------------------------------
    def scalars(self, views: tuple[int, ...]) -> list[float]:
        """The values of 0-dim `views` (the loss)."""
        with self._lock:
            return [self.view(v).item() for v in views]

    def typed(self, b: int) -> torch.Tensor:
        """A host copy of `b`'s current data as a flat tensor of its dtype
        (from the device if there, else from a valid host copy)."""
        with self._lock:
            storage = self._storage[b]
            if storage is not None:
                raw = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
                raw = raw.cpu().clone()
            elif self.host_valid(b):
                raw = torch.empty(0, dtype=torch.uint8).set_(self._host[b]).clone()  # type: ignore[arg-type]
            else:
                raise AssertionError(f"buffer {b} has no valid copy")
        dtype = self.buffer_dtype[b]
        n = raw.numel() // dtype.itemsize
        return raw[: n * dtype.itemsize].view(dtype)

    # ---- under the lock ----------------------------------------------------------------
    def _table(self, t: Transfer) -> dict[int, Transfer]:
        return self._leaving if t.direction is Direction.D2H else self._arriving

    def _apply(self, b: int, ev: Event, ctx: Ctx = NO_CTX) -> int:
        return self._state.apply(b, ev, ctx)

    def _current(self, t: Transfer, table: dict[int, Transfer]) -> bool:
        """Whether `t` still acts on its buffer (a framework free takes a
        buffer's transfers off the tables)."""
        return table.get(t.buffer) is t and self._state.epoch[t.buffer] == t.lifetime

    def _fail(self, t: Transfer, msg: str) -> None:
        """A transfer that does not hold the lane is off: its buffer stays
        where it was before it (the compute loop raises `msg` anyway)."""
        self._errors.append(f"{t.label}: {msg}")
        table = self._table(t)
        if table.get(t.buffer) is t and not t.running:
            del table[t.buffer]
            lost = Event.D2H_CANCELLED if t.direction is Direction.D2H else Event.H2D_FAILED
            self._apply(t.buffer, lost)

    def _free(self, b: int) -> None:
        """The framework frees `b` (FREE): a copy running for it keeps the
        bytes until it ends; one that has not started is off."""
        where = self._state.where[b]
        do = self._apply(b, Event.FREE)
        leaving, arriving = self._leaving.pop(b, None), self._arriving.pop(b, None)
        if do & Do.DETACH:
            assert leaving is not None and leaving.running
            leaving.owns_bytes = True
            self._drop(b, counted=False)
        elif where == ARRIVING and arriving is not None and arriving.running:
            arriving.owns_bytes = True  # the swap-in's storage, bound when it started
            self._drop(b, counted=False)
        elif do & Do.DROP:
            self._drop(b)
        self._drop_host(b)
        self._writers[b] = []
        self._stale_by.pop(b, None)

    def _end(self, t: Transfer, table: dict[int, Transfer]) -> bool:
        """`t`'s copy is over: whether it still acts on its buffer (the
        framework did not free it meanwhile: then its bytes go back now)."""
        t.running = False
        if t.owns_bytes:
            self._current_bytes -= t.nbytes
            return False
        if table.get(t.buffer) is t:
            del table[t.buffer]
        return True

    def _reserve(self, nbytes: int) -> None:
        self._current_bytes += nbytes
        if self._current_bytes > self._iteration_peaks[-1]:  # start_iteration came first
            self._iteration_peaks[-1] = self._current_bytes

    def _bind(self, b: int, storage: torch.UntypedStorage, reserved: bool = False) -> None:
        """Make `storage` the device copy of `b`; its bytes enter the pool
        (already did if `reserved`)."""
        if self._storage[b] is not None:
            raise AssertionError(f"buffer {b} is already on the device")
        self._storage[b] = storage
        if not reserved:
            self._reserve(int(self._nbytes[b]))
        self._views.forget(b)

    def _drop(self, b: int, counted: bool = True) -> None:
        """Free the device copy of `b` (its bytes too unless not `counted`:
        a running copy gives them back when it ends)."""
        if self._storage[b] is None:
            return
        self._storage[b] = None
        if counted:
            self._current_bytes -= int(self._nbytes[b])
        self._dropped_writers[b] = tuple(self._writers[b])
        self._dropped_version[b] = self._version[b]
        self._views.forget(b)

    def _set_host(self, b: int, data: torch.UntypedStorage) -> None:
        self._drop_host(b)
        self._stale_by.pop(b, None)
        self._host[b] = data
        self._host_bytes += int(self._nbytes[b])
        self._host_peak_bytes = max(self._host_peak_bytes, self._host_bytes)

    def _drop_host(self, b: int) -> None:
        if self._host[b] is not None:
            self._host[b] = None
            self._host_bytes -= int(self._nbytes[b])

    def _created(self, b: int, op: int) -> None:
        """A new life of `b` (CREATE): new data, written by `op` (-1: loaded)."""
        self._version[b] += 1
        self._writers[b] = [op]
        self._stale_by.pop(b, None)
        self._drop_host(b)

    def _written(self, b: int, op: int) -> None:
        """`op` modified `b` in place (WRITE): a host copy no longer matches it."""
        self._apply(b, Event.WRITE)
        self._version[b] += 1
        self._writers[b].append(op)
        if self._host[b] is not None:
            self._stale_by[b] = op
            self._drop_host(b)
