"""Checkpoint: a folder of files on some filesystem, as in ``ray.train.Checkpoint``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any, Self

from storage.filesystem import absolute, download_directory, is_local, pafs, read_bytes, resolve_filesystem, write_bytes

#: Where user metadata lives inside a checkpoint folder.
METADATA_FILE = ".metadata.json"


class Checkpoint:
    """A folder of files (a model, optimizer state, ...) on local disk or remote storage.

    Build one from a local folder with ``Checkpoint.from_directory(path)`` and pass it to
    ``report()``; read one back with ``as_directory()`` or ``to_directory()``.
    """

    def __init__(self, path: str | os.PathLike, filesystem: pafs.FileSystem | None = None) -> None:
        if filesystem is None:
            filesystem, path = resolve_filesystem(absolute(path))
        self.path = os.fspath(path)
        self.filesystem = filesystem

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> Self:
        """A checkpoint of the local folder ``path`` (nothing is copied until it is reported).

        Raises ``ValueError`` at once when ``path`` is not an existing folder.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Checkpoint.from_directory(path={path!r}): path must be a str or os.PathLike folder path.")
        folder = os.path.abspath(os.fspath(path))
        if not os.path.isdir(folder):
            problem = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
            raise ValueError(
                f"Checkpoint.from_directory(path={os.fspath(path)!r}): {folder} {problem}. "
                "Save the checkpoint's files into a folder first, then pass that folder."
            )
        return cls(folder, pafs.LocalFileSystem())

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        """Copy the checkpoint into a local folder (a new temporary one by default); return its path."""
        target = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint_")
        download_directory(self.filesystem, self.path, target)
        return target

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local folder with the checkpoint's files: the folder itself on local disk, else a copy
        that is removed afterwards. Do not write into it."""
        if is_local(self.filesystem):
            yield self.path
            return
        local = self.to_directory()
        try:
            yield local
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def get_metadata(self) -> dict[str, Any]:
        """The checkpoint's metadata dict (empty when none was set)."""
        try:
            return json.loads(read_bytes(self.filesystem, f"{self.path}/{METADATA_FILE}"))
        except OSError:
            return {}

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the checkpoint's metadata (must be JSON-serialisable)."""
        write_bytes(self.filesystem, f"{self.path}/{METADATA_FILE}", json.dumps(metadata).encode())

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the checkpoint's metadata."""
        self.set_metadata({**self.get_metadata(), **metadata})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path and other.filesystem.equals(self.filesystem)

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Checkpoint(filesystem={self.filesystem.type_name}, path={self.path})"
