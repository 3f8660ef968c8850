"""Replay a trace op by op with real tensors, optionally applying a plan.

`replay(trace, ...)` materialises the iteration's starting state on a device
(NOTE [ Initial values ] in `validate/replay/initial.py`), calls every op through
`torch.ops` with its recorded arguments over views of the live buffers,
frees buffers where the framework did (`Buffer.freed_after`), and applies the
plan's swaps, releases and recomputes on the way. It measures op and
iteration times and device bytes, and returns the final persistent state so
that `compare_results` can check a plan changed nothing computed."""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

import numpy as np
import torch
from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut, describe
from memplan.traces.model import Trace
from memplan.validate.errors import ValidationError
from memplan.validate.replay.device import (
    CudaTimer,
    cuda_event,
    deterministic,
    get_rng,
    iteration_seed,
    no_gc,
    run_device,
    seed_rng,
    swap_rng,
)
from memplan.validate.replay.initial import initial_bytes
from memplan.validate.replay.invoke import Invoker
from memplan.validate.replay.lanes import Lane, LaneSync
from memplan.validate.replay.mover import Mover
from memplan.validate.replay.pool import NOTHING, DevicePool, NoHostCopy, NotOnDevice
from memplan.validate.replay.program import Program, compile_trace
from memplan.validate.replay.result import ReplayResult
from memplan.validate.replay.schedule import Schedule, Triggered, build_schedule
from memplan.validate.replay.transfer import Direction, Transfer

# NOTE [ Iterations and randomness ]
# Every iteration replays the same recorded step: parameters, optimizer state
# and module buffers carry over; inputs are re-materialised from the seed with
# the same bytes each time; every other buffer is made by its op. Before each
# iteration the default generator of the run device is seeded from
# (seed, iteration), so dropout masks differ between iterations but not
# between runs. The caller's generator state is restored when the replay ends.

# NOTE [ Applying a plan ]
# The simulator's semantics (NOTE [ Event semantics ] in `sim/model.py`), so a replay
# measures what a simulation predicts. Events with `after_op = i` fire when op i ends (-1:
# the iteration start), in plan order, before the framework's own frees after op i.
# - `SwapOut` queues a copy to the host pool and frees the device copy when it ends
#   (NOTE [ Device bytes ]); the buffer stays usable meanwhile (NOTE [ Keep ] in
#   `validate/replay/pool.py`); a valid host copy (valid until the buffer is written) means no
#   bytes move; `before_op` waits for it.
# - `SwapIn` takes its device bytes when the copy starts; `before_op` and any op needing the
#   buffer wait for it. `Release` frees the device copy at once (undoes a leaving one's keep).
# - Each op waits for its due swap-ins and deadlines, then makes its buffers present:
#   leaving is kept, arriving waited for, absent recomputed (NOTE [ Recompute on demand ]),
#   else a `ValidationError` naming op and buffer.
# - Lanes (NOTE [ Throttled copies ]): one lane shared in ready order, or swap-outs on lane 0
#   and swap-ins on lane 1. The waits count in `wait_seconds`. Full text: docs/notes.md.

# NOTE [ Recompute on demand ]
# A `Recompute` runs on demand: only when `before_op` needs its buffer and it
# is absent. Its ops are re-run in order, each after its sources are made
# present as an op's inputs are (waiting for a swap-in, or another
# `Recompute` of the source before the same op); outputs for buffers that are
# absent are bound (the chain's intermediates are freed again when the chain
# ends, only `buffer` stays), outputs for buffers still present are dropped
# at once. An op of the chain that writes in place a
# buffer the chain did not bring back (BatchNorm's running statistics, see
# NOTE [ Hidden mutations ]) writes a scratch copy instead: a recompute never
# changes live data. RNG ops run with the generator state saved before their
# first run in this iteration, then the current state is put back. The replay
# checks the chain reproduces the data that was dropped: every buffer it reads
# has the version it had at the original run, and every buffer it brings back
# is written by the same ops, in order, as the dropped copy was.


