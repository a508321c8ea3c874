"""XGBoost on flowtrain: ``XGBoostTrainer``, ``XGBoostConfig``, ``XGBoostCheckpoint``,
``RayTrainReportCallback`` and ``get_model``.

Same names as ``ray.train.xgboost`` (``get_model`` is ours). Needs xgboost >= 2.1
(``pip install 'flowtrain[xgboost]'``).
"""

try:
    import xgboost as _xgboost  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trainers.xgboost needs the xgboost package: pip install 'flowtrain[xgboost]' (or xgboost-cpu)."
    ) from error

from trainers.xgboost.callback import RayTrainReportCallback, XGBoostCheckpoint, get_model
from trainers.xgboost.config import XGBoostBackend, XGBoostConfig
from trainers.xgboost.trainer import XGBoostTrainer

__all__ = [
    "RayTrainReportCallback",
    "XGBoostBackend",
    "XGBoostCheckpoint",
    "XGBoostConfig",
    "XGBoostTrainer",
    "get_model",
]
