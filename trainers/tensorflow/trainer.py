"""TensorflowTrainer: data-parallel TensorFlow/Keras training with ``TF_CONFIG`` set on every worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from storage import Checkpoint
from trainers.config import DataConfig, RunConfig, ScalingConfig
from trainers.data_parallel_trainer import DataParallelTrainer
from trainers.tensorflow.config import TensorflowConfig


class TensorflowTrainer(DataParallelTrainer):
    """Runs a TensorFlow training function on N workers, ready for ``MultiWorkerMirroredStrategy``.

    Every worker starts with ``TF_CONFIG`` naming all workers, so the strategy trains one model on
    every worker's shard together; ``trainers.tensorflow.keras.ReportCheckpointCallback`` reports
    and checkpoints each epoch. Same arguments as ``ray.train.tensorflow.TensorflowTrainer``. Set
    TensorFlow's thread counts in the function (``tf.config.threading``) if several workers share a
    node's cores. Example: docs/frameworks.md, "TensorFlow and Keras".
    """

    _backend_config_arg = ("tensorflow_config", TensorflowConfig)

    # Ray Train's signature, which must stay exact (tests/test_api_surface.py checks it).
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        tensorflow_config: TensorflowConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        dataset_config: DataConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        validation_config: Any = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
    ) -> None:
        self._init_above(TensorflowTrainer, locals())
