"""flowtrain's trainers: the Ray Train API, implemented on Ray Core.

A Ray Train script changes only its imports::

    import trainers as train                      # was: from ray import train
    from trainers.torch import TorchTrainer       # was: from ray.train.torch import TorchTrainer
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.lazy_names import lazy_names

# Every public name is imported on first use (``storage.lazy_names`` reads where each lives from the
# ``TYPE_CHECKING`` block below): every worker process imports this package, and loading the whole
# driver side there cost each worker ~0.05-0.1 s of CPU, start-up time multiplied by the worker count.
__all__, __getattr__, __dir__ = lazy_names(globals())


if TYPE_CHECKING:  # the public names: what IDEs and type checkers see, and what lazy_names loads on first use
    from storage import Checkpoint, CheckpointConfig
    from trainers import collective
    from trainers.backend import Backend, BackendConfig
    from trainers.callback import TrainRunContext, UserCallback
    from trainers.config import TRAIN_DATASET_KEY, DataConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from trainers.context import TrainContext, get_context
    from trainers.data_parallel_trainer import DataParallelTrainer
    from trainers.errors import (
        ControllerError,
        InsufficientResourcesError,
        NCCLHangError,
        PreemptionError,
        RankFailure,
        TrainingFailedError,
        WorkerGroupError,
    )
    from trainers.preemption import PreemptionInfo
    from trainers.report_config import CheckpointUploadMode
    from trainers.result import Result
    from trainers.train_fn import (
        get_all_reported_checkpoints,
        get_checkpoint,
        get_dataset_shard,
        get_preemption_info,
        report,
    )
    from trainers.validation import (
        CheckpointConsistencyMode,
        ReportedCheckpoint,
        ReportedCheckpointStatus,
        ValidationConfig,
        ValidationFn,
        ValidationTaskConfig,
    )
