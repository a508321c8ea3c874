"""A long run's bookkeeping: does a report, a commit and the driver's memory stay flat in its length?

    python -m benchmarks.long_run --reports 1000000 --out benchmarks/results/long-run-DATE.json

What a new user writes for a long job: 2 workers report every step (step, loss, lr, grad norm,
throughput), metrics only, and every ``--checkpoint-every`` steps with a small checkpoint. Measured,
in one fit() on a Ray of its own:

- reports per second, and the cost of a report in the first and in the last window of
  ``--window`` reports: rank 0's wall time per report; each rank's process CPU time and the
  driver's (every thread of the driver: the event road, the controller, the run's storage) per
  report, which load from other processes does not move; and the whole machine's busy CPU time per
  report, which rank 0's wall time follows where 3 busy processes share 2 cores;
- the driver's time to commit a checkpoint round (``RunStorage.record_report`` of a round that
  commits), wall and CPU (its thread's), over the first and the last 10 commits;
- the size of ``run.json`` and of the run's metrics log at the end;
- the driver's RSS: after the first window, its peak while training, and at the end.

The acceptance of issue 59: the last window and the last 10 commits within 1.2x the first,
``run.json`` under 1 MB, the driver's RSS while training within 100 MB of its RSS after the first
50,000 reports.
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
import threading
import time
from typing import Any

from benchmarks.bench import machine


def _machine_busy_s() -> float:
    """Every CPU's busy time on this machine so far (Linux's /proc/stat, less idle and iowait)."""
    try:
        fields = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _loop(config: dict[str, Any]) -> None:
    """Run on each worker: ``reports`` reports, every ``every``-th with a checkpoint; each rank
    writes to ``marks_dir`` its time, its process's CPU time and the machine's busy CPU time at the
    end of every ``window`` reports."""
    import trainers

    rank = trainers.get_context().get_world_rank()
    reports, every, window = config["reports"], config["checkpoint_every"], config["window"]
    marks = [(time.perf_counter(), time.process_time(), _machine_busy_s())]
    for step in range(reports):
        metrics = {"step": step, "loss": 1.0 / (step + 1), "lr": 0.001, "grad_norm": 0.5, "throughput": 1000.0}
        if (step + 1) % every == 0:
            with tempfile.TemporaryDirectory() as folder:
                pathlib.Path(folder, f"rank{rank}.txt").write_text(str(step))
                trainers.report(metrics, checkpoint=trainers.Checkpoint.from_directory(folder))
        else:
            trainers.report(metrics)
        if (step + 1) % window == 0:
            marks.append((time.perf_counter(), time.process_time(), _machine_busy_s()))
    pathlib.Path(config["marks_dir"], f"rank{rank}.json").write_text(json.dumps(marks))


def _per_report(marks: list[list[float]], column: int, window: int) -> list[float]:
    """Microseconds per report of each window, from one column of a rank's marks."""
    return [1e6 * (b[column] - a[column]) / window for a, b in zip(marks, marks[1:], strict=False)]


