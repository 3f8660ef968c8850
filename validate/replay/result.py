"""What a replay returns, and the check that two replays computed the same."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from memplan.validate.errors import ValidationError
from memplan.validate.replay.transfer import Direction, TransferRecord


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """One replay of `iterations` training steps of a trace.

    Times are seconds, sizes bytes. Per-op arrays are `[iteration, op]`.
    `state` holds every persistent buffer (params, optimizer state, module
    buffers) after the last iteration, as a flat host tensor of its dtype,
    by buffer id. `memory_curve[k, i]` is the device pool while op i of
    iteration k runs (its outputs allocated, the frees after it not yet
    done; accounted exactly, see NOTE [ Device bytes ]); `peak_bytes` the
    pool's peak over the whole run, `iteration_peak_bytes[k]` over iteration
    k (from the start of its inputs to the start of the next one's, copies
    included). `allocator_peak_bytes` is CUDA's
    `max_memory_allocated` above what was allocated before the replay (None
    on CPU). `size_mismatches` lists buffers whose real storage is larger
    than the trace records (a meta capture can under-count, e.g. a CPU
    `mse_loss` returns its 0-dim loss inside its elementwise buffer); the
    pool counts the trace's sizes.
    """

    model: str
    device: str
    seed: int
    state: dict[int, torch.Tensor]
    names: dict[int, str]
    losses: np.ndarray  # float64[iterations, n_loss_views]
    op_seconds: np.ndarray  # float64[iterations, n_ops]: the call (CPU) or its kernels (CUDA)
    iteration_seconds: np.ndarray  # float64[iterations]: wall time, inputs ready to last op done
    wait_seconds: np.ndarray  # float64[iterations]: compute stalled on swap-ins
    recompute_seconds: np.ndarray  # float64[iterations]: chains re-run (wall / device time)
    recomputes: np.ndarray  # int64[iterations], recompute events that ran
    memory_curve: np.ndarray  # int64[iterations, n_ops]
    peak_bytes: int
    iteration_peak_bytes: np.ndarray  # int64[iterations]
    host_peak_bytes: int
    allocator_peak_bytes: int | None
    transfers: tuple[TransferRecord, ...]
    size_mismatches: dict[int, tuple[int, int]]  # buffer -> (trace nbytes, real nbytes)

    @property
    def iterations(self) -> int:
        return len(self.iteration_seconds)

    def bytes_moved(self, direction: Direction) -> int:
        return sum(t.nbytes for t in self.transfers if t.direction is direction)


def _describe(result: ReplayResult, b: int) -> str:
    name = result.names.get(b, "")
    return f"buffer {b} ({name})" if name else f"buffer {b}"


def compare_results(a: ReplayResult, b: ReplayResult) -> None:
    """Raise `ValidationError` unless `a` and `b` computed bit-identical
    persistent state and losses; the message names the first differing
    buffer (by id) and by how much it differs."""
    if a.state.keys() != b.state.keys():
        only = sorted(a.state.keys() ^ b.state.keys())
        raise ValidationError(f"the replays hold different buffers: {only[:5]} in only one")
    if a.losses.shape != b.losses.shape:
        raise ValidationError(
            f"losses: {a.losses.shape} vs {b.losses.shape} (iterations, loss values)"
        )
    for k in sorted(a.state):
        x, y = a.state[k], b.state[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            raise ValidationError(
                f"{_describe(a, k)}: {x.dtype}[{x.numel()}] vs {y.dtype}[{y.numel()}]"
            )
        if not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            differ = x.view(torch.uint8).reshape(x.numel(), -1) != y.view(torch.uint8).reshape(
                y.numel(), -1
            )
            idx = differ.any(dim=1).nonzero().flatten()
            first = int(idx[0])
            detail = f"{len(idx)} of {x.numel()} elements differ, first at [{first}]"
            if x.dtype.is_floating_point:
                diff = (x.double() - y.double()).abs().nan_to_num(nan=float("inf")).max()
                detail += f", max abs diff {float(diff):.3g}"
            raise ValidationError(f"{_describe(a, k)} differs: {detail}")
    same = np.array_equal(a.losses.view(np.uint64), b.losses.view(np.uint64))
    if not same:
        it, j = np.argwhere(a.losses.view(np.uint64) != b.losses.view(np.uint64))[0]
        raise ValidationError(
            f"loss {j} of iteration {it} differs: {a.losses[it, j]!r} vs {b.losses[it, j]!r}"
        )
