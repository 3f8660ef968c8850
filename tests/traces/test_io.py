"""Trace files: round trip, fingerprint, and one test per malformed case."""

from __future__ import annotations

import copy
import gzip
import json

import pytest
from memplan.traces import io
from memplan.traces.errors import TraceError
from memplan.traces.io import fingerprint
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View

MiB = 1 << 20


def toy() -> Trace:
    """w (4 MiB param) and x (1 MiB input); a = mm(w, x) 2 MiB; r = relu(a) 3 MiB."""
    bufs = (
        Buffer(0, 4 * MiB, BufferKind.PARAM, True, "w"),
        Buffer(1, 1 * MiB, BufferKind.INPUT, False, "x", freed_after=2),
        Buffer(2, 2 * MiB, BufferKind.ACTIVATION, freed_after=2),
        Buffer(3, 3 * MiB, BufferKind.ACTIVATION, freed_after=2),
    )
    views = tuple(View(i, i, (b.nbytes // 4,), (1,), 0, "float32") for i, b in enumerate(bufs))
    ops = (
        Op(
            0,
            "aten.mm.default",
            Phase.FORWARD,
            (0, 1),
            (2,),
            {"args": [{"view": 0}, {"view": 1}], "kwargs": {}},
        ),
        Op(
            1, "aten.relu.default", Phase.FORWARD, (2,), (3,), {"args": [{"view": 2}], "kwargs": {}}
        ),
        Op(2, "aten.sum.default", Phase.BACKWARD, (3,), (), {"args": [{"view": 3}], "kwargs": {}}),
    )
    return Trace(TraceMeta("toy", 1), bufs, views, ops)


def test_round_trip_json_and_gzip(tmp_path):
    t = toy()
    for name in ("t.json", "t.json.gz"):
        io.save(t, tmp_path / name)
        back = io.load(tmp_path / name)
        assert io.to_dict(back) == io.to_dict(t)
        assert fingerprint(back) == fingerprint(t)
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes())[:1] == b"{"


def test_fingerprint_changes_with_content_not_with_durations():
    t = toy()
    d = io.to_dict(t)
    d["ops"][0]["duration_us"] = 12.5
    assert fingerprint(io.from_dict(d)) == fingerprint(t)
    d["buffers"][2]["nbytes"] = 3 * MiB
    assert fingerprint(io.from_dict(d)) != fingerprint(t)


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    io.save(toy(), tmp_path / "a.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def _broken(edit) -> dict:
    d = copy.deepcopy(io.to_dict(toy()))
    edit(d)
    return d


MALFORMED = [
    ("missing schema", lambda d: d.pop("schema"), "schema: missing"),
    (
        "wrong schema",
        lambda d: d.update(schema="memplan.trace/9"),
        "schema: expected 'memplan.trace/1'",
    ),
    (
        "unknown view in reads",
        lambda d: d["ops"][1]["reads"].__setitem__(0, 999),
        "ops[1].reads[0]: unknown view 999",
    ),
    (
        "unknown view in writes",
        lambda d: d["ops"][0]["writes"].append(42),
        "ops[0].writes[1]: unknown view 42",
    ),
    (
        "unknown view in args",
        lambda d: d["ops"][0]["args"]["args"].__setitem__(1, {"view": 77}),
        "ops[0].args.args[1]: unknown view 77",
    ),
    (
        "unknown buffer of a view",
        lambda d: d["views"][2].update(buffer=9),
        "views[2].buffer: unknown buffer 9",
    ),
    (
        "duplicate buffer id",
        lambda d: d["buffers"][2].update(id=1),
        "buffers[2].id: duplicate id 1 (also buffers[1])",
    ),
    (
        "duplicate op id",
        lambda d: d["ops"][2].update(id=0),
        "ops[2].id: duplicate id 0 (also ops[0])",
    ),
    (
        "id not its position",
        lambda d: d["views"][3].update(id=7),
        "views[3].id: expected 3 (ids are positions), got 7",
    ),
    (
        "negative size",
        lambda d: d["buffers"][3].update(nbytes=-5),
        "buffers[3].nbytes: expected an integer in [0, 4611686018427387904], got -5",
    ),
    (
        "view larger than its buffer",
        lambda d: d["views"][1].update(shape=[MiB // 4 + 1]),
        "views[1]: spans 1048580 bytes but buffer 1 has 1048576 bytes",
    ),
    (
        "read before any write",
        lambda d: d["ops"][0]["reads"].append(3),
        "ops[0].reads[2]: view 3 of buffer 3 is read before any op writes it",
    ),
    (
        "unknown kind",
        lambda d: d["buffers"][0].update(kind="weights"),
        'buffers[0].kind: unknown BufferKind "weights" (one of input, param,',
    ),
    (
        "unknown phase",
        lambda d: d["ops"][0].update(phase="fwd"),
        'ops[0].phase: unknown Phase "fwd" (one of forward, backward, optimizer)',
    ),
    (
        "access after free",
        lambda d: d["buffers"][2].update(freed_after=0),
        "buffers[2].freed_after: freed after op 0 but ops[1] accesses it",
    ),
    (
        "freed_after outside the trace",
        lambda d: d["buffers"][2].update(freed_after=3),
        "buffers[2].freed_after: 3 is not an op index (0..2)",
    ),
    (
        "wrong field type",
        lambda d: d["buffers"][1].update(nbytes="big"),
        'buffers[1].nbytes: expected an integer, got "big"',
    ),
    ("missing field", lambda d: d["ops"][1].pop("target"), "ops[1].target: missing"),
]


@pytest.mark.parametrize("name,edit,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_trace_names_the_location(tmp_path, name, edit, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_broken(edit)))
    with pytest.raises(TraceError) as e:
        io.load(path)
    assert str(e.value) == f"{path}: {message}" or str(e.value).startswith(f"{path}: {message}")
    assert "\n" not in str(e.value)


def test_bad_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "memplan.trace/1", "meta": ')
    with pytest.raises(TraceError, match=r"bad.json: not valid JSON: Expecting value: line 1"):
        io.load(bad)
    with pytest.raises(TraceError, match=r"nope.json: no such trace file"):
        io.load(tmp_path / "nope.json")
    gz = tmp_path / "bad.json.gz"
    gz.write_bytes(gzip.compress(b'{"schema": "memplan.trace/1"}')[:-6])
    with pytest.raises(TraceError, match=r"bad.json.gz: corrupt gzip data"):
        io.load(gz)


def test_file_sizes_are_bounded(tmp_path, monkeypatch):
    # NOTE [ File sizes ], with the cap at 1000 bytes: a file above it is not
    # read, a gzip that inflates past it is cut off there, a truncated one is
    # corrupt, and a trace within it loads
    monkeypatch.setattr(io, "MAX_JSON_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text(" " * 1001)
    with pytest.raises(TraceError, match=r"big.json: larger than"):
        io.load(big)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * 10**5, compresslevel=9))  # 100 KB of JSON in ~150 B
    assert bomb.stat().st_size <= 1000
    with pytest.raises(TraceError, match=r"bomb.json.gz: larger than"):
        io.load(bomb)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(b"[1, 2, 3]")[:-12])
    with pytest.raises(TraceError, match=r"cut.json.gz: corrupt gzip data"):
        io.load(cut)
    small = tmp_path / "small.json.gz"
    small.write_bytes(gzip.compress(b" " * 999 + b"1"))
    with pytest.raises(TraceError, match=r"small.json.gz: top level: expected an object"):
        io.load(small)


def test_shipped_traces_by_name():
    """NOTE [ Shipped traces by name ]: the stem, or the model alone when one
    shipped trace starts with it."""
    names = io.shipped()
    assert "resnet50_b16_adam" in names
    full = io.load("zoo:resnet50_b16_adam")
    assert fingerprint(io.load("zoo:resnet50")) == fingerprint(full)
    assert io.resolve("zoo:resnet50") == io.DATA_DIR / "resnet50_b16_adam.json.gz"
    with pytest.raises(TraceError, match=r"zoo:resnet: is not a shipped trace \(shipped: bert"):
        io.load("zoo:resnet")
    with pytest.raises(TraceError, match="zoo:: is not a shipped trace"):
        io.load("zoo:")


def test_jobs_may_name_shipped_traces_with_a_count():
    from memplan.commands.compare import parse_jobs

    a, b = parse_jobs(["zoo:gpt2:2"])
    assert a is b and a.meta.model == "gpt2"
