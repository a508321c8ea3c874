"""Ray Tune over flowtrain's trainers: real Tune, real Ray (the session's 4 CPUs), tiny torch trials."""

from __future__ import annotations

import json
import pathlib

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler

import tune_loops
from conftest import assert_no_leaks, live_placement_groups, train_worker_actors
from run_history import recorded_reports
from trainers import InsufficientResourcesError, Result, ScalingConfig
from trainers.tune import NotInTuneTrialError, TuneReportCallback, trial_resources, with_resources

EPOCHS = 4
#: In the 2-CPU tests, a trainer that waits for its workers longer than this (other trials train
#: meanwhile) would have failed before trials could wait their turn.
SHORT_START_TIMEOUT_S = 6


@pytest.fixture(scope="module")
def _two_cpu_ray():
    """A Ray of its own with 2 CPUs (the shared one has 4), so trials must take turns for CPUs."""
    import ray

    if ray.is_initialized():
        ray.shutdown()  # the suite's shared Ray; ray_local starts it again when a later test needs it
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"FLOWTRAIN_WORKER_START_TIMEOUT_S": str(SHORT_START_TIMEOUT_S)}},
    )
    yield
    ray.shutdown()


@pytest.fixture
def ray_two_cpus(_two_cpu_ray):
    """The 2-CPU Ray; fails the test if it leaks actors or placement groups."""
    yield
    assert_no_leaks()


def _asha(metric_epochs: int = EPOCHS) -> tune.TuneConfig:
    return tune.TuneConfig(
        metric="loss", mode="min", scheduler=ASHAScheduler(max_t=metric_epochs, grace_period=1, reduction_factor=2)
    )


def _check_asha_sweep(grid, lr_of) -> None:
    """The sweep finished under ASHA and found the best learning rate, never cutting it.

    ASHA cuts a trial only when it is worse than the trials already at its rung. Here trials take
    turns for the two CPUs in whatever order their trainers get them, so the worst may reach each
    rung first and none is cut (seen in CI). That a bad trial is cut is asserted on 4 CPUs by
    test_asha_stops_bad_trials_early_and_returns_the_best, whose good trials start first.
    """
    assert not grid.errors, grid.errors
    iterations = {lr_of(r.config): r.metrics["training_iteration"] for r in grid}
    assert len(iterations) == 4
    assert all(1 <= n <= EPOCHS for n in iterations.values()), iterations
    best = grid.get_best_result()
    assert lr_of(best.config) == 0.3 and iterations[0.3] == EPOCHS
    assert Result.from_path(best.metrics["run_path"]).metrics["loss"] == best.metrics["loss"]


def _reports(run_path: str) -> list[dict]:
    return [r["metrics"] for r in recorded_reports(run_path)]


def test_asha_stops_bad_trials_early_and_returns_the_best(tmp_path, ray_local):
    runs = tmp_path / "runs"
    before = set(train_worker_actors())
    tuner = tune.Tuner(
        with_resources(tune_loops.train_driver, tune_loops.SCALING),
        # Grid order is trial order; two trials run at once, so the good ones set each rung's bar.
        param_space={"lr": tune.grid_search([0.3, 0.1, 0.0, 0.001]), "epochs": EPOCHS, "storage_path": str(runs)},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", scheduler=ASHAScheduler(max_t=EPOCHS, grace_period=1, reduction_factor=2)
        ),
        run_config=tune.RunConfig(name="asha", storage_path=str(tmp_path / "tune"), verbose=0),
    )
    grid = tuner.fit()

    assert not grid.errors
    by_lr = {r.config["lr"]: r for r in grid}
    iterations = {lr: r.metrics["training_iteration"] for lr, r in by_lr.items()}
    stopped = [lr for lr, n in iterations.items() if n < EPOCHS]
    assert 0.0 in stopped, iterations  # lr=0 never learns: ASHA cuts it at the first rung
    assert iterations[0.3] == EPOCHS  # the best trial is never cut

    best = grid.get_best_result()
    assert best.config["lr"] == 0.3
    assert best.metrics["loss"] == min(r.metrics["loss"] for r in grid)
    # The metrics Tune saw are the run's own reports, with the committed checkpoint's path.
    ours = Result.from_path(best.metrics["run_path"])
    assert ours.metrics["loss"] == best.metrics["loss"] and len(ours.metrics_dataframe) == EPOCHS
    assert best.metrics["checkpoint_path"] == ours.checkpoint.path
    assert (pathlib.Path(best.metrics["checkpoint_path"]) / "model.pt").is_file()
    # An early-stopped trial's run holds no more reports than Tune received from it.
    cut = by_lr[0.0]
    assert len(_reports(cut.metrics["run_path"])) < EPOCHS
    assert pathlib.Path(cut.metrics["run_path"]).parent == runs
    # Every trial's workers are gone (their processes too), and so is every placement group,
    # Tune's trial groups included.
    assert len(set(train_worker_actors()) - before) == len(by_lr)  # one worker per trial was started
    assert_no_leaks(new_since=before)


