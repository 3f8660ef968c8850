"""The snapshot a simulation writes, as PyTorch's own tools show it (CPU
only): `torch.cuda._memory_viz`'s trace_plot / segment_plot pages, its
stats, trace and flamegraph views, and a transcription of what the
memory_viz page (torch/utils/viz/MemoryViz.js) computes from the pickle
it embeds, checked against the simulation."""

from __future__ import annotations

import base64
import json
import pickle
import pickletools
import re

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.core.plan import Recompute, Release, SwapIn, SwapOut
from memplan.sim import Job, simulate
from memplan.sim.snapshot import PICKLE_PROTOCOL, snapshot
from memplan.sim.snapshot_read import check_snapshot, device_peaks
from memplan.traces import synthetic
from torch.cuda import _memory_viz as viz

from tests.sim.handtraces import MiB, gpu
from tests.sim.test_model import plan
from tests.sim.test_snapshot import hand

# The opcodes `unpickle` in MemoryViz.js knows; any other stops the page.
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST",
    "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE",
    "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE",
}  # fmt: skip


def hand_run():
    # hand(): b1 swapped out and in, 2 iterations; peak 8 MiB (b0 4 + b1 2 + b2 1
    # + b3 1 while op2 runs), 4 buffers made per iteration plus b0 at arrival.
    t, lat = hand()
    p = plan(t, SwapOut(1, 0), SwapIn(1, 1, 3))
    return simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=2)


def two_jobs_run(allocator: str = "exact"):
    # two residual(3) jobs at 80% of their vanilla peak under capuchin: both
    # swap and recompute, and fit; caching and smartpool (their segments and
    # each job's CUDA context, the profile's) get the whole device
    t = synthetic.residual(3, act_mib=2)
    device = DeviceModel(load_hardware("a100-pcie-40gb"), Roofline())
    budget = int(0.8 * 2 * t.peak()[0])
    plans = registry.run("capuchin", [t, t], device, budget_bytes=budget).plans
    assert all(p.counts()["recompute"] and p.counts()["swap_in"] for p in plans)
    if allocator != "exact":
        budget = device.hw.memory_bytes
    jobs = [Job(t, p) for p in plans]
    r = simulate(jobs, device, iterations=2, budget=budget, allocator=allocator)
    assert not r.oom
    return r


def hand_recompute_run():
    t, lat = hand()
    p = plan(t, Release(1, 0), Recompute(1, 3, (0,)))
    return simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=2)


RUNS = {
    "swap": hand_run,
    "recompute": hand_recompute_run,
    "two jobs": two_jobs_run,
    "two jobs, caching": lambda: two_jobs_run("caching"),
    "two jobs, smartpool": lambda: two_jobs_run("smartpool"),
}


def embedded(html: str) -> dict:
    """The snapshot a memory_viz page embeds (base64 of the pickle, zero-padded)."""
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))
    raw = base64.b64decode(files[0]["base64"])
    return check_snapshot(pickle.loads(raw), "page")


# ---- MemoryViz.js, transcribed ----------------------------------------------------------
def annotated(entries: list[dict]) -> list[dict]:
    """`annotate_snapshot`: a free_requested followed by its free_completed is one 'free'."""
    out: list[dict] = []
    for e in entries:
        e = dict(e)
        prev = out[-1] if out else None
        if e["action"] == "free_completed" and prev and prev["action"] == "free_requested" \
                and prev["addr"] == e["addr"]:  # fmt: skip
            prev["action"] = "free"
            continue
        out.append(e)
    return out


def timeline(snap: dict, plot_segments: bool = False) -> tuple[int, int]:
    """(max_size, elements) of `process_alloc_data` for device 0: the top of
    the Active Memory Timeline (or, with `plot_segments`, the Active Cached
    Segment Timeline) and how many allocations it draws."""
    alloc = "segment_alloc" if plot_segments else "alloc"
    frees = ("segment_free",) if plot_segments else ("free", "free_completed")
    elements: list[int] = []  # sizes
    initially, actions, addr_to_alloc = [], [], {}
    for e in annotated(snap["device_traces"][0]):
        if e["action"] == alloc:
            elements.append(e["size"])
            addr_to_alloc[e["addr"]] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif e["action"] in frees:
            if e["addr"] in addr_to_alloc:
                actions.append(addr_to_alloc.pop(e["addr"]))
            else:
                elements.append(e["size"])
                initially.append(len(elements) - 1)
                actions.append(len(elements) - 1)
    for seg in snap["segments"]:
        if plot_segments:
            if seg["address"] not in addr_to_alloc:
                elements.append(seg["total_size"])
                initially.append(len(elements) - 1)
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and addr not in addr_to_alloc:
                elements.append(b["requested_size"])
                initially.append(len(elements) - 1)
            addr += b["size"]
    current = set(initially)
    total = sum(elements[i] for i in initially)
    max_size = 0
    for i in actions:
        if i in current:
            current.remove(i)
            total -= elements[i]
        else:
            current.add(i)
            total += elements[i]
        max_size = max(max_size, total)
    return max_size, len(elements)


