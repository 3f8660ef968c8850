"""The semantic case table against the four implementations of plan
semantics (docs/design.md, "What happens to a buffer"): every case x every
implementation. See `tests/semantics/cases.py` for what a case holds and
how bytes per op are compared, `adapters.py` for how each implementation is
run.
"""

from __future__ import annotations

import re

import pytest
from memplan.traces.model import Trace

from tests.semantics.adapters import RUNNERS, Run, run_sim_checked
from tests.semantics.cases import Case, Check, Impl, MiB
from tests.semantics.cases_errors import ERROR_CASES
from tests.semantics.cases_recompute import RECOMPUTE_CASES
from tests.semantics.cases_swap import SWAP_CASES

CASES: tuple[Case, ...] = (*SWAP_CASES, *RECOMPUTE_CASES, *ERROR_CASES)


def _params() -> list:
    return [
        pytest.param(case, impl, id=f"{case.name}-{impl.value}") for case in CASES for impl in Impl
    ]


@pytest.mark.parametrize(("case", "impl"), _params())
def test_case(case: Case, impl: Impl) -> None:
    differs = case.differs.get(impl)
    if differs is not None and differs.check is Check.NONE:
        pytest.skip(f"{impl.value}: {differs.why}")
    run = RUNNERS[impl](case)
    _assert_outcome(case, impl, run, accepts=differs is not None and differs.accepts)
    if not run.ok:
        return
    if differs is not None and differs.check is Check.OUTCOME:
        return
    upper = differs is not None and differs.check is Check.UPPER
    _assert_bytes(case, run, upper)


def _assert_outcome(case: Case, impl: Impl, run: Run, accepts: bool) -> None:
    if case.reject is None or accepts:
        assert run.ok, f"{impl.value} rejects the plan: {run.message}"
        return
    assert not run.ok, f"{impl.value} accepts a plan the case rejects ({case.reject.fragment})"
    if impl is Impl.CHECKER:
        assert case.reject.fragment in run.message, run.message
    assert re.search(rf"buffer {case.reject.buffer}\b", run.message), run.message


def _assert_bytes(case: Case, run: Run, upper: bool) -> None:
    """Bytes per op of iterations 0 and 1 (in MiB, for readable failures) and
    the peak, where the implementation has them: equal, or >= if `upper`."""
    for label, want, got in (
        ("iteration 0", case.first, run.first),
        ("iteration 1", case.steady, run.steady),
    ):
        if got is None:
            continue
        want_mib, got_mib = _mib(want), _mib(got)
        if upper:
            assert all(g >= w for g, w in zip(got_mib, want_mib, strict=True)), (
                f"{label}: {got_mib} not >= {want_mib}"
            )
        else:
            assert got_mib == want_mib, f"{label}: bytes per op (MiB)"
    if run.peak is not None:
        if upper:
            assert run.peak >= case.peak
        else:
            assert _mib((run.peak,)) == _mib((case.peak,)), "peak over the run (MiB)"


def _mib(xs: tuple[int, ...]) -> tuple[float, ...]:
    return tuple(x / MiB for x in xs)


TOLERATED = [
    pytest.param(case, id=case.name)
    for case in CASES
    if case.reject is not None and Impl.SIM in case.differs and case.differs[Impl.SIM].accepts
]


@pytest.mark.parametrize("case", TOLERATED)
def test_the_simulator_rejects_what_it_tolerates_when_it_checks(case: Case) -> None:
    """The static checker is the contract: a plan the unchecked simulator runs
    but the checker rejects is rejected by `simulate` as it runs by default."""
    assert case.reject is not None
    run = run_sim_checked(case)
    assert not run.ok, "simulate(check=True) accepts it"
    assert case.reject.fragment in run.message, run.message


def test_the_table_is_hand_worked_and_covers_the_semantics() -> None:
    """At least 30 uniquely named cases; every expected curve has one figure
    per op; every kind of event and the required situations appear."""
    assert len(CASES) >= 30
    assert len({case.name for case in CASES}) == len(CASES)
    for case in CASES:
        trace: Trace = case.built()[0]
        if case.reject is None:
            assert len(case.first_mib) == trace.n_ops, case.name
            assert case.steady_mib is None or len(case.steady_mib) == trace.n_ops, case.name
        else:
            assert not case.first_mib and case.steady_mib is None, case.name
    kinds = {type(ev).__name__ for case in CASES for ev in case.events}
    assert kinds == {"SwapOut", "SwapIn", "Release", "Recompute"}
    events = [ev for case in CASES for ev in case.events]
    assert any(getattr(ev, "before_op", -1) >= 0 for ev in events if type(ev).__name__ == "SwapOut")
    assert any(getattr(ev, "next_iteration", False) for ev in events)
    names = {case.name for case in CASES}
    for required in (
        "recompute_chain",
        "swap_in_cancels_running_swap_out",
        "swap_in_cancels_queued_swap_out",
        "discard_by_release",
        "framework_free_during_copy",
        "read_of_absent_buffer",
        "swap_in_without_host_copy",
        "release_of_dead_buffer",
        "duplicate_recompute",
    ):
        assert required in names
