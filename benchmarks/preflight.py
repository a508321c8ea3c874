"""What the pre-flight check costs a healthy run (issue 48: under 2 s).

    python -m benchmarks.preflight [--workers 2 4] [--repeats 5]

For each worker count, ``repeats`` pairs of 2-worker (or N-worker) ``TorchTrainer`` fits of a
one-report loop, the check on (``FLOWTRAIN_PREFLIGHT=on``) and off, turn about (on, off; off,
on; ...) on one Ray, so the workers are kept between fits as a user's loop of fits keeps them.
Two figures: the check's own time as the driver measured it (``Result.health.preflight``: from
sending the probes to judging them), and what it added to ``fit()``'s wall time (the median of
on minus off, per pair). On CPUs, the compute probe is a 256x256 matrix multiply 40 times and the
all-reduce 4 MiB 5 times over gloo; on GPUs 4096x4096 20 times and 256 MiB over NCCL.

Results go to ``results/<date>-preflight.json`` with the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks.bench import RESULTS, machine


def _one_report(config: dict) -> None:
    import trainers

    trainers.report({"step": 0})


def fit_once(workers: int, checked: bool, storage: str, run: int) -> tuple[float, float | None]:
    """The wall time of one fit() and its check's seconds (None when off)."""
    from trainers import RunConfig, ScalingConfig
    from trainers.torch import TorchTrainer

    os.environ["FLOWTRAIN_PREFLIGHT"] = "on" if checked else "off"
    started = time.perf_counter()
    result = TorchTrainer(
        _one_report,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=f"preflight-{workers}-{run}-{'on' if checked else 'off'}", storage_path=storage),
    ).fit()
    wall = time.perf_counter() - started
    return wall, (result.health.preflight[-1].seconds if result.health.preflight else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=max(args.workers), include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="flowtrain-bench-preflight-")
    report: dict = {"date": datetime.date.today().isoformat(), "machine": machine(), "by_workers": {}}
    try:
        for workers in args.workers:
            fit_once(workers, False, storage, -1)  # warm: start the workers once, as every later fit finds them
            checks, added = [], []
            for repeat in range(args.repeats):
                order = (True, False) if repeat % 2 == 0 else (False, True)
                walls = {}
                for checked in order:
                    walls[checked], seconds = fit_once(workers, checked, storage, repeat)
                    if seconds is not None:
                        checks.append(seconds)
                added.append(walls[True] - walls[False])
            figures = {
                "check_s": checks,
                "check_s_median": statistics.median(checks),
                "check_s_max": max(checks),
                "added_to_fit_s": added,
                "added_to_fit_s_median": statistics.median(added),
            }
            report["by_workers"][str(workers)] = figures
            print(
                f"N={workers}: the check {figures['check_s_median']:.2f} s (max {figures['check_s_max']:.2f} s); "
                f"added to fit() {figures['added_to_fit_s_median']:+.2f} s (median of {args.repeats} pairs)",
                flush=True,
            )
    finally:
        ray.shutdown()
    out = args.out or RESULTS / f"{report['date']}-preflight.json"
    with open(out, "w") as file:
        json.dump(report, file, indent=2)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
