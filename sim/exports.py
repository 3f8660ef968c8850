"""Timelines of a simulation: Chrome-trace / Perfetto JSON and matplotlib figures.

- `chrome_trace(result)`: one pid per job (named after it) with named tids
  for its compute stream and each PCIe lane, `X` events for ops, recomputed
  ops, stalls and copies, and a counter track of the job's device bytes; pid
  0 ("device") carries the total and the budget. Open in ui.perfetto.dev or
  chrome://tracing.
- `memory_figure(result)`: device memory over time stacked by buffer kind,
  the budget as a dashed line.
- `gantt_figure(result)`: compute of every job and each lane, one row each.

Built from the event log and memory curve only. Figures use matplotlib's
object API (no pyplot state); `save_figure` and `write_chrome_trace` write
atomically. The third export, a PyTorch memory snapshot that memory_viz
opens, is sim/snapshot.py.
"""

from __future__ import annotations

import io as _io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from memplan.sim.log import LogKind
from memplan.sim.metrics import SimResult
from memplan.traces.io import atomic_write_bytes
from memplan.traces.model import BUFFER_KINDS, BufferKind

K = LogKind
# Bottom to top: what stays resident first, what comes and goes on top.
STACK_ORDER = (
    BufferKind.PARAM,
    BufferKind.OPTIMIZER_STATE,
    BufferKind.INPUT,
    BufferKind.GRAD,
    BufferKind.ACTIVATION,
    BufferKind.OTHER,
)
COMPUTE_TID = 1
_PAIRS = {
    K.OP_START: (K.OP_END, "op"),
    K.RECOMPUTE_START: (K.RECOMPUTE_END, "recompute"),
    K.STALL_START: (K.STALL_END, "stall"),
    K.SWAP_OUT_START: (K.SWAP_OUT_END, "swap_out"),
    K.SWAP_IN_START: (K.SWAP_IN_END, "swap_in"),
    K.EVICT_START: (K.EVICT_END, "evict"),
    K.FETCH_START: (K.FETCH_END, "fetch"),
}
_ENDS = {end: start for start, (end, _) in _PAIRS.items()}


class Span(NamedTuple):
    """One interval of the log: `lane` -1 for the compute stream."""

    job: int
    iteration: int
    cat: str
    start_us: float
    end_us: float
    op: int
    buffer: int
    lane: int


def spans(result: SimResult) -> Iterator[Span]:
    """Intervals in order of their end: ops, recomputes, stalls and copies."""
    open_: dict[tuple, float] = {}
    for e in result.log:
        if e.kind in _PAIRS:
            open_[(e.job, e.kind, e.op, e.buffer, e.lane)] = e.t_us
        elif e.kind in _ENDS:
            start_kind = _ENDS[e.kind]
            t0 = open_.pop((e.job, start_kind, e.op, e.buffer, e.lane))
            cat = _PAIRS[start_kind][1]
            yield Span(e.job, e.iteration, cat, t0, e.t_us, e.op, e.buffer, e.lane)


