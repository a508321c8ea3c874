"""The pipeline's parameters as pydantic models: the Prefect UI shows them as a form, and the server
checks ``prefect deployment run --param`` against them before a run is created. ``to_config()`` turns
each into the config a Ray Train user knows (``ScalingConfig``, ...), which checks itself too, so a
mistake fails before any worker starts."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from storage import settings
from storage.filesystem import is_uri
from storage.layout import run_folder
from trainers import CheckpointConfig, FailureConfig, ScalingConfig

ColumnKind = Literal["float", "int", "number", "string", "bool"]

#: ``package.module:function``: how a deployment names its training loop (no pickled code).
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ParamsModel(BaseModel):
    """The base of every flow parameter model: unknown fields are refused (a typo fails the run
    before it starts, naming the field) and values cannot be changed once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSource(ParamsModel):
    """One dataset the pipeline reads with Ray Data."""

    uri: str = Field(description="A file or folder: an absolute local path, or s3://, gs://, ... URI.")
    format: Literal["parquet", "csv", "json"] | None = Field(
        None, description="The file format; None guesses it from the file names."
    )
    required_columns: dict[str, ColumnKind] = Field(
        default_factory=dict, description="Columns that must exist, with the kind of values they hold."
    )

    @field_validator("uri")
    @classmethod
    def _absolute(cls, uri: str) -> str:
        if is_uri(uri):
            return uri
        local = os.path.expanduser(uri)
        if not os.path.isabs(local):
            raise ValueError(f"uri={uri!r}: give an absolute path or a URI; a relative path differs between machines.")
        return local


class Scaling(ParamsModel):
    """How many training workers to start and what each one reserves (``ScalingConfig``)."""

    num_workers: int = Field(2, ge=0, description="Training workers; 0 runs the loop in the task's process.")
    use_gpu: bool = Field(False, description="One GPU per worker, nccl between them.")
    resources_per_worker: dict[str, float] | None = Field(None, description='e.g. {"CPU": 1}')
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    accelerator_type: str | None = Field(
        None, min_length=1, description='Only nodes with this accelerator, e.g. "A100".'
    )
    min_workers: int | None = Field(
        None,
        ge=1,
        description="Elastic training: start with at least this many workers and grow to num_workers as the "
        "cluster allows; a lost node shrinks the run instead of failing it. None: exactly num_workers.",
    )
    label_selector: dict[str, str] | None = Field(
        None, description='Only nodes with these Ray labels, e.g. {"ray.io/market-type": "on-demand"}.'
    )
    elastic_resize_monitor_interval_s: float = Field(
        60.0, ge=0, description="Elastic training: how often a running job checks whether more workers now fit."
    )

    def to_config(self) -> ScalingConfig:
        """The ``ScalingConfig`` these parameters describe."""
        fields = self.model_dump()
        low = fields.pop("min_workers")
        if low is not None:
            if low > self.num_workers:
                raise ValueError(
                    f"scaling.min_workers={low} is above scaling.num_workers={self.num_workers}: num_workers is the "
                    "most workers an elastic run grows to."
                )
            fields["num_workers"] = (low, self.num_workers)
        return ScalingConfig(**fields)

    def identity(self) -> dict:
        """The fields that name a sweep trial's run. Fields added later appear only when set, so
        a sweep run again after an upgrade finds the trials it already trained."""
        fields = self.model_dump()
        for later in ("accelerator_type", "min_workers", "label_selector", "elastic_resize_monitor_interval_s"):
            if fields[later] == type(self).model_fields[later].default:
                del fields[later]
        return fields


class Checkpointing(ParamsModel):
    """Which checkpoints the run keeps (``CheckpointConfig``)."""

    num_to_keep: int | None = Field(None, ge=1, description="Keep the n best (plus the latest); None keeps all.")
    score_attribute: str | None = Field(
        None, description='The metric that ranks checkpoints, "outer/inner" for nested.'
    )
    score_order: Literal["max", "min"] = "max"

    def to_config(self) -> CheckpointConfig:
        """The ``CheckpointConfig`` these parameters describe."""
        return CheckpointConfig(
            num_to_keep=self.num_to_keep,
            checkpoint_score_attribute=self.score_attribute,
            checkpoint_score_order=self.score_order,
        )


