"""JAX training functions the tests' workers import (JAX is imported inside them)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

import trainers
from trainers import Checkpoint

#: The line every worker's rows follow: y = x @ TRUE_W + TRUE_B.
TRUE_W = np.array([2.0, -1.0, 0.5], dtype=np.float32)
TRUE_B = -0.5
PARAMS_FILE = "params.npz"


def rows(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, TRUE_W.size)).astype(np.float32)
    return x, (x @ TRUE_W + TRUE_B).astype(np.float32)


def load_params(checkpoint: Checkpoint) -> tuple[dict[str, np.ndarray], int]:
    """The parameters and the epoch a ``linear_regression_loop`` checkpoint holds."""
    with checkpoint.as_directory() as folder:
        saved = np.load(os.path.join(folder, PARAMS_FILE))
        return {"w": saved["w"], "b": saved["b"]}, int(saved["epoch"])


def linear_regression_loop(config: dict[str, Any]) -> dict[str, Any]:
    """One linear model trained with ``jax.grad`` on every worker's rows at once.

    The batch is one global array sharded over all workers' devices; the parameters are
    replicated, so the jitted gradient of the global mean loss sums across workers by itself.
    Reports ``loss`` each epoch with a checkpoint (rank 0 writes it) and resumes from the latest.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    rank = trainers.get_context().get_world_rank()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded, replicated = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())

    # A cross-process sum: every worker contributes rank + 1.
    mine = jax.make_array_from_process_local_data(sharded, np.array([rank + 1.0], dtype=np.float32))
    total = jax.jit(jnp.sum, out_shardings=replicated)(mine)

    x, y = rows(seed=rank, count=64)
    batch = (
        jax.make_array_from_process_local_data(sharded, x),
        jax.make_array_from_process_local_data(sharded, y),
    )
    params = {"w": np.zeros(TRUE_W.size, np.float32), "b": np.zeros((), np.float32)}
    start = 0
    if checkpoint := trainers.get_checkpoint():
        params, last = load_params(checkpoint)
        start = last + 1
    params = jax.device_put(params, replicated)

    def loss_fn(p, xb, yb):
        return jnp.mean((xb @ p["w"] + p["b"] - yb) ** 2)

    @jax.jit
    def step(p, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        return jax.tree_util.tree_map(lambda v, g: v - config["lr"] * g, p, grads), loss

    for epoch in range(start, config["epochs"]):
        for _ in range(config.get("steps_per_epoch", 10)):
            params, loss = step(params, *batch)
        host = {k: np.asarray(jax.device_get(v)) for k, v in params.items()}
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                np.savez(os.path.join(folder, PARAMS_FILE), epoch=epoch, **host)
                checkpoint = Checkpoint.from_directory(folder)
            metrics = {
                "epoch": epoch,
                "loss": float(loss),
                "process_count": jax.process_count(),
                "process_index": jax.process_index(),
                "total": float(total.addressable_data(0)),
            }
            trainers.report(metrics, checkpoint=checkpoint)
    return {
        "start_epoch": start,
        "w": np.asarray(jax.device_get(params["w"])).tolist(),
        "b": float(jax.device_get(params["b"])),
    }


def keras3_data_parallel_loop(config: dict[str, Any]) -> dict[str, Any]:
    """Keras 3 on the JAX backend (``KERAS_BACKEND=jax`` in the workers' environment), data
    parallel over every worker's device, reporting and checkpointing each epoch through
    ``trainers.tensorflow.keras.ReportCheckpointCallback``; resumes from the latest checkpoint."""
    import jax
    import keras

    from trainers.tensorflow.keras import ReportCheckpointCallback

    checkpoint = trainers.get_checkpoint()
    # Loaded before the distribution is set: Keras 3 cannot load a saved model straight into
    # variables laid out over several processes, but it can assign its weights to them.
    saved = ReportCheckpointCallback.get_model(checkpoint).get_weights() if checkpoint else None
    distribution = keras.distribution.DataParallel(devices=jax.devices())
    distribution.auto_shard_dataset = False  # each worker passes its own rows
    keras.distribution.set_distribution(distribution)
    x, y = rows(seed=trainers.get_context().get_world_rank(), count=128)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((TRUE_W.size,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    if saved is not None:
        model.set_weights(saved)
    start = checkpoint.get_metadata()["epoch"] + 1 if checkpoint else 0
    model.fit(
        x,
        y[:, None],
        batch_size=32,
        initial_epoch=start,
        epochs=config["epochs"],
        verbose=0,
        callbacks=[ReportCheckpointCallback()],
    )
    return {"backend": keras.backend.backend(), "start_epoch": start, "keras": type(model).__module__.split(".")[0]}


def tpu_placement_loop() -> None:
    """Report where this worker runs on a (fake) TPU cluster: its slice, its node, and the
    ``MEGASCALE_*`` variables the backend set."""
    import ray

    keys = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID")
    trainers.report(
        {
            "rank": trainers.get_context().get_world_rank(),
            "slice": ray.get_runtime_context().get_node_labels().get("ray.io/tpu-slice-name"),
            "node": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            **{key: os.environ.get(key) for key in keys},
        }
    )
