"""Result: what a finished (or failed) run leaves behind."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import pyarrow.fs

from storage import Checkpoint
from trainers.errors import TrainingFailedError

if TYPE_CHECKING:
    import pandas as pd


def metrics_frame(history: list[dict[str, Any]]) -> "pd.DataFrame":
    """One row per report, nested metrics flattened as ``"outer/inner"`` columns."""
    import pandas as pd

    if not history:
        return pd.DataFrame()
    return pd.json_normalize(history, sep="/")


@dataclasses.dataclass
class Result:
    """The outcome of ``fit()``.

    ``metrics`` are rank 0's last reported metrics, ``metrics_dataframe`` holds every report (with
    or without a checkpoint), ``checkpoint`` is the latest committed checkpoint and
    ``best_checkpoints`` the kept ones, best first, with the metrics they were reported with.
    ``return_value`` is what rank 0's training function returned.
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    error: TrainingFailedError | None
    path: str
    filesystem: pyarrow.fs.FileSystem | None = None
    metrics_dataframe: "pd.DataFrame | None" = None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = dataclasses.field(default_factory=list)
    return_value: Any = None

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint with the best ``metric`` (``mode`` "max" or "min"); NaN never wins."""
        if mode not in ("max", "min"):
            raise ValueError(f"get_best_checkpoint(mode={mode!r}): must be 'max' or 'min'.")
        scored = []
        for checkpoint, metrics in self.best_checkpoints:
            value = _lookup(metrics, metric)
            if value is None:
                continue
            if isinstance(value, float) and math.isnan(value):
                continue
            scored.append((value, checkpoint))
        if not scored and self.best_checkpoints:
            keys = sorted({k for _, m in self.best_checkpoints for k in metrics_frame([m]).columns})
            raise ValueError(f"get_best_checkpoint({metric!r}): no kept checkpoint reported it; reported keys: {keys}.")
        if not scored:
            return None
        pick = max if mode == "max" else min
        return pick(scored, key=lambda pair: pair[0])[1]

    @classmethod
    def from_path(cls, path: str, storage_filesystem: pyarrow.fs.FileSystem | None = None) -> "Result":
        """Rebuild the Result of a run from its folder (``Result.path``), e.g. after the driver died."""
        from storage import load_run

        run = load_run(path, storage_filesystem)
        return cls._from_run(run, return_value=None, error=None)

    @classmethod
    def _from_run(cls, run: Any, *, return_value: Any, error: TrainingFailedError | None) -> "Result":
        history = list(run.metrics_history)
        return cls(
            metrics=history[-1] if history else None,
            checkpoint=run.latest_checkpoint,
            error=error,
            path=run.run_uri,
            filesystem=run.filesystem,
            metrics_dataframe=metrics_frame(history),
            best_checkpoints=list(run.best_checkpoints),
            return_value=return_value,
        )


def _lookup(metrics: dict[str, Any], key: str) -> Any:
    if key in metrics:
        return metrics[key]
    value: Any = metrics
    for part in key.split("/"):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value
