"""Tiny hand-built traces and an independent brute-force planner for them.

`tiny_trace` builds a `Trace` from a compact op list (sizes in MiB, durations
in ms); `tiny_hw` is a device whose lane moves 1 MiB per ms each way, so
every copy and op takes a whole number of ms and results work out by hand.

`brute_force` enumerates every keep / swap / recompute choice of every gap,
every order of the copies on the lane and every op after which each swap-in
may start, times each combination as early as it can run (ops never idle, a
copy starts when its trigger has passed and the copy before it on the lane has
ended), checks memory op window by op window and returns the best iteration
time. It shares no code with `planners.cpsat`: it re-derives gaps, host-copy
epochs, recompute rules and memory from the trace, following the rules of
NOTE [ CP-SAT semantics ] (closed op windows with a 1-tick margin, no
cross-iteration swap-in may stall). A persistent buffer may be swapped out
after its last access and in for the next iteration's first (`cross`), and
with `heads` also out after the iteration starts and in before its first
access (`head`, as an input), not both. A recomputed gap re-runs its producer
before any op r of the gap after its first hot op (its own access, or an
earlier op where a recomputation reads it: NOTE [ Recompute chains ]), with
every source present at r (accessed there, or kept, or recomputed no later).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.profile import Hardware
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View

MiB = 1 << 20
MS = 1_000_000  # ticks (ns) per ms
MARGIN = 1


def tiny_hw(*, lanes_bw_mib_per_ms: float = 1.0, memory_mib: int = 1024) -> Hardware:
    """A device whose copies move `lanes_bw_mib_per_ms` MiB per ms, no fixed cost."""
    bw = lanes_bw_mib_per_ms * MiB * 1000
    return Hardware(
        name="tiny",
        memory_bytes=memory_mib * MiB,
        h2d_bytes_per_s=bw,
        d2h_bytes_per_s=bw,
        transfer_fixed_s=0.0,
        copy_engines=2,
        h2d_duplex_factor=1.0,
        peak_flops={"float32": 1e12},
        mem_bw_bytes_per_s=1e12,
        launch_overhead_s=0.0,
    )


@dataclass(frozen=True, slots=True)
class B:
    """A buffer spec: size in MiB; `kind` "act", "param" (persistent) or "input"."""

    mib: int
    kind: str = "act"


@dataclass(frozen=True, slots=True)
class Step:
    """An op spec: buffer ids read and written, duration in ms."""

    reads: tuple[int, ...]
    writes: tuple[int, ...]
    ms: int = 1
    rng: bool = False


def tiny_trace(buffers: list[B], ops: list[Step], name: str = "tiny") -> Trace:
    """A trace with one view per buffer; activations are freed after their last access."""
    n = len(ops)
    last = [-1] * len(buffers)
    for i, op in enumerate(ops):
        for b in (*op.reads, *op.writes):
            last[b] = i
    kinds = {"act": BufferKind.ACTIVATION, "param": BufferKind.PARAM, "input": BufferKind.INPUT}
    bufs = []
    for i, spec in enumerate(buffers):
        persistent = spec.kind == "param"
        freed = None if persistent else (n - 1 if spec.kind == "input" else last[i])
        bufs.append(Buffer(i, spec.mib * MiB, kinds[spec.kind], persistent, f"b{i}", freed))
    views = tuple(
        View(i, i, (spec.mib * MiB // 4,), (1,), 0, "float32") for i, spec in enumerate(buffers)
    )
    trace_ops = tuple(
        Op(
            i,
            "aten.fake.default",
            Phase.FORWARD,
            op.reads,
            op.writes,
            {},
            0,
            op.ms * 1000.0,
            rng=op.rng,
        )
        for i, op in enumerate(ops)
    )
    return Trace(TraceMeta(name, 1), tuple(bufs), views, trace_ops)


def durations_s(trace: Trace) -> list[float]:
    return [op.duration_us * 1e-6 for op in trace.ops]


# ---- random tiny graphs ------------------------------------------------------------------
def random_tiny(
    seed: int,
    n_ops: int = 7,
    n_buffers: int = 6,
    max_gaps: int = 4,
    max_reads: int = 2,
    *,
    update_early: bool = False,
) -> tuple[Trace, int]:
    """(trace, budget bytes): a random step of `n_ops` ops over `n_buffers`
    buffers -- an input, sometimes a parameter that the last op updates in
    place (`update_early`: always one, updated by an op in the middle, so
    ops after it may find it gone until the next iteration), activations
    each made by one op and read by later ones -- with a budget a few MiB
    under its release-only peak (not under its peak lower bound) that
    leaves 1..`max_gaps` gaps to decide."""
    for sub in itertools.count():
        rng = np.random.default_rng([seed, sub])
        trace, budget = _draw(rng, seed, n_ops, n_buffers, max_reads, update_early)
        acc = [trace.accesses_of(b).tolist() for b in range(trace.n_buffers)]
        writes = [set(_bufs(trace, op.writes)) for op in trace.ops]
        mem0 = _mem0(trace, acc)
        hot = [k for k in range(trace.n_ops) if mem0[k] > budget]
        if 1 <= len(_gaps(trace, acc, writes, hot)) <= max_gaps:
            return trace, budget
    raise AssertionError("unreachable")


def _draw(
    rng: np.random.Generator,
    seed: int,
    n_ops: int,
    n_buffers: int,
    max_reads: int,
    update_early: bool = False,
) -> tuple[Trace, int]:
    bufs: list[B] = [B(int(rng.integers(1, 4)), "input")]
    has_param = update_early or bool(rng.random() < 0.5)
    update = int(rng.integers(1, n_ops - 2)) if update_early else n_ops - 1
    if has_param:
        bufs.append(B(int(rng.integers(1, 3)), "param"))
    n_acts = min(n_buffers - len(bufs), n_ops - 1)
    bufs += [B(int(rng.integers(1, 5))) for _ in range(n_acts)]
    acts = list(range(len(bufs) - n_acts, len(bufs)))
    # which ops produce: the first op, then a random subset keeping order
    producer_slots = sorted(
        [0, *rng.choice(np.arange(1, n_ops), n_acts - 1, replace=False).tolist()]
    )
    ops: list[Step] = []
    ready = [0, 1] if has_param else [0]
    made = iter(acts)
    for i in range(n_ops):
        k = int(rng.integers(1, max_reads + 1))
        reads = tuple(
            sorted({int(x) for x in rng.choice(ready, size=min(k, len(ready)), replace=False)})
        )
        ms = int(rng.integers(1, 4))
        if i in producer_slots:
            b = next(made)
            ops.append(Step(reads, (b,), ms, bool(rng.random() < 0.15)))
            ready.append(b)
        elif has_param and i == update:
            ops.append(Step(tuple(sorted({*reads, 1})), (1,), ms))  # an in-place update
        else:
            ops.append(Step(reads, (), ms))
    trace = tiny_trace(bufs, ops, f"tiny{seed}")
    live = trace.memory_curve("liveness")
    lo = peak_floor(trace)
    hi = int(live.max())
    budget = hi - int(rng.integers(1, 4)) * MiB  # a few MiB under the release-only peak
    return trace, max(budget, lo)


def peak_floor(trace: Trace) -> int:
    """The largest working set, or the bytes resident at the iteration start."""
    p, bb = trace.access_csr
    ws = max(int(trace.nbytes[bb[p[i] : p[i + 1]]].sum()) for i in range(trace.n_ops))
    start = int(trace.nbytes[trace.exists_at_start & (trace.last_access >= 0)].sum())
    return max(ws, start, int(trace.nbytes[trace.persistent].sum()))


# ---- the enumerator ------------------------------------------------------------------------
KEEP, SWAP, REC = "keep", "swap", "rec"


@dataclass(frozen=True, slots=True)
class _Gap:
    buffer: int
    kind: str  # head / within / cross
    a: int
    c: int
    inner: tuple[int, ...]  # hot ops where it may be absent
    lo: int  # first op of its interior
    hi: int  # last op of its interior
    rec_op: int
    rec_srcs: tuple[int, ...]  # buffers the producer reads
    rec_at: tuple[int, ...]  # ops before which it may be recomputed
    rec_temps: int = 0  # bytes of the producer's other outputs, made while it re-runs


def rec_point(mode: str) -> int | None:
    """The op of a "rec@R" mode, None for keep and swap."""
    return int(mode[4:]) if mode.startswith("rec@") else None


@dataclass(frozen=True, slots=True)
class BruteResult:
    iteration_ticks: int | None  # None: no plan fits
    modes: tuple[str, ...]
    evaluated: int


def brute_force(
    trace: Trace, d_ticks: list[int], io_ticks: list[int], budget: int, *, heads: bool = False
) -> BruteResult:
    """The best iteration time (ticks) over every choice; `io_ticks[b]` is one
    copy of buffer b (both directions cost the same on `tiny_hw`). With
    `heads`, a persistent buffer may also be off before its first access
    (as NOTE [ CP-SAT semantics ] does not let it be)."""
    n = trace.n_ops
    acc = [
        [i for i, op in enumerate(trace.ops) if b in _touch(trace, op)]
        for b in range(trace.n_buffers)
    ]
    writes = [set(_bufs(trace, op.writes)) for op in trace.ops]
    mem0 = _mem0(trace, acc)
    hot = [k for k in range(n) if mem0[k] > budget]
    gaps = _gaps(trace, acc, writes, hot, heads)
    choices = []
    for g in gaps:
        choices.append([KEEP, SWAP] + [f"{REC}@{r}" for r in g.rec_at])

    def rec_ticks(ms: tuple[str, ...]) -> int:
        return sum(d_ticks[g.rec_op] for g, m in zip(gaps, ms) if rec_point(m) is not None)

    best: tuple[int, tuple[str, ...]] | None = None
    evaluated = 0
    combos = sorted(itertools.product(*choices), key=rec_ticks)
    for modes in combos:
        lb = sum(d_ticks) + rec_ticks(modes)
        if best is not None and (lb >= best[0] or best[0] == sum(d_ticks)):
            continue
        if not _modes_ok(gaps, modes, mem0, hot, budget, trace):
            continue
        t, k = _best_timing(
            trace, gaps, modes, acc, writes, mem0, hot, budget, d_ticks, io_ticks, best
        )
        evaluated += k
        if t is not None and (best is None or t < best[0]):
            best = (t, modes)
    if best is None:
        return BruteResult(None, (), evaluated)
    return BruteResult(best[0], best[1], evaluated)


def _bufs(trace: Trace, views: tuple[int, ...]) -> list[int]:
    return sorted({trace.views[v].buffer for v in views})


def _touch(trace: Trace, op: Op) -> set[int]:
    return set(_bufs(trace, op.reads)) | set(_bufs(trace, op.writes))


def _mem0(trace: Trace, acc: list[list[int]]) -> list[int]:
    n = trace.n_ops
    mem = [0] * n
    for b, buf in enumerate(trace.buffers):
        if not acc[b] and not buf.persistent:
            continue
        first = 0 if (buf.persistent or buf.kind is BufferKind.INPUT) else acc[b][0]
        last = n - 1 if buf.persistent else acc[b][-1]
        for k in range(first, last + 1):
            mem[k] += buf.nbytes
    return mem


def _gaps(
    trace: Trace, acc: list[list[int]], writes: list[set[int]], hot: list[int], heads: bool = False
) -> list[_Gap]:
    n = trace.n_ops
    raw: list[tuple[int, str, int, int, range]] = []
    for b, buf in enumerate(trace.buffers):
        a_ = acc[b]
        if not a_:
            continue
        if (buf.kind is BufferKind.INPUT or (heads and buf.persistent)) and a_[0] >= 2:
            # out after the iteration starts (a persistent buffer is resident
            # then, written by the previous iteration), back before its first
            raw.append((b, "head", -1, a_[0], range(1, a_[0])))
        for a, c in zip(a_, a_[1:]):
            if c - a >= 2:
                raw.append((b, "within", a, c, range(a + 1, c)))
        if buf.persistent and a_[-1] <= n - 2:
            raw.append((b, "cross", a_[-1], a_[0], range(a_[-1] + 1, n)))
    out = []
    for b, kind, a, c, inner in raw:
        hot_inner = tuple(k for k in inner if k in hot)
        if not hot_inner:
            continue
        rec_op, srcs_ok = -1, ()
        buf = trace.buffers[b]
        if kind == "within" and not buf.persistent and buf.kind is not BufferKind.INPUT:
            p = acc[b][0]
            op = trace.ops[p]
            srcs = _bufs(trace, op.reads)
            ok = not op.rng and not writes[p] & set(srcs)
            ok = ok and not any(trace.buffers[w].persistent for w in writes[p])
            ok = ok and not any(b in writes[k] for k in acc[b] if p < k < c)
            for s in srcs if ok else []:
                s_acc = acc[s]
                if (
                    not trace.buffers[s].persistent
                    and s_acc[-1] < c
                    or any(s in writes[k] for k in s_acc if p < k < c)
                ):
                    ok = False
            if ok:
                rec_op, srcs_ok = p, tuple(srcs)
        # its own access, or any op after its first hot op (where a chain may pull it)
        points = (*range(hot_inner[0] + 1, c), c) if rec_op >= 0 else ()
        temps = sum(trace.buffers[w].nbytes for w in writes[rec_op] - {b}) if rec_op >= 0 else 0
        out.append(
            _Gap(b, kind, a, c, hot_inner, inner[0], inner[-1], rec_op, srcs_ok, points, temps)
        )
    return out


def _gap_at(gaps: list[_Gap], b: int, k: int) -> int | None:
    """The gap (index) of buffer b whose interior holds op k, if it has one."""
    for j, g in enumerate(gaps):
        if g.buffer == b and g.lo <= k <= g.hi:
            return j
    return None


def _modes_ok(gaps, modes, mem0, hot, budget, trace) -> bool:
    """Memory with every swap absent at all its hot ops, every recompute
    source present where it runs, and an early recompute read by another;
    a persistent buffer swapped before its first access is not also swapped
    after its last (it must be resident when the iteration starts)."""
    acc = [trace.accesses_of(b).tolist() for b in range(trace.n_buffers)]
    swapped = {(g.buffer, g.kind) for g, m in zip(gaps, modes) if m == SWAP}
    if any((b, "cross") in swapped for b, kind in swapped if kind == "head"):
        return False
    for g, m in zip(gaps, modes):
        r = rec_point(m)
        if r is None:
            continue
        for s in g.rec_srcs:
            j = None if r in acc[s] else _gap_at(gaps, s, r)
            if j is None:
                continue  # accessed at r, or in a gap with no decision: resident
            rs = rec_point(modes[j])
            if modes[j] == SWAP or (rs is not None and rs > r):
                return False
        if r < g.c and not any(
            rec_point(mh) == r and g.buffer in h.rec_srcs for h, mh in zip(gaps, modes)
        ):
            return False  # nothing would trigger it: still absent at c
    for k in hot:
        free = sum(
            trace.buffers[g.buffer].nbytes
            for g, m in zip(gaps, modes)
            if k in g.inner and (m == SWAP or (rec_point(m) or -1) > k)
        )
        if mem0[k] - free > budget:
            return False
    return True


def _copies(gaps, modes, acc, writes) -> dict[int, bool]:
    """Per swapped gap: does it need a D2H copy (no earlier swap of the same
    write epoch in this iteration left a valid host copy)?"""
    swaps = [i for i, m in enumerate(modes) if m == SWAP]
    out = {}
    for i in swaps:
        g = gaps[i]
        out[i] = not any(
            gaps[j].buffer == g.buffer
            and gaps[j].kind != "cross"
            and gaps[j].c <= g.a
            and not any(g.buffer in writes[k] for k in acc[g.buffer] if gaps[j].c <= k <= g.a)
            for j in swaps
            if j < i
        )
    return out


def _best_timing(trace, gaps, modes, acc, writes, mem0, hot, budget, d, io, best):
    """(best iteration ticks or None, combinations tried) for fixed modes."""
    swaps = [i for i, m in enumerate(modes) if m == SWAP]
    recs = [(i, rec_point(m)) for i, m in enumerate(modes) if rec_point(m) is not None]
    copy = _copies(gaps, modes, acc, writes)
    rec_at = [0] * trace.n_ops
    for i, r in recs:
        rec_at[r] += d[gaps[i].rec_op]
    lb = sum(d) + sum(rec_at)
    placements = [
        [False, True] if gaps[i].kind == "cross" and gaps[i].c >= 1 else [False] for i in swaps
    ]
    q_opts = [list(gaps[i].inner) for i in swaps]
    # a persistent buffer's copy-out may be waited for where it follows the
    # iteration's start (`head`), not the last access (`cross`)
    wait_opts = [
        [False, True]
        if copy[i] and (gaps[i].kind == "head" or not trace.buffers[gaps[i].buffer].persistent)
        else [False]
        for i in swaps
    ]
    found: int | None = None
    tried = 0
    bound = best[0] if best is not None else None
    no_wait = dict.fromkeys(swaps, False)
    for nxt in itertools.product(*placements):
        nxt_of = dict(zip(swaps, nxt))
        transfers = [("out", i) for i in swaps if copy[i]] + [("in", i) for i in swaps]
        for order in itertools.permutations(transfers):
            pos = {t: p for p, t in enumerate(order)}
            if any(copy[i] and not nxt_of[i] and pos[("out", i)] > pos[("in", i)] for i in swaps):
                continue
            for qs in itertools.product(
                *[[None] if nxt_of[i] else q for i, q in zip(swaps, q_opts)]
            ):
                args = [trace, gaps, swaps, recs, copy, nxt_of, no_wait, dict(zip(swaps, qs))]
                args += [order, rec_at, mem0, hot, budget, d, io]
                # waits only delay: no better than the timing without them
                t0 = _evaluate(*args, memory=False)
                if t0 is None or (found is not None and t0 >= found):
                    continue
                for waits in itertools.product(*wait_opts):
                    tried += 1
                    args[6] = dict(zip(swaps, waits))
                    t = _evaluate(*args)
                    if t is not None and (found is None or t < found):
                        found = t
                        if t == lb:
                            return found, tried
        if bound is not None and found is not None and found <= lb:
            break
    return found, tried


def _evaluate(
    trace, gaps, swaps, recs, copy, nxt, waits, q, order, rec_at, mem0, hot, budget, d, io,
    memory=True,
):  # fmt: skip
    """Iteration ticks of the earliest schedule with this lane order, or None
    (with `memory=False`, of its timing alone). A swap that `waits` has its
    first hot op wait for its copy-out, and must then be absent there; while
    that op waits its outputs are not made yet."""
    n = trace.n_ops
    m = MARGIN
    end = list(itertools.accumulate(d))
    start = {t: 0 for t in order}
    horizon = sum(d) + sum(rec_at) + 4 * sum(io[gaps[i].buffer] for i in swaps) + 100
    for _ in range(4 * (len(order) + 2)):
        # the lane, in order, each copy as early as its trigger allows
        lane, changed = 0, False
        for t in order:
            kind, i = t
            g, dur = gaps[i], io[gaps[i].buffer]
            e_a = end[g.a] if g.a >= 0 else 0
            if kind == "out":
                rel = e_a
            elif nxt[i]:
                rel = m  # frame-local: the next iteration's start plus the margin
            else:
                rel = end[q[i]] + m
                rel = max(rel, start[("out", i)] + dur if copy[i] else e_a)
            s = max(lane, rel)
            if s != start[t]:
                start[t], changed = s, True
            lane = s + dur
        # the ops, never idle, waiting for their swap-ins
        due = [0] * n
        for i in swaps:
            g = gaps[i]
            if g.kind != "cross":
                due[g.c] = max(due[g.c], start[("in", i)] + io[g.buffer])
            if waits[i]:  # its first hot op starts when the copy-out has ended
                k0 = g.inner[0]
                due[k0] = max(due[k0], start[("out", i)] + io[g.buffer])
        prev = 0
        for k in range(n):
            e = max(prev, due[k]) + rec_at[k] + d[k]
            if e != end[k]:
                end[k], changed = e, True
            prev = e
        if not changed:
            break
        if end[-1] > horizon:
            return None
    else:
        return None
    T = end[-1]
    if not memory:
        return T
    # cross-iteration swap-ins: done before their op's ready time, never stalling it
    frame = [
        (start[t], start[t] + io[gaps[t[1]].buffer])
        for t in order
        if not (t[0] == "in" and nxt[t[1]])
    ]
    for i in swaps:
        g = gaps[i]
        if g.kind != "cross":
            continue
        e_prev = end[g.c - 1] if g.c >= 1 else 0
        s_in = start[("in", i)]
        if nxt[i]:
            if s_in + io[g.buffer] > e_prev:
                return None
        else:
            if s_in + io[g.buffer] > T + e_prev:
                return None
            lo, hi = s_in - T, s_in + io[g.buffer] - T  # the part that wraps into the next frame
            if hi > 0 and any(
                a < hi and lo < b for a, b in frame if (a, b) != (s_in, s_in + io[g.buffer])
            ):
                return None
    # memory, op window by op window
    absent_somewhere = dict.fromkeys(swaps, False)
    freed: dict[int, int] = {}
    for k in hot:
        free = 0
        for i, g in enumerate(gaps):
            if k not in g.inner:
                continue
            mode = "swap" if i in absent_somewhere else None
            if mode is None:
                continue
            s_in = start[("in", i)] + (T if nxt[i] else 0)
            out_ok = (start[("out", i)] + io[g.buffer] + m <= end[k - 1]) if copy[i] else True
            out_ok = out_ok or (waits[i] and k == g.inner[0])  # k waited for the copy
            if out_ok and s_in >= end[k] + m:
                free += trace.buffers[g.buffer].nbytes
                absent_somewhere[i] = True
            elif waits[i] and k == g.inner[0]:
                return None  # waited for, yet back by then
        free += sum(
            trace.buffers[gaps[i].buffer].nbytes for i, r in recs if k in gaps[i].inner and k < r
        )
        if mem0[k] - free > budget:
            return None
        freed[k] = free
    if not all(absent_somewhere.values()):
        return None
    for i, r in recs:  # a producer's other outputs, while it re-runs before r
        temps = sum(gaps[j].rec_temps for j, q in recs if q == r)
        if gaps[i].rec_temps and mem0[r] - freed.get(r, 0) + temps > budget:
            return None
    return T if _waits_fit(trace, gaps, swaps, waits, mem0, freed, budget) else None


def _waits_fit(trace, gaps, swaps, waits, mem0, freed, budget) -> bool:
    """Each op that waits for copy-outs fits while it waits: the buffers it
    waits for are still there, its new outputs not yet."""
    back: dict[int, int] = {}
    for i in swaps:
        if waits[i]:
            k0 = gaps[i].inner[0]
            back[k0] = back.get(k0, 0) + trace.buffers[gaps[i].buffer].nbytes
    for k0, extra in back.items():
        made = sum(
            b.nbytes
            for b in trace.buffers
            if not b.persistent
            and b.kind is not BufferKind.INPUT
            and trace.accesses_of(b.id).tolist()[:1] == [k0]
        )
        if mem0[k0] - made - freed[k0] + extra > budget:
            return False
    return True
