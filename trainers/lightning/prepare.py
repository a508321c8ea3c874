"""prepare_trainer: check a ``pl.Trainer`` will train on flowtrain's workers, not launch its own."""

from __future__ import annotations

import lightning.pytorch as pl

from trainers.lightning.strategies import RayDDPStrategy, RayDeepSpeedStrategy, RayFSDPStrategy, RayLightningEnvironment

_STRATEGIES = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Check ``trainer`` is set up for flowtrain and return it.

    It must use ``RayDDPStrategy``, ``RayFSDPStrategy`` or ``RayDeepSpeedStrategy`` (or a subclass), with
    ``RayLightningEnvironment`` as its cluster environment (``pl.Trainer(strategy=RayDDPStrategy(),
    plugins=[RayLightningEnvironment()], ...)``; docs/frameworks.md has the whole example).

    Raises:
        TypeError: another strategy or cluster environment; Lightning would then start its own
            processes or process group.
    """
    strategy = trainer.strategy
    if not isinstance(strategy, _STRATEGIES):
        raise TypeError(
            f"prepare_trainer: the trainer's strategy is {type(strategy).__name__}; use "
            "strategy=RayDDPStrategy(), RayFSDPStrategy() or RayDeepSpeedStrategy() from trainers.lightning."
        )
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise TypeError(
            f"prepare_trainer: the trainer's cluster environment is {type(environment).__name__}; "
            "pass plugins=[RayLightningEnvironment()] from trainers.lightning."
        )
    return trainer
