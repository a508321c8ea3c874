"""Ordered background work for one worker: checkpoint uploads and the reports queued behind them
(reports must reach the controller in the order they were made)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable


class OrderedUploader:
    """A single background thread running jobs in submission order; a job's error is re-raised
    in the training loop at its next ``report()`` or when it returns."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future] = []

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job`` behind the earlier ones; first re-raise the error of one that failed."""
        for future in [future for future in self._pending if future.done()]:
            future.result()  # a failed job's error, raised (and kept for flush)
            self._pending.remove(future)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowtrain-upload")
        self._pending.append(self._pool.submit(job))

    def flush(self) -> None:
        """Wait for every submitted job; raise the first failure, if any."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
