"""XGBoostCheckpoint: a checkpoint holding an ``xgboost.Booster``, as in ``ray.train.xgboost``."""

from __future__ import annotations

from typing import ClassVar

import xgboost

from trainers.gbdt.checkpoint import GBDTCheckpoint
from trainers.xgboost.callback import MODEL_FILE, load_model


class XGBoostCheckpoint(GBDTCheckpoint):
    """A checkpoint with an xgboost model: ``XGBoostCheckpoint.from_model(booster)``, then
    ``checkpoint.get_model()``.

    ``get_model`` also loads the checkpoints ``RayTrainReportCallback`` (and so
    ``XGBoostTrainer``) writes: ``XGBoostCheckpoint(result.checkpoint.path,
    result.checkpoint.filesystem).get_model()``.
    """

    #: The file ``from_model`` writes (xgboost's JSON format).
    MODEL_FILENAME: ClassVar[str] = "model.json"
    _OTHER_MODEL_FILENAMES: ClassVar[tuple[str, ...]] = (MODEL_FILE,)
    _BOOSTER = xgboost.Booster
    _PASS_A_BOOSTER = "an xgboost.Booster (for an XGBClassifier/XGBRegressor, model.get_booster())"
    _load_model = staticmethod(load_model)
