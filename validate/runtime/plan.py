"""A plan as a PyTorch runtime sees it: decisions about the tensors autograd
saves, keyed by what capture recorded (module path and pack order), and
the modules to checkpoint selectively, and the training state's moves
(`validate.runtime.moments`). `export` builds one from a `Plan` and its
`Trace`; `validate.runtime.io` reads and writes them as JSON with
``"schema": "memplan.runtime/2"``."""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut, describe, validate
from memplan.traces.model import Phase, Trace
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.moments import STATE_KINDS, StateSwap, state_swaps

# NOTE [ From plan events to saved tensors ]
# User code cannot act "after op 12"; it sees autograd's saved tensors (pack hooks in
# forward, in `Trace.saved` order; unpack hooks in backward). Per buffer a saved tensor holds:
# - offload: a `SwapOut` after a forward op and a `SwapIn` before a backward op. Each saved
#   tensor holding the buffer is copied to the host when packed; the prefetch starts at the
#   unpack of the first visible saved tensor read after the swap-in's `after_op`, else the
#   last one before it (`prefetch_after`; none: fetched when unpacked). A swap-out's deadline
#   has no counterpart: no user-code moment waits for an offload.
# - recompute: a forward `Release` with a backward `Recompute` of forward ops, done by
#   selective activation checkpointing of a *region* (a module with a forward, not the root:
#   the innermost enclosing the ops and the modules whose saved tensors hold the buffer, else
#   the ops alone; nested regions merge). Plan ops PREFER_RECOMPUTE, the rest MUST_SAVE;
#   ops are matched at run time by invocation, module, target and occurrence; the set is
#   closed as NOTE [ Closing the recompute set ] says.
# - parameters, gradients, optimizer state: NOTE [ From plan events to moments ].
# - everything else is listed in `skipped` with the reason. Full text: docs/notes.md.

# NOTE [ Closing the recompute set ]
# Checkpoint replays a region in backward from its inputs, taking each op's output from the
# cache or running it again; the ops to recompute are closed (per invocation) so the replay
# computes the same values:
# - in-place chains are all or nothing: an op writing a buffer brings every writer of it;
# - a recomputed op that read a buffer before a later in-place write brings its writers
#   (a cached tensor is its last version);
# - every random op before a recomputed one is recomputed too, so the generator, restored at
#   the region's start, advances as it did.
# Cached tensors are final versions, so `allow_cache_entry_mutation=True` is safe.
# Full text: docs/notes.md, "Closing the recompute set".


class Action(enum.Enum):
    KEEP = "keep"  # held on the device, as without a plan
    OFFLOAD = "offload"  # copied to the host when packed, prefetched before use
    RECOMPUTE = "recompute"  # packed inside a checkpointed region, recomputed in backward
    REGION = "region"  # packed inside a checkpointed region, cached by its policy


@dataclass(frozen=True, slots=True)
class SavedDecision:
    """What happens to saved tensor `index` (pack order in the step), packed
    in `module`, holding `buffer` of `nbytes` bytes."""

    index: int
    module: str
    buffer: int
    nbytes: int
    persistent: bool
    action: Action
    prefetch_after: int | None = None


@dataclass(frozen=True, slots=True)
class RecomputeOp:
    """An op to recompute: the `occurrence`-th call of `target` with
    `module` innermost, in call `invocation` of the checkpointed `region`."""

    region: str
    invocation: int
    module: str
    target: str
    occurrence: int


@dataclass(frozen=True, slots=True)
class Skipped:
    event: str
    reason: str


