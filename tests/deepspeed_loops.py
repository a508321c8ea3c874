"""Training functions for the rest of the torch family (tests/test_deepspeed.py,
test_fsdp_lightning.py, test_fsdp.py's FSDP1-style kwargs, test_framework_parity.py's XLA
backend), in a module so Ray workers import them by name. Each rank takes its half of every
global batch of the same seeded data, so plain DDP, the ZeRO stages and FSDP compute the same
thing up to float32 reduction order.
"""

from __future__ import annotations

import functools
import os
import signal
import tempfile

import torch

from trainers import Checkpoint, get_checkpoint, get_context, report

NUM_ROWS = 64
GLOBAL_BATCH = 16
LR = 0.1
MOMENTUM = 0.5  # optimizer state that a resumed run must restore


def mlp() -> torch.nn.Module:
    """A small MLP with the same initial weights on every rank (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """y = x @ w + noise, seeded: every rank builds the same tensors."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_ROWS, 4, generator=generator)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(NUM_ROWS, 1, generator=generator)


def my_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's half of global batch ``step``."""
    context = get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    x, y = data()
    start = (step * GLOBAL_BATCH) % NUM_ROWS
    return x[start : start + GLOBAL_BATCH][rank::size], y[start : start + GLOBAL_BATCH][rank::size]


def global_mean(value: torch.Tensor) -> float:
    """The mean of ``value`` over all ranks: the loss of the whole global batch."""
    import torch.distributed as dist

    value = value.detach().clone()
    dist.all_reduce(value)
    return value.item() / dist.get_world_size()


def zero_engine(stage: int):
    """``deepspeed.initialize`` over the process group TorchTrainer set up, with plain SGD."""
    import deepspeed

    model = mlp()
    config = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // get_context().get_world_size(),
        "zero_optimization": {"stage": stage},
        # DeepSpeed clips gradients to norm 1.0 unless told otherwise; DDP does not clip.
        "gradient_clipping": 0.0,
        # torch's SGD under ZeRO: DeepSpeed's fused optimizers would need compiled ops.
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def shm_all_reduce() -> dict:
    """Sums each rank's ``rank + 1`` with DeepSpeed's CPU shared-memory all-reduce, the op
    ``make install`` compiles (``deepspeed.initialize`` loaded it). Returns where the op was loaded
    from, the vector kernel level it runs at (0: it falls back to the process group) and the sums."""
    import deepspeed.comm as ds_comm
    from deepspeed.comm import comm as ds_state

    backend = ds_state.cdb
    tensor = torch.full((4096,), float(get_context().get_world_rank() + 1))
    summed = ds_comm.inference_all_reduce(tensor)
    return {
        "module": getattr(backend.shm_comm_op, "__file__", None),
        "kernel_level": getattr(backend, "shm_vector_kernel_level", 0),
        "sums": sorted(set(summed.tolist())),
    }


