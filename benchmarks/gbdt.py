"""Gradient-boosted trees with per-round reporting: XGBoost and LightGBM on 2 workers under
flowtrain and ray.train, against the library alone in one process with as many threads, and
against the library's own distributed mode in 2 plain processes ("raw": no Ray).

The data is a synthetic binary classification (``GBDT_ROWS`` rows, ``GBDT_FEATURES`` float
features; the ``_2m`` workloads take ``LONG_ROWS``, the same job ten times longer) saved once as
``.npy`` files; every worker loads it and keeps every other row, so both
trainers see identical shards and neither pays for Ray Data. The training function is the same
for flowtrain and ray.train (only the imports differ): one thread per worker, the library's
collective set up by the trainer, a report every round through ``RayTrainReportCallback`` and
the model checkpointed at the end. The library alone trains on all rows with 2 threads and
records its metrics with its own callback. The raw run spawns 2 processes that join the
library's own collective (XGBoost's tracker, LightGBM's ``machines`` list), train the same shards
with one thread each, keep their metrics with the library's callback and save the model from
rank 0 at the end: what a user of the library would write without any trainer. Measured: wall
seconds from the call to the trained model (``fit()`` for the trainers, ``train()`` for the
library, spawn to join for raw), Ray already started.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import shutil
import tempfile
import time

from benchmarks.workloads import NUM_WORKERS, OPT_IN, WORKLOADS, free_port

GBDT_ROWS = 200_000
#: The rows of the ``xgboost_2m`` and ``lightgbm_2m`` workloads: the library alone takes about 15 s
#: instead of 1.5-2.5 s, so start-up and the per-level all-reduce no longer dominate.
LONG_ROWS = 2_000_000
GBDT_FEATURES = 20
ROUNDS = 100
XGB_PARAMS = {
    "objective": "binary:logistic",
    "eval_metric": "logloss",
    "max_depth": 6,
    "eta": 0.1,
    "tree_method": "hist",
}
LGB_PARAMS = {"objective": "binary", "metric": "binary_logloss", "num_leaves": 63, "learning_rate": 0.1, "verbose": -1}


@functools.cache
def data_folder(rows: int = GBDT_ROWS) -> str:
    """Where ``x.npy`` and ``y.npy`` of ``rows`` rows are (written once per benchmark run, and
    removed when the benchmark's process exits: 2M rows take 160 MB)."""
    import numpy as np

    folder = tempfile.mkdtemp(prefix="flowtrain-bench-gbdt-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, GBDT_FEATURES)).astype("float32")
    logits = x[:, :5] @ rng.standard_normal(5) + 0.5 * np.sin(3 * x[:, 5]) * x[:, 6]
    y = (logits + rng.logistic(size=rows) > 0).astype("float32")
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y)
    return folder


def _shard(folder: str, rank: int, world_size: int):
    import numpy as np

    x, y = np.load(os.path.join(folder, "x.npy")), np.load(os.path.join(folder, "y.npy"))
    return x[rank::world_size], y[rank::world_size]


# -- the training functions (identical but for where report callback and context come from) -------


def _xgboost_train(config, callback, rank, world_size):
    import xgboost

    x, y = _shard(config["data"], rank, world_size)
    train = xgboost.DMatrix(x, label=y)
    return xgboost.train(
        {**XGB_PARAMS, "nthread": 1},
        train,
        num_boost_round=ROUNDS,
        evals=[(train, "train")],
        verbose_eval=False,
        callbacks=[callback],
    )


def _lightgbm_train(config, callback, network, rank, world_size):
    import lightgbm

    x, y = _shard(config["data"], rank, world_size)
    train = lightgbm.Dataset(x, label=y)
    params = {**LGB_PARAMS, "num_threads": 1, "tree_learner": "data_parallel", **network}
    return lightgbm.train(
        params, train, num_boost_round=ROUNDS, valid_sets=[train], valid_names=["train"], callbacks=[callback]
    )


def xgboost_loop_flowtrain(config):
    import trainers
    from trainers.xgboost import RayTrainReportCallback

    context = trainers.get_context()
    _xgboost_train(config, RayTrainReportCallback(), context.get_world_rank(), context.get_world_size())


def xgboost_loop_ray(config):
    import ray.train
    from ray.train.xgboost import RayTrainReportCallback

    context = ray.train.get_context()
    _xgboost_train(config, RayTrainReportCallback(), context.get_world_rank(), context.get_world_size())


def lightgbm_loop_flowtrain(config):
    import trainers
    from trainers.lightgbm import RayTrainReportCallback, get_network_params

    context = trainers.get_context()
    _lightgbm_train(
        config, RayTrainReportCallback(), get_network_params(), context.get_world_rank(), context.get_world_size()
    )


def lightgbm_loop_ray(config):
    import ray.train
    from ray.train.lightgbm import RayTrainReportCallback, get_network_params

    context = ray.train.get_context()
    _lightgbm_train(
        config, RayTrainReportCallback(), get_network_params(), context.get_world_rank(), context.get_world_size()
    )


# -- drivers ------------------------------------------------------------------------------------


def _library_alone(library: str, folder: str) -> None:
    x, y = _shard(folder, 0, 1)
    if library == "xgboost":
        import xgboost

        train = xgboost.DMatrix(x, label=y)
        log: dict = {}
        xgboost.train(
            {**XGB_PARAMS, "nthread": NUM_WORKERS},
            train,
            num_boost_round=ROUNDS,
            evals=[(train, "train")],
            evals_result=log,
            verbose_eval=False,
        )
    else:
        import lightgbm

        train = lightgbm.Dataset(x, label=y)
        log = {}
        lightgbm.train(
            {**LGB_PARAMS, "num_threads": NUM_WORKERS},
            train,
            num_boost_round=ROUNDS,
            valid_sets=[train],
            valid_names=["train"],
            callbacks=[lightgbm.record_evaluation(log)],
        )


class _RoundMetrics:
    """Per-round metrics kept in the process, the raw run's stand-in for ``report()``."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []

    def xgboost_callback(self):
        import xgboost

        rounds = self.rounds

        class Keep(xgboost.callback.TrainingCallback):
            def after_iteration(self, model, epoch, evals_log):
                rounds.append(
                    {
                        f"{data}-{metric}": values[-1]
                        for data, metrics in evals_log.items()
                        for metric, values in metrics.items()
                    }
                )
                return False

        return Keep()

    def lightgbm_callback(self, env) -> None:
        self.rounds.append({f"{data}-{metric}": value for data, metric, value, _ in env.evaluation_result_list})


def _raw_process(library: str, rank: int, world_size: int, network: dict, folder: str, out: str) -> None:
    keep = _RoundMetrics()
    if library == "xgboost":
        from xgboost import collective

        with collective.CommunicatorContext(**network, dmlc_task_id=f"rank-{rank}"):
            model = _xgboost_train({"data": folder}, keep.xgboost_callback(), rank, world_size)
    else:
        ports = network["ports"]
        lightgbm_network = {
            "machines": ",".join(f"127.0.0.1:{port}" for port in ports),
            "local_listen_port": ports[rank],
            "num_machines": world_size,
        }
        model = _lightgbm_train({"data": folder}, keep.lightgbm_callback, lightgbm_network, rank, world_size)
    if len(keep.rounds) != ROUNDS:
        raise RuntimeError(f"raw {library} rank {rank}: {len(keep.rounds)} rounds of metrics, expected {ROUNDS}")
    if rank == 0:
        model.save_model(os.path.join(out, "model.ubj" if library == "xgboost" else "model.txt"))


def _raw_distributed(library: str, folder: str) -> None:
    """The library's own collective in ``NUM_WORKERS`` spawned processes."""
    tracker = None
    if library == "xgboost":
        from xgboost.tracker import RabitTracker

        tracker = RabitTracker(host_ip="127.0.0.1", n_workers=NUM_WORKERS)
        tracker.start()
        network = tracker.worker_args()
    else:
        network = {"ports": [free_port() for _ in range(NUM_WORKERS)]}
    out = tempfile.mkdtemp(prefix=f"flowtrain-bench-raw-{library}-")
    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(target=_raw_process, args=(library, rank, NUM_WORKERS, network, folder, out))
        for rank in range(NUM_WORKERS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    if tracker is not None:
        tracker.wait_for()
    failed = [rank for rank, process in enumerate(processes) if process.exitcode != 0]
    if failed or not os.listdir(out):
        raise RuntimeError(f"raw {library}: ranks {failed} failed, or rank 0 saved no model in {out}")


def _fit(library: str, impl: str, storage: str, name: str, folder: str) -> None:
    config = {"data": folder}
    if impl == "flowtrain":
        from trainers import RunConfig, ScalingConfig

        if library == "xgboost":
            from trainers.xgboost import XGBoostTrainer as Trainer

            loop = xgboost_loop_flowtrain
        else:
            from trainers.lightgbm import LightGBMTrainer as Trainer

            loop = lightgbm_loop_flowtrain
    else:
        from ray.train import RunConfig, ScalingConfig

        if library == "xgboost":
            from ray.train.xgboost import XGBoostTrainer as Trainer

            loop = xgboost_loop_ray
        else:
            from ray.train.lightgbm import LightGBMTrainer as Trainer

            loop = lightgbm_loop_ray
    result = Trainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
        run_config=RunConfig(name=name, storage_path=storage),
    ).fit()
    if result.checkpoint is None:
        raise RuntimeError(f"{impl} {library}: the run ended without its final checkpoint")


def _workload(library: str, rows: int = GBDT_ROWS):
    def measure(impl: str, storage: str, run: int) -> dict:
        folder = data_folder(rows)  # written before the clock starts
        start = time.perf_counter()
        if impl == "library":
            _library_alone(library, folder)
        elif impl == "raw":
            _raw_distributed(library, folder)
        else:
            _fit(library, impl, storage, f"{library}-{rows}-{impl.replace('.', '-')}-{run}", folder)
        return {"wall_s": time.perf_counter() - start}

    measure.__doc__ = f"Wall seconds of {ROUNDS} {library} rounds on {rows} rows, reported every round."
    return measure


IMPLS = ("flowtrain", "ray.train", "raw", "library")
WORKLOADS["xgboost"] = (_workload("xgboost"), IMPLS)
WORKLOADS["lightgbm"] = (_workload("lightgbm"), IMPLS)
WORKLOADS["xgboost_2m"] = (_workload("xgboost", LONG_ROWS), IMPLS)
WORKLOADS["lightgbm_2m"] = (_workload("lightgbm", LONG_ROWS), IMPLS)
# About 45 minutes more at 5 repetitions, most of it ray.train's: a default run leaves them out.
OPT_IN.update({"xgboost_2m", "lightgbm_2m"})
