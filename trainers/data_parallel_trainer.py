"""DataParallelTrainer: run one training function on N workers, as Ray Train's does."""

from __future__ import annotations

import datetime
import inspect
import logging
import warnings
from collections.abc import Callable
from typing import Any, TypedDict

from storage import Checkpoint, CheckpointConfig, RunStorage, settings
from storage.health import Timeline
from storage.lease import new_owner
from trainers._internal.log_level import log_level
from trainers._internal.ray_private import TuneTrainableAttributes
from trainers._internal.run.controller import Controller, ControllerSettings
from trainers._internal.run.failure_policy import FailurePolicy
from trainers._internal.run.health_watch import RunHealthWatch
from trainers._internal.run.progress import ProgressLine
from trainers._internal.run.run_hooks import RunHooks
from trainers._internal.run.validation_runner import make_runner
from trainers._internal.session.data import (
    capture_data_context,
    check_dataset_values,
    check_row_counts,
    resolve_datasets,
)
from trainers._internal.workers.run_workers import LocalWorkers, RayWorkers, RunSpec
from trainers.backend import BackendConfig
from trainers.callback import TrainRunContext
from trainers.config import DataConfig, FailureConfig, RunConfig, ScalingConfig
from trainers.context import StorageInfo
from trainers.errors import ControllerError, PreemptionError, TrainingFailedError, WorkerGroupError
from trainers.health import PreflightSettings, StragglerSettings, draw_timeline_into
from trainers.result import Result
from trainers.tuning import worker_start_timeout_s
from trainers.validation import ValidationConfig


