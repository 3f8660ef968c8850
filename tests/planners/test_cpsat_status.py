"""CP-SAT statuses as the solver said them (NOTE [ Soft statuses ] in
planners/cpsat/solve.py): UNKNOWN is never reported as INFEASIBLE, by the
read-out or by `memplan plan`'s wording."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from memplan.planners.cpsat import solve
from memplan.planners.cpsat.options import CpsatOptions
from memplan.planners.cpsat.outcome import result
from memplan.traces import io, synthetic
from ortools.sat.python import cp_model

from tests.fuzz.harness import assert_clean, run_cli

W = 1000  # the soft model's excess weight: H + 1


class FakeSolver:
    def __init__(self, bound: float, excess: int):
        self.best_objective_bound = bound
        self.objective_value = W * excess + 7.0
        self.wall_time = 0.5
        self._excess = excess

    def value(self, _var: object) -> int:
        return self._excess


@pytest.fixture
def no_readout(monkeypatch):
    monkeypatch.setattr(solve, "read_solution", lambda bm, s: "solution")


@pytest.mark.parametrize(
    ("name", "code", "bound", "excess", "soft", "reported", "plan"),
    [
        ("UNKNOWN", cp_model.UNKNOWN, 0.0, 0, False, "UNKNOWN", False),  # hard: as said
        ("UNKNOWN", cp_model.UNKNOWN, 0.0, 0, True, "UNKNOWN", False),  # soft, no solution
        ("FEASIBLE", cp_model.FEASIBLE, 5.0, 2, True, "UNKNOWN", False),  # over the budget
        ("OPTIMAL", cp_model.OPTIMAL, 5.0, 0, True, "OPTIMAL", True),  # within the budget
        ("FEASIBLE", cp_model.FEASIBLE, W + 5.0, 2, True, "INFEASIBLE", False),  # bound proves
        ("UNKNOWN", cp_model.UNKNOWN, float(W), 0, True, "INFEASIBLE", False),  # bound proves
        ("INFEASIBLE", cp_model.INFEASIBLE, 0.0, 0, True, "INFEASIBLE", False),  # its proof
    ],
)
def test_soft_read_out_reports_infeasible_only_with_a_proof(
    no_readout, name, code, bound, excess, soft, reported, plan
):
    bm = SimpleNamespace(excess="x" if soft else None, excess_weight=W)
    out = solve._read_out(FakeSolver(bound, excess), code, name, bm)
    assert out.status == reported
    assert (out.solution is not None) == plan
    if soft and reported != "INFEASIBLE":
        assert not out.proven_excess


def test_plan_words_unknown_as_a_time_limit(tmp_path, monkeypatch):
    """`memplan plan --planner cpsat` prints what the run proved: a run the
    solver left UNKNOWN is 'stopped: time limit ... nothing proved', with no
    'infeasible' anywhere."""
    from memplan.planners import registry

    unknown = result(CpsatOptions(time_limit_s=2.0), 5 << 20, 0.0, "UNKNOWN", None,
                     {"objective": None, "best_bound": math.nan})  # fmt: skip
    monkeypatch.setattr(registry, "run", lambda *a, **k: unknown)
    path = tmp_path / "t.json"
    io.save(synthetic.chain(3), path)
    argv = ["plan", str(path), "--planner", "cpsat", "--gpu", "rtx-a6000", "--budget", "5MiB"]
    o = run_cli(argv, 30.0)
    assert_clean(o)
    assert o.code == 0, o.describe()
    assert "cpsat: stopped: time limit (no plan within the time limit of 2 s, nothing proved)" in (
        o.stdout
    )
    assert "infeasible" not in o.stdout.lower()
    o = run_cli([*argv, "--json"], 30.0)
    assert '"status": "stopped"' in o.stdout and '"status": "UNKNOWN"' in o.stdout, o.stdout
