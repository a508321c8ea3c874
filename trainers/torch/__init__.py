"""PyTorch on flowtrain: ``TorchTrainer``, ``TorchConfig``, ``TorchCheckpoint`` and the
training-loop helpers.

Same names as ``ray.train.torch``; ``trainers.torch.xla`` holds ``TorchXLAConfig``.
"""

from trainers.torch.amp import accelerate, backward, prepare_optimizer
from trainers.torch.checkpoint import TorchCheckpoint
from trainers.torch.config import TorchBackend, TorchConfig
from trainers.torch.devices import get_device, get_devices
from trainers.torch.train_loop_utils import enable_reproducibility, prepare_data_loader, prepare_model
from trainers.torch.trainer import TorchTrainer

__all__ = [
    "TorchBackend",
    "TorchCheckpoint",
    "TorchConfig",
    "TorchTrainer",
    "accelerate",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
]
