"""DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU workers: flowtrain's TorchTrainer next to the same script
launched by hand with ``torchrun`` and next to ray.train's TorchTrainer.

    python -m benchmarks.deepspeed_bench             # both workloads, 5 repetitions
    python -m benchmarks.deepspeed_bench --quick     # one repetition, a smoke run

Every implementation runs the identical work (``zero_work``): an MLP regression under
``deepspeed.initialize`` with torch's SGD, one torch thread per worker, over the gloo group the
launcher set up. Each measurement gives ``startup_s`` (from calling ``fit()``, or starting
``torchrun``, to the end of rank 0's first training step: process start, imports, process group,
``deepspeed.initialize``), ``steady_samples_per_s`` (rank 0's global rate after the first
``WARMUP_STEPS`` steps) and ``wall_s`` (until ``fit()`` returns, or ``torchrun`` exits). Needs
the deepspeed extra (the Makefile installs it).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from benchmarks.workloads import NUM_WORKERS, WORKLOADS

#: Rows per worker per step, steps per run, and the steps left out of the steady rate.
BATCH = 64
STEPS = 600
WARMUP_STEPS = 50
FEATURES = 64
HIDDEN = 512


def zero_work(stage: int, rank: int, world_size: int) -> dict[str, float]:
    """Train the MLP under ZeRO-``stage`` (process group already up); rank 0's step timings."""
    import deepspeed
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1),
    )
    config = {
        "train_batch_size": BATCH * world_size,
        "train_micro_batch_size_per_gpu": BATCH,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, FEATURES, generator=generator)
    y = x[:, :1] * 2.0 - x[:, 1:2]
    ends: list[float] = []
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        ends.append(time.time())
    steady = ends[-1] - ends[WARMUP_STEPS - 1]
    return {"first_step_at": ends[0], "steady_samples_per_s": (STEPS - WARMUP_STEPS) * BATCH * world_size / steady}


def _keep(rank: int, metrics: dict[str, float], out: str) -> None:
    # A file rather than the reported metrics: the same for all three launchers.
    if rank == 0:
        with open(out, "w") as f:
            json.dump(metrics, f)


def loop_flowtrain(config: dict) -> None:
    import trainers

    context = trainers.get_context()
    metrics = zero_work(config["stage"], context.get_world_rank(), context.get_world_size())
    trainers.report({"done": 1})
    _keep(context.get_world_rank(), metrics, config["out"])


def loop_ray(config: dict) -> None:
    import ray.train

    context = ray.train.get_context()
    metrics = zero_work(config["stage"], context.get_world_rank(), context.get_world_size())
    ray.train.report({"done": 1})
    _keep(context.get_world_rank(), metrics, config["out"])


def _fit(impl: str, stage: int, storage: str, name: str, out: str) -> None:
    config = {"stage": stage, "out": out}
    if impl == "flowtrain":
        from trainers import RunConfig, ScalingConfig
        from trainers.torch import TorchTrainer

        loop: Callable[[dict], None] = loop_flowtrain
    else:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        loop = loop_ray
    TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
        run_config=RunConfig(name=name, storage_path=storage),
    ).fit()


def _torchrun(stage: int, out: str) -> None:
    """The script launched by hand: ``torchrun --standalone --nproc-per-node 2`` on this module."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={NUM_WORKERS}",
        "-m",
        "benchmarks.deepspeed_bench",
        "--raw-worker",
        str(stage),
        out,
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)


def _raw_worker(stage: int, out: str) -> None:
    """One torchrun process: join the gloo group from torchrun's variables, then do the work."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    metrics = zero_work(stage, dist.get_rank(), dist.get_world_size())
    _keep(dist.get_rank(), metrics, out)
    dist.destroy_process_group()


def _workload(stage: int) -> Callable[[str, str, int], dict]:
    def measure(impl: str, storage: str, run: int) -> dict:
        out = os.path.join(tempfile.mkdtemp(prefix=f"flowtrain-bench-zero{stage}-"), "metrics.json")
        start = time.time()
        if impl == "raw":
            _torchrun(stage, out)
        else:
            _fit(impl, stage, storage, f"zero{stage}-{impl.replace('.', '-')}-{run}-{time.time_ns()}", out)
        wall = time.time() - start
        with open(out) as f:
            metrics = json.load(f)
        return {
            "startup_s": metrics["first_step_at"] - start,
            "steady_samples_per_s": metrics["steady_samples_per_s"],
            "wall_s": wall,
        }

    measure.__doc__ = f"DeepSpeed ZeRO-{stage} on {NUM_WORKERS} CPU workers: start-up, steady samples/s, wall seconds."
    return measure


WORKLOADS["deepspeed_zero2"] = (_workload(2), ("flowtrain", "ray.train", "raw"))
WORKLOADS["deepspeed_zero3"] = (_workload(3), ("flowtrain", "ray.train", "raw"))


def main(argv: list[str] | None = None) -> int:
    """Run only this module's workloads through the benchmark command (same options)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--raw-worker"]:
        _raw_worker(int(args[1]), args[2])
        return 0
    # Register this module under its import name too: the workers unpickle functions by it.
    import benchmarks.deepspeed_bench  # noqa: F401
    from benchmarks import bench

    if "--only" not in args:
        args += ["--only", "deepspeed_zero2", "deepspeed_zero3"]
    if "--out" not in args:
        # Not bench's default name: this run must not replace the day's main results.
        quick = "-quick" if "--quick" in args else ""
        args += ["--out", str(bench.RESULTS / f"{datetime.date.today().isoformat()}-deepspeed{quick}.json")]
    return bench.main(args)


if __name__ == "__main__":
    sys.exit(main())
