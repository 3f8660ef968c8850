"""A trace compiled for replay: per op its `torch.ops` callable, its decoded
arguments with view placeholders, and the buffer sets the executor needs.

Built once per replay, so the loop over ops never walks JSON again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from memplan.traces.model import Phase, Trace
from memplan.traces.recorder import HIDDEN_WRITES
from memplan.validate.errors import ValidationError

# NOTE [ Mapping outputs to buffers ]
# Capture records as an op's new buffers the storages among its outputs that
# no live buffer owned, in output order (`traces/capture.py`, NOTE [ Buffer
# identity ]). Replay mirrors that: the distinct storages among the outputs
# that are on the run device and belong to no argument are, in order, the
# buffers the op creates (`Step.creates`: buffers whose `created_at` is this
# op, in the order their views appear in `Op.writes`). In-place writes need no
# binding: they happen through the argument views.

# NOTE [ Hidden mutations ]
# Some aten ops write arguments their schema does not mark as mutable: in
# training mode `native_batch_norm` (and its cuDNN / MIOpen twins) update
# `running_mean` and `running_var` in place. Capture records them as writes
# (`traces.recorder.HIDDEN_WRITES`, NOTE [ Writes the schema does not declare ]);
# here the same table names the argument slots, so a recompute of the op
# redirects them to scratch copies instead of updating the statistics twice.


@dataclass(frozen=True, slots=True)
class ViewRef:
    """Placeholder for a view argument, filled with a tensor at call time."""

    view: int


@dataclass(frozen=True, slots=True)
class HostTensor:
    """A host tensor argument (a CPU scalar the op reads), rebuilt for every
    call so no call can leak a mutation into the next."""

    value: Any
    dtype: torch.dtype

    def make(self) -> torch.Tensor:
        return torch.tensor(self.value, dtype=self.dtype)


# Where an argument sits in a call: ("args", 2) or ("kwargs", "out").
ArgSlot = tuple[str, int | str]


@dataclass(frozen=True, slots=True)
class Step:
    """One op, ready to call. Buffer tuples are sorted unless said otherwise."""

    op: int
    fn: Any  # torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    needs: tuple[int, ...]  # must be on the device when the op starts
    accesses: frozenset[int]  # every buffer it touches (what it pins, NOTE [ Keep ])
    creates: tuple[int, ...]  # allocated by the op, in output order
    create_bytes: int  # their bytes, by the trace
    writes: tuple[int, ...]  # modified in place (with hidden mutations)
    mutated: tuple[ArgSlot, ...]  # argument slots written in place
    frees: tuple[int, ...]  # freed by the framework after the op
    rng: bool


@dataclass(frozen=True, slots=True)
class Program:
    trace: Trace
    steps: tuple[Step, ...]
    buffer_dtype: tuple[torch.dtype, ...]  # of each buffer's first view (uint8 if none)
    loss_op: int  # read `loss_views` just before this op runs
    loss_views: tuple[int, ...]


def dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValidationError(f"unknown dtype {name!r}")
    return dt


def resolve(target: str, where: str) -> Any:
    """`aten.convolution.default` -> `torch.ops.aten.convolution.default`."""
    parts = target.split(".")
    if len(parts) != 3:
        raise ValidationError(f"{where}: target {target!r} is not namespace.op.overload")
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        raise ValidationError(f"{where}: torch has no operator {target!r}") from None


class _Decoder:
    """The tagged JSON of `traces/capture.py` (`_Recorder.encode`) back to
    torch objects. Device tags naming the capture device become the run
    device; any other device (the host) stays what it was."""

    def __init__(self, capture_device: str, run_device: torch.device, where: str):
        self.capture_type = torch.device(capture_device).type
        self.run_device = run_device
        self.where = where

    def __call__(self, x: Any) -> Any:
        if isinstance(x, list):
            return [self(y) for y in x]
        if not isinstance(x, dict):
            return x
        if "view" in x:
            return ViewRef(int(x["view"]))
        if "host_tensor" in x:
            if x["host_tensor"] is None:
                raise ValidationError(f"{self.where}: a host tensor's value was not recorded")
            return HostTensor(x["host_tensor"], dtype_of(x["dtype"]))
        if "float" in x:
            return float(x["float"])
        if "complex" in x:
            re, im = x["complex"]
            return complex(re, im)
        if "dtype" in x:
            return dtype_of(x["dtype"])
        if "device" in x:
            dev = x["device"]
            return self.run_device if dev == self.capture_type else torch.device(dev)
        if "layout" in x:
            return getattr(torch, x["layout"])
        if "memory_format" in x:
            return getattr(torch, x["memory_format"])
        if "generator" in x:
            return None  # the default generator, seeded per iteration
        raise ValidationError(f"{self.where}: cannot rebuild argument {str(x)[:60]}")


def _views_in(x: Any) -> list[int]:
    if isinstance(x, ViewRef):
        return [x.view]
    if isinstance(x, list):
        return [v for y in x for v in _views_in(y)]
    return []


def _mutated_slots(fn: Any, target: str, args: tuple, kwargs: dict) -> list[ArgSlot]:
    slots: list[ArgSlot] = []
    for i, a in enumerate(fn._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        if not a.kwarg_only and i < len(args):
            slots.append(("args", i))
        elif a.name in kwargs:
            slots.append(("kwargs", a.name))
    hidden = HIDDEN_WRITES.get(target)
    if hidden is not None and len(args) > hidden[1] and args[hidden[1]] is True:
        slots += [("args", p) for p in hidden[0] if args[p] is not None]
    return slots


def _slot_value(args: tuple, kwargs: dict, slot: ArgSlot) -> Any:
    return args[slot[1]] if slot[0] == "args" else kwargs[slot[1]]  # type: ignore[index]


def compile_trace(trace: Trace, device: torch.device) -> Program:
    """Resolve every op of `trace` for a replay on `device`."""
    vb = trace.view_buffer
    created_at = trace.created_at
    frees: list[list[int]] = [[] for _ in trace.ops]
    for b in np.flatnonzero(~trace.persistent):
        f = int(trace.freed_after[b])
        if 0 <= f < trace.n_ops:
            frees[f].append(int(b))
    steps = []
    for op in trace.ops:
        where = f"ops[{op.id}] ({op.target})"
        fn = resolve(op.target, where)
        dec = _Decoder(trace.meta.device, device, where)
        args = tuple(dec(a) for a in op.args.get("args", []))
        kwargs = {k: dec(v) for k, v in op.args.get("kwargs", {}).items()}
        creates = tuple(dict.fromkeys(int(vb[v]) for v in op.writes if created_at[vb[v]] == op.id))
        slots = _mutated_slots(fn, op.target, args, kwargs)
        in_place = {int(vb[v]) for s in slots for v in _views_in(_slot_value(args, kwargs, s))}
        in_place |= {int(b) for b in trace.op_writes(op.id)}
        needs = {int(b) for b in trace.op_accesses(op.id)} | in_place
        steps.append(
            Step(
                op=op.id,
                fn=fn,
                args=args,
                kwargs=kwargs,
                needs=tuple(sorted(needs - set(creates))),
                accesses=frozenset(needs),
                creates=creates,
                create_bytes=int(sum(int(trace.buffers[b].nbytes) for b in creates)),
                writes=tuple(sorted(in_place - set(creates))),
                mutated=tuple(slots),
                frees=tuple(sorted(frees[op.id])),
                rng=op.rng,
            )
        )
    loss_op, loss_views = _loss(trace)
    return Program(trace, tuple(steps), _buffer_dtypes(trace), loss_op, loss_views)


def _buffer_dtypes(trace: Trace) -> tuple[torch.dtype, ...]:
    out: list[torch.dtype | None] = [None] * trace.n_buffers
    for v in trace.views:
        if out[v.buffer] is None:
            out[v.buffer] = dtype_of(v.dtype)
    return tuple(torch.uint8 if d is None else d for d in out)


def _loss(trace: Trace) -> tuple[int, tuple[int, ...]]:
    """The loss: the 0-dim floating views the first backward op reads (the
    seed of backward, `ones_like(loss)`), read just before that op. Without
    a backward phase, the 0-dim floating views the last op writes."""
    first_bwd = next((op for op in trace.ops if op.phase is Phase.BACKWARD), None)
    op = first_bwd if first_bwd is not None else trace.ops[-1] if trace.ops else None
    if op is None:
        return -1, ()
    views = op.reads if first_bwd is not None else op.writes
    scalars = tuple(
        v
        for v in views
        if trace.views[v].shape == () and dtype_of(trace.views[v].dtype).is_floating_point
    )
    return (op.id if first_bwd is not None else op.id + 1), scalars
