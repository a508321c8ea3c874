"""The ingest stage: open each dataset with Ray Data, check it, and hand on a small spec of it."""

from __future__ import annotations

from prefect import get_run_logger

from tasks.console import run_output
from tasks.params import DatasetSource, DatasetSpec
from tasks.retries import io_task


@io_task(name="ingest", task_run_name="ingest {name}", retries=3)
def ingest(name: str, source: DatasetSource) -> DatasetSpec:
    """Read the dataset ``name`` from ``source``, check its columns and that it has rows.

    Returns where it is and what it holds (not its rows): the train stage opens it again, so
    nothing large passes through Prefect. I/O errors are retried; a missing file or column is not.
    """
    from trainers.cluster import ensure_ray
    from trainers.data import DatasetError, read_dataset

    with run_output():
        ensure_ray()
        dataset = read_dataset(source.uri, format=source.format, required_columns=source.required_columns)
        num_rows = dataset.count()
        schema = dataset.schema()
    if num_rows == 0:
        raise DatasetError(f"{source.uri}: dataset {name!r} has no rows.")
    columns = {column: str(kind) for column, kind in zip(schema.names, schema.types, strict=True)}
    # One line per dataset; its columns and their kinds are in the task's result (DatasetSpec).
    get_run_logger().info("dataset %r at %s: %d rows, %d columns", name, source.uri, num_rows, len(columns))
    return DatasetSpec(name=name, uri=source.uri, format=source.format, columns=columns, num_rows=num_rows)
