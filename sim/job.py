"""A job (trace + plan + arrival + iterations) and its compiled form.

`CompiledJob` gives the simulator flat per-op Python tuples -- which buffers
each op needs present, creates, writes and frees (`OpTable`, built once per
trace), which plan events its end triggers (`IndexedPlan`) -- so its hot loop
indexes tuples instead of rebuilding objects per op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from memplan.hwmodels.device import DeviceModel, TimeUnit, op_workspace_bytes
from memplan.hwmodels.errors import LatencyError
from memplan.planners.core.plan import Plan, Release, SwapIn, SwapOut, empty_plan
from memplan.planners.core.semantics import IndexedPlan, OpTable, Triggered
from memplan.sim.errors import SimError
from memplan.traces.fields import printable
from memplan.traces.model import Trace

# Codes of compiled trigger events.
OUT, IN, REL = 0, 1, 2


class Trigger(NamedTuple):
    """A plan event as the model's loop reads it, in its trigger's group."""

    code: int  # OUT, IN or REL
    buffer: int
    delay_us: float
    before_op: int  # -1: none
    next_iteration: bool
    event: int  # index in the plan's events
    after_op: int


class OpRow(NamedTuple):
    """What op i does, as the model's loop unpacks it (NOTE [ One tuple per op ])."""

    accesses: tuple[int, ...]  # what it pins
    need: tuple[int, ...]  # present when it starts
    create: tuple[int, ...]  # allocated when it starts
    create_bytes: int
    writes: tuple[int, ...]
    frees: tuple[int, ...]  # the framework frees after it
    after: tuple[Trigger, ...]  # the plan events its end triggers


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
    departure_s: float | None = None  # NOTE [ Departures ] in sim/dynamics.py


class CompiledJob:
    """Read-only per-job data for the model. Per-op fields are tuples indexed
    by op id (the trace's `OpTable`); `triggers[i + 1]` are the events that
    the end of op i starts (`triggers[0]`: the start of the iteration), as
    `Trigger`s; `recompute[(buffer, op)]` is (buffer, its chain's
    `recompute_sources`, event index). `workspace[i]` is op i's workspace
    bytes when the run counts workspaces (NOTE [ Workspaces ] in
    hwmodels/device.py), None when it does not or no op has one. `order` is
    the op ids in the order the job runs them, the plan's (NOTE [ Plans
    under another order ] in planners/core/plan.py), and `frees` follow it.
    `ops[i]` is op i's `OpRow`, what the model's loop reads (NOTE [ One
    tuple per op ]); under a plan in the trace's order `order` is
    `range(n_ops)`, and `kind_bytes[b]` is buffer b's (kind index, bytes)
    (NOTE [ Fewer streams per op ])."""

    __slots__ = (
        "index",
        "name",
        "trace",
        "plan",
        "arrival_us",
        "departure_us",
        "iterations",
        "n_ops",
        "nbytes",
        "kind",
        "kind_bytes",
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
        "durations",
        "workspace",
        "table",
        "kernels",
        "order",
        "ops",
    )

    def __init__(
        self,
        index: int,
        job: Job,
        iterations: int,
        device: DeviceModel,
        workspaces: bool = False,
        usage: float = 0.0,
    ):
        t = job.trace
        plan = job.plan if job.plan is not None else empty_plan(t)
        n = t.n_ops
        self.index = index
        # names reach tables, figures and reports: printable whatever their characters
        self.name = printable(job.name or t.meta.model or f"job{index}")
        self.trace = t
        self.plan = plan
        self.arrival_us = float(job.arrival_s) * 1e6
        dep = job.departure_s
        self.departure_us = None if dep is None else float(dep) * 1e6
        self.iterations = iterations
        self.n_ops = n
        self.kind: list[int] = t.kind_index.tolist()

        table = self.table = OpTable.of(t)
        self.nbytes = table.nbytes  # one object per size (NOTE [ One object per buffer id ])
        self.kind_bytes = table.kind_bytes  # NOTE [ Fewer streams per op ]
        self.accs = table.accesses
        self.need = table.need
        self.create = table.creates
        self.create_bytes = table.create_bytes
        self.writes = table.writes
        self.frees = table.frees
        self.persistent = table.persistent
        self.persistent_bytes = sum(self.nbytes[b] for b in self.persistent)
        self.kernels = self._kernels(device, usage)
        self.use_plan(plan, device)
        ws = op_workspace_bytes(t, device.hw) if workspaces else None
        self.workspace: list[int] | None = ws.tolist() if ws is not None and ws.any() else None

    def use_plan(self, plan: Plan, device: DeviceModel) -> None:
        """Compile `plan`'s events and durations for this job (at the start,
        and at a plan change: NOTE [ Plan changes at a boundary ] in sim/boundary.py)."""
        table = OpTable.of(self.trace, plan.order)
        ip = IndexedPlan.of(plan, self.trace, table)
        self.plan = plan
        # the trace's order as a range (NOTE [ Fewer streams per op ])
        self.order = ip.order if plan.order is not None else range(self.n_ops)
        self.frees = table.frees  # NOTE [ Frees under another order ]
        # Plan events by trigger, in plan order; inputs released at the start
        # are never loaded (NOTE [ Duplicate events ] in planners/core/semantics.py).
        triggers: list[tuple[Trigger, ...]] = [()] * len(ip.triggered)
        for i, g in enumerate(ip.triggered):
            if g:
                triggers[i] = tuple(_compiled(e, ev) for e, ev in g)
        self.triggers = tuple(triggers)
        # the model's loop reads one tuple per op (NOTE [ One tuple per op ])
        self.ops = tuple(
            OpRow(*row)
            for row in zip(self.accs, self.need, self.create, self.create_bytes, self.writes,
                           self.frees, self.triggers[1:], strict=True)
        )  # fmt: skip
        self.recompute = {
            key: (r.event.buffer, r.sources, r.index) for key, r in ip.recompute.items()
        }
        self.inputs = ip.inputs
        self.input_bytes = sum(self.nbytes[b] for b in self.inputs)
        self.durations = self._durations(device, plan)

    def _kernels(self, device: DeviceModel, usage: float) -> list[float]:
        """Op durations in microseconds at outside load `usage` (NOTE [ Op
        durations ] in sim/model.py, NOTE [ Usage and jitter ] in sim/dynamics.py)."""
        try:
            d = device.op_durations(self.trace, TimeUnit.US, usage=usage).tolist()
        except LatencyError as e:
            raise SimError(f"job {self.index} ({self.name}): {e}") from None
        seen: dict[float, float] = {}  # one object per value (NOTE [ Fewer streams per op ])
        return [seen.setdefault(x, x) for x in d]

    def _durations(self, device: DeviceModel, plan: Plan) -> list[float]:
        """The kernels' durations, each op that triggers planned copies longer
        by the device's compute-stream cost per copy (the iteration's start
        charges the first op of the order)."""
        d = list(self.kernels)
        extra = device.transfer_cost(TimeUnit.US)
        if extra and self.n_ops:
            for ev in plan.events:
                if isinstance(ev, SwapOut | SwapIn):
                    d[ev.after_op if ev.after_op >= 0 else self.order[0]] += extra
        return d


