"""The benchmark workloads, each written once per implementation: flowtrain, ray.train, raw torch.

Every function runs one measurement and returns a dict of numbers. Same work, same worker count,
same threads per worker for every implementation.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time

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
        loop, scaling_config=ScalingConfig(num_workers=NUM_WORKERS), run_config=RunConfig(name=name, storage_path=storage)
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


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def startup(impl: str, storage: str, run: int) -> dict:
    """Wall time of a trivial 2-worker run (one report), Ray already started."""
    start = time.perf_counter()
    if impl == "flowtrain":
        _flowtrain_fit(report_once_flowtrain, storage, f"startup-{run}")
    elif impl == "ray.train":
        _ray_fit(report_once_ray, storage, f"startup-{run}")
    else:
        import torch.multiprocessing as mp

        mp.spawn(_raw_worker, args=(NUM_WORKERS, _free_port()), nprocs=NUM_WORKERS, join=True)
    return {"wall_s": time.perf_counter() - start}


def report_latency(impl: str, storage: str, run: int) -> dict:
    """Mean and p99 of a metrics-only report() on rank 0, over 200 calls."""
    if impl == "flowtrain":
        durations = _flowtrain_fit(report_loop_flowtrain, storage, f"report-{run}").return_value
    elif impl == "ray.train":
        out = os.path.join(tempfile.mkdtemp(), "durations.txt")
        _ray_fit(report_loop_ray, storage, f"report-{run}", config={"out": out})
        durations = [float(v) for v in open(out).read().split(",")]
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


# -- Ray Data ingestion -------------------------------------------------------------------------

DATA_ROWS = 250_000
_data_path: str | None = None


def parquet_dataset() -> str:
    """A 250k-row parquet folder (8 float features and a label), written once per benchmark run."""
    global _data_path
    if _data_path is None:
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
        _data_path = folder
    return _data_path


def _consume(shard, out_dir, rank):
    """One epoch of iter_torch_batches with a token of compute per batch; writes rows and seconds."""
    start = time.perf_counter()
    rows = 0
    for batch in shard.iter_torch_batches(batch_size=1024):
        batch["y"].sum()  # touch the data as a training step would
        rows += len(batch["y"])
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(f"{rows},{time.perf_counter() - start}")


def ingest_flowtrain(config):
    import trainers

    _consume(trainers.get_dataset_shard("train"), config["out"], trainers.get_context().get_world_rank())


def ingest_ray(config):
    import ray.train

    _consume(ray.train.get_dataset_shard("train"), config["out"], ray.train.get_context().get_world_rank())


def ray_data_throughput(impl: str, storage: str, run: int) -> dict:
    """Rows per second through ``iter_torch_batches`` on 2 workers (whole dataset / slowest rank)."""
    import ray.data

    out = tempfile.mkdtemp()
    dataset = ray.data.read_parquet(parquet_dataset())
    config = {"out": out}
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
    results = [open(os.path.join(out, name)).read().split(",") for name in sorted(os.listdir(out))]
    rows = sum(int(r) for r, _ in results)
    slowest = max(float(s) for _, s in results)
    return {"rows_per_s": rows / slowest, "rows": float(rows)}


WORKLOADS["ray_data"] = (ray_data_throughput, ("flowtrain", "ray.train"))
