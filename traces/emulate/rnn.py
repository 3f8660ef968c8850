"""`nn.LSTM` / `GRU` / `RNN` as a CUDA target runs them: cuDNN's fused kernel.

`nn.RNNBase` subclasses call `_VF.lstm`, `_VF.gru`, `_VF.rnn_tanh` or
`_VF.rnn_relu` (the objects `torch.lstm`, ... of `torch._C._VariableFunctions`,
which `Emulation` receives as `func`). On a CUDA target the handler here makes
the one `aten._cudnn_rnn` call aten's cuDNN stub makes (NOTE [ Recurrent layers
on a CUDA target ]); below autograd, `meta_kernels` sizes its reserve buffer
(NOTE [ cuDNN reserve space ]) and supplies `_cudnn_rnn_backward`, which meta
lacks. `flatten_weights` lays a model's recurrent weights out in one buffer
before capture, as building the module on a GPU does (NOTE [ cuDNN weight
buffer ]). A cpu target is refused before it gets here (NOTE [ Recurrent
layers on meta ] in traces/capture.py).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from memplan.traces.emulate.mode import handles
from memplan.traces.errors import TraceError
from memplan.traces.target import Target, TargetDevice

if TYPE_CHECKING:
    from memplan.traces.emulate.mode import Emulation

FORWARD = "aten._cudnn_rnn.default"
BACKWARD = "aten._cudnn_rnn_backward.default"


class RnnMode(enum.IntEnum):
    """cuDNN's `cudnnRNNMode_t`, the `mode` `_cudnn_rnn` takes
    (torch/backends/cudnn/rnn.py `get_cudnn_mode`)."""

    RNN_RELU = 0
    RNN_TANH = 1
    LSTM = 2
    GRU = 3

    @property
    def gates(self) -> int:
        """Rows of `hidden_size` in each weight matrix and bias."""
        return {RnnMode.LSTM: 4, RnnMode.GRU: 3}.get(self, 1)

    @property
    def reserved_per_layer(self) -> int:
        """Values of `hidden_size` the reserve keeps per layer, direction,
        step and batch row (NOTE [ cuDNN reserve space ])."""
        return {RnnMode.LSTM: 5, RnnMode.GRU: 6}.get(self, 1)


# the torch-level function `nn.RNNBase` calls -> cuDNN's mode
FUNC_MODES: dict[Callable, RnnMode] = {
    torch._VF.lstm: RnnMode.LSTM,
    torch._VF.gru: RnnMode.GRU,
    torch._VF.rnn_tanh: RnnMode.RNN_TANH,
    torch._VF.rnn_relu: RnnMode.RNN_RELU,
}
# `nn.RNNBase.mode` -> cuDNN's mode
MODULE_MODES = {
    "RNN_RELU": RnnMode.RNN_RELU,
    "RNN_TANH": RnnMode.RNN_TANH,
    "LSTM": RnnMode.LSTM,
    "GRU": RnnMode.GRU,
}


@dataclass(frozen=True, slots=True)
class RnnShape:
    """What cuDNN's buffers are sized by. `proj_size` is 0 without a
    projection (LSTM only)."""

    mode: RnnMode
    input_size: int
    hidden_size: int
    proj_size: int
    num_layers: int
    bidirectional: bool

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def out_size(self) -> int:
        """Width of a layer's hidden state and output per direction."""
        return self.proj_size or self.hidden_size

    def slots(self) -> list[tuple[tuple[int, ...], bool]]:
        """cuDNN's weight space in order, per layer and direction: (shape,
        is a bias) of w_ih, w_hh, b_ih, b_hh and, with a projection, w_hr,
        each the gates' blocks of one kind together (NOTE [ cuDNN weight
        buffer ])."""
        rows = self.mode.gates * self.hidden_size
        out: list[tuple[tuple[int, ...], bool]] = []
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else self.out_size * self.directions
            for _ in range(self.directions):
                out += [((rows, width), False), ((rows, self.out_size), False)]
                out += [((rows,), True), ((rows,), True)]
                if self.proj_size:
                    out.append(((self.proj_size, self.hidden_size), False))
        return out

    def weight_numel(self) -> int:
        """Elements of cuDNN's weight space (bias slots included)."""
        return sum(math.prod(shape) for shape, _ in self.slots())

    def offsets(self, has_biases: bool) -> list[int]:
        """Element offsets in the weight space of a module's weights, in
        `_flat_weights` order (the biases' only when it has them)."""
        out, at = [], 0
        for shape, bias in self.slots():
            if has_biases or not bias:
                out.append(at)
            at += math.prod(shape)
        return out

    def forward_flops(self, rows: int) -> int:
        """Multiply-adds x 2 of the forward's matmuls for `rows` = steps x
        batch rows: per layer and direction, the gates' input and recurrent
        matmuls and the projection (the pointwise gate math is left out, as
        torch's FLOP counter leaves out pointwise ops)."""
        per_row = 0
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else self.out_size * self.directions
            per_row += self.mode.gates * self.hidden_size * (width + self.out_size)
            per_row += self.proj_size * self.hidden_size
        return 2 * rows * self.directions * per_row

    def reserve_bytes(self, rows: int, itemsize: int) -> int:
        """Training reserve for `rows` = steps x batch rows (the sum of
        `batch_sizes` when packed), NOTE [ cuDNN reserve space ]."""
        per_direction = (self.num_layers - 1) * self.out_size
        per_direction += self.num_layers * self.mode.reserved_per_layer * self.hidden_size
        return rows * self.directions * per_direction * itemsize


