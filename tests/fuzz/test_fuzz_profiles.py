"""Issue 17, profiles: seeded mutants of a shipped hardware profile through
`memplan simulate --gpu PATH` and `memplan hw show PATH`, in-process with a
time limit each. Zero tracebacks, zero hangs; a bad profile -- absurd but
finite figures included (NOTE [ Profile sanity ranges ] in hwmodels/profile.py,
restated here as the test's own table) -- is one line naming the file and
the field; a valid variant runs to exit 0 with whole output."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from memplan.hwmodels.profile import PROFILES_DIR
from memplan.traces import io, synthetic

from tests.fuzz.harness import assert_rejected, assert_whole, run_cli

TIMEOUT_S = 20.0
BASE = (PROFILES_DIR / "a100-pcie-40gb.toml").read_text()
# field -> (lowest, highest) allowed, integer or not (the NOTE's table)
RANGES: dict[str, tuple[float, float, bool]] = {
    "memory_bytes": (2**20, 64 * 2**40, True),
    "h2d_bytes_per_s": (1e6, 1e13, False),
    "d2h_bytes_per_s": (1e6, 1e13, False),
    "mem_bw_bytes_per_s": (1e8, 1e14, False),
    "transfer_fixed_s": (0.0, 1.0, False),
    "launch_overhead_s": (0.0, 1.0, False),
    "copy_engines": (1, 64, True),
    "h2d_duplex_factor": (0.01, 1.0, False),
}
TABLES = {"peak_flops": (1e6, 1e18), "roofline_efficiency": (1e-3, 1e3)}
DTYPES = ("float64", "float32", "tfloat32", "float16", "bfloat16", "int8")
NOT_NUMBERS = ['"1"', "true", "[1]", "{ a = 1 }", "1979-05-27", '""', "[]", "12:00:00"]
NON_FINITE = ["nan", "inf", "-inf", "+nan"]
Mutant = tuple[str, str, bytes, str | None]  # class, what, file bytes, field (None: valid)


def _split(text: str) -> tuple[str, str]:
    """(top-level lines, the tables after them)."""
    i = text.index("\n[")
    return text[:i], text[i:]


def _set(text: str, key: str, value: str) -> str:
    top, rest = _split(text)
    lines = [f"{key} = {value}" if ln.startswith(f"{key} = ") else ln for ln in top.splitlines()]
    return "\n".join(lines) + rest


def _drop(text: str, key: str) -> str:
    top, rest = _split(text)
    return "\n".join(ln for ln in top.splitlines() if not ln.startswith(f"{key} = ")) + rest


def _table(text: str, table: str, key: str, value: str | None) -> str:
    """Set (None: drop) `key` in `[table]`, adding the table if absent."""
    head = f"[{table}]\n"
    if head not in text:
        return text + f"\n{head}" + (f"{key} = {value}\n" if value is not None else "")
    before, after = text.split(head, 1)
    body, sep, tail = after.partition("\n[")
    lines = [ln for ln in body.splitlines() if not ln.startswith(f"{key} = ")]
    if value is not None:
        lines.append(f"{key} = {value}")
    return before + head + "\n".join(lines) + "\n" + sep + tail


def _fmt(x: float, integer: bool) -> str:
    return str(int(x)) if integer else repr(float(x))


def m_out_of_range(rng: random.Random) -> tuple[str, str, str | None]:
    key = rng.choice(list(RANGES))
    lo, hi, integer = RANGES[key]
    if integer:  # Python integers: past any float
        v = rng.choice([int(lo) - rng.randrange(1, 10**6), int(hi) + rng.randrange(1, 10**30)])
    else:
        v = rng.choice(
            [lo - max(abs(lo), 1) * rng.uniform(1e-3, 1), hi * rng.uniform(1.001, 1e290)]
        )
    if key in ("h2d_bytes_per_s", "launch_overhead_s") and rng.random() < 0.5:
        v = 1e-300 if key == "h2d_bytes_per_s" else 1e300  # the two
    return _set(BASE, key, _fmt(v, integer)), f"{key}={v:g}", key


def m_non_finite(rng):
    key = rng.choice(list(RANGES))
    v = rng.choice(NON_FINITE)
    return _set(BASE, key, v), f"{key}={v}", key


def m_wrong_type(rng):
    key = rng.choice(list(RANGES))
    v = rng.choice(NOT_NUMBERS + (["4.0e10", "2.0", "1e3"] if RANGES[key][2] else []))
    return _set(BASE, key, v), f"{key}={v}", key


def m_missing(rng):
    key = rng.choice(list(RANGES))
    return _drop(BASE, key), f"no {key}", key


def m_unknown(rng):
    key = rng.choice(["h2d_bw", "memory", "Memory_bytes", "lanes", "x"])
    top, rest = _split(BASE)
    return f"{top}\n{key} = 1{rest}", f"unknown {key}", key


def m_peak_flops(rng):
    kind = rng.choice(["range", "type", "dtype", "empty", "missing"])
    if kind == "missing":
        text = BASE.replace("[peak_flops]", "[peak_flops_x]")
        return text, "no [peak_flops]", "peak_flops"
    if kind == "empty":
        before, after = BASE.split("[peak_flops]\n")
        top, rest = _split(before + after[after.index("\n[") + 1 :])
        return top + "\npeak_flops = {}" + rest, "peak_flops = {}", "peak_flops"
    if kind == "dtype":
        key = rng.choice(["fp32", "float", "int4", "Float32"])
        return _table(BASE, "peak_flops", key, "1e12"), f"dtype {key}", key
    lo, hi = TABLES["peak_flops"]
    key = rng.choice(DTYPES)
    v = rng.choice([repr(lo / 10), repr(hi * 10), "0", "-1e12", *NON_FINITE, *NOT_NUMBERS])
    return _table(BASE, "peak_flops", key, v), f"peak_flops.{key}={v}", f"peak_flops.{key}"


def m_efficiency(rng):
    lo, hi = TABLES["roofline_efficiency"]
    v = rng.choice([repr(lo / 2), repr(hi * 2), "0", *NON_FINITE, *NOT_NUMBERS])
    text = _table(BASE, "roofline_efficiency", "conv", v)
    text = _table(text, "source", "roofline_efficiency", '"a test"')
    return text, f"roofline_efficiency.conv={v}", "roofline_efficiency.conv"


def m_source(rng):
    key = rng.choice(["memory_bytes", "peak_flops", "launch_overhead_s"])
    kind = rng.choice(["missing", "empty", "type", "table"])
    if kind == "table":
        return BASE.replace("[source]", "[sources]"), "no [source]", "source"
    value = {"missing": None, "empty": '"  "', "type": rng.choice(["1", "true", "[]"])}[kind]
    return _table(BASE, "source", key, value), f"source.{key} {kind}", f"source.{key}"


def m_names(rng):
    key, v = rng.choice([("name", '""'), ("name", "1"), ("name", "[]"), ("description", "1")])
    return _set(BASE, key, v), f"{key}={v}", key


def m_bytes(rng):
    kind = rng.choice(["truncated", "garbage", "utf8", "deep", "duplicate", "empty"])
    text = {
        "truncated": BASE[: rng.randrange(40, len(BASE))] + "\n= [",  # a line with no key
        "garbage": "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(80)),
        "utf8": None,
        "deep": "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
        "duplicate": BASE.replace("copy_engines = 2", "copy_engines = 2\ncopy_engines = 3"),
        "empty": "",
    }[kind]
    if kind == "utf8":
        return BASE.encode()[:200] + b"\xff\xfe" + BASE.encode()[200:], "bad UTF-8", ""
    return text, f"{kind} file", ""


def m_valid(rng):
    text = BASE
    for key, (lo, hi, integer) in RANGES.items():
        if rng.random() < 0.5:  # anywhere in the range, edges included
            v = rng.choice([lo, hi, lo + (hi - lo) * rng.random()])
            text = _set(text, key, _fmt(v, integer))
    if rng.random() < 0.5:
        text = _table(text, "peak_flops", "float32", repr(rng.choice(TABLES["peak_flops"])))
    if rng.random() < 0.3:
        text = "# a comment\n" + text.replace("[source]", '[source]\nextra = "more words ✓"')
    if rng.random() < 0.3:
        text = _set(text, "name", '"Zoë ✓ 模型"')
    return text, "in range", None


CLASSES: dict[str, Callable[[random.Random], tuple[str | bytes, str, str | None]]] = {
    name.removeprefix("m_"): fn for name, fn in globals().items() if name.startswith("m_")
}


def mutants(seed: int, n: int) -> Iterator[Mutant]:
    rng = random.Random(seed)
    names = list(CLASSES)
    for k in range(n):
        cls = names[k % len(names)]
        text, what, field = CLASSES[cls](rng)
        yield cls, what, text if isinstance(text, bytes) else text.encode(), field


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("fuzz_profiles") / "chain.json"
    io.save(synthetic.chain(3), p)
    return p


def run_mutants(tmp_path: Path, trace_path: Path, seed: int, n: int) -> Counter:
    seen: Counter = Counter()
    failures: list[str] = []
    for k, (cls, what, data, field) in enumerate(mutants(seed, n)):
        path = tmp_path / f"gpu{seed}_{k}.toml"
        path.write_bytes(data)
        argvs = [
            ["simulate", str(trace_path), "--gpu", str(path), "--iterations", "1"],
            ["hw", "show", str(path)],
        ]
        if field is not None:
            argvs = [argvs[k % 2]]
        for argv in argvs:
            o = run_cli(argv, TIMEOUT_S)
            try:
                if field is None:
                    assert_whole(o, f"profile {what}")
                else:
                    assert_rejected(o, path.name, field)
            except AssertionError as e:
                failures.append(f"mutant {k} ({cls}: {what}): {e}")
        seen[cls] += 1
        path.unlink()
    assert not failures, f"{len(failures)} failures, the first:\n" + "\n\n".join(failures[:3])
    return seen


def test_100_profile_mutants(tmp_path, trace_path):
    n = len(CLASSES) * 10
    seen = run_mutants(tmp_path, trace_path, seed=17, n=n)
    assert n >= 100 and set(seen) == set(CLASSES) and min(seen.values()) == 10


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_more_profile_mutants(tmp_path, trace_path, seed):
    run_mutants(tmp_path, trace_path, seed=seed, n=len(CLASSES) * 50)
