"""Plan semantics: what a trace does to its buffers per op, and a plan's
events indexed by when they act. The simulator (`sim/job.py`), the checker
(`planners.core.check`), the replay executor (`validate/replay/schedule.py`)
and the planners' op-grid memory (`planners.analysis.opgrid`,
`planners.analysis.queued`) all read these, so they agree on which buffers
an op needs, when the framework frees a buffer and which event acts when.

- `OpTable.of(trace)`: per op, the buffers it needs present, creates,
  writes, and those the framework frees after it; the persistent buffers and
  the iteration's inputs. Built once per trace object.
- `IndexedPlan.of(plan, trace)`: the plan's events grouped by trigger, its
  recomputes by (buffer, before_op), and the inputs it keeps from loading
  (NOTE [ Duplicate events ] for the one rule on duplicates).
- `recompute_sources(ev, trace)`: what a recompute chain reads from outside.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from memplan.planners.core.errors import PlanError
from memplan.planners.core.order import positions
from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut, describe
from memplan.traces.model import Trace

Triggered = SwapOut | SwapIn | Release

# One op's buffer ids, ascending unless said otherwise.
Ids = tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class OpTable:
    """What one iteration of a trace does to its buffers, per op `i`:

    - `accesses[i]`: every buffer op i reads or writes (what it pins);
    - `need[i]`: the accessed buffers that must be on the device when op i
      starts (`accesses[i]` minus `creates[i]`);
    - `creates[i]`: the buffers op i allocates (their first access, for a
      buffer that does not exist at the iteration's start), and
      `create_bytes[i]` their bytes;
    - `writes[i]`: the buffers op i modifies (a host copy goes stale);
    - `frees[i]`: the non-persistent buffers the framework frees right
      after op i (`Buffer.freed_after`, at the latest after the last op).

    `persistent` are the buffers that live across iterations (resident when
    the job arrives), `inputs` the non-persistent buffers allocated at every
    iteration's start, `nbytes[b]` buffer b's bytes and `kind_bytes[b]` its
    (kind index, bytes). Per-op fields are tuples indexed by op id, as the
    simulator's loop over ops reads them."""

    n_ops: int
    nbytes: tuple[int, ...]
    kind_bytes: tuple[tuple[int, int], ...]
    accesses: tuple[Ids, ...]
    need: tuple[Ids, ...]
    creates: tuple[Ids, ...]
    create_bytes: tuple[int, ...]
    writes: tuple[Ids, ...]
    frees: tuple[Ids, ...]
    persistent: Ids
    inputs: Ids

    @staticmethod
    def of(trace: Trace, order: Sequence[int] | None = None) -> OpTable:
        """The table of `trace`, built once per trace object; under an op
        `order` other than the trace's (checked by the caller), the same with
        the frees of NOTE [ Frees under another order ], built each call."""
        table = _TABLES.get(trace)
        if table is None:
            table = _TABLES[trace] = _build_table(trace)
        if order is None:
            return table
        return replace(table, frees=frees_in_order(trace, order))


_TABLES: weakref.WeakKeyDictionary[Trace, OpTable] = weakref.WeakKeyDictionary()


# NOTE [ One object per buffer id ]
# `tolist()` makes a new int object for every element, so a table built from the trace's arrays
# would hold one object per access, write, creation and free of a buffer, which the simulator's
# loop over ops reads (and reference-counts) as it goes. The table shares one int per buffer id
# (`ids`) instead, in buffer order, the order the per-buffer lists are in. Sizes likewise: the
# simulator reads `nbytes[b]` at every allocation and free, and a step repeats few sizes, so
# `nbytes` and `create_bytes` share one object per distinct value, which stays in cache.
# Measurements: docs/notes.md, "One object per buffer id".
def _build_table(t: Trace) -> OpTable:
    n = t.n_ops
    sizes: dict[int, int] = {}  # one object per size (NOTE [ One object per buffer id ])
    nbytes = tuple(sizes.setdefault(x, x) for x in t.nbytes.tolist())
    pairs: dict[tuple[int, int], tuple[int, int]] = {}  # likewise one per (kind, size)
    kind_bytes = tuple(pairs.setdefault(p, p) for p in zip(t.kind_index.tolist(), nbytes))
    ids = list(range(t.n_buffers))  # NOTE [ One object per buffer id ]
    ap, wp = t.access_csr[0].tolist(), t.writes_csr[0].tolist()
    ab, wb = ([ids[b] for b in a.tolist()] for a in (t.access_csr[1], t.writes_csr[1]))
    start = t.exists_at_start.tolist()
    persistent = t.persistent.tolist()
    creates: list[list[int]] = [[] for _ in range(n)]
    for b, c in zip(ids, t.created_at.tolist()):
        if c >= 0 and not start[b]:
            creates[c].append(b)
    frees: list[list[int]] = [[] for _ in range(n)]
    if n:
        for b, f in zip(ids, t.freed_after.tolist()):
            if not persistent[b]:
                frees[min(f, n - 1)].append(b)
    # an op's tuples are made one after another, and an op that writes just
    # what it creates shares that tuple (NOTE [ Fewer streams per op ] in sim/job.py)
    acc_of, need_of, made_of, made_bytes, writes_of, frees_of = [], [], [], [], [], []
    for i in range(n):
        a, c = tuple(ab[ap[i] : ap[i + 1]]), tuple(creates[i])
        w = tuple(wb[wp[i] : wp[i + 1]])
        acc_of.append(a)
        need_of.append(tuple(b for b in a if b not in c) if c else a)
        made_of.append(c)
        m = sum(nbytes[b] for b in c)  # bytes op i creates
        made_bytes.append(sizes.setdefault(m, m))
        writes_of.append(c if w == c else w)
        frees_of.append(tuple(frees[i]))
    return OpTable(
        n_ops=n,
        nbytes=nbytes,
        kind_bytes=kind_bytes,
        accesses=tuple(acc_of),
        need=tuple(need_of),
        creates=tuple(made_of),
        create_bytes=tuple(made_bytes),
        writes=tuple(writes_of),
        frees=tuple(frees_of),
        persistent=tuple(b for b in ids if persistent[b]),
        inputs=tuple(b for b in ids if start[b] and not persistent[b]),
    )


# NOTE [ Frees under another order ]
# `Buffer.freed_after` is what PyTorch did in the trace's order: the op after
# which the buffer's last reference went, at or after its last access. Under
# another order (Plan.order, planners/core/order.py) there is no observation,
# so the rule is: a non-persistent buffer is freed right after whichever of
# its accessing ops and its `freed_after` op comes last in the new order.
# Its last access there is when it is last needed; the `freed_after` op
# keeps a reference the framework held past the last access (a tensor kept
# by Python until that op) tied to the op that dropped it. In the trace's own
# order that op is `freed_after` itself, so an explicit identity order means
# exactly the same as none. Creation needs no rule: an allowed order keeps a
# buffer's first writer before every other access of it (NOTE [ Allowed
# orders ]), so `creates` holds under any allowed order.
def frees_in_order(trace: Trace, order: Sequence[int]) -> tuple[Ids, ...]:
    """Per op id, the non-persistent buffers the framework frees right after
    it when the ops run in `order` (NOTE [ Frees under another order ])."""
    n = trace.n_ops
    frees: list[list[int]] = [[] for _ in range(n)]
    if not n:
        return ()
    pos = positions(order)
    persistent = trace.persistent.tolist()
    freed = trace.freed_after.tolist()
    for b in range(trace.n_buffers):
        if persistent[b]:
            continue
        last = min(freed[b], n - 1)
        for k in trace.accesses_of(b).tolist():
            if pos[k] > pos[last]:
                last = k
        frees[last].append(b)
    return tuple(tuple(f) for f in frees)


def recompute_sources(ev: Recompute, trace: Trace) -> tuple[tuple[int, Ids], ...]:
    """Per chain op, the buffers it reads that no earlier op of the chain
    writes: what must be on the device when that op is re-run."""
    made: set[int] = set()
    out = []
    for k in ev.ops:
        out.append((k, tuple(int(b) for b in trace.op_reads(k) if int(b) not in made)))
        made.update(int(b) for b in trace.op_writes(k))
    return tuple(out)


class Recomputation(NamedTuple):
    """A plan's Recompute, indexed: `index` in `plan.events`; `sources` as
    `recompute_sources`; `temporaries` every other buffer its ops write (a
    chain op's outputs besides the recomputed buffer, ascending)."""

    index: int
    event: Recompute
    sources: tuple[tuple[int, Ids], ...]
    temporaries: Ids


# NOTE [ Duplicate events ]
# One rule, applied by everything that reads an `IndexedPlan`:
# - Triggered events (SwapOut, SwapIn, Release) are never merged or dropped: one trigger's
#   events act in plan order, each on the state the one before left. A second SwapOut or
#   Release of a buffer finds it gone (the simulator logs `skip`, the checker rejects the plan:
#   "buffer 3 is not on the device"); a second SwapIn finds it arriving (the simulator waits
#   for that one copy before each swap-in's `before_op`) or present (the checker: nothing to do).
# - An input released at the iteration's start (`Release(b, -1)`) is never loaded
#   (NOTE [ Iteration boundary ] in sim/model.py): such releases are `IndexedPlan.unloaded`,
#   not triggered events, and `inputs` lacks their buffers. A consumer that loads every input
#   and then releases (checker, replay) applies them with the start's other events in plan
#   order (`start_events`), so the checker rejects a second release of one input.
# - Recomputes act on demand: op i needing absent b runs the Recompute of b before i. A second
#   one for one (buffer, before_op) is a `PlanError` naming both, wherever a plan is indexed.
# Full text: docs/notes.md, "Duplicate events".


@dataclass(frozen=True, slots=True, eq=False)
class IndexedPlan:
    """A plan's events indexed by when they act (NOTE [ Duplicate events ]).

    - `triggered[k]`: (event index, event) of the SwapOuts, SwapIns and
      Releases that the end of op k - 1 triggers (`triggered[0]`: the start
      of the iteration), in plan order; the input releases of `unloaded` are
      not among them.
    - `unloaded`: (event index, Release) of the inputs released at the start
      of the iteration, which are never loaded; `inputs`: the inputs that are
      (`OpTable.inputs` without those), allocated at every iteration's start.
    - `recompute[(buffer, before_op)]`: the `Recomputation` that rebuilds the
      buffer if it is absent when op `before_op` is due; plan order.
    - `recompute_ops`: every op some recompute re-runs; `rng_ops`: those that
      consume RNG state.
    - `order`: the op ids in the order the job runs them (`plan.order`, or
      the trace's: NOTE [ Plans under another order ] in planners/core/plan.py)."""

    plan: Plan
    triggered: tuple[tuple[tuple[int, Triggered], ...], ...]
    unloaded: tuple[tuple[int, Release], ...]
    inputs: Ids
    recompute: dict[tuple[int, int], Recomputation]
    recompute_ops: frozenset[int]
    rng_ops: frozenset[int]
    order: Ids

    @staticmethod
    def of(plan: Plan, trace: Trace, table: OpTable | None = None) -> IndexedPlan:
        """Index `plan`, whose events `planners.core.plan.validate` accepts for
        `trace` (not checked here). Raises `PlanError` for a second Recompute
        of one buffer before one op. `table`, if given, is `OpTable.of(trace,
        plan.order)`."""
        table = table if table is not None else OpTable.of(trace, plan.order)
        n = table.n_ops
        inputs = set(table.inputs)
        by_trigger: dict[int, list[tuple[int, Triggered]]] = {}
        unloaded: list[tuple[int, Release]] = []
        recompute: dict[tuple[int, int], Recomputation] = {}
        ops: set[int] = set()
        for e, ev in enumerate(plan.events):
            if isinstance(ev, Recompute):
                key = (ev.buffer, ev.before_op)
                first = recompute.get(key)
                if first is not None:
                    raise PlanError(
                        f"events[{e}] ({describe(ev)}): a second recompute of buffer "
                        f"{ev.buffer} before op {ev.before_op} (also events[{first.index}])"
                    )
                recompute[key] = _recomputation(e, ev, trace)
                ops.update(ev.ops)
            elif isinstance(ev, Release) and ev.after_op == -1 and ev.buffer in inputs:
                unloaded.append((e, ev))
            else:
                by_trigger.setdefault(ev.after_op + 1, []).append((e, ev))
        triggered: list[tuple[tuple[int, Triggered], ...]] = [()] * (n + 1)
        for i, g in by_trigger.items():
            triggered[i] = tuple(g)
        gone = {ev.buffer for _e, ev in unloaded}
        rng = {k for k in ops if trace.ops[k].rng}
        return IndexedPlan(
            plan=plan,
            triggered=tuple(triggered),
            unloaded=tuple(unloaded),
            inputs=tuple(b for b in table.inputs if b not in gone),
            recompute=recompute,
            recompute_ops=frozenset(ops),
            rng_ops=frozenset(rng),
            order=plan.order if plan.order is not None else _identity(n),
        )

    def start_events(self) -> tuple[tuple[int, Triggered], ...]:
        """`triggered[0]` with the `unloaded` input releases, in plan order:
        the start's events for a consumer that loads every input first."""
        if not self.unloaded:
            return self.triggered[0]
        return tuple(sorted((*self.unloaded, *self.triggered[0]), key=lambda x: x[0]))


@functools.lru_cache(maxsize=16)
def _identity(n: int) -> Ids:
    """The trace's own order of `n` ops (one tuple shared by every plan)."""
    return tuple(range(n))


# A recompute's sources and temporaries depend on the event and the trace
# only; planners index a growing plan again and again, so they are kept per
# trace object (frozen events hash by value).
_CHAINS: weakref.WeakKeyDictionary[Trace, dict[Recompute, tuple[Any, Ids]]] = (
    weakref.WeakKeyDictionary()
)


def _recomputation(e: int, ev: Recompute, trace: Trace) -> Recomputation:
    known = _CHAINS.setdefault(trace, {})
    hit = known.get(ev)
    if hit is None:
        temps = {int(w) for k in ev.ops for w in trace.op_writes(k)} - {ev.buffer}
        hit = known[ev] = (recompute_sources(ev, trace), tuple(sorted(temps)))
    return Recomputation(e, ev, hit[0], hit[1])