# NOTE [ One tuple per op ]
# The model's loop over ops read eight tables indexed by op id (accesses,
# needed, created, their bytes, written, freed, the plan events after the
# op, durations): eight pointer arrays of n_ops each besides the objects
# they point at, all out of cache once a step has thousands of ops.
# `CompiledJob.ops[i]` zips the seven that are fixed for a plan into one
# tuple, made in op order, that the loop unpacks (durations stay apart:
# jitter replaces them per iteration); `OpRow` names its fields, unpacked by
# position in the loop. Measurements: docs/notes.md, "One tuple per op".
# NOTE [ Fewer streams per op ]
# Past a few thousand ops a step's tables no longer fit the core's L2, and the loop's cost per
# op rises by what it waits on memory. It reads its tables in order, which a prefetcher can
# stream, but it walks about thirty streams at once, and the number of streams is what costs:
# - an op's tuples are made one after another (`OpTable`), and `writes[i]` is `creates[i]`
#   when op i writes what it makes;
# - `kind_bytes[b]`, one shared (kind, bytes) pair, is what the pool reads per allocation and
#   free, where it read `kind[b]` and `nbytes[b]`;
# - `durations` share one float per distinct value, like sizes (NOTE [ One object per buffer id ]);
# - a plan in the trace's order runs `range(n_ops)`, not a tuple of op ids;
# - `parked[b]` is read only while some buffer is parked (`JobState.n_parked`), and `wcount[b]`
#   counted only while a swap-out reads (NOTE [ Writes during a copy ] in sim/copies.py).
# Measurements: docs/notes.md, "Fewer streams per op".
def _compiled(e: int, ev: Triggered) -> Trigger:
    if isinstance(ev, Release):
        return Trigger(REL, ev.buffer, 0.0, -1, False, e, ev.after_op)
    if isinstance(ev, SwapOut):
        return Trigger(OUT, ev.buffer, ev.delay_us, ev.before_op, False, e, ev.after_op)
    return Trigger(IN, ev.buffer, ev.delay_us, ev.before_op, ev.next_iteration, e, ev.after_op)
