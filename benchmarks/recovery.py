"""Recovery of a short run: a rank that exits at the start of epoch 3, to the first step after.

The run a user would write: N workers train a small DDP model from a torch ``DataLoader`` (with
``prepare_model`` and ``prepare_data_loader``) for 6 epochs of about 2.5 s, a checkpoint each
epoch, ``FailureConfig(max_failures=1)``. In the first attempt only, rank 1 calls ``os._exit(1)``
at the start of epoch 3. Measured: seconds from that exit to the end of the first optimizer step
after the resume (rank 0's, which the all-reduce in its backward pass ties to every rank's), under
flowtrain and ``ray.train`` in the same run, on 2 workers (``recovery_epochs``) and on 8
(``recovery_epochs_8``, half a CPU each, the data split 8 ways: the same work per epoch).
"""

from __future__ import annotations

import os
import pathlib
import statistics
import tempfile
import time
import types

from benchmarks.workloads import WORKLOADS

EPOCHS = 6
KILLED_AT_EPOCH = 3
#: Samples in the whole dataset: about 2.5 s an epoch on 2 workers of a 2-core machine.
SAMPLES = 180_000
BATCH_SIZE = 64


def _loop(api: types.SimpleNamespace, marker_dir: str) -> None:
    """Run on every worker under either trainer; ``api`` holds that trainer's functions."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    features = torch.randn(SAMPLES, 32)
    labels = (features.sum(dim=1) > 0).long()
    model = api.prepare_model(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))
    loader = api.prepare_data_loader(DataLoader(TensorDataset(features, labels), batch_size=BATCH_SIZE, shuffle=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rank = api.get_context().get_world_rank()
    start, resumed = 0, False
    checkpoint = api.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, resumed = state["epoch"] + 1, True
    killed = os.path.join(marker_dir, "killed.txt")
    for epoch in range(start, EPOCHS):
        if epoch == KILLED_AT_EPOCH and rank == 1 and not os.path.exists(killed):
            pathlib.Path(killed).write_text(repr(time.time()))
            os._exit(1)
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        total = 0.0
        for features_batch, labels_batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(features_batch), labels_batch)
            loss.backward()
            optimizer.step()
            total += float(loss)
            if resumed and rank == 0:
                pathlib.Path(marker_dir, "resumed.txt").write_text(f"{time.time()!r},{epoch}")
                resumed = False
        if rank == 0:
            with open(os.path.join(marker_dir, "epochs.txt"), "a") as ends:
                ends.write(f"{time.time()!r}\n")
        with tempfile.TemporaryDirectory() as folder:
            saved = None
            if rank == 0:
                torch.save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                    os.path.join(folder, "state.pt"),
                )
                saved = api.Checkpoint.from_directory(folder)
            api.report({"epoch": epoch, "loss": total}, checkpoint=saved)


def _api(train: types.ModuleType, torch_module: types.ModuleType) -> types.SimpleNamespace:
    names = ("report", "get_checkpoint", "get_context", "Checkpoint")
    return types.SimpleNamespace(
        **{name: getattr(train, name) for name in names},
        prepare_model=torch_module.prepare_model,
        prepare_data_loader=torch_module.prepare_data_loader,
    )


def flowtrain_loop(config: dict) -> None:
    import trainers
    import trainers.torch

    _loop(_api(trainers, trainers.torch), config["dir"])


def ray_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch

    _loop(_api(ray.train, ray.train.torch), config["dir"])


def recover(impl: str, storage: str, run: int, workers: int) -> dict:
    """One run of the job under ``impl`` (``flowtrain_no_spare``: flowtrain with
    ``FLOWTRAIN_SPARE_WORKERS=0``); the seconds from the exit to the first step after it."""
    marker_dir = tempfile.mkdtemp(prefix="flowtrain-recovery-")
    spares = os.environ.pop("FLOWTRAIN_SPARE_WORKERS", None)
    if impl == "flowtrain_no_spare":
        os.environ["FLOWTRAIN_SPARE_WORKERS"] = "0"
    try:
        return _recover(impl, storage, run, workers, marker_dir)
    finally:
        os.environ.pop("FLOWTRAIN_SPARE_WORKERS", None)
        if spares is not None:
            os.environ["FLOWTRAIN_SPARE_WORKERS"] = spares


def _recover(impl: str, storage: str, run: int, workers: int, marker_dir: str) -> dict:
    if impl.startswith("flowtrain"):
        from trainers import FailureConfig, RunConfig, ScalingConfig
        from trainers.torch import TorchTrainer

        loop = flowtrain_loop
    else:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        loop = ray_loop
    started = time.time()
    TorchTrainer(
        loop,
        train_loop_config={"dir": marker_dir},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": min(1.0, 4 / workers)}),
        run_config=RunConfig(
            name=f"recovery-epochs-{impl}-{workers}-{run}",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()
    run_s = time.time() - started
    killed = float(pathlib.Path(marker_dir, "killed.txt").read_text())
    resumed_at, resumed_epoch = pathlib.Path(marker_dir, "resumed.txt").read_text().split(",")
    ends = [float(line) for line in pathlib.Path(marker_dir, "epochs.txt").read_text().split()]
    return {
        "recovery_s": float(resumed_at) - killed,
        "resumed_epoch": float(resumed_epoch),
        # Rank 0's epochs that no restart interrupted: what training costs around the recovery.
        "epoch_s": statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False) if not a < killed < b),
        "run_s": run_s,
    }


def recovery_epochs(impl: str, storage: str, run: int) -> dict:
    return recover(impl, storage, run, workers=2)


def recovery_epochs_8(impl: str, storage: str, run: int) -> dict:
    return recover(impl, storage, run, workers=8)


WORKLOADS["recovery_epochs"] = (recovery_epochs, ("flowtrain", "ray.train", "flowtrain_no_spare"))
WORKLOADS["recovery_epochs_8"] = (recovery_epochs_8, ("flowtrain", "ray.train", "flowtrain_no_spare"))
