"""How ``report()`` puts a checkpoint into the run's storage, and what it does with the local folder
(the three ways, as in Ray Train: docs/checkpoints.md). A copy, flowtrain's or the user's
``checkpoint_upload_fn``'s (given the staging folder relative to the run folder), lands in the
report's staging folder, so the controller commits it all at once. flowtrain's copy retries errors
that pass; a user's function is called once: only its author knows whether a retry is safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable

from storage import Checkpoint, upload_directory
from storage.filesystem import delete_dir, display_path, is_local, pafs, relative_inside
from storage.layout import RunLayout, check_dir_name
from storage.upload import CheckpointUploadError, UploadStats

logger = logging.getLogger(__name__)

UploadFn = Callable[[Checkpoint, str], Checkpoint]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one rank's reported checkpoint went, as the controller needs to know it."""

    #: The folder name to commit it under (None: the default), or where it already is.
    dir_name: str | None
    #: True when it is already in its final folder inside the run folder (nothing to move).
    in_place: bool
    #: What the upload took on this rank (None: nothing was uploaded).
    upload: UploadStats | None = None


def check_request(
    checkpoint: Checkpoint | None,
    *,
    no_upload: bool,
    dir_name: str | None,
    upload_fn: UploadFn | None,
    delete_local: bool,
    layout: RunLayout,
    filesystem: pafs.FileSystem | None,
) -> None:
    """Refuse a ``report()`` whose checkpoint arguments cannot work, before anything is copied
    (``filesystem``, the run's, is needed only with a checkpoint)."""
    if dir_name is not None:
        check_dir_name(dir_name)
    if upload_fn is not None and not callable(upload_fn):
        raise TypeError(
            f"report(checkpoint_upload_fn={upload_fn!r}): must be a function taking (checkpoint, "
            "checkpoint_dir_name) and returning the uploaded trainers.Checkpoint."
        )
    if not isinstance(delete_local, bool):
        raise TypeError(f"report(delete_local_checkpoint_after_upload={delete_local!r}): must be None, True or False.")
    if checkpoint is None:
        return
    if no_upload:
        if layout.checkpoint_dir_name(filesystem, checkpoint.filesystem, checkpoint.path) is None:
            raise ValueError(
                f"report(checkpoint_upload_mode=NO_UPLOAD): the checkpoint at {display_path(checkpoint.filesystem, checkpoint.path)} "
                f"is not a folder directly inside the run folder {display_path(filesystem, layout.run_path)}, so "
                "nothing would keep it. Write it to get_context().get_storage().build_checkpoint_path_from_name(name) "
                "first, or report it with CheckpointUploadMode.SYNC to have it copied there."
            )
        return
    if (
        delete_local
        and relative_inside(filesystem, layout.run_path, checkpoint.filesystem, checkpoint.path) is not None
    ):
        raise ValueError(
            f"report(delete_local_checkpoint_after_upload=True): the run folder {layout.run_path} is inside the "
            f"checkpoint folder {checkpoint.path}, which would be deleted after the upload. Save the checkpoint "
            "to a folder of its own (a temporary folder), or pass delete_local_checkpoint_after_upload=False."
        )


def persist(
    checkpoint: Checkpoint,
    *,
    staging: str,
    layout: RunLayout,
    filesystem: pafs.FileSystem,
    dir_name: str | None,
    upload_fn: UploadFn | None,
) -> Placement:
    """Copy ``checkpoint`` into the report's ``staging`` folder, ourselves (retrying errors that
    pass; ``CheckpointUploadError`` when that fails) or with ``upload_fn`` (called once)."""
    if upload_fn is None:
        with checkpoint.as_directory() as folder:
            stats = upload_directory(folder, filesystem, staging)
            _check_uploaded(folder, filesystem, staging)
        return Placement(dir_name, in_place=False, upload=stats)
    relative = layout.relative(staging)
    assert relative is not None, staging  # staging folders are inside the run folder
    start = time.monotonic()
    persisted = upload_fn(checkpoint, relative)
    stats = UploadStats(bytes=_local_bytes(checkpoint), seconds=time.monotonic() - start)
    if not isinstance(persisted, Checkpoint):
        raise TypeError(
            f"report(checkpoint_upload_fn={getattr(upload_fn, '__name__', upload_fn)!r}) returned {persisted!r}; it "
            "must return the uploaded checkpoint as a trainers.Checkpoint."
        )
    if relative_inside(persisted.filesystem, persisted.path, filesystem, staging) == "":
        return Placement(dir_name, in_place=False, upload=stats)
    placed = layout.checkpoint_dir_name(filesystem, persisted.filesystem, persisted.path)
    if placed is None:
        raise ValueError(
            f"report(checkpoint_upload_fn=...): the function returned a checkpoint at "
            f"{display_path(persisted.filesystem, persisted.path)}, outside the run folder "
            f"{display_path(filesystem, layout.run_path)}. Write it to the path built from the name it is given: "
            "get_context().get_storage().build_checkpoint_path_from_name(checkpoint_dir_name)."
        )
    return Placement(placed, in_place=True, upload=stats)


