"""Data, training functions and callbacks the XGBoost/LightGBM tests run on workers (a module,
so workers import it by name)."""

from __future__ import annotations

import os
import signal

import xgboost

import trainers

LABEL = "target"
XGB_PARAMS = {
    "objective": "binary:logistic",
    "eval_metric": "logloss",
    "eta": 0.1,
    "max_depth": 3,
    "tree_method": "hist",
    "seed": 0,
}
LGB_PARAMS = {
    "objective": "binary",
    "metric": "binary_logloss",
    "learning_rate": 0.1,
    "num_leaves": 15,
    "seed": 0,
    "deterministic": True,
    "verbose": -1,
}
#: Squared error on the 0/1 label: a constant hessian, for which LightGBM's data-parallel learner
#: is exact (with the binary objective it estimates row counts from hessian sums; see test_lightgbm).
LGB_L2_PARAMS = {**LGB_PARAMS, "objective": "regression", "metric": "l2"}


def breast_cancer_frames():
    """scikit-learn's breast cancer data (shipped inside the package: no download), split 456/113 (an even training set: equal shards drop no row)."""
    import pandas as pd
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(x.shape[1])])
    frame[LABEL] = y.astype("int64")
    train, valid = train_test_split(frame, test_size=113, random_state=0, stratify=frame[LABEL])
    return train.reset_index(drop=True), valid.reset_index(drop=True)


def xy(frame):
    return frame.drop(columns=LABEL).to_numpy(), frame[LABEL].to_numpy()


# -- the library alone --------------------------------------------------------------------------


def xgboost_alone(rounds: int):
    """Validation logloss per round and the booster of plain xgboost.train in this process."""
    train, valid = breast_cancer_frames()
    history: dict = {}
    booster = xgboost.train(
        XGB_PARAMS,
        xgboost.DMatrix(*xy(train)),
        num_boost_round=rounds,
        evals=[(xgboost.DMatrix(*xy(valid)), "valid")],
        evals_result=history,
        verbose_eval=False,
    )
    return history["valid"]["logloss"], booster


def lightgbm_alone(rounds: int, params: dict | None = None):
    """Validation metric per round (the first metric of ``params``) and the booster of plain
    lightgbm.train in this process."""
    import lightgbm

    train, valid = breast_cancer_frames()
    history: dict = {}
    train_set = lightgbm.Dataset(*xy(train))
    booster = lightgbm.train(
        params or LGB_PARAMS,
        train_set,
        num_boost_round=rounds,
        valid_sets=[lightgbm.Dataset(*xy(valid), reference=train_set)],
        valid_names=["valid"],
        callbacks=[lightgbm.record_evaluation(history)],
    )
    (curve,) = history["valid"].values()
    return curve, booster


# -- callbacks ------------------------------------------------------------------------------------


def _kill_once(marker: str) -> None:
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


class XGBoostKillOnce(xgboost.callback.TrainingCallback):
    """An xgboost callback: rank ``rank`` SIGKILLs its own process after round ``at``, once (the
    marker file remembers)."""

    def __init__(self, at: int, rank: int, marker: str) -> None:
        super().__init__()
        self.at, self.rank, self.marker = at, rank, marker

    def after_iteration(self, model, epoch, evals_log) -> bool:
        if epoch == self.at and trainers.get_context().get_world_rank() == self.rank:
            _kill_once(self.marker)
        return False


class LightGBMKillOnce:
    """A lightgbm callback: rank ``rank`` SIGKILLs its own process after round ``at``, once."""

    order = 10  # before the report callback: the round being killed is never reported

    def __init__(self, at: int, rank: int, marker: str) -> None:
        self.at, self.rank, self.marker = at, rank, marker

    def __call__(self, env) -> None:
        if env.iteration == self.at and trainers.get_context().get_world_rank() == self.rank:
            _kill_once(self.marker)


# -- training functions (the V2 form), written as a Ray Train user would ---------------------------


def xgboost_loop(config: dict) -> dict:
    """xgboost.train on this worker's shard; resumes from get_checkpoint() for the remaining rounds."""
    from xgboost import collective

    from trainers.xgboost import RayTrainReportCallback

    context = trainers.get_context()
    trainers.report(
        {
            "world_rank": context.get_world_rank(),
            "xgb_rank": collective.get_rank(),
            "xgb_world_size": collective.get_world_size(),
        }
    )
    booster = None
    checkpoint = trainers.get_checkpoint()
    if checkpoint is not None:
        booster = RayTrainReportCallback.get_model(checkpoint)
    done = booster.num_boosted_rounds() if booster is not None else 0
    train = trainers.get_dataset_shard("train").materialize().to_pandas()
    valid = trainers.get_dataset_shard("valid").materialize().to_pandas()
    xgboost.train(
        config["params"],
        xgboost.DMatrix(*xy(train)),
        num_boost_round=config["rounds"] - done,
        evals=[(xgboost.DMatrix(*xy(valid)), "valid")],
        xgb_model=booster,
        verbose_eval=False,
        callbacks=[RayTrainReportCallback(metrics={"loss": "valid-logloss"}, frequency=config.get("frequency", 0))],
    )
    return {"resumed_from": done}


