"""FailureConfig -> Prefect task options: which failures of the train task Prefect retries.

These are the driver-level rows of the failure budget table in docs/design.md (``RETRY_TABLE``); the
worker-level rows are the controller's ``FailurePolicy``, inside one task run. A retry calls ``fit()``
again with the same ``storage_path`` and ``name``: it resumes from the run's snapshot (its latest
checkpoint and failure counts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task

from storage import RunInProgressError, SnapshotCorruptError, StorageError, StorageNotSharedError
from tasks.params import Failures
from trainers import ControllerError, WorkerGroupError

P = ParamSpec("P")
R = TypeVar("R")

#: Prefect needs a number; ``controller_failure_limit=-1`` (unlimited) becomes this many retries.
UNLIMITED_RETRIES = 100

#: Errors a second try can get past (checked in order: the first matching row decides).
RETRY_TABLE: tuple[tuple[type[BaseException], bool, str], ...] = (
    (WorkerGroupError, False, "the workers' failure budget (max_failures) is spent; it is kept in run.json"),
    (SnapshotCorruptError, False, "the run's snapshot cannot be read; a retry would read it again"),
    (RunInProgressError, True, "another driver holds the run; its lease goes stale if it died"),
    (ControllerError, True, "the driver failed (Ray, storage or scheduling), not the training code"),
    (StorageNotSharedError, False, "a node does not see the run's storage; a retry would place workers there again"),
    (StorageError, True, "storage did not answer"),
    (OSError, True, "an I/O error, a dropped connection or a timeout"),
    (ValueError, False, "a mistake in the parameters, the data or the cluster size"),
    (TypeError, False, "a mistake in the parameters"),
)


def should_retry(error: BaseException | None) -> bool:
    """Whether a failed train stage is worth another try, by ``RETRY_TABLE``; unknown errors are not."""
    if error is None:
        return False
    return next((retry for kind, retry, _why in RETRY_TABLE if isinstance(error, kind)), _is_ray_system_error(error))


def _is_ray_system_error(error: BaseException) -> bool:
    """Ray's own failures (lost connection, dead GCS) are driver-level; checked by name so this module
    does not import Ray."""
    return any(
        cls.__module__.startswith("ray.") and cls.__name__ in ("RaySystemError", "GetTimeoutError")
        for cls in type(error).__mro__
    )


def failed_with(state: Any) -> BaseException | None:
    """The exception a failed Prefect state holds, or None."""
    data = getattr(state, "data", None)
    if isinstance(data, BaseException):
        return data
    try:
        result = state.result(raise_on_failure=False)
    except Exception as error:  # noqa: BLE001 - the state could only re-raise it
        return error
    return result if isinstance(result, BaseException) else None


def retry_driver_failures(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn`` of the train task: retry only what ``RETRY_TABLE`` allows.

    A plain function on purpose: Prefect runs the condition only when ``inspect.isfunction`` is true
    (a partial or callable object silently turns retries off).
    """
    return should_retry(failed_with(state))


def retry_io_errors(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn`` of ``io_task``: only I/O errors (a bad file is not retried)."""
    return isinstance(failed_with(state), OSError)


def io_task(*, name: str, task_run_name: str, retries: int) -> Callable[[Callable[P, R]], Task[P, R]]:
    """The task decorator of the stages that read or tidy storage (ingest, checkpoints): Prefect
    retries their I/O errors only (``retry_io_errors``), 2 s apart, and keeps their results."""
    return task(
        name=name,
        task_run_name=task_run_name,
        retries=retries,
        retry_delay_seconds=2,
        retry_condition_fn=retry_io_errors,
        persist_result=True,
    )


def train_task_options(failures: Failures) -> dict[str, Any]:
    """The Prefect options of the train task for these failure settings (``task.with_options(**...)``)."""
    limit = failures.controller_failure_limit
    return {
        "retries": UNLIMITED_RETRIES if limit == -1 else limit,
        "retry_delay_seconds": failures.retry_delay_s,
        "retry_condition_fn": retry_driver_failures,
    }
