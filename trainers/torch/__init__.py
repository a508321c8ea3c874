"""PyTorch on flowtrain: ``TorchTrainer``, ``TorchConfig``, ``TorchCheckpoint`` and the
training-loop helpers.

Same names as ``ray.train.torch``; ``trainers.torch.xla`` holds ``TorchXLAConfig``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.lazy_names import lazy_names

# Every public name is imported on first use, as in ``trainers`` (``storage.lazy_names``): every
# worker imports this package (the backend's set-up functions live in ``trainers.torch.config``),
# and loading ``TorchTrainer`` there brought the whole driver side (controller, worker group,
# storage) into each worker, about 0.1 s of CPU per worker process at start-up.
__all__, __getattr__, __dir__ = lazy_names(globals())


if TYPE_CHECKING:  # the public names: what IDEs and type checkers see, and what lazy_names loads on first use
    from trainers.torch.amp import accelerate, backward, prepare_optimizer
    from trainers.torch.checkpoint import TorchCheckpoint
    from trainers.torch.config import TorchBackend, TorchConfig
    from trainers.torch.devices import get_device, get_devices
    from trainers.torch.train_loop_utils import enable_reproducibility, prepare_data_loader, prepare_model
    from trainers.torch.trainer import TorchTrainer
