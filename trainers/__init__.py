"""flowtrain's trainers: the Ray Train API, implemented on Ray Core.

A Ray Train script changes only its imports::

    import trainers as train                      # was: from ray import train
    from trainers.torch import TorchTrainer       # was: from ray.train.torch import TorchTrainer
"""

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
from trainers.train_fn import get_all_reported_checkpoints, get_checkpoint, get_dataset_shard, get_preemption_info, report
from trainers.validation import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
    ValidationConfig,
    ValidationFn,
    ValidationTaskConfig,
)

__all__ = [
    "Backend",
    "BackendConfig",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointUploadMode",
    "ControllerError",
    "DataConfig",
    "DataParallelTrainer",
    "FailureConfig",
    "InsufficientResourcesError",
    "LoggingConfig",
    "NCCLHangError",
    "PreemptionError",
    "PreemptionInfo",
    "RankFailure",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "TRAIN_DATASET_KEY",
    "TrainContext",
    "TrainRunContext",
    "TrainingFailedError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "collective",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
