"""Behaviour Ray Train 2.60's own tests (python/ray/train/v2/tests) rely on, checked here with only
the imports changed: V1 leftovers answered with DeprecationWarning, GPU resource requests, a
training function without a config parameter, LoggingConfig, and the error types users catch.
"""

from __future__ import annotations

import logging
import pickle

import pytest

import trainers as train
from storage import CheckpointConfig
from trainers import (
    DataParallelTrainer,
    FailureConfig,
    LoggingConfig,
    NCCLHangError,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    WorkerGroupError,
)
from trainers.torch import TorchConfig, TorchTrainer

# -- V1 leftovers: a migration message, raised as DeprecationWarning (as Ray raises it) ----------


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: FailureConfig(fail_fast=True), "fail_fast"),
        (lambda: RunConfig(verbose=2), "verbose"),
        (lambda: RunConfig(sync_config=object()), "sync_config"),
        (lambda: RunConfig(stop={"loss": 0.1}), "stop"),
        (lambda: RunConfig(progress_reporter=object()), "progress_reporter"),
        (lambda: RunConfig(log_to_file=True), "log_to_file"),
        (lambda: ScalingConfig(trainer_resources={"CPU": 1}), "trainer_resources"),
        (lambda: CheckpointConfig(checkpoint_frequency=5), "checkpoint_frequency"),
        (lambda: CheckpointConfig(checkpoint_at_end=True), "checkpoint_at_end"),
        (lambda: TorchTrainer.restore("/tmp/run"), "restore"),
        (lambda: TorchTrainer.can_restore("/tmp/run"), "can_restore"),
        (lambda: DataParallelTrainer.restore("/tmp/run"), "restore"),
    ],
)
def test_v1_leftovers_raise_deprecation_warning_with_a_migration_message(make, field):
    with pytest.raises(DeprecationWarning) as caught:
        make()
    message = str(caught.value)
    assert field in message and "no longer supported" in message
    assert "https://github.com/ray-project/ray/issues/49454" in message


@pytest.mark.parametrize("method", ["get_trial_id", "get_trial_resources", "get_trial_dir"])
def test_tune_only_context_methods_raise_deprecation_warning(method, tmp_path):
    def loop():
        try:
            getattr(train.get_context(), method)()
        except DeprecationWarning as error:
            return str(error)
        return "no error"

    result = DataParallelTrainer(
        loop, scaling_config=ScalingConfig(num_workers=0), run_config=RunConfig(storage_path=str(tmp_path))
    ).fit()
    assert method in result.return_value and "ray.tune.get_context()" in result.return_value


# -- resources: what each worker asks Ray for ------------------------------------------------------


def test_use_gpu_asks_each_worker_for_one_gpu_and_no_cpu_as_ray_does():
    # A GPU node with 8 GPUs and 4 CPUs fits 8 workers in Ray: each asks {"GPU": 1} only.
    assert ScalingConfig(num_workers=8, use_gpu=True).worker_resources == {"GPU": 1}
    assert ScalingConfig(num_workers=2, use_gpu=True).total_resources == {"GPU": 2}
    with_type = ScalingConfig(num_workers=2, use_gpu=True, accelerator_type="A100")
    assert with_type.worker_resources == {"GPU": 1, "accelerator_type:A100": 0.001}
    assert with_type.num_cpus_per_worker == 0 and with_type.num_gpus_per_worker == 1
    assert with_type.additional_resources_per_worker == {"accelerator_type:A100": 0.001}


def test_a_gpu_node_with_few_cpus_fits_one_worker_per_gpu():
    from trainers._internal.workers.resources import check_feasible

    check_feasible(ScalingConfig(num_workers=8, use_gpu=True), [{"CPU": 4.0, "GPU": 8.0}])


def test_elastic_sizes_are_checked_and_read_as_ray_reads_them():
    scaling = ScalingConfig(num_workers=(2, 4))
    assert scaling.elasticity_enabled and (scaling.min_workers, scaling.max_workers) == (2, 4)
    assert scaling.total_resources == {"CPU": 4}
    assert not ScalingConfig(num_workers=3).elasticity_enabled
    for bad in [(3, 2), (0, 2), (1, 2, 3), (1.5, 2)]:
        with pytest.raises(ValueError, match=r"ScalingConfig.num_workers="):
            ScalingConfig(num_workers=bad)
    with pytest.raises(ValueError, match=r"label_selector has 1 entries for 4 workers"):
        ScalingConfig(num_workers=(2, 4), label_selector=[{"zone": "a"}])
    assert (
        ScalingConfig(num_workers=2, label_selector={"zone": "a"}).label_selector_per_worker(2) == [{"zone": "a"}] * 2
    )


