"""A worker's session without Ray or a controller: rank 0 of 1, attempt 1, its events in a list."""

from __future__ import annotations

from storage.layout import RunLayout
from trainers._internal.session.worker_session import WorkerSession
from trainers.context import StorageInfo, TrainContext


def make_session(tmp_path, fs, events: list) -> WorkerSession:
    """A session whose run lives under ``tmp_path/run`` on ``fs`` and which appends each event it
    emits to ``events``."""
    info = StorageInfo(str(tmp_path), str(tmp_path / "run"), str(tmp_path / "run"), fs)
    return WorkerSession(
        context=TrainContext("run", 1, 0, 0, 1, 0, info),
        attempt=1,
        layout=RunLayout(str(tmp_path / "run")),
        checkpoint=None,
        dataset_shards={},
        emit=events.append,
    )