# NOTE [ Recurrent layers on a CUDA target ]
# aten's `lstm`, `gru`, `rnn_tanh`, `rnn_relu` (aten/src/ATen/native/RNN.cpp) take cuDNN
# when `use_cudnn(input)`: a non-empty CUDA tensor of float, double, half, or bfloat16 where
# `supportsBFloat16RNNWithCuDNN` (sm 8.0+, cuDNN 9.13+: assumed of a target's build); else
# the per-step path, which meta runs itself. `_cudnn_impl` (native/cudnn/RNN.cpp) then makes
# ONE `_cudnn_rnn` for the whole stack (all layers and directions), `batch_first` passed
# through, weight_stride0 = 4 (2 without biases, +1 with a projection), the flat weight
# buffer when the weights are its views (NOTE [ cuDNN weight buffer ]) and no dropout state
# (its ~2 MiB, made once per device, is missing). Packed input adds `batch_sizes`. Autograd
# saves input, weights, hx, cx, output, reserve and weight buffer; backward is one
# `_cudnn_rnn_backward`. Full text: docs/notes.md, "Recurrent layers on a CUDA target".
@handles(*FUNC_MODES)
def _fused(em: Emulation, func: Callable, args: tuple, kwargs: dict) -> Any:
    call = _RnnCall.parse(func, args, kwargs)
    if not _recording() or not _use_cudnn(call.input, em.target):
        return func(*args, **kwargs)  # NOTE [ Recording the fused kernel ]
    hx, cx = call.hx, call.cx
    hidden_size, proj_size = hx.shape[2], 0
    if cx is not None and cx.shape[2] != hx.shape[2]:
        hidden_size, proj_size = cx.shape[2], hx.shape[2]
    shape = RnnShape(
        call.mode, call.input.shape[-1], hidden_size, proj_size, call.num_layers, call.bidirectional
    )
    ops = _Operands(
        call.input, hx, cx, list(call.params), _weight_buf(call.params, shape, call.has_biases)
    )
    if em.autocast_dtype is not None:
        ops = _cast_reflatten(ops, shape, call.has_biases)
    stride0 = (4 if call.has_biases else 2) + (1 if proj_size else 0)
    output, hy, cy, _, _ = torch.ops.aten._cudnn_rnn(
        ops.input, ops.params, stride0, ops.weight_buf, ops.hx, ops.cx, int(call.mode),
        hidden_size, proj_size, call.num_layers, call.batch_first, call.dropout, call.train,
        call.bidirectional, call.batch_sizes, None,
    )  # fmt: skip
    return (output, hy, cy) if call.mode is RnnMode.LSTM else (output, hy)