class Failures(ParamsModel):
    """How many failures the run survives (``FailureConfig``) and how Prefect retries the driver."""

    max_failures: int = Field(
        0, ge=-1, description="Worker-group restarts inside one task run, from the latest checkpoint; -1 unlimited."
    )
    controller_failure_limit: int = Field(
        3, ge=-1, description="Prefect retries of the train task after a driver-level failure; -1 unlimited."
    )
    report_timeout_s: float | None = Field(None, gt=0, description="A rank this far behind the others counts as hung.")
    max_preemption_failures: int = Field(
        -1, ge=-1, description="Restarts after nodes were preempted (drained with a deadline); -1 unlimited."
    )
    preemption_grace_s: float = Field(
        0.0, ge=0, description="Seconds past a preemption deadline the workers get to finish a checkpoint."
    )
    retry_delay_s: float = Field(2.0, ge=0, description="Seconds between Prefect retries of the train task.")

    def to_config(self) -> FailureConfig:
        """The ``FailureConfig`` of ``fit()`` in the train task; Prefect spends ``controller_failure_limit``
        (``tasks.retries.train_task_options``)."""
        return FailureConfig(
            max_failures=self.max_failures,
            report_timeout_s=self.report_timeout_s,
            max_preemption_failures=self.max_preemption_failures,
            preemption_grace_s=self.preemption_grace_s,
        )


class RunSettings(ParamsModel):
    """Where the run keeps its checkpoints and state (``RunConfig``)."""

    name: str | None = Field(
        None, description="The run's folder under storage_path; same name = resume. Default: from the flow run."
    )
    storage_path: str | None = Field(
        None, description="Absolute local path or URI (s3://bucket/prefix). Default ~/flowtrain_results."
    )
    callbacks: list[str] = Field(
        default_factory=list, description="UserCallback classes as package.module:Class, called in the driver."
    )

    @field_validator("callbacks")
    @classmethod
    def _import_paths(cls, paths: list[str]) -> list[str]:
        return [check_import_path("callbacks", path) for path in paths]

    def completed(self, default_name: str) -> RunSettings:
        """These settings with the blanks filled: ``default_name``, and ``$FLOWTRAIN_STORAGE_PATH``
        for the storage (a deployment's job variable), else ``~/flowtrain_results``."""
        storage_path = self.storage_path or settings.STORAGE_PATH.read()
        return self.model_copy(update={"name": self.name or default_name, "storage_path": storage_path})

    @property
    def run_path(self) -> str:
        """The run's folder, ``{storage_path}/{name}`` (default storage when unset; ``name`` must be set)."""
        assert self.name is not None, "run_path of RunSettings without a name; complete them first"
        return run_folder(self.storage_path, self.name)


class Validation(ParamsModel):
    """Score each checkpoint the loop reports with ``report(..., validation=True)``, in a Ray task
    beside training (``trainers.ValidationConfig``); its metrics join that checkpoint's, so
    ``checkpointing.score_attribute`` can rank by them."""

    fn: str = Field(
        description="The validation function as package.module:function, e.g. 'tasks.loops:tabular_mlp_validation'."
    )
    fn_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments the function gets after the checkpoint."
    )
    timeout_s: float | None = Field(
        None, gt=0, description="A validation running longer is stopped and recorded as timed out."
    )
    num_cpus: float | None = Field(
        None, ge=0, description="CPUs the validation task reserves; None: 1 when free, else less."
    )

    @field_validator("fn")
    @classmethod
    def _import_path(cls, path: str) -> str:
        return check_import_path("validation.fn", path)

    def to_config(self) -> Any:
        """The ``trainers.ValidationConfig`` these parameters describe."""
        from trainers import ValidationConfig, ValidationTaskConfig

        fn = import_function("validation.fn", self.fn)
        remote = {"num_cpus": self.num_cpus} if self.num_cpus is not None else None
        return ValidationConfig(
            fn, ValidationTaskConfig(fn_kwargs=dict(self.fn_kwargs), timeout_s=self.timeout_s), remote
        )


class MLflowTracking(ParamsModel):
    """Log the run to MLflow (``trainers.integrations.mlflow.MLflowLoggerCallback``): one MLflow run
    per training run, continued by every restart and retry, linked from the train task run."""

    tracking_uri: str | None = Field(
        None,
        description="The MLflow tracking server, e.g. http://mlflow:5000. None: $MLFLOW_TRACKING_URI, else a local store.",
    )
    experiment: str | None = Field(
        None,
        description="The MLflow experiment, created when missing. None: $MLFLOW_EXPERIMENT_NAME, else MLflow's default.",
    )
    tags: dict[str, str] = Field(default_factory=dict, description="Tags to set on the MLflow run.")
    save_artifact: bool = Field(
        False, description="Upload the best checkpoint's files to the MLflow run when training ends."
    )


