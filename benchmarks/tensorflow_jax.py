"""TensorFlow (Keras, MultiWorkerMirroredStrategy) and JAX (jax.distributed) on 2 workers: flowtrain
next to the same work started by hand, and ray.train's TensorflowTrainer.

    python -m benchmarks.bench --only tensorflow jax            # both workloads, 5 repetitions
    python -m benchmarks.bench --only tensorflow jax --quick    # one repetition, a smoke run

"raw" is what a user writes without any trainer: a script spawns 2 processes, sets ``TF_CONFIG``
(or calls ``jax.distributed.initialize``) in each, and runs the same training function. Each
measurement gives ``startup_s`` (from calling ``fit()``, or spawning, to the end of the first
training step on rank 0), ``steady_samples_per_s`` (rank 0's rate after the first
``WARMUP_STEPS`` steps) and ``wall_s`` (until ``fit()`` returns, or the processes exit).
ray.train's JaxTrainer is left out: on CPUs it starts unconnected processes, which is not the
same work.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.workloads import NUM_WORKERS, WORKLOADS

#: Rows per worker per step, steps per run, and the steps left out of the steady rate.
BATCH = 256
STEPS = 240
WARMUP_STEPS = 40
FEATURES = 64
HIDDEN = 256


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rates(step_ends: list[float]) -> dict[str, float]:
    """Rank 0's first-step time and steady rate (global samples/s) from its step end times."""
    steady = step_ends[-1] - step_ends[WARMUP_STEPS - 1]
    return {
        "first_step_at": step_ends[0],
        "steady_samples_per_s": (len(step_ends) - WARMUP_STEPS) * BATCH * NUM_WORKERS / steady,
    }


# -- the work, the same for every implementation (runs on the workers) --------------------------


def keras_work(rank: int) -> dict[str, float]:
    """An MLP regression fitted by Keras 2 under MultiWorkerMirroredStrategy (TF_CONFIG already set)."""
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(BATCH * 16, FEATURES)).astype(np.float32)
    y = x[:, :1] * 2.0 - x[:, 1:2]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH).with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((FEATURES,)),
                tf.keras.layers.Dense(HIDDEN, activation="relu"),
                tf.keras.layers.Dense(HIDDEN, activation="relu"),
                tf.keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
    ends: list[float] = []

    class StepTimes(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            ends.append(time.time())

    model.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0, callbacks=[StepTimes()])
    return _rates(ends)


