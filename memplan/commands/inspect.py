"""`memplan inspect TRACE`: what a captured iteration holds and where its peak is."""

from __future__ import annotations

import argparse
import json

from memplan.commands.machine import one_trace
from memplan.traces.fields import printable
from memplan.traces.io import fingerprint
from memplan.traces.model import BUFFER_KINDS, Phase, Trace
from memplan.traces.optim import describe
from memplan.units import format_bytes, integer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a trace: ops per phase, bytes per buffer kind, vanilla peak",
        description=(
            "Summarise a captured trace: ops per phase, buffers and bytes per kind, "
            "the vanilla (framework) peak and the op where it happens, the largest buffers."
        ),
    )
    p.add_argument("trace", help="trace file (.json or .json.gz), or zoo:NAME for a shipped trace")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument(
        "--top",
        type=integer(0, 100_000),
        default=10,
        help="how many of the largest buffers to list",
    )
    p.set_defaults(func=run)


def summary(trace: Trace, top: int = 10) -> dict:
    peak, peak_op = trace.peak("framework")
    live_peak, live_op = trace.peak("liveness")
    by_kind = trace.bytes_by_kind()
    counts = {k.value: 0 for k in BUFFER_KINDS}
    for b in trace.buffers:
        counts[b.kind.value] += 1
    largest = sorted(trace.buffers, key=lambda b: (-b.nbytes, b.id))[:top]
    op = trace.ops[peak_op] if peak_op >= 0 else None
    return {
        "model": trace.meta.model,
        "batch_size": trace.meta.batch_size,
        "optimizer": trace.meta.optimizer,
        "optimizer_kwargs": trace.meta.optimizer_kwargs,
        "amp": trace.meta.amp.value,
        "accumulate": trace.meta.accumulate,
        "device": trace.meta.device,
        "fingerprint": fingerprint(trace),
        "ops": trace.n_ops,
        "ops_by_phase": {p.value: n for p, n in trace.ops_by_phase().items()},
        "buffers": trace.n_buffers,
        "buffers_by_kind": counts,
        "bytes_by_kind": {k.value: v for k, v in by_kind.items()},
        "peak_bytes": peak,
        "peak_op": peak_op,
        "peak_op_target": op.target if op else None,
        "peak_op_phase": op.phase.value if op else None,
        "liveness_peak_bytes": live_peak,
        "liveness_peak_op": live_op,
        "largest_buffers": [
            {"id": b.id, "nbytes": b.nbytes, "kind": b.kind.value, "name": b.name} for b in largest
        ],
    }


def run(args: argparse.Namespace) -> int:
    trace = one_trace(args.trace, "inspect")
    s = summary(trace, args.top)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(
        f"{printable(s['model'])}  batch {s['batch_size']}  "
        f"optimizer {printable(describe(s['optimizer'], s['optimizer_kwargs'])) or '-'}  "
        f"amp {s['amp']}  accumulate {s['accumulate']}  "
        f"captured on {printable(s['device'])}  ({s['fingerprint'][:12]})"
    )
    phases = "  ".join(f"{p.value} {s['ops_by_phase'][p.value]}" for p in Phase)
    print(f"ops       {s['ops']:>7}   ({phases})")
    print(f"buffers   {s['buffers']:>7}")
    print()
    print(f"  {'kind':<16}{'buffers':>8}{'bytes':>16}")
    for k in BUFFER_KINDS:
        n = s["buffers_by_kind"][k.value]
        if n:
            print(f"  {k.value:<16}{n:>8}{format_bytes(s['bytes_by_kind'][k.value]):>16}")
    print()
    print(
        f"vanilla peak    {format_bytes(s['peak_bytes']):>12}  at op {s['peak_op']} "
        f"({printable(str(s['peak_op_target']))}, {s['peak_op_phase']})"
    )
    print(
        f"liveness peak   {format_bytes(s['liveness_peak_bytes']):>12}  at op "
        f"{s['liveness_peak_op']}  (every buffer freed right after its last access)"
    )
    print()
    print(f"largest {len(s['largest_buffers'])} buffers:")
    for b in s["largest_buffers"]:
        print(
            f"  #{b['id']:<6}{format_bytes(b['nbytes']):>12}  {b['kind']:<16}{printable(b['name'])}"
        )
    return 0
