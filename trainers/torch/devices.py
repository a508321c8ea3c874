"""This worker's torch devices (``trainers._internal.workers.devices`` decides which GPUs each worker has)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def get_devices() -> list[torch.device]:
    """This worker's devices: its GPUs (``cuda:i``) when it has any, else the CPU.

    Outside a training worker: ``cuda:0`` when CUDA is available, else the CPU.
    """
    import torch

    from trainers import context

    if not torch.cuda.is_available():
        return [torch.device("cpu")]
    current = context._current
    if current is None:
        return [torch.device("cuda", 0)]
    if not current.accelerator_ids:
        return [torch.device("cpu")]
    return [torch.device("cuda", index) for index in current.accelerator_ids]


def get_device() -> torch.device:
    """This worker's first device (see ``get_devices``)."""
    return get_devices()[0]
