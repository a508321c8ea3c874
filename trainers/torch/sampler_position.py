"""A ``DistributedSampler`` whose place in its epoch is saved with each checkpoint.

``prepare_data_loader`` builds its loader from these two when the data position is kept
(``DataConfig(checkpoint_data_position=True)``, the default): the loader counts the samples of
each batch it hands to the loop, the sampler answers its position at every ``report()`` and,
after a restart, starts the epoch the checkpoint was saved in where that checkpoint left it.
"""

from __future__ import annotations

import itertools
import time
import types
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

from storage.positions import LoaderRecord
from trainers._internal.session.worker_session import current_session


class PositionedSampler(DistributedSampler):
    """A ``DistributedSampler`` that knows how many samples of its epoch (``set_epoch``) the loop
    received, and starts the epoch it resumes from ``resume`` mid-way."""

    def __init__(self, *args: Any, resume: LoaderRecord | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received = 0
        self._resume = resume

    def __iter__(self) -> Iterator[Any]:
        indices = super().__iter__()
        # Only the first pass, and only in the epoch saved: a loop that resumes at the next
        # epoch (its checkpoint came at an epoch's end) skips nothing.
        resume, self._resume = self._resume, None
        skip = resume.samples if resume is not None and resume.epoch == self.epoch else 0
        self.received = skip
        return itertools.islice(indices, skip, None)

    def position(self) -> LoaderRecord:
        return LoaderRecord(self.epoch, min(self.received, self.num_samples))


class PositionedLoader(DataLoader):
    """A ``DataLoader`` over a ``PositionedSampler`` that tells it what each batch handed out held,
    and adds the seconds the loop waits for each batch to its rank's ``data_wait_s``.

    Counted as the loop receives batches, not as the loader's workers prefetch them.
    """

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator over DataLoader's own iterator
        sampler = self.sampler
        assert isinstance(sampler, PositionedSampler)
        per_batch = self.batch_size or 1
        session = current_session()
        waits = session.health if session is not None else types.SimpleNamespace(data_wait_s=0.0)
        clock = time.perf_counter
        asked = clock()  # from the loop asking for a batch to having it (its workers' start, their prefetch)
        for batch in super().__iter__():
            waits.data_wait_s += clock() - asked
            sampler.received += per_batch
            yield batch
            asked = clock()
        waits.data_wait_s += clock() - asked
