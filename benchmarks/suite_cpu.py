"""Where a command's CPU goes, by kind of process: ``python -m benchmarks.suite_cpu --out F -- CMD...``.

Built to answer why the test suite takes as long as it does on a small machine. It runs the
command and, once a second until it exits, reads every process's CPU time from ``/proc``; each
second's growth is charged to the kind of process that used it (a Ray actor by its class, Ray's
daemons, the pytest process, Prefect's server, a flow run...). The JSON it writes holds the wall
time, the CPU seconds, how many cores that kept busy on average, and the CPU seconds per kind,
largest first. Whatever else runs on the machine is counted too, so measure on a quiet one.

A process that starts and ends between two readings is not seen; a worker process lives for
seconds, so what is missed is small.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import pathlib
import subprocess
import sys
import time

#: Kinds found by a word of the program a command line runs (its words before the first ``--``
#: option), as (word, kind); the first that matches wins.
KINDS_BY_WORD = (
    ("gcs_server", "ray gcs_server"),
    ("/raylet", "ray raylet"),
    ("dashboard/agent.py", "ray dashboard agent"),
    ("runtime_env/agent", "ray runtime env agent"),
    ("log_monitor", "ray log monitor"),
    ("autoscaler/_private/monitor.py", "ray autoscaler monitor"),
    ("dashboard/dashboard.py", "ray dashboard"),
    ("default_worker.py", "ray worker, starting"),
    ("postgres", "postgres"),
    ("exec(eval(sys.stdin.readline()))", "pytest-xdist worker"),
    ("pytest", "pytest"),
    ("prefect server", "prefect server"),
    ("uvicorn", "prefect server"),
    ("prefect worker", "prefect worker"),
    ("prefect.engine", "prefect flow run"),
    ("prefect", "prefect cli"),
)


def kind_of(command_line: str) -> str:
    """The kind a process is counted as, from its command line (Ray names its workers ``ray::Class``)."""
    if command_line.startswith("ray::"):
        return "ray actor/task " + command_line.split()[0].removeprefix("ray::").split(".")[0]
    parts = command_line.split()
    # Matched before the options: Ray passes its workers and agents the raylet's socket path.
    program = " ".join(itertools.takewhile(lambda part: not part.startswith("--"), parts))
    for word, kind in KINDS_BY_WORD:
        if word in program:
            return kind
    if not parts:
        return "other"
    executable = pathlib.Path(parts[0]).name
    if executable.startswith("python") and len(parts) > 1:
        return "python " + " ".join(parts[1:3])[:60]
    return executable[:40]


def read_processes(skip: set[int]) -> dict[int, tuple[str, float, str]]:
    """Every process now: pid -> (its start time, CPU seconds so far, its kind)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            command = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended while we looked
            continue
        # Fields after the ")" that closes the process name: utime and stime are the 12th and 13th.
        fields = stat.rsplit(")", 1)[1].split()
        found[int(entry)] = (fields[19], (int(fields[11]) + int(fields[12])) / ticks, kind_of(command.strip()))
    return found


def sample(command: list[str], interval_s: float = 1.0) -> dict:
    """Run ``command`` and charge the machine's CPU to kinds of process until it exits."""
    seen = read_processes({os.getpid()})  # what ran before the command is charged only for its growth
    by_kind: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    process = subprocess.Popen(command)
    while True:
        done = process.poll() is not None
        now = read_processes({os.getpid()})
        for pid, (birth, cpu, kind) in now.items():
            before = seen.get(pid)
            grown = cpu - before[1] if before and before[0] == birth else cpu
            if grown > 0:
                by_kind[kind] += grown
        seen = now
        if done:
            break
        time.sleep(interval_s)
    wall = time.monotonic() - started
    cpu = sum(by_kind.values())
    return {
        "command": command,
        "returncode": process.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cores_busy": round(cpu / wall, 2) if wall else 0.0,
        "cores": os.cpu_count(),
        "cpu_s_by_kind": {kind: round(seconds, 1) for kind, seconds in by_kind.most_common() if seconds >= 0.05},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the JSON file to write")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between readings")
    parser.add_argument("--top", type=int, default=20, help="how many kinds the printed table names")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to measure, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to measure after --, e.g. -- python -m pytest tests")
    table = sample(command, args.interval)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{table['wall_s']} s wall, {table['cpu_s']} CPU s, {table['cores_busy']} of {table['cores']} cores busy")
    for kind, seconds in list(table["cpu_s_by_kind"].items())[: args.top]:
        print(f"{seconds:9.1f} s {100 * seconds / max(table['cpu_s'], 1e-9):5.1f}%  {kind}")
    return table["returncode"]


if __name__ == "__main__":
    sys.exit(main())
