"""flowtrain storage: checkpoints and run state on any ``pyarrow.fs`` filesystem.

Commits are atomic, retention never deletes the best or the latest checkpoint, and a run can
always be resumed from what its snapshot (``run.json``) names; a folder ``ray.train`` wrote is
read and resumed from Ray's own snapshot. Imports neither ``trainers`` nor Prefect nor Ray.
"""

from storage.checkpoint import Checkpoint
from storage.config import CheckpointConfig
from storage.errors import RunInProgressError, SnapshotCorruptError, StorageError
from storage.filesystem import download_directory, resolve_filesystem
from storage.layout import RunLayout
from storage.protocol import RunRecord
from storage.ray_run_format import RayRunFormatError
from storage.run_storage import RunStorage, load_run
from storage.snapshot import RunSnapshot
from storage.upload import upload_directory

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "RayRunFormatError",
    "RunInProgressError",
    "RunLayout",
    "RunRecord",
    "RunSnapshot",
    "RunStorage",
    "SnapshotCorruptError",
    "StorageError",
    "download_directory",
    "load_run",
    "resolve_filesystem",
    "upload_directory",
]
