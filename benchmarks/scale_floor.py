"""What Ray itself costs per worker on this machine: N bare actors, no trainer at all.

    python -m benchmarks.scale_floor                     # N = 2 4 8 16 32 64, 3 repeats
    python -m benchmarks.scale_floor --workers 2 8 --repeats 1

Every Ray Train worker, flowtrain's and ray.train's alike, is one Ray actor process. How long N
actor processes take to start, and how much memory each adds, is the floor under both
implementations' start-up and per-worker memory in ``benchmarks.scale``: a trainer can only add
to it. Each N runs in a process of its own on a fresh one-node Ray (2 CPUs, the ``single``
topology of ``benchmarks.scale``), actors asking ``{"CPU": 0.015}`` as the scale workers do; this
process samples that process tree's PSS. Writes ``benchmarks/results/scale-floor-<date>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.bench import machine
from benchmarks.scale_report import slope
from benchmarks.scale_run import ROOT, RayTopology, TreeSampler

RESULTS = pathlib.Path(__file__).with_name("results")


class Bare:
    """An actor that only says where it runs: all a worker process costs before any trainer code."""

    def pid(self) -> int:
        return os.getpid()


def child(workers: int, out: pathlib.Path) -> None:
    """In the measured process: Ray up, ``workers`` bare actors started and answered, Ray down."""
    import ray

    topology = RayTopology("single").start()
    try:
        actor = ray.remote(Bare)
        began = time.perf_counter()
        actors = [actor.options(num_cpus=0.015).remote() for _ in range(workers)]
        ray.get([a.pid.remote() for a in actors])
        started_s = time.perf_counter() - began
        time.sleep(1.0)  # every process up at once for a few samples of the sampler
        out.write_text(json.dumps({"start_s": started_s}))
    finally:
        topology.stop()


def measure(workers: int) -> dict:
    """One N in a fresh process; its start time and the peak PSS of its process tree."""
    with tempfile.TemporaryDirectory(prefix="flowtrain-floor-") as tmp:
        out = pathlib.Path(tmp) / "out.json"
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale_floor", "--child", str(workers), str(out)], cwd=ROOT
        )
        sampler = TreeSampler(process.pid).start()
        process.wait(timeout=600)
        memory = sampler.stop()
        numbers = json.loads(out.read_text()) if out.exists() else {"missing": True}
    return {**numbers, **memory}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="file stem under benchmarks/results (default scale-floor-<date>)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(int(args.child[0]), pathlib.Path(args.child[1]))
        return 0
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    report = {
        "command": "python -m benchmarks.scale_floor " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "runs": {},
    }
    for n in args.workers:
        runs = [measure(n) for _ in range(args.repeats)]
        report["runs"][str(n)] = runs
        print(f"bare actors N={n}: {[round(r.get('start_s', float('nan')), 2) for r in runs]} s", flush=True)
    medians = {
        int(n): {
            key: statistics.median(r[key] for r in runs if r.get(key) is not None) for key in ("start_s", "peak_pss_mb")
        }
        for n, runs in report["runs"].items()
    }
    report["median"] = medians
    report["pss_per_extra_worker_mb"] = slope([(n, m["peak_pss_mb"]) for n, m in medians.items()])
    stem = RESULTS / (args.out or f"scale-floor-{report['date']}")
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    lines = [
        "# Ray's own floor: N bare actors, no trainer",
        "",
        f"`{report['command']}` on {report['date']}; machine: {report['machine']}. Medians of {args.repeats}.",
        "",
        "| N | start N actors, all answered (s) | per worker (s) | peak PSS of the tree (MiB) |",
        "| --- | --- | --- | --- |",
    ]
    for n, m in sorted(medians.items()):
        lines.append(f"| {n} | {m['start_s']:.2f} | {m['start_s'] / n:.3f} | {m['peak_pss_mb']:.0f} |")
    per_worker = report["pss_per_extra_worker_mb"]
    if per_worker is not None:
        lines += ["", f"Peak PSS per extra worker (least-squares slope over N): {per_worker:.1f} MiB."]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
