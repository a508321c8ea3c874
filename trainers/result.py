"""Result: what a finished (or failed) run leaves behind."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from storage import Checkpoint
from storage.filesystem import display_path, pafs
from storage.health import RunHealth
from storage.retention import flatten
from trainers.errors import TrainingFailedError

if TYPE_CHECKING:
    import pandas as pd


class ResultError(ValueError, RuntimeError):
    """A ``Result`` cannot answer the question asked (no kept checkpoint, or none reported the
    metric). A ``RuntimeError``, as Ray Train raises there, and a ``ValueError``, as flowtrain
    raised before: ``except`` clauses written for either catch it."""


def metrics_frame(history: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per report, nested metrics flattened as ``"outer/inner"`` columns."""
    import pandas as pd

    return pd.json_normalize(list(history), sep="/")  # no reports: an empty frame


class _LazyFrame:
    """The ``metrics_dataframe`` field: a DataFrame, or a ``functools.partial`` that builds one from
    the run's history when first read. Reading the history and building the frame (pandas: about
    0.3 s and 30 MB in a process that had not imported it) is what a ``fit()`` whose caller never
    looks at the frame should not pay."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, result: Any, owner: type | None = None) -> Any:
        if result is None:
            return None  # the dataclass field's default
        value = result.__dict__.get(self._slot)
        if isinstance(value, functools.partial):
            value = result.__dict__[self._slot] = value()
        return value

    def __set__(self, result: Any, value: Any) -> None:
        result.__dict__[self._slot] = value


@dataclasses.dataclass
class Result:
    """The outcome of ``fit()``.

    ``metrics`` are rank 0's last reported metrics, ``metrics_dataframe`` holds every report (with
    or without a checkpoint), ``checkpoint`` is the latest committed checkpoint and
    ``best_checkpoints`` the kept ones with their reported metrics, the best last, as in Ray
    Train: without ``CheckpointConfig.checkpoint_score_attribute`` in report order; with it by
    score, worst first (checkpoints without a numeric score first of all, ties in report order).
    ``return_value`` is what rank 0's training function returned.

    Metric values keep their types (a tuple stays a tuple; a datetime column of
    ``metrics_dataframe`` holds pandas Timestamps). ``from_path`` reads them back from run.json as
    ``storage.metric_values`` describes: plain values, tuples, datetimes and Decimals exactly,
    others by unpickling them (their repr where their class cannot be imported).

    ``path`` is the run folder inside ``filesystem``, as in Ray Train: an absolute local path, or
    ``"bucket/prefix/name"`` (no ``s3://``) on object storage. ``uri`` is the same folder to paste
    into a shell (``s3://bucket/prefix/name``); ``Result.from_path(result.uri)`` reopens it.
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    error: TrainingFailedError | None
    path: str
    metrics_dataframe: pd.DataFrame | None = _LazyFrame()  # type: ignore[assignment]  # a descriptor: None until set
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] | None = None
    _storage_filesystem: pafs.FileSystem | None = None
    return_value: Any = None
    #: Each rank's peak memory and the straggler episodes of the run (flowtrain's own; see
    #: ``trainers.health``).
    health: RunHealth = RunHealth()

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The filesystem ``path`` is on (local disk unless the run used remote storage)."""
        return self._storage_filesystem or pafs.LocalFileSystem()

    @property
    def uri(self) -> str:
        """The run folder as a URI (``s3://bucket/prefix/name``), or its absolute local path."""
        return display_path(self.filesystem, self.path)

    @property
    def config(self) -> Any:
        """Not available: Ray Train V2 dropped ``Result.config`` (it belongs to Ray Tune)."""
        raise DeprecationWarning(
            "Result.config is no longer supported (Ray Train V2 dropped it: it only meant something for "
            "Ray Tune). Keep the config you passed as train_loop_config, or report the values you need "
            "as metrics."
        )

    def __repr__(self) -> str:
        shown: dict[str, Any] = {} if self.error is None else {"error": type(self.error).__name__}
        shown.update(
            metrics=self.metrics, path=self.path, filesystem=self.filesystem.type_name, checkpoint=self.checkpoint
        )
        body = ",\n".join(f"  {key}={value!r}" for key, value in shown.items())
        return f"{type(self).__name__}(\n{body}\n)"

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint with the best ``metric`` (``mode`` "max" or "min"); NaN never wins.

        Raises ``ResultError`` (a ``RuntimeError`` and a ``ValueError``) when the run kept no
        checkpoint, or none of them reported ``metric`` as a number.
        """
        if mode not in ("max", "min"):
            raise ValueError(f"get_best_checkpoint(mode={mode!r}): must be 'max' or 'min'.")
        if not self.best_checkpoints:
            raise ResultError(
                f"get_best_checkpoint({metric!r}): the run kept no checkpoint; pass checkpoint= to report() to keep one."
            )
        values = ((flatten(metrics).get(metric), checkpoint) for checkpoint, metrics in self.best_checkpoints)
        scored = [(v, c) for v, c in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if not scored:
            keys = sorted({k for _, m in self.best_checkpoints for k in flatten(m)})
            raise ResultError(
                f"Invalid metric name {metric}! get_best_checkpoint({metric!r}): no kept checkpoint reported it; "
                f"reported keys: {keys}."
            )
        return (max if mode == "max" else min)(scored, key=lambda pair: pair[0])[1]

    @classmethod
    def from_path(cls, path: str | os.PathLike, storage_filesystem: pafs.FileSystem | None = None) -> Result:
        """Rebuild the Result of a run from its folder, e.g. after the driver died: ``Result.path``
        with ``storage_filesystem=Result.filesystem``, or a URI (``s3://...``) or absolute local path.

        A folder written by ``ray.train`` (Ray 2.60) is read from Ray's snapshot: its kept
        checkpoints, the latest one and their metrics (one row per checkpoint in
        ``metrics_dataframe``: Ray keeps no record of metrics-only reports).

        Raises ``StorageError`` (an ``OSError`` and a ``RuntimeError``) when the folder holds no run
        (``"Experiment folder ... doesn't exist"``, as in Ray Train), and its subclass
        ``storage.RayRunFormatError``, naming the Ray version, for a Ray snapshot format flowtrain
        does not read.
        """
        from storage import load_run

        return cls._from_run(load_run(os.fspath(path), storage_filesystem), return_value=None, error=None)

    @classmethod
    def _from_run(cls, run: Any, *, return_value: Any, error: TrainingFailedError | None) -> Result:
        return cls(
            metrics=run.last_metrics,
            checkpoint=run.committed_checkpoint,
            error=error,
            path=run.run_path,
            metrics_dataframe=functools.partial(metrics_frame, run.history_now()),  # type: ignore[arg-type]  # _LazyFrame makes it a DataFrame when read
            best_checkpoints=run.best_checkpoints[::-1],  # storage ranks best first; Ray lists the best last
            _storage_filesystem=run.filesystem,
            return_value=return_value,
            health=run.health,
        )
