"""Helpers for the training function of a ``TensorflowTrainer``."""

from __future__ import annotations

from typing import Any


def prepare_dataset_shard(tf_dataset_shard: Any) -> Any:
    """Ready a ``tf.data.Dataset`` made from this worker's Ray Data shard for a distributed ``fit()``.

    ``trainers.get_dataset_shard("train").to_tf(...)`` already holds only this worker's rows.
    Under ``MultiWorkerMirroredStrategy`` TensorFlow would shard it again across workers and
    each would train on a fraction of its own fraction; this turns that auto-sharding off and
    adds prefetching. Same as ``ray.train.tensorflow.prepare_dataset_shard``.
    """
    import tensorflow as tf

    if not isinstance(tf_dataset_shard, tf.data.Dataset):
        raise TypeError(
            f"prepare_dataset_shard(tf_dataset_shard={type(tf_dataset_shard).__name__}): pass a tf.data.Dataset, "
            "e.g. trainers.get_dataset_shard('train').to_tf(feature_columns=..., label_columns=..., batch_size=...)."
        )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf_dataset_shard.with_options(options).prefetch(tf.data.AUTOTUNE)
