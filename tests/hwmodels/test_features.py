"""Op classes, argument binding and MLP features from `Op.args` + view shapes."""

from __future__ import annotations

import math

import pytest
from memplan.hwmodels.features import class_features, feature_names, op_costs, single_op_features
from memplan.hwmodels.opclass import OpClass, base_name, bind, classify, is_inplace
from memplan.traces.model import Phase

from tests.hwmodels.handmade import Call, make, mm


@pytest.mark.parametrize(
    ("target", "cls"),
    [
        ("aten.convolution.default", OpClass.CONV),
        ("aten.convolution_backward.default", OpClass.CONV),
        ("aten.addmm.default", OpClass.MATMUL),
        ("aten.bmm.default", OpClass.MATMUL),
        ("aten.native_batch_norm_backward.default", OpClass.NORM),
        ("aten.native_layer_norm.default", OpClass.NORM),
        ("aten.relu_.default", OpClass.ELEMENTWISE),
        ("aten.threshold_backward.default", OpClass.ELEMENTWISE),
        ("aten.add_.Tensor", OpClass.ELEMENTWISE),
        ("aten.addcdiv_.default", OpClass.OPTIMIZER),
        ("aten._foreach_add_.List", OpClass.OPTIMIZER),
        ("aten.mean.dim", OpClass.REDUCTION),
        ("aten._log_softmax.default", OpClass.REDUCTION),
        ("aten.nll_loss_forward.default", OpClass.REDUCTION),
        ("aten.max_pool2d_with_indices.default", OpClass.REDUCTION),
        ("aten.view.default", OpClass.VIEW),
        ("aten.t.default", OpClass.VIEW),
        ("aten._unsafe_view.default", OpClass.VIEW),
        ("aten.empty.memory_format", OpClass.VIEW),
        ("aten.cat.default", OpClass.OTHER),
        ("aten.embedding.default", OpClass.OTHER),
        ("mylib.custom.default", OpClass.OTHER),
    ],
)
def test_classify(target, cls):
    assert classify(target) is cls


def test_vocab_tokens():
    from memplan.hwmodels.opclass import vocab_token

    assert vocab_token("aten.add_.Tensor") == "arith/add"
    assert vocab_token("aten.threshold_backward.default") == "arith/threshold_backward"
    assert vocab_token("aten.rsqrt.default") == "divide/rsqrt"
    assert vocab_token("aten.gelu.default") == "transcendental/gelu"
    assert vocab_token("aten.zeros.default") == "fill/zeros"
    assert vocab_token("aten.mm.default") == "mm"
    assert vocab_token("aten.addcdiv_.default") == "addcdiv"


def test_names():
    assert base_name("aten.relu_.default") == "relu"
    assert base_name("aten._foreach_mul_.Scalar") == "_foreach_mul"
    assert base_name("aten._log_softmax.default") == "_log_softmax"
    assert is_inplace("aten.add_.Tensor") and not is_inplace("aten.add.Tensor")
    assert not is_inplace("aten.__iand__.Tensor")


def test_bind_names_positional_args_and_fills_defaults():
    a = bind("aten.add.Tensor", {"args": [{"view": 0}, {"view": 1}], "kwargs": {}})
    assert a == {"self": {"view": 0}, "other": {"view": 1}, "alpha": 1}
    a = bind("aten.addcmul_.default", {"args": [1, 2, 3], "kwargs": {"value": 0.5}})
    assert a["tensor2"] == 3 and a["value"] == 0.5
    assert bind("mylib.custom.default", {"args": [7]}) == {"_0": 7}


CONV = Call(
    "aten.convolution.default", ((2, 3, 8, 8), (4, 3, 3, 3)), (2, 4, 4, 4),
    ["$0", "$1", None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1],
)  # fmt: skip
CONV_BWD = Call(
    "aten.convolution_backward.default", ((2, 4, 4, 4), (2, 3, 8, 8), (4, 3, 3, 3)), (2, 3, 8, 8),
    ["$0", "$1", "$2", None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]],
    phase=Phase.BACKWARD,
)  # fmt: skip


def _feat(row, c, name):
    return row[feature_names(c).index(name)]


