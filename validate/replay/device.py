"""The run device: naming it, seeding and forking its generator, timing ops
on it, and the determinism switches a bit-exact replay needs."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from memplan.validate.errors import ValidationError


def run_device(device: str) -> torch.device:
    """`cpu`, `cuda` or `cuda:N`, with the CUDA index made explicit."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValidationError(f"device={device!r}: CUDA is not available on this machine")
        return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    if dev.type != "cpu":
        raise ValidationError(f"device={device!r} must be cpu or cuda")
    return dev


def iteration_seed(seed: int, iteration: int) -> int:
    state = np.random.SeedSequence([seed, iteration, 1]).generate_state(1, np.uint64)[0]
    return int(state) & ((1 << 63) - 1)


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off (and back on if it was on), as
    `timeit` does while it times: a collection holds the GIL from the op
    loop and the copy lanes alike, at random points of the replay (here up
    to a millisecond, over a hundred of them in one `validate_plan`).
    Replays make no reference cycles that need it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def deterministic(dev: torch.device) -> Iterator[None]:
    """Fork the generators; on CUDA also ask for deterministic kernels (the
    toggles are global, so they are put back on exit)."""
    devices = [dev.index] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        if dev.type != "cuda":
            yield
            return
        old = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.benchmark,
        )
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(old[0], warn_only=old[1])
            torch.backends.cudnn.benchmark = old[2]


def get_rng(dev: torch.device) -> torch.Tensor:
    """The state of `dev`'s default generator."""
    return torch.cuda.get_rng_state(dev) if dev.type == "cuda" else torch.get_rng_state()


def swap_rng(dev: torch.device, state: torch.Tensor) -> torch.Tensor:
    """Install `state` in `dev`'s default generator; return the state it replaces."""
    old = get_rng(dev)
    if dev.type == "cuda":
        torch.cuda.set_rng_state(state, dev)
    else:
        torch.set_rng_state(state)
    return old


def seed_rng(dev: torch.device, seed: int) -> None:
    if dev.type == "cuda":
        torch.cuda.default_generators[dev.index].manual_seed(seed)
    else:
        torch.random.default_generator.manual_seed(seed)


def cuda_event(timing: bool = False) -> Any:
    """An event after the work queued so far on the current stream."""
    e = torch.cuda.Event(enable_timing=timing)
    e.record()
    return e


class CudaTimer:
    """Per-op CUDA events on the compute stream, read once per iteration."""

    def __init__(self, n_ops: int):
        self.starts: list[Any] = [None] * n_ops
        self.ends: list[Any] = [None] * n_ops

    def start(self, op: int) -> None:
        self.starts[op] = torch.cuda.Event(enable_timing=True)
        self.starts[op].record()

    def end(self, op: int) -> None:
        self.ends[op] = torch.cuda.Event(enable_timing=True)
        self.ends[op].record()

    def seconds(self) -> np.ndarray:
        """float64[n_ops]: each op's device time (0 if it did not run). Call
        after synchronising the device."""
        return np.array(
            [
                0.0 if a is None or b is None else a.elapsed_time(b) * 1e-3
                for a, b in zip(self.starts, self.ends, strict=True)
            ]
        )
