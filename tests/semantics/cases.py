"""The semantic case table: its record types, the hand device and the tiny
traces every case runs on (docs/design.md, "What happens to a buffer").

A `Case` is a tiny trace, a plan, the expected outcome and the expected
resident bytes per op, worked out by hand. The same table runs against the
four implementations of plan semantics (`Impl`): the static checker, the
planners' op-grid memory, the SimPy simulator and the CPU replay
(`tests/semantics/adapters.py` calls them). They agree, or the case says in
`differs` which may differ and why, and what that implementation is then
held to (`Check`).

Bytes per op are compared as NOTE [ Resident bytes per op ] says (next to
`Case`); the hand device every case runs on is NOTE [ The hand device ]
(next to `HW`).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from memplan.hwmodels.latency import Fixed
from memplan.planners.core.plan import Event, Plan, fingerprint_of
from memplan.traces import io
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View

from tests.hwmodels.handmade import device
from tests.sim.handtraces import MIB_PER_MS, B, Call, MiB

__all__ = ["B", "Call", "MiB", "Case", "Check", "Differs", "Impl", "Reject", "HW", "Built"]

# NOTE [ The hand device ]
# Ops last whole milliseconds (1 ms unless a case says otherwise). Both PCIe
# directions move 4 MiB per ms after a fixed 0.2 ms, on one lane shared by
# both directions: a copy of 1 MiB holds the lane 0.45 ms, 2 MiB 0.7 ms,
# 4 MiB 1.2 ms. So a copy triggered at the end of an op ends in the middle of
# the next one, never on a boundary where the order of two instants would
# decide the outcome. A swap-in meant to count from op j (and not before) is
# triggered after op j - 1 with a delay that starts it in the middle of op j,
# while its `before_op` is later still: started at a trigger, or clamped to its
# `before_op`, it would be counted one op early by the op grid, which widens
# copies by `EPS_US` (case `late_swap_in`).
HW = device(
    "semantics-gpu",
    memory_bytes=1 << 30,
    h2d_bytes_per_s=4.0 * MIB_PER_MS,
    d2h_bytes_per_s=4.0 * MIB_PER_MS,
    transfer_fixed_s=0.2e-3,
    launch_overhead_s=0.0,
)


class Impl(enum.Enum):
    """The four implementations of plan semantics."""

    CHECKER = "checker"  # planners.core.check.check
    OPGRID = "opgrid"  # planners.analysis.opgrid.memory_of_plan
    SIM = "sim"  # sim.simulate
    REPLAY = "replay"  # validate.replay.executor.replay on CPU


class Check(enum.Enum):
    """What an implementation listed in `Case.differs` is held to."""

    OUTCOME = "outcome"  # the outcome only (that it accepts, if `Differs.accepts`)
    UPPER = "upper"  # the outcome, and bytes per op (and peak) >= the case's
    NONE = "none"  # nothing: it does not apply (the test is skipped, saying why)


@dataclass(frozen=True, slots=True)
class Differs:
    """Why an implementation may legitimately differ, and what it is held to.
    `accepts=True`: it runs a plan the case rejects (its outcome is then
    that it accepts)."""

    check: Check
    why: str
    accepts: bool = False


@dataclass(frozen=True, slots=True)
class Reject:
    """The plan is rejected. `fragment` must be in the checker's message;
    every implementation that rejects must name `buffer` ("buffer 3")."""

    fragment: str
    buffer: int


Built = tuple[Trace, Fixed]


# NOTE [ Resident bytes per op ]
# The bytes of op i are those on the device while op i runs, from its start
# (its outputs allocated) to its end (the frees after it not yet done): a
# buffer counts if it is there at any moment of that span. A swap-out counts
# up to the op during which its copy ends, a swap-in from the op during which
# its copy starts. Stalls and recompute chains run before their op starts:
# what they hold only for a moment (a chain's temporaries) is not in any op's
# bytes but is in the peak over the run (`Case.peak_mib`). The simulator's
# figure is that span's maximum over its memory samples. The replay samples
# its pool once per op, right after the call (`ReplayResult.memory_curve`),
# with its copy lanes put in the simulator's order
# (NOTE [ The simulator's order on the replay ] in adapters.py). So per-op
# bytes are compared for the op grid, the simulator and the replay, the peak
# for the simulator and the replay (the op grid's is its curves' maximum).
# The checker has no bytes: only its outcome is compared.


@dataclass(frozen=True, slots=True)
class Case:
    """One hand-worked case. Bytes are whole MiB per op (NOTE [ Resident
    bytes per op ]): `first_mib` for iteration 0, `steady_mib` for iteration 1
    when it differs (None: the same), `peak_mib` the peak over the run when
    it is above every op's bytes (None: their maximum). A rejected plan
    (`reject`) has no bytes."""

    name: str
    why: str
    trace: Callable[[], Built]
    events: tuple[Event, ...]
    first_mib: tuple[int, ...] = ()
    steady_mib: tuple[int, ...] | None = None
    peak_mib: int | None = None
    reject: Reject | None = None
    differs: Mapping[Impl, Differs] = field(default_factory=dict)

    def built(self) -> Built:
        return self.trace()

    def plan(self) -> Plan:
        trace = self.built()[0]
        return Plan(fingerprint_of(trace), self.events, trace.meta.model)

    @property
    def first(self) -> tuple[int, ...]:
        return tuple(m * MiB for m in self.first_mib)

    @property
    def steady(self) -> tuple[int, ...]:
        return tuple(m * MiB for m in (self.steady_mib or self.first_mib))

    @property
    def peak(self) -> int:
        if self.peak_mib is not None:
            return self.peak_mib * MiB
        return max((*self.first, *self.steady), default=0)


# ---- replayable hand traces ------------------------------------------------------
def build(name: str, buffers: Sequence[B], calls: Sequence[Call]) -> Built:
    """A validated trace whose ops are real aten calls (so the replay can run
    them) over float32 buffers of whole MiB, and the ops' fixed latencies.

    A call makes at most one new buffer: from 1, 2 or 3 inputs by `clone`,
    `add` or `addcmul` (`rand_like` of one if `rng`), or it updates one
    existing buffer in place from 1 or 2 others (`add_`, `addcmul_`). Every
    input is viewed as a vector of the output's length: a prefix of it, or
    its first element broadcast (stride 0) if it is shorter. `freed_after`
    None frees a buffer after its last access (as `tests.sim.handtraces`)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, c in enumerate(calls):
        for b in (*c.reads, *c.writes):
            first.setdefault(b, i)
            last[b] = i
    bufs = []
    for i, spec in enumerate(buffers):
        kind = BufferKind(spec.kind)
        persistent = kind in (BufferKind.PARAM, BufferKind.OPTIMIZER_STATE)
        freed = None if persistent else (last[i] if spec.freed_after is None else spec.freed_after)
        bufs.append(Buffer(i, spec.mib * MiB, kind, persistent, spec.name or f"b{i}", freed))
    views: list[View] = []

    def view(b: int, n: int) -> int:
        stride = 1 if n <= bufs[b].nbytes // 4 else 0
        views.append(View(len(views), b, (n,), (stride,), 0, "float32"))
        return len(views) - 1

    ops = []
    for i, c in enumerate(calls):
        made = [b for b in c.writes if not bufs[b].exists_at_start and first[b] == i]
        updated = [b for b in c.writes if b not in made]
        assert len(made) + len(updated) == 1, f"op {i}: one output or one in-place write"
        out = (made or updated)[0]
        n = bufs[out].nbytes // 4
        if made:
            ins = [view(b, n) for b in c.reads]
            ov = view(out, n)
            target = "aten.rand_like.default" if c.rng else _MAKE[len(ins)]
            reads, writes, args = tuple(ins), (ov,), ins
        else:
            ov = view(out, n)
            ins = [view(b, n) for b in c.reads if b != out]
            target = _UPDATE[len(ins)]
            reads, writes, args = (ov, *ins), (ov,), [ov, *ins]
        arg_json = {"args": [{"view": v} for v in args], "kwargs": {}}
        ops.append(Op(i, target, Phase(c.phase), reads, writes, arg_json, 0, c.ms * 1e3, rng=c.rng))
    trace = Trace(TraceMeta(name, 1), tuple(bufs), tuple(views), tuple(ops))
    trace = io.from_dict(io.to_dict(trace))  # the loader's validation
    return trace, Fixed([c.ms * 1e-3 for c in calls])


