"""Copying a checkpoint's files into the run's storage, retrying the errors that pass.

Which errors those are, how often they are retried and what the run does when the tries run out:
docs/checkpoints.md, "Uploads that hold up" (``RetryPolicy`` reads its variables at every upload:
the workers' for their uploads, the driver's for the commit). An exception other than an
``OSError`` (a ``TypeError``, pyarrow's ``ArrowInvalid``) is a mistake, not weather: raised at once.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import logging
import random
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from storage import settings
from storage.codec import Record, Round6
from storage.errors import RunInProgressError, StorageError
from storage.filesystem import display_path, is_local, pafs, same_filesystem

logger = logging.getLogger(__name__)

#: Bytes read and written per call when streaming a file to remote storage.
CHUNK_BYTES = 4 * 1024 * 1024

#: Python error types waiting cannot fix.
PERMANENT_TYPES = (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)
#: Local-disk ``errno`` values waiting cannot fix (within the seconds an upload waits); not every
#: platform has them all.
PERMANENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "ENOENT", "ENAMETOOLONG", "EFBIG", "EISDIR", "ENOTDIR")
    if hasattr(errno, name)
)
#: Error codes of S3 (as pyarrow names them: "AWS Error ACCESS_DENIED during ..."), Google Cloud
#: Storage and Azure that mean the bucket is missing or the credentials may not write there.
PERMANENT_CODES = (
    "ACCESS_DENIED",
    "NO_SUCH_BUCKET",
    "INVALID_ACCESS_KEY_ID",
    "SIGNATURE_DOES_NOT_MATCH",
    "INVALID_CLIENT_TOKEN_ID",
    "UNRECOGNIZED_CLIENT",
    "MISSING_AUTHENTICATION_TOKEN",
    "AccessDenied",
    "NoSuchBucket",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
    "ContainerNotFound",
)
_PERMANENT_CODE = re.compile(r"\b(" + "|".join(PERMANENT_CODES) + r")\b")
#: pyarrow's S3 filesystem says this (no error code) when a bucket is missing.
_MISSING_BUCKET = re.compile(r"Bucket '[^']*' not found")


def is_transient(error: BaseException) -> bool:
    """Whether trying again later may succeed: True for I/O errors other than a missing bucket or
    folder, a denied permission, bad credentials or a full or read-only disk."""
    if not isinstance(error, OSError) or isinstance(error, PERMANENT_TYPES) or error.errno in PERMANENT_ERRNOS:
        return False
    message = str(error)
    return not (_PERMANENT_CODE.search(message) or _MISSING_BUCKET.search(message))


class CheckpointUploadError(StorageError):
    """A checkpoint's files could not be copied into the run's storage.

    Raised after the retry budget is spent on errors that pass (``attempts`` tries), or after
    the first try of one that does not (``attempts`` is 1). ``path`` is where the files were going
    (a URI on object stores) and ``last_error`` the last underlying error, as text; the message
    names both. The checkpoint was not committed: the run's previous checkpoint is untouched and
    is what ``Result.checkpoint`` and a resumed run use.
    """

    # Pickled by the exception's own rule: its one positional argument, then these fields.
    def __init__(
        self, message: str, *, path: str | None = None, attempts: int = 0, last_error: str | None = None
    ) -> None:
        super().__init__(message)
        self._path = path
        self._attempts = attempts
        self._last_error = last_error

    @property
    def path(self) -> str | None:
        """Where the checkpoint's files were being copied to."""
        return self._path

    @property
    def attempts(self) -> int:
        """How many times the copy was tried."""
        return self._attempts

    @property
    def last_error(self) -> str | None:
        """The last underlying error, as ``"Type: message"``."""
        return self._last_error


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently an upload is tried again, as the ``FLOWTRAIN_UPLOAD_*`` variables say."""

    #: Retries after the first try (``FLOWTRAIN_UPLOAD_RETRIES``): 5 tries in all.
    retries: int = settings.UPLOAD_RETRIES.default
    #: Seconds before the first retry (``FLOWTRAIN_UPLOAD_BACKOFF_S``); doubled for each further one.
    backoff_s: float = settings.UPLOAD_BACKOFF_S.default
    #: The longest wait between two tries (``FLOWTRAIN_UPLOAD_BACKOFF_MAX_S``). With the defaults an
    #: upload that never succeeds gives up after waiting at most 0.5+1+2+4 = 7.5 s.
    backoff_max_s: float = settings.UPLOAD_BACKOFF_MAX_S.default
    #: Files copied at once into remote storage (``FLOWTRAIN_UPLOAD_THREADS``); local disk copies
    #: one file at a time.
    threads: int = settings.UPLOAD_THREADS.default

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetryPolicy:
        """The policy the ``FLOWTRAIN_UPLOAD_*`` variables set (defaults for those unset); a bad
        value is a ``ValueError`` naming the variable."""
        return cls(
            retries=settings.UPLOAD_RETRIES.read(environ),
            backoff_s=settings.UPLOAD_BACKOFF_S.read(environ),
            backoff_max_s=settings.UPLOAD_BACKOFF_MAX_S.read(environ),
            threads=settings.UPLOAD_THREADS.read(environ),
        )

    @property
    def attempts(self) -> int:
        """Tries in all: the first one plus the retries."""
        return self.retries + 1

    def delay(self, retry: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number ``retry`` (0 is the first): the exponential step,
        capped, times a random factor between 0.5 and 1, so workers that failed together do not
        all come back at the same moment."""
        step = min(self.backoff_max_s, self.backoff_s * 2**retry)
        return step * (0.5 + 0.5 * draw())


