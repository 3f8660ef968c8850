"""A plan's Recompute, on demand: the chain's ops re-run on the compute
stream (NOTE [ Event semantics ] in sim/model.py)."""

from __future__ import annotations

import simpy
from memplan.planners.core.lifecycle import Event
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.ports import Runner
from memplan.sim.state import DEV, OFF, Gen, JobState

K = LogKind


def recompute(run: Runner, s: JobState, rc: tuple, i: int) -> Gen:
    """Re-run the chain `rc` of a planned Recompute for op `i` (NOTE [ Event
    semantics ] in sim/model.py)."""
    target, chain, _e = rc
    c, mem = s.c, run.mem
    where, pinned = s.where, s.pinned
    temps: list[int] = []
    for k, srcs in chain:
        s.pinned = pinned + c.accs[k]
        for src in srcs:
            if where[src] != DEV:
                yield from run.ensure(s, src, i)
        outs = [w for w in c.writes[k] if where[w] == OFF]
        yield from mem.take_group(s, outs, i, target)
        temps += [w for w in outs if w != target]
        yield from rerun(run, s, k, target)
    s.pinned = pinned
    alive = s.alive
    for w in temps:
        if not alive[w]:  # freed earlier and made again for the chain: that
            run.framework_free(s, w)  # life ends here (NOTE [ Incarnations ])
        elif where[w] == DEV:
            mem.act(s, w, s.apply(w, Event.DROP))
    for _k, srcs in chain:  # a freed source, made again by its own Recompute
        for src in srcs:
            if not alive[src]:
                run.framework_free(s, src)


def rerun(run: Runner, s: JobState, k: int, target: int) -> Gen:
    """Re-run op `k` on the compute stream to make `target` again (its
    absent outputs already taken); returns its duration in us."""
    if not run.shared:  # alone, a job never queues for compute
        return (yield from _kernel(run, s, k, target))
    with run.compute.request() as req:  # given back when the kernel ends, or withdrawn
        yield req
        return (yield from _kernel(run, s, k, target))


def _kernel(run: Runner, s: JobState, k: int, target: int) -> Gen:
    """Op `k`'s kernel, once the stream is the job's."""
    env, j = run.env, s.c.index
    run.mem.touch(s, s.c.accs[k])
    run.log.append(LogEntry(env.now, j, s.iteration, K.RECOMPUTE_START, k, target))
    kernel = env.timeout(s.dur[k])
    try:
        yield kernel
    except simpy.Interrupt:  # the job stopped: the kernel runs to its end (NOTE [ Stopping a job ])
        yield kernel
        raise
    run.log.append(LogEntry(env.now, j, s.iteration, K.RECOMPUTE_END, k, target))
    s.recompute_us += s.dur[k]
    return s.dur[k]
