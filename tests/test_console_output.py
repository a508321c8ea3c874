"""What a person sees on the terminal of a pipeline run, and what its Prefect logs keep.

Each test runs a demo-sized pipeline (2 workers at 0.5 CPU, 2 Ray Data datasets split between
them, a 2-CPU Ray of its own) in a subprocess, so its stdout and stderr are what a terminal gets,
against the session's Prefect server; then reads the flow run's logs back from the server.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

from conftest import ROOT, TESTS
from console_loops import WORKER_FAILURE, WORKER_WARNING
from pipeline_loops import write_classification_parquet
from prefect_server import api_post, stop_process_group

#: Ray Data's progress output: tqdm bars, cursor-up redraws, progress logs, per-execution notices.
RAY_DATA_PROGRESS = re.compile(
    r"%\||row/s\]|\x1b\[A|Running Dataset|Total Progress|Starting execution of Dataset|execution finished in"
)
#: The fractional-CPU warning ``fit()`` raises in the driver (the task's process).
DRIVER_WARNING = "Giving each of the 2 training workers 0.5 CPU"


def run_pipeline(env: dict[str, str], tmp_path, *, fail: bool = False) -> tuple[str, str, int]:
    """Run ``console_loops.main`` in a subprocess; returns the run's name, its terminal output
    (stdout then stderr) and its exit code."""
    data = write_classification_parquet(tmp_path / "data")
    name = f"console-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    args = [sys.executable, str(TESTS / "console_loops.py"), data, str(tmp_path / "runs"), name] + (
        ["fail"] if fail else []
    )
    process = subprocess.Popen(
        args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=240)
    finally:
        stop_process_group(process)  # the subprocess's own Ray too, if it was cut off
    return name, stdout + stderr, process.returncode


def flow_run_logs(env: dict[str, str], name: str) -> list[dict]:
    """Every log record of the flow run called ``name`` (its task runs' included), oldest first."""
    (flow_run,) = api_post(env, "/flow_runs/filter", {"flow_runs": {"name": {"any_": [name]}}})
    body = {"logs": {"flow_run_id": {"any_": [flow_run["id"]]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    return api_post(env, "/logs/filter", body)


def records_with(logs: list[dict], text: str) -> list[tuple[int, str]]:
    return [(log["level"], log["message"]) for log in logs if text in log["message"]]


def test_the_terminal_shows_prefect_lines_and_the_run_logs_keep_the_warnings(prefect_server, tmp_path):
    name, out, code = run_pipeline(prefect_server, tmp_path)
    assert code == 0, out[-5000:]

    assert not RAY_DATA_PROGRESS.search(out), f"Ray Data's progress reached the terminal:\n{out}"
    assert "pid=" not in out, f"a Ray worker's lines were printed raw, not logged:\n{out}"
    lines = out.splitlines()
    assert len([line for line in lines if re.search(r"report \d+ \(attempt", line)]) == 4  # one line per report
    assert len(lines) < 40, out

    logs = flow_run_logs(prefect_server, name)
    worker = records_with(logs, WORKER_WARNING)
    assert len(worker) == 1 and worker[0][0] == 30 and worker[0][1].startswith("rank 1: "), worker  # WARNING, rank 1
    driver = records_with(logs, DRIVER_WARNING)
    assert len(driver) == 1 and driver[0][0] == 30 and driver[0][1].startswith("UserWarning: "), driver
    # On the terminal each warning shows once: Prefect's console line of that log record.
    assert out.count(WORKER_WARNING) == 1 and out.count(DRIVER_WARNING) == 1, out


def test_a_failed_rank_s_traceback_is_printed_once(prefect_server, tmp_path):
    name, out, code = run_pipeline(prefect_server, tmp_path, fail=True)
    assert code == 1, out[-5000:]

    rank_traceback = f"raise RuntimeError(WORKER_FAILURE)\nRuntimeError: {WORKER_FAILURE}"
    assert out.count(rank_traceback) == 1, out
    assert out.count("Traceback (most recent call last)") == 2, out  # the rank's, and the flow's own (Prefect's)
    assert not RAY_DATA_PROGRESS.search(out), out
    assert records_with(flow_run_logs(prefect_server, name), rank_traceback), (
        "the rank's traceback is not in the run's logs"
    )


def test_worker_lines_reach_the_sink_of_their_own_run():
    """The router alone, fed batches as Ray's log thread hands them over: two runs captured at once
    (a sweep's trials) each get only their workers' lines; other lines are printed as before."""
    from trainers._internal.worker_output import _Router, capture_worker_output, worker_label

    printed, got = [], {"a": [], "b": []}
    router = _Router(printed.append)

    def batch(actor_name: str, *lines: str, is_err: bool = False) -> dict:
        return {"pid": "1", "actor_name": actor_name, "lines": list(lines), "is_err": is_err}

    coordinator_notice = "✔️  Dataset dataset_1_0 execution finished in 0.91 seconds"
    with capture_worker_output("a", lambda *line: got["a"].append(line)):
        with capture_worker_output("b'x", lambda *line: got["b"].append(line)):
            router(batch(worker_label("a", 1), "UserWarning: from a", is_err=True))
            router(batch(worker_label("b'x", 0), "hello from b"))
            router(batch(worker_label("c", 0), "run c is not captured"))
            router(batch("SplitCoordinator", coordinator_notice, "a real Ray Data warning"))
        router(batch(worker_label("b'x", 0), "late line of b"))  # Ray delivers lines a moment late
    assert got["a"] == [(1, ["UserWarning: from a"], True)]
    assert got["b"] == [(0, ["hello from b"], False), (0, ["late line of b"], False)]
    assert [d["lines"] for d in printed] == [["run c is not captured"], ["a real Ray Data warning"]]