def lightgbm_loop(config: dict) -> dict:
    """lightgbm.train on this worker's shard with the trainer's network and shared bins; resumes
    from get_checkpoint() for the remaining rounds."""
    import lightgbm

    import trainers.lightgbm as tlgb

    booster = None
    checkpoint = trainers.get_checkpoint()
    if checkpoint is not None:
        booster = tlgb.RayTrainReportCallback.get_model(checkpoint)
    done = booster.current_iteration() if booster is not None else 0
    train = trainers.get_dataset_shard("train").materialize().to_pandas()
    valid = trainers.get_dataset_shard("valid").materialize().to_pandas()
    x, y = xy(train)
    params = {**config["params"], "tree_learner": "data_parallel", **tlgb.get_network_params()}
    reference = tlgb.shared_bins(x, params) if config.get("shared_bins", True) else None
    train_set = lightgbm.Dataset(x, y, reference=reference)
    lightgbm.train(
        params,
        train_set,
        num_boost_round=config["rounds"] - done,
        valid_sets=[lightgbm.Dataset(*xy(valid), reference=train_set)],
        valid_names=["valid"],
        init_model=booster,
        callbacks=[
            tlgb.RayTrainReportCallback(
                metrics={"loss": f"valid-{params['metric']}"}, frequency=config.get("frequency", 0)
            )
        ],
    )
    return {"resumed_from": done}


def xgboost_callback_loop(config: dict) -> None:
    """Plain xgboost.train on the whole breast cancer data (no datasets), reporting through
    RayTrainReportCallback(**config["callback"])."""
    from trainers.xgboost import RayTrainReportCallback

    train, valid = breast_cancer_frames()
    xgboost.train(
        XGB_PARAMS,
        xgboost.DMatrix(*xy(train)),
        num_boost_round=config["rounds"],
        evals=[(xgboost.DMatrix(*xy(train)), "train"), (xgboost.DMatrix(*xy(valid)), "valid")],
        verbose_eval=False,
        callbacks=[RayTrainReportCallback(**config["callback"])],
    )


def lightgbm_callback_loop(config: dict) -> None:
    """Plain lightgbm.train on the whole breast cancer data (no datasets), reporting through
    RayTrainReportCallback(**config["callback"])."""
    import lightgbm

    from trainers.lightgbm import RayTrainReportCallback

    train, valid = breast_cancer_frames()
    train_set = lightgbm.Dataset(*xy(train))
    lightgbm.train(
        LGB_PARAMS,
        train_set,
        num_boost_round=config["rounds"],
        valid_sets=[train_set, lightgbm.Dataset(*xy(valid), reference=train_set)],
        valid_names=["train", "valid"],
        callbacks=[RayTrainReportCallback(**config["callback"])],
    )


def network_params_loop() -> None:
    """Reports what get_network_params() gives this worker."""
    import trainers.lightgbm as tlgb

    trainers.report({"rank": trainers.get_context().get_world_rank(), **tlgb.get_network_params()})


def lightgbm_port_thief_loop(config: dict) -> None:
    """lightgbm.train on half the breast cancer rows per rank; on the first attempt another socket
    takes rank 0's port right after get_network_params() frees it (the race the trainer retries)."""
    import pathlib
    import socket

    import lightgbm

    import trainers.lightgbm as tlgb

    rank = trainers.get_context().get_world_rank()
    params = {**LGB_PARAMS, "tree_learner": "data_parallel", **tlgb.get_network_params()}
    thief = None
    marker = pathlib.Path(config["marker"])
    if rank == 0 and not marker.exists():
        marker.touch()
        thief = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        thief.bind(("", params["local_listen_port"]))
        thief.listen()
    train, _ = breast_cancer_frames()
    x, y = xy(train)
    lightgbm.train(
        params,
        lightgbm.Dataset(x[rank::2], y[rank::2]),
        num_boost_round=config["rounds"],
        callbacks=[tlgb.RayTrainReportCallback()],
    )


class Recorder(trainers.UserCallback):
    """Driver-side callback for the tests: every rank's metrics of every committed round, and the restarts."""

    def __init__(self):
        self.rounds, self.restarts = [], []

    def after_report(self, run_context, metrics, checkpoint):
        self.rounds.append(metrics)

    def on_restart(self, run_context, failures, resume_from):
        self.restarts.append((len(self.rounds), failures))
