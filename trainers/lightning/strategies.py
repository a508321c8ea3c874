"""Lightning's view of a flowtrain worker group: ranks from ``get_context()``, the device from
``trainers.torch``, and the process group flowtrain already set up (Lightning never launches
processes or opens its own group); ``prepare_trainer`` checks a ``pl.Trainer`` uses them.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.seed import reset_seed
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
        """Always True: flowtrain started every worker, so Lightning must not spawn copies of the script."""
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
        """Ignored: the world size is flowtrain's (Lightning's comes from devices x num_nodes)."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the rank is flowtrain's."""

    def teardown(self) -> None:
        """Leaves the process group and its environment to flowtrain, which tears them down."""


class _OnFlowtrainWorker:
    """What both Ray strategies change in Lightning's: the device and the sampler's ranks."""

    @property
    def root_device(self) -> torch.device:
        """This worker's device, as ``trainers.torch.get_device()`` gives it."""
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Lightning's ``DistributedSampler`` covers all flowtrain workers, at this worker's rank."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}  # type: ignore[attr-defined]  # from the Lightning strategy this is mixed into


class RayDDPStrategy(_OnFlowtrainWorker, DDPStrategy):
    """Lightning's ``DDPStrategy`` on flowtrain's workers (same arguments).

    The process group's backend and timeout come from ``TorchConfig`` on the trainer, not from
    ``process_group_backend``/``timeout`` here: the group exists before Lightning starts.
    """


class RayFSDPStrategy(_OnFlowtrainWorker, FSDPStrategy):
    """Lightning's ``FSDPStrategy`` on flowtrain's workers (same arguments), on GPUs or CPUs.

    The default ``state_dict_type="full"`` gathers the whole model into rank 0's checkpoint, so
    ``LightningModule.load_from_checkpoint`` loads it without FSDP; ``"sharded"`` writes one
    shard per rank (all of them are kept in the reported checkpoint).

    On CPU workers the shards are exchanged over the gloo group the trainer set up (Lightning
    alone gives torch's FSDP no device for a CPU, and FSDP then refuses to start). There, wrap
    submodules with ``auto_wrap_policy`` rather than with ``torch.distributed.fsdp.wrap.wrap``
    inside ``configure_model``.
    """

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wraps the model in ``FullyShardedDataParallel``; on CPU, with the CPU as its device."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        already_wrapped = any(isinstance(module, FullyShardedDataParallel) for module in model.modules())
        if self.root_device.type != "cpu" or already_wrapped:
            return super()._setup_model(model)
        # Lightning passes device_id=None for a CPU device, and torch's FSDP then looks for an
        # accelerator and fails; naming the CPU makes it shard over gloo.
        model = FullyShardedDataParallel(
            module=model,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,
            **self.kwargs,
        )
        # Lightning's own step (metrics, activation checkpointing) on the wrapped model; its
        # auto_wrap_policy was applied above, so hide it rather than have Lightning warn and drop it.
        policy = self.kwargs.pop("auto_wrap_policy", None)
        try:
            return super()._setup_model(model)
        finally:
            if policy is not None:
                self.kwargs["auto_wrap_policy"] = policy

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The model's weights for a checkpoint; on CPU, the full ones gathered without a CPU copy."""
        if self.root_device.type != "cpu" or self._state_dict_type != "full":
            return super().lightning_module_state_dict()
        from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

        # Lightning asks FSDP to offload the gathered weights to the CPU; when they already are on
        # the CPU, torch frees the gathered storage before copying it out (a segfault in torch 2.13).
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        assert self.model is not None  # Lightning saves a checkpoint only once the model is set up
        with FullyShardedDataParallel.state_dict_type(self.model, StateDictType.FULL_STATE_DICT, config):
            return self.model.state_dict()


