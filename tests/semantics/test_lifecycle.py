"""The state x event table of a buffer (`planners.core.lifecycle.step`).

`TABLE` restates NOTE [ Event semantics ] (sim/model.py) as rows, written
from the note and not from `step`: for an event, the states it applies in
(where, and a condition on the flags and the driver's context), the new
where and flags, and what the driver does. The first matching row is the
rule. The tests walk every reachable state, every event and every context:
each triple matches a row, `step` agrees with it, every row is used, and
the buffer's bytes are conserved.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

import pytest
from memplan.planners.core.lifecycle import (
    DEAD,
    Ctx,
    Do,
    Event,
    IllegalTransition,
    State,
    Where,
    holds_bytes,
    step,
)

OFF, DEV, LEAVING, ARRIVING = Where
E = Event
ANY = frozenset(Where)
ILLEGAL = "illegal"


class Row(NamedTuple):
    event: Event
    where: frozenset[Where]
    when: Callable[[State, Ctx], bool]
    to: Where | None  # None: where is unchanged; ignored for an illegal row
    flags: dict[str, bool]  # flags the event sets
    do: int | str


def always(_s: State, _c: Ctx) -> bool:
    return True


def row(ev, where, when=always, to=None, flags=None, do=Do.NONE) -> Row:
    ws = frozenset(where) if isinstance(where, tuple | set | frozenset) else frozenset({where})
    return Row(ev, ws, when, to, flags or {}, do)


LIFE_ENDS = {"alive": False, "host": False, "keep": False, "copying": False}
TABLE: tuple[Row, ...] = (
    # a new life: allocated on the device, no host copy
    row(E.CREATE, OFF, lambda s, c: not s.alive, DEV, {"alive": True, "host": False, "keep": False},
        Do.TAKE),
    row(E.CREATE, ANY, do=ILLEGAL),
    # a recompute chain takes an absent buffer's bytes again; the life is the same
    row(E.REMAKE, OFF, to=DEV, do=Do.TAKE),
    row(E.REMAKE, ANY, do=ILLEGAL),
    # an allocator model may refuse those bytes: the buffer is absent, and the job stops
    row(E.TAKE_FAILED, DEV, to=OFF),
    row(E.TAKE_FAILED, ANY, do=ILLEGAL),
    row(E.DROP, DEV, to=OFF, do=Do.DROP),
    row(E.DROP, ANY, do=ILLEGAL),
    # Release frees the device copy at once; of a leaving buffer it undoes a cancelled free
    row(E.RELEASE, DEV, lambda s, c: s.alive, OFF, do=Do.DROP | Do.RELEASED),
    row(E.RELEASE, LEAVING, flags={"keep": False}, do=Do.RELEASED),
    row(E.RELEASE, ANY, do=Do.SKIP),
    # SwapOut: with a valid host copy and no delay the device copy is dropped at the
    # trigger; else the buffer leaves and a copy is started
    row(E.SWAP_OUT, DEV, lambda s, c: s.alive and s.host and not c.delayed, OFF,
        do=Do.DROP | Do.DISCARD),
    row(E.SWAP_OUT, DEV, lambda s, c: s.alive, LEAVING, {"keep": False}, Do.LEAVE | Do.COPY_D2H),
    row(E.SWAP_OUT, ANY, do=Do.SKIP),
    # SwapIn: joins a swap-in under way; copies a valid host copy; keeps a leaving buffer
    row(E.SWAP_IN, ARRIVING, do=Do.JOIN),
    row(E.SWAP_IN, OFF, lambda s, c: s.alive and s.host, ARRIVING, do=Do.COPY_H2D),
    row(E.SWAP_IN, LEAVING, flags={"keep": True}, do=Do.SKIP),
    row(E.SWAP_IN, ANY, do=Do.SKIP),
    # a D2H copy asked for: with a valid host copy no bytes move (stays if wanted)
    row(E.COPY_OUT, (DEV, LEAVING), lambda s, c: s.copying, do=ILLEGAL),
    row(E.COPY_OUT, (DEV, LEAVING), lambda s, c: s.host and (s.keep or c.in_use), DEV,
        {"keep": False}, Do.STAY | Do.SKIP),
    row(E.COPY_OUT, (DEV, LEAVING), lambda s, c: s.host, OFF, do=Do.DROP | Do.DISCARD),
    row(E.COPY_OUT, (DEV, LEAVING), to=LEAVING, do=Do.LEAVE),
    row(E.COPY_OUT, ANY, do=ILLEGAL),
    # the lane is granted: an eviction of a buffer wanted back meanwhile is called off
    row(E.D2H_START, LEAVING, lambda s, c: s.copying, do=ILLEGAL),
    row(E.D2H_START, LEAVING, lambda s, c: s.keep and c.passive, DEV, {"keep": False},
        Do.STAY | Do.SKIP),
    row(E.D2H_START, LEAVING, flags={"copying": True}),
    row(E.D2H_START, ANY, do=ILLEGAL),
    # the copy ends: a host copy unless written meanwhile; freed unless wanted or in use
    row(E.D2H_END, LEAVING, lambda s, c: s.copying and (s.keep or c.in_use), DEV,
        {"copying": False, "keep": False, "host": None}, Do.STAY),
    row(E.D2H_END, LEAVING, lambda s, c: s.copying, OFF, {"copying": False, "host": None},
        Do.DROP),
    row(E.D2H_END, ANY, do=ILLEGAL),
    row(E.D2H_CANCELLED, LEAVING, lambda s, c: not s.copying, DEV, do=Do.STAY),
    row(E.D2H_CANCELLED, ANY, do=ILLEGAL),
    # a swap-in lands (the host copy stays valid) or ends without its copy
    row(E.H2D_END, ARRIVING, to=DEV, do=Do.STAY),
    row(E.H2D_END, ANY, do=ILLEGAL),
    row(E.H2D_FAILED, ARRIVING, to=OFF),
    row(E.H2D_FAILED, ANY, do=ILLEGAL),
    # an op needs it: leaving, it stays; arriving, the op stalls; absent, the plan's
    # recompute first, then a fetch of the host copy, then DTR, else the data is lost
    row(E.NEED, DEV),
    row(E.NEED, LEAVING, flags={"keep": True}),
    row(E.NEED, ARRIVING, do=Do.STALL),
    row(E.NEED, OFF, lambda s, c: c.recompute, do=Do.RECOMPUTE),
    row(E.NEED, OFF, lambda s, c: s.host, ARRIVING, do=Do.FETCH),
    row(E.NEED, OFF, lambda s, c: c.remakeable, do=Do.REMAKE_CHAIN),
    row(E.NEED, OFF, do=Do.LOST),
    row(E.WRITE, ANY, flags={"host": False}),
    # the life ends; a copy running for it keeps reading the bytes and frees them
    row(E.FREE, (DEV,), to=OFF, flags=LIFE_ENDS, do=Do.DROP),
    row(E.FREE, LEAVING, lambda s, c: not s.copying, OFF, LIFE_ENDS, Do.DROP),
    row(E.FREE, LEAVING, to=OFF, flags=LIFE_ENDS, do=Do.DETACH),
    row(E.FREE, (OFF, ARRIVING), to=OFF, flags=LIFE_ENDS),
    row(E.STOP, (DEV,), to=OFF, flags=LIFE_ENDS, do=Do.DROP),
    row(E.STOP, LEAVING, lambda s, c: not s.copying, OFF, LIFE_ENDS, Do.DROP),
    row(E.STOP, LEAVING, to=OFF, flags=LIFE_ENDS, do=Do.DETACH),
    row(E.STOP, (OFF, ARRIVING), to=OFF, flags=LIFE_ENDS),
)  # fmt: skip

CONTEXTS = tuple(Ctx(*bits) for bits in itertools.product((False, True), repeat=len(Ctx._fields)))


def _rule(s: State, ev: Event, c: Ctx) -> tuple[int, State | None, Do | None]:
    """The table's answer: (row index, new state, do), or (row, None, None) if illegal."""
    for k, r in enumerate(TABLE):
        if r.event is ev and s.where in r.where and r.when(s, c):
            if r.do == ILLEGAL:
                return k, None, None
            new = s._replace(where=r.to if r.to is not None else s.where)
            for name, value in r.flags.items():
                if value is None:  # the one computed flag: host after a D2H copy
                    value = not c.written
                new = new._replace(**{name: value})
            return k, new, r.do
    raise AssertionError(f"no row for {ev} in {s}")


