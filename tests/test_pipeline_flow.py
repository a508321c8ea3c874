"""The Prefect pipeline under prefect_test_harness, on the session's real local Ray and real files.

Each test runs the whole flow (ingest -> train -> checkpoints) ad hoc and reads back from the
Prefect API what a user would see: task runs and their retries, artifacts, logs.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

import pipeline_loops
from pipeline_loops import write_classification_parquet
from run_history import recorded_reports

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_local")


@pytest.fixture
def data(tmp_path) -> str:
    return write_classification_parquet(tmp_path / "data")


def _flow_run_id(state):
    return state.state_details.flow_run_id


def task_runs(flow_run_id) -> dict[str, list]:
    """The flow run's task runs by task name, oldest first."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    by_name: dict[str, list] = {}
    for run in sorted(runs, key=lambda r: r.created):
        by_name.setdefault(run.task_key.split("-")[0], []).append(run)
    return by_name


def artifacts(flow_run_id) -> dict[str, object]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found}


def log_text(flow_run_id) -> str:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)


def flowtrain_events(run_name: str, expected: int, timeout_s: float = 20.0) -> list[str]:
    """Names of the flowtrain events about ``run_name`` (waits for ``expected`` to arrive)."""
    import time

    from prefect import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=10)
    query = EventFilter(
        event=EventNameFilter(prefix=["flowtrain."]), resource=EventResourceFilter(id=[f"flowtrain.run.{run_name}"])
    )
    deadline = time.monotonic() + timeout_s
    while True:
        with get_client(sync_client=True) as client:
            names = sorted(e.event for e in client.read_events(filter=query, limit=50).events)
        if len(names) >= expected or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


def run_json(storage: pathlib.Path, name: str) -> dict:
    return json.loads((storage / name / "run.json").read_text())


def test_pipeline_trains_publishes_artifacts_and_keeps_the_best_checkpoint(tmp_path, data):
    from flows.pipeline import training_pipeline

    storage = tmp_path / "results"
    state = training_pipeline(
        train_loop="tasks.loops:tabular_mlp_loop",
        train_loop_config={"label_column": "label", "epochs": 3, "lr": 0.05},
        datasets={"train": {"uri": data, "required_columns": {"label": "int"}}, "valid": {"uri": data}},
        scaling={"num_workers": 2},
        checkpointing={"num_to_keep": 1, "score_attribute": "valid_loss", "score_order": "min"},
        run={"name": "mlp", "storage_path": str(storage)},
        return_state=True,
    )
    assert state.is_completed(), state
    summary = state.result()
    history = [r["metrics"] for r in recorded_reports(storage / "mlp")]
    assert [m["epoch"] for m in history] == [0, 1, 2]
    assert all(m["train_rows"] == 512 and m["valid_rows"] == 512 for m in history)  # every row, once per epoch
    assert history[-1]["valid_accuracy"] > 0.85  # a separable problem: the shipped loop really trains
    assert summary["num_reports"] == 3 and summary["metrics"] == history[-1]

    best = min(range(3), key=lambda i: history[i]["valid_loss"])
    assert summary["best_checkpoint"].endswith(f"checkpoint_{best:06d}")
    assert summary["best_metrics"]["valid_loss"] == history[best]["valid_loss"]
    on_disk = sorted(p.name for p in (storage / "mlp").iterdir() if p.name.startswith("checkpoint_"))
    assert on_disk == sorted({f"checkpoint_{best:06d}", "checkpoint_000002"})  # best + latest
    assert all(pathlib.Path(p).is_dir() for p in summary["kept_checkpoints"])

    found = artifacts(_flow_run_id(state))
    table = json.loads(found["mlp-metrics"].data)
    assert [row["valid_loss"] for row in table] == [
        float(f"{m['valid_loss']:.4g}") for m in history
    ]  # 4 significant digits
    assert found["mlp-progress"].data == 100.0
    assert summary["best_checkpoint"] in found["mlp-best-checkpoint"].data
    assert "valid_loss" in found["mlp-best-checkpoint"].data
    health = found["mlp-health"].data  # goodput, the timeline picture (the pipeline always draws it), memory
    assert "**Goodput " in health and "| training |" in health and "data:image/png;base64," in health
    assert (
        "| 0 | RSS " in health
        and "| 1 | RSS " in health
        and "/artifacts/artifact/" in found["mlp-metric-chart"].data  # the health page itself
    )

    runs = task_runs(_flow_run_id(state))
    assert sorted(r.name for r in runs["ingest"]) == ["ingest train", "ingest valid"]
    assert [r.name for r in runs["train"]] == ["train mlp"] and runs["train"][0].run_count == 1
    assert [r.name for r in runs["checkpoints"]] == ["checkpoints mlp"]
    logs = log_text(_flow_run_id(state))
    assert "report 3 (attempt 1): epoch=2" in logs


