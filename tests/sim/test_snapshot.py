"""The snapshot a simulation writes (sim/snapshot.py): every trace entry of
hand-worked runs, the labels against the simulator's own takes and drops,
and what the snapshot holds at its end (NOTE [ Snapshot time ])."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.core.plan import Recompute, Release, SwapIn, SwapOut
from memplan.sim import Job, simulate
from memplan.sim.allocations import allocations
from memplan.sim.allocator import CachingAllocator
from memplan.sim.memory import MemoryPool
from memplan.sim.snapshot import BASE_ADDRESS, JOB_RANGE, snapshot
from memplan.sim.snapshot_read import device_peaks
from memplan.traces import synthetic

from tests.sim.handtraces import B, Call, MiB, gpu, make
from tests.sim.test_model import plan, two_jobs


# b0: a 4 MiB parameter read by op0; b1 (2 MiB) made by op0, read by op3;
# b2 (1 MiB) made by op1, freed after op2; b3 (1 MiB) made by op2, read by op3.
def hand():
    return make(
        [B(4, "param"), B(2), B(1, freed_after=2), B(1)],
        [Call([0], [1], 1), Call([], [2], 3), Call([2], [3], 3), Call([1, 3], [], 1)],
    )


def rows(snap: dict) -> list[tuple]:
    """(action, address - base in MiB, MiB, ms, innermost frame) per entry."""
    out = []
    for e in snap["device_traces"][0]:
        f = e["frames"][0]
        where = f"{f['filename']}:{f['line']}:{f['name']}"
        out.append((e["action"], (e["addr"] - BASE_ADDRESS) / MiB, e["size"] / MiB,
                    e["time_us"] / 1000, where))  # fmt: skip
    return out


def test_swap_every_entry():
    # b0 at arrival (0 ms); op0 0-1 makes b1; b1 copied out 1-3 (freed at 3);
    # op1 1-4 makes b2; op2 4-7 makes b3, then b1's copy in starts at 4 (its
    # bytes taken then); b2 freed at 7; op3 7-8, then b1 and b3 go. b0 stays
    # (the snapshot is taken before the job leaves). Addresses: b0 [0, 4),
    # b1 [4, 6), b2 [6, 7), b3 [7, 8) (b1's range is 2 MiB, too large to be
    # reused for 1 MiB), b1 again [4, 6).
    t, lat = hand()
    r = simulate(
        [Job(t, plan(t, SwapOut(1, 0), SwapIn(1, 1, 3)))], DeviceModel(gpu(), lat), iterations=1
    )
    s = snapshot(r)
    b0 = "arrival:-1:persistent param #0 b0"
    b1 = "aten.op0.default:0:create activation #1 b1"
    b1_in = "aten.op1.default:1:swap_in activation #1 b1"
    b2 = "aten.op1.default:1:create activation #2 b2"
    b3 = "aten.op2.default:2:create activation #3 b3"
    assert rows(s) == [
        ("segment_alloc", 0, 4, 0, b0), ("alloc", 0, 4, 0, b0),
        ("segment_alloc", 4, 2, 0, b1), ("alloc", 4, 2, 0, b1),
        ("segment_alloc", 6, 1, 1, b2), ("alloc", 6, 1, 1, b2),
        ("free_requested", 4, 2, 3, b1), ("free_completed", 4, 2, 3, b1),
        ("segment_free", 4, 2, 3, b1),
        ("segment_alloc", 7, 1, 4, b3), ("alloc", 7, 1, 4, b3),
        ("segment_alloc", 4, 2, 4, b1_in), ("alloc", 4, 2, 4, b1_in),
        ("free_requested", 6, 1, 7, b2), ("free_completed", 6, 1, 7, b2),
        ("segment_free", 6, 1, 7, b2),
        ("free_requested", 4, 2, 8, b1_in), ("free_completed", 4, 2, 8, b1_in),
        ("segment_free", 4, 2, 8, b1_in),
        ("free_requested", 7, 1, 8, b3), ("free_completed", 7, 1, 8, b3),
        ("segment_free", 7, 1, 8, b3),
    ]  # fmt: skip
    (seg,) = s["segments"]
    assert (seg["address"], seg["total_size"], seg["segment_type"]) == (
        BASE_ADDRESS,
        4 * MiB,
        "large",
    )
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [(4 * MiB, "active_allocated")]
    assert seg["blocks"][0]["frames"][0]["name"] == "persistent param #0 b0"
    # outer frames: the job, with its iteration
    assert s["device_traces"][0][3]["frames"][-1] == {
        "filename": "job 0 hand",
        "line": 0,
        "name": "iteration 0",
    }
    assert {e["stream"] for e in s["device_traces"][0]} == {0}
    assert s["memplan"]["peak_bytes"] == r.peak_bytes == 8 * MiB


def test_recompute_every_entry():
    # b1 released after op0 (1 ms) and made again by re-running op0 before
    # op3: op2 ends at 7, the re-run takes b1's bytes at 7 and runs 7-8, op3 8-9.
    t, lat = hand()
    p = plan(t, Release(1, 0), Recompute(1, 3, (0,)))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1)
    got = [(a, at, mib, ms, f.split(":", 2)[2]) for a, at, mib, ms, f in rows(snapshot(r))]
    assert [g for g in got if g[0] in ("alloc", "free_completed")] == [
        ("alloc", 0, 4, 0, "persistent param #0 b0"),
        ("alloc", 4, 2, 0, "create activation #1 b1"),
        ("free_completed", 4, 2, 1, "create activation #1 b1"),
        ("alloc", 6, 1, 1, "create activation #2 b2"),  # not b1's 2 MiB range: a new one
        ("alloc", 7, 1, 4, "create activation #3 b3"),
        ("free_completed", 6, 1, 7, "create activation #2 b2"),
        ("alloc", 4, 2, 7, "recompute activation #1 b1"),  # b1's range again
        ("free_completed", 4, 2, 9, "recompute activation #1 b1"),
        ("free_completed", 7, 1, 9, "create activation #3 b3"),
    ]


def test_recompute_every_entry_addresses_do_not_overlap():
    # the same run: no two live allocations share a byte
    t, lat = hand()
    p = plan(t, Release(1, 0), Recompute(1, 3, (0,)))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=2)
    live: dict[int, int] = {}
    for e in snapshot(r)["device_traces"][0]:
        if e["action"] == "alloc":
            lo, hi = e["addr"], e["addr"] + e["size"]
            assert all(hi <= a or b_hi <= lo for a, b_hi in live.items()), e
            live[lo] = hi
        elif e["action"] == "free_completed":
            del live[e["addr"]]


def test_jobs_are_streams_and_the_first_to_leave_is_gone():
    # job A (stream 0) runs 0-... ; job B (stream 1) arrives at 5 ms. Whichever
    # ends first has given everything back at the end; none has persistent bytes.
    jobs, lat = two_jobs()
    r = simulate(jobs, DeviceModel(gpu(), lat), iterations=1)
    s = snapshot(r)
    entries = s["device_traces"][0]
    assert {e["stream"] for e in entries} == {0, 1}
    first_b = min(e["time_us"] for e in entries if e["stream"] == 1)
    assert first_b == 5000
    assert all(e["frames"][-1]["filename"] == f"job {e['stream']} {'AB'[e['stream']]}"
               for e in entries)  # fmt: skip
    assert s["segments"] == []
    assert sum(e["action"] == "alloc" for e in entries) == sum(
        e["action"] == "free_completed" for e in entries
    )


def test_out_of_memory_is_an_oom_entry():
    # a 7 MiB budget: b0, b1, b2 hold 7 MiB when op2 asks for b3 (1 MiB) at 4 ms
    t, lat = hand()
    r = simulate([t], DeviceModel(gpu(), lat), iterations=1, budget=7 * MiB)
    assert r.oom
    entries = snapshot(r)["device_traces"][0]
    (k,) = [k for k, e in enumerate(entries) if e["action"] == "oom"]
    oom = entries[k]
    assert (oom["size"], oom["device_free"], oom["time_us"]) == (MiB, 0, 4000)
    assert oom["frames"][0]["name"] == "oom activation #3 b3"
    # the job's end gives everything back after the oom, b0 included
    assert [e["action"] for e in entries[k + 1 :] if e["action"] == "free_completed"] == [
        "free_completed"
    ] * 3


# ---- the labels against the simulator's own takes and drops ---------------------------
def _recorded(monkeypatch) -> list[tuple[float, int, int, int]]:
    """(time, job, +/- bytes, buffer) per take and drop of a buffer, as the pool sees them."""
    got: list[tuple[float, int, int, int]] = []
    take, drop = MemoryPool.take, MemoryPool.drop

    def rec_take(self, s, b):
        got.append((self.env.now, s.c.index, s.c.nbytes[b], b))
        return take(self, s, b)

    def rec_drop(self, s, b):
        got.append((self.env.now, s.c.index, -s.c.nbytes[b], b))
        return drop(self, s, b)

    monkeypatch.setattr(MemoryPool, "take", rec_take)
    monkeypatch.setattr(MemoryPool, "drop", rec_drop)
    return got


@pytest.mark.parametrize(
    ("planner", "policy", "share"),
    [("vanilla", "fail", 1.0), ("checkpoint", "fail", 0.7), ("tensile", "fail", 0.85),
     ("capuchin", "fail", 0.85), ("vdnn", "fail", 0.85), ("vanilla", "passive", 0.7),
     ("checkpoint", "dtr", 0.7)],
)  # fmt: skip
def test_labels_name_the_buffer_the_simulator_moved(monkeypatch, planner, policy, share):
    # NOTE [ Which buffer a memory change is ]: every buffer the pool itself
    # took or dropped is among the labels of that instant, job and size (the
    # bytes of copies in flight name no buffer in the pool: those only
    # count). Two jobs at a share of their vanilla peak: swaps, recomputes,
    # evictions, an OOM (checkpoint at 70%).
    t = synthetic.residual(4, act_mib=4)
    device = DeviceModel(load_hardware("a100-pcie-40gb"), Roofline())
    budget = int(share * 2 * t.peak()[0])
    plans = registry.run(planner, [t, t], device, budget_bytes=budget).plans
    truth = _recorded(monkeypatch)
    r = simulate([Job(t, p) for p in plans], device, iterations=2, budget=budget, oom=policy)
    moved: dict[tuple, list[int]] = {}  # what the pool moved, per instant, job and size
    for time_us, j, n, b in truth:
        moved.setdefault((round(time_us, 6), j, n), []).append(b)
    labelled: dict[tuple, list[int]] = {}
    for ev in allocations(r, at_end=False):
        sign = {"alloc": 1, "free": -1}.get(ev.action)
        if sign:
            a = ev.alloc
            labelled.setdefault((round(ev.t_us, 6), a.job, sign * a.nbytes), []).append(a.buffer)
    # at one instant, changes of one job and size are interchangeable: every
    # buffer the pool moved then is among the labels then
    for key, bufs in moved.items():
        left = list(labelled.get(key, []))
        for b in bufs:
            assert b in left, (key, bufs, labelled.get(key))
            left.remove(b)
    assert sum(map(len, moved.values())) > 100


# ---- the caching allocator and SmartPool (NOTE [ Snapshot layout ]) ---------------------
def test_caching_allocator_every_entry():
    # The swap run again under PyTorch's caching allocator: b0 (4 MiB) takes
    # a 20 MiB large segment at 0 [b0 | 16 free]; b1 (2 MiB) is the front of
    # the 16 free MiB; b2 (1 MiB: the small pool) a 2 MiB small segment at
    # 20 MiB [b2 | 1 free]; b1's free (3 ms) coalesces [b0 | 16 free]; b3 the
    # small segment's free half; b1 again at 4 MiB; frees return blocks, never
    # segments: 22 MiB reserved from 1 ms to the end.
    t, lat = hand()
    r = simulate(
        [Job(t, plan(t, SwapOut(1, 0), SwapIn(1, 1, 3)))],
        DeviceModel(gpu(), lat),
        iterations=1,
        allocator="caching",
    )
    s = snapshot(r)
    got = [(a, at, mib, ms, f.split(":", 2)[2].split(" #")[1]) for a, at, mib, ms, f in rows(s)]
    assert [g for g in got if g[0] != "free_requested"] == [
        ("segment_alloc", 0, 20, 0, "0 b0"), ("alloc", 0, 4, 0, "0 b0"),
        ("alloc", 4, 2, 0, "1 b1"),
        ("segment_alloc", 20, 2, 1, "2 b2"), ("alloc", 20, 1, 1, "2 b2"),
        ("free_completed", 4, 2, 3, "1 b1"),
        ("alloc", 21, 1, 4, "3 b3"),
        ("alloc", 4, 2, 4, "1 b1"),
        ("free_completed", 20, 1, 7, "2 b2"),
        ("free_completed", 4, 2, 8, "1 b1"),
        ("free_completed", 21, 1, 8, "3 b3"),
    ]  # fmt: skip
    segs = [(g["address"] - BASE_ADDRESS, g["total_size"], g["segment_type"],
             [(b["size"], b["state"]) for b in g["blocks"]]) for g in s["segments"]]  # fmt: skip
    assert segs == [
        (0, 20 * MiB, "large", [(4 * MiB, "active_allocated"), (16 * MiB, "inactive")]),
        (20 * MiB, 2 * MiB, "small", [(2 * MiB, "inactive")]),
    ]
    (d,) = device_peaks(s)
    assert (d.reserved_peak, d.allocated_peak) == (r.reserved_peak_bytes, r.peak_bytes)
    assert (d.reserved_peak, d.allocated_peak) == (22 * MiB, 8 * MiB)


def test_smartpool_every_entry():
    # SmartPool's lifetimes, in the job's event count: b0 [1, 10) (open at the
    # end), b1 [2, 4), b2 [3, 7), b3 [5, 9), b1 again [6, 8). Largest first:
    # b0 at 0; b1 and b1' above it at 4 (they do not overlap in time); b2
    # overlaps b0, b1 and b1': 6; b3 overlaps b0, b1' and b2: 7. One 8 MiB
    # pool (the live-bytes bound), mapped at the first allocation.
    t, lat = hand()
    r = simulate(
        [Job(t, plan(t, SwapOut(1, 0), SwapIn(1, 1, 3)))],
        DeviceModel(gpu(), lat),
        iterations=1,
        allocator="smartpool",
    )
    s = snapshot(r)
    got = [(a, at, mib, ms) for a, at, mib, ms, _ in rows(s) if a in ("segment_alloc", "alloc")]
    assert got == [
        ("segment_alloc", 0, 8, 0), ("alloc", 0, 4, 0), ("alloc", 4, 2, 0), ("alloc", 6, 1, 1),
        ("alloc", 7, 1, 4), ("alloc", 4, 2, 4),
    ]  # fmt: skip
    (seg,) = s["segments"]
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [
        (4 * MiB, "active_allocated"), (4 * MiB, "inactive")
    ]  # fmt: skip
    (d,) = device_peaks(s)
    assert (d.reserved_peak, d.allocated_peak) == (r.reserved_peak_bytes, r.peak_bytes)
    assert d.reserved_peak == 8 * MiB


def test_caching_snapshot_is_the_simulators_blocks(monkeypatch):
    # Two residual(4) jobs at half their vanilla peak under the caching
    # allocator and the passive net: evictions, fetches (copies in flight,
    # NOTE [ Copies in flight ]), and segments returned mid-run to make room. The
    # snapshot's mallocs and frees are the simulator's own allocators' calls,
    # block for block, in order (less the frees of the job still there when
    # the snapshot is taken, NOTE [ Snapshot time ]).
    calls: dict[int, list[tuple[str, int]]] = {}
    malloc, free = CachingAllocator.malloc, CachingAllocator.free

    def rec_malloc(self, n):
        block = malloc(self, n)
        calls.setdefault(id(self), []).append(("alloc", block.addr))
        return block

    def rec_free(self, block):
        calls.setdefault(id(self), []).append(("free_completed", block.addr))
        return free(self, block)

    monkeypatch.setattr(CachingAllocator, "malloc", rec_malloc)
    monkeypatch.setattr(CachingAllocator, "free", rec_free)
    t = synthetic.residual(4, act_mib=4)
    device = DeviceModel(load_hardware("a100-pcie-40gb"), Roofline())
    budget = int(0.5 * 2 * t.peak()[0]) + 2 * device.hw.context_reserve_bytes
    r = simulate([t, t], device, iterations=2, budget=budget, oom="passive", allocator="caching")
    sim_calls = list(calls.values())  # per job, in the order the jobs' allocators were made
    calls.clear()
    s = snapshot(r)
    entries = s["device_traces"][0]
    assert not r.oom and "fetch" in {e.alloc.why for e in allocations(r)}
    first_end = min(j.end_s for j in r.jobs) * 1e6
    assert any(e["action"] == "segment_free" and e["time_us"] < first_end for e in entries)
    for j, sim in enumerate(sim_calls):
        at = [(a, BASE_ADDRESS + j * JOB_RANGE + addr % JOB_RANGE) for a, addr in sim]
        got = [(e["action"], e["addr"]) for e in entries
               if e["stream"] == j and e["action"] in ("alloc", "free_completed")]  # fmt: skip
        assert got == at[: len(got)]
        assert all(a == "free_completed" for a, _ in at[len(got) :])
    (d,) = device_peaks(s)
    assert d.reserved_peak == r.reserved_peak_bytes
