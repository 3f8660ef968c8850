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
# `torch.autocast` exists per device type, not for meta (and cpu autocast leaves meta
# tensors alone). A capture with `amp` runs on cpu or cuda under that device type's
# autocast, or on meta for a target under the target's autocast, emulated
# (NOTE [ Autocast on meta ] in traces/emulate/autocast.py). Which ops run in low precision
# is autocast's list for that device type (cpu and cuda differ on layer_norm, softmax,
# pointwise ops and losses). The low-precision copy of each weight, cached for the region,
# is an activation that lives until backward has used it. fp16 adds a `GradScaler` of the
# capture device type (on meta, NOTE [ GradScaler on meta ]): its unscale, inf check, step
# and `update` are recorded in the optimizer phase (the scaling multiply in backward);
# `scale` and `growth_tracker` are persistent. Full text: docs/notes.md.
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
