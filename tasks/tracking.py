"""Experiment trackers in the train stage: the callbacks the ``tracking`` parameter asks for, and
a link from the Prefect task run to the MLflow run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from tasks.params import Tracking
from tasks.reporting import artifact_key
from trainers import TrainRunContext, UserCallback
from trainers.integrations.mlflow import PREFECT_FLOW_RUN_TAG, MLflowLoggerCallback


class LinkedMLflowLogger(MLflowLoggerCallback):
    """``MLflowLoggerCallback`` that links its MLflow run from the Prefect task run as soon as the
    MLflow run is open, so it can be watched while training runs."""

    def before_run(self, run_context: TrainRunContext, history: Sequence[dict[str, Any]]) -> None:
        super().before_run(run_context, history)
        publish_mlflow_run(run_context.name, self)


def flow_run_id() -> str | None:
    """The id of the Prefect flow run this code runs for, or None: the one place the pipeline reads
    it (from this thread's flow or task run context, else the variable Prefect sets in a process)."""
    return flow_run.get_id() or None


def tracking_callbacks(tracking: Tracking) -> list[UserCallback]:
    """The callbacks ``tracking`` asks for; the MLflow run is tagged with the flow run's id."""
    callbacks: list[UserCallback] = []
    if tracking.mlflow is not None:
        # Read here, in the train task's context: the callback may run where that context is not.
        flow_id = flow_run_id()
        flow_tags = {PREFECT_FLOW_RUN_TAG: flow_id} if flow_id else {}
        callbacks.append(
            LinkedMLflowLogger(
                tracking.mlflow.tracking_uri,
                experiment_name=tracking.mlflow.experiment,
                tags={**flow_tags, **tracking.mlflow.tags},
                save_artifact=tracking.mlflow.save_artifact,
            )
        )
    if tracking.tensorboard:
        from trainers.integrations.tensorboard import TensorBoardLoggerCallback

        callbacks.append(TensorBoardLoggerCallback())
    return callbacks


def publish_mlflow_run(run_name: str, logger: MLflowLoggerCallback) -> None:
    """A markdown artifact linking the MLflow run's page; when the tracking URI is not an HTTP server
    it names the run's id and store instead (the page is then wherever ``mlflow ui`` serves them)."""
    if logger.run_url is not None:
        markdown = f"[MLflow run {logger.run_id}]({logger.run_url})"
    else:
        markdown = (
            f"MLflow run `{logger.run_id}` (experiment `{logger.experiment_id}`) in `{logger.resolved_tracking_uri}`"
        )
    create_markdown_artifact(
        markdown=markdown,
        key=artifact_key(run_name, "mlflow-run"),
        description=f"The MLflow run of training run {run_name!r}",
    )
