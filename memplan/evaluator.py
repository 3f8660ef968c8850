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
from memplan.planners.core.evaluate import (
    Evaluation,
    Evaluator,
    MoveKind,
    NetMove,
    OomPolicy,
    OpTimes,
)
from memplan.planners.core.plan import Plan, SwapOut
from memplan.plannerview import rebound
from memplan.runconfig import DEFAULT_RUN, RunConfig
from memplan.sim import Job, SimResult, simulate
from memplan.sim.log import CODE, KINDS, LogKind
from memplan.traces.model import Trace

K = LogKind


def sim_evaluator(
    traces: Sequence[Trace],
    device: DeviceModel,
    budget: int,
    *,
    iterations: int = 2,
    config: RunConfig = DEFAULT_RUN,
) -> Evaluator:
    """An `Evaluator` simulating `traces` (one job each) on `device` under
    `budget` and `config`'s memory model for `iterations` iterations, plans
    unchecked (the planner checks what it returns); the net is the
    evaluation's `policy`, not `config`'s."""

    def evaluate(plans: Sequence[Plan], policy: OomPolicy = OomPolicy.FAIL) -> Evaluation:
        plans = rebound(plans, traces)  # planned for the planners' view of them
        pairs = enumerate(zip(traces, plans, strict=True))
        jobs = [Job(t, p, name=f"job{i}") for i, (t, p) in pairs]
        sim = simulate(
            jobs, device, iterations=iterations, budget=budget, oom=policy, check=False,
            **config.memory,
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
    """When each job's ops ran in its last iteration, from the log's columns."""
    t_us, cols = sim.log.columns()
    job, iteration, code, op, buf = (cols[:, c] for c in range(5))
    out = []
    for j, jr in enumerate(sim.jobs):
        n = sim.traces[j].n_ops
        mine = (job == j) & (iteration == len(jr.iteration_times_s) - 1)
        start, end = np.full(n, np.nan), np.full(n, np.nan)
        at = mine & (code == CODE[K.OP_START])
        start[op[at]] = t_us[at]
        at = mine & (code == CODE[K.OP_END])
        end[op[at]] = t_us[at]
        t0 = period = math.nan
        starts = t_us[mine & (code == CODE[K.ITER_START])]
        ends = t_us[mine & (code == CODE[K.ITER_END])]
        if len(starts):
            t0 = float(starts[-1])
            if len(ends):
                period = float(ends[-1]) - t0
        stalled: dict[tuple[int, int], float] = {}
        stalls: dict[tuple[int, int], float] = {}
        for r in np.flatnonzero(mine & np.isin(code, STALLS)).tolist():
            key, t = (int(op[r]), int(buf[r])), float(t_us[r])
            if code[r] == CODE[K.STALL_START]:
                stalled[key] = t
            elif key in stalled:
                stalls[key] = stalls.get(key, 0.0) + t - stalled.pop(key)
        waits = tuple((o, b, us) for (o, b), us in stalls.items() if us > 0)
        out.append(OpTimes(start - t0, end - t0, period, waits, _op_peaks(sim, t0, end)))
    return tuple(out)


STALLS = [CODE[K.STALL_START], CODE[K.STALL_END]]
NET = [CODE[k] for k in (K.EVICT_START, K.DISCARD, K.DROP, K.FETCH_START, K.RECOMPUTE_START)]


def net_moves(sim: SimResult, plans: Sequence[Plan] = ()) -> tuple[NetMove, ...]:
    """What the OOM policy did, from the log: evictions (passive's swap-out,
    its discard of a buffer whose host copy is valid, DTR's drop) and
    restores (an on-demand fetch, or a producer re-run, restored for the next
    op the job starts: DTR's remakes, and the ops of the plan's own recompute
    chains, which `plan_from_net` recognises). See NOTE [ Net discards ].
    Only the rows of those kinds are read, in order; the op a job last ended
    and the op it starts next are found in its own rows by bisection."""
    t_us, cols = sim.log.columns()
    code = cols[:, 2]
    rows = np.flatnonzero(np.isin(code, NET))
    if not len(rows):
        return ()
    planned = {
        (j, e.buffer, e.after_op) for j, p in enumerate(plans) for e in p.events
        if isinstance(e, SwapOut)
    }  # fmt: skip
    job, iteration, op, buf = cols[:, 0], cols[:, 1], cols[:, 3], cols[:, 4]
    marks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def marks_of(j: int) -> tuple[np.ndarray, np.ndarray]:
        """Job j's rows that end an op or start an iteration, and that start an op."""
        if j not in marks:
            mine = job == j
            ends = mine & ((code == CODE[K.OP_END]) | (code == CODE[K.ITER_START]))
            marks[j] = np.flatnonzero(ends), np.flatnonzero(mine & (code == CODE[K.OP_START]))
        return marks[j]

    keyed: list[tuple[int, int, NetMove]] = []  # (row it is known at, its own row, move)
    for r in rows.tolist():
        j, it, o, b, kind = int(job[r]), int(iteration[r]), int(op[r]), int(buf[r]), KINDS[code[r]]
        if kind is K.EVICT_START or kind is K.DROP:
            keyed.append((r, r, NetMove(j, it, MoveKind.EVICT, o, b, kind is K.EVICT_START)))
        elif kind is K.DISCARD:
            ends, _ = marks_of(j)
            p = int(np.searchsorted(ends, r)) - 1  # the job's last op end since its iteration began
            ended = int(op[ends[p]]) if p >= 0 and code[ends[p]] == CODE[K.OP_END] else -1
            if not ((j, b, o) in planned and o <= ended):
                keyed.append((r, r, NetMove(j, it, MoveKind.EVICT, o, b, True)))
        elif kind is K.FETCH_START:
            keyed.append((r, r, NetMove(j, it, MoveKind.RESTORE, o, b, True)))
        else:  # a remake, or an op of a plan's chain: restored for the next op the job starts
            _, starts = marks_of(j)
            q = int(np.searchsorted(starts, r))
            if q < len(starts):
                f = int(starts[q])
                keyed.append((f, r, NetMove(j, it, MoveKind.RESTORE, int(op[f]), b, False, (o,))))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return tuple(m for _f, _r, m in keyed)


# NOTE [ Net discards ]
# A net evicting a buffer whose host copy is still valid (a parameter
# fetched back and only read since) moves no bytes: the log says `discard`,
# not `evict_start`. A plan's own SwapOut of such a buffer logs `discard`
# too, with op = its `after_op`, once that op has ended; the net's, with op =
# the op it makes room for, before that op has ended. Only the net's are
# evictions: missing them, `plan_from_net` would keep a parameter resident
# from its fetch to its next access (vgg16 at 50%: fc1's 392 MiB weight
# through the backward pass, out of memory at the first op that needs room).