class RssSampler:
    """This process's RSS every ``interval_s``, in a thread."""

    def __init__(self, interval_s: float = 0.5) -> None:
        import psutil

        self._process = psutil.Process()
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss")

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.samples.append((time.perf_counter(), self._process.memory_info().rss / 2**20))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def measure(reports: int, checkpoint_every: int, window: int) -> dict[str, Any]:
    """One long fit(); the figures the module's docstring lists."""
    import ray

    from storage.run_storage import RunStorage
    from trainers import CheckpointConfig, RunConfig, ScalingConfig, UserCallback
    from trainers.torch import TorchTrainer

    commits: list[float] = []
    commits_cpu: list[float] = []
    record_report = RunStorage.record_report

    def timed(self: RunStorage, round_: Any) -> Any:
        began, began_cpu = time.perf_counter(), time.thread_time()
        try:
            return record_report(self, round_)
        finally:
            if round_.commits:
                commits.append(time.perf_counter() - began)
                commits_cpu.append(time.thread_time() - began_cpu)

    class DriverCpu(UserCallback):
        """The driver's CPU time (all its threads) at the first report and at the end of every
        window of reports after it (the run's start is not a report's cost)."""

        def __init__(self) -> None:
            self.at: list[float] = []

        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            if run_context.num_reports == 1 or run_context.num_reports % window == 1:
                self.at.append(time.process_time())

    driver_cpu = DriverCpu()

    RunStorage.record_report = timed  # type: ignore[method-assign]  # the benchmark's own probe
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="flowtrain-long-run-")
    try:
        with RssSampler() as rss:
            started = time.perf_counter()
            result = TorchTrainer(
                _loop,
                train_loop_config={
                    "reports": reports,
                    "checkpoint_every": checkpoint_every,
                    "window": window,
                    "marks_dir": storage,
                },
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(
                    name="long",
                    storage_path=storage,
                    checkpoint_config=CheckpointConfig(num_to_keep=2),
                    callbacks=[driver_cpu],
                ),
            ).fit()
            wall_s = time.perf_counter() - started
        marks = [json.loads(pathlib.Path(storage, f"rank{rank}.json").read_text()) for rank in (0, 1)]
    finally:
        RunStorage.record_report = record_report  # type: ignore[method-assign]
        ray.shutdown()
    ends = [mark[0] for mark in marks[0]]
    per_report_ms = [us / 1000 for us in _per_report(marks[0], 0, window)]
    rank0_cpu_us, rank1_cpu_us = (_per_report(rank_marks, 1, window) for rank_marks in marks)
    driver_us = [1e6 * (b - a) / window for a, b in zip(driver_cpu.at, driver_cpu.at[1:], strict=False)]
    first_window_end = ends[1] if len(ends) > 1 else ends[0]
    after_first = [mb for at, mb in rss.samples if at >= first_window_end]
    training = [mb for at, mb in rss.samples if at <= ends[-1]]
    run_folder = pathlib.Path(storage, "long")
    log_bytes = sum(p.stat().st_size for p in run_folder.glob(".metrics/*") if p.is_file())
    return {
        "reports": reports,
        "checkpoint_every": checkpoint_every,
        "window": window,
        "wall_s": wall_s,
        "reports_per_s": reports / (ends[-1] - ends[0]),
        "report_ms_first_window": per_report_ms[0],
        "report_ms_last_window": per_report_ms[-1],
        "report_ms_windows": per_report_ms,
        "rank0_cpu_us_per_report_first_window": rank0_cpu_us[0],
        "rank0_cpu_us_per_report_last_window": rank0_cpu_us[-1],
        "rank0_cpu_us_windows": rank0_cpu_us,
        "rank1_cpu_us_windows": rank1_cpu_us,
        # The whole machine's busy CPU per report (every process, Ray's and the kernel's too):
        # rank 0's wall time follows it, 3 busy processes sharing 2 cores.
        "machine_cpu_us_windows": _per_report(marks[0], 2, window),
        "driver_cpu_us_per_report_first_window": driver_us[0],
        "driver_cpu_us_per_report_last_window": driver_us[-1],
        "driver_cpu_us_windows": driver_us,
        "commit_ms_first_10": 1000 * statistics.mean(commits[:10]),
        "commit_ms_last_10": 1000 * statistics.mean(commits[-10:]),
        "commit_cpu_ms_first_10": 1000 * statistics.mean(commits_cpu[:10]),
        "commit_cpu_ms_last_10": 1000 * statistics.mean(commits_cpu[-10:]),
        "commits": len(commits),
        "commit_cpu_ms_each": [round(1000 * c, 3) for c in commits_cpu],
        "run_json_bytes": (run_folder / "run.json").stat().st_size,
        "metrics_log_bytes": log_bytes,
        "driver_rss_mb_after_first_window": after_first[0] if after_first else None,
        "driver_rss_mb_peak_training": max(training, default=None),
        "driver_rss_mb_end": rss.samples[-1][1] if rss.samples else None,
        "rows_in_metrics_dataframe": len(result.metrics_dataframe),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--checkpoint-every", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=50_000)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    figures = measure(args.reports, args.checkpoint_every, args.window)
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "python": platform.python_version(),
        **figures,
    }
    shown = {k: v for k, v in figures.items() if not k.endswith("_windows")}
    print(json.dumps(shown, indent=2))
    last, first = figures["report_ms_last_window"], figures["report_ms_first_window"]
    cpu_last, cpu_first = (
        figures["driver_cpu_us_per_report_last_window"],
        figures["driver_cpu_us_per_report_first_window"],
    )
    print(
        f"last window / first: {last / first:.2f}x wall on rank 0, "
        f"{figures['rank0_cpu_us_per_report_last_window'] / figures['rank0_cpu_us_per_report_first_window']:.2f}x "
        f"rank 0's CPU, {cpu_last / cpu_first:.2f}x the driver's CPU; "
        f"last 10 commits / first 10: {figures['commit_ms_last_10'] / figures['commit_ms_first_10']:.2f}x wall, "
        f"{figures['commit_cpu_ms_last_10'] / figures['commit_cpu_ms_first_10']:.2f}x CPU"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
