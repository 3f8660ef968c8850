"""Simulated versus measured: does the simulator predict what a plan does on a
real device, and does the plan leave what is computed unchanged?

`validate_plan(trace, plan or planner name, ...)` measures the device with
vanilla replays (`validate/calibrate/measure.py`), plans with a planner if given a
name, simulates the plan with the measured latencies and lane, replays the
plan, and reports predicted against measured steady iteration time and peak
bytes, with the correctness verdict (bit-identical persistent state and
losses against the vanilla replay).

# NOTE [ Paired runs ]
The plan replay is bracketed by two vanilla replays (vanilla, plan,
vanilla), and its simulation uses the latencies of both: a prediction and
its measurement see about the same machine. A lane probe runs between the
first vanilla replay and the plan's; its sample of the compute-thread cost
per transfer is pooled with every other (`validate/calibrate/measure.py`
NOTE [ Transfers cost the compute thread too ]), and every kept bracket is
simulated with the pooled figure. The machine is shared, though: other
processes take the cores, and -- two vCPUs that may be siblings of one
physical core -- slow ours down without our thread ever waiting for a CPU
(here a release-only plan, which changes no time, measured 20-30% off its
vanilla replay a second earlier). So each of the `runs` runs makes `samples`
brackets and keeps the steadiest: the one whose two vanilla replays agree
best (`drift` = |before - after| / the smaller, of their best steady
iterations), i.e. the machine ran at one speed throughout, and whose lane
probe read closest to the pooled figure, i.e. transfers cost the compute
thread what the simulation is told (`unsteadiness`: drift plus that distance
relative to the figure). Neither looks at the plan replay. The probe's part
was chosen on 1416 brackets of tiny_resnet under TENSILE replayed back to
back for 7 minutes, grouped offline into validations as `validate_plan`
makes them: with drift alone 8 of 467 validations were off by more than 15%
in time (worst 23.5%), with both 1 (worst 19.7%); the median error stayed
2.1-2.6%. Such an outlier comes from a regime where transfers cost the
compute thread half as much again (the plan's own cost per transfer, 38-50
us between its 10th and 90th percentiles, rose past 60 us for seconds at a
time), and a probe run just before the plan replay sees it.

A first vanilla replay warms the allocator and caches, is the reference for
correctness (every plan replay of every bracket is compared with it, bit for
bit), and gives the latencies a named planner plans with. Reported figures
are medians over the runs of each kept bracket's figure; errors are
(predicted - measured) / measured of those medians.

# NOTE [ Timing-sensitive peaks ]
A plan's peak can hinge on a race: whether a swap-out's copy ends (and frees
its bytes) before a later op allocates, or a prefetch starts (and takes its
bytes) before or after one. When the two are a few percent apart, the
machine's noise decides, in the simulation (fed one pair's latencies) as in
the replay: tiny_resnet under vdnn simulated at 3.90 MiB with the measured
latencies and at 3.68 MiB with every op 10% slower, and replays landed on
either. No peak prediction can be within 1% of such a plan every time. A
plan removes the race by naming, for each swap-out, the op by which it
counts on the memory (planners.core.plan NOTE [ Swap-out deadlines ]): vDNN,
TENSILE and Capuchin plans do, and tiny_resnet under vdnn then simulates at
3.68 MiB with every op 15% faster or slower, and replays at 3.68 MiB every
time. For plans without deadlines (CP-SAT's, a hand-made one) the
report also gives the simulated peak with compute `PEAK_SPREAD` faster and
slower than measured (the lane unchanged): where that range is wide, the
peak depends on timing the plan leaves no slack for, and a measured peak
anywhere in it is what the model predicts.

# NOTE [ Steady figures ]
Times are per iteration after the first (the simulator's steady state,
`sim.JobResult.iteration_time_s`). Measured, a replay's figure is its best
(least) iteration after the first, as `timeit` takes the best of its
repeats: on a shared machine the slower ones measure other processes.
Per-op latencies are likewise each op's least call time over the vanilla
replay's steady iterations, plus the harness share that makes the
predicted vanilla iteration equal the measured one (NOTE [ What the
simulator is told ]). Peaks are over the whole run, first iteration
included, in both. Stall and recompute seconds are means per iteration
over all iterations, in both.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from memplan.hwmodels.device import DeviceModel as SimDevice
from memplan.hwmodels.latency import Fixed
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, validate
from memplan.sim import Job, simulate
from memplan.traces.model import Trace
from memplan.validate.calibrate.measure import (
    DeviceModel,
    LaneModel,
    Sample,
    best_iteration,
    compute_sample,
    device_hardware,
    device_model,
    measure_lane,
    op_latencies,
    probe_plan,
    sampled,
)
from memplan.validate.errors import ValidationError
from memplan.validate.replay.executor import replay
from memplan.validate.replay.lanes import Direction
from memplan.validate.replay.result import ReplayResult, compare_results


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
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "model": self.model,
            "planner": self.planner,
            "planner_feasible": self.planner_feasible,
            "device": self.device,
            "correct": self.correct,
            "mismatch": self.mismatch,
            "time_pred_s": num(self.time_pred_s),
            "time_meas_s": self.time_meas_s,
            "time_err": num(self.time_err),
            "peak_pred_bytes": self.peak_pred_bytes,
            "peak_meas_bytes": self.peak_meas_bytes,
            "peak_err": num(self.peak_err),
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
            "contention": num(self.contention),
            "drift": self.drift,
            "per_run": [
                {k: getattr(r, k) for k in RunFigures.__dataclass_fields__} for r in self.per_run
            ],
        }


def _rel(pred: float, meas: float) -> float:
    if meas == 0 or math.isnan(pred) or math.isnan(meas):
        return math.nan
    return (pred - meas) / meas


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run with `threads` intra-op threads (None: as is), restored on exit."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def resolve_plan(
    trace: Trace,
    plan: Plan | str,
    model: DeviceModel,
    budget_bytes: int | None,
    options: object,
) -> tuple[Plan, str, bool]:
    """(plan, planner name, feasible): `plan` itself, or the plan the named
    planner makes for the measured device."""
    if isinstance(plan, Plan):
        validate(plan, trace)
        return plan, "file", True
    from memplan.planners import registry

    result = registry.run(
        plan,
        [trace],
        DeviceModel(model.hardware, model.latency),
        budget_bytes=budget_bytes,
        options=options,
    )
    if not result.plans:
        why = result.explain()
        raise PlanError(f"planner {plan!r} made no plan: {why}")
    return result.plans[0], plan, result.feasible


def _verdict(reference: ReplayResult, planned: ReplayResult) -> str:
    try:
        compare_results(reference, planned)
    except ValidationError as e:
        return str(e)
    return ""


@dataclass(frozen=True, slots=True)
class _Bracket:
    """One bracket's replays (NOTE [ Paired runs ]): vanilla, the lane
    probe, the plan, vanilla again."""

    before: ReplayResult
    planned: ReplayResult
    after: ReplayResult
    drift: float  # NOTE [ Paired runs ]
    contention: float  # the largest of the replays' (NOTE [ Contention ])
    probe_sample: float | None  # the probe's compute-thread seconds per transfer


@dataclass(frozen=True, slots=True)
class _Pair:
    """A kept bracket, the device model of its two vanilla replays and the
    simulation with it."""

    bracket: _Bracket
    sim: Any  # sim.JobResult
    model: DeviceModel
    peak_span: tuple[int, int]  # NOTE [ Timing-sensitive peaks ]


PEAK_SPREAD = 0.05


def peak_span(
    trace: Trace,
    plan: Plan,
    hardware: Any,
    latency: Fixed,
    peak_bytes: int,
    *,
    iterations: int,
    lanes: int,
    spread: float = PEAK_SPREAD,
) -> tuple[int, int]:
    """The least and largest of `peak_bytes` (the simulated peak of `plan`
    with `latency` as given) and the simulated peaks with every op `spread`
    faster and `spread` slower (NOTE [ Timing-sensitive peaks ])."""
    peaks = [peak_bytes]
    for f in (1.0 - spread, 1.0 + spread):
        scaled = Fixed(latency.durations_s * f)
        sim = simulate(
            [Job(trace, plan)], SimDevice(hardware, scaled, lanes), iterations=iterations
        )
        peaks.append(sim.jobs[0].peak_bytes)
    return min(peaks), max(peaks)


def _bracket(
    trace: Trace,
    plan: Plan,
    probe: Plan | None,
    *,
    device: str,
    iterations: int,
    seed: int,
    bandwidth: float | None,
    lanes: int,
) -> _Bracket:
    """NOTE [ Paired runs ]: vanilla, the lane probe (NOTE [ The lane probe ]
    in `validate/calibrate/measure.py`; skipped if None), the plan, vanilla again."""

    def run(p: Plan | None) -> Sample[ReplayResult]:
        return sampled(
            lambda: replay(
                trace,
                device=device,
                iterations=iterations,
                seed=seed,
                plan=p,
                bandwidth_bytes_per_s=bandwidth if p is not None else None,
                lanes=lanes,
            )
        )

    before = run(None)
    probed = run(probe) if probe is not None else None
    try:
        planned = run(plan)
    except ValidationError as e:
        raise ValidationError(f"the plan cannot be replayed: {e}") from None
    after = run(None)
    b, a = best_iteration(before.value), best_iteration(after.value)
    return _Bracket(
        before.value,
        planned.value,
        after.value,
        abs(b - a) / min(b, a),
        max(before.contention, planned.contention, after.contention),
        None if probed is None else compute_sample(before.value, probed.value),
    )


def unsteadiness(drift: float, probe_sample: float | None, lane: LaneModel) -> float:
    """How far a bracket's machine was from steady and from the device model
    (NOTE [ Paired runs ]): its drift plus how far its lane probe read from
    the pooled cost per transfer, relative to it."""
    if probe_sample is None or lane.compute_s <= 0:
        return drift
    return drift + abs(probe_sample - lane.compute_s) / lane.compute_s


def _simulated(
    trace: Trace, plan: Plan, bracket: _Bracket, hardware: Any, lane: LaneModel, **kw: Any
) -> _Pair:
    """The simulation of `plan` with the latencies of both vanilla replays of
    `bracket` and the compute-thread cost per transfer of `lane`, and its
    peak span (two more simulations: only kept brackets are simulated)."""
    model = device_model(hardware, lane, bracket.before, bracket.after)
    latency = model.latency_for(plan)
    device = SimDevice(model.hardware, latency, kw["lanes"])
    sim = simulate([Job(trace, plan)], device, iterations=kw["iterations"]).jobs[0]
    span = peak_span(trace, plan, model.hardware, latency, sim.peak_bytes, **kw)
    return _Pair(bracket, sim, model, span)


def validate_plan(
    trace: Trace,
    plan: Plan | str,
    *,
    device: str = "cpu",
    bandwidth: float | None = None,
    iterations: int = 4,
    runs: int = 3,
    samples: int = 3,
    seed: int = 0,
    lanes: int = 1,
    budget_bytes: int | None = None,
    options: Mapping[str, Any] | object = None,
    threads: int | None = None,
    lane_samples: int | None = None,
) -> ValidationReport:
    """Replay `plan` (a `Plan` for `trace`, or a planner's name: it plans for
    the measured device, under `budget_bytes`, with `options`) on `device`,
    simulate it with what vanilla replays measured, and report both with the
    correctness verdict; NOTE [ Paired runs ]. `bandwidth` (bytes/s)
    throttles the copy lanes; None: they run at the device's copy speed,
    measured. `threads`: intra-op threads while measuring (None: torch's
    setting). `lane_samples`: vanilla/probe pairs that measure the lane
    (None: `samples`; the compute-thread cost per transfer is a difference
    of two timings and wants more, `validate.calibrate.measure` NOTE [ Transfers cost
    the compute thread too ]). On CPU call
    `hwmodels.hostmem.cache_host_allocations()` first
    for figures like the CLI's (NOTE [ Host allocations ]). Raises
    `ValidationError` for bad arguments or a plan that cannot be replayed,
    `PlanError` for a plan that does not fit the trace or a planner that
    makes none."""
    for name, value, low in (
        ("iterations", iterations, 2),
        ("runs", runs, 1),
        ("samples", samples, 1),
        ("lane_samples", samples if lane_samples is None else lane_samples, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValidationError(f"{name}={value!r} must be an integer >= {low}")
    if lanes not in (1, 2):
        raise ValidationError(f"lanes={lanes!r} must be 1 or 2")
    if bandwidth is not None and not (math.isfinite(bandwidth) and bandwidth > 0):
        raise ValidationError(f"bandwidth={bandwidth!r} must be > 0 bytes/s")
    if threads is not None and threads < 1:
        raise ValidationError(f"threads={threads!r} must be >= 1")
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValidationError(f"device={device!r} must be cpu, cuda or cuda:N")
    with intra_op_threads(threads):
        reference = replay(trace, device=device, iterations=iterations, seed=seed)
        lane = measure_lane(
            trace,
            device=device,
            bandwidth_bytes_per_s=bandwidth,
            lanes=lanes,
            seed=seed,
            samples=samples if lane_samples is None else lane_samples,
        )
        hardware = device_hardware(device, lane, lanes, op_latencies(reference)[1])
        first = device_model(hardware, lane, reference)
        chosen, planner, feasible = resolve_plan(trace, plan, first, budget_bytes, options)
        probe = probe_plan(trace) if lane.probes else None
        runs_of: list[list[_Bracket]] = []
        mismatch = ""
        for _run in range(runs):
            candidates = [
                _bracket(
                    trace,
                    chosen,
                    probe,
                    device=device,
                    iterations=iterations,
                    seed=seed,
                    bandwidth=bandwidth,
                    lanes=lanes,
                )
                for _ in range(samples)
            ]
            for c in candidates:
                mismatch = mismatch or _verdict(reference, c.planned)
            runs_of.append(candidates)
        # NOTE [ Transfers cost the compute thread too ]: every probe counts
        lane = lane.pooled(
            [b.probe_sample for r in runs_of for b in r if b.probe_sample is not None]
        )
        kept = [min(r, key=lambda b: unsteadiness(b.drift, b.probe_sample, lane)) for r in runs_of]
        chosen_pairs = [
            _simulated(trace, chosen, b, hardware, lane, iterations=iterations, lanes=lanes)
            for b in kept
        ]
    return _report(
        trace, chosen, planner, feasible, lane, lanes, iterations, reference, chosen_pairs, mismatch
    )


def _report(
    trace: Trace,
    plan: Plan,
    planner: str,
    feasible: bool,
    lane: LaneModel,
    lanes: int,
    iterations: int,
    reference: ReplayResult,
    pairs: list[_Pair],
    mismatch: str,
) -> ValidationReport:
    per_run = tuple(_figures(p, iterations) for p in pairs)

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


def _figures(pair: _Pair, iterations: int) -> RunFigures:
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
