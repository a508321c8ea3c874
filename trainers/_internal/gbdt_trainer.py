"""The part XGBoostTrainer and LightGBMTrainer share: accepting either form, and checking the
parameter form's columns before any worker starts."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from storage import Checkpoint
from trainers._internal import gbdt
from trainers.backend import BackendConfig
from trainers.config import DataConfig, RunConfig, ScalingConfig
from trainers.data_parallel_trainer import DataParallelTrainer
from trainers.result import Result


class GBDTTrainer(DataParallelTrainer):
    """A DataParallelTrainer that also runs a built-in training function from parameters alone."""

    #: The library's train function (its keyword arguments are checked against it).
    _library_train: Callable[..., Any]
    #: Its arguments the parameter form sets itself.
    _reserved: tuple[str, ...] = ()
    #: The built-in training function of the parameter form (takes a ``gbdt.ParamForm``).
    _param_form_fn: Callable[[gbdt.ParamForm], Any]

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None,
        *,
        train_loop_config: dict[str, Any] | None,
        backend_config: BackendConfig,
        scaling_config: ScalingConfig | None,
        run_config: RunConfig | None,
        datasets: dict[str, Any] | None,
        dataset_config: DataConfig | None,
        validation_config: Any,
        metadata: dict[str, Any] | None,
        resume_from_checkpoint: Checkpoint | None,
        label_column: str | None,
        params: dict[str, Any] | None,
        num_boost_round: int | None,
        dmatrix_params: dict[str, dict[str, Any]] | None,
        train_kwargs: dict[str, Any],
    ) -> None:
        name = type(self).__name__
        param_args = dict(label_column=label_column, params=params, num_boost_round=num_boost_round, dmatrix_params=dmatrix_params)
        self._param_form: gbdt.ParamForm | None = None
        if gbdt.check_forms(name, train_loop_per_worker, train_loop_config, param_args, train_kwargs):
            num_boost_round = 10 if num_boost_round is None else num_boost_round  # Ray Train's default
            gbdt.check_param_form(
                name,
                datasets=datasets,
                label_column=label_column,
                params=params,
                num_boost_round=num_boost_round,
                dmatrix_params=dmatrix_params,
                train_kwargs=train_kwargs,
                library_train=type(self)._library_train,
                reserved=self._reserved,
            )
            self._param_form = gbdt.ParamForm(
                label_column=label_column,
                params=dict(params or {}),
                num_boost_round=num_boost_round,
                dmatrix_params=dict(dmatrix_params or {}),
                train_kwargs=dict(train_kwargs),
            )
            train_loop_per_worker = type(self)._param_form_fn
            dataset_config = gbdt.default_data_config(dataset_config)
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=backend_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            validation_config=validation_config,
            metadata=metadata,
            resume_from_checkpoint=resume_from_checkpoint,
        )

    def fit(self) -> Result:
        """Train; return the Result. In the parameter form the label and feature columns of every
        dataset are checked first, before any worker starts."""
        if self._param_form is None:
            return super().fit()
        from trainers._internal.data import resolve_datasets
        from trainers._internal.ray_init import ensure_ray

        ensure_ray()
        given = self.datasets
        resolved = resolve_datasets(given)
        features = gbdt.check_columns(resolved, self._param_form.label_column)
        names = (gbdt.TRAIN, *sorted(n for n in resolved if n != gbdt.TRAIN))
        self.train_loop_config = dataclasses.replace(self._param_form, features=features, dataset_names=names)
        self.datasets = resolved  # dataset functions are called once per fit, here
        try:
            return super().fit()
        finally:
            self.datasets, self.train_loop_config = given, None
