"""vDNN (Rhu et al., MICRO'16): offload layers' input feature maps in forward,
prefetch them one layer ahead in backward.

vDNN_all offloads the input feature maps of every layer, vDNN_conv only those
of convolution layers (`VdnnOptions.layers`). It ignores the budget: the plan
is fixed by the network's structure, which is the point of the baseline (the
result is infeasible when the predicted peak still exceeds a budget given).
"""

# NOTE [ vDNN layers and feature maps ]
# - A *layer* is a maximal run of consecutive forward ops with the same `Op.module` (a module
#   called twice is two layers); a convolution layer has a convolution among its ops.
# - A layer's *input feature maps*: the non-persistent activation and input buffers its
#   forward ops read and none of them writes, that are read or written again in backward.
# - Each is offloaded once, after its *last* forward access (a skip connection too): the
#   copy starts when that op ends, and the memory is free when the copy ends.
# - Prefetch: triggered when the backward of the *next* layer starts (looked up from
#   `before_op`, at most `MAX_SCAN` layers on; else by the op just before `before_op`), and
#   due before the buffer's first backward access (`before_op`).
# - vDNN syncs its streams at layer boundaries; here the swap-out's deadline
#   (planners.core.plan NOTE [ Swap-out deadlines ]) is the first op of the layer after the
#   one the copy overlaps. It costs time, as in vDNN, and makes the peak not depend on a race.
# - Left alone: a buffer whose swap-in would be triggered by the op that swaps it out, and
#   one whose copy has no op to overlap before its deadline. Full text: docs/notes.md.
#
# NOTE [ vDNN predicted peak ]
# vDNN does not schedule its copies: they queue on the PCIe lane in trigger
# order, a prefetch that finds its buffer still queued or copying out just
# keeps it (no copy), and the op needing a late prefetch, or due after an
# offload (its deadline), waits for it. Under
# congestion that decides the memory, so the predicted peak (for `feasible`
# under a budget) comes from a small replay of the plan with those rules --
# the simulator's NOTE [ Event semantics ] for one job on one FIFO lane,
# no budget (`planners.analysis.queued.queued_peak`) -- over three
# iterations (each starts with the copies the one before left queued).

from __future__ import annotations

import bisect
import enum
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.device import DeviceModel
from memplan.planners.analysis import as_traces, check_budget, predict_timelines
from memplan.planners.analysis.queued import queued_peak
from memplan.planners.core.errors import PlanError
from memplan.planners.core.options import options_dict
from memplan.planners.core.plan import (
    Plan,
    PlanResult,
    SwapIn,
    SwapOut,
    fingerprint_of,
    fit_result,
)
from memplan.traces.model import BufferKind, Phase, Trace

MAX_SCAN = 64  # layers looked at after a buffer's layer for the next one with a backward

_CONV = re.compile(r"(^|_)conv(olution|_transpose|_depthwise|_dilated|_tbc|\d)")


class VdnnLayers(enum.Enum):
    ALL = "all"  # vDNN_all
    CONV = "conv"  # vDNN_conv


@dataclass(frozen=True, slots=True)
class VdnnOptions:
    """`layers`: whose input feature maps are offloaded (a `VdnnLayers` or its value)."""

    layers: VdnnLayers = VdnnLayers.ALL

    def __post_init__(self) -> None:
        if not isinstance(self.layers, VdnnLayers):
            try:
                object.__setattr__(self, "layers", VdnnLayers(self.layers))
            except ValueError:
                allowed = ", ".join(repr(v.value) for v in VdnnLayers)
                raise PlanError(f"vdnn: layers={self.layers!r} must be one of {allowed}") from None


@dataclass(frozen=True, slots=True)
class Layer:
    """Forward ops `start..stop-1` (one run of `module`); `conv` when one is a convolution."""

    module: str
    start: int
    stop: int
    conv: bool


def _is_conv(target: str) -> bool:
    """`aten.convolution.default`, `aten.cudnn_convolution...`, `aten.conv2d...`."""
    parts = target.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    return bool(_CONV.search(name)) and "backward" not in name


def layers_of(trace: Trace) -> list[Layer]:
    """The forward layers in order (NOTE [ vDNN layers and feature maps ])."""
    out: list[Layer] = []
    start, module, conv = -1, "", False
    for op in trace.ops:
        fwd = op.phase is Phase.FORWARD
        if start >= 0 and (not fwd or op.module != module):
            out.append(Layer(module, start, op.id, conv))
            start = -1
        if fwd:
            if start < 0:
                start, module, conv = op.id, op.module, False
            conv = conv or _is_conv(op.target)
    if start >= 0:
        out.append(Layer(module, start, trace.n_ops, conv))
    return out


