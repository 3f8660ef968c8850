"""Apply a plan to a real training step in user code.

    runtime = PlanRuntime(model, export(plan, trace), optimizer=optimizer)  # once
    for batch in data:
        with runtime.step() as stats:
            loss = loss_fn(model(batch.x), batch.y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    runtime.close()  # the training state back on the device, the hooks removed

`apply_plan(model, plan, trace)` is the one-step shorthand. Decisions come
from `validate.runtime.plan` (NOTE [ From plan events to saved tensors ]):
offloads become `saved_tensors_hooks`, recomputes selective activation
checkpointing of the planned modules; moves of parameters, gradients and
optimizer state and host optimizer steps run at the moments of
`validate.runtime.moments` (`validate.runtime.state`), the optimizer's ones
in its step hooks. The forward pass, the loss and backward must run inside
the step, as they did at capture."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from memplan.planners.core.plan import Plan
from memplan.traces.model import Trace
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.moments import Moment, When
from memplan.validate.runtime.pinned import PinnedPool, flat
from memplan.validate.runtime.plan import Action, RuntimePlan, SavedDecision, export
from memplan.validate.runtime.state import StateRuntime, StateStats
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

# NOTE [ Offload and prefetch ]
# - Pack: every saved tensor on the model's device is matched to the next entry of the
#   trace's `saved` list the hooks see (checkpointed regions' entries skipped); a wrong
#   module or storage size is a `RuntimePlanError`, as are too few saved tensors at the end.
# - Offload copies the whole storage (view, strides and offset come back exactly) to the
#   host, once per buffer in the step. CUDA: on a side stream that waits for the current
#   one, into a reused pinned pool, the source kept alive until the copy's event completes;
#   CPU: synchronously.
# - Prefetch starts at the unpack named by `prefetch_after` (CUDA: on the side stream, which
#   the compute stream waits for at the unpack that needs it; CPU: into a separate host
#   tensor); a tensor never prefetched is fetched when unpacked (`StepStats.late`).
# - Accounting: device-side bytes of distinct non-persistent storages held by saved tensors,
#   now and at peak. Full text: docs/notes.md, "Offload and prefetch".


@dataclass(slots=True)
class StepStats:
    """One step under a plan. Bytes are distinct storages (NOTE [ Offload and
    prefetch ]); counts are saved tensors seen by the hooks."""

    packed: int = 0
    kept: int = 0
    offloaded: int = 0
    prefetched: int = 0
    late: int = 0
    recomputed_ops: int = 0
    device_bytes: int = 0
    device_peak_bytes: int = 0
    forward_device_bytes: int = 0  # at the first unpack: all of forward saved, none used
    host_bytes: int = 0
    host_peak_bytes: int = 0
    offloaded_bytes: int = 0
    region_inputs: int = 0  # inputs checkpoint saved for its regions (kept, not counted above)


@dataclass(slots=True)
class _Stored:
    """One buffer's saved data in the step."""

    decision: SavedDecision
    holders: int = 0
    host: torch.Tensor | None = None  # flat uint8 host copy
    device: torch.Tensor | None = None  # flat uint8 device copy once prefetched
    source: torch.Tensor | None = None  # CUDA: the original, alive until `event` completes
    event: Any = None  # CUDA: the offload's (then the prefetch's) copy event
    counted: bool = False  # its bytes are in `StepStats.device_bytes`


class _Packed:
    """What the pack hook returns: the tensor kept, or how to rebuild it."""

    __slots__ = ("dtype", "index", "offset", "owner", "shape", "stored", "stride", "tensor")

    def __init__(self, owner: _Step, index: int, stored: _Stored, t: torch.Tensor, keep: bool):
        self.owner, self.index, self.stored = owner, index, stored
        self.tensor = t if keep else None
        self.dtype, self.shape, self.stride = t.dtype, t.shape, t.stride()
        self.offset = t.storage_offset()
        stored.holders += 1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finaliser
            self.owner.release(self)