# -- a training function without a config parameter ------------------------------------------------


def _no_config_loop():
    train.report({"world_size": train.get_context().get_world_size()})


@pytest.mark.usefixtures("ray_local")
def test_a_loop_without_a_config_parameter_runs_with_a_config_given_and_a_warning(tmp_path):
    """Ray's own XGBoost and LightGBM tests pass train_loop_config to such loops: accepted."""
    with pytest.warns(UserWarning, match=r"takes no argument, so it never sees the config"):
        trainer = TorchTrainer(
            _no_config_loop,
            train_loop_config={"lr": 0.1},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=str(tmp_path), name="no-config"),
        )
    result = trainer.fit()
    assert result.metrics == {"world_size": 2}


def test_gbdt_trainers_accept_a_loop_without_a_config_parameter_and_a_config():
    from trainers.lightgbm import LightGBMTrainer
    from trainers.xgboost import XGBoostTrainer

    for trainer_cls in (XGBoostTrainer, LightGBMTrainer):
        with pytest.warns(UserWarning, match="never sees the config"):
            trainer_cls(_no_config_loop, train_loop_config={"num_boost_round": 2})


# -- LoggingConfig --------------------------------------------------------------------------------


def _loop_reporting_log_levels():
    train.report({"trainers": logging.getLogger("trainers").getEffectiveLevel(), "root": logging.getLogger().level})


@pytest.mark.usefixtures("ray_local")
def test_logging_config_sets_flowtrain_log_level_in_the_workers_and_the_driver(tmp_path, caplog):
    caplog.set_level(logging.NOTSET)
    root_before = logging.getLogger().level
    result = TorchTrainer(
        _loop_reporting_log_levels,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="debug", logging_config=LoggingConfig("debug")),
    ).fit()
    assert result.metrics["trainers"] == logging.DEBUG
    assert result.metrics["root"] != logging.DEBUG, "the root logger is the user's, not ours"

    quiet = TorchTrainer(
        _loop_reporting_log_levels,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="quiet", logging_config=LoggingConfig("ERROR")),
    ).fit()
    assert quiet.metrics["trainers"] == logging.ERROR
    # The driver's loggers get their levels back once fit() returns.
    assert logging.getLogger("trainers").level == logging.NOTSET and logging.getLogger().level == root_before


def test_logging_config_refuses_an_unknown_level():
    with pytest.raises(ValueError, match=r"LoggingConfig.log_level='LOUD': must be one of"):
        LoggingConfig("LOUD")
    assert LoggingConfig("warning").log_level == "WARNING"


# -- error types ------------------------------------------------------------------------------------


def test_worker_group_error_takes_ray_s_parameters_and_pickles_as_itself():
    error = WorkerGroupError(error_message="rank 1 failed", worker_failures={1: ValueError("boom")})
    assert isinstance(error, TrainingFailedError) and isinstance(error, RuntimeError)
    hang = NCCLHangError("rank 0 hung", {0: TimeoutError("no report")})
    again = pickle.loads(pickle.dumps(hang))
    assert type(again) is NCCLHangError and isinstance(again, WorkerGroupError)
    assert str(again) == "rank 0 hung" and isinstance(again.worker_failures[0], TimeoutError)


def _hung_run(collective_backend):
    """A 2-rank run stepped by hand where rank 1 never reports step 0 (scripted workers, no Ray)."""
    from test_controller import MemoryStore, ScriptedWorkers, policy, report
    from trainers._internal.run.controller import Controller, ControllerSettings, State

    now = [0.0]
    workers = ScriptedWorkers(2, [[[report(0, 0)], [], []]])
    controller = Controller(
        workers=workers,
        storage=MemoryStore(),
        policy=policy(max_failures=0, report_timeout_s=30),
        settings=ControllerSettings(clock=lambda: now[0], collective_backend=collective_backend),
    )
    controller.step()
    controller.step()
    now[0] = 31.0
    assert controller.step() is State.FAILED
    return controller.error


def test_a_hang_in_an_nccl_run_is_an_nccl_hang_error():
    """The decision only: that NCCL itself hangs this way needs GPUs, which CI does not have."""
    assert type(_hung_run("nccl")) is NCCLHangError
    assert type(_hung_run("gloo")) is WorkerGroupError
    assert type(_hung_run(None)) is WorkerGroupError


def test_torch_config_names_its_collective_backend():
    assert TorchConfig().collective_backend(use_gpu=True) == "nccl"
    assert TorchConfig().collective_backend(use_gpu=False) == "gloo"
    assert TorchConfig(backend="gloo").collective_backend(use_gpu=True) == "gloo"
