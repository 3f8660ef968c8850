"""Op workspaces (NOTE [ Workspaces ] in hwmodels/device.py): the trace's own
wins, else the profile's estimate per op class; the simulator allocates them
for the op's duration with an allocator model, and the bounds count the
trace's own through the same function."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel, op_workspace_bytes
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.profile import load_hardware, profile_path, to_toml
from memplan.planners.analysis.bounds import working_sets
from memplan.sim import simulate
from memplan.traces.model import Trace

from tests.sim.handtraces import B, Call, MiB, gpu, make


def with_ops(trace: Trace, **per_op: dict) -> Trace:
    """`trace` with op fields replaced: per_op = {"1": {"workspace_bytes": n}}."""
    ops = tuple(dataclasses.replace(op, **per_op.get(str(op.id), {})) for op in trace.ops)
    return Trace(trace.meta, trace.buffers, trace.views, ops, trace.saved)


def estimating_gpu(conv: int, matmul: int):
    return dataclasses.replace(gpu(), conv_workspace_bytes=conv, matmul_workspace_bytes=matmul)


def test_the_trace_wins_then_the_class_estimate():
    t, _ = make(
        [B(1), B(1), B(1), B(1)], [Call([], [0]), Call([0], [1]), Call([1], [2]), Call([2], [3])]
    )
    t = with_ops(
        t,
        **{
            "0": {"target": "aten.mm.default"},
            "1": {"target": "aten.convolution.default"},
            "2": {"target": "aten.relu.default"},
            "3": {"target": "aten.addmm.default", "workspace_bytes": 7},
        },
    )
    hw = estimating_gpu(conv=3 * MiB, matmul=2 * MiB)
    assert op_workspace_bytes(t, hw).tolist() == [2 * MiB, 3 * MiB, 0, 7]
    assert op_workspace_bytes(t).tolist() == [0, 0, 0, 7]  # no profile: the trace's own
    # the bounds count the trace's own through the same function
    assert (working_sets(t) - working_sets(t, workspace=False)).tolist() == [0, 0, 0, 7]


def test_shipped_profiles_carry_the_cublas_workspace():
    # PyTorch's default cuBLAS workspace: 4096 KiB x 2 + 16 KiB x 8 before sm90
    assert load_hardware("a100-pcie-40gb").matmul_workspace_bytes == 8 * MiB + 128 * 1024
    assert load_hardware("h100-sxm-80gb").matmul_workspace_bytes == 32 * MiB
    assert load_hardware("cpu-local").matmul_workspace_bytes == 0


def ws_trace():
    """A (6 MiB) by op 0; op 1 reads A, makes B (6 MiB) with 5 MiB of workspace."""
    t, lat = make([B(6), B(6)], [Call([], [0]), Call([0], [1])])
    return with_ops(t, **{"1": {"workspace_bytes": 5 * MiB}}), lat


def test_workspace_lives_for_its_op_with_an_allocator_model():
    t, lat = ws_trace()
    dev = DeviceModel(gpu(), lat)
    assert simulate([t], dev).peak_bytes == 12 * MiB  # exact: tensor bytes only
    # smartpool: A, B and the workspace live together during op 1
    pooled = simulate([t], dev, allocator="smartpool")
    assert (pooled.peak_bytes, pooled.reserved_peak_bytes) == (17 * MiB, 17 * MiB)
    # caching: one 20 MiB segment, [A 6][B 6][ws 5][3 free]
    cached = simulate([t], dev, allocator="caching")
    assert (cached.allocated_peak_bytes, cached.reserved_peak_bytes) == (17 * MiB, 20 * MiB)
    # the workspace is freed when op 1 ends: the curve's last sample drops it
    kinds = cached.memory.by_kind
    assert kinds[:, -1].max() == 5 * MiB and kinds[-1, -1] == 0  # "other" is the last kind


@pytest.mark.parametrize(
    "allocator, ws_mib, budget_mib",
    [
        ("smartpool", 5, 16),  # 6 + 6 + 5 = 17 bytes live > 16
        ("caching", 9, 20),  # [A 6][B 6][8 free]: 9 MiB needs a second segment
    ],
)
def test_a_workspace_that_does_not_fit_is_out_of_memory_at_its_op(allocator, ws_mib, budget_mib):
    t, lat = ws_trace()
    t = with_ops(t, **{"1": {"workspace_bytes": ws_mib * MiB}})
    dev = DeviceModel(gpu(), lat)
    r = simulate([t], dev, budget=budget_mib * MiB, allocator=allocator)
    assert r.jobs[0].oom_at == (0, 1, -1)
    assert not simulate([t], dev, budget=budget_mib * MiB).oom  # exact counts no workspace


def test_estimates_reach_the_simulation():
    t, lat = make([B(1), B(1)], [Call([], [0]), Call([0], [1])])
    t = with_ops(t, **{"1": {"target": "aten.mm.default"}})
    dev = DeviceModel(estimating_gpu(conv=0, matmul=3 * MiB), lat)
    r = simulate([t], dev, allocator="smartpool")
    assert r.peak_bytes == 5 * MiB
    assert np.array_equal(op_workspace_bytes(t, dev.hw), [0, 3 * MiB])


@pytest.mark.parametrize(
    "line, message",
    [
        ("context_reserve_bytes = -1", "context_reserve_bytes: expected an integer in [0, "),
        ("conv_workspace_bytes = 1e9", "conv_workspace_bytes: expected an integer"),
        ("matmul_workspace_bytes = 68719476737", "expected an integer in [0, 68719476736]"),
        ("context_reserve_bytes = 1", "source.context_reserve_bytes: missing"),
    ],
)
def test_optional_profile_fields_are_checked(tmp_path, line, message):
    # NOTE [ Profile sanity ranges ]: optional, whole bytes up to 64 GiB, with a source line
    text = profile_path("p100-pcie-16gb").read_text()
    text = re.sub(
        r"(?m)^(context_reserve_bytes|conv_workspace_bytes|matmul_workspace_bytes) =.*\n", "", text
    )
    if "missing" in message:
        text = re.sub(r"(?m)^context_reserve_bytes = \".*\n", "", text)
    else:
        key = line.split(" =")[0]
        text = text.replace("[source]\n", f'[source]\n{key} = "a test"\n')
    head, _, tail = text.partition("\n[peak_flops]")
    path = tmp_path / "p.toml"
    path.write_text(f"{head}\n{line}\n[peak_flops]{tail}")
    with pytest.raises(LatencyError, match=re.escape(message)):
        load_hardware(path)


def test_optional_profile_fields_default_to_zero_and_round_trip(tmp_path):
    hw = load_hardware("p100-pcie-16gb")
    assert (hw.context_reserve_bytes, hw.conv_workspace_bytes) == (300 * MiB, 0)
    path = tmp_path / "p.toml"
    path.write_text(to_toml(hw))
    assert load_hardware(path) == hw
    bare = {
        k: v for k, v in hw.source.items() if not k.endswith(("reserve_bytes", "workspace_bytes"))
    }
    path.write_text(to_toml(dataclasses.replace(hw, source=bare)))
    assert load_hardware(path).context_reserve_bytes == 0  # left out: no reserve