@dataclasses.dataclass(frozen=True)
class UploadStats(Record):
    """What one upload took: the checkpoint's bytes, the seconds from start to end (waits between
    tries included) and how many tries failed and were made again."""

    bytes: int
    seconds: Round6
    retries: int = 0

    @staticmethod
    def combine(parts: Iterable[UploadStats | None]) -> UploadStats | None:
        """One checkpoint's uploads on several ranks as one: bytes and retries added up, seconds
        of the slowest rank (they upload at the same time). None when no rank uploaded."""
        found = [p for p in parts if p is not None]
        if not found:
            return None
        return UploadStats(
            bytes=sum(p.bytes for p in found),
            seconds=max(p.seconds for p in found),
            retries=sum(p.retries for p in found),
        )


def retry(
    action: Callable[[], Any],
    *,
    destination: str,
    source: str | None = None,
    policy: RetryPolicy | None = None,
    what: str = "checkpoint files",
    before_each_try: Callable[[], None] = lambda: None,
) -> int:
    """Call ``action`` until it returns, retrying transient errors by ``policy`` (the
    environment's by default); return how many retries it took. ``what`` names the data in the
    log line of each retry.

    ``action`` must be safe to call again after it failed half way (overwrite, never append).
    Raises ``CheckpointUploadError`` naming ``destination`` (and ``source``) when the budget is
    spent or the error is not transient; errors that are not ``OSError`` pass through as they are,
    as does ``RunInProgressError``, which a driver's ``before_each_try`` raises once it may no
    longer own the run (a try stuck in a cut network can fail only after another driver took over).
    """
    policy = policy or RetryPolicy.from_env()
    start = time.monotonic()
    for attempt in range(policy.attempts):
        try:
            before_each_try()
            action()
            return attempt
        except (CheckpointUploadError, RunInProgressError):
            raise
        except OSError as error:
            transient = is_transient(error)
            if not transient or attempt + 1 == policy.attempts:
                raise _failure(destination, source, error, attempt + 1, start, transient=transient) from error
            wait = policy.delay(attempt)
            logger.warning(
                "writing %s to %s failed (%s: %s); retry %d of %d in %.2f s",
                what,
                destination,
                type(error).__name__,
                error,
                attempt + 1,
                policy.retries,
                wait,
            )
            time.sleep(wait)
    raise AssertionError("unreachable: the last try returns or raises")  # pragma: no cover


def _failure(
    destination: str, source: str | None, error: OSError, attempts: int, start: float, *, transient: bool
) -> CheckpointUploadError:
    last = f"{type(error).__name__}: {error}"
    origin = f" from {source}" if source else ""
    why = (
        f"after {attempts} tries over {time.monotonic() - start:.1f} s (FLOWTRAIN_UPLOAD_RETRIES sets the budget). "
        "Last error"
        if transient
        else "; not retried, since waiting cannot fix it (a missing bucket or folder, a denied permission, a full disk)"
    )
    return CheckpointUploadError(
        f"could not copy the checkpoint{origin} to {destination} {why}: {last}. The checkpoint was not "
        "committed; the run's previous checkpoint is kept.",
        path=destination,
        attempts=attempts,
        last_error=last,
    )