def test_a_killed_worker_resumes_inside_the_same_task_run(tmp_path, data):
    from flows.pipeline import training_pipeline

    markers = tmp_path / "markers"
    markers.mkdir()
    storage = tmp_path / "results"
    state = training_pipeline(
        train_loop=pipeline_loops.counting_loop,  # ad hoc: a function, not an import path
        train_loop_config={"epochs": 3, "kill_at_epoch": 1, "marker_dir": str(markers)},
        datasets={"train": {"uri": data}},
        scaling={"num_workers": 2},
        failures={"max_failures": 1, "controller_failure_limit": 0},
        run={"name": "killed", "storage_path": str(storage)},
        return_state=True,
    )
    assert state.is_completed(), state
    assert (markers / "killed").exists()
    starts = sorted(int(p.name.split("-")[1]) for p in markers.glob("start-*-0-*"))
    assert starts == [0, 1]  # rank 0 started fresh, then resumed right after the epoch-0 checkpoint
    history = [r["metrics"]["epoch"] for r in recorded_reports(storage / "killed")]
    assert history == [0, 1, 2]  # every completed epoch exactly once
    train_runs = task_runs(_flow_run_id(state))["train"]
    assert len(train_runs) == 1 and train_runs[0].run_count == 1  # no Prefect retry was needed
    logs = log_text(_flow_run_id(state))
    # Only the killed rank was replaced; rank 0 kept its process.
    assert "attempt 1 failed" in logs and "replaced rank 1 (its process died); kept rank(s) 0" in logs
    restarting = re.search(r"\| restarting \| ([0-9.]+) \|", artifacts(_flow_run_id(state))["killed-health"].data)
    assert restarting and float(restarting.group(1)) > 0  # the goodput account shows the restart
    assert flowtrain_events("killed", expected=4) == ["flowtrain.checkpoint.committed"] * 3 + [
        "flowtrain.run.restarted"
    ]


def test_a_driver_failure_is_retried_by_prefect_and_resumes_from_the_snapshot(tmp_path, data):
    from flows.pipeline import training_pipeline

    markers = tmp_path / "markers"
    markers.mkdir()
    storage = tmp_path / "results"
    pipeline_loops.FailOnceCallback.marker = markers / "driver-failed"
    try:
        state = training_pipeline(
            train_loop="pipeline_loops:counting_loop",
            train_loop_config={"epochs": 4, "marker_dir": str(markers)},
            datasets={"train": {"uri": data}},
            scaling={"num_workers": 2},
            failures={"max_failures": 0, "controller_failure_limit": 2, "retry_delay_s": 0},
            run={"name": "driver", "storage_path": str(storage), "callbacks": ["pipeline_loops:FailOnceCallback"]},
            return_state=True,
        )
    finally:
        pipeline_loops.FailOnceCallback.marker = None
    assert state.is_completed(), state
    assert (markers / "driver-failed").exists()
    train_runs = task_runs(_flow_run_id(state))["train"]
    assert len(train_runs) == 1 and train_runs[0].run_count == 2  # one Prefect retry of the same task run
    starts = sorted(int(p.name.split("-")[1]) for p in markers.glob("start-*-0-*"))
    assert starts == [0, 2]  # the retry resumed after the epoch-1 checkpoint, not from scratch
    history = [r["metrics"]["epoch"] for r in recorded_reports(storage / "driver")]
    assert history == [0, 1, 2, 3]
    assert len(run_json(storage, "driver")["goodput"]) == 2  # an account per fit() call: the failed one and the rerun


def test_the_prefect_reporter_forgets_the_reports_a_resize_makes_again(tmp_path):
    """A resize resumes from the latest checkpoint (no failure, no on_restart): the reports after it
    are made again, and the reporter must not count them twice."""
    from prefect import flow

    from storage import Checkpoint
    from tasks.reporting import PrefectReporter
    from trainers import TrainRunContext

    @flow
    def watch_a_resize() -> PrefectReporter:
        reporter = PrefectReporter("resized", expected_reports=4)
        told = TrainRunContext("resized", str(tmp_path), 1, None, None, None)
        reporter.after_report(told, [{"epoch": 0}], Checkpoint(tmp_path / "checkpoint_000000"))
        reporter.after_report(told, [{"epoch": 1}], None)
        reporter.on_resize(told, 1, 2)
        for epoch in (1, 2, 3):
            reporter.after_report(
                TrainRunContext("resized", str(tmp_path), 2, None, None, None), [{"epoch": epoch}] * 2, None
            )
        return reporter

    reporter = watch_a_resize()
    assert reporter.num_reports == 4
    assert [len(ranks) for ranks in reporter.every_rank([{"epoch": e} for e in range(4)])] == [1, 2, 2, 2]


