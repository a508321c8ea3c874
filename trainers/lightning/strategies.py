"""Lightning's view of a flowtrain worker group: ranks from ``get_context()``, the device from
``trainers.torch``, and the process group flowtrain already set up (Lightning never launches
processes or opens its own group).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy

from trainers._extras import require
from trainers.context import get_context
from trainers.torch.devices import get_device


class RayLightningEnvironment(LightningEnvironment):
    """Tells Lightning this worker's ranks and world size, as flowtrain assigned them.

    Pass it as ``pl.Trainer(plugins=[RayLightningEnvironment()])``. Lightning then trusts that the
    processes already exist (one per flowtrain worker) and that ``torch.distributed`` is ready.
    """

    @property
    def creates_processes_externally(self) -> bool:
        """Always True: Lightning must not launch processes of its own."""
        # flowtrain started every worker: Lightning must not spawn copies of the script.
        return True

    def world_size(self) -> int:
        """How many workers train together (``get_context().get_world_size()``)."""
        return get_context().get_world_size()

    def global_rank(self) -> int:
        """This worker's rank among all workers."""
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        """This worker's rank on its node."""
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        """The rank of this worker's node."""
        return get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """Ignored: the world size is flowtrain's."""
        # Lightning computes a world size from devices x num_nodes; ours comes from the context.
        pass

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the rank is flowtrain's."""
        pass

    def teardown(self) -> None:
        """Leaves the process group and its environment to flowtrain, which tears them down."""
        pass


class _OnFlowtrainWorker:
    """What both Ray strategies change in Lightning's: the device and the sampler's ranks."""

    @property
    def root_device(self) -> torch.device:
        """This worker's device, as ``trainers.torch.get_device()`` gives it."""
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Lightning's ``DistributedSampler`` covers all flowtrain workers, at this worker's rank."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayDDPStrategy(_OnFlowtrainWorker, DDPStrategy):
    """Lightning's ``DDPStrategy`` on flowtrain's workers (same arguments).

    The process group's backend and timeout come from ``TorchConfig`` on the trainer, not from
    ``process_group_backend``/``timeout`` here: the group exists before Lightning starts.
    """


class RayFSDPStrategy(_OnFlowtrainWorker, FSDPStrategy):
    """Lightning's ``FSDPStrategy`` on flowtrain's workers (same arguments).

    The default ``state_dict_type="full"`` gathers the whole model into rank 0's checkpoint, so
    ``LightningModule.load_from_checkpoint`` loads it without FSDP; ``"sharded"`` writes one
    shard per rank (all of them are kept in the reported checkpoint).

    Needs GPUs (``ScalingConfig(use_gpu=True)``): Lightning builds on torch's
    ``FullyShardedDataParallel``, which does not run on CPU. To shard on CPU workers, call
    ``trainers.torch.prepare_model(model, parallel_strategy="fsdp")`` in a plain torch loop.
    """

    def setup_environment(self) -> None:
        """Fails at once on CPU workers, naming what to use instead."""
        if self.root_device.type == "cpu":
            raise ValueError(
                "RayFSDPStrategy needs GPUs: Lightning's FSDP (torch's FullyShardedDataParallel) does "
                "not run on CPU. Set ScalingConfig(use_gpu=True), use strategy=RayDDPStrategy() on CPU "
                "workers, or shard a plain torch loop with trainers.torch.prepare_model(model, "
                "parallel_strategy='fsdp')."
            )
        super().setup_environment()


class RayDeepSpeedStrategy(_OnFlowtrainWorker, DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` (ZeRO stages, offloading) on flowtrain's workers (same
    arguments, e.g. ``RayDeepSpeedStrategy(stage=3)``).

    DeepSpeed joins the process group flowtrain set up; its backend and timeout come from
    ``TorchConfig`` on the trainer. Needs the ``deepspeed`` package
    (``pip install 'flowtrain[deepspeed]'``), and in practice GPUs.

    Raises:
        MissingExtraError: (an ``ImportError``) when deepspeed is not installed, naming the
            install command; raised when the strategy is built, before training starts.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Lightning would only say "not available" once training starts; say what to install now.
        require("deepspeed", extra="deepspeed")
        super().__init__(*args, **kwargs)
