"""What the XGBoost and LightGBM trainers share: checking the parameter form's arguments and
columns on the driver, turning a worker's shard into a matrix, and the report callbacks' rules
(which metrics, when to checkpoint, rank 0 saves).

Nothing here imports xgboost or lightgbm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import tempfile
from typing import Any, Callable, ContextManager, Iterator, Mapping

import numpy as np
import pyarrow as pa

from storage import Checkpoint
from trainers.config import DataConfig
from trainers.data import DatasetError

TRAIN = "train"

#: Arguments that only the parameter form takes (``datasets=``, ``label_column=``, ...).
PARAM_FORM_ARGS = ("label_column", "params", "num_boost_round", "dmatrix_params")


@dataclasses.dataclass(frozen=True)
class ParamForm:
    """The parameter form's settings, sent to every worker as its ``train_loop_config``."""

    label_column: str
    params: dict[str, Any]
    num_boost_round: int
    dmatrix_params: dict[str, dict[str, Any]]
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


def check_param_form(
    trainer: str,
    *,
    datasets: Mapping[str, Any] | None,
    label_column: Any,
    params: Any,
    num_boost_round: Any,
    dmatrix_params: Any,
    train_kwargs: Mapping[str, Any],
    library_train: Callable[..., Any],
    reserved: tuple[str, ...],
) -> None:
    """Arguments of the parameter form, checked when the trainer is built."""
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
    accepted = set(inspect.signature(library_train).parameters) - set(reserved)
    unknown = sorted(set(train_kwargs) - accepted)
    if unknown:
        raise TypeError(
            f"{trainer}: unexpected argument(s) {unknown}. Extra keyword arguments are passed to "
            f"{library_train.__module__.split('.')[0]}.train(), which accepts {sorted(accepted)}."
        )


def default_data_config(dataset_config: DataConfig | None) -> DataConfig:
    """The parameter form splits only "train": every worker evaluates on whole validation sets, so
    their metrics cover every row (LightGBM computes metrics on each worker's rows alone)."""
    return dataset_config or DataConfig(datasets_to_split=[TRAIN])


# -- columns, checked on the driver ------------------------------------------------------------


def _is_numeric(column_type: Any) -> bool:
    if isinstance(column_type, pa.DataType):
        return (
            pa.types.is_integer(column_type)
            or pa.types.is_floating(column_type)
            or pa.types.is_boolean(column_type)
            or pa.types.is_decimal(column_type)
        )
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
        types = dict(zip(names, schema.types))
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


# -- a worker's shard as a matrix ----------------------------------------------------------------


def load_shard(
    shard: Any, name: str, rank: int, features: tuple[str, ...], label_column: str, dtype: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Read this worker's part of dataset ``name`` into a feature matrix and a label vector."""
    xs, ys = [], []
    for batch in shard.iter_batches(batch_size=None, batch_format="numpy"):
        if len(batch[label_column]) == 0:
            continue
        xs.append(np.column_stack([np.asarray(batch[c], dtype=dtype) for c in features]))
        ys.append(np.asarray(batch[label_column], dtype=np.float64))
    if not ys:
        raise DatasetError(
            f"rank {rank} received no rows of datasets[{name!r}]: every worker needs some rows to train on. "
            "Use fewer workers, or more rows, or repartition the dataset."
        )
    return np.concatenate(xs), np.concatenate(ys)


# -- report callbacks -------------------------------------------------------------------------


def check_callback_args(owner: str, metrics: Any, filename: Any, frequency: Any, checkpoint_at_end: Any) -> Any:
    """The report callbacks' arguments, checked when the callback is built; returns ``metrics``
    as None, a list or a dict."""
    if isinstance(metrics, str):
        metrics = [metrics]
    if metrics is not None and not (
        (isinstance(metrics, list) and all(isinstance(m, str) for m in metrics))
        or (isinstance(metrics, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metrics.items()))
    ):
        raise TypeError(
            f"{owner}(metrics={metrics!r}): must be None (report every metric), a metric name, a list of names, "
            "or a dict of reported name to the library's name, e.g. {'loss': 'valid-logloss'}."
        )
    if not isinstance(filename, str) or not filename or os.sep in filename:
        raise ValueError(f"{owner}(filename={filename!r}): must be a file name such as 'model.ubj'.")
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
        raise ValueError(f"{owner}(frequency={frequency!r}): must be 0 (no checkpoints while training) or an integer >= 1.")
    if not isinstance(checkpoint_at_end, bool):
        raise TypeError(f"{owner}(checkpoint_at_end={checkpoint_at_end!r}): must be True or False.")
    return metrics


def select_metrics(owner: str, reported: dict[str, float], metrics: list[str] | dict[str, str] | None) -> dict[str, float]:
    """The metrics to report: all of them, the listed ones, or the dict's renamings."""
    if not metrics:
        return dict(reported)
    wanted = metrics.items() if isinstance(metrics, dict) else ((m, m) for m in metrics)
    selected = {}
    for shown, key in wanted:
        if key not in reported:
            raise ValueError(
                f"{owner}(metrics=...): the library reported no metric {key!r}; it reported {sorted(reported)}. "
                "Names are '<dataset>-<metric>', from the evaluation sets you pass."
            )
        selected[shown] = reported[key]
    return selected


def is_checkpoint_round(iteration: int, frequency: int) -> bool:
    """Rounds count from 0; with frequency=k rounds k-1, 2k-1, ... are checkpointed."""
    return frequency > 0 and (iteration + 1) % frequency == 0


def report(metrics: dict[str, Any], save: Callable[[str], None] | None, filename: str) -> None:
    """Report one round; with ``save``, rank 0 also writes the model to ``filename`` as a checkpoint
    (the other ranks hold the same model, so they send none)."""
    import trainers

    if save is None or trainers.get_context().get_world_rank() != 0:
        trainers.report(metrics)
        return
    with _model_folder(save, filename) as folder:
        trainers.report(metrics, checkpoint=Checkpoint.from_directory(folder))


@contextlib.contextmanager
def _model_folder(save: Callable[[str], None], filename: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="flowtrain-model-") as folder:
        save(os.path.join(folder, filename))
        yield folder


def model_path(checkpoint: Checkpoint, filename: str, default: str) -> ContextManager[str]:
    """The path of the model file inside ``checkpoint``, with a clear error when it is not there."""
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"get_model(checkpoint={checkpoint!r}): pass a trainers.Checkpoint, e.g. result.checkpoint.")
    return _model_path(checkpoint, filename, default)


@contextlib.contextmanager
def _model_path(checkpoint: Checkpoint, filename: str, default: str) -> Iterator[str]:
    with checkpoint.as_directory() as folder:
        path = os.path.join(folder, filename)
        if not os.path.exists(path):
            hint = "" if filename != default else " Pass filename= if the callback saved under another name."
            raise FileNotFoundError(
                f"get_model: the checkpoint {checkpoint.path} has no {filename!r}; it holds {sorted(os.listdir(folder))}.{hint}"
            )
        yield path
