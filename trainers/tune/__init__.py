"""Hyperparameter search with Ray Tune over flowtrain's trainers (docs/tuning.md, "With Ray Tune",
has the example).

Each Tune trial runs a function that builds a trainer from the trial's config and calls
``fit()``; the trainer's controller runs in the trial's process. Ray's own forms run unchanged
(``tune.with_resources(fn, {"CPU": 0.1})``, a trainer object as the trainable); ``with_resources``
below reserves the workers with the trial instead, up front. ``import trainers`` never imports
Ray Tune; ``import trainers.tune`` does.
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
