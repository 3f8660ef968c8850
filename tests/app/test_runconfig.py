"""`RunConfig`: the memory model and the net of a run, built once from the
command line (memplan/runconfig.py)."""

from __future__ import annotations

import argparse

import pytest
from memplan.planners.core.evaluate import OomPolicy
from memplan.sim.errors import SimError
from memplan.sim.state import Allocator
from memplan.traces.errors import MemplanError

from memplan.commands import machine
from memplan.runconfig import Fallback, RunConfig


def test_names_become_enums_and_bad_ones_are_one_line_errors():
    run = RunConfig("caching", 4096, "dtr")
    assert (run.allocator, run.context_reserve, run.fallback) == (
        Allocator.CACHING, 4096, Fallback.DTR,
    )  # fmt: skip
    assert run.memory == {"allocator": Allocator.CACHING, "context_reserve": 4096}
    assert run.with_fallback("none") == RunConfig("caching", 4096)
    with pytest.raises(
        MemplanError, match=r"^--fallback='fail' must be one of none, passive, dtr$"
    ):
        RunConfig(fallback="fail")
    with pytest.raises(SimError, match="allocator='buddy' must be one of exact, caching"):
        RunConfig("buddy")


def test_each_net_is_a_simulator_policy():
    assert [f.policy for f in Fallback] == [OomPolicy.FAIL, OomPolicy.PASSIVE, OomPolicy.DTR]
    assert f"{Fallback.DTR} net" == "dtr net" and Fallback.PASSIVE == "passive"


def test_the_command_line_choices_are_the_enums():
    p = argparse.ArgumentParser()
    machine.add_allocator(p)
    machine.add_fallback(p)
    args = p.parse_args(["--allocator", "smartpool", "--context-reserve", "1KiB"])
    assert machine.run_config(args) == RunConfig("smartpool", 1024, "none")
    args = p.parse_args(["--fallback", "passive"])
    assert machine.run_config(args) == RunConfig(fallback=Fallback.PASSIVE)
    assert machine.run_config(args, net=False) == RunConfig()
    for action in p._actions:
        if action.dest in ("allocator", "fallback"):  # plain strings: argparse quotes them
            assert all(type(c) is str for c in action.choices)
    assert machine.run_config(argparse.Namespace()) == RunConfig()
