"""TensorflowTrainer: data-parallel TensorFlow/Keras training with ``TF_CONFIG`` set on every worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from trainers.data_parallel_trainer import DataParallelTrainer, TrainerOptions
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

    # Ray Train's keywords: its own config here, the rest in TrainerOptions (tests/test_api_surface.py).
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        tensorflow_config: TensorflowConfig | None = None,
        **options: Unpack[TrainerOptions],
    ) -> None:
        super().__init__(train_loop_per_worker, backend_config=tensorflow_config, **options)
