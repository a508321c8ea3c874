"""XGBoostTrainer on real data (scikit-learn's breast cancer set, shipped inside the package):
distributed through xgboost's collective, reported per round, checkpointed, resumed."""

from __future__ import annotations

import numpy as np
import pytest

import gbdt_loops as loops
from trainers import Checkpoint, DataConfig, FailureConfig, RunConfig, ScalingConfig
from trainers.xgboost import RayTrainReportCallback, XGBoostTrainer, get_model

pytestmark = pytest.mark.usefixtures("ray_local")

ROUNDS = 30


@pytest.fixture(scope="module")
def frames():
    return loops.breast_cancer_frames()


@pytest.fixture(scope="module")
def alone():
    """The library alone, in this process: validation logloss per round and the booster."""
    return loops.xgboost_alone(ROUNDS)


def datasets(frames):
    import ray.data

    train, valid = frames
    return {"train": ray.data.from_pandas(train), "valid": ray.data.from_pandas(valid)}


def param_form(frames, tmp_path, name, *, num_workers=2, max_failures=0, recorder=None, **train_kwargs):
    return XGBoostTrainer(
        datasets=datasets(frames),
        label_column=loops.LABEL,
        params=loops.XGB_PARAMS,
        num_boost_round=ROUNDS,
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=max_failures),
            callbacks=[recorder] if recorder else None,
        ),
        **train_kwargs,
    ).fit()


@pytest.fixture(scope="module")
def two_workers(frames, tmp_path_factory):
    """The parameter form on 2 workers, no failure (the baseline the restart test compares with)."""
    return param_form(frames, tmp_path_factory.mktemp("xgb"), "two-workers")


def test_two_workers_reach_the_validation_logloss_of_xgboost_alone(two_workers, alone, frames):
    curve, booster = alone
    frame = two_workers.metrics_dataframe
    # One row per boosting round, with xgboost's own metric names.
    assert len(frame) == ROUNDS
    assert {"train-logloss", "valid-logloss"} <= set(frame.columns)
    distributed, single = frame["valid-logloss"].iloc[-1], curve[-1]
    print(f"validation logloss after {ROUNDS} rounds: xgboost alone {single:.6f}, 2 workers {distributed:.6f}")
    assert abs(distributed - single) <= 0.01 * single
    # xgboost's distributed sketch and histogram all-reduce give the single-process trees.
    np.testing.assert_allclose(frame["valid-logloss"], curve, rtol=1e-5)
    model = get_model(two_workers.checkpoint)
    assert model.num_boosted_rounds() == ROUNDS
    import xgboost

    features = frames[1].drop(columns=loops.LABEL)
    np.testing.assert_allclose(
        model.predict(xgboost.DMatrix(features)), booster.predict(xgboost.DMatrix(features.to_numpy())), rtol=1e-5
    )


def test_sigkill_of_a_rank_resumes_boosting_from_the_last_checkpoint(frames, tmp_path, two_workers):
    marker = tmp_path / "kill-marker"
    recorder = loops.Recorder()
    result = param_form(
        frames,
        tmp_path,
        "killed",
        max_failures=1,
        recorder=recorder,
        callbacks=[loops.XGBoostKillOnce(at=12, rank=1, marker=str(marker))],
    )
    assert marker.exists()  # the kill fired, once: the second attempt ran past round 12
    ((rounds_before, failures),) = recorder.restarts
    assert failures[0].world_rank == 1 and failures[0].kind == "died"
    assert 0 < rounds_before <= 12
    model = get_model(result.checkpoint)
    assert model.num_boosted_rounds() == ROUNDS  # continued from the checkpoint, not from round 0
    # Every round's metrics exactly once, and the same boosting as without the kill.
    assert len(result.metrics_dataframe) == ROUNDS
    np.testing.assert_allclose(
        result.metrics_dataframe["valid-logloss"], two_workers.metrics_dataframe["valid-logloss"], rtol=1e-5
    )