def test_a_trainer_bigger_than_its_trial_fails_before_any_worker_starts(tmp_path, ray_local):
    before = set(train_worker_actors())
    tuner = tune.Tuner(
        with_resources(tune_loops.train_driver, tune_loops.SCALING),  # 1 worker reserved ...
        param_space={"lr": 0.1, "epochs": 1, "num_workers": 2, "storage_path": str(tmp_path / "runs")},  # ... 2 asked
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="too-big", storage_path=str(tmp_path / "tune"), verbose=0),
    )
    grid = tuner.fit()

    assert len(grid.errors) == 1
    message = str(grid.errors[0])
    assert "InsufficientResourcesError" in message and "2 workers" in message
    assert "trainers.tune.with_resources(fn, scaling_config)" in message
    assert set(train_worker_actors()) == before  # no worker was started


def test_helpers_reject_bad_arguments_and_use_outside_tune():
    with pytest.raises(TypeError, match=r"scaling_config=2: must be the trainers.ScalingConfig"):
        trial_resources(2)
    with pytest.raises(ValueError, match=r"driver_resources\['CPU'\]=-1: must be a number >= 0"):
        trial_resources(ScalingConfig(num_workers=1), driver_resources={"CPU": -1})
    with pytest.raises(TypeError, match=r"trainable='train': must be the function"):
        with_resources("train", ScalingConfig(num_workers=1))
    with pytest.raises(NotInTuneTrialError, match=r"TuneReportCallback\(\) works only inside a Ray Tune trial"):
        TuneReportCallback()


def test_trial_resources_reserve_the_trial_and_each_worker():
    factory = trial_resources(
        ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}, placement_strategy="SPREAD")
    )
    assert factory.bundles == [{"CPU": 1}, {"CPU": 0.5}, {"CPU": 0.5}]
    assert factory.strategy == "SPREAD"
    assert factory.required_resources == {"CPU": 2.0}
    free_driver = trial_resources(ScalingConfig(num_workers=1), driver_resources={})
    assert free_driver.bundles == [{"CPU": 1}] and free_driver.head_bundle_is_empty


def test_insufficient_resources_error_is_a_value_error():
    assert issubclass(InsufficientResourcesError, ValueError)


def test_a_trial_that_reserves_nothing_for_itself_puts_every_bundle_to_work(tmp_path, ray_local):
    tuner = tune.Tuner(
        with_resources(tune_loops.train_driver, tune_loops.SCALING, driver_resources={}),
        param_space={"lr": 0.1, "epochs": 2, "storage_path": str(tmp_path / "runs")},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="no-driver-bundle", storage_path=str(tmp_path / "tune"), verbose=0),
    )
    grid = tuner.fit()
    assert not grid.errors
    assert [m["epoch"] for m in _reports(grid[0].metrics["run_path"])] == [0, 1]


def test_a_trial_tune_restarts_resumes_its_run_from_the_latest_checkpoint(tmp_path, ray_local):
    marker = tmp_path / "failed-once"
    tuner = tune.Tuner(
        with_resources(tune_loops.train_driver, tune_loops.SCALING),
        param_space={"lr": 0.1, "epochs": 3, "storage_path": str(tmp_path / "runs"), "fail_once_marker": str(marker)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            name="restart",
            storage_path=str(tmp_path / "tune"),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=1),
        ),
    )
    grid = tuner.fit()

    assert not grid.errors and marker.exists()
    result = grid[0]
    run = json.loads((pathlib.Path(result.metrics["run_path"]) / "run.json").read_text())
    assert [r["metrics"]["epoch"] for r in recorded_reports(result.metrics["run_path"])] == [
        0,
        1,
        2,
    ]  # epoch 2 only was trained again
    assert run["attempt"] == 2 and run["finished"]
    assert result.metrics["epoch"] == 2


# -- Ray's own forms, unchanged, on a cluster that fits one trainer at a time ---------------------


