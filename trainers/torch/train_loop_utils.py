"""Helpers for a PyTorch training loop on flowtrain workers, as in ``ray.train.torch``.

``prepare_model`` moves the model to the worker's device and wraps it for data-parallel training;
``prepare_data_loader`` gives every worker its own part of the data and moves batches to the
device. With one worker (or ``num_workers=0``) they only move things to the device.
"""

from __future__ import annotations

import collections.abc
import os
import random
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from trainers import context as _context
from trainers._internal.session.data_position import DataPositions
from trainers._internal.session.worker_session import current_data_positions
from trainers.torch.amp import autocast_model, current_amp
from trainers.torch.devices import get_device
from trainers.torch.fsdp_options import apply_fsdp, plan_fsdp
from trainers.torch.sampler_position import PositionedLoader, PositionedSampler

PARALLEL_STRATEGIES = ("ddp", "fsdp", None)


def _world() -> tuple[int, int]:
    current = _context._current
    if current is None or not dist.is_available() or not dist.is_initialized():
        return 1, 0
    return current.world_size, current.world_rank


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and wrap it for data-parallel training.

    ``parallel_strategy="ddp"`` wraps in ``DistributedDataParallel``; ``"fsdp"`` shards it with
    torch's ``fully_shard`` (works on CPU over gloo too); ``None`` leaves it unwrapped. Nothing is
    wrapped when a single worker trains.

    ``parallel_strategy_kwargs`` go to ``DistributedDataParallel`` for "ddp". For "fsdp" they may
    be ``fully_shard``'s own (``mesh``, ``reshard_after_forward``, ``mp_policy``...) or, as in Ray
    Train, ``FullyShardedDataParallel``'s (``sharding_strategy``, ``auto_wrap_policy``,
    ``mixed_precision``, ...: ``trainers.torch.fsdp_options`` translates each to FSDP2, or raises
    ``ValueError`` naming one FSDP2 cannot honour).

    After ``accelerate(amp=True)`` the forward runs under ``torch.autocast``.

    To checkpoint a sharded model, either gather it on every rank with
    ``torch.distributed.checkpoint.state_dict.get_model_state_dict(model,
    options=StateDictOptions(full_state_dict=True, cpu_offload=True))`` (rank 0 receives the whole
    model and saves it), or save shards with ``torch.distributed.checkpoint.save`` into a folder
    per rank and have every rank ``report`` its folder: the files are merged into one checkpoint.
    """
    if parallel_strategy not in PARALLEL_STRATEGIES:
        raise ValueError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}): must be one of 'ddp', 'fsdp' or None."
        )
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
    if parallel_strategy == "fsdp":
        # Checked before the model moves, so a bad argument fails fast and on every rank alike.
        fsdp_plan = plan_fsdp(dict(parallel_strategy_kwargs or {}), device)
    if move_to_device:
        model = model.to(device)
    # Before any wrapper: DDP and fully_shard call the module's own forward, now under autocast.
    model = autocast_model(model)
    world_size, _ = _world()
    if world_size <= 1 or parallel_strategy is None:
        return model
    kwargs = dict(parallel_strategy_kwargs or {})
    if parallel_strategy == "ddp":
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device])
            kwargs.setdefault("output_device", device)
        return torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    return apply_fsdp(model, fsdp_plan, device)


class _DeviceLoader:
    """Wraps a DataLoader so every batch arrives on ``device``; keeps ``len``, ``sampler``, ``dataset``."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self._loader = loader
        self.device = device

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def _move(self, item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return item.to(self.device, non_blocking=self.device.type == "cuda")
        if isinstance(item, collections.abc.Mapping):
            return {k: self._move(v) for k, v in item.items()}
        if isinstance(item, tuple) and hasattr(item, "_fields"):
            return type(item)(*(self._move(v) for v in item))
        if isinstance(item, (list, tuple)):
            return type(item)(self._move(v) for v in item)
        return item

    def __iter__(self):
        return map(self._move, self._loader)


def prepare_data_loader(
    data_loader: DataLoader,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> DataLoader:
    """Give this worker its share of ``data_loader`` and move its batches to the worker's device.

    With several workers and no ``DistributedSampler`` yet, the loader is rebuilt with one
    (``shuffle`` kept: it shuffles when the loader did), so each worker sees a disjoint part.
    Call ``loader.sampler.set_epoch(epoch)`` each epoch for a new shuffle, as with plain DDP.

    With several workers the sampler's place in its epoch (the epoch set with ``set_epoch`` and
    the samples the loop received in it) is saved with every checkpoint, and after a restart the
    epoch resumes where the checkpoint left it, unless ``DataConfig(checkpoint_data_position=False)``.
    """
    current_amp()  # as in Ray Train: accelerate() must come before this
    world_size, rank = _world()
    loader = data_loader
    positions = current_data_positions() if world_size > 1 else None
    if add_dist_sampler and world_size > 1 and not isinstance(loader.sampler, DistributedSampler):
        loader = _with_distributed_sampler(loader, world_size, rank, positions)
    elif positions is not None and type(loader.sampler) is DistributedSampler:
        given = loader.sampler
        settings = {name: getattr(given, name) for name in ("num_replicas", "rank", "shuffle", "seed", "drop_last")}
        sampler = _sampler(loader.dataset, positions, **settings)
        sampler.set_epoch(given.epoch)
        loader = _rebuild(loader, sampler)
    device = get_device()
    if move_to_device and device.type != "cpu":
        return _DeviceLoader(loader, device)  # type: ignore[return-value]  # passes for the DataLoader, whose attributes it forwards (as in Ray Train)
    return loader


def _with_distributed_sampler(
    loader: DataLoader, world_size: int, rank: int, positions: DataPositions | None
) -> DataLoader:
    sampler = loader.sampler
    if not isinstance(sampler, (RandomSampler, SequentialSampler)):
        warnings.warn(
            f"prepare_data_loader: the loader's sampler {type(sampler).__name__} is replaced by a "
            "DistributedSampler; give it a DistributedSampler yourself to keep your sampling.",
            stacklevel=3,
        )
    if loader.batch_sampler is not None and type(loader.batch_sampler).__name__ != "BatchSampler":
        warnings.warn(
            f"prepare_data_loader: the custom batch_sampler {type(loader.batch_sampler).__name__} is "
            "replaced by batches of batch_size over a DistributedSampler.",
            stacklevel=3,
        )
    shuffle = isinstance(sampler, RandomSampler)
    generator = sampler.generator if isinstance(sampler, RandomSampler) else None
    seed = int(generator.initial_seed()) if generator is not None else 0
    distributed = _sampler(loader.dataset, positions, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)
    return _rebuild(loader, distributed)


def _sampler(dataset: Any, positions: DataPositions | None, **settings: Any) -> DistributedSampler[Any]:
    """A ``DistributedSampler``; one whose position is kept when ``positions`` keeps them."""
    if positions is None:
        return DistributedSampler(dataset, **settings)
    sampler: PositionedSampler = PositionedSampler(dataset, resume=positions.next_loader_start(), **settings)
    positions.add_loader(sampler)
    return sampler


def _rebuild(loader: DataLoader, sampler: DistributedSampler[Any]) -> DataLoader:
    """``loader`` with ``sampler`` instead of its own, every other setting kept."""
    kept = (
        "batch_size",
        "num_workers",
        "collate_fn",
        "pin_memory",
        "drop_last",
        "timeout",
        "worker_init_fn",
        "multiprocessing_context",
        "generator",
        "persistent_workers",
    )
    loader_class = PositionedLoader if isinstance(sampler, PositionedSampler) else DataLoader
    return loader_class(
        loader.dataset,
        sampler=sampler,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        **{name: getattr(loader, name) for name in kept},
    )


def enable_reproducibility(seed: int = 0) -> None:
    """Make training repeatable: seed torch, numpy and random, and pick deterministic kernels.

    Call it at the top of the training function. Deterministic kernels can be slower, and data
    loader workers need their own seeding (``worker_init_fn``).
    """
    import numpy as np

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # cuBLAS needs a fixed workspace to be deterministic on CUDA >= 10.2.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