class RayDeepSpeedStrategy(_OnFlowtrainWorker, DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` (ZeRO stages, offloading) on flowtrain's workers (same
    arguments, e.g. ``RayDeepSpeedStrategy(stage=3)``), on GPUs or CPUs.

    DeepSpeed joins the process group flowtrain set up (gloo on CPU, where Lightning alone
    refuses to run DeepSpeed); its backend and timeout come from ``TorchConfig`` on the trainer.
    With ``RayTrainReportCallback`` every rank saves its part of the DeepSpeed checkpoint (a
    folder named ``checkpoint.ckpt``) on its own node, and the report merges the parts into one
    checkpoint; ``pl.Trainer.fit(ckpt_path=...)`` on that folder resumes, optimizer included.

    Raises:
        MissingExtraError: (an ``ImportError``) when built without the ``deepspeed`` package
            (``pip install 'flowtrain[deepspeed]'``), before training starts.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Lightning would only say "not available" once training starts; say what to install now.
        require("deepspeed", extra="deepspeed")
        super().__init__(*args, **kwargs)

    def setup_environment(self) -> None:
        """Joins DeepSpeed to the existing process group; on CPU too (Lightning allows CUDA only)."""
        if self.root_device.type == "cpu":
            DDPStrategy.setup_environment(self)
        else:
            super().setup_environment()

    def setup_distributed(self) -> None:
        """Lets DeepSpeed wrap the process group; on CPU skips Lightning's check of device indices
        (a CPU has none, which it reads as a wrong GPU selection)."""
        if self.root_device.type != "cpu":
            super().setup_distributed()
            return
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None
    ) -> tuple[Any, Any]:
        """``deepspeed.initialize`` on the model; on CPU without a device index (a CPU has none)."""
        if self.root_device.type != "cpu":
            return super()._setup_model_and_optimizer(model, optimizer, lr_scheduler)
        import deepspeed

        # Lightning passes the device's index (None on CPU); with no args DeepSpeed takes LOCAL_RANK.
        engine, deepspeed_optimizer, _, _ = deepspeed.initialize(
            config=self.config,
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, deepspeed_optimizer

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Every rank writes its part of the DeepSpeed checkpoint into ``filepath`` (a folder) on its
        own node, and flowtrain merges the ranks' folders (Lightning would have every rank write into
        rank 0's path, on another node a folder nobody reports). So every rank must get the same
        path (``RayTrainReportCallback`` does; ``ModelCheckpoint`` does with ``sync_dist=True`` metrics).
        """
        if storage_options is not None:
            raise TypeError(
                "RayDeepSpeedStrategy.save_checkpoint(storage_options=...): not supported, DeepSpeed "
                "writes its own files; pass storage_options=None."
            )
        # DeepSpeed saves the weights and optimizer state itself, sharded; the rest rides along.
        client_state = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        self.deepspeed_engine.save_checkpoint(
            filepath,
            client_state=client_state,
            tag="checkpoint",
            exclude_frozen_parameters=self.exclude_frozen_parameters,
        )


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Check ``trainer`` is set up for flowtrain and return it.

    It must use ``RayDDPStrategy``, ``RayFSDPStrategy`` or ``RayDeepSpeedStrategy`` (or a subclass), with
    ``RayLightningEnvironment`` as its cluster environment (``pl.Trainer(strategy=RayDDPStrategy(),
    plugins=[RayLightningEnvironment()], ...)``; docs/frameworks.md has the whole example).

    Raises:
        TypeError: another strategy or cluster environment; Lightning would then start its own
            processes or process group.
    """
    strategy = trainer.strategy
    if not isinstance(strategy, (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)):
        raise TypeError(
            f"prepare_trainer: the trainer's strategy is {type(strategy).__name__}; use "
            "strategy=RayDDPStrategy(), RayFSDPStrategy() or RayDeepSpeedStrategy() from trainers.lightning."
        )
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise TypeError(
            f"prepare_trainer: the trainer's cluster environment is {type(environment).__name__}; "
            "pass plugins=[RayLightningEnvironment()] from trainers.lightning."
        )
    return trainer
