"""Cases of releases and recomputes: on demand, chains (a source that is
itself recomputed), temporaries, RNG. Times in ms, sizes in MiB (NOTE [ The
hand device ] in `tests/semantics/cases.py`); every op lasts 1 ms, and a
chain's ops run before the op they serve, which starts that much later.
"""

from __future__ import annotations

from memplan.planners.core.plan import Recompute, Release

from tests.semantics import cases as c
from tests.semantics.cases import Case, Check, Differs, Impl

RECOMPUTE_CASES: tuple[Case, ...] = (
    Case(
        "vanilla_chain",
        "No events on `chain`.",
        c.chain,
        (),
        c.CHAIN_VANILLA,
    ),
    Case(
        "release_and_recompute",
        "a2 (b4, 2 MiB) is released after op 2 and recomputed by op 1 (from a1, still "
        "there) before op 5 needs it: off in ops 3 and 4 (11 - 2 = 9, 12 - 2 = 10).",
        c.step,
        (Release(4, 2), Recompute(4, 5, (1,))),
        (8, 9, 10, 9, 10, 11, 10, 5, 5),
    ),
    Case(
        "recompute_not_needed",
        "A Recompute of a buffer that is present runs nothing (on demand): vanilla.",
        c.step,
        (Recompute(4, 5, (1,)),),
        c.STEP_VANILLA,
    ),
    Case(
        "recompute_chain",
        "h1 (b1, 2) released after op 1, h2 (b2, 4) after op 2; op 4 needs h2: its "
        "chain (op 1) needs h1, which its own Recompute (op 0, from w) brings back "
        "first, and which stays for op 5. Op 2: 8 - 2 = 6; op 3: 9 - 6 = 3; op 4: 9.",
        c.chain,
        (Release(1, 1), Release(2, 2), Recompute(1, 4, (0,)), Recompute(2, 4, (1,))),
        (3, 7, 6, 3, 9, 5),
    ),
    Case(
        "recompute_with_temporary",
        "As `recompute_chain`, but h2's chain runs ops 0 and 1 itself: h1 is its "
        "temporary, freed when the chain ends, and recomputed again before op 5. Op 4 "
        "runs with w 1 + h2 4 + h4 1 + b5 1 = 7. The chain peaks at 8 before op 4 (w, "
        "h4, h1, h2).",
        c.chain,
        (Release(1, 1), Release(2, 2), Recompute(2, 4, (0, 1)), Recompute(1, 5, (0,))),
        (3, 7, 6, 3, 7, 5),
        peak_mib=8,
        differs={
            Impl.OPGRID: Differs(
                Check.UPPER,
                "the op grid counts a chain's temporaries (h1, 2 MiB) at the op it serves, "
                "on top of that op's own outputs: op 4 is 9",
            )
        },
    ),
    Case(
        "release_just_before_recompute",
        "a3 (b5) is released after op 3 and recomputed (op 2, from a2) before op 4, "
        "the very next op: nothing runs without it, the bytes are the vanilla ones.",
        c.step,
        (Release(5, 3), Recompute(5, 4, (2,))),
        c.STEP_VANILLA,
    ),
    Case(
        "recompute_rng_restored",
        "On `dropout`, r (b1, drawn by op 0) is released after op 1 and recomputed "
        "before op 3 with the generator state restored: off in op 2 (4 - 1 = 3).",
        c.dropout,
        (Release(1, 1), Recompute(1, 3, (0,), restore_rng=True)),
        (2, 3, 3, 4),
    ),
)