_MAKE = {1: "aten.clone.default", 2: "aten.add.Tensor", 3: "aten.addcmul.default"}
_UPDATE = {1: "aten.add_.Tensor", 2: "aten.addcmul_.default"}


# ---- the traces --------------------------------------------------------------------
@functools.cache
def step() -> Built:
    """A training step: input x (b0), params w1 (b1, read by op 0, updated by
    op 8) and w2 (b2, read by op 3, updated by op 7), activations a1..a4
    (b3..b6), gradients g4, g3, g2 (b7..b9). Freed after their last access:
    b0 after op 0, b5 and b6 after 4, b4 and b7 after 5, b3 and b8 after 6,
    b9 after 8. Bytes per op (MiB), vanilla:
        op0: x 1 + w1 2 + w2 1 + a1 4         =  8
        op1: w1 2 + w2 1 + a1 4 + a2 2         =  9
        op2: + a3 1                            = 10
        op3: + a4 1                            = 11
        op4: + g4 1                            = 12
        op5: - a3 - a4 + g3 1                  = 11
        op6: - a2 - g4 + g2 2                  = 10
        op7: - a1 - g3 (w1 2 + w2 1 + g2 2)    =  5
        op8:                                   =  5"""
    return _step()


@functools.cache
def step_late_free() -> Built:
    """`step`, but the framework frees a1 (b3, 4 MiB) after op 7, one op
    after its last access: vanilla op 7 is 5 + 4 = 9 MiB."""
    return _step(b3_freed_after=7)


