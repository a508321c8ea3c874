"""Reading training data with Ray Data: parquet, csv or json from a local path or any URI.

``read_dataset`` checks what it read before training starts: required columns must exist with
the expected types, and every error names the file (or folder) and the column.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from storage.filesystem import absolute, resolve_filesystem

FORMATS = ("parquet", "csv", "json")


class DatasetError(ValueError):
    """The data cannot be used as given: the message names the file and the column."""


_ENDINGS = (("parquet", (".parquet", ".pq")), ("csv", (".csv",)), ("json", (".json", ".jsonl")))


def _guess_format(path: str, names: list[str]) -> str:
    """The format from the file's ending, or from the endings of the files in a folder."""
    for name in [path, *sorted(names)]:
        for fmt, endings in _ENDINGS:
            if name.rstrip("/").lower().endswith(endings):
                return fmt
    raise DatasetError(f"{path}: cannot tell the format from the name; pass format= one of {', '.join(FORMATS)}.")


def read_dataset(
    path: str,
    *,
    format: str | None = None,
    required_columns: Mapping[str, str] | None = None,
    filesystem: Any = None,
) -> Any:
    """Open ``path`` (a file or folder, local or ``s3://``/``gs://``/...) as a ``ray.data.Dataset``.

    ``required_columns`` maps column names to the kind of values expected: ``"float"``,
    ``"int"``, ``"number"`` (either), ``"string"`` or ``"bool"``. Reading is lazy; only the schema
    is looked at here.
    """
    import pyarrow.fs as pafs
    import ray.data

    fs, inner = resolve_filesystem(absolute(path), filesystem)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise DatasetError(f"{path}: no such file or folder.")
    names = []
    if info.type == pafs.FileType.Directory:
        names = [entry.base_name for entry in fs.get_file_info(pafs.FileSelector(inner))]
    fmt = format or _guess_format(path, names)
    if fmt not in FORMATS:
        raise DatasetError(f"{path}: format={fmt!r} is not one of {', '.join(FORMATS)}.")
    reader = {"parquet": ray.data.read_parquet, "csv": ray.data.read_csv, "json": ray.data.read_json}[fmt]
    dataset = reader(inner, filesystem=fs)
    if required_columns:
        check_schema(dataset.schema(), required_columns, source=path)
    return dataset


_KINDS = {
    "float": pa.types.is_floating,
    "int": pa.types.is_integer,
    "number": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "bool": pa.types.is_boolean,
}


def check_schema(schema: Any, required: Mapping[str, str], *, source: str) -> None:
    """Raise ``DatasetError`` naming ``source`` and the column when one is missing or of the wrong kind."""
    names = list(schema.names)
    types = dict(zip(names, schema.types, strict=True))
    for column, kind in required.items():
        if kind not in _KINDS:
            raise ValueError(f"required_columns[{column!r}]={kind!r}: must be one of {', '.join(_KINDS)}.")
        if column not in types:
            raise DatasetError(f"{source}: column {column!r} is missing; the columns are {names}.")
        arrow_type = types[column]
        if not isinstance(arrow_type, pa.DataType):
            arrow_type = pa.from_numpy_dtype(arrow_type)
        if not _KINDS[kind](arrow_type):
            raise DatasetError(f"{source}: column {column!r} holds {arrow_type}, expected {kind} values.")
