"""The chaos soak: faults at seeded random points of real training runs, and the invariants
that must hold after every one.

    python -m benchmarks.chaos --faults 32 --seed 1 --per-run 10 --ack-timeout 3   # the suite's short schedule
    python -m benchmarks.chaos --faults 300 --seed 7 --out benchmarks/results/chaos-<date>
    python -m benchmarks.chaos --faults 30 --seed 1 --storage s3       # S3 on a moto server
    python -m benchmarks.chaos --faults 30 --seed 1 --plant lost-events  # a planted defect: must break

Runs real ``fit()`` calls (2 workers, gloo, DDP, a checkpoint every 4 steps, best 2 kept,
``FailureConfig(max_failures=-1)``) on a two-node Ray on this machine. The fault kinds are in
``chaos_schedule.KINDS``; the invariants in ``chaos_check``. Prints a table of the faults
injected and survived by kind and the invariants broken; exits 1 when any invariant broke.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

from benchmarks import chaos_road
from benchmarks.chaos_schedule import KINDS, checkpoint_steps, make_schedule
from benchmarks.chaos_soak import RunReport, Settings, Soak

#: Faults planned per run (one name): each run costs a driver's start, as a restart costs a group's.
PER_RUN = 8


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=30, help="how many faults to inject (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the schedule and the training loop")
    parser.add_argument(
        "--storage", choices=("local", "s3"), default="local", help="local disk, or S3 on a moto server"
    )
    parser.add_argument("--minutes", type=float, default=None, help="stop starting new runs after this long")
    parser.add_argument(
        "--kinds",
        default=None,
        help="comma-separated fault kinds (default: every kind this tree can inject that is not opt-in)",
    )
    parser.add_argument(
        "--plant",
        choices=("lose-file", chaos_road.LOST_EVENTS),
        default=None,
        help="a planted defect of the soak's own: a commit loses a file, or the driver acknowledges the events of a "
        "faulted connection without delivering them (what the event road's acknowledgements guard against)",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="let the event road's faults and the worker kills share runs (a worker dying before it noticed its "
        "connection broke takes its unacknowledged reports with it)",
    )
    parser.add_argument("--fail-fast", action="store_true", help="stop after the first run that breaks an invariant")
    parser.add_argument("--steps", type=int, default=Settings.steps, help="steps per run (default %(default)s)")
    parser.add_argument(
        "--per-run",
        type=int,
        default=PER_RUN,
        help="faults planned per run at most (default %(default)s; at most the checkpoints a run takes)",
    )
    parser.add_argument(
        "--ack-timeout",
        type=float,
        default=None,
        help="how long a worker waits for the event road's acknowledgement, in the drivers (default 15 s)",
    )
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write the table to OUT.json and OUT.md")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, runs) for a post-mortem")
    return parser.parse_args(argv)


def available_kinds() -> list[str]:
    """Every kind but the opt-in ones, less the event road's when this tree's event channel has
    no fault hook."""
    return [
        k for k, kind in KINDS.items() if not kind.opt_in and (chaos_road.available() or not k.startswith("event-"))
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the soak the options describe; print (and with ``--out`` write) its table; return the
    exit status: 1 when an invariant broke."""
    args = parse(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    kinds = args.kinds.split(",") if args.kinds else available_kinds()
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; choose from {sorted(KINDS)}")
    most = len(checkpoint_steps(args.steps, Settings.every)) - 1  # a storage fault strikes one checkpoint each
    if not 1 <= args.per_run <= most:
        raise SystemExit(
            f"--per-run {args.per_run}: between 1 and {most}, the checkpoints a run of --steps {args.steps} "
            "takes before its last (a storage fault strikes one each)"
        )
    if (
        args.plant == chaos_road.LOST_EVENTS or any(k.startswith("event-") for k in kinds)
    ) and not chaos_road.available():
        raise SystemExit(
            "the event-road faults and --plant lost-events need the event road's tap (trainers.testing), which this tree lacks"
        )
    settings = Settings(
        storage=args.storage,
        seed=args.seed,
        steps=args.steps,
        plant=args.plant,
        ack_timeout_s=args.ack_timeout,
    )
    schedule = make_schedule(
        args.faults,
        args.seed,
        kinds,
        steps=settings.steps,
        every=settings.every,
        per_run=args.per_run,
        overlap=args.overlap,
    )
    started, load, date = time.monotonic(), os.getloadavg()[0], datetime.datetime.now().isoformat(timespec="seconds")
    work = tempfile.mkdtemp(prefix="flowtrain-chaos-")
    print(
        f"chaos soak: {args.faults} faults of {len(set(kinds))} kinds in {len(schedule)} runs, seed {args.seed}, "
        f"{args.storage} storage; work folder {work}",
        flush=True,
    )
    reports: list[RunReport] = []
    setup_s = reference_s = 0.0
    try:
        with Soak(settings, work, say=lambda line: print(line, flush=True)) as soak:
            reference = soak.reference()
            setup_s, reference_s = time.monotonic() - started, soak.unit_s
            print(f"  the cluster and the fault-free run: {setup_s:.1f} s (the run: {reference_s:.1f} s)", flush=True)
            for plan in schedule:
                if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                    print(
                        f"  --minutes {args.minutes:g} reached: {len(schedule) - len(reports)} runs not started",
                        flush=True,
                    )
                    break
                reports.append(soak.run(plan, reference))
                if args.fail_fast and reports[-1].broken:
                    break
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    table = summarize(
        reports,
        schedule,
        args,
        date=date,
        wall_s=time.monotonic() - started,
        setup_s=setup_s,
        reference_s=reference_s,
        load=load,
    )
    print(markdown(table))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        (args.out.parent / f"{args.out.name}.json").write_text(json.dumps(table, indent=2) + "\n")
        (args.out.parent / f"{args.out.name}.md").write_text(markdown(table) + "\n")
    return 1 if table["invariants_broken"] else 0


def summarize(
    reports: list[RunReport],
    schedule: list,
    args: argparse.Namespace,
    *,
    date: str,
    wall_s: float,
    setup_s: float,
    reference_s: float,
    load: float,
) -> dict:
    """The soak's table: per kind, faults planned, injected (fired) and survived (fired in a
    segment that broke no invariant); the broken invariants; the wall time; the machine."""
    kinds: dict[str, dict[str, int]] = {}
    for plan in schedule:
        for fault in plan.faults:
            kinds.setdefault(
                fault.kind, {"planned": 0, "injected": 0, "survived": 0, "ranks_replaced": 0, "full_restarts": 0}
            )["planned"] += 1
    broken = []
    for report in reports:
        for segment, lines in report.segments:
            for fault in segment.fired:
                kinds[fault.kind]["injected"] += 1
                kinds[fault.kind]["survived"] += not lines
            for kind, restart in restarts_by_fault(segment):
                if restart.get("full_restart"):
                    kinds[kind]["full_restarts"] += 1
                else:
                    kinds[kind]["ranks_replaced"] += len(restart.get("replaced") or [])
            fired = ", ".join(f"{f.kind}@{f.step}" for f in segment.fired) or "none"
            broken += [
                {"run": segment.run, "segment": segment.index, "fired": fired, "invariant": line} for line in lines
            ]
    segments = [segment for report in reports for segment, _ in report.segments]
    return {
        "date": date,
        "machine": {
            "host": socket.gethostname(),
            "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "load_1m_at_start": round(load, 2),
            "python": platform.python_version(),
        },
        "command": "python -m benchmarks.chaos " + " ".join(args.argv),
        "seed": args.seed,
        "storage": args.storage,
        "plant": args.plant,
        "overlap": args.overlap,
        "runs": len(reports),
        "segments": len(segments),
        "restarts": sum(1 for s in segments for line in s.journal if line["e"] == "restart"),
        "kinds": dict(sorted(kinds.items())),
        "injected": sum(k["injected"] for k in kinds.values()),
        "survived": sum(k["survived"] for k in kinds.values()),
        "invariants_broken": len(broken),
        "broken": broken,
        "wall_s": round(wall_s, 1),
        "setup_s": round(setup_s, 1),
        "fault_free_run_s": round(reference_s, 1),
    }


def restarts_by_fault(segment: Any) -> list[tuple[str, dict]]:
    """Each restart of ``segment`` (the driver's journal) with the kind of the fault that caused
    it: the faults that restart the group, in the order they fired (by step), matched one to one
    with the restarts in the order they came; unmatched ones are left out."""
    made = [line for line in segment.journal if line["e"] == "restart"]
    causing = sorted((f for f in segment.fired if KINDS[f.kind].restarts), key=lambda f: f.step)
    return [(fault.kind, restart) for fault, restart in zip(causing, made, strict=False)]


def markdown(table: dict) -> str:
    """The table as markdown, with the broken invariants under it."""
    lines = [
        f"Chaos soak, {table['date']}, seed {table['seed']}, {table['storage']} storage"
        + (f", planted {table['plant']}" if table["plant"] else "")
        + (", faults may overlap" if table["overlap"] else "")
        + f"; {table['machine']['cores']} cores, load {table['machine']['load_1m_at_start']} at start",
        "",
        "| fault kind | planned | injected | survived | ranks replaced / full restarts | what it is |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, counts in table["kinds"].items():
        lines.append(
            f"| {name} | {counts['planned']} | {counts['injected']} | {counts['survived']} | "
            f"{counts.get('ranks_replaced', 0)} / {counts.get('full_restarts', 0)} | {KINDS[name].about} |"
        )
    replaced = sum(k.get("ranks_replaced", 0) for k in table["kinds"].values())
    full = sum(k.get("full_restarts", 0) for k in table["kinds"].values())
    lines += [
        f"| **all** | {sum(k['planned'] for k in table['kinds'].values())} | {table['injected']} | {table['survived']} "
        f"| {replaced} / {full} | |",
        "",
        f"Invariants broken: **{table['invariants_broken']}**. Runs {table['runs']}, segments {table['segments']}, "
        f"restarts {table['restarts']}; wall time {table['wall_s']:.0f} s, of which {table['setup_s']:.0f} s starting the "
        f"cluster and the fault-free run ({table['fault_free_run_s']:.0f} s: what a segment costs here without faults).",
    ]
    for item in table["broken"]:
        lines.append(f"- {item['run']} segment {item['segment']} (fired: {item['fired']}): {item['invariant']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
