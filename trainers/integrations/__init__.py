"""Experiment trackers for flowtrain runs: MLflow (``trainers.integrations.mlflow``) and
TensorBoard (``trainers.integrations.tensorboard``).

Each is a :class:`trainers.UserCallback` for ``RunConfig(callbacks=[...])`` that logs rank 0's
metrics of every report with the report's index in the run's history as the step. A resumed run
(a restarted worker group, a rerun of ``fit()``, a Prefect retry) logs on where the tracker left
off: every step once, in order. Install them with ``pip install 'flowtrain[tracking]'``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from storage.retention import flatten


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics a tracker can plot: numbers (and 0-d tensors or arrays) as floats, nested dicts
    flattened to ``outer/inner``; text, lists and other values are left out."""
    scalars = {}
    for key, value in flatten(metrics).items():
        if not isinstance(value, (str, bytes)):
            with contextlib.suppress(TypeError, ValueError):
                scalars[key] = float(value)
    return scalars
