"""The benchmark workloads, each written once per implementation: flowtrain, ray.train, raw torch.

Every function runs one measurement and returns a dict of numbers. Same work, same worker count,
same threads per worker for every implementation.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUM_WORKERS = 2
NUM_REPORTS = 200
#: ray.train's report() waits on its controller's 2 s poll: 200 calls would take ~7 min per
#: repetition, so it is timed over fewer calls (the per-call figure is what is compared).
NUM_REPORTS_RAY = 20


# -- training functions (run on the workers) --------------------------------------------------


def report_once_flowtrain():
    import trainers

    trainers.report({"done": 1})


def report_once_ray():
    import ray.train

    ray.train.report({"done": 1})


def _timed_reports(report, count=NUM_REPORTS):
    durations = []
    for i in range(count):
        start = time.perf_counter()
        report({"i": i})
        durations.append(time.perf_counter() - start)
    return durations


def report_loop_flowtrain():
    import trainers

    durations = _timed_reports(trainers.report)
    if trainers.get_context().get_world_rank() == 0:
        return durations


def report_loop_ray(config):
    import ray.train

    durations = _timed_reports(ray.train.report, NUM_REPORTS_RAY)
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            f.write(",".join(str(d) for d in durations))


# -- drivers --------------------------------------------------------------------------------------


def _flowtrain_fit(loop, storage, name):
    from trainers import RunConfig, ScalingConfig
    from trainers.torch import TorchTrainer

    return TorchTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
        run_config=RunConfig(name=name, storage_path=storage),
    ).fit()


def _ray_fit(loop, storage, name, config=None):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    return TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
        run_config=RunConfig(name=name, storage_path=storage),
    ).fit()


def _raw_worker(rank, world_size, port):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for the raw peers' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_trivial_job(impl: str, storage: str, name: str) -> None:
    """The start-up workload's job: 2 workers that report once (raw torch: join gloo, one barrier)."""
    if impl == "flowtrain":
        _flowtrain_fit(report_once_flowtrain, storage, name)
    elif impl == "ray.train":
        _ray_fit(report_once_ray, storage, name)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_raw_worker, args=(NUM_WORKERS, free_port()), nprocs=NUM_WORKERS, join=True)


def startup(impl: str, storage: str, run: int) -> dict:
    """The first trivial 2-worker run of a fresh process (Ray already started in it), and the
    peak PSS of its process tree (``benchmarks.startup``, in a process of its own)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.startup", impl],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.startup {impl} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))


def report_latency(impl: str, storage: str, run: int) -> dict:
    """Mean and p99 of a metrics-only report() on rank 0, over 200 calls."""
    if impl == "flowtrain":
        durations = _flowtrain_fit(report_loop_flowtrain, storage, f"report-{run}").return_value
    elif impl == "ray.train":
        out = os.path.join(tempfile.mkdtemp(), "durations.txt")
        _ray_fit(report_loop_ray, storage, f"report-{run}", config={"out": out})
        durations = [float(v) for v in pathlib.Path(out).read_text().split(",")]
    else:
        return {}
    durations = sorted(durations)
    return {
        "mean_ms": 1000 * sum(durations) / len(durations),
        "p99_ms": 1000 * durations[int(0.99 * (len(durations) - 1))],
    }


WORKLOADS = {
    "startup": (startup, ("flowtrain", "ray.train", "raw")),
    "report_latency": (report_latency, ("flowtrain", "ray.train")),
}
#: Workloads a default run leaves out because they are long; ``--only`` names them.
OPT_IN: set[str] = set()
#: Workloads that measure in processes of their own: the harness starts no Ray and runs no
#: warm-up for them.
OWN_PROCESS = {"startup"}


# -- Ray Data ingestion -------------------------------------------------------------------------

DATA_ROWS = 250_000


@functools.cache
def parquet_dataset() -> str:
    """A 250k-row parquet folder (8 float features and a label), written once per benchmark run."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tempfile.mkdtemp(prefix="flowtrain-bench-data-")
    rng = np.random.default_rng(0)
    per_file = DATA_ROWS // 8
    for part in range(8):
        columns = {f"x{i}": rng.standard_normal(per_file).astype("float32") for i in range(8)}
        columns["y"] = rng.standard_normal(per_file).astype("float32")
        pq.write_table(pa.table(columns), os.path.join(folder, f"part-{part}.parquet"))
    return folder


