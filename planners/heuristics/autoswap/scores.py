"""AutoSwap's candidates and priority scores (SmartPool/AutoSwap §IV-A, §IV-B).

- `candidates(jobs, min_bytes)`: the variables worth swapping, with the gap
  (two consecutive accesses) in which each would be off the device
  (NOTE [ AutoSwap candidates ]).
- `scores(jobs, cands)`: DOA, AOA, WDOA and SWDOA of every candidate
  (NOTE [ AutoSwap scores ]), as one float64[n, 4] array.
- `combine(table, weights)`: the BO score, a weighted sum of the four
  standardised scores (§IV-C, equation 3).

Times are microseconds, sizes bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.planners.analysis import Timeline, access_table
from memplan.traces.model import Trace

SCORES = ("doa", "aoa", "wdoa", "swdoa")


@dataclass(frozen=True)
class AutoSwapJob:
    """One job as AutoSwap sees it: its trace, predicted timeline, memory
    load per op (the framework's frees, bytes) and copy times per buffer (us)."""

    trace: Trace
    timeline: Timeline
    load: np.ndarray
    d_out: np.ndarray
    d_in: np.ndarray

    @classmethod
    def of(cls, trace: Trace, timeline: Timeline, device: DeviceModel) -> AutoSwapJob:
        return cls(
            trace,
            timeline,
            trace.memory_curve("framework").astype(np.int64),
            device.copy_time(trace.nbytes, Direction.D2H, TimeUnit.US),
            device.copy_time(trace.nbytes, Direction.H2D, TimeUnit.US),
        )

    @cached_property
    def peak_op(self) -> int:
        """The first op where the load peaks (-1 without ops)."""
        return int(np.argmax(self.load)) if len(self.load) else -1


@dataclass(frozen=True, slots=True)
class Candidate:
    """Buffer `buffer` of job `job`, off the device between its accesses
    `prev` and `nxt` (op ids); its hole must hold ops `first..last`, the
    gap's ops in the peak time (NOTE [ AutoSwap candidates ])."""

    job: int
    buffer: int
    prev: int
    nxt: int
    nbytes: int
    first: int
    last: int


# NOTE [ AutoSwap candidates ]
# §IV-A keeps the variables (i) of at least a size threshold (`min_bytes`, 1 MiB by default)
# (ii) whose lifetime spans the peak time, read on each job's load under the framework's
# own frees. A candidate is one gap of a buffer: the ops strictly between two consecutive
# accesses within the iteration (Fig. 5; a gap wrapping into the next iteration is left
# alone: that is TENSILE's idea). "The peak time" is the ops whose load is over the budget
# (with several jobs, over the job's share, in proportion to its peak); with no budget or
# no op over, the first op of the maximum. A single peak op gives too few candidates where
# the limit is tight, and SWDOA exists because the peak moves. A gap is a candidate if one
# of its ops is in the peak time; a buffer may give several, whose holes never overlap.
# Its ops in the peak time (`first`..`last`) are what its swap is for
# (NOTE [ AutoSwap scheduling ]). Full text and an example: docs/notes.md.
def candidates(
    jobs: Sequence[AutoSwapJob], min_bytes: int, budget: int | None = None
) -> list[Candidate]:
    """Every job's candidates (NOTE [ AutoSwap candidates ]), by job, buffer, gap."""
    out: list[Candidate] = []
    total = sum(int(jb.load.max(initial=0)) for jb in jobs)
    for j, jb in enumerate(jobs):
        p = jb.peak_op
        if p < 0:
            continue
        load = jb.load
        over = np.zeros(len(load), bool)
        if budget is not None and total > 0:
            over = load > budget * (int(load[p]) / total)
        if not over.any():
            over[p] = True
        reach = np.concatenate(([0], np.cumsum(over)))
        t = jb.trace
        table = access_table(t)
        big = (t.nbytes >= min_bytes) & (t.nbytes > 0)
        for b in np.flatnonzero(big).tolist():
            acc = table.accesses(b)
            if len(acc) < 2:
                continue
            prev, nxt = acc[:-1], acc[1:]
            ok = (nxt - prev > 1) & (reach[nxt] - reach[prev + 1] > 0)
            for a, z in zip(prev[ok].tolist(), nxt[ok].tolist(), strict=True):
                ops = a + 1 + np.flatnonzero(over[a + 1 : z])
                out.append(Candidate(j, b, a, z, int(t.nbytes[b]), int(ops[0]), int(ops[-1])))
    return out


# NOTE [ AutoSwap scores ]
# §IV-B's scores of a candidate of `nbytes` off the device between accesses `prev` and `nxt`
# (predicted timeline, microseconds):
# - span = ready(nxt) - end(prev); DOA = span - d_out - d_in (`DeviceModel.copy_time`);
# - AOA = DOA * nbytes, or DOA / nbytes when DOA < 0 (the paper's rule);
# - WDOA = sum over ops prev < k < nxt of load[k] * (end(k) - ready(k)) (bytes x us);
# - SWDOA: WDOA made submodular -- take the highest-WDOA candidate, lower the load by its
#   bytes over its gap, recompute the rest's WDOA, repeat; each keeps its value when taken.
# Ties go to the lower (job, buffer, gap). The BO score (§IV-C, Eq. 3) is
# w1 z(DOA) + w2 z(AOA) + w3 z(WDOA) + w4 z(SWDOA), each score standardised over the
# candidates (0 where equal on all), weights in [-1, 1]; a single score is a one-hot vector.
# Full text: docs/notes.md, "AutoSwap scores".
def scores(jobs: Sequence[AutoSwapJob], cands: Sequence[Candidate]) -> np.ndarray:
    """float64[len(cands), 4]: DOA, AOA, WDOA, SWDOA of each candidate
    (NOTE [ AutoSwap scores ])."""
    n = len(cands)
    out = np.zeros((n, 4))
    if n == 0:
        return out
    job = np.fromiter((c.job for c in cands), np.int64, n)
    prev = np.fromiter((c.prev for c in cands), np.int64, n)
    nxt = np.fromiter((c.nxt for c in cands), np.int64, n)
    size = np.fromiter((c.nbytes for c in cands), np.float64, n)
    for j, jb in enumerate(jobs):
        m = job == j
        if not m.any():
            continue
        tl, b = jb.timeline, np.fromiter((c.buffer for c in cands if c.job == j), np.int64)
        span = tl.ready_us[nxt[m]] - tl.end_us[prev[m]]
        out[m, 0] = span - jb.d_out[b] - jb.d_in[b]
        out[m, 2] = _wdoa(jb, prev[m], nxt[m], jb.load)
    doa = out[:, 0]
    out[:, 1] = np.where(doa >= 0, doa * size, doa / size)
    out[:, 3] = _swdoa(jobs, job, prev, nxt, size)
    return out


def _area(jb: AutoSwapJob, load: np.ndarray) -> np.ndarray:
    """float64[n_ops + 1]: cumulative load x op time, area[k] = sum over ops < k."""
    tl = jb.timeline
    w = load.astype(np.float64) * (tl.end_us - tl.ready_us)
    return np.concatenate(([0.0], np.cumsum(w)))


def _wdoa(jb: AutoSwapJob, prev: np.ndarray, nxt: np.ndarray, load: np.ndarray) -> np.ndarray:
    area = _area(jb, load)
    return area[nxt] - area[prev + 1]


def _swdoa(
    jobs: Sequence[AutoSwapJob],
    job: np.ndarray,
    prev: np.ndarray,
    nxt: np.ndarray,
    size: np.ndarray,
) -> np.ndarray:
    """SWDOA by repeated takes (NOTE [ AutoSwap scores ]): O(candidates x
    (ops + candidates)) numpy work."""
    n = len(job)
    loads = [jb.load.copy() for jb in jobs]
    areas = [_area(jb, ld) for jb, ld in zip(jobs, loads, strict=True)]
    left = np.ones(n, bool)
    out = np.zeros(n)
    w = np.empty(n)
    dirty = set(range(len(jobs)))
    for _ in range(n):
        for j in dirty:
            areas[j] = _area(jobs[j], loads[j])
            m = job == j
            w[m] = areas[j][nxt[m]] - areas[j][prev[m] + 1]
        i = int(np.argmax(np.where(left, w, -np.inf)))  # first of equals: lowest id
        out[i], left[i] = w[i], False
        j = int(job[i])
        loads[j][prev[i] + 1 : nxt[i]] -= int(size[i])
        dirty = {j}
    return out


def standardise(table: np.ndarray) -> np.ndarray:
    """Each column as z-scores over the rows; a constant column is zeros."""
    if len(table) == 0:
        return table.copy()
    mean = table.mean(axis=0)
    std = table.std(axis=0)
    safe = np.where(std > 0, std, 1.0)
    return np.where(std > 0, (table - mean) / safe, 0.0)


def combine(z: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """The BO score of each candidate: standardised scores `z` times `weights`."""
    return z @ np.asarray(weights, np.float64)


def ranking(score: np.ndarray, cands: Sequence[Candidate]) -> list[int]:
    """Candidate indices by descending score, ties to the earlier candidate
    (they are listed by job, buffer and gap)."""
    return np.lexsort((np.arange(len(cands)), -score)).tolist()
