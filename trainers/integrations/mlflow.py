"""MLflow for flowtrain runs, with the names of ``ray.air.integrations.mlflow`` (docs/tracking.md).

One flowtrain run is one MLflow run however often it resumes. Which one has one answer,
``our_run`` (the experiment's run tagged with the run's folder and the rank), for the callback
(rank 0) and ``setup_mlflow()`` alike; the run's ``flowtrain.last_step`` tag, set in the same
request as that step's metrics, is where a resumed run logs on, so no step is logged twice.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from storage.filesystem import display_path
from storage.retention import flatten
from trainers._extras import require
from trainers.callback import TrainRunContext, UserCallback
from trainers.integrations import scalar_metrics

if TYPE_CHECKING:
    from trainers.result import Result

#: The name the callback's state has in the run's record (``TrainRunContext.tracking``).
TRACKER = "mlflow"
#: Tags flowtrain sets on the MLflow runs it creates.
RUN_PATH_TAG = "flowtrain.run_path"
RANK_TAG = "flowtrain.rank"
LAST_STEP_TAG = "flowtrain.last_step"
BEST_CHECKPOINT_TAG = "flowtrain.best_checkpoint"
PREFECT_FLOW_RUN_TAG = "prefect.flow_run_id"
#: Set by Prefect in the process of a flow run it starts (deployments). trainers never import
#: Prefect (tests/test_layers.py), so this is what the callback knows on its own; the pipeline
#: passes the flow run's id in ``tags`` (``tasks.tracking.flow_run_id``).
PREFECT_FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"
#: MLflow's limits on one ``log_batch`` request.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100


class MLflowLoggerCallback(UserCallback):
    """Logs a run to MLflow from the driver: pass it in ``RunConfig(callbacks=[...])``.

    The MLflow run is named after the flowtrain run and tagged with its folder
    (``flowtrain.run_path``) and, when the run belongs to a Prefect flow run, that flow run's id
    (``prefect.flow_run_id``). It gets ``train_loop_config`` as parameters (nested keys as
    ``outer/inner``) and rank 0's numeric metrics of every report, with the report's index in the
    run's history as the step. A resumed run continues the same MLflow run; a step reported again
    after a restart keeps the value logged first. At the end the best checkpoint (by
    ``CheckpointConfig``'s rule; the latest without a score attribute) is named in the
    ``flowtrain.best_checkpoint`` tag, and the run is marked FINISHED, or FAILED when training
    failed.

    Args:
        tracking_uri: The MLflow tracking server or store, e.g. ``http://mlflow:5000``; None: MLflow's
            default (``$MLFLOW_TRACKING_URI``, else a local store).
        registry_uri: The MLflow model registry; None: MLflow's default.
        experiment_name: The MLflow experiment, created when it does not exist; None:
            ``$MLFLOW_EXPERIMENT_NAME``, else MLflow's default experiment.
        tags: Tags to set on the MLflow run (values as text).
        tracking_token: A token for the tracking server, set as ``$MLFLOW_TRACKING_TOKEN`` in the
            driver process.
        save_artifact: Also upload the best checkpoint's files to the MLflow run, under
            ``checkpoints/<checkpoint folder>``, when the run ends. (Ray uploads the trial's folder.)
        log_params_on_trial_end: Log the parameters when the run ends instead of when it starts.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        registry_uri: str | None = None,
        experiment_name: str | None = None,
        tags: dict[str, Any] | None = None,
        tracking_token: str | None = None,
        save_artifact: bool = False,
        log_params_on_trial_end: bool = False,
    ) -> None:
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f"MLflowLoggerCallback(tags={tags!r}): must be a dict of tag names to values, or None.")
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.should_save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end
        #: The MLflow run and experiment this callback logs to, and the tracking URI in use (MLflow's
        #: default filled in), once the run has started.
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.resolved_tracking_uri: str | None = None
        self._client: Any = None
        self._last_step = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # a client holds connections; the copy makes its own

    @property
    def run_url(self) -> str | None:
        """The MLflow run's page when the tracking URI is an HTTP(S) server, else None."""
        uri = self.resolved_tracking_uri
        if self.run_id is None or not uri or not uri.startswith(("http://", "https://")):
            return None
        return f"{uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"

    def before_run(self, run_context: TrainRunContext, history: Sequence[dict[str, Any]]) -> None:
        """Open the MLflow run (``our_run`` when resuming), log the parameters, and
        log the history's steps the MLflow run does not hold yet."""
        self._client = client = connect(self.tracking_uri, self.registry_uri, self.tracking_token)
        self.resolved_tracking_uri = client.tracking_uri
        experiment_id = experiment_id_for(client, None, self.experiment_name, create=True)
        run = our_run(client, experiment_id, run_context.run_path, 0)
        if run is None:
            run = client.create_run(
                experiment_id, run_name=run_context.name, tags={RUN_PATH_TAG: run_context.run_path, RANK_TAG: "0"}
            )
            run_context.save_tracking(
                TRACKER,
                {"run_id": run.info.run_id, "experiment_id": experiment_id, "tracking_uri": client.tracking_uri},
            )
        elif run.info.status != "RUNNING":
            client.update_run(run.info.run_id, status="RUNNING")
        self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
        self._last_step = int(run.data.tags.get(LAST_STEP_TAG, -1))
        from mlflow.entities import RunTag

        tags = {**_prefect_tags(), **self.tags}
        if tags:
            client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True)
        if not self.log_params_on_trial_end:
            log_params(client, run, run_context.train_loop_config)
        self._log_steps(enumerate(history))

    def after_report(self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        """Log rank 0's metrics at step ``num_reports - 1``, unless the MLflow run holds that step."""
        self._log_steps([(run_context.num_reports - 1, metrics[0])])

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        """Name (and with ``save_artifact`` upload) the best checkpoint, then end the MLflow run."""
        client = self._client
        if self.run_id is None:
            return  # the run failed before this callback opened its MLflow run
        if result.best_checkpoints:
            best = result.best_checkpoints[-1][0]
            client.set_tag(self.run_id, BEST_CHECKPOINT_TAG, display_path(best.filesystem, best.path))
            if self.should_save_artifact:
                with best.as_directory() as folder:
                    name = best.path.rstrip("/").rpartition("/")[2]
                    client.log_artifacts(self.run_id, folder, artifact_path=f"checkpoints/{name}")
        if self.log_params_on_trial_end:
            log_params(client, client.get_run(self.run_id), run_context.train_loop_config)
        client.set_terminated(self.run_id, status="FINISHED" if result.error is None else "FAILED")

    def _log_steps(self, steps: Any) -> None:
        """Log ``(step, metrics)`` pairs after the last step the MLflow run holds, a few per request;
        each request moves the ``flowtrain.last_step`` tag along with its metrics."""
        from mlflow.entities import Metric

        batch: list[Any] = []
        last = self._last_step
        for step, metrics in steps:
            if step <= last:
                continue
            stamp = int(time.time() * 1000)
            points = [Metric(key, value, stamp, step) for key, value in scalar_metrics(metrics).items()]
            if batch and len(batch) + len(points) > MAX_METRICS_PER_BATCH:
                self._send(batch, last)
                batch = []
            batch += points
            last = step
        if last > self._last_step:
            self._send(batch, last)

    def _send(self, points: list[Any], last_step: int) -> None:
        from mlflow.entities import RunTag

        # A step with more metrics than one request takes is split; the tag moves with its last part.
        for start in range(0, max(len(points), 1), MAX_METRICS_PER_BATCH):
            tags = [RunTag(LAST_STEP_TAG, str(last_step))] if start + MAX_METRICS_PER_BATCH >= len(points) else []
            self._client.log_batch(
                self.run_id, metrics=points[start : start + MAX_METRICS_PER_BATCH], tags=tags, synchronous=True
            )
        self._last_step = last_step


class _NoopModule:
    """What ``setup_mlflow`` returns on ranks that do not log: every attribute and call does nothing."""

    def __getattr__(self, name: str) -> _NoopModule:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def setup_mlflow(
    config: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    experiment_id: str | None = None,
    experiment_name: str | None = None,
    tracking_token: str | None = None,
    artifact_location: str | None = None,
    run_name: str | None = None,
    create_experiment_if_not_exists: bool = False,
    tags: dict[str, Any] | None = None,
    rank_zero_only: bool = True,
) -> Any:
    """Start (or, after a restart, resume) this run's MLflow run inside the training function and
    return the ``mlflow`` module to log with, as ``ray.air.integrations.mlflow.setup_mlflow`` does
    (docs/tracking.md has an example).

    On ranks other than 0 it returns a stand-in whose every call does nothing (with
    ``rank_zero_only=False`` every rank logs, each to its own MLflow run). A restarted worker or a
    rerun of ``fit()`` logs to the same MLflow run (found by the ``flowtrain.run_path`` tag and the
    rank; the ``MLflowLoggerCallback``'s in the same experiment). MLflow keeps both values of a step
    logged twice, so log with the step your checkpoint resumes at, or let the callback log the
    reports. Outside a training function it starts a new MLflow run.

    Args:
        config: Logged as the MLflow run's parameters (nested keys as ``outer/inner``); values
            logged before keep their first value.
        tracking_uri: The MLflow tracking server or store; None: MLflow's default.
        registry_uri: The MLflow model registry; None: MLflow's default.
        experiment_id: An existing experiment's id; takes precedence over ``experiment_name``.
        experiment_name: The experiment's name; None: ``$MLFLOW_EXPERIMENT_NAME``, else MLflow's
            default experiment.
        tracking_token: A token for the tracking server, set as ``$MLFLOW_TRACKING_TOKEN`` in this process.
        artifact_location: Where a created experiment keeps its artifacts.
        run_name: The MLflow run's name; None: the flowtrain run's name (``<name>-rank<r>`` for other ranks).
        create_experiment_if_not_exists: Create ``experiment_name`` when it does not exist, else raise ``ValueError``.
        tags: Tags to set on the MLflow run.
        rank_zero_only: Only rank 0 logs; the others get the no-op stand-in.
    """
    from trainers import context as _context

    context = _context._current  # None outside a training function
    if context is not None and rank_zero_only and context.get_world_rank() != 0:
        return _NoopModule()
    mlflow = require("mlflow", extra="tracking")
    client = connect(tracking_uri, registry_uri, tracking_token)
    mlflow.set_tracking_uri(client.tracking_uri)
    if registry_uri is not None:
        mlflow.set_registry_uri(registry_uri)
    experiment = experiment_id_for(
        client,
        experiment_id,
        experiment_name,
        create=create_experiment_if_not_exists,
        artifact_location=artifact_location,
    )
    run_tags = {k: str(v) for k, v in (tags or {}).items()}
    found = None
    if context is not None:
        rank = context.get_world_rank()
        run_path = context.get_storage().experiment_path
        found = our_run(client, experiment, run_path, rank)
        run_tags.update({RUN_PATH_TAG: run_path, RANK_TAG: str(rank)})
        name = context.get_experiment_name()
        run_name = run_name or (name if rank == 0 else f"{name}-rank{rank}")
    if mlflow.active_run() is None:
        if found is not None:
            mlflow.start_run(run_id=found.info.run_id)
            mlflow.set_tags(run_tags)
        else:
            mlflow.start_run(experiment_id=experiment, run_name=run_name, tags=run_tags)
    log_params(client, client.get_run(mlflow.active_run().info.run_id), config)
    return mlflow


def connect(tracking_uri: str | None, registry_uri: str | None, tracking_token: str | None) -> Any:
    """An ``MlflowClient`` for these URIs (MLflow's defaults for None), with the token set."""
    require("mlflow", extra="tracking")
    from mlflow.tracking import MlflowClient

    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)


