"""Which accelerator each worker uses (pure functions, testable without a GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING


if TYPE_CHECKING:
    import torch


def assign_visible_devices(gpu_ids_by_worker: list[list[str]], node_of_worker: list[str]) -> list[tuple[str, tuple[int, ...]]]:
    """Per worker: the ``CUDA_VISIBLE_DEVICES`` to set, and its own GPUs as indices into that list.

    Every worker on a node sees all GPUs given to that node's workers (sorted), so NCCL can use
    peer-to-peer copies between them; each worker then trains on its own ones by index.
    """
    def order(gpu: str) -> tuple[int, str]:
        return (int(gpu), gpu) if gpu.isdigit() else (1 << 30, gpu)

    per_node: dict[str, list[str]] = {}
    for node, gpus in zip(node_of_worker, gpu_ids_by_worker):
        per_node.setdefault(node, [])
        for gpu in gpus:
            if gpu not in per_node[node]:
                per_node[node].append(gpu)
    visible = {node: sorted(gpus, key=order) for node, gpus in per_node.items()}
    return [
        (",".join(visible[node]), tuple(visible[node].index(gpu) for gpu in gpus))
        for node, gpus in zip(node_of_worker, gpu_ids_by_worker)
    ]


def get_devices() -> list["torch.device"]:
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


def get_device() -> "torch.device":
    """This worker's first device (see ``get_devices``)."""
    return get_devices()[0]
