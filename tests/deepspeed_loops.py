"""DeepSpeed training functions for tests/test_deepspeed.py, in a module so Ray workers import
them by name. Each rank takes its half of every global batch of the same seeded data, so a
plain DDP run and the ZeRO stages compute the same thing up to float32 reduction order.
"""

from __future__ import annotations

import os
import signal
import tempfile

import torch

from trainers import Checkpoint, get_checkpoint, get_context, report

NUM_ROWS = 64
GLOBAL_BATCH = 16
LR = 0.05


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
        # torch's SGD under ZeRO: DeepSpeed's fused optimizers would need compiled ops.
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def compare_loop(config: dict) -> dict:
    """Trains ``steps`` steps with plain DDP, then ZeRO stages 1, 2 and 3, in the same workers.

    Returns (from every rank) each strategy's global-batch losses, DDP's final weights, and the
    environment DeepSpeed saw.
    """
    from trainers.torch import prepare_model

    steps = config["steps"]
    losses: dict[str, list[float]] = {"ddp": []}
    ddp = prepare_model(mlp())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
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
    report({"done": 1})
    from deepspeed.accelerator import get_accelerator

    return {
        "losses": losses,
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
