"""What both libraries' ``RayTrainReportCallback`` share (their arguments, which metrics a round
reports, when it carries a checkpoint, written by rank 0 alone, and reading the model back), and
what ``XGBoostCheckpoint`` and ``LightGBMCheckpoint`` share: a booster in one file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Self

from storage import Checkpoint
from trainers._checks import is_metric_choice
from trainers._internal.session.framework_checkpoint import FrameworkCheckpoint
from trainers.context import get_context
from trainers.train_fn import report


class ReportCallback:
    """The base of ``trainers.xgboost.RayTrainReportCallback`` and
    ``trainers.lightgbm.RayTrainReportCallback``; each hooks it into its library's training loop."""

    def __init__(
        self,
        metrics: str | list[str] | dict[str, str] | None,
        filename: str,
        frequency: int,
        checkpoint_at_end: bool,
        results_postprocessing_fn: Callable[[dict[str, Any]], dict[str, Any]] | None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        if not is_metric_choice(metrics):
            raise TypeError(
                f"{owner}(metrics={metrics!r}): must be None (report every metric), a metric name, a list of names, "
                "or a dict of reported name to the library's name, e.g. {'loss': 'valid-logloss'}."
            )
        if not isinstance(filename, str) or not filename or os.sep in filename:
            raise ValueError(f"{owner}(filename={filename!r}): must be a file name such as 'model.ubj'.")
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
            raise ValueError(
                f"{owner}(frequency={frequency!r}): must be 0 (no checkpoints while training) or an integer >= 1."
            )
        if not isinstance(checkpoint_at_end, bool):
            raise TypeError(f"{owner}(checkpoint_at_end={checkpoint_at_end!r}): must be True or False.")
        self._metrics = [metrics] if isinstance(metrics, str) else metrics
        self._filename = filename
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn

    def _round_metrics(self, latest: dict[str, Any]) -> dict[str, Any]:
        """What to report of the library's latest ``"<dataset>-<metric>"`` values: all of them, or
        those ``metrics`` names, under the names it gives them."""
        selected = dict(latest)
        if self._metrics:
            names = self._metrics if isinstance(self._metrics, dict) else {m: m for m in self._metrics}
            missing = [key for key in names.values() if key not in latest]
            if missing:
                raise ValueError(
                    f"{type(self).__name__}(metrics=...): the library reported no metric {missing[0]!r}; it reported "
                    f"{sorted(latest)}. Names are '<dataset>-<metric>', from the evaluation sets you pass."
                )
            selected = {shown: latest[key] for shown, key in names.items()}
        return self._postprocess(selected) if self._postprocess else selected

    def _is_checkpoint_round(self, iteration: int) -> bool:
        """Rounds count from 0; with frequency=k rounds k-1, 2k-1, ... are checkpointed."""
        return self._frequency > 0 and (iteration + 1) % self._frequency == 0

    def _report(self, metrics: dict[str, Any], save: Callable[[str], None] | None) -> None:
        """Report one round; with ``save``, rank 0 also writes the model as a checkpoint (the other
        ranks hold the same model, so they send none)."""
        if save is None or get_context().get_world_rank() != 0:
            report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="flowtrain-model-") as folder:
            save(os.path.join(folder, self._filename))
            report(metrics, checkpoint=Checkpoint.from_directory(folder))


@contextlib.contextmanager
def model_path(checkpoint: Checkpoint, filename: str, default: str) -> Iterator[str]:
    """The path of the model file inside ``checkpoint``, with a clear error when it is not there."""
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"get_model(checkpoint={checkpoint!r}): pass a trainers.Checkpoint, e.g. result.checkpoint.")
    with checkpoint.as_directory() as folder:
        path = os.path.join(folder, filename)
        if not os.path.exists(path):
            hint = "" if filename != default else " Pass filename= if the callback saved under another name."
            raise FileNotFoundError(
                f"get_model: the checkpoint {checkpoint.path} has no {filename!r}; it holds {sorted(os.listdir(folder))}.{hint}"
            )
        yield path


class GBDTCheckpoint(FrameworkCheckpoint):
    """A checkpoint with a boosting library's model: ``from_model(booster)``, then ``get_model()``."""

    _INSTEAD: ClassVar[str] = "trainers.Checkpoint with RayTrainReportCallback.get_model(checkpoint)"
    #: The library's booster class; what to pass for it, in words; how to read one from its file.
    _BOOSTER: ClassVar[type[Any]]
    _PASS_A_BOOSTER: ClassVar[str]
    _load_model: ClassVar[staticmethod[[str], Any]]

    @classmethod
    def from_model(
        cls, booster: Any, *, preprocessor: Any | None = None, path: str | os.PathLike | None = None
    ) -> Self:
        """A checkpoint of ``booster`` saved into ``path`` (an existing, preferably empty folder;
        a new temporary one by default), with ``preprocessor`` if given.

        For a scikit-learn style model pass its booster: ``model.get_booster()`` for xgboost,
        ``model.booster_`` for LightGBM.
        """
        if not isinstance(booster, cls._BOOSTER):
            raise TypeError(f"{cls.__name__}.from_model(booster={type(booster).__name__}): pass {cls._PASS_A_BOOSTER}.")
        return cls._from_saved(booster.save_model, preprocessor=preprocessor, path=path, method="from_model")

    def get_model(self) -> Any:
        """The booster stored in this checkpoint (an ``xgboost.Booster`` or a ``lightgbm.Booster``)."""
        with self._model_file() as path:
            return type(self)._load_model(path)
