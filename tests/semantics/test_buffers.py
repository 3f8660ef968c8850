"""The store of buffer states against the transition function: `Buffers.apply`
writes what `step` says, and the fast paths (NOTE [ Fast paths of the
transition function ]) equal the events they stand for, in every reachable
state."""

from __future__ import annotations

import itertools

import pytest
from memplan.planners.core.lifecycle import (
    DEAD,
    Buffers,
    Ctx,
    Event,
    IllegalTransition,
    State,
    Where,
    step,
)

from tests.semantics.test_lifecycle import CONTEXTS, REACHABLE


def _buffers(n: int = 3) -> Buffers:
    return Buffers(n)


def _put(s: Buffers, b: int, st: State, epoch: int = 5) -> None:
    s.where[b], s.alive[b], s.host[b], s.keep[b] = int(st.where), st.alive, st.host, st.keep
    s.epoch[b] = epoch
    s.copying[b] = epoch if st.copying else epoch - 2  # an earlier life's copy reads False


def _get(s: Buffers, b: int) -> State:
    return s.state(b)


@pytest.mark.parametrize("ev", list(Event), ids=lambda e: e.value)
def test_apply_writes_what_step_says(ev: Event):
    for st, ctx in itertools.product(REACHABLE, CONTEXTS[:: len(CONTEXTS) // 8]):
        s = _buffers()
        _put(s, 1, st)
        try:
            want, do = step(st, ev, ctx)
        except IllegalTransition:
            with pytest.raises(IllegalTransition):
                s.apply(1, ev, ctx)
            continue
        assert s.apply(1, ev, ctx) == do
        ends = ev in (Event.FREE, Event.STOP)
        assert s.epoch[1] == 5 + ends
        if not ends:
            assert _get(s, 1) == want
        else:  # the next life starts dead, and no copy runs for it
            assert want == DEAD
            assert (s.where[1], s.alive[1], s.host[1], s.keep[1]) == (0, False, False, False)
            assert s.copying[1] != s.epoch[1]
        assert _get(s, 0) == DEAD and _get(s, 2) == DEAD  # its neighbours are untouched


def test_create_is_the_create_event():
    legal = [st for st in REACHABLE if st.where == Where.OFF and not st.alive]
    assert DEAD in legal and len(legal) > 1  # some with stale flags of an earlier life
    for st in legal:
        s = _buffers()
        _put(s, 1, st)
        s.create(1)
        assert _get(s, 1) == step(st, Event.CREATE)[0]


def test_written_is_the_write_event():
    for st in REACHABLE:
        s = _buffers()
        _put(s, 1, st)
        s.written((1,))
        assert _get(s, 1) == step(st, Event.WRITE)[0]


def test_written_counts_writes_only_while_a_copy_reads():
    s = _buffers()
    s.written((0, 1))
    assert s.wcount == [0, 0, 0]
    s.reading = 1
    s.written((0, 1))
    assert s.wcount == [1, 1, 0]


def test_a_copy_of_an_earlier_life_is_not_this_ones():
    """`copying` holds the epoch whose D2H copy runs: after a FREE the old copy
    may still run, and the new life reads as not being copied."""
    s = _buffers()
    s.create(0)
    s.apply(0, Event.SWAP_OUT, Ctx(delayed=True))
    s.apply(0, Event.COPY_OUT)
    s.apply(0, Event.D2H_START)
    assert _get(s, 0).copying
    s.apply(0, Event.FREE)
    s.create(0)
    assert _get(s, 0) == State(Where.DEV, True, False, False, False)


def test_end_all_is_stop_for_every_buffer():
    n = len(REACHABLE)
    ended, one_by_one = _buffers(n), _buffers(n)
    for b, st in enumerate(REACHABLE):
        _put(ended, b, st)
        _put(one_by_one, b, st)
    got = dict(ended.end_all())
    for b in range(n):
        do = one_by_one.apply(b, Event.STOP)
        assert got.get(b, 0) == do  # a dead buffer's STOP does nothing
        assert _get(ended, b) == _get(one_by_one, b) == DEAD
    assert ended.epoch == one_by_one.epoch == [6] * n
    assert DEAD in REACHABLE and REACHABLE.index(DEAD) not in got


def test_free_is_the_free_event():
    for st in REACHABLE:
        fast, slow = _buffers(), _buffers()
        _put(fast, 1, st)
        _put(slow, 1, st)
        assert fast.free(1) == slow.apply(1, Event.FREE)
        assert _get(fast, 1) == _get(slow, 1) and fast.epoch == slow.epoch
        assert fast.copying[1] != fast.epoch[1]


def test_the_batch_paths_are_one_by_one():
    n = len(REACHABLE)
    dead = [b for b, st in enumerate(REACHABLE) if st.where == Where.OFF and not st.alive]
    batch, single = _buffers(n), _buffers(n)
    for b, st in enumerate(REACHABLE):
        _put(batch, b, st)
        _put(single, b, st)
    batch.create_all(tuple(dead))
    for b in dead:
        single.create(b)
    for b in range(n):
        single.free(b)
    batch.static_op((), (), tuple(range(n)))
    assert [batch.state(b) for b in range(n)] == [single.state(b) for b in range(n)]
    assert batch.epoch == single.epoch


def test_a_static_op_is_create_write_free():
    """`static_op` equals CREATE of its outputs, WRITE, then FREE, one by one,
    from every reachable state of a written or freed buffer."""
    n = len(REACHABLE)
    dead = tuple(b for b, st in enumerate(REACHABLE) if st.where == Where.OFF and not st.alive)
    others = tuple(b for b in range(n) if b not in dead)
    for frees in (others[::2], others[1::2] + dead[:1]):
        fast, slow = _buffers(n), _buffers(n)
        for b, st in enumerate(REACHABLE):
            _put(fast, b, st)
            _put(slow, b, st)
        writes = tuple(range(0, n, 3))
        fast.static_op(dead[1:], writes, frees)
        for b in dead[1:]:
            slow.apply(b, Event.CREATE)
        for b in writes:
            slow.apply(b, Event.WRITE)
        for b in frees:
            slow.apply(b, Event.FREE)
        assert [fast.state(b) for b in range(n)] == [slow.state(b) for b in range(n)]
        assert fast.epoch == slow.epoch
