"""Hugging Face Transformers on flowtrain, under the names of ``ray.train.huggingface.transformers``:
a ``transformers.Trainer`` script runs inside a ``TorchTrainer`` training function with
``RayTrainReportCallback`` and ``prepare_trainer`` added (docs/frameworks.md, "Hugging Face
Transformers", has the example).

Needs the ``transformers`` extra: ``pip install 'flowtrain[transformers]'``.
"""

from trainers._extras import require

require("transformers", extra="transformers")

from trainers.huggingface.transformers._transformers_utils import RayTrainReportCallback, prepare_trainer  # noqa: E402

__all__ = ["RayTrainReportCallback", "prepare_trainer"]
