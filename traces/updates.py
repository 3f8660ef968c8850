"""The optimizer step by parameter: which of a trace's optimizer ops update
which parameters and their state (NOTE [ Update groups ]). A group is the
unit a plan could move off the device as a whole -- its state kept on the
host, its step run there -- so its bytes say what such a move is worth."""

from __future__ import annotations

from dataclasses import dataclass

from memplan.traces.model import BufferKind, Phase, Trace

# NOTE [ Update groups ]
# Two optimizer-phase ops are in one group when a buffer the optimizer phase writes links
# them: one writes it and the other reads or writes it (a parameter, its state, a temporary
# such as Adam's denominator). Buffers the phase only reads -- gradients, a learning rate or
# step count shared by every parameter -- link nothing, so a for-loop optimizer gives one
# group per parameter, while a foreach or fused one (one op writes every parameter), or an
# AMP unscale writing every gradient, gives one group of all. A group's `params` are the
# parameters it writes, `state` the optimizer state, `grads` the gradients its ops read.


@dataclass(frozen=True, slots=True)
class UpdateGroup:
    """Ops (trace order) of one group and the buffers they update or read."""

    ops: tuple[int, ...]
    params: tuple[int, ...]
    state: tuple[int, ...]
    grads: tuple[int, ...]


def update_groups(trace: Trace) -> tuple[UpdateGroup, ...]:
    """The groups of NOTE [ Update groups ], by their first op."""
    from networkx.utils import UnionFind

    ops = [op.id for op in trace.ops if op.phase is Phase.OPTIMIZER]
    written = {b for i in ops for b in trace.op_writes(i).tolist()}
    linked = UnionFind(ops)
    first_op: dict[int, int] = {}  # written buffer -> the first op touching it
    for i in ops:
        for b in trace.op_accesses(i).tolist():
            if b in written:
                linked.union(i, first_op.setdefault(b, i))
    members = [sorted(g) for g in linked.to_sets()]
    kinds = [b.kind for b in trace.buffers]
    groups = []
    for group in sorted(members):
        wrote = sorted({b for i in group for b in trace.op_writes(i).tolist()})
        read = sorted({b for i in group for b in trace.op_reads(i).tolist()})
        groups.append(
            UpdateGroup(
                ops=tuple(group),
                params=tuple(b for b in wrote if kinds[b] is BufferKind.PARAM),
                state=tuple(b for b in wrote if kinds[b] is BufferKind.OPTIMIZER_STATE),
                grads=tuple(b for b in read if kinds[b] is BufferKind.GRAD),
            )
        )
    return tuple(groups)
