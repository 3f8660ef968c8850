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
# Every JSON result memplan writes (compare, capacity, bounds, simulate, export, the dynamic
# report, plan files, regress's baseline) carries a "provenance" object saying, months
# later, which inputs and which memplan made it:
# - `memplan_version`; `command`, the subcommand (arguments in `options`, so quoting and
#   order do not matter);
# - `traces`: per job, in order, the model name and `traces.io.fingerprint` (measured
#   durations excluded, so re-measuring a trace keeps it);
# - `profile`: its name, its [source] lines and every value the costs were computed from;
# - `options`: the command's arguments (`command_options`) or a library caller's; `seed`.
# No timestamp, host or output path: a deterministic output stays byte-identical anywhere.


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
