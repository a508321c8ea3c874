"""The driver side of checkpoint validation: start a Ray task per checkpoint, record how it ended.

The controller calls ``poll()`` as it steps. Every checkpoint the run's record marks
PENDING_VALIDATION is validated, oldest first, one task at a time (as in Ray Train). The work list
is the run's record, so a run resumed after its driver died validates the unfinished ones again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import warnings
from typing import Any

import ray
from ray.exceptions import RayError, TaskCancelledError

from storage import Checkpoint, RunRecord
from storage.snapshot import VALIDATED, VALIDATION_FAILED, VALIDATION_TIMEOUT, CheckpointRecord
from trainers._checks import pickling_error
from trainers.validation import ValidationConfig, ValidationTaskConfig, request_from_json

logger = logging.getLogger(__name__)

#: Validations running at once (Ray Train runs one at a time too).
MAX_IN_FLIGHT = 1
#: The default CPU ask of a validation task when the cluster has that much beside the workers.
DEFAULT_NUM_CPUS = 1.0


def _validate(fn: Any, checkpoint: Checkpoint, fn_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The body of a validation task."""
    from trainers._internal.session.worker_session import plain_metrics

    metrics = fn(checkpoint, **fn_kwargs)
    if not isinstance(metrics, dict):
        raise TypeError(
            f"the validation function {getattr(fn, '__qualname__', fn)} returned {type(metrics).__name__}; "
            "it must return a dict of metrics, e.g. {'val_loss': 0.1}."
        )
    return plain_metrics(metrics)


@functools.cache
def _remote() -> Any:
    return ray.remote(_validate)


def task_options(config: ValidationConfig, free_cpus: float) -> dict[str, Any]:
    """The Ray options of a validation task: ``ray_remote_kwargs``, with a CPU ask that fits the
    ``free_cpus`` beside the training workers unless the user chose one (else a validation could not
    start before training ends, and a loop waiting for it would wait forever)."""
    options = dict(config.ray_remote_kwargs)
    if "num_cpus" not in options:
        options["num_cpus"] = max(0.0, min(DEFAULT_NUM_CPUS, free_cpus))
    elif isinstance(options["num_cpus"], (int, float)) and options["num_cpus"] > free_cpus:
        warnings.warn(
            f"ValidationConfig(ray_remote_kwargs={{'num_cpus': {options['num_cpus']}}}) asks more than the "
            f"{free_cpus:g} CPU(s) the cluster has beside the training workers: validations will wait until "
            "training ends, and get_all_reported_checkpoints() in VALIDATED mode waits with them.",
            stacklevel=3,
        )
    return options


def settle_without_config(storage: RunRecord) -> None:
    """A resumed run whose trainer has no ``validation_config`` cannot validate the checkpoints
    left pending: mark them VALIDATION_FAILED, with a warning, so nothing waits for them."""
    for record in storage.pending_validations:
        warnings.warn(
            f"checkpoint {record.dir_name} of run {storage.run_uri} was waiting for its validation, but this "
            "trainer has no validation_config; it is recorded as VALIDATION_FAILED. Pass the same "
            "validation_config=trainers.ValidationConfig(fn) to validate it.",
            UserWarning,
            stacklevel=3,
        )
        storage.record_validation(record.dir_name, {}, VALIDATION_FAILED)


def make_runner(
    config: ValidationConfig | None, storage: RunRecord, scaling: Any, runtime_env: dict | None = None
) -> ValidationRunner | None:
    """The run's validation runner, or None without a ``validation_config`` (then checkpoints left
    pending are settled). Tasks run in the workers' ``runtime_env`` unless ``ray_remote_kwargs``
    names one. Called before any worker starts, so a function that does not pickle fails first.
    """
    if config is None:
        settle_without_config(storage)
        return None
    from trainers._internal.ray_init import ensure_ray
    from trainers._internal.workers.resources import cluster_nodes

    if (error := pickling_error(config.fn)) is not None:
        raise TypeError(
            f"ValidationConfig(fn={config.fn!r}) cannot be sent to its Ray task: it does not pickle "
            f"({type(error).__name__}: {error}). Build clients, locks or open files inside the function."
        ) from error
    ensure_ray()
    free_cpus = sum(node.get("CPU", 0.0) for node in cluster_nodes()) - scaling.total_resources.get("CPU", 0.0)
    options = task_options(config, free_cpus)
    if runtime_env is not None:
        options.setdefault("runtime_env", runtime_env)
    return ValidationRunner(config, storage, options)


