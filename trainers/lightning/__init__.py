"""PyTorch Lightning on flowtrain, under the names of ``ray.train.lightning``.

Inside a ``TorchTrainer`` training function::

    import lightning.pytorch as pl
    from trainers.lightning import (
        RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer,
    )

    trainer = pl.Trainer(
        max_epochs=5,
        strategy=RayDDPStrategy(),                 # or RayFSDPStrategy(), RayDeepSpeedStrategy()
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],      # metrics + checkpoint every epoch
        accelerator="auto", devices="auto",
    )
    trainer = prepare_trainer(trainer)
    trainer.fit(model, datamodule=data)

Needs the ``lightning`` extra: ``pip install 'flowtrain[lightning]'`` (and ``deepspeed`` for
``RayDeepSpeedStrategy``).
"""

from trainers._extras import require

require("lightning.pytorch", extra="lightning")

from trainers.lightning.callback import RayTrainReportCallback  # noqa: E402
from trainers.lightning.prepare import prepare_trainer  # noqa: E402
from trainers.lightning.strategies import (  # noqa: E402
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
)

__all__ = [
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
]
