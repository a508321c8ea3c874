"""flowtrain storage: checkpoints and run state on any ``pyarrow.fs`` filesystem.

Commits are atomic, retention never deletes the best or the latest checkpoint, and a run can
always be resumed from what its snapshot (``run.json``) names; a folder ``ray.train`` wrote is
read and resumed from Ray's own snapshot. Imports neither ``trainers`` nor Prefect nor Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.lazy_names import lazy_names

# Every public name is imported on first use (``storage.lazy_names``, which reads where each lives
# from the ``TYPE_CHECKING`` block below): a training worker needs ``Checkpoint`` and the run's
# layout, not the driver's ``RunStorage`` (snapshot, lease, commit, retention).
__all__, __getattr__, __dir__ = lazy_names(globals())


if TYPE_CHECKING:  # the public names: what IDEs and type checkers see, and what lazy_names loads on first use
    from storage.checkpoint import Checkpoint
    from storage.config import CheckpointConfig
    from storage.errors import RunInProgressError, SnapshotCorruptError, StorageError, StorageNotSharedError
    from storage.filesystem import download_directory, resolve_filesystem
    from storage.layout import RunLayout
    from storage.protocol import ReportRound, RunRecord
    from storage.ray_run_format import RayRunFormatError
    from storage.run_storage import RunStorage, load_run
    from storage.snapshot import RestartRecord, RunSnapshot
    from storage.upload import upload_directory