@dataclass(frozen=True, slots=True)
class _Operands:
    """The tensors `_cudnn_rnn` is given; `weight_buf` None when the weights
    are not views of one buffer (NOTE [ cuDNN weight buffer ])."""

    input: torch.Tensor
    hx: torch.Tensor
    cx: torch.Tensor | None
    params: list[torch.Tensor]
    weight_buf: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class _RnnCall:
    """The arguments of `_VF.lstm` / `gru` / `rnn_*`, either overload:
    (input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
    batch_first) or, packed, (data, batch_sizes, hx, params, has_biases,
    num_layers, dropout, train, bidirectional). `batch_sizes` is empty
    unless packed."""

    mode: RnnMode
    input: torch.Tensor
    batch_sizes: list[int]
    hx: torch.Tensor
    cx: torch.Tensor | None
    params: Sequence[torch.Tensor]
    has_biases: bool
    num_layers: int
    dropout: float
    train: bool
    bidirectional: bool
    batch_first: bool

    @classmethod
    def parse(cls, func: Callable, args: tuple, kwargs: dict) -> _RnnCall:
        name = getattr(func, "__name__", repr(func))
        if kwargs or len(args) != 9:
            raise TraceError(
                f"torch.{name}: expected the 9 positional arguments nn.RNNBase passes, "
                f"got {len(args)} and keywords {sorted(kwargs)}"
            )
        mode = FUNC_MODES[func]
        packed = isinstance(args[3], list | tuple)
        if packed:
            data, sizes, hidden, params, biases, layers, p, train, bidir = args
            if sizes.device.type != "cpu":
                raise TraceError(f"torch.{name}: batch_sizes is on {sizes.device}, not the cpu")
            batch_sizes, batch_first = [int(n) for n in sizes.tolist()], False
        else:
            data, hidden, params, biases, layers, p, train, bidir, batch_first = args
            batch_sizes = []
        hx, cx = (hidden[0], hidden[1]) if mode is RnnMode.LSTM else (hidden, None)
        return cls(mode, data, batch_sizes, hx, cx, params, bool(biases), int(layers), float(p),
                   bool(train), bool(bidir), bool(batch_first))  # fmt: skip


def _use_cudnn(x: torch.Tensor, target: Target) -> bool:
    """aten's `use_cudnn(input)` on `target` (NOTE [ Recurrent layers on a
    CUDA target ])."""
    if target.device is not TargetDevice.CUDA or not torch.backends.cudnn.enabled:
        return False
    dtypes = {torch.float32, torch.float64, torch.float16}
    if target.sm >= 80:
        dtypes.add(torch.bfloat16)
    return x.dtype in dtypes and x.numel() > 0


# NOTE [ Recording the fused kernel ]
# Meta runs `_cudnn_rnn` but has no `_cudnn_rnn_backward`. The recorder's
# dispatch mode supplies it (`meta_kernels`, through the recorder's
# DispatchRules), with the `_cudnn_rnn` that sizes the reserve. The warm-up
# steps run under no dispatch mode, where nothing could: there the handler lets
# meta run its own per-step cells. Warm-up exists to create the optimizer's
# state and settle the fp16 loss scale, and both come out the same: the grads
# have the weights' shapes either way. So the fused kernel runs exactly when a
# dispatch mode is active, which in a capture is the recording.
def _recording() -> bool:
    return torch._C._len_torch_dispatch_stack() > 0


# NOTE [ cuDNN weight buffer ]
# On a GPU, nn.RNNBase flattens its weights (`flatten_parameters`,
# `copy_weights_to_flat_buf_views` in native/cudnn/RNN.cpp) into one zeroed buffer of cuDNN's
# weight-space size when all are half, float or double of one dtype and none alias;
# `_cudnn_rnn` then uses it, else it copies the weights into a new buffer every forward, kept
# for backward. The space has both bias slots even without biases; per layer and direction:
# input matrices, hidden matrices, the two biases, the projection, no gap (none assumed
# between layers either). Backward's weight grads are views of one zeroed buffer of that size
# when the module has biases, else one tensor per weight. Under autocast,
# `_cudnn_rnn_cast_reflatten` (AutocastRNN.cpp) copies the weights into a new float16
# buffer every call and casts input, hx, cx to float16, even under bf16 autocast.
# Full text: docs/notes.md, "cuDNN weight buffer".
FLATTENED_DTYPES = frozenset({torch.float16, torch.float32, torch.float64})


