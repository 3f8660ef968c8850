"""`memplan inspect TRACE`: what a captured iteration holds and where its peak is;
`memplan inspect SNAPSHOT.pickle [--trace TRACE]`: the allocated and reserved
peaks of a PyTorch memory snapshot, beside a trace's prediction."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

import numpy as np

from memplan.commands.machine import one_trace
from memplan.traces.errors import MemplanError
from memplan.traces.fields import printable
from memplan.traces.io import fingerprint
from memplan.traces.model import BUFFER_KINDS, Phase, Trace
from memplan.traces.optim import describe
from memplan.units import format_bytes, integer

if TYPE_CHECKING:
    from memplan.hwmodels.device import DeviceModel


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a trace (ops, bytes per kind, vanilla peak) or a PyTorch memory snapshot",
        description=(
            "Summarise a captured trace: ops per phase, buffers and bytes per kind, "
            "the vanilla (framework) peak and the op where it happens, the largest buffers. "
            "Given a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot() "
            "writes after _record_memory_history(), or snapshot.pickle of `memplan simulate "
            "--out`): the allocated and reserved peaks over its trace and at its end, and with "
            "--trace the trace's predicted peak beside them."
        ),
    )
    p.add_argument(
        "trace",
        help="trace file (.json or .json.gz), zoo:NAME for a shipped trace, or a memory "
        "snapshot (.pickle)",
    )
    p.add_argument(
        "--trace",
        dest="against",
        metavar="TRACE",
        help="with a snapshot: a trace whose vanilla peak and persistent bytes are printed "
        "beside the snapshot's",
    )
    p.add_argument(
        "--host",
        metavar="PROFILE",
        help="with a trace: a host's hardware profile (cpu-local, or a .toml path); the "
        "optimizer step of the update groups timed there with roofline latencies, as if it "
        "ran on the host (NOTE [ Update groups ] in traces/updates.py)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument(
        "--top",
        type=integer(0, 100_000),
        default=10,
        help="how many of the largest buffers to list",
    )
    p.set_defaults(func=run)


def summary(trace: Trace, top: int = 10, host: DeviceModel | None = None) -> dict:
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
        "target": None if trace.meta.target is None else trace.meta.target.to_json(),
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
        "update_groups": _update_groups(trace, host),
    }


def _update_groups(trace: Trace, host: DeviceModel | None) -> dict | None:
    """The optimizer step by parameter (NOTE [ Update groups ] in
    traces/updates.py): how many groups, and the one holding the most
    parameter and state bytes; with `host`, the seconds their ops take
    there. None for a step without optimizer ops."""
    from memplan.traces.updates import update_groups

    groups = update_groups(trace)
    if not groups:
        return None
    nbytes = trace.nbytes

    def size(bufs: tuple[int, ...]) -> int:
        return int(sum(int(nbytes[b]) for b in bufs))

    top = max(groups, key=lambda g: (size(g.params) + size(g.state), -g.ops[0]))
    out: dict = {
        "groups": len(groups),
        "largest": {
            "params": [trace.buffers[b].name for b in top.params],
            "param_bytes": size(top.params),
            "state_bytes": size(top.state),
            "grad_bytes": size(top.grads),
            "ops": len(top.ops),
        },
    }
    if host is not None:
        from memplan.hwmodels.device import TimeUnit

        d = host.op_durations(trace, TimeUnit.S)
        out["host"] = {
            "profile": host.hw.name,
            "latency": "roofline",
            "all_s": float(sum(d[list(g.ops)].sum() for g in groups)),
            "largest_s": float(d[list(top.ops)].sum()),
        }
    return out


def run(args: argparse.Namespace) -> int:
    if is_snapshot(args.trace):
        return run_snapshot(args)
    if args.against is not None:
        raise MemplanError(
            f"--trace {args.against!r}: for a snapshot (memplan inspect SNAPSHOT.pickle --trace "
            f"TRACE); {args.trace!r} is a trace"
        )
    host = None
    if args.host is not None:
        from memplan.hwmodels.device import DeviceModel
        from memplan.hwmodels.latency import Roofline
        from memplan.hwmodels.profile import load_hardware

        host = DeviceModel(load_hardware(args.host), Roofline())
    trace = one_trace(args.trace, "inspect")
    s = summary(trace, args.top, host)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(
        f"{printable(s['model'])}  batch {s['batch_size']}  "
        f"optimizer {printable(describe(s['optimizer'], s['optimizer_kwargs'])) or '-'}  "
        f"amp {s['amp']}  accumulate {s['accumulate']}  "
        f"captured on {printable(s['device'])}  ({s['fingerprint'][:12]})"
    )
    target = trace.meta.target
    if target is not None:
        print(f"target    {printable(target.describe())}: what its dispatch runs, emulated")
    elif trace.meta.device == "meta":
        print("target    none: meta's own dispatch (math attention, per-step RNN cells)")
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
    groups = s["update_groups"]
    if groups is not None:
        top = groups["largest"]
        names = ", ".join(printable(n) for n in top["params"][:3])
        more = f" and {len(top['params']) - 3} more" if len(top["params"]) > 3 else ""
        print(
            f"optimizer       {groups['groups']} update group(s); the largest updates "
            f"{names or '-'}{more}: {format_bytes(top['param_bytes'])} of parameters, "
            f"{format_bytes(top['state_bytes'])} of state, {top['ops']} ops"
        )
        if "host" in groups:
            h = groups["host"]
            print(
                f"  on the host   {printable(h['profile'])} (roofline): {h['all_s'] * 1e3:.1f} ms "
                f"for every group, {h['largest_s'] * 1e3:.1f} ms for the largest"
            )
    print()
    print(f"largest {len(s['largest_buffers'])} buffers:")
    for b in s["largest_buffers"]:
        print(
            f"  #{b['id']:<6}{format_bytes(b['nbytes']):>12}  {b['kind']:<16}{printable(b['name'])}"
        )
    return 0


# ---- PyTorch memory snapshots (sim/snapshot_read.py) ----------------------------------
def is_snapshot(spec: str) -> bool:
    """A memory snapshot, not a trace: named .pickle / .pkl, or a file that
    starts as a pickle does."""
    if spec.startswith("zoo:"):
        return False
    if spec.lower().endswith((".pickle", ".pkl")):
        return True
    try:
        with open(spec, "rb") as f:
            return f.read(1) == b"\x80"  # pickle protocol 2 and later
    except OSError:
        return False


def snapshot_summary(path: str, doc: dict, trace: Trace | None) -> dict:
    from memplan.sim.snapshot_read import device_peaks

    meta = doc.get("memplan")
    written = None
    if isinstance(meta, dict) and all(
        isinstance(meta.get(k), str) for k in ("hardware", "allocator")
    ):
        written = {"hardware": meta["hardware"], "allocator": meta["allocator"]}
    s: dict = {"snapshot": path, "memplan": written, "devices": []}
    for d in device_peaks(doc):
        row = d.to_dict()
        times = d.time_us[np.isfinite(d.time_us)]
        k = d.allocated_peak_entry
        at = d.time_us[k] if k >= 0 else np.nan
        row["allocated_peak_ms"] = float(at - times[0]) / 1e3 if len(times) and at == at else None
        s["devices"].append(row)
    if trace is not None:
        s["trace"] = {
            "model": trace.meta.model,
            "batch_size": trace.meta.batch_size,
            "fingerprint": fingerprint(trace),
            "vanilla_peak_bytes": trace.peak("framework")[0],
            "persistent_bytes": int(trace.nbytes[trace.persistent].sum()),
        }
    return s


def run_snapshot(args: argparse.Namespace) -> int:
    """`memplan inspect SNAPSHOT [--trace TRACE]`."""
    if args.host is not None:
        raise MemplanError(f"--host {args.host!r}: for a trace, not a memory snapshot")
    from memplan.sim.snapshot_read import read_snapshot

    trace = one_trace(args.against, "inspect") if args.against is not None else None
    s = snapshot_summary(args.trace, read_snapshot(args.trace), trace)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    devs = s["devices"]
    entries = sum(d["entries"] for d in devs)
    by = s["memplan"]
    print(
        f"{printable(args.trace)}: PyTorch memory snapshot, {len(devs)} device(s), {entries} "
        "trace entries"
        + (f" (memplan simulate on {printable(by['hardware'])}, allocator "
           f"{printable(by['allocator'])}: simulated time)" if by else "")
    )  # fmt: skip
    for d in devs:
        when = f"entry {d['allocated_peak_entry']}" if d["allocated_peak_entry"] >= 0 else "start"
        if d["allocated_peak_ms"] is not None:
            when += f", {d['allocated_peak_ms']:.3f} ms into the trace"
        print(f"\ndevice {d['device']}       {'allocated':>12}  {'reserved':>12}")
        print(f"  peak         {format_bytes(d['allocated_peak_bytes']):>12}  "
              f"{format_bytes(d['reserved_peak_bytes']):>12}   (allocated: {when})")  # fmt: skip
        print(f"  at the end   {format_bytes(d['allocated_end_bytes']):>12}  "
              f"{format_bytes(d['reserved_end_bytes']):>12}   ({d['segments']} segments)")  # fmt: skip
        acts = ", ".join(f"{n} {printable(str(a))}" for a, n in sorted(d["actions"].items()))
        print(f"  entries      {acts or 'none (no history recorded: the peaks are the end)'}")
        if not d["consistent"]:
            print("  note: the trace frees more than the end state can have held; "
                  "the levels before those frees are too low")  # fmt: skip
    t = s.get("trace")
    if t is not None and devs:
        d = max(devs, key=lambda d: d["allocated_peak_bytes"])
        print(f"\nagainst {printable(t['model'])} batch {t['batch_size']} "
              f"({t['fingerprint'][:12]}), device {d['device']}:")  # fmt: skip
        print(f"  {'':<16}{'snapshot':>12}  {'trace':>12}  snapshot / trace")
        for what, got, want in (
            ("allocated peak", d["allocated_peak_bytes"], t["vanilla_peak_bytes"]),
            ("at the end", d["allocated_end_bytes"], t["persistent_bytes"]),
        ):
            ratio = f"{got / want:.3f}" if want else "-"
            print(f"  {what:<16}{format_bytes(got):>12}  {format_bytes(want):>12}  {ratio}")
        print("  (trace: the vanilla peak and the persistent bytes -- params, optimizer "
              "state -- it predicts)")  # fmt: skip
    return 0
