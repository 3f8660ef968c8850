"""What a JSON result was computed from: memplan's version, the command, the
traces (by fingerprint), the hardware profile's values, the options and the
seed (NOTE [ Provenance ]).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import memplan

if TYPE_CHECKING:
    from memplan.hwmodels.profile import Hardware
    from memplan.traces.model import Trace

# NOTE [ Provenance ]
# Every JSON result memplan writes (compare's, capacity's, bounds', simulate's,
# export's and the dynamic report's JSON, plan files, regress's baseline)
# carries a "provenance" object: enough to say, months later, which inputs
# and which memplan made it.
# - `memplan_version`: `memplan.__version__`.
# - `command`: the subcommand (`memplan compare`); the argument values are in
#   `options`, not a command line, so that the record does not depend on how
#   the user quoted or ordered them.
# - `traces`: one entry per job, in order (copies repeat): the model name the
#   trace records and its fingerprint (`traces.io.fingerprint`: measured
#   durations excluded, so re-measuring a trace keeps it).
# - `profile`: the hardware profile's name, its [source] lines and every
#   value the costs were computed from (a user's edited .toml under a shipped
#   name shows in its values).
# - `options`: the command's arguments (`command_options`) or, for a library
#   caller, what it passes; `seed`: the random seed when the result has one.
# No timestamp, host or path of the output: a deterministic output stays
# byte-identical when run again, anywhere.


def _fingerprints(traces: Sequence[Trace]) -> list[dict[str, str]]:
    from memplan.traces.io import fingerprint

    known: dict[int, str] = {}  # `TRACE:4` is one object four times: hashed once
    out = []
    for t in traces:
        if id(t) not in known:
            known[id(t)] = fingerprint(t)
        out.append({"name": t.meta.model, "fingerprint": known[id(t)]})
    return out


def profile_values(hw: Hardware) -> dict[str, Any]:
    """The profile as a JSON object: name, source lines and values."""
    return {f.name: _plain(getattr(hw, f.name)) for f in dataclasses.fields(hw)}


def _plain(value: Any) -> Any:
    """`value` as strict JSON: containers copied, non-finite floats and
    other objects as strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def provenance(
    traces: Sequence[Trace],
    hw: Hardware | None,
    *,
    options: dict[str, Any],
    seed: int | None,
    command: str,
) -> dict[str, Any]:
    """The "provenance" object of a JSON result (NOTE [ Provenance ]):
    deterministic, strict JSON (no NaN)."""
    return {
        "memplan_version": memplan.__version__,
        "command": command,
        "traces": _fingerprints(traces),
        "profile": None if hw is None else profile_values(hw),
        "options": _plain(options),
        "seed": seed,
    }


# Arguments that say where output goes or how it is shown, not what is computed.
_NOT_INPUTS = frozenset({"func", "command", "json", "out", "summary"})


def command_options(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed arguments of a command that decide its result, as JSON:
    everything but where it writes and how it prints (NOTE [ Provenance ])."""
    out = {k: _plain(v) for k, v in sorted(vars(args).items()) if k not in _NOT_INPUTS}
    json.dumps(out, allow_nan=False)  # a bug, not bad input, if this fails
    return out


def of_command(
    args: argparse.Namespace,
    traces: Sequence[Trace],
    hw: Hardware | None,
    seed: int | None = None,
) -> dict[str, Any]:
    """`provenance` of a command's result: its arguments as options, `seed`
    (default its `--seed`, None when it has none) and `memplan COMMAND`."""
    if seed is None:
        seed = getattr(args, "seed", None)
    command = f"memplan {getattr(args, 'command', None) or '?'}"
    return provenance(traces, hw, options=command_options(args), seed=seed, command=command)
