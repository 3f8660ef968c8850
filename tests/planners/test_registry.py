"""The planner registry: names, options from key=value strings, one call
signature for every planner."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.planners import registry
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.options import NoOptions, options_dict
from memplan.planners.core.plan import PlanResult, Status
from memplan.planners.heuristics.tensile.planner import TensileOptions
from memplan.planners.registry import PlannerSpec, make_options

from tests.planners.test_analysis import MiB, gap_chain, gpu

HW = gpu()


class Mode(enum.Enum):
    FAST = "fast"
    GOOD = "good"


@dataclass(frozen=True, slots=True)
class ToyOptions:
    mode: Mode = Mode.FAST
    limit: int | None = None
    weights: tuple[float, ...] = (1.0,)
    name: str = "toy"

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit={self.limit} must be >= 0")


def toy(traces, device, *, budget_bytes=None, options=None):
    assert isinstance(options, ToyOptions)  # parsed once, by the registry
    return PlanResult(
        "toy", Status.PLANNED, (), options={"budget_bytes": budget_bytes, **options_dict(options)}
    )


TOY = PlannerSpec("toy", toy, ToyOptions, "a test planner")


def test_builtin_names():
    names = registry.names()
    assert names[:3] == ["vanilla", "release_only", "tensile"]
    for name in names:
        spec = registry.get(name)
        assert spec.name == name and dataclasses.is_dataclass(spec.options)
    assert registry.get("tensile").options is TensileOptions
    assert registry.get("vanilla").options is NoOptions


def test_unknown_planner_names_the_known_ones():
    with pytest.raises(PlanError, match=r"unknown planner 'nope'; known: vanilla, release_only"):
        registry.get("nope")


def test_options_from_key_value_strings():
    opts = make_options("tensile", ["per_job_lane=true", "max_swap_rate=0.5", "stop_after = 5"])
    assert opts == TensileOptions(per_job_lane=True, max_swap_rate=0.5, stop_after=5)
    assert make_options("tensile", None) == TensileOptions()
    assert make_options("tensile", {"swap_rest": "no", "margin_us": 2}) == TensileOptions(
        swap_rest=False, margin_us=2.0
    )
    same = TensileOptions(recompute=False)
    assert make_options("tensile", same) is same


def test_typed_options():
    opts = make_options(TOY, ["mode=good", "limit=none", "weights=0.5, 2", "name=x"])
    assert opts == ToyOptions(Mode.GOOD, None, (0.5, 2.0), "x")
    assert make_options(TOY, ["limit=7"]).limit == 7
    assert options_dict(opts) == {"mode": "good", "limit": None, "weights": [0.5, 2.0], "name": "x"}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["bogus=1"], r"tensile: unknown option 'bogus' \(options: per_job_lane, "),
        (["max_swap_rate=abc"], r"tensile: option max_swap_rate='abc': expected a number"),
        (["per_job_lane=maybe"], r"option per_job_lane='maybe': expected true or false"),
        (["stop_after=1.5"], r"option stop_after='1.5': expected an integer"),
        (["swap_rest"], r"tensile: option 'swap_rest' must look like key=value"),
        (["max_swap_rate=2"], r"tensile: max_swap_rate=2.0 must be in \(0, 1\]"),
        (3, r"tensile: options must be TensileOptions, a mapping or key=value strings"),
    ],
)
def test_bad_options_are_one_line_plan_errors(items, message):
    with pytest.raises(PlanError, match=message):
        make_options("tensile", items)


def test_bad_typed_options():
    with pytest.raises(PlanError, match=r"toy: option mode='slow': expected one of fast, good"):
        make_options(TOY, ["mode=slow"])
    with pytest.raises(PlanError, match=r"toy: limit=-1 must be >= 0"):
        make_options(TOY, ["limit=-1"])
    with pytest.raises(PlanError, match=r"toy: option weights='1,x': item 'x': expected a number"):
        make_options(TOY, ["weights=1,x"])


def test_run_builds_options_and_passes_the_budget():
    t, lat = gap_chain()
    res = registry.run(
        "tensile", [t], DeviceModel(HW, lat), budget_bytes=6 * MiB, options=["swap_rest=off"]
    )
    assert res.planner == "tensile" and res.feasible
    assert res.options["budget_bytes"] == 6 * MiB and res.options["swap_rest"] is False
    check(res.plans[0], t)
    for name in ("vanilla", "release_only"):
        res = registry.run(name, [t], DeviceModel(HW, lat), budget_bytes=8 * MiB)
        assert res.planner == name and res.feasible
        check(res.plans[0], t)
    with pytest.raises(PlanError, match="vanilla: unknown option 'x' \\(options: none\\)"):
        registry.run("vanilla", [t], DeviceModel(HW, lat), options=["x=1"])


def test_a_spec_is_callable_with_the_shared_signature():
    t, lat = gap_chain()
    spec = registry.get("tensile")
    device = DeviceModel(HW, lat)
    res = spec([t], device, budget_bytes=5 * MiB, options={"max_swap_rate": "1"})
    assert res.feasible and res.stats["peak_bytes"] == 5 * MiB
    assert spec([t], device, budget_bytes=5 * MiB).options["budget_bytes"] == 5 * MiB
    # the planner itself takes its typed options only
    assert spec.fn([t], device, budget_bytes=5 * MiB, options=TensileOptions()).feasible
    with pytest.raises(TypeError):
        spec.fn([t], device, budget_bytes=5 * MiB, max_swap_rate=1.0)


def test_register_a_planner():
    registry.register(TOY)
    try:
        assert "toy" in registry.names() and registry.get("toy") is TOY
        t, lat = gap_chain()
        res = registry.run(
            "toy", [t], DeviceModel(HW, lat), budget_bytes=3, options={"mode": "good"}
        )
        assert res.options == {
            "budget_bytes": 3,
            "mode": "good",
            "limit": None,
            "weights": [1.0],
            "name": "toy",
        }
    finally:
        registry._EXTRA.clear()
    with pytest.raises(PlanError, match="is not a dataclass"):
        registry.register(PlannerSpec("bad", toy, dict))


def test_traits_are_read_without_importing_the_planner():
    import subprocess
    import sys

    code = (
        "import sys; from memplan.planners import registry as r;"
        "t = r.traits('capuchin'), r.traits('cpsat'), r.traits('squeeze'), r.traits('tensile');"
        "print([x.budget_from for x in t], [x.search.value for x in t],"
        " 'memplan.planners.heuristics.capuchin.planner' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("] ") == [
        "['tensile', None, None, None",
        "['none', 'whole_limit', 'bounded', 'none'",
        "False\n",
    ]
    assert registry.get("capuchin").traits == registry.traits("capuchin")
    with pytest.raises(PlanError, match="unknown planner 'nope'"):
        registry.traits("nope")