@dataclass(frozen=True, slots=True)
class RuntimePlan:
    trace_fingerprint: str
    model: str
    planner: str
    saved: tuple[SavedDecision, ...]
    regions: tuple[str, ...]
    recompute: tuple[RecomputeOp, ...]
    skipped: tuple[Skipped, ...]
    state: tuple[StateSwap, ...] = ()  # parameters, gradients, optimizer state moved
    host_step: tuple[str, ...] = ()  # parameters whose optimizer step runs on the host

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys((a.value for a in Action), 0)
        for d in self.saved:
            out[d.action.value] += 1
        return out

    def held_bytes(self, actions: frozenset[Action] = frozenset({Action.KEEP})) -> int:
        """Bytes of the distinct non-persistent buffers that saved tensors with
        one of `actions` hold: with KEEP, what a runtime's pack hooks hold on
        the device once the forward pass is done (before any prefetch)."""
        seen = {d.buffer: d.nbytes for d in self.saved if d.action in actions and not d.persistent}
        return sum(seen.values())


# ---- export -----------------------------------------------------------------------
def _under(module: str, region: str) -> bool:
    return region == "" or module == region or module.startswith(region + ".")


def _common(paths: list[str]) -> str:
    parts = [p.split(".") if p else [] for p in paths]
    out: list[str] = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return ".".join(out)


def _invocations(trace: Trace, region: str) -> list[list[int]]:
    """Runs of consecutive forward ops under `region`: its calls, in order."""
    runs: list[list[int]] = []
    prev = -2
    for op in trace.ops:
        if op.phase is Phase.FORWARD and op.module and _under(op.module, region):
            if op.id != prev + 1:
                runs.append([])
            runs[-1].append(op.id)
            prev = op.id
    return runs


def export(
    plan: Plan,
    trace: Trace,
    planner: str = "",
    *,
    callable_: Callable[[str], bool] | None = None,
) -> RuntimePlan:
    """The runtime decisions of `plan` for `trace` (NOTE [ From plan events to
    saved tensors ]). `callable_(path)` says whether a module has a forward
    to checkpoint (default: `assumed_callable`). Raises `PlanError` if the
    plan does not fit the trace,
    `RuntimePlanError` if the trace recorded no saved tensors or the plan
    reorders ops (NOTE [ Plans under another order ] in planners/core/plan.py)."""
    validate(plan, trace)
    if plan.order is not None and plan.order != tuple(range(trace.n_ops)):
        raise RuntimePlanError(
            f"plan for {trace.meta.model!r} runs its ops in another order (SwapAdvisor's); "
            f"a training loop runs them in autograd's order, so the runtime cannot apply it"
        )
    if not trace.saved:
        raise RuntimePlanError(
            f"trace {trace.meta.model!r} records no saved tensors: capture it again "
            f"(saved tensors are recorded since the trace format's first release)"
        )
    fwd = {op.id for op in trace.ops if op.phase is Phase.FORWARD}
    bwd = {op.id for op in trace.ops if op.phase is Phase.BACKWARD}
    saved_bufs = {trace.views[s.view].buffer for s in trace.saved}
    skipped: list[Skipped] = []
    swap_in: dict[int, SwapIn] = {}
    swap_out: dict[int, SwapOut] = {}
    released: set[int] = set()
    recomputes: list[Recompute] = []
    moves: list[SwapOut | SwapIn] = []

    def skip(ev: Any, reason: str) -> None:
        where = (
            f" after op {ev.after_op}" if hasattr(ev, "after_op") else f" before op {ev.before_op}"
        )
        skipped.append(Skipped(describe(ev) + where, reason))

    recomputed_bufs = {ev.buffer for ev in plan.events if isinstance(ev, Recompute)}
    for ev in plan.events:
        b = ev.buffer
        buf = trace.buffers[b]
        if isinstance(ev, Release) and (b not in recomputed_bufs or ev.after_op not in fwd):
            skip(
                ev, "a release after the last use: PyTorch frees a tensor when its last use is done"
            )
        elif (buf.persistent or buf.kind in STATE_KINDS) and isinstance(ev, SwapOut | SwapIn):
            moves.append(ev)
        elif buf.persistent:
            skip(ev, f"a recompute of a persistent {buf.kind.value} buffer is not covered")
        elif isinstance(ev, SwapIn) and ev.next_iteration:
            skip(ev, "cross-iteration swaps are not covered")
        elif b not in saved_bufs:
            skip(ev, "no saved tensor holds this buffer (it is moved between forward ops)")
        elif isinstance(ev, SwapOut):
            if ev.after_op in fwd and b not in swap_out:
                swap_out[b] = ev
            else:
                skip(ev, "a swap-out outside the forward pass (or a second one)")
        elif isinstance(ev, SwapIn):
            if ev.before_op in bwd and (b not in swap_in or ev.before_op < swap_in[b].before_op):
                swap_in[b] = ev
            elif ev.before_op not in bwd:
                skip(ev, "a swap-in before a forward op (the runtime prefetches for backward)")
        elif isinstance(ev, Release):
            released.add(b)
        elif isinstance(ev, Recompute):
            recomputes.append(ev)
    offloaded = set(swap_out) & set(swap_in)
    for b in sorted(set(swap_out) - offloaded):
        skip(swap_out[b], "no swap-in for the backward pass follows it")

    ok = callable_ if callable_ is not None else assumed_callable(trace)
    regions, r_ops = _regions(trace, recomputes, released, fwd, bwd, skip, ok)
    keys, recomputed = _recompute_keys(trace, regions, r_ops)
    saved = _decisions(trace, regions, offloaded, swap_in, recomputed, bwd)
    state = state_swaps(trace, moves, skip)
    return RuntimePlan(
        trace_fingerprint=plan.trace_fingerprint,
        model=trace.meta.model,
        planner=planner,
        saved=saved,
        regions=tuple(regions),
        recompute=keys,
        skipped=tuple(skipped),
        state=state,
    )


