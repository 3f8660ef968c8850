"""TENSILE's options, and the choices they set where the paper is vague."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TensileOptions:
    """TENSILE's knobs. See the NOTE blocks in this module for each choice.

    - `per_job_lane`: one lane timeline per job (the authors' simplification)
      instead of one shared by all jobs (NOTE [ Lane timelines ]).
    - `max_swap_rate`: each job's cap on its share of all swapped tensors
      (NOTE [ Max swapping rate ]); 1 = no cap.
    - `swap_rest`: after a swap succeeds, also swap the buffer in before its
      later accesses (Algorithm 2 line 43; NOTE [ Which gap is swapped ]).
    - `recompute`: MSPS recompute when swapping leaves the peak over budget
      (NOTE [ TENSILE recompute rounds ] in tensile/recompute.py).
    - `max_recompute_ops`: longest recompute chain, in ops; the paper sets
      none (NOTE [ Recompute chain length ]).
    - `recompute_in_place`: a buffer written in place (an in-place ReLU, a
      dropout mask) may be remade by all its writes
      (planners.analysis.msps NOTE [ In-place chains ]).
    - `count_first_iteration`: the peak of iteration 0 counts, as in the
      simulator (NOTE [ Peak analysis on the op grid ]).
    - `margin_us`: slack left between a swap-in's end and the op needing it.
    - `stop_after`, `stop_window`, `stop_min_gain`: the paper's stopping rule
      (NOTE [ Stopping rule ]); `max_iterations` a hard cap on swap rounds.
    """

    per_job_lane: bool = False
    max_swap_rate: float = 1.0
    swap_rest: bool = True
    recompute: bool = True
    max_recompute_ops: int = 32
    recompute_in_place: bool = True
    count_first_iteration: bool = True
    margin_us: float = 0.0
    stop_after: int = 100
    stop_window: int = 3
    stop_min_gain: float = 0.0005
    max_iterations: int = 100_000

    def __post_init__(self) -> None:
        if not 0.0 < self.max_swap_rate <= 1.0:
            raise ValueError(f"max_swap_rate={self.max_swap_rate!r} must be in (0, 1]")
        if self.max_recompute_ops < 1:
            raise ValueError(f"max_recompute_ops={self.max_recompute_ops!r} must be >= 1")
        if not (math.isfinite(self.margin_us) and self.margin_us >= 0):
            raise ValueError(f"margin_us={self.margin_us!r} must be a number >= 0")
        if self.stop_window < 1 or self.stop_after < 0 or self.max_iterations < 1:
            raise ValueError("stop_window >= 1, stop_after >= 0 and max_iterations >= 1 required")
        if not self.stop_min_gain >= 0:
            raise ValueError(f"stop_min_gain={self.stop_min_gain!r} must be >= 0")


# NOTE [ Max swapping rate ]
# The paper caps, per job, "the rate of tensors swapped in a job to tensors
# swapped in the whole system" and tests SON[job] <= MSR[job] before a swap
# (Algorithm 2 line 36). We do the same with SON counting the job's swapped
# gaps and MSR[job] = max_swap_rate * (gaps swapped by all jobs): with one
# job or a rate of 1 there is no cap, with two jobs at 0.5 they take turns.
# As in the paper the cap does not apply to cross-iteration swaps of updated
# parameters (line 33).
#
# NOTE [ Recompute chain length ]
# §IV-D only recomputes accesses whose inputs were never released, so its
# chains are one op long; with Capuchin's update (which §IV-D's MSPS comes
# from) a source released for recompute is made again inside the chain, and
# the chain grows by every such source. The paper sets no cap; ours bounds a
# chain's time and the work of building chains. 32 ops, Capuchin's default
# here: on the six shipped traces at 75, 60 and 50% of the vanilla peak
# (rtx-a6000, roofline), 1 op fits 8 of the 18 cells, 8 ops 9, 16 and 32
# ops 11 (32 gets lower peaks where the plan still falls short).
#
# NOTE [ Stopping rule ]
# Algorithm 3 stops when no swap and no recompute succeeds, and also when
# "the average MP of the jobs corresponding to the selected tensors in the
# past 3 iterations reduces less than 0.05% and iter > 100". We take MP as
# the global peak: after `stop_after` rounds, swapping stops once the peak of
# `stop_window` rounds ago is less than `stop_min_gain` (relative) above the
# current one. Recompute rounds stop when the peak fits or no candidate is
# left.
