"""Give each worker its part of the trainer's datasets, the way Ray Train 2.60 does.

Split datasets are streamed to the workers in equal shards (``streaming_split``); the others reach
every worker whole. Each runs with ``DataConfig.execution_options`` or else the driver's
``DataContext`` defaults, and that ``DataContext`` is installed in every worker too, so ``ray.data``
in the training function behaves as in the driver.
"""

from __future__ import annotations

import copy
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainers.config import DataConfig


def is_dataset(value: Any) -> bool:
    """Whether ``value`` is a Ray Data dataset (anything that can be split and iterated)."""
    return hasattr(value, "streaming_split") and hasattr(value, "iterator")


def check_dataset_values(datasets: dict[str, Any]) -> None:
    """Each value is a Ray Data dataset or a function returning one (checked when called)."""
    for name, value in datasets.items():
        if not isinstance(name, str):
            raise TypeError(f"datasets: the name {name!r} must be a string such as 'train'.")
        if not is_dataset(value) and not callable(value):
            raise TypeError(
                f"datasets[{name!r}]={type(value).__name__}: pass a ray.data.Dataset (for example "
                "ray.data.read_parquet(path), ray.data.from_pandas(df), or trainers.data.read_dataset(path)) "
                "or a function returning one."
            )


def resolve_datasets(datasets: dict[str, Any] | None) -> dict[str, Any]:
    """Call the dataset factories (``datasets={"train": lambda: ray.data.read_parquet(...)}``), and
    let the datasets' Parquet listings start only the footer readers their files need (see
    ``trainers._internal.ray_private.right_size_footer_readers``)."""
    from trainers._internal.ray_private import right_size_footer_readers

    resolved = {}
    for name, value in (datasets or {}).items():
        dataset = value if is_dataset(value) else value()
        if not is_dataset(dataset):
            raise TypeError(
                f"datasets[{name!r}]: the function returned {type(dataset).__name__}, not a ray.data.Dataset."
            )
        right_size_footer_readers(dataset)
        resolved[name] = dataset
    return resolved


def names_to_split(datasets: dict[str, Any], config: DataConfig) -> set[str]:
    """The names of the datasets streamed to the workers in shards (the others reach each whole)."""
    return set(datasets) if config.datasets_to_split == "all" else set(config.datasets_to_split)


def check_datasets_to_split(datasets: dict[str, Any], config: DataConfig) -> None:
    """``DataConfig.datasets_to_split`` names only datasets the trainer was given."""
    unknown = names_to_split(datasets, config) - set(datasets)
    if unknown:
        raise ValueError(
            f"DataConfig.datasets_to_split names {sorted(unknown)}, which the trainer was not given; "
            f"its datasets are {sorted(datasets)}."
        )


def check_row_counts(datasets: dict[str, Any], config: DataConfig, world_size: int) -> None:
    """Check ``datasets_to_split``, and warn before any worker starts about datasets some workers
    will see no rows of: as in Ray Train not an error (an empty dataset, or a split one with fewer
    rows than workers, gives empty iterators), but a loop that expects rows would see none."""
    check_datasets_to_split(datasets, config)
    to_split = names_to_split(datasets, config)
    for name, dataset in datasets.items():
        rows = dataset.count()
        if rows == 0:
            warnings.warn(
                f"datasets[{name!r}] is empty: every worker's get_dataset_shard({name!r}) will yield no rows.",
                stacklevel=3,
            )
        elif name in to_split and rows < world_size:
            warnings.warn(
                f"datasets[{name!r}] has {rows} row(s) for {world_size} workers: its shards are equal and Ray Data "
                "drops the rows left over, so every worker gets an empty shard. Use fewer workers, or give every "
                f"worker all of it with DataConfig(datasets_to_split=[...]) without {name!r}.",
                stacklevel=3,
            )


# -- the driver's DataContext, in the workers ---------------------------------------------------


def capture_data_context() -> Any | None:
    """A copy of the driver's current Ray Data ``DataContext``, to install in the workers; None when
    this process never imported Ray Data (nobody changed it, and workers need not import it)."""
    if "ray.data" not in sys.modules:
        return None
    from ray.data import DataContext

    return copy.deepcopy(DataContext.get_current())


def split_datasets(
    datasets: dict[str, Any], config: DataConfig, world_size: int, worker_node_ids: list[str] | None = None
) -> list[dict[str, Any]]:
    """One ``{name: DataIterator}`` per rank, made by ``config.configure`` (so a ``DataConfig``
    subclass that overrides it decides, as in Ray Train); ``worker_node_ids`` are the workers'
    nodes in rank order, for shard locality."""
    check_datasets_to_split(datasets, config)
    shards = config.configure(datasets, world_size=world_size, worker_handles=None, worker_node_ids=worker_node_ids)
    if not isinstance(shards, list) or len(shards) != world_size:
        raise TypeError(
            f"{type(config).__name__}.configure returned {type(shards).__name__} of length "
            f"{len(shards) if isinstance(shards, list) else '?'}: it must return a list with one "
            f"{{name: DataIterator}} dict per worker ({world_size})."
        )
    return shards
