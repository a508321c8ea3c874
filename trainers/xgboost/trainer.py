"""XGBoostTrainer: distributed xgboost, with your own training function or with parameters only."""

from __future__ import annotations

import logging
from typing import Any, Callable, NoReturn

import numpy as np
import xgboost

import trainers
from storage import Checkpoint
from trainers._internal import gbdt
from trainers._internal.gbdt_trainer import GBDTTrainer
from trainers.config import DataConfig, RunConfig, ScalingConfig
from trainers.xgboost.callback import RayTrainReportCallback, get_model
from trainers.xgboost.config import XGBoostConfig

logger = logging.getLogger(__name__)


def _train_fn_per_worker(form: gbdt.ParamForm) -> None:
    """The parameter form's training function: resume from the latest checkpoint, build the
    DMatrices from this worker's shards, boost the remaining rounds."""
    booster, done = None, 0
    checkpoint = trainers.get_checkpoint()
    if checkpoint is not None:
        booster = get_model(checkpoint)
        done = booster.num_boosted_rounds()
    remaining = form.num_boost_round - done
    if remaining <= 0:
        logger.info("the checkpoint holds %d rounds, num_boost_round=%d: nothing left to train", done, form.num_boost_round)
        return
    rank = trainers.get_context().get_world_rank()
    evals = []
    for name in form.dataset_names:
        x, y = gbdt.load_shard(trainers.get_dataset_shard(name), name, rank, form.features, form.label_column, np.float32)
        matrix = xgboost.DMatrix(x, label=y, feature_names=list(form.features), **form.dmatrix_params.get(name, {}))
        evals.append((matrix, name))
    kwargs = dict(form.train_kwargs)
    callbacks = list(kwargs.pop("callbacks", None) or [])
    if not any(isinstance(c, RayTrainReportCallback) for c in callbacks):
        callbacks.append(RayTrainReportCallback(frequency=1))
    kwargs.setdefault("verbose_eval", False)
    xgboost.train(
        form.params,
        evals[0][0],
        num_boost_round=remaining,
        evals=evals,
        xgb_model=booster,
        callbacks=callbacks,
        **kwargs,
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

    _library_train = staticmethod(xgboost.train)
    _reserved = ("params", "dtrain", "num_boost_round", "evals", "xgb_model")
    _param_form_fn = staticmethod(_train_fn_per_worker)

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None = None,
        *,
        train_loop_config: dict[str, Any] | None = None,
        xgboost_config: XGBoostConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        validation_config: Any = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        label_column: str | None = None,
        params: dict[str, Any] | None = None,
        num_boost_round: int | None = None,
        dmatrix_params: dict[str, dict[str, Any]] | None = None,
        **train_kwargs: Any,
    ) -> None:
        if xgboost_config is not None and not isinstance(xgboost_config, XGBoostConfig):
            raise TypeError(f"xgboost_config={xgboost_config!r}: must be a trainers.xgboost.XGBoostConfig.")
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=xgboost_config or XGBoostConfig(),
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            validation_config=validation_config,
            metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint,
            label_column=label_column,
            params=params,
            num_boost_round=num_boost_round,
            dmatrix_params=dmatrix_params,
            train_kwargs=train_kwargs,
        )

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> NoReturn:
        """Removed, as in Ray Train: raises ``DeprecationWarning`` naming what to call instead.

        Load a checkpoint's model with ``RayTrainReportCallback.get_model(checkpoint)`` (or
        ``trainers.xgboost.get_model(checkpoint)``).
        """
        raise DeprecationWarning(
            "XGBoostTrainer.get_model(checkpoint) is gone (Ray Train V2 removed it): load the model with "
            "trainers.xgboost.RayTrainReportCallback.get_model(checkpoint), or trainers.xgboost.get_model(checkpoint)."
        )
