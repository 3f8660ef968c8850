"""The training state's moves in a real loop: parameters, gradients and
optimizer state off the device between two moments of a step
(`moments.StateSwap`), and the optimizer step of chosen parameters run on
the host. `PlanRuntime` owns one `StateRuntime` and calls `at(when)` at
each moment (NOTE [ Moving training state ], NOTE [ The host optimizer step ])."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from memplan.traces.model import BufferKind
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.moments import Moment, StateSwap, When
from memplan.validate.runtime.pinned import PinnedPool, flat

# NOTE [ Moving training state ]
# - Out: the tensor's whole storage is copied to a host buffer and the tensor replaced by an
#   empty placeholder on the device: a parameter keeps its `nn.Parameter` (optimizers hold it)
#   and swaps its `.data`; a gradient keeps its tensor (`p.grad`) and swaps its `.data`;
#   optimizer state is replaced in `optimizer.state[p]`. A read while off fails on the shape.
# - Fetch starts the copy back into fresh device memory; back puts it in place (fetching
#   first if the planned fetch did not happen: `StateStats.late`). If user code replaced the
#   placeholder meanwhile (zero_grad, a loaded state dict), the host copy is dropped.
# - CUDA: copies on the runtime's side stream, which first waits for the current stream;
#   the old storage is `record_stream`ed to it; at back the current stream waits for the
#   fetch's event. Host buffers are pinned, from the runtime's pool. CPU: plain copies.
# - At a moment: tensors due back first, then those leaving, then fetches started.

# NOTE [ The host optimizer step ]
# Parameters in `host_step` keep a host master copy stepped by an instance of the user's
# optimizer class, with the same param-group hyperparameters (synced at every step, so LR
# schedulers apply; `capturable` off) and the only optimizer state of those parameters (moved
# from the user's optimizer when the runtime starts, back at `close`). In that optimizer's
# step pre-hook the device gradients are copied to the host copies, the host optimizer steps,
# the results are copied into the device parameters, and the device gradients are hidden
# (`p.grad = None`) so that the user's optimizer skips those parameters; its post-hook puts
# them back.


@dataclass(slots=True)
class StateStats:
    """Since the runtime started: tensors moved out and back, bytes."""

    moved_out: int = 0
    moved_back: int = 0
    late: int = 0  # brought back without the fetch the plan started earlier
    absent: int = 0  # due out but not there (no gradient yet, optimizer state not made)
    dropped: int = 0  # replaced by user code while off: the host copy dropped
    off_bytes: int = 0  # device bytes of tensors now off the device
    off_peak_bytes: int = 0
    host_steps: int = 0  # optimizer steps run on the host


class _Slot:
    """One tensor of the training state: where it lives on the model or the
    optimizer, and its host copy while off the device."""

    def __init__(self, swap: StateSwap, param: torch.nn.Parameter, optimizer: Any):
        self.swap, self.param, self.optimizer = swap, param, optimizer
        self.holder: Any = None  # what holds the placeholder while off
        self.host: torch.Tensor | None = None
        self.device: torch.Tensor | None = None  # fetched device bytes, not yet in place
        self.event: Any = None
        self.meta: tuple[torch.dtype, torch.Size, tuple[int, ...], int] | None = None

    def get(self) -> torch.Tensor | None:
        kind, p = self.swap.kind, self.param
        if kind is BufferKind.PARAM:
            return p.data
        if kind is BufferKind.GRAD:
            return p.grad
        return self.optimizer.state.get(p, {}).get(self.swap.key)

    def replace(self, t: torch.Tensor) -> Any:
        """Put `t` where the tensor lives; returns what now holds it."""
        kind, p = self.swap.kind, self.param
        if kind is BufferKind.PARAM:
            p.data = t
            return p
        if kind is BufferKind.GRAD:
            assert p.grad is not None
            p.grad.data = t
            return p.grad
        self.optimizer.state[p][self.swap.key] = t
        return t

    def still_held(self) -> bool:
        kind, p = self.swap.kind, self.param
        if kind is BufferKind.PARAM:
            return True
        if kind is BufferKind.GRAD:
            return p.grad is self.holder
        return self.optimizer.state.get(p, {}).get(self.swap.key) is self.holder


class StateRuntime:
    """The state swaps and host steps of one runtime plan, bound to a model
    and its optimizer (NOTE [ Moving training state ])."""

    def __init__(
        self,
        model: torch.nn.Module,
        state: tuple[StateSwap, ...],
        host_step: tuple[str, ...],
        optimizer: Any,
        device: torch.device,
        pool: PinnedPool,
        side_stream: Any,
    ):
        params = dict(model.named_parameters())
        modules = dict(model.named_modules())
        _check(state, host_step, params, modules, optimizer)
        self.device, self.pool, self.side = device, pool, side_stream
        self.cuda = device.type == "cuda"
        self.stats = StateStats()
        self.slots = [_Slot(s, params[s.param], optimizer) for s in state]
        self.out_at: defaultdict[When, list[_Slot]] = defaultdict(list)
        self.fetch_at: defaultdict[When, list[_Slot]] = defaultdict(list)
        self.back_at: defaultdict[When, list[_Slot]] = defaultdict(list)
        for slot in self.slots:
            self.out_at[slot.swap.out].append(slot)
            self.fetch_at[slot.swap.fetch].append(slot)
            self.back_at[slot.swap.back].append(slot)
        self.host = HostStep(optimizer, [params[n] for n in host_step], self) if host_step else None
        self.handles: list[Any] = []
        if optimizer is not None and (self.host or self._uses_optimizer()):
            self.handles = [
                optimizer.register_step_pre_hook(lambda *_: self.at(When(Moment.OPTIMIZER_STEP))),
                optimizer.register_step_post_hook(lambda *_: self.at(When(Moment.STEP_END))),
            ]

    def _uses_optimizer(self) -> bool:
        late = (Moment.OPTIMIZER_STEP, Moment.STEP_END)
        return any(w.moment in late for w in (*self.out_at, *self.fetch_at, *self.back_at))

    def forward_modules(self) -> list[str]:
        """Modules whose first forward pre-hook in a step is a moment."""
        whens = {*self.out_at, *self.fetch_at, *self.back_at}
        return sorted({w.module for w in whens if w.moment is Moment.FORWARD})

    def at(self, when: When) -> None:
        """Everything due at `when` (NOTE [ Moving training state ])."""
        for slot in self.back_at.get(when, ()):
            self._back(slot, late=slot.swap.fetch != when)
        if self.host is not None and when.moment is Moment.STEP_END:
            self.host.after()
        for slot in self.out_at.get(when, ()):
            self._out(slot)
        for slot in self.fetch_at.get(when, ()):
            if slot.host is not None and slot.device is None:
                self._fetch(slot)
        if self.host is not None and when.moment is Moment.OPTIMIZER_STEP:
            self.host.before()

    def close(self) -> None:
        """Every tensor back on the device, the host-stepped parameters' state
        back in the user's optimizer, the optimizer's hooks removed."""
        for slot in self.slots:
            self._back(slot, late=False)
        for h in self.handles:
            h.remove()
        self.handles = []
        if self.host is not None:
            self.host.after()
            self.host.give_back()

    # ---- moves ----------------------------------------------------------------------
    def _out(self, slot: _Slot) -> None:
        t = slot.get()
        if slot.host is not None:
            return  # already off
        if t is None or t.device != self.device or t.numel() == 0:
            self.stats.absent += 1
            return
        src = flat(t)
        host = self.pool.get(src.numel())
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            self.side.wait_stream(current)
            with torch.cuda.stream(self.side):
                host.copy_(src, non_blocking=True)
                slot.event = torch.cuda.Event()
                slot.event.record(self.side)
            src.record_stream(self.side)  # its memory is reused once the copy is done
        else:
            host.copy_(src)
        slot.meta = (t.dtype, t.shape, t.stride(), t.storage_offset())
        slot.host = host
        slot.holder = slot.replace(torch.empty(0, dtype=t.dtype, device=self.device))
        self.stats.moved_out += 1
        self.stats.off_bytes += src.numel()
        self.stats.off_peak_bytes = max(self.stats.off_peak_bytes, self.stats.off_bytes)

    def _fetch(self, slot: _Slot) -> None:
        host = slot.host
        assert host is not None
        if self.cuda:
            with torch.cuda.stream(self.side):  # after the copy out: the same stream
                slot.device = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
                slot.device.copy_(host, non_blocking=True)
                slot.event = torch.cuda.Event()
                slot.event.record(self.side)
        else:
            slot.device = host.clone()  # the "device" copy: a separate host tensor

    def _back(self, slot: _Slot, late: bool) -> None:
        host = slot.host
        if host is None:
            return
        if slot.device is None:
            self._fetch(slot)
            self.stats.late += late
        dev, meta = slot.device, slot.meta
        assert dev is not None and meta is not None
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(slot.event)
            dev.record_stream(current)
        self.stats.off_bytes -= host.numel()
        if slot.still_held():
            dtype, shape, stride, offset = meta
            t = torch.empty(0, dtype=dtype, device=dev.device)
            slot.replace(t.set_(dev.untyped_storage(), offset, shape, stride))
            self.stats.moved_back += 1
        else:
            self.stats.dropped += 1
        self.pool.put(host, slot.event)
        slot.host = slot.device = slot.holder = slot.meta = None

    def is_off(self, param: torch.nn.Parameter) -> bool:
        return any(
            s.param is param and s.swap.kind is BufferKind.PARAM and s.host is not None
            for s in self.slots
        )


def _check(
    state: tuple[StateSwap, ...],
    host_step: tuple[str, ...],
    params: dict[str, torch.nn.Parameter],
    modules: dict[str, torch.nn.Module],
    optimizer: Any,
) -> None:
    """`RuntimePlanError` naming the first swap or host step that does not
    fit the model and optimizer."""
    late = (Moment.OPTIMIZER_STEP, Moment.STEP_END)
    for i, s in enumerate(state):
        if s.param not in params:
            raise RuntimePlanError(f"state[{i}]: parameter {s.param!r} is not in the model")
        for w in (s.out, s.fetch, s.back):
            if w.moment is Moment.FORWARD and w.module not in modules:
                raise RuntimePlanError(
                    f"state[{i}] ({s.name}): module {w.module!r} is not in the model"
                )
        needs = s.kind is BufferKind.OPTIMIZER_STATE or any(
            w.moment in late for w in (s.out, s.fetch, s.back)
        )
        if needs and optimizer is None:
            raise RuntimePlanError(
                f"state[{i}] moves {s.name!r} with the optimizer's step: pass the optimizer "
                "(PlanRuntime(model, plan, optimizer=opt)) or leave the state moves out "
                "(dataclasses.replace(plan, state=(), host_step=()))"
            )
        if s.kind is BufferKind.OPTIMIZER_STATE and s.param in host_step:
            raise RuntimePlanError(
                f"state[{i}]: {s.name!r} is on the host already: {s.param!r} is in host_step"
            )
    for i, name in enumerate(host_step):
        if name not in params:
            raise RuntimePlanError(f"host_step[{i}]: parameter {name!r} is not in the model")
        if optimizer is None:
            raise RuntimePlanError(
                f"host_step[{i}] ({name!r}): pass the optimizer "
                "(PlanRuntime(model, plan, optimizer=opt))"
            )
        if not any(p is params[name] for g in optimizer.param_groups for p in g["params"]):
            raise RuntimePlanError(
                f"host_step[{i}]: parameter {name!r} is in none of the optimizer's param groups"
            )


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    """A param group's hyperparameters for the host copy."""
    out = {k: v for k, v in group.items() if k != "params"}
    if "capturable" in out:
        out["capturable"] = False  # CUDA graphs only: the host step is eager
    return out


