"""Training functions the tests run on workers (a module, so workers import it by name)."""

from __future__ import annotations

import os
import tempfile

import trainers
from trainers import Checkpoint, get_checkpoint, get_context, report

GLOBAL_BATCH = 16
NUM_ROWS = 128


def dataset(seed: int = 0):
    """A small seeded regression problem: y = x @ w + noise."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_ROWS, 4, generator=generator)
    w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    y = x @ w + 0.1 * torch.randn(NUM_ROWS, 1, generator=generator)
    return x, y


def linear_ddp_loop(config: dict) -> dict:
    """DDP over a fixed global batch: each rank takes every world_size-th row of each batch.

    With gradients averaged by DDP this is the same computation as one process on the whole
    global batch, so the final weights must match a single-process run.
    """
    import torch

    from trainers.torch import prepare_model

    context = get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(config.get("seed", 0))
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.05))
    x, y = dataset()
    step = 0
    for epoch in range(config.get("epochs", 2)):
        for start in range(0, NUM_ROWS, GLOBAL_BATCH):
            xb, yb = x[start : start + GLOBAL_BATCH][rank::size], y[start : start + GLOBAL_BATCH][rank::size]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            report(
                {
                    "epoch": epoch,
                    "step": step,
                    "loss": loss.item(),
                    "world_rank": rank,
                    "local_rank": context.get_local_rank(),
                    "node_rank": context.get_node_rank(),
                    "env_rank": int(os.environ.get("RANK", "0")),
                    "dist_rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
                }
            )
            step += 1
    module = getattr(model, "module", model)
    return {name: tensor.detach().tolist() for name, tensor in module.state_dict().items()}


def resume_after_checkpoint(file_name: str) -> int:
    """Where a resumed loop starts: one past the number stored in ``file_name`` of the checkpoint
    ``get_checkpoint()`` gives, or 0 when there is none."""
    checkpoint = get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as folder:
        with open(os.path.join(folder, file_name)) as f:
            return int(f.read()) + 1


def checkpointing_loop(config: dict) -> None:
    """Counts steps, checkpointing every ``every`` steps; resumes from get_checkpoint(). With
    ``report_where``, every report also names the rank's process and node ("pid", "node"). An
    attempt that starts when the file ``steps_file`` exists reads how many steps to count there."""
    start = resume_after_checkpoint("step.txt")
    steps = config["steps"]
    if config.get("steps_file") and os.path.exists(config["steps_file"]):
        with open(config["steps_file"]) as f:
            steps = int(f.read())
    rank = get_context().get_world_rank()
    where = {}
    if config.get("report_where"):
        import ray

        where = {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}
    for step in range(start, steps):
        if config.get("sleep_s"):
            import time

            time.sleep(config["sleep_s"])
        if config.get("fail_at") == step and rank == config.get("fail_rank", 0):
            marker = config["fail_marker"]
            if not os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError(f"injected failure at step {step}")
        if step % config.get("every", 1) == 0 and rank == 0:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "step.txt"), "w") as f:
                    f.write(str(step))
                report(
                    {"step": step, "score": config.get("scores", {}).get(step, step), **where},
                    checkpoint=Checkpoint.from_directory(folder),
                    checkpoint_upload_mode=config.get("upload_mode", trainers.CheckpointUploadMode.SYNC),
                )
        else:
            report({"step": step, "score": config.get("scores", {}).get(step, step), **where})


def failing_loop(config: dict) -> None:
    rank = get_context().get_world_rank()
    report({"step": 0})
    if rank == config["rank"]:
        raise ValueError(f"bad value on rank {rank}")
    report({"step": 1})


def no_arg_loop():
    report({"ok": 1})
    return "no-arg"


def sees_no_package_trainers():
    return trainers.__name__


def resumable_ddp_loop(config: dict) -> dict:
    """DDP training that checkpoints model and optimizer every step and resumes from get_checkpoint().

    ``kill_at`` makes rank ``kill_rank`` SIGKILL its own process: once when a ``marker`` file is
    given (it remembers the kill), in every attempt otherwise.
    """
    import signal

    import torch

    from trainers.torch import prepare_model

    context = get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
    x, y = dataset()
    for step in range(start, config["steps"]):
        if step == config.get("kill_at") and rank == config.get("kill_rank", 1):
            marker = config.get("marker")
            if marker is None or not os.path.exists(marker):
                if marker is not None:
                    open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        batch = slice((step * GLOBAL_BATCH) % NUM_ROWS, (step * GLOBAL_BATCH) % NUM_ROWS + GLOBAL_BATCH)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[batch][rank::size]), y[batch][rank::size])
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as folder:
            saved = None
            if rank == 0:
                module = getattr(model, "module", model)
                torch.save(
                    {"model": module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                    os.path.join(folder, "state.pt"),
                )
                saved = Checkpoint.from_directory(folder)
            report({"step": step, "loss": loss.item(), "attempt_pid": os.getpid()}, checkpoint=saved)
    module = getattr(model, "module", model)
    return {name: tensor.detach().tolist() for name, tensor in module.state_dict().items()}


def hang_loop(config: dict) -> None:
    """Rank ``sleeper`` dawdles before an all-reduce; the others wait in it until the timeout."""
    import time

    import torch
    import torch.distributed as dist

    report({"step": 0})
    if get_context().get_world_rank() == config["sleeper"]:
        time.sleep(config["sleep_s"])
    dist.all_reduce(torch.ones(1))
    report({"step": 1})


def stuck_rank_loop(config: dict) -> None:
    """Rank ``stuck`` stops reporting after step 0 (no collective involved)."""
    import time

    report({"step": 0})
    if get_context().get_world_rank() == config["stuck"]:
        time.sleep(config["sleep_s"])
    report({"step": 1})


def endless_loop(config: dict) -> None:
    """Reports forever. Every rank writes ``rank<r>.pid`` (its pid) to ``pid_dir`` first, and
    ``rank<r>.reporting`` once its first ``report()`` returned; each file appears whole."""
    import time

    def publish(name: str, text: str) -> None:
        path = os.path.join(config["pid_dir"], f"rank{get_context().get_world_rank()}.{name}")
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)  # a reader never sees a half-written file

    publish("pid", str(os.getpid()))
    step = 0
    while True:
        report({"step": step})
        if step == 0:
            publish("reporting", "")
        step += 1
        time.sleep(0.1)


def collect_ids_loop(config: dict) -> None:
    """One epoch over this rank's shard of "train": reports the ids it saw.

    With ``fail_marker``, rank 1 dies half way through its shard once (the marker remembers).
    """
    shard = trainers.get_dataset_shard("train")
    ids = []
    for batch in shard.iter_batches(batch_size=64, batch_format="numpy"):
        ids.extend(int(i) for i in batch["id"])
        marker = config.get("fail_marker") if config else None
        if marker and get_context().get_world_rank() == 1 and len(ids) >= 200 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected failure mid-epoch")
    report({"ids": ids, "count": len(ids)})


def ray_data_regression_loop(config: dict) -> float:
    """Linear regression over iter_torch_batches; returns the last epoch's mean loss."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    shard = trainers.get_dataset_shard("train")
    mean = 0.0
    for epoch in range(config["epochs"]):
        total, rows = 0.0, 0
        for batch in shard.iter_torch_batches(batch_size=32, dtypes=torch.float32):
            x = torch.stack([batch[f"x{i}"] for i in range(4)], dim=1)
            y = batch["y"].unsqueeze(1)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            rows += len(y)
        mean = total / rows
        report({"epoch": epoch, "loss": mean})
    return mean


