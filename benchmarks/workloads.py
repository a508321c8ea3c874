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
