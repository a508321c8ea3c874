"""XGBoostTrainer: distributed xgboost, with your own training function or with parameters only."""

from __future__ import annotations

from operator import methodcaller
from typing import Any

import numpy as np
import xgboost

from trainers.gbdt.param_form import Library, Shards
from trainers.gbdt.trainer import GBDTTrainer
from trainers.xgboost.callback import RayTrainReportCallback
from trainers.xgboost.config import XGBoostConfig


def _boost(form: Any, shards: Shards, booster: Any, num_boost_round: int, callbacks: list, train_kwargs: dict) -> None:
    """The parameter form's boosting: a DMatrix of each shard, then ``xgboost.train``."""
    feature_names = list(form.features)
    evals = [
        (xgboost.DMatrix(x, label=y, feature_names=feature_names, **form.dmatrix_params.get(name, {})), name)
        for name, x, y in shards
    ]
    train_kwargs.setdefault("verbose_eval", False)  # the reports show every round
    xgboost.train(
        form.params,
        evals[0][0],
        num_boost_round=num_boost_round,
        evals=evals,
        xgb_model=booster,
        callbacks=callbacks,
        **train_kwargs,
    )


class XGBoostTrainer(GBDTTrainer):
    """Data-parallel xgboost on N workers, each training on its shard of the data, as in Ray Train.

    With a training function, the trainer starts xgboost's collective before the function runs, so
    ``xgboost.train(..., callbacks=[RayTrainReportCallback()])`` there combines every worker's shard;
    to resume, load ``RayTrainReportCallback.get_model(trainers.get_checkpoint())`` and pass
    ``xgb_model=booster``. With parameters only (``datasets=``, ``label_column=``, ``params=``,
    ``num_boost_round=``: the form Ray Train removed), every round is reported and checkpointed and
    a restart boosts the remaining rounds; only "train" is split across workers,
    ``dmatrix_params={"train": {...}}`` goes to a dataset's ``xgboost.DMatrix`` and other keyword
    arguments to ``xgboost.train``. Examples: docs/frameworks.md, "XGBoost and LightGBM". Ray Train's other arguments (``xgboost_config=``,
    ``scaling_config=``, ...) are taken as ``DataParallelTrainer`` takes them.
    """

    #: This library as GBDTTrainer uses it (LightGBMTrainer fills in the same fields for LightGBM).
    _library = Library(
        name="xgboost",
        train=xgboost.train,
        feature_dtype=np.float32,
        report_callback=RayTrainReportCallback,
        num_rounds=methodcaller("num_boosted_rounds"),
        boost=_boost,
        reserved=("params", "dtrain", "num_boost_round", "evals", "xgb_model"),
    )

    _backend_config_arg = ("xgboost_config", XGBoostConfig)