@dataclasses.dataclass
class _Running:
    dir_name: str
    started: float
    timeout_s: float | None


class ValidationRunner:
    """Runs the validations the run's record asks for and writes their outcome back into it."""

    def __init__(self, config: ValidationConfig, storage: RunRecord, options: dict[str, Any]) -> None:
        self.config = config
        self.storage = storage
        self.options = options
        self._fn = ray.put(config.fn)  # sent once, not with every task
        self._running: dict[Any, _Running] = {}

    @property
    def busy(self) -> bool:
        """True while a validation runs or waits to start."""
        return bool(self._running or self.storage.pending_validations)

    def poll(self) -> None:
        """Record the validations that ended or ran out of time, start the next; never blocks."""
        self._stop_late()
        if self._running:
            done, _ = ray.wait(list(self._running), num_returns=len(self._running), timeout=0)
            for ref in done:
                self._record(ref, self._running.pop(ref))
        self._start_next()

    def wait_all(self) -> None:
        """Wait until every validation has ended (each bounded by its ``timeout_s``)."""
        while True:
            self.poll()
            if not self._running:
                return
            deadlines = [r.started + r.timeout_s for r in self._running.values() if r.timeout_s is not None]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            ray.wait(list(self._running), num_returns=1, timeout=wait_s)

    def cancel_all(self) -> None:
        """Stop the running validations (the run failed or was interrupted). Their checkpoints stay
        PENDING_VALIDATION in the run's record, so resuming the run validates them again."""
        for ref in self._running:
            ray.cancel(ref, force=True)
        self._running.clear()

    def _start_next(self) -> None:
        running = {r.dir_name for r in self._running.values()}
        for record in self.storage.pending_validations:
            if len(self._running) >= MAX_IN_FLIGHT:
                return
            if record.dir_name not in running:
                self._start(record)

    def _start(self, record: CheckpointRecord) -> None:
        request = request_from_json(record.validation)
        defaults = self.config.task_config
        task = request if isinstance(request, ValidationTaskConfig) else defaults
        fn_kwargs = {**(defaults.fn_kwargs or {}), **(task.fn_kwargs or {})}
        checkpoint = Checkpoint(self.storage.layout.path_of(record.dir_name), self.storage.filesystem)
        ref = _remote().options(**self.options).remote(self._fn, checkpoint, fn_kwargs)
        self._running[ref] = _Running(record.dir_name, time.monotonic(), task.timeout_s)
        logger.info("validating checkpoint %s", record.dir_name)

    def _stop_late(self) -> None:
        now = time.monotonic()
        late = [ref for ref, r in self._running.items() if r.timeout_s is not None and now - r.started >= r.timeout_s]
        for ref in late:
            running = self._running.pop(ref)
            ray.cancel(ref, force=True)
            warnings.warn(
                f"the validation of checkpoint {running.dir_name} ran past ValidationTaskConfig(timeout_s="
                f"{running.timeout_s:g}) and was stopped; it is recorded as VALIDATION_TIMEOUT and training goes on.",
                UserWarning,
                stacklevel=2,
            )
            self.storage.record_validation(running.dir_name, {}, VALIDATION_TIMEOUT)

    def _record(self, ref: Any, running: _Running) -> None:
        try:
            metrics = ray.get(ref)
        except TaskCancelledError:
            return  # stopped by cancel_all: stays pending
        except RayError as error:
            cause = getattr(error, "cause", None) or error
            message = str(cause).strip().splitlines()
            warnings.warn(
                f"the validation of checkpoint {running.dir_name} failed with {type(cause).__name__}: "
                f"{message[-1] if message else ''}; it is recorded as VALIDATION_FAILED and training goes on.",
                UserWarning,
                stacklevel=3,
            )
            logger.warning("validation of checkpoint %s failed:\n%s", running.dir_name, error)
            self.storage.record_validation(running.dir_name, {}, VALIDATION_FAILED)
            return
        self.storage.record_validation(running.dir_name, metrics, VALIDATED)
