"""The benchmark command keeps working: a one-repetition smoke run of its start-up workload, and
the arithmetic of its summary (medians, per-repetition ratios). No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.bench import parse, rotated, summarise
from conftest import ROOT


def test_summary_takes_medians_and_the_median_of_the_per_repetition_ratios():
    samples = {
        "flowtrain": [{"wall_s": 2.0}, {"wall_s": 4.0}, {"wall_s": 3.0}],
        "raw": [{"wall_s": 1.0}, {"wall_s": 1.0}, {"wall_s": 3.0}],
    }

    summary = summarise(samples)

    assert summary["flowtrain"] == {"wall_s": 3.0}
    assert summary["raw"]["wall_s"] == 1.0
    # per repetition: 2.0, 4.0, 1.0 -> median 2.0 (the ratio of the medians would be 3.0)
    assert summary["raw"]["ratio_flowtrain_over_this"] == {"wall_s": 2.0}


def test_every_implementation_takes_every_place_in_the_order_once_per_cycle():
    impls = ("flowtrain", "ray.train", "raw")

    orders = [rotated(impls, repeat) for repeat in range(4)]

    assert orders[:3] == [
        ("flowtrain", "ray.train", "raw"),
        ("ray.train", "raw", "flowtrain"),
        ("raw", "flowtrain", "ray.train"),
    ]
    assert orders[3] == orders[0]
    # over one cycle, each implementation runs first once
    assert sorted(order[0] for order in orders[:3]) == sorted(impls)


def test_a_default_run_leaves_the_long_gbdt_jobs_out_and_only_runs_them_when_named():
    default = parse([]).only

    assert {"startup", "throughput", "xgboost", "lightgbm"} <= set(default)
    assert not {"xgboost_2m", "lightgbm_2m"} & set(default)
    assert parse(["--only", "xgboost_2m"]).only == ["xgboost_2m"]


def run_benchmark(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<module> ARGS`` from the checkout, as a user runs it; it must succeed."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_quick_startup_run_measures_every_implementation_and_writes_its_json(tmp_path):
    out = tmp_path / "startup.json"
    done = run_benchmark("bench", "--quick", "--only", "startup", "--out", str(out))

    report = json.loads(out.read_text())
    assert report["machine"]["cores"] == os.cpu_count()
    startup = report["workloads"]["startup"]
    assert set(startup) == {"flowtrain", "ray.train", "raw"}
    for impl, entry in startup.items():
        assert entry["wall_s"] > 0 and entry["again_wall_s"] > 0 and entry["peak_pss_mb"] > 0, impl
    assert startup["raw"]["ratio_flowtrain_over_this"]["wall_s"] > 0
    assert startup["ray.train"]["ratio_flowtrain_over_this"]["wall_s"] > 0
    assert startup["ray.train"]["ratio_flowtrain_over_this"]["again_wall_s"] > 0
    assert any("flowtrain/raw: " in line and " wall_s=" in line for line in done.stdout.splitlines())


def test_gbdt_raw_peer_trains_both_libraries_in_their_own_distributed_mode(tmp_path):
    """The peer that shows what the libraries' own 2-process mode costs, with no Ray: it must
    train every round on both ranks and save the model (it raises otherwise)."""
    from benchmarks.gbdt import WORKLOADS

    for library in ("xgboost", "lightgbm"):
        measure, impls = WORKLOADS[library]
        assert "raw" in impls
        assert measure("raw", str(tmp_path), 0)["wall_s"] > 0


def test_long_run_measure_writes_every_window_and_commit_and_keeps_every_report(tmp_path):
    """``benchmarks.long_run`` in a small form (its own Ray, so in a process of its own): every
    window and commit measured, on both ranks and the driver, and the history whole."""
    out = tmp_path / "long-run.json"
    args = ["--reports", "6000", "--checkpoint-every", "500", "--window", "1500", "--out", str(out)]
    done = run_benchmark("long_run", *args)

    report = json.loads(out.read_text())
    assert report["rows_in_metrics_dataframe"] == 6000 and report["commits"] == 12
    assert len(report["commit_cpu_ms_each"]) == 12 and min(report["commit_cpu_ms_each"]) > 0
    for name in ("report_ms", "rank0_cpu_us", "rank1_cpu_us", "machine_cpu_us"):
        windows = report[f"{name}_windows"]
        assert len(windows) == 4 and min(windows) > 0, name
    assert len(report["driver_cpu_us_windows"]) == 3  # from the first report on
    assert 0 < report["run_json_bytes"] < 2**20 and report["driver_rss_mb_peak_training"] > 0
    assert "last 10 commits / first 10" in done.stdout
