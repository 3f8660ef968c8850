"""TENSILE's plan updating (§IV-E) on plain arrays: when to re-plan, and how
long the scheduler takes to plan.

- `LatencyTracker`: one EWMA (hwmodels/latency.py, NOTE [ EWMA plan
  updating ]) per distinct trace, fed each finished iteration's observed op
  latencies; `average_change_rate` over the jobs running is the paper's
  "average latency rate of change", and `due` compares it with the
  threshold.
- `planning_time_s`: the modelled time a plan takes to make
  (NOTE [ Modelled planning time ]).

The controller that wires these to the simulator is memplan/controllers.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import EWMA, LatencyModel
from memplan.hwmodels.profile import Hardware
from memplan.planners.core.errors import PlanError
from memplan.traces.model import Trace

# NOTE [ Update threshold ]
# The paper (§IV-E) re-plans when the average latency change rate
# |s' - s| / s exceeds "the updating threshold set before" and prints no
# value; 0.05 (a 5% drift of a job's summed op latencies) is our default,
# an option (`UpdateOptions.threshold`). The rate is averaged over the
# running jobs' distinct traces (jobs of one model on one device share an
# estimate: they observe the same kernels under the same mix), each against
# the sum its last plan was made from. EWMA's alpha defaults to 0.3, as
# hwmodels/latency.py's.
DEFAULT_THRESHOLD = 0.05


# NOTE [ Modelled planning time ]
# The scheduler plans beside the jobs (TENSILE's Memory Scheduler is a
# process of its own, §III), so a plan made at time t is ready at
# t + T_plan and taken at the first iteration boundary after that. T_plan is
# modelled, never measured, so runs stay deterministic and machine-free:
#     T_plan = fixed_s + per_op_s * (ops of all jobs planned together).
# Neither paper prints scheduler times. The defaults come from timing our
# own planners once (rtx-a6000 roofline, budget 60% of the vanilla peak; one
# run each, noisy): TENSILE planned resnet50 b16 (1588 ops) in 0.06 s alone
# and 0.05 s for two copies, vgg16 (319 ops) in 0.04-0.06 s; Capuchin
# resnet50 in 0.05 s, vgg16 in 0.01 s. That is a fixed part of a few
# hundredths of a second and about 20 us per op, so fixed_s = 0.02 s and
# per_op_s = 2e-5 s. Capuchin's measured plan and vDNN are costed with the
# same model for a like-for-like comparison; Capuchin's in-trigger feedback
# edits a plan in place and is ready at once (cost 0).
@dataclass(frozen=True, slots=True)
class PlanningTime:
    """T_plan = `fixed_s` + `per_op_s` x ops planned (NOTE [ Modelled planning time ])."""

    fixed_s: float = 0.02
    per_op_s: float = 2e-5

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_op_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not np.isfinite(v) or v < 0 or v > 3600:
                raise PlanError(f"planning time: {name}={v!r} must be in [0, 3600] seconds")

    def of(self, traces: Sequence[Trace]) -> float:
        """Seconds to plan `traces` together."""
        return self.fixed_s + self.per_op_s * sum(t.n_ops for t in traces)


@dataclass(frozen=True, slots=True)
class UpdateOptions:
    """- `threshold`: re-plan when the average change rate exceeds it
      (NOTE [ Update threshold ]).
    - `alpha`: the EWMA's weight of a new observation."""

    threshold: float = DEFAULT_THRESHOLD
    alpha: float = 0.3

    def __post_init__(self) -> None:
        t = self.threshold
        if not isinstance(t, int | float) or not np.isfinite(t) or not 0 < t < 10:
            raise PlanError(f"update threshold={t!r} must be in (0, 10)")
        if not isinstance(self.alpha, int | float) or not 0 < self.alpha <= 1:
            raise PlanError(f"EWMA alpha={self.alpha!r} must be in (0, 1]")


class LatencyTracker:
    """Observed op latencies of every running trace, folded by one EWMA over
    `base` (the predicted latencies plans start from). `model` is a
    `LatencyModel` to plan with: the current estimates."""

    def __init__(self, base: LatencyModel, hw: Hardware, options: UpdateOptions | None = None):
        self.options = options or UpdateOptions()
        self.hw = hw
        self.model = EWMA(base, self.options.alpha)

    def observe(self, trace: Trace, latencies_s: np.ndarray) -> None:
        """Fold one iteration's latencies (seconds, one per op of `trace`;
        NaN for an op not observed)."""
        lat = np.asarray(latencies_s, np.float64)
        if lat.shape != (trace.n_ops,):
            raise PlanError(f"tracker: {lat.shape} latencies for {trace.n_ops} ops")
        seen = np.isfinite(lat) & (lat >= 0)  # an op not seen (NaN) keeps its estimate
        self.model.observe(trace, self.hw, np.flatnonzero(seen), lat[seen])

    def mark_planned(self, traces: Sequence[Trace]) -> None:
        """A plan was made for `traces` from the current estimates."""
        for t in _distinct(traces):
            self.model.mark_planned(t, self.hw)

    def average_change_rate(self, traces: Sequence[Trace]) -> float:
        """Mean over the distinct `traces` of |s' - s| / s (0 with none)."""
        ts = _distinct(traces)
        if not ts:
            return 0.0
        return float(np.mean([self.model.change_rate(t, self.hw) for t in ts]))

    def due(self, traces: Sequence[Trace]) -> tuple[bool, float]:
        """(re-plan now?, the average change rate)."""
        rate = self.average_change_rate(traces)
        return rate > self.options.threshold, rate

    def device(self, device: DeviceModel) -> DeviceModel:
        """`device` with this tracker's estimates as its latency model."""
        return DeviceModel(device.hw, self.model, device.lanes, device.extra_per_transfer_s)


def _distinct(traces: Sequence[Trace]) -> list[Trace]:
    seen: dict[int, Trace] = {}
    for t in traces:
        seen.setdefault(id(t), t)
    return list(seen.values())
