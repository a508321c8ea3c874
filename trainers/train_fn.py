"""Functions a training loop calls: ``report``, ``get_checkpoint``, ``get_dataset_shard``,
``get_all_reported_checkpoints``, ``get_preemption_info``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from storage import Checkpoint
from trainers._internal.session import reported_checkpoints
from trainers._internal.session.worker_session import get_session
from trainers.preemption import PreemptionInfo
from trainers.report_config import CheckpointUploadMode
from trainers.validation import CheckpointConsistencyMode, ReportedCheckpoint, ValidationTaskConfig


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
    delete_local_checkpoint_after_upload: bool | None = None,
    checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
    validation: bool | ValidationTaskConfig = False,
) -> None:
    """Report this worker's metrics, and optionally a checkpoint, for the current step.

    Every worker must call ``report`` the same number of times. Rank 0's metrics become the run's
    (one row of ``Result.metrics_dataframe`` per call). A checkpoint is copied into the run's
    storage before ``report`` returns and committed once every worker has reported this step;
    several workers' checkpoints are merged into one. Metrics-only reports cost microseconds.

    ``CheckpointUploadMode.ASYNC`` copies the checkpoint to local disk and uploads it in the
    background. ``NO_UPLOAD`` copies nothing: the checkpoint must be a folder you wrote directly
    inside the run folder (``get_context().get_storage().build_checkpoint_path_from_name(name)``).

    ``checkpoint_dir_name`` names the checkpoint's folder in the run folder (rank 0's counts;
    default ``checkpoint_NNNNNN`` in commit order); a name the run already keeps is refused.
    ``delete_local_checkpoint_after_upload`` deletes the reported folder once uploaded; None (the
    default) deletes it after an ASYNC upload and keeps it after a SYNC one. An ASYNC report takes
    the folder's files when called and leaves the folder, empty: the loop may write its next
    checkpoint there at once, and nothing it writes there is ever deleted.
    ``checkpoint_upload_fn(checkpoint, checkpoint_dir_name)`` does the upload instead of flowtrain:
    it writes the files to ``build_checkpoint_path_from_name(checkpoint_dir_name)`` and returns a
    ``Checkpoint`` of that folder, committed like any other (the name it is given is a staging
    folder of the run; the final name is ``checkpoint_dir_name``).

    ``validation=True`` (or a ``ValidationTaskConfig`` overriding its ``fn_kwargs`` and
    ``timeout_s``) validates the checkpoint with the trainer's ``validation_config`` once it is
    committed, in a separate Ray task while training goes on; the metrics it returns are merged
    into the checkpoint's metrics.
    """
    get_session("report").report(
        metrics,
        checkpoint,
        checkpoint_upload_mode,
        validation=validation,
        dir_name=checkpoint_dir_name,
        delete_local=delete_local_checkpoint_after_upload,
        upload_fn=checkpoint_upload_fn,
    )


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
    timeout_s: float | None = None,
) -> list[ReportedCheckpoint]:
    """The run's kept checkpoints, oldest first, each with its metrics and validation status.

    Waits until every checkpoint this worker has reported is committed (and, in the default
    ``VALIDATED`` mode, until no validation of the run is pending), so the list includes them.
    When ``timeout_s`` passes first, it returns the checkpoints as they stand then, as Ray Train
    does. Checkpoints of earlier attempts and of the run's earlier ``fit()`` calls are included.
    """
    return reported_checkpoints.read(get_session("get_all_reported_checkpoints"), consistency_mode, timeout_s)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from: the run's latest committed one (or the trainer's
    ``resume_from_checkpoint`` while the run has none), None on a fresh start; after a SYNC (or
    NO_UPLOAD) ``report()`` with a checkpoint, that checkpoint once committed, as in Ray Train."""
    return get_session("get_checkpoint").current_checkpoint()


def get_dataset_shard(dataset_name: str | None = None) -> Any:
    """This worker's part of the dataset passed to the trainer as ``datasets={name: ...}``."""
    shards = get_session("get_dataset_shard").dataset_shards
    if not shards:
        raise ValueError(
            "get_dataset_shard(): this trainer was given no datasets; pass datasets={'train': ds} to the trainer."
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


def get_preemption_info() -> PreemptionInfo | None:
    """The preemption coming to a node of this run, or None while there is none.

    Call it in the training loop, e.g. once a step, and save a checkpoint when it stops being None
    (docs/fault-tolerance.md, "Preemption"). Every worker must call it the same number of times: it
    waits for all of them, like ``trainers.collective.barrier()``, so all get rank 0's answer and
    take the same branch. Outside ``train_loop_per_worker`` it raises RuntimeError.
    """
    session = get_session("get_preemption_info")
    return session.synchronize(session.preemption_info, "get_preemption_info")
