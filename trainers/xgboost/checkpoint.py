"""XGBoostCheckpoint: a checkpoint holding an ``xgboost.Booster``, as in ``ray.train.xgboost``."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import xgboost

from trainers._internal.framework_checkpoint import FrameworkCheckpoint
from trainers.xgboost.callback import MODEL_FILE


class XGBoostCheckpoint(FrameworkCheckpoint):
    """A checkpoint with an xgboost model: ``XGBoostCheckpoint.from_model(booster)``, then
    ``checkpoint.get_model()``.

    ``get_model`` also loads the checkpoints ``RayTrainReportCallback`` (and so
    ``XGBoostTrainer``) writes: ``XGBoostCheckpoint(result.checkpoint.path,
    result.checkpoint.filesystem).get_model()``.
    """

    #: The file ``from_model`` writes (xgboost's JSON format).
    MODEL_FILENAME: ClassVar[str] = "model.json"
    _OTHER_MODEL_FILENAMES: ClassVar[tuple[str, ...]] = (MODEL_FILE,)
    _INSTEAD: ClassVar[str] = "trainers.Checkpoint with RayTrainReportCallback.get_model(checkpoint)"

    @classmethod
    def from_model(
        cls,
        booster: xgboost.Booster,
        *,
        preprocessor: Any | None = None,
        path: str | os.PathLike | None = None,
    ) -> "XGBoostCheckpoint":
        """A checkpoint of ``booster`` saved into ``path`` (an existing, preferably empty folder;
        a new temporary one by default), with ``preprocessor`` if given.

        For a scikit-learn style model pass ``model.get_booster()``.
        """
        if not isinstance(booster, xgboost.Booster):
            raise TypeError(
                f"XGBoostCheckpoint.from_model(booster={type(booster).__name__}): pass an xgboost.Booster "
                "(for an XGBClassifier/XGBRegressor, model.get_booster())."
            )
        return cls._from_saved(booster.save_model, preprocessor=preprocessor, path=path, method="from_model")

    def get_model(self) -> xgboost.Booster:
        """The ``xgboost.Booster`` stored in this checkpoint."""
        with self._model_file() as path:
            booster = xgboost.Booster()
            booster.load_model(path)
            return booster
