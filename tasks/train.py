"""The train stage: build the trainer from the pipeline's parameters and run ``fit()`` here.

Worker failures are restarted by the controller inside this task run (``max_failures``); a
driver-level failure fails the task, and Prefect's retry (``tasks.retries``) calls ``fit()`` again
with the same run name, which resumes from the run's snapshot.
"""

from __future__ import annotations

import importlib
from typing import Any

from prefect import get_run_logger, task

from tasks.console import run_output
from tasks.params import (
    BoostingTraining,
    Checkpointing,
    DatasetSpec,
    Failures,
    RunSettings,
    Scaling,
    TorchTraining,
    Tracking,
    TrainSummary,
    import_object,
    resolve_train_loop,
)
from tasks.reporting import PrefectReporter, log_failure, publish_metrics, publish_run_health, without_traceback
from tasks.tracking import tracking_callbacks
from trainers import TRAIN_DATASET_KEY, DataConfig, RunConfig, TrainingFailedError, UserCallback

#: The trainer of each ``framework`` the parameters name: (module, class).
TRAINERS = {
    "torch": ("trainers.torch", "TorchTrainer"),
    "tensorflow": ("trainers.tensorflow", "TensorflowTrainer"),
    "jax": ("trainers.jax", "JaxTrainer"),
    "xgboost": ("trainers.xgboost", "XGBoostTrainer"),
    "lightgbm": ("trainers.lightgbm", "LightGBMTrainer"),
}


def reports_already_kept(run: RunSettings) -> int:
    """How many reports a rerun of ``run`` starts after: those up to its latest checkpoint (0 if new)."""
    from storage import StorageError, load_run

    try:
        return load_run(run.run_path).snapshot.kept_reports()
    except StorageError:
        return 0


def _callbacks(paths: list[str]) -> list[UserCallback]:
    callbacks = []
    for path in paths:
        cls = import_object("callbacks", path)
        callback = cls() if isinstance(cls, type) else cls
        if not isinstance(callback, UserCallback):
            raise ValueError(f"callbacks: {path!r} is not a trainers.UserCallback subclass.")
        callbacks.append(callback)
    return callbacks


def build_trainer(
    training: TorchTraining | BoostingTraining, *, run_config: RunConfig, scaling: Scaling, datasets: dict[str, Any]
) -> Any:
    """The Ray Train-style trainer for ``training`` (checked here, before any worker starts).

    A training loop gets ``datasets["train"]`` in equal shards and every other dataset whole on
    every worker (as the boosting trainers do): an equal split drops the rows left over (1 of 113
    on 2 workers), and a validation set must be scored on all of its rows."""
    module, class_name = TRAINERS[training.framework]
    trainer_cls = getattr(importlib.import_module(module), class_name)  # only the framework asked for is imported
    if isinstance(training, BoostingTraining):
        return trainer_cls(
            datasets=datasets,
            label_column=training.label_column,
            params=dict(training.params),
            num_boost_round=training.num_boost_round,
            scaling_config=scaling.to_config(),
            run_config=run_config,
        )
    return trainer_cls(
        resolve_train_loop(training.train_loop),
        train_loop_config=dict(training.train_loop_config),
        scaling_config=scaling.to_config(),
        run_config=run_config,
        datasets=datasets or None,
        dataset_config=DataConfig(datasets_to_split=[name for name in datasets if name == TRAIN_DATASET_KEY]),
        validation_config=training.validation.to_config() if training.validation else None,
    )


@task(name="train", task_run_name="train {run.name}", persist_result=True)
def train(
    training: TorchTraining | BoostingTraining,
    *,
    datasets: list[DatasetSpec],
    scaling: Scaling,
    checkpointing: Checkpointing,
    failures: Failures,
    run: RunSettings,
    tracking: Tracking = Tracking(),
) -> TrainSummary:
    """Run distributed training to the end and return where its results are.

    ``run.name`` must be set (the flow names the run): it is what makes a retry resume, and what
    keeps a retry logging to the same MLflow run (``tracking``).
    """
    from trainers.cluster import ensure_ray
    from trainers.data import read_dataset

    if not run.name:
        raise ValueError("run.name: the train stage needs the run's name, so that a retry resumes the same run.")
    reporter = PrefectReporter(
        run.name, expected_reports=training.expected_reports, reports_so_far=reports_already_kept(run)
    )
    run_config = RunConfig(
        name=run.name,
        storage_path=run.storage_path,
        checkpoint_config=checkpointing.to_config(),
        failure_config=failures.to_config(),
        callbacks=[reporter, *_callbacks(run.callbacks), *tracking_callbacks(tracking)],
    )
    with run_output(run.name):  # Ray Data quiet; Ray's, the workers' and fit()'s warnings into this run's logs
        opened = {}
        if datasets:
            ensure_ray()
            opened = {spec.name: read_dataset(spec.uri, format=spec.format) for spec in datasets}
        trainer = build_trainer(training, run_config=run_config, scaling=scaling, datasets=opened)
        try:
            result = trainer.fit()
        except TrainingFailedError as error:
            log_failure(error)
            publish_run_health(run.name, run.run_path)  # its failures on the timeline
            raise without_traceback(error) from None  # the traceback is in the log just written: once
    reporter.finish()
    history = result.metrics_dataframe.to_dict("records") if result.metrics_dataframe is not None else []
    health = publish_run_health(run.name, result.uri)  # first: the metric chart links to it
    notes = getattr(getattr(trainer, "train_loop_per_worker", None), "metric_notes", None)  # what each figure is
    publish_metrics(
        run.name, history, reporter=reporter, checkpointing=checkpointing, notes=notes, health_artifact=health
    )
    latest = result.checkpoint.path if result.checkpoint else None
    get_run_logger().info("run %r finished: %d reports, latest checkpoint %s", run.name, len(history), latest)
    return TrainSummary(
        run_name=run.name,
        run_path=result.uri,  # a URI on object stores: Result.path is inside result.filesystem
        metrics=result.metrics,
        checkpoint_path=latest,
        num_reports=len(history),
    )