def assumed_callable(trace: Trace) -> Callable[[str], bool]:
    """Without the model: a module is taken to have a forward unless all its
    children are numbered (a ModuleList, or a Sequential) and no op of the
    trace ran in it directly."""
    own = {op.module for op in trace.ops if op.phase is Phase.FORWARD}
    children: defaultdict[str, set[str]] = defaultdict(set)
    for op in trace.ops:
        parts = op.module.split(".") if op.module else []
        for i in range(len(parts)):
            children[".".join(parts[:i])].add(parts[i])

    def ok(path: str) -> bool:
        kids = children.get(path, set())
        return path in own or not kids or not all(k.isdigit() for k in kids)

    return ok


def _regions(
    trace: Trace,
    recomputes: list[Recompute],
    released: set[int],
    fwd: set[int],
    bwd: set[int],
    skip: Any,
    callable_: Callable[[str], bool],
) -> tuple[list[str], set[int]]:
    """The checkpointed modules and the ops to recompute in them."""
    holders: defaultdict[int, set[str]] = defaultdict(set)
    for sv in trace.saved:
        holders[trace.views[sv.view].buffer].add(sv.module)
    per_event: list[tuple[str, tuple[int, ...]]] = []
    for ev in recomputes:
        mods = [trace.ops[k].module for k in ev.ops]
        if ev.before_op not in bwd or not all(k in fwd for k in ev.ops):
            skip(ev, "a recompute outside backward, or of ops outside forward")
            continue
        if ev.buffer not in released:
            skip(ev, "the buffer is never released in forward: nothing to recompute")
            continue
        if "" in mods:
            skip(
                ev, "an op outside every module (the root's own ops, the loss) is not checkpointed"
            )
            continue
        candidates = [_common(mods + sorted(holders[ev.buffer])), _common(mods)]
        region = next((r for r in candidates if r and callable_(r)), None)
        if region is None:
            skip(ev, f"its ops share no module with a forward to checkpoint ({candidates[1]!r})")
            continue
        per_event.append((region, ev.ops))
    outer = sorted({r for r, _ in per_event}, key=lambda r: (r.count("."), r))
    regions: list[str] = []
    for r in outer:
        if not any(_under(r, o) for o in regions):
            regions.append(r)
    r_ops = {k for _r, ops in per_event for k in ops}
    return sorted(regions), r_ops


