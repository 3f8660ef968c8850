"""Seeded mutants of a small valid trace file, each knowing its verdict.

`mutants(base, seed, n)` yields `Mutant`s round-robin over every class in
`CLASSES` (issue 17's "Traces" list and more), with the details (which
buffer, view, op; which bad value) drawn from the seed. A mutant either
must be rejected with one line naming `field` (a path such as
``ops[3].flops``, or a word of the file-level message), or it is a valid
variant (`field` is None) that every command must run to exit 0.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Doc = dict[str, Any]


@dataclass(frozen=True)
class Mutant:
    cls: str  # the mutation class
    what: str  # what was done, for failure messages
    data: bytes  # the file's bytes
    suffix: str  # ".json" or ".json.gz"
    field: str | None  # the rejection must name it; None: a valid variant


# ---- raw JSON tokens (NaN, Infinity, 400-digit numbers) --------------------------------
_RAW = "\x00raw:"
_RAW_RE = re.compile(r'"\\u0000raw:([^"]*)"')


def raw(token: str) -> str:
    """A placeholder that `dump` writes as the bare JSON token `token`."""
    return _RAW + token


def dump(doc: Any) -> bytes:
    return _RAW_RE.sub(lambda m: m.group(1), json.dumps(doc)).encode()


BIG = "1" + "0" * 400
NON_FINITE = [raw("NaN"), raw("Infinity"), raw("-Infinity"), raw("1e400"), raw(f"-{BIG}")]
NOT_A_NUMBER = ["1", "abc", [], {}, True, False, None, [1]]
NOT_AN_INT = [*NOT_A_NUMBER, *NON_FINITE, 1.5, 1.0, raw(BIG), 2**63, -1, "\ud800"]
NOT_A_BOOL = ["false", "true", 0, 1, None, [], "no", 0.0]
NOT_A_STRING = [1, None, [], {}, True, 1.5, ["x"]]
NOT_A_LIST = [None, 1, "x", {}, True, "[]"]
NOT_AN_OBJECT = [None, 1, "x", [], True, [{}]]
SURROGATES = ["\ud800", "a\udfffb", "\udc80\udc81", "x\ud83d"]


def _deep(depth: int, leaf: Any = 0) -> Any:
    x = leaf
    for _ in range(depth):
        x = [x]
    return x


# ---- the classes: (rng, doc, n) -> (new doc or file bytes, field or None, what) -------
Result = tuple[Any, str | None, str]


def _pick(rng: random.Random, doc: Doc, section: str) -> int:
    return rng.randrange(len(doc[section]))


def bad_int(rng: random.Random, d: Doc) -> Result:
    sec, key = rng.choice(
        [("buffers", "nbytes"), ("buffers", "id"), ("views", "id"), ("views", "buffer"),
         ("views", "offset"), ("ops", "id"), ("ops", "flops"), ("ops", "workspace_bytes"),
         ("saved", "view"), ("saved", "index"), ("meta", "batch_size")]
    )  # fmt: skip
    value = rng.choice(NOT_AN_INT + ([2**62 + 1, 10**20 + 1] if key != "id" else []))
    if sec == "meta":
        d["meta"][key] = value
        return d, f"meta.{key}", f"meta.{key} = {value!r}"
    i = _pick(rng, d, sec)
    d[sec][i][key] = value
    if key == "flops" and value in (2**62 + 1, 2**63):
        return d, None, f"{sec}[{i}].{key} = {value} (within the 1e20 cap)"
    if key in ("offset", "buffer", "view", "index") and value in (2**62 + 1, 10**20 + 1):
        value = 2**63  # an in-range offset or id fails differently: keep to int64 here
        d[sec][i][key] = value
    return d, f"{sec}[{i}].{key}", f"{sec}[{i}].{key} = {value!r}"


def bad_dim(rng: random.Random, d: Doc) -> Result:
    i = rng.choice([i for i, v in enumerate(d["views"]) if v["shape"]])
    key = rng.choice(["shape", "stride"])
    value = rng.choice([*NOT_AN_INT, _deep(300)])
    if key == "stride" and value == -1:
        value = "x"
    d["views"][i][key][0] = value
    return d, f"views[{i}].{key}[0]", f"views[{i}].{key}[0] = {str(value)[:30]}"


def bad_number(rng: random.Random, d: Doc) -> Result:
    i = _pick(rng, d, "ops")
    value = rng.choice([*NOT_A_NUMBER, *NON_FINITE, raw(BIG), -1, -0.5, 1e308, 86_400e6 * 2])
    if value is None:
        return _valid_null_duration(d, i)
    d["ops"][i]["duration_us"] = value
    return d, f"ops[{i}].duration_us", f"ops[{i}].duration_us = {value!r}"


def _valid_null_duration(d: Doc, i: int) -> Result:
    d["ops"][i]["duration_us"] = None
    return d, None, f"ops[{i}].duration_us = null (optional)"


def bad_bool(rng: random.Random, d: Doc) -> Result:
    sec, key = rng.choice([("buffers", "persistent"), ("ops", "rng")])
    i = _pick(rng, d, sec)
    value = rng.choice(NOT_A_BOOL)
    d[sec][i][key] = value
    return d, f"{sec}[{i}].{key}", f"{sec}[{i}].{key} = {value!r}"


def bad_string(rng: random.Random, d: Doc) -> Result:
    sec, key = rng.choice(
        [("buffers", "kind"), ("buffers", "name"), ("views", "dtype"), ("ops", "target"),
         ("ops", "phase"), ("ops", "module"), ("saved", "module"), ("meta", "model"),
         ("meta", "optimizer"), ("meta", "device"), ("meta", "dtype")]
    )  # fmt: skip
    value = rng.choice(NOT_A_STRING)
    if sec == "meta":
        d["meta"][key] = value
        return d, f"meta.{key}", f"meta.{key} = {value!r}"
    i = _pick(rng, d, sec)
    d[sec][i][key] = value
    return d, f"{sec}[{i}].{key}", f"{sec}[{i}].{key} = {value!r}"


def bad_enum(rng: random.Random, d: Doc) -> Result:
    sec, key = rng.choice([("buffers", "kind"), ("views", "dtype"), ("ops", "phase")])
    i = _pick(rng, d, sec)
    value = rng.choice(["", "fwd", "FORWARD", "float", "weights", " input", "\ud800", "None"])
    d[sec][i][key] = value
    return d, f"{sec}[{i}].{key}", f"{sec}[{i}].{key} = {value!r}"


def bad_list(rng: random.Random, d: Doc) -> Result:
    where = rng.choice(["buffers", "views", "ops", "saved", "reads", "writes", "shape", "stride"])
    value = rng.choice(NOT_A_LIST)
    if where in ("buffers", "views", "ops", "saved"):
        d[where] = value
        return d, where, f"{where} = {value!r}"
    sec = "views" if where in ("shape", "stride") else "ops"
    i = _pick(rng, d, sec)
    d[sec][i][where] = value
    return d, f"{sec}[{i}].{where}", f"{sec}[{i}].{where} = {value!r}"


def bad_object(rng: random.Random, d: Doc) -> Result:
    value = rng.choice(NOT_AN_OBJECT)
    where = rng.choice(["meta", "meta.extra", "buffers", "views", "ops", "saved", "args"])
    if where == "meta":
        d["meta"] = value
        return d, "meta", f"meta = {value!r}"
    if where == "meta.extra":
        if value is None:
            value = "x"  # null extra reads as {}
        d["meta"]["extra"] = value
        return d, "meta.extra", f"meta.extra = {value!r}"
    sec = "ops" if where == "args" else where
    i = _pick(rng, d, sec)
    if where == "args":
        d["ops"][i]["args"] = value
        return d, f"ops[{i}].args", f"ops[{i}].args = {value!r}"
    d[sec][i] = value
    return d, f"{sec}[{i}]", f"{sec}[{i}] = {value!r}"


REQUIRED = {
    "buffers": ["id", "nbytes", "kind"],
    "views": ["id", "buffer", "shape", "stride", "offset", "dtype"],
    "ops": ["id", "target", "phase", "reads", "writes"],
    "saved": ["view", "index"],
    "meta": ["model", "batch_size"],
    "": ["schema", "meta", "buffers", "views", "ops"],
}
OPTIONAL = {
    "buffers": ["name"],
    "ops": ["args", "flops", "duration_us", "workspace_bytes", "module", "rng"],
    "saved": ["module"],
    "meta": ["dtype", "optimizer", "device", "torch_version", "extra"],
    "": ["saved"],
}


def deleted_key(rng: random.Random, d: Doc) -> Result:
    required = rng.random() < 0.6
    table = REQUIRED if required else OPTIONAL
    sec = rng.choice(list(table))
    key = rng.choice(table[sec])
    if sec == "":
        obj, path = d, key
    elif sec == "meta":
        obj, path = d["meta"], f"meta.{key}"
    else:
        i = _pick(rng, d, sec)
        obj, path = d[sec][i], f"{sec}[{i}].{key}"
    del obj[key]
    if not required:
        return d, None, f"deleted optional {path}"
    return d, ("schema" if key == "schema" else path), f"deleted {path}"


def duplicate_id(rng: random.Random, d: Doc) -> Result:
    sec = rng.choice(["buffers", "views", "ops"])
    i = rng.randrange(1, len(d[sec]))
    d[sec][i]["id"] = rng.randrange(i)
    return d, f"{sec}[{i}].id", f"{sec}[{i}].id = {d[sec][i]['id']} (duplicate)"


def dangling_view(rng: random.Random, d: Doc) -> Result:
    n_views = len(d["views"])
    value = rng.choice([n_views, n_views + 7, 999_999, -1, "0", True, 1.5, None, 2**64])
    i = _pick(rng, d, "ops")
    where = rng.choice(["reads", "writes", "args", "saved"])
    if where == "args":
        d["ops"][i]["args"] = {"args": [{"view": value}], "kwargs": {}}
        return d, f"ops[{i}].args", f"ops[{i}].args view {value!r}"
    if where == "saved":
        j = _pick(rng, d, "saved")
        d["saved"][j]["view"] = value
        return d, f"saved[{j}].view", f"saved[{j}].view = {value!r}"
    d["ops"][i][where].append(value)
    j = len(d["ops"][i][where]) - 1
    return d, f"ops[{i}].{where}[{j}]", f"ops[{i}].{where}[{j}] = {value!r}"


def bad_freed_after(rng: random.Random, d: Doc) -> Result:
    n_ops = len(d["ops"])
    persistent = [i for i, b in enumerate(d["buffers"]) if b["persistent"]]
    if rng.random() < 0.3:
        i = rng.choice(persistent)
        d["buffers"][i]["freed_after"] = rng.randrange(n_ops)
        return d, f"buffers[{i}].freed_after", f"persistent buffers[{i}] freed"
    i = rng.choice([i for i, b in enumerate(d["buffers"]) if not b["persistent"]])
    value = rng.choice([n_ops, -1, "1", 1.5, True, 2**63, [], raw("NaN")])
    d["buffers"][i]["freed_after"] = value
    return d, f"buffers[{i}].freed_after", f"buffers[{i}].freed_after = {value!r}"


def deep_nesting(rng: random.Random, d: Doc) -> Result | tuple[bytes, str, str]:
    kind = rng.choice(["file", "args", "args-json", "extra", "stride"])
    if kind == "file":
        n = 100_000
        return ("[" * n + "]" * n).encode(), "nested", "a 100,000-deep nested list"
    i = _pick(rng, d, "ops")
    if kind == "args":
        d["ops"][i]["args"] = {"args": _deep(100)}
        return d, f"ops[{i}].args", f"ops[{i}].args 100 deep"
    if kind == "args-json":  # too deep for Python's parser itself
        text = dump(d).decode()
        n = 100_000
        text = text.replace('"kwargs": {}', '"kwargs": ' + "[" * n + "]" * n, 1)
        return text.encode(), "nested", "args 100,000 deep"
    if kind == "extra":
        d["meta"]["extra"] = {"x": _deep(100)}
        return d, "meta.extra", "meta.extra 100 deep"
    j = _pick(rng, d, "views")
    d["views"][j]["stride"] = _deep(500)  # Python's parser takes it; the loader does not
    return d, f"views[{j}].stride", f"views[{j}].stride 500 deep"


def surrogate_name(rng: random.Random, d: Doc) -> Result:
    """Lone surrogates in names are fine (printed escaped); in a target not."""
    s = rng.choice(SURROGATES)
    where = rng.choice(["buffer", "module", "model", "optimizer", "device", "saved", "extra",
                        "target", "all"])  # fmt: skip
    if where == "target":
        i = _pick(rng, d, "ops")
        d["ops"][i]["target"] += s
        return d, f"ops[{i}].target", f"ops[{i}].target + {s!r}"
    if where in ("buffer", "all"):
        for b in d["buffers"]:
            b["name"] = s + b["name"]
    if where in ("module", "all"):
        for o in d["ops"]:
            o["module"] = s
    if where in ("model", "optimizer", "device", "all"):
        d["meta"]["model" if where == "all" else where] = s
    if where in ("saved", "all"):
        d["saved"][0]["module"] = s
    if where in ("extra", "all"):
        d["meta"]["extra"][s] = s
    return d, None, f"surrogate {s!r} in {where}"


def sizes(rng: random.Random, d: Doc) -> Result:
    kind = rng.choice(["sum", "one", "ok-big", "ok-zero-ws", "ok-ws", "span", "offset"])
    bufs = d["buffers"]
    i = _pick(rng, d, "buffers")
    if kind == "sum":  # each within the cap, their sum not
        j = rng.choice([k for k in range(len(bufs)) if k != i])
        bufs[i]["nbytes"] = bufs[j]["nbytes"] = 2**61 + 1
        return d, f"buffers[{max(i, j)}].nbytes", f"buffers[{i}], [{j}] of 2**61 + 1"
    if kind == "one":
        bufs[i]["nbytes"] = rng.choice([2**62 + 1, 2**63 - 1, 2**63, 2**64])
        return d, f"buffers[{i}].nbytes", f"buffers[{i}].nbytes = {bufs[i]['nbytes']}"
    if kind == "ok-big":
        bufs[i]["nbytes"] = 2**61
        return d, None, f"buffers[{i}].nbytes = 2**61"
    k = _pick(rng, d, "ops")
    if kind == "ok-zero-ws":
        d["ops"][k]["workspace_bytes"] = 0
        return d, None, f"ops[{k}].workspace_bytes = 0"
    if kind == "ok-ws":
        d["ops"][k]["workspace_bytes"] = 2**30
        return d, None, f"ops[{k}].workspace_bytes = 2**30"
    v = _pick(rng, d, "views")
    if kind == "span":
        d["views"][v]["shape"] = [2**40]
        return d, f"views[{v}]", f"views[{v}].shape = [2**40] (past its buffer)"
    d["views"][v]["offset"] = 2**62
    return d, f"views[{v}]", f"views[{v}].offset = 2**62 (past its buffer)"


def huge_times(rng: random.Random, d: Doc) -> Result:
    """Valid but extreme: TENSILE must still return (NOTE [ Lane steps relative
    to the magnitude ]), the simulation stays finite."""
    kind = rng.choice(["flops-all", "flops-one", "duration-max", "duration-zero", "flops-cap"])
    if kind == "flops-all":
        for o in d["ops"]:
            o["flops"] = 2**62
    elif kind == "flops-one":
        d["ops"][_pick(rng, d, "ops")]["flops"] = 10**20
    elif kind == "flops-cap":
        i = _pick(rng, d, "ops")
        d["ops"][i]["flops"] = 10**20 + 1
        return d, f"ops[{i}].flops", f"ops[{i}].flops = 10**20 + 1"
    elif kind == "duration-max":
        for o in d["ops"]:
            o["duration_us"] = 86_400e6
    else:
        for o in d["ops"]:
            o["duration_us"] = 0
    return d, None, kind


def file_level(rng: random.Random, d: Doc) -> tuple[bytes, str | None, str]:
    """Whole-file damage; the field is a word of the one-line message."""
    kind = rng.choice(["empty", "truncated", "garbage", "latin1", "top", "schema", "gzip-ok",
                       "gzip-cut", "gzip-garbage", "extra-keys"])  # fmt: skip
    text = dump(d)
    if kind == "empty":
        return b"", "not valid JSON", "empty file"
    if kind == "truncated":
        return text[: rng.randrange(1, len(text) - 1)], "not valid JSON", "truncated JSON"
    if kind == "garbage":
        junk = bytes(rng.randrange(256) for _ in range(64))
        return b"\x00" + junk, "not valid JSON", "random bytes"  # never gzip's magic
    if kind == "latin1":
        return text.replace(b'"sgd"', b'"\xe9t\xe9"'), "not valid JSON", "Latin-1 bytes"
    if kind == "top":
        return rng.choice([b"[]", b"null", b"1", b'"x"', b"[{}]"]), "top level", "not an object"
    if kind == "schema":
        d["schema"] = rng.choice(["memplan.trace/2", "", None, 1, "memplan.plan/1"])
        return dump(d), "schema", f"schema = {d['schema']!r}"
    if kind == "extra-keys":  # unknown keys are ignored
        d["comment"] = "x"
        d["buffers"][0]["color"] = [1, 2]
        d["ops"][0]["note"] = {"a": None}
        return dump(d), None, "unknown keys"
    gz = gzip.compress(text, mtime=0)
    if kind == "gzip-ok":
        return gz, None, "gzip-compressed"
    if kind == "gzip-cut":
        return gz[: rng.randrange(2, len(gz) - 1)], "gzip", "truncated gzip"
    return gz[:10] + bytes(rng.randrange(256) for _ in range(40)), "gzip", "gzip of garbage"


CLASSES: dict[str, Callable[[random.Random, Doc], Any]] = {
    "bad_int": bad_int,
    "bad_dim": bad_dim,
    "bad_number": bad_number,
    "bad_bool": bad_bool,
    "bad_string": bad_string,
    "bad_enum": bad_enum,
    "bad_list": bad_list,
    "bad_object": bad_object,
    "deleted_key": deleted_key,
    "duplicate_id": duplicate_id,
    "dangling_view": dangling_view,
    "bad_freed_after": bad_freed_after,
    "deep_nesting": deep_nesting,
    "surrogate_name": surrogate_name,
    "sizes": sizes,
    "huge_times": huge_times,
    "file_level": file_level,
}


def mutants(base: Doc, seed: int, n: int) -> Iterator[Mutant]:
    """`n` mutants of `base`, round-robin over `CLASSES`, details from `seed`."""
    rng = random.Random(seed)
    names = list(CLASSES)
    for k in range(n):
        cls = names[k % len(names)]
        out, field, what = CLASSES[cls](rng, copy.deepcopy(base))
        data = out if isinstance(out, bytes) else dump(out)
        gz = cls != "file_level" and rng.random() < 0.1
        yield Mutant(cls, what, gzip.compress(data, mtime=0) if gz else data,
                     ".json.gz" if gz else ".json", field)  # fmt: skip
