"""Functions a training loop calls: ``report``, ``get_checkpoint``, ``get_dataset_shard``."""

from __future__ import annotations

import warnings
from typing import Any

from storage import Checkpoint
from trainers._internal.session import CheckpointUploadMode, get_session


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
) -> None:
    """Report this worker's metrics, and optionally a checkpoint, for the current step.

    Every worker must call ``report`` the same number of times. The metrics of rank 0 become the
    run's metrics (one row of ``Result.metrics_dataframe`` per call). A checkpoint is copied into
    the run's storage before ``report`` returns, and is committed once every worker has reported
    this step; when several workers pass a checkpoint, their files are merged into one.
    Metrics-only reports cost microseconds: they are pushed to the driver, not polled.

    With ``checkpoint_upload_mode=CheckpointUploadMode.ASYNC`` the checkpoint is copied to local
    disk and uploaded in the background, so the loop does not wait for remote storage.
    ``checkpoint_dir_name`` is accepted for Ray Train compatibility; folders are always named
    ``checkpoint_NNNNNN`` in commit order.
    """
    session = get_session("report")
    if checkpoint_dir_name is not None and not session.warned_dir_name:
        session.warned_dir_name = True
        warnings.warn(
            f"report(checkpoint_dir_name={checkpoint_dir_name!r}) is ignored: flowtrain names committed "
            "checkpoints checkpoint_NNNNNN in commit order.",
            stacklevel=2,
        )
    session.report(metrics, checkpoint, checkpoint_upload_mode)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from: the latest committed one, or None on a fresh start."""
    return get_session("get_checkpoint").checkpoint


def get_dataset_shard(dataset_name: str | None = None) -> Any:
    """This worker's part of the dataset passed to the trainer as ``datasets={name: ...}``."""
    session = get_session("get_dataset_shard")
    shards = session.dataset_shards
    if not shards:
        raise ValueError(
            "get_dataset_shard(): this trainer was given no datasets; pass datasets={'train': ds} "
            "to the trainer."
        )
    if dataset_name is None:
        if len(shards) != 1:
            raise ValueError(
                f"get_dataset_shard(): the trainer has {len(shards)} datasets ({', '.join(sorted(shards))}); "
                "name the one you want."
            )
        return next(iter(shards.values()))
    if dataset_name not in shards:
        raise KeyError(
            f"get_dataset_shard({dataset_name!r}): no dataset of that name; the trainer has "
            f"{', '.join(repr(n) for n in sorted(shards))}."
        )
    return shards[dataset_name]
