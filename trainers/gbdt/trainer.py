"""GBDTTrainer: what XGBoostTrainer and LightGBMTrainer are, given their library's adapter."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NoReturn

from storage import Checkpoint
from trainers.data_parallel_trainer import DataParallelTrainer, TrainerOptions
from trainers.gbdt.param_form import (
    TRAIN,
    Library,
    ParamForm,
    check_columns,
    check_forms,
    default_data_config,
    param_form,
    train_fn_per_worker,
)
from trainers.result import Result


class GBDTTrainer(DataParallelTrainer):
    """A DataParallelTrainer for one boosting library (``_library``) that also trains from
    parameters alone, with a built-in training function."""

    #: The library this trainer boosts with.
    _library: Library

    # Ray Train's signature, the parameter form's and ``**kwargs``: the subclass's config
    # (``<library>_config=``, its ``_backend_config_arg``), ``TrainerOptions``' keywords, and any
    # other keyword for the library's own ``train``.
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any] | None = None,
        *,
        label_column: str | None = None,
        params: dict[str, Any] | None = None,
        num_boost_round: int | None = None,
        dmatrix_params: dict[str, dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        backend_config = kwargs.pop(self._backend_config_arg[0], None)
        options: dict[str, Any] = {key: kwargs.pop(key) for key in TrainerOptions.__annotations__ if key in kwargs}
        param_args: dict[str, Any] = dict(
            label_column=label_column, params=params, num_boost_round=num_boost_round, dmatrix_params=dmatrix_params
        )
        self._param_form: ParamForm | None = None
        if check_forms(name, train_loop_per_worker, options.get("train_loop_config"), param_args, kwargs):
            self._param_form = param_form(
                name, self._library, options.get("datasets"), train_kwargs=kwargs, **param_args
            )
            train_loop_per_worker = train_fn_per_worker
            options["dataset_config"] = default_data_config(options.get("dataset_config"))
        # On to DataParallelTrainer, as every framework's trainer goes.
        super().__init__(
            train_loop_per_worker,  # type: ignore[arg-type]  # None gets DataParallelTrainer's own TypeError, which names the argument
            backend_config=backend_config,
            **options,
        )

    def fit(self) -> Result:
        """Train; return the Result. In the parameter form the label and feature columns of every
        dataset are checked first, before any worker starts."""
        if self._param_form is None:
            return super().fit()
        from trainers._internal.ray_init import ensure_ray
        from trainers._internal.session.data import resolve_datasets

        ensure_ray()
        given = self.datasets
        resolved = resolve_datasets(given)
        features = check_columns(resolved, self._param_form.label_column)
        names = (TRAIN, *sorted(n for n in resolved if n != TRAIN))
        self.train_loop_config = dataclasses.replace(self._param_form, features=features, dataset_names=names)  # type: ignore[assignment]  # train_fn_per_worker takes the form itself as its config
        self.datasets = resolved  # dataset functions are called once per fit, here
        try:
            return super().fit()
        finally:
            self.datasets, self.train_loop_config = given, None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint) -> NoReturn:
        """Removed, as in Ray Train: raises ``DeprecationWarning`` naming what to call instead.

        Load a checkpoint's model with the library's ``RayTrainReportCallback.get_model(checkpoint)``
        (or ``trainers.xgboost.get_model(checkpoint)``, ``trainers.lightgbm.get_model(checkpoint)``).
        """
        module = f"trainers.{cls._library.name}"
        raise DeprecationWarning(
            f"{cls.__name__}.get_model(checkpoint) is gone (Ray Train V2 removed it): load the model with "
            f"{module}.RayTrainReportCallback.get_model(checkpoint), or {module}.get_model(checkpoint)."
        )