# ---- Chrome trace ------------------------------------------------------------
def chrome_trace(result: SimResult) -> dict[str, Any]:
    events: list[dict[str, Any]] = []

    def meta(pid: int, tid: int | None, name: str, value: str) -> None:
        ev = {"ph": "M", "pid": pid, "name": name, "args": {"name": value}}
        if tid is not None:
            ev["tid"] = tid
        events.append(ev)

    meta(0, None, "process_name", f"device {result.hardware}")
    for j in result.jobs:
        pid = j.index + 1
        meta(pid, None, "process_name", f"job {j.index}: {j.name}")
        meta(pid, COMPUTE_TID, "thread_name", "compute")
        for lane, name in enumerate(result.lanes):
            meta(
                pid,
                COMPUTE_TID + 1 + lane,
                "thread_name",
                "pcie" if name == "pcie" else f"pcie {name}",
            )
    for sp in spans(result):
        trace = result.traces[sp.job] if result.traces else None
        if sp.cat in ("op", "recompute") and trace is not None:
            name = trace.ops[sp.op].target
        elif sp.cat == "stall":
            name = f"stall (buffer {sp.buffer})" if sp.buffer >= 0 else "stall"
        else:
            label = trace.buffers[sp.buffer].name if trace is not None else ""
            name = f"{sp.cat} {label or f'buffer {sp.buffer}'}"
        args: dict[str, Any] = {"iteration": sp.iteration, "op": sp.op}
        if sp.buffer >= 0:
            args["buffer"] = sp.buffer
            if trace is not None:
                args["nbytes"] = trace.buffers[sp.buffer].nbytes
        events.append(
            {
                "name": name,
                "cat": sp.cat,
                "ph": "X",
                "ts": sp.start_us,
                "dur": sp.end_us - sp.start_us,
                "pid": sp.job + 1,
                "tid": COMPUTE_TID if sp.lane < 0 else COMPUTE_TID + 1 + sp.lane,
                "args": args,
            }
        )
    for e in result.log:  # the instants of a scenario: departures and plan changes
        if e.kind is K.DEPART or e.kind is K.PLAN:
            what = "departure" if e.kind is K.DEPART else f"plan change (version {e.buffer})"
            events.append(
                {
                    "name": what,
                    "cat": e.kind.value,
                    "ph": "i",
                    "s": "p",
                    "ts": e.t_us,
                    "pid": e.job + 1,
                    "tid": COMPUTE_TID,
                    "args": {"iteration": e.iteration},
                }
            )
    mem = result.memory
    last = _last_per_time(mem.t_s)
    t_us = mem.t_s[last] * 1e6
    for j in result.jobs:
        col = mem.by_job[last, j.index]
        for t, v in zip(t_us.tolist(), col.tolist(), strict=True):
            events.append(
                {
                    "name": "device bytes",
                    "ph": "C",
                    "ts": t,
                    "pid": j.index + 1,
                    "args": {"bytes": v},
                }
            )
    for t, v in zip(t_us.tolist(), mem.bytes[last].tolist(), strict=True):
        events.append(
            {
                "name": "device bytes",
                "ph": "C",
                "ts": t,
                "pid": 0,
                "args": {"bytes": v, "budget": result.budget_bytes},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _last_per_time(t: np.ndarray) -> np.ndarray:
    """Indices of the last sample at each distinct time (the state from then on)."""
    if len(t) == 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.append(t[1:] != t[:-1], True))


def write_chrome_trace(result: SimResult, path: str | os.PathLike[str]) -> None:
    atomic_write_bytes(path, json.dumps(chrome_trace(result), separators=(",", ":")).encode())


# ---- figures --------------------------------------------------------------------
def _bytes_unit(peak: float) -> tuple[float, str]:
    return (2**30, "GiB") if peak >= 2**30 else (2**20, "MiB")


def memory_figure(result: SimResult) -> Figure:
    mem = result.memory
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    ax = fig.add_subplot()
    peak, budget = result.peak_bytes, result.budget_bytes
    scale, unit = _bytes_unit(peak)
    used = [
        BUFFER_KINDS.index(k) for k in STACK_ORDER if mem.by_kind[:, BUFFER_KINDS.index(k)].any()
    ]
    if used:
        t_ms = mem.t_s * 1e3
        ys = [mem.by_kind[:, k] / scale for k in used]
        ax.stackplot(t_ms, ys, labels=[BUFFER_KINDS[k].value for k in used], step="post")
    if result.device_curve is not None:  # an allocator model: what the device holds
        t_s, held = result.device_curve
        ax.step(t_s * 1e3, held / scale, where="post", color="black", lw=1.2,
                label=f"{result.allocator.value}: reserved + contexts")  # fmt: skip
        peak = max(peak, result.device_peak_bytes)
    # The budget is drawn where it is; a budget far above the peak would
    # squash the curve, so then the axis stops above the peak and the legend
    # says where the budget is.
    top = max(peak, budget) if budget <= 2 * peak else peak
    ax.set_ylim(0, max(top, 1) * 1.08 / scale)
    ax.axhline(
        budget / scale,
        color="black",
        ls="--",
        lw=1,
        label=f"budget {budget / scale:.2f} {unit}" + ("" if budget <= top else " (above)"),
    )
    ax.set_xlabel("time (ms)")
    ax.set_ylabel(f"device memory ({unit})")
    jobs = ", ".join(j.name for j in result.jobs)
    ax.set_title(f"{jobs} on {result.hardware}: peak {result.peak_bytes / scale:.2f} {unit}")
    ax.legend(loc="upper right", fontsize="small")
    ax.set_xlim(left=0)
    return fig


def gantt_figure(result: SimResult) -> Figure:
    lanes = ["pcie" if n == "pcie" else f"pcie {n}" for n in result.lanes]
    rows = [f"job {j.index} compute" for j in result.jobs] + lanes
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for sp in spans(result):
        row = sp.job if sp.lane < 0 else len(result.jobs) + sp.lane
        key = (row, sp.cat if sp.lane < 0 else f"job {sp.job} copies")
        bars.setdefault(key, []).append((sp.start_us / 1e3, (sp.end_us - sp.start_us) / 1e3))
    colors = {"op": "tab:blue", "recompute": "tab:orange", "stall": "tab:red"}
    cycle = ["tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]
    fig = Figure(figsize=(10, 1.2 + 0.5 * len(rows)), layout="constrained")
    ax = fig.add_subplot()
    labelled: set[str] = set()
    for (row, what), xs in sorted(bars.items()):
        color = colors.get(what) or cycle[int(what.split()[1]) % len(cycle)]
        label = None if what in labelled else what
        labelled.add(what)
        ax.broken_barh(xs, (row - 0.4, 0.8), facecolors=color, label=label)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title("compute and PCIe")
    if labelled:
        ax.legend(loc="upper right", fontsize="small", ncols=min(len(labelled), 4))
    return fig


def save_figure(fig: Figure, path: str | os.PathLike[str], dpi: int = 120) -> None:
    """PNG or SVG by the file's suffix, written atomically."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    buf = _io.BytesIO()
    FigureCanvasAgg(fig).print_figure(buf, format=fmt, dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())
