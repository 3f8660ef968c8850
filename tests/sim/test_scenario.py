"""Scenarios from text: `--job TRACE@T:N`, `--lane-slowdown`, and the TOML
scenario file (memplan/scenario.py)."""

from __future__ import annotations

import pytest
from memplan.sim import LaneSlowdown, SimError

from memplan.scenario import JobSpec, job_spec, lane_slowdown, load, time_s


def test_job_specs():
    assert job_spec("zoo:resnet50_b16_adam@2.5s:20") == JobSpec(
        "zoo:resnet50_b16_adam", 2.5, 20, None
    )
    assert job_spec("a/b.json@500ms") == JobSpec("a/b.json", 0.5)
    assert job_spec("t.json:until=5s") == JobSpec("t.json", 0.0, None, 5.0)
    assert job_spec("t.json@1s:until=1500ms") == JobSpec("t.json", 1.0, None, 1.5)
    assert job_spec("zoo:vgg16_b16_adam") == JobSpec("zoo:vgg16_b16_adam")
    assert time_s("20us", "x") == pytest.approx(2e-5)
    for text, msg in [
        ("t.json@2", "with a unit"),
        ("t.json@-1s", "with a unit"),
        ("t.json@1e9s", "at most"),
        ("t.json:0", "from 1 to 1000"),
        ("t.json:1001", "from 1 to 1000"),
        ("t.json@2s:until=1s", "not after its arrival"),
        ("@1s", "no trace"),
    ]:
        with pytest.raises(SimError, match=msg):
            job_spec(text)


def test_lane_slowdowns():
    assert lane_slowdown("4x@1s-3s") == LaneSlowdown(4.0, 1.0, 3.0)
    assert lane_slowdown("1.5X@0ms-20ms") == LaneSlowdown(1.5, 0.0, 0.02)
    for text, msg in [
        ("4@1s-3s", "FACTORx"),
        ("fourx@1s-3s", "not a number"),
        ("0.5x@1s-3s", "factor"),
        ("4x@3s-1s", "after the start"),
        ("4x@1s", "FACTORx"),
        ("nanx@1s-2s", "factor"),
    ]:
        with pytest.raises(SimError, match=msg):
            lane_slowdown(text)


FILE = """
seed = 7
jitter = 0.1
usage = 0.25
lane_slowdown = ["2x@1s-2s"]

[[job]]
trace = "zoo:resnet50_b16_adam"
iterations = 5

[[job]]
trace = "sub/t.json"
arrival_s = 1.5
departure_s = 4.0
plan = "vanilla"
name = "late"
"""


def test_a_scenario_file(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(FILE)
    s = load(f)
    assert s.jobs == (
        JobSpec("zoo:resnet50_b16_adam", 0.0, 5),
        JobSpec(str(tmp_path / "sub/t.json"), 1.5, None, 4.0, "vanilla", "late"),
    )
    assert s.options() == {
        "seed": 7,
        "jitter": 0.1,
        "usage": 0.25,
        "lane_slowdowns": (LaneSlowdown(2.0, 1.0, 2.0),),
    }


def random_launch(seed: int) -> str:
    jobs = "".join(f'[[job]]\ntrace = "t{k}.json"\niterations = 3\n' for k in range(5))
    return f'[launch]\norder = "random"\nseed = {seed}\ngap_s = 0.5\nstart_s = 1.0\n{jobs}'


def test_random_launch_order_is_seeded(tmp_path):
    # five jobs launched one by one, 0.5 s apart from 1 s, in an order drawn
    # from the seed: the arrivals are a permutation of 1, 1.5, ..., 3 s
    f = tmp_path / "s.toml"
    orders = []
    for seed in (1, 1, 2, 3):
        f.write_text(random_launch(seed))
        arrivals = [j.arrival_s for j in load(f).jobs]
        assert sorted(arrivals) == [1.0, 1.5, 2.0, 2.5, 3.0]
        orders.append(arrivals)
    assert orders[0] == orders[1]
    assert len({tuple(o) for o in orders}) > 2  # seeds 1, 2, 3 do not all agree


@pytest.mark.parametrize(
    "text, msg",
    [
        ("seed = 1\n", "no \\[\\[job\\]\\] tables"),
        ('jiter = 0.1\n[[job]]\ntrace = "t"\n', 'unknown field "jiter"'),
        ('[[job]]\ntrace = "t"\narival_s = 1\n', 'job\\[0\\]: unknown field "arival_s"'),
        ("[[job]]\niterations = 2\n", "job\\[0\\]: no trace"),
        ('[[job]]\ntrace = "t"\niterations = 0\n', "job\\[0\\].iterations: expected an integer"),
        ('[[job]]\ntrace = "t"\niterations = 2.5\n', "job\\[0\\].iterations: expected an integer"),
        ('[[job]]\ntrace = "t"\narrival_s = nan\n', "job\\[0\\].arrival_s: expected a finite"),
        ('[[job]]\ntrace = "t"\narrival_s = -1\n', "job\\[0\\].arrival_s: expected a number in"),
        ('[[job]]\ntrace = "t"\narrival_s = 2\ndeparture_s = 1\n', "not after arrival_s"),
        ('jitter = 9\n[[job]]\ntrace = "t"\n', "jitter: expected a number in \\[0, 2\\]"),
        ('usage = "high"\n[[job]]\ntrace = "t"\n', "usage: expected a number"),
        ('lane_slowdown = "4x@1s-2s"\n[[job]]\ntrace = "t"\n', "lane_slowdown: expected a list"),
        ('lane_slowdown = ["4x"]\n[[job]]\ntrace = "t"\n', "lane_slowdown\\[0\\]"),
        ('[launch]\norder = "shuffled"\n[[job]]\ntrace = "t"\n', 'launch.order: expected "given"'),
        ('[launch]\ngap_s = 1\n[[job]]\ntrace = "t"\n', 'only with order = "random"'),
        ('[launch]\norder = "random"\n[[job]]\ntrace = "t"\narrival_s = 1\n', "sets the arrivals"),
        ("[[job]]\ntrace = 3\n", "job\\[0\\].trace: expected a string"),
        ("job = 3\n", "job: expected a list"),
        ("[[job]\n", "not valid TOML"),
    ],
)
def test_bad_scenario_files_name_the_field(tmp_path, text, msg):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(SimError, match=msg) as e:
        load(f)
    assert "\n" not in str(e.value) and str(f) in str(e.value)


def test_unreadable_scenario_files(tmp_path):
    with pytest.raises(SimError, match="no such scenario file"):
        load(tmp_path / "missing.toml")
    f = tmp_path / "bin.toml"
    f.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SimError, match="not valid TOML"):
        load(f)
