"""Storage errors: types you can catch, each naming the path and the operation."""

from __future__ import annotations


class StorageError(OSError, RuntimeError):
    """Reading or writing the run's storage failed: the message names the path and the operation.

    An ``OSError`` (what I/O failures are in Python, and what Prefect's retry rule looks for) and
    a ``RuntimeError``, which is what Ray Train raises in the same places (for example
    ``Result.from_path`` on a folder that holds no run), so ``except RuntimeError`` written for
    Ray Train catches it too.
    """


class RunInProgressError(StorageError):
    """Another live process owns this run (same storage_path and name) right now."""

    #: The owner's host and process id, and the seconds until its lease goes stale (when known).
    holder_host: str | None = None
    holder_pid: int | None = None
    retry_after_s: float | None = None


class SnapshotCorruptError(StorageError):
    """The run's snapshot (run.json) is unreadable and no previous good copy exists."""


class StorageNotSharedError(StorageError, ValueError):
    """A node the run's workers were placed on does not see the run's folder where the driver
    writes it: its checkpoints would land on that node's own disk. The message names each such
    node and the path. Nothing was trained; use storage every node reaches, then run again.

    Also a ``ValueError``: ``storage_path`` does not suit this cluster, a mistake that restarting
    the workers cannot mend (``fit()`` raises it at once, as it does a bad configuration)."""
