"""Capture one full training iteration as a `Trace`.

Forward, loss, backward, `optimizer.step()` and `zero_grad(set_to_none=True)`
run under a `TorchDispatchMode` that records every aten call that reaches
the backend, with the storages it reads and writes.

See NOTE [ Buffer identity ] and NOTE [ What is recorded ] in traces/recorder.py,
and NOTE [ Buffer kinds ] here.
"""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any

import torch
from memplan.traces import emulate, optim
from memplan.traces.errors import TraceError
from memplan.traces.model import (
    MAX_ACCUMULATE,
    Amp,
    Buffer,
    BufferKind,
    Phase,
    SavedTensor,
    Trace,
    TraceMeta,
)
from memplan.traces.recorder import MODULE_KEY, CaptureMode, Recorder, tensors
from memplan.traces.step import Trainer, run_step
from memplan.traces.target import Target, TargetDevice, check_target

if TYPE_CHECKING:
    from memplan.traces.workload import Workload


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """How to capture. `device`: meta (no memory used), cpu, or cuda.

    `optimizer` names any `torch.optim` class (any case) and
    `optimizer_kwargs` its keywords, built over memplan's defaults into
    `resolved_kwargs` (`lr`,
    `foreach` as torch picks it for the device the trace describes: True on
    CUDA, False elsewhere; SGD's momentum 0.9: NOTE [ Optimizer defaults ]
    in traces/optim.py). `amp` runs forward and loss under `torch.autocast`
    (fp16 with a `GradScaler`; on cpu or cuda, or on meta for a target:
    NOTE [ Autocast and the capture device ]); `accumulate` forward/backward
    passes make one iteration (NOTE [ Gradient accumulation ]). `target` is the device the
    trace is captured for (NOTE [ Capture targets ]). Everything is checked
    here, each problem a one-line `TraceError`."""

    device: str = "meta"
    optimizer: str = "adam"
    lr: float = 1e-3
    warmup_iterations: int = 1
    measure: bool = False
    measure_repeats: int = 5
    seed: int = 0
    optimizer_kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    amp: Amp | str = Amp.NONE
    accumulate: int = 1
    target: Target | None = None
    # what the optimizer is built with: `optimizer_kwargs` over the defaults
    # (kept apart, so `dataclasses.replace` re-derives it from what was given)
    resolved_kwargs: Mapping[str, Any] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.device not in ("meta", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise TraceError(f"device={self.device!r} must be meta, cpu or cuda")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise TraceError(f"device={self.device!r}: CUDA is not available on this machine")
        if self.measure and self.device == "meta":
            raise TraceError("measure=True needs a real device (cpu or cuda), not meta")
        if self.warmup_iterations < 0 or self.measure_repeats < 1:
            raise TraceError("warmup_iterations must be >= 0 and measure_repeats >= 1")
        amp = self.amp
        if not isinstance(amp, Amp):
            allowed = ", ".join(a.value for a in Amp)
            if amp not in {a.value for a in Amp}:
                raise TraceError(f"amp={amp!r} must be one of {allowed}")
            object.__setattr__(self, "amp", Amp(amp))
        check_target(self.target, self.device)
        if self.amp is not Amp.NONE and self.device == "meta" and self.target is None:
            raise TraceError(
                f"amp={self.amp.value}: torch.autocast does not exist on the meta device; "
                "name the GPU with --target, or capture with --device cpu "
                "(NOTE [ Autocast and the capture device ])"
            )
        acc = self.accumulate
        if not isinstance(acc, int) or isinstance(acc, bool) or not 1 <= acc <= MAX_ACCUMULATE:
            raise TraceError(f"accumulate={acc!r} must be an integer in [1, {MAX_ACCUMULATE}]")
        if not isinstance(self.optimizer_kwargs, Mapping):
            raise TraceError(
                f"optimizer_kwargs={self.optimizer_kwargs!r} must be a mapping of keyword to value"
            )
        if not isinstance(self.lr, int | float) or not math.isfinite(self.lr) or self.lr < 0:
            raise TraceError(f"lr={self.lr!r} must be a finite number >= 0")
        given = MappingProxyType(dict(self.optimizer_kwargs))
        resolved = optim.resolve_kwargs(
            self.optimizer, given, self.lr, self.describes, meta=self.device == "meta"
        )
        object.__setattr__(self, "optimizer_kwargs", given)
        object.__setattr__(self, "resolved_kwargs", MappingProxyType(resolved))

    @property
    def emulated(self) -> bool:
        """Whether the step runs under the target's emulation (meta with a target)."""
        return self.device == "meta" and self.target is not None

    @property
    def describes(self) -> TargetDevice | None:
        """The device type the trace describes: the target's, else the capture
        device's; None on meta without a target (meta's own dispatch)."""
        if self.target is not None:
            return self.target.device
        if self.device == "meta":
            return None
        return TargetDevice.CUDA if self.device.startswith("cuda") else TargetDevice.CPU

    @property
    def optimizer_name(self) -> str:
        """The `torch.optim` class in lower case (`adamw`), as traces record it."""
        return optim.optimizer_class(self.optimizer).__name__.lower()


def _label_graph(outputs: Any, path: str) -> None:
    """Label every autograd node created inside module `path` (and not by one
    of its children, which finished first and labelled theirs)."""
    stack = [t.grad_fn for t in tensors(outputs) if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or MODULE_KEY in node.metadata:
            continue
        node.metadata[MODULE_KEY] = path
        stack.extend(n for n, _ in node.next_functions if n is not None)


@contextmanager
def _module_hooks(model: torch.nn.Module, rec: Recorder) -> Iterator[None]:
    handles = []
    for path, mod in model.named_modules():

        def pre(_m, _a, path=path):  # noqa: ANN001, ANN202
            rec.module_stack.append(path)

        def post(_m, _a, out, path=path):  # noqa: ANN001, ANN202
            rec.module_stack.pop()
            if torch.is_grad_enabled():
                _label_graph(out, path)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# ---- the driver ------------------------------------------------------------
def _make_optimizer(
    model: torch.nn.Module, opts: CaptureOptions, name: str
) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise TraceError(f"workload {name}: the model has no trainable parameters to train")
    return optim.build(opts.optimizer, opts.resolved_kwargs, params, name)


def capture(
    workload: Callable[[int], Workload],
    batch_size: int,
    options: CaptureOptions | None = None,
    *,
    model_name: str = "",
    progress: Callable[[Phase, int], None] | None = None,
) -> Trace:
    """Run `warmup_iterations` unrecorded steps, then record one full step.

    `workload(batch_size)` is called with the capture device as the default
    device, so parameters and inputs are created there directly. What the
    workload's own code raises is a one-line `TraceError` naming it
    (NOTE [ Errors in the workload ]).
    """
    opts = options or CaptureOptions()
    if batch_size < 1:
        raise TraceError(f"batch_size={batch_size} must be >= 1")
    device = torch.device(opts.device)
    name = repr(model_name) if model_name else _callable_name(workload)
    torch.manual_seed(opts.seed)
    with _theirs(name, "building the workload", opts.device, always=True), torch.device(device):
        w = workload(batch_size)
    _check_workload(w, name)
    if device.type == "meta":
        _recurrent_on_meta(w.model, name, opts.target)
    em = _emulation(opts)
    with _theirs(name, "the training step", opts.device), em or nullcontext():
        w.model.train()
        opt = _make_optimizer(w.model, opts, name)
        trainer = Trainer.make(w, opt, device, opts.amp, opts.accumulate, em)
        _warm_up(trainer, opts.warmup_iterations, name)

    host = {
        state["step"].untyped_storage()._cdata
        for state in opt.state.values()
        if isinstance(state.get("step"), torch.Tensor) and state["step"].device.type == "cpu"
    }
    rec = Recorder(device, host, opts.measure, opts.measure_repeats, progress)
    rec.rules = emulate.dispatch_rules(opts.target if opts.emulated else None)
    _register_persistent(trainer, rec)
    torch.manual_seed(opts.seed + 1)

    def pack(t: torch.Tensor) -> torch.Tensor:
        if rec.on_device(t):
            module = rec.module_stack[-1] if rec.module_stack else ""
            rec.saved.append(SavedTensor(len(rec.saved), rec.view_of(t), module))
        return t

    scale = trainer.scale()
    with (
        _theirs(name, "the training step", opts.device),
        _module_hooks(w.model, rec),
        torch.autograd.graph.saved_tensors_hooks(pack, _identity),
        em or nullcontext(),
        CaptureMode(rec),
    ):
        run_step(trainer, rec)
    if not rec.ops:
        raise TraceError(f"{model_name or 'workload'}: the training step ran no device ops")
    if scale is not None and trainer.scale() < scale:
        raise TraceError(
            f"workload {name}: amp=fp16: the recorded step found inf/NaN grads and the "
            "GradScaler skipped the optimizer step; capture with --warmup 1 or more "
            "(NOTE [ Warm-up under a GradScaler ])"
        )
    del w, opt, trainer
    rec.poll_frees()
    return _build_trace(rec, opts, model_name, batch_size)


def _emulation(opts: CaptureOptions) -> emulate.Emulation | None:
    """The target's emulation for a meta capture with a target, else None."""
    if not opts.emulated:
        return None
    assert opts.target is not None
    emulate.load_handlers()
    return emulate.Emulation(opts.target)


# NOTE [ Warm-up under a GradScaler ]
# With fp16 the `GradScaler` starts at a scale of 2**16 and halves it, skipping
# the optimizer step, whenever the scaled grads overflow: the first steps of a
# real run are often skipped. The recorded step must be one that updates the
# parameters (and the optimizer state must exist before it), so after the
# asked-for warm-up iterations capture keeps warming up while the last step
# was skipped, at most MAX_SKIPPED more times (2**16 halved 24 times is below
# 2**-7: grads that overflow then do so at any scale), and the recorded step
# is checked the same way. Without warm-up (`warmup_iterations=0`) nothing is
# added: the recorded step is the first, as asked, and is refused if skipped.
# On meta the grads have no values: its scaler assumes them finite, takes
# every step and keeps its scale (NOTE [ GradScaler on meta ]), so nothing is
# added or refused there.
MAX_SKIPPED = 24


def _warm_up(trainer: Trainer, iterations: int, name: str) -> None:
    """`iterations` unrecorded steps, and more while a `GradScaler` skipped the
    last one (NOTE [ Warm-up under a GradScaler ])."""
    skipped = False
    for i in range(iterations + MAX_SKIPPED):
        if i >= iterations and not skipped:
            return
        before = trainer.scale()
        run_step(trainer, None)
        skipped = before is not None and trainer.scale() < before
    if skipped:
        raise TraceError(
            f"workload {name}: amp=fp16: after {iterations + MAX_SKIPPED} warm-up steps the "
            f"GradScaler still skips the step (inf/NaN grads at loss scale "
            f"{trainer.scale():g}): the model does not train in float16"
        )


# NOTE [ Recurrent layers on meta ]
# nn.LSTM, nn.GRU and nn.RNN call one composite aten op (`aten.lstm`, ...)
# that picks its kernels by device. On cuda it is cuDNN's fused kernel (one
# op per call forward, one backward, with a reserve buffer); on cpu an LSTM
# is oneDNN's fused `mkldnn_rnn_layer` per layer (an LSTM of 2 layers over 12
# steps: 89 ops), and a GRU or RNN runs per time step with the input
# projection of the whole sequence done at once. On meta every one of them
# falls back to the per-time-step cells, input projections included: the
# LSTM above gives 923 ops and a peak 23% lower than cpu, a GRU 118 more ops
# than cpu. For a CUDA target the emulation runs cuDNN's path instead, the
# layers' weights first laid out in one buffer as building them on a GPU does
# (traces/emulate/rnn.py). Without a target, or for a cpu target (oneDNN's
# path is not emulated), such a model is refused, naming cpu.
def _recurrent_on_meta(model: torch.nn.Module, name: str, target: Target | None) -> None:
    """Flatten the recurrent layers' weights for a CUDA target, else refuse
    a model holding one (NOTE [ Recurrent layers on meta ])."""
    if target is not None and target.device is TargetDevice.CUDA:
        from memplan.traces.emulate import rnn

        rnn.flatten_weights(model)
        return
    for path, mod in model.named_modules():
        if isinstance(mod, torch.nn.RNNBase):
            kind, at = type(mod).__name__, path or "the model"
            if target is not None:
                raise TraceError(
                    f"workload {name}: {kind} at {at!r}: meta does not emulate the fused "
                    f"oneDNN kernel cpu target {target.name} runs "
                    "(NOTE [ Recurrent layers on meta ]): capture with --device cpu"
                )
            raise TraceError(
                f"workload {name}: {kind} at {at!r} runs per "
                "time step on meta, not as the fused kernel cpu and cuda run "
                "(NOTE [ Recurrent layers on meta ]): capture with --device cpu"
            )


def _identity(x: Any) -> Any:
    return x


# NOTE [ Errors in the workload ]
# The factory and the model are the user's code. What they raise is their
# error, reported in one line naming the workload, what was running and the
# innermost line of their code, with a hint when the meta device is the cause
# (`.item()`, data-dependent shapes: capture on cpu instead). Calling the
# factory is always theirs (`os:getcwd` cannot take a batch size). In the
# training step we look at the innermost frame outside torch and the
# standard library: their code, traces/step.py (which only calls their
# model, loss, backward and optimizer), traces/emulate/ (which runs their
# calls as the target would) or the recorder's call of the op itself make it
# theirs; any other line of the recorder or of this module is a bug here and
# keeps its traceback. The line named is their own code's, never ours.
_HERE = os.path.dirname(os.path.abspath(__file__))
_STEP = os.path.join(_HERE, "step.py")
_EMULATE = os.path.join(_HERE, "emulate")
_MACHINERY = (
    os.path.join(_HERE, "capture.py"),
    os.path.join(_HERE, "recorder.py"),
    _STEP,
    *(os.path.join(_EMULATE, f) for f in sorted(os.listdir(_EMULATE)) if f.endswith(".py")),
)
_LIBRARY = (os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(os.__file__))


def _callable_name(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def _blame(tb: TracebackType | None) -> tuple[bool, str | None]:
    """(is it the workload's error, `file:line` of its innermost own frame)
    by NOTE [ Errors in the workload ]."""
    frames = [
        f
        for f in traceback.extract_tb(tb)
        if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(_LIBRARY)
    ]
    theirs = [f for f in frames if os.path.abspath(f.filename) not in _MACHINERY]
    where = f"{os.path.basename(theirs[-1].filename)}:{theirs[-1].lineno}" if theirs else None
    if not frames or os.path.abspath(frames[-1].filename) not in _MACHINERY:
        return True, where
    last = frames[-1]
    calls_op = last.name == "__torch_dispatch__" and "kernel(*args" in (last.line or "")
    path = os.path.abspath(last.filename)
    return path == _STEP or path.startswith(_EMULATE + os.sep) or calls_op, where


@contextmanager
def _theirs(name: str, what: str, device: str, *, always: bool = False) -> Iterator[None]:
    """Errors of the workload's code as one-line TraceErrors (NOTE [ Errors in the workload ])."""
    try:
        yield
    except TraceError:
        raise
    except Exception as e:
        theirs, where = _blame(e.__traceback__)
        if not (theirs or always):
            raise
        cause = (str(e).strip().splitlines() or [""])[0][:300]
        at = f" (at {where})" if where else ""
        hint = ""
        if device == "meta" and "meta" in str(e).lower():
            hint = (
                "; the model needs real values, which the meta device has not: "
                "capture with --device cpu"
            )
        raise TraceError(
            f"workload {name}: {what} failed{at}: {type(e).__name__}: {cause}{hint}"
        ) from None


def _check_workload(w: Any, name: str) -> None:
    from memplan.traces.workload import Workload

    if not isinstance(w, Workload):
        raise TraceError(
            f"workload {name}: returned {type(w).__name__}, expected a traces.zoo.Workload "
            "(a factory takes the batch size and returns one)"
        )
    if not isinstance(w.model, torch.nn.Module):
        raise TraceError(
            f"workload {name}: model is {type(w.model).__name__}, not a torch.nn.Module"
        )


# NOTE [ Buffer kinds ]
# Decided by identity after the iteration: parameters -> param; the storages
# of `p.grad` after backward -> grad; optimizer state -> optimizer_state; the
# batch and labels -> input; module buffers (BatchNorm statistics) -> other,
# persistent. Everything else is a temporary: activation when created in
# forward or backward, other when created in the optimizer phase. Buffers
# still alive when the iteration ends (the loss, the grads that zero_grad
# drops) are freed after the last op.
def _register_persistent(trainer: Trainer, rec: Recorder) -> None:
    w, opt = trainer.workload, trainer.optimizer

    def add(t: torch.Tensor, kind: BufferKind, name: str, persistent: bool = True) -> int | None:
        if not isinstance(t, torch.Tensor) or not rec.on_device(t):
            return None
        bid = rec.register(t, created=not persistent)
        b = rec.buffers[bid]
        b.kind, b.persistent, b.name = kind, persistent, name
        return bid

    pname = {}
    for name, p in w.model.named_parameters():
        pname[p] = name
        bid = add(p, BufferKind.PARAM, name)
        if bid is not None:
            rec.param_module[bid] = name.rpartition(".")[0]
    for name, b in w.model.named_buffers():
        add(b, BufferKind.OTHER, name)
    for p, state in opt.state.items():
        for key, t in state.items():
            add(t, BufferKind.OPTIMIZER_STATE, f"{pname.get(p, '?')}.{key}")
    if trainer.scaler is not None:  # NOTE [ Autocast and the capture device ] in traces/step.py
        add(trainer.scaler._scale, BufferKind.OTHER, "grad_scaler.scale")
        add(trainer.scaler._growth_tracker, BufferKind.OTHER, "grad_scaler.growth_tracker")
    for i, t in enumerate(w.inputs):
        add(t, BufferKind.INPUT, f"input{i}", persistent=False)
    for i, t in enumerate(w.targets):
        add(t, BufferKind.INPUT, f"target{i}", persistent=False)


def _build_trace(rec: Recorder, opts: CaptureOptions, model_name: str, batch: int) -> Trace:
    last = len(rec.ops) - 1
    buffers = []
    for i, b in enumerate(rec.buffers):
        kind = b.kind
        if kind is None:
            kind = BufferKind.OTHER if b.phase is Phase.OPTIMIZER else BufferKind.ACTIVATION
        freed = None if b.persistent else (last if b.freed_after is None else b.freed_after)
        buffers.append(Buffer(i, b.nbytes, kind, b.persistent, b.name, freed))
    params = [b for b in buffers if b.kind is BufferKind.PARAM]
    dtype = "float32"
    if params:
        dtype = next(v.dtype for v in rec.views if v.buffer == params[0].id)
    meta = TraceMeta(
        model=model_name,
        batch_size=batch,
        dtype=dtype,
        optimizer=opts.optimizer_name,
        device=opts.device,
        torch_version=torch.__version__.split("+")[0],
        extra={"seed": opts.seed, "warmup_iterations": opts.warmup_iterations},
        optimizer_kwargs={
            k: list(v) if isinstance(v, tuple) else v for k, v in opts.resolved_kwargs.items()
        },
        amp=opts.amp,
        accumulate=opts.accumulate,
        target=opts.target,
    )
    return Trace(meta, tuple(buffers), tuple(rec.views), tuple(rec.ops), tuple(rec.saved))
