"""prepare_trainer: fit a ``transformers.Trainer`` to flowtrain's workers and datasets."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import transformers
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainers import get_context


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
