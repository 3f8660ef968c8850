"""The memory planners plan for: the budget less the CUDA contexts and
workspaces, and buffers at the sizes the allocator gives them (NOTE [ The
planners' view of the caching allocator ]). The app shell computes it once
for every planner; the simulator, which runs the jobs themselves, judges."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from memplan.hwmodels.device import DeviceModel, op_workspace_bytes
from memplan.planners.core.plan import Plan, PlanResult, fingerprint_of
from memplan.runconfig import DEFAULT_RUN, Fallback, RunConfig
from memplan.sim.allocator import alone_size
from memplan.sim.state import Allocator
from memplan.traces.errors import MemplanError
from memplan.traces.model import Trace


# NOTE [ The planners' view of the caching allocator ]
# Planners count bytes exactly, so the app shell hands them the memory they may plan for
# (`planner_view`): the budget less every job's CUDA context (NOTE [ Context reserve ] in
# sim/simulate.py) and, with an allocator model, less each job's largest op workspace
# (NOTE [ Workspaces ]); with `caching`, every buffer at its size alone
# (`sim.allocator.alone_size`: 512 B rounding, 2 MiB from 10 MiB, where it gets its own
# segment). What rounding cannot show (unsplit block tails, segments cached by the other
# pool or job) only the simulator sees, and it judges: a plan the caching allocator runs out
# of memory on is a row out of memory (or rescued by the net), never one that fits.
# SmartPool lays its pool out after the plan, so its planners see exact sizes. With no
# budget, planners get none. Full text: docs/notes.md.
def planner_view(
    traces: Sequence[Trace],
    device: DeviceModel,
    budget: int | None,
    config: RunConfig = DEFAULT_RUN,
) -> tuple[list[Trace], int | None]:
    """(traces, budget) as planners should see them under `config`'s
    allocator (NOTE [ The planners' view of the caching allocator ])."""
    alloc = config.allocator
    reserve = config.context_bytes(device.hw)
    views = list(traces)
    if alloc is Allocator.CACHING:
        views = [_rounded(t) for t in traces]
    if budget is None or (alloc is Allocator.EXACT and not reserve):
        return views, budget
    scratch = 0
    if alloc is not Allocator.EXACT:
        scratch = sum(int(op_workspace_bytes(t, device.hw).max(initial=0)) for t in traces)
    share = budget - reserve * len(traces) - scratch
    if share <= 0:
        raise MemplanError(
            f"budget {budget} bytes leaves nothing to plan for after {len(traces)} CUDA "
            f"context(s) of {reserve} bytes and {scratch} bytes of workspace"
        )
    return views, share


def _rounded(trace: Trace) -> Trace:
    """`trace` with every buffer at the size the caching allocator gives it alone."""
    buffers = tuple(dataclasses.replace(b, nbytes=alone_size(b.nbytes)) if b.nbytes else b
                    for b in trace.buffers)  # fmt: skip
    return Trace(trace.meta, buffers, trace.views, trace.ops, trace.saved)


def rebound(plans: Sequence[Plan], traces: Sequence[Trace]) -> tuple[Plan, ...]:
    """`plans` made for the planners' view of `traces`, bound to the traces
    themselves (same buffers and ops: only the fingerprint differs)."""
    out = []
    for p, t in zip(plans, traces, strict=False):
        fp = fingerprint_of(t)
        out.append(p if p.trace_fingerprint == fp else dataclasses.replace(p, trace_fingerprint=fp))
    return tuple(out)


def rebound_result(result: PlanResult, traces: Sequence[Trace]) -> PlanResult:
    """`result` with its plans `rebound` to `traces`."""
    plans = rebound(result.plans, traces)
    return result if plans == result.plans else dataclasses.replace(result, plans=plans)


# NOTE [ The net under a reordered plan ]
# DTR's remakes reason in the trace's op order (sim/remat.py), so the
# simulator refuses `oom="dtr"` for a plan that reorders ops (SwapAdvisor's;
# NOTE [ Plans under another order ] in planners/core/plan.py). In a
# comparison such a row runs under the passive net instead, and says so,
# rather than failing the whole command.
def net_for(
    plans: Sequence[Plan], traces: Sequence[Trace], fallback: Fallback
) -> tuple[Fallback, str]:
    """The `--fallback` a row of `plans` runs under, and why if not `fallback`
    (NOTE [ The net under a reordered plan ])."""
    reordered = any(
        p.order is not None and p.order != tuple(range(t.n_ops))
        for p, t in zip(plans, traces, strict=True)
    )
    if fallback == Fallback.DTR and reordered:
        why = "the plan reorders ops: its net is passive (dtr remakes in trace order)"
        return Fallback.PASSIVE, why
    return fallback, ""
