"""What keeping the data position costs steady throughput (issue 37.1: under 1%).

    python -m benchmarks.data_position [--repeats 7] [--quick]

Three measures, each with the position kept (``DataConfig(checkpoint_data_position=True)``, the
default) and off. Each repetition runs off, kept, kept, off (the fit: off, kept, turning each
time), so the machine's drift hits both alike, and gives one ratio of steady rates, kept over off;
the table shows the min and the median of those ratios (above 1: kept was faster), per
wall-clock second and per CPU second of the process that iterates (less sensitive to whatever
else the machine runs).

1. ``shard``: one pass over a Ray Data shard of 1M rows in this process (``iter_torch_batches``,
   1024 rows a batch, a token of compute per batch): Ray's ``DataIterator`` against the counting
   one a worker gets, whose position is read every 10 batches as ``report()`` reads it.
2. ``loader``: one epoch of a ``DataLoader`` over 800k numbered samples (256 a batch) through
   rank 0 of 2's ``DistributedSampler``, against the ``PositionedLoader`` and
   ``PositionedSampler`` ``prepare_data_loader`` builds.
3. ``fit``: a 2-worker ``fit()`` whose loop reads its shard of 250k parquet rows for 3 epochs,
   with a metrics-only ``report()`` every 10 batches and a checkpoint at each epoch's end; the
   rate is that of the last two epochs (the first includes start-up), the slower rank's.

On a shared machine the ratios carry the noise of the runs beside them; ``cost_per_batch_us`` is
the steady figure: what counting adds to each batch (the iterator layer, the count, a position
read every 10 batches), timed on batches already in memory, the best of 5, and its share of an
off batch's time at the median off rate.

Results go to ``results/<date>-data-position.json`` with the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from benchmarks.bench import RESULTS, machine
from benchmarks.workloads import parquet_dataset

BATCH_ROWS = 1024
REPORT_EVERY = 10


def _pass(batches, on_batch) -> dict[str, float]:
    """Rows per wall-clock second and per CPU second of this process (its threads: Ray Data's
    prefetching too) over one pass of ``batches``, with a token of compute per batch."""
    wall, cpu = time.perf_counter(), time.process_time()
    rows = 0
    for step, batch in enumerate(batches):
        values = batch["y"] if isinstance(batch, dict) else batch
        values.sum()  # touch the data as a training step would
        rows += len(values)
        on_batch(step)
    return {"wall": rows / (time.perf_counter() - wall), "cpu": rows / (time.process_time() - cpu)}


def shard_rate(kept: bool, dataset) -> dict[str, float]:
    """Rows per second through one pass of ``dataset``'s iterator, counted or not."""
    from trainers.testing import ShardCounter

    iterator = dataset.iterator()
    counter = ShardCounter()
    if kept:
        iterator = counter.track(iterator, "train")

    def on_batch(step: int) -> None:
        if kept and step % REPORT_EVERY == 0:
            counter.position()  # what each report() takes

    return _pass(iterator.iter_torch_batches(batch_size=BATCH_ROWS), on_batch)


def loader_rate(kept: bool) -> dict[str, float]:
    """Samples per second through one epoch of rank 0's part of a 200k-sample loader."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from trainers.torch.sampler_position import PositionedLoader, PositionedSampler

    data = torch.arange(800_000, dtype=torch.float32)
    settings = dict(num_replicas=2, rank=0, shuffle=True, seed=0)
    if kept:
        sampler: DistributedSampler = PositionedSampler(data, **settings)
        loader: DataLoader = PositionedLoader(data, batch_size=256, sampler=sampler)
    else:
        sampler = DistributedSampler(data, **settings)
        loader = DataLoader(data, batch_size=256, sampler=sampler)

    def on_batch(step: int) -> None:
        if kept and step % REPORT_EVERY == 0:
            sampler.position()  # type: ignore[attr-defined]  # what each report() takes

    return _pass(loader, on_batch)


def _fit_loop(config: dict) -> None:
    import trainers

    shard = trainers.get_dataset_shard("train")
    rank = trainers.get_context().get_world_rank()
    rows, wall, cpu = 0, 0.0, 0.0
    for epoch in range(3):
        if epoch == 1:
            rows, wall, cpu = 0, time.perf_counter(), time.process_time()
        for step, batch in enumerate(shard.iter_torch_batches(batch_size=BATCH_ROWS)):
            batch["y"].sum()
            rows += len(batch["y"])
            if step % REPORT_EVERY == 0:
                trainers.report({"epoch": epoch, "step": step})
        with tempfile.TemporaryDirectory() as folder:
            pathlib.Path(folder, "epoch.txt").write_text(str(epoch))
            trainers.report({"epoch": epoch}, checkpoint=trainers.Checkpoint.from_directory(folder))
    rates = {"wall": rows / (time.perf_counter() - wall), "cpu": rows / (time.process_time() - cpu)}
    pathlib.Path(config["out"], f"rank{rank}.json").write_text(json.dumps(rates))


def fit_rate(kept: bool, storage: str, run: int) -> dict[str, float]:
    """The slower rank's rows per second (wall-clock and its process's CPU) over the last two of
    three epochs of a 2-worker fit()."""
    import ray.data

    from benchmarks.data_position import _fit_loop  # by its module's name, not __main__'s: workers import it
    from trainers import DataConfig, RunConfig, ScalingConfig
    from trainers.torch import TorchTrainer

    out = tempfile.mkdtemp(prefix="flowtrain-bench-position-")
    TorchTrainer(
        _fit_loop,
        train_loop_config={"out": out},
        datasets={"train": ray.data.read_parquet(parquet_dataset())},
        dataset_config=DataConfig(checkpoint_data_position=kept),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=f"position-{run}-{'kept' if kept else 'off'}", storage_path=storage),
    ).fit()
    ranks = [json.loads(pathlib.Path(out, name).read_text()) for name in os.listdir(out)]
    return {kind: min(rank[kind] for rank in ranks) for kind in ("wall", "cpu")}


def counting_cost_us(batches: int = 20_000) -> float:
    """Microseconds counting adds to one batch a worker's shard hands out (the best of 5)."""
    from trainers.testing import ShardCounter

    items = [{"y": None}] * batches
    counter = ShardCounter()

    def plain() -> float:
        start = time.perf_counter()
        for _ in items:
            pass
        return time.perf_counter() - start

    def counted() -> float:
        start = time.perf_counter()
        for step, _ in enumerate(counter.count(items, BATCH_ROWS, "train")):
            if step % REPORT_EVERY == 0:
                counter.position()
        return time.perf_counter() - start

    return (min(counted() for _ in range(5)) - min(plain() for _ in range(5))) / batches * 1e6


