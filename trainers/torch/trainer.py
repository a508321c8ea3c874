"""TorchTrainer: data-parallel PyTorch training with a ready process group on every worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from storage import Checkpoint
from trainers.config import DataConfig, RunConfig, ScalingConfig
from trainers.data_parallel_trainer import DataParallelTrainer
from trainers.torch.config import TorchConfig


class TorchTrainer(DataParallelTrainer):
    """Runs a PyTorch training function on N workers with ``torch.distributed`` set up.

    Inside the function use ``trainers.torch.prepare_model`` / ``prepare_data_loader`` (or your own
    DDP code: the process group is already initialised), and ``trainers.report`` for metrics and
    checkpoints. Same arguments as ``ray.train.torch.TorchTrainer``.
    """

    _backend_config_arg = ("torch_config", TorchConfig)

    # Ray Train's signature, which must stay exact (tests/test_api_surface.py checks it).
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        torch_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        validation_config: Any = None,
        metadata: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
    ) -> None:
        self._init_above(TorchTrainer, locals())
