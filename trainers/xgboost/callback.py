"""RayTrainReportCallback for xgboost: one report per boosting round, the model as a checkpoint."""

from __future__ import annotations

from typing import Any, Callable

import xgboost
from xgboost.callback import TrainingCallback

from storage import Checkpoint
from trainers._internal import gbdt

MODEL_FILE = "model.ubj"


def get_model(checkpoint: Checkpoint, filename: str = MODEL_FILE) -> xgboost.Booster:
    """Load the ``xgboost.Booster`` saved in a checkpoint by ``RayTrainReportCallback``.

    ``booster.num_boosted_rounds()`` tells how many rounds it holds, e.g. to resume training
    with ``xgboost.train(..., xgb_model=booster, num_boost_round=total - booster.num_boosted_rounds())``.
    """
    with gbdt.model_path(checkpoint, filename, MODEL_FILE) as path:
        booster = xgboost.Booster()
        booster.load_model(path)
        return booster


class RayTrainReportCallback(TrainingCallback):
    """Reports xgboost's evaluation metrics after every boosting round and saves the model as a
    checkpoint, as ``ray.train.xgboost.RayTrainReportCallback`` does.

    Pass it to ``xgboost.train(..., callbacks=[RayTrainReportCallback()])`` inside your training
    function. Every round becomes one row of ``Result.metrics_dataframe``, named
    ``"<evaluation set>-<metric>"`` (``"valid-logloss"``); the last round's row is reported
    together with the final checkpoint. Only rank 0 writes the model (all ranks hold the same one).

    Args:
        metrics: None reports every metric; a name or list of names reports those; a dict
            ``{"loss": "valid-logloss"}`` reports xgboost's ``valid-logloss`` as ``loss``.
        filename: The model's file name inside the checkpoint; the ending picks the format
            (``.ubj`` binary JSON, ``.json``).
        frequency: Save a checkpoint every ``frequency`` rounds (0: only at the end). With
            ``FailureConfig(max_failures=...)``, a restart resumes from the latest one.
        checkpoint_at_end: Save a checkpoint after the last round.
        results_postprocessing_fn: Optional function applied to the metrics dict before it is reported.
    """

    #: The model's default file name inside each checkpoint (as ``ray.train.xgboost``'s).
    CHECKPOINT_NAME = MODEL_FILE

    def __init__(
        self,
        metrics: str | list[str] | dict[str, str] | None = None,
        filename: str = MODEL_FILE,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self._metrics = gbdt.check_callback_args(type(self).__name__, metrics, filename, frequency, checkpoint_at_end)
        self._filename = filename
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn
        # The latest round's metrics, held back until we know whether it is the last round (its row
        # then carries the final checkpoint: one row per round, with or without checkpoint_at_end).
        self._held: dict[str, Any] | None = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = MODEL_FILE) -> xgboost.Booster:
        """Load the ``xgboost.Booster`` saved in ``checkpoint`` (see ``trainers.xgboost.get_model``)."""
        return get_model(checkpoint, filename)

    def before_training(self, model: xgboost.Booster) -> xgboost.Booster:
        self._held = None
        return model

    def after_iteration(self, model: xgboost.Booster, epoch: int, evals_log: dict) -> bool:
        metrics = self._round_metrics(evals_log)
        self._release(save=None)
        if gbdt.is_checkpoint_round(epoch, self._frequency):
            gbdt.report(metrics, model.save_model, self._filename)
        else:
            self._held = metrics
        return False  # never asks xgboost to stop

    def after_training(self, model: xgboost.Booster) -> xgboost.Booster:
        self._release(save=model.save_model if self._checkpoint_at_end else None)
        return model

    def _release(self, save: Callable[[str], None] | None) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            gbdt.report(held, save, self._filename)

    def _round_metrics(self, evals_log: dict) -> dict[str, Any]:
        latest = {}
        for data_name, by_metric in evals_log.items():
            for metric, values in by_metric.items():
                value = values[-1]
                latest[f"{data_name}-{metric}"] = value[0] if isinstance(value, tuple) else value
        selected = gbdt.select_metrics(type(self).__name__, latest, self._metrics)
        return self._postprocess(selected) if self._postprocess else selected
