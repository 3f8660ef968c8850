"""The `dtr` OOM policy: the pool that evicts by DTR's heuristic (NOTE [ DTR ]
in sim/remat.py), and how it finds its victim fast (NOTE [ DTR's scan ])."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from typing import Any

from memplan.planners.core.lifecycle import Event
from memplan.sim.job import CompiledJob
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.memory import StallPool
from memplan.sim.remat import ABSENT, STALENESS_EPS_US, RematTable
from memplan.sim.state import Gen, JobState

K = LogKind

# NOTE [ DTR's scan ]
# h = k / s, k the per-byte cost (c / m) and s the staleness, which grows with time, so no
# order of the candidates lasts: each eviction scans them, but only as far as one can still win
# -- at worst every resident buffer, as DTR does. Per job, a resident (non-empty) buffer is
# filed in a bucket by the k of the state it was filed in (host copy: fetch; droppable: its
# producer's duration; else: swap), one bucket per 1/16 of a power of two, whose `floor` is the
# least k ever filed in it; a bucket is sorted by (last use, buffer), and every use files the
# buffer again at the end. While it stays filed its k only grows (a write spoils a host copy;
# its evicted neighbourhood adds), so along a bucket floor / s is a lower bound of h that
# grows: once it passes the best h found, the scan leaves the bucket. The neighbourhood of a
# droppable candidate is walked only if its producer's cost alone does not already lose, and
# only as far as it can still win. The choice is the exact minimum of h; ties go to the lower
# job, then the staler buffer, then the lower buffer id (tests/sim/test_dtr.py checks it
# against a plain scan).
_STEPS = 16
_NO_COST = -(1 << 30)  # the key of a free eviction (k = 0)


class _Bucket:
    __slots__ = ("floor", "items")

    def __init__(self, floor: float):
        self.floor = floor
        self.items: list[tuple[float, int]] = []  # (last use, buffer), ascending


class _Shelf:
    """One job's buckets, ascending by key, and where each buffer is filed."""

    __slots__ = ("keys", "buckets", "by_key", "filed")

    def __init__(self, n_buffers: int):
        self.keys: list[int] = []
        self.buckets: list[_Bucket] = []
        self.by_key: dict[int, _Bucket] = {}
        self.filed: list[_Bucket | None] = [None] * n_buffers

    def bucket(self, k: float) -> _Bucket:
        key = math.floor(math.log2(k) * _STEPS) if k > 0 else _NO_COST
        bucket = self.by_key.get(key)
        if bucket is None:
            at = bisect_left(self.keys, key)
            bucket = self.by_key[key] = _Bucket(k)
            self.keys.insert(at, key)
            self.buckets.insert(at, bucket)
        elif k < bucket.floor:
            bucket.floor = k
        return bucket


