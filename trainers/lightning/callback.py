"""RayTrainReportCallback: report Lightning's metrics and a checkpoint at the end of every epoch."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import lightning.pytorch as pl

from trainers import Checkpoint, CheckpointUploadMode, get_context, report


class RayTrainReportCallback(pl.callbacks.Callback):
    """At the end of each training epoch, report ``trainer.callback_metrics`` and a checkpoint.

    The metrics gain ``epoch`` and ``step`` (Lightning's ``current_epoch`` and ``global_step``).
    The checkpoint folder holds Lightning's file as ``checkpoint.ckpt`` (``CHECKPOINT_NAME``):
    ``MyModule.load_from_checkpoint`` loads it, and ``pl.Trainer.fit(..., ckpt_path=...)`` on it
    resumes training.

    Args:
        checkpoint_upload_mode: How ``report`` stores each checkpoint (None: ``SYNC``).
        validation: Passed on to ``trainers.report(..., validation=...)``: ``True`` (or a
            ``ValidationTaskConfig``) validates each checkpoint with the trainer's
            ``ValidationConfig`` while training goes on; ``False`` does not.
    """

    #: File name of Lightning's checkpoint inside each reported checkpoint folder.
    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, checkpoint_upload_mode: CheckpointUploadMode | None = None, validation: Any = False) -> None:
        super().__init__()
        checkpoint_upload_mode = CheckpointUploadMode.SYNC if checkpoint_upload_mode is None else checkpoint_upload_mode
        if not isinstance(checkpoint_upload_mode, CheckpointUploadMode):
            raise ValueError(
                f"RayTrainReportCallback(checkpoint_upload_mode={checkpoint_upload_mode!r}): "
                f"must be None or one of {', '.join('CheckpointUploadMode.' + m.name for m in CheckpointUploadMode)}."
            )
        self.checkpoint_upload_mode = checkpoint_upload_mode
        self.validation = validation

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Called by Lightning on every rank: save the checkpoint, then report it with the metrics."""
        metrics: dict[str, Any] = {name: value.item() for name, value in trainer.callback_metrics.items()}
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        rank = get_context().get_world_rank()
        folder = tempfile.mkdtemp(prefix=f"flowtrain-lightning-rank{rank}-")
        try:
            # Every rank takes part (FSDP gathers or shards the weights); Lightning decides who
            # writes: rank 0 alone for a full state dict, each rank its shard otherwise.
            trainer.save_checkpoint(os.path.join(folder, self.CHECKPOINT_NAME), weights_only=False)
            # A rank that wrote nothing reports metrics only; the others' files are merged.
            checkpoint = Checkpoint.from_directory(folder) if os.listdir(folder) else None
            # validation= only when asked for: report() checks the value (and older versions lack it).
            extra = {} if self.validation is None or self.validation is False else {"validation": self.validation}
            report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=self.checkpoint_upload_mode, **extra)
        finally:
            # report() has copied the folder (ASYNC copies it to its own local folder first).
            shutil.rmtree(folder, ignore_errors=True)
