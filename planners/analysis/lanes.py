"""Which PCIe lane time is still free (TENSILE §IV-C feasible intervals).

`LaneSet`: the lane timeline(s) of a set of jobs (NOTE [ Lane timelines ]):
free intervals, the earliest and latest free slot of a given length in a
window, which copies may fit after a start (`FreeTime`), booking. Times are
job-local unrolled microseconds.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from memplan.hwmodels.device import Direction
from memplan.planners.analysis.optimes import EPS_US, Timeline
from memplan.planners.core.errors import PlanError

# NOTE [ Lane timelines ]
# TENSILE moves one tensor at a time over PCIe (§IV-C): a swap may only use
# lane time no other swap holds. A lane is a circle of `period` microseconds
# (the iteration repeats), holding disjoint busy intervals. By default all
# jobs share one lane, as the simulator's `lanes=1` does: its period is the
# longest job's, and a job with a shorter period holds each booking once per
# repetition of its own iteration within that circle (`ceil(P / period_j)`
# replicas), so a slot is free for it only if every replica is. With
# `per_job_lane=True` each job gets its own circle of its own period -- the
# authors' simplification, which lets two jobs' copies collide at run time.
# Transfers of both directions share the lane (the paper's single channel)
# unless the device has two lanes (`DeviceModel.lanes == 2`): then every
# circle is doubled, one per `Direction`, as the simulator's `lanes=2` gives
# each direction its own copy engine.


# Intervals that overlap by less than this (us) only touch: rounding in the
# circle's modular arithmetic must not make a slot that ends where a busy
# interval starts look taken. At large times the tolerance grows with the
# magnitude (NOTE [ Lane steps relative to the magnitude ]).
_TOUCH = 1e-7
# A latest start this little (us) below the lower bound is taken, raised to it.
SLACK_US = 1e-9
D2H = Direction.D2H

# NOTE [ Lane steps relative to the magnitude ]
# Lane times are float64 microseconds, and float64 cannot resolve a constant
# step of 1e-7 us past about 2**30 us (ulp(2**30) = 2.4e-7): there
# `s - 1e-7 == s`, and a search that steps back by it (or a touch tolerance
# of that size) stands still forever -- TENSILE never returned on a trace
# whose ops all had 2**62 FLOPs. So the touch tolerance and the smallest
# step of `earliest` / `latest` are `_ULPS` units in the last place of the
# largest time in play (the circle's period and every time booked on it, or
# the time searched), never less than `_TOUCH`: reducing an unrolled time
# modulo the period loses a few ulps of the larger of the two, which 16
# covers, and up to ~2**25 us (33 s iterations) it is `_TOUCH` as before.
# Each step of a search passes a busy interval (or moves by the tolerance),
# so a search takes at most about one step per booked replica in its window;
# `_step_cap` allows four times that plus slack, and a search that runs past
# it raises `PlanError` instead of looping.
_ULPS = 16


# Below this magnitude (us) 16 ulps are under `_TOUCH`: the tolerance is `_TOUCH`.
_FLAT = 2.0**25


def _tol(x: float) -> float:
    """The touch tolerance and smallest step at magnitude `x` (us)."""
    x = abs(x)
    return _TOUCH if x < _FLAT else max(_TOUCH, _ULPS * math.ulp(x))


class _Circle:
    """Disjoint busy intervals on [0, period), sorted."""

    __slots__ = ("period", "starts", "ends", "scale")

    def __init__(self, period: float):
        self.period = period
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.scale = period  # the largest magnitude booked (NOTE [ Lane steps relative ...])

    def tol(self, a: float, b: float = 0.0) -> float:
        """The touch tolerance for a query at times `a` and `b` on this circle."""
        return _tol(max(self.scale, abs(a), abs(b)))

    def add(self, a: float, b: float) -> None:
        """Mark [a, b) busy (unrolled times; b - a <= period)."""
        P = self.period
        self.scale = max(self.scale, abs(a), abs(b))
        if b - a >= P:
            self.starts, self.ends = [0.0], [P]
            return
        k = math.floor(a / P)
        a, b = a - k * P, b - k * P
        if b > P:
            self._add(a, P)
            self._add(0.0, b - P)
        else:
            self._add(a, b)

    def _add(self, a: float, b: float) -> None:
        if b <= a:
            return
        S, E = self.starts, self.ends
        i = bisect.bisect_left(E, a)  # first interval ending at or after a
        j = bisect.bisect_right(S, b)  # intervals starting at or before b
        if i < j:
            a = min(a, S[i])
            b = max(b, E[j - 1])
        S[i:j] = [a]
        E[i:j] = [b]

    def conflict(self, a: float, b: float) -> tuple[float, float] | None:
        """A busy interval overlapping [a, b) in unrolled time (b - a < period),
        returned in unrolled coordinates: the last-ending one for `a`..`b`."""
        P = self.period
        k = math.floor(a / P)
        a0, b0 = a - k * P, b - k * P
        touch = self.tol(a, b)
        best = None
        for lo, hi, shift in ((a0, min(b0, P), k * P), (0.0, b0 - P, (k + 1) * P)):
            if hi <= lo:
                continue
            j = bisect.bisect_left(self.starts, hi - touch) - 1
            if j >= 0 and self.ends[j] > lo + touch:
                cand = (self.starts[j] + shift, self.ends[j] + shift)
                if best is None or cand[1] > best[1]:
                    best = cand
        return best

    def first_conflict(self, a: float, b: float) -> tuple[float, float] | None:
        """The earliest-starting busy interval overlapping [a, b)."""
        P = self.period
        k = math.floor(a / P)
        a0, b0 = a - k * P, b - k * P
        touch = self.tol(a, b)
        for lo, hi, shift in ((a0, min(b0, P), k * P), (0.0, b0 - P, (k + 1) * P)):
            if hi <= lo:
                continue
            j = bisect.bisect_right(self.ends, lo + touch)  # first one ending after lo
            if j < len(self.starts) and self.starts[j] < hi - touch:
                return self.starts[j] + shift, self.ends[j] + shift
        return None

    def busy_in(self, a: float, b: float) -> Iterator[tuple[float, float]]:
        """Busy intervals overlapping [a, b), unrolled and clipped to it,
        ascending (lazily: a caller may stop early)."""
        P = self.period
        if P <= 0:
            return
        k = math.floor(a / P)
        while k * P < b:
            shift = k * P
            lo, hi = a - shift, b - shift
            i = bisect.bisect_right(self.ends, lo)
            while i < len(self.starts) and self.starts[i] < hi:
                yield max(a, self.starts[i] + shift), min(b, self.ends[i] + shift)
                i += 1
            k += 1


# NOTE [ Lane walks ]
# `earliest` walks up from `lo` and `latest` down from `hi - dur`, each step
# past a busy interval in the way, to the first free start; the other end
# of the window (`hi`, `lo`) only says where to give up. So where a walk
# goes from a given start depends on (job, direction, dur, start) alone,
# and two walks that reach one start (a busy interval's end, or its start
# less `dur`) go on alike. Between two bookings the LaneSet keeps every
# start a walk passed, mapped to that walk: a search that reaches one joins
# it (its answer, or where it stopped, resumed from there). A booking can
# change any walk, so it drops them all. Many searches of one TENSILE round
# end behind the same queue of swap-ins (a residual step's skip connections
# close at backward ops a copy apart): each passes one busy interval and
# joins, instead of walking the whole queue.
class _Walk:
    """A walk of `earliest` or `latest` (NOTE [ Lane walks ]): where it
    stands, whether that start is free, its steps, and the walk it joined."""

    __slots__ = ("s", "found", "steps", "joined")

    def __init__(self, s: float):
        self.s, self.found, self.steps = s, False, 0
        self.joined: _Walk | None = None

    def head(self) -> _Walk:
        """The walk this one continues as (itself if it joined none)."""
        w = self
        while w.joined is not None:
            w = w.joined
        return w


_WalkKey = tuple[bool, int, bool, float, float]  # (up, job, direction is D2H, dur, start)


# NOTE [ Free time after a start ]
# `earliest` and `latest` take a slot [s, s + dur) as free when no busy
# interval of any replica reaches into it by more than the touch tolerance
# `tol`. So a copy can start at s >= lo and end by hi only if [lo, hi) has a
# free stretch (merged over replicas) at least dur - 2 tol long, and the
# first such stretch after lo is where the earliest such copy can start.
# `FreeTime.may_fit` answers for many copies (their own durations and
# deadlines) from one scan of the stretches after lo, read only as far as
# the first one long enough for the longest copy (or past the last
# deadline), and says no only where no stretch could hold the copy by its
# deadline. Its margin, 4 tol + `SLACK_US` on each side, also covers
# `latest` raising a start just below lo, and rounding on the circle.


class LaneSet:
    """The lane timeline(s) of a set of jobs (NOTE [ Lane timelines ]). All
    times are job-local unrolled microseconds (iteration r of job j at
    r * timelines[j].period_us)."""

    def __init__(
        self, timelines: Sequence[Timeline], *, lanes: int = 1, per_job_lane: bool = False
    ):
        if lanes not in (1, 2):
            raise ValueError(f"lanes={lanes!r} must be 1 or 2")
        periods = [max(t.period_us, EPS_US) for t in timelines]
        for j, p in enumerate(periods):
            if not math.isfinite(p):
                raise PlanError(
                    f"job {j}: the predicted iteration time is not finite ({p} us); "
                    "the op times of its trace and device add up past float range"
                )
        self.per_job_lane = per_job_lane
        self.periods = periods
        self.lanes = lanes
        if per_job_lane or len(timelines) == 1:
            circle_periods = periods
            self.lane_of = list(range(len(timelines)))
            self.offsets = [[0.0] for _ in periods]
        else:
            big = max(periods)
            circle_periods = [big]
            self.lane_of = [0] * len(timelines)
            self.offsets = [
                [r * p for r in range(max(1, math.ceil(big / p - 1e-9)))] for p in periods
            ]
        # circle of lane l, direction d: circles[l * lanes + (d is D2H when two lanes)]
        self.circles = [_Circle(p) for p in circle_periods for _ in range(lanes)]
        self.bookings: list[tuple[int, float, float, Direction]] = []
        # every start a walk passed since the last booking (NOTE [ Lane walks ])
        self._walks: dict[_WalkKey, _Walk] = {}

    def _circle(self, job: int, direction: Direction) -> _Circle:
        k = self.lane_of[job] * self.lanes
        return self.circles[k + 1 if self.lanes == 2 and direction is Direction.D2H else k]

    def is_free(self, job: int, start: float, dur: float, direction: Direction) -> bool:
        c = self._circle(job, direction)
        return all(c.conflict(start + o, start + o + dur) is None for o in self.offsets[job])

    def earliest(
        self, job: int, lo: float, hi: float, dur: float, direction: Direction
    ) -> float | None:
        """The earliest start s >= lo with [s, s + dur) free and s + dur <= hi."""
        c, offs = self._circle(job, direction), self.offsets[job]
        if dur >= c.period:
            return None

        def step(s: float) -> tuple[float, bool]:
            bumped = False
            for o in offs:
                hit = c.conflict(s + o, s + o + dur)
                if hit is not None:
                    s = max(hit[1] - o, s + c.tol(s + o + dur))
                    bumped = True
            return s, bumped

        cap = _step_cap(c, offs, lo, hi)
        w = self._walk(
            (True, job, direction is D2H, dur, lo), step, lambda s: s + dur > hi + 1e-9, cap
        )
        if w is None:
            raise _stuck("earliest", job, lo, hi, dur, cap)
        return None if w.s + dur > hi + 1e-9 else w.s

    def latest(
        self, job: int, lo: float, hi: float, dur: float, direction: Direction
    ) -> float | None:
        """The latest start s >= lo with [s, s + dur) free and s + dur <= hi."""
        c, offs = self._circle(job, direction), self.offsets[job]
        if dur >= c.period:
            return None

        def step(s: float) -> tuple[float, bool]:
            bumped = False
            for o in offs:
                hit = c.first_conflict(s + o, s + o + dur)
                if hit is not None:
                    s = min(hit[0] - o - dur, s - c.tol(s + o + dur))
                    bumped = True
            return s, bumped

        cap = _step_cap(c, offs, lo, hi)
        w = self._walk(
            (False, job, direction is D2H, dur, hi - dur), step, lambda s: s < lo - SLACK_US, cap
        )
        if w is None:
            raise _stuck("latest", job, lo, hi, dur, cap)
        return None if w.s < lo - SLACK_US else max(w.s, lo)

    def _walk(
        self,
        key: _WalkKey,
        step: Callable[[float], tuple[float, bool]],
        past: Callable[[float], bool],
        cap: int,
    ) -> _Walk | None:
        """The walk from `key`'s start (NOTE [ Lane walks ]), taken on until
        its start is free or `past` the window; None if it takes more than
        `cap` steps."""
        up, job, d2h, dur, _s0 = key
        walks = self._walks
        w = walks.get(key)
        if w is None:
            w = walks[key] = _Walk(key[4])
        w = w.head()
        while not w.found and not past(w.s):
            if w.steps >= cap:
                return None
            s, bumped = step(w.s)
            w.steps += 1
            if not bumped:
                w.found = True
                break
            there = walks.get((up, job, d2h, dur, s))
            if there is not None and there.head() is not w:
                w.joined = there.head()
                w = w.joined
                continue
            walks[up, job, d2h, dur, s] = w
            w.s = s
        return None if w.steps > cap else w

    def book(self, job: int, start: float, dur: float, direction: Direction) -> None:
        """Hold the lane for [start, start + dur) in every replica."""
        c = self._circle(job, direction)
        for o in self.offsets[job]:
            c.add(start + o, start + o + dur)
        self.bookings.append((job, start, dur, direction))
        self._walks.clear()

    def free_intervals(
        self, job: int, lo: float, hi: float, direction: Direction
    ) -> list[tuple[float, float]]:
        """TENSILE's feasible intervals: the maximal free stretches of [lo, hi)
        for `job` (free in every replica), ascending."""
        return list(self._free(job, lo, hi, direction))

    def _free(
        self, job: int, lo: float, hi: float, direction: Direction
    ) -> Iterator[tuple[float, float]]:
        """`free_intervals`, lazily."""
        c, offs = self._circle(job, direction), self.offsets[job]
        if len(offs) == 1 and offs[0] == 0.0:
            busy = c.busy_in(lo, hi)
        else:
            busy = heapq.merge(*(_shifted(c.busy_in(lo + o, hi + o), o) for o in offs))
        t = lo
        for a, b in busy:
            if a > t:
                yield t, a
            t = max(t, b)
        if t < hi:
            yield t, hi

    def free_after(self, job: int, lo: float, hi: float, direction: Direction) -> FreeTime:
        """The free time of [lo, hi) for `job` in `direction`, to ask which
        copies may fit there (NOTE [ Free time after a start ])."""
        return FreeTime(self, job, lo, hi, direction)


class FreeTime:
    """The free stretches of [lo, hi) for one job and direction, read only as
    far as `may_fit` needs them (NOTE [ Free time after a start ]); good
    until the lane's next booking."""

    def __init__(self, lanes: LaneSet, job: int, lo: float, hi: float, direction: Direction):
        self.lanes, self.hi = lanes, hi
        self.margin = 4 * lanes._circle(job, direction).tol(lo, hi) + SLACK_US
        self._bookings = len(lanes.bookings)
        self._stretches = lanes._free(job, lo - self.margin, hi + self.margin, direction)
        self._starts: list[float] = []  # each free stretch's start ...
        self._longest: list[float] = []  # ... and the longest one up to it

    def may_fit(self, durs: np.ndarray, his: np.ndarray) -> np.ndarray:
        """bool per copy i: False where no start s >= lo with s + durs[i] <=
        his[i] is free, so neither `earliest` nor `latest` over that window
        finds one; True where one may be."""
        if len(durs) == 0:
            return np.ones(0, bool)
        if len(self.lanes.bookings) != self._bookings:
            raise PlanError("FreeTime.may_fit asked after a booking: its stretches are stale")
        top = float(his.max())
        if top > self.hi:
            raise ValueError(f"a copy due at {top} us is past this free time's end {self.hi} us")
        m = self.margin
        need = durs - 2 * m  # the free stretch each copy needs
        self._read(float(need.max()), top + m)
        # where the first stretch long enough for each copy starts (inf: none)
        first = np.append(self._starts, math.inf)[np.searchsorted(self._longest, need)]
        return (his + m >= first + need) | (need <= 0)

    def _read(self, most: float, until: float) -> None:
        """Read stretches until one at least `most` long, or one starting
        after `until` (no copy due by then can use it), or the end."""
        starts, longest = self._starts, self._longest
        while not longest or (longest[-1] < most and starts[-1] <= until):
            stretch = next(self._stretches, None)
            if stretch is None:
                return
            a, b = stretch
            starts.append(a)
            longest.append(max(b - a, longest[-1] if longest else 0.0))


def _shifted(busy: Iterator[tuple[float, float]], offset: float) -> Iterator[tuple[float, float]]:
    return ((a - offset, b - offset) for a, b in busy)


def _step_cap(c: _Circle, offsets: Sequence[float], lo: float, hi: float) -> int:
    """Steps a search over [lo, hi] may take (NOTE [ Lane steps relative to
    the magnitude ]): four per booked replica it can meet, plus slack."""
    periods = (hi - lo) / c.period if c.period > 0 else 0.0
    spans = min(math.ceil(max(periods, 0.0)), 1 << 20) + 2
    return 64 + 4 * len(offsets) * (len(c.starts) + 1) * spans


def _stuck(search: str, job: int, lo: float, hi: float, dur: float, cap: int) -> PlanError:
    return PlanError(
        f"lane search ({search}) for job {job} made no progress in {cap} steps looking for "
        f"{dur:.6g} us in [{lo:.6g}, {hi:.6g}] us: times this large cannot be scheduled"
    )
