"""Run the benchmarks side by side and print medians and ratios.

    python -m benchmarks.bench            # full run (make bench)
    python -m benchmarks.bench --quick    # one repetition each, for a smoke run
    python -m benchmarks.bench --only xgboost_2m lightgbm_2m   # the long GBDT jobs (opt-in)

Implementations are interleaved, and the order turns by one each repetition (A B C, B C A,
C A B, ...): drift in machine speed hits all alike, and no implementation always runs first or
always follows the same one (a run can slow the next, e.g. while Ray refills its worker pool).
The ratio reported is the median of the per-repetition ratios against flowtrain.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile

import benchmarks.gbdt  # each of these four registers its workloads
import benchmarks.recovery
import benchmarks.tensorflow_jax
import benchmarks.training  # noqa: F401 - imported for the workloads it registers
from benchmarks.workloads import OPT_IN, OWN_PROCESS, WORKLOADS

RESULTS = pathlib.Path(__file__).with_name("results")


def machine() -> dict:
    """Cores, memory and load at the start of the run."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(memory_gib, 1),
        "load_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }


def run(names: list[str], repeats: int) -> dict:
    """Every workload in ``names``, each on a Ray instance of its own, ``repeats`` times per
    implementation."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    storage = tempfile.mkdtemp(prefix="flowtrain-bench-")
    report: dict = {"date": datetime.date.today().isoformat(), "machine": machine(), "workloads": {}}
    for name in names:
        workload, impls = WORKLOADS[name]
        # A fresh Ray per workload: what one workload leaves behind (ray.train's controller
        # actors, the log monitor's growing list of worker logs, Ray Data's pools) must not
        # weigh on the next, so a workload measures the same alone (--only) as in a full run.
        # One that measures in processes of its own needs neither Ray here nor a warm-up.
        here = name not in OWN_PROCESS
        if here:
            ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            if here:
                workload(impls[0], storage, -1)  # warm-up: imports, Ray worker pool
            samples: dict[str, list[dict]] = {impl: [] for impl in impls}
            for repeat in range(repeats):
                for impl in rotated(impls, repeat):
                    samples[impl].append(workload(impl, storage, repeat))
                    print(f"{name} {impl} #{repeat}: {samples[impl][-1]}", flush=True)
            report["workloads"][name] = summarise(samples)
        finally:
            if here:
                ray.shutdown()
    return report


def rotated(impls: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """The order of the implementations in repetition ``repeat``: turned left by ``repeat``."""
    turn = repeat % len(impls)
    return impls[turn:] + impls[:turn]


def summarise(samples: dict[str, list[dict]]) -> dict:
    """Median of every number per implementation, and the median per-repetition ratio to flowtrain."""
    summary: dict = {}
    base = samples.get("flowtrain", [])
    for impl, runs in samples.items():
        keys = sorted({k for r in runs for k in r})
        entry = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
        if impl != "flowtrain" and base:
            entry["ratio_flowtrain_over_this"] = {
                k: statistics.median(b[k] / r[k] for b, r in zip(base, runs, strict=False) if k in r and r[k])
                for k in keys
            }
        summary[impl] = entry
    return summary


def print_table(report: dict) -> None:
    print(f"machine: {report['machine']}")
    for name, impls in report["workloads"].items():
        print(f"\n{name}")
        for impl, entry in impls.items():
            numbers = " ".join(f"{k}={v:.4g}" for k, v in entry.items() if isinstance(v, float))
            ratio = entry.get("ratio_flowtrain_over_this")
            shown = f"  flowtrain/{impl}: " + " ".join(f"{k}={v:.3g}x" for k, v in ratio.items()) if ratio else ""
            print(f"  {impl:10s} {numbers}{shown}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: which workloads, how many repetitions, where the JSON goes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, for a smoke run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--only",
        nargs="*",
        choices=sorted(WORKLOADS),
        default=sorted(set(WORKLOADS) - OPT_IN),
        help=f"workloads to run (default: all but {', '.join(sorted(OPT_IN))})",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="result JSON (default benchmarks/results/<date>.json)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    report = run(args.only, 1 if args.quick else args.repeats)
    print_table(report)
    out = args.out or RESULTS / f"{report['date']}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
