"""The parameter form (``datasets=``, ``label_column=``, ``params=``, ...): the boosting library as
the form uses it, the form's arguments, checked when the trainer is built, the datasets' columns,
checked on the driver before any worker starts, and the training function every worker runs."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from trainers.config import DataConfig
from trainers.context import get_context
from trainers.data import DatasetError
from trainers.train_fn import get_checkpoint, get_dataset_shard

logger = logging.getLogger(__name__)

TRAIN = "train"

#: This worker's part of each dataset, read one at a time: (name, features, labels), "train" first.
Shards = Iterator[tuple[str, Any, Any]]


@dataclasses.dataclass(frozen=True)
class Library:
    """One boosting library as the core uses it; it travels to the workers with the parameter form."""

    #: The package's name, as users import it ("xgboost"); the trainer's config argument is ``<name>_config``.
    name: str
    #: The library's train function; the parameter form's extra keyword arguments are checked against it.
    train: Callable[..., Any]
    #: The arguments of ``train`` the parameter form sets itself.
    reserved: tuple[str, ...]
    #: The dtype the workers read features in.
    feature_dtype: Any
    #: The library's ``RayTrainReportCallback``; its ``get_model(checkpoint)`` reads a model back.
    report_callback: type[Any]
    #: How many boosting rounds a model holds.
    num_rounds: Callable[[Any], int]
    #: ``boost(form, shards, booster, num_boost_round, callbacks, train_kwargs)``: build the library's
    #: datasets from this worker's shards and train ``num_boost_round`` more rounds on top of ``booster``
    #: (None: from scratch).
    boost: Callable[[Any, Shards, Any, int, list, dict], None]


@dataclasses.dataclass(frozen=True)
class ParamForm:
    """The parameter form's settings, sent to every worker as its ``train_loop_config``."""

    #: The library that trains.
    library: Library
    #: The column that holds the label, in every dataset.
    label_column: str
    #: The library's training parameters.
    params: dict[str, Any]
    #: How many rounds the model holds when training ends (a resumed run boosts the rest).
    num_boost_round: int
    #: Keyword arguments of each dataset's matrix, by dataset name.
    dmatrix_params: dict[str, dict[str, Any]]
    #: Other keyword arguments of the library's train function (``callbacks=``, ...).
    train_kwargs: dict[str, Any]
    #: Feature columns in a fixed order (every rank builds its matrix the same way).
    features: tuple[str, ...] = ()
    #: Dataset names: "train" first, then the evaluation sets.
    dataset_names: tuple[str, ...] = ()


def check_forms(
    trainer: str,
    train_loop_per_worker: Callable[..., Any] | None,
    train_loop_config: Any,
    param_args: Mapping[str, Any],
    train_kwargs: Mapping[str, Any],
) -> bool:
    """Which form the trainer was called in: True for the parameter form. Mixing both is an error."""
    given = [name for name, value in param_args.items() if value is not None]
    if train_loop_per_worker is not None:
        if given or train_kwargs:
            extra = given + sorted(train_kwargs)
            raise TypeError(
                f"{trainer}: {', '.join(extra)} belong to the parameter form (datasets=, label_column=, params=, "
                "num_boost_round=), which runs its own training loop; with train_loop_per_worker, pass them to "
                "your function through train_loop_config instead."
            )
        return False
    if train_loop_config is not None:
        raise TypeError(
            f"{trainer}: train_loop_config needs a train_loop_per_worker; in the parameter form pass params= "
            "(the library's training parameters) instead."
        )
    return True


