"""One JSON field, checked (NOTE [ Fields from files ]), and the trace
loader's ranges (NOTE [ Trace sanity ranges ], NOTE [ Op targets ]): every
case worked out by hand."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from memplan.traces import fields, io
from memplan.traces.errors import TraceError
from memplan.traces.model import MAX_OP_FLOPS, MAX_OP_US, MAX_TRACE_BYTES, Phase

from tests.traces.test_io import toy

E = TraceError


# ---- fields ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, 7, 2**63 - 1])
def test_integer_takes_json_integers_within_int64(value):
    assert fields.integer(value, "x", E) == value


@pytest.mark.parametrize(
    "value,message",
    [
        (True, "x: expected an integer, got true"),
        (3.0, "x: expected an integer, got 3.0"),
        ("3", 'x: expected an integer, got "3"'),
        (None, "x: expected an integer, got null"),
        (math.nan, "x: expected an integer, got NaN"),
        (-1, "x: expected an integer in [0, 9223372036854775807], got -1"),
        (2**63, "x: expected an integer in [0, 9223372036854775807], got 9223372036854775808"),
    ],
)
def test_integer_refuses_everything_else(value, message):
    with pytest.raises(E) as e:
        fields.integer(value, "x", E)
    assert str(e.value) == message


def test_integer_bounds_are_inclusive():
    assert fields.integer(-5, "x", E, lo=-5, hi=5) == -5
    assert fields.integer(5, "x", E, lo=-5, hi=5) == 5
    with pytest.raises(E, match=r"x: expected an integer in \[-5, 5\], got 6"):
        fields.integer(6, "x", E, lo=-5, hi=5)


def test_number_is_finite_and_in_range():
    assert fields.number(3, "t", E) == 3.0 and isinstance(fields.number(3, "t", E), float)
    assert fields.number(0.5, "t", E, 0.0, 1.0) == 0.5
    for bad in (math.nan, math.inf, -math.inf, 10**400):  # 10**400: no float holds it
        with pytest.raises(E, match=r"^t: expected a finite number, got "):
            fields.number(bad, "t", E)
    for bad in ("1", None, [1], False):
        with pytest.raises(E, match=r"^t: expected a number, got "):
            fields.number(bad, "t", E)
    with pytest.raises(E, match=r"^t: expected a number in \[0, 1\], got 1.5$"):
        fields.number(1.5, "t", E, 0.0, 1.0)


def test_boolean_string_obj_array():
    assert fields.boolean(False, "p", E) is False
    for bad in ("false", 0, None):
        with pytest.raises(E, match=r"^p: expected true or false, got "):
            fields.boolean(bad, "p", E)
    assert fields.string("\ud800", "s", E) == "\ud800"  # any code point; printed escaped
    with pytest.raises(E, match=r'^s: expected a string, got \["x"\]$'):
        fields.string(["x"], "s", E)
    with pytest.raises(E, match=r"^o: expected an object, got \[\]$"):
        fields.obj([], "o", E)
    with pytest.raises(E, match=r"^a: expected a list, got null$"):
        fields.array(None, "a", E)


def test_text_refuses_lone_surrogates_and_says_where():
    assert fields.text("aten.mm.default", "t", E) == "aten.mm.default"
    assert fields.text("\U0001f600", "t", E) == "\U0001f600"  # a real astral character
    with pytest.raises(E) as e:
        fields.text("ab\ud800", "t", E)
    assert str(e.value) == 't: not valid Unicode text (a lone surrogate at position 2): "ab\\ud800"'


def test_enum_value_names_the_allowed_values():
    assert fields.enum_value(Phase, "backward", "ph", E) is Phase.BACKWARD
    with pytest.raises(E) as e:
        fields.enum_value(Phase, "fwd", "ph", E)
    assert str(e.value) == 'ph: unknown Phase "fwd" (one of forward, backward, optimizer)'
    with pytest.raises(E, match=r"^ph: expected a string \(one of forward, "):
        fields.enum_value(Phase, 1, "ph", E)


def test_depth_counts_lists_and_objects():
    """[[1]] is 2 deep; {"a": [{}]} is 3 deep; scalars add nothing."""
    assert fields.depth_at_most([[1]], "d", E, limit=2) == [[1]]
    fields.depth_at_most({"a": [{}]}, "d", E, limit=3)
    with pytest.raises(E, match=r"^d: nested more than 2 levels deep$"):
        fields.depth_at_most({"a": [{}]}, "d", E, limit=2)
    deep: list = []
    for _ in range(100_000):  # walked without recursion
        deep = [deep]
    with pytest.raises(E, match="nested more than 64"):
        fields.depth_at_most(deep, "d", E)


def test_parse_makes_every_failure_one_line():
    assert fields.parse(b'{"a": [1]}', "f", E) == {"a": [1]}
    with pytest.raises(E, match=r"^f: nested too deeply to be a memplan file$"):
        fields.parse("[" * 100_000 + "]" * 100_000, "f", E)
    with pytest.raises(E, match=r"^f: not valid JSON: "):
        fields.parse(b"\xe9", "f", E)
    with pytest.raises(E, match=r"^f: not valid JSON: "):
        fields.parse("1" * 5000, "f", E)  # past Python's integer digit limit


def test_shown_and_printable_are_safe_to_print():
    assert fields.printable("a\ud800b") == "a\\ud800b"
    assert fields.printable("plain é") == "plain é"
    assert fields.shown("x" * 100, limit=10) == '"xxxxxx...'
    assert fields.shown(math.nan) == "NaN"
    fields.shown("\udfff").encode("utf-8")  # no UnicodeEncodeError


# ---- the trace loader's ranges --------------------------------------------------------
def _load(tmp_path, edit):
    d = copy.deepcopy(io.to_dict(toy()))
    edit(d)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))
    return io.load(path), path


def _refused(tmp_path, edit, message):
    with pytest.raises(TraceError) as e:
        _load(tmp_path, edit)
    assert str(e.value) == f"{tmp_path / 't.json'}: {message}"


def test_total_bytes_stay_within_2_62(tmp_path):
    """toy's buffers: 4, 1, 2, 3 MiB. Buffer 0 at 2**62 - 6 MiB fills the
    cap exactly with the others; one byte more and buffer 3, the one that
    crosses it, is named."""
    MiB = 1 << 20
    t, _ = _load(tmp_path, lambda d: d["buffers"][0].update(nbytes=MAX_TRACE_BYTES - 6 * MiB))
    assert int(t.nbytes.sum()) == MAX_TRACE_BYTES and t.nbytes.dtype == np.int64
    assert t.peak() == (MAX_TRACE_BYTES, 1)  # op 1 holds w, x, a and r: every byte, no wrap
    _refused(
        tmp_path,
        lambda d: d["buffers"][0].update(nbytes=MAX_TRACE_BYTES - 6 * MiB + 1),
        f"buffers[3].nbytes: the buffers up to here hold {MAX_TRACE_BYTES + 1} bytes, "
        f"more than {MAX_TRACE_BYTES} (2**62) in all",
    )


def test_flops_durations_and_workspace_have_sanity_caps(tmp_path):
    t, _ = _load(tmp_path, lambda d: d["ops"][0].update(flops=MAX_OP_FLOPS, duration_us=MAX_OP_US))
    assert t.ops[0].flops == 10**20 and t.ops[0].duration_us == 86_400e6
    _refused(
        tmp_path,
        lambda d: d["ops"][0].update(flops=MAX_OP_FLOPS + 1),
        "ops[0].flops: expected an integer in [0, 100000000000000000000], "
        "got 100000000000000000001",
    )
    _refused(
        tmp_path,
        lambda d: d["ops"][1].update(duration_us=1e308),
        "ops[1].duration_us: expected a number in [0, 8.64e+10], got 1e+308",
    )
    _refused(
        tmp_path,
        lambda d: d["ops"][2].update(workspace_bytes=-1),
        "ops[2].workspace_bytes: expected an integer in [0, 4611686018427387904], got -1",
    )
    t, _ = _load(tmp_path, lambda d: d["ops"][2].update(duration_us=None))
    assert t.ops[2].duration_us is None  # measured durations stay optional


def test_strict_types_where_python_would_coerce(tmp_path):
    _refused(
        tmp_path,
        lambda d: d["buffers"][1].update(persistent="false"),
        'buffers[1].persistent: expected true or false, got "false"',
    )
    _refused(tmp_path, lambda d: d.update(saved=None), "saved: expected a list, got null")
    _refused(
        tmp_path,
        lambda d: d["views"][0].update(stride=["x"]),
        'views[0].stride[0]: expected an integer, got "x"',
    )
    _refused(
        tmp_path,
        lambda d: d["ops"][0].update(flops="abc"),
        'ops[0].flops: expected an integer, got "abc"',
    )
    _refused(
        tmp_path,
        lambda d: d["ops"][0].update(args={"args": [[[[0]]]] * 1, "k": _deep_list(70)}),
        "ops[0].args: nested more than 64 levels deep",
    )


def _deep_list(n):
    x: list = []
    for _ in range(n):
        x = [x]
    return x


def test_names_may_hold_anything_but_targets_must_be_text(tmp_path):
    """NOTE [ Op targets ]"""

    def names(d):
        d["meta"]["model"] = "m\ud800"
        d["buffers"][0]["name"] = "\udfff"
        d["ops"][0]["module"] = "\ud83d"

    t, _ = _load(tmp_path, names)
    assert t.buffers[0].name == "\udfff" and t.meta.model == "m\ud800"
    _refused(
        tmp_path,
        lambda d: d["ops"][1].update(target="aten.relu.default\ud800"),
        "ops[1].target: not valid Unicode text (a lone surrogate at position 17): "
        '"aten.relu.default\\ud800"',
    )


def test_a_record_is_its_fields_in_order_as_json_values():
    """`fields.record`: declaration order, enums by value, tuples as lists,
    NaN as None, `omit` left out; dicts and None as they are."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class R:
        z: int
        phase: Phase
        ops: tuple
        eor: float
        skipped: object
        stats: dict
        peak: int | None = None

    stats = {"a": 1}
    r = R(3, Phase.BACKWARD, (1, (Phase.FORWARD, 2)), math.nan, object(), stats)
    doc = fields.record(r, omit=("skipped",))
    assert list(doc) == ["z", "phase", "ops", "eor", "stats", "peak"]
    assert doc == {"z": 3, "phase": "backward", "ops": [1, ["forward", 2]], "eor": None,
                   "stats": {"a": 1}, "peak": None}  # fmt: skip
    assert doc["stats"] is stats
    assert json.dumps(fields.record(R(1, Phase.OPTIMIZER, (), 0.5, None, {}))) == (
        '{"z": 1, "phase": "optimizer", "ops": [], "eor": 0.5, "skipped": null, '
        '"stats": {}, "peak": null}'
    )
