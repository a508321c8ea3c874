"""RayTrainReportCallback for xgboost (one report per boosting round, the model as a checkpoint), and
XGBoostCheckpoint, which reads the same model files."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import xgboost
from xgboost.callback import TrainingCallback

from storage import Checkpoint
from trainers.gbdt.callback import GBDTCheckpoint, ReportCallback, model_path

MODEL_FILE = "model.ubj"


def load_model(path: str) -> xgboost.Booster:
    """The ``xgboost.Booster`` saved at ``path``."""
    booster = xgboost.Booster()
    booster.load_model(path)
    return booster


class RayTrainReportCallback(ReportCallback, TrainingCallback):
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

    # Ray Train's signature; LightGBM's callback has the same one but for its file name, and both
    # leave the arguments to ReportCallback.
    def __init__(
        self,
        metrics: str | list[str] | dict[str, str] | None = None,
        filename: str = MODEL_FILE,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(metrics, filename, frequency, checkpoint_at_end, results_postprocessing_fn)
        # The latest round's metrics, held back until we know whether it is the last round (its row
        # then carries the final checkpoint: one row per round, with or without checkpoint_at_end).
        self._held: dict[str, Any] | None = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = MODEL_FILE) -> xgboost.Booster:
        """Load the ``xgboost.Booster`` saved in ``checkpoint`` by this callback (also ``trainers.xgboost.get_model``).

        ``booster.num_boosted_rounds()`` tells how many rounds it holds, e.g. to resume training
        with ``xgboost.train(..., xgb_model=booster, num_boost_round=total - booster.num_boosted_rounds())``.
        """
        with model_path(checkpoint, filename, MODEL_FILE) as path:
            return load_model(path)

    def before_training(self, model: xgboost.Booster) -> xgboost.Booster:
        """Start with nothing held back (the callback may serve several trainings)."""
        self._held = None
        return model

    def after_iteration(self, model: xgboost.Booster, epoch: int, evals_log: dict) -> bool:
        """Report the previous round, then this one's now if it is a checkpoint round (else hold it)."""
        metrics = self._round_metrics(_latest(evals_log))
        self._release(save=None)
        if self._is_checkpoint_round(epoch):
            self._report(metrics, model.save_model)
        else:
            self._held = metrics
        return False  # never asks xgboost to stop

    def after_training(self, model: xgboost.Booster) -> xgboost.Booster:
        """Report the last round, with the final checkpoint when ``checkpoint_at_end``."""
        self._release(save=model.save_model if self._checkpoint_at_end else None)
        return model

    def _release(self, save: Callable[[str], None] | None) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._report(held, save)


def _latest(evals_log: dict) -> dict[str, Any]:
    """Each metric's value in the round just finished, as ``"<evaluation set>-<metric>"``."""
    return {
        f"{data_name}-{metric}": values[-1][0] if isinstance(values[-1], tuple) else values[-1]
        for data_name, by_metric in evals_log.items()
        for metric, values in by_metric.items()
    }


#: ``RayTrainReportCallback.get_model``, as a function.
get_model = RayTrainReportCallback.get_model


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