def jax_work(rank: int) -> dict[str, float]:
    """An MLP regression trained with jax.grad and optax over a batch sharded across processes
    (jax.distributed already initialised)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded, replicated = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = x[:, :1] * 2.0 - x[:, 1:2]
    batch = (jax.make_array_from_process_local_data(sharded, x), jax.make_array_from_process_local_data(sharded, y))
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    sizes = [(FEATURES, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1)]
    params = [jax.random.normal(k, s) * (1 / np.sqrt(s[0])) for k, s in zip(keys, sizes, strict=True)]
    params = jax.device_put(params, replicated)
    optimizer = optax.adam(1e-3)
    state = jax.jit(optimizer.init)(params)

    def loss_fn(p, xb, yb):
        h = xb
        for w in p[:-1]:
            h = jax.nn.relu(h @ w)
        return jnp.mean((h @ p[-1] - yb) ** 2)

    @jax.jit
    def step(p, s, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    ends: list[float] = []
    for _ in range(STEPS):
        params, state, loss = step(params, state, *batch)
        loss.block_until_ready()
        ends.append(time.time())
    return _rates(ends)


# -- flowtrain and ray.train: the work inside a training function --------------------------------


def _keep(rank: int, metrics: dict[str, float], out: str) -> None:
    # A file rather than the reported metrics: ray.train's Result has metrics only with a checkpoint.
    if rank == 0:
        with open(out, "w") as f:
            json.dump(metrics, f)


def keras_loop_flowtrain(config: dict) -> None:
    import trainers

    rank = trainers.get_context().get_world_rank()
    metrics = keras_work(rank)
    trainers.report(metrics)
    _keep(rank, metrics, config["out"])


def keras_loop_ray(config: dict) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    metrics = keras_work(rank)
    ray.train.report(metrics)
    _keep(rank, metrics, config["out"])


def jax_loop_flowtrain(config: dict) -> None:
    import trainers

    rank = trainers.get_context().get_world_rank()
    metrics = jax_work(rank)
    trainers.report(metrics)
    _keep(rank, metrics, config["out"])


def _fit(framework: str, impl: str, storage: str, name: str) -> dict[str, float]:
    if impl == "flowtrain":
        from trainers import RunConfig, ScalingConfig

        if framework == "tensorflow":
            from trainers.tensorflow import TensorflowTrainer as Trainer

            loop: Callable[[dict], None] = keras_loop_flowtrain
        else:
            from trainers.jax import JaxTrainer as Trainer

            loop = jax_loop_flowtrain
    else:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer as Trainer

        loop = keras_loop_ray
    run_config = RunConfig(name=name, storage_path=storage)
    if impl == "ray.train":
        # As Ray's examples do: ray.train.tensorflow resolves tf.keras when it is imported, before
        # its backend sets TF_USE_LEGACY_KERAS, so without this the workers get Keras 3.
        run_config = RunConfig(
            name=name, storage_path=storage, worker_runtime_env={"env_vars": {"TF_USE_LEGACY_KERAS": "1"}}
        )
    out = os.path.join(tempfile.mkdtemp(prefix=f"flowtrain-bench-{framework}-"), "metrics.json")
    Trainer(
        loop,
        train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
        run_config=run_config,
    ).fit()
    with open(out) as f:
        return json.load(f)


# -- raw: a script's own processes ---------------------------------------------------------------


def _raw_process(framework: str, rank: int, address: str, addresses: list[str], out: str) -> None:
    if framework == "tensorflow":
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}
        )
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        metrics = keras_work(rank)
    else:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax

        jax.distributed.initialize(address, num_processes=NUM_WORKERS, process_id=rank)
        metrics = jax_work(rank)
    _keep(rank, metrics, out)


def _raw(framework: str) -> dict[str, float]:
    addresses = [f"127.0.0.1:{_free_port()}" for _ in range(NUM_WORKERS)]
    out = os.path.join(tempfile.mkdtemp(prefix=f"flowtrain-bench-raw-{framework}-"), "metrics.json")
    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(target=_raw_process, args=(framework, rank, addresses[0], addresses, out))
        for rank in range(NUM_WORKERS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    failed = [rank for rank, process in enumerate(processes) if process.exitcode != 0]
    if failed or not os.path.exists(out):
        raise RuntimeError(f"raw {framework}: ranks {failed} failed, or rank 0 wrote no metrics to {out}")
    with open(out) as f:
        return json.load(f)


def _workload(framework: str) -> Callable[[str, str, int], dict]:
    def measure(impl: str, storage: str, run: int) -> dict:
        start = time.time()
        if impl == "raw":
            metrics = _raw(framework)
        else:
            metrics = _fit(framework, impl, storage, f"{framework}-{impl.replace('.', '-')}-{run}-{time.time_ns()}")
        wall = time.time() - start
        return {
            "startup_s": metrics["first_step_at"] - start,
            "steady_samples_per_s": metrics["steady_samples_per_s"],
            "wall_s": wall,
        }

    measure.__doc__ = (
        f"{framework} on {NUM_WORKERS} workers: start-up to the first step, steady samples/s, wall seconds."
    )
    return measure


WORKLOADS["tensorflow"] = (_workload("tensorflow"), ("flowtrain", "ray.train", "raw"))
WORKLOADS["jax"] = (_workload("jax"), ("flowtrain", "raw"))
