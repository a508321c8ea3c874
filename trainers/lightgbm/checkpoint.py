"""LightGBMCheckpoint: a checkpoint holding a ``lightgbm.Booster``, as in ``ray.train.lightgbm``."""

from __future__ import annotations

from typing import ClassVar

import lightgbm

from trainers.gbdt.checkpoint import GBDTCheckpoint
from trainers.lightgbm.callback import MODEL_FILE, load_model


class LightGBMCheckpoint(GBDTCheckpoint):
    """A checkpoint with a LightGBM model: ``LightGBMCheckpoint.from_model(booster)``, then
    ``checkpoint.get_model()``.

    It uses the same file as ``RayTrainReportCallback`` (``model.txt``), so the checkpoints of
    ``LightGBMTrainer`` load too: ``LightGBMCheckpoint(result.checkpoint.path,
    result.checkpoint.filesystem).get_model()``.
    """

    #: The file ``from_model`` writes (LightGBM's text format).
    MODEL_FILENAME: ClassVar[str] = MODEL_FILE
    _BOOSTER = lightgbm.Booster
    _PASS_A_BOOSTER = "a lightgbm.Booster (for an LGBMClassifier/LGBMRegressor, model.booster_)"
    _load_model = staticmethod(load_model)
