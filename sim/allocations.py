"""What a simulation allocated, buffer by buffer: every change of the device
bytes paired into allocations and frees and labelled with the job, buffer
and op it belongs to (NOTE [ Which buffer a memory change is ]). The
snapshot writer (sim/snapshot.py) turns them into PyTorch's trace entries.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from memplan.planners.core.semantics import OpTable
from memplan.sim.log import LogKind
from memplan.sim.metrics import SimResult
from memplan.traces.model import BUFFER_KINDS, BufferKind, Trace

K = LogKind
OTHER = BUFFER_KINDS.index(BufferKind.OTHER)  # workspaces and contexts count as this kind

# NOTE [ Snapshot time ]
# A real snapshot is taken while the program runs, usually after some
# iterations: the parameters and optimizer state are still allocated. The
# snapshot of a simulation is taken at its end, after the last iteration of
# the jobs that finish last but before they leave: their persistent buffers
# stay allocated (in `segments`), their frees at that instant are left out
# of the trace. Jobs that ended earlier, or ran out of memory, have left and
# given everything back. The allocated peak over the trace is the
# simulation's peak either way.


class Allocation(NamedTuple):
    """One allocation of the simulation: `buffer` -1 for bytes that are no
    buffer of the job's trace (a workspace); `op` -1 before the first op of
    an iteration (inputs) or at arrival (persistent buffers)."""

    token: int  # unique: pairs the allocation with its free
    t_us: float
    job: int
    nbytes: int
    buffer: int
    op: int
    iteration: int
    why: str


class MemEvent(NamedTuple):
    """At `t_us`: an allocation (`alloc`) or its free (`free`; `leaving`: its
    job has ended and leaves, NOTE [ Snapshot time ]); the end of a copy's
    transfer (`arrive`, NOTE [ Copies in flight ]); an `oom`; a job's CUDA
    context taken (`context`) or given back (`context_end`), `alloc.nbytes`
    its bytes."""

    t_us: float
    action: str
    alloc: Allocation
    leaving: bool = False


# ---- which buffer a memory change is ---------------------------------------------
# NOTE [ Which buffer a memory change is ]
# The simulator records each change of device bytes (time, job, kind, +/- bytes), not its
# buffer; `allocations` labels it with a buffer of that job, kind and size, the first of:
# - a taking (one holding no bytes): the outputs of an op whose turn it is (not started, its
#   process waits for nothing); one a recompute, swap-in or fetch logged then names; one a
#   recompute logged before the next op names; an input or persistent buffer; one a later copy
#   names; else the next op's workspace (kind `other`, NOTE [ Workspaces ] in hwmodels/device.py);
# - a giving back (one holding them): one the log names then or the framework frees after the
#   ops that ended then; what a recompute ending then made for itself only (not one a copy out
#   still reads); one freed after the last op that ended (put off while a copy read it); a
#   workspace; at the job's end its lowest buffer; else the latest allocation of its kind and
#   size. Several at one instant go in the simulator's order: workspace, framework frees, log.
# A job's CUDA context is a `context` event. Totals are exact at every instant; only among one
# job's buffers of one kind and size can a label be wrong.
# Reasons and measurements: docs/notes.md, "Which buffer a memory change is".
_EPS_US = 1e-6  # the curve holds seconds: times match within rounding

_ALLOC_HINTS = {K.SWAP_IN_START: "swap_in", K.FETCH_START: "fetch"}
_FREE_HINTS = (K.RELEASE, K.DISCARD, K.DROP, K.SWAP_OUT_END, K.EVICT_END)
_READY = (K.ITER_START, K.OP_END, K.STALL_END, K.RECOMPUTE_END, K.FETCH_END)


def _eps(t: float) -> float:
    return _EPS_US + 1e-12 * abs(t)


class _JobLabels:
    """Labels the memory changes of one job (NOTE [ Which buffer a memory change is ])."""

    def __init__(self, job: int, trace: Trace, entries: list, end_us: float):
        self.job, self.end_us = job, end_us
        self.table = table = OpTable.of(trace)
        self.key = list(zip(trace.kind_index.tolist(), trace.nbytes.tolist(), strict=True))
        self.by_key: dict[tuple[int, int], list[int]] = {}
        for b, k in enumerate(self.key):
            self.by_key.setdefault(k, []).append(b)
        self.start = set(table.persistent) | set(table.inputs)
        self.persistent = set(table.persistent)
        self.created = trace.created_at.tolist()
        # per op run: when it starts, and from when it may take its outputs
        # (the last thing its job's process waited for before it)
        self.start_t: list[float] = []
        self.start_op: list[tuple[int, int]] = []
        self.ready_t: list[float] = []
        ready = -math.inf
        for e in entries:
            if e.kind is K.OP_START:
                self.start_t.append(e.t_us)
                self.start_op.append((e.op, e.iteration))
                self.ready_t.append(ready)
            elif e.kind in _READY:
                ready = e.t_us
        ends = [e for e in entries if e.kind is K.OP_END]
        self.end_t = [e.t_us for e in ends]
        self.end_op = [e.op for e in ends]
        hints = []  # (t, buffer, op, why) of log entries that take bytes
        self.free_t: list[float] = []  # buffers the log names as freed then
        self.free_b: list[int] = []
        # copies out that read a buffer, (start, end): its bytes go at the end
        self.copying: dict[int, list[tuple[float, float]]] = {}
        started: dict[int, float] = {}
        for e in entries:
            if e.kind in _ALLOC_HINTS:
                hints.append((e.t_us, e.buffer, e.op, _ALLOC_HINTS[e.kind]))
            elif e.kind is K.RECOMPUTE_START:
                hints += [(e.t_us, w, e.op, "recompute") for w in table.writes[e.op]]
            if e.kind in _FREE_HINTS:
                self.free_t.append(e.t_us)
                self.free_b.append(e.buffer)
            if e.kind in (K.SWAP_OUT_START, K.EVICT_START):
                started[e.buffer] = e.t_us
            elif e.kind in (K.SWAP_OUT_END, K.EVICT_END) and e.buffer in started:
                self.copying.setdefault(e.buffer, []).append((started.pop(e.buffer), e.t_us))
        self.hint_t = [h[0] for h in hints]
        self.hints = hints
        self.remat_t, self.remat_b = self._remade_temporaries(entries, trace)
        self.iter_t = [e.t_us for e in entries if e.kind is K.ITER_START]
        self.live: dict[tuple[int, int], list[Allocation]] = {}
        self.live_b: set[int] = set()

    def _remade_temporaries(self, entries: list, trace: Trace) -> tuple[list, list]:
        """(time, buffer) of what recomputes made for themselves only: when a
        recompute ends, what the ops re-run since the job's last op wrote,
        but the buffers still alive for the op they serve (sim/model.py NOTE
        [ Incarnations ]; sim/remat.py NOTE [ DTR ])."""
        writes, freed = self.table.writes, trace.freed_after.tolist()
        times: list[float] = []
        bufs: list[int] = []
        rerun: list[int] = []  # ops re-run since the last op started
        targets: list[int] = []
        ends: list[tuple[float, int]] = []  # (time, how many ops had re-run)

        def resolve(i: int) -> None:
            for t, n in ends:
                alive = {x for x in targets if freed[x] >= i}
                temps = {w for k in rerun[:n] for w in writes[k]} - alive
                times.extend([t] * len(temps))
                bufs.extend(sorted(temps))
            rerun.clear(), targets.clear(), ends.clear()

        for e in entries:
            if e.kind is K.RECOMPUTE_START:
                rerun.append(e.op)
                targets.append(e.buffer)
            elif e.kind is K.RECOMPUTE_END:
                ends.append((e.t_us, len(rerun)))
            elif e.kind is K.OP_START:
                resolve(e.op)
        resolve(trace.n_ops)
        order = sorted(range(len(times)), key=times.__getitem__)
        return [times[k] for k in order], [bufs[k] for k in order]

    def _copied(self, b: int, t: float) -> bool:
        """A copy out of `b` is running at `t` (it frees the bytes when it ends)."""
        return any(t0 <= t < t1 - _eps(t) for t0, t1 in self.copying.get(b, ()))

    def _iteration(self, t: float) -> int:
        return max(bisect.bisect_right(self.iter_t, t + _eps(t)) - 1, 0)

    def take(self, token: int, t: float, kind: int, n: int) -> Allocation:
        key, eps = (kind, n), _eps(t)
        # the ops that may have taken it: those starting now (zero-length ops
        # run at the same instant) and the next one after
        p = bisect.bisect_left(self.start_t, t - eps)
        q = min(bisect.bisect_right(self.start_t, t + eps), len(self.start_t) - 1)
        ops = self.start_op[p : q + 1]
        nxt, it = ops[-1] if ops else (-1, self._iteration(t))
        t_next = self.start_t[q] if ops else math.inf
        free = self._free_of(key)
        lo = bisect.bisect_left(self.hint_t, t - eps)
        hi = bisect.bisect_right(self.hint_t, t_next + eps)
        # an op whose outputs are due now (its job waits for nothing else);
        # else a recompute or copy logged now; else a recompute logged later
        # (it takes its outputs before it queues for compute); else a copy
        # logged later (it took its bytes before it queued for its lane)
        due = [(1, s, 1, o) for s, r, o in zip(self.start_t[p : q + 1], self.ready_t[p : q + 1],
               ops, strict=True) if r <= t + eps]  # fmt: skip
        events = due + [
            (2 if h[0] <= t + eps else 3 if h[3] == "recompute" else 4, h[0], 0, h)
            for h in self.hints[lo:hi]
        ]
        events.sort(key=lambda e: e[:3])
        found = next(self._match(events, free), None)
        if found is None:
            found = next(
                (
                    (b, -1, "persistent" if b in self.persistent else "input")
                    for b in self.by_key.get(key, ())
                    if b in self.start and free(b)
                ),
                None,
            )
        if found is None:
            later = self.hints[hi : hi + 64]
            found = next(((b, op, why) for _t, b, op, why in later if free(b)), None)
        b, op, why = found if found is not None else (-1, nxt, "workspace")
        if why == "persistent":
            it = 0
        a = Allocation(token, t, self.job, n, b, op, it, why)
        self.live.setdefault(key, []).append(a)
        if b >= 0:
            self.live_b.add(b)
        return a

    def _match(self, events: list, free):  # noqa: ANN001, ANN202
        creates = self.table.creates
        for _rank, _t, code, x in events:
            if code == 0:
                if free(x[1]):
                    yield x[1:]
            else:
                yield from ((b, x[0], "create") for b in creates[x[0]] if free(b))

    def _free_of(self, key: tuple[int, int]):  # noqa: ANN202
        key_of, live_b = self.key, self.live_b
        return lambda b: b >= 0 and key_of[b] == key and b not in live_b

    def give_back(self, t: float, kind: int, n: int) -> Allocation | None:
        """The allocation the change frees; None if none of that kind and size
        is live. Among several the simulator frees at one instant, the one it
        frees first: an allocator model's blocks depend on the order."""
        live = self.live.get((kind, n))
        if not live:
            return None
        eps = _eps(t)
        # ops that ended now (zero-length ops end at the same instant): their
        # workspaces, then the framework's frees, in order; then what the log
        # names; then what a recompute made for itself; then the frees of the
        # op that ended last before
        hi = bisect.bisect_right(self.end_t, t + eps)
        lo = bisect.bisect_left(self.end_t, t - eps)
        ended = self.end_op[lo:hi]
        order = [b for op in ended for b in self.table.frees[op]]
        order += self.free_b[
            bisect.bisect_left(self.free_t, t - eps) : bisect.bisect_right(self.free_t, t + eps)
        ]
        where = {a.buffer: i for i, a in enumerate(live)}
        pick = next((i for i, a in enumerate(live) if a.why == "workspace" and a.op in ended), None)
        if pick is None:  # (a copy out still reading a buffer frees it when it ends)
            pick = next((where[b] for b in order if b in where and not self._copied(b, t)), None)
        if pick is None:  # what a recompute ending now made for itself, oldest first
            remade = set(
                self.remat_b[
                    bisect.bisect_left(self.remat_t, t - eps) : bisect.bisect_right(
                        self.remat_t, t + eps
                    )
                ]
            )
            pick = next(
                (
                    i
                    for i, a in enumerate(live)
                    if a.why == "recompute" and a.buffer in remade and not self._copied(a.buffer, t)
                ),
                None,
            )
        if pick is None and not ended and hi:  # a free the framework put off (a copy ran)
            pick = next(
                (where[b] for b in self.table.frees[self.end_op[hi - 1]] if b in where), None
            )
        if pick is None:  # an op's workspace goes when the op ends
            pick = next((i for i, a in enumerate(live) if a.why == "workspace"), None)
        if pick is None and t >= self.end_us - eps:  # the job ends: buffer by buffer
            pick = min(range(len(live)), key=lambda i: (live[i].buffer < 0, live[i].buffer))
        a = live.pop(len(live) - 1 if pick is None else pick)
        self.live_b.discard(a.buffer)
        return a


