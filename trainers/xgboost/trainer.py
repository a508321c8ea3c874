"""XGBoostTrainer: distributed xgboost, with your own training function or with parameters only."""

from __future__ import annotations

from collections.abc import Callable
from operator import methodcaller
from typing import Any

import numpy as np
import xgboost

from storage import Checkpoint
from trainers.config import DataConfig, RunConfig, ScalingConfig
from trainers.gbdt.library import Library, Shards
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
    """Data-parallel xgboost on N workers, each training on its shard of the data.

    Two ways to call it, as in Ray Train:

    With a training function (Ray Train's current form). The trainer starts xgboost's collective
    before your function runs, so ``xgboost.train`` combines every worker's shard::

        def train_fn(config):
            shard = trainers.get_dataset_shard("train").materialize().to_pandas()
            dtrain = xgboost.DMatrix(shard.drop(columns="y"), label=shard["y"])
            xgboost.train(config, dtrain, num_boost_round=50, callbacks=[RayTrainReportCallback(frequency=10)])

        XGBoostTrainer(train_fn, train_loop_config=params, datasets={"train": ds},
                       scaling_config=ScalingConfig(num_workers=2)).fit()

    To resume after a restart, start from ``trainers.get_checkpoint()``: load it with
    ``RayTrainReportCallback.get_model(checkpoint)`` and pass ``xgb_model=booster`` and
    ``num_boost_round=total - booster.num_boosted_rounds()``.

    With parameters only (the form Ray Train removed): no function to write::

        XGBoostTrainer(datasets={"train": train_ds, "valid": valid_ds}, label_column="y",
                       params={"objective": "binary:logistic", "eval_metric": "logloss"},
                       num_boost_round=100, scaling_config=ScalingConfig(num_workers=2)).fit()

    Every round is reported (``train-logloss``, ``valid-logloss``, ...) and checkpointed, and a
    restart or a second ``fit()`` of the same run continues boosting from the latest checkpoint
    up to ``num_boost_round`` rounds. Only "train" is split across workers; the other datasets
    are evaluated whole on every worker. ``dmatrix_params={"train": {...}}`` passes keyword
    arguments to a dataset's ``xgboost.DMatrix``, and other keyword arguments go to
    ``xgboost.train`` (e.g. ``callbacks=[RayTrainReportCallback(frequency=10)]`` to checkpoint
    less often, ``early_stopping_rounds=``).
    """

    #: This library as GBDTTrainer uses it (LightGBMTrainer fills in the same fields for LightGBM).
    _library = Library(
        name="xgboost",
        config_cls=XGBoostConfig,
        train=xgboost.train,
        feature_dtype=np.float32,
        report_callback=RayTrainReportCallback,
        num_rounds=methodcaller("num_boosted_rounds"),
        boost=_boost,
        reserved=("params", "dtrain", "num_boost_round", "evals", "xgb_model"),
    )

    _backend_config_arg = ("xgboost_config", XGBoostConfig)

    # Ray Train's signature, which LightGBMTrainer shares but for lightgbm_config=.
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None = None,
        *,
        # DataParallelTrainer's arguments, as every framework's trainer takes them, and the config:
        train_loop_config: dict[str, Any] | None = None,
        xgboost_config: XGBoostConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        validation_config: Any = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        # The parameter form's arguments:
        label_column: str | None = None,
        params: dict[str, Any] | None = None,
        num_boost_round: int | None = None,
        dmatrix_params: dict[str, dict[str, Any]] | None = None,
        **train_kwargs: Any,
    ) -> None:
        self._init_above(XGBoostTrainer, locals())
