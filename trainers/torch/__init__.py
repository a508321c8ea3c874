"""PyTorch on flowtrain: ``TorchTrainer``, ``TorchConfig`` and the training-loop helpers.

Same names as ``ray.train.torch``.
"""

from trainers.torch.config import TorchBackend, TorchConfig
from trainers.torch.train_loop_utils import (
    enable_reproducibility,
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
)
from trainers.torch.trainer import TorchTrainer

__all__ = [
    "TorchBackend",
    "TorchConfig",
    "TorchTrainer",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
]
