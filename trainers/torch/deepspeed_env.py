"""The environment DeepSpeed reads on a worker, so ``deepspeed.initialize`` works in a TorchTrainer loop.

DeepSpeed's own launcher exports a few variables besides torchrun's (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``... which every flowtrain worker already has). Without them DeepSpeed guesses:
on CPU it counts NUMA nodes to decide how many "devices" a node has, and it may pick an
accelerator that is not the one the worker trains on. Setting them is harmless when the loop
does not use DeepSpeed, and never imports it.
"""

from __future__ import annotations

from typing import Any


def deepspeed_env(workers: list[Any], use_gpu: bool) -> dict[int, dict[str, str]]:
    """Per world rank: the variables DeepSpeed's launcher would have set for that worker.

    - ``LOCAL_SIZE``: workers on this worker's node (DeepSpeed's CPU accelerator takes it as
      its device count; it also equals ``LOCAL_WORLD_SIZE``).
    - ``CROSS_RANK`` / ``CROSS_SIZE``: this worker's node rank and the number of nodes.
    - ``DS_ACCELERATOR=cpu`` on CPU workers, so DeepSpeed does not look for a GPU and
      communicates over the gloo group the trainer set up. On GPU workers DeepSpeed finds CUDA
      itself.
    """
    num_nodes = len({w.ranks.node_rank for w in workers})
    return {
        w.ranks.world_rank: {
            "LOCAL_SIZE": str(w.ranks.local_world_size),
            "CROSS_RANK": str(w.ranks.node_rank),
            "CROSS_SIZE": str(num_nodes),
            **({} if use_gpu else {"DS_ACCELERATOR": "cpu"}),
        }
        for w in workers
    }
