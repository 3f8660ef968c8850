"""Out of memory in the simulator, worked by hand: `fail` stops the job,
`stall` waits for memory a swap-out will return, `passive` evicts the least
recently used buffer (NOTE [ Out of memory ] in sim/memory.py); `dtr` has
its own cases in test_dtr.py."""

from __future__ import annotations

import math

from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.plan import SwapIn, SwapOut
from memplan.sim import Job, OomPolicy, simulate

from tests.sim.handtraces import B, Call, MiB, fmt, gpu, make
from tests.sim.test_model import plan


def tight():
    return make([B(2), B(2)], [Call([], [0]), Call([], [1]), Call([1], []), Call([0], [])])


def test_oom_fail_stops_the_job():
    t, lat = tight()
    r = simulate([t], DeviceModel(gpu(), lat), iterations=2, budget=3 * MiB, oom="fail")
    assert fmt(r.log) == [
        (0.0, "iter_start", -1, -1),
        (0.0, "op_start", 0, -1),
        (1.0, "op_end", 0, -1),
        (1.0, "oom", 1, 1),
    ]
    j = r.jobs[0]
    assert j.oom and j.oom_at == (0, 1, 1)
    assert math.isnan(j.iteration_time_s) and j.iteration_times_s == ()
    assert (j.peak_bytes, j.end_s) == (2 * MiB, 0.001)
    assert r.memory.bytes[-1] == 0  # a dead job returns its memory


def test_oom_stall_waits_for_an_inflight_swap_out():
    # a's copy 1->3 frees the 2 MiB op1 needs: op1 waits 1->3. b dies after op2
    # (5), then a comes back 5->7 and op3 waits for it.
    t, lat = tight()
    p = plan(t, SwapOut(0, 0), SwapIn(0, 2, 3))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1, budget=3 * MiB, oom="stall")
    assert fmt(r.log) == [
        (0.0, "iter_start", -1, -1),
        (0.0, "op_start", 0, -1),
        (1.0, "op_end", 0, -1),
        (1.0, "stall_start", 1, 1),
        (1.0, "swap_out_start", 0, 0, "lane0"),
        (3.0, "swap_out_end", 0, 0, "lane0"),
        (3.0, "stall_end", 1, 1),
        (3.0, "op_start", 1, -1),
        (4.0, "op_end", 1, -1),
        (4.0, "op_start", 2, -1),
        (5.0, "op_end", 2, -1),
        (5.0, "stall_start", 3, 0),
        (5.0, "swap_in_start", 2, 0, "lane0"),
        (7.0, "swap_in_end", 2, 0, "lane0"),
        (7.0, "stall_end", 3, 0),
        (7.0, "op_start", 3, -1),
        (8.0, "op_end", 3, -1),
        (8.0, "iter_end", -1, -1),
    ]
    j = r.jobs[0]
    assert (j.oom, j.stall_s, j.peak_bytes) == (False, 0.004, 2 * MiB)
    assert (j.evictions, j.net_used) == (0, False)  # waiting evicts nothing
    # the same plan under `fail` dies at op1; `stall` with nothing in flight too
    assert simulate([Job(t, p)], DeviceModel(gpu(), lat), budget=3 * MiB, oom="fail").jobs[0].oom
    assert simulate([t], DeviceModel(gpu(), lat), budget=3 * MiB, oom="stall").jobs[0].oom_at == (
        0,
        1,
        1,
    )


def test_oom_passive_evicts_lru_and_fetches_on_demand():
    # No plan. op1 needs 2 MiB: a (least recently used, not op1's) is evicted
    # synchronously 1->3; op3 finds a absent and fetches it 5->7.
    t, lat = tight()
    r = simulate([t], DeviceModel(gpu(), lat), iterations=1, budget=3 * MiB, oom=OomPolicy.PASSIVE)
    assert fmt(r.log) == [
        (0.0, "iter_start", -1, -1),
        (0.0, "op_start", 0, -1),
        (1.0, "op_end", 0, -1),
        (1.0, "evict_start", 1, 0, "lane0"),
        (3.0, "evict_end", 1, 0, "lane0"),
        (3.0, "op_start", 1, -1),
        (4.0, "op_end", 1, -1),
        (4.0, "op_start", 2, -1),
        (5.0, "op_end", 2, -1),
        (5.0, "fetch_start", 3, 0, "lane0"),
        (7.0, "fetch_end", 3, 0, "lane0"),
        (7.0, "op_start", 3, -1),
        (8.0, "op_end", 3, -1),
        (8.0, "iter_end", -1, -1),
    ]
    j = r.jobs[0]
    assert (j.passive_swaps, j.stall_s, j.bytes_d2h, j.bytes_h2d) == (2, 0.004, 2 * MiB, 2 * MiB)
    assert j.peak_bytes == 2 * MiB
    # the net's figures: one eviction (the fetch is a passive swap, not one)
    assert (j.evictions, j.evicted_bytes, j.remat_s, j.net_used) == (1, 2 * MiB, 0.0, True)
    assert {k: j.to_dict()[k] for k in ("evictions", "evicted_bytes", "remat_s", "net_used")} == {
        "evictions": 1,
        "evicted_bytes": 2 * MiB,
        "remat_s": 0.0,
        "net_used": True,
    }


def test_oom_when_one_op_needs_more_than_the_budget():
    t, lat = tight()
    for policy in OomPolicy:
        r = simulate([t], DeviceModel(gpu(), lat), budget=1 * MiB, oom=policy)
        assert r.jobs[0].oom_at == (0, 0, 0), policy


# p (2 MiB param) is read in forward (op0) and updated by the optimizer (op2);
# op4 makes a 6 MiB temporary. p is swapped out after its update and swapped
# back in after op4 for the next iteration's op0.
