"""What happens to a buffer: its states, the events that move it, and for each
(state, event) the new state and what the driver must do.

The simulator, the checker, the op grid, the queued-peak analysis and the
replay decide *when* an event happens (an op starts, a copy ends, the framework frees);
`step` says *what* happens. It is a pure function of a small value, so a
test walks every state and event (`tests/semantics/test_lifecycle.py`).

A buffer's state is where it is (`Where`) and four flags of its current life
(NOTE [ Incarnations ] in sim/model.py): `alive` (between its creation and
the framework's free), `host` (a host copy is valid: made by a D2H copy the
op writes did not overlap, kept by a swap-in), `keep` (wanted back while it
leaves: its free is cancelled) and `copying` (this life's D2H copy holds
the lane). The driver keeps the life's number (its epoch) and voids the
events of an ended life before asking `step`.

The rules, one function per event below, are the simulator's; their long
form is in docs/design.md, "What happens to a buffer".

`Buffers` is the one store of that state: per-buffer lists a driver reads
freely and changes only through its methods (`apply` asks `step`; `create`,
`written`, `free`, `static_op` and `end_all` are its fast paths, NOTE [ Fast paths of the
transition function ]). The simulator's `JobState` is one, the checker, the op
grid and the queued-peak analysis each keep one.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = [
    "ARRIVING",
    "DEAD",
    "DEV",
    "LEAVING",
    "NO_CTX",
    "OFF",
    "Buffers",
    "Ctx",
    "Do",
    "Event",
    "IllegalTransition",
    "State",
    "Where",
    "holds_bytes",
    "step",
]


class Where(enum.IntEnum):
    """Where a buffer is. LEAVING: on the device, a swap-out or eviction owns
    it (still usable). ARRIVING: a swap-in or fetch is on its way (not usable
    yet; its copy owns any bytes it took)."""

    OFF = 0
    DEV = 1
    LEAVING = 2
    ARRIVING = 3


class State(NamedTuple):
    where: Where
    alive: bool
    host: bool
    keep: bool
    copying: bool


DEAD = State(Where.OFF, False, False, False, False)


class Event(enum.Enum):
    CREATE = "create"  # an op (or a job's arrival, an iteration's inputs) allocates a new life
    REMAKE = "remake"  # a recompute chain allocates an absent buffer again, same life
    TAKE_FAILED = "take_failed"  # the allocator refused a CREATE's or REMAKE's bytes (then: STOP)
    DROP = "drop"  # a chain's temporary ends, or DTR evicts: the device copy is freed at once
    RELEASE = "release"  # a plan's Release triggers
    SWAP_OUT = "swap_out"  # a plan's SwapOut triggers (Ctx.delayed: its copy waits first)
    SWAP_IN = "swap_in"  # a plan's SwapIn triggers
    COPY_OUT = "copy_out"  # a D2H copy is asked for: a swap-out's delay ended, or an eviction
    D2H_START = "d2h_start"  # that copy gets its lane
    D2H_END = "d2h_end"  # that copy ends (Ctx.written: an op wrote the buffer meanwhile)
    D2H_CANCELLED = "d2h_cancelled"  # an eviction waiting for its lane will not happen
    H2D_END = "h2d_end"  # a swap-in or fetch lands
    H2D_FAILED = "h2d_failed"  # a swap-in or fetch ended without its copy
    NEED = "need"  # an op (or a chain) needs the buffer on the device now
    WRITE = "write"  # an op writes the buffer: a host copy goes stale
    FREE = "free"  # the framework frees the buffer: its life ends
    STOP = "stop"  # the job ends or runs out of memory: every life ends

    # members are singletons: hash by identity, in C (Enum's own hashes the
    # name in Python, and the simulator keys a dict by event per transition)
    __hash__ = object.__hash__


class Ctx(NamedTuple):
    """What the driver knows beside the state when an event happens."""

    delayed: bool = False  # SWAP_OUT: the swap-out has a delay
    passive: bool = False  # COPY_OUT, D2H_START: an eviction, not a planned swap-out
    in_use: bool = False  # COPY_OUT, D2H_END: the job's current op uses the buffer
    written: bool = False  # D2H_END: an op wrote the buffer while its bytes moved
    recompute: bool = False  # NEED: the plan recomputes it before this op
    remakeable: bool = False  # NEED: DTR can remake it (NOTE [ DTR ] in sim/remat.py)


NO_CTX = Ctx()


class Do:
    """What the driver does besides writing the new state: bits of an int
    (plain ints, not `enum.Flag`, whose `&` costs a microsecond in the
    simulator's loop). Bytes: TAKE allocates the buffer's bytes, DROP frees
    them, DETACH leaves them to the running copy (freed when it ends), LEAVE
    hands them to a leaving copy, STAY gives them back to the buffer (a copy
    landed or was called off). Work: COPY_D2H / COPY_H2D start a planned
    copy, FETCH an on-demand one, JOIN waits on the swap-in already under
    way, STALL waits for it now, RECOMPUTE runs the plan's chain,
    REMAKE_CHAIN DTR's remake, LOST is a plan error. Log: SKIP, DISCARD (a
    valid host copy made the copy needless), RELEASED."""

    NONE = 0
    TAKE = 1 << 0
    DROP = 1 << 1
    DETACH = 1 << 2
    LEAVE = 1 << 3
    STAY = 1 << 4
    COPY_D2H = 1 << 5
    COPY_H2D = 1 << 6
    FETCH = 1 << 7
    JOIN = 1 << 8
    STALL = 1 << 9
    RECOMPUTE = 1 << 10
    REMAKE_CHAIN = 1 << 11
    LOST = 1 << 12
    SKIP = 1 << 13
    DISCARD = 1 << 14
    RELEASED = 1 << 15

    @staticmethod
    def names(do: int) -> str:
        """`do` in words, e.g. "DROP|RELEASED" (for messages and test output)."""
        bits = [k for k, v in vars(Do).items() if k.isupper() and v and do & v]
        return "|".join(bits) or "NONE"


class IllegalTransition(RuntimeError):
    """An event that cannot happen in that state: a bug in the driver."""


# the same as plain ints, which drivers store and compare in their loops
OFF, DEV, LEAVING, ARRIVING = (int(w) for w in Where)
ON_DEVICE = (DEV, LEAVING)  # the states that hold the buffer's bytes


def holds_bytes(s: State) -> bool:
    """The buffer's own bytes are on the device (a copy in flight owns its own)."""
    return s.where in ON_DEVICE