def copy_tree(
    source_fs: pafs.FileSystem,
    source: str,
    dest_fs: pafs.FileSystem,
    dest: str,
    *,
    before_each_try: Callable[[], None] = lambda: None,
) -> UploadStats:
    """Copy the files of folder ``source`` into folder ``dest`` (merging with what is there),
    retrying transient errors; return the bytes copied, the seconds taken and the retries.

    A retry copies again only the files not yet copied, each from its start, overwriting what a
    failed try left of it, so a retry never leaves a file half written. Within one filesystem the
    store copies each file itself (a server-side copy on S3). ``before_each_try`` runs before
    each try; what it raises ends the copy.
    """
    policy = RetryPolicy.from_env()
    start = time.monotonic()
    plan: dict[str, Any] = {}
    done: set[str] = set()
    same = same_filesystem(source_fs, dest_fs)

    def copy(relative: str) -> None:
        source_file, dest_file = f"{source.rstrip('/')}/{relative}", f"{dest.rstrip('/')}/{relative}"
        if is_local(source_fs) and is_local(dest_fs):
            shutil.copy2(source_file, dest_file)  # as shutil.copytree did; truncates what a failed try left
        elif same:
            dest_fs.copy_file(source_file, dest_file)  # the store copies (S3 CopyObject): nothing goes through us
        else:
            with source_fs.open_input_stream(source_file) as reader, dest_fs.open_output_stream(dest_file) as writer:
                while chunk := reader.read(CHUNK_BYTES):
                    writer.write(chunk)
        done.add(relative)

    def one_pass() -> None:
        # Listing and making folders may fail too: each is part of the try until it has worked.
        if not plan:
            plan.update(_plan(source_fs, source))
        if "made" not in plan:
            dest_fs.create_dir(dest, recursive=True)
            for relative in plan["dirs"]:  # empty folders of the checkpoint too, as a local copy keeps them
                dest_fs.create_dir(f"{dest.rstrip('/')}/{relative}", recursive=True)
            plan["made"] = True
        remaining = [path for path, _ in plan["files"] if path not in done]
        _copy_files(copy, remaining, 1 if is_local(dest_fs) else policy.threads)

    where, origin = display_path(dest_fs, dest), display_path(source_fs, source)
    retries = retry(one_pass, destination=where, source=origin, policy=policy, before_each_try=before_each_try)
    return UploadStats(bytes=sum(size for _, size in plan["files"]), seconds=time.monotonic() - start, retries=retries)


def upload_directory(local_dir: str, fs: pafs.FileSystem, dest_path: str) -> UploadStats:
    """Copy the files of ``local_dir`` into ``dest_path`` on ``fs``, merging with what is there and
    retrying the errors that pass (else ``CheckpointUploadError``); return the bytes copied, the
    seconds it took and the retries."""
    return copy_tree(pafs.LocalFileSystem(), local_dir, fs, dest_path)


def _plan(fs: pafs.FileSystem, root: str) -> dict[str, Any]:
    """The folders and (file, size) pairs under ``root``, as paths relative to it."""
    root = root.rstrip("/") or "/"
    prefix = root.rstrip("/") + "/"
    dirs, files = [], []
    for entry in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        relative = entry.path[len(prefix) :] if entry.path.startswith(prefix) else entry.base_name
        if entry.type == pafs.FileType.Directory:
            dirs.append(relative)
        elif entry.type == pafs.FileType.File:
            files.append((relative, entry.size or 0))
    return {"dirs": sorted(dirs), "files": sorted(files)}


def _copy_files(copy: Callable[[str], None], names: list[str], threads: int) -> None:
    """Copy the files ``names`` (relative paths) with ``copy``; raise the worst error of the pass
    (one waiting cannot fix before one it can) after every file was tried."""
    errors: list[BaseException] = []
    if threads == 1 or len(names) < 2:
        for relative in names:
            try:
                copy(relative)
            except OSError as error:
                errors.append(error)
                if not is_transient(error):
                    break
    else:
        with concurrent.futures.ThreadPoolExecutor(
            min(threads, len(names)), thread_name_prefix="flowtrain-copy"
        ) as pool:
            futures = [pool.submit(copy, relative) for relative in names]
        errors = [failure for future in futures if (failure := future.exception()) is not None]
    if errors:
        permanent = [e for e in errors if not is_transient(e)]
        raise (permanent or errors)[0]
