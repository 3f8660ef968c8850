"""The recording side of capture: a `TorchDispatchMode` that records every
aten call reaching the backend with the storages it reads and writes, and the
per-storage records it keeps (NOTE [ Buffer identity ],
NOTE [ What is recorded ])."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from memplan.traces.emulate.mode import NO_RULES, DispatchRules
from memplan.traces.model import BufferKind, Op, Phase, SavedTensor, View
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

# Ops that draw from the RNG: recomputing them needs the RNG state restored.
RNG_OPS = frozenset(
    {
        "native_dropout",
        "dropout",
        "bernoulli",
        "bernoulli_",
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "normal",
        "normal_",
        "uniform_",
        "exponential_",
        "multinomial",
        "rrelu_with_noise",
        "_fused_dropout",
        # the fused attention kernels draw their dropout mask (when dropout_p > 0)
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    }
)
MODULE_KEY = "memplan_module"


@dataclass(slots=True)
class BufRec:
    nbytes: int
    phase: Phase | None
    kind: BufferKind | None = None
    persistent: bool = False
    name: str = ""
    freed_after: int | None = None


# NOTE [ Buffer identity ]
# A buffer is a storage. We key live storages by their StorageImpl address and
# hold a `StorageWeakRef` to each; before every op we ask which of them expired
# and record the free as happening after the previous op. Because a free is
# noticed before the next op's outputs are registered, an address reused by a
# later allocation is a new buffer, never an alias of the dead one. Persistent
# storages (params, optimizer state, module buffers) are known before
# recording and are not polled.
@dataclass(slots=True)
class Recorder:
    device: torch.device
    host_storages: set[int]
    measure: bool
    repeats: int
    progress: Callable[[Phase, int], None] | None = None
    rules: DispatchRules = NO_RULES  # what a target changes below autograd
    phase: Phase = Phase.FORWARD
    buffers: list[BufRec] = field(default_factory=list)
    views: list[View] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    saved: list[SavedTensor] = field(default_factory=list)
    by_storage: dict[int, int] = field(default_factory=dict)  # StorageImpl address -> buffer
    polled: dict[int, StorageWeakRef] = field(default_factory=dict)
    pinned: list[torch.UntypedStorage] = field(default_factory=list)
    view_ids: dict[tuple, int] = field(default_factory=dict)
    module_stack: list[str] = field(default_factory=list)
    param_module: dict[int, str] = field(default_factory=dict)  # buffer -> owning module path

    # ---- buffers and views -------------------------------------------------
    def on_device(self, t: torch.Tensor) -> bool:
        if t.device != self.device or t.layout != torch.strided:
            return False
        return t.untyped_storage()._cdata not in self.host_storages

    def register(self, t: torch.Tensor, *, created: bool, poll: bool = True) -> int:
        """The buffer behind `t`, registering its storage if new."""
        storage = t.untyped_storage()
        key = storage._cdata
        bid = self.by_storage.get(key)
        if bid is not None:
            rec = self.buffers[bid]
            rec.nbytes = max(rec.nbytes, storage.nbytes())
            return bid
        bid = len(self.buffers)
        # A storage first seen as an op input was allocated before capture
        # and is still needed: treat it as persistent.
        rec = BufRec(storage.nbytes(), self.phase if created else None)
        if not created:
            # Allocated outside any recorded op (a constant built from Python
            # data, a cache filled before capture): resident from the start.
            # Hold it, so its address cannot be reused by a later buffer.
            rec.kind, rec.persistent, rec.name = BufferKind.OTHER, True, "constant"
            self.pinned.append(storage)
        self.buffers.append(rec)
        self.by_storage[key] = bid
        if poll and created:
            self.polled[key] = StorageWeakRef(storage)
        return bid

    def view_of(self, t: torch.Tensor, *, created: bool = False) -> int:
        bid = self.register(t, created=created)
        dtype = str(t.dtype).removeprefix("torch.")
        key = (bid, tuple(t.shape), tuple(t.stride()), t.storage_offset(), dtype)
        vid = self.view_ids.get(key)
        if vid is None:
            vid = len(self.views)
            self.views.append(View(vid, *key))
            self.view_ids[key] = vid
        return vid

    def mark_grads(self, model: torch.nn.Module) -> None:
        """The storages of the parameters' `.grad` are grads (NOTE [ Buffer
        kinds ] in traces/capture.py), named after their parameter."""
        for name, p in model.named_parameters():
            if p.grad is not None and self.on_device(p.grad):
                bid = self.register(p.grad, created=True)
                self.buffers[bid].kind = BufferKind.GRAD
                self.buffers[bid].name = f"{name}.grad"

    def poll_frees(self) -> None:
        if not self.polled:
            return
        dead = [k for k, ref in self.polled.items() if ref.expired()]
        last = len(self.ops) - 1
        for k in dead:
            del self.polled[k]
            bid = self.by_storage.pop(k)
            self.buffers[bid].freed_after = max(last, 0)

    # ---- args --------------------------------------------------------------
    def encode(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if self.on_device(x):
                return {"view": self.view_of(x)}
            value = x.tolist() if x.device.type != "meta" else None
            return {"host_tensor": value, "dtype": str(x.dtype).removeprefix("torch.")}
        if isinstance(x, bool | int | str) or x is None:
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"float": str(x)}
        if isinstance(x, list | tuple | torch.Size):
            return [self.encode(y) for y in x]
        if isinstance(x, torch.dtype):
            return {"dtype": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {"device": x.type}
        if isinstance(x, torch.layout):
            return {"layout": str(x).removeprefix("torch.")}
        if isinstance(x, torch.memory_format):
            return {"memory_format": str(x).removeprefix("torch.")}
        if isinstance(x, complex):
            return {"complex": [x.real, x.imag]}
        if isinstance(x, torch.Generator):
            return {"generator": None}
        return {"repr": repr(x)}


def tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


# NOTE [ What is recorded ]
# - Pure view ops (every output aliases an input, nothing written: view, t,
#   expand, detach, ...) launch no kernel and move no data; they are not ops of
#   the trace. Their results still appear as `View`s when a later op uses them.
# - Ops that touch no tensor of the capture device are host work (Adam's
#   `step` counter lives on the host unless `capturable=True`) and are skipped;
#   the host-side `step` tensors are not device buffers.
# - Reads are the device tensors an op takes except schema `out=` arguments;
#   writes are its new outputs plus every argument its schema marks as mutated.
class CaptureMode(TorchDispatchMode):
    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        rec = self.rec
        rec.poll_frees()
        schema = func._schema
        written: list[torch.Tensor] = []
        out_args: list[torch.Tensor] = []
        for i, a in enumerate(schema.arguments):
            val = kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i]
            if a.alias_info is not None and a.alias_info.is_write:
                written += tensors(val)
                if a.is_out:
                    out_args += tensors(val)
        written += _hidden_writes(str(func), args, kwargs)
        inputs = [t for t in tensors((args, kwargs)) if rec.on_device(t)]

        target = str(func)
        kernel = rec.rules.kernels.get(target, func)
        t0 = time.perf_counter()
        out = kernel(*args, **kwargs)
        elapsed = time.perf_counter() - t0
        _to_host(rec, out, rec.rules.host_outputs.get(target, ()))
        outputs = [t for t in tensors(out) if rec.on_device(t)]
        if not inputs and not outputs:
            return out  # host-side work, no device memory touched
        input_storages = {t.untyped_storage()._cdata for t in inputs}
        new_outputs = [t for t in outputs if t.untyped_storage()._cdata not in rec.by_storage]
        if (
            not written
            and not new_outputs
            and all(t.untyped_storage()._cdata in input_storages for t in outputs)
        ):
            return out  # a pure view op: no kernel, no data moved

        op_id = len(rec.ops)
        out_ids = {id(t) for t in out_args}
        reads = _unique(rec.view_of(t) for t in inputs if id(t) not in out_ids)
        writes = _unique(
            [rec.view_of(t, created=True) for t in new_outputs]
            + [rec.view_of(t) for t in written if rec.on_device(t)]
        )
        duration_us = self._measure(func, args, kwargs, written, elapsed) if rec.measure else None
        name = func._overloadpacket.__name__
        rec.ops.append(
            Op(
                id=op_id,
                target=target,
                phase=rec.phase,
                reads=reads,
                writes=writes,
                args={
                    "args": [rec.encode(a) for a in args],
                    "kwargs": {k: rec.encode(v) for k, v in kwargs.items()},
                },
                flops=_flops(func, args, kwargs, out, rec.rules.flops.get(target)),
                duration_us=duration_us,
                module=self._module(reads + writes),
                rng=name.removesuffix("_") in RNG_OPS or name in RNG_OPS,
            )
        )
        if rec.progress is not None:
            rec.progress(rec.phase, op_id + 1)
        return out

    def _module(self, view_ids: tuple[int, ...]) -> str:
        rec = self.rec
        if rec.phase is Phase.FORWARD:
            return rec.module_stack[-1] if rec.module_stack else ""
        if rec.phase is Phase.BACKWARD:
            node = torch._C._current_autograd_node()
            return node.metadata.get(MODULE_KEY, "") if node is not None else ""
        for v in view_ids:  # optimizer: the module owning the parameter updated
            m = rec.param_module.get(rec.views[v].buffer)
            if m is not None:
                return m
        return ""

    def _measure(self, func, args, kwargs, written, first_s: float) -> float:  # noqa: ANN001
        """Median of repeated calls, in microseconds. Repeats run on clones of
        the mutated arguments, with the RNG state restored, so the recorded
        iteration computes exactly what it would have without timing."""
        rec = self.rec
        if rec.device.type == "cuda":
            return _cuda_time_us(func, args, kwargs, written, rec.repeats)
        times = [first_s]
        state = torch.random.get_rng_state()
        for _ in range(rec.repeats - 1):
            a2, k2 = _clone_written(args, kwargs, written)
            t0 = time.perf_counter()
            func(*a2, **k2)
            times.append(time.perf_counter() - t0)
        torch.random.set_rng_state(state)
        return statistics.median(times) * 1e6


# NOTE [ Writes the schema does not declare ]
# The batch-norm kernels update `running_mean` and `running_var` in place in
# training mode, but their schemas carry no `(a!)` annotation. Recorded as
# writes, they keep a planner from trusting a stale host copy of the
# statistics and from recomputing the op (which would update them twice).
# target -> (positions of the running statistics, position of the `training` flag)
HIDDEN_WRITES: dict[str, tuple[tuple[int, ...], int]] = {
    "aten.native_batch_norm.default": ((3, 4), 5),
    "aten.cudnn_batch_norm.default": ((3, 4), 5),
    "aten.miopen_batch_norm.default": ((3, 4), 5),
}


def _hidden_writes(target: str, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    hidden = HIDDEN_WRITES.get(target)
    if hidden is None or len(args) <= hidden[1] or args[hidden[1]] is not True:
        return []
    return [args[p] for p in hidden[0] if isinstance(args[p], torch.Tensor)]


def _to_host(rec: Recorder, out: Any, positions: tuple[int, ...]) -> None:
    """The outputs at `positions`, which the target keeps in host memory,
    are not device buffers: their storages join the host set."""
    for i in positions:
        t = out[i]
        if isinstance(t, torch.Tensor):
            rec.host_storages.add(t.untyped_storage()._cdata)
            rec.pinned.append(t.untyped_storage())  # its address is never reused


def _clone_written(args, kwargs, written):  # noqa: ANN001, ANN202
    ids = {id(t) for t in written}
    if not ids:
        return args, kwargs

    def sub(x):  # noqa: ANN001, ANN202
        if isinstance(x, torch.Tensor) and id(x) in ids:
            return x.clone()
        if isinstance(x, list | tuple):
            return type(x)(sub(y) for y in x)
        return x

    return sub(args), {k: sub(v) for k, v in kwargs.items()}


def _cuda_time_us(func, args, kwargs, written, repeats: int) -> float:  # noqa: ANN001
    """CUDA events around repeated calls on clones; median in microseconds."""
    times = []
    state = torch.cuda.get_rng_state()
    for _ in range(repeats):
        a2, k2 = _clone_written(args, kwargs, written)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        func(*a2, **k2)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    torch.cuda.set_rng_state(state)
    return statistics.median(times)


def _unique(ids) -> tuple[int, ...]:  # noqa: ANN001
    return tuple(dict.fromkeys(ids))


def _flops(func, args, kwargs, out, emulated=None) -> int:  # noqa: ANN001
    if emulated is not None:  # a target's kernel the FLOP counter does not know
        return int(emulated(*args, **kwargs))
    f = flop_registry.get(func._overloadpacket)
    if f is None:
        return 0
    try:
        return int(f(*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not cover this overload: unknown, not fatal
        return 0


# ---- module attribution ----------------------------------------------------