def _reachable() -> set[State]:
    seen, todo = {DEAD}, [DEAD]
    while todo:
        s = todo.pop()
        for ev, c in itertools.product(Event, CONTEXTS):
            try:
                new, _ = step(s, ev, c)
            except IllegalTransition:
                continue
            if new not in seen:
                seen.add(new)
                todo.append(new)
    return seen


REACHABLE = sorted(_reachable())


def test_the_reachable_states():
    """Every where with and without each flag a driver can leave set, and
    `copying` only while leaving: 32 states."""
    assert len(REACHABLE) == 32
    assert {s.where for s in REACHABLE} == set(Where)
    assert all(not s.copying for s in REACHABLE if s.where != LEAVING)
    assert DEAD in REACHABLE


@pytest.mark.parametrize("ev", list(Event), ids=lambda e: e.value)
def test_every_state_and_event_follows_the_table(ev: Event):
    for s, c in itertools.product(REACHABLE, CONTEXTS):
        _k, new, do = _rule(s, ev, c)
        if new is None:
            with pytest.raises(IllegalTransition):
                step(s, ev, c)
        else:
            assert step(s, ev, c) == (new, do), (s, ev, c)


def test_every_row_is_used():
    used = {_rule(s, ev, c)[0] for s in REACHABLE for ev in Event for c in CONTEXTS}
    assert used == set(range(len(TABLE))), sorted(set(range(len(TABLE))) - used)


