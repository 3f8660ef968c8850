"""What `validate_plan` reports: predicted (simulated) against measured
(replayed) figures of one plan, per kept bracket and as medians over them
(NOTE [ Steady figures ])."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from memplan.planners.core.plan import Plan
from memplan.traces.fields import nan_to_none
from memplan.traces.model import Trace
from memplan.validate.calibrate.brackets import Pair
from memplan.validate.calibrate.measure import LaneModel, best_iteration
from memplan.validate.replay.result import ReplayResult
from memplan.validate.replay.transfer import Direction

# NOTE [ Steady figures ]
# Times are per iteration after the first (the simulator's steady state,
# `sim.JobResult.iteration_time_s`). Measured, a replay's figure is its best
# (least) iteration after the first, as `timeit` takes the best of its
# repeats: on a shared machine the slower ones measure other processes.
# Per-op latencies are likewise each op's least call time over the vanilla
# replay's steady iterations, plus the harness share that makes the
# predicted vanilla iteration equal the measured one (NOTE [ What the
# simulator is told ]). Peaks are over the whole run, first iteration
# included, in both. Stall and recompute seconds are means per iteration
# over all iterations, in both.


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One pair (NOTE [ Paired runs ]): seconds per iteration and bytes."""

    time_pred_s: float
    time_meas_s: float
    peak_pred_bytes: int
    peak_meas_bytes: int
    vanilla_time_s: float
    stall_pred_s: float
    stall_meas_s: float
    recompute_pred_s: float
    recompute_meas_s: float
    contention: float
    drift: float
    peak_pred_lo_bytes: int = 0  # NOTE [ Timing-sensitive peaks ]
    peak_pred_hi_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """Predicted (simulated) against measured (replayed) figures of one plan
    on one device, medians over `runs` pairs (NOTE [ Paired runs ], NOTE
    [ Steady figures ]). Seconds and bytes. `correct`: every plan replay
    computed bit-identical state and losses to the vanilla replay;
    `mismatch` names the first difference otherwise."""

    model: str
    planner: str
    planner_feasible: bool
    device: str
    iterations: int
    runs: int
    lanes: int
    lane: LaneModel
    events: dict[str, int]
    correct: bool
    mismatch: str
    time_pred_s: float
    time_meas_s: float
    peak_pred_bytes: int
    peak_meas_bytes: int
    vanilla_time_s: float
    vanilla_peak_bytes: int
    stall_pred_s: float
    stall_meas_s: float
    recompute_pred_s: float
    recompute_meas_s: float
    bytes_d2h_pred: int
    bytes_d2h_meas: int
    bytes_h2d_pred: int
    bytes_h2d_meas: int
    overhead_s: float
    contention: float
    drift: float
    per_run: tuple[RunFigures, ...] = field(default_factory=tuple)
    # the simulated peak with compute PEAK_SPREAD faster / slower (NOTE
    # [ Timing-sensitive peaks ]); medians over the runs
    peak_pred_lo_bytes: int = 0
    peak_pred_hi_bytes: int = 0

    @property
    def time_err(self) -> float:
        """(predicted - measured) / measured steady iteration time."""
        return _rel(self.time_pred_s, self.time_meas_s)

    @property
    def peak_err(self) -> float:
        """(predicted - measured) / measured peak bytes."""
        return _rel(self.peak_pred_bytes, self.peak_meas_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "planner": self.planner,
            "planner_feasible": self.planner_feasible,
            "device": self.device,
            "correct": self.correct,
            "mismatch": self.mismatch,
            "time_pred_s": nan_to_none(self.time_pred_s),
            "time_meas_s": self.time_meas_s,
            "time_err": nan_to_none(self.time_err),
            "peak_pred_bytes": self.peak_pred_bytes,
            "peak_meas_bytes": self.peak_meas_bytes,
            "peak_err": nan_to_none(self.peak_err),
            "peak_pred_range_bytes": [self.peak_pred_lo_bytes, self.peak_pred_hi_bytes],
            "vanilla_time_s": self.vanilla_time_s,
            "vanilla_peak_bytes": self.vanilla_peak_bytes,
            "stall_pred_s": self.stall_pred_s,
            "stall_meas_s": self.stall_meas_s,
            "recompute_pred_s": self.recompute_pred_s,
            "recompute_meas_s": self.recompute_meas_s,
            "bytes_d2h_pred": self.bytes_d2h_pred,
            "bytes_d2h_meas": self.bytes_d2h_meas,
            "bytes_h2d_pred": self.bytes_h2d_pred,
            "bytes_h2d_meas": self.bytes_h2d_meas,
            "events": self.events,
            "iterations": self.iterations,
            "runs": self.runs,
            "lanes": self.lanes,
            "bandwidth_bytes_per_s": self.lane.bandwidth_bytes_per_s,
            "bandwidth_throttled": self.lane.throttled,
            "transfer_fixed_s": self.lane.fixed_s,
            "op_overhead_s": self.overhead_s,
            "contention": nan_to_none(self.contention),
            "drift": self.drift,
            "per_run": [
                {k: getattr(r, k) for k in RunFigures.__dataclass_fields__} for r in self.per_run
            ],
        }


