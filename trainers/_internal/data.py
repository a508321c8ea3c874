"""Give each worker its part of the trainer's datasets (Ray Data ``streaming_split``)."""

from __future__ import annotations

from typing import Any

from trainers.config import DataConfig


def resolve_datasets(datasets: dict[str, Any] | None) -> dict[str, Any]:
    """Call the dataset factories (``datasets={"train": lambda: ray.data.read_parquet(...)}``)."""
    return {name: (ds() if callable(ds) and not hasattr(ds, "streaming_split") else ds) for name, ds in (datasets or {}).items()}


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
