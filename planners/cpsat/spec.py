"""What a CP-SAT model is, as records: the objective, what to build
(`ModelSpec`), the handles to a built model's variables (`BuiltModel`), and
a solution as plain integers (`Solution`). The builder (`cpsat/model.py`),
its cuts, the solve and the read-out all work on these; this module imports
none of them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from memplan.planners.cpsat.data import CpsatData
from ortools.sat.python import cp_model

KEEP, SWAP, RECOMPUTE = 0, 1, 2
MODE_NAMES = ("keep", "swap", "recompute")


class Objective(enum.Enum):
    TIME = "time"  # minimise the iteration time under the budget
    PEAK = "peak"  # minimise the peak bytes under an iteration-time cap


@dataclass(frozen=True, slots=True)
class Solution:
    """A model solution in ticks. Per gap: `mode`, `copy` (a D2H copy is made),
    `out_start` / `in_start` (-1 when unused), `absent` = (first, last) hot
    position it is absent over, (-1, -1) when kept, `rec_at` the position
    before which it is recomputed (-1 unless recomputed; NOTE [ Recompute
    chains ] in cpsat/chains.py), `wait`: its first hot op waits for its
    copy-out (NOTE [ Swap-out deadlines in the model ] in cpsat/model.py).
    Per op: `ready`, `end`."""

    mode: tuple[int, ...]
    copy: tuple[bool, ...]
    out_start: tuple[int, ...]
    in_start: tuple[int, ...]
    absent: tuple[tuple[int, int], ...]
    rec_at: tuple[int, ...]
    wait: tuple[bool, ...]
    ready: tuple[int, ...]
    end: tuple[int, ...]
    peak_bytes: int

    @property
    def iteration_ticks(self) -> int:
        return self.end[-1]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What to build. `budget` caps memory (both objectives); `time_cap` caps
    the iteration (peak mode). `block` hot ops per absence segment. Gaps not
    in `free` (None = all free) are fixed to `incumbent`'s decisions."""

    objective: Objective
    budget: int
    time_cap: int | None = None
    peak_floor: int = 0
    block: int = 1
    free: frozenset[int] | None = None
    incumbent: Solution | None = None
    fine: tuple[int, int] | None = None  # hot positions with one-op segments whatever `block`
    soft: bool = False  # memory may exceed the cap, minimised first (NOTE [ Soft budget ])
    time_floor: int = 0  # a lower bound on the iteration (ticks) valid for every plan
    waits: bool = True  # ops may wait for copy-outs (NOTE [ Swap-out deadlines in the model ])


@dataclass(eq=False)
class BuiltModel:
    """The CP-SAT model and handles to its variables. `horizon` bounds every
    time variable (ticks)."""

    model: cp_model.CpModel
    spec: ModelSpec
    data: CpsatData
    horizon: int
    end: list[cp_model.IntVar]
    ready: list[cp_model.LinearExprT] = field(default_factory=list)
    swap: dict[int, cp_model.IntVar] = field(default_factory=dict)
    rec: dict[int, cp_model.IntVar] = field(default_factory=dict)
    rec_at: dict[int, list[cp_model.IntVar]] = field(default_factory=dict)  # per rec_points
    copy: dict[int, cp_model.LinearExprT] = field(default_factory=dict)
    out_start: dict[int, cp_model.IntVar] = field(default_factory=dict)
    in_start: dict[int, cp_model.IntVar] = field(default_factory=dict)
    in_end: dict[int, cp_model.IntVar] = field(default_factory=dict)  # 0 unless swapped
    in_wrapped: dict[int, cp_model.IntVar] = field(default_factory=dict)  # in_start - T
    wait: dict[int, cp_model.IntVar] = field(default_factory=dict)  # its first hot op waits
    wait_end: dict[int, cp_model.IntVar] = field(default_factory=dict)  # out end if waited for
    segments: dict[int, list[tuple[int, int, cp_model.IntVar]]] = field(default_factory=dict)
    peak: cp_model.IntVar | None = None
    excess: cp_model.IntVar | None = None
    row_excess: list[cp_model.IntVar] = field(default_factory=list)
    excess_weight: int = 0
    excess_step: int = 1  # units per step of excess
    chain: list[cp_model.IntVar] = field(default_factory=list)  # absent units per hot op
    # h0, h1, w, gap, recompute point index (-1: a swap's absence segment)
    items: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    objective_unit: int = 1  # bytes per objective unit in peak mode
    n_terms: int = 0

    @property
    def T(self) -> cp_model.IntVar:  # noqa: N802 -- the iteration time, as the NOTEs name it
        return self.end[-1]

    def is_free(self, g: int) -> bool:
        return self.spec.free is None or g in self.spec.free

    def fixed(self) -> Solution:
        """The incumbent that fixes the gaps outside `spec.free`."""
        if self.spec.incumbent is None:
            raise ValueError("fixed gaps need an incumbent solution")
        return self.spec.incumbent
