"""Every planner by name, with its options dataclass.

All planners share one signature (the seam the app shell and sweeps use)::

    planner(traces, device, *, budget_bytes=None, options=None) -> PlanResult

`traces` is a sequence of `Trace` (one per job; `analysis.as_traces` also
takes `sim.Job`s), `device` the `hwmodels.device.DeviceModel` they run on,
`budget_bytes` the device bytes all jobs together may use (None: no budget,
the planner does what it does best), and `options` an instance of the
planner's options dataclass (None: its defaults). Not fitting is a result
(`PlanResult.status`), never an exception.

`get(name)` returns a `PlannerSpec`; `run(name, ...)` and calling a spec
parse the options once, here (from a dataclass, a mapping, or ``key=value``
strings as the CLI passes them), and call the planner. Planner modules are imported when first asked
for, so a broken or missing one does not break the others.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.util
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.errors import PlanError
from memplan.planners.core.evaluate import Evaluator
from memplan.planners.core.options import NoOptions, options_dict
from memplan.planners.core.plan import PlanResult

__all__ = [
    "NoOptions",
    "PlannerSpec",
    "Search",
    "Traits",
    "get",
    "make_options",
    "names",
    "option_fields",
    "options_dict",
    "register",
    "run",
    "traits",
]


class Search(enum.Enum):
    """How long a planner runs: it plans and stops (NONE), searches until its
    own limits, a few seconds by default (BOUNDED), or uses its whole time
    limit (WHOLE_LIMIT)."""

    NONE = "none"
    BOUNDED = "bounded"
    WHOLE_LIMIT = "whole_limit"


@dataclass(frozen=True, slots=True)
class Traits:
    """What the app shell knows of a planner beside its signature.
    `budget_from`: it plans only to a budget; given none, the shell gives it
    the peak that planner reaches (Capuchin's paper sets its budget so).
    `search`: how long it runs (`all` in `compare` leaves out WHOLE_LIMIT
    searches, in `capacity` every search)."""

    budget_from: str | None = None
    search: Search = Search.NONE


@dataclass(frozen=True, slots=True)
class PlannerSpec:
    """A planner: its name, function, options dataclass, a one-line summary
    and its traits."""

    name: str
    fn: Callable[..., PlanResult]
    options: type
    summary: str = ""
    traits: Traits = Traits()

    def make_options(self, given: object = None) -> Any:
        return make_options(self, given)

    def __call__(
        self,
        traces: Sequence[Any],
        device: DeviceModel,
        *,
        budget_bytes: int | None = None,
        options: object = None,
        evaluator: Evaluator | None = None,
    ) -> PlanResult:
        """Run the planner with `options` parsed by `make_options`; a search
        planner (one whose function takes `evaluator`) also gets `evaluator`."""
        extra = {"evaluator": evaluator} if self.searches else {}
        return self.fn(
            traces, device, budget_bytes=budget_bytes, options=make_options(self, options), **extra
        )

    @property
    def searches(self) -> bool:
        """The planner scores plans with an injected `Evaluator`."""
        return "evaluator" in inspect.signature(self.fn).parameters


# name -> (module, function, options class or None, summary[, traits]); imported lazily.
_BUILTIN: dict[str, tuple[str, str, str | None, str] | tuple[str, str, str | None, str, Traits]] = {
    "vanilla": (
        "memplan.planners.heuristics.vanilla",
        "vanilla",
        None,
        "no events: the framework's own frees",
    ),
    "release_only": (
        "memplan.planners.heuristics.vanilla",
        "release_only",
        None,
        "TENSILE's activity analysis: free after the last access",
    ),
    "tensile": (
        "memplan.planners.heuristics.tensile.planner",
        "tensile",
        "TensileOptions",
        "TENSILE: greedy hidden swaps at the global peak, cross-iteration, MSPS recompute",
    ),
    "capuchin": (
        "memplan.planners.heuristics.capuchin.planner",
        "capuchin",
        "CapuchinOptions",
        "Capuchin: swap by free time, MSPS recompute",
        Traits(budget_from="tensile"),
    ),
    "vdnn": (
        "memplan.planners.heuristics.vdnn",
        "vdnn",
        "VdnnOptions",
        "vDNN: layer-wise offload and prefetch",
    ),
    "checkpoint": (
        "memplan.planners.heuristics.checkpoint",
        "checkpoint",
        "CheckpointOptions",
        "Chen et al. sqrt(n) checkpointing",
    ),
    "autoswap": (
        "memplan.planners.heuristics.autoswap.planner",
        "autoswap",
        "AutoSwapOptions",
        "AutoSwap: priority scores (DOA, AOA, WDOA, SWDOA), weights by Bayesian optimisation",
    ),
    "squeeze": (
        "memplan.planners.search.squeeze",
        "squeeze",
        "SqueezeOptions",
        "memplan's planner for memory pressure: heuristics and the net's choices, "
        "improved by simulation",
        Traits(search=Search.BOUNDED),
    ),
    "swapadvisor": (
        "memplan.planners.search.swapadvisor",
        "swapadvisor",
        "SwapAdvisorOptions",
        "SwapAdvisor: genetic search over op orders, size-class allocations and swaps",
        Traits(search=Search.WHOLE_LIMIT),
    ),
    "cpsat": (
        "memplan.planners.cpsat.planner",
        "cpsat",
        "CpsatOptions",
        "CP-SAT: our exact baseline",
        Traits(search=Search.WHOLE_LIMIT),
    ),
}
_EXTRA: dict[str, PlannerSpec] = {}
_LOADED: dict[str, PlannerSpec] = {}


def register(spec: PlannerSpec) -> None:
    """Add (or replace) a planner; its options must be a dataclass."""
    if not dataclasses.is_dataclass(spec.options):
        raise PlanError(f"planner {spec.name!r}: options {spec.options!r} is not a dataclass")
    _EXTRA[spec.name] = spec
    _LOADED.pop(spec.name, None)


def names() -> list[str]:
    """The planners that can be loaded, in registration order."""
    out = []
    for name, (module, *_rest) in _BUILTIN.items():
        if name in _EXTRA or importlib.util.find_spec(module) is not None:
            out.append(name)
    out += [n for n in _EXTRA if n not in _BUILTIN]
    return out


def get(name: str) -> PlannerSpec:
    """The planner called `name`; PlanError naming the known ones otherwise."""
    if name in _EXTRA:
        return _EXTRA[name]
    if name in _LOADED:
        return _LOADED[name]
    if name not in _BUILTIN:
        raise PlanError(f"unknown planner {name!r}; known: {', '.join(names())}")
    module, fn_name, opt_name, summary = _BUILTIN[name][:4]
    if importlib.util.find_spec(module) is None:
        raise PlanError(f"planner {name!r} is not available (module {module} is missing)")
    mod = importlib.import_module(module)
    fn = getattr(mod, fn_name)
    opts = NoOptions if opt_name is None else getattr(mod, opt_name)
    spec = _LOADED[name] = PlannerSpec(name, fn, opts, summary, traits(name))
    return spec


def traits(name: str) -> Traits:
    """A planner's traits, without importing it; PlanError if it is unknown."""
    if name in _EXTRA:
        return _EXTRA[name].traits
    entry = _BUILTIN.get(name)
    if entry is None:
        raise PlanError(f"unknown planner {name!r}; known: {', '.join(names())}")
    return entry[4] if len(entry) > 4 else Traits()  # type: ignore[misc]


# ---- options ---------------------------------------------------------------------
def option_fields(spec: PlannerSpec) -> dict[str, Any]:
    """Field name -> resolved type of a planner's options dataclass."""
    hints = typing.get_type_hints(spec.options)
    return {f.name: hints[f.name] for f in dataclasses.fields(spec.options)}


def make_options(spec: PlannerSpec | str, given: object = None) -> Any:
    """An instance of the planner's options dataclass from `given`: None (the
    defaults), an instance already, a mapping of field -> value (strings are
    parsed by the field's type), or a sequence of ``key=value`` strings.
    PlanError names the planner, the option and what was expected."""
    if isinstance(spec, str):
        spec = get(spec)
    cls = spec.options
    if given is None:
        items: dict[str, Any] = {}
    elif isinstance(given, cls):
        return given
    elif isinstance(given, Mapping):
        items = dict(given)
    elif isinstance(given, Sequence) and not isinstance(given, str | bytes):
        items = {}
        for text in given:
            if not isinstance(text, str) or "=" not in text:
                raise PlanError(f"{spec.name}: option {text!r} must look like key=value")
            key, _, value = text.partition("=")
            items[key.strip()] = value.strip()
    else:
        raise PlanError(
            f"{spec.name}: options must be {cls.__name__}, a mapping or key=value strings, "
            f"got {type(given).__name__}"
        )
    fields = option_fields(spec)
    values = {}
    for key, value in items.items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise PlanError(f"{spec.name}: unknown option {key!r} (options: {known})")
        values[key] = _coerce(spec.name, key, fields[key], value)
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:
        raise PlanError(f"{spec.name}: {e}") from None


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(planner: str, key: str, tp: Any, value: Any) -> Any:
    """`value` (a string from the command line, or a Python value) as type `tp`."""
    where = f"{planner}: option {key}={value!r}"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and (
            value is None or (isinstance(value, str) and value.lower() in ("none", "null", ""))
        ):
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(planner, key, a, value)
            except PlanError as e:
                errors.append(str(e))
        raise PlanError(errors[0] if errors else f"{where}: unsupported type {tp}")
    if origin is tuple:
        args = typing.get_args(tp)
        items = value.split(",") if isinstance(value, str) else list(value)
        inner = args[0] if args else str
        out = []
        for x in items:
            try:
                out.append(_coerce(planner, key, inner, x.strip() if isinstance(x, str) else x))
            except PlanError as e:
                why = str(e).rpartition(": ")[2]
                raise PlanError(
                    f"{where}: item {x.strip() if isinstance(x, str) else x!r}: {why}"
                ) from None
        return tuple(out)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise PlanError(f"{where}: expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise PlanError(f"{where}: expected an integer")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise PlanError(f"{where}: expected a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise PlanError(f"{where}: expected a string")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in tp)
            raise PlanError(f"{where}: expected one of {allowed}") from None
    return value


# ---- running ---------------------------------------------------------------------
def run(
    name: str,
    traces: Sequence[Any],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: object = None,
    evaluator: Evaluator | None = None,
) -> PlanResult:
    """Run planner `name` with `options` (see `make_options`); `evaluator`
    goes to search planners (`PlannerSpec.searches`) and is ignored by the rest."""
    return get(name)(
        traces, device, budget_bytes=budget_bytes, options=options, evaluator=evaluator
    )
