"""Calling one op of a trace against the device pool: its arguments as views
over the live buffers, the call, and binding its new outputs to the buffers
it creates (NOTE [ Mapping outputs to buffers ] in `validate/replay/program.py`)."""

from __future__ import annotations

import time
from typing import Any

import torch
from memplan.traces.model import Trace
from memplan.validate.errors import ValidationError
from memplan.validate.replay.device import CudaTimer
from memplan.validate.replay.pool import DevicePool
from memplan.validate.replay.program import HostTensor, Step, ViewRef
from torch.utils._pytree import tree_flatten


class Invoker:
    """Runs steps against `pool`; remembers outputs larger than the trace says."""

    def __init__(self, trace: Trace, pool: DevicePool, device: torch.device):
        self.trace = trace
        self.pool = pool
        self.nbytes = trace.nbytes
        self.dev = device
        self.size_mismatches: dict[int, tuple[int, int]] = {}  # buffer -> (trace, real)

    def call(
        self,
        step: Step,
        timer: CudaTimer | None,
        scratch: frozenset[int] = frozenset(),
        bind: frozenset[int] | None = None,
    ) -> float:
        """Run `step` and bind its new outputs (only those in `bind`, if
        given; the others are dropped at once). In-place writes to buffers in
        `scratch` go to clones (NOTE [ Recompute on demand ] in `validate/replay/executor.py`).
        Returns the op's seconds (host time; the executor reads CUDA events)."""
        pool = self.pool
        writes = tuple(b for b in step.writes if b not in scratch) if scratch else step.writes
        # outputs are taken as the op starts, as the simulator does (NOTE
        # [ Device bytes ]); writes count from here for a copy ending meanwhile
        missing = pool.begin_op(step.op, step.needs, writes, step.create_bytes)
        if missing is not None:
            raise ValidationError(f"{self.op(step.op)} needs {self.gone(missing)}")
        storages: set[int] = set()  # the arguments' views are stable (NOTE [ One lock ])
        args = [
            self.fill(a, storages, scratch if ("args", j) in step.mutated else frozenset())
            for j, a in enumerate(step.args)
        ]
        kwargs = {
            k: self.fill(v, storages, scratch if ("kwargs", k) in step.mutated else frozenset())
            for k, v in step.kwargs.items()
        }
        if timer is not None:
            timer.start(step.op)
        t0 = time.perf_counter()
        try:
            out = step.fn(*args, **kwargs)
        except Exception as e:
            pool.op_failed()
            raise ValidationError(f"{self.op(step.op)} failed on replay: {e}") from e
        seconds = time.perf_counter() - t0
        if timer is not None:
            timer.end(step.op)
        del args, kwargs
        new = new_storages(out, storages, self.dev)
        del out
        if len(new) != len(step.creates):
            raise ValidationError(
                f"{self.op(step.op)} made {len(new)} new buffers, the trace records "
                f"{len(step.creates)}: {list(step.creates)}"
            )
        for b, s in zip(step.creates, new, strict=True):
            expected = int(self.nbytes[b])
            if s.nbytes() != expected:
                if s.nbytes() < expected:
                    raise ValidationError(
                        f"{self.op(step.op)}: its output for {self.name(b)} has {s.nbytes()} "
                        f"bytes, fewer than the {expected} the trace records"
                    )
                self.size_mismatches[b] = (expected, s.nbytes())
        pool.end_op(step.op, step.creates, new, bind, writes)
        del new
        return seconds

    def fill(self, x: Any, storages: set[int], scratch: frozenset[int]) -> Any:
        """A template argument with tensors in place of `ViewRef`s; views of
        `scratch` buffers are cloned."""
        if isinstance(x, ViewRef):
            t = self.pool.view(x.view)
            if scratch and int(self.trace.views[x.view].buffer) in scratch:
                t = t.clone()
            storages.add(t.untyped_storage()._cdata)
            return t
        if isinstance(x, list):
            return [self.fill(y, storages, scratch) for y in x]
        if isinstance(x, HostTensor):
            t = x.make()
            storages.add(t.untyped_storage()._cdata)
            return t
        return x

    def gone(self, b: int) -> str:
        where = "on the host" if self.pool.has_host_copy(b) else "not on the device"
        return f"{self.name(b)}, which is {where}"

    def op(self, i: int) -> str:
        return f"op {i} ({self.trace.ops[i].target})"

    def name(self, b: int) -> str:
        name = self.trace.buffers[b].name
        return f"buffer {b} ({name})" if name else f"buffer {b}"


def new_storages(out: Any, known: set[int], dev: torch.device) -> list[torch.UntypedStorage]:
    """The distinct storages among an op's outputs on `dev` that none of its
    arguments owns, in output order (NOTE [ Mapping outputs to buffers ])."""
    seen = set(known)
    new = []
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.device == dev:
            s = t.untyped_storage()
            if s._cdata not in seen:
                seen.add(s._cdata)
                new.append(s)
    return new