def experiment_id_for(
    client: Any,
    experiment_id: str | None,
    experiment_name: str | None,
    *,
    create: bool,
    artifact_location: str | None = None,
) -> str:
    """The experiment to log to: ``experiment_id`` when it exists, else ``experiment_name`` (or
    ``$MLFLOW_EXPERIMENT_NAME``), created when ``create``; MLflow's default experiment when neither
    is given."""
    from mlflow.entities import Experiment
    from mlflow.exceptions import MlflowException

    experiment_id = experiment_id or os.environ.get("MLFLOW_EXPERIMENT_ID")
    if experiment_id is not None:
        try:
            return client.get_experiment(experiment_id).experiment_id
        except MlflowException:
            if experiment_name is None:
                raise ValueError(
                    f"experiment_id={experiment_id!r}: there is no MLflow experiment with that id at {client.tracking_uri}."
                ) from None
    given = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    name = given or Experiment.DEFAULT_EXPERIMENT_NAME
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    if not create and given:
        raise ValueError(
            f"experiment_name={name!r}: there is no MLflow experiment of that name at {client.tracking_uri}. "
            "Create it, or pass create_experiment_if_not_exists=True."
        )
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        found = client.get_experiment_by_name(name)  # another rank or driver created it meanwhile
        if found is None:
            raise
        return found.experiment_id


