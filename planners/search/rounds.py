"""The rounds of squeeze's search: the kinds of moves tried on the best
plans, in order, each accepted in batches by the simulation (NOTE
[ Squeeze ], step 3, in planners/search/squeeze.py)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.plan import Event, Plan, Recompute, SwapIn, SwapOut
from memplan.planners.search.crossing import cross_moves
from memplan.planners.search.moves import (
    Move,
    Search,
    accept_batches,
    deadline_moves,
    pair_prune_moves,
    prefetch_moves,
    prune_moves,
    queue_moves,
    recompute_moves,
    stall_moves,
    swap_moves,
    with_room,
)
from memplan.traces.model import Trace

DEADLINE_EVALS = 100  # NOTE [ Batched acceptance ]: a cap on dropping swap-out deadlines
HIDDEN_EVALS = 100  # NOTE [ Hidden swaps ]: a cap on chains made swaps against the estimate
CROSS_EVALS = 10  # NOTE [ State swaps across the boundary ]: in a search's first round only


@dataclass
class Rounds:
    """The moves of squeeze's rounds on `traces` under `budget` bytes, and,
    per kind of move, the evaluations it took and the seconds it took off
    (`moves`), over every search it improved."""

    traces: Sequence[Trace]
    device: DeviceModel
    budget: int
    timelines: Sequence[Timeline]
    durations: Sequence[np.ndarray]
    rng: random.Random
    cross: bool = True  # offer swaps across the boundary (NOTE [ State swaps across the boundary ])
    moves: dict[str, list] = field(default_factory=dict)

    def improve(self, search: Search, base: Sequence[Plan], only: tuple[str, ...] = ()) -> bool:
        """Rounds of moves on `search` while one gains (NOTE [ Squeeze ], step
        3); `only`: those kinds of move alone. True if the last round gained
        nothing, False if it stopped on its limits."""
        timelines, durations = self.timelines, self.durations

        def cost(j: int, e: Event) -> float:
            if isinstance(e, Recompute):
                return float(sum(durations[j][k] for k in e.ops))
            if isinstance(e, SwapIn | SwapOut):
                nbytes = int(self.traces[j].nbytes[e.buffer])
                return float(self.device.copy_time(nbytes, Direction.H2D))
            return 0.0

        traces, device = self.traces, self.device

        def rooms() -> list[np.ndarray | None]:
            """Per job, the budget less the simulated bytes of each op of the best plans."""
            ran = search.best.op_times
            if ran is None:
                return [None] * len(traces)
            return [None if o.peak_bytes is None else self.budget - o.peak_bytes for o in ran()]

        def stalls(plans: list[Plan]) -> list[Move]:
            ran = search.best.op_times
            return stall_moves(ran(), plans) if ran is not None else []

        def queues(plans: list[Plan]) -> list[Move]:
            ran = search.best.op_times
            return queue_moves(ran(), plans) if ran is not None else []

        # the kinds of moves of a round, in order: (name, moves on the plans
        # as they are now, strict, cap on evaluations)
        kinds: tuple[tuple[str, Callable[[list[Plan]], list[Move]], bool, int | None], ...] = (
            ("recompute", lambda p: recompute_moves(traces, device, durations, p), True, None),
            ("swap", lambda p: swap_moves(traces, device, timelines, durations, p), True, None),
            (  # NOTE [ Hidden swaps ]
                "hidden swap",
                lambda p: swap_moves(traces, device, timelines, durations, p, hidden=True),
                True,
                HIDDEN_EVALS,
            ),
            (  # NOTE [ State swaps across the boundary ]
                "cross",
                lambda p: cross_moves(traces, device, timelines, self.budget, p),
                True,
                CROSS_EVALS,
            ),
            (  # NOTE [ Batched acceptance ]: a few deadlines matter
                "deadline",
                lambda p: deadline_moves(traces, device, timelines, p),
                True,
                DEADLINE_EVALS,
            ),
            ("prefetch", lambda p: prefetch_moves(traces, device, timelines, p), True, None),
            (
                "prune",
                lambda p: with_room(traces, rooms(), prune_moves(base, p, cost, self.rng)),
                False,
                None,
            ),
            ("queue", queues, True, None),  # NOTE [ Queues ahead of a stall ]
            ("stall", stalls, True, None),
            (
                "pair prune",
                lambda p: with_room(traces, rooms(), pair_prune_moves(base, p, cost, self.rng)),
                False,
                None,
            ),
        )
        first = True
        while not search.out_of_time():
            before = search.best.iteration_s
            for kind, find, strict, cap in kinds:
                if (only and kind not in only) or (kind == "cross" and not (self.cross and first)):
                    continue
                e0, t0 = search.evaluations, search.best.iteration_s
                accept_batches(search, find(search.plans), strict=strict, max_evaluations=cap)
                tally = self.moves.setdefault(kind, [0, 0.0])
                tally[0] += search.evaluations - e0
                tally[1] += t0 - search.best.iteration_s
            first = False
            if not search.best.iteration_s < before - 1e-12:
                return True
        return False