# NOTE [ Bounded waits ]
# The replay waits out a plan's delays in real time, and the compute thread
# waits for copies only a lane thread ends, so every wait has a bound:
# - a swap's delay is at most `max_delay_s` (default MAX_DELAY_S, 10 s), else
#   the replay refuses the plan before it starts; `validate` holds delays to
#   the measured iteration first (planners/core/check.py NOTE [ Delays within
#   the iteration ]);
# - a wait for a transfer ends by its ready time plus the time the link needs
#   for every byte of the trace (at most one transfer per buffer is in
#   flight, and those ahead in the FIFO were ready earlier) plus WAIT_SLACK_S
#   for a busy machine; past that the replay stops with a `ValidationError`
#   naming the transfer, and so it does when the lanes are not done that long
#   after the last op (they finish what is queued);
# - a lane thread that dies ends its transfers (NOTE [ A lane that dies ] in
#   `validate/replay/lanes.py`), so the waits end at once with its error.
MAX_DELAY_S = 10.0
WAIT_SLACK_S = 60.0


class ReplaySync(LaneSync, Protocol):
    """NOTE [ Test synchronisation ] in `validate/replay/lanes.py`: also called on
    the compute thread when op `op` of `iteration` has ended and its events
    have fired."""

    def op_done(self, iteration: int, op: int) -> None: ...


