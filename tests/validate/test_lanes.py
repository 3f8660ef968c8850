"""The copy lane on its own: the emulated link's schedule (NOTE [ Throttled
copies ] in validate/lanes.py), with a mover that moves nothing."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from validate.lanes import Direction, Lane, Transfer


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
