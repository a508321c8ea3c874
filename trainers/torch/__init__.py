"""PyTorch on flowtrain: ``TorchTrainer``, ``TorchConfig``, ``TorchCheckpoint`` and the
training-loop helpers.

Same names as ``ray.train.torch``; ``trainers.torch.xla`` holds ``TorchXLAConfig``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.lazy_names import lazy_names

#: Where each public name lives, imported on first use as in ``trainers``: every worker imports
#: this package (the backend's set-up functions live in ``trainers.torch.config``), and loading
#: ``TorchTrainer`` there brought the whole driver side (controller, worker group, storage) into
#: each worker, about 0.1 s of CPU per worker process at start-up.
_HOMES: dict[str, tuple[str, ...]] = {
    "trainers.torch.amp": ("accelerate", "backward", "prepare_optimizer"),
    "trainers.torch.checkpoint": ("TorchCheckpoint",),
    "trainers.torch.config": ("TorchBackend", "TorchConfig"),
    "trainers.torch.devices": ("get_device", "get_devices"),
    "trainers.torch.train_loop_utils": ("enable_reproducibility", "prepare_data_loader", "prepare_model"),
    "trainers.torch.trainer": ("TorchTrainer",),
}
__all__, __getattr__, __dir__ = lazy_names("trainers.torch", _HOMES, globals())


if TYPE_CHECKING:  # what IDEs and type checkers see; at run time the names load on first use
    from trainers.torch.amp import accelerate, backward, prepare_optimizer
    from trainers.torch.checkpoint import TorchCheckpoint
    from trainers.torch.config import TorchBackend, TorchConfig
    from trainers.torch.devices import get_device, get_devices
    from trainers.torch.train_loop_utils import enable_reproducibility, prepare_data_loader, prepare_model
    from trainers.torch.trainer import TorchTrainer