def flatten_weights(model: torch.nn.Module) -> None:
    """Lay every recurrent layer's weights out in one buffer of cuDNN's
    weight-space size, as building it on a GPU does (NOTE [ cuDNN weight
    buffer ]). Run before the optimizer and the recorder see the parameters:
    the parameter objects stay, their storage changes."""
    for mod in model.modules():
        if not isinstance(mod, torch.nn.RNNBase):
            continue
        weights = list(mod._flat_weights)
        if len(weights) != len(mod._flat_weights_names) or not all(
            isinstance(w, torch.Tensor) for w in weights
        ):
            continue
        dtype = weights[0].dtype
        storages = {w.untyped_storage()._cdata for w in weights}
        if dtype not in FLATTENED_DTYPES or any(w.dtype != dtype for w in weights):
            continue
        if len(storages) != len(weights):
            continue  # aliasing weights: PyTorch leaves them as they are
        shape = RnnShape(
            MODULE_MODES[mod.mode], mod.input_size, mod.hidden_size, mod.proj_size,
            mod.num_layers, mod.bidirectional,
        )  # fmt: skip
        flat = torch.zeros(shape.weight_numel(), dtype=dtype, device=weights[0].device)
        with torch.no_grad():
            for w, at in zip(weights, shape.offsets(mod.bias), strict=True):
                w.set_(flat.untyped_storage(), at, w.shape, _contiguous_strides(w.shape))


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _weight_buf(
    params: Sequence[torch.Tensor], shape: RnnShape, has_biases: bool
) -> torch.Tensor | None:
    """`try_get_weight_buf`: the flat buffer the weights are views of, as a
    1-D view, or None when they are not laid out so."""
    first = params[0]
    storage = first.untyped_storage()
    if any(p.untyped_storage()._cdata != storage._cdata or p.dtype != first.dtype for p in params):
        return None
    if [p.storage_offset() for p in params] != shape.offsets(has_biases):
        return None
    numel = shape.weight_numel()
    if storage.nbytes() < numel * first.element_size() or not params[-1].is_contiguous():
        return None
    # a view: no kernel, nothing recorded; detached, as `try_get_weight_buf`'s is
    return first.detach().as_strided((numel,), (1,), 0)


def _cast_reflatten(ops: _Operands, shape: RnnShape, has_biases: bool) -> _Operands:
    """Autocast's `_cudnn_rnn_cast_reflatten` (NOTE [ cuDNN weight buffer ]):
    float weights copied into a new float16 buffer, autograd-exposed, and
    input, hx, cx cast to float16."""

    def eligible(t: torch.Tensor) -> bool:  # autocast casts floating tensors, never double
        return t.is_floating_point() and t.dtype not in (torch.float64, torch.float16)

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float16) if eligible(t) else t

    params, weight_buf = ops.params, ops.weight_buf
    if eligible(weight_buf if weight_buf is not None else params[0]):
        # as `get_parameters` does: tensors set on the buffer's storage, not
        # autograd views of it, so the buffer itself never requires grad
        flat = torch.zeros(shape.weight_numel(), dtype=torch.float16, device=params[0].device)
        copies = []
        for p, at in zip(params, shape.offsets(has_biases), strict=True):
            w = torch.empty(0, dtype=torch.float16, device=p.device)
            w.set_(flat.untyped_storage(), at, p.shape, _contiguous_strides(p.shape))
            w.copy_(p)
            copies.append(w)
        params, weight_buf = copies, flat
    cx = None if ops.cx is None else cast(ops.cx)
    return _Operands(cast(ops.input), cast(ops.hx), cx, params, weight_buf)


def meta_kernels(target: Target) -> Mapping[str, Callable[..., Any]]:
    """Kernels the recorder runs in place of aten's on meta for `target`
    (NOTE [ Recording the fused kernel ]): none for a cpu target."""
    if target.device is not TargetDevice.CUDA:
        return {}
    return {FORWARD: _cudnn_rnn, BACKWARD: _cudnn_rnn_backward}


def flop_counts(target: Target) -> Mapping[str, Callable[..., int]]:
    """FLOPs of the fused kernels, which torch's FLOP counter does not know:
    the forward's matmuls (`RnnShape.forward_flops`); backward twice that
    (the input grads and the weight grads each repeat the forward's matmuls)."""
    if target.device is not TargetDevice.CUDA:
        return {}

    def forward(*args: Any, **kwargs: Any) -> int:
        a = _bind(torch.ops.aten._cudnn_rnn.default._schema, args, kwargs)
        return _shape(a).forward_flops(_rows(a))

    def backward(*args: Any, **kwargs: Any) -> int:
        a = _bind(torch.ops.aten._cudnn_rnn_backward.default._schema, args, kwargs)
        return 2 * _shape(a).forward_flops(_rows(a))

    return {FORWARD: forward, BACKWARD: backward}


