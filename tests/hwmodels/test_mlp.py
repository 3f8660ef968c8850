"""The MLP latency model: training on a known function, save/load, fallback, errors."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.dataset import Dataset, DatasetMeta
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.evaluate import evaluate, summarize
from memplan.hwmodels.features import op_costs
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.mlp import DEFAULT_MODEL, MLPLatency
from memplan.hwmodels.mlptrain import TrainOptions, train_mlp

from tests.hwmodels.handmade import Call, add, device, make, mm

HW = device("hand-cpu")
FAST = TrainOptions(hidden=(32, 32), ensemble=2, epochs=400, lr=1e-2)


def truth(trace, usage):
    """The 'device': matmuls at 50 GFLOP/s + 2 us, adds at 10 GB/s + 1 us,
    perfectly time-shared."""
    c = op_costs(trace)
    t = np.where(c.flops > 0, 2e-6 + c.flops / 5e10, 1e-6 + (c.bytes_read + c.bytes_written) / 1e10)
    return t / (1.0 - usage)


def synthetic_dataset(seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    calls = [mm(*(int(x) for x in 2 ** rng.uniform(4, 9, 3))) for _ in range(120)]
    calls += [add(int(2 ** rng.uniform(8, 20))) for _ in range(80)]
    trace = make(calls)
    op = np.repeat(np.arange(trace.n_ops), 2)
    usage = np.tile([0.0, 0.5], trace.n_ops)
    lat = truth(trace, 0.0)[op] / (1.0 - usage)
    return Dataset(DatasetMeta(device="cpu", hardware="hand-cpu"), trace, op, usage, lat)


@pytest.fixture(scope="module")
def trained():
    ds = synthetic_dataset()
    return ds, train_mlp(ds, FAST)


def test_learns_a_known_function_on_held_out_shapes(trained):
    ds, model = trained
    held = ds.heldout()
    assert 0.1 < held.mean() < 0.3  # about a fifth of the shapes, by content hash
    errors = evaluate(model, ds, HW)
    assert errors["all"].n == held.sum()
    assert errors["all"].mdape < 0.05
    assert errors["matmul"].within_20 > 0.9 and errors["elementwise"].within_20 > 0.9
    assert model.last_stats.n_fallback == 0
    assert model.meta.hardware == "hand-cpu" and model.meta.n_train == (~held).sum()


def test_save_load_round_trip(trained, tmp_path):
    ds, model = trained
    path = tmp_path / "m.pt"
    model.save(path)
    back = MLPLatency.load(path)
    assert back.meta == model.meta
    assert {c: n.spec for c, n in back.nets.items()} == {c: n.spec for c, n in model.nets.items()}
    for u in (0.0, 0.3):
        assert np.array_equal(back.predict_all(ds.trace, HW, u), model.predict_all(ds.trace, HW, u))


def test_scalar_and_vectorised_paths_agree(trained):
    _, model = trained
    t = make(
        [
            mm(64, 32, 128),
            add(5000),
            mm(8192, 8192, 8192),
            Call("aten.t.default", ((3, 4),), (4, 3), ["$0"]),
        ]
    )
    for u in (0.0, 0.4, 0.9):
        vec = model.predict_all(t, HW, u)
        for op in t.ops:
            assert model.predict(op, t, HW, u) == pytest.approx(vec[op.id], rel=1e-9)


def test_falls_back_to_the_roofline_outside_what_it_saw(trained):
    _, model = trained
    conv = Call("aten.convolution.default", ((1, 3, 8, 8), (4, 3, 3, 3)), (1, 4, 6, 6),
                ["$0", "$1", None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1])  # fmt: skip
    bmm = Call("aten.bmm.default", ((2, 64, 64), (2, 64, 64)), (2, 64, 64), ["$0", "$1"])
    t = make([mm(64, 64, 64), mm(8192, 8192, 8192), bmm, conv])
    got = model.predict_all(t, HW)
    roof = Roofline().predict_all(t, HW)
    st = model.last_stats
    assert (st.n_ops, st.n_mlp, st.n_fallback) == (4, 1, 3)
    assert st.fallback_by_reason == {
        "outside training range: log_flops": 1,
        "op bmm not in training set": 1,
        "no model for class conv": 1,
    }
    assert st.fallback_by_class == {"matmul": 2, "conv": 1}
    assert got[1:].tolist() == roof[1:].tolist()
    assert got[0] == pytest.approx(truth(t, 0.0)[0], rel=0.1)


def test_pointwise_ops_share_their_family(trained):
    _, model = trained
    # only `add` was measured, but `sub` and `mul` are the same kind of kernel
    sub = Call("aten.sub.Tensor", ((5000,), (5000,)), (5000,), ["$0", "$1"])
    model.predict_all(make([sub]), HW)
    assert model.last_stats.n_mlp == 1
    exp = Call("aten.exp.default", ((5000,),), (5000,), ["$0"])
    model.predict_all(make([exp]), HW)
    assert model.last_stats.fallback_by_reason == {"op exp not in training set": 1}


def test_usage_beyond_training_is_stretched(trained):
    _, model = trained
    t = make([mm(64, 64, 64)])
    at_max = model.predict_all(t, HW, 0.5)[0]  # the highest usage in the data
    beyond = model.predict_all(t, HW, 0.9)[0]
    assert model.last_stats.n_usage_extrapolated == 1
    assert beyond / at_max == pytest.approx((1 / 0.1) / (1 / 0.5))


def test_refuses_other_hardware(trained):
    _, model = trained
    with pytest.raises(LatencyError, match="measured on 'hand-cpu', not 'a100'"):
        model.predict_all(make([add(8)]), device("a100"))


def test_load_errors(tmp_path):
    with pytest.raises(LatencyError, match="no such latency model"):
        MLPLatency.load(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a zip")
    with pytest.raises(LatencyError, match="not a saved latency model"):
        MLPLatency.load(junk)


def test_summarize_by_hand():
    s = summarize(np.array([1.05, 1.3, 0.5, 1.15]), np.ones(4))
    # errors 5%, 30%, 50%, 15%: median 22.5%, one within 10%, two within 20%
    assert (s.n, s.mdape, s.within_10, s.within_20) == (4, pytest.approx(0.225), 0.25, 0.5)


def test_train_options_are_checked():
    with pytest.raises(LatencyError, match="hidden"):
        TrainOptions(hidden=())
    with pytest.raises(LatencyError, match="ensemble"):
        TrainOptions(ensemble=0)


@pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="shipped model not built")
def test_shipped_model_times_the_shipped_resnet50():
    from pathlib import Path

    from memplan.hwmodels.profile import load_hardware
    from memplan.traces import io

    path = Path(__file__).parents[2] / "traces" / "data" / "resnet50_b16_adam.json.gz"
    if not path.exists():
        pytest.skip("shipped trace not captured")
    model = MLPLatency.load()
    assert model.meta.hardware == "cpu-local"
    trace = io.load(path)
    s = model.predict_all(trace, load_hardware("cpu-local"))
    assert s.shape == (trace.n_ops,) and np.isfinite(s).all() and (s >= 0).all()
    st = model.last_stats
    assert st.n_mlp > 0.8 * trace.n_ops