def _close(trace: Trace, ops: list[int], chosen: set[int]) -> set[int]:
    """The ops to recompute in one invocation, closed under NOTE [ Closing
    the recompute set ]."""
    pos = {k: i for i, k in enumerate(ops)}
    writers: defaultdict[int, list[int]] = defaultdict(list)  # buffer -> ops writing it, in order
    for k in ops:
        for b in trace.op_writes(k):
            writers[int(b)].append(k)
    chosen = set(chosen)
    while True:
        before = len(chosen)
        for k in list(chosen):  # a buffer's writers together; newer writes of what k read
            for b in trace.op_writes(k):
                chosen.update(writers[int(b)])
            for b in trace.op_reads(k):
                if any(pos[w] > pos[k] for w in writers.get(int(b), ())):
                    chosen.update(writers[int(b)])
        last = max((pos[k] for k in chosen if trace.ops[k].rng), default=-1)
        chosen.update(k for k in ops if trace.ops[k].rng and pos[k] < last)
        if len(chosen) == before:
            return chosen


def _recompute_keys(
    trace: Trace, regions: list[str], r_ops: set[int]
) -> tuple[tuple[RecomputeOp, ...], set[int]]:
    """Run-time keys of the ops to recompute and the buffers they write."""
    keys: list[RecomputeOp] = []
    recomputed: set[int] = set()
    for region in regions:
        for j, ops in enumerate(_invocations(trace, region)):
            chosen = _close(trace, ops, {k for k in ops if k in r_ops})
            seen: defaultdict[tuple[str, str], int] = defaultdict(int)
            for k in ops:
                op = trace.ops[k]
                n = seen[(op.module, op.target)]
                seen[(op.module, op.target)] += 1
                if k in chosen:
                    keys.append(RecomputeOp(region, j, op.module, op.target, n))
                    recomputed |= {int(b) for b in trace.op_writes(k)}
    return tuple(keys), recomputed


def _pack_runs(trace: Trace) -> list[int]:
    """Per saved tensor, its run of consecutive packs in one module: the
    tensors one op saved, which autograd unpacks together."""
    runs, n = [], -1
    for i, sv in enumerate(trace.saved):
        if i == 0 or sv.module != trace.saved[i - 1].module:
            n += 1
        runs.append(n)
    return runs


def _decisions(
    trace: Trace,
    regions: list[str],
    offloaded: set[int],
    swap_in: dict[int, SwapIn],
    recomputed: set[int],
    bwd: set[int],
) -> tuple[SavedDecision, ...]:
    first_bwd: dict[int, int] = {}
    for s in trace.saved:
        b = trace.views[s.view].buffer
        acc = [int(k) for k in trace.accesses_of(b) if int(k) in bwd]
        if acc:
            first_bwd[s.index] = acc[0]
    hooked = [s for s in trace.saved if not any(_under(s.module, r) for r in regions)]
    run = _pack_runs(trace)
    out = []
    for s in trace.saved:
        b = trace.views[s.view].buffer
        buf = trace.buffers[b]
        prefetch = None
        if any(_under(s.module, r) for r in regions):
            action = Action.RECOMPUTE if b in recomputed else Action.REGION
        elif b in offloaded and not buf.persistent:
            action = Action.OFFLOAD
            ev, own = swap_in.get(b), first_bwd.get(s.index)
            if ev is not None and own is not None:
                others = [
                    t
                    for t in hooked
                    if t.index in first_bwd
                    and run[t.index] != run[s.index]
                    and trace.views[t.view].buffer != b
                ]
                after = [t for t in others if ev.after_op < first_bwd[t.index] < own]
                before = [t for t in others if first_bwd[t.index] <= ev.after_op]
                if after:
                    prefetch = min(after, key=lambda t: (first_bwd[t.index], t.index)).index
                elif before:
                    prefetch = max(before, key=lambda t: (first_bwd[t.index], -t.index)).index
        else:
            action = Action.KEEP
        out.append(
            SavedDecision(s.index, s.module, b, buf.nbytes, buf.persistent, action, prefetch)
        )
    return tuple(out)
