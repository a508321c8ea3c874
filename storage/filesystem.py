"""Resolve a storage path or URI to a ``pyarrow.fs`` filesystem, and copy folders in and out of it."""

from __future__ import annotations

import os
import pickle
import posixpath
import shutil
from typing import TYPE_CHECKING, Any


class _PyarrowFs:
    """``pyarrow.fs``, imported where first used, and only its core for the local disk: a worker
    that never touches the run's storage never loads pyarrow's filesystems, and a run on local disk
    never loads the S3, GCS, Azure and HDFS libraries (about 3 MB of memory in each process)."""

    def __getattr__(self, name: str) -> Any:
        import pyarrow._fs

        if hasattr(pyarrow._fs, name):
            return getattr(pyarrow._fs, name)
        return getattr(_full_pyarrow_fs(), name)


def _full_pyarrow_fs() -> Any:
    """All of ``pyarrow.fs``: loaded before any remote filesystem is built or rebuilt, as it
    registers the S3 library's clean-up at exit."""
    import pyarrow.fs

    return pyarrow.fs


if TYPE_CHECKING:
    import pyarrow.fs as pafs
else:
    pafs = _PyarrowFs()


def is_uri(path: str | os.PathLike) -> bool:
    """True when ``path`` names a filesystem by its scheme (``s3://bucket/x``, ``file:///tmp/x``);
    False for a local path. The one place flowtrain tells the two apart."""
    return "://" in os.fspath(path)


def absolute(path: str | os.PathLike) -> str:
    """A URI as it is, a local path made absolute against the working directory (for paths a user
    gives on the driver, which means the driver's working directory)."""
    text = os.fspath(path)
    return text if is_uri(text) else os.path.abspath(text)


def resolve_filesystem(storage_path: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """Return ``(filesystem, path inside it)`` for a local path or a URI.

    Local paths must be absolute (``~`` is expanded). ``file://``, ``s3://``, ``gs://``,
    ``hdfs://`` go through pyarrow; other schemes through fsspec when it knows them. With an
    explicit ``filesystem`` the path is used as it is.
    """
    path = os.fspath(storage_path)
    if filesystem is not None:
        if is_uri(path):  # "s3://bucket/prefix" with an explicit S3 filesystem: the bucket path
            path = path.split("://", 1)[1]
        return filesystem, path.rstrip("/") or "/"
    if not is_uri(path):
        path = os.path.expanduser(path)
        if not os.path.isabs(path):
            raise ValueError(f"storage path {storage_path!r} is relative: give an absolute path or a URI.")
        return pafs.LocalFileSystem(), os.path.normpath(path)
    try:
        fs, inner = _full_pyarrow_fs().FileSystem.from_uri(path)
        return fs, inner.rstrip("/")
    except ValueError as pyarrow_error:  # pyarrow's ArrowInvalid is a ValueError
        return _fsspec_filesystem(storage_path, path, pyarrow_error)


def _fsspec_filesystem(storage_path: str, path: str, pyarrow_error: Exception) -> tuple[pafs.FileSystem, str]:
    """The fallback for schemes pyarrow does not know: fsspec, or a clear error naming the scheme."""
    import fsspec  # a dependency of ray[data]; imported only for the schemes pyarrow does not know

    scheme = path.split("://", 1)[0]
    if scheme not in fsspec.available_protocols():
        raise ValueError(
            f"storage_path={storage_path!r}: the URI scheme {scheme!r} is not supported. Use an absolute "
            "local path, or a URI that pyarrow.fs knows (file://, s3://, gs://, hdfs://) or that an "
            f"installed fsspec filesystem handles ({pyarrow_error})."
        ) from None
    try:
        fs_spec, inner = fsspec.core.url_to_fs(path)
    except (ValueError, ImportError) as fsspec_error:
        raise ValueError(
            f"storage_path={storage_path!r}: the URI scheme {scheme!r} needs a filesystem that cannot be "
            f"loaded ({fsspec_error}). Install the package it names, or use another storage_path."
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs_spec)), inner.rstrip("/")


def is_local(fs: pafs.FileSystem) -> bool:
    """True for the local disk, where folders can be renamed atomically."""
    return isinstance(fs, pafs.LocalFileSystem)


def display_path(fs: pafs.FileSystem, path: str) -> str:
    """What to show a person: the plain path on local disk, a URI elsewhere."""
    if is_local(fs):
        return path
    kind = fs.type_name.removeprefix("py::")  # a PyFileSystem says what its handler is after "py::"
    scheme = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs"}.get(kind, kind)
    return f"{scheme}://{path.lstrip('/')}"


class ShippedFilesystem:
    """A filesystem on its way to a worker: pickled on the way, rebuilt there when first used (so
    that a worker which never touches storage never imports pyarrow). ``local`` says, without
    rebuilding it, whether it is the worker's own disk."""

    def __init__(self, filesystem: pafs.FileSystem | None) -> None:
        self._filesystem, self._pickled = filesystem, b""
        self.local = filesystem is not None and is_local(filesystem)

    def get(self) -> pafs.FileSystem:
        """The filesystem itself."""
        if self._pickled:
            if not self.local:
                _full_pyarrow_fs()
            self._filesystem, self._pickled = pickle.loads(self._pickled), b""
        return self._filesystem

    def __getstate__(self) -> dict[str, Any]:
        pickled = self._pickled or pickle.dumps(self._filesystem)
        return {"_filesystem": None, "_pickled": pickled, "local": self.local}


def download_directory(fs: pafs.FileSystem, src_path: str, local_dir: str) -> None:
    """Copy the folder ``src_path`` on ``fs`` into ``local_dir``."""
    os.makedirs(local_dir, exist_ok=True)
    if is_local(fs):
        shutil.copytree(src_path, local_dir, dirs_exist_ok=True)
        return
    pafs.copy_files(src_path, local_dir, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())


def exists(fs: pafs.FileSystem, path: str) -> bool:
    """True when a file or folder is at ``path``."""
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    """The whole content of the file at ``path``."""
    with fs.open_input_stream(path) as stream:
        return stream.read()


def write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` as the file at ``path``, replacing what was there."""
    with fs.open_output_stream(path) as stream:
        stream.write(data)


def delete_dir(fs: pafs.FileSystem, path: str) -> None:
    """Delete the folder at ``path`` with everything in it; nothing happens when it is not there."""
    if exists(fs, path):
        fs.delete_dir(path)


def same_filesystem(a: pafs.FileSystem, b: pafs.FileSystem) -> bool:
    """True when ``a`` and ``b`` are one filesystem (so a path means the same file in both)."""
    if a is b:
        return True
    try:
        return a.equals(b)
    except (TypeError, NotImplementedError):
        return False


def normal_path(fs: pafs.FileSystem, path: str) -> str:
    """``path`` as ``fs`` means it: symlinks and ``..`` resolved on local disk (as Ray Train does
    before it compares paths), only normalised elsewhere."""
    return os.path.realpath(path) if is_local(fs) else posixpath.normpath(path)


def relative_inside(path_fs: pafs.FileSystem, path: str, root_fs: pafs.FileSystem, root: str) -> str | None:
    """Where ``path`` (on ``path_fs``) is inside the folder ``root`` (on ``root_fs``): its path
    relative to ``root``, ``""`` when it is ``root`` itself, None when it is elsewhere (another
    filesystem included)."""
    if not same_filesystem(path_fs, root_fs):
        return None
    top, inner = normal_path(root_fs, root).rstrip("/"), normal_path(root_fs, path)
    if inner == top:
        return ""
    return inner[len(top) + 1 :] if inner.startswith(top + "/") else None
