"""Simulated versus measured: does the simulator predict what a plan does on a
real device, and does the plan leave what is computed unchanged?

`validate_plan(trace, plan or planner name, ...)` measures the device with
vanilla replays (`validate/calibrate/measure.py`), plans with a planner if given a
name, simulates the plan with the measured latencies and lane, replays the
plan, and reports predicted against measured steady iteration time and peak
bytes, with the correctness verdict (bit-identical persistent state and
losses against the vanilla replay). The brackets of replays are
`validate/calibrate/brackets.py` (NOTE [ Paired runs ]), the figures
`validate/calibrate/report.py` (NOTE [ Steady figures ]).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from memplan.hwmodels.profile import Hardware
from memplan.planners.core.check import check_delays
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, validate
from memplan.sim import Job, simulate
from memplan.traces.model import Trace
from memplan.validate.calibrate.brackets import Bracket, Pair, run_bracket, unsteadiness, verdict
from memplan.validate.calibrate.measure import (
    LaneModel,
    Measurement,
    device_hardware,
    measure_lane,
    measurement,
    op_latencies,
    probe_plan,
)
from memplan.validate.calibrate.report import ValidationReport, build_report
from memplan.validate.errors import ValidationError
from memplan.validate.replay.executor import replay

# NOTE [ Timing-sensitive peaks ]
# A plan's peak can hinge on a race: whether a swap-out's copy ends before a later op
# allocates, or a prefetch starts before or after one. When the two are close, the
# machine's noise decides, in the simulation as in the replay, and no peak prediction is
# within 1% every time. A plan removes the race by naming each swap-out's deadline
# (planners.core.plan NOTE [ Swap-out deadlines ]), as vDNN, TENSILE and Capuchin plans do.
# For plans without deadlines the report also gives the simulated peak with compute
# `PEAK_SPREAD` faster and slower (lane unchanged): a measured peak anywhere in that range
# is what the model predicts. The example: docs/notes.md, "Timing-sensitive peaks".


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
    model: Measurement,
    budget_bytes: int | None,
    options: object,
    lanes: int = 1,
) -> tuple[Plan, str, bool]:
    """(plan, planner name, feasible): `plan` itself, or the plan the named
    planner makes for the measured device."""
    if isinstance(plan, Plan):
        validate(plan, trace)
        check_delays(plan, trace, model.device(lanes))  # before any replay waits them out
        return plan, "file", True
    from memplan.planners import registry

    result = registry.run(
        plan,
        [trace],
        model.device(lanes),
        budget_bytes=budget_bytes,
        options=options,
    )
    if not result.plans:
        why = result.explain()
        raise PlanError(f"planner {plan!r} made no plan: {why}")
    return result.plans[0], plan, result.feasible


PEAK_SPREAD = 0.05


def peak_span(
    trace: Trace,
    plan: Plan,
    model: Measurement,
    peak_bytes: int,
    *,
    iterations: int,
    lanes: int,
    spread: float = PEAK_SPREAD,
) -> tuple[int, int]:
    """The least and largest of `peak_bytes` (the simulated peak of `plan`
    on `model`'s device) and the simulated peaks with every op `spread`
    faster and `spread` slower (NOTE [ Timing-sensitive peaks ])."""
    peaks = [peak_bytes]
    for f in (1.0 - spread, 1.0 + spread):
        device = model.device(lanes, scale=f)
        sim = simulate([Job(trace, plan)], device, iterations=iterations)
        peaks.append(sim.jobs[0].peak_bytes)
    return min(peaks), max(peaks)


def _simulated(
    trace: Trace, plan: Plan, bracket: Bracket, hardware: Hardware, lane: LaneModel, **kw: Any
) -> Pair:
    """The simulation of `plan` on the device measured by both vanilla
    replays of `bracket`, with the compute-thread cost per transfer of
    `lane`, and its peak span (two more simulations: only kept brackets are
    simulated)."""
    model = measurement(hardware, lane, bracket.before, bracket.after)
    device = model.device(kw["lanes"])
    sim = simulate([Job(trace, plan)], device, iterations=kw["iterations"]).jobs[0]
    span = peak_span(trace, plan, model, sim.peak_bytes, **kw)
    return Pair(bracket, sim, model, span)


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
        first = measurement(hardware, lane, reference)
        chosen, planner, feasible = resolve_plan(trace, plan, first, budget_bytes, options, lanes)
        probe = probe_plan(trace) if lane.probes else None
        runs_of: list[list[Bracket]] = []
        mismatch = ""
        for _run in range(runs):
            candidates = [
                run_bracket(
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
                mismatch = mismatch or verdict(reference, c.planned)
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
    return build_report(
        trace, chosen, planner, feasible, lane, lanes, iterations, reference, chosen_pairs, mismatch
    )