def test_rays_documented_with_resources_pattern_sweeps_with_asha_on_two_cpus(tmp_path, ray_two_cpus):
    # Each trial holds 0.1 CPU; each trainer's 1-CPU worker group is placed outside it, so the four
    # trials all start and their trainers take turns, waiting longer than the start timeout.
    tuner = tune.Tuner(
        tune.with_resources(tune_loops.train_driver, {"CPU": 0.1}),
        param_space={
            "lr": tune.grid_search([0.3, 0.1, 0.001, 0.0]),
            "epochs": EPOCHS,
            "storage_path": str(tmp_path / "runs"),
        },
        tune_config=_asha(),
        run_config=tune.RunConfig(name="ray-docs", storage_path=str(tmp_path / "tune"), verbose=0),
    )
    grid = tuner.fit()

    _check_asha_sweep(grid, lambda config: config["lr"])
    assert_no_leaks()


def test_a_trainer_object_with_a_train_loop_config_param_space_sweeps_with_asha(tmp_path, ray_two_cpus):
    trainer = tune_loops.trainer_object(str(tmp_path / "runs"), EPOCHS)
    tuner = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([0.3, 0.1, 0.001, 0.0])}},
        tune_config=_asha(),
        run_config=tune.RunConfig(name="trainer-object", storage_path=str(tmp_path / "tune"), verbose=0),
    )
    grid = tuner.fit()

    _check_asha_sweep(grid, lambda config: config["train_loop_config"]["lr"])
    runs = {pathlib.Path(r.metrics["run_path"]) for r in grid}
    assert len(runs) == 4 and {run.parent for run in runs} == {tmp_path / "runs"}  # one run per trial
    assert trainer.train_loop_config == {"epochs": EPOCHS}  # the user's trainer is left as it was
    assert_no_leaks()


def test_a_trial_that_could_never_fit_beside_itself_fails_at_once(tmp_path, ray_two_cpus):
    # 2 workers x 1 CPU fit the 2-CPU cluster, but never beside the 0.1 CPU the trial itself holds.
    before = set(train_worker_actors())
    tuner = tune.Tuner(
        tune.with_resources(tune_loops.train_driver, {"CPU": 0.1}),
        param_space={"lr": 0.1, "epochs": 1, "num_workers": 2, "storage_path": str(tmp_path / "runs")},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="never-fits", storage_path=str(tmp_path / "tune"), verbose=0),
    )
    grid = tuner.fit()

    assert len(grid.errors) == 1
    message = str(grid.errors[0])
    assert "InsufficientResourcesError" in message
    assert "2 workers x {CPU: 1}" in message and "{CPU: 0.1} this Tune trial holds" in message
    assert set(train_worker_actors()) == before  # it failed before any worker started
    assert not live_placement_groups()


def test_a_trainer_object_trial_rejects_other_param_space_keys(tmp_path, ray_two_cpus):
    tuner = tune.Tuner(
        tune_loops.trainer_object(str(tmp_path / "runs"), 1),
        param_space={"lr": 0.1},
        run_config=tune.RunConfig(name="bad-key", storage_path=str(tmp_path / "tune"), verbose=0),
    )
    grid = tuner.fit()
    assert len(grid.errors) == 1
    assert "param_space has 'lr'" in str(grid.errors[0]) and '"train_loop_config"' in str(grid.errors[0])


def test_a_trainer_objects_trial_reserves_one_bundle_per_worker():
    trainer = tune_loops.trainer_object("/tmp/unused", 1)
    factory = trainer._resources
    assert factory.head_bundle_is_empty and factory.required_resources == {"CPU": 1.0}
    assert trainer._name == "TorchTrainer"
    assert tune.with_resources(trainer, {"CPU": 0.1})._resources.bundles == [{"CPU": 0.1}]  # Ray's form overrides it
    with pytest.raises(NotInTuneTrialError, match=r"TorchTrainer\(config\) works only inside a Ray Tune trial"):
        trainer({"train_loop_config": {"lr": 0.1}})


def test_trials_whose_own_processes_hold_every_cpu_fail_instead_of_waiting_forever(tmp_path, ray_two_cpus):
    # Two trials of 0.7 CPU run at once and leave 0.6 CPU: neither trainer's 1-CPU group can ever
    # be placed, and neither trial ends on its own. Each fits beside itself, so only waiting shows it.
    tuner = tune.Tuner(
        tune.with_resources(tune_loops.train_driver, {"CPU": 0.7}),
        param_space={"lr": tune.grid_search([0.1, 0.2]), "epochs": 1, "storage_path": str(tmp_path / "runs")},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="stuck", storage_path=str(tmp_path / "tune"), verbose=0),
    )
    grid = tuner.fit()  # returns: no trial waits forever

    # A trial that fails frees its 0.7 CPU, which may let the other one train.
    assert 1 <= len(grid.errors) <= 2
    for error in grid.errors:
        assert "InsufficientResourcesError" in str(error) and "no trainer is training" in str(error)
        assert "max_concurrent_trials" in str(error)
