"""A job (trace + plan + arrival + iterations) and its compiled form.

`compile_job` turns a job into flat per-op Python tuples built once from the
trace's numpy arrays -- which buffers each op needs present, creates, writes
and frees, which plan events its end triggers -- so the simulator's hot loop
indexes lists instead of rebuilding objects per op.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.latency import LatencyModel, queued_usage
from memplan.hwmodels.profile import Hardware
from memplan.planners.core.plan import (
    Plan,
    Recompute,
    Release,
    SwapIn,
    SwapOut,
    empty_plan,
    recompute_sources,
)
from memplan.sim.errors import SimError
from memplan.traces.model import Trace

# Codes of compiled trigger events.
OUT, IN, REL = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Job:
    """One training job: `trace` run under `plan` (None = the vanilla empty
    plan), arriving `arrival_s` seconds into the simulation, for `iterations`
    iterations (None = `simulate`'s `iterations`)."""

    trace: Trace
    plan: Plan | None = None
    arrival_s: float = 0.0
    iterations: int | None = None
    name: str = ""


class CompiledJob:
    """Read-only per-job data for the model. Per-op fields are lists indexed by
    op id; `triggers[i + 1]` are the events that the end of op i starts
    (`triggers[0]`: the start of the iteration)."""

    __slots__ = (
        "index",
        "name",
        "trace",
        "plan",
        "arrival_us",
        "iterations",
        "n_ops",
        "nbytes",
        "kind",
        "accs",
        "need",
        "create",
        "create_bytes",
        "writes",
        "frees",
        "persistent",
        "persistent_bytes",
        "inputs",
        "input_bytes",
        "triggers",
        "recompute",
        "_latency",
        "_hw",
        "_durations",
    )

    def __init__(self, index: int, job: Job, iterations: int, latency: LatencyModel, hw: Hardware):
        t = job.trace
        plan = job.plan if job.plan is not None else empty_plan(t)
        n = t.n_ops
        self.index = index
        self.name = job.name or t.meta.model or f"job{index}"
        self.trace = t
        self.plan = plan
        self.arrival_us = float(job.arrival_s) * 1e6
        self.iterations = iterations
        self.n_ops = n
        self.nbytes: list[int] = t.nbytes.tolist()
        self.kind: list[int] = t.kind_index.tolist()
        self._latency, self._hw = latency, hw
        self._durations: dict[int, list[float]] = {}

        ap, ab = (a.tolist() for a in t.access_csr)
        wp, wb = (a.tolist() for a in t.writes_csr)
        start = t.exists_at_start.tolist()
        create: list[list[int]] = [[] for _ in range(n)]
        for b, c in enumerate(t.created_at.tolist()):
            if c >= 0 and not start[b]:
                create[c].append(b)
        self.accs = [tuple(ab[ap[i] : ap[i + 1]]) for i in range(n)]
        self.create = [tuple(c) for c in create]
        self.need = [
            tuple(b for b in self.accs[i] if b not in create[i]) if create[i] else self.accs[i]
            for i in range(n)
        ]
        self.create_bytes = [sum(self.nbytes[b] for b in c) for c in create]
        self.writes = [tuple(wb[wp[i] : wp[i + 1]]) for i in range(n)]
        frees: list[list[int]] = [[] for _ in range(n)]
        persistent = t.persistent.tolist()
        for b, f in enumerate(t.freed_after.tolist()):
            if not persistent[b] and n:
                frees[min(f, n - 1)].append(b)
        self.frees = [tuple(f) for f in frees]
        self.persistent = tuple(b for b in range(t.n_buffers) if persistent[b])
        self.persistent_bytes = sum(self.nbytes[b] for b in self.persistent)

        # Plan events, grouped by trigger, in plan order. An input released at
        # the start of the iteration is never loaded (NOTE [ Iteration boundary ]).
        triggers: list[list[tuple]] = [[] for _ in range(n + 1)]
        self.recompute: dict[tuple[int, int], tuple] = {}
        unloaded: set[int] = set()
        for e, ev in enumerate(plan.events):
            if isinstance(ev, Release):
                if ev.after_op == -1 and start[ev.buffer] and not persistent[ev.buffer]:
                    unloaded.add(ev.buffer)
                    continue
                triggers[ev.after_op + 1].append((REL, ev.buffer, 0.0, -1, False, e, ev.after_op))
            elif isinstance(ev, SwapOut):
                triggers[ev.after_op + 1].append(
                    (OUT, ev.buffer, float(ev.delay_us), ev.before_op, False, e, ev.after_op)
                )
            elif isinstance(ev, SwapIn):
                triggers[ev.after_op + 1].append(
                    (
                        IN,
                        ev.buffer,
                        float(ev.delay_us),
                        ev.before_op,
                        ev.next_iteration,
                        e,
                        ev.after_op,
                    )
                )
            elif isinstance(ev, Recompute):
                self.recompute[(ev.buffer, ev.before_op)] = (
                    ev.buffer,
                    recompute_sources(ev, t),
                    e,
                )
        self.triggers = [tuple(tr) for tr in triggers]
        self.inputs = tuple(
            b for b in range(t.n_buffers) if start[b] and not persistent[b] and b not in unloaded
        )
        self.input_bytes = sum(self.nbytes[b] for b in self.inputs)

    def durations(self, n_active: int) -> list[float]:
        """Op durations in microseconds (rounded to 1 ns) while `n_active` jobs
        share the device; see NOTE [ Usage ]."""
        d = self._durations.get(n_active)
        if d is None:
            usage = queued_usage(n_active)
            s = np.asarray(self._latency.predict_all(self.trace, self._hw, usage), np.float64)
            if s.shape != (self.n_ops,) or not np.isfinite(s).all() or (s < 0).any():
                raise SimError(
                    f"job {self.index} ({self.name}): latency model {self._latency.name!r} "
                    f"returned bad durations (need {self.n_ops} finite values >= 0)"
                )
            d = self._durations[n_active] = np.round(s * 1e6, 3).tolist()
        return d
