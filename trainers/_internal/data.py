"""Give each worker its part of the trainer's datasets (Ray Data ``streaming_split``)."""

from __future__ import annotations

from typing import Any

from trainers.config import DataConfig


def is_dataset(value: Any) -> bool:
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
    ``trainers._internal.parquet_listing``)."""
    from trainers._internal.parquet_listing import right_size_footer_readers

    resolved = {}
    for name, value in (datasets or {}).items():
        dataset = value if is_dataset(value) else value()
        if not is_dataset(dataset):
            raise TypeError(f"datasets[{name!r}]: the function returned {type(dataset).__name__}, not a ray.data.Dataset.")
        right_size_footer_readers(dataset)
        resolved[name] = dataset
    return resolved


def check_row_counts(datasets: dict[str, Any], config: DataConfig, world_size: int) -> None:
    """Empty datasets, and split ones with fewer rows than workers, fail before any worker starts."""
    to_split = set(datasets) if config.datasets_to_split == "all" else set(config.datasets_to_split)
    for name, dataset in datasets.items():
        rows = dataset.count()
        if rows == 0:
            raise ValueError(f"datasets[{name!r}] is empty: it has no rows to train on.")
        if name in to_split and rows < world_size:
            raise ValueError(
                f"datasets[{name!r}] has {rows} row(s) for {world_size} workers: every worker needs at least one. "
                f"Use fewer workers, or leave it whole with DataConfig(datasets_to_split=[...]) without {name!r}."
            )


def split_datasets(datasets: dict[str, Any], config: DataConfig, world_size: int) -> list[dict[str, Any]]:
    """One ``{name: DataIterator}`` per rank: split datasets are streamed in equal shards, the others
    reach every rank whole."""
    to_split = set(datasets) if config.datasets_to_split == "all" else set(config.datasets_to_split)
    unknown = to_split - set(datasets)
    if unknown:
        raise ValueError(
            f"DataConfig.datasets_to_split names {sorted(unknown)}, which the trainer was not given; "
            f"its datasets are {sorted(datasets)}."
        )
    shards: list[dict[str, Any]] = [{} for _ in range(world_size)]
    for name, dataset in datasets.items():
        if config.execution_options is not None:
            dataset.context.execution_options = config.execution_options
        if name in to_split and world_size > 1:
            parts = dataset.streaming_split(world_size, equal=True)
        else:
            parts = [dataset.iterator()] * world_size
        for rank in range(world_size):
            shards[rank][name] = parts[rank]
    return shards
