"""Which GPUs each worker sees and trains on: decided once per attempt, for every framework."""

from __future__ import annotations


def assign_visible_devices(
    gpu_ids_by_worker: list[list[str]], node_of_worker: list[str]
) -> list[tuple[str, tuple[int, ...]]]:
    """Per worker: the ``CUDA_VISIBLE_DEVICES`` to set, and its own GPUs as indices into that list
    (``TrainContext.accelerator_ids``). Every worker on a node sees all GPUs of that node's
    workers (sorted), so NCCL can use peer-to-peer copies between them."""

    def order(gpu: str) -> tuple[int, str]:
        return (int(gpu), gpu) if gpu.isdigit() else (1 << 30, gpu)

    per_node: dict[str, set[str]] = {}
    for node, gpus in zip(node_of_worker, gpu_ids_by_worker, strict=True):
        per_node.setdefault(node, set()).update(gpus)
    visible = {node: sorted(gpus, key=order) for node, gpus in per_node.items()}
    return [
        (",".join(visible[node]), tuple(visible[node].index(gpu) for gpu in gpus))
        for node, gpus in zip(node_of_worker, gpu_ids_by_worker, strict=True)
    ]
