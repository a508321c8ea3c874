"""Experiment tracking that survives restarts (issue 37.2), against a real MLflow tracking server.

A 2-worker run loses a worker, then its driver is SIGKILLed and the run is rerun: MLflow holds
one run with every report once, in order, its parameters and its best checkpoint, and the
TensorBoard event files in the run folder hold every step once. The same through the Prefect
pipeline with a task retry.

Run as a script, this file is the driver that gets killed: ``python test_tracking.py STORAGE
MARKERS TRACKING_URI`` joins the Ray in RAY_ADDRESS and trains until the loop holds.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

from loops import resume_after_checkpoint
from trainers import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    get_context,
    report,
)
from trainers.integrations.mlflow import BEST_CHECKPOINT_TAG, RUN_PATH_TAG, MLflowLoggerCallback
from trainers.integrations.tensorboard import TensorBoardLoggerCallback

EPOCHS = 6
KILL_AT = 3  # rank 1 dies before reporting epoch 3: epoch 2 (after the epoch-1 checkpoint) is reported again
HOLD_AFTER = 4  # the driver is killed after epoch 4 (after the epoch-3 checkpoint): the rerun reports it again
EXPERIMENT = "restarts"


def tracked_loop(config: dict) -> None:
    """Rank 0 checkpoints odd epochs; ``score`` peaks at epoch 3. Rank 1 SIGKILLs itself once at
    ``kill_at``; after ``hold_after`` the loop waits (for the driver's kill) while a ``hold`` file exists."""
    markers = pathlib.Path(config["marker_dir"])
    rank = get_context().get_world_rank()
    for epoch in range(resume_after_checkpoint("epoch.txt"), config["epochs"]):
        if epoch == config["kill_at"] and rank == 1 and not (markers / "killed").exists():
            (markers / "killed").touch()
            os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0 and epoch % 2 == 1:
                pathlib.Path(folder, "epoch.txt").write_text(str(epoch))
                checkpoint = Checkpoint.from_directory(folder)
            report({"epoch": epoch, "score": -abs(epoch - 3)}, checkpoint=checkpoint)
        if epoch == config["hold_after"] and (markers / "hold").exists():
            threading.Event().wait()


def trainer(storage: str, markers: str, tracking_uri: str) -> DataParallelTrainer:
    return DataParallelTrainer(
        tracked_loop,
        train_loop_config={"epochs": EPOCHS, "kill_at": KILL_AT, "hold_after": HOLD_AFTER, "marker_dir": markers},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run",
            storage_path=storage,
            checkpoint_config=CheckpointConfig(checkpoint_score_attribute="score"),
            failure_config=FailureConfig(max_failures=1),
            callbacks=[
                MLflowLoggerCallback(
                    tracking_uri, experiment_name=EXPERIMENT, tags={"team": "tests"}, save_artifact=True
                ),
                TensorBoardLoggerCallback(),
            ],
        ),
    )


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (SQLite backend, artifacts served by it) on 127.0.0.1."""
    home = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = home / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{home}/mlflow.db",
                "--default-artifact-root",
                str(home / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300  # importing the server takes long on a busy machine
        while True:
            if server.poll() is not None:
                pytest.fail(f"the MLflow server exited ({server.returncode}):\n{log.read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the MLflow server did not answer in time:\n{log.read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def the_only_run(client, experiment: str):
    """The one MLflow run of ``experiment`` (fails if there are more)."""
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def steps_and_values(client, run_id: str, key: str) -> list[tuple[int, float]]:
    """The metric's history as MLflow returns it (every logged point, in the order logged)."""
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)
    return [(m.step, m.value) for m in history]


