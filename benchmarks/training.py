"""Training throughput and memory: the same DDP MLP over the same 250k-row parquet data on 2 workers,
under flowtrain, ray.train and raw ``torch.multiprocessing`` + gloo.

Every implementation runs the identical loop body (plain DDP and a DistributedSampler, one torch
thread per worker, one metrics-only report per epoch); only who starts the processes and sets up
the process group differs. Measured: samples/s after the first epoch (steady state), seconds from
the call to the first training step, and the peak memory the run adds to the machine (the summed
proportional set size of every process involved, each counted by what it added since the run
began; see ``MemorySampler``).
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import threading
import time

from benchmarks.workloads import NUM_WORKERS, WORKLOADS, free_port, parquet_dataset

EPOCHS = 5
BATCH_SIZE = 512


def _train(rank: int, world_size: int, data_folder: str, out: str, report) -> None:
    """The loop every implementation runs on each worker (the process group is already up)."""
    import pandas as pd
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    frame = pd.read_parquet(data_folder)
    x = torch.tensor(frame[[f"x{i}" for i in range(8)]].to_numpy())
    y = torch.tensor(frame[["y"]].to_numpy())
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)
    model = DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(8, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 1),
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    first_step_at, epochs = None, []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        start, seen, loss = time.perf_counter(), 0, torch.zeros(())
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            seen += len(xb)
            if first_step_at is None:
                first_step_at = time.time()
        epochs.append([seen, time.perf_counter() - start])
        if report is not None:
            report({"epoch": epoch, "loss": loss.item()})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"first_step_at": first_step_at, "epochs": epochs}, f)


def loop_flowtrain(config):
    import trainers

    context = trainers.get_context()
    _train(context.get_world_rank(), context.get_world_size(), config["data"], config["out"], trainers.report)


def loop_ray(config):
    import ray.train

    context = ray.train.get_context()
    _train(context.get_world_rank(), context.get_world_size(), config["data"], config["out"], ray.train.report)


def _raw_process(rank, world_size, port, data, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        _train(rank, world_size, data, out, None)
    finally:
        dist.destroy_process_group()


class MemorySampler:
    """Samples, every ``interval_s``, the proportional set size (PSS) of this process, its
    descendants and (``include_ray``) every Ray process, and keeps the peak of what the run added.

    Added memory is counted per process: a process that existed at the start counts only its
    growth, a new one counts whole, and one that exits during the run (a previous run's worker
    still shutting down) counts nothing instead of a negative amount.

    Sampling is not free: one sample reads the memory map of every process, 20-30 ms of CPU; at 4
    samples/s that was about 9% of one core, taken from the training it measures. Memory plateaus once
    training runs, so one sample a second finds the same peak at a quarter of the cost.
    """

    def __init__(self, interval_s: float = 1.0, include_ray: bool = True) -> None:
        self.interval_s = interval_s
        self.include_ray = include_ray
        self.baseline = self._sizes()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _processes(self):
        import psutil

        me = psutil.Process()
        found = {me.pid: me}
        found.update({p.pid: p for p in me.children(recursive=True)})
        if not self.include_ray:
            return found.values()
        for process in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(process.info.get("cmdline") or [])
            if "ray::" in cmdline or "raylet" in cmdline or "gcs_server" in cmdline or "ray/_private" in cmdline:
                found[process.pid] = process
        return found.values()

    def _sizes(self) -> dict[int, int]:
        import psutil

        sizes = {}
        for process in self._processes():
            try:
                sizes[process.pid] = process.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return sizes

    def _added(self) -> int:
        return sum(size - self.baseline.get(pid, 0) for pid, size in self._sizes().items())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self._added())

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def added_mb(self) -> float:
        return self.peak / 2**20


def throughput(impl: str, storage: str, run: int) -> dict:
    """Steady samples/s (epochs after the first), seconds to the first step, and peak memory added."""
    data, out = parquet_dataset(), tempfile.mkdtemp()
    config = {"data": data, "out": out}
    started = time.time()
    # Raw torch uses no Ray, so Ray processes elsewhere on the machine are not counted against it.
    # The benchmark's own local Ray is this process's child and is counted for every side, which
    # is right for PSS: pages a new process shares with Ray's (the interpreter, libc) move part of
    # their size off Ray's processes, and only the sum over all of them shows what the run added.
    with MemorySampler(include_ray=impl != "raw") as memory:
        if impl == "flowtrain":
            from trainers import RunConfig, ScalingConfig
            from trainers.torch import TorchTrainer

            TorchTrainer(
                loop_flowtrain,
                train_loop_config=config,
                scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                run_config=RunConfig(name=f"throughput-{run}", storage_path=storage),
            ).fit()
        elif impl == "ray.train":
            from ray.train import RunConfig, ScalingConfig
            from ray.train.torch import TorchTrainer

            TorchTrainer(
                loop_ray,
                train_loop_config=config,
                scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                run_config=RunConfig(name=f"throughput-{run}", storage_path=storage),
            ).fit()
        else:
            import torch.multiprocessing as mp

            mp.spawn(_raw_process, args=(NUM_WORKERS, free_port(), data, out), nprocs=NUM_WORKERS, join=True)
    ranks = [json.loads(pathlib.Path(out, name).read_text()) for name in sorted(os.listdir(out))]
    steady_samples = sum(seen for r in ranks for seen, _ in r["epochs"][1:])
    steady_seconds = max(sum(s for _, s in r["epochs"][1:]) for r in ranks)
    return {
        "samples_per_s": steady_samples / steady_seconds,
        "first_step_s": max(r["first_step_at"] for r in ranks) - started,
        "peak_mem_mb": memory.added_mb,
    }


WORKLOADS["throughput"] = (throughput, ("flowtrain", "ray.train", "raw"))
