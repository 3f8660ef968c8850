"""Tiny traces and a device to work out simulations by hand.

Sizes are whole MiB; both PCIe directions move 1 MiB per millisecond with no
fixed cost, so every copy takes a whole number of milliseconds; op durations
are given in milliseconds. `fmt(log)` turns the event log into tuples with
times in milliseconds for `assert ... == [...]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memplan.hwmodels.latency import Fixed
from memplan.hwmodels.profile import Hardware
from memplan.sim.log import LogEntry
from memplan.traces import io
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View

MiB = 1 << 20
MIB_PER_MS = 1000 * MiB  # bytes per second that move 1 MiB per millisecond


def gpu(memory_mib: int = 1024, copy_engines: int = 2, duplex: float = 0.5) -> Hardware:
    return Hardware(
        name="hand-gpu",
        memory_bytes=memory_mib * MiB,
        h2d_bytes_per_s=float(MIB_PER_MS),
        d2h_bytes_per_s=float(MIB_PER_MS),
        transfer_fixed_s=0.0,
        copy_engines=copy_engines,
        h2d_duplex_factor=duplex,
        peak_flops={"float32": 1e12},
        mem_bw_bytes_per_s=1e11,
        launch_overhead_s=0.0,
    )


@dataclass(frozen=True)
class B:
    """A buffer: `mib` MiB of `kind`; `freed_after` None = after its last access
    (persistent kinds: param, optimizer_state, never)."""

    mib: int
    kind: str = "activation"
    freed_after: int | None = None
    name: str = ""


@dataclass(frozen=True)
class Call:
    """An op reading and writing buffer ids, running `ms` milliseconds."""

    reads: Sequence[int]
    writes: Sequence[int]
    ms: float = 1.0
    phase: str = "forward"
    rng: bool = False


def make(buffers: Sequence[B], ops: Sequence[Call], name: str = "hand") -> tuple[Trace, Fixed]:
    """A validated trace (one view per buffer, view id = buffer id; measured
    durations set) and the fixed latencies of its ops."""
    last: dict[int, int] = {}
    for i, op in enumerate(ops):
        for b in (*op.reads, *op.writes):
            last[b] = i
    bufs = []
    for i, b in enumerate(buffers):
        kind = BufferKind(b.kind)
        persistent = kind in (BufferKind.PARAM, BufferKind.OPTIMIZER_STATE)
        freed = None if persistent else (b.freed_after if b.freed_after is not None else last[i])
        bufs.append(Buffer(i, b.mib * MiB, kind, persistent, b.name or f"b{i}", freed))
    views = tuple(View(i, i, (b.nbytes // 4,), (1,), 0, "float32") for i, b in enumerate(bufs))
    trace_ops = tuple(
        Op(
            i,
            f"aten.op{i}.default",
            Phase(o.phase),
            tuple(o.reads),
            tuple(o.writes),
            duration_us=o.ms * 1000,
            rng=o.rng,
        )
        for i, o in enumerate(ops)
    )
    trace = Trace(TraceMeta(name, 1), tuple(bufs), views, trace_ops)
    trace = io.from_dict(io.to_dict(trace))  # the loader's validation
    return trace, Fixed([o.ms * 1e-3 for o in ops])


def fmt(log: Sequence[LogEntry], job: bool = False) -> list[tuple]:
    """(ms, kind, op, buffer[, job]) per entry; lane copies also carry the lane."""
    out = []
    for e in log:
        row: tuple = (e.t_us / 1000, e.kind.value, e.op, e.buffer)
        if e.lane >= 0:
            row += (f"lane{e.lane}",)
        if job:
            row = (e.job, *row)
        out.append(row)
    return out
