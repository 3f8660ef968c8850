"""The four implementations of plan semantics, each behind one function that
returns a `Run`: the outcome and the resident bytes per op (NOTE [ Resident
bytes per op ] in `tests/semantics/cases.py`). Every call into the
implementations is in the section below; a change of their signatures
touches only it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import LatencyModel
from memplan.planners.analysis.opgrid import memory_of_plan
from memplan.planners.analysis.optimes import predict_timeline
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Event, SwapIn, SwapOut
from memplan.sim import Job, simulate
from memplan.sim.errors import SimError
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.metrics import SimResult
from memplan.traces.model import Trace
from memplan.validate import Direction
from memplan.validate.errors import ValidationError
from memplan.validate.replay.executor import replay

from tests.semantics.cases import HW, Case, Impl

ITERATIONS = 3  # iteration 1 is steady: a cross-iteration swap-in of it has a next one
REPLAY_DELAY_SCALE = 50  # NOTE [ The simulator's order on the replay ]


@dataclass(frozen=True, slots=True)
class Run:
    """What one implementation made of a case: whether it accepted the plan
    (else its message), and, where it has them, bytes per op of iterations 0
    and 1 and the peak over the run."""

    ok: bool
    message: str = ""
    first: tuple[int, ...] | None = None
    steady: tuple[int, ...] | None = None
    peak: int | None = None


# ---- the adapter section: every call into the four implementations ----------------
def device(latency: LatencyModel) -> DeviceModel:
    return DeviceModel(HW, latency, lanes=1)


def run_checker(case: Case) -> Run:
    trace, _ = case.built()
    try:
        check(case.plan(), trace)
    except PlanError as e:
        return Run(False, str(e))
    return Run(True)


def run_opgrid(case: Case) -> Run:
    trace, latency = case.built()
    dev = device(latency)
    try:
        st = memory_of_plan(trace, predict_timeline(trace, dev), case.plan(), dev)
    except PlanError as e:
        return Run(False, str(e))
    first, steady = tuple(st.first.tolist()), tuple(st.steady.tolist())
    return Run(True, "", first, steady, max(*first, *steady))


def run_sim(case: Case) -> Run:
    return _simulated(case)[0]


def run_sim_checked(case: Case) -> Run:
    """The simulator as it runs by default: the checker first (`check=True`)."""
    trace, latency = case.built()
    try:
        simulate([Job(trace, case.plan())], device(latency), iterations=ITERATIONS)
    except (SimError, PlanError) as e:
        return Run(False, str(e))
    return Run(True)


def run_replay(case: Case) -> Run:
    """On CPU, copy lanes put in the simulator's order and delays in the
    replay's time (NOTE [ The simulator's order on the replay ]);
    free-running if the simulator rejected the plan."""
    trace, _ = case.built()
    result = _simulated(case)[1]
    order = None if result is None else SimOrder(result, trace, case.events)
    plan = replace(case.plan(), events=tuple(_replay_delay(ev) for ev in case.events))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as tests/validate: tiny ops, no waits for pool threads
    try:
        r = replay(trace, plan=plan, device="cpu", iterations=ITERATIONS, sync=order)
    except (ValidationError, PlanError) as e:
        if SimOrder.STUCK in str(e):
            raise AssertionError(str(e)) from None
        return Run(False, str(e))
    finally:
        torch.set_num_threads(threads)
    curve = r.memory_curve
    return Run(True, "", tuple(curve[0].tolist()), tuple(curve[1].tolist()), int(r.peak_bytes))


def _replay_delay(ev: Event) -> Event:
    if isinstance(ev, SwapOut | SwapIn) and ev.delay_us:
        return replace(ev, delay_us=ev.delay_us * REPLAY_DELAY_SCALE)
    return ev


_SIM_RUNS: dict[str, tuple[Run, SimResult | None]] = {}


def _simulated(case: Case) -> tuple[Run, SimResult | None]:
    """The simulator's own semantics (`check=False`: the checker is another
    implementation), once per case."""
    hit = _SIM_RUNS.get(case.name)
    if hit is None:
        trace, latency = case.built()
        try:
            r = simulate(
                [Job(trace, case.plan())], device(latency), iterations=ITERATIONS, check=False
            )
        except (SimError, PlanError) as e:
            hit = (Run(False, str(e)), None)
        else:
            first, steady = (sim_bytes_per_op(r, trace.n_ops, k) for k in (0, 1))
            hit = (Run(True, "", first, steady, int(r.jobs[0].peak_bytes)), r)
        _SIM_RUNS[case.name] = hit
    return hit


RUNNERS: dict[Impl, Callable[[Case], Run]] = {
    Impl.CHECKER: run_checker,
    Impl.OPGRID: run_opgrid,
    Impl.SIM: run_sim,
    Impl.REPLAY: run_replay,
}


# ---- reading the simulator --------------------------------------------------------
TOL_US = 1e-6  # the model's times are sums of exact-ish floats; no case has a tie


def op_spans(result: SimResult) -> dict[tuple[int, int], tuple[float, float]]:
    """(iteration, op) -> (start, end) in microseconds, from the event log."""
    starts: dict[tuple[int, int], float] = {}
    spans = {}
    for e in result.log:
        if e.kind is LogKind.OP_START:
            starts[(e.iteration, e.op)] = e.t_us
        elif e.kind is LogKind.OP_END:
            spans[(e.iteration, e.op)] = (starts[(e.iteration, e.op)], e.t_us)
    return spans


def sim_bytes_per_op(result: SimResult, n_ops: int, iteration: int) -> tuple[int, ...]:
    """Bytes while each op of `iteration` runs: the level just after its
    start (every change at that instant included) and every level strictly
    inside its span."""
    t = result.memory.t_s * 1e6
    level = result.memory.bytes
    spans = op_spans(result)
    out = []
    for i in range(n_ops):
        t0, t1 = spans[(iteration, i)]
        lo = int(np.searchsorted(t, t0 + TOL_US, "right"))
        hi = int(np.searchsorted(t, t1 - TOL_US, "left"))
        inside = [int(level[lo - 1])] if lo else [0]
        out.append(max(inside + level[lo:hi].tolist()))
    return tuple(out)


# NOTE [ The simulator's order on the replay ]
# The replay's copy lanes are threads: whether a copy ends before or after an op is a race. The
# simulator's log says in which op's span (or the gap before which op) each copy starts and
# ends, and the hooks of `validate/replay/lanes.py` (NOTE [ Test synchronisation ]) put the
# replay in that order; it samples its pool right after an op's call, then fires its events:
# - a copy starting in op X's span, or before X starts, has started before X is called;
# - a swap-out ending in X's span ends after X's events -- unless X uses the buffer: then just
#   before X is called, with X pinning it; a swap-in ending in X's span, and any copy ending
#   before X starts, ends before X is called; one lane runs copies FIFO.
# Hooks never say "not before": delays do, multiplied by REPLAY_DELAY_SCALE on one intra-op
# thread so a delayed copy cannot start early (0 stays 0). Copies are named (direction, buffer,
# trigger's iteration, n-th such). No hook orders a copy ending in X when X's end triggers
# another event of its buffer, or one triggered at an iteration's start: cases avoid both. A
# replay that leaves the order stops with `SimOrder.STUCK`: a failure, not a reject.
# Why the scale suffices: docs/notes.md, "The simulator's order on the replay".


_COPIES = {
    LogKind.SWAP_OUT_START: (Direction.D2H, True),
    LogKind.SWAP_OUT_END: (Direction.D2H, False),
    LogKind.SWAP_IN_START: (Direction.H2D, True),
    LogKind.SWAP_IN_END: (Direction.H2D, False),
}
Key = tuple[Direction, int, int, int]
Transfer = Any  # a replay transfer: direction, buffer, iteration, done (a latch)


class SimOrder:
    """A `ReplaySync` that follows the simulator's copies."""

    STUCK = "the replay left the simulator's order"
    TIMEOUT_S = 10.0  # a safety net against a wrong order hanging, never a pacing

    def __init__(self, result: SimResult, trace: Trace, events: tuple[Event, ...]) -> None:
        self.n = trace.n_ops
        self.waits: dict[int, list[tuple[bool, Key]]] = {}  # op -> (ended?, copy)
        self.holds: dict[Key, int] = {}  # copy -> op it does not end before
        # ops whose end triggers an event of a buffer (-1: the iteration's start)
        self.triggers = {(ev.buffer, getattr(ev, "after_op", None)) for ev in events}
        self._derive(result, trace)
        self._cond = threading.Condition()
        self._done: set[int] = set()
        self._started: dict[Key, Transfer] = {}
        self._count: dict[tuple[Direction, int, int], int] = {}
        self._key: dict[int, Key] = {}

    # ---- the order, from the log (global op index g = iteration * n_ops + op) ----
    def _derive(self, result: SimResult, trace: Trace) -> None:
        spans = op_spans(result)
        order = sorted(spans, key=lambda ki: ki[0] * self.n + ki[1])
        ends = np.array([spans[ki][1] for ki in order])
        starts = np.array([spans[ki][0] for ki in order])
        it_start = {e.iteration: e.t_us for e in result.log if e.kind is LogKind.ITER_START}
        counts: dict[tuple[Direction, int, int], int] = {}
        running: dict[tuple[Direction, int], Key] = {}
        lane_free = -1  # the hook after which the last copy on the lane has ended
        start_hook: dict[Key, int] = {}
        for e in result.log:
            if e.kind not in _COPIES:
                continue
            direction, is_start = _COPIES[e.kind]
            x = int(np.searchsorted(ends, e.t_us + TOL_US, "right"))  # op ending after it
            inside = x < len(ends) and starts[x] + TOL_US < e.t_us
            if is_start:
                k = self._trigger_iteration(e, spans, it_start)
                n = counts.get((direction, e.buffer, k), 0)
                counts[(direction, e.buffer, k)] = n + 1
                key = (direction, e.buffer, k, n)
                running[(direction, e.buffer)] = key
                # events after op a fire before op a's hook; at an iteration's start,
                # after the previous iteration's last hook: op 0's is the first after
                floor = k * self.n + max(e.op, 0)
                start_hook[key] = max(x - 1, lane_free, floor)
                if start_hook[key] >= 0:
                    self.waits.setdefault(start_hook[key], []).append((False, key))
                continue
            key = running.pop((direction, e.buffer))
            pinned = inside and e.buffer in trace.op_accesses(x % self.n)
            hook = x if direction is Direction.D2H and inside and not pinned else x - 1
            hook = max(hook, start_hook[key])
            if direction is Direction.D2H and hook == x and (e.buffer, x % self.n) in self.triggers:
                raise AssertionError(
                    f"{self.STUCK}: the swap-out of buffer {e.buffer} ends in op {x % self.n}, "
                    f"which triggers another event of it; the replay can only end the copy "
                    f"after that event (its hooks follow an op's events): make the case avoid it"
                )
            lane_free = hook
            if hook >= 0:
                self.holds[key] = hook
                self.waits.setdefault(hook, []).append((True, key))

    @staticmethod
    def _trigger_iteration(
        e: LogEntry, spans: dict[tuple[int, int], tuple[float, float]], it_start: dict[int, float]
    ) -> int:
        """The last iteration whose trigger op (`e.op`, -1: its start) fired by `e`."""
        k = e.iteration
        while k > 0:
            t = it_start[k] if e.op < 0 else spans[(k, e.op)][1]
            if t <= e.t_us + TOL_US:
                break
            k -= 1
        return k

    # ---- the hooks ------------------------------------------------------------------
    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        if not self._cond.wait_for(ready, self.TIMEOUT_S):
            raise AssertionError(f"{self.STUCK}: {what}")

    def copy_started(self, t: Transfer) -> None:
        with self._cond:
            base = (t.direction, t.buffer, t.iteration)
            n = self._count.get(base, 0)
            self._count[base] = n + 1
            self._key[id(t)] = key = (*base, n)
            self._started[key] = t
            self._cond.notify_all()

    def copy_ending(self, t: Transfer) -> None:
        with self._cond:
            key = self._key[id(t)]
            hook = self.holds.get(key)
            if hook is not None:
                self._wait_for(lambda: hook in self._done, f"{key} held until op {hook}")

    def op_done(self, iteration: int, op: int) -> None:
        g = iteration * self.n + op
        with self._cond:
            self._done.add(g)
            self._cond.notify_all()
        for ended, key in self.waits.get(g, ()):
            with self._cond:
                self._wait_for(lambda key=key: key in self._started, f"{key} never started")
                t = self._started[key]
            if ended and not t.done.wait(self.TIMEOUT_S):
                raise AssertionError(f"{self.STUCK}: {key} never ended")
