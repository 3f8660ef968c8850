"""Iteration boundaries under a controller: plan changes, and what the
scheduler observes (`IterationReport`), read from the model's own log
(NOTE [ Plan changes at a boundary ] below).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.check import check as check_plan
from memplan.planners.core.plan import empty_plan, validate
from memplan.sim.control import Controller, IterationReport, LateSwapIn, PlanChange
from memplan.sim.errors import SimError
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.ports import Gpu
from memplan.sim.state import JobState

K = LogKind


# NOTE [ Plan changes at a boundary ]
# A `PlanChange` for job j waits for j's first iteration start (iteration 0's too) at or after
# its `ready_s`; a later change replaces one still waiting; one for a job that has ended is
# dropped. There the new plan is compiled (`CompiledJob.use_plan`) and checked (`check=True`),
# and from that iteration on only its events trigger. The old plan ends with the iteration it
# last ran: its triggered events run to their end (a swap-out still on the lane, a
# `next_iteration` swap-in for k+1) and their buffers land where they would have, but its waits
# for iterations it no longer runs are dropped (a new op waits for a buffer still arriving as
# any op does: NOTE [ Event semantics ] in sim/model.py, `ensure`). Buffers stay where it left
# them: a new event that finds one elsewhere is a `skip`, and one on the host that the new plan
# does not swap in is fetched on demand (a passive swap, in `passive_swaps`). Nothing is lost:
# a persistent buffer off the device has a host copy, and the others die within an iteration.
# `JobResult.plan_versions[k]` is the plan in force in iteration k (0: the job's own, v: the
# v-th change applied); `plan_changes` lists (iteration, ready_s, reason) per change applied.
# Full text: docs/notes.md, "Plan changes at a boundary".


class Boundaries:
    """Plan changes and iteration reports of one run (with or without a
    controller: without, every job keeps its plan)."""

    def __init__(self, gpu: Gpu, device: DeviceModel, controller: Controller | None, check: bool):
        self.gpu = gpu
        self.device = device
        self.ctl = controller
        self.check = check
        n = len(gpu.jobs)
        self.pending: list[PlanChange | None] = [None] * n
        self.version = [0] * n
        # per job: where its last report's log scan ended, its bytes then
        self.log_at = [0] * n
        self.sample_at = [0] * n
        self.held = [0] * n
        self.in_start: list[dict[int, float]] = [{} for _ in range(n)]
        self.in_end: list[dict[int, tuple[float, float]]] = [{} for _ in range(n)]
        self.stall0 = [0.0] * n
        self.passive0 = [0] * n

    # ---- controller calls ------------------------------------------------------------
    def _running(self) -> list[int]:
        return [s.c.index for s in self.gpu.jobs if s.start_us == s.start_us and not s.stopped]

    def arrived(self, s: JobState) -> None:
        if self.ctl is not None:
            now = self.gpu.env.now / 1e6
            self._take(self.ctl.job_arrived(s.c.index, now, self._running()), "job_arrived")

    def left(self, s: JobState) -> None:
        if self.ctl is not None:
            now = self.gpu.env.now / 1e6
            self._take(self.ctl.job_left(s.c.index, now, self._running()), "job_left")

    def _take(self, changes: Sequence[PlanChange], where: str) -> None:
        jobs = self.gpu.jobs
        for ch in changes or ():
            if not isinstance(ch, PlanChange):
                raise SimError(f"controller.{where} returned {type(ch).__name__}, not a PlanChange")
            if not isinstance(ch.job, int) or not 0 <= ch.job < len(jobs):
                raise SimError(f"controller.{where}: PlanChange for job {ch.job!r}: no such job")
            if not isinstance(ch.ready_s, int | float) or not math.isfinite(ch.ready_s):
                raise SimError(f"controller.{where}: ready_s={ch.ready_s!r} must be a finite time")
            if not jobs[ch.job].stopped:
                self.pending[ch.job] = ch

    # ---- boundaries ------------------------------------------------------------------
    def starts(self, s: JobState, it: int) -> None:
        """Before iteration `it`: apply a plan change that is ready."""
        j, m = s.c.index, self.gpu
        ch = self.pending[j]
        if ch is not None and ch.ready_s * 1e6 <= m.env.now:
            self.pending[j] = None
            c = s.c
            plan = ch.plan if ch.plan is not None else empty_plan(c.trace)
            (check_plan if self.check else validate)(plan, c.trace)
            c.use_plan(plan, self.device)
            m.mem.plan_changed(c)
            for key in [k for k in s.deadlines if k[0] >= it]:  # the old plan's waits
                del s.deadlines[key]
            self.version[j] += 1
            s.plan_changes.append((it, float(ch.ready_s), str(ch.reason)))
            m.log.append(LogEntry(m.env.now, j, it, K.PLAN, -1, self.version[j]))
        s.plan_versions.append(self.version[j])
        self.stall0[j], self.passive0[j] = s.stall_us, s.passive

    def ended(self, s: JobState, it: int) -> None:
        """After iteration `it`: report it to the controller."""
        if self.ctl is None:
            return
        report = self._report(s, it)
        self._take(self.ctl.iteration_ended(report), "iteration_ended")

    def _report(self, s: JobState, it: int) -> IterationReport:
        c, m = s.c, self.gpu
        j, n = c.index, c.n_ops
        starts = np.full(n, math.nan)
        ends = np.full(n, math.nan)
        late: list[LateSwapIn] = []
        stalls: dict[tuple[int, int], float] = {}
        in_start, in_end = self.in_start[j], self.in_end[j]
        log = m.log
        for e in log.since(self.log_at[j]):
            if e.job != j:
                continue
            k = e.kind
            if k is K.OP_START:
                starts[e.op] = e.t_us
            elif k is K.OP_END:
                ends[e.op] = e.t_us
            elif k is K.SWAP_IN_START:
                in_start[e.buffer] = e.t_us
            elif k is K.SWAP_IN_END:
                in_end[e.buffer] = (e.t_us, e.t_us - in_start.get(e.buffer, e.t_us))
            elif k is K.STALL_START:
                stalls[(e.op, e.buffer)] = e.t_us
            elif k is K.STALL_END and (e.op, e.buffer) in stalls:
                t0 = stalls.pop((e.op, e.buffer))
                copy = in_end.get(e.buffer)
                if copy is not None and copy[0] == e.t_us and e.iteration == it:
                    late.append(LateSwapIn(e.buffer, e.op, (e.t_us - t0) / 1e6, copy[1] / 1e6))
        self.log_at[j] = len(log)
        samples = m.mem.samples
        held = peak = self.held[j]
        for _t, job, _kind, delta in samples.rows(self.sample_at[j]):
            if job == j:
                held += delta
                peak = max(peak, held)
        self.sample_at[j], self.held[j] = len(samples), held
        return IterationReport(
            job=j,
            iteration=it,
            start_s=s.iter_start_us[-1] / 1e6,
            end_s=s.iter_end_us[-1] / 1e6,
            op_start_s=starts / 1e6,
            op_durations_s=(ends - starts) / 1e6,
            late_swap_ins=tuple(late),
            passive_swaps=s.passive - self.passive0[j],
            stall_s=(s.stall_us - self.stall0[j]) / 1e6,
            peak_bytes=int(peak),
            op_queue_s=self._queued(s, starts) / 1e6,
        )

    def _queued(self, s: JobState, starts: np.ndarray) -> np.ndarray:
        """Microseconds each op of the iteration waited for the compute stream."""
        if not self.gpu.shared:
            return np.zeros(len(starts))
        return np.maximum(starts - np.asarray(s.ready_us), 0.0)
