"""The copy lane on its own: the emulated link's schedule (NOTE [ Throttled
copies ] in validate/replay/lanes.py), with a mover that moves nothing."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from memplan.validate.replay.lanes import Lane
from memplan.validate.replay.mover import GIL_COPY_BYTES, cpu_copy
from memplan.validate.replay.transfer import Direction, Latch, Transfer


class _Mover:
    """Every transfer needs the lane and starts; nothing is copied."""

    cuda = False

    def __init__(self) -> None:
        self.pool = SimpleNamespace(lock=threading.RLock(), leaving={}, arriving={}, errors=[])
        self.steps: list[tuple[str, int]] = []

    def arrive(self, t: Transfer) -> bool:
        self.steps.append(("arrive", t.buffer))
        return True

    def start(self, t: Transfer, lane: int) -> bool:
        self.steps.append(("start", t.buffer))
        return True

    def end(self, t: Transfer) -> None:
        self.steps.append(("end", t.buffer))


def _transfer(b: int, ready_s: float, nbytes: int) -> Transfer:
    return Transfer(Direction.D2H, b, 0, f"swap_out of buffer {b}", nbytes, ready_s, ready_s, 0)


def test_the_link_schedule_does_not_drift_with_the_thread():
    # three copies of 5 s each on the link, ready 20 s ago: by the link's
    # schedule all three ended 5 s ago, so a lane that starts late ends each
    # at once instead of holding it for 5 s after it got to it
    mover = _Mover()
    t0 = time.perf_counter()
    lane = Lane(0, mover, bandwidth_bytes_per_s=1e6, t0=t0)
    transfers = [_transfer(b, t0 - 20.0, 5_000_000) for b in range(3)]
    for t in transfers:
        lane.submit(t)
    lane.start()
    lane.close()
    lane.join()
    assert all(t.done.is_set() for t in transfers)
    assert time.perf_counter() - t0 < 5.0  # far less; a drifting lane takes 15 s
    arrivals = [("arrive", b) for b in range(3)]  # all ready at once, then FIFO on the link
    assert mover.steps == arrivals + [(s, b) for b in range(3) for s in ("start", "end")]
    assert [r.buffer for r in lane.records] == [0, 1, 2]


def test_a_copy_is_held_for_its_bytes_time_from_its_ready_time():
    mover = _Mover()
    t0 = time.perf_counter()
    lane = Lane(0, mover, bandwidth_bytes_per_s=1e9, t0=t0)
    t = _transfer(7, t0, 20_000_000)  # 20 ms on the link
    lane.submit(t)
    lane.start()
    lane.close()
    lane.join()
    (r,) = lane.records
    assert r.end_s >= r.ready_s + 0.02


def _asleep(lane: Lane, until: float, idle: bool) -> Lane:
    """Put a lane that has not started in the state of a sleeping one."""
    lane._wake_at, lane._idle = until, idle
    return lane


def test_a_ready_copy_wakes_only_an_idle_lane():
    # NOTE [ Lean lanes ]: a busy lane takes the copy when its current one
    # ends, so queueing it must not wake the lane thread; an idle one must
    now = time.perf_counter()
    busy = _asleep(Lane(0, _Mover(), 1e9, now), until=now + 100.0, idle=False)
    busy.submit(_transfer(1, now, 10))
    assert busy._wake.locked()  # no poke
    idle = _asleep(Lane(0, _Mover(), 1e9, now), until=math.inf, idle=True)
    idle.submit(_transfer(1, now, 10))
    assert not idle._wake.locked()  # poked
    awake = _asleep(Lane(0, _Mover(), 1e9, now), until=-math.inf, idle=True)
    awake.submit(_transfer(1, now, 10))
    assert awake._wake.locked()  # it looks at the queue before it sleeps


def test_a_delayed_copy_wakes_the_lane_only_before_it_would_wake():
    now = time.perf_counter()
    later = _asleep(Lane(0, _Mover(), 1e9, now), until=now + 100.0, idle=False)
    later.submit(_transfer(1, now + 200.0, 10))
    assert later._wake.locked()  # ready after the lane wakes anyway
    sooner = _asleep(Lane(0, _Mover(), 1e9, now), until=now + 100.0, idle=False)
    sooner.submit(_transfer(1, now + 50.0, 10))
    assert not sooner._wake.locked()


def test_a_ready_copy_arrives_on_the_queueing_thread():
    mover = _Mover()
    lane = Lane(0, mover, 1e9, time.perf_counter())
    lane.submit(_transfer(4, time.perf_counter() - 1.0, 10))
    assert mover.steps == [("arrive", 4)]  # the lane thread has not even started
    delayed = _transfer(5, time.perf_counter() + 100.0, 10)
    lane.submit(delayed)
    assert mover.steps == [("arrive", 4)]  # the lane arrives it at its ready time


def test_latch():
    latch = Latch()
    assert not latch.is_set() and not latch.wait(0.0)
    waiters = [threading.Thread(target=latch.wait) for _ in range(3)]
    for w in waiters:
        w.start()
    latch.set()
    latch.set()  # a second set is a no-op, not an error
    for w in waiters:
        w.join(60.0)  # a safety net: every waiter passes once it is set
    assert latch.is_set() and latch.wait(0.0) and not any(w.is_alive() for w in waiters)


@pytest.mark.parametrize("nbytes", [0, 1, 4097, GIL_COPY_BYTES, GIL_COPY_BYTES + 1, 1 << 20])
def test_cpu_copy_copies_every_byte(nbytes):
    src = torch.randint(
        0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes)
    )
    dst = torch.UntypedStorage(nbytes)
    cpu_copy(dst, src.untyped_storage())
    assert torch.equal(torch.empty(0, dtype=torch.uint8).set_(dst), src)
