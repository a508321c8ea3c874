"""Where everything of one run lives under ``{storage_path}/{name}``."""

from __future__ import annotations

import dataclasses
import os
import posixpath

from storage.filesystem import is_uri, pafs, relative_inside

#: Where runs go when no storage path is given (Ray Train's is ``~/ray_results``).
DEFAULT_STORAGE_PATH = "~/flowtrain_results"

SNAPSHOT = "run.json"
SNAPSHOT_PREVIOUS = "run.json.prev"
SNAPSHOT_NEW = "run.json.new"
#: Claims on the run's lease are files ``lease.<id>.json``, one per driver that wants the run.
LEASE_PREFIX = "lease."
STAGING = ".staging"
COMMIT_MARKER = ".committed"
CHECKPOINT_PREFIX = "checkpoint_"
#: The run's health files (memory summaries of ranks that ran out of memory, the timeline): hidden,
#: as .staging is, so that the run folder shows what Ray Train's does (its checkpoints).
HEALTH = ".health"
#: The run's metrics history, an append-only log of segments (``storage.metrics_log``): hidden too.
METRICS = ".metrics"
#: Names in the run folder that belong to flowtrain, never to a checkpoint.
RESERVED_NAMES = frozenset({SNAPSHOT, SNAPSHOT_PREVIOUS, SNAPSHOT_NEW, STAGING, HEALTH, METRICS})


def check_dir_name(name: object, field: str = "report(checkpoint_dir_name)") -> str:
    """Return ``name`` when it can name a checkpoint folder inside the run folder, else raise
    ``ValueError`` saying why: one plain folder name, not hidden, not one of flowtrain's files."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{field}={name!r}: must be a non-empty folder name such as 'epoch_3'.")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(
            f"{field}={name!r}: must be one folder name directly inside the run folder, without "
            "'/' or '..'; put the step in the name instead, e.g. 'epoch_3'."
        )
    if name.startswith(".") or name in RESERVED_NAMES:
        raise ValueError(
            f"{field}={name!r}: names starting with '.' and {sorted(RESERVED_NAMES - {STAGING, HEALTH})} are "
            "flowtrain's own files in the run folder; choose another name."
        )
    return name


def resolve_storage_path(storage_path: str | None) -> str:
    """``storage_path`` with the default filled in and ``~`` expanded (a URI stays as it is)."""
    path = str(storage_path) if storage_path is not None else DEFAULT_STORAGE_PATH
    return path if is_uri(path) else os.path.expanduser(path)


def run_folder(storage_path: str | None, name: str) -> str:
    """The folder of run ``name`` under ``storage_path`` (None: the default), as the user names
    it: a local path or a URI."""
    return join_run(resolve_storage_path(storage_path), name)


def join_run(root: str, name: str) -> str:
    """The folder of run ``name`` in the folder ``root``: the one place a run's folder is joined."""
    return f"{root.rstrip('/')}/{name}"


class _RunFile:
    """``RunLayout.<attribute>``: the path of one file of the run, named at the top of this module."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, layout: RunLayout, owner: type | None = None) -> str:
        return layout._join(self.name)


@dataclasses.dataclass(frozen=True)
class RunLayout:
    """Paths of one run's files, inside its filesystem. Workers get a copy to know where to upload."""

    run_path: str

    def _join(self, *parts: str) -> str:
        return "/".join([self.run_path.rstrip("/"), *parts])

    snapshot = _RunFile(SNAPSHOT)
    snapshot_previous = _RunFile(SNAPSHOT_PREVIOUS)
    snapshot_new = _RunFile(SNAPSHOT_NEW)
    #: The folder of the run's metrics log (``.metrics/``).
    metrics_folder = _RunFile(METRICS)
    staging_root = _RunFile(STAGING)

    def health_path(self, file_name: str) -> str:
        """A file of the run's health folder (``.health/``)."""
        return self._join(HEALTH, file_name)

    def staging_path(self, attempt: int, report_index: int) -> str:
        """Where ranks upload the checkpoint files of their ``report_index``-th report in ``attempt``."""
        return self._join(STAGING, f"attempt_{attempt:04d}", f"report_{report_index:06d}")

    @staticmethod
    def checkpoint_name(seq: int) -> str:
        return f"{CHECKPOINT_PREFIX}{seq:06d}"

    def path_of(self, dir_name: str) -> str:
        """The folder ``dir_name`` inside the run folder."""
        return self._join(dir_name)

    def relative(self, path: str) -> str | None:
        """``path`` relative to the run folder (``".staging/..."``, ``"epoch_3"``), or None when
        it is not inside the run folder."""
        root = posixpath.normpath(self.run_path).rstrip("/")
        inner = posixpath.normpath(path)
        return inner[len(root) + 1 :] if inner.startswith(root + "/") else None

    def checkpoint_dir_name(self, fs: pafs.FileSystem, path_fs: pafs.FileSystem, path: str) -> str | None:
        """The folder name of ``path`` (on ``path_fs``) when it is a folder directly inside this run
        folder (on ``fs``) whose name can name a checkpoint; else None."""
        relative = relative_inside(path_fs, path, fs, self.run_path)
        if not relative or "/" in relative:
            return None
        try:
            return check_dir_name(relative)
        except ValueError:
            return None