class Executor:
    """One replay: a compiled trace, a plan schedule, a pool and copy lanes."""

    def __init__(
        self,
        trace: Trace,
        device: torch.device,
        schedule: Schedule,
        seed: int,
        iterations: int,
        bandwidth_bytes_per_s: float | None,
        lanes: int,
        sync: ReplaySync | None = None,
    ):
        self.trace = trace
        self.dev = device
        self.cuda = device.type == "cuda"
        self.program: Program = compile_trace(trace, device)
        self.steps = self.program.steps
        self.schedule = schedule
        self.seed = seed
        self.iterations = iterations
        self.pool = DevicePool(trace, device, self.program.buffer_dtype)
        self.nbytes = trace.nbytes
        self.invoker = Invoker(trace, self.pool, device)
        self.start_bytes = initial_bytes(trace, self.program.buffer_dtype, seed)
        self.t0 = time.perf_counter()
        mover = Mover(self.pool, lanes)
        self.sync = sync
        self.lanes = [Lane(k, mover, bandwidth_bytes_per_s, self.t0, sync) for k in range(lanes)]
        # NOTE [ Bounded waits ]: the link's time for every byte of the trace, and slack
        link_s = float(self.nbytes.sum()) / bandwidth_bytes_per_s if bandwidth_bytes_per_s else 0.0
        self.wait_slack_s = link_s + WAIT_SLACK_S
        self.max_delay_s = max(
            (ev.delay_us * 1e-6 for g in schedule.after for ev in g if not isinstance(ev, Release)),
            default=0.0,
        )
        n_it, n_ops = iterations, trace.n_ops
        self.op_seconds = np.zeros((n_it, n_ops))
        self.memory_curve = np.zeros((n_it, n_ops), np.int64)
        self.losses = np.zeros((n_it, len(self.program.loss_views)))
        self.wait_seconds = np.zeros(n_it)
        self.recompute_seconds = np.zeros(n_it)
        self.recomputes = np.zeros(n_it, np.int64)
        self.iteration_seconds = np.zeros(n_it)
        self.deadlines: dict[tuple[int, int], list[Transfer]] = {}
        self.rng_state: dict[int, torch.Tensor] = {}
        self.recompute_spans: list[tuple[Any, Any]] = []  # CUDA events of this iteration
        self.read_versions: dict[int, dict[int, int]] = {}
        self.recomputing: set[int] = set()  # buffers whose recompute is running
        self.rebuilding: set[int] = set()  # buffers those recomputes have brought back
        self.it = 0

    # ---- the run ------------------------------------------------------------------
    def run(self) -> ReplayResult:
        base = torch.cuda.memory_allocated(self.dev) if self.cuda else 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        for lane in self.lanes:
            lane.start()
        try:
            with deterministic(self.dev), no_gc():
                for it in range(self.iterations):
                    self._iteration(it)
        finally:
            for lane in self.lanes:
                lane.close()
            deadline = time.perf_counter() + self.max_delay_s + self.wait_slack_s
            for lane in self.lanes:
                lane.join(timeout=max(deadline - time.perf_counter(), 0.0))
        self._raise_lane_errors()
        stuck = [lane.name for lane in self.lanes if lane.is_alive()]
        if stuck:  # NOTE [ Bounded waits ]
            raise ValidationError(
                f"copy lane {stuck[0]} has not finished its transfers "
                f"{self.max_delay_s + self.wait_slack_s:.3g} s after the last op"
            )
        persistent = [b.id for b in self.trace.buffers if b.persistent]
        for b in persistent:
            if not self.pool.on_device(b) and not self.pool.host_valid(b):
                raise ValidationError(
                    f"{self.invoker.name(b)} has no valid copy after the last iteration"
                )
        records = sorted((r for lane in self.lanes for r in lane.records), key=lambda r: r.start_s)
        return ReplayResult(
            model=self.trace.meta.model,
            device=str(self.dev),
            seed=self.seed,
            state={b: self.pool.typed(b) for b in persistent},
            names={b.id: b.name for b in self.trace.buffers if b.name},
            losses=self.losses,
            op_seconds=self.op_seconds,
            iteration_seconds=self.iteration_seconds,
            wait_seconds=self.wait_seconds,
            recompute_seconds=self.recompute_seconds,
            recomputes=self.recomputes,
            memory_curve=self.memory_curve,
            peak_bytes=max(peaks := self.pool.iteration_peaks),
            iteration_peak_bytes=np.asarray(peaks, np.int64),
            host_peak_bytes=self.pool.host_peak_bytes,
            allocator_peak_bytes=(torch.cuda.max_memory_allocated(self.dev) - base)
            if self.cuda
            else None,
            transfers=tuple(records),
            size_mismatches=dict(sorted(self.invoker.size_mismatches.items())),
        )

    def _iteration(self, it: int) -> None:
        self.it = it
        pool = self.pool
        self.rng_state.clear()
        self.read_versions.clear()
        seed_rng(self.dev, iteration_seed(self.seed, it))
        pool.start_iteration()
        for b, raw in self.start_bytes.items():
            if it == 0 or not self.trace.buffers[b].persistent:
                pool.materialise(b, raw.to(self.dev, copy=True).untyped_storage())
        timer = CudaTimer(self.trace.n_ops) if self.cuda else None
        start = time.perf_counter()
        steps, order, frees = self.steps, self.schedule.order, self.schedule.frees
        n = len(order)
        last = it + 1 == self.iterations
        # NOTE [ Keep ]: an op pins what it accesses from the end of the op
        # before it (when the simulator's job process moves on) to its own end
        pool.pin(steps[order[0]].accesses)
        self._trigger(self.schedule.after[0])
        for p, i in enumerate(order):  # NOTE [ Plans under another order ]
            step = steps[i]
            for t in self.deadlines.pop((it, i), ()):
                self._wait(t)
            for b in step.needs:
                self._ensure(b, i, self.invoker.op(i))
            if i == self.program.loss_op:
                self._record_loss()
            if i in self.schedule.recompute_ops:
                self.read_versions[i] = {b: pool.version(b) for b in step.needs}
            if i in self.schedule.rng_ops:
                self.rng_state[i] = get_rng(self.dev)
            self.op_seconds[it, i] = self.invoker.call(step, timer)
            self.memory_curve[it, i] = pool.current_bytes
            nxt = steps[order[p + 1]].accesses if p + 1 < n else None
            pool.pin(nxt if nxt is not None else NOTHING if last else steps[order[0]].accesses)
            if i + 1 == self.program.loss_op:  # no backward: the loss is the last op's output
                self._record_loss()
            self._trigger(self.schedule.after[i + 1])
            for b in step.frees if frees is None else frees[i]:
                pool.framework_free(b)
            self._raise_lane_errors()
            if self.sync is not None:
                self.sync.op_done(it, i)
        if self.cuda:
            torch.cuda.synchronize(self.dev)
        self.iteration_seconds[it] = time.perf_counter() - start
        if timer is not None:
            self.op_seconds[it] = timer.seconds()
            spans, self.recompute_spans = self.recompute_spans, []
            self.recompute_seconds[it] = sum(a.elapsed_time(b) * 1e-3 for a, b in spans)
        left = [
            b
            for b in range(self.trace.n_buffers)
            if pool.on_device(b) and not self.trace.buffers[b].persistent
        ]
        if left:  # only a plan can do that: a recompute of a buffer the framework had freed
            raise ValidationError(
                f"iteration {it}: {self.invoker.name(left[0])} is on the device after the framework "
                f"freed it (after op {self.trace.buffers[left[0]].freed_after})"
            )

    # ---- one op -------------------------------------------------------------------
    def _ensure(self, b: int, i: int, who: str) -> None:
        """Make `b`, which op `i` (or a recompute for it) needs, usable
        (NOTE [ Applying a plan ])."""
        while True:
            usable = self.pool.need(b)  # a leaving one is kept (NOTE [ Keep ])
            if usable is True:
                return
            if usable is not False:  # arriving
                self._wait(usable)
                continue
            ev = self.schedule.recompute.get((b, i))
            if ev is None or b in self.recomputing:
                raise ValidationError(f"{who} needs {self.invoker.gone(b)}")
            self._recompute(ev)

    def _wait(self, t: Transfer) -> None:
        if not t.done.is_set():
            t0 = time.perf_counter()
            limit = max(t.ready_s - t0, 0.0) + self.wait_slack_s  # NOTE [ Bounded waits ]
            done = t.done.wait(limit)
            self.wait_seconds[self.it] += time.perf_counter() - t0
            self._raise_lane_errors()
            if not done:
                raise ValidationError(f"{t.label}: not over after waiting {limit:.3g} s for it")
        self._raise_lane_errors()

    # ---- plan events ----------------------------------------------------------------
    def _trigger(self, events: tuple[Triggered, ...]) -> None:
        for ev in events:
            if isinstance(ev, Release):
                self._release(ev)
            elif isinstance(ev, SwapOut):
                self._swap_out(ev)
            else:
                self._swap_in(ev)

    def _release(self, ev: Release) -> None:
        try:
            self.pool.release(ev.buffer)
        except NotOnDevice:
            raise self._absent(ev) from None

    def _swap_out(self, ev: SwapOut) -> None:
        try:  # NOTE [ Keep ]: a skip or a discard needs no copy
            t = self.pool.begin_swap_out(
                ev.buffer, not ev.delay_us, lambda life: self._transfer(Direction.D2H, ev, life)
            )
        except NotOnDevice:
            raise self._absent(ev) from None
        if t is None:
            return
        if ev.before_op >= 0:  # planners.core.plan NOTE [ Swap-out deadlines ]
            self.deadlines.setdefault((self.it, ev.before_op), []).append(t)
        self.lanes[0].submit(t)

    def _swap_in(self, ev: SwapIn) -> None:
        if ev.next_iteration and self.it + 1 == self.iterations:
            return  # no next iteration to serve (planners.core.plan NOTE [ Cross-iteration swaps ])
        due = (self.it + 1 if ev.next_iteration else self.it, ev.before_op)
        # NOTE [ Keep ]: a copy in flight serves this one too; a leaving buffer is kept
        try:
            t, new = self.pool.begin_swap_in(
                ev.buffer, lambda life: self._transfer(Direction.H2D, ev, life)
            )
        except NoHostCopy as e:
            raise ValidationError(
                f"{describe(ev)} after op {ev.after_op} of iteration {self.it}: "
                f"no valid host copy ({e.why})"
            ) from None
        if t is None:
            return
        self.deadlines.setdefault(due, []).append(t)
        if new:
            self.lanes[-1].submit(t)

    def _transfer(self, direction: Direction, ev: SwapOut | SwapIn, lifetime: int) -> Transfer:
        """The transfer `ev` queues now; `lifetime`: its buffer's, from the pool."""
        now = time.perf_counter()
        return Transfer(
            direction,
            ev.buffer,
            self.it,
            label=f"{describe(ev)} after op {ev.after_op} of iteration {self.it}",
            nbytes=int(self.nbytes[ev.buffer]),
            queued_s=now,
            ready_s=now + ev.delay_us * 1e-6,
            lifetime=lifetime,
            compute_ready=cuda_event() if self.cuda else None,
        )

    def _absent(self, ev: SwapOut | Release) -> ValidationError:
        return ValidationError(f"{describe(ev)} after op {ev.after_op}: it is not on the device")

    def _recompute(self, ev: Recompute) -> None:
        """NOTE [ Recompute on demand ]: `ev.buffer` is absent and `ev.before_op` needs it."""
        pool = self.pool
        who = f"recompute of {self.invoker.name(ev.buffer)} before op {ev.before_op}"
        t0 = time.perf_counter()
        span = (cuda_event(timing=True), None) if self.cuda else None
        restored: set[int] = set()
        writers: dict[int, list[int]] = {}
        pinned = pool.pinned
        outer = not self.recomputing  # a nested chain's time is in the outer one's
        self.recomputing.add(ev.buffer)
        for k in ev.ops:
            step = self.steps[k]
            pool.pin(pinned | step.accesses)
            read = [b for b in step.needs if b not in restored]
            for b in read:
                self._ensure(b, ev.before_op, f"{who}: op {k}")
            scratch = {b for b in step.writes if b not in restored}
            versions = self.read_versions.get(k)
            if versions is None:
                raise ValidationError(f"{who}: op {k} has not run in this iteration")
            for b in read:
                if b in self.rebuilding:  # an enclosing chain's, checked by that chain
                    continue
                if b not in scratch and pool.version(b) != versions[b]:
                    raise ValidationError(
                        f"{who}: op {k} reads {self.invoker.name(b)}, which op "
                        f"{pool.last_writer(b)} modified after op {k} first ran"
                    )
            absent = {b for b in step.creates if pool.gone(b)}
            saved = swap_rng(self.dev, self.rng_state[k]) if step.rng else None
            self.invoker.call(step, None, frozenset(scratch), frozenset(absent))
            if saved is not None:
                swap_rng(self.dev, saved)
            restored |= absent
            self.rebuilding |= absent
            for b in absent:
                writers[b] = [k]
            for b in step.writes:
                if b in restored and b not in absent:
                    writers[b].append(k)
        self.rebuilding -= restored
        for b in sorted(restored):
            dropped = pool.dropped_writers(b)
            if tuple(writers[b]) != dropped:
                raise ValidationError(
                    f"{who}: brings back {self.invoker.name(b)} from ops {writers[b]}, but the "
                    f"dropped copy was written by ops {list(dropped or ())}"
                )
            pool.restore(b)
            if b != ev.buffer:
                pool.drop(b)
        pool.pin(pinned)
        self.recomputing.discard(ev.buffer)
        if outer and span is not None:  # device time, read when the iteration synchronises
            self.recompute_spans.append((span[0], cuda_event(timing=True)))
        elif outer:
            self.recompute_seconds[self.it] += time.perf_counter() - t0
        self.recomputes[self.it] += 1

    # ---- helpers -------------------------------------------------------------------
    def _record_loss(self) -> None:
        values = self.pool.scalars(self.program.loss_views)
        self.losses[self.it, : len(values)] = values

    def _raise_lane_errors(self) -> None:
        error = self.pool.lane_error
        if error is not None:
            raise ValidationError(error)