def _last_forward_access(trace: Trace, forward: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(last forward access, the access right after it) per buffer; -1 where none."""
    bptr, ops = trace.buffer_accesses
    nb = trace.n_buffers
    counts = np.diff(bptr)
    owner = np.repeat(np.arange(nb, dtype=np.int64), counts)
    pos = np.full(nb, -1, np.int64)
    fwd_pos = np.flatnonzero(forward[ops])
    np.maximum.at(pos, owner[fwd_pos], fwd_pos)
    last = np.where(pos >= 0, ops[np.maximum(pos, 0)], -1)
    has_next = (pos >= 0) & (pos + 1 < bptr[1:])
    nxt = np.where(has_next, ops[np.minimum(pos + 1, len(ops) - 1)], -1) if len(ops) else pos
    return last, nxt


def vdnn_plan(trace: Trace, options: VdnnOptions | None = None) -> Plan:
    """The vDNN plan of one trace: a `SwapOut` after the last forward access of
    each offloaded feature map and a `SwapIn` before its first backward access."""
    opts = options or VdnnOptions()
    backward = np.fromiter((op.phase is Phase.BACKWARD for op in trace.ops), bool, trace.n_ops)
    forward = np.fromiter((op.phase is Phase.FORWARD for op in trace.ops), bool, trace.n_ops)
    layers = layers_of(trace)
    last_fwd, next_acc = _last_forward_access(trace, forward)
    kinds = trace.kind_index
    fm_kinds = {
        list(BufferKind).index(BufferKind.ACTIVATION),
        list(BufferKind).index(BufferKind.INPUT),
    }
    eligible = ~trace.persistent & np.isin(kinds, list(fm_kinds)) & (next_acc >= 0)
    eligible &= backward[np.maximum(next_acc, 0)]

    # backward ops per module, ascending; forward layers per module
    bwd_by_module: dict[str, list[int]] = defaultdict(list)
    for op in trace.ops:
        if op.phase is Phase.BACKWARD:
            bwd_by_module[op.module].append(op.id)
    bwd = {m: np.asarray(v, np.int64) for m, v in bwd_by_module.items()}
    layers_by_module: dict[str, list[int]] = defaultdict(list)
    for li, layer in enumerate(layers):
        layers_by_module[layer.module].append(li)

    rp, rb = trace.reads_csr
    wp, wb = trace.writes_csr
    chosen: dict[int, int] = {}  # buffer -> index of a layer it is an input of
    for li, layer in enumerate(layers):
        if opts.layers is VdnnLayers.CONV and not layer.conv:
            continue
        reads = rb[rp[layer.start] : rp[layer.stop]]
        written = wb[wp[layer.start] : wp[layer.stop]]
        for b in np.setdiff1d(reads, written).tolist():
            if eligible[b] and b not in chosen:
                chosen[b] = li

    starts = [layer.start for layer in layers]
    after_forward = layers[-1].stop if layers else trace.n_ops
    events: list[SwapOut | SwapIn] = []
    for b in sorted(chosen):
        out_after, before = int(last_fwd[b]), int(next_acc[b])
        trigger = _prefetch_trigger(trace, layers, layers_by_module, bwd, out_after, before)
        li = bisect.bisect_right(starts, out_after) - 1  # the layer the copy starts after
        sync = min(starts[li + 2] if li + 2 < len(layers) else after_forward, trigger - 1)
        if sync <= out_after + 1:
            # no op for the copy to overlap before it is due (this includes a
            # prefetch triggered by the swap-out's own op): it would only stall
            continue
        events.append(SwapOut(b, out_after, before_op=sync))
        events.append(SwapIn(b, trigger - 1, before))
    events.sort(key=lambda ev: (ev.after_op, isinstance(ev, SwapIn), ev.buffer))
    return Plan(fingerprint_of(trace), tuple(events), trace.meta.model)


def _prefetch_trigger(
    trace: Trace,
    layers: list[Layer],
    layers_by_module: dict[str, list[int]],
    bwd: dict[str, np.ndarray],
    out_after: int,
    before: int,
) -> int:
    """The op whose start triggers the prefetch of a buffer offloaded after
    `out_after` and first needed by backward op `before`."""
    calls = layers_by_module.get(trace.ops[before].module, [])
    k = bisect.bisect_right(calls, out_after, key=lambda li: layers[li].start)
    if k == 0:
        return before
    first = calls[k - 1] + 1
    for li in range(first, min(first + MAX_SCAN, len(layers))):
        ops = bwd.get(layers[li].module)
        if ops is None:
            continue
        lo = int(np.searchsorted(ops, out_after, side="right"))
        hi = int(np.searchsorted(ops, before, side="left"))
        if hi > lo:
            j = hi - 1
            while j > lo and ops[j - 1] == ops[j] - 1:
                j -= 1
            return int(ops[j])
    return before


def vdnn(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: VdnnOptions | None = None,
) -> PlanResult:
    """vDNN on every job alone. The plan does not depend on the budget;
    planned when none is given or the predicted peaks of all jobs together
    fit it."""
    t0 = time.perf_counter()
    jobs = as_traces(traces)
    budget = check_budget(budget_bytes)
    opts = options or VdnnOptions()
    timelines = predict_timelines(jobs, device)
    plans = [vdnn_plan(t, opts) for t in jobs]
    peaks = [queued_peak(t, tl, p, device) for t, tl, p in zip(jobs, timelines, plans, strict=True)]
    return fit_result(
        "vdnn",
        plans,
        sum(peaks),
        budget,
        t0,
        options=options_dict(opts),
        stats={
            "peak_bytes": sum(peaks),
            "job_peak_bytes": peaks,
            "swapped_buffers": [p.counts()["swap_out"] for p in plans],
        },
    )
