"""The log and the memory samples kept flat (NOTE [ A flat log ]
in sim/log.py): read as before, and the evaluator's bulk readers of them
(`op_times`, `net_moves`) agree with a row-by-row reading of the entries."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.core.evaluate import NetMove
from memplan.planners.core.plan import Plan, SwapIn, SwapOut
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.sim import Job, SimResult, simulate
from memplan.sim.log import Log, LogEntry, LogKind, Rows
from memplan.traces import synthetic
from memplan.traces.io import fingerprint
from memplan.traces.model import BUFFER_KINDS

from memplan.evaluator import net_moves, op_times
from tests.sim.handtraces import B, Call, gpu, make

K = LogKind


def test_a_log_reads_back_the_entries_it_was_given():
    entries = [
        LogEntry(0.0, 0, 0, K.ITER_START),
        LogEntry(1.5, 0, 0, K.OP_START, 3),
        LogEntry(2.25, 1, 2, K.SWAP_IN_START, 4, 7, 1),
        LogEntry(9.0, 0, 0, K.PLAN, -1, 2),
    ]
    log = Log()
    for e in entries:
        log.append(e)
    assert len(log) == 4 and list(log) == entries
    assert log[2] == entries[2] and log[-1] == entries[-1]
    assert log[1:3] == entries[1:3] and log[::-2] == entries[::-2]
    assert list(log.since(2)) == entries[2:]
    assert all(type(e) is LogEntry and isinstance(e.kind, LogKind) for e in log)
    with pytest.raises(IndexError):
        log[4]
    with pytest.raises(IndexError):
        log[-5]
    again = pickle.loads(pickle.dumps(log))
    assert again == log and list(again) == entries
    log.append(LogEntry(9.5, 0, 0, K.ITER_END))
    assert again != log


def test_samples_read_as_the_tuples_they_were():
    rows = Rows(3)
    for x in [(0.0, 0, 1, 100), (2.0, 1, 0, -(2**40)), (2.0, 0, 3, 7)]:
        rows.add(x[0], x[1:])
    assert list(rows) == [(0.0, 0, 1, 100), (2.0, 1, 0, -(2**40)), (2.0, 0, 3, 7)]
    assert rows[1] == (2.0, 1, 0, -(2**40)) and rows[-1][3] == 7 and list(rows.rows(2)) == [rows[2]]
    t, ints = rows.columns()
    assert t.tolist() == [0.0, 2.0, 2.0] and ints.shape == (3, 3) and ints[1, 2] == -(2**40)


def test_the_curve_by_kind_is_made_when_read_from_the_samples():
    """NOTE [ The curve by kind ] in sim/metrics.py: `simulate` leaves it
    unmade; read, it is each kind's running sum of the samples, summed
    one by one here, and the kinds add up to the curve."""
    t = synthetic.sized(300, seed=1, family=synthetic.Family.RESIDUAL)
    jobs = [Job(t, release_only_plan(t)), Job(t, None, arrival_s=1e-4)]
    r = simulate(jobs, DeviceModel(gpu(), Roofline()), iterations=2)
    curve = r.memory
    assert "by_kind" not in vars(curve)
    running = [0] * len(BUFFER_KINDS)
    want = []
    for kind, delta in zip(curve.kind.tolist(), curve.delta.tolist(), strict=True):
        running[kind] += delta
        want.append(list(running))
    assert curve.by_kind.tolist() == want
    assert (curve.by_kind.sum(axis=1) == curve.bytes).all()
    assert (curve.by_kind.max(axis=0) > 0).sum() >= 4  # params, grads, activations, states
    assert curve.by_kind is curve.by_kind  # made once
    # by job: the jobs' curves add up to the device's; one job's is the device's
    assert (curve.by_job.sum(axis=1) == curve.bytes).all()
    alone = simulate(jobs[:1], DeviceModel(gpu(), Roofline()), iterations=2).memory
    assert alone.by_job.shape == (len(alone.t_s), 1)
    assert (alone.by_job[:, 0] == alone.bytes).all() and not np.shares_memory(
        alone.by_job, alone.bytes
    )
    before = int((curve.t_s < 1e-4).sum())  # until job 1 arrives, job 0 runs as it does alone
    assert before > 10 and (curve.by_job[:before, 0] == alone.by_job[:before, 0]).all()
    assert not curve.by_job[:before, 1].any()


# ---- the evaluator's readers against the entries read one by one ------------------------
def _op_times_by_entry(sim: SimResult) -> list[tuple]:
    """`op_times` as it read the log before it was columns: entry by entry."""
    out = []
    for j, job in enumerate(sim.jobs):
        n = sim.traces[j].n_ops
        it = len(job.iteration_times_s) - 1
        start, end = np.full(n, np.nan), np.full(n, np.nan)
        t0 = period = math.nan
        stalled: dict = {}
        stalls: dict = {}
        for e in sim.log:
            if e.job != j or e.iteration != it:
                continue
            if e.kind is K.OP_START:
                start[e.op] = e.t_us
            elif e.kind is K.OP_END:
                end[e.op] = e.t_us
            elif e.kind is K.STALL_START:
                stalled[e.op, e.buffer] = e.t_us
            elif e.kind is K.STALL_END and (e.op, e.buffer) in stalled:
                key = (e.op, e.buffer)
                stalls[key] = stalls.get(key, 0.0) + e.t_us - stalled.pop(key)
            elif e.kind is K.ITER_START:
                t0 = e.t_us
            elif e.kind is K.ITER_END:
                period = e.t_us - t0
        waits = tuple((op, b, us) for (op, b), us in stalls.items() if us > 0)
        out.append((start - t0, end - t0, period, waits))
    return out


def _net_moves_by_entry(sim: SimResult, plans: list[Plan]) -> tuple[NetMove, ...]:
    """`net_moves` as it read the log before: entry by entry, keeping the
    op each job last ended and the chains pending until its next op starts."""
    planned = {
        (j, e.buffer, e.after_op) for j, p in enumerate(plans) for e in p.events
        if isinstance(e, SwapOut)
    }  # fmt: skip
    out: list[NetMove] = []
    pending: dict[int, list] = {}
    ended: dict[int, int] = {}
    for e in sim.log:
        kind = e.kind
        if kind is K.OP_END:
            ended[e.job] = e.op
        elif kind is K.ITER_START:
            ended[e.job] = -1
        elif kind is K.EVICT_START:
            out.append(NetMove(e.job, e.iteration, "evict", e.op, e.buffer, True))
        elif kind is K.DISCARD:
            if not ((e.job, e.buffer, e.op) in planned and e.op <= ended.get(e.job, -1)):
                out.append(NetMove(e.job, e.iteration, "evict", e.op, e.buffer, True))
        elif kind is K.DROP:
            out.append(NetMove(e.job, e.iteration, "evict", e.op, e.buffer, False))
        elif kind is K.FETCH_START:
            out.append(NetMove(e.job, e.iteration, "restore", e.op, e.buffer, True))
        elif kind is K.RECOMPUTE_START:
            pending.setdefault(e.job, []).append((e.iteration, e.buffer, e.op))
        elif kind is K.OP_START and pending.get(e.job):
            for it, b, producer in pending.pop(e.job):
                out.append(NetMove(e.job, it, "restore", e.op, b, False, (producer,)))
    return tuple(out)


@pytest.fixture(scope="module")
def runs() -> list[tuple[SimResult, list[Plan]]]:
    """Two jobs under passive and dtr at half and 70% of their peaks, with no
    plan, release_only, and Capuchin's plan (swap-outs the net's discards
    must be told from, recomputes)."""
    device = DeviceModel(load_hardware("rtx-a6000"), Roofline())
    t = synthetic.sized(400, seed=1, family=synthetic.Family.RESIDUAL)
    peak = t.peak("liveness")[0]
    capuchin = registry.run("capuchin", [t], device, budget_bytes=int(peak * 0.7)).plans[0]
    out = []
    for policy in ("passive", "dtr"):
        for frac in (0.5, 0.7):
            for plan in (None, release_only_plan(t), capuchin):
                jobs = [Job(t, plan), Job(t, plan, arrival_s=0.0005)]
                sim = simulate(
                    jobs, device, iterations=2, budget=int(peak * frac * 2), oom=policy, check=False
                )
                out.append((sim, [plan, plan] if plan else []))
    # a parameter swapped out, in and out again unwritten: the second swap-out
    # is the plan's own discard (tests/sim/test_model.py), not the net's
    t, lat = make(
        [B(2), B(1), B(1)],
        [Call([], [0]), Call([], [1], 4), Call([0], []), Call([], [2], 4), Call([0], [])],
    )
    events = (SwapOut(0, 0), SwapIn(0, 1, 2), SwapOut(0, 2), SwapIn(0, 3, 4))
    hand = Plan(fingerprint(t), events)
    sim = simulate([Job(t, hand)], DeviceModel(gpu(), lat), iterations=2, oom="passive")
    out.append((sim, [hand]))
    return out


def test_the_runs_exercise_every_kind_the_readers_read(runs):
    kinds = {e.kind for sim, _ in runs for e in sim.log}
    for k in (K.EVICT_START, K.DISCARD, K.DROP, K.FETCH_START, K.RECOMPUTE_START, K.STALL_START):
        assert k in kinds, k
    mine = [len(_net_moves_by_entry(s, p)) < len(_net_moves_by_entry(s, [])) for s, p in runs]
    assert any(mine), "no planned discard told from the net's"


def test_net_moves_read_from_columns_are_those_read_entry_by_entry(runs):
    for sim, plans in runs:
        assert net_moves(sim, plans) == _net_moves_by_entry(sim, plans)


def test_op_times_read_from_columns_are_those_read_entry_by_entry(runs):
    waited = 0
    for sim, _ in runs:
        for got, (start, end, period, waits) in zip(op_times(sim), _op_times_by_entry(sim)):
            assert np.array_equal(got.start_us, start, equal_nan=True)
            assert np.array_equal(got.end_us, end, equal_nan=True)
            assert got.period_us == period or (math.isnan(got.period_us) and math.isnan(period))
            assert got.stalls == waits
            waited += len(waits)
    assert waited