def log_params(client: Any, run: Any, config: dict[str, Any] | None) -> None:
    """Log ``config`` as the run's parameters; keys it already has keep their first value
    (MLflow refuses to change one), with a warning naming those that differ."""
    from mlflow.entities import Param

    params = {key: str(value) for key, value in flatten(dict(config or {})).items()}
    logged = run.data.params
    changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
    if changed:
        warnings.warn(
            f"MLflow run {run.info.run_id} keeps the first value of parameter(s) {changed}: the config of this "
            "resumed run differs there, and MLflow does not change a logged parameter.",
            UserWarning,
            stacklevel=3,
        )
    new = [Param(k, v) for k, v in params.items() if k not in logged]
    for start in range(0, len(new), MAX_PARAMS_PER_BATCH):
        client.log_batch(run.info.run_id, params=new[start : start + MAX_PARAMS_PER_BATCH], synchronous=True)


def our_run(client: Any, experiment_id: str, run_path: str, rank: int) -> Any:
    """The MLflow run that rank ``rank`` of the flowtrain run in ``run_path`` logs to: the oldest
    run of the experiment tagged with both, or None when there is none yet. One whose runs were
    all deleted gets a new MLflow run: a warning says so."""
    from mlflow.entities import ViewType

    where = f"tags.`{RUN_PATH_TAG}` = '{run_path}' and tags.`{RANK_TAG}` = '{rank}'"
    runs = client.search_runs(
        [experiment_id], filter_string=where, run_view_type=ViewType.ALL, order_by=["attributes.start_time ASC"]
    )
    live = [run for run in runs if run.info.lifecycle_stage != "deleted"]
    if runs and not live:
        warnings.warn(
            f"The MLflow run {runs[0].info.run_id} this run logged to is deleted at {client.tracking_uri}; "
            "logging to a new MLflow run.",
            UserWarning,
            stacklevel=3,
        )
    return live[0] if live else None


def _prefect_tags() -> dict[str, str]:
    flow_run_id = os.environ.get(PREFECT_FLOW_RUN_ENV)
    return {PREFECT_FLOW_RUN_TAG: flow_run_id} if flow_run_id else {}
