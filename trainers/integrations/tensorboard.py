"""TensorBoard event files in the run folder, written from the driver: every step once, across
restarts (``TensorBoardLoggerCallback``; docs/tracking.md)."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from storage.filesystem import is_uri
from trainers._extras import require
from trainers.callback import TrainRunContext, UserCallback
from trainers.integrations import scalar_metrics

if TYPE_CHECKING:
    from trainers.result import Result

#: The folder inside the run folder that holds the event files.
FOLDER = "tensorboard"


class TensorBoardLoggerCallback(UserCallback):
    """Writes every report to TensorBoard event files in the run folder: pass it in
    ``RunConfig(callbacks=[...])``. Local storage only: with an object store ``storage_path`` the
    run fails at start with a ``ValueError``."""

    def __init__(self) -> None:
        self._writer: Any = None
        self._last_step = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_writer": None}

    def before_run(self, run_context: TrainRunContext, history: Sequence[dict[str, Any]]) -> None:
        """Open a writer in ``<run folder>/tensorboard`` and write the history's steps its event files lack."""
        require("tensorboard", extra="tracking")
        from torch.utils.tensorboard import SummaryWriter

        if is_uri(run_context.run_path):
            raise ValueError(
                f"TensorBoardLoggerCallback writes its event files into the run folder on local disk, and this run's "
                f"folder is {run_context.run_path}. Use a local RunConfig(storage_path=...) or a shared file system "
                "path, or log to MLflow (trainers.integrations.mlflow) instead."
            )
        folder = os.path.join(run_context.run_path, FOLDER)
        self.close()
        self._last_step = last_step_written(folder)
        self._writer = SummaryWriter(log_dir=folder)
        self._write(enumerate(history))

    def after_report(self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        """Write rank 0's metrics at step ``num_reports - 1``, unless the event files hold that step."""
        self._write([(run_context.num_reports - 1, metrics[0])])

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        """Close the event file."""
        self.close()

    def close(self) -> None:
        """Flush and close the event file (a later ``before_run`` opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _write(self, steps: Any) -> None:
        wrote = False
        for step, metrics in steps:
            if step <= self._last_step:
                continue
            for key, value in scalar_metrics(metrics).items():
                self._writer.add_scalar(key, value, global_step=step)
            self._last_step, wrote = step, True
        if wrote:
            self._writer.flush()  # on disk before the next report: a killed driver loses at most this one


def last_step_written(folder: str) -> int:
    """The highest step of any scalar in the event files in ``folder``; -1 when there is none.

    A file cut short by a killed process is read up to its last whole event.
    """
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    paths = sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))
    events = (event for path in paths for event in EventFileLoader(path).Load())
    return max((event.step for event in events if event.HasField("summary")), default=-1)