def test_a_straggler_becomes_a_prefect_event_with_its_figures(tmp_path):
    from prefect import flow

    from storage.health import StragglerRecord
    from tasks.reporting import PrefectReporter
    from trainers import TrainRunContext

    straggler = StragglerRecord(1, 1, "10.0.0.2 (abc)", 6, 5, 4.1, 0.82, 0.2)

    @flow
    def name_a_straggler() -> None:
        context = TrainRunContext("straggling", str(tmp_path), 1, None, None, None)
        PrefectReporter("straggling").on_straggler(context, straggler)

    name_a_straggler()
    assert flowtrain_events("straggling", expected=1) == ["flowtrain.rank.straggling"]


def test_bad_parameters_fail_at_once_without_retry(tmp_path, data):
    from flows.pipeline import training_pipeline

    with pytest.raises(Exception, match="num_workers"):
        training_pipeline(scaling={"num_workers": -1}, run={"storage_path": str(tmp_path)})
    with pytest.raises(Exception, match="relative path"):
        training_pipeline(datasets={"train": {"uri": "data/train.parquet"}}, run={"storage_path": str(tmp_path)})

    state = training_pipeline(
        train_loop="pipeline_loops:no_such_loop",
        datasets={"train": {"uri": data}},
        failures={"controller_failure_limit": 3, "retry_delay_s": 0},
        run={"name": "bad", "storage_path": str(tmp_path)},
        return_state=True,
    )
    assert state.is_failed()
    with pytest.raises(
        ValueError, match=r"train_loop='pipeline_loops:no_such_loop': module 'pipeline_loops' has no 'no_such_loop'"
    ):
        state.result()
    train_runs = task_runs(_flow_run_id(state))["train"]
    assert len(train_runs) == 1 and train_runs[0].run_count == 1  # retries were allowed, none was made


def test_a_retried_flow_run_skips_the_stages_it_completed(tmp_path, data, monkeypatch):
    from flows.pipeline import training_pipeline
    from storage import RunStorage

    markers = tmp_path / "markers"
    markers.mkdir()
    real = RunStorage.verify_and_tidy
    calls = []

    def fail_first_time(self, owner):
        calls.append(owner)
        if len(calls) == 1:
            raise ValueError("injected: checkpoints stage fails once")
        return real(self, owner)

    monkeypatch.setattr(RunStorage, "verify_and_tidy", fail_first_time)
    state = training_pipeline.with_options(retries=1, retry_delay_seconds=0)(
        train_loop="pipeline_loops:counting_loop",
        train_loop_config={"epochs": 2, "marker_dir": str(markers)},
        datasets={"train": {"uri": data}},
        scaling={"num_workers": 2},
        run={"name": "cached", "storage_path": str(tmp_path / "results")},
        return_state=True,
    )
    assert state.is_completed(), state
    assert len(calls) == 2  # the checkpoints stage ran in both flow attempts
    assert len(list(markers.glob("start-*-0-*"))) == 1  # training ran once: the retry reused its result
    assert state.result()["best_checkpoint"].endswith("checkpoint_000001")


def test_a_flow_timeout_tears_the_worker_group_down(tmp_path, data):
    from flows.pipeline import training_pipeline

    markers = tmp_path / "markers"
    markers.mkdir()
    state = training_pipeline.with_options(timeout_seconds=25)(
        train_loop="pipeline_loops:counting_loop",
        train_loop_config={"epochs": 10_000, "sleep_s": 0.5, "marker_dir": str(markers)},
        datasets={"train": {"uri": data}},
        scaling={"num_workers": 2},
        run={"name": "timeout", "storage_path": str(tmp_path / "results")},
        return_state=True,
    )
    assert state.name == "TimedOut" and "exceeded timeout of 25" in (state.message or ""), state
    assert list(markers.glob("start-*")), "training never started, so the timeout proved nothing"
    # the ray_local fixture fails this test if any worker actor, process or placement group is left
