"""NOTE [ Dropout on a CUDA target ]: one fused `native_dropout` with a bool
mask on a CUDA target; cpu's own steps elsewhere."""

from __future__ import annotations

import torch
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.model import Phase, Trace
from memplan.traces.target import Target, TargetDevice
from memplan.traces.zoo import Workload
from torch import nn
from torch.nn import functional as F

A100 = Target("a100-sxm-80gb", TargetDevice.CUDA, (8, 0))
CPU = Target("cpu-local", TargetDevice.CPU)


class _Drop(nn.Module):
    """Linear(256, 256), then dropout 0.1 (out of place, or in place)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)
        self.drop = nn.Dropout(0.1, inplace=inplace)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x))


def _workload(inplace: bool = False):  # noqa: ANN202
    def make(batch: int) -> Workload:
        x, y = torch.randn(batch, 256), torch.randn(batch, 256)
        return Workload(_Drop(inplace).train(), (x,), (y,), F.mse_loss)

    return make


def _targets(trace: Trace, phase: Phase) -> list[str]:
    return [op.target for op in trace.ops if op.phase is phase]


def test_a_cuda_target_runs_one_fused_kernel_saving_a_byte_per_element():
    """64 x 256 activations: the bool mask is 16,384 bytes (cpu's float32
    noise would be 65,536), saved for backward's one native_dropout_backward."""
    trace = capture(_workload(), 64, CaptureOptions(target=A100))
    forward = _targets(trace, Phase.FORWARD)
    assert forward.count("aten.native_dropout.default") == 1
    assert not [t for t in forward if "bernoulli" in t]
    assert _targets(trace, Phase.BACKWARD).count("aten.native_dropout_backward.default") == 1
    (op,) = [op for op in trace.ops if op.target == "aten.native_dropout.default"]
    output, mask = (trace.views[v] for v in op.writes)
    assert (output.dtype, mask.dtype) == ("float32", "bool")
    assert trace.buffers[mask.buffer].nbytes == 64 * 256
    assert op.rng  # the mask is drawn from the RNG: a recompute restores it
    saved = {trace.views[s.view].buffer for s in trace.saved}
    assert mask.buffer in saved


def test_a_cpu_target_and_in_place_dropout_keep_the_noise_tensor():
    """cpu's dispatch (and `dropout_` everywhere) draws a noise tensor of the
    input's dtype: no fused kernel, as a real cpu capture records."""
    cpu = capture(_workload(), 64, CaptureOptions(target=CPU))
    real = capture(_workload(), 64, CaptureOptions(device="cpu"))
    assert [op.target for op in cpu.ops] == [op.target for op in real.ops]
    assert "aten.native_dropout.default" not in _targets(cpu, Phase.FORWARD)
    inplace = capture(_workload(inplace=True), 64, CaptureOptions(target=A100))
    forward = _targets(inplace, Phase.FORWARD)
    assert "aten.native_dropout.default" not in forward
    assert [t for t in forward if "bernoulli" in t]
