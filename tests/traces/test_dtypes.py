"""Every torch dtype is a trace dtype (NOTE [ Trace dtypes ] in traces/model.py):
its name and bytes per element match the installed torch, and a view of it
is written and read back with the loader's span check intact."""

from __future__ import annotations

import pytest
import torch
from memplan.traces import io
from memplan.traces.errors import TraceError
from memplan.traces.model import DTYPE_BYTES, Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View


def _torch_dtypes() -> dict[str, torch.dtype]:
    """Every `torch.dtype` torch exports, by the name a capture writes
    (aliases such as `torch.half` fold into their dtype's own name)."""
    return {
        str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
    }


TORCH_DTYPES = _torch_dtypes()


@pytest.mark.filterwarnings("ignore:.*(ComplexHalf|quantize_per_tensor).*:UserWarning")
def test_every_torch_dtype_is_listed_with_torchs_element_size():
    # a dtype added by a newer torch fails here instead of in a reader
    missing = sorted(set(TORCH_DTYPES) - set(DTYPE_BYTES))
    assert missing == []
    for name, d in TORCH_DTYPES.items():
        assert DTYPE_BYTES[name] == d.itemsize, name
        assert DTYPE_BYTES[name] == torch.empty((), dtype=d, device="meta").element_size(), name


def test_table_holds_only_torch_dtypes():
    # no made-up names: each key is a dtype this torch has
    assert sorted(set(DTYPE_BYTES) - set(TORCH_DTYPES)) == []


def test_the_dtypes_the_issue_named_by_hand():
    # uint64: the philox seed of flash attention; sub-byte and packed: 1 byte
    assert DTYPE_BYTES["uint64"] == 8
    assert DTYPE_BYTES["uint16"] == 2 and DTYPE_BYTES["uint32"] == 4
    assert DTYPE_BYTES["complex32"] == 4  # two float16
    assert DTYPE_BYTES["qint32"] == 4 and DTYPE_BYTES["quint4x2"] == 1
    assert DTYPE_BYTES["float4_e2m1fn_x2"] == 1 and DTYPE_BYTES["float8_e8m0fnu"] == 1
    assert DTYPE_BYTES["int4"] == 1 and DTYPE_BYTES["uint1"] == 1
    assert DTYPE_BYTES["bits16"] == 2 and DTYPE_BYTES["bits1x8"] == 1


# A strided view: shape (3, 2), stride (1, 3), offset 2 reaches element
# 2 + (3-1)*1 + (2-1)*3 = 7, so it spans 8 elements: 8 * itemsize bytes.
_SHAPE, _STRIDE, _OFFSET, _ELEMENTS = (3, 2), (1, 3), 2, 8


def _trace_of(dtypes: list[str], short_by: int = 0) -> Trace:
    """One buffer and one strided view per dtype, each buffer exactly the
    view's span (less `short_by` bytes), all read by one op."""
    bufs = tuple(
        Buffer(i, _ELEMENTS * DTYPE_BYTES[d] - short_by, BufferKind.INPUT, True, d)
        for i, d in enumerate(dtypes)
    )
    views = tuple(View(i, i, _SHAPE, _STRIDE, _OFFSET, d) for i, d in enumerate(dtypes))
    args = {"args": [{"view": i} for i in range(len(dtypes))], "kwargs": {}}
    ops = (Op(0, "aten.cat.default", Phase.FORWARD, tuple(range(len(dtypes))), (), args),)
    return Trace(TraceMeta("dtypes", 1), bufs, views, ops)


def test_a_view_of_every_dtype_saves_and_loads(tmp_path):
    names = sorted(TORCH_DTYPES)
    t = _trace_of(names)
    io.save(t, tmp_path / "t.json.gz")
    back = io.load(tmp_path / "t.json.gz")
    assert [v.dtype for v in back.views] == names
    assert io.to_dict(back) == io.to_dict(t)
    # uint64: 8 elements of 8 bytes; complex128: 8 of 16
    by_name = {b.name: b.nbytes for b in back.buffers}
    assert by_name["uint64"] == 64 and by_name["complex128"] == 128 and by_name["int3"] == 8


@pytest.mark.parametrize("dtype", ["uint64", "complex32", "float4_e2m1fn_x2", "qint32", "int1"])
def test_span_check_counts_the_new_dtypes(dtype, tmp_path):
    # one byte short of the view's span is refused, naming both sizes
    span = _ELEMENTS * DTYPE_BYTES[dtype]
    io.save(_trace_of([dtype], short_by=1), tmp_path / "t.json")
    refused = rf"views\[0\]: spans {span} bytes but buffer 0 has {span - 1} bytes"
    with pytest.raises(TraceError, match=refused):
        io.load(tmp_path / "t.json")


def test_unknown_dtype_is_one_line_naming_the_view():
    d = io.to_dict(_trace_of(["uint64"]))
    d["views"][0]["dtype"] = "uint128"
    with pytest.raises(TraceError, match=r'^views\[0\]\.dtype: unknown dtype "uint128"') as e:
        io.from_dict(d)
    assert "\n" not in str(e.value)