def segment_view_holds(snap: dict) -> int:
    """`MemoryView.simulate_memory` for every event, from the last back to
    the first: each step must find what it undoes, and every block drawn
    must lie in a segment (`find_segment`), else the page breaks. Returns
    how many states were checked."""
    segments = {s["address"]: s["total_size"] for s in snap["segments"]}
    blocks: dict[int, int] = {}
    for s in snap["segments"]:
        addr = s["address"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                blocks[addr] = b["size"]
            addr += b["size"]
    events = annotated(snap["device_traces"][0])
    for k in range(len(events) - 1, -1, -1):
        for addr, size in blocks.items():
            assert any(a <= addr and addr + size <= a + n for a, n in segments.items()), (k, addr)
        e = events[k]
        if e["action"] in ("free", "free_completed"):
            blocks[e["addr"]] = e["size"]
        elif e["action"] == "alloc":
            del blocks[e["addr"]]
        elif e["action"] == "segment_free":
            segments[e["addr"]] = e["size"]
        elif e["action"] == "segment_alloc":
            assert segments.pop(e["addr"]) == e["size"]
    assert not blocks and not segments  # nothing before the first event
    return len(events)


# ---- the tests --------------------------------------------------------------------------
@pytest.mark.parametrize("run", RUNS)
def test_memory_viz_pages_show_the_simulation(run):
    r = RUNS[run]()
    snap = snapshot(r)
    data = pickle.dumps(snap, protocol=PICKLE_PROTOCOL)
    used = {op.name for op, _arg, _pos in pickletools.genops(data)}
    assert used <= VIEWER_OPCODES, used - VIEWER_OPCODES
    allocs = sum(e["action"] == "alloc" for e in snap["device_traces"][0])
    # the tensors' peak: the memory curve's, less the contexts (every job
    # holds its own from its arrival to its end, through the peak here)
    tensors = r.peak_bytes - len(r.jobs) * r.context_reserve_bytes
    for html in (viz.trace_plot(snap), viz.segment_plot(snap)):
        assert html.lstrip().startswith("<!DOCTYPE html>")
        shown = embedded(html)
        assert shown == snap
        # the Active Memory Timeline tops out at the simulation's tensor
        # peak, one element per allocation; the cached segments at its
        # reserved peak
        assert timeline(shown) == (tensors, allocs)
        assert timeline(shown, plot_segments=True)[0] == r.reserved_peak_bytes
    assert segment_view_holds(snap) == len(annotated(snap["device_traces"][0]))
    (d,) = device_peaks(snap)
    assert (d.allocated_peak, d.reserved_peak, d.consistent) == (
        tensors,
        r.reserved_peak_bytes,
        True,
    )


def test_text_views_of_the_hand_run():
    snap = snapshot(hand_run())
    # stats: what is still allocated when the snapshot is taken, b0's 4 MiB
    stats = viz.segsum(snap)
    assert "segments: 1\n" in stats
    assert "total_reserved: 4.0MiB\n" in stats and "total_allocated: 4.0MiB\n" in stats
    # trace: one line per cudaMalloc and per allocation; 1 + 2 x 4 of each
    text = viz.trace(snap)
    assert len(re.findall(r"^\w+ = cudaMalloc\(", text, re.M)) == 9
    assert len(re.findall(r"^\w+ = \w+\[0:", text, re.M)) == 9
    assert len(re.findall(r"^cudaFree\(", text, re.M)) == 8
    assert "raise OutOfMemoryError" not in text
    # flamegraph input of the memory and segments views: b0, named by its frames
    lines = viz.memory(snap, format_flamegraph=lambda s: s).splitlines()
    assert lines == [
        "stream_0;active_allocated;job 0 hand:0:iteration 0;arrival:-1:persistent param #0 b0 "
        f"{4 * MiB}"
    ]
    assert viz.segments(snap, format_flamegraph=lambda s: s).count(f" {4 * MiB}") == 1


def test_an_oom_shows_in_the_trace_view():
    t, lat = hand()
    snap = snapshot(simulate([t], DeviceModel(gpu(), lat), iterations=1, budget=7 * MiB))
    assert "raise OutOfMemoryError # 1.0MiB requested, 0.0B free in CUDA" in viz.trace(snap)
    assert segment_view_holds(snap) > 0
