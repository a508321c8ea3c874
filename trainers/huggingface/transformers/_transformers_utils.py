"""``transformers.Trainer`` on flowtrain's workers, as Ray Train's module of the same name holds it:
``RayTrainReportCallback`` reports what the Trainer logged, with the checkpoint it saved, and
``prepare_trainer`` fits the Trainer to the workers and their datasets."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import torch.distributed as dist
import transformers
from torch.utils.data import DataLoader, Dataset, IterableDataset
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from trainers import Checkpoint, get_context, report

# Files a rank writes for itself into the checkpoint folder (transformers' per-process RNG state).
_RANK_FILE = re.compile(r"rng_state_(\d+)\.pth")


class RayTrainReportCallback(transformers.TrainerCallback):
    """After every checkpoint ``transformers.Trainer`` saves, report it with the logged metrics.

    The metrics are everything logged so far (later logs override earlier ones), with ``step``
    set to the trainer's global step. Each reported checkpoint holds the Trainer's folder as
    ``checkpoint/``; to resume, pass that folder back as ``trainer.train(resume_from_checkpoint=
    os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME))``.

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
            copied = _copy_own_files(source, os.path.join(folder, self.CHECKPOINT_NAME), rank)
            report(metrics, checkpoint=Checkpoint.from_directory(folder) if copied else None)


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


class _Batches(IterableDataset):
    """Batches that are already made (e.g. ``shard.iter_torch_batches(...)``), as a torch dataset."""

    def __init__(self, batches: Iterable[Any]) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)


def _is_batch_iterable(dataset: Any) -> bool:
    # A torch/HF dataset is indexed row by row; a Ray Data shard's iter_*_batches() yields batches.
    if dataset is None or isinstance(dataset, (Dataset, dict)):
        return False
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def _as_loader(batches: Iterable[Any]) -> DataLoader:
    return DataLoader(_Batches(batches), batch_size=None)


def prepare_trainer(trainer: transformers.Trainer) -> transformers.Trainer:
    """Make ``trainer`` train on flowtrain's workers, and return it.

    Checks the Trainer sees the same world size as flowtrain (its arguments were built inside
    the training function, where the process group is ready). A ``train_dataset`` or
    ``eval_dataset`` given as ready-made batches, e.g. a Ray Data shard's
    ``get_dataset_shard("train").iter_torch_batches(batch_size=...)``, is used batch by batch
    (each worker already has its own part; set ``max_steps``, as such data has no length).

    Raises:
        RuntimeError: the Trainer's world size differs from the number of workers, e.g. its
            ``TrainingArguments`` were created before ``fit()`` started the workers.
    """
    workers = get_context().get_world_size()
    if trainer.args.world_size != workers:
        raise RuntimeError(
            f"prepare_trainer: the Trainer sees a world size of {trainer.args.world_size}, but "
            f"{workers} workers train; create TrainingArguments inside train_loop_per_worker."
        )
    base = type(trainer)

    class FlowtrainTrainer(base):  # type: ignore[valid-type, misc]  # the user's Trainer class, known only at run time
        """The user's Trainer class, taking ready-made batches as they come."""

        def get_train_dataloader(self) -> DataLoader:
            if _is_batch_iterable(self.train_dataset):
                return _as_loader(self.train_dataset)
            return super().get_train_dataloader()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
            chosen = self.eval_dataset if eval_dataset is None else eval_dataset
            if isinstance(chosen, str) and isinstance(self.eval_dataset, dict):
                chosen = self.eval_dataset[chosen]
            if _is_batch_iterable(chosen):
                return _as_loader(chosen)
            return super().get_eval_dataloader(eval_dataset)

    FlowtrainTrainer.__name__ = FlowtrainTrainer.__qualname__ = base.__name__
    trainer.__class__ = FlowtrainTrainer
    return trainer
