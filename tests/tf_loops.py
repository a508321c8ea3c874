"""TensorFlow training functions the tests' workers import (TensorFlow is imported inside them,
so the test process itself never pays for it)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import numpy as np

import trainers

#: The line every worker's rows follow: y = x @ TRUE_W + TRUE_B (plus a little noise).
TRUE_W = np.array([1.5, -2.0, 0.5, 3.0], dtype=np.float32)
TRUE_B = 0.25


def rows(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, TRUE_W.size)).astype(np.float32)
    y = (x @ TRUE_W + TRUE_B + rng.normal(scale=0.01, size=count)).astype(np.float32)
    return x, y[:, None]


def keras_mwms_loop(config: dict[str, Any]) -> dict[str, Any]:
    """A Keras 2 linear model under MultiWorkerMirroredStrategy, reporting and checkpointing every
    epoch with ``ReportCheckpointCallback``, resuming from the latest checkpoint.

    ``kill_epoch``/``kill_rank``: that rank SIGKILLs its own process in the middle of that epoch,
    once (``marker`` remembers the kill across the restart).
    """
    import tensorflow as tf

    from trainers.tensorflow import prepare_dataset_shard
    from trainers.tensorflow.keras import ReportCheckpointCallback

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = trainers.get_context().get_world_rank()
    x, y = rows(seed=rank, count=256)
    data = prepare_dataset_shard(tf.data.Dataset.from_tensor_slices((x, y)).batch(32))

    checkpoint = trainers.get_checkpoint()
    with strategy.scope():
        if checkpoint:
            model = ReportCheckpointCallback.get_model(checkpoint)
        else:
            tf.keras.utils.set_random_seed(0)
            model = tf.keras.Sequential([tf.keras.Input((TRUE_W.size,)), tf.keras.layers.Dense(1)])
            model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.1), loss="mse", metrics=["mae"])
    start = checkpoint.get_metadata()["epoch"] + 1 if checkpoint else 0

    class KillOnce(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            marker = config.get("marker")
            if (
                self.epoch == config.get("kill_epoch")
                and batch == 3
                and rank == config.get("kill_rank")
                and marker
                and not os.path.exists(marker)
            ):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

    model.fit(
        data,
        initial_epoch=start,
        epochs=config["epochs"],
        verbose=0,
        callbacks=[ReportCheckpointCallback(), KillOnce()],
    )
    return {"start_epoch": start, "keras": type(model).__module__.split(".")[0]}


def tf_dataset_sum_loop(config: dict[str, Any]) -> None:
    """Sum this worker's Ray Data shard through ``to_tf`` and ``prepare_dataset_shard``; report
    the sums, the row count and what ``TF_CONFIG`` says about this worker."""
    import tensorflow as tf

    from trainers.tensorflow import prepare_dataset_shard

    shard = trainers.get_dataset_shard("train")
    data = prepare_dataset_shard(shard.to_tf(feature_columns="x", label_columns="y", batch_size=16))
    total_x = total_y = 0.0
    count = 0
    for features, labels in data:
        total_x += float(tf.reduce_sum(features))
        total_y += float(tf.reduce_sum(labels))
        count += int(tf.shape(labels)[0])
    tf_config = json.loads(os.environ["TF_CONFIG"])
    trainers.report(
        {
            "rank": trainers.get_context().get_world_rank(),
            "sum_x": total_x,
            "sum_y": total_y,
            "rows": count,
            "task_index": tf_config["task"]["index"],
            "cluster": tf_config["cluster"]["worker"],
            "auto_shard": tf.data.experimental.AutoShardPolicy(
                data.options().experimental_distribute.auto_shard_policy
            ).name,
            "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
        }
    )