class DtrPool(StallPool):
    """The `dtr` policy: evict the buffer with the least c / (m * s), dropping
    what can be remade (NOTE [ DTR ] in sim/remat.py)."""

    dtr = True

    def __init__(self, *parts: Any, **named: Any):  # as `MemoryPool` takes them
        super().__init__(*parts, **named)
        self.tables = [RematTable(s.c, self.device) for s in self.jobs]
        self.shelves = [_Shelf(len(t.prod)) for t in self.tables]

    def remakeable(self, s: JobState, b: int, i: int) -> bool:
        return self.tables[s.c.index].remakeable(b, i)

    def plan_changed(self, c: CompiledJob) -> None:
        # what the job may remake depends on the plan's releases
        self.tables[c.index] = RematTable(c, self.device)

    # ---- the choice ------------------------------------------------------------------
    def victim(self) -> tuple[int, int] | None:
        # the exact least h, by NOTE [ DTR's scan ]
        now, eps, inf = self.env.now, STALENESS_EPS_US, float("inf")
        best_h, best_j, best_t, best_b = inf, -1, inf, -1
        for j, shelf in enumerate(self.shelves):
            s, t = self.jobs[j], self.tables[j]
            pinned, host, alive, where, nbytes = s.pinned, s.host, s.alive, s.where, s.c.nbytes
            droppable, inputs = t.droppable, t.inputs
            swap_pb, fetch_pb, redo_pb = t.swap_pb, t.fetch_pb, t.redo_pb
            for bucket in shelf.buckets:
                floor = bucket.floor
                for lu, b in bucket.items:
                    age = now - lu
                    if age < eps:
                        age = eps
                    least = floor / age  # no later buffer of this bucket has less
                    if least > best_h or (
                        least == best_h and (j > best_j or (lu, b) >= (best_t, best_b))
                    ):
                        break
                    if b in pinned:
                        continue
                    if not alive[b]:
                        k = swap_pb[b]
                    elif host[b]:
                        k = fetch_pb[b]
                    elif droppable[b]:
                        k = redo_pb[b]
                        if k > best_h * age:  # its neighbourhood only adds
                            continue
                        for z in inputs[b]:
                            if where[z] in ABSENT:  # walked as far as it can win
                                m = nbytes[b]
                                k += t.neighbourhood_us(s, b, (best_h * age - k) * m) / m
                                break
                    else:
                        k = swap_pb[b]
                    h = k / age
                    if h < best_h or (h == best_h and j == best_j and (lu, b) < (best_t, best_b)):
                        best_h, best_j, best_t, best_b = h, j, lu, b
        return None if best_j < 0 else (best_j, best_b)

    def evict(self, owner: JobState, b: int, op: int) -> Gen:
        if owner.alive[b] and not owner.host[b] and self.tables[owner.c.index].droppable[b]:
            self.act(owner, b, owner.apply(b, Event.DROP))
            owner.evictions += 1
            owner.evicted_bytes += owner.c.nbytes[b]
            self.log.append(LogEntry(self.env.now, owner.c.index, owner.iteration, K.DROP, op, b))
            return
        yield from self.copies.copy_out(owner, b, op, True)

    # ---- buffers ---------------------------------------------------------------------
    def take(self, s: JobState, b: int) -> None:
        super().take(s, b)
        self._file(s, b)

    def drop(self, s: JobState, b: int) -> None:
        self._unfile(s, b)
        super().drop(s, b)

    def stay(self, s: JobState, b: int) -> None:
        super().stay(s, b)
        self._file(s, b)

    def leave(self, s: JobState, b: int) -> None:
        self._unfile(s, b)

    def touch(self, s: JobState, bufs: tuple[int, ...]) -> None:
        now, last, filed = self.env.now, s.last_use, self.shelves[s.c.index].filed
        for b in bufs:
            bucket = filed[b]
            if bucket is not None:
                items = bucket.items
                del items[bisect_left(items, (last[b], b))]
                insort(items, (now, b))
            last[b] = now

    # ---- the shelf -------------------------------------------------------------------
    def _file(self, s: JobState, b: int) -> None:
        """`b` is on the device, used now: file it by the per-byte cost of its
        state (NOTE [ DTR's scan ])."""
        self._unfile(s, b)
        s.last_use[b] = self.env.now
        m = s.c.nbytes[b]
        if not m:  # an empty buffer frees nothing: never a victim
            return
        j = s.c.index
        t, shelf = self.tables[j], self.shelves[j]
        if not s.alive[b]:
            k = t.swap_pb[b]
        elif s.host[b]:
            k = t.fetch_pb[b]
        else:
            k = t.redo_pb[b] if t.droppable[b] else t.swap_pb[b]
        bucket = shelf.filed[b] = shelf.bucket(k)
        insort(bucket.items, (s.last_use[b], b))

    def _unfile(self, s: JobState, b: int) -> None:
        filed = self.shelves[s.c.index].filed
        bucket = filed[b]
        if bucket is not None:
            items = bucket.items
            del items[bisect_left(items, (s.last_use[b], b))]
            filed[b] = None
