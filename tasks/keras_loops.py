"""A Keras training loop the pipeline runs by import path (``tasks.keras_loops:tabular_keras_loop``).

It runs on the training workers of a ``TensorflowTrainer``, so this module imports no Prefect:
only TensorFlow (inside the function), ``trainers`` and ``tasks.loops``.
"""

from __future__ import annotations

import os
from typing import Any

import trainers
from tasks.loops import optional_shard


def tabular_keras_loop(config: dict[str, Any]) -> None:
    """Train a Keras MLP classifier on the ``train`` dataset's numeric columns under
    ``MultiWorkerMirroredStrategy``, one report and checkpoint per epoch.

    ``config``: ``label_column`` (required; integer classes 0..num_classes-1), ``feature_columns``
    (default: every other column), ``num_classes`` (2), ``epochs`` (5), ``lr`` (0.01),
    ``batch_size`` (64 per worker), ``hidden`` (32). Reports Keras' logs (``loss``, ``accuracy``,
    and ``val_loss``/``val_accuracy`` with a ``valid`` dataset) and ``epoch``. A restart or a rerun
    of the same run resumes at the epoch after its latest checkpoint.
    """
    if "TF_CONFIG" not in os.environ and trainers.get_context().get_world_size() > 1:
        raise RuntimeError(
            "tabular_keras_loop needs TF_CONFIG on its workers: run it with trainers.tensorflow.TensorflowTrainer "
            "(in the pipeline, the TensorFlow trainer), not TorchTrainer."
        )
    import tensorflow as tf

    from trainers.tensorflow import prepare_dataset_shard
    from trainers.tensorflow.keras import ReportCheckpointCallback

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    label = config["label_column"]
    train_shard = trainers.get_dataset_shard("train")
    features = list(config.get("feature_columns") or [c for c in train_shard.schema().names if c != label])
    batch_size = int(config.get("batch_size", 64))

    def as_tf(shard: Any) -> Any:
        data = shard.to_tf(feature_columns=features, label_columns=label, batch_size=batch_size)
        # to_tf gives one tensor per column; the model takes them side by side as one matrix.
        stacked = data.map(lambda x, y: (tf.stack([tf.cast(x[c], tf.float32) for c in features], axis=1), y))
        return prepare_dataset_shard(stacked)

    checkpoint = trainers.get_checkpoint()
    with strategy.scope():
        if checkpoint:
            model = ReportCheckpointCallback.get_model(checkpoint)
        else:
            tf.keras.utils.set_random_seed(int(config.get("seed", 0)))
            model = tf.keras.Sequential(
                [
                    tf.keras.Input((len(features),)),
                    # Tabular columns come in wildly different scales.
                    tf.keras.layers.BatchNormalization(momentum=0.9, center=False, scale=False),
                    tf.keras.layers.Dense(int(config.get("hidden", 32)), activation="relu"),
                    tf.keras.layers.Dense(int(config.get("num_classes", 2))),
                ]
            )
            model.compile(
                optimizer=tf.keras.optimizers.Adam(learning_rate=float(config.get("lr", 0.01))),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
    start = checkpoint.get_metadata()["epoch"] + 1 if checkpoint else 0
    valid = optional_shard("valid")
    model.fit(
        as_tf(train_shard),
        validation_data=as_tf(valid) if valid is not None else None,
        initial_epoch=start,
        epochs=int(config.get("epochs", 5)),
        verbose=0,
        callbacks=[ReportCheckpointCallback()],
    )
