"""Keras callbacks that report to flowtrain: ``ReportCheckpointCallback``, as in ``ray.train.tensorflow.keras``.

The callbacks derive from the Keras that ``tf.keras`` names in this process: Keras 2
(``tf-keras``) when ``TF_USE_LEGACY_KERAS=1``, as ``TensorflowTrainer`` sets on its workers,
and Keras 3 otherwise (for example Keras 3 on the JAX backend inside a ``JaxTrainer``, where
importing this module does not import TensorFlow).
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from typing import Any

from storage import Checkpoint
from trainers._checks import is_metric_choice
from trainers.tensorflow.checkpoint import KERAS_KEY, TensorflowCheckpoint, keras_package, model_from_checkpoint

__all__ = ["RayReportCallback", "ReportCheckpointCallback"]

#: The Keras hooks (less their ``on_`` prefix) a report or a checkpoint can be tied to.
EVENTS = tuple(
    f"{stage}_{edge}"
    for stage in ("epoch", "train_batch", "test_batch", "predict_batch", "train", "test", "predict")
    for edge in ("begin", "end")
)


def _keras_callback_base() -> type:
    """``tf.keras.callbacks.Callback`` without importing TensorFlow: TensorFlow's own rule picks
    Keras 2 (``tf_keras``) when ``TF_USE_LEGACY_KERAS`` is set to true, Keras 3 otherwise."""
    legacy = os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")
    return importlib.import_module("tf_keras" if legacy else "keras").callbacks.Callback


def _events(field: str, value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or any(name not in EVENTS for name in names):
        raise ValueError(
            f"ReportCheckpointCallback({field}={value!r}): must be one Keras hook name or a list of them, "
            f"from {', '.join(repr(e) for e in EVENTS)}."
        )
    return tuple(names)


def _plain(value: Any) -> Any:
    """A Keras log value as a plain Python number when it is one (numpy and tensor scalars too)."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item") and getattr(value, "size", None) == 1:
        value = value.item()
    return value


