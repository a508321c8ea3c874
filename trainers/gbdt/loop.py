"""The parameter form's training function, run on every worker: resume from the latest
checkpoint, read this worker's shards, and let the library boost the remaining rounds."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from trainers.context import get_context
from trainers.data import DatasetError
from trainers.gbdt.param_form import ParamForm
from trainers.train_fn import get_checkpoint, get_dataset_shard

logger = logging.getLogger(__name__)


def train_fn_per_worker(form: ParamForm) -> None:
    """Boost up to ``form.num_boost_round`` rounds, continuing the latest checkpoint's model, with
    one report per round (unless ``callbacks=`` holds the library's report callback already)."""
    library, booster, done = form.library, None, 0
    if (checkpoint := get_checkpoint()) is not None:
        booster = library.report_callback.get_model(checkpoint)
        done = library.num_rounds(booster)
    if done >= form.num_boost_round:
        logger.info(
            "the checkpoint holds %d rounds, num_boost_round=%d: nothing left to train", done, form.num_boost_round
        )
        return
    train_kwargs = dict(form.train_kwargs)
    callbacks = list(train_kwargs.pop("callbacks", None) or [])
    if not any(isinstance(c, library.report_callback) for c in callbacks):
        callbacks.append(library.report_callback(frequency=1))
    rank = get_context().get_world_rank()
    # A generator: the library may turn each dataset into its own matrix before the next is read.
    shards = ((name, *load_shard(get_dataset_shard(name), name, rank, form)) for name in form.dataset_names)
    library.boost(form, shards, booster, form.num_boost_round - done, callbacks, train_kwargs)


def load_shard(shard: Any, name: str, rank: int, form: ParamForm) -> tuple[np.ndarray, np.ndarray]:
    """Read this worker's part of dataset ``name`` into a feature matrix and a label vector."""
    xs, ys = [], []
    for batch in shard.iter_batches(batch_size=None, batch_format="numpy"):
        if len(batch[form.label_column]) == 0:
            continue
        xs.append(np.column_stack([np.asarray(batch[c], dtype=form.library.feature_dtype) for c in form.features]))
        ys.append(np.asarray(batch[form.label_column], dtype=np.float64))
    if not ys:
        raise DatasetError(
            f"rank {rank} received no rows of datasets[{name!r}]: every worker needs some rows to train on. "
            "Use fewer workers, or more rows, or repartition the dataset."
        )
    return np.concatenate(xs), np.concatenate(ys)
