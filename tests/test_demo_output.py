"""What a new user sees of the demo (``make demo``): validation metrics over every validation row,
one log line per ingested dataset, Ray's notices at their true weight, and the way to the UI.

On the demo's own data (scikit-learn's breast cancer set: 113 validation rows, an odd number that
an equal split between 2 workers would cut to 112).
"""

from __future__ import annotations

import pytest

from tasks.example_data import LABEL, write_breast_cancer

#: Rows of the demo's validation file (20% of each class of 569 rows).
DEMO_VALID_ROWS = 113


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> dict[str, str]:
    return write_breast_cancer(str(tmp_path_factory.mktemp("demo-data")))


@pytest.mark.usefixtures("ray_local")
def test_the_demo_loop_scores_every_validation_row_on_2_workers(demo_data, tmp_path):
    import pyarrow.parquet as pq

    from tasks.params import Scaling, TorchTraining
    from tasks.train import build_trainer
    from trainers import RunConfig
    from trainers.data import read_dataset

    assert pq.read_metadata(demo_data["valid"]).num_rows == DEMO_VALID_ROWS
    training = TorchTraining(
        train_loop="tasks.loops:tabular_mlp_loop", train_loop_config={"label_column": LABEL, "epochs": 2}
    )
    trainer = build_trainer(
        training,
        run_config=RunConfig(name="valid-rows", storage_path=str(tmp_path)),
        scaling=Scaling(num_workers=2),
        datasets={name: read_dataset(uri) for name, uri in demo_data.items()},
    )
    result = trainer.fit()
    history = result.metrics_dataframe.to_dict("records")
    assert [m["epoch"] for m in history] == [0, 1]
    assert all(m["valid_rows"] == DEMO_VALID_ROWS for m in history), history
    # The training set is still split in equal shards: 456 rows, 228 a worker.
    assert all(m["train_rows"] == 456 for m in history), history


def flow_run_logs(flow_run_id) -> list[tuple[int, str]]:
    """(level, message) of every log record of the flow run, its task runs' included, oldest first."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), sort=LogSort.TIMESTAMP_ASC
        )
    return [(log.level, log.message) for log in logs]


@pytest.mark.usefixtures("prefect_harness", "ray_local")
def test_ingest_logs_one_line_per_dataset_and_ray_s_token_notice_is_not_in_the_log(demo_data):
    import logging

    import pyarrow.parquet as pq
    from prefect import flow, task

    from tasks.console import run_output
    from tasks.ingest import ingest
    from tasks.params import DatasetSource

    @task(name="ray-notice")
    def ray_notice() -> None:
        # What Ray logs when a new local ray.init() turns token authentication on (the demo's
        # ingest starts Ray); this test's Ray is already running, so Ray's own function says it.
        from ray._private.authentication.authentication_token_setup import _warn_token_auth_enabled

        with run_output():
            _warn_token_auth_enabled()

    @flow(name="ingest-demo-data")
    def ingest_demo_data() -> None:
        for name, uri in demo_data.items():
            ingest(name, DatasetSource(uri=uri))
        ray_notice()

    state = ingest_demo_data(return_state=True)
    assert state.is_completed(), state
    logs = flow_run_logs(state.state_details.flow_run_id)
    for name, uri in demo_data.items():
        about = [message for _, message in logs if f"dataset {name!r}" in message]
        rows = pq.read_metadata(uri).num_rows
        assert about == [f"dataset {name!r} at {uri}: {rows} rows, 31 columns"], logs
    assert not [message for _, message in logs if "mean_radius" in message], logs  # no column listing
    # Logged at DEBUG, below what the run's log keeps: noise a user cannot act on.
    assert not [message for _, message in logs if message.startswith("Token authentication is enabled")], logs
    assert any(message.startswith("dataset ") for _, message in logs)  # the log itself was read
    assert all(level < logging.WARNING for level, _ in logs), logs


def test_the_pipeline_s_loop_trainers_split_the_train_dataset_only():
    from tasks.params import Scaling, TorchTraining
    from tasks.train import build_trainer
    from trainers import RunConfig

    def split(names: list[str]) -> object:
        trainer = build_trainer(
            TorchTraining(train_loop="tasks.loops:tabular_mlp_loop"),
            run_config=RunConfig(name="split", storage_path="/tmp/unused"),
            scaling=Scaling(num_workers=2),
            datasets=dict.fromkeys(names, list),  # a function returning a dataset: not called before fit()
        )
        return trainer.dataset_config.datasets_to_split

    assert split(["train", "valid"]) == ["train"]
    assert split(["valid"]) == [] and split([]) == []  # a loop without "train" gets every dataset whole


def test_the_closing_hint_names_the_server_the_run_went_to():
    import uuid

    import prefect.settings as settings

    from tasks.console import flow_run_ui_lines

    run_id = uuid.uuid4()
    with settings.temporary_settings({settings.PREFECT_API_URL: "http://10.1.2.3:4300/api"}):
        assert flow_run_ui_lines(run_id) == [f"  open http://10.1.2.3:4300/runs/flow-run/{run_id}"]
    # PREFECT_API_URL unset: the run went to a temporary server on the local database; a server
    # started on it listens where the server settings say.
    unset = {settings.PREFECT_API_URL, settings.PREFECT_UI_URL}
    with settings.temporary_settings({settings.PREFECT_SERVER_API_PORT: 4321}, restore_defaults=unset):
        assert flow_run_ui_lines(run_id, prefect_cli="/venv/bin/prefect") == [
            "  /venv/bin/prefect server start",
            f"  then open http://127.0.0.1:4321/runs/flow-run/{run_id}",
        ]