def step(s: State, ev: Event, ctx: Ctx = NO_CTX) -> tuple[State, int]:
    """The state after `ev` and what the driver does; `IllegalTransition` for
    an event that cannot happen in `s`. Uncached: `Buffers` keeps its answers."""
    new = _RULES[ev](s, ctx)
    if new is None:
        raise IllegalTransition(f"{ev.value} in {s}")
    return new


def _create(s: State, _c: Ctx) -> tuple[State, int] | None:
    if s.where != OFF or s.alive:
        return None
    return State(DEV, True, False, False, False), Do.TAKE


def _remake(s: State, _c: Ctx) -> tuple[State, int] | None:
    return (s._replace(where=DEV), Do.TAKE) if s.where == OFF else None


def _take_failed(s: State, _c: Ctx) -> tuple[State, int] | None:
    return (s._replace(where=OFF), Do.NONE) if s.where == DEV else None


def _drop(s: State, _c: Ctx) -> tuple[State, int] | None:
    return (s._replace(where=OFF), Do.DROP) if s.where == DEV else None


def _release(s: State, _c: Ctx) -> tuple[State, int]:
    if s.where == DEV and s.alive:
        return s._replace(where=OFF), Do.DROP | Do.RELEASED
    if s.where == LEAVING:  # undoes a cancelled free
        return s._replace(keep=False), Do.RELEASED
    return s, Do.SKIP


def _swap_out(s: State, c: Ctx) -> tuple[State, int]:
    if s.where != DEV or not s.alive:
        return s, Do.SKIP
    if s.host and not c.delayed:  # a discard at the trigger (NOTE [ Event semantics ])
        return s._replace(where=OFF), Do.DROP | Do.DISCARD
    return s._replace(where=LEAVING, keep=False), Do.LEAVE | Do.COPY_D2H


def _swap_in(s: State, _c: Ctx) -> tuple[State, int]:
    if s.where == ARRIVING:
        return s, Do.JOIN
    if s.where == OFF and s.alive and s.host:
        return s._replace(where=ARRIVING), Do.COPY_H2D
    if s.where == LEAVING:  # cancels the swap-out's free
        return s._replace(keep=True), Do.SKIP
    return s, Do.SKIP


def _copy_out(s: State, c: Ctx) -> tuple[State, int] | None:
    if s.where not in ON_DEVICE or s.copying:
        return None
    if s.host:  # no bytes need to move
        if s.keep or c.in_use:
            return s._replace(where=DEV, keep=False), Do.STAY | Do.SKIP
        return s._replace(where=OFF), Do.DROP | Do.DISCARD
    return s._replace(where=LEAVING), Do.LEAVE


def _d2h_start(s: State, c: Ctx) -> tuple[State, int] | None:
    if s.where != LEAVING or s.copying:
        return None
    if s.keep and c.passive:  # needed again before the eviction began
        return s._replace(where=DEV, keep=False), Do.STAY | Do.SKIP
    return s._replace(copying=True), Do.NONE


