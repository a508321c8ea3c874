"""LightGBMCheckpoint: a checkpoint holding a ``lightgbm.Booster``, as in ``ray.train.lightgbm``."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import lightgbm

from trainers._internal.framework_checkpoint import FrameworkCheckpoint
from trainers.lightgbm.callback import MODEL_FILE


class LightGBMCheckpoint(FrameworkCheckpoint):
    """A checkpoint with a LightGBM model: ``LightGBMCheckpoint.from_model(booster)``, then
    ``checkpoint.get_model()``.

    It uses the same file as ``RayTrainReportCallback`` (``model.txt``), so the checkpoints of
    ``LightGBMTrainer`` load too: ``LightGBMCheckpoint(result.checkpoint.path,
    result.checkpoint.filesystem).get_model()``.
    """

    #: The file ``from_model`` writes (LightGBM's text format).
    MODEL_FILENAME: ClassVar[str] = MODEL_FILE
    _INSTEAD: ClassVar[str] = "trainers.Checkpoint with RayTrainReportCallback.get_model(checkpoint)"

    @classmethod
    def from_model(
        cls,
        booster: lightgbm.Booster,
        *,
        preprocessor: Any | None = None,
        path: str | os.PathLike | None = None,
    ) -> "LightGBMCheckpoint":
        """A checkpoint of ``booster`` saved into ``path`` (an existing, preferably empty folder;
        a new temporary one by default), with ``preprocessor`` if given.

        For a scikit-learn style model pass ``model.booster_``.
        """
        if not isinstance(booster, lightgbm.Booster):
            raise TypeError(
                f"LightGBMCheckpoint.from_model(booster={type(booster).__name__}): pass a lightgbm.Booster "
                "(for an LGBMClassifier/LGBMRegressor, model.booster_)."
            )
        return cls._from_saved(booster.save_model, preprocessor=preprocessor, path=path, method="from_model")

    def get_model(self) -> lightgbm.Booster:
        """The ``lightgbm.Booster`` stored in this checkpoint."""
        with self._model_file() as path:
            return lightgbm.Booster(model_file=path)