def _takes_config(fn: Callable[..., Any]) -> bool:
    """Whether the training function takes the config argument (0 or 1 parameters allowed)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 1:
        raise ValueError(
            f"train_loop_per_worker {getattr(fn, '__name__', fn)!r} takes {len(required)} required arguments; "
            "it must take none, or one (the train_loop_config dict)."
        )
    return bool(positional) or any(p.kind is p.VAR_POSITIONAL for p in params)


def _check_picklable(field: str, value: Any) -> None:
    """Workers receive ``value`` pickled: fail before the run folder exists when it cannot be."""
    import reprlib

    from trainers._checks import pickling_error

    error = pickling_error(value)
    if error is not None:
        raise TypeError(
            f"{field}={reprlib.repr(value)} cannot be sent to the workers: it does not pickle ({type(error).__name__}: {error}). "
            "Pass plain values and build locks, clients or open files inside the training function."
        ) from error


def _check_type(field: str, value: Any, cls: type) -> None:
    if value is not None and not isinstance(value, cls):
        raise TypeError(f"{field}={value!r}: must be a trainers.{cls.__name__}.")


def _restore_removed(cls: type, method: str) -> DeprecationWarning:
    from storage.config import deprecated

    return deprecated(
        f"{cls.__name__}.{method}()",
        "To continue a run, build the trainer again with the same RunConfig(storage_path=..., name=...) "
        "and call fit(): it resumes from the run's latest checkpoint. To start a new run from a "
        "checkpoint, pass resume_from_checkpoint=.",
    )


def _warn_controller_failure_limit(failure_config: FailureConfig | None) -> None:
    """Say that ``controller_failure_limit`` bounds reruns of ``fit()``, which it cannot make itself."""
    limit = failure_config.controller_failure_limit if failure_config is not None else -1
    if limit != -1:
        warnings.warn(
            f"FailureConfig(controller_failure_limit={limit}) has no effect on fit() itself: fit() does not retry "
            "a failure of the driver (a ControllerError: storage, Ray or a callback failing under the controller; "
            "or this process dying). It bounds the retries of whatever runs fit() again: the Prefect pipeline's "
            "train task retries that many times, each retry resuming from the run's latest checkpoint; do the same "
            "by calling fit() again with the same RunConfig(storage_path=..., name=...). (Ray Train counts a worker "
            "group that fails to start here; flowtrain counts it against FailureConfig.max_failures.)",
            UserWarning,
            stacklevel=3,
        )


def _caller_stacklevel() -> int:
    """The stack level of the user's line that built the trainer (past our own subclasses' __init__)."""
    frame, level = inspect.currentframe(), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("trainers."):
        frame, level = frame.f_back, level + 1
    return level - 1


logger = logging.getLogger(__name__)


class TrainerOptions(TypedDict, total=False):
    """The keywords every framework's trainer takes as ``DataParallelTrainer`` does, beside its own
    config (``TorchTrainer(fn, torch_config=..., **options)``); written once, typed for IDEs."""

    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig | None
    run_config: RunConfig | None
    datasets: dict[str, Any] | None
    dataset_config: DataConfig | None
    validation_config: Any
    metadata: dict[str, Any] | None
    resume_from_checkpoint: Checkpoint | None


class DataParallelTrainer(TuneTrainableAttributes):
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` workers.

    Each worker calls ``trainers.report(...)`` to report metrics and checkpoints; ``fit()`` returns
    a :class:`Result`, or raises :class:`TrainingFailedError` when the failure budget is spent.
    A second ``fit()`` with the same ``RunConfig(storage_path=..., name=...)`` resumes the run
    from its latest checkpoint.
    """

    #: The keyword a framework's trainer takes its ``BackendConfig`` under, and that config's class
    #: (``TorchTrainer``: ``("torch_config", TorchConfig)``); ``__init__`` checks it for every trainer.
    _backend_config_arg: tuple[str, type[BackendConfig]] = ("backend_config", BackendConfig)

    # Ray Train's signature, which must stay exact (tests/test_api_surface.py checks it).
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        backend_config: BackendConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        validation_config: Any = None,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker={train_loop_per_worker!r}: must be a function.")
        self._takes_config = _takes_config(train_loop_per_worker)
        if train_loop_config is not None and not self._takes_config:
            # Ray Train accepts this (its own XGBoost and LightGBM tests do it) and drops the config.
            warnings.warn(
                f"train_loop_config was given, but train_loop_per_worker "
                f"{getattr(train_loop_per_worker, '__name__', '')!r} takes no argument, so it never sees "
                "the config; add a `config` parameter to receive it.",
                UserWarning,
                stacklevel=_caller_stacklevel(),
            )
        _check_type("scaling_config", scaling_config, ScalingConfig)
        _check_type("run_config", run_config, RunConfig)
        _check_type("dataset_config", dataset_config, DataConfig)
        arg, config_cls = self._backend_config_arg
        if backend_config is not None and not isinstance(backend_config, config_cls):
            home = config_cls.__module__.rpartition(".")[0]  # trainers.torch.config -> trainers.torch
            raise TypeError(f"{arg}={backend_config!r}: must be a {home}.{config_cls.__name__}.")
        if datasets is not None and not isinstance(datasets, dict):
            raise TypeError(f"datasets={datasets!r}: must be a dict of name to ray.data.Dataset, e.g. {{'train': ds}}.")
        check_dataset_values(datasets or {})
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.backend_config = backend_config if backend_config is not None else config_cls()
        self.scaling_config = scaling_config or ScalingConfig()
        # A backend that cannot run on these resources (TorchConfig(backend="nccl") without GPUs)
        # fails here, before any worker starts.
        self.backend_config.collective_backend(self.scaling_config.use_gpu)
        self.run_config = run_config or RunConfig()
        self.datasets = datasets or {}
        self.dataset_config = dataset_config or DataConfig()
        self.metadata = metadata or {}
        _check_type("resume_from_checkpoint", resume_from_checkpoint, Checkpoint)
        #: Where a new run starts when its storage holds no checkpoint yet (as in Ray Train).
        self.resume_from_checkpoint = resume_from_checkpoint
        _check_type("validation_config", validation_config, ValidationConfig)
        #: How reported checkpoints are validated (``trainers.ValidationConfig``), or None.
        self.validation_config = validation_config

    # -- Ray Train V1 leftovers ------------------------------------------------------------------

    @classmethod
    def restore(cls, *args: Any, **kwargs: Any) -> DataParallelTrainer:
        """Removed in Ray Train V2 (raises DeprecationWarning): build the trainer again with the
        same ``RunConfig(storage_path=..., name=...)`` and call ``fit()``; it resumes the run."""
        raise _restore_removed(cls, "restore")

    @classmethod
    def can_restore(cls, *args: Any, **kwargs: Any) -> bool:
        """Removed in Ray Train V2 (raises DeprecationWarning): a run resumes whenever its
        ``RunConfig(storage_path=..., name=...)`` folder holds a checkpoint."""
        raise _restore_removed(cls, "can_restore")

    # -- Ray Tune: tune.Tuner(trainer, param_space={"train_loop_config": {...}}) ------------------

    def as_trainable(self) -> Callable[[dict[str, Any]], None]:
        """This trainer as a Ray Tune trainable: each trial runs ``fit()`` with its
        ``config["train_loop_config"]`` merged into ``train_loop_config``, in a run named after the
        trial, reserving one bundle per worker of ``scaling_config``."""
        from trainers.tune.trial import trainer_as_trainable

        return trainer_as_trainable(self)

    def __call__(self, config: dict[str, Any]) -> None:
        """Run one Ray Tune trial of this trainer (what ``tune.Tuner(trainer, ...)`` calls)."""
        from trainers.tune.trial import run_trainer_trial

        run_trainer_trial(self, config)

    def _default_tune_resources(self) -> Any:
        # What a trial reserves unless tune.with_resources(trainer, ...) says (TuneTrainableAttributes).
        from trainers.tune.trial import trainer_trial_resources

        return trainer_trial_resources(self)

    @property
    def _log_level(self) -> str | None:
        logging_config = self.run_config.logging_config
        return logging_config.log_level if logging_config is not None else None

    def fit(self) -> Result:
        """Train; return the Result, or raise TrainingFailedError when training cannot finish."""
        scaling, run_config = self.scaling_config, self.run_config
        settings.check_all()  # a bad FLOWTRAIN_* value fails here, before anything starts
        _warn_controller_failure_limit(run_config.failure_config)
        name = run_config.name or f"{type(self).__name__}_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
        storage = RunStorage(  # resolves the URI only: a bad storage_path fails before Ray starts
            run_config.resolved_storage_path,
            name,
            filesystem=run_config.storage_filesystem,
            checkpoint_config=run_config.checkpoint_config or CheckpointConfig(),
            resume_from_checkpoint=self.resume_from_checkpoint,
        )
        if scaling.max_workers > 0 or self.datasets:
            from trainers._internal.ray_init import ensure_ray

            ensure_ray()
        if scaling.max_workers > 0:
            from trainers._internal.workers.resources import (
                check_feasible,
                check_label_selector,
                cluster_nodes,
                leave_cpu_for_data,
            )

            _check_picklable("train_loop_per_worker", self.train_loop_per_worker)
            _check_picklable("train_loop_config", self.train_loop_config)

            nodes = cluster_nodes()
            check_feasible(scaling, nodes)
            check_label_selector(scaling)
            if self.datasets:
                scaling = leave_cpu_for_data(scaling, nodes)
        datasets = resolve_datasets(self.datasets) if self.datasets else {}
        if datasets:
            check_row_counts(datasets, self.dataset_config, max(1, scaling.max_workers))
        storage.open(owner=new_owner())
        try:
            with log_level(self._log_level):
                return self._run(name, storage, scaling, datasets)
        finally:
            storage.close()

    def _run_spec(self, name: str, storage: RunStorage, scaling: ScalingConfig, datasets: dict[str, Any]) -> RunSpec:
        """What every attempt of this run starts its workers from."""
        run_config = self.run_config
        return RunSpec(
            name=name,
            train_fn=self.train_loop_per_worker,
            train_loop_config=self.train_loop_config,
            takes_config=self._takes_config,
            scaling=scaling,
            backend_config=self.backend_config,
            datasets=datasets,
            dataset_config=self.dataset_config,
            storage_info=StorageInfo(
                storage_path=run_config.resolved_storage_path,
                experiment_path=storage.run_uri,
                experiment_fs_path=storage.run_path,
                storage_filesystem=storage.filesystem,
            ),
            layout=storage.layout,
            metadata=self.metadata,
            start_timeout_s=worker_start_timeout_s(self.scaling_config.max_workers),
            runtime_env=run_config.worker_runtime_env,
            score_attribute=storage.checkpoint_config.checkpoint_score_attribute,
            log_level=self._log_level,
            data_context=capture_data_context(),
            validation_config=self.validation_config,
            preflight=PreflightSettings.from_env(),
            storage_marker=storage.lease_path,
            restartable=(run_config.failure_config or FailureConfig()).max_failures != 0,
        )

    def _controller_settings(self, name: str, storage: RunStorage, scaling: ScalingConfig) -> ControllerSettings:
        """The run as listeners see it, and the collective backend a hang report names."""
        context = TrainRunContext(
            name, storage.run_uri, 0, self.run_config, scaling, self.train_loop_config, _run_record=storage
        )
        return ControllerSettings(
            run_context=context,
            collective_backend=self.backend_config.collective_backend(scaling.use_gpu),
            stragglers=StragglerSettings.from_env(),
            gpus_per_worker=scaling.num_gpus_per_worker,
        )

    def _run(self, name: str, storage: RunStorage, scaling: ScalingConfig, datasets: dict[str, Any]) -> Result:
        run_config = self.run_config
        timeline_wanted = settings.TIMELINE.read()
        spec = self._run_spec(name, storage, scaling, datasets)
        progress = ProgressLine(name)
        validations = make_runner(self.validation_config, storage, scaling, run_config.worker_runtime_env)
        controller = Controller(
            LocalWorkers(spec) if scaling.max_workers == 0 else RayWorkers(spec),
            storage=storage,
            policy=FailurePolicy(  # what a failure costs, and whether the run may restart after it
                run_config.failure_config or FailureConfig(),
                elastic=scaling.elasticity_enabled,
                is_setup_clash=self.backend_config.is_setup_clash,
            ),
            listeners=[progress, *(run_config.callbacks or [])],  # the driver's own, then Prefect's, Tune's, the user's
            validations=validations,
            settings=self._controller_settings(name, storage, scaling),
        )
        hooks = RunHooks(name, list(run_config.callbacks or []), controller, storage)
        try:
            hooks.starting()
            value = controller.run()
            if validations is not None:
                validations.wait_all()  # the Result includes every validation's metrics
        except (TrainingFailedError, ValueError, TypeError) as error:
            if isinstance(error, (WorkerGroupError, PreemptionError)):
                storage.finish(error=str(error))
            hooks.failed(error)
            raise  # a training failure, or the user's mistake: as it is
        except Exception as error:
            failure = ControllerError(error)
            hooks.failed(failure)
            raise failure from error
        finally:
            if validations is not None:
                validations.cancel_all()  # a failed run's pending validations rerun when it resumes
            health = next(listener for listener in controller.listeners if isinstance(listener, RunHealthWatch))
            if health.account is not None:
                progress.note(health.account.describe())  # the health watch logs it too
            if health.timeline is not None:
                _draw_timeline_if_wanted(storage, health.timeline, timeline_wanted)
            progress.close()
        storage.finish()
        return hooks.finished(Result._from_run(storage, return_value=value, error=None))


def _draw_timeline_if_wanted(storage: RunStorage, timeline: Timeline, setting: str) -> None:
    """Draw the run's timeline picture when ``FLOWTRAIN_TIMELINE`` asks for it (by default when the
    run had something to look at); a picture that cannot be drawn is only logged."""
    if setting == "never" or (setting == "auto" and not timeline.notable):
        return
    try:
        path = draw_timeline_into(storage, timeline)
    except Exception as error:  # noqa: BLE001 - the run's outcome matters, not its picture
        logger.warning("the run's timeline picture was not drawn: %s", error)
        return
    logger.info("%s: timeline picture at %s", timeline.run_name, path)