@functools.cache
def step_late_free_a4() -> Built:
    """`step`, but a4 (b6, 1 MiB) is freed after op 5, one op after its last
    access: vanilla op 5 is 11 + 1 = 12 MiB."""
    return _step(b6_freed_after=5)


STEP_VANILLA = (8, 9, 10, 11, 12, 11, 10, 5, 5)


def _step(b3_freed_after: int | None = None, b6_freed_after: int | None = None) -> Built:
    name = f"step-{b3_freed_after}-{b6_freed_after}"
    bufs = [
        B(1, "input", name="x"),
        B(2, "param", name="w1"),
        B(1, "param", name="w2"),
        B(4, name="a1", freed_after=b3_freed_after),
        B(2, name="a2"),
        B(1, name="a3"),
        B(1, name="a4", freed_after=b6_freed_after),
        B(1, name="g4"),
        B(1, name="g3"),
        B(2, name="g2"),
    ]
    calls = [
        Call([0, 1], [3]),
        Call([3], [4]),
        Call([4], [5]),
        Call([5, 2], [6]),
        Call([6, 5], [7], phase="backward"),
        Call([7, 4], [8], phase="backward"),
        Call([8, 3], [9], phase="backward"),
        Call([2, 9], [2], phase="optimizer"),
        Call([1, 9], [1], phase="optimizer"),
    ]
    return build(name, bufs, calls)


@functools.cache
def chain() -> Built:
    """A chain for recomputes: param w (b0, 1 MiB); op 0 makes h1 (b1, 2) from
    w, op 1 h2 (b2, 4) from h1, op 2 h3 (b3, 1), op 3 h4 (b4, 1); op 4 reads
    h4 and h2 again (makes b5, 1), op 5 reads b5 and h1 again (makes b6, 1).
    Vanilla: 3, 7, 8, 9, 9 (w 1 + h1 2 + h2 4 + h4 1 + b5 1), 5 (w, h1, b5, b6)."""
    bufs = [B(1, "param", name="w"), B(2), B(4), B(1), B(1), B(1), B(1)]
    calls = [
        Call([0], [1]),
        Call([1], [2]),
        Call([2], [3]),
        Call([3], [4]),
        Call([4, 2], [5]),
        Call([5, 1], [6]),
    ]
    return build("chain", bufs, calls)