def pairs(measure, repeats: int, *, abba: bool = True) -> dict:
    """``repeats`` repetitions of off and kept rates ({"wall", "cpu"}), and per repetition the
    ratio of each kind (kept over off)."""
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    for repeat in range(repeats):
        turned = (False, True) if repeat % 2 == 0 else (True, False)
        order = (False, True, True, False) if abba else turned
        got: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for kept in order:
            got[kept].append(measure(kept, repeat))
        for kept, rates in got.items():
            runs[kept].extend(rates)
        for kind, values in ratios.items():
            values.append(sum(r[kind] for r in got[True]) / sum(r[kind] for r in got[False]))
    summary: dict = {"runs_off": runs[False], "runs_kept": runs[True]}
    for kind, values in ratios.items():
        summary[kind] = {
            "median_off": statistics.median(r[kind] for r in runs[False]),
            "median_kept": statistics.median(r[kind] for r in runs[True]),
            "ratio_kept_over_off": values,
            "ratio_min": min(values),
            "ratio_median": statistics.median(values),
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="pairs per measure (fit: at most 5)")
    parser.add_argument("--quick", action="store_true", help="2 pairs each, a smoke run")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats

    import ray
    import ray.data

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    report: dict = {"date": datetime.date.today().isoformat(), "machine": machine(), "measures": {}}
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        # Read once (4 x the parquet rows): the pass alone is timed.
        dataset = ray.data.read_parquet([parquet_dataset()] * 4).materialize()
        shard_rate(False, dataset)  # warm-up: Ray Data's first pass starts its pools
        measures = report["measures"]
        measures["shard"] = pairs(lambda kept, _: shard_rate(kept, dataset), repeats)
        measures["loader"] = pairs(lambda kept, _: loader_rate(kept), repeats)
        storage = tempfile.mkdtemp(prefix="flowtrain-bench-position-")
        measures["fit"] = pairs(lambda kept, run: fit_rate(kept, storage, run), min(repeats, 5), abba=False)
        cost_us = counting_cost_us()
        batch_us = 1e6 * BATCH_ROWS / measures["shard"]["wall"]["median_off"]
        report["cost_per_batch_us"] = {"counting": cost_us, "off_batch": batch_us, "share": cost_us / batch_us}
    finally:
        ray.shutdown()
    out = args.out or RESULTS / f"{report['date']}-data-position{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'measure':8} {'per':5} {'off (rows/s)':>14} {'kept (rows/s)':>14} {'kept/off min':>13} {'median':>8}")
    for name, measure in report["measures"].items():
        for kind in ("wall", "cpu"):
            m = measure[kind]
            print(
                f"{name:8} {kind + ' s':5} {m['median_off']:14,.0f} {m['median_kept']:14,.0f} "
                f"{m['ratio_min']:13.3f} {m['ratio_median']:8.3f}"
            )
    cost = report["cost_per_batch_us"]
    print(
        f"counting adds {cost['counting']:.2f} us to a {BATCH_ROWS}-row batch of {cost['off_batch']:.0f} us "
        f"({100 * cost['share']:.3f}%)"
    )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