def param_form(
    trainer: str,
    library: Library,
    datasets: Mapping[str, Any] | None,
    *,
    label_column: Any,
    params: Any,
    num_boost_round: Any,
    dmatrix_params: Any,
    train_kwargs: Mapping[str, Any],
) -> ParamForm:
    """The parameter form's settings, its arguments checked when the trainer is built."""
    num_boost_round = 10 if num_boost_round is None else num_boost_round  # Ray Train's default
    if not datasets or TRAIN not in datasets:
        names = sorted(datasets or {})
        raise ValueError(
            f"{trainer}: without train_loop_per_worker, datasets= must hold the training data under 'train' "
            f"(got {names or 'no datasets'}), e.g. datasets={{'train': train_ds, 'valid': valid_ds}}."
        )
    if not isinstance(label_column, str) or not label_column:
        raise ValueError(
            f"{trainer}: label_column={label_column!r}: name the column that holds the label, e.g. label_column='target'."
        )
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"{trainer}: params={params!r}: must be a dict of training parameters.")
    if isinstance(num_boost_round, bool) or not isinstance(num_boost_round, int) or num_boost_round < 1:
        raise ValueError(f"{trainer}: num_boost_round={num_boost_round!r}: must be an integer >= 1.")
    if dmatrix_params is not None:
        if not isinstance(dmatrix_params, dict) or not all(isinstance(v, dict) for v in dmatrix_params.values()):
            raise TypeError(
                f"{trainer}: dmatrix_params={dmatrix_params!r}: must map a dataset name to the keyword arguments of "
                "its matrix, e.g. {'train': {'weight': ...}}."
            )
        unknown = sorted(set(dmatrix_params) - set(datasets))
        if unknown:
            raise ValueError(
                f"{trainer}: dmatrix_params names {unknown}, which are not among the datasets {sorted(datasets)}."
            )
    accepted = set(inspect.signature(library.train).parameters) - set(library.reserved)
    unknown = sorted(set(train_kwargs) - accepted)
    if unknown:
        raise TypeError(
            f"{trainer}: unexpected argument(s) {unknown}. Extra keyword arguments are passed to "
            f"{library.name}.train(), which accepts {sorted(accepted)}."
        )
    return ParamForm(
        library, label_column, dict(params or {}), num_boost_round, dict(dmatrix_params or {}), dict(train_kwargs)
    )


def default_data_config(dataset_config: DataConfig | None) -> DataConfig:
    """The parameter form splits only "train": every worker evaluates on whole validation sets, so
    their metrics cover every row (LightGBM computes metrics on each worker's rows alone)."""
    return dataset_config or DataConfig(datasets_to_split=[TRAIN])


def _is_numeric(column_type: Any) -> bool:
    if isinstance(column_type, pa.DataType):
        kinds = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_decimal)
        return any(is_kind(column_type) for is_kind in kinds)
    try:
        return np.dtype(column_type).kind in "biuf"
    except TypeError:
        return False


def check_columns(datasets: Mapping[str, Any], label_column: str) -> tuple[str, ...]:
    """The feature columns (every column but the label), after checking that every dataset has the
    label and the same numeric features. Reads only the schemas."""
    features: tuple[str, ...] | None = None
    for name, dataset in datasets.items():
        schema = dataset.schema()
        names = list(schema.names)
        types = dict(zip(names, schema.types, strict=True))
        if label_column not in types:
            raise DatasetError(
                f"datasets[{name!r}] has no label column {label_column!r}; its columns are {names}. "
                "Set label_column= to one of them."
            )
        if not _is_numeric(types[label_column]):
            raise DatasetError(
                f"datasets[{name!r}]: the label column {label_column!r} holds {types[label_column]}; "
                "encode the labels as numbers (e.g. 0/1 for two classes)."
            )
        bad = [f"{c!r} ({types[c]})" for c in names if c != label_column and not _is_numeric(types[c])]
        if bad:
            raise DatasetError(
                f"datasets[{name!r}] has non-numeric feature column(s) {', '.join(bad)}; encode them as numbers "
                "(e.g. with ds.map_batches) or drop them with ds.drop_columns([...])."
            )
        these = tuple(c for c in names if c != label_column)
        if features is None:
            features = these
        elif set(these) != set(features):
            raise DatasetError(
                f"datasets[{name!r}] has the feature columns {list(these)}, but datasets['train'] has "
                f"{list(features)}; every dataset needs the same features."
            )
    assert features is not None
    return features


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
