"""The scale benchmark (benchmarks/scale.py) in a small form: flowtrain only, N = 2 and 4, on one
Ray node and on two, metrics-only and checkpointing reports, and a SIGKILLed rank at N = 4 that
must resume from the last committed checkpoint. Structure is asserted, never seconds: every rank
reported every round, every checkpoint holds every rank's files, the steps line up after the
restart, and the JSON, markdown and plot are written."""

from __future__ import annotations

import json

import psutil
import pytest

from benchmarks import scale
from benchmarks.scale_report import DEFINITIONS, slope
from benchmarks.scale_run import Spec, _folder_problems, _write_rank_files

REPORTS = 20
ARGS = [
    "--impls", "flowtrain",
    "--workers", "2", "4",
    "--topologies", "single", "multi",
    "--nodes", "2",
    "--variants", "metrics", "ckpt", "recovery",
    "--recovery-n", "4",
    "--reports", str(REPORTS),
    "--fit-timeout", "120",
    "--in-process",
]  # fmt: skip


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """One small benchmark run for the whole module: (report, output stem)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()  # the suite's shared Ray; the benchmark starts its own per topology
    stem = tmp_path_factory.mktemp("scale") / "scale-small"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    report = scale.main(ARGS + ["--out", str(stem)])
    # The benchmark shut its Rays down: nothing it started is left running.
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(left, timeout=30)
    assert not alive, f"processes left behind: {[(p.pid, p.name()) for p in alive]}"
    return report, stem


def runs_of(report: dict, **match) -> list[dict]:
    """The runs whose spec has every given value."""
    return [r for r in report["runs"] if all(r["spec"][k] == v for k, v in match.items())]


def test_every_planned_measurement_finished_and_passed_its_structure_check(bench):
    report, _ = bench

    measured = sorted((r["spec"]["topology"], r["spec"]["variant"], r["spec"]["workers"]) for r in report["runs"])

    assert measured == sorted(
        [(t, v, n) for t in ("single", "multi") for v in ("metrics", "ckpt") for n in (2, 4)]
        + [("single", "recovery", 4)]
    )
    for run in report["runs"]:
        result = run["result"]
        assert not result.get("missing"), (run["spec"], result.get("reason"), result.get("log_tail"))
        assert result["structure"]["ok"], (run["spec"], result["structure"]["problems"], result.get("error"))


def test_every_rank_reported_every_round_and_every_checkpoint_holds_every_ranks_files(bench):
    report, _ = bench

    for run in runs_of(report, variant="metrics") + runs_of(report, variant="ckpt"):
        result = run["result"]
        assert result["rounds"] == REPORTS
        assert result["structure"]["problems"] == []
    for run in runs_of(report, variant="ckpt"):
        result = run["result"]
        assert result["checkpoints_committed"] == REPORTS // 5
        assert result["structure"]["checked_checkpoints"] == REPORTS // 5
        assert result["structure"]["best_checkpoints"] == REPORTS // 5
        assert "ckpt_commit_ms_p50" in result and "ckpt_blocked_ms_p50" in result
    for run in runs_of(report, variant="metrics"):
        assert "checkpoints_committed" not in run["result"]


def test_the_two_node_runs_put_workers_on_both_nodes(bench):
    report, _ = bench

    for run in runs_of(report, topology="multi"):
        assert run["result"]["nodes_used"] == 2, run["spec"]
    for run in runs_of(report, topology="single"):
        assert run["result"]["nodes_used"] == 1


def test_the_killed_rank_resumes_from_the_last_committed_checkpoint(bench):
    report, _ = bench

    (run,) = runs_of(report, variant="recovery")
    result = run["result"]

    # killed right after round 7; the checkpoint of step 5 was the last committed one
    assert result["killed_after_step"] == 7
    assert result["last_committed_step"] == 5
    assert result["resumed_at_step"] == 6
    # rounds 1-7 of the first attempt, then 6-20 of the resumed one
    assert result["rounds"] == 7 + (REPORTS - 5)
    assert result["checkpoints_committed"] == 1 + 3  # step 5, then 10, 15, 20 after the restart
    assert result["recovery_s"] > 0
    assert report["recovery"][0]["resumed_at_step"] == 6


def test_json_markdown_and_plot_are_written_with_the_expected_content(bench):
    report, stem = bench

    written = json.loads(stem.with_suffix(".json").read_text())
    markdown = stem.with_suffix(".md").read_text()
    png = stem.with_suffix(".png").read_bytes()

    assert {
        "command",
        "date",
        "machine",
        "versions",
        "options",
        "definitions",
        "runs",
        "summary",
        "per_extra_worker_mb",
        "recovery",
    } <= set(written)
    assert {"cores", "memory_gib", "load_1m", "python"} <= set(written["machine"])
    assert {"ray", "torch"} <= set(written["versions"])
    entry = written["summary"]["single"]["metrics"]["4"]["flowtrain"]
    assert {
        "all_ranks_in_s",
        "first_report_s",
        "round_ms_p50",
        "round_ms_p90",
        "driver_cpu_ms_per_round",
        "peak_pss_mb",
        "procs_at_peak",
    } <= set(entry)
    assert entry["structure_ok"] is True
    ckpt = written["summary"]["multi"]["ckpt"]["2"]["flowtrain"]
    assert {"ckpt_commit_ms_p50", "ckpt_blocked_ms_p50", "ckpt_round_ms_p50"} <= set(ckpt)
    assert isinstance(written["per_extra_worker_mb"]["single"]["metrics"]["flowtrain"], float)
    assert written["command"].startswith("python -m benchmarks.scale --impls flowtrain")
    for heading in (
        "## single, metrics",
        "## single, ckpt",
        "## multi, metrics",
        "## multi, ckpt",
        "## Recovery",
        "## Definitions",
    ):
        assert heading in markdown
    assert written["command"] in markdown
    assert "| 4 |" in markdown
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_the_structure_check_notices_a_rank_missing_from_a_checkpoint(tmp_path):
    for rank in (0, 2):
        _write_rank_files(str(tmp_path), rank, step=5, size=1000)

    problems = _folder_problems(tmp_path, 3, 1000)

    assert problems == [f"{tmp_path.name}: no files from rank(s) [1]"]
    assert (
        _folder_problems(tmp_path, 3, 999)[1] == f"{tmp_path.name}: rank(s) [0, 2] wrote a file that is not 999 bytes"
    )


def test_implementations_take_turns_going_first_and_the_memory_slope_is_least_squares():
    specs = scale.plan(scale.parse(["--workers", "2", "4", "--topologies", "single", "--variants", "metrics", "ckpt"]))

    order = [(s.workers, s.variant, s.impl) for s in specs]

    assert order == [
        (2, "metrics", "flowtrain"), (2, "metrics", "ray_train"),
        (2, "ckpt", "ray_train"), (2, "ckpt", "flowtrain"),
        (4, "metrics", "flowtrain"), (4, "metrics", "ray_train"),
        (4, "ckpt", "ray_train"), (4, "ckpt", "flowtrain"),
    ]  # fmt: skip
    assert all(isinstance(s, Spec) for s in specs)
    assert slope([(2, 100.0), (4, 140.0), (8, 220.0)]) == pytest.approx(20.0)
    assert slope([(2, 100.0)]) is None
    assert set(DEFINITIONS) >= {"all_ranks_in_s", "ckpt_commit_ms_p50", "recovery_s", "per_extra_worker_mb"}


def test_the_cpu_a_fault_costs_counts_each_process_s_growth_and_new_processes_whole():
    from benchmarks.scale_run import cpu_between

    before = {"11@1.0": 1.0, "12@1.0": 2.0}
    after = {"11@1.0": 1.5, "13@5.0": 0.7}  # 12 ended (not counted), 13 started in between (counted whole)
    assert cpu_between(before, after) == pytest.approx(1.2)
