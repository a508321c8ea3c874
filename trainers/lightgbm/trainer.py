"""LightGBMTrainer: distributed LightGBM, with your own training function or with parameters only."""

from __future__ import annotations

from operator import methodcaller
from typing import Any

import lightgbm
import numpy as np

from trainers.gbdt.param_form import TRAIN, Library, Shards
from trainers.gbdt.trainer import GBDTTrainer
from trainers.lightgbm.bins import shared_bins
from trainers.lightgbm.callback import RayTrainReportCallback
from trainers.lightgbm.config import LightGBMConfig, get_network_params


def _boost(form: Any, shards: Shards, booster: Any, num_boost_round: int, callbacks: list, train_kwargs: dict) -> None:
    """The parameter form's boosting: the training set binned from all workers' rows, the validation
    sets with its bins, then ``lightgbm.train`` over LightGBM's own network."""
    params = {"tree_learner": "data_parallel", "pre_partition": True, **form.params}
    features, frames = list(form.features), {name: (x, y) for name, x, y in shards}

    def dataset(name: str, reference: Any) -> lightgbm.Dataset:
        x, y = frames[name]
        return lightgbm.Dataset(
            x, label=y, reference=reference, feature_name=features, **form.dmatrix_params.get(name, {})
        )

    train_set = dataset(TRAIN, shared_bins(frames[TRAIN][0], params, feature_name=features))
    valid_sets = [train_set] + [dataset(name, train_set) for name in frames if name != TRAIN]
    params.update(get_network_params())  # last: this frees the port LightGBM binds next
    lightgbm.train(
        params,
        train_set,
        num_boost_round=num_boost_round,
        valid_sets=valid_sets,
        valid_names=list(frames),
        init_model=booster,
        callbacks=callbacks,
        **train_kwargs,
    )


class LightGBMTrainer(GBDTTrainer):
    """Data-parallel LightGBM on N workers, each training on its shard of the data, as in Ray Train.

    With a training function, merge ``get_network_params()`` into the parameters of
    ``lightgbm.train`` and set ``tree_learner="data_parallel"``; ``shared_bins(x, params)`` (ours)
    bins features from all workers' rows, as one process would. To resume, load
    ``RayTrainReportCallback.get_model(trainers.get_checkpoint())`` and pass ``init_model=booster``.
    With parameters only (``datasets=``, ``label_column=``, ``params=``, ``num_boost_round=``: the
    form Ray Train removed) it trains with ``tree_learner="data_parallel"`` and
    ``pre_partition=True`` unless ``params`` say otherwise and shared bins; every round is reported
    and checkpointed and a restart boosts the remaining rounds; only "train" is split across
    workers (LightGBM's ``training`` metrics cover rank 0's shard only), ``dmatrix_params`` goes to
    a dataset's ``lightgbm.Dataset`` and other keyword arguments to ``lightgbm.train``. Examples:
    docs/frameworks.md, "XGBoost and LightGBM". Ray Train's other arguments (``lightgbm_config=``,
    ``scaling_config=``, ...) are taken as ``DataParallelTrainer`` takes them.
    """

    #: This library as GBDTTrainer uses it (XGBoostTrainer fills in the same fields for xgboost).
    _library = Library(
        name="lightgbm",
        train=lightgbm.train,
        feature_dtype=np.float64,
        report_callback=RayTrainReportCallback,
        num_rounds=methodcaller("current_iteration"),
        boost=_boost,
        reserved=("params", "train_set", "num_boost_round", "valid_sets", "valid_names", "init_model"),
    )

    _backend_config_arg = ("lightgbm_config", LightGBMConfig)
