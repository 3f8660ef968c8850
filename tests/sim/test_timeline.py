"""Timelines: the Chrome trace of a hand-worked run, and the figures."""

from __future__ import annotations

import json

from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.plan import Plan, SwapIn, SwapOut
from memplan.sim import Job, simulate
from memplan.sim.exports import (
    chrome_trace,
    gantt_figure,
    memory_figure,
    save_figure,
    spans,
    write_chrome_trace,
)
from memplan.traces.io import fingerprint

from tests.sim.handtraces import MiB, gpu
from tests.sim.test_model import swap_chain, two_jobs


def late_swap():
    # op0 0-1, D2H 1-3, op1 1-4, op2 4-7, H2D 7-9 (stall 7-9), op3 9-10
    t, lat = swap_chain()
    p = Plan(fingerprint(t), (SwapOut(0, 0), SwapIn(0, 2, 3)))
    return simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1)


def test_spans_pair_the_log():
    got = [
        (s.cat, s.start_us / 1e3, s.end_us / 1e3, s.op, s.buffer, s.lane)
        for s in spans(late_swap())
    ]
    assert got == [
        ("op", 0.0, 1.0, 0, -1, -1),
        ("swap_out", 1.0, 3.0, 0, 0, 0),
        ("op", 1.0, 4.0, 1, -1, -1),
        ("op", 4.0, 7.0, 2, -1, -1),
        ("swap_in", 7.0, 9.0, 2, 0, 0),
        ("stall", 7.0, 9.0, 3, 0, -1),
        ("op", 9.0, 10.0, 3, -1, -1),
    ]


def test_chrome_trace_structure():
    doc = chrome_trace(late_swap())
    events = doc["traceEvents"]
    names = {
        (e["pid"], e.get("tid"), e["name"]): e["args"]["name"] for e in events if e["ph"] == "M"
    }
    assert names == {
        (0, None, "process_name"): "device hand-gpu",
        (1, None, "process_name"): "job 0: hand",
        (1, 1, "thread_name"): "compute",
        (1, 2, "thread_name"): "pcie",
    }
    xs = [(e["name"], e["cat"], e["ts"], e["dur"], e["tid"]) for e in events if e["ph"] == "X"]
    assert xs == [
        ("aten.op0.default", "op", 0.0, 1000.0, 1),
        ("swap_out b0", "swap_out", 1000.0, 2000.0, 2),
        ("aten.op1.default", "op", 1000.0, 3000.0, 1),
        ("aten.op2.default", "op", 4000.0, 3000.0, 1),
        ("swap_in b0", "swap_in", 7000.0, 2000.0, 2),
        ("stall (buffer 0)", "stall", 7000.0, 2000.0, 1),
        ("aten.op3.default", "op", 9000.0, 1000.0, 1),
    ]
    job_bytes = [
        (e["ts"], e["args"]["bytes"] // MiB) for e in events if e["ph"] == "C" and e["pid"] == 1
    ]
    # a leaves at 3, returns at 7; b1 (until op3) and b2 (until op2) come and go
    assert job_bytes == [(0.0, 2), (1000.0, 3), (3000.0, 1), (4000.0, 2), (7000.0, 3), (10000.0, 0)]
    total = [e for e in events if e["ph"] == "C" and e["pid"] == 0]
    assert total[0]["args"] == {"bytes": 2 * MiB, "budget": 1024 * MiB}


def test_two_jobs_get_two_pids_and_lanes_their_names(tmp_path):
    jobs, lat = two_jobs()
    r = simulate(jobs, DeviceModel(gpu(), lat, lanes=2), iterations=1)
    write_chrome_trace(r, tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    threads = sorted(
        (e["pid"], e["tid"], e["args"]["name"])
        for e in doc["traceEvents"]
        if e["name"] == "thread_name"
    )
    assert threads == [
        (1, 1, "compute"), (1, 2, "pcie h2d"), (1, 3, "pcie d2h"),
        (2, 1, "compute"), (2, 2, "pcie h2d"), (2, 3, "pcie d2h"),
    ]  # fmt: skip
    copies = {
        (e["pid"], e["tid"], e["cat"])
        for e in doc["traceEvents"]
        if e["ph"] == "X" and e["tid"] > 1
    }
    assert copies == {(1, 3, "swap_out"), (1, 2, "swap_in"), (2, 3, "swap_out")}


def test_figures_are_written(tmp_path):
    r = late_swap()
    fig = memory_figure(r)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "device memory (MiB)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "activation",
        "budget 1024.00 MiB (above)",
    ]
    gantt = gantt_figure(r)
    assert [t.get_text() for t in gantt.axes[0].get_yticklabels()] == ["job 0 compute", "pcie"]
    save_figure(fig, tmp_path / "memory.png")
    save_figure(gantt, tmp_path / "gantt.svg")
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "gantt.svg").read_bytes()[:400]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gantt.svg", "memory.png"]