def test_training_function_form_ranks_and_resuming_a_rerun(frames, tmp_path, alone):
    recorder = loops.Recorder()

    def fit(rounds):
        return XGBoostTrainer(
            loops.xgboost_loop,
            train_loop_config={"params": loops.XGB_PARAMS, "rounds": rounds, "frequency": 5},
            datasets=datasets(frames),
            dataset_config=DataConfig(datasets_to_split=["train"]),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="rerun", storage_path=str(tmp_path), callbacks=[recorder]),
        ).fit()

    first = fit(20)
    # xgboost's ranks are the trainer's world ranks.
    assert [(m["world_rank"], m["xgb_rank"], m["xgb_world_size"]) for m in recorder.rounds[0]] == [(0, 0, 2), (1, 1, 2)]
    assert first.return_value == {"resumed_from": 0}
    assert get_model(first.checkpoint).num_boosted_rounds() == 20

    # The same run again with more rounds: it resumes from the 20-round model (the user pattern
    # in loops.xgboost_loop) and boosts 10 more.
    second = fit(ROUNDS)
    assert second.return_value == {"resumed_from": 20}
    assert RayTrainReportCallback.get_model(second.checkpoint).num_boosted_rounds() == ROUNDS
    losses = second.metrics_dataframe["loss"].dropna()
    assert len(losses) == ROUNDS  # 20 rounds, then 10 more: every round once
    np.testing.assert_allclose(losses, alone[0], rtol=1e-5)


def test_local_mode_trains_in_this_process(frames, tmp_path, alone):
    result = param_form(frames, tmp_path, "local", num_workers=0)
    assert get_model(result.checkpoint).num_boosted_rounds() == ROUNDS
    np.testing.assert_allclose(result.metrics_dataframe["valid-logloss"], alone[0], rtol=1e-6)


def test_report_callback_selects_renames_and_checkpoints_every_frequency_rounds(tmp_path):
    result = XGBoostTrainer(
        loops.xgboost_callback_loop,
        train_loop_config={
            "rounds": 10,
            "callback": {"metrics": {"loss": "valid-logloss"}, "frequency": 3, "filename": "m.json"},
        },
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="callback", storage_path=str(tmp_path)),
    ).fit()
    assert list(result.metrics_dataframe.columns) == ["loss"] and len(result.metrics_dataframe) == 10
    # Rounds 2, 5 and 8 (every third), and the last one (checkpoint_at_end), each once.
    assert len(result.best_checkpoints) == 4
    with pytest.raises(FileNotFoundError, match="has no 'model.ubj'"):
        get_model(result.checkpoint)
    assert get_model(result.checkpoint, filename="m.json").num_boosted_rounds() == 10

    listed = XGBoostTrainer(
        loops.xgboost_callback_loop,
        train_loop_config={"rounds": 4, "callback": {"metrics": ["train-logloss"], "checkpoint_at_end": False}},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="listed", storage_path=str(tmp_path)),
    ).fit()
    assert list(listed.metrics_dataframe.columns) == ["train-logloss"] and len(listed.metrics_dataframe) == 4
    assert listed.checkpoint is None


def test_report_callback_names_the_metrics_it_knows(tmp_path):
    from trainers import WorkerGroupError

    with pytest.raises(
        WorkerGroupError, match=r"no metric 'valid-auc'; it reported \['train-logloss', 'valid-logloss'\]"
    ):
        XGBoostTrainer(
            loops.xgboost_callback_loop,
            train_loop_config={"rounds": 2, "callback": {"metrics": ["valid-auc"]}},
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="unknown-metric", storage_path=str(tmp_path)),
        ).fit()
    with pytest.raises(ValueError, match="frequency=-1"):
        RayTrainReportCallback(frequency=-1)
    with pytest.raises(TypeError, match="get_model"):
        get_model("/not/a/checkpoint")
    assert isinstance(Checkpoint, type)
