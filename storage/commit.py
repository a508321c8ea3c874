"""Committing a checkpoint folder: the staged files reach the checkpoint's folder all or nothing.

On local disk the staged folder is renamed (an atomic rename(2)). On object stores the files are
copied, errors that pass are retried (``storage.upload``), and a ``.committed`` marker is written
once every file is in: a folder without it is never read.
"""

from __future__ import annotations

from collections.abc import Callable

from storage.errors import StorageError
from storage.filesystem import delete_dir, display_path, exists, is_local, pafs, write_bytes
from storage.layout import COMMIT_MARKER
from storage.upload import CheckpointUploadError, copy_tree, retry


def try_delete(fs: pafs.FileSystem, path: str) -> bool:
    """Best-effort cleanup of the folder at ``path``: True when it worked; a failure is retried at
    the next chance."""
    try:
        delete_dir(fs, path)
        return True
    except OSError:
        return False


def commit_folder(
    fs: pafs.FileSystem,
    staged: str,
    final: str,
    *,
    announce: Callable[[], None] | None = None,
    still_owner: Callable[[], None] = lambda: None,
) -> int:
    """Move the staged files to ``final``, all or nothing; return the retries it took.

    ``announce`` is called once the staged files are found and before anything moves
    (``RunStorage._announce``). ``still_owner`` raises when this driver may no longer own the run (its
    lease's check): it is called before each try to change ``final``, since a commit
    can outlast the lease (a copy stuck in a cut network, answered once the link is back) and
    the folder may then be another driver's.
    """
    if not exists(fs, staged):
        raise StorageError(f"cannot commit checkpoint: its staged files are missing at {display_path(fs, staged)}")
    if announce is not None:
        announce()
    leftover = exists(fs, final)  # a half-done commit of a crashed attempt, or a dropped checkpoint
    # whose deletion failed: never a kept one. The lookups above can outlast the lease (answered
    # once a cut link is back), and the folder may then be the new owner's: check before any change.
    still_owner()
    if leftover:
        delete_dir(fs, final)
    if is_local(fs):
        fs.move(staged, final)  # rename(2): all or nothing
        return 0
    where = display_path(fs, final)
    try:
        copied = copy_tree(fs, staged, fs, final, before_each_try=still_owner)
        marker = f"{final}/{COMMIT_MARKER}"
        marked = retry(lambda: write_bytes(fs, marker, b""), destination=where, before_each_try=still_owner)
    except CheckpointUploadError:
        still_owner()
        try_delete(fs, final)  # unmarked, so never read; tidied now
        raise
    try_delete(fs, staged)
    return copied.retries + marked


def adopt_folder(
    fs: pafs.FileSystem, staged: str | None, final: str, *, still_owner: Callable[[], None] = lambda: None
) -> None:
    """Commit a checkpoint a worker wrote into the run folder itself, merging in the staged files
    of ranks that uploaded theirs (``staged``); ``still_owner`` as for ``commit_folder``."""
    if fs.get_file_info(final).type != pafs.FileType.Directory:
        raise StorageError(
            f"cannot record checkpoint {display_path(fs, final)} (CheckpointUploadMode.NO_UPLOAD): "
            "it is not a folder of the run's storage."
        )
    still_owner()
    if staged is not None and exists(fs, staged):
        pafs.copy_files(staged, final, source_filesystem=fs, destination_filesystem=fs)
        try_delete(fs, staged)
    if not is_local(fs):
        write_bytes(fs, f"{final}/{COMMIT_MARKER}", b"")


def is_committed(fs: pafs.FileSystem, path: str) -> bool:
    """Whether the checkpoint folder at ``path`` was committed: on local disk the folder is the
    proof (an atomic rename made it), on object stores its marker."""
    return is_local(fs) or exists(fs, f"{path}/{COMMIT_MARKER}")