class Tracking(ParamsModel):
    """Experiment trackers the run logs every report to (``pip install 'flowtrain[tracking]'``)."""

    mlflow: MLflowTracking | None = Field(
        None, description='e.g. {"tracking_uri": "http://mlflow:5000", "experiment": "churn"}'
    )
    tensorboard: bool = Field(False, description="TensorBoard event files in the run folder (local storage only).")


class TorchTraining(ParamsModel):
    """A training loop to run on every worker: ``TorchTrainer`` by default, ``TensorflowTrainer`` or
    ``JaxTrainer`` with ``framework``."""

    #: The trainer the loop runs under: TorchTrainer, TensorflowTrainer (Keras) or JaxTrainer.
    framework: Literal["torch", "tensorflow", "jax"] = "torch"
    #: ``package.module:function`` (deployments), or the function itself (ad hoc calls).
    train_loop: str | Callable[..., Any]
    train_loop_config: dict[str, Any] = Field(default_factory=dict)
    #: How many reports a full run makes, for the progress artifact. Unset: the loop config's
    #: ``epochs``, ``num_epochs`` or ``num_boost_round`` when it is a whole number, else unknown.
    expected_reports: int | None = None
    #: How the checkpoints the loop asks to validate are validated; None: no validation.
    validation: Validation | None = None

    @model_validator(mode="before")
    @classmethod
    def _count_reports(cls, fields: Any) -> Any:
        config = fields.get("train_loop_config") if isinstance(fields, dict) else None
        if isinstance(config, dict) and fields.get("expected_reports") is None:
            counts = (
                config[key] for key in ("epochs", "num_epochs", "num_boost_round") if isinstance(config.get(key), int)
            )
            fields = {**fields, "expected_reports": next(counts, None)}
        return fields


class BoostingTraining(ParamsModel):
    """Gradient-boosted trees with no code: ``XGBoostTrainer``/``LightGBMTrainer`` in parameter form."""

    framework: Literal["xgboost", "lightgbm"]
    label_column: str = Field(description="The column to predict; every other column is a feature.")
    params: dict[str, Any] = Field(
        default_factory=dict, description='The library\'s parameters, e.g. {"objective": "binary:logistic"}.'
    )
    num_boost_round: int = Field(10, ge=1, description="Boosting rounds; one report (and checkpoint) per round.")

    @property
    def expected_reports(self) -> int:
        """One report per boosting round."""
        return self.num_boost_round


class DatasetSpec(ParamsModel):
    """What the ingest stage hands on: where a checked dataset is and what it holds (not its rows)."""

    name: str
    uri: str
    format: Literal["parquet", "csv", "json"] | None
    columns: dict[str, str]
    num_rows: int


class TrainSummary(ParamsModel):
    """What the train stage hands on: the run's folder and its outcome."""

    run_name: str
    run_path: str
    metrics: dict[str, Any] | None
    checkpoint_path: str | None
    num_reports: int


class CheckpointSummary(ParamsModel):
    """What the checkpoints stage hands on: the kept checkpoints, best first, and the best one."""

    run_path: str
    kept: list[str]
    best_path: str | None
    best_metrics: dict[str, Any] | None
    score_attribute: str | None


def check_import_path(field: str, path: str) -> str:
    """Raise ``ValueError`` unless ``path`` looks like ``package.module:name``."""
    if not isinstance(path, str) or not IMPORT_PATH.match(path):
        raise ValueError(f"{field}={path!r}: name it as package.module:name, e.g. 'tasks.loops:tabular_mlp_loop'.")
    return path


def import_object(field: str, path: str) -> Any:
    """Import ``package.module:name``; a ``ValueError`` naming the field when it cannot be found."""
    check_import_path(field, path)
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{field}={path!r}: cannot import {module_name!r} ({error}).") from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{field}={path!r}: module {module_name!r} has no {attribute!r}.") from None


def import_function(field: str, path: str) -> Callable[..., Any]:
    """``import_object`` of a function: a ``ValueError`` naming the field when ``path`` names another thing."""
    found = import_object(field, path)
    if not callable(found):
        raise ValueError(f"{field}={path!r} names a {type(found).__name__}, not a function.")
    return found


def resolve_train_loop(train_loop: str | Callable[..., Any]) -> Callable[..., Any]:
    """The training function: a callable as it is (ad hoc calls), or imported from its path (deployments)."""
    return train_loop if callable(train_loop) else import_function("train_loop", train_loop)