class _Step:
    """The hooks of one step (NOTE [ Offload and prefetch ])."""

    def __init__(self, rt: PlanRuntime):
        self.rt = rt
        self.stats = StepStats()
        self.cursor = 0
        self.stored: dict[int, _Stored] = {}
        self.triggered: set[int] = set()
        self.persistent = {
            t.untyped_storage().data_ptr() for t in (*rt.model.parameters(), *rt.model.buffers())
        }
        self.unpacked = False

    # ---- pack -------------------------------------------------------------------
    def _next(self, module: str) -> SavedDecision:
        saved = self.rt.plan.saved
        while self.cursor < len(saved) and saved[self.cursor].action in _REGION_ACTIONS:
            self.cursor += 1
        if self.cursor >= len(saved):
            raise RuntimePlanError(
                f"saved tensor #{self.stats.packed} (in module {module!r}): the trace recorded "
                f"only {self.rt.hooked} outside checkpointed modules"
            )
        d = saved[self.cursor]
        if d.module != module:
            raise RuntimePlanError(
                f"saved tensor #{d.index}: packed in module {module!r}, the trace recorded "
                f"{d.module!r} (is this the model the trace was captured from?)"
            )
        self.cursor += 1
        return d

    def pack(self, t: torch.Tensor) -> Any:
        rt = self.rt
        if t.device != rt.device or t.layout != torch.strided:
            return t  # not device memory (capture did not record it either)
        if rt.entering:  # a checkpointed region's inputs, saved as the region starts
            self.stats.region_inputs += 1
            return t
        self._reap()
        d = self._next(rt.stack[-1] if rt.stack else "")
        nbytes = t.untyped_storage().nbytes()
        if nbytes != d.nbytes:
            raise RuntimePlanError(
                f"saved tensor #{d.index} (module {d.module!r}): its storage has {nbytes} bytes, "
                f"the trace recorded {d.nbytes} (another batch size or dtype?)"
            )
        self.stats.packed += 1
        persistent = d.persistent or t.untyped_storage().data_ptr() in self.persistent
        stored = self.stored.get(d.buffer)
        if stored is None:
            stored = self.stored[d.buffer] = _Stored(d)
        if d.action is Action.OFFLOAD and not persistent:
            self.stats.offloaded += 1
            if stored.host is None:
                self._offload(stored, t)
            return _Packed(self, d.index, stored, t, keep=False)
        self.stats.kept += 1
        packed = _Packed(self, d.index, stored, t, keep=True)
        if not persistent:
            self._count(stored, True)
        return packed

    def _offload(self, stored: _Stored, t: torch.Tensor) -> None:
        rt, src = self.rt, flat(t)
        host = rt.pool.get(src.numel())
        if rt.cuda:
            stream = rt.side_stream
            stream.wait_stream(torch.cuda.current_stream(rt.device))  # read at call time
            with torch.cuda.stream(stream):
                host.copy_(src, non_blocking=True)
                stored.event = torch.cuda.Event()
                stored.event.record(stream)
            stored.source = src
            self._count(stored, True)
        else:
            host.copy_(src)
        stored.host = host
        self.stats.offloaded_bytes += host.numel()
        self.stats.host_bytes += host.numel()
        self.stats.host_peak_bytes = max(self.stats.host_peak_bytes, self.stats.host_bytes)

    # ---- unpack -------------------------------------------------------------------
    def unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            return packed
        if not self.unpacked:
            self.unpacked = True
            self.stats.forward_device_bytes = self.stats.device_bytes
        self._reap()
        if packed.index not in self.triggered:
            self.triggered.add(packed.index)
            for stored in self.rt.prefetch_at.get(packed.index, ()):
                s = self.stored.get(stored)
                if s is not None and s.host is not None and s.device is None:
                    self._prefetch(s)
                    self.stats.prefetched += 1
        if packed.tensor is not None:
            return packed.tensor
        s = packed.stored
        if s.device is None:
            self._prefetch(s)
            self.stats.late += 1
        assert s.device is not None
        if self.rt.cuda:
            current = torch.cuda.current_stream(self.rt.device)
            if s.event is not None:
                current.wait_event(s.event)
            s.device.record_stream(current)
        out = torch.empty(0, dtype=packed.dtype, device=s.device.device)
        return out.set_(s.device.untyped_storage(), packed.offset, packed.shape, packed.stride)

    def _prefetch(self, s: _Stored) -> None:
        rt, host = self.rt, s.host
        assert host is not None
        if rt.cuda:
            stream = rt.side_stream
            if s.event is not None:  # the offload copy itself must be done first
                stream.wait_event(s.event)
            with torch.cuda.stream(stream):
                s.device = torch.empty(host.numel(), dtype=torch.uint8, device=rt.device)
                s.device.copy_(host, non_blocking=True)
                s.event = torch.cuda.Event()
                s.event.record(stream)
        else:
            s.device = host.clone()  # the "device" copy: a separate host tensor
        self._count(s, True)

    # ---- release and accounting -------------------------------------------------------
    def release(self, packed: _Packed) -> None:
        s = packed.stored
        s.holders -= 1
        if s.holders > 0:
            return
        if s.host is not None:
            self.rt.pool.put(s.host, s.event)
            self.stats.host_bytes -= s.host.numel()
            s.host = None
        s.device = None
        if s.source is None:
            self._count(s, False)

    def _count(self, s: _Stored, on: bool) -> None:
        if s.counted == on:
            return
        s.counted = on
        self.stats.device_bytes += s.decision.nbytes if on else -s.decision.nbytes
        self.stats.device_peak_bytes = max(self.stats.device_peak_bytes, self.stats.device_bytes)

    def _reap(self) -> None:
        """CUDA: let go of offload sources whose copy has completed."""
        for s in self.stored.values():
            if s.source is not None and (s.event is None or s.event.query()):
                s.source = None
                if s.device is None:
                    self._count(s, False)

    def finish(self) -> None:
        saved = self.rt.plan.saved
        while self.cursor < len(saved) and saved[self.cursor].action in _REGION_ACTIONS:
            self.cursor += 1
        if self.cursor != len(saved):
            d = saved[self.cursor]
            raise RuntimePlanError(
                f"the step saved {self.stats.packed} tensors outside checkpointed modules, the "
                f"trace recorded {self.rt.hooked}: the first missing is #{d.index} in module "
                f"{d.module!r} (run the forward pass, the loss and backward inside the step)"
            )
        self.rt.check_recompute()


