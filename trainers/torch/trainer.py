"""TorchTrainer: data-parallel PyTorch training with a ready process group on every worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from trainers.data_parallel_trainer import DataParallelTrainer, TrainerOptions
from trainers.torch.config import TorchConfig


class TorchTrainer(DataParallelTrainer):
    """Runs a PyTorch training function on N workers with ``torch.distributed`` set up.

    Inside the function use ``trainers.torch.prepare_model`` / ``prepare_data_loader`` (or your own
    DDP code: the process group is already initialised), and ``trainers.report`` for metrics and
    checkpoints. Same arguments as ``ray.train.torch.TorchTrainer``.
    """

    _backend_config_arg = ("torch_config", TorchConfig)

    # Ray Train's keywords: its own config here, the rest in TrainerOptions (tests/test_api_surface.py).
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        torch_config: TorchConfig | None = None,
        **options: Unpack[TrainerOptions],
    ) -> None:
        super().__init__(train_loop_per_worker, backend_config=torch_config, **options)