def _d2h_end(s: State, c: Ctx) -> tuple[State, int] | None:
    if s.where != LEAVING or not s.copying:
        return None
    s = s._replace(host=not c.written, copying=False)
    if s.keep or c.in_use:
        return s._replace(where=DEV, keep=False), Do.STAY
    return s._replace(where=OFF), Do.DROP


def _d2h_cancelled(s: State, _c: Ctx) -> tuple[State, int] | None:
    if s.where != LEAVING or s.copying:
        return None
    return s._replace(where=DEV), Do.STAY


def _h2d_end(s: State, _c: Ctx) -> tuple[State, int] | None:
    return (s._replace(where=DEV), Do.STAY) if s.where == ARRIVING else None


def _h2d_failed(s: State, _c: Ctx) -> tuple[State, int] | None:
    return (s._replace(where=OFF), Do.NONE) if s.where == ARRIVING else None


def _need(s: State, c: Ctx) -> tuple[State, int]:
    if s.where == DEV:
        return s, Do.NONE
    if s.where == LEAVING:  # used while it leaves: it stays
        return s._replace(keep=True), Do.NONE
    if s.where == ARRIVING:
        return s, Do.STALL
    if c.recompute:
        return s, Do.RECOMPUTE
    if s.host:
        return s._replace(where=ARRIVING), Do.FETCH
    if c.remakeable:
        return s, Do.REMAKE_CHAIN
    return s, Do.LOST


def _write(s: State, _c: Ctx) -> tuple[State, int]:
    return s._replace(host=False), Do.NONE


def _end_life(s: State, _c: Ctx) -> tuple[State, int]:
    """FREE and STOP: a copy running for this life still reads the bytes and
    returns them when it ends; otherwise they are freed now."""
    if s.where == DEV or (s.where == LEAVING and not s.copying):
        do = Do.DROP
    elif s.where == LEAVING:
        do = Do.DETACH
    else:
        do = Do.NONE
    return DEAD, do


_RULES = {
    Event.CREATE: _create,
    Event.REMAKE: _remake,
    Event.TAKE_FAILED: _take_failed,
    Event.DROP: _drop,
    Event.RELEASE: _release,
    Event.SWAP_OUT: _swap_out,
    Event.SWAP_IN: _swap_in,
    Event.COPY_OUT: _copy_out,
    Event.D2H_START: _d2h_start,
    Event.D2H_END: _d2h_end,
    Event.D2H_CANCELLED: _d2h_cancelled,
    Event.H2D_END: _h2d_end,
    Event.H2D_FAILED: _h2d_failed,
    Event.NEED: _need,
    Event.WRITE: _write,
    Event.FREE: _end_life,
    Event.STOP: _end_life,
}


# ---- the store -------------------------------------------------------------------------
Answer = tuple[int, bool, bool, bool, bool, int]  # new where, alive, host, keep, copying; do
# `step`'s answers as plain values: per event (and context, where it has one),
# per state code (`Buffers.apply`)
_ANSWERS: dict[object, list[Answer | None]] = {}
_ENDS_LIFE = (Event.FREE, Event.STOP)
_DROP = Do.DROP


def _answer(code: int, ev: Event, ctx: Ctx) -> Answer:
    state = State(Where(code & 3), bool(code & 4), bool(code & 8), bool(code & 16), bool(code & 32))
    new, do = step(state, ev, ctx)
    return int(new.where), new.alive, new.host, new.keep, new.copying, do


