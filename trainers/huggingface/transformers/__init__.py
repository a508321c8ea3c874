"""Hugging Face Transformers on flowtrain, under the names of ``ray.train.huggingface.transformers``.

A ``transformers.Trainer`` script runs inside a ``TorchTrainer`` training function with two
more lines::

    from trainers.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[RayTrainReportCallback()])  # metrics + checkpoints
    trainer = prepare_trainer(trainer)
    trainer.train()

Needs the ``transformers`` extra: ``pip install 'flowtrain[transformers]'``.
"""

from trainers._extras import require

require("transformers", extra="transformers")

from trainers.huggingface.transformers.callback import RayTrainReportCallback  # noqa: E402
from trainers.huggingface.transformers.prepare import prepare_trainer  # noqa: E402

__all__ = ["RayTrainReportCallback", "prepare_trainer"]
