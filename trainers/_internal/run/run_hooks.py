"""The start and the end of a run, told to its callbacks (``before_run`` and ``after_run``): the
trainer's to tell, not the controller's, since only it holds the ``Result``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from storage import RunStorage
from trainers._internal.run.controller import Controller
from trainers.callback import UserCallback
from trainers.errors import ControllerError
from trainers.result import Result

logger = logging.getLogger("trainers")


class RunHooks:
    """Calls ``before_run`` and ``after_run`` of ``callbacks`` with the run's context."""

    def __init__(self, name: str, callbacks: list[Any], controller: Controller, storage: RunStorage) -> None:
        self.name = name
        self.callbacks = [c for c in callbacks if isinstance(c, UserCallback)]
        self.controller = controller
        self.storage = storage

    def starting(self) -> None:
        """The run starts or resumes: each callback gets rank 0's metrics of the reports so far."""
        context = dataclasses.replace(self.controller.run_context, attempt=self.storage.snapshot.attempt + 1)
        for callback in self.callbacks:
            callback.before_run(context, self.storage.metrics_history)

    def finished(self, result: Result) -> Result:
        """The run ended with ``result`` (its error set when it failed), which this returns; a
        callback that fails here fails ``fit()`` with ``ControllerError``, as one failing during
        the run does."""
        context = dataclasses.replace(self.controller.run_context, attempt=self.storage.snapshot.attempt)
        try:
            for callback in self.callbacks:
                callback.after_run(context, result)
        except Exception as error:
            raise ControllerError(error) from error
        return result

    def failed(self, error: BaseException) -> None:
        """The run failed with ``error``, which ``fit()`` raises next: a callback failing here is
        logged, not raised. The run's record is in memory, so this holds when the storage failed."""
        if not self.callbacks:
            return
        try:
            # The Result a failed run's after_run sees carries fit()'s error, whatever its type.
            self.finished(Result._from_run(self.storage, return_value=None, error=error))  # type: ignore[arg-type]
        except Exception:
            logger.exception("%s: a callback's after_run failed after the run failed", self.name)
