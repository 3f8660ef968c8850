"""One training iteration as capture drives it: `accumulate` times forward
and loss (under `torch.autocast` with `amp`) and backward (of the scaled loss
with fp16), then the optimizer step (through the `GradScaler` with fp16) and
`zero_grad(set_to_none=True)`.

Everything this module runs is the workload's model, loss and optimizer: an
error raised under it is the workload's (NOTE [ Errors in the workload ] in
traces/capture.py), so it holds nothing but the calls of the step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from memplan.traces.emulate.autocast import GradScalerOnMeta
from memplan.traces.emulate.mode import Emulation
from memplan.traces.model import Amp, Phase

if TYPE_CHECKING:
    from memplan.traces.recorder import Recorder
    from memplan.traces.workload import Workload

AMP_DTYPE = {Amp.BF16: torch.bfloat16, Amp.FP16: torch.float16}


# NOTE [ Autocast and the capture device ]
# `torch.autocast` exists per device type (cpu, cuda, ...), not for meta:
# `torch.autocast("meta")` is refused by torch, and cpu autocast leaves meta
# tensors alone (their dispatch keys carry no Autocast key). A capture with
# `amp` runs on cpu or cuda under that device type's autocast, or on meta for
# a target under the target device type's autocast, emulated
# (NOTE [ Autocast on meta ] in traces/emulate/autocast.py). Which ops run in
# bf16/fp16 (convolutions, matmuls, linear), which are kept in float32 and
# which follow their widest input is autocast's list for that device type:
# cpu and cuda agree on the ops that carry the bytes and differ on
# layer_norm, softmax, pointwise ops and losses (float32 on cuda). Autocast
# caches the low-precision copy of each weight for the autocast region
# (forward and loss), so those copies are recorded as activations that live
# until backward has used them, as on a GPU. fp16 adds a `GradScaler` (of the
# capture device type; on meta, NOTE [ GradScaler on meta ]): the loss is
# scaled before backward, and its step unscales the grads, checks them for
# inf/NaN and steps the optimizer; `update` adjusts the scale. Those ops are
# recorded in the optimizer phase (the scaling multiply in backward). Its
# `scale` and `growth_tracker` are persistent buffers.
@dataclass(slots=True)
class Trainer:
    """The ingredients of one iteration. `scaler` is set exactly when `amp`
    is fp16."""

    workload: Workload
    optimizer: torch.optim.Optimizer
    device_type: str
    amp: Amp = Amp.NONE
    accumulate: int = 1
    scaler: torch.amp.GradScaler | None = None
    emulation: Emulation | None = None  # a meta capture for a target (traces/emulate)

    @classmethod
    def make(
        cls,
        workload: Workload,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        amp: Amp,
        accumulate: int,
        em: Emulation | None = None,
    ) -> Trainer:
        scaler = None
        if amp is Amp.FP16:  # on meta, NOTE [ GradScaler on meta ] in traces/emulate/autocast.py
            scaler = torch.amp.GradScaler(device.type) if em is None else GradScalerOnMeta()
        return cls(workload, optimizer, device.type, amp, accumulate, scaler, em)

    def scale(self) -> float | None:
        """The `GradScaler`'s current loss scale (None without one); it drops
        exactly when a step found inf/NaN grads and was skipped (never on
        meta, where grads are assumed finite)."""
        return None if self.scaler is None else self.scaler.get_scale()


def _autocast(t: Trainer) -> AbstractContextManager:
    if t.amp is Amp.NONE:  # no autocast at all: meta has none to disable
        return nullcontext()
    if t.emulation is not None:  # meta for a target: its autocast, emulated
        return t.emulation.autocast_region(AMP_DTYPE[t.amp])
    return torch.autocast(t.device_type, dtype=AMP_DTYPE[t.amp])


# NOTE [ Gradient accumulation ]
# `accumulate=K` runs K forward/backward passes, then one optimizer step and
# one `zero_grad`: the trace is the whole iteration. Each pass's loss is
# divided by K (as a training loop does, so the accumulated grads are the
# mean), and each pass reads the same input tensors: the workload builds one
# micro-batch of `batch_size`, and a data loader's next micro-batch would
# occupy the same bytes once the previous one is gone. Grads are created by
# the first backward and accumulated in place by the others.
def run_step(t: Trainer, rec: Recorder | None) -> None:
    """One iteration; with a recorder, phases are set and grads marked."""
    w, opt = t.workload, t.optimizer
    for _ in range(t.accumulate):
        if rec is not None:
            rec.phase = Phase.FORWARD
        with _autocast(t):
            loss = w.loss_fn(w.model(*w.inputs), *w.targets)
        if t.accumulate > 1:
            loss = loss / t.accumulate
        if rec is not None:
            rec.phase = Phase.BACKWARD
        (loss if t.scaler is None else t.scaler.scale(loss)).backward()
        del loss
        if rec is not None:
            rec.poll_frees()  # the graph and loss die here, before grads are read
            rec.mark_grads(w.model)
    if rec is not None:
        rec.phase = Phase.OPTIMIZER
    if t.scaler is None:
        opt.step()
    else:
        t.scaler.step(opt)
        t.scaler.update()
    opt.zero_grad(set_to_none=True)