_REGION_ACTIONS = frozenset({Action.RECOMPUTE, Action.REGION})


class PlanRuntime:
    """A runtime plan bound to `model` (and to `optimizer`, which a plan that
    moves gradients or optimizer state, or steps parameters on the host,
    needs): its hooks, the side stream and the host pool, reused by every
    `step()`. `close()` (or leaving a `with PlanRuntime(...)` block) puts the
    training state back on the device and removes the optimizer's hooks."""

    def __init__(
        self,
        model: torch.nn.Module,
        plan: RuntimePlan,
        device: torch.device | None = None,
        *,
        optimizer: torch.optim.Optimizer | None = None,
    ):
        modules = dict(model.named_modules())
        for d in plan.saved:
            if d.module and d.module not in modules:
                raise RuntimePlanError(
                    f"saved tensor #{d.index}: module {d.module!r} of the trace is not in the model"
                )
        for r in plan.regions:
            if r not in modules:
                raise RuntimePlanError(f"checkpointed module {r!r} of the plan is not in the model")
            if not has_forward(modules[r]):
                raise RuntimePlanError(
                    f"checkpointed module {r!r} is a {type(modules[r]).__name__} without a "
                    "forward: export the plan with the model "
                    "(memplan.validate.runtime.hooks.export_for)"
                )
        first = next(iter(model.parameters()), None)
        self.device = (
            torch.device(device)
            if device is not None
            else (first.device if first is not None else torch.device("cpu"))
        )
        self.model = model
        self.plan = plan
        self.modules = modules
        self.cuda = self.device.type == "cuda"
        self.side_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.pool = PinnedPool(pin=self.cuda)
        self.hooked = sum(d.action not in _REGION_ACTIONS for d in plan.saved)
        self.prefetch_at: dict[int, list[int]] = defaultdict(list)
        for d in plan.saved:
            at = self.prefetch_at[d.prefetch_after] if d.prefetch_after is not None else None
            if d.action is Action.OFFLOAD and at is not None and d.buffer not in at:
                at.append(d.buffer)
        self.keys: dict[tuple[str, int], set[tuple[str, str, int]]] = defaultdict(set)
        for r in plan.recompute:
            self.keys[(r.region, r.invocation)].add((r.module, r.target, r.occurrence))
        self.stack: list[str] = []
        self.entering = False
        self.calls: defaultdict[str, int] = defaultdict(int)
        self.seen: set[tuple[str, int, str, str, int]] = set()
        self.optimizer = optimizer
        self.state = StateRuntime(
            model, plan.state, plan.host_step, optimizer, self.device, self.pool, self.side_stream
        )

    @property
    def state_stats(self) -> StateStats:
        """Moves of the training state since the runtime started."""
        return self.state.stats

    @property
    def host_optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer over the host copies of `plan.host_step` (its state is
        theirs), or None."""
        return self.state.host.host if self.state.host is not None else None

    def close(self) -> None:
        """The training state back on the device, the optimizer's hooks removed."""
        self.state.close()

    def __enter__(self) -> PlanRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def step(self) -> Iterator[StepStats]:
        """One training step under the plan; yields its live `StepStats`."""
        st = _Step(self)
        self.entering = False
        self.stack.clear()
        self.calls.clear()
        self.seen.clear()
        self.state.at(When(Moment.STEP_START))
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._module_stack())
            stack.enter_context(self._forward_moments())
            for r in self.plan.regions:
                stack.enter_context(self._checkpointed(r))
            if self.plan.saved:  # a plan of state moves alone leaves saved tensors be
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(st.pack, st.unpack))
            yield st.stats
        st.stats.recomputed_ops = len(self.seen)
        if self.plan.saved:
            st.finish()
        self.state.at(When(Moment.AFTER_BACKWARD))

    # ---- module tracking and checkpointing ------------------------------------------------
    @contextlib.contextmanager
    def _module_stack(self) -> Iterator[None]:
        handles = []
        for path, mod in self.modules.items():

            def pre(_m: Any, _a: Any, path: str = path) -> None:
                self.stack.append(path)

            def post(_m: Any, _a: Any, _o: Any) -> None:
                self.stack.pop()

            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(post, always_call=True))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def _forward_moments(self) -> Iterator[None]:
        """The first forward pre-hook of each module named by a FORWARD moment."""
        fired: set[str] = set()
        handles = []
        for path in self.state.forward_modules():

            def pre(_m: Any, _a: Any, path: str = path) -> None:
                if path not in fired:
                    fired.add(path)
                    self.state.at(When(Moment.FORWARD, path))

            handles.append(self.modules[path].register_forward_pre_hook(pre))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def _checkpointed(self, region: str) -> Iterator[None]:
        """Wrap `region`'s forward in selective checkpointing (NOTE [ From plan
        events to saved tensors ]); its own forward is put back on exit."""
        module = self.modules[region]
        orig = module.forward

        def inner(*args: Any, **kwargs: Any) -> Any:
            self.entering = False
            self.stack.append(region)  # module hooks do not run when checkpoint recomputes
            try:
                return orig(*args, **kwargs)
            finally:
                self.stack.pop()

        def forward(*args: Any, **kwargs: Any) -> Any:
            call = self.calls[region]
            self.calls[region] += 1
            policy = self._policy(region, call)
            self.entering = True  # until `inner` starts: checkpoint saves the inputs
            return checkpoint(
                inner,
                *args,
                use_reentrant=False,
                context_fn=lambda: create_selective_checkpoint_contexts(
                    policy, allow_cache_entry_mutation=True
                ),
                **kwargs,
            )

        own = module.__dict__.get("forward")  # an instance attribute the user set, if any
        module.forward = forward
        try:
            yield
        finally:
            if own is None:
                del module.forward  # the class's forward shows again
            else:
                module.forward = own

    def _policy(self, region: str, call: int) -> Any:
        keys = self.keys.get((region, call), set())
        counts: dict[bool, defaultdict[tuple[str, str], int]] = {
            False: defaultdict(int),
            True: defaultdict(int),
        }

        def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            module, target = (self.stack[-1] if self.stack else ""), str(op)
            count = counts[bool(ctx.is_recompute)]
            n = count[(module, target)]
            count[(module, target)] += 1
            if (module, target, n) in keys:
                if not ctx.is_recompute:
                    self.seen.add((region, call, module, target, n))
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE

        return policy

    def check_recompute(self) -> None:
        for r in self.plan.recompute:
            if (r.region, r.invocation, r.module, r.target, r.occurrence) not in self.seen:
                raise RuntimePlanError(
                    f"the plan recomputes {r.target} #{r.occurrence} in module {r.module!r} "
                    f"(call {r.invocation} of {r.region!r}), which this step did not run"
                )


def has_forward(module: torch.nn.Module) -> bool:
    """Whether calling `module` runs a forward (a ModuleList's does not)."""
    return type(module).forward is not torch.nn.Module.forward


def export_for(model: torch.nn.Module, plan: Plan, trace: Trace, planner: str = "") -> RuntimePlan:
    """`export`, checkpointing only modules of `model` that have a forward."""
    modules = dict(model.named_modules())
    return export(
        plan, trace, planner, callable_=lambda p: p in modules and has_forward(modules[p])
    )


def apply_plan(
    model: torch.nn.Module, plan: Plan | RuntimePlan, trace: Trace | None = None
) -> contextlib.AbstractContextManager[StepStats]:
    """One training step of `model` under `plan` (a `RuntimePlan`, or a `Plan`
    with its `trace`), as a context manager yielding the step's `StepStats`.
    For many steps, make one `PlanRuntime` and call its `step()`."""
    if isinstance(plan, Plan):
        if trace is None:
            raise RuntimePlanError("apply_plan: a Plan needs its trace (or pass a RuntimePlan)")
        plan = export_for(model, plan, trace)
    return PlanRuntime(model, plan).step()
