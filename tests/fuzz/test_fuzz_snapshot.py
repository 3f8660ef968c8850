"""Seeded mutants of a small PyTorch memory snapshot through `memplan
inspect`, in-process with a time limit each (NOTE [ Reading a snapshot ]):
no traceback, no hang; every broken file -- not a pickle, truncated, bytes
flipped, a pickle that names a class or function, a field of the wrong type
-- is one line naming the file (and the field, where one is wrong) with exit
2; valid variants (extra keys, old formats) run to exit 0 with whole output.
No mutant's code runs: a marker file would show it."""

from __future__ import annotations

import pickle
import random
from collections import Counter
from pathlib import Path

from tests.fuzz.harness import assert_clean, assert_rejected, assert_whole, run_cli
from tests.sim.test_snapshot_read import real_run

TIMEOUT_S = 10.0


class _Runs:
    """Unpickled plainly, calls `fn(*args)`."""

    def __init__(self, fn, *args):
        self.call = (fn, args)

    def __reduce__(self):
        return self.call


def exploits(marker: Path) -> list[bytes]:
    """Pickles that name code: each creates `marker` if unpickled plainly."""
    import os

    touch = f"open({str(marker)!r}, 'w').close()"
    return [
        pickle.dumps(_Runs(os.system, f"touch {marker}"), protocol=0),  # GLOBAL, REDUCE
        pickle.dumps({"segments": [_Runs(exec, touch)]}, protocol=2),
        pickle.dumps({"segments": [], "x": _Runs(exec, touch)}, protocol=4),  # STACK_GLOBAL
        f"(S{touch!r}\nibuiltins\nexec\n.".encode(),  # INST
    ]


def _field_mutants(rng: random.Random) -> tuple[dict, str]:
    """A snapshot with one field of a wrong type or range, and its path."""
    doc = real_run()
    bad = rng.choice([None, "1", 1.5, -1, 2**64, [], {}, True])
    k = rng.randrange(len(doc["device_traces"][0]))
    entry = doc["device_traces"][0][k]
    where = rng.choice(["size", "addr", "action", "time_us"])
    if where == "action":
        bad = rng.choice([None, 1, [], {}])
    if where == "time_us":
        bad = rng.choice([None, "1", [], float("nan"), float("inf")])
    if where == "addr" and bad == 1.5:
        bad = "x"
    entry[where] = bad
    return doc, f"device_traces[0][{k}].{where}"


def _segment_mutants(rng: random.Random) -> tuple[dict, str]:
    doc = real_run()
    i = rng.randrange(len(doc["segments"]))
    key = rng.choice(["address", "total_size", "blocks", "device"])
    doc["segments"][i][key] = rng.choice([None, "0", -5, 1.0, [1] if key != "blocks" else 7])
    return doc, f"segments[{i}].{key}"


def mutants(seed: int, n: int, marker: Path):
    """(name, bytes, words the rejection must name; None: valid) per mutant."""
    rng = random.Random(seed)
    good = pickle.dumps(real_run(), protocol=4)
    for k in range(n):
        cls = k % 7
        if cls == 0:
            cut = rng.randrange(0, len(good))
            yield "truncated", good[:cut], ["not a readable pickle"]
        elif cls == 1:
            data = bytearray(good)
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            yield "flipped", bytes(data), []  # may still read: exit 0 or 2, never a traceback
        elif cls == 2:
            yield "code", rng.choice(exploits(marker)), ["names the python object"]
        elif cls == 3:
            doc, where = _field_mutants(rng)
            yield "field", pickle.dumps(doc, protocol=rng.choice([2, 4, 5])), [where]
        elif cls == 4:
            doc, where = _segment_mutants(rng)
            yield "segment", pickle.dumps(doc, protocol=4), [where]
        elif cls == 5:
            junk = rng.choice(
                [b"", b"{}", b"segments", bytes(rng.randrange(256) for _ in range(40))]
            )
            yield "junk", junk, [] if junk.startswith(b"\x80") else ["not a readable pickle"]
        else:
            doc = real_run()
            variant = rng.choice(["extra keys", "old list", "no trace", "empty"])
            if variant == "extra keys":
                doc["device_traces"][0][0]["compile_context"] = "N/A"
                doc["segments"][0]["blocks"][0]["history"] = [{"real_size": 1}]
                doc["external_annotations"] = [{"stage": "x"}]
            elif variant == "old list":
                doc = doc["segments"]
            elif variant == "no trace":
                del doc["device_traces"]
            else:
                doc = {"segments": [], "device_traces": [[]]}
            yield f"valid ({variant})", pickle.dumps(doc, protocol=rng.choice([2, 3, 4, 5])), None


def test_snapshot_mutants(tmp_path):
    marker = tmp_path / "RAN"
    seen: Counter = Counter()
    failures = []
    for k, (cls, data, names) in enumerate(mutants(seed=18, n=70, marker=marker)):
        path = tmp_path / f"m{k}.pickle"
        path.write_bytes(data)
        o = run_cli(["inspect", str(path)], TIMEOUT_S)
        try:
            if names is None:
                assert_whole(o, cls)
            elif cls == "flipped" or (cls == "junk" and not names):
                assert_clean(o)
                if o.code != 0:
                    assert_rejected(o, path.name)
            else:
                assert_rejected(o, path.name, *names)
        except AssertionError as e:
            failures.append(f"mutant {k} ({cls}): {e}")
        seen[cls.split(" ")[0]] += 1
    assert not failures, "\n".join(failures[:5])
    assert not marker.exists(), "a mutant's code ran"
    assert set(seen) == {"truncated", "flipped", "code", "field", "segment", "junk", "valid"}
