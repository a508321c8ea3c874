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
import random
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

from benchmarks import chaos_hosts, chaos_road
from benchmarks.chaos_hosts import HostSettings, HostSoak, host_kinds
from benchmarks.chaos_schedule import HOST, KINDS, Fault, RunPlan, checkpoint_steps, make_schedule
from benchmarks.chaos_soak import RunReport, Settings, Soak
from benchmarks.hosts import RayHosts

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
    hosts = parser.add_argument_group("the soak on hosts with their own addresses (benchmarks.chaos_hosts)")
    hosts.add_argument(
        "--hosts",
        type=int,
        default=None,
        help="run on namespace hosts: N hosts of one CPU for the workers (world size N-1, one spare), a head "
        "host with 0 CPUs for Ray's head and the drivers, a store host with S3; the host kinds join the old ones",
    )
    hosts.add_argument(
        "--detect-s",
        type=float,
        default=HostSettings.detect_s,
        help="the bound a partitioned rank is to be found within: a link blip is shorter, a link cut longer "
        "(default %(default)s)",
    )
    hosts.add_argument(
        "--partition-max-s",
        type=float,
        default=HostSettings.partition_max_s,
        help="the longest a cut or dead host waits for its ranks to be replaced before it is healed all the same "
        "(default %(default)s)",
    )
    hosts.add_argument(
        "--baseline",
        action="store_true",
        help="instead of a schedule, the issue's cases one run each: rank 1's host cut until replaced at a step "
        "drawn by --seed, a 2 s link blip and a 200 ms slower link from step 8 on (use with --steps 30)",
    )
    hosts.add_argument("--inside", type=pathlib.Path, default=None, help=argparse.SUPPRESS)
    hosts.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def baseline_plans(seed: int, steps: int) -> list[RunPlan]:
    """The issue's headline cases on rank 1's host: a cut until the rank is replaced, at a step
    drawn by ``seed`` (in the middle two thirds of ``steps``), then from step 8 on a 2 s blip and
    200 ms more on everything the host sends until the run ends."""
    cases = [
        ("partition", random.Random(seed).randint(steps // 6, steps - steps // 6), 0.0, 0.0),
        ("link-blip", 8, 2.0, 0.0),
        ("link-slow", 8, 24 * 3600.0, 0.2),
    ]
    return [
        RunPlan(name=f"baseline-{kind}", wrapped=False, faults=(Fault(i, kind, step, 1, hold_s=hold, amount=amount),))
        for i, (kind, step, hold, amount) in enumerate(cases)
    ]


def available_kinds(hosts: bool = False) -> list[str]:
    """Every kind but the opt-in ones, less the event road's when this tree's event channel has
    no fault hook; on hosts (``chaos_hosts.host_kinds``), or else less the host kinds."""
    kinds = host_kinds() if hosts else [k for k, kind in KINDS.items() if not kind.opt_in and kind.by != HOST]
    return [k for k in kinds if chaos_road.available() or not k.startswith("event-")]


def main(argv: list[str] | None = None) -> int:
    """Run the soak the options describe; print (and with ``--out`` write) its table; return the
    exit status: 1 when an invariant broke."""
    args = parse(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    on_hosts = args.hosts is not None
    if on_hosts and args.hosts < 2:
        raise SystemExit(f"--hosts {args.hosts}: at least 2 (a worker and a spare)")
    kinds = args.kinds.split(",") if args.kinds else available_kinds(hosts=on_hosts)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; choose from {sorted(KINDS)}")
    if not on_hosts and any(KINDS[k].by == HOST for k in kinds):
        raise SystemExit(f"--kinds: {[k for k in kinds if KINDS[k].by == HOST]} need --hosts")
    if on_hosts and "node-loss" in kinds:
        raise SystemExit("--kinds: node-loss removes a node of a one-machine Ray; on --hosts the host kinds do")
    most = len(checkpoint_steps(args.steps, Settings.every)) - 1  # a storage fault strikes one checkpoint each
    if not args.baseline and not 1 <= args.per_run <= most:
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
    if on_hosts and args.inside is None:
        return hosts_main(args)
    settings = Settings(
        storage="s3" if on_hosts else args.storage,
        seed=args.seed,
        steps=args.steps,
        plant=args.plant,
        ack_timeout_s=args.ack_timeout,
        world_size=args.hosts - 1 if on_hosts else Settings.world_size,
    )
    if args.baseline:
        schedule = baseline_plans(args.seed, args.steps)
    else:
        schedule = make_schedule(
            args.faults,
            args.seed,
            kinds,
            steps=settings.steps,
            every=settings.every,
            per_run=args.per_run,
            world_size=settings.world_size,
            overlap=args.overlap,
            detect_s=args.detect_s,
        )
    started, load, date = time.monotonic(), os.getloadavg()[0], datetime.datetime.now().isoformat(timespec="seconds")
    work = str(args.inside) if on_hosts else tempfile.mkdtemp(prefix="flowtrain-chaos-")
    planned = sum(len(plan.faults) for plan in schedule)
    lines = sys.stdout
    if on_hosts:  # Ray prints to every driver's stdout what it says of a dead raylet (its log's tail): to stderr
        lines, sys.stdout = os.fdopen(os.dup(1), "w", buffering=1), sys.stderr

    def say(line: str) -> None:
        print(line, file=lines, flush=True)

    say(
        f"chaos soak: {planned} faults of {len({f.kind for p in schedule for f in p.faults})} kinds in "
        f"{len(schedule)} runs, seed {args.seed}, {settings.storage} storage"
        + (f", {args.hosts} worker hosts (world size {settings.world_size})" if on_hosts else "")
        + f"; work folder {work}"
    )
    reports: list[RunReport] = []
    setup_s = reference_s = 0.0
    soak: Soak
    if on_hosts:
        cluster = RayHosts.from_json(json.loads((args.inside / "cluster.json").read_text()))
        host_settings = HostSettings(hosts=args.hosts, detect_s=args.detect_s, partition_max_s=args.partition_max_s)
        soak = HostSoak(settings, work, cluster, args.endpoint, host_settings, say=say)
    else:
        soak = Soak(settings, work, say=say)
    try:
        with soak:
            reference = soak.reference()
            setup_s, reference_s = time.monotonic() - started, soak.unit_s
            say(f"  the cluster and the fault-free run: {setup_s:.1f} s (the run: {reference_s:.1f} s)")
            for plan in schedule:
                if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                    say(f"  --minutes {args.minutes:g} reached: {len(schedule) - len(reports)} runs not started")
                    break
                reports.append(soak.run(plan, reference))
                if args.fail_fast and reports[-1].broken:
                    break
    finally:
        if not args.keep and not on_hosts:
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
        step_s=soak.step_s,
    )
    if on_hosts:  # the outer process adds the teardown, prints and writes the table
        (args.inside / "table.json").write_text(json.dumps(table, indent=2) + "\n")
        return 0
    write(table, args.out)
    return 1 if table["invariants_broken"] else 0


def write(table: dict, out: pathlib.Path | None) -> None:
    """Print the table; with ``out``, write it to OUT.json and OUT.md."""
    print(markdown(table))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        (out.parent / f"{out.name}.json").write_text(json.dumps(table, indent=2) + "\n")
        (out.parent / f"{out.name}.md").write_text(markdown(table) + "\n")


def hosts_main(args: argparse.Namespace) -> int:
    """``--hosts``: build the hosts, run the soak on the head host, tear them down, and add to its
    table what was left behind (a broken invariant)."""
    started = time.monotonic()
    inner_argv = [a for a in args.argv if a != "--keep"]
    table, left, work = chaos_hosts.outer(args, inner_argv)
    try:
        if table is None:
            print(f"the soak on the head host wrote no table (work folder {work})", flush=True)
            return 1
        table["wall_s"] = round(time.monotonic() - started, 1)
        table["command"] = "python -m benchmarks.chaos " + " ".join(args.argv)
        table["left_behind"] = left
        if left:
            table["broken"].append(
                {"run": "teardown", "segment": 0, "fired": "", "invariant": f"left behind: {', '.join(left)}"}
            )
            table["invariants_broken"] += 1
        write(table, args.out)
        return 1 if table["invariants_broken"] else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work folder kept: {work}")


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
    step_s: float = 0.0,
) -> dict:
    """The soak's table: per kind, faults planned, injected (fired) and survived (fired in a
    segment that broke no invariant), the restarts they caused and how (ranks replaced or every
    worker restarted), and the wall time each cost its run (``chaos_check.time_lost``); the
    broken invariants; the wall time; the machine."""
    kinds: dict[str, dict[str, Any]] = {}
    for plan in schedule:
        for fault in plan.faults:
            kinds.setdefault(
                fault.kind,
                {
                    "planned": 0,
                    "injected": 0,
                    "survived": 0,
                    "restarts": 0,
                    "ranks_replaced": 0,
                    "full_restarts": 0,
                    "lost_s": [],
                    "restart_after_s": [],
                },
            )["planned"] += 1
    broken = []
    unexplained = 0
    for report in reports:
        for segment, lines in report.segments:
            for fault in segment.fired:
                kinds[fault.kind]["injected"] += 1
                kinds[fault.kind]["survived"] += not lines
                lost = report.lost.get(fault.id)
                if lost is not None:
                    kinds[fault.kind]["lost_s"].append(lost)
            fired = ", ".join(f"{f.kind}@{f.step}" for f in segment.fired) or "none"
            broken += [
                {"run": segment.run, "segment": segment.index, "fired": fired, "invariant": line} for line in lines
            ]
        for kind, restart in report.restarts:
            if kind is None:
                unexplained += 1
                continue
            kinds[kind]["restarts"] += 1
            kinds[kind]["restart_after_s"].append(restart["after_s"])
            if restart.get("full_restart"):
                kinds[kind]["full_restarts"] += 1
            else:
                kinds[kind]["ranks_replaced"] += len(restart.get("replaced") or [])
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
        "storage": "s3" if args.hosts else args.storage,
        "plant": args.plant,
        "overlap": args.overlap,
        "hosts": args.hosts,
        "detect_s": args.detect_s if args.hosts else None,
        "baseline": bool(args.hosts and args.baseline),
        "runs": len(reports),
        "segments": len(segments),
        "restarts": sum(1 for s in segments for line in s.journal if line["e"] == "restart"),
        "restarts_without_a_fault": unexplained,
        "kinds": dict(sorted(kinds.items())),
        "injected": sum(k["injected"] for k in kinds.values()),
        "survived": sum(k["survived"] for k in kinds.values()),
        "invariants_broken": len(broken),
        "broken": broken,
        "wall_s": round(wall_s, 1),
        "setup_s": round(setup_s, 1),
        "fault_free_run_s": round(reference_s, 1),
        "fault_free_step_s": round(step_s, 3),
        "runs_wall_s": [
            {
                "run": report.plan.name,
                "fired": [f"{f.kind}@{f.step}" for s, _ in report.segments for f in s.fired],
                "wall_s": round(sum(s.seconds for s, _ in report.segments), 1),
                "restarts": len(report.restarts),
            }
            for report in reports
        ],
    }