def _check_uploaded(folder: str, filesystem: pafs.FileSystem, staging: str) -> None:
    """Raise ``CheckpointUploadError`` unless every file of local ``folder`` is now in ``staging``:
    a checkpoint missing files (or empty when the folder was not) is never committed."""
    expected = {
        os.path.relpath(os.path.join(root, name), folder) for root, _, names in os.walk(folder) for name in names
    }
    if not expected:
        return
    prefix = staging.rstrip("/") + "/"
    listed = filesystem.get_file_info(pafs.FileSelector(staging, recursive=True, allow_not_found=True))
    present = {
        info.path[len(prefix) :] for info in listed if info.type == pafs.FileType.File and info.path.startswith(prefix)
    }
    missing = sorted(expected - present)
    if missing:
        where = display_path(filesystem, staging)
        raise CheckpointUploadError(
            f"the checkpoint's upload to {where} is missing {len(missing)} of its {len(expected)} files "
            f"({', '.join(missing[:5])}); it was not committed, and the run's previous checkpoint is kept.",
            path=where,
            attempts=1,
        )


def _local_bytes(checkpoint: Checkpoint) -> int:
    """The size of a reported folder on local disk: what a user's upload function had to copy
    (0 when the folder is elsewhere, where measuring it would cost a listing of remote storage)."""
    if not is_local(checkpoint.filesystem):
        return 0
    total = 0
    for folder, _, names in os.walk(checkpoint.path):
        for name in names:
            with contextlib.suppress(OSError):  # removed while we counted: not part of the upload either
                total += os.path.getsize(os.path.join(folder, name))
    return total


def take_for_upload(checkpoint: Checkpoint, *, release: bool, layout: RunLayout, filesystem: pafs.FileSystem) -> str:
    """A private local folder holding the files of ``checkpoint`` as they are now, for an ASYNC
    upload to work from after ``report()`` returned (the caller removes it once uploaded).

    With ``release`` the files leave the reported folder before ``report()`` returns (moved, or
    copied and deleted); the folder stays, empty, for a loop that writes every checkpoint into it.
    Nothing is deleted later: that would meet the loop's next checkpoint. A folder inside the run
    folder is the run's own: copied, never released.
    """
    release = release and relative_inside(checkpoint.filesystem, checkpoint.path, filesystem, layout.run_path) is None
    private = tempfile.mkdtemp(prefix="flowtrain-upload-")
    try:
        if release and is_local(checkpoint.filesystem):
            _move_contents(checkpoint.path, private)
            return private
        with checkpoint.as_directory() as folder:
            shutil.copytree(folder, private, dirs_exist_ok=True)
        if release:
            delete_source(checkpoint)  # a folder on remote storage: gone before report() returns
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return private


def _move_contents(source: str, target: str) -> None:
    """Move every entry of folder ``source`` into the empty folder ``target``; on failure what was
    moved goes back before the error is raised: the reported folder is left as the loop wrote it."""
    moved: list[str] = []
    try:
        for name in sorted(os.listdir(source)):
            origin, destination = os.path.join(source, name), os.path.join(target, name)
            try:
                os.rename(origin, destination)
            except OSError:  # another disk (EXDEV), or a rename the filesystem refuses
                if os.path.isdir(origin) and not os.path.islink(origin):
                    shutil.copytree(origin, destination)
                    shutil.rmtree(origin)
                else:
                    shutil.copy2(origin, destination)
                    os.unlink(origin)
            moved.append(name)
    except BaseException:
        for name in moved:
            try:
                shutil.move(os.path.join(target, name), os.path.join(source, name))
            except OSError as error:
                logger.warning("could not move %s back into %s: %s", name, source, error)
        raise


def delete_source(checkpoint: Checkpoint, keep: Checkpoint | None = None) -> None:
    """Delete the reported checkpoint's folder after its upload (never the uploaded copy
    ``keep``); a failure is logged, never raised: the upload itself succeeded."""
    if keep is not None and relative_inside(keep.filesystem, keep.path, checkpoint.filesystem, checkpoint.path) == "":
        return
    try:
        delete_dir(checkpoint.filesystem, checkpoint.path)
    except FileNotFoundError:
        pass  # already gone: the loop's own temporary folder was cleaned up first
    except OSError as error:  # e.g. another worker on this node shares the folder and deleted it first
        logger.warning("could not delete the local checkpoint %s after its upload: %s", checkpoint.path, error)