def _rel(pred: float, meas: float) -> float:
    if meas == 0 or math.isnan(pred) or math.isnan(meas):
        return math.nan
    return (pred - meas) / meas


def build_report(
    trace: Trace,
    plan: Plan,
    planner: str,
    feasible: bool,
    lane: LaneModel,
    lanes: int,
    iterations: int,
    reference: ReplayResult,
    pairs: list[Pair],
    mismatch: str,
) -> ValidationReport:
    """The report of `plan` from its kept `pairs`: medians of their figures."""
    per_run = tuple(run_figures(p, iterations) for p in pairs)

    def med(values: Any) -> float:
        return float(statistics.median(values))

    def fig(name: str) -> float:
        return med(getattr(r, name) for r in per_run)

    return ValidationReport(
        model=trace.meta.model,
        planner=planner,
        planner_feasible=feasible,
        device=reference.device,
        iterations=iterations,
        runs=len(pairs),
        lanes=lanes,
        lane=lane,
        events=plan.counts(),
        correct=not mismatch,
        mismatch=mismatch,
        time_pred_s=fig("time_pred_s"),
        time_meas_s=fig("time_meas_s"),
        peak_pred_bytes=int(fig("peak_pred_bytes")),
        peak_meas_bytes=int(fig("peak_meas_bytes")),
        vanilla_time_s=fig("vanilla_time_s"),
        vanilla_peak_bytes=reference.peak_bytes,
        stall_pred_s=fig("stall_pred_s"),
        stall_meas_s=fig("stall_meas_s"),
        recompute_pred_s=fig("recompute_pred_s"),
        recompute_meas_s=fig("recompute_meas_s"),
        bytes_d2h_pred=int(med(p.sim.bytes_d2h for p in pairs)),
        bytes_d2h_meas=int(med(p.bracket.planned.bytes_moved(Direction.D2H) for p in pairs)),
        bytes_h2d_pred=int(med(p.sim.bytes_h2d for p in pairs)),
        bytes_h2d_meas=int(med(p.bracket.planned.bytes_moved(Direction.H2D) for p in pairs)),
        overhead_s=med(p.model.overhead_s for p in pairs),
        contention=fig("contention"),
        drift=fig("drift"),
        per_run=per_run,
        peak_pred_lo_bytes=int(fig("peak_pred_lo_bytes")),
        peak_pred_hi_bytes=int(fig("peak_pred_hi_bytes")),
    )


def run_figures(pair: Pair, iterations: int) -> RunFigures:
    """One pair's figures, NOTE [ Steady figures ]."""
    sim, b = pair.sim, pair.bracket
    planned = b.planned
    return RunFigures(
        time_pred_s=sim.iteration_time_s,
        time_meas_s=best_iteration(planned),
        peak_pred_bytes=sim.peak_bytes,
        peak_meas_bytes=planned.peak_bytes,
        vanilla_time_s=min(best_iteration(b.before), best_iteration(b.after)),
        stall_pred_s=sim.stall_s / iterations,
        stall_meas_s=float(planned.wait_seconds.mean()),
        recompute_pred_s=sim.recompute_s / iterations,
        recompute_meas_s=float(planned.recompute_seconds.mean()),
        contention=b.contention,
        drift=b.drift,
        peak_pred_lo_bytes=pair.peak_span[0],
        peak_pred_hi_bytes=pair.peak_span[1],
    )
