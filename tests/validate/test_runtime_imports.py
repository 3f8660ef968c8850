"""The runtime room stays light: a training loop that imports
`memplan.validate.runtime` loads neither SimPy, the simulator, nor the replay
engine or the calibration (docs/design.md, "Layers"). Checked in a fresh
interpreter, where nothing else has loaded them first."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "simpy",
    "memplan.sim",
    "memplan.validate.replay",
    "memplan.validate.calibrate",
    "memplan.validate.errors",
)
RUNTIME = (
    "memplan.validate.runtime",
    "memplan.validate.runtime.errors",
    "memplan.validate.runtime.hooks",
    "memplan.validate.runtime.io",
    "memplan.validate.runtime.moments",
    "memplan.validate.runtime.pinned",
    "memplan.validate.runtime.plan",
    "memplan.validate.runtime.state",
)


def loaded_after(*statements: str) -> list[str]:
    """The modules a fresh interpreter holds after running `statements`."""
    code = "\n".join([*statements, "import json, sys", "print(json.dumps(sorted(sys.modules)))"])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return json.loads(out.splitlines()[-1])


def test_importing_the_runtime_loads_nothing_of_the_replay_or_the_simulator():
    loaded = loaded_after(*(f"import {m}" for m in RUNTIME))
    assert set(RUNTIME) <= set(loaded)
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == []


def test_the_package_names_load_the_replay_engine_when_used():
    # `import memplan.validate` alone is light; its names come on first use,
    # and `replay` is the function whichever module of the room came first
    assert "memplan.validate.replay" not in loaded_after("import memplan.validate")
    loaded = loaded_after(
        "import memplan.validate.replay.pool",
        "from memplan.validate import Direction, ReplayResult, replay",
        "from memplan.validate.replay.executor import replay as f",
        "assert replay is f and callable(replay), replay",
        "assert Direction.D2H.value == 'd2h' and ReplayResult.__name__ == 'ReplayResult'",
    )
    assert "memplan.validate.replay.executor" in loaded
