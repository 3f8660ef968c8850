"""Cases of swaps and releases: deadlines, delays, cross-iteration swaps,
swap-ins cancelling swap-outs, discards of a valid host copy and framework
frees during a copy. Times in ms, sizes in MiB (NOTE [ The hand device ] in
`tests/semantics/cases.py`: copies of 1, 2, 4 MiB take 0.45, 0.7, 1.2 ms).
"""

from __future__ import annotations

from memplan.planners.core.plan import Release, SwapIn, SwapOut

from tests.semantics import cases as c
from tests.semantics.cases import Case, Check, Differs, Impl

OPGRID_NO_QUEUE = Differs(
    Check.OUTCOME,
    "lane queueing: the op grid starts every copy at its trigger, the simulator and the "
    "replay queue copies FIFO on one lane, so the op grid frees a queued swap-out early "
    "(its timeline is not the simulator's, and its bound does not hold)",
)

SWAP_CASES: tuple[Case, ...] = (
    Case(
        "vanilla_step",
        "No events: the framework's frees alone (the bytes in `cases.step`).",
        c.step,
        (),
        c.STEP_VANILLA,
    ),
    Case(
        "vanilla_long",
        "No events on `long`.",
        c.long,
        (),
        c.LONG_VANILLA,
    ),
    Case(
        "vanilla_frozen",
        "No events on `frozen`.",
        c.frozen,
        (),
        c.FROZEN_VANILLA,
    ),
    Case(
        "swap_out_then_in",
        "a1 (b3, 4 MiB) leaves after op 1: copy 2.0-3.2, freed in op 3 (still counted), "
        "off in op 4: 12 - 4 = 8. Back after op 4 + 0.5 ms: copy 5.5-6.7 starts in op 5 "
        "(counted), op 6 waits for it until 6.7.",
        c.step,
        (SwapOut(3, 1), SwapIn(3, 4, 6, delay_us=500)),
        (8, 9, 10, 11, 8, 11, 10, 5, 5),
    ),
    Case(
        "swap_out_deadline",
        "As `swap_out_then_in` with before_op=3 on the swap-out: op 3 waits for its "
        "copy (3.0-3.2) and runs without a1: 11 - 4 = 7, op 4 12 - 4 = 8. The swap-in "
        "(after op 4 at 5.2, + 0.5) starts at 5.7 in op 5.",
        c.step,
        (SwapOut(3, 1, before_op=3), SwapIn(3, 4, 6, delay_us=500)),
        (8, 9, 10, 7, 8, 11, 10, 5, 5),
    ),
    Case(
        "late_swap_in",
        "a1 leaves after op 1 + 0.5 ms: copy 2.5-3.7 ends in op 3 (counted), off in ops "
        "4 and 5: 12 - 4 = 8, 11 - 4 = 7. The swap-in after op 4 + 1.5 ms starts at 6.5, "
        "after op 6 is ready (6.0): op 6 stalls until 7.7 and runs with a1.",
        c.step,
        (SwapOut(3, 1, delay_us=500), SwapIn(3, 4, 6, delay_us=1500)),
        (8, 9, 10, 11, 8, 7, 10, 5, 5),
        differs={
            Impl.OPGRID: Differs(
                Check.UPPER,
                "the op grid clamps a swap-in that would start after its before_op is "
                "ready to that ready time minus EPS_US, i.e. inside the op before: op 5 "
                "counts a1 (11)",
            )
        },
    ),
    Case(
        "swap_out_at_iteration_start",
        "after_op=-1: w2 (b2, 1 MiB, updated by op 7, so its host copy is stale every "
        "iteration) leaves as the iteration starts: copy 0-0.45 in op 0, off in op 1: "
        "9 - 1 = 8; back after op 1 + 0.2 ms (2.2-2.65, in op 2). The same every "
        "iteration.",
        c.step,
        (SwapOut(2, -1), SwapIn(2, 1, 3, delay_us=200)),
        (8, 8, 10, 11, 12, 11, 10, 5, 5),
    ),
    Case(
        "cross_iteration_swap",
        "NOTE [ Cross-iteration swaps ], on `update`: w (b1, 2 MiB) leaves after its "
        "update (op 4; copy 5.0-5.7 in op 5), off in op 6 (4 - 2 = 2), and comes back for "
        "op 2 of the next iteration: triggered after op 6 (7.0) + 1.2 ms, copy 8.2-8.9 in "
        "op 1 of iteration 1, so off in its op 0 too (2). Iteration 0 starts with w "
        "resident. Every iteration writes w, so every swap-out copies.",
        c.update,
        (SwapOut(1, 4), SwapIn(1, 6, 2, delay_us=1200, next_iteration=True)),
        (4, 4, 6, 7, 4, 5, 2),
        steady_mib=(2, 4, 6, 7, 4, 5, 2),
    ),
    Case(
        "fifo_lane",
        "a1 (4 MiB) and w1 (b1, 2 MiB) leave after op 1: a1's copy 2.0-3.2, w1's queued "
        "behind it, 3.2-3.9; both end in op 3 (11), op 4 has neither: 12 - 6 = 6. a1 "
        "back after op 4 + 0.5 (5.5, op 5: 11 - 2 = 9); op 6 stalls to 6.7 (10 - 2 = 8); "
        "w1 back after op 6 + 0.5 (8.2, in op 7: 5).",
        c.step,
        (
            SwapOut(3, 1),
            SwapOut(1, 1),
            SwapIn(3, 4, 6, delay_us=500),
            SwapIn(1, 6, 8, delay_us=500),
        ),
        (8, 9, 10, 11, 6, 9, 8, 5, 5),
        differs={Impl.OPGRID: OPGRID_NO_QUEUE},
    ),
    Case(
        "swap_in_cancels_running_swap_out",
        "a1 leaves after op 1 (copy 2.0-3.2); a swap-in triggered after op 2 (3.0) "
        "finds its copy running: it cancels the free (NOTE [ Event semantics ]), the "
        "copy ends with a1 kept. Bytes are the vanilla ones.",
        c.step,
        (SwapOut(3, 1), SwapIn(3, 2, 6)),
        c.STEP_VANILLA,
    ),
    Case(
        "swap_in_cancels_queued_swap_out",
        "a1 leaves after op 1 (copy 2.0-3.2, off in op 4: 8, back in op 5 as in "
        "`swap_out_then_in`); a2 (b4) leaves after op 2 (3.0), queued behind a1's copy, "
        "and a swap-in of a2 at the same trigger comes before its copy began: a2 stays, "
        "and its copy is still made (3.2-3.8) for a later Release to rely on.",
        c.step,
        (SwapOut(3, 1), SwapOut(4, 2), SwapIn(4, 2, 5), SwapIn(3, 4, 6, delay_us=500)),
        (8, 9, 10, 11, 8, 11, 10, 5, 5),
    ),
    Case(
        "release_after_cancelled_queued_swap_out",
        "`swap_in_cancels_queued_swap_out`, then a Release of a2 after op 4: the copy "
        "made at 3.8 while a2 stayed is its host copy, so a swap-in after op 4 + 0.1 "
        "brings a2 back (5.1-5.7) for op 5, and a1's swap-in queues behind it. Found "
        "by a plan the checker took and the simulator lost a buffer in, when the copy "
        "was skipped.",
        c.step,
        (
            SwapOut(3, 1),
            SwapOut(4, 2),
            SwapIn(4, 2, 5),
            Release(4, 4),
            SwapIn(4, 4, 5, delay_us=100),
            SwapIn(3, 4, 6, delay_us=500),
        ),
        (8, 9, 10, 11, 8, 11, 10, 5, 5),
        differs={Impl.OPGRID: OPGRID_NO_QUEUE},
    ),
    Case(
        "release_of_leaving_buffer",
        "a1 leaves after op 1 (copy 2.0-3.2); after op 2 a swap-in cancels the free and "
        "a Release undoes the cancel (NOTE [ Event semantics ]): a1 is freed when the "
        "copy ends, in op 3 (counted: 11), off in op 4 (8), back from a second swap-in "
        "after op 4 + 0.5 (5.5, in op 5). The host copy made at 3.2 serves it.",
        c.step,
        (SwapOut(3, 1), SwapIn(3, 2, 6), Release(3, 2), SwapIn(3, 4, 6, delay_us=500)),
        (8, 9, 10, 11, 8, 11, 10, 5, 5),
    ),
    Case(
        "second_swap_in_joins",
        "`swap_out_then_in` with a second swap-in of a1 triggered after op 4 (+0.6 ms) "
        "while the first is arriving: it joins that copy (no second copy). Same bytes.",
        c.step,
        (SwapOut(3, 1), SwapIn(3, 4, 6, delay_us=500), SwapIn(3, 4, 6, delay_us=600)),
        (8, 9, 10, 11, 8, 11, 10, 5, 5),
    ),
    Case(
        "swap_in_of_resident_buffer",
        "A swap-in of a1, which is on the device, does nothing: vanilla bytes.",
        c.step,
        (SwapIn(3, 2, 6),),
        c.STEP_VANILLA,
    ),
    Case(
        "discard_by_swap_out",
        "On `long`, a (b1, 2 MiB) leaves after op 1 (copy 2.0-2.7, in op 2), off in op 3 "
        "(4 - 2 = 2), back after op 3 + 0.2 (4.2-4.9, in op 4). Its host copy is still "
        "valid, so the swap-out after op 4 is a discard: dropped at 5.0, off in op 5 "
        "(2); back after op 5 + 0.2 (6.2, in op 6).",
        c.long,
        (
            SwapOut(1, 1),
            SwapIn(1, 3, 5, delay_us=200),
            SwapOut(1, 4),
            SwapIn(1, 5, 7, delay_us=200),
        ),
        (3, 3, 4, 2, 4, 2, 4, 4),
    ),
    Case(
        "discard_by_release",
        "`discard_by_swap_out` with a Release after op 4 instead of the second "
        "swap-out: the host copy made at 2.7 is still valid (nothing wrote a), so the "
        "swap-in after op 5 needs no new swap-out.",
        c.long,
        (
            SwapOut(1, 1),
            SwapIn(1, 3, 5, delay_us=200),
            Release(1, 4),
            SwapIn(1, 5, 7, delay_us=200),
        ),
        (3, 3, 4, 2, 4, 2, 4, 4),
    ),
    Case(
        "host_copy_across_iterations",
        "On `frozen`, p (b1, 2 MiB, never written) leaves after op 5 (copy 6.0-6.7, in "
        "op 6), off in op 7 (4 - 2 = 2), and comes back for op 3 of the next iteration, "
        "after op 7 (8.0) + 1.5 ms: 9.5-10.2 in op 1 of iteration 1 (off in op 0: 2), "
        "ready before op 3 (11.0). In iteration 1 the swap-out finds the host copy of "
        "iteration 0 valid: a discard at the end of op 5, so p is off in op 6 too "
        "(5 - 2 = 3).",
        c.frozen,
        (SwapOut(1, 5), SwapIn(1, 7, 3, delay_us=1500, next_iteration=True)),
        (4, 4, 4, 5, 5, 5, 5, 2),
        steady_mib=(2, 4, 4, 5, 5, 5, 3, 2),
    ),
    Case(
        "framework_free_during_copy",
        "a1 is freed by the framework after op 7 (`step_late_free`); its swap-out after "
        "op 6 copies 7.0-8.2, so the free finds the copy running: the bytes go when it "
        "ends, in op 8, which counts them: 5 + 4 = 9 (NOTE [ Event semantics ]).",
        c.step_late_free,
        (SwapOut(3, 6),),
        (8, 9, 10, 11, 12, 11, 10, 9, 9),
    ),
    Case(
        "cancelled_swap_out_still_copies",
        "`framework_free_during_copy` with a swap-in of a1 at the swap-out's trigger "
        "(after op 6): it wants a1 back before the copy starts, which cancels the free "
        "but not the copy (NOTE [ Event semantics ]), so, as there, the framework's free "
        "after op 7 takes effect when the copy ends: op 8 is 9.",
        c.step_late_free,
        (SwapOut(3, 6), SwapIn(3, 6, 7)),
        (8, 9, 10, 11, 12, 11, 10, 9, 9),
    ),
    Case(
        "framework_free_while_copy_queued",
        "a4 (b6) is freed after op 5 (`step_late_free_a4`: vanilla op 5 is 12). Its "
        "swap-out after op 4 + 0.6 ms queues behind a1's swap-in (5.5-6.7): at the "
        "free (6.0) its copy has not started, so the bytes go at once and the copy is "
        "dropped. a1 leaves after op 1 (off in op 4: 8), is back in op 5 (12).",
        c.step_late_free_a4,
        (SwapOut(3, 1), SwapIn(3, 4, 6, delay_us=500), SwapOut(6, 4, delay_us=600)),
        (8, 9, 10, 11, 8, 12, 10, 5, 5),
        differs={
            Impl.OPGRID: Differs(
                Check.UPPER,
                "lane queueing, on the safe side: the op grid starts a4's copy at its "
                "trigger (5.6, not queued behind a1's swap-in), so at the free (6.0) the "
                "copy is running and holds a4's bytes until it ends (6.05, in op 6: 11)",
            )
        },
    ),
    Case(
        "release_after_last_use",
        "a1's last access is op 6, the framework frees it after op 7 "
        "(`step_late_free`, vanilla op 7 = 9): a Release after op 6 frees it at once, "
        "op 7 is 5.",
        c.step_late_free,
        (Release(3, 6),),
        c.STEP_VANILLA,
    ),
)
