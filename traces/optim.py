"""The optimizer a capture trains with: any `torch.optim` class by name, with
its keyword arguments checked before any work (NOTE [ Optimizer defaults ]).

`parse_kwargs("lr=1e-3,betas=(0.9,0.99)")` reads the command line's form;
`resolve_kwargs` checks names and values and adds memplan's defaults;
`build` makes the optimizer for a model's parameters.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Iterable, Mapping
from types import UnionType
from typing import Any, Union, get_args, get_origin

import torch
from memplan.traces.errors import TraceError
from memplan.traces.target import TargetDevice

# lower-case name -> class, every `torch.optim.Optimizer` subclass torch exports
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    name.lower(): cls
    for name, cls in sorted(vars(torch.optim).items())
    if isinstance(cls, type)
    and issubclass(cls, torch.optim.Optimizer)
    and cls is not torch.optim.Optimizer
}
# Classes torch has that one recorded `step()` cannot capture, and why.
REFUSED: dict[str, str] = {
    "lbfgs": "its step() takes a closure that re-runs forward and backward several times",
    "sparseadam": "it needs sparse gradients, and sparse tensors are not recorded",
}
_CAPTURABLE = tuple(n for n in OPTIMIZERS if n not in REFUSED)

# A value of an optimizer keyword: scalars, or a tuple of them (`betas`).
Scalar = bool | int | float | str | None
_INT = re.compile(r"[+-]?\d+")


# NOTE [ Optimizer defaults ]
# memplan builds `torch.optim.<Name>(params, **kwargs)` with these defaults under the
# user's keywords (theirs always win):
# - `lr`: `CaptureOptions.lr` (1e-3); memory does not depend on it.
# - `foreach`, unless `foreach` or `fused=True` is given: torch's default for the traced
#   device (`_default_to_fused_or_foreach`): True on CUDA (a cuda capture or meta for a cuda
#   target), False on cpu and on meta without a target; not True where torch would not pick
#   it (`fused=False`, `differentiable=True`, Adafactor).
# - `fused=True` runs on cpu and cuda; on meta only for a target, where memplan creates
#   Adam's state itself (NOTE [ Fused Adam on meta ]).
# - SGD: `momentum=0.9` (what `--optimizer sgd` always meant); `momentum=0` is plain SGD.
# LBFGS and SparseAdam are refused (REFUSED says why). An optimizer reading a tensor's value
# on meta (ASGD, Adafactor) fails with a one-line error that says to capture on cpu.
# Full text: docs/notes.md, "Optimizer defaults".
def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The `torch.optim` class named `name` (any case); a `TraceError` listing
    the names that capture takes otherwise."""
    if not isinstance(name, str):
        raise TraceError(f"optimizer={name!r} must be the name of a torch.optim optimizer")
    key = name.lower()
    if key in REFUSED:
        raise TraceError(f"optimizer={name!r} cannot be captured: {REFUSED[key]}")
    cls = OPTIMIZERS.get(key)
    if cls is None:
        raise TraceError(
            f"optimizer={name!r} is not a torch.optim optimizer (one of {', '.join(_CAPTURABLE)})"
        )
    return cls


def keywords(cls: type[torch.optim.Optimizer]) -> tuple[str, ...]:
    """The keyword arguments `cls` takes besides the parameters."""
    params = inspect.signature(cls.__init__).parameters
    return tuple(p for p in params if p not in ("self", "params"))