CHAIN_VANILLA = (3, 7, 8, 9, 9, 5)


@functools.cache
def long() -> Built:
    """An activation kept long: op 0 makes a (b1, 2 MiB) from x (b0, 1), op 1
    reads it, ops 1..6 pass 1 MiB buffers b2..b7 along, op 7 reads b7 and a
    again. Vanilla: 3 (x + a), 3 (a + b2), then 4 (a + two 1 MiB) to op 7."""
    bufs = [B(1, "input"), B(2), *[B(1) for _ in range(7)]]
    calls = [Call([0], [1]), *[Call([k], [k + 1]) for k in range(1, 7)], Call([7, 1], [8])]
    return build("long", bufs, calls)


LONG_VANILLA = (3, 3, 4, 4, 4, 4, 4, 4)


@functools.cache
def frozen() -> Built:
    """A frozen param p (b1, 2 MiB, never written) read by ops 3 and 5; x (b0,
    1) feeds a line of activations b2..b9: 1, 1, 1, 2 (made by op 3), 1, 2
    (made by op 5), 1, 1. Vanilla: 4 (x + p + b2), 4, 4, 5 (p + b4 1 + b5 2),
    5 (p + b5 + b6), 5 (p + b6 + b7), 5 (p + b7 + b8), 4 (p + b8 + b9)."""
    bufs = [B(1, "input"), B(2, "param", name="p"), B(1), B(1), B(1), B(2), B(1), B(2), B(1), B(1)]
    calls = [
        Call([0], [2]),
        Call([2], [3]),
        Call([3], [4]),
        Call([4, 1], [5]),
        Call([5], [6]),
        Call([6, 1], [7]),
        Call([7], [8]),
        Call([8], [9]),
    ]
    return build("frozen", bufs, calls)


FROZEN_VANILLA = (4, 4, 4, 5, 5, 5, 5, 4)


@functools.cache
def update() -> Built:
    """A param updated every step: w (b1, 2 MiB) read by op 2, updated in
    place by op 4 from its gradient (b5, 2, made by op 3); x (b0, 1) and
    activations b2 (1, kept to op 3), b3 (1), b4 (2), then b6, b7 (1) after
    the update. Vanilla: 4 (x + w + b2), 4 (w + b2 + b3), 6 (+ b4 2), 7 (w +
    b2 + b4 + b5 2), 4 (w + b5), 5 (+ b6), 4 (w + b6 + b7)."""
    bufs = [B(1, "input"), B(2, "param", name="w"), B(1), B(1), B(2), B(2), B(1), B(1)]
    calls = [
        Call([0], [2]),
        Call([2], [3]),
        Call([3, 1], [4]),
        Call([4, 2], [5], phase="backward"),
        Call([1, 5], [1], phase="optimizer"),
        Call([5], [6]),
        Call([6], [7]),
    ]
    return build("update", bufs, calls)


UPDATE_VANILLA = (4, 4, 6, 7, 4, 5, 4)


@functools.cache
def inplace() -> Built:
    """A param p (b0, 1 MiB) read by op 0 (makes h, b1, 2 MiB) and updated in
    place by op 1 (from h); op 2 reads h (makes b2, 1)."""
    bufs = [B(1, "param", name="p"), B(2), B(1)]
    calls = [Call([0], [1]), Call([1, 0], [0], phase="optimizer"), Call([1], [2])]
    return build("inplace", bufs, calls)


@functools.cache
def dropout() -> Built:
    """An RNG op: op 0 draws r (b1, 1 MiB, `rand_like` of x, b0, kept to op
    3); op 1 makes b2, op 2 b3, op 3 reads b3 and r. Vanilla: 2 (x + r), 3,
    4 (x, r, b2, b3), 4 (x, r, b3, b4)."""
    bufs = [B(1, "input", freed_after=3), B(1), B(1), B(1), B(1)]
    calls = [Call([0], [1], rng=True), Call([1], [2]), Call([2], [3]), Call([3, 1], [4])]
    return build("dropout", bufs, calls)
