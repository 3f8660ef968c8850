"""One bracket of `validate_plan` (NOTE [ Paired runs ]): a plan replay
between two vanilla replays, with the lane probe before it; which bracket of
a run is kept; and the correctness verdict against the reference replay."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memplan.planners.core.plan import Plan
from memplan.traces.model import Trace
from memplan.validate.calibrate.measure import (
    LaneModel,
    Measurement,
    Sample,
    best_iteration,
    compute_sample,
    sampled,
)
from memplan.validate.errors import ValidationError
from memplan.validate.replay.executor import replay
from memplan.validate.replay.result import ReplayResult, compare_results

# NOTE [ Paired runs ]
# The plan replay is bracketed by two vanilla replays (vanilla, plan,
# vanilla), and its simulation uses the latencies of both: a prediction and
# its measurement see about the same machine. A lane probe runs between the
# first vanilla replay and the plan's; its sample of the compute-thread cost
# per transfer is pooled with every other (`validate/calibrate/measure.py`
# NOTE [ Transfers cost the compute thread too ]), and every kept bracket is
# simulated with the pooled figure. The machine is shared, though: other
# processes take the cores, and -- two vCPUs that may be siblings of one
# physical core -- slow ours down without our thread ever waiting for a CPU
# (here a release-only plan, which changes no time, measured 20-30% off its
# vanilla replay a second earlier). So each of the `runs` runs makes `samples`
# brackets and keeps the steadiest: the one whose two vanilla replays agree
# best (`drift` = |before - after| / the smaller, of their best steady
# iterations), i.e. the machine ran at one speed throughout, and whose lane
# probe read closest to the pooled figure, i.e. transfers cost the compute
# thread what the simulation is told (`unsteadiness`: drift plus that distance
# relative to the figure). Neither looks at the plan replay. The probe's part
# was chosen on 1416 brackets of tiny_resnet under TENSILE replayed back to
# back for 7 minutes, grouped offline into validations as `validate_plan`
# makes them: with drift alone 8 of 467 validations were off by more than 15%
# in time (worst 23.5%), with both 1 (worst 19.7%); the median error stayed
# 2.1-2.6%. Such an outlier comes from a regime where transfers cost the
# compute thread half as much again (the plan's own cost per transfer, 38-50
# us between its 10th and 90th percentiles, rose past 60 us for seconds at a
# time), and a probe run just before the plan replay sees it.
#
# A first vanilla replay warms the allocator and caches, is the reference for
# correctness (every plan replay of every bracket is compared with it, bit for
# bit), and gives the latencies a named planner plans with. Reported figures
# are medians over the runs of each kept bracket's figure; errors are
# (predicted - measured) / measured of those medians.


def verdict(reference: ReplayResult, planned: ReplayResult) -> str:
    try:
        compare_results(reference, planned)
    except ValidationError as e:
        return str(e)
    return ""


@dataclass(frozen=True, slots=True)
class Bracket:
    """One bracket's replays (NOTE [ Paired runs ]): vanilla, the lane
    probe, the plan, vanilla again."""

    before: ReplayResult
    planned: ReplayResult
    after: ReplayResult
    drift: float  # NOTE [ Paired runs ]
    contention: float  # the largest of the replays' (NOTE [ Contention ])
    probe_sample: float | None  # the probe's compute-thread seconds per transfer


@dataclass(frozen=True, slots=True)
class Pair:
    """A kept bracket, the device model of its two vanilla replays and the
    simulation with it."""

    bracket: Bracket
    sim: Any  # sim.JobResult
    model: Measurement
    peak_span: tuple[int, int]  # NOTE [ Timing-sensitive peaks ]


def run_bracket(
    trace: Trace,
    plan: Plan,
    probe: Plan | None,
    *,
    device: str,
    iterations: int,
    seed: int,
    bandwidth: float | None,
    lanes: int,
) -> Bracket:
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
    return Bracket(
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
