"""Plans that lose data: every implementation that replays semantics rejects
them. The op grid computes bytes for a plan it is given checked, so it has
nothing to reject, except a duplicate Recompute, which the shared core's
indexing rejects for everyone (NOTE [ Duplicate events ] in
`planners/core/semantics.py`). The simulator runs with `check=False`: its own
semantics, not the checker's. Where it or the replay runs a plan the checker
rejects, the case says why in `differs`: the static checker is the contract
(`simulate` checks by default), what the others tolerate at run time is not.
"""

from __future__ import annotations

from memplan.planners.core.plan import Recompute, Release, SwapIn, SwapOut

from tests.semantics import cases as c
from tests.semantics.cases import Case, Check, Differs, Impl, Reject

OPGRID_TAKES_CHECKED = Differs(
    Check.NONE,
    "memory_of_plan predicts bytes for a plan that is checked already: it replays no "
    "data, so it has nothing to reject",
)
SIM_NO_VALUES = Differs(
    Check.OUTCOME,
    "the simulator models bytes and time, not values: it cannot see that a recompute "
    "would compute something else, and runs the plan",
    accepts=True,
)
SIM_SKIPS_UNCHECKED = Differs(
    Check.OUTCOME,
    "the static checker is the contract: a plan that releases a dead buffer is "
    "malformed, and simulate() checks plans by default (check=True) and rejects it. "
    "Unchecked (check=False, as the table runs it) the simulator tolerates it at run "
    "time: the event finds nothing to act on, is logged as a `skip` (NOTE [ Event "
    "semantics ]) and the run goes on",
    accepts=True,
)
LEAVING_READ = (
    "the checker has no time, so it takes a swap-out to take the buffer off at once: "
    "a plan must swap it back in before a read. At run time the copy may still be "
    "running and the read finds the bytes"
)
ERROR_CASES: tuple[Case, ...] = (
    Case(
        "read_of_absent_buffer",
        "a1 (b3) is released after op 1 and neither swapped in nor recomputed before "
        "op 6 reads it.",
        c.step,
        (Release(3, 1),),
        reject=Reject("reads buffer 3, which is absent", 3),
        differs={Impl.OPGRID: OPGRID_TAKES_CHECKED},
    ),
    Case(
        "swap_in_without_host_copy",
        "a1 is released (no swap-out, so no host copy) and then swapped in.",
        c.step,
        (Release(3, 1), SwapIn(3, 4, 6)),
        reject=Reject("no host copy to read", 3),
        differs={Impl.OPGRID: OPGRID_TAKES_CHECKED},
    ),
    Case(
        "swap_in_of_stale_host_copy",
        "w1 (b1) is swapped out after op 0 and back for op 8, which updates it: the "
        "host copy is stale. Released after op 8, it cannot come back for the next "
        "iteration's op 0 without a new swap-out.",
        c.step,
        (
            SwapOut(1, 0),
            SwapIn(1, 6, 8),
            Release(1, 8),
            SwapIn(1, 8, 0, next_iteration=True),
        ),
        reject=Reject("no host copy to read", 1),
        differs={Impl.OPGRID: OPGRID_TAKES_CHECKED},
    ),
    Case(
        "release_of_dead_buffer",
        "a3 (b5) is freed by the framework after op 4; a Release after op 5 names a dead "
        "buffer: a malformed plan (the checker and the replay reject it; the simulator "
        "rejects it when it checks, its default).",
        c.step,
        (Release(5, 5),),
        reject=Reject("is not alive then", 5),
        differs={Impl.OPGRID: OPGRID_TAKES_CHECKED, Impl.SIM: SIM_SKIPS_UNCHECKED},
    ),
    Case(
        "swap_out_of_absent_buffer",
        "a1 is released after op 1 and swapped out after op 2: nothing to copy (and "
        "op 6 then finds it gone).",
        c.step,
        (Release(3, 1), SwapOut(3, 2)),
        reject=Reject("is not on the device", 3),
        differs={Impl.OPGRID: OPGRID_TAKES_CHECKED},
    ),
    Case(
        "duplicate_recompute",
        "Two Recomputes of a2 (b4) before op 5: one buffer, one op, one rule -- "
        "reject (NOTE [ Duplicate events ]): all four index the plan with the shared "
        "core's IndexedPlan, the op grid included.",
        c.step,
        (Release(4, 2), Recompute(4, 5, (1,)), Recompute(4, 5, (1,))),
        reject=Reject("a second recompute of buffer 4", 4),
    ),
    Case(
        "recompute_source_absent",
        "a1 (b3) and a2 (b4) are released; a2's recompute (op 1) needs a1, which is "
        "absent and not recomputed before op 5.",
        c.step,
        (Release(3, 1), Release(4, 2), Recompute(4, 5, (1,))),
        reject=Reject("needs buffer 3, which is absent", 3),
        differs={Impl.OPGRID: OPGRID_TAKES_CHECKED},
    ),
    Case(
        "recompute_source_overwritten",
        "On `inplace`, h (b1) is recomputed by op 0 from p (b0), which op 1 updated "
        "since: the recomputed h would differ.",
        c.inplace,
        (Release(1, 1), Recompute(1, 2, (0,))),
        reject=Reject("source buffer 0 read by op 0 is overwritten by op 1", 0),
        differs={Impl.OPGRID: OPGRID_TAKES_CHECKED, Impl.SIM: SIM_NO_VALUES},
    ),
    Case(
        "recompute_rng_not_restored",
        "`recompute_rng_restored` without restore_rng: re-running op 0 draws new numbers.",
        c.dropout,
        (Release(1, 1), Recompute(1, 3, (0,))),
        reject=Reject("consumes RNG state", 1),
        differs={Impl.OPGRID: OPGRID_TAKES_CHECKED, Impl.SIM: SIM_NO_VALUES},
    ),
    Case(
        "read_of_leaving_buffer",
        "a2 (b4) is swapped out right after op 1 makes it, and op 2 reads it while its "
        "copy (2.0-2.7) runs. The checker, which has no time, holds a swapped-out buffer "
        "absent until a swap-in: it rejects. The simulator and the replay keep the "
        "buffer for the read and accept: a plan that relies on it relies on timing.",
        c.step,
        (SwapOut(4, 1),),
        reject=Reject("reads buffer 4, which is absent", 4),
        differs={
            Impl.OPGRID: OPGRID_TAKES_CHECKED,
            Impl.SIM: Differs(
                Check.OUTCOME,
                f"{LEAVING_READ}: a leaving buffer is usable until its copy ends, and an "
                "op that needs it keeps it on the device (NOTE [ Event semantics ]). A "
                "plan that relies on that relies on timing",
                accepts=True,
            ),
            Impl.REPLAY: Differs(
                Check.OUTCOME,
                f"{LEAVING_READ}: the replay keeps a leaving buffer an op needs (NOTE "
                "[ Keep ]). A plan that relies on that relies on timing",
                accepts=True,
            ),
        },
    ),
)