def resolve_kwargs(
    name: str, given: Mapping[str, Any], lr: float, device: TargetDevice | None, *, meta: bool
) -> dict[str, Scalar | tuple[Scalar, ...]]:
    """The keyword arguments optimizer `name` is built with: `given`, checked,
    over memplan's defaults (NOTE [ Optimizer defaults ]). `device` is the
    device type the trace describes (None: meta's own dispatch, a meta
    capture without a target) and `meta` whether the step runs on meta
    tensors. Unknown names, values that are not numbers, booleans, strings
    or tuples of them, values the optimizer itself rejects, and a fused
    kernel meta cannot run are one-line `TraceError`s."""
    cls = optimizer_class(name)
    known = keywords(cls)
    label = cls.__name__.lower()
    params = inspect.signature(cls.__init__).parameters
    for key, value in given.items():
        if key not in known:
            raise TraceError(
                f"optimizer {label} has no keyword {key!r} (it takes {', '.join(known)})"
            )
        _check_value(label, key, value)
        ann = params[key].annotation
        if not _fits(tuple(value) if isinstance(value, list) else value, ann):
            raise TraceError(f"optimizer {label}: {key}={value!r} must be {_type_text(ann)}")
    kwargs: dict[str, Any] = {"lr": lr} if "lr" in known else {}
    if "foreach" in known and "foreach" not in given and not given.get("fused"):
        kwargs["foreach"] = (
            device is TargetDevice.CUDA
            and given.get("fused") is None
            and not given.get("differentiable")
            and cls not in _NO_FOREACH_DEFAULT
        )
    if cls is torch.optim.SGD:
        kwargs["momentum"] = 0.9
    kwargs.update({k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
    if kwargs.get("fused") and meta:
        _check_fused_on_meta(cls, label, device)
    _try_build(cls, kwargs, label)
    return kwargs


# Optimizers with a `foreach` keyword whose step does not ask
# `_default_to_fused_or_foreach` when it is None (torch/optim/_adafactor.py
# `adafactor`: `if foreach:` picks the multi-tensor path, None does not).
_NO_FOREACH_DEFAULT: frozenset[type[torch.optim.Optimizer]] = frozenset({torch.optim.Adafactor})

# optimizer -> the aten kernel its fused step runs (torch/optim/<name>.py `_fused_<name>`)
FUSED_KERNELS: dict[str, str] = {
    "adam": "_fused_adam_",
    "adamw": "_fused_adamw_",
    "sgd": "_fused_sgd_",
    "adagrad": "_fused_adagrad_",
}


def _check_fused_on_meta(
    cls: type[torch.optim.Optimizer], label: str, device: TargetDevice | None
) -> None:
    """Refuse `fused=True` on meta unless a target is named, the optimizer is
    Adam's (whose state memplan creates, NOTE [ Fused Adam on meta ]) and
    torch has a meta kernel for its fused op."""
    if device is None:
        raise TraceError(
            f"optimizer {label} with fused=True: the fused kernel runs on cpu and cuda, not on "
            "meta; name the GPU with --target, capture with --device cpu, or use foreach=True"
        )
    kernel = FUSED_KERNELS.get(label, f"_fused_{label}_")
    has_meta = torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{kernel}", "Meta")
    if not (issubclass(cls, torch.optim.Adam) and has_meta):
        why = (
            f"torch has no meta kernel for aten.{kernel}"
            if not has_meta
            else "memplan creates fused state on meta for adam and adamw only"
        )
        raise TraceError(
            f"optimizer {label} with fused=True on meta: {why}; capture with --device cpu "
            "or cuda, or use foreach=True"
        )


def _check_value(label: str, key: str, value: Any) -> None:
    items = value if isinstance(value, tuple | list) else (value,)
    for x in items:
        if not isinstance(x, Scalar):
            raise TraceError(
                f"optimizer {label}: {key}={x!r} is not a number, boolean, string or None"
            )
        if isinstance(x, float) and not math.isfinite(x):
            raise TraceError(f"optimizer {label}: {key}={x!r} is not a finite number")


def _fits(value: Any, ann: Any) -> bool:
    """Whether `value` has the type of the annotation `ann` of a `torch.optim`
    keyword (bool, int, float, str, None, tensors, tuples of them, unions);
    True for annotations outside these (the optimizer checks them itself)."""
    origin = get_origin(ann)
    if origin in (Union, UnionType):
        return any(_fits(value, a) for a in get_args(ann))
    if origin is tuple:
        args = get_args(ann)
        if len(args) == 2 and args[1] is Ellipsis:
            return isinstance(value, tuple) and all(_fits(v, args[0]) for v in value)
        return (
            isinstance(value, tuple)
            and len(value) == len(args)
            and all(_fits(v, a) for v, a in zip(value, args, strict=True))
        )
    if ann is bool:
        return isinstance(value, bool)
    if ann is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if ann is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if ann in (str, type(None), torch.Tensor):
        return isinstance(value, ann)
    return True


def _type_text(ann: Any) -> str:
    text = ann.__name__ if isinstance(ann, type) else str(ann)
    return text.replace("torch.Tensor", "Tensor").replace("NoneType", "None")


def _try_build(cls: type[torch.optim.Optimizer], kwargs: dict[str, Any], label: str) -> None:
    """What the constructor itself checks (ranges, types, exclusive flags),
    on one throw-away 2-D parameter on the cpu, before any capture work."""
    probe = torch.zeros(2, 2, device="cpu", requires_grad=True)
    try:
        cls([probe], **kwargs)
    except (ValueError, TypeError, RuntimeError) as e:
        raise TraceError(f"optimizer {label}({_shown(kwargs)}): {_first_line(e)}") from None


def build(
    name: str, kwargs: Mapping[str, Any], params: Iterable[torch.nn.Parameter], workload: str
) -> torch.optim.Optimizer:
    """`torch.optim.<name>(params, **kwargs)`; what the constructor raises for
    these parameters (Muon takes 2-D ones only) is a one-line `TraceError`.
    Fused Adam on meta parameters creates its state itself
    (NOTE [ Fused Adam on meta ])."""
    cls = optimizer_class(name)
    params = list(params)
    try:
        opt = cls(params, **kwargs)
    except (ValueError, TypeError, RuntimeError) as e:
        raise TraceError(
            f"workload {workload}: optimizer {cls.__name__.lower()}({_shown(kwargs)}) "
            f"refuses its parameters: {_first_line(e)}"
        ) from None
    on_meta = any(p.device.type == "meta" for p in params)
    if isinstance(opt, torch.optim.Adam) and kwargs.get("fused") and on_meta:
        opt.register_step_pre_hook(_fused_adam_state)
    return opt


# NOTE [ Fused Adam on meta ]
# Adam and AdamW with fused=True create each parameter's state lazily, in the
# first step (torch/optim/adam.py `Adam._init_group`), after
# `_device_dtype_check_for_fused(p)` (torch/optim/optimizer.py), which refuses
# a device outside `_get_fused_kernels_supported_devices()`: meta is not in
# it. Everything after that runs on meta: `_fused_adam` groups the tensors,
# adds 1 to the steps (`_foreach_add_`) and calls `aten._fused_adam_` /
# `_fused_adamw_`, which have meta kernels (torch/_meta_registrations.py).
# So a step pre-hook of this one optimizer (`register_step_pre_hook`, run
# inside `step()`, where the recorder sees it) creates the state first, as
# `_init_group` does for fused: `step` a 0-d float32 on the parameter's device
# (`_get_scalar_dtype(is_fused=True)`), `exp_avg` and `exp_avg_sq` (and
# `max_exp_avg_sq` with amsgrad) `zeros_like` the parameter. torch's check of
# the dtype is kept: floating-point parameters only. Nothing of torch changes.
def _fused_adam_state(opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is None or opt.state[p]:
                continue
            if not torch.is_floating_point(p):
                raise RuntimeError(
                    f"`fused=True` requires floating point parameters, got {p.dtype}"
                )
            opt.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
            if group["amsgrad"]:
                opt.state[p]["max_exp_avg_sq"] = torch.zeros_like(
                    p, memory_format=torch.preserve_format
                )


def describe(name: str, kwargs: Mapping[str, Any]) -> str:
    """`adamw(lr=0.001, weight_decay=0.01)`: how inspect and capture print
    it; the bare name without keywords (traces from before they were kept)."""
    return f"{name}({_shown(kwargs)})" if kwargs else name


def _shown(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_value_text(v)}" for k, v in kwargs.items())


def _value_text(v: Any) -> str:
    if isinstance(v, tuple | list):
        return "(" + ",".join(_value_text(x) for x in v) + ")"
    return repr(v) if isinstance(v, str) else str(v)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


# ---- the command line's form -----------------------------------------------
def parse_kwargs(text: str) -> dict[str, Scalar | tuple[Scalar, ...]]:
    """``lr=1e-3,weight_decay=0.01,betas=(0.9,0.99),nesterov=true`` as a dict.
    Values are read as bool (true/false), None (none), int, float, or a
    tuple in parentheses or brackets; anything else stays a string."""
    out: dict[str, Any] = {}
    for item in split_top(text):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise TraceError(f"optimizer keywords {text!r}: {item!r} is not name=value")
        if key in out:
            raise TraceError(f"optimizer keywords {text!r}: {key!r} is given twice")
        raw = raw.strip()
        if raw[:1] in "([" and raw[-1:] in ")]" and raw:
            parts = [x.strip() for x in raw[1:-1].split(",")]
            if parts[-1] == "":  # `(0.9,)` and `()`
                parts.pop()
            out[key] = tuple(_scalar(x) for x in parts)
        else:
            out[key] = _scalar(raw)
    return out


def split_top(text: str, what: str = "optimizer keywords") -> list[str]:
    """`text` split at the commas outside parentheses, brackets and braces;
    unbalanced ones are a `TraceError` naming `what` (the option read)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                raise TraceError(f"{what} {text!r}: unbalanced {ch!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise TraceError(f"{what} {text!r}: unbalanced brackets")
    items.append(text[start:])
    return [s for s in items if s.strip()]


def _scalar(raw: str) -> Scalar:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    if _INT.fullmatch(raw):
        if len(raw) > 30:
            raise TraceError(f"optimizer keyword value {raw[:40]!r}...: more than 30 digits")
        return int(raw)
    try:
        return float(raw)
    except ValueError:
        return raw