def _consume(shard, out_dir, rank):
    """One epoch of iter_torch_batches with a token of compute per batch; writes the rows, the
    seconds of the epoch, the seconds to its first batch and the wall-clock time it ended."""
    start = time.perf_counter()
    rows = 0
    first_batch_s = None
    for batch in shard.iter_torch_batches(batch_size=1024):
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - start
        batch["y"].sum()  # touch the data as a training step would
        rows += len(batch["y"])
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(f"{rows},{time.perf_counter() - start},{first_batch_s},{time.time()}")


def ingest_flowtrain(config):
    import trainers

    _consume(trainers.get_dataset_shard("train"), config["out"], trainers.get_context().get_world_rank())


def ingest_ray(config):
    import ray.train

    _consume(ray.train.get_dataset_shard("train"), config["out"], ray.train.get_context().get_world_rank())


def ray_data_throughput(impl: str, storage: str, run: int) -> dict:
    """Rows per second through ``iter_torch_batches`` on 2 workers (whole dataset / slowest rank),
    with the time to the first batch, and the seconds from calling ``fit()`` to the end of the
    slower rank's epoch: what reading earlier saves shows there, not only in the rate."""
    import ray.data

    out = tempfile.mkdtemp()
    dataset = ray.data.read_parquet(parquet_dataset())
    config = {"out": out}
    called = time.time()
    if impl == "flowtrain":
        from trainers import RunConfig, ScalingConfig
        from trainers.torch import TorchTrainer

        TorchTrainer(
            ingest_flowtrain,
            train_loop_config=config,
            datasets={"train": dataset},
            scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
            run_config=RunConfig(name=f"ingest-{run}", storage_path=storage),
        ).fit()
    else:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        TorchTrainer(
            ingest_ray,
            train_loop_config=config,
            datasets={"train": dataset},
            scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
            run_config=RunConfig(name=f"ingest-{run}", storage_path=storage),
        ).fit()
    fit_s = time.time() - called
    results = [[float(v) for v in pathlib.Path(out, name).read_text().split(",")] for name in sorted(os.listdir(out))]
    rows = sum(r[0] for r in results)
    return {
        "rows_per_s": rows / max(r[1] for r in results),
        "rows": rows,
        "first_batch_s": max(r[2] for r in results),
        "call_to_epoch_end_s": max(r[3] for r in results) - called,
        "fit_s": fit_s,
    }


WORKLOADS["ray_data"] = (ray_data_throughput, ("flowtrain", "ray.train"))


# -- checkpoint blocking time -------------------------------------------------------------------

NUM_CHECKPOINTS = 10


