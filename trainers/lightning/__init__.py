"""PyTorch Lightning on flowtrain, under the names of ``ray.train.lightning``: a ``pl.Trainer``
built inside a ``TorchTrainer`` training function with these strategies, environment and callback,
then ``prepare_trainer`` (docs/frameworks.md, "PyTorch Lightning", has the example).

Needs the ``lightning`` extra: ``pip install 'flowtrain[lightning]'`` (and ``deepspeed`` for
``RayDeepSpeedStrategy``).
"""

from trainers._extras import require

require("lightning.pytorch", extra="lightning")

from trainers.lightning.callback import RayTrainReportCallback  # noqa: E402
from trainers.lightning.strategies import (  # noqa: E402
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
    prepare_trainer,
)

__all__ = [
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
]
