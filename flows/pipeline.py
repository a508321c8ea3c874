"""The training pipelines: ingest (Ray Data) -> distributed training -> checkpoints, as Prefect flows.

``training_pipeline`` runs a torch training loop; ``xgboost_pipeline`` and ``lightgbm_pipeline``
train gradient-boosted trees from parameters alone. Run them ad hoc (``training_pipeline(...)``),
as deployments (``prefect deployment run 'flowtrain-pipeline/...' --param ...``), or on a schedule
(``prefect.yaml``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, Literal

from prefect import Flow, flow
from prefect.runtime import flow_run

from tasks.checkpoints import checkpoints
from tasks.ingest import ingest
from tasks.params import (
    BoostingTraining,
    Checkpointing,
    DatasetSource,
    Failures,
    RunSettings,
    Scaling,
    TorchTraining,
    Tracking,
    Validation,
)
from tasks.retries import train_task_options
from tasks.tracking import flow_run_id
from tasks.train import train


def flow_run_name(default: str | None = None) -> str:
    """What the flow run is called in the UI: its ``run.name`` parameter (the training run's or the
    sweep's name); without one ``default``, else ``<what it trains>-<time>``."""
    params = flow_run.parameters or {}
    run = params.get("run")
    name = (run.get("name") if isinstance(run, dict) else getattr(run, "name", None)) or default
    if name:
        return name
    loop = params.get("train_loop", flow_run.flow_name or "train")
    what = loop.rpartition(":")[2] if isinstance(loop, str) else getattr(loop, "__name__", "train")
    return f"{what}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


def _pipeline(
    training: TorchTraining | BoostingTraining,
    datasets: dict[str, DatasetSource],
    scaling: Scaling,
    checkpointing: Checkpointing,
    failures: Failures,
    run: RunSettings,
    tracking: Tracking,
) -> dict[str, Any]:
    """The wiring every pipeline shares: ingest each dataset, train, then keep and publish checkpoints."""
    run = run.completed(default_name=f"pipeline-{str(flow_run_id())[:8]}")  # the flow run's id: stable across retries
    specs = [ingest(name, source) for name, source in datasets.items()]
    summary = train.with_options(**train_task_options(failures))(  # Prefect retries the driver-level failures
        training,
        datasets=specs,
        scaling=scaling,
        checkpointing=checkpointing,
        failures=failures,
        run=run,
        tracking=tracking,
    )
    kept = checkpoints(summary, checkpointing)
    return {
        **summary.model_dump(exclude={"checkpoint_path"}),  # run_name, run_path, metrics, num_reports
        "best_checkpoint": kept.best_path,
        "best_metrics": kept.best_metrics,
        "kept_checkpoints": kept.kept,
    }


@flow(name="flowtrain-pipeline", flow_run_name=flow_run_name)
def training_pipeline(
    train_loop: str | Callable[..., Any] = "tasks.loops:tabular_mlp_loop",
    train_loop_config: dict[str, Any] | None = None,
    datasets: dict[str, DatasetSource] | None = None,
    scaling: Scaling = Scaling(),
    checkpointing: Checkpointing = Checkpointing(),
    failures: Failures = Failures(),
    run: RunSettings = RunSettings(),
    validation: Validation | None = None,
    framework: Literal["torch", "tensorflow", "jax"] = "torch",
    tracking: Tracking = Tracking(),
) -> dict[str, Any]:
    """Ingest ``datasets``, train ``train_loop`` on ``scaling.num_workers`` workers, keep and publish
    the checkpoints. Returns the run's folder, its final metrics and its best checkpoint.

    ``train_loop`` is ``package.module:function`` (deployments) or a function (ad hoc calls); it
    receives ``train_loop_config``. The same ``run.name`` resumes a run from its latest checkpoint.
    With ``validation``, each checkpoint the loop reports with ``report(..., validation=True)`` (the
    example loop does when ``train_loop_config`` has ``"validate": true``) is scored by
    ``validation.fn`` in a Ray task while training goes on; ``scaling.min_workers`` makes the run elastic.
    ``framework`` picks the trainer: ``"torch"`` (TorchTrainer), ``"tensorflow"`` (TensorflowTrainer,
    e.g. ``tasks.keras_loops:tabular_keras_loop``) or ``"jax"`` (JaxTrainer). ``tracking`` logs every
    report to MLflow (``{"mlflow": {"tracking_uri": ..., "experiment": ...}}``, the MLflow run linked
    from the train task run) and/or to TensorBoard event files in the run folder.
    """
    training = TorchTraining(
        train_loop=train_loop,
        train_loop_config=train_loop_config or {},
        validation=validation,
        framework=framework,
    )
    return _pipeline(training, datasets or {}, scaling, checkpointing, failures, run, tracking)


def _boosting_flow(framework: Literal["xgboost", "lightgbm"], description: str) -> Flow[..., dict[str, Any]]:
    """The flow ``flowtrain-<framework>`` (deployments say ``<flow name>/<deployment>``) that trains
    gradient-boosted trees from parameters alone: the same parameters and wiring for every library."""

    def pipeline(
        datasets: dict[str, DatasetSource],
        label_column: str,
        params: dict[str, Any] | None = None,
        num_boost_round: int = 10,
        scaling: Scaling = Scaling(),
        checkpointing: Checkpointing = Checkpointing(),
        failures: Failures = Failures(),
        run: RunSettings = RunSettings(),
        tracking: Tracking = Tracking(),
    ) -> dict[str, Any]:
        training = BoostingTraining(
            framework=framework, label_column=label_column, params=params or {}, num_boost_round=num_boost_round
        )
        return _pipeline(training, datasets, scaling, checkpointing, failures, run, tracking)

    pipeline.__name__ = pipeline.__qualname__ = f"{framework}_pipeline"  # the entrypoint prefect.yaml names
    pipeline.__doc__ = description
    return flow(name=f"flowtrain-{framework}", flow_run_name=flow_run_name)(pipeline)


xgboost_pipeline = _boosting_flow(
    "xgboost",
    """XGBoost on ``scaling.num_workers`` workers from parameters alone: ``datasets["train"]`` is
    trained on, every other dataset is evaluated each round (``valid-logloss``, ...).""",
)
lightgbm_pipeline = _boosting_flow(
    "lightgbm",
    """LightGBM (data parallel) on ``scaling.num_workers`` workers from parameters alone:
    ``datasets["train"]`` is trained on, every other dataset is evaluated each round.""",
)