class RayReportCallback(_keras_callback_base()):  # type: ignore[misc]  # a base class picked at import time
    """Reports Keras logs to flowtrain at chosen hooks, with a checkpoint of the model at others
    (arguments as ``ReportCheckpointCallback``'s).

    At a checkpoint hook every rank saves the model (``model.keras``; the strategy needs every
    rank to take part) and rank 0 reports its copy with the metrics, the other ranks the metrics
    alone; at a hook in ``report_metrics_on`` only, every rank reports the metrics. At the epoch
    hooks the Keras epoch index is reported as ``epoch`` (unless a log has that name) and recorded
    in each checkpoint's metadata, so a resumed run passes ``initial_epoch=epoch + 1`` to ``fit()``.
    """

    def __init__(
        self,
        checkpoint_on: str | list[str] = "epoch_end",
        report_metrics_on: str | list[str] = "epoch_end",
        metrics: str | list[str] | dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self._checkpoint_on = _events("checkpoint_on", checkpoint_on)
        self._report_metrics_on = _events("report_metrics_on", report_metrics_on)
        if not is_metric_choice(metrics):
            raise TypeError(
                f"ReportCheckpointCallback(metrics={metrics!r}): must be None (every Keras log), a log name, a list of "
                "log names, or a dict of reported name to log name, e.g. {'train_loss': 'loss'}."
            )
        self._metrics = metrics
        self._epoch: int | None = None

    @staticmethod
    def get_model(checkpoint: Checkpoint) -> Any:
        """The Keras model in a checkpoint this callback reported, loaded with the Keras that saved it.

        Call it inside ``strategy.scope()`` to resume training on the workers.
        """
        return model_from_checkpoint(checkpoint)

    # Keras 2 skips a callback's batch hooks when these say False: else every batch pays for a call.
    def _implements_train_batch_hooks(self) -> bool:
        return self._wants("train_batch_")

    def _implements_test_batch_hooks(self) -> bool:
        return self._wants("test_batch_")

    def _implements_predict_batch_hooks(self) -> bool:
        return self._wants("predict_batch_")

    def _wants(self, prefix: str) -> bool:
        return any(e.startswith(prefix) for e in self._checkpoint_on + self._report_metrics_on)

    def _handle(self, logs: dict | None, when: str) -> None:
        if when in self._checkpoint_on:
            self._save_and_report_checkpoint(self._selected(logs or {}, when), None)
        elif when in self._report_metrics_on:
            self._report_metrics(self._selected(logs or {}, when))

    def _selected(self, logs: dict, when: str) -> dict[str, Any]:
        wanted = self._metrics
        if isinstance(wanted, dict):
            names = dict(wanted)
        else:  # every log, one name or a list of names, each reported under its own name
            listed = logs if wanted is None else [wanted] if isinstance(wanted, str) else wanted
            names = {name: name for name in listed}
        missing = sorted(set(names.values()) - set(logs))
        if missing:
            raise KeyError(
                f"ReportCheckpointCallback(metrics={wanted!r}): Keras has no log {', '.join(map(repr, missing))} at "
                f"{when!r}; its logs there are {sorted(logs)}. Compile the model with that metric or pick another name."
            )
        metrics = {reported: _plain(logs[name]) for reported, name in names.items()}
        if when.startswith("epoch_") and self._epoch is not None:
            metrics.setdefault("epoch", self._epoch)
        return metrics

    def _save_and_report_checkpoint(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        """Every rank saves the model, rank 0 reports its copy with ``metrics``, the others report
        ``metrics`` alone: under MultiWorkerMirroredStrategy saving reads variables all-reduced on
        read (metrics, the optimizer's step), so a save on rank 0 alone would hang its collectives."""
        import trainers

        folder = tempfile.mkdtemp(prefix="flowtrain-keras-")
        try:
            self.model.save(os.path.join(folder, TensorflowCheckpoint.MODEL_FILENAME))
            if trainers.get_context().get_world_rank() != 0:
                trainers.report(metrics)
                return
            checkpoint = Checkpoint.from_directory(folder)
            saved = {TensorflowCheckpoint.MODEL_FILENAME_KEY: TensorflowCheckpoint.MODEL_FILENAME}
            epoch = {} if self._epoch is None else {"epoch": self._epoch}
            checkpoint.update_metadata({**saved, KERAS_KEY: keras_package(self.model), **epoch})
            trainers.report(metrics, checkpoint=checkpoint)
        finally:
            # report() has copied the folder into the run's storage.
            shutil.rmtree(folder, ignore_errors=True)

    def _report_metrics(self, metrics: dict[str, Any]) -> None:
        import trainers

        trainers.report(metrics)


def _hook(when: str) -> Any:
    """``RayReportCallback.on_<when>``, with the parameters Keras calls it with: the epoch or batch
    index first (the epoch is kept for the metrics and checkpoints), then the logs."""
    if when.startswith("epoch_"):

        def on_epoch(self: RayReportCallback, epoch: int, logs: dict | None = None) -> None:
            self._epoch = epoch
            self._handle(logs, when)

        return on_epoch
    if "_batch_" in when:

        def on_batch(self: RayReportCallback, batch: int, logs: dict | None = None) -> None:
            self._handle(logs, when)

        return on_batch

    def on_stage(self: RayReportCallback, logs: dict | None = None) -> None:
        self._handle(logs, when)

    return on_stage


# Keras calls each hook by name; every one hands its moment on to _handle.
for _when in EVENTS:
    setattr(RayReportCallback, f"on_{_when}", _hook(_when))


class ReportCheckpointCallback(RayReportCallback):
    """Keras callback that reports ``fit()``'s logs and checkpoints the model, every epoch by default.

    Inside a ``TensorflowTrainer`` training function, ``model.fit(data, epochs=10,
    callbacks=[ReportCheckpointCallback()])`` reports Keras' logs (``loss``, your metrics,
    ``val_*``) and ``epoch`` after every epoch, with a checkpoint holding ``model.keras`` (rank 0's
    copy). To resume after a restart, build the model with ``get_model(checkpoint)`` inside
    ``strategy.scope()`` and pass ``initial_epoch=checkpoint.get_metadata()["epoch"] + 1``
    (docs/frameworks.md, "TensorFlow and Keras", has the example).

    Args:
        checkpoint_on: Keras hook(s), without ``on_``, at which to report a checkpoint (with the metrics).
        report_metrics_on: Keras hook(s) at which to report the metrics.
        metrics: None for all logs, a log name, a list of names, or ``{reported name: log name}``.
    """
