"""How ``report()`` handles a checkpoint (``ray.train.CheckpointUploadMode``)."""

from __future__ import annotations

import enum


class CheckpointUploadMode(enum.Enum):
    """How ``report()`` moves a checkpoint into the run's storage.

    ``SYNC`` uploads before ``report()`` returns. ``ASYNC`` copies the folder to local disk,
    returns, and uploads in the background (reports stay in order): with remote storage the loop
    waits only for the local copy. ``NO_UPLOAD`` copies nothing: the checkpoint is a folder you
    wrote directly inside the run folder (``get_context().get_storage().build_checkpoint_path_from_name(name)``),
    recorded there as it is (retention deletes it like any other checkpoint).
    """

    SYNC = "SYNC"
    ASYNC = "ASYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """What ``report(delete_local_checkpoint_after_upload=None)`` means in this mode: delete
        the reported folder after an ASYNC upload, keep it otherwise."""
        return self is CheckpointUploadMode.ASYNC
