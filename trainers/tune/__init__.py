"""Hyperparameter search with Ray Tune over flowtrain's trainers.

Each Tune trial runs a function that builds a trainer from the trial's config and calls
``fit()``; the trainer's controller runs in the trial's process. Ray's own forms run unchanged:
with ``tune.with_resources(fn, {"CPU": 0.1})`` each trainer reserves its workers' placement group
beside the trial's (trials that do not all fit take turns), and a trainer object is a trainable
(``tune.Tuner(trainer, param_space={"train_loop_config": {...}})``). ``with_resources`` below
reserves the workers with the trial instead, up front::

    from ray import tune
    from trainers.tune import TuneReportCallback, trial_run_config, with_resources

    scaling = ScalingConfig(num_workers=2)

    def train_driver(config):
        TorchTrainer(train_loop, train_loop_config=config, scaling_config=scaling,
                     run_config=trial_run_config(RunConfig(storage_path="/abs/runs"))).fit()

    tuner = tune.Tuner(with_resources(train_driver, scaling), param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                       tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler()))
    best = tuner.fit().get_best_result()

``import trainers`` never imports Ray Tune; ``import trainers.tune`` does.
"""

from trainers.tune.callback import CHECKPOINT_PATH_KEY, RUN_PATH_KEY, NotInTuneTrialError, TuneReportCallback
from trainers.tune.trial import trainer_trial_resources, trial_resources, trial_run_config, with_resources

__all__ = [
    "CHECKPOINT_PATH_KEY",
    "RUN_PATH_KEY",
    "NotInTuneTrialError",
    "TuneReportCallback",
    "trial_resources",
    "trial_run_config",
    "trainer_trial_resources",
    "with_resources",
]
