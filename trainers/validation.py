"""Checkpoint validation and the record of reported checkpoints, as in Ray Train (docs/checkpoints.md):
``ValidationConfig(fn)`` on the trainer, ``report(..., validation=True)`` in the loop, and
``get_all_reported_checkpoints()`` for the run's kept checkpoints with their validation status.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from storage import Checkpoint


class ValidationFn(Protocol):
    """A function that scores a checkpoint: ``fn(checkpoint, **fn_kwargs) -> dict of metrics``."""

    def __call__(self, checkpoint: Checkpoint, **kwargs: Any) -> dict: ...


@dataclasses.dataclass
class ValidationTaskConfig:
    """How to run one validation: ``report(..., validation=ValidationTaskConfig(...))``, or the
    trainer-wide default in ``ValidationConfig(task_config=...)``.

    ``fn_kwargs`` are keyword arguments for the validation function after the checkpoint, merged
    per report over the ``ValidationConfig`` defaults; they must be JSON values (a resumed run
    reads them back from its record to validate again). ``timeout_s`` stops a longer validation
    (None: no limit), recorded as ``VALIDATION_TIMEOUT``.
    """

    fn_kwargs: dict[str, Any] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            self.fn_kwargs = {}
        if not isinstance(self.fn_kwargs, dict) or not all(isinstance(k, str) for k in self.fn_kwargs):
            raise TypeError(
                f"ValidationTaskConfig(fn_kwargs={self.fn_kwargs!r}): must be a dict of argument name to value."
            )
        try:
            json.dumps(self.fn_kwargs, allow_nan=True)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"ValidationTaskConfig(fn_kwargs={self.fn_kwargs!r}): the values must be JSON values (numbers, "
                f"strings, lists, dicts), because they are stored with the checkpoint so that a resumed run can "
                f"validate it again ({error}). Pass a path or a name and load the object inside the validation "
                "function."
            ) from error
        timeout = self.timeout_s
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
        ):
            raise ValueError(
                f"ValidationTaskConfig(timeout_s={timeout!r}): must be None (no limit) or a number of seconds > 0."
            )


class ValidationConfig:
    """Validate reported checkpoints with ``fn``; pass it to the trainer as ``validation_config=``.

    ``fn(checkpoint, **fn_kwargs)`` must return a dict of metrics. ``task_config`` holds the
    default ``fn_kwargs`` and ``timeout_s`` (a report's own ``ValidationTaskConfig`` overrides
    them). ``ray_remote_kwargs`` are the validation task's Ray options, e.g. ``{"num_gpus": 1}``;
    by default one CPU, or what the cluster has left beside the training workers (down to none),
    so that a validation never waits for training to end.
    """

    def __init__(
        self,
        fn: ValidationFn,
        task_config: ValidationTaskConfig | None = None,
        ray_remote_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"ValidationConfig(fn={fn!r}): must be a function taking the checkpoint and returning a dict of metrics."
            )
        task_config = ValidationTaskConfig() if task_config is None else task_config
        if not isinstance(task_config, ValidationTaskConfig):
            raise TypeError(
                f"ValidationConfig(task_config={task_config!r}): must be a trainers.ValidationTaskConfig or None."
            )
        ray_remote_kwargs = {} if ray_remote_kwargs is None else ray_remote_kwargs
        if not isinstance(ray_remote_kwargs, dict):
            raise TypeError(
                f"ValidationConfig(ray_remote_kwargs={ray_remote_kwargs!r}): must be a dict of Ray task options, "
                "e.g. {'num_cpus': 1}."
            )
        self.fn = fn
        self.task_config = task_config
        self.ray_remote_kwargs = ray_remote_kwargs
        # Partial: a report's own fn_kwargs may supply the rest.
        where = "ValidationConfig(task_config=ValidationTaskConfig(fn_kwargs=...))"
        check_fn_kwargs(fn, task_config.fn_kwargs or {}, where, partial=True)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"ValidationConfig(fn={name}, task_config={self.task_config!r}, ray_remote_kwargs={self.ray_remote_kwargs!r})"


class ReportedCheckpointStatus(enum.Enum):
    """Where a reported checkpoint stands.

    ``COMMITTED``: saved, no validation asked. ``PENDING_VALIDATION``: saved, its validation has
    not ended. ``VALIDATED``: saved and validated (its metrics include the validation's).
    ``VALIDATION_TIMEOUT``: its validation ran past ``timeout_s``. ``VALIDATION_FAILED``: its
    validation raised (or could not be run).
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


class CheckpointConsistencyMode(enum.Enum):
    """What ``get_all_reported_checkpoints`` waits for before it answers.

    ``COMMITTED``: every checkpoint this worker reported is committed. ``VALIDATED``: that, and
    every validation of the run has ended.
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


@dataclasses.dataclass
class ReportedCheckpoint:
    """One kept checkpoint of the run, with its metrics (validation metrics merged in) and status."""

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus


def check_fn_kwargs(fn: Any, fn_kwargs: dict[str, Any], where: str, *, partial: bool = False) -> None:
    """Raise ``TypeError`` when ``fn(checkpoint, **fn_kwargs)`` cannot be called with these names
    (with ``partial``, only when a name is unknown: the others may come later)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function: Python cannot tell, the task will say
    try:
        (signature.bind_partial if partial else signature.bind)(None, **fn_kwargs)
    except TypeError as error:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"{where}: the validation function {name}{signature} cannot be called as "
            f"fn(checkpoint, **{fn_kwargs!r}) ({error}). Make the names in fn_kwargs match its parameters."
        ) from None


def resolve_request(validation: Any, config: ValidationConfig | None) -> bool | ValidationTaskConfig:
    """Check ``report(validation=...)`` against the trainer's ``validation_config``; return the
    request as recorded (False when none). One without a checkpoint is kept: the controller, which
    sees the whole round, refuses it when no rank passed a checkpoint."""
    if validation is False or validation is None:
        return False
    if validation is not True and not isinstance(validation, ValidationTaskConfig):
        raise TypeError(f"report(validation={validation!r}): must be True, False or a trainers.ValidationTaskConfig.")
    if config is None:
        raise ValueError(
            f"report(validation={validation!r}): this trainer has no validation function. Pass "
            "validation_config=trainers.ValidationConfig(fn) to the trainer (e.g. TorchTrainer(..., "
            "validation_config=...)), or drop validation= from report()."
        )
    overrides = (validation.fn_kwargs or {}) if isinstance(validation, ValidationTaskConfig) else {}
    where = (
        "report(validation=ValidationTaskConfig(fn_kwargs=...))" if overrides else f"report(validation={validation!r})"
    )
    check_fn_kwargs(config.fn, {**(config.task_config.fn_kwargs or {}), **overrides}, where)
    return validation


def request_to_json(validation: bool | ValidationTaskConfig) -> Any:
    """The form a validation request takes in the run's record (run.json)."""
    if isinstance(validation, ValidationTaskConfig):
        return {"fn_kwargs": dict(validation.fn_kwargs or {}), "timeout_s": validation.timeout_s}
    return bool(validation)


def request_from_json(stored: Any) -> bool | ValidationTaskConfig:
    """Read back what ``request_to_json`` wrote."""
    if isinstance(stored, dict):
        return ValidationTaskConfig(fn_kwargs=stored.get("fn_kwargs"), timeout_s=stored.get("timeout_s"))
    return bool(stored)