def compare_loop(config: dict) -> dict:
    """Trains ``steps`` steps with plain DDP, then ZeRO stages 1, 2 and 3, in the same workers.

    Returns (from every rank) each strategy's global-batch losses, DDP's final weights, and the
    environment DeepSpeed saw.
    """
    from trainers.torch import prepare_model

    steps = config["steps"]
    losses: dict[str, list[float]] = {"ddp": []}
    ddp = prepare_model(mlp())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(steps):
        x, y = my_batch(step)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses["ddp"].append(global_mean(loss))
    for stage in config["stages"]:
        engine = zero_engine(stage)
        losses[f"zero{stage}"] = []
        for step in range(steps):
            x, y = my_batch(step)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses[f"zero{stage}"].append(global_mean(loss))
        engine.destroy()
    shm = shm_all_reduce()
    report({"done": 1})
    from deepspeed.accelerator import get_accelerator

    return {
        "losses": losses,
        "shm": shm,
        "ddp_weights": {name: value.tolist() for name, value in ddp.module.state_dict().items()},
        "accelerator": get_accelerator().device_name(),
        "env": {name: os.environ.get(name) for name in ("DS_ACCELERATOR", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")},
    }


def resumable_zero_loop(config: dict) -> dict:
    """ZeRO-``stage`` training that saves a DeepSpeed checkpoint every step (every rank writes its
    part; the report merges them into one checkpoint) and resumes from ``get_checkpoint()``.

    At step ``kill_at`` rank ``kill_rank`` SIGKILLs its own process, once (``marker`` remembers).
    Each report carries the engine's optimizer step count (``global_steps``) after the step.
    """
    engine = zero_engine(config["stage"])
    rank = get_context().get_world_rank()
    start = 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            _, client_state = engine.load_checkpoint(folder)
        start = client_state["step"] + 1
    for step in range(start, config["steps"]):
        if step == config["kill_at"] and rank == config["kill_rank"] and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = my_batch(step)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        with tempfile.TemporaryDirectory() as folder:
            engine.save_checkpoint(folder, tag=f"step{step}", client_state={"step": step})
            report(
                {"step": step, "loss": global_mean(loss), "global_steps": engine.global_steps},
                checkpoint=Checkpoint.from_directory(folder),
            )
    return {"global_steps": engine.global_steps}


@functools.cache
def lightning_regressor():
    """A LightningModule class with SGD momentum (optimizer state to save and restore); built on
    first use so other tests never import Lightning."""
    import lightning.pytorch as pl

    class MomentumRegressor(pl.LightningModule):
        def __init__(self, lr: float = LR) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=MOMENTUM)

    MomentumRegressor.__qualname__ = "MomentumRegressor"
    return MomentumRegressor


def lightning_sharded_loop(config: dict) -> dict:
    """Lightning on CPU workers with ``RayDeepSpeedStrategy(stage=...)`` or ``RayFSDPStrategy()``
    (``config["strategy"]``): ``epochs`` epochs reported through ``RayTrainReportCallback``, then
    one more epoch in a new ``pl.Trainer`` resumed from ``get_checkpoint()``.

    Returns the files of the first checkpoint each rank saw and the resumed trainer's state.
    """
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from trainers.lightning import (
        RayDeepSpeedStrategy,
        RayFSDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    def trainer(epochs: int) -> pl.Trainer:
        if config["strategy"] == "deepspeed":
            strategy = RayDeepSpeedStrategy(stage=config["stage"])
        else:
            strategy = RayFSDPStrategy()
        return prepare_trainer(
            pl.Trainer(
                max_epochs=epochs,
                strategy=strategy,
                plugins=[RayLightningEnvironment()],
                callbacks=[RayTrainReportCallback()],
                accelerator="cpu",
                devices="auto",
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                default_root_dir=tempfile.mkdtemp(prefix="lightning-root-"),
            )
        )

    x, y = data()
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // 2, shuffle=False)
    torch.manual_seed(0)
    trainer(config["epochs"]).fit(lightning_regressor()(lr=LR), train_dataloaders=loader)
    # A rank that saved nothing (FSDP's full state dict is rank 0's file) keeps no checkpoint of
    # its own, as in Ray Train: take rank 0's, the run's latest.
    import torch.distributed as dist

    latest = [get_checkpoint()]
    dist.broadcast_object_list(latest, src=0)
    with latest[0].as_directory() as folder:
        files = sorted(
            os.path.relpath(os.path.join(root, name), folder) for root, _, names in os.walk(folder) for name in names
        )
        resumed = trainer(config["epochs"] + 1)
        torch.manual_seed(1)  # different initial weights: only the checkpoint makes the losses continue
        resumed.fit(
            lightning_regressor()(lr=LR),
            train_dataloaders=loader,
            ckpt_path=os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME),
        )
    return {"files": files, "global_step": resumed.global_step, "epoch": resumed.current_epoch}


def fsdp_kwargs_loop(config: dict) -> dict:
    """Plain DDP, then ``prepare_model(parallel_strategy="fsdp", parallel_strategy_kwargs=...)`` for
    each ``(name, kwargs)`` in ``config["variants"]`` (Ray's FSDP1-style arguments), same data.

    Rank 1 starts from different weights when the kwargs ask for ``sync_module_states``: only the
    broadcast from rank 0 makes it train like DDP. Returns each variant's losses and how many
    submodules were sharded on their own.
    """
    from torch.distributed.fsdp import FSDPModule

    from trainers.torch import prepare_model

    rank = get_context().get_world_rank()

    def train(model: torch.nn.Module) -> list[float]:
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        losses = []
        for step in range(config["steps"]):
            x, y = my_batch(step)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(global_mean(loss))
        return losses

    result = {"losses": {"ddp": train(prepare_model(mlp()))}, "sharded_submodules": {}}
    for name, kwargs in config["variants"]:
        model = mlp()
        if kwargs.get("sync_module_states") and rank == 1:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(1.0)
        model = prepare_model(model, parallel_strategy="fsdp", parallel_strategy_kwargs=kwargs)
        result["sharded_submodules"][name] = sum(isinstance(m, FSDPModule) for m in model.modules() if m is not model)
        result["losses"][name] = train(model)
    report({"done": 1})
    return result


#: The variables TorchXLAConfig's backend sets (besides those every flowtrain worker has).
XLA_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_RANK",
    "FI_PROVIDER",
    "FI_EFA_USE_DEVICE_RDMA",
    "FI_EFA_FORK_SAFE",
    "XLA_TRANSFER_SEED_ASYNC",
    "NCCL_ASYNC_ERROR_HANDLING",
    "NEURON_PARALLEL_COMPILE",
    "PJRT_DEVICE",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
)


def xla_env_loop() -> dict:
    """What a worker of a TorchXLAConfig run sees: its XLA/torch elastic environment, the process
    group's backend, and the sum over ranks of (rank + 1) computed through that group."""
    import torch.distributed as dist

    value = torch.tensor([float(get_context().get_world_rank() + 1)])
    dist.all_reduce(value)
    report({"done": 1})
    return {"env": {name: os.environ.get(name) for name in XLA_ENV}, "backend": dist.get_backend(), "sum": value.item()}