class Buffers:
    """The state of `n` buffers as per-buffer lists (`where` as plain ints),
    changed only by the methods below. `epoch[b]` numbers b's lives (NOTE [
    Incarnations ] in sim/model.py): FREE and STOP start the next.
    `copying[b]` is the epoch whose D2H copy runs, -1 if none -- never a bare
    flag, which would outlive the life it was set for. `wcount[b]` counts the
    writes of `b` while `reading` (D2H copies moving bytes) is not 0 (NOTE [
    Writes during a copy ] in sim/copies.py)."""

    def __init__(self, n: int):
        self.where = [OFF] * n
        self.alive = [False] * n
        self.host = [False] * n
        self.keep = [False] * n
        self.epoch = [0] * n
        self.copying = [-1] * n
        self.wcount = [0] * n
        self.reading = 0

    def state(self, b: int) -> State:
        """`b`'s state as `step` sees it."""
        copying = self.copying[b] == self.epoch[b]
        return State(Where(self.where[b]), self.alive[b], self.host[b], self.keep[b], copying)

    def states(self) -> tuple[tuple, ...]:
        """Every buffer's `state`, epochs left out, hashable: two stores with
        equal `states` answer every event alike."""
        copying = tuple(c == e for c, e in zip(self.copying, self.epoch))
        return (tuple(self.where), tuple(self.alive), tuple(self.host), tuple(self.keep), copying)

    def apply(self, b: int, ev: Event, ctx: Ctx = NO_CTX) -> int:
        """Move buffer `b` by `ev` (`step`); returns what the caller must do
        (`Do` bits). Ending a life bumps its epoch; `copying` is kept as the
        epoch whose D2H copy runs."""
        ep = self.epoch[b]
        copying = self.copying[b] == ep
        code = (
            self.where[b]
            | self.alive[b] << 2
            | self.host[b] << 3
            | self.keep[b] << 4
            | copying << 5
        )
        key = ev if ctx is NO_CTX else (ev, ctx)
        answers = _ANSWERS.get(key)
        if answers is None:
            answers = _ANSWERS[key] = [None] * 64
        answer = answers[code]
        if answer is None:
            answer = answers[code] = _answer(code, ev, ctx)
        self.where[b], self.alive[b], self.host[b], self.keep[b], now_copying, do = answer
        if now_copying != copying:
            self.copying[b] = ep if now_copying else -1
        if ev in _ENDS_LIFE:
            self.epoch[b] = ep + 1  # pending events for this life of `b` are void
        return do

    def end_all(self) -> list[tuple[int, int]]:
        """STOP for every buffer: (buffer, `Do` bits) of those that were not
        dead (a dead buffer's STOP leaves it dead and does nothing but move its
        epoch)."""
        where, alive, host, keep = self.where, self.alive, self.host, self.keep
        epoch, apply = self.epoch, self.apply
        out = []
        for b in range(len(where)):
            if where[b] == OFF and not (alive[b] or host[b] or keep[b]):
                epoch[b] += 1
            else:
                out.append((b, apply(b, Event.STOP)))
        return out

    # NOTE [ Fast paths of the transition function ]
    # Every op creates, writes and frees buffers, so `create`, `written` and
    # the common case of `free` set what `step` gives for CREATE, WRITE and
    # FREE without asking it, `static_op` does all three for an op of a
    # static replay in one call (the checker), and `end_all` skips the dead
    # buffers' STOP: an `apply` costs about a microsecond, an op of the
    # model's loop about two (`benchmarks/sim.py`). tests/semantics/test_buffers.py holds each to
    # the function in every reachable state. Measured: docs/notes.md, "Fast paths of the
    # transition function".
    def create(self, b: int) -> None:
        """A new life of `b` on the device: CREATE (the pool takes its bytes)."""
        self.where[b] = DEV
        self.alive[b] = True
        self.host[b] = self.keep[b] = False

    def create_all(self, bufs: tuple[int, ...]) -> None:
        """`create` each of `bufs` (an op's outputs where no pool is told)."""
        where, alive, host, keep = self.where, self.alive, self.host, self.keep
        for b in bufs:
            where[b] = DEV
            alive[b] = True
            host[b] = keep[b] = False

    def static_op(
        self, creates: tuple[int, ...], writes: tuple[int, ...], frees: tuple[int, ...]
    ) -> None:
        """An op of a static replay (no copy runs, no pool is told): `create`
        its outputs, WRITE what it writes, `free` what the framework frees
        after it -- one call per op, the common cases written out."""
        where, alive, host, keep, epoch = self.where, self.alive, self.host, self.keep, self.epoch
        for b in creates:
            where[b] = DEV
            alive[b] = True
            host[b] = keep[b] = False
        for b in writes:
            host[b] = False
        for b in frees:
            if where[b] <= DEV:  # OFF or DEV: `free`'s common case
                where[b] = OFF
                alive[b] = host[b] = keep[b] = False
                epoch[b] += 1
            else:
                self.apply(b, Event.FREE)

    def free(self, b: int) -> int:
        """The framework frees `b` (FREE); returns the `Do` bits. Most frees find
        `b` on the device or off it, not leaving or arriving: those cases are
        written here."""
        ep, w = self.epoch[b], self.where[b]
        if w <= DEV:  # OFF or DEV
            self.where[b] = OFF
            self.alive[b] = self.host[b] = self.keep[b] = False
            self.epoch[b] = ep + 1
            return _DROP if w == DEV else 0
        return self.apply(b, Event.FREE)

    def written(self, bufs: tuple[int, ...]) -> None:
        """An op writes `bufs` (WRITE): a host copy goes stale, and a D2H copy
        moving meanwhile counts the write (NOTE [ Writes during a copy ])."""
        host = self.host
        for b in bufs:
            host[b] = False
        if self.reading:
            wcount = self.wcount
            for b in bufs:
                wcount[b] += 1
