"""What PyTorch's dispatch would run on a target device, emulated on meta.

A capture on meta for a `Target` runs its training step under `Emulation`,
a `TorchFunctionMode` scoped to the capture (torch itself is never patched).
It sees each torch-level call before autograd does and routes it to what the
target runs:

- `attention.py`: `F.scaled_dot_product_attention` to the SDPA backend the
  target's dispatch picks (flash, memory-efficient, cuDNN, math);
- `rnn.py`: `nn.LSTM` / `GRU` / `RNN` to the fused `_cudnn_rnn` kernel;
- `autocast.py`: `--amp` casts as the target device type's autocast does;
- `dropout.py`: dropout as CUDA's one fused `native_dropout`.

Below autograd, the recorder asks `dispatch_rules(target)` for the few aten
kernels meta lacks (cuDNN's RNN backward), for outputs the target keeps on the
host (memory-efficient attention's philox seed and offset) and for the FLOPs
of kernels torch's counter does not know (`mode.DispatchRules`).
"""

from __future__ import annotations

from memplan.traces.emulate.mode import (
    CASTERS,
    HANDLERS,
    NO_RULES,
    Caster,
    DispatchRules,
    Emulation,
    Handler,
    handles,
)
from memplan.traces.target import Target

__all__ = [
    "CASTERS", "HANDLERS", "NO_RULES", "Caster", "DispatchRules", "Emulation", "Handler",
    "dispatch_rules", "handles", "load_handlers",
]  # fmt: skip


def dispatch_rules(target: Target | None) -> DispatchRules:
    """The recorder's rules for `target` (NO_RULES for none)."""
    if target is None:
        return NO_RULES
    from memplan.traces.emulate import attention, rnn

    return DispatchRules(
        kernels={**rnn.meta_kernels(target)},
        host_outputs={**attention.host_outputs(target)},
        flops={**rnn.flop_counts(target)},
    )


def load_handlers() -> None:
    """Import the modules that register handlers (once; cheap after)."""
    from memplan.traces.emulate import attention, autocast, dropout, rnn  # noqa: F401