def test_conv_features_by_hand():
    t = make([CONV, CONV_BWD])
    c = op_costs(t)
    fwd = 2 * 2 * 4 * 4 * 4 * 3 * 9  # 2 x N x Cout x Ho x Wo x Cin x k x k = 6912
    assert c.flops.tolist() == [fwd, 2 * fwd]  # backward: grad_input + grad_weight
    cf = class_features(t)[OpClass.CONV]
    assert cf.op_names == ("convolution", "convolution_backward")
    f, b = cf.X
    lg = lambda x: math.log2(1 + x)  # noqa: E731
    assert _feat(f, OpClass.CONV, "log_flops") == pytest.approx(lg(fwd))
    assert [_feat(f, OpClass.CONV, n) for n in ("log_n", "log_cin", "log_h", "log_cout", "log_kh")] == \
        pytest.approx([lg(2), lg(3), lg(8), lg(4), lg(3)])  # fmt: skip
    assert [_feat(f, OpClass.CONV, n) for n in ("stride_h", "pad_w", "transposed", "backward")] == [
        2,
        1,
        0,
        0,
    ]
    assert _feat(f, OpClass.CONV, "log_hout") == pytest.approx(lg(4))
    assert [
        _feat(b, OpClass.CONV, n) for n in ("backward", "grad_input", "grad_weight", "bias")
    ] == [1, 1, 1, 0]
    assert _feat(b, OpClass.CONV, "log_hout") == pytest.approx(lg(4))  # from grad_output


def test_matmul_features_see_transposed_operands():
    t_view = ((64, 32), (1, 64))  # a (64, 32) view of a column-major buffer: a .t()
    t = make([Call("aten.addmm.default", ((32,), (16, 64), t_view), (16, 32), ["$0", "$1", "$2"]),
              mm(8, 4, 2)])  # fmt: skip
    cf = class_features(t)[OpClass.MATMUL]
    names = feature_names(OpClass.MATMUL)
    addmm = dict(zip(names, cf.X[0], strict=True))
    assert addmm["log_m"] == pytest.approx(math.log2(17))
    assert addmm["log_k"] == pytest.approx(math.log2(65))
    assert addmm["log_n"] == pytest.approx(math.log2(33))
    assert (addmm["a_transposed"], addmm["b_transposed"], addmm["bias"]) == (0, 1, 1)
    assert op_costs(t).flops[0] == 2 * 16 * 64 * 32  # analytic: the hand trace has no flops


def test_single_op_features_match_the_matrix():
    t = make([CONV, mm(8, 4, 2), Call("aten.t.default", ((3, 4),), (4, 3), ["$0"])])
    feats = class_features(t)
    c, row, name = single_op_features(t.ops[1], t)
    assert c is OpClass.MATMUL and name == "mm"
    assert row.tolist() == feats[OpClass.MATMUL].X[0].tolist()
    c, row, _ = single_op_features(t.ops[2], t)
    assert c is OpClass.VIEW and row is None
    assert OpClass.VIEW not in feats
    assert class_features(t) is feats  # cached


def test_elementwise_features_count_int_and_float_scalars_apart():
    t = make([
        Call("aten.add_.Tensor", ((1, 1),), (1, 1), ["$0", 1], dtype="int64", inplace=True),
        Call("aten.mul.Tensor", ((3, 4),), (3, 4), ["$0", 1.5]),
        Call("aten.add.Tensor", ((8,), (8,)), (8,), ["$0", "$1"], {"alpha": 0.5}),
    ])  # fmt: skip
    X = class_features(t)[OpClass.ELEMENTWISE].X
    names = ("n_int_scalars", "n_float_scalars", "floating", "inplace", "n_tensors")
    got = [[_feat(row, OpClass.ELEMENTWISE, n) for n in names] for row in X]
    # add_(counter, 1): other=1 and alpha's default 1 are ints; an int64 tensor
    assert got[0] == [2, 0, 0, 1, 1]
    assert got[1] == [0, 1, 1, 0, 1]  # x * 1.5
    assert got[2] == [0, 1, 1, 0, 2]  # a + 0.5 * b: alpha given as a float


def test_other_features_see_indices_and_the_extents_around_dim():
    lg = lambda x: math.log2(1 + x)  # noqa: E731
    t = make([
        Call("aten.index_select.default", ((6, 18, 28), (8,)), (6, 8, 28), ["$0", 1, "$1"],
             input_dtypes=("float32", "int64")),
        Call("aten.embedding.default", ((100, 16), (5,)), (5, 16), ["$0", "$1"],
             input_dtypes=("float32", "int64")),
        Call("aten.cat.default", ((4,), (4,), (4,)), (12,), [["$0", "$1", "$2"], 0]),
    ])  # fmt: skip
    X = class_features(t)[OpClass.OTHER].X
    names = ("log_numel_index", "log_outer", "log_inner", "n_tensors", "log_numel_out")
    got = [[_feat(row, OpClass.OTHER, n) for n in names] for row in X]
    assert got[0] == pytest.approx([lg(8), lg(6), lg(28), 2, lg(6 * 8 * 28)])
    assert got[1] == pytest.approx([lg(5), lg(1), lg(16), 2, lg(80)])  # rows of the table
    assert got[2] == pytest.approx([0, lg(1), lg(1), 3, lg(12)])  # no indices
