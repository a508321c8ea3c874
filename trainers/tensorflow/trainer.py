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

    Every worker starts with ``TF_CONFIG`` naming all workers, so::

        def train_func(config):
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            with strategy.scope():
                model = build_and_compile_model()
            data = prepare_dataset_shard(trainers.get_dataset_shard("train").to_tf("x", "y", batch_size=32))
            model.fit(data, epochs=config["epochs"], callbacks=[ReportCheckpointCallback()])

        TensorflowTrainer(train_func, train_loop_config={"epochs": 5}, datasets={"train": ds},
                          scaling_config=ScalingConfig(num_workers=2)).fit()

    trains one model on every worker's shard together, reporting and checkpointing each epoch
    (``trainers.tensorflow.keras.ReportCheckpointCallback``). Same arguments as
    ``ray.train.tensorflow.TensorflowTrainer``. Set TensorFlow's thread counts in the function
    (``tf.config.threading``) if several workers share a node's cores.
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
