"""What a run folder's metrics log holds, for tests that check a run's recorded history."""

from __future__ import annotations

import os
from typing import Any

import pyarrow.fs as pafs

from storage.layout import RunLayout
from storage.metrics_log import read_history


def recorded_reports(run_folder: str | os.PathLike) -> list[dict[str, Any]]:
    """Every report the local run folder's history keeps, in order, each as
    ``{"attempt": ..., "report_index": ..., "metrics": {...}}``."""
    return [entry.to_json() for entry in read_history(pafs.LocalFileSystem(), RunLayout(os.fspath(run_folder)))]
