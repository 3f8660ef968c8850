"""The model's event log: what happened, when, to which job, op and buffer.

Metrics and timelines are computed from this log (and the memory samples),
never from prints inside the model. Times are microseconds of simulated time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import NamedTuple, overload

import numpy as np


class LogKind(enum.Enum):
    ITER_START = "iter_start"
    ITER_END = "iter_end"
    OP_START = "op_start"
    OP_END = "op_end"
    RECOMPUTE_START = "recompute_start"  # op = the re-run op, buffer = the recomputed one
    RECOMPUTE_END = "recompute_end"
    SWAP_OUT_START = "swap_out_start"  # a planned D2H copy holds its lane
    SWAP_OUT_END = "swap_out_end"
    SWAP_IN_START = "swap_in_start"  # a planned H2D copy holds its lane
    SWAP_IN_END = "swap_in_end"
    EVICT_START = "evict_start"  # passive: synchronous D2H copy to make room
    EVICT_END = "evict_end"
    FETCH_START = "fetch_start"  # passive: on-demand H2D copy of an absent input
    FETCH_END = "fetch_end"
    DISCARD = "discard"  # device copy dropped, the host copy is still valid: no transfer
    DROP = "drop"  # dtr: device copy dropped, to be remade by recompute (NOTE [ DTR ])
    RELEASE = "release"
    STALL_START = "stall_start"  # compute waits for a swap-in or for memory
    STALL_END = "stall_end"
    SKIP = "skip"  # a plan event found nothing to do (see NOTE [ Event semantics ])
    OOM = "oom"
    DEPART = "depart"  # the job leaves at its departure_s (NOTE [ Departures ] in sim/dynamics.py)
    PLAN = "plan"  # a plan change takes effect; buffer = the plan's version (sim/boundary.py)


class LogEntry(NamedTuple):
    """One instant. `op` is -1 where no op applies (iteration start), `buffer`
    -1 where no buffer does, `lane` -1 unless a copy holds a lane."""

    t_us: float
    job: int
    iteration: int
    kind: LogKind
    op: int = -1
    buffer: int = -1
    lane: int = -1


# NOTE [ A flat log ]
# A run logs two entries per op and two memory samples per buffer life:
# for a 30k-op step run 3 iterations, 180k LogEntry namedtuples and 204k
# sample tuples, alive in the result and each tracked by the cyclic
# collector (a namedtuple never becomes untracked), so the next collection
# walked them all, and freeing them touched each again, in memory no cache
# holds once the trace is large. `Rows` keeps rows of (time, `width`
# integers) flat in one list instead: one tracked object however long, and
# a row costs the model one `list.extend` of a tuple freed at once (97 ns
# here, against 109 ns to append the tuple; filling an `array` took 307 ns,
# its conversion of every value costing more than the objects saved).
# Readers see the same values: `Log` is a read-only sequence of `LogEntry`,
# built when read, so a consumer iterates, indexes, slices and compares it
# as before; bulk readers take numpy `columns()`, converted once per length.
class Rows(Sequence[tuple]):
    """Rows of (time, `width` integers), flat in one list and read as tuples
    (NOTE [ A flat log ]). Writers extend `flat` by a whole row."""

    __slots__ = ("flat", "width", "_columns")

    def __init__(self, width: int) -> None:
        self.flat: list[float | int] = []
        self.width = width
        self._columns: tuple[int, np.ndarray, np.ndarray] | None = None

    def add(self, t: float, ints: tuple[int, ...]) -> None:
        self.flat.extend((t, *ints))

    def __len__(self) -> int:
        return len(self.flat) // (self.width + 1)

    def _row(self, r: int) -> tuple:
        n, w = len(self), self.width + 1
        if not -n <= r < n:
            raise IndexError(f"row {r} of {n}")
        r %= n
        return tuple(self.flat[r * w : (r + 1) * w])

    @overload
    def __getitem__(self, i: int) -> tuple: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple]: ...
    def __getitem__(self, i: int | slice) -> tuple | list[tuple]:
        if isinstance(i, slice):
            return [self[r] for r in range(*i.indices(len(self)))]
        return self._row(i)

    def rows(self, start: int = 0) -> Iterator[tuple]:
        """(time, *ints) for every row from `start` on."""
        w = self.width + 1
        flat = islice(self.flat, start * w, None)
        return zip(*([flat] * w))

    def __iter__(self) -> Iterator[tuple]:
        return self.rows()

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """The columns: times float64[n], integers int64[n, width] (read-only)."""
        n, w, flat = len(self), self.width + 1, self.flat
        if self._columns is None or self._columns[0] != n:
            t = np.array(flat[0::w], np.float64)
            ints = np.empty((n, self.width), np.int64)
            for c in range(1, w):
                ints[:, c - 1] = flat[c::w]
            t.flags.writeable = ints.flags.writeable = False
            self._columns = (n, t, ints)
        return self._columns[1], self._columns[2]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rows):
            return NotImplemented
        return self.width == other.width and self.flat == other.flat

    __hash__ = None  # type: ignore[assignment]


KINDS: tuple[LogKind, ...] = tuple(LogKind)
CODE: dict[LogKind, int] = {k: i for i, k in enumerate(KINDS)}


class Log(Rows):
    """The model's log: a sequence of `LogEntry`, kept flat as rows of (time,
    job, iteration, the kind's code in `KINDS`, op, buffer, lane)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(6)

    def append(self, e: LogEntry) -> None:
        self.flat.extend((e[0], e[1], e[2], CODE[e[3]], e[4], e[5], e[6]))

    def since(self, start: int) -> Iterator[LogEntry]:
        """The entries from row `start` on."""
        new, kinds = tuple.__new__, KINDS
        for t, j, it, k, op, b, lane in self.rows(start):
            yield new(LogEntry, (t, j, it, kinds[k], op, b, lane))

    def __iter__(self) -> Iterator[LogEntry]:
        return self.since(0)

    def _row(self, r: int) -> LogEntry:
        t, j, it, k, op, b, lane = super()._row(r)
        return LogEntry(t, j, it, KINDS[k], op, b, lane)

    def __repr__(self) -> str:
        return f"Log({len(self)} entries)"