def ask_for_unknown_dataset(config: dict) -> None:
    trainers.get_dataset_shard("valid")


def reused_folder_async_loop(config: dict) -> None:
    """Every epoch's checkpoint written into one folder per rank and reported ASYNC with the
    default deletion, the way a loop that keeps one ``ckpt/`` folder does. On odd epochs the loop
    waits for the previous checkpoint's commit after writing its files and before reporting
    them: the moment an upload that deleted the reported folder once it finished would delete
    this epoch's files instead."""
    rank = get_context().get_world_rank()
    folder = os.path.join(config["scratch"], f"rank{rank}")
    os.makedirs(folder, exist_ok=True)  # once, as such loops do
    for epoch in range(config["epochs"]):
        with open(os.path.join(folder, f"weights_rank{rank}.txt"), "w") as f:
            f.write(str(epoch))
        with open(os.path.join(folder, f"epoch_{epoch}_rank{rank}.txt"), "w") as f:
            f.write(str(epoch))
        if epoch % 2:
            trainers.get_all_reported_checkpoints(trainers.CheckpointConsistencyMode.COMMITTED)
        report(
            {"epoch": epoch},
            checkpoint=Checkpoint.from_directory(folder),
            checkpoint_upload_mode=trainers.CheckpointUploadMode.ASYNC,
        )