def _changes(result: SimResult) -> Iterator[tuple[float, int, int, int]]:
    """(t_us, job, kind, +/- bytes) per change of the memory curve, in order."""
    m = result.memory
    if not len(m.t_s):
        return
    dj = np.diff(m.by_job, axis=0, prepend=np.zeros((1, m.by_job.shape[1]), np.int64))
    dk = np.diff(m.by_kind, axis=0, prepend=np.zeros((1, m.by_kind.shape[1]), np.int64))
    delta = dj.sum(axis=1)
    rows = np.flatnonzero(delta)
    job = np.argmax(dj[rows] != 0, axis=1)
    kind = np.argmax(dk[rows] != 0, axis=1)
    t_us = m.t_s[rows] * 1e6
    yield from zip(t_us.tolist(), job.tolist(), kind.tolist(), delta[rows].tolist(), strict=True)


def allocations(result: SimResult, at_end: bool = True) -> list[MemEvent]:
    """Every allocation, free and OOM of the simulation, and the jobs'
    contexts, in time order, labelled as
    NOTE [ Which buffer a memory change is ] says; with `at_end` up to the
    snapshot's time (NOTE [ Snapshot time ]), else to the end."""
    by_job: list[list] = [[] for _ in result.jobs]
    for e in result.log:
        by_job[e.job].append(e)
    ends = [j.end_s * 1e6 for j in result.jobs]
    labels = [_JobLabels(j, t, by_job[j], ends[j]) for j, t in enumerate(result.traces)]
    makespan_us = result.makespan_s * 1e6
    stays = {
        j.index
        for j in result.jobs
        if at_end and not j.oom and abs(ends[j.index] - makespan_us) <= _eps(makespan_us)
    }
    ooms = sorted((e.t_us, e.job, e.buffer) for e in result.log if e.kind is K.OOM)
    ctx, held, seen = result.context_reserve_bytes, set(), set()
    events: list[MemEvent] = []
    token = 0
    for t, j, kind, delta in _changes(result):
        # an OOM goes before the frees of its job's end (NOTE [ Snapshot format ])
        while ooms and (
            ooms[0][0] < t - _eps(t)
            or (ooms[0][0] <= t + _eps(t) and delta < 0 and j == ooms[0][1])
        ):
            events.append(_oom(ooms.pop(0), result))
        first, leaving = j not in seen, t >= ends[j] - _eps(t) and j not in stays
        seen.add(j)
        if ctx and kind == OTHER and abs(delta) == ctx and (first if delta > 0 else j in held):
            # the job's CUDA context: its first bytes and its last (sim/memory.py)
            if delta < 0 and not leaving:
                continue  # still held when the snapshot is taken
            held.symmetric_difference_update({j})
            a = Allocation(-1, t, j, ctx, -1, -1, 0, "context")
            events.append(MemEvent(t, "context" if delta > 0 else "context_end", a))
            continue
        lab = labels[j]
        if delta > 0:
            events.append(MemEvent(t, "alloc", lab.take(token, t, kind, delta)))
            token += 1
            continue
        a = lab.give_back(t, kind, -delta)
        if a is None:  # a model bug: bytes given back that were never taken
            raise RuntimeError(f"job {j} gives back {-delta} bytes of kind {kind} it never took")
        if j in stays and a.buffer in lab.persistent and t >= makespan_us - _eps(t):
            continue  # still allocated when the snapshot is taken
        events.append(MemEvent(t, "free", a, leaving))
    events += [_oom(o, result) for o in ooms]
    return _with_arrivals(events, result)


