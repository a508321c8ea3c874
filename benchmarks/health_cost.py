"""What run health costs the report path, measured apart from everything else (issue 48).

    python -m benchmarks.health_cost [--ranks 64] [--rounds 2000]

``benchmarks/scale.py`` measures the whole report path at 64 workers on this 2-core machine,
where the driver's thread shares the cores with 64 busy workers and its CPU per round moves by
half from run to run. This measures the health parts alone, in this process, the best of 5:

- ``worker_us_per_report``: what a rank adds to each ``report()`` (``RankHealth.report_starts``
  and ``report_ends``: two clock reads, one ``getrusage``, a peak compared);
- ``driver_us_per_round``: what the controller adds to each committed round of ``--ranks`` ranks
  (each rank's report count and memory kept, the steps read, the straggler judge, the timeline,
  the round's memory), on steps with the spread of a real run;
- ``worker_us_per_batch``: what a worker's dataset shard adds to each batch it hands the loop
  (its rows counted for the data position, the loop's wait for it timed: two clock reads), less a
  plain loop over the same batches: what a run that is not input-bound pays per batch (issue 62).

Results go to ``results/<date>-health-cost.json`` with the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from collections.abc import Callable

from benchmarks.bench import RESULTS, machine


def worker_us_per_report(reports: int = 20_000) -> float:
    from trainers.testing import RankHealthMeter

    meter = RankHealthMeter()

    def one_pass() -> float:
        started = time.perf_counter()
        for _ in range(reports):
            meter.measure()
        return time.perf_counter() - started

    return min(one_pass() for _ in range(5)) / reports * 1e6


def worker_us_per_batch(batches: int = 200_000) -> float:
    from trainers.testing import ShardCounter

    counter = ShardCounter()
    items = [{"x": None}] * batches

    def timed(loop: Callable[[], object]) -> float:
        started = time.perf_counter()
        loop()
        return time.perf_counter() - started

    def counted() -> None:
        for _ in counter.count(items, rows_each=1):
            pass

    def plain() -> None:
        for _ in items:
            pass

    best = min(timed(counted) for _ in range(5)) - min(timed(plain) for _ in range(5))
    return best / batches * 1e6


def driver_us_per_round(ranks: int, rounds: int) -> float:
    from trainers.testing import RoundHealthJudge

    spread = random.Random(0)
    steps = [[0.01 * spread.uniform(0.8, 1.3) for _ in range(ranks)] for _ in range(rounds)]

    def one_pass() -> float:
        judge = RoundHealthJudge(ranks)
        prepared = judge.rounds(steps)
        started = time.perf_counter()
        for round_ in prepared:
            judge.judge(round_)
        return time.perf_counter() - started

    return min(one_pass() for _ in range(5)) / rounds * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "ranks": args.ranks,
        "worker_us_per_report": round(worker_us_per_report(), 2),
        "driver_us_per_round": round(driver_us_per_round(args.ranks, args.rounds), 1),
        "worker_us_per_batch": round(worker_us_per_batch(), 3),
    }
    print(
        f"worker: +{report['worker_us_per_report']} us per report, +{report['worker_us_per_batch']} us per batch; "
        f"driver: +{report['driver_us_per_round']} us per {args.ranks}-rank round",
        flush=True,
    )
    out = args.out or RESULTS / f"{report['date']}-health-cost.json"
    with open(out, "w") as file:
        json.dump(report, file, indent=2)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
