"""What a recomputation costs when the sources it reads are already dead
(NOTE [ Dead sources ]): the recompute charge of NOTE [ Absences ] at one
op of the iteration, for the split bound of `planners.analysis.window_bound`.
"""

from __future__ import annotations

import numpy as np
from memplan.planners.analysis.gaps import Gaps, recompute_costs, writes
from memplan.traces.model import Trace

# NOTE [ Dead sources ]
# NOTE [ Absences ] charges a gap that comes back by recompute the cheapest
# op m that writes it without reading it (its share of m's kernel by bytes).
# That kernel reads m's inputs, which must be on the device when it runs. An
# input z that the framework freed before the absence instant of op k
# (`freed_after[z] < k`, z not persistent) is dead then: its host copy went
# with it and nothing can keep it, so the chain (or DTR's remake) must make
# z again first, with an op that writes z without reading it -- made for
# that chain only, so each run pays it (NOTE [ Incarnations ], NOTE [ DTR ]).
# Its ops run once each, in ascending op order (a plan's chain) or are the
# producers themselves (DTR), so a z needed by m is made by an op before m.
# Two lower bounds on the ops a run needs besides m, whose union may share
# ancestors (so no sum of whole derivations):
# - one writer per dead input: at least sum_z rec1(z), rec1 the cheapest
#   writer's share of the bytes it writes (shares of one op add up to <= 1);
# - the whole making of any one dead input: at least max_z full(z), full(z)
#   the least duration of a writer of z before m plus, recursively, the same
#   bound for its own dead inputs.
# So a run of m costs at least val(m) = d_m + max(sum_z rec1(z), max_z
# full(z)) (inf when some dead input cannot be made: an input, or no writer
# qualifies), and a gap of buffer x is charged min over qualifying m of x's
# share of val(m). One pass over the ops in order computes it for every
# buffer. The dead set only grows with k, so a charge computed at an earlier
# op holds at a later one; a gap covering several ops is charged at the
# first of them (the multi-op bound), a split at op k at k.


class DeadSources:
    """The recompute charges of NOTE [ Dead sources ] of one trace, with op
    durations `d` (seconds per op), at any op."""

    def __init__(self, trace: Trace, d: np.ndarray):
        n, w = trace.n_ops, writes(trace)
        rp, rb = trace.reads_csr
        self.outs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for op, b, s in zip(
            w.op[w.maker].tolist(), w.buffer[w.maker].tolist(), w.share[w.maker].tolist()
        ):
            self.outs[op].append((b, s))
        mortal = ~trace.persistent[rb]  # persistent inputs never die
        self.reads = [rb[rp[i] : rp[i + 1]][mortal[rp[i] : rp[i + 1]]] for i in range(n)]
        self.freed = trace.freed_after
        self.rec1 = recompute_costs(trace, d)
        self.d = d.tolist()
        self.n_buffers = trace.n_buffers
        self._cache: dict[int, np.ndarray] = {}

    def at(self, k: int) -> np.ndarray:
        """float64[n_buffers]: each buffer's recompute charge at op `k`
        (seconds; inf where none qualifies), never below `recompute_costs`."""
        if k not in self._cache:
            self._cache[k] = self._pass(k)
        return self._cache[k]

    def _pass(self, k: int) -> np.ndarray:
        full = [np.inf] * self.n_buffers
        rec = [np.inf] * self.n_buffers
        rec1, freed = self.rec1, self.freed
        for op, outs in enumerate(self.outs):
            if not outs:
                continue
            dead = self.reads[op][freed[self.reads[op]] < k].tolist()
            extra = max(sum(rec1[z] for z in dead), max(full[z] for z in dead)) if dead else 0.0
            val = self.d[op] + extra
            for b, s in outs:
                full[b] = min(full[b], val)
                rec[b] = min(rec[b], s * val)
        return np.maximum(np.array(rec), self.rec1)

    def gap_rec(self, gaps: Gaps, k: int) -> np.ndarray:
        """float64[gaps]: the recompute charge of every gap at op `k` (inf
        where `gaps.rec` is: no recompute within the iteration)."""
        return np.where(
            np.isfinite(gaps.rec), np.maximum(gaps.rec, self.at(k)[gaps.buffer]), np.inf
        )

    def gap_rec_from(self, gaps: Gaps, g: np.ndarray, first: np.ndarray, every: int) -> np.ndarray:
        """float64[len(g)]: the recompute charge of gaps `g` at an op at or
        before `first` (ascending ops: the first each covers), one of every
        `every`-th distinct op of them (the charge only grows along the
        iteration: NOTE [ Dead sources ])."""
        marks = np.unique(first)[::every]
        at = marks[np.searchsorted(marks, first, side="right") - 1]
        out = np.empty(len(g))
        for k in np.unique(at).tolist():
            sel = at == k
            out[sel] = self.gap_rec(gaps, int(k))[g[sel]]
        return out
