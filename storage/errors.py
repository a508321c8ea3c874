"""Storage errors: types you can catch, each naming the path and the operation."""

from __future__ import annotations


class StorageError(OSError):
    """Reading or writing the run's storage failed: the message names the path and the operation."""


class RunInProgressError(StorageError):
    """Another live process owns this run (same storage_path and name) right now."""


class SnapshotCorruptError(StorageError):
    """The run's snapshot (run.json) is unreadable and no previous good copy exists."""
