"""What a training worker knows about itself: ranks, sizes, run name and storage.

``get_context()`` inside ``train_loop_per_worker`` returns the :class:`TrainContext` of the
calling worker, exactly as ``ray.train.get_context()`` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from storage.filesystem import ShippedFilesystem, pafs


class StorageInfo:
    """Where the run keeps its checkpoints and state.

    ``storage_path`` is what the user gave (``RunConfig.storage_path``), ``experiment_fs_path``
    the run folder inside ``storage_filesystem``, and ``experiment_path`` the same folder as a
    URI or absolute local path a person can paste somewhere.
    """

    def __init__(
        self, storage_path: str, experiment_path: str, experiment_fs_path: str, storage_filesystem: pafs.FileSystem
    ) -> None:
        self.storage_path = storage_path
        self.experiment_path = experiment_path
        self.experiment_fs_path = experiment_fs_path
        #: Travels to the workers pickled, and is rebuilt in one only when it is used there.
        self.shipped_filesystem = ShippedFilesystem(storage_filesystem)

    @property
    def storage_filesystem(self) -> pafs.FileSystem:
        """The ``pyarrow.fs`` filesystem the run's folder is in."""
        return self.shipped_filesystem.get()

    def build_checkpoint_path_from_name(self, name: str) -> str:
        """Where a checkpoint folder called ``name`` sits in the run folder (in ``storage_filesystem``):
        write there and report it with ``checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD``."""
        return f"{self.experiment_fs_path.rstrip('/')}/{name}"


@dataclasses.dataclass(frozen=True)
class TrainContext:
    """The calling worker's place in the run.

    Ranks are assigned by node: workers on the same node get consecutive world ranks, the node of
    world rank 0 is node rank 0, and local ranks count from 0 on every node.
    """

    experiment_name: str
    world_size: int
    world_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    storage: StorageInfo
    #: Accelerator ids of this worker, as indices into its ``CUDA_VISIBLE_DEVICES`` (empty on CPU).
    accelerator_ids: tuple[int, ...] = ()
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Which attempt of the run this worker trains in (see ``get_attempt``).
    attempt: int = 1

    # Ray Train's TrainContext getters, one per field: its public API.
    def get_experiment_name(self) -> str:
        """The run's name (``RunConfig.name``)."""
        return self.experiment_name

    def get_world_size(self) -> int:
        """How many workers train together."""
        return self.world_size

    def get_world_rank(self) -> int:
        """This worker's rank among all workers, from 0."""
        return self.world_rank

    def get_local_rank(self) -> int:
        """This worker's rank among the workers on its node, from 0."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """How many workers run on this worker's node."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """The rank of this worker's node, from 0 (the node of world rank 0)."""
        return self.node_rank

    def get_storage(self) -> StorageInfo:
        """Where the run's checkpoints and state live."""
        return self.storage

    def get_metadata(self) -> dict[str, Any]:
        """User metadata attached to the trainer (``metadata=`` on the trainer)."""
        return dict(self.metadata)

    def get_attempt(self) -> int:
        """Which attempt of the run this is: 1 the first time, one more after each restart (a
        failure, a preemption, an elastic resize), counted over reruns of ``fit()`` too, as
        ``run.json`` counts them. flowtrain's own (in Ray Train, ``get_checkpoint()`` tells a restart)."""
        return self.attempt

    def get_trial_name(self) -> str:
        """The run's name; kept for Ray Train (Tune) code that asks for a trial name."""
        return self.experiment_name

    def get_trial_id(self) -> str:
        """Removed in Ray Train V2 (raises DeprecationWarning): use ``ray.tune.get_context()`` in a Tune trial."""
        raise _tune_only("get_trial_id")

    def get_trial_resources(self) -> Any:
        """Removed in Ray Train V2 (raises DeprecationWarning): use ``ray.tune.get_context()`` in a Tune trial."""
        raise _tune_only("get_trial_resources")

    def get_trial_dir(self) -> str:
        """Removed in Ray Train V2 (raises DeprecationWarning): pass the folder you need in
        ``train_loop_config``, or use ``get_storage()`` for the run's folder."""
        raise _tune_only("get_trial_dir")


def _tune_only(method: str) -> DeprecationWarning:
    from storage.config import deprecated

    return deprecated(
        f"get_context().{method}()",
        "It described a Ray Tune trial; inside a Tune trial ask ray.tune.get_context(), and pass "
        "anything else the training function needs in train_loop_config.",
    )


_current: TrainContext | None = None


def _set_context(context: TrainContext | None) -> None:
    global _current
    _current = context


def get_context() -> TrainContext:
    """Return the calling worker's :class:`TrainContext`; ``RuntimeError`` outside ``train_loop_per_worker``."""
    if _current is None:
        raise RuntimeError("get_context() works only inside train_loop_per_worker, while a trainer's fit() runs.")
    return _current
