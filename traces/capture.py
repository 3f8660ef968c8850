"""Capture one full training iteration as a `Trace`.

Forward, loss, backward, `optimizer.step()` and `zero_grad(set_to_none=True)`
run under a `TorchDispatchMode` that records every aten call that reaches
the backend, with the storages it reads and writes.

See NOTE [ Buffer identity ] and NOTE [ What is recorded ] in traces/recorder.py,
and NOTE [ Buffer kinds ] here.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from memplan.traces.errors import TraceError
from memplan.traces.model import Buffer, BufferKind, Phase, SavedTensor, Trace, TraceMeta
from memplan.traces.recorder import MODULE_KEY, CaptureMode, Recorder, tensors

if TYPE_CHECKING:
    from memplan.traces.zoo import Workload


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """How to capture. `device`: meta (no memory used), cpu, or cuda."""

    device: str = "meta"
    optimizer: str = "adam"
    lr: float = 1e-3
    warmup_iterations: int = 1
    measure: bool = False
    measure_repeats: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.device not in ("meta", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise TraceError(f"device={self.device!r} must be meta, cpu or cuda")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise TraceError(f"device={self.device!r}: CUDA is not available on this machine")
        if self.optimizer not in ("adam", "sgd"):
            raise TraceError(f"optimizer={self.optimizer!r} must be adam or sgd")
        if self.measure and self.device == "meta":
            raise TraceError("measure=True needs a real device (cpu or cuda), not meta")
        if self.warmup_iterations < 0 or self.measure_repeats < 1:
            raise TraceError("warmup_iterations must be >= 0 and measure_repeats >= 1")


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
    if opts.optimizer == "adam":
        return torch.optim.Adam(params, lr=opts.lr, foreach=False)
    return torch.optim.SGD(params, lr=opts.lr, momentum=0.9, foreach=False)


def _step(w: Workload, opt: torch.optim.Optimizer, rec: Recorder | None) -> None:
    def phase(p: Phase) -> None:
        if rec is not None:
            rec.phase = p

    phase(Phase.FORWARD)
    loss = w.loss_fn(w.model(*w.inputs), *w.targets)
    phase(Phase.BACKWARD)
    loss.backward()
    del loss
    if rec is not None:
        rec.poll_frees()  # the graph and loss die here, before grads are read
        _mark_grads(w.model, rec)
    phase(Phase.OPTIMIZER)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _mark_grads(model: torch.nn.Module, rec: Recorder) -> None:
    for name, p in model.named_parameters():
        if p.grad is not None and rec.on_device(p.grad):
            bid = rec.register(p.grad, created=True)
            rec.buffers[bid].kind = BufferKind.GRAD
            rec.buffers[bid].name = f"{name}.grad"


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
    with _theirs(name, "the training step", opts.device):
        w.model.train()
        opt = _make_optimizer(w.model, opts, name)
        for _ in range(opts.warmup_iterations):
            _step(w, opt, None)

    host = {
        state["step"].untyped_storage()._cdata
        for state in opt.state.values()
        if isinstance(state.get("step"), torch.Tensor) and state["step"].device.type == "cpu"
    }
    rec = Recorder(device, host, opts.measure, opts.measure_repeats, progress)
    _register_persistent(w, opt, rec)
    torch.manual_seed(opts.seed + 1)

    def pack(t: torch.Tensor) -> torch.Tensor:
        if rec.on_device(t):
            module = rec.module_stack[-1] if rec.module_stack else ""
            rec.saved.append(SavedTensor(len(rec.saved), rec.view_of(t), module))
        return t

    with (
        _theirs(name, "the training step", opts.device),
        _module_hooks(w.model, rec),
        torch.autograd.graph.saved_tensors_hooks(pack, _identity),
        CaptureMode(rec),
    ):
        _step(w, opt, rec)
    if not rec.ops:
        raise TraceError(f"{model_name or 'workload'}: the training step ran no device ops")
    del w, opt
    rec.poll_frees()
    return _build_trace(rec, opts, model_name, batch_size)


def _identity(x: Any) -> Any:
    return x


# NOTE [ Errors in the workload ]
# The factory and the model are the user's code. What they raise is their
# error, reported in one line naming the workload, what was running and the
# innermost line of their code, with a hint when the meta device is the cause
# (`.item()`, data-dependent shapes: capture on cpu instead). Calling the
# factory is always theirs (`os:getcwd` cannot take a batch size). In the
# training step we look at the innermost frame outside torch and the
# standard library: their code, `_step` (their loss's `backward()`) or the
# recorder's call of the op itself make it theirs; any other line of the
# recorder or of this module is a bug here and keeps its traceback.
_HERE = os.path.dirname(os.path.abspath(__file__))
_MACHINERY = (os.path.join(_HERE, "capture.py"), os.path.join(_HERE, "recorder.py"))
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
    calls_op = last.name == "__torch_dispatch__" and "func(*args" in (last.line or "")
    return last.name == "_step" or calls_op, where


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
    from memplan.traces.zoo import Workload

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
def _register_persistent(w: Workload, opt: torch.optim.Optimizer, rec: Recorder) -> None:
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
        optimizer=opts.optimizer,
        device=opts.device,
        torch_version=torch.__version__.split("+")[0],
        extra={"lr": opts.lr, "seed": opts.seed, "warmup_iterations": opts.warmup_iterations},
    )
    return Trace(meta, tuple(buffers), tuple(rec.views), tuple(rec.ops), tuple(rec.saved))
