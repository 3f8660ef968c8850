"""A plan's Recompute, on demand: the chain's ops re-run on the compute
stream (NOTE [ Event semantics ] in sim/model.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy
from memplan.planners.core.lifecycle import Event
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.state import DEV, OFF, Gen, JobState

if TYPE_CHECKING:
    from memplan.sim.model import GpuModel

K = LogKind


def recompute(model: GpuModel, s: JobState, rc: tuple, i: int) -> Gen:
    """Re-run the chain `rc` of a planned Recompute for op `i` (NOTE [ Event
    semantics ] in sim/model.py)."""
    target, chain, _e = rc
    c, mem = s.c, model.mem
    where, pinned = s.where, s.pinned
    temps: list[int] = []
    for k, srcs in chain:
        s.pinned = pinned + c.accs[k]
        for src in srcs:
            if where[src] != DEV:
                yield from model._ensure(s, src, i)
        outs = [w for w in c.writes[k] if where[w] == OFF]
        yield from mem.take_group(s, outs, i, target)
        temps += [w for w in outs if w != target]
        yield from rerun(model, s, k, target)
    s.pinned = pinned
    alive = s.alive
    for w in temps:
        if not alive[w]:  # freed earlier and made again for the chain: that
            model._framework_free(s, w)  # life ends here (NOTE [ Incarnations ])
        elif where[w] == DEV:
            model.mem.act(s, w, s.apply(w, Event.DROP))
    for _k, srcs in chain:  # a freed source, made again by its own Recompute
        for src in srcs:
            if not alive[src]:
                model._framework_free(s, src)


def rerun(model: GpuModel, s: JobState, k: int, target: int) -> Gen:
    """Re-run op `k` on the compute stream to make `target` again (its
    absent outputs already taken); returns its duration in us."""
    env, j = model.env, s.c.index
    req = None
    if model.shared:
        req = model.compute.request()
        try:
            yield req
        except simpy.Interrupt:
            model.compute.cancel(req)
            raise
    model.mem.touch(s, s.c.accs[k])
    model.log.append(LogEntry(env.now, j, s.iteration, K.RECOMPUTE_START, k, target))
    kernel = env.timeout(s.dur[k])
    try:
        yield kernel
    except simpy.Interrupt:
        yield from model._hold(kernel, req)
        raise
    if req is not None:
        model.compute.release()
    model.log.append(LogEntry(env.now, j, s.iteration, K.RECOMPUTE_END, k, target))
    s.recompute_us += s.dur[k]
    return s.dur[k]
