"""Reading PyTorch memory snapshots (sim/snapshot_read.py): snapshots built
by hand with the structure `torch.cuda.memory._snapshot()` documents, their
peaks worked out by hand, and files that must be refused in one line
(NOTE [ Reading a snapshot ])."""

from __future__ import annotations

import pickle

import pytest
from memplan.sim import snapshot_read
from memplan.sim.snapshot_read import SnapshotError, device_peaks, read_snapshot

MiB = 1 << 20


def seg(addr, total, blocks, device=0, stream=0):
    """A segment whose blocks are (size, requested or None for inactive)."""
    return {
        "device": device,
        "address": addr,
        "total_size": total,
        "stream": stream,
        "segment_type": "small" if total <= MiB else "large",
        "segment_pool_id": (0, 0),
        "allocated_size": sum(s for s, r in blocks if r is not None),
        "active_size": sum(s for s, r in blocks if r is not None),
        "blocks": [
            {"size": s, "requested_size": r or 0, "frames": [],
             "state": "inactive" if r is None else "active_allocated"}
            for s, r in blocks
        ],
    }  # fmt: skip


def ev(action, addr, size, t=0):
    frames = [{"filename": "train.py", "line": 7, "name": "step"}]
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": frames}  # fmt: skip


def free(addr, size, t=0):
    return [ev("free_requested", addr, size, t), ev("free_completed", addr, size, t)]


A, S = 0x7000_0000_0000, 0x7000_0200_0000  # a 20 MiB large segment, a 2 MiB small one


def real_run() -> dict:
    # A 20 MiB segment holds a 12 MiB block (asked 12 MiB - 100 B, rounded to
    # 512 B) and a 4 MiB one that is freed; a 2 MiB small segment holds 100 B
    # (a 512 B block). Allocated (requested sizes): 12 MiB - 100, + 4 MiB =
    # 16 MiB - 100 (the peak, entry 2), - 4 MiB, + 100 = 12 MiB at the end.
    # Reserved: 20 MiB, then 22 MiB (entry 5) to the end.
    trace = [
        ev("segment_alloc", A, 20 * MiB, 10),
        ev("alloc", A, 12 * MiB - 100, 10),
        ev("alloc", A + 12 * MiB, 4 * MiB, 20),
        *free(A + 12 * MiB, 4 * MiB, 30),
        ev("segment_alloc", S, 2 * MiB, 40),
        ev("alloc", S, 100, 40),
    ]
    return {
        "segments": [
            seg(A, 20 * MiB, [(12 * MiB, 12 * MiB - 100), (8 * MiB, None)]),
            seg(S, 2 * MiB, [(512, 100), (2 * MiB - 512, None)]),
        ],
        "device_traces": [trace],
        "allocator_settings": {"expandable_segments": False},
    }


def write(tmp_path, doc, name="snap.pickle", protocol=pickle.HIGHEST_PROTOCOL):
    p = tmp_path / name
    p.write_bytes(pickle.dumps(doc, protocol=protocol))
    return p


def test_peaks_of_a_hand_built_run(tmp_path):
    (d,) = device_peaks(read_snapshot(write(tmp_path, real_run())))
    assert d.allocated.tolist() == [
        0, 0, 12 * MiB - 100, 16 * MiB - 100, 16 * MiB - 100, 12 * MiB - 100, 12 * MiB - 100,
        12 * MiB,
    ]  # fmt: skip
    assert d.reserved.tolist() == [0, *[20 * MiB] * 5, 22 * MiB, 22 * MiB]
    assert (d.allocated_peak, d.allocated_peak_entry) == (16 * MiB - 100, 2)
    assert (d.reserved_peak, d.reserved_peak_entry) == (22 * MiB, 5)
    assert (d.allocated_end, d.reserved_end, d.segments) == (12 * MiB, 22 * MiB, 2)
    assert d.actions == {"segment_alloc": 2, "alloc": 3, "free_requested": 1, "free_completed": 1}
    assert d.time_us.tolist() == [10, 10, 20, 30, 30, 40, 40]
    assert d.consistent


def test_history_that_starts_late(tmp_path):
    # Recording began with an 8 MiB block and its 20 MiB segment already there:
    # the trace only frees it (and the segment: empty_cache). The end holds
    # 4 MiB in a 20 MiB segment of its own, mapped and allocated during the trace.
    doc = {
        "segments": [seg(A, 20 * MiB, [(4 * MiB, 4 * MiB), (16 * MiB, None)])],
        "device_traces": [[
            ev("alloc", A, 4 * MiB), *free(S, 8 * MiB), ev("segment_free", S, 20 * MiB),
        ]],
    }  # fmt: skip
    (d,) = device_peaks(read_snapshot(write(tmp_path, doc)))
    assert d.allocated.tolist() == [8 * MiB, 12 * MiB, 12 * MiB, 4 * MiB, 4 * MiB]
    assert d.reserved.tolist() == [40 * MiB] * 4 + [20 * MiB]
    assert (d.allocated_peak, d.allocated_peak_entry) == (12 * MiB, 0)
    assert (d.reserved_peak, d.reserved_peak_entry) == (40 * MiB, -1)  # before the trace
    assert d.consistent