def test_the_bytes_are_conserved():
    """What the buffer holds on the device changes only by what the driver is
    told to do: TAKE adds its bytes, DROP and DETACH take them away, STAY
    after a swap-in hands it the bytes its copy took, and TAKE_FAILED says the
    TAKE before it did not happen."""
    for s, ev, c in itertools.product(REACHABLE, Event, CONTEXTS):
        try:
            new, do = step(s, ev, c)
        except IllegalTransition:
            continue
        gained = bool(do & Do.TAKE) + bool(do & Do.STAY and s.where == ARRIVING)
        lost = bool(do & Do.DROP) + bool(do & Do.DETACH) + (ev is E.TAKE_FAILED)
        assert holds_bytes(new) - holds_bytes(s) == gained - lost, (s, ev, c, new, do)


def test_a_life_that_ended_is_dead():
    for s, c in itertools.product(REACHABLE, CONTEXTS):
        for ev in (E.FREE, E.STOP):
            assert step(s, ev, c)[0] == DEAD


def test_a_swap_round_trip_by_hand():
    """Created, swapped out (copied, freed, host copy kept), swapped in: on the
    device with its host copy still valid; a write makes that copy stale."""
    s, do = step(DEAD, E.CREATE)
    assert (s, do) == (State(DEV, True, False, False, False), Do.TAKE)
    s, do = step(s, E.SWAP_OUT, Ctx(delayed=True))
    assert (s.where, do) == (LEAVING, Do.LEAVE | Do.COPY_D2H)
    s, _ = step(s, E.COPY_OUT)
    s, _ = step(s, E.D2H_START)
    s, do = step(s, E.D2H_END)
    assert (s, do) == (State(OFF, True, True, False, False), Do.DROP)
    s, do = step(s, E.SWAP_IN)
    assert (s.where, do) == (ARRIVING, Do.COPY_H2D)
    s, do = step(s, E.H2D_END)
    assert (s, do) == (State(DEV, True, True, False, False), Do.STAY)
    assert step(s, E.SWAP_OUT)[1] == Do.DROP | Do.DISCARD  # the host copy is still good
    assert step(s, E.WRITE)[0].host is False
