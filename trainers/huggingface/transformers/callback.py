"""RayTrainReportCallback: report what ``transformers.Trainer`` logged, with the checkpoint it saved."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

import torch.distributed as dist
import transformers
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from trainers import Checkpoint, get_context, report

# Files a rank writes for itself into the checkpoint folder (transformers' per-process RNG state).
_RANK_FILE = re.compile(r"rng_state_(\d+)\.pth")


class RayTrainReportCallback(transformers.TrainerCallback):
    """After every checkpoint ``transformers.Trainer`` saves, report it with the logged metrics.

    The metrics are everything logged so far (later logs override earlier ones), with ``step``
    set to the trainer's global step. Each reported checkpoint holds the Trainer's folder as
    ``checkpoint/``; to resume, pass it back to the Trainer::

        checkpoint = trainers.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as folder:
                trainer.train(resume_from_checkpoint=os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.train()

    Log and evaluate at least as often as you save, so each report carries current metrics.
    """

    #: Folder name of the Trainer's checkpoint inside each reported checkpoint.
    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Called by the Trainer on every rank after it saved ``checkpoint-<global_step>``."""
        # Rank 0 writes the model after the others may already be here: wait until all have saved.
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        metrics = {key: value for entry in state.log_history for key, value in entry.items()}
        metrics["step"] = state.global_step
        source = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        rank = get_context().get_world_rank()
        with tempfile.TemporaryDirectory(prefix=f"flowtrain-transformers-rank{rank}-") as folder:
            if _copy_own_files(source, os.path.join(folder, self.CHECKPOINT_NAME), rank):
                report(metrics, checkpoint=Checkpoint.from_directory(folder))
            else:
                report(metrics)


def _copy_own_files(source: str, target: str, rank: int) -> bool:
    """Copy the files of ``source`` this rank is responsible for; True when there were any.

    Rank 0 takes the whole folder except other ranks' RNG files; every other rank takes only its
    own RNG file. Ranks on one node share the folder, so this way no file is uploaded twice, and
    ranks on other nodes still contribute theirs (the report merges all ranks' files).
    """
    if not os.path.isdir(source):
        return False

    def not_mine(directory: str, names: list[str]) -> set[str]:
        if directory != source:
            return set()  # inside a subfolder only rank 0 ever gets here: keep it whole
        owners = {name: _RANK_FILE.fullmatch(name) for name in names}
        return {name for name, match in owners.items() if (int(match.group(1)) if match else 0) != rank}

    shutil.copytree(source, target, ignore=not_mine)
    return any(files for _, _, files in os.walk(target))