def test_a_trace_that_frees_more_than_there_was_is_inconsistent(tmp_path):
    doc = {"segments": [], "device_traces": [[ev("alloc", A, MiB), *free(A, 2 * MiB)]]}
    (d,) = device_peaks(read_snapshot(write(tmp_path, doc)))
    assert d.allocated.tolist() == [MiB, 2 * MiB, 2 * MiB, 0]
    (d,) = device_peaks(read_snapshot(write(tmp_path, {"segments": [], "device_traces": [[
        *free(A, MiB)]]})))  # fmt: skip
    assert d.consistent
    doc["device_traces"] = [[*free(A, MiB), ev("alloc", A, 2 * MiB), *free(A, 2 * MiB)]]
    doc["segments"] = []
    (d,) = device_peaks(read_snapshot(write(tmp_path, doc)))
    assert d.consistent  # 1 MiB allocated before, 0 at the end
    doc["device_traces"] = [[ev("alloc", A, 2 * MiB), *free(A, MiB)]]
    (d,) = device_peaks(read_snapshot(write(tmp_path, doc)))
    assert d.allocated.tolist() == [-MiB, MiB, MiB, 0] and not d.consistent


def test_devices_old_formats_and_extra_fields(tmp_path):
    # an old snapshot is the list of segments alone; blocks of old snapshots
    # may lack requested_size (their size counts); real ones carry more keys
    old = [seg(A, 2 * MiB, [(MiB, MiB)], device=1), seg(S, 2 * MiB, [(2 * MiB, None)])]
    del old[0]["blocks"][0]["requested_size"]
    old[0]["blocks"].append({"size": MiB, "state": "inactive"})
    old[0]["is_expandable"] = False
    got = {d.device: (d.allocated_peak, d.reserved_peak) for d in
           device_peaks(read_snapshot(write(tmp_path, old, protocol=2)))}  # fmt: skip
    assert got == {0: (0, 2 * MiB), 1: (MiB, 2 * MiB)}
    doc = {"segments": [seg(A, 512, [(512, 5)], device=1)], "device_traces": [[], [
           ev("alloc", A, 5), {"action": "snapshot"}, {"action": "oom", "size": 7}]]}  # fmt: skip
    (d,) = device_peaks(read_snapshot(write(tmp_path, doc)))
    assert (d.device, d.allocated_peak, d.actions) == (1, 5, {"alloc": 1, "snapshot": 1, "oom": 1})


# ---- refused in one line ---------------------------------------------------------------
class Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch BOOM",))


def bad(tmp_path, data: bytes) -> str:
    p = tmp_path / "bad.pickle"
    p.write_bytes(data)
    with pytest.raises(SnapshotError) as e:
        read_snapshot(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(p))
    return msg.removeprefix(f"{p}: ")


def test_a_pickle_that_names_code_is_refused_unrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    msg = bad(tmp_path, pickle.dumps({"segments": [Boom()]}))
    assert "names the Python object" in msg and "system" in msg
    assert not (tmp_path / "BOOM").exists()
    msg = bad(tmp_path, pickle.dumps({"segments": [], "x": SnapshotError("x")}))
    assert "memplan.sim.snapshot_read.SnapshotError" in msg


def test_broken_files(tmp_path):
    good = pickle.dumps(real_run())
    assert bad(tmp_path, b"").startswith("not a readable pickle (EOFError")
    assert bad(tmp_path, b"hello, world\n").startswith("not a readable pickle")
    assert bad(tmp_path, good[: len(good) // 2]).startswith("not a readable pickle")
    assert bad(tmp_path, b'{"segments": []}').startswith("not a readable pickle")
    assert bad(tmp_path, pickle.dumps([1, 2])) == "segments[0]: expected an object, got 1"
    assert bad(tmp_path, pickle.dumps("text")) == (
        "expected a snapshot (a dict with segments and device_traces), got str"
    )
    assert bad(tmp_path, pickle.dumps({"device_traces": []})) == (
        "no 'segments': not a PyTorch memory snapshot"
    )
    with pytest.raises(SnapshotError, match="no such snapshot file"):
        read_snapshot(tmp_path / "missing.pickle")
    with pytest.raises(SnapshotError, match="is a directory"):
        read_snapshot(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["device_traces"][0][2].update(size="4"),
         'device_traces[0][2].size: expected an integer, got "4"'),
        (lambda d: d["device_traces"][0][2].update(size=-1),
         "device_traces[0][2].size: expected an integer in [0, 9223372036854775807], got -1"),
        (lambda d: d["device_traces"][0][1].pop("addr"),
         "device_traces[0][1].addr: expected an integer, got null"),
        (lambda d: d["device_traces"][0][6].update(action=None),
         "device_traces[0][6].action: expected a string, got null"),
        (lambda d: d["device_traces"][0][0].update(time_us=float("nan")),
         "device_traces[0][0].time_us: expected a finite number, got NaN"),
        (lambda d: d["device_traces"][0].__setitem__(3, [1]),
         "device_traces[0][3]: expected an object, got [1]"),
        (lambda d: d.update(device_traces={"0": []}),
         'device_traces: expected a list, got {"0": []}'),
        (lambda d: d["segments"][1].update(total_size=2**64),
         "segments[1].total_size: expected an integer in [0, 9223372036854775807], "
         "got 18446744073709551616"),
        (lambda d: d["segments"][0]["blocks"][1].update(state=3),
         "segments[0].blocks[1].state: expected a string, got 3"),
        (lambda d: d["segments"][0]["blocks"].pop(),
         "segments[0].blocks: sizes add up to 12582912, not the segment's total_size 20971520"),
        (lambda d: d["segments"][0].update(blocks=None),
         "segments[0].blocks: expected a list, got null"),
        (lambda d: d["segments"][0].update(device=True),
         "segments[0].device: expected an integer, got true"),
    ],
)  # fmt: skip
def test_wrong_fields_are_named(tmp_path, change, message):
    doc = real_run()
    change(doc)
    assert bad(tmp_path, pickle.dumps(doc)) == message


def test_size_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot_read, "MAX_SNAPSHOT_BYTES", 100)
    data = pickle.dumps(real_run())
    assert bad(tmp_path, data) == (
        f"{len(data)} bytes, more than a snapshot may have (100; NOTE [ File sizes ])"
    )