def tensorboard_steps(run_dir: pathlib.Path, tag: str) -> list[int]:
    """Every step of ``tag`` in the run's event files, duplicates and all (no purging of replayed steps)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), purge_orphaned_data=False)
    events.Reload()
    return [scalar.step for scalar in events.Scalars(tag)]


def wait_for_steps(client, run_dir: pathlib.Path, count: int, driver: subprocess.Popen, log: pathlib.Path) -> None:
    """Wait until the MLflow run named in run.json holds ``count`` steps of ``epoch``."""
    deadline = time.monotonic() + 300
    while True:
        if driver.poll() is not None:
            pytest.fail(f"the driver exited ({driver.returncode}) early:\n{log.read_text()}")
        try:
            run_id = json.loads((run_dir / "run.json").read_text())["tracking"]["mlflow"]["run_id"]
        except (OSError, ValueError, KeyError):
            run_id = None  # not written yet, or caught mid-replace
        if run_id is not None and len(client.get_metric_history(run_id, "epoch")) >= count:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the driver logged no {count} steps in time:\n{log.read_text()}")
        time.sleep(0.2)


@pytest.mark.usefixtures("ray_local")
def test_a_killed_worker_and_a_killed_driver_leave_one_mlflow_run_with_every_step_once(tmp_path, mlflow_server):
    import ray
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    markers = tmp_path / "markers"
    markers.mkdir()
    (markers / "hold").touch()
    run_dir = tmp_path / "run"
    log = tmp_path / "driver.log"
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, __file__, str(tmp_path), str(markers), mlflow_server],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_steps(client, run_dir, HOLD_AFTER + 1, driver, log)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert (markers / "killed").exists()  # the worker was killed in the driver's run, and restarted
    (markers / "hold").unlink()

    result = trainer(str(tmp_path), str(markers), mlflow_server).fit()

    assert list(result.metrics_dataframe["epoch"]) == list(range(EPOCHS))
    run = the_only_run(client, EXPERIMENT)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    for key, value_of in (("epoch", float), ("score", lambda epoch: float(-abs(epoch - 3)))):
        assert steps_and_values(client, run.info.run_id, key) == [(step, value_of(step)) for step in range(EPOCHS)]
    assert run.data.params == {
        "epochs": str(EPOCHS),
        "kill_at": str(KILL_AT),
        "hold_after": str(HOLD_AFTER),
        "marker_dir": str(markers),
    }
    best = result.get_best_checkpoint("score", "max")
    assert (run_dir / "checkpoint_000001" / "epoch.txt").read_text() == "3" and best.path == str(
        run_dir / "checkpoint_000001"
    )
    assert run.data.tags[BEST_CHECKPOINT_TAG] == best.path
    assert run.data.tags[RUN_PATH_TAG] == str(run_dir) and run.data.tags["team"] == "tests"
    [artifact] = client.list_artifacts(run.info.run_id, "checkpoints/checkpoint_000001")
    assert artifact.path == "checkpoints/checkpoint_000001/epoch.txt"
    assert json.loads((run_dir / "run.json").read_text())["tracking"]["mlflow"]["run_id"] == run.info.run_id

    assert (
        len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2
    )  # the killed driver's and the rerun's
    assert tensorboard_steps(run_dir, "epoch") == list(range(EPOCHS))
    assert tensorboard_steps(run_dir, "score") == list(range(EPOCHS))


@pytest.mark.usefixtures("prefect_harness", "ray_local")
def test_the_pipeline_keeps_one_mlflow_run_through_a_task_retry_and_links_it(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import pipeline_loops
    from flows.pipeline import training_pipeline

    markers = tmp_path / "markers"
    markers.mkdir()
    storage = tmp_path / "results"
    pipeline_loops.FailOnceCallback.marker = markers / "driver-failed"  # raises after epoch 1's report, once
    try:
        state = training_pipeline(
            train_loop="pipeline_loops:counting_loop",
            train_loop_config={"epochs": 3, "marker_dir": str(markers)},
            datasets={"train": {"uri": pipeline_loops.write_classification_parquet(tmp_path / "data", rows=128)}},
            scaling={"num_workers": 2},
            failures={"max_failures": 0, "controller_failure_limit": 1, "retry_delay_s": 0},
            run={"name": "tracked", "storage_path": str(storage), "callbacks": ["pipeline_loops:FailOnceCallback"]},
            tracking={"mlflow": {"tracking_uri": mlflow_server, "experiment": "pipeline"}, "tensorboard": True},
            return_state=True,
        )
    finally:
        pipeline_loops.FailOnceCallback.marker = None
    assert state.is_completed(), state
    assert (markers / "driver-failed").exists()  # the train task failed once and Prefect retried it

    client = MlflowClient(mlflow_server)
    run = the_only_run(client, "pipeline")
    # The failed attempt's callbacks stopped before the tracker saw epoch 1; the retry logged it first.
    assert steps_and_values(client, run.info.run_id, "epoch") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert run.data.params["epochs"] == "3"
    assert run.data.tags["prefect.flow_run_id"] == str(state.state_details.flow_run_id)
    assert tensorboard_steps(storage / "tracked", "epoch") == [0, 1, 2]
    with get_client(sync_client=True) as prefect:
        links = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["tracked-mlflow-run"]))
        )
    page = f"{mlflow_server}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    assert [link.data for link in links] == [
        f"[MLflow run {run.info.run_id}]({page})"
    ] * 2  # each try of the task linked the same run


def loop_with_setup_mlflow(config: dict) -> None:
    from trainers.integrations.mlflow import setup_mlflow

    mlflow = setup_mlflow(config, tracking_uri=config["uri"], experiment_name="in-loop")
    mlflow.log_metric("from_loop", 1.0, step=0)
    report({"x": 1})
    mlflow.end_run()  # this loop runs in the test's process (num_workers=0): leave no active run behind


def test_setup_mlflow_logs_to_the_callbacks_run_and_finds_it_again_on_a_rerun(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    for _ in range(2):  # the rerun finds the same MLflow run by the run's folder
        DataParallelTrainer(
            loop_with_setup_mlflow,
            train_loop_config={"uri": mlflow_server},
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(
                name="loop",
                storage_path=str(tmp_path),
                callbacks=[MLflowLoggerCallback(mlflow_server, experiment_name="in-loop")],
            ),
        ).fit()
    client = MlflowClient(mlflow_server)
    run = the_only_run(client, "in-loop")
    assert run.data.params == {"uri": mlflow_server}
    assert steps_and_values(client, run.info.run_id, "x") == [(0, 1.0)]  # the rerun's report 0 was logged already
    assert steps_and_values(client, run.info.run_id, "from_loop") == [
        (0, 1.0),
        (0, 1.0),
    ]  # the loop's own logging repeats


def test_a_deleted_mlflow_run_is_not_logged_to_again_and_run_json_names_the_new_one(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    def fit() -> None:
        DataParallelTrainer(
            lambda: report({"x": 1}),
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(
                name="gone",
                storage_path=str(tmp_path),
                callbacks=[MLflowLoggerCallback(mlflow_server, experiment_name="deleted")],
            ),
        ).fit()

    fit()
    client = MlflowClient(mlflow_server)
    first = the_only_run(client, "deleted")
    client.delete_run(first.info.run_id)
    with pytest.warns(UserWarning, match=f"MLflow run {first.info.run_id} .* is deleted"):
        fit()
    second = the_only_run(client, "deleted")  # search_runs lists live runs only
    assert second.info.run_id != first.info.run_id and second.info.status == "FINISHED"
    recorded = json.loads((tmp_path / "gone" / "run.json").read_text())["tracking"]["mlflow"]["run_id"]
    assert recorded == second.info.run_id


def test_tensorboard_refuses_a_run_folder_on_an_object_store():
    from trainers.callback import TrainRunContext

    context = TrainRunContext("run", "s3://bucket/runs/run", 1, RunConfig(), ScalingConfig(), None)
    with pytest.raises(ValueError, match=r"s3://bucket/runs/run\. Use a local RunConfig\(storage_path=\.\.\.\)"):
        TensorBoardLoggerCallback().before_run(context, [])


if __name__ == "__main__":
    trainer(sys.argv[1], sys.argv[2], sys.argv[3]).fit()


def test_the_callback_tags_its_run_from_prefects_variable_without_importing_prefect():
    script = (
        "import sys\n"
        "from trainers.integrations.mlflow import _prefect_tags\n"
        "print(_prefect_tags().get('prefect.flow_run_id'), 'prefect' in sys.modules)\n"
    )
    env = {**os.environ, "PREFECT__FLOW_RUN_ID": "0f1e2d3c"}
    given = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert given.stdout.split() == ["0f1e2d3c", "False"]
    env.pop("PREFECT__FLOW_RUN_ID")
    absent = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert absent.stdout.split() == ["None", "False"]
