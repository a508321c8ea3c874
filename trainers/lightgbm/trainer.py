"""LightGBMTrainer: distributed LightGBM, with your own training function or with parameters only."""

from __future__ import annotations

import logging
from typing import Any, Callable, NoReturn

import lightgbm
import numpy as np

import trainers
from storage import Checkpoint
from trainers._internal import gbdt
from trainers._internal.gbdt_trainer import GBDTTrainer
from trainers.config import DataConfig, RunConfig, ScalingConfig
from trainers.lightgbm.bins import shared_bins
from trainers.lightgbm.callback import RayTrainReportCallback, get_model
from trainers.lightgbm.config import LightGBMConfig, get_network_params

logger = logging.getLogger(__name__)


def _train_fn_per_worker(form: gbdt.ParamForm) -> None:
    """The parameter form's training function: resume from the latest checkpoint, build the
    Datasets from this worker's shards with bins shared by all workers, boost the remaining rounds."""
    booster, done = None, 0
    checkpoint = trainers.get_checkpoint()
    if checkpoint is not None:
        booster = get_model(checkpoint)
        done = booster.current_iteration()
    remaining = form.num_boost_round - done
    if remaining <= 0:
        logger.info("the checkpoint holds %d rounds, num_boost_round=%d: nothing left to train", done, form.num_boost_round)
        return
    rank = trainers.get_context().get_world_rank()
    params = {"tree_learner": "data_parallel", "pre_partition": True, **form.params}
    features = list(form.features)
    frames = {
        name: gbdt.load_shard(trainers.get_dataset_shard(name), name, rank, form.features, form.label_column, np.float64)
        for name in form.dataset_names
    }
    x, y = frames[gbdt.TRAIN]
    train_set = lightgbm.Dataset(
        x,
        label=y,
        reference=shared_bins(x, params, feature_name=features),
        feature_name=features,
        **form.dmatrix_params.get(gbdt.TRAIN, {}),
    )
    valid_sets = [train_set] + [
        lightgbm.Dataset(vx, label=vy, reference=train_set, feature_name=features, **form.dmatrix_params.get(name, {}))
        for name, (vx, vy) in frames.items()
        if name != gbdt.TRAIN
    ]
    kwargs = dict(form.train_kwargs)
    callbacks = list(kwargs.pop("callbacks", None) or [])
    if not any(isinstance(c, RayTrainReportCallback) for c in callbacks):
        callbacks.append(RayTrainReportCallback(frequency=1))
    params.update(get_network_params())  # last: this frees the port LightGBM binds next
    lightgbm.train(
        params,
        train_set,
        num_boost_round=remaining,
        valid_sets=valid_sets,
        valid_names=list(frames),
        init_model=booster,
        callbacks=callbacks,
        **kwargs,
    )


class LightGBMTrainer(GBDTTrainer):
    """Data-parallel LightGBM on N workers, each training on its shard of the data.

    Two ways to call it, as in Ray Train:

    With a training function (Ray Train's current form). Merge ``get_network_params()`` into the
    parameters of ``lightgbm.train`` and set ``tree_learner="data_parallel"``::

        def train_fn(config):
            shard = trainers.get_dataset_shard("train").materialize().to_pandas()
            x, y = shard.drop(columns="y"), shard["y"]
            params = {**config, "tree_learner": "data_parallel", **trainers.lightgbm.get_network_params()}
            train_set = lightgbm.Dataset(x, y, reference=trainers.lightgbm.shared_bins(x, params))
            lightgbm.train(params, train_set, num_boost_round=50, callbacks=[RayTrainReportCallback(frequency=10)])

    ``shared_bins`` (optional) makes every worker bin features from all workers' rows, as a
    single process would; without it LightGBM bins each feature from one worker's rows. To
    resume after a restart, start from ``trainers.get_checkpoint()``: load it with
    ``RayTrainReportCallback.get_model(checkpoint)`` and pass ``init_model=booster`` and
    ``num_boost_round=total - booster.current_iteration()``.

    With parameters only (the form Ray Train removed): no function to write::

        LightGBMTrainer(datasets={"train": train_ds, "valid": valid_ds}, label_column="y",
                        params={"objective": "binary", "metric": "binary_logloss"},
                        num_boost_round=100, scaling_config=ScalingConfig(num_workers=2)).fit()

    It trains with ``tree_learner="data_parallel"`` and ``pre_partition=True`` unless ``params``
    say otherwise, bins features from all workers' rows, reports (``valid-binary_logloss``, ...)
    and checkpoints every round, and a restart or a second ``fit()`` of the same run continues
    boosting from the latest checkpoint up to ``num_boost_round`` rounds. Only "train" is split
    across workers; the other datasets are evaluated whole on every worker (LightGBM's
    ``training`` metrics cover rank 0's shard only). ``dmatrix_params={"train": {...}}`` passes
    keyword arguments to a dataset's ``lightgbm.Dataset``, and other keyword arguments go to
    ``lightgbm.train`` (e.g. ``callbacks=[RayTrainReportCallback(frequency=10)]``).
    """

    _library_train = staticmethod(lightgbm.train)
    _reserved = ("params", "train_set", "num_boost_round", "valid_sets", "valid_names", "init_model")
    _param_form_fn = staticmethod(_train_fn_per_worker)

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None = None,
        *,
        train_loop_config: dict[str, Any] | None = None,
        lightgbm_config: LightGBMConfig | None = None,
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
        if lightgbm_config is not None and not isinstance(lightgbm_config, LightGBMConfig):
            raise TypeError(f"lightgbm_config={lightgbm_config!r}: must be a trainers.lightgbm.LightGBMConfig.")
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=lightgbm_config or LightGBMConfig(),
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
        ``trainers.lightgbm.get_model(checkpoint)``).
        """
        raise DeprecationWarning(
            "LightGBMTrainer.get_model(checkpoint) is gone (Ray Train V2 removed it): load the model with "
            "trainers.lightgbm.RayTrainReportCallback.get_model(checkpoint), or trainers.lightgbm.get_model(checkpoint)."
        )
