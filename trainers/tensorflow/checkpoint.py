"""TensorflowCheckpoint: a checkpoint holding a Keras model, as in ``ray.train.tensorflow``."""

from __future__ import annotations

import importlib
import os
import shutil
from typing import Any, ClassVar

from storage import Checkpoint
from trainers._internal.session.framework_checkpoint import FrameworkCheckpoint

#: Metadata key naming which Keras wrote the model: "tf_keras" (Keras 2) or "keras" (Keras 3).
KERAS_KEY = "keras_package"


def keras_package(model: Any) -> str:
    """The package a Keras model comes from: "tf_keras" (Keras 2) or "keras" (Keras 3)."""
    return "tf_keras" if type(model).__module__.startswith("tf_keras") else "keras"


def load_keras_model(path: str, package: str | None) -> Any:
    """Load the model saved at ``path`` with the Keras that saved it (``tf.keras`` when unknown).

    A file written by Keras 2 loads only with Keras 2 and the other way round, and which Keras
    ``tf.keras`` is depends on ``TF_USE_LEGACY_KERAS`` in this process: going by the recorded
    package makes the driver load what the workers saved.
    """
    if package in ("tf_keras", "keras"):
        return importlib.import_module(package).models.load_model(path)
    import tensorflow as tf

    return tf.keras.models.load_model(path)


def model_from_checkpoint(checkpoint: Checkpoint) -> Any:
    """The Keras model in ``checkpoint`` (written by ``TensorflowCheckpoint.from_model`` or
    ``ReportCheckpointCallback``), loaded with the Keras that saved it."""
    metadata = checkpoint.get_metadata()
    name = metadata.get(TensorflowCheckpoint.MODEL_FILENAME_KEY, TensorflowCheckpoint.MODEL_FILENAME)
    with checkpoint.as_directory() as folder:
        path = os.path.normpath(os.path.join(folder, name))
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"the checkpoint {checkpoint.path} has no Keras model {name!r}; it holds {sorted(os.listdir(folder))}. "
                "Write it with trainers.tensorflow.keras.ReportCheckpointCallback or TensorflowCheckpoint.from_model."
            )
        return load_keras_model(path, metadata.get(KERAS_KEY))


class TensorflowCheckpoint(FrameworkCheckpoint):
    """A checkpoint holding a Keras model (``model.keras`` by default), as Ray Train's.

    ``TensorflowCheckpoint.from_model(model)`` saves the whole model (architecture, weights,
    optimizer state) and ``checkpoint.get_model()`` loads it back, Keras 2 or Keras 3 alike.
    ``ReportCheckpointCallback`` writes this layout, so its checkpoints load the same way.
    """

    MODEL_FILENAME: ClassVar[str] = "model.keras"
    #: Metadata key of the model's file (or folder) name inside the checkpoint, as in Ray Train.
    MODEL_FILENAME_KEY: ClassVar[str] = "_model_filename"
    _INSTEAD: ClassVar[str] = "trainers.Checkpoint with model.save() and keras.models.load_model()"

    @classmethod
    def from_model(cls, model: Any, *, preprocessor: Any | None = None) -> TensorflowCheckpoint:
        """A checkpoint in a new temporary folder holding ``model`` saved as ``model.keras``."""
        if not hasattr(model, "save") or not hasattr(model, "get_config"):
            raise TypeError(f"TensorflowCheckpoint.from_model(model={type(model).__name__}): pass a Keras model.")
        checkpoint = cls._from_saved(model.save, preprocessor=preprocessor, path=None, method="from_model")
        checkpoint.update_metadata({cls.MODEL_FILENAME_KEY: cls.MODEL_FILENAME, KERAS_KEY: keras_package(model)})
        return checkpoint

    @classmethod
    def from_h5(cls, file_path: str, *, preprocessor: Any | None = None) -> TensorflowCheckpoint:
        """A checkpoint in a new temporary folder holding a copy of the ``.h5`` file at ``file_path``."""
        if not os.path.isfile(file_path) or not file_path.endswith(".h5"):
            raise ValueError(f"TensorflowCheckpoint.from_h5(file_path={file_path!r}): must be an existing .h5 file.")
        name = os.path.basename(file_path)
        return cls._copied(lambda folder: shutil.copy(file_path, os.path.join(folder, name)), name, preprocessor)

    @classmethod
    def from_saved_model(cls, dir_path: str, *, preprocessor: Any | None = None) -> TensorflowCheckpoint:
        """A checkpoint in a new temporary folder holding a copy of the SavedModel folder ``dir_path``."""
        if not os.path.isdir(dir_path):
            raise ValueError(
                f"TensorflowCheckpoint.from_saved_model(dir_path={dir_path!r}): must be an existing SavedModel folder."
            )
        return cls._copied(lambda folder: shutil.copytree(dir_path, folder, dirs_exist_ok=True), ".", preprocessor)

    @classmethod
    def _copied(cls, copy: Any, name: str, preprocessor: Any | None) -> TensorflowCheckpoint:
        """A checkpoint of a new temporary folder after ``copy(folder)``, naming ``name`` its model."""
        checkpoint = cls._from_saved(
            lambda model_path: copy(os.path.dirname(model_path)), preprocessor=preprocessor, path=None, method="_copied"
        )
        checkpoint.update_metadata({cls.MODEL_FILENAME_KEY: name})
        return checkpoint

    def get_model(self) -> Any:
        """The Keras model stored in this checkpoint, loaded with the Keras that saved it.

        Raises:
            FileNotFoundError: the checkpoint holds no model file.
        """
        return model_from_checkpoint(self)
