"""The simulator as a search planner's evaluator (planners.core.evaluate).

Planners never import `sim`; the app shell, which may import both, builds the
`Evaluator` a search planner scores its candidates with and hands it over
through `planners.registry.run(..., evaluator=...)`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.evaluate import Evaluation, Evaluator, NetMove, OpTimes
from memplan.planners.core.plan import Plan, SwapOut
from memplan.plannerview import rebound
from memplan.sim import Job, OomPolicy, SimResult, simulate
from memplan.sim.log import LogKind
from memplan.traces.model import Trace

K = LogKind


def sim_evaluator(
    traces: Sequence[Trace],
    device: DeviceModel,
    budget: int,
    *,
    iterations: int = 2,
    allocator: str = "exact",
    context_reserve: int | None = None,
) -> Evaluator:
    """An `Evaluator` simulating `traces` (one job each) on `device` under
    `budget` and `allocator` for `iterations` iterations, plans unchecked
    (the planner checks what it returns)."""

    def evaluate(plans: Sequence[Plan], policy: str = "fail") -> Evaluation:
        plans = rebound(plans, traces)  # planned for the planners' view of them
        pairs = enumerate(zip(traces, plans, strict=True))
        jobs = [Job(t, p, name=f"job{i}") for i, (t, p) in pairs]
        sim = simulate(
            jobs, device, iterations=iterations, budget=budget, oom=policy, check=False,
            allocator=allocator, context_reserve=context_reserve,
        )  # fmt: skip
        return evaluation(sim, plans)

    return evaluate


def evaluation(sim: SimResult, plans: Sequence[Plan] = ()) -> Evaluation:
    """What a search planner reads from a simulated run of `plans`."""
    times = [j.iteration_time_s for j in sim.jobs]
    oom_at = next(((j.index, *j.oom_at[:2]) for j in sim.jobs if j.oom_at is not None), None)
    net_used = any(j.net_used for j in sim.jobs)
    finished = not sim.oom and not any(math.isnan(t) for t in times)
    return Evaluation(
        fits=finished and not net_used,
        iteration_s=sum(times) / len(times) if finished else math.inf,
        peak_bytes=sim.device_peak_bytes,
        iterations=max(len(j.iteration_times_s) for j in sim.jobs),
        oom_at=oom_at,
        net_used=net_used,
        # under `fail` no net acts: nothing to read from the log (2 ms a run on densenet121)
        moves=net_moves(sim, plans) if sim.oom_policy is not OomPolicy.FAIL else (),
        op_times=functools.cache(functools.partial(op_times, sim)) if finished else None,
    )


def _op_peaks(sim: SimResult, t0: float, end: np.ndarray) -> np.ndarray:
    """Device bytes at most from the end of op i-1 (the iteration's start for
    op 0) to the end of op i, `end` in microseconds of the run."""
    t_us, nbytes = sim.memory.t_s * 1e6, sim.memory.bytes
    out = np.zeros(len(end), np.int64)
    if not len(t_us):
        return out
    lo = t0
    for i, hi in enumerate(end.tolist()):
        if math.isnan(hi):
            out[i] = out[i - 1] if i else 0
            continue
        a = max(int(np.searchsorted(t_us, lo, "right")) - 1, 0)  # the bytes held at lo
        b = max(int(np.searchsorted(t_us, hi, "right")), a + 1)
        out[i] = int(nbytes[a:b].max())
        lo = hi
    return out


def op_times(sim: SimResult) -> tuple[OpTimes, ...]:
    """When each job's ops ran in its last iteration, from the log."""
    out = []
    for j, job in enumerate(sim.jobs):
        n = sim.traces[j].n_ops
        it = len(job.iteration_times_s) - 1
        start, end = np.full(n, np.nan), np.full(n, np.nan)
        t0 = period = math.nan
        stalled: dict[tuple[int, int], float] = {}
        stalls: dict[tuple[int, int], float] = {}
        for e in sim.log:
            if e.job != j or e.iteration != it:
                continue
            kind = e.kind
            if kind is K.OP_START:
                start[e.op] = e.t_us
            elif kind is K.OP_END:
                end[e.op] = e.t_us
            elif kind is K.STALL_START:
                stalled[e.op, e.buffer] = e.t_us
            elif kind is K.STALL_END and (e.op, e.buffer) in stalled:
                key = (e.op, e.buffer)
                stalls[key] = stalls.get(key, 0.0) + e.t_us - stalled.pop(key)
            elif kind is K.ITER_START:
                t0 = e.t_us
            elif kind is K.ITER_END:
                period = e.t_us - t0
        waits = tuple((op, b, us) for (op, b), us in stalls.items() if us > 0)
        out.append(OpTimes(start - t0, end - t0, period, waits, _op_peaks(sim, t0, end)))
    return tuple(out)


def net_moves(sim: SimResult, plans: Sequence[Plan] = ()) -> tuple[NetMove, ...]:
    """What the OOM policy did, from the log: evictions (passive's swap-out,
    its discard of a buffer whose host copy is valid, DTR's drop) and
    restores (an on-demand fetch, or a producer re-run, restored for the next
    op the job starts: DTR's remakes, and the ops of the plan's own recompute
    chains, which `plan_from_net` recognises). See NOTE [ Net discards ]."""
    planned = {
        (j, e.buffer, e.after_op) for j, p in enumerate(plans) for e in p.events
        if isinstance(e, SwapOut)
    }  # fmt: skip
    out: list[NetMove] = []
    pending: dict[int, list[tuple[int, int, int]]] = {}  # job -> (iteration, buffer, producer)
    ended: dict[int, int] = {}  # job -> the last op that ended in its iteration
    for e in sim.log:
        kind = e.kind
        if kind is K.OP_END:
            ended[e.job] = e.op
        elif kind is K.ITER_START:
            ended[e.job] = -1
        elif kind is K.EVICT_START:
            out.append(NetMove(e.job, e.iteration, "evict", e.op, e.buffer, True))
        elif kind is K.DISCARD:
            mine = (e.job, e.buffer, e.op) in planned and e.op <= ended.get(e.job, -1)
            if not mine:
                out.append(NetMove(e.job, e.iteration, "evict", e.op, e.buffer, True))
        elif kind is K.DROP:
            out.append(NetMove(e.job, e.iteration, "evict", e.op, e.buffer, False))
        elif kind is K.FETCH_START:
            out.append(NetMove(e.job, e.iteration, "restore", e.op, e.buffer, True))
        elif kind is K.RECOMPUTE_START:  # a remake, or an op of a plan's chain
            pending.setdefault(e.job, []).append((e.iteration, e.buffer, e.op))
        elif kind is K.OP_START and pending.get(e.job):
            for it, b, producer in pending.pop(e.job):
                out.append(NetMove(e.job, it, "restore", e.op, b, False, (producer,)))
    return tuple(out)


# NOTE [ Net discards ]
# A net evicting a buffer whose host copy is still valid (a parameter
# fetched back and only read since) moves no bytes: the log says `discard`,
# not `evict_start`. A plan's own SwapOut of such a buffer logs `discard`
# too, with op = its `after_op`, once that op has ended; the net's, with op =
# the op it makes room for, before that op has ended. Only the net's are
# evictions: missing them, `plan_from_net` would keep a parameter resident
# from its fetch to its next access (vgg16 at 50%: fc1's 392 MiB weight
# through the backward pass, out of memory at the first op that needs room).
