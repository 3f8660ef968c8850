"""The CP-SAT planner's options: one frozen dataclass, validated when made.

Parsing from strings (the CLI's ``key=value``) is the registry's
(`memplan.planners.registry.make_options`); the planner receives an instance.
The number of copy lanes is not an option: it is the device's
(`DeviceModel.lanes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memplan.planners.core.errors import PlanError
from memplan.planners.cpsat.spec import Objective


@dataclass(frozen=True, slots=True)
class CpsatOptions:
    """- `objective`: "time" (iteration time under the budget) or "peak" (peak
      bytes with the iteration at most `max_eor` times the compute time).
    - `time_limit_s`, `num_workers`, `seed`: the solver's (deterministic for
      `num_workers=1`).
    - `hint`: a registered planner whose plan warm-starts the search, "best"
      (every heuristic planner; the fastest plan that fits, NOTE [ Hints ] in
      cpsat/hints.py), or None.
    - `chain_depth`: how many recomputations a chain may pull its sources
      through (NOTE [ Recompute chains ] in cpsat/chains.py); 0: none.
    - `swap_waits`: an op may wait for a copy-out (NOTE [ Swap-out deadlines
      in the model ] in cpsat/model.py).
    - `margin_ns`: how long before an allocation a copy's free must happen.
    - `max_exact_terms`: above this many (gap, hot op) pairs the model is
      solved coarsened and refined in windows (`lns_*`, see cpsat/lns.py).
    - `progress`: a progress line on stderr (None: when it is a terminal)."""

    objective: Objective = Objective.TIME
    time_limit_s: float = 60.0
    num_workers: int = 2
    seed: int = 0
    max_eor: float = 1.2
    hint: str | None = "best"
    chain_depth: int = 64
    swap_waits: bool = True
    margin_ns: int = 1
    max_exact_terms: int = 40_000
    lns_coarse_segments: int = 12_000
    lns_window_hot_ops: int = 48
    lns_max_free_gaps: int = 160
    lns_window_time_s: float = 4.0
    progress: bool | None = None
    log_search: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.objective, str):
            try:
                object.__setattr__(self, "objective", Objective(self.objective))
            except ValueError:
                raise PlanError(
                    f"cpsat: objective={self.objective!r} must be 'time' or 'peak'"
                ) from None
        positive = {
            "time_limit_s": self.time_limit_s,
            "max_eor": self.max_eor,
            "lns_window_time_s": self.lns_window_time_s,
        }
        for name, v in positive.items():
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise PlanError(f"cpsat: {name}={v!r} must be a number > 0")
        counts = {
            "num_workers": self.num_workers,
            "max_exact_terms": self.max_exact_terms,
            "lns_coarse_segments": self.lns_coarse_segments,
            "lns_window_hot_ops": self.lns_window_hot_ops,
            "lns_max_free_gaps": self.lns_max_free_gaps,
            "margin_ns": self.margin_ns,
        }
        for name, v in counts.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"cpsat: {name}={v!r} must be an integer >= 1")
        d = self.chain_depth
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise PlanError(f"cpsat: chain_depth={d!r} must be an integer >= 0")