def lost_figure(values: list[float]) -> str:
    """A kind's time lost per fault: the median and the most, in seconds."""
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.1f} ({ordered[-1]:.1f})"


def markdown(table: dict) -> str:
    """The table as markdown, with the broken invariants under it."""
    on_hosts = table.get("hosts") is not None
    lines = [
        f"Chaos soak, {table['date']}, seed {table['seed']}, {table['storage']} storage"
        + (
            f", {table['hosts']} worker hosts (namespaces; Ray's default health checks; detection bound "
            f"{table['detect_s']:g} s)"
            if on_hosts
            else ""
        )
        + (f", planted {table['plant']}" if table["plant"] else "")
        + (", faults may overlap" if table["overlap"] else "")
        + f"; {table['machine']['cores']} cores, load {table['machine']['load_1m_at_start']} at start",
        "",
        "| fault kind | planned | injected | survived | restarts | ranks replaced / full restarts "
        "| restart after the strike, s: median (most) | time lost per fault, s: median (most) | what it is |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, counts in table["kinds"].items():
        lines.append(
            f"| {name} | {counts['planned']} | {counts['injected']} | {counts['survived']} | "
            f"{counts.get('restarts', '-')} | {counts.get('ranks_replaced', 0)} / {counts.get('full_restarts', 0)} | "
            f"{lost_figure(counts.get('restart_after_s', []))} | {lost_figure(counts.get('lost_s', []))} | "
            f"{KINDS[name].about} |"
        )
    replaced = sum(k.get("ranks_replaced", 0) for k in table["kinds"].values())
    full = sum(k.get("full_restarts", 0) for k in table["kinds"].values())
    lines += [
        f"| **all** | {sum(k['planned'] for k in table['kinds'].values())} | {table['injected']} | {table['survived']} "
        f"| {table['restarts']} | {replaced} / {full} | | | |",
        "",
        f"Invariants broken: **{table['invariants_broken']}**. Runs {table['runs']}, segments {table['segments']}, "
        f"restarts {table['restarts']}; wall time {table['wall_s']:.0f} s, of which {table['setup_s']:.0f} s starting the "
        f"cluster and the fault-free run ({table['fault_free_run_s']:.0f} s: what a segment costs here without faults"
        + (f"; a step {table['fault_free_step_s']:.2f} s" if table.get("fault_free_step_s") else "")
        + ").",
    ]
    if on_hosts:
        lines.append(
            "Time lost per fault: from the strike to the run's first commit past the step it had reached, less a "
            "fault-free step; faults that overlap share their stall."
        )
    if table.get("baseline"):
        lines += [
            "",
            "| run (rank 1's host, kind@step) | wall time, s | against the fault-free run | restarts |",
            "| --- | --- | --- | --- |",
            f"| fault-free | {table['fault_free_run_s']:.1f} | | 0 |",
        ]
        for run in table["runs_wall_s"]:
            lines.append(
                f"| {', '.join(run['fired'])} | {run['wall_s']:.1f} | {run['wall_s'] - table['fault_free_run_s']:+.1f} s "
                f"| {run['restarts']} |"
            )
    for item in table["broken"]:
        lines.append(f"- {item['run']} segment {item['segment']} (fired: {item['fired']}): {item['invariant']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