# NOTE [ Copies in flight ]
# The bytes a swap-in or fetch takes belong to no buffer until its copy
# ends and the buffer stays: the simulator's allocator models (sim/ledger.py
# NOTE [ One process per job ]) hold them as a loose block of the job and
# hand the buffer the job's most recent loose block of that size when it
# arrives (an `arrive` event, at the end of its copy), and a copy that ends
# with no buffer to stay frees the most recent one. Among several copies of
# one size in flight, that may be another copy's block: a snapshot follows
# the same blocks, so its addresses and segments are the simulation's.
_ARRIVES = (K.SWAP_IN_END, K.FETCH_END)


def _with_arrivals(events: list[MemEvent], result: SimResult) -> list[MemEvent]:
    """`events` with an `arrive` at the end of each copy's transfer, before
    what happens at that instant (NOTE [ Copies in flight ])."""
    ends: dict[tuple[int, int], list[float]] = {}
    for e in result.log:
        if e.kind in _ARRIVES:
            ends.setdefault((e.job, e.buffer), []).append(e.t_us)
    arrivals = []
    for ev in events:
        a = ev.alloc
        if ev.action == "alloc" and a.why in ("swap_in", "fetch"):
            times = ends.get((a.job, a.buffer), [])
            k = bisect.bisect_left(times, a.t_us - _eps(a.t_us))
            if k < len(times):
                arrivals.append(MemEvent(times[k], "arrive", a))
    if not arrivals:
        return events
    arrivals.sort(key=lambda ev: ev.t_us)
    out, k = [], 0
    for ev in events:
        while k < len(arrivals) and arrivals[k].t_us <= ev.t_us + _eps(ev.t_us):
            out.append(arrivals[k])
            k += 1
        out.append(ev)
    return out + arrivals[k:]


