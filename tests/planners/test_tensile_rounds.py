"""TENSILE's round shortcuts against the plain round: candidates read in
blocks of the pick order (NOTE [ Candidates in pick order ]) and a
swap-in search per closing access (NOTE [ One swap-in search per access ])
give the plan that looking every candidate up and trying each one gives;
and the precomputed per-trace tables the rounds read equal their plain
definitions."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners.analysis import access_table, msps
from memplan.planners.analysis.opgrid import _last_reader
from memplan.planners.heuristics import tensile as tensile_module
from memplan.planners.heuristics.tensile import TensileOptions, tensile
from memplan.traces import synthetic as syn

DEVICE = DeviceModel(load_hardware("rtx-a6000"), Roofline())
FAMILIES = list(syn.Family)


def plain_candidates(self, pa):
    """Every gap around the peak looked up at once, sorted largest first."""
    rows = []
    for jb in self.jobs:
        p = pa.job_peak_op[jb.j]
        if p < 0:
            continue
        res = pa.resident[jb.j]
        res = res[~np.isin(res, jb.trace.op_accesses(p))]
        ok, g, prev, nxt, pp = self._gaps_at(jb, res, p)
        for b, *gap in zip(*(x[ok].tolist() for x in (res, g, prev, nxt, pp)), strict=True):
            rows.append((-int(jb.trace.nbytes[b]), jb.j, b, *gap))
    rows.sort()
    for _size, j, b, *gap in rows:
        yield (self.jobs[j], b, *gap)


def plans(traces, monkeypatch, plain: bool, **kw):
    with monkeypatch.context() as m:
        if plain:
            m.setattr(tensile_module._Tensile, "_candidates", plain_candidates)
            m.setattr(tensile_module._SwapInSlots, "may_fit", lambda *a: True)
        res = tensile(traces, DEVICE, **kw)
    return [p.events for p in res.plans], res.stats["rounds"]


@pytest.mark.parametrize("family", FAMILIES, ids=[f.value for f in FAMILIES])
def test_a_round_picks_as_the_plain_round(family, monkeypatch):
    t = syn.sized(500, seed=3, family=family)
    fast, rounds = plans([t], monkeypatch, plain=False)
    assert rounds > 10
    assert fast == plans([t], monkeypatch, plain=True)[0]


def test_two_jobs_on_one_lane_with_a_budget_pick_as_the_plain_round(monkeypatch):
    """Two jobs of different lengths share the lane (bookings replicated),
    swapping is capped per job, and recompute follows."""
    a = syn.sized(300, seed=1, family=syn.Family.RESIDUAL)
    b = syn.sized(200, seed=2, family=syn.Family.UNET)
    budget = int(0.5 * (a.peak("framework")[0] + b.peak("framework")[0]))
    kw = {"budget_bytes": budget, "options": TensileOptions(max_swap_rate=0.5)}
    fast, rounds = plans([a, b], monkeypatch, plain=False, **kw)
    assert rounds > 10
    assert fast == plans([a, b], monkeypatch, plain=True, **kw)[0]


@pytest.mark.parametrize("family", FAMILIES, ids=[f.value for f in FAMILIES])
def test_producers_and_last_readers_follow_their_definitions(family):
    t = syn.sized(300, seed=5, family=family)
    table = access_table(t)
    for b in range(t.n_buffers):
        p0, p1 = int(table.ptr[b]), int(table.ptr[b + 1])
        w = table.writes[p0:p1]
        op = int(table.ops[p0]) if p1 > p0 else -1
        ok = (
            not (t.exists_at_start[b] or t.persistent[b])
            and p1 > p0
            and int(w.sum()) == 1
            and bool(w[0])
            and b not in t.op_reads(op)
            and not t.writes_persistent[op]
        )
        assert msps.producer(t, b) == (op if ok else -1)
    readers = [i for i in range(t.n_ops) if len(t.op_reads(i))]
    for p in range(-1, t.n_ops):
        assert _last_reader(t, p) == max((i for i in readers if i <= p), default=-1)
