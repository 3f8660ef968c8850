"""Chen et al. 2016: sqrt(n) checkpointing.

Split the forward pass into about sqrt(n) segments, keep only the segment
boundaries, release every other activation saved for backward after its last
forward use, and recompute it in backward from the nearest kept boundary.
Like vDNN it ignores the budget (the result is infeasible when the predicted
peak still exceeds a budget given).

See NOTE [ Checkpoint boundaries ] and NOTE [ Checkpoint recomputation ].
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np
from memplan.hwmodels.device import DeviceModel
from memplan.planners.analysis import (
    Timeline,
    as_traces,
    check_budget,
    memory_of_plan,
    predict_timelines,
)
from memplan.planners.core.errors import PlanError
from memplan.planners.core.options import options_dict
from memplan.planners.core.plan import (
    Plan,
    PlanResult,
    Recompute,
    Release,
    empty_plan,
    fingerprint_of,
    fit_result,
)
from memplan.traces.model import BufferKind, Phase, Trace

_S, _T = "S", "T"


@dataclass(frozen=True, slots=True)
class CheckpointOptions:
    """`segments`: how many segments to cut the forward pass into; None =
    round(sqrt(n)) for n boundary candidates."""

    segments: int | None = None

    def __post_init__(self) -> None:
        s = self.segments
        if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 1):
            raise PlanError(f"checkpoint: segments={s!r} must be an integer >= 1 (or None)")


@dataclass(frozen=True, slots=True)
class Segmentation:
    """Boundary candidates in forward order, the kept ones, and the buffers
    to release (before any is kept back for lack of a recompute chain)."""

    candidates: tuple[int, ...]
    kept: tuple[int, ...]
    released: tuple[int, ...]


class _Tables:
    """Per-trace arrays the planner indexes (built once)."""

    def __init__(self, trace: Trace):
        n = trace.n_ops
        self.trace = trace
        self.phase = [op.phase for op in trace.ops]
        rp, rb = (a.tolist() for a in trace.reads_csr)
        wp, wb = (a.tolist() for a in trace.writes_csr)
        self.reads = [rb[rp[i] : rp[i + 1]] for i in range(n)]
        self.writes = [wb[wp[i] : wp[i + 1]] for i in range(n)]
        writers: list[list[int]] = [[] for _ in range(trace.n_buffers)]
        for i in range(n):
            for b in self.writes[i]:
                writers[b].append(i)
        self.writers = writers
        self.created = trace.created_at.tolist()
        self.freed = trace.freed_after.tolist()
        self.persistent = trace.persistent.tolist()
        inp = BufferKind.INPUT
        self.is_input = [b.kind is inp for b in trace.buffers]
        # ops whose re-run changes nothing but temporaries
        self.recomputable = [
            not any(self.persistent[b] or self.is_input[b] for b in self.writes[i])
            for i in range(n)
        ]


# NOTE [ Checkpoint boundaries ]
# - Graph: the forward dataflow graph of activations on the main path, from the first
#   forward op reading an input (source S) to what the last forward op reads (sink T, the
#   model's output). Side values (constants, masks, shifted labels) are left out with
#   parameters and inputs: as nodes they would tie every layer to S or T.
# - Candidates: the articulation points separating S from T (every later value is computed
#   from one alone), read again in backward.
# - Of n candidates and k segments (default round(sqrt(n)), at most n), number
#   floor(j * n / k), j = 1..k, is kept: the final segment, never checkpointed, is the longer.
# - Released: forward activations up to the last kept boundary before the final segment
#   that backward reads again, other than the kept boundaries and their ops' other outputs,
#   each after its last forward access. The final segment runs without checkpointing, as in
#   `checkpoint_sequential`: releasing it would lower no peak.
# - A plan predicted to peak above the framework's own peak is replaced by the empty plan
#   (stats `fallback`). Full text and the reasons: docs/notes.md, "Checkpoint boundaries".
def _forward_graph(tab: _Tables) -> tuple[nx.Graph, list[bool]]:
    """The undirected forward dataflow graph of the main path's activations
    with S and T (NOTE [ Checkpoint boundaries ]), and which buffers are its
    nodes."""
    t = tab.trace
    node = [False] * t.n_buffers
    g = nx.Graph()
    g.add_nodes_from((_S, _T))
    last: list[int] = []
    entered = False
    for i in range(t.n_ops):
        if tab.phase[i] is not Phase.FORWARD:
            continue
        reads = tab.reads[i]
        acts = [b for b in reads if node[b]]
        entry = not entered and any(tab.is_input[b] for b in reads)
        if not acts and not entry:
            continue
        entered = True
        outs = [b for b in tab.writes[i] if not tab.persistent[b] and not tab.is_input[b]]
        for w in outs:
            if not node[w]:
                node[w] = True
                g.add_node(w)
            if not acts:
                g.add_edge(_S, w)
            for r in acts:
                if r != w:
                    g.add_edge(r, w)
        if acts:
            last = acts
    for b in last:
        g.add_edge(b, _T)
    return g, node


def _cut_vertices(g: nx.Graph) -> list[int]:
    """Articulation points on every S-T path, from S to T."""
    if not nx.has_path(g, _S, _T):
        return []
    comp = g.subgraph(nx.node_connected_component(g, _S))
    cuts = set(nx.articulation_points(comp))
    tree = nx.Graph()
    home: dict[Any, Any] = {}
    for k, block in enumerate(nx.biconnected_components(comp)):
        for v in block:
            if v in cuts:
                tree.add_edge(("block", k), ("cut", v))
            else:
                home[v] = ("block", k)
    src = ("cut", _S) if _S in cuts else home[_S]
    dst = ("cut", _T) if _T in cuts else home[_T]
    if src == dst:
        return []
    path = nx.shortest_path(tree, src, dst)
    return [v for kind, v in path if kind == "cut" and v not in (_S, _T)]


def segment(trace: Trace, segments: int | None = None) -> Segmentation:
    """Boundary candidates, kept boundaries and buffers to release
    (NOTE [ Checkpoint boundaries ])."""
    return _segment(_Tables(trace), segments)


def _segment(tab: _Tables, segments: int | None) -> Segmentation:
    t = tab.trace
    g, node = _forward_graph(tab)
    last_acc = t.last_access.tolist()
    bwd_start = next((i for i, p in enumerate(tab.phase) if p is not Phase.FORWARD), t.n_ops)
    saved = [node[b] and last_acc[b] >= bwd_start for b in range(t.n_buffers)]
    cands = sorted((b for b in _cut_vertices(g) if saved[b]), key=lambda b: tab.created[b])
    n = len(cands)
    if n == 0:
        return Segmentation((), (), ())
    k = min(n, segments if segments is not None else max(1, round(math.sqrt(n))))
    kept = tuple(cands[(j * n) // k - 1] for j in range(1, k + 1))
    if k == 1:
        return Segmentation(tuple(cands), kept, ())
    keep_ops = {w for b in kept for w in tab.writers[b]}
    shielded = {b for i in keep_ops for b in tab.writes[i]}
    horizon = tab.created[kept[-2]]  # the final segment is not checkpointed
    released = tuple(
        b
        for b in range(t.n_buffers)
        if saved[b] and tab.created[b] <= horizon and b not in shielded
    )
    return Segmentation(tuple(cands), kept, released)


# NOTE [ Checkpoint recomputation ]
# Chen et al. re-run each segment's forward once, when backward reaches it. Here each
# released buffer gets a `Recompute` keyed on the op that first needs it (replaying backward
# in order): its chain holds the ops that wrote it and, recursively, the writers of inputs
# the framework has freed by then; an input released and not yet back is a *source* with its
# own `Recompute` before the same op, kept resident until the framework frees it, so a
# segment is recomputed once (Capuchin §5.3's collective recomputation). A chain that would
# re-run an op writing a persistent buffer or an input, or read a source overwritten since,
# cannot restore the value: that buffer is kept (its `Release` dropped). Ops consuming RNG
# state set `restore_rng`. Full text: docs/notes.md, "Checkpoint recomputation".
class _Replay:
    """Replays backward in demand order and builds the recompute events
    (NOTE [ Checkpoint recomputation ])."""

    def __init__(self, tab: _Tables, released: Sequence[int]):
        self.tab = tab
        self.released = set(released)
        self.present: set[int] = set()  # released buffers back on the device
        self.kept_back: set[int] = set()
        self.events: list[Recompute] = []

    def resolve(self, b: int, x: int) -> None:
        """Make released `b` present before op `x`, or keep it if no chain can."""
        chain = self._chain(b, x)
        if chain is None:
            self.kept_back.add(b)
            self.present.add(b)
            return
        ops, nested = chain
        for s in nested:
            if s not in self.present:
                self.resolve(s, x)
        rng = any(self.tab.trace.ops[k].rng for k in ops)
        self.events.append(Recompute(b, x, ops, rng))
        self.present.add(b)

    def _absent(self, s: int) -> bool:
        return s in self.released and s not in self.present

    def _chain(self, b: int, x: int) -> tuple[tuple[int, ...], list[int]] | None:
        """The ops that recreate `b` before op `x` and the released inputs to
        bring back first; None if the value cannot be restored."""
        tab = self.tab
        chain = {w for w in tab.writers[b] if w < x}
        if not chain:
            return None
        changed = True
        while changed:  # grow to a fixpoint: every value a chain op reads is restored
            changed = False
            made: set[int] = set()
            for k in sorted(chain):
                for s in tab.reads[k]:
                    dead = tab.freed[s] < x and not (tab.persistent[s] or tab.is_input[s])
                    if s in made or dead:
                        missing = [w for w in tab.writers[s] if w < k and w not in chain]
                        if missing:
                            chain.update(missing)
                            changed = True
                made.update(tab.writes[k])
        ops = tuple(sorted(chain))
        if not all(tab.recomputable[k] for k in ops):
            return None
        nested: list[int] = []
        made = set()
        for k in ops:
            for s in tab.reads[k]:
                temp = s in made and (self._absent(s) or tab.freed[s] < x)
                # otherwise op k reads the value on the device: it must be the one it read then
                if not temp and any(k < w < x for w in tab.writers[s]):
                    return None
                if s not in made and self._absent(s) and s not in nested:
                    nested.append(s)
            made.update(tab.writes[k])
        return ops, nested


def checkpoint_plan(trace: Trace, options: CheckpointOptions | None = None) -> tuple[Plan, dict]:
    """The checkpointing plan of one trace, before the peak guard, and its
    figures (candidates, kept boundaries, released and recomputed buffers)."""
    opts = options or CheckpointOptions()
    tab = _Tables(trace)
    seg = _segment(tab, opts.segments)
    last_fwd = _last_forward_access(tab)
    release_after = {b: last_fwd[b] for b in seg.released}
    demand = _first_access_after(trace, release_after)
    replay = _Replay(tab, seg.released)
    for b in sorted(seg.released, key=lambda b: (demand[b], b)):
        if b not in replay.present:
            replay.resolve(b, demand[b])
    events: list[Release | Recompute] = [
        Release(b, release_after[b]) for b in seg.released if b not in replay.kept_back
    ]
    events.sort(key=lambda ev: (ev.after_op, ev.buffer))
    events.extend(replay.events)
    stats = {
        "candidates": list(seg.candidates),
        "kept": list(seg.kept),
        "released": len(events) - len(replay.events),
        "kept_back": sorted(replay.kept_back),
        "recomputed_ops": sum(len(ev.ops) for ev in replay.events),
    }
    return Plan(fingerprint_of(trace), tuple(events), trace.meta.model), stats


def _last_forward_access(tab: _Tables) -> dict[int, int]:
    out: dict[int, int] = {}
    for i, p in enumerate(tab.phase):
        if p is Phase.FORWARD:
            for b in tab.reads[i]:
                out[b] = i
            for b in tab.writes[i]:
                out[b] = i
    return out


def _first_access_after(trace: Trace, after: dict[int, int]) -> dict[int, int]:
    bptr, ops = trace.buffer_accesses
    out = {}
    for b, a in after.items():
        acc = ops[bptr[b] : bptr[b + 1]]
        out[b] = int(acc[np.searchsorted(acc, a, side="right")])
    return out


def predicted_peak(trace: Trace, timeline: Timeline, plan: Plan, device: DeviceModel) -> int:
    """Bytes at the op-grid peak `plan` predicts (`analysis.memory_of_plan`,
    recompute temporaries included)."""
    return memory_of_plan(trace, timeline, plan, device).peak()[0]


def checkpoint(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: CheckpointOptions | None = None,
) -> PlanResult:
    """Chen et al.'s checkpointing of every job alone. Planned when no budget
    is given or the predicted peaks of all jobs together fit it."""
    t0 = time.perf_counter()
    jobs = as_traces(traces)
    budget = check_budget(budget_bytes)
    opts = options or CheckpointOptions()
    timelines = predict_timelines(jobs, device)
    plans, peaks, stats = [], [], []
    for t, tl in zip(jobs, timelines, strict=True):
        plan, st = checkpoint_plan(t, opts)
        peak = predicted_peak(t, tl, plan, device)
        vanilla = t.peak("framework")[0]
        st["fallback"] = peak > vanilla
        if st["fallback"]:
            plan, peak = empty_plan(t), vanilla
        plans.append(plan)
        peaks.append(peak)
        stats.append(st)
    return fit_result(
        "checkpoint",
        plans,
        sum(peaks),
        budget,
        t0,
        options=options_dict(opts),
        stats={"peak_bytes": sum(peaks), "job_peak_bytes": peaks, "jobs": stats},
    )