def as_blocks(events: list[MemEvent]) -> list[MemEvent]:
    """`events` as the allocator models see them (NOTE [ Copies in flight ]):
    each free names the allocation whose bytes it gives back -- its own, or
    the copy's block its buffer was handed -- and `arrive` events are gone."""
    loose: dict[tuple[int, int], list[Allocation]] = {}
    holds: dict[int, Allocation | None] = {}  # token -> the block it holds (None: loose)
    out = []
    for ev in events:
        a = ev.alloc
        if ev.action == "alloc":
            copy = a.why in ("swap_in", "fetch")
            if copy:
                loose.setdefault((a.job, a.nbytes), []).append(a)
            holds[a.token] = None if copy else a
        elif ev.action == "arrive":
            if a.token in holds and holds[a.token] is None:
                holds[a.token] = loose[(a.job, a.nbytes)].pop()
            continue
        elif ev.action == "free":
            block = holds.pop(a.token)
            if block is None:  # its copy never arrived: the job's last loose block
                block = loose[(a.job, a.nbytes)].pop()
            ev = ev._replace(alloc=block)
        out.append(ev)
    return out


def _oom(o: tuple[float, int, int], result: SimResult) -> MemEvent:
    t, j, b = o
    n = int(result.traces[j].nbytes[b]) if b >= 0 else 0
    return MemEvent(t, "oom", Allocation(-1, t, j, n, b, -1, 0, "oom"))
