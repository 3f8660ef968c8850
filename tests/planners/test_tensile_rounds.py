"""TENSILE's round shortcuts against the plain round: candidates read in
blocks of the pick order (NOTE [ Candidates in pick order ]) and gaps
passed over where the lane has no time for their swap-in after the peak
(NOTE [ Swap-ins after the peak ]) give the plan that looking every
candidate up and trying each one gives; and the precomputed per-trace
tables the rounds read equal their plain definitions."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners.analysis import access_table, msps, predict_timeline
from memplan.planners.analysis.opgrid import _last_reader
from memplan.planners.heuristics.tensile import planner as tensile_module
from memplan.planners.heuristics.tensile.planner import TensileOptions, tensile
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
    """(each job's events, swap rounds, gaps tried)."""
    tried = 0
    try_gap = tensile_module._Tensile._try_gap

    def counted(self, *gap):
        nonlocal tried
        tried += 1
        return try_gap(self, *gap)

    with monkeypatch.context() as m:
        m.setattr(tensile_module._Tensile, "_try_gap", counted)
        if plain:
            m.setattr(tensile_module._Tensile, "_candidates", plain_candidates)
        res = tensile(traces, DEVICE, **kw)
    return [p.events for p in res.plans], res.stats["rounds"], tried


@pytest.mark.parametrize("family", FAMILIES, ids=[f.value for f in FAMILIES])
def test_a_round_picks_as_the_plain_round(family, monkeypatch):
    t = syn.sized(500, seed=3, family=family)
    fast, rounds, tried = plans([t], monkeypatch, plain=False)
    plain, _rounds, plain_tried = plans([t], monkeypatch, plain=True)
    assert rounds > 10 and tried < plain_tried  # the shortcuts passed gaps over
    assert fast == plain


def test_two_jobs_on_one_lane_with_a_budget_pick_as_the_plain_round(monkeypatch):
    """Two jobs of different lengths share the lane (bookings replicated),
    swapping is capped per job, and recompute follows."""
    a = syn.sized(300, seed=1, family=syn.Family.RESIDUAL)
    b = syn.sized(200, seed=2, family=syn.Family.UNET)
    budget = int(0.5 * (a.peak("framework")[0] + b.peak("framework")[0]))
    kw = {"budget_bytes": budget, "options": TensileOptions(max_swap_rate=0.5)}
    fast, rounds, tried = plans([a, b], monkeypatch, plain=False, **kw)
    plain, _rounds, plain_tried = plans([a, b], monkeypatch, plain=True, **kw)
    assert rounds > 10 and tried < plain_tried
    assert fast == plain


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


@pytest.mark.parametrize("family", FAMILIES, ids=[f.value for f in FAMILIES])
def test_unrolled_ready_times_follow_their_definition(family):
    t = syn.sized(300, seed=5, family=family)
    jb = tensile_module.JobPlanning(0, t, predict_timeline(t, DEVICE), DEVICE, TensileOptions())
    assert jb.unrolled_ready_us.tolist() == [jb.t_ready(x) for x in range(2 * t.n_ops)]
