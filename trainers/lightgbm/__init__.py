"""LightGBM on flowtrain: ``LightGBMTrainer``, ``LightGBMConfig``, ``LightGBMCheckpoint``,
``RayTrainReportCallback``, ``get_network_params``, ``normalize_pandas_for_lightgbm``,
``get_model`` and ``shared_bins``.

Same names as ``ray.train.lightgbm`` (``get_model`` and ``shared_bins`` are ours). Needs
lightgbm >= 4 (``pip install 'flowtrain[lightgbm]'``).
"""

try:
    import lightgbm as _lightgbm  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("trainers.lightgbm needs the lightgbm package: pip install 'flowtrain[lightgbm]'.") from error

from trainers.lightgbm.bins import shared_bins
from trainers.lightgbm.callback import LightGBMCheckpoint, RayTrainReportCallback, get_model
from trainers.lightgbm.config import LightGBMBackend, LightGBMConfig, get_network_params
from trainers.lightgbm.dataframe import normalize_pandas_for_lightgbm
from trainers.lightgbm.trainer import LightGBMTrainer

__all__ = [
    "LightGBMBackend",
    "LightGBMCheckpoint",
    "LightGBMConfig",
    "LightGBMTrainer",
    "RayTrainReportCallback",
    "get_model",
    "get_network_params",
    "normalize_pandas_for_lightgbm",
    "shared_bins",
]
