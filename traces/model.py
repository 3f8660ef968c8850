"""The trace: one training iteration of one model at one batch size, in op order.

Records are frozen dataclasses; everything later layers loop over (sizes,
first and last access, per-op buffer sets) is derived once into numpy arrays
and cached on the `Trace`, so planners and the simulator never rebuild
per-op Python objects.

Memory is always counted per `Buffer` (a storage), never per `View`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np
from memplan.traces.target import Target

MemoryPolicy = Literal["framework", "liveness"]

# NOTE [ Trace dtypes ]
# A view's `dtype` is the name `str(torch.<dtype>)` gives without "torch."
# (`float32`, not its alias `float`), and DTYPE_BYTES lists every dtype torch
# exports: a capture can record any tensor, so the reader takes all of them.
# Bytes per element are `torch.dtype.itemsize` (torch/csrc/Dtype.cpp's
# `THPDtype_itemsize`: the scalar type's TypeMeta size), which is what a
# tensor's storage holds per element:
# - packed dtypes hold several values in one element and count one byte:
#   float4_e2m1fn_x2 (two fp4), quint4x2, quint2x4, bits1x8/2x4/4x2;
# - sub-byte shells (int1..int7, uint1..uint7) count one byte per element,
#   as torch allocates them (their packing is left to the kernels using them);
# - quantized dtypes count their integer storage (qint32: 4), not the
#   scale and zero point, which live in the quantizer, not in the storage.
# The first fourteen keep their order (hwmodels indexes dtypes by position);
# tests/traces/test_dtypes.py checks the table against the installed torch.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    # the rest of the floating and complex dtypes
    "complex32": 4,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    # unsigned integers wider than a byte
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    # quantized
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
    "quint4x2": 1,
    "quint2x4": 1,
    # untyped bits
    "bits8": 1,
    "bits16": 2,
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
    # sub-byte shells: one byte per element
    **{f"int{n}": 1 for n in range(1, 8)},
    **{f"uint{n}": 1 for n in range(1, 8)},
}

# NOTE [ Trace sanity ranges ]
# A trace file is refused when its figures cannot describe a training step on real hardware
# or would break the arithmetic downstream:
# - bytes: every buffer's `nbytes`, every op's `workspace_bytes` and the sum of all buffers
#   are at most MAX_TRACE_BYTES = 2**62, so int64 sums (numpy wraps past 2**63) stay exact;
# - time: one op's `duration_us` is at most a day (MAX_OP_US), beyond any real kernel;
# - work: one op's `flops` is at most MAX_OP_FLOPS = 10**20 (a day at about 1.16 PFLOP/s;
#   a 65536^3 matmul is 5.6e14), so predicted times stay finite.
# Times that still come out non-finite are an error where they are computed (the
# simulator's makespan, the planners' lane circles). Full text: docs/notes.md.
MAX_TRACE_BYTES = 2**62
MAX_OP_US = 86_400e6
MAX_OP_FLOPS = 10**20


class BufferKind(enum.Enum):
    INPUT = "input"
    PARAM = "param"
    GRAD = "grad"
    ACTIVATION = "activation"
    OPTIMIZER_STATE = "optimizer_state"
    OTHER = "other"


BUFFER_KINDS: tuple[BufferKind, ...] = tuple(BufferKind)


class Phase(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True, slots=True)
class Buffer:
    """A unit of device memory (a storage).

    `freed_after` is the op index after which PyTorch itself freed the buffer
    during capture (the vanilla baseline); a buffer still alive when the
    iteration ends is freed after the last op. Persistent buffers (params,
    optimizer state, module buffers) never die: `freed_after` is None.
    """

    id: int
    nbytes: int
    kind: BufferKind
    persistent: bool = False
    name: str = ""
    freed_after: int | None = None

    @property
    def exists_at_start(self) -> bool:
        """Persistent buffers and inputs are resident before op 0 runs."""
        return self.persistent or self.kind is BufferKind.INPUT


@dataclass(frozen=True, slots=True)
class View:
    """A tensor as an op sees it; `offset` and `stride` are in elements."""

    id: int
    buffer: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str


@dataclass(frozen=True, slots=True)
class Op:
    """One aten call. `reads` / `writes` are view ids; `args` is the JSON form
    of the call (views as ``{"view": id}``), enough to call it again."""

    id: int
    target: str
    phase: Phase
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    args: dict[str, Any] = field(default_factory=dict)
    flops: int = 0
    duration_us: float | None = None
    workspace_bytes: int = 0
    module: str = ""
    rng: bool = False


@dataclass(frozen=True, slots=True)
class SavedTensor:
    """A tensor autograd saved for backward, in pack order, with the module it
    was saved in: the key the runtime uses to match a live model to its trace."""

    index: int
    view: int
    module: str


# Passes of gradient accumulation one trace may hold: a trace grows by a whole
# forward and backward per pass, and 1024 micro-batches per step is beyond
# any recipe (an effective batch is what scaling the micro-batch is for).
MAX_ACCUMULATE = 1024


class Amp(enum.Enum):
    """Mixed precision of a captured step: none, or `torch.autocast` to bf16,
    or to fp16 with a `GradScaler`."""

    NONE = "none"
    BF16 = "bf16"
    FP16 = "fp16"


@dataclass(frozen=True, slots=True)
class TraceMeta:
    """What was captured and how. `optimizer` is the `torch.optim` class in
    lower case and `optimizer_kwargs` the keywords it was built with;
    `accumulate` forward/backward passes make one iteration (`batch_size` is
    each pass's micro-batch). Fields after `extra` came later: a file
    without them loads with these defaults (NOTE [ Meta fields added later ]
    in traces/io.py)."""

    model: str
    batch_size: int
    dtype: str = "float32"
    optimizer: str = ""
    device: str = "meta"
    torch_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    amp: Amp = Amp.NONE
    accumulate: int = 1
    # the device captured for (traces/target.py): None is the capture device's own dispatch
    target: Target | None = None


@dataclass(frozen=True, eq=False)
class Trace:
    """One iteration. Ids of buffers, views and ops equal their index."""

    meta: TraceMeta
    buffers: tuple[Buffer, ...]
    views: tuple[View, ...]
    ops: tuple[Op, ...]
    saved: tuple[SavedTensor, ...] = ()

    # ---- sizes -----------------------------------------------------------
    @property
    def n_ops(self) -> int:
        return len(self.ops)

    @property
    def n_buffers(self) -> int:
        return len(self.buffers)

    @cached_property
    def nbytes(self) -> np.ndarray:
        """int64[n_buffers]: bytes of each buffer."""
        return np.fromiter((b.nbytes for b in self.buffers), np.int64, self.n_buffers)

    @cached_property
    def persistent(self) -> np.ndarray:
        return np.fromiter((b.persistent for b in self.buffers), bool, self.n_buffers)

    @cached_property
    def kind_index(self) -> np.ndarray:
        """int8[n_buffers]: index of each buffer's kind in `BUFFER_KINDS`."""
        order = {k: i for i, k in enumerate(BUFFER_KINDS)}
        return np.fromiter((order[b.kind] for b in self.buffers), np.int8, self.n_buffers)

    @cached_property
    def exists_at_start(self) -> np.ndarray:
        return np.fromiter((b.exists_at_start for b in self.buffers), bool, self.n_buffers)

    @cached_property
    def view_buffer(self) -> np.ndarray:
        """int64[n_views]: the buffer behind each view."""
        return np.fromiter((v.buffer for v in self.views), np.int64, len(self.views))

    # ---- per-op buffer sets (CSR) ------------------------------------------
    def _csr(self, attr: str) -> tuple[np.ndarray, np.ndarray]:
        vb = self.view_buffer
        rows = [np.unique(vb[np.asarray(getattr(op, attr), np.int64)]) for op in self.ops]
        indptr = np.zeros(self.n_ops + 1, np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return indptr, flat.astype(np.int64)

    @cached_property
    def reads_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, buffers): buffers read by op i are buffers[indptr[i]:indptr[i+1]]."""
        return self._csr("reads")

    @cached_property
    def writes_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return self._csr("writes")

    @cached_property
    def access_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """Buffers read or written by each op (unique, sorted)."""
        rp, rb = self.reads_csr
        wp, wb = self.writes_csr
        rows = [np.union1d(rb[rp[i] : rp[i + 1]], wb[wp[i] : wp[i + 1]]) for i in range(self.n_ops)]
        indptr = np.zeros(self.n_ops + 1, np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        flat = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
        return indptr, flat

    def op_reads(self, i: int) -> np.ndarray:
        p, b = self.reads_csr
        return b[p[i] : p[i + 1]]

    def op_writes(self, i: int) -> np.ndarray:
        p, b = self.writes_csr
        return b[p[i] : p[i + 1]]

    def op_accesses(self, i: int) -> np.ndarray:
        p, b = self.access_csr
        return b[p[i] : p[i + 1]]

    @cached_property
    def writes_persistent(self) -> np.ndarray:
        """bool[n_ops]: the op writes a persistent buffer (an optimizer update,
        BatchNorm's running statistics). Re-running such an op is not free of
        side effects, so it can never be part of a recomputation."""
        p, b = self.writes_csr
        op_of = np.repeat(np.arange(self.n_ops, dtype=np.int64), np.diff(p))
        out = np.zeros(self.n_ops, bool)
        out[op_of[self.persistent[b]]] = True
        return out

    # ---- per-buffer access lists -----------------------------------------
    @cached_property
    def buffer_accesses(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, ops): ops accessing buffer b, ascending, are
        ops[indptr[b]:indptr[b+1]]."""
        return self._by_buffer(self.access_csr)

    @cached_property
    def buffer_writes(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, ops): ops writing buffer b, ascending, are
        ops[indptr[b]:indptr[b+1]]."""
        return self._by_buffer(self.writes_csr)

    def _by_buffer(self, csr: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """A per-op CSR (op -> buffers) turned per buffer (buffer -> ops, ascending)."""
        indptr, bufs = csr
        op_of = np.repeat(np.arange(self.n_ops, dtype=np.int64), np.diff(indptr))
        order = np.lexsort((op_of, bufs))
        counts = np.bincount(bufs, minlength=self.n_buffers)
        bptr = np.zeros(self.n_buffers + 1, np.int64)
        bptr[1:] = np.cumsum(counts)
        return bptr, op_of[order]

    def accesses_of(self, b: int) -> np.ndarray:
        p, ops = self.buffer_accesses
        return ops[p[b] : p[b + 1]]

    def writers_of(self, b: int) -> np.ndarray:
        p, ops = self.buffer_writes
        return ops[p[b] : p[b + 1]]

    @cached_property
    def first_access(self) -> np.ndarray:
        """int64[n_buffers]: first op reading or writing the buffer, -1 if none."""
        p, ops = self.buffer_accesses
        out = np.full(self.n_buffers, -1, np.int64)
        has = np.diff(p) > 0
        out[has] = ops[p[:-1][has]]
        return out

    @cached_property
    def last_access(self) -> np.ndarray:
        """int64[n_buffers]: last op reading or writing the buffer, -1 if none."""
        p, ops = self.buffer_accesses
        out = np.full(self.n_buffers, -1, np.int64)
        has = np.diff(p) > 0
        out[has] = ops[p[1:][has] - 1]
        return out

    @cached_property
    def created_at(self) -> np.ndarray:
        """int64[n_buffers]: the op that allocates the buffer (its first
        writer), or -1 for buffers resident from iteration start."""
        out = np.where(self.exists_at_start, -1, self.first_access)
        return out.astype(np.int64)

    @cached_property
    def freed_after(self) -> np.ndarray:
        """int64[n_buffers]: op after which the framework frees the buffer;
        `n_ops` (never, within the iteration) for persistent buffers."""
        return np.fromiter(
            (self.n_ops if b.freed_after is None else b.freed_after for b in self.buffers),
            np.int64,
            self.n_buffers,
        )

    def lifetimes(self, policy: MemoryPolicy = "framework") -> tuple[np.ndarray, np.ndarray]:
        """(start, end) op indices per buffer: resident while ops start..end
        run, inclusive. `framework` ends at `freed_after`; `liveness` right
        after the last access (TENSILE's activity analysis). Persistent
        buffers end at `n_ops - 1` under both. A buffer no op touches and
        that does not exist at start has end < start (never resident)."""
        start = np.where(self.exists_at_start, 0, self.created_at)
        if policy == "framework":
            end = self.freed_after.copy()
        elif policy == "liveness":
            end = self.last_access.copy()
        else:
            raise ValueError(f"policy={policy!r} must be 'framework' or 'liveness'")
        end = np.where(self.persistent, self.n_ops - 1, np.minimum(end, self.n_ops - 1))
        never = (start < 0) & ~self.exists_at_start
        end = np.where(never, -1, end)
        start = np.where(never, 0, start)
        return start.astype(np.int64), end.astype(np.int64)

    def memory_curve(
        self, policy: MemoryPolicy = "framework", kind: BufferKind | None = None
    ) -> np.ndarray:
        """int64[n_ops]: bytes resident while op i runs -- its outputs already
        allocated, the frees that follow it not yet done. Optionally only the
        buffers of one kind."""
        start, end = self.lifetimes(policy)
        live = end >= start
        if kind is not None:
            live &= self.kind_index == BUFFER_KINDS.index(kind)
        diff = np.zeros(self.n_ops + 1, np.int64)
        np.add.at(diff, start[live], self.nbytes[live])
        np.add.at(diff, end[live] + 1, -self.nbytes[live])
        return np.cumsum(diff[:-1])

    def peak(self, policy: MemoryPolicy = "framework") -> tuple[int, int]:
        """(peak bytes, op index where it first happens) under `policy`."""
        curve = self.memory_curve(policy)
        if len(curve) == 0:
            return int(self.nbytes[self.exists_at_start].sum()), -1
        i = int(np.argmax(curve))
        return int(curve[i]), i

    # ---- summaries -------------------------------------------------------
    def bytes_by_kind(self) -> dict[BufferKind, int]:
        sums = np.bincount(self.kind_index, weights=self.nbytes, minlength=len(BUFFER_KINDS))
        return {k: int(s) for k, s in zip(BUFFER_KINDS, sums, strict=True)}

    def ops_by_phase(self) -> dict[Phase, int]:
        counts = dict.fromkeys(Phase, 0)
        for op in self.ops:
            counts[op.phase] += 1
        return counts
