"""TensorFlow and Keras on flowtrain: ``TensorflowTrainer``, ``TensorflowConfig``,
``TensorflowCheckpoint`` and ``prepare_dataset_shard``; Keras callbacks in ``trainers.tensorflow.keras``.

Same names as ``ray.train.tensorflow``. Needs the ``tensorflow`` extra
(``pip install 'flowtrain[tensorflow]'``: TensorFlow 2.21 and ``tf-keras``). Importing this
package does not import TensorFlow: the driver only builds the trainer, the workers train.
"""

import importlib.util as _util

from trainers._extras import MissingExtraError as _MissingExtraError

if _util.find_spec("tensorflow") is None:
    raise _MissingExtraError("tensorflow", "tensorflow")

from trainers.tensorflow.checkpoint import TensorflowCheckpoint
from trainers.tensorflow.config import TensorflowBackend, TensorflowConfig
from trainers.tensorflow.train_loop_utils import prepare_dataset_shard
from trainers.tensorflow.trainer import TensorflowTrainer

__all__ = [
    "TensorflowBackend",
    "TensorflowCheckpoint",
    "TensorflowConfig",
    "TensorflowTrainer",
    "prepare_dataset_shard",
]
