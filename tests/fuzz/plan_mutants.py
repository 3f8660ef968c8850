"""Seeded mutants of a valid plan file, each knowing its verdict.

`mutants(base, seed, n)` yields `Mutant`s round-robin over `CLASSES` (issue
17's "Plans" list -- a nested file, an integer delay of 10^400, `"type":
{}`, delays of 1e308 and 1e9 us -- and more), details drawn from the seed.
A mutant is rejected in one line naming `field`; or a valid variant
(`field` None) that runs to exit 0; or, for in-range edits whose meaning
only the plan's semantics decide, `either`: any clean outcome, and a
rejection is one line. `simulated_only` marks a file refused only where the
plan is simulated -- a delay finite and at most a day but longer than the
iteration on the device, a plan count that does not match the traces -- and
valid for `export`, which has no device and takes one plan by `--job`.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

Doc = dict[str, Any]


@dataclass(frozen=True)
class Mutant:
    cls: str
    what: str
    data: bytes
    suffix: str
    field: str | None
    either: bool = False
    simulated_only: bool = False


class Base(NamedTuple):
    doc: Doc  # a valid plan file's document, with one plan of every event kind
    n_ops: int
    n_buffers: int
    iteration_us: float  # the vanilla iteration on the fuzzed device


# ---- raw JSON tokens --------------------------------------------------------------------
_RAW = "\x00raw:"


def raw(token: str) -> str:
    """A placeholder `dump` writes as the bare JSON token `token` (NaN, 1e400)."""
    return _RAW + token


def dump(doc: Any) -> bytes:
    text = json.dumps(doc)
    while '"\\u0000raw:' in text:
        i = text.index('"\\u0000raw:')
        j = text.index('"', i + 1)
        text = text[:i] + text[i + len('"\\u0000raw:') : j] + text[j + 1 :]
    return text.encode()


BIG = "1" + "0" * 400
NON_FINITE = [raw("NaN"), raw("Infinity"), raw("-Infinity"), raw("1e400"), raw(BIG), 10**400]
NOT_A_NUMBER = ["1", "abc", [], {}, True, False, None, [1]]
NOT_AN_INT = [*NOT_A_NUMBER, *NON_FINITE, 1.5, 1.0, 2**63, 2**64, "\ud800"]
NOT_A_BOOL = ["false", "true", 0, 1, None, [], "no", 0.0]
NOT_A_STRING = [1, None, [], {}, True, 1.5, ["x"]]
NOT_A_LIST = [None, 1, "x", {}, True, "[]"]
SURROGATES = ["\ud800", "a\udfffb", "\udc80\udc81", "x\ud83d", "Zoë ✓ 模型"]
REQUIRED = {
    "swap_out": ("type", "buffer", "after_op"),
    "swap_in": ("type", "buffer", "after_op", "before_op"),
    "release": ("type", "buffer", "after_op"),
    "recompute": ("type", "buffer", "before_op", "ops"),
}


def _deep(depth: int) -> Any:
    x: Any = 0
    for _ in range(depth):
        x = [x]
    return x


def _events(d: Doc) -> list[Doc]:
    return d["plans"][0]["events"]


def _event(rng: random.Random, d: Doc, *kinds: str) -> Doc:
    """An event of one of `kinds` (any, if the plan has none: a key of another
    kind is then an unknown field, named as well)."""
    return rng.choice([e for e in _events(d) if e["type"] in kinds] or _events(d))


# Each class: (rng, base, doc) -> (what, field, extra verdict keywords); it edits `doc`
# in place or returns bytes in the "data" keyword.
Result = tuple[str, str | None, dict[str, Any]]


def c_type(rng, b, d) -> Result:
    v = rng.choice([{}, [], None, 5, "swap", "", "SWAP_OUT", True, "\ud800", ["swap_in"]])
    _event(rng, d)["type"] = v
    return f"type={v!r}", "type", {}


def c_delay_not_finite(rng, b, d) -> Result:
    v = rng.choice([*NON_FINITE, *NOT_A_NUMBER])
    _event(rng, d, "swap_out", "swap_in")["delay_us"] = v
    return f"delay_us={str(v)[:20]!r}", "delay_us", {}


def c_delay_absurd(rng, b, d) -> Result:
    v = rng.choice([-1, -1e-9, 1e308, 1.7e308, 2 * 86_400e6, 1e300])
    _event(rng, d, "swap_out", "swap_in")["delay_us"] = v
    return f"delay_us={v!r}", "delay_us", {}


def c_delay_past_iteration(rng, b, d) -> Result:
    v = rng.choice([1e9, b.iteration_us * rng.uniform(1.01, 1e3), 86_400e6])
    _event(rng, d, "swap_out", "swap_in")["delay_us"] = v
    what = f"delay_us={v!r} (iteration {b.iteration_us:g} us)"
    return what, "delay_us", {"simulated_only": True}


def c_delay_valid(rng, b, d) -> Result:
    v = rng.choice([0, 0.0, rng.uniform(0, b.iteration_us), b.iteration_us])
    _event(rng, d, "swap_out", "swap_in")["delay_us"] = v
    return f"delay_us={v!r} within the iteration", None, {}


def c_buffer(rng, b, d) -> Result:
    v = rng.choice([*NOT_AN_INT, -1, b.n_buffers, b.n_buffers + rng.randrange(1, 10**6)])
    _event(rng, d)["buffer"] = v
    return f"buffer={str(v)[:20]!r}", "buffer", {}


def c_op_index(rng, b, d) -> Result:
    ev = _event(rng, d)
    key = rng.choice([k for k in ("after_op", "before_op") if k in ev])
    lo = -1 if key == "after_op" or ev["type"] == "swap_out" else 0
    ev[key] = rng.choice([*NOT_AN_INT, lo - 1, b.n_ops, b.n_ops + 7, -(2**63) - 1, 10**20])
    return f"{key}={str(ev[key])[:20]!r}", key, {}


def c_ops(rng, b, d) -> Result:
    ev = _event(rng, d, "recompute")
    v = rng.choice(
        [*NOT_A_LIST, [], [1.5], ["1"], [b.n_ops], [2**70], [None], [-1], [True], [b.n_ops - 1, 0]]
    )
    ev["ops"] = v
    return f"ops={v!r}", "ops", {}


def c_flag(rng, b, d) -> Result:
    ev = _event(rng, d, "swap_in", "recompute")
    key = "next_iteration" if ev["type"] == "swap_in" else "restore_rng"
    ev[key] = rng.choice(NOT_A_BOOL)
    return f"{key}={ev[key]!r}", key, {}


def c_missing(rng, b, d) -> Result:
    where = rng.choice(["event", "plan", "top"])
    if where == "event":
        ev = _event(rng, d)
        key = rng.choice(REQUIRED[ev["type"]])
        del ev[key]
    elif where == "plan":
        key = rng.choice(["trace", "events"])
        del d["plans"][0][key]
    else:
        key = rng.choice(["schema", "plans", "planner", "solve_time_s"])
        del d[key]
    return f"{where} without {key}", key, {}


def c_unknown_key(rng, b, d) -> Result:
    key = rng.choice(["delay_su", "befor_op", "nbytes", "job", "x", "Type", "ops_"])
    target = rng.choice([_event(rng, d), d["plans"][0], d])
    target[key] = rng.choice([0, "x", None, [1]])
    return f"extra key {key}", key, {}


def c_strings(rng, b, d) -> Result:
    target, key = rng.choice(
        [(d["plans"][0], "trace"), (d["plans"][0], "model"), (d, "planner"), (d, "detail")]
    )
    target[key] = rng.choice(NOT_A_STRING)
    return f"{key}={target[key]!r}", key, {}


def c_top(rng, b, d) -> Result:
    key, v = rng.choice(
        [
            ("schema", rng.choice(["memplan.plan/2", "", None, 1, "memplan.trace/1"])),
            ("plans", rng.choice(NOT_A_LIST[:-1] + [{}])),
            ("options", rng.choice([[], "x", 1, None])),
            ("stats", rng.choice([[], "x", 1])),
            ("solve_time_s", rng.choice([*NON_FINITE, -1.0, "1", None])),
            ("status", rng.choice(["maybe", "", 1, None, "PLANNED"])),
            ("reason", rng.choice(["none", "because", 3])),
            ("trace", rng.choice(["0" * 64, "f1225e2e", ""])),
        ]
    )
    if key == "trace":
        d["plans"][0]["trace"] = v  # another trace's plan
    else:
        d[key] = v
    if key == "reason" and v == "none":  # "none" does not go with status "stopped"
        d["status"] = "stopped"
    return f"{key}={str(v)[:20]!r}", key, {}


def c_nested(rng, b, d) -> Result:
    depth = rng.choice([70, 500, 5000, 100_000])
    target, key = rng.choice(
        [(d["plans"][0], "events"), (d, "options"), (d, "stats"), (_event(rng, d), "ops")]
    )
    # json.dumps cannot write thousands of levels: a raw token can
    target[key] = _deep(depth) if depth < 5000 else raw("[" * depth + "0" + "]" * depth)
    return f"{key} nested {depth} deep", "nested", {}


def c_bytes(rng, b, d) -> Result:
    text = dump(d)
    kind = rng.choice(["truncated", "empty", "garbage", "gzip", "list", "nul"])
    data = {
        "truncated": text[: rng.randrange(1, len(text))],
        "empty": b"",
        "garbage": bytes(rng.randrange(256) for _ in range(64)),
        "gzip": b"\x1f\x8b" + bytes(rng.randrange(256) for _ in range(32)),
        "list": b"[" + text + b"]",
        "nul": text[:10] + b"\x00" + text[10:],
    }[kind]
    return f"{kind} bytes", "", {"data": data}


def c_valid(rng, b, d) -> Result:
    kind = rng.choice(["shuffled", "optional", "names", "gzip", "stats", "indent", "utf16"])
    if kind == "shuffled":
        for ev in _events(d):
            items = list(ev.items())
            rng.shuffle(items)
            ev.clear()
            ev.update(items)
    elif kind == "optional":
        for ev in _events(d):
            for key in ("delay_us", "next_iteration"):
                ev.pop(key, None)
    elif kind == "names":
        d["plans"][0]["model"] = rng.choice(SURROGATES)
        d["planner"] = rng.choice(SURROGATES)
        d["detail"] = rng.choice(SURROGATES)
    elif kind == "stats":
        d["stats"] = {"x": [1, {"y": None}], "z": rng.choice(SURROGATES)}
        d["options"] = {"k": _deep(20)}
    data = dump(d)
    if kind == "gzip":
        return "gzip-compressed", None, {"data": gzip.compress(data), "suffix": ".json.gz"}
    if kind == "utf16":  # a JSON encoding Python reads (RFC 8259 wants UTF-8, RFC 4627 allowed it)
        return "UTF-16", None, {"data": data.decode().encode("utf-16")}
    if kind == "indent":
        return "indented", None, {"data": json.dumps(d, indent=rng.choice([1, 4, "\t"])).encode()}
    return kind, None, {"data": data}


def c_in_range(rng, b, d) -> Result:
    ev = _event(rng, d)
    key = rng.choice([k for k in ("buffer", "after_op", "before_op") if k in ev])
    ev[key] = rng.randrange(b.n_buffers if key == "buffer" else b.n_ops)
    return f"{key}={ev[key]} (in range)", None, {"either": True}


def c_plan_count(rng, b, d) -> Result:
    d["plans"] = d["plans"] * rng.choice([0, 2, 3])
    return f"{len(d['plans'])} plans", "plans", {"simulated_only": len(d["plans"]) > 0}


def c_duplicate(rng, b, d) -> Result:
    ev = _event(rng, d)
    _events(d).insert(rng.randrange(len(_events(d)) + 1), copy.deepcopy(ev))
    return f"duplicate {ev['type']}", None, {"either": True}


CLASSES: dict[str, Callable[..., Result]] = {
    name.removeprefix("c_"): fn for name, fn in globals().items() if name.startswith("c_")
}


def mutants(base: Base, seed: int, n: int) -> Iterator[Mutant]:
    """`n` mutants of `base`, round-robin over `CLASSES`, details from `seed`."""
    rng = random.Random(seed)
    names = list(CLASSES)
    for k in range(n):
        cls = names[k % len(names)]
        d = copy.deepcopy(base.doc)
        what, field, extra = CLASSES[cls](rng, base, d)
        data = extra.pop("data", None)
        yield Mutant(
            cls,
            what,
            data if data is not None else dump(d),
            extra.pop("suffix", ".json"),
            field,
            **extra,
        )