def _bind(schema: torch.FunctionSchema, args: tuple, kwargs: dict) -> dict[str, Any]:
    out = {}
    for i, a in enumerate(schema.arguments):
        out[a.name] = args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
    return out


def _shape(a: Mapping[str, Any]) -> RnnShape:
    return RnnShape(
        RnnMode(a["mode"]), a["input"].shape[-1], int(a["hidden_size"]), int(a["proj_size"]),
        int(a["num_layers"]), bool(a["bidirectional"]),
    )  # fmt: skip


def _rows(a: Mapping[str, Any]) -> int:
    """Steps x batch rows of the input (its first dimension when packed)."""
    x = a["input"]
    return x.shape[0] if a["batch_sizes"] else x.shape[0] * x.shape[1]


# NOTE [ cuDNN reserve space ]
# The reserve is what cuDNN's training forward keeps for backward: `_cudnn_rnn` allocates it
# (`cudnnGetRNNTempSpaceSizes`), returns it as output 3, autograd saves it, and it dies with
# the graph. Meta gives 0 bytes and NVIDIA documents no formula. Our rule, per step, batch
# row and direction, when training: every layer's gate values (LSTM 5, GRU 6, RNN 1, of
# hidden_size each) plus every layer's hidden state but the last's, in the input's element
# size. It matches cuDNN 7's sizes for a 4-layer LSTM and GRU of 320 units on a P100
# (pytorch/pytorch#2895). Unmeasured, so possibly off: cuDNN 8/9's layout and padding,
# persistent algorithms, float32 gates for float16 input, dropout masks, projections.
# Full text: docs/notes.md, "cuDNN reserve space".
def _cudnn_rnn(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """`aten._cudnn_rnn` on meta, with its reserve (NOTE [ cuDNN reserve
    space ]) and, for weights not laid out in one buffer, the new weight
    buffer it makes. Its workspace, freed before it returns, has no formula
    and is not recorded."""
    out = list(torch.ops.aten._cudnn_rnn.default(*args, **kwargs))
    a = _bind(torch.ops.aten._cudnn_rnn.default._schema, args, kwargs)
    x, shape = a["input"], _shape(a)
    if a["train"]:
        nbytes = shape.reserve_bytes(_rows(a), x.element_size())
        out[3] = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    if a["weight_buf"] is None:
        out[4] = torch.empty(shape.weight_numel(), dtype=a["weight"][0].dtype, device=x.device)
    return tuple(out)


def _cudnn_rnn_backward(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """`aten._cudnn_rnn_backward` on meta, as native/cudnn/RNN.cpp's: grads of
    input, hx and (LSTM) cx always, whatever `output_mask` says; the weights'
    when asked, as views of one zeroed weight-space buffer if the module has
    biases, else one tensor per weight (NOTE [ cuDNN weight buffer ])."""
    a = _bind(torch.ops.aten._cudnn_rnn_backward.default._schema, args, kwargs)
    weights = a["weight"]
    if a["grad_output"] is None and a["grad_hy"] is None and a["grad_cy"] is None:
        return None, None, None, [None] * len(weights)
    x, hx, cx = a["input"], a["hx"], a["cx"]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dhx = torch.empty(hx.shape, dtype=hx.dtype, device=hx.device)
    dcx = None if cx is None else torch.empty(cx.shape, dtype=cx.dtype, device=cx.device)
    if not a["output_mask"][3]:
        return dx, dhx, dcx, []
    shape = _shape(a)
    buf = a["weight_buf"]
    cudnn_stride0 = 4 + (1 if shape.proj_size else 0)  # `get_parameters` with its biases
    if a["weight_stride0"] != cudnn_stride0:
        return dx, dhx, dcx, [torch.empty(w.shape, dtype=w.dtype, device=w.device) for w in weights]
    dw = torch.zeros(shape.weight_numel(), dtype=buf.dtype, device=buf.device)
    grads = [
        dw[at : at + w.numel()].view(w.shape)
        for w, at in zip(weights, shape.offsets(True), strict=True)
    ]
    return dx, dhx, dcx, grads