def replay(
    trace: Trace,
    *,
    device: str = "cpu",
    iterations: int = 2,
    seed: int = 0,
    plan: Plan | None = None,
    bandwidth_bytes_per_s: float | None = None,
    lanes: int = 1,
    sync: ReplaySync | None = None,
    max_delay_s: float = MAX_DELAY_S,
) -> ReplayResult:
    """Run `iterations` training steps of `trace` with real tensors on
    `device`, applying `plan` (None: the framework's own frees only); a
    swap's delay over `max_delay_s` is refused (NOTE [ Bounded waits ]).

    Transfers run on `lanes` copy lanes (1: one lane shared by both
    directions; 2: swap-outs on one, swap-ins on the other), throttled to
    `bandwidth_bytes_per_s` if given (NOTE [ Throttled copies ]). The same
    trace and seed give bit-identical results with any valid plan; check with
    `compare_results`. Raises `ValidationError` if the plan cannot run (a
    read of a buffer that is gone, a stale host copy, a recompute that does
    not reproduce its buffer) and `PlanError` if it does not fit the trace.
    `sync`: for tests, NOTE [ Test synchronisation ] in `validate/replay/lanes.py`.
    """
    if iterations < 1:
        raise ValidationError(f"iterations={iterations} must be >= 1")
    if lanes not in (1, 2):
        raise ValidationError(f"lanes={lanes} must be 1 or 2")
    if bandwidth_bytes_per_s is not None and not bandwidth_bytes_per_s > 0:
        raise ValidationError(f"bandwidth_bytes_per_s={bandwidth_bytes_per_s} must be > 0")
    if not 0 <= max_delay_s < math.inf:
        raise ValidationError(f"max_delay_s={max_delay_s} must be a finite number >= 0")
    if trace.n_ops == 0:
        raise ValidationError(f"trace {trace.meta.model!r} has no ops to replay")
    dev = run_device(device)
    schedule = build_schedule(plan, trace, max_delay_s)
    ex = Executor(trace, dev, schedule, seed, iterations, bandwidth_bytes_per_s, lanes, sync)
    return ex.run()
