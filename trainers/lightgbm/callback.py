"""RayTrainReportCallback for lightgbm (one report per boosting round, the model as a checkpoint), and
LightGBMCheckpoint, which reads the same model file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import lightgbm

from storage import Checkpoint
from trainers.gbdt.callback import GBDTCheckpoint, ReportCallback, model_path

MODEL_FILE = "model.txt"


def load_model(path: str) -> lightgbm.Booster:
    """The ``lightgbm.Booster`` saved at ``path``."""
    return lightgbm.Booster(model_file=path)


class RayTrainReportCallback(ReportCallback):
    """Reports LightGBM's evaluation metrics after every boosting round and saves the model as a
    checkpoint, as ``ray.train.lightgbm.RayTrainReportCallback`` does.

    Pass it to ``lightgbm.train(..., callbacks=[RayTrainReportCallback()])`` inside your training
    function. Every round becomes one row of ``Result.metrics_dataframe``, named
    ``"<valid set name>-<metric>"`` (``"valid-binary_logloss"``). Only rank 0 writes the model
    (all ranks hold the same one). LightGBM computes metrics on each worker's own rows: give
    validation sets whole to every worker (``DataConfig(datasets_to_split=["train"])``) for
    metrics over all of them.

    Args:
        metrics: None reports every metric; a name or list of names reports those; a dict
            ``{"loss": "valid-binary_logloss"}`` reports LightGBM's metric under a new name.
        filename: The model's file name inside the checkpoint (LightGBM's text format).
        frequency: Save a checkpoint every ``frequency`` rounds (0: only at the end). With
            ``FailureConfig(max_failures=...)``, a restart resumes from the latest one.
        checkpoint_at_end: Save a checkpoint after the last round.
        results_postprocessing_fn: Optional function applied to the metrics dict before it is reported.
    """

    #: The model's default file name inside each checkpoint (as ``ray.train.lightgbm``'s).
    CHECKPOINT_NAME = MODEL_FILE

    #: LightGBM runs callbacks by this number: after record_evaluation (20), before early_stopping (30).
    order = 25

    # Ray Train's signature; xgboost's callback has the same one but for its file name, and both
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

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = MODEL_FILE) -> lightgbm.Booster:
        """Load the ``lightgbm.Booster`` saved in ``checkpoint`` by this callback (also ``trainers.lightgbm.get_model``).

        ``booster.current_iteration()`` tells how many rounds it holds, e.g. to resume training with
        ``lightgbm.train(..., init_model=booster, num_boost_round=total - booster.current_iteration())``.
        """
        with model_path(checkpoint, filename, MODEL_FILE) as path:
            return load_model(path)

    def __call__(self, env: Any) -> None:
        """Report the round LightGBM just finished, with a checkpoint when it is due."""
        metrics = self._round_metrics({f"{e[0]}-{e[1]}": e[2] for e in env.evaluation_result_list or []})
        last = env.iteration == env.end_iteration - 1
        due = self._is_checkpoint_round(env.iteration) or (last and self._checkpoint_at_end)
        # num_iteration=-1: every round, so that a resumed run counts them all.
        self._report(metrics, (lambda path: env.model.save_model(path, num_iteration=-1)) if due else None)


#: ``RayTrainReportCallback.get_model``, as a function.
get_model = RayTrainReportCallback.get_model


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