class HostStep:
    """The optimizer step of some parameters on the host (NOTE [ The host
    optimizer step ])."""

    def __init__(self, optimizer: Any, chosen: list[torch.nn.Parameter], rt: StateRuntime):
        self.rt, self.optimizer = rt, optimizer
        pin = rt.cuda
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        user_groups, host_groups = [], []
        for g in optimizer.param_groups:
            mine = [p for p in g["params"] if any(p is c for c in chosen)]
            if not mine:
                continue
            hosts = []
            for p in mine:
                hp = torch.empty(p.shape, dtype=p.dtype, pin_memory=pin)
                hp.copy_(p.detach())
                hosts.append(torch.nn.Parameter(hp, requires_grad=p.requires_grad))
                self.pairs.append((p, hosts[-1]))
            user_groups.append(g)
            host_groups.append({"params": hosts, **_hyper(g)})
        self.host = type(optimizer)(host_groups, **_hyper(optimizer.defaults))
        self.groups = list(zip(user_groups, self.host.param_groups, strict=True))
        for p, hp in self.pairs:  # the state lives only on the host
            st = optimizer.state.pop(p, None)
            if st:
                self.host.state[hp] = {
                    k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
                    for k, v in st.items()
                }
        self.grads: dict[int, torch.Tensor] = {}
        self.hidden: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self.event: Any = None

    def before(self) -> None:
        """The optimizer's step pre-hook: step the host copies, copy them in."""
        rt = self.rt
        for g, hg in self.groups:
            hg.update(_hyper(g))
        current = torch.cuda.current_stream(rt.device) if rt.cuda else None
        if rt.cuda:
            rt.side.wait_stream(current)
        for i, (p, hp) in enumerate(self.pairs):
            if p.grad is None:
                hp.grad = None
                continue
            if rt.is_off(p):
                raise RuntimePlanError(
                    "a parameter stepped on the host is off the device at optimizer.step() "
                    f"(shape {tuple(hp.shape)}): the plan must bring it back first"
                )
            buf = self.grads.get(i)
            if buf is None:
                buf = self.grads[i] = torch.empty(hp.shape, dtype=hp.dtype, pin_memory=rt.cuda)
            if rt.cuda:
                with torch.cuda.stream(rt.side):
                    buf.copy_(p.grad, non_blocking=True)
            else:
                buf.copy_(p.grad)
            hp.grad = buf
            self.hidden.append((p, p.grad))
            p.grad = None  # the user's optimizer skips it
        if rt.cuda:
            rt.side.synchronize()
        self.host.step()
        self.rt.stats.host_steps += 1
        if rt.cuda:
            with torch.cuda.stream(rt.side):
                for p, hp in self.pairs:
                    p.data.copy_(hp.detach(), non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record(rt.side)
        else:
            for p, hp in self.pairs:
                p.data.copy_(hp.detach())

    def give_back(self) -> None:
        """The host optimizer's state into the user's optimizer: tensors shaped
        like their parameter on its device, the rest (Adam's step) as they are."""
        for p, hp in self.pairs:
            st = self.host.state.pop(hp, None)
            if st:
                self.optimizer.state[p] = {
                    k: v.to(p.device) if isinstance(v, torch.Tensor) and v.shape == p.shape else v
                    for k, v in st.items()
                }

    def after(self) -> None:
        """The optimizer's step post-hook: the device parameters ready on the
        current stream, the gradients shown again."""
        if self.event is not None:
            torch.cuda.current_stream(self.rt.device).wait_event(self.event)
            self.event = None
        for p, g in self.hidden:
            if p.grad is None:
                p.grad = g
        self.hidden = []