def _state():
    """An MLP's weights, about 8 MB."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    return model.state_dict()


def _timed_checkpoint_reports(report, checkpoint_cls, rank):
    """Seconds each report(metrics, checkpoint) call blocks; the save itself is not counted."""
    import torch

    state, durations = _state(), []
    for i in range(NUM_CHECKPOINTS):
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                torch.save(state, os.path.join(folder, "model.pt"))
                checkpoint = checkpoint_cls.from_directory(folder)
            start = time.perf_counter()
            report({"i": i}, checkpoint=checkpoint)
            durations.append(time.perf_counter() - start)
    return durations


def checkpoint_loop_flowtrain():
    import trainers

    rank = trainers.get_context().get_world_rank()
    durations = _timed_checkpoint_reports(trainers.report, trainers.Checkpoint, rank)
    return durations if rank == 0 else None


def checkpoint_loop_ray(config):
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    durations = _timed_checkpoint_reports(ray.train.report, ray.train.Checkpoint, rank)
    if rank == 0:
        with open(config["out"], "w") as f:
            f.write(",".join(map(str, durations)))


def checkpoint_blocking(impl: str, storage: str, run: int) -> dict:
    """Median seconds report() with an 8 MB checkpoint blocks rank 0; raw: torch.save to local disk."""
    import statistics

    if impl == "flowtrain":
        durations = _flowtrain_fit(checkpoint_loop_flowtrain, storage, f"ckpt-{run}").return_value
    elif impl == "ray.train":
        out = os.path.join(tempfile.mkdtemp(), "durations.txt")
        _ray_fit(checkpoint_loop_ray, storage, f"ckpt-{run}", config={"out": out})
        durations = [float(v) for v in pathlib.Path(out).read_text().split(",")]
    else:
        import torch

        state, durations = _state(), []
        for _ in range(NUM_CHECKPOINTS):
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                torch.save(state, os.path.join(folder, "model.pt"))
                durations.append(time.perf_counter() - start)
    return {"blocked_ms": 1000 * statistics.median(durations)}


WORKLOADS["checkpoint_blocking"] = (checkpoint_blocking, ("flowtrain", "ray.train", "raw"))


# -- recovery after a killed rank ---------------------------------------------------------------


def _recovering_loop(report, get_checkpoint, checkpoint_cls, rank, marker_dir):
    """Checkpoints every step; rank 1 SIGKILLs itself at step 5 once, writing the kill time first.
    The first step after the restart writes its time too."""
    import signal

    start = 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            start = int(pathlib.Path(folder, "step.txt").read_text()) + 1
        if rank == 0:
            with open(os.path.join(marker_dir, "resumed.txt"), "w") as f:
                f.write(f"{time.time()},{start}")
    for step in range(start, 10):
        if step == 5 and rank == 1 and not os.path.exists(os.path.join(marker_dir, "killed.txt")):
            with open(os.path.join(marker_dir, "killed.txt"), "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)
        with tempfile.TemporaryDirectory() as folder:
            saved = None
            if rank == 0:
                with open(os.path.join(folder, "step.txt"), "w") as f:
                    f.write(str(step))
                saved = checkpoint_cls.from_directory(folder)
            report({"step": step}, checkpoint=saved)


def recovery_loop_flowtrain(config):
    import trainers

    _recovering_loop(
        trainers.report,
        trainers.get_checkpoint,
        trainers.Checkpoint,
        trainers.get_context().get_world_rank(),
        config["dir"],
    )


def recovery_loop_ray(config):
    import ray.train

    _recovering_loop(
        ray.train.report,
        ray.train.get_checkpoint,
        ray.train.Checkpoint,
        ray.train.get_context().get_world_rank(),
        config["dir"],
    )


def recovery(impl: str, storage: str, run: int) -> dict:
    """Seconds from SIGKILL of rank 1 to the first step of the restarted group (max_failures=1)."""
    marker_dir = tempfile.mkdtemp()
    config = {"dir": marker_dir}
    if impl == "flowtrain":
        from trainers import FailureConfig, RunConfig, ScalingConfig
        from trainers.torch import TorchTrainer

        TorchTrainer(
            recovery_loop_flowtrain,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
            run_config=RunConfig(
                name=f"recovery-{impl}-{run}", storage_path=storage, failure_config=FailureConfig(max_failures=1)
            ),
        ).fit()
    else:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        TorchTrainer(
            recovery_loop_ray,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
            run_config=RunConfig(
                name=f"recovery-{impl}-{run}", storage_path=storage, failure_config=FailureConfig(max_failures=1)
            ),
        ).fit()
    killed = float(pathlib.Path(marker_dir, "killed.txt").read_text())
    resumed_at, resumed_step = pathlib.Path(marker_dir, "resumed.txt").read_text().split(",")
    return {"recovery_s": float(resumed_at) - killed, "resumed_step": float(resumed_step)}


WORKLOADS["recovery"] = (recovery, ("flowtrain", "ray.train"))
