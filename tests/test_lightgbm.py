"""LightGBMTrainer on real data (scikit-learn's breast cancer set, shipped inside the package):
LightGBM's own network between the workers, bins shared by all workers, reported per round,
checkpointed, resumed.

LightGBM's data-parallel learner is exact only where its algorithm is: with a constant hessian
(squared error) two workers grow the single process's trees; with the binary objective it
estimates child row counts from hessian sums (one process counts rows), so trees built where
``min_data_in_leaf`` binds can differ. The exactness tests use squared error for that reason.
"""

from __future__ import annotations

import numpy as np
import pytest

import gbdt_loops as loops
from trainers import DataConfig, FailureConfig, RunConfig, ScalingConfig
from trainers.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_model, get_network_params

pytestmark = pytest.mark.usefixtures("ray_local")

ROUNDS = 30


@pytest.fixture(scope="module")
def frames():
    return loops.breast_cancer_frames()


def datasets(frames):
    import ray.data

    train, valid = frames
    return {"train": ray.data.from_pandas(train), "valid": ray.data.from_pandas(valid)}


def param_form(frames, tmp_path, name, params, *, num_workers=2, max_failures=0, recorder=None, **train_kwargs):
    return LightGBMTrainer(
        datasets=datasets(frames),
        label_column=loops.LABEL,
        params=params,
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


def test_two_workers_grow_the_trees_of_lightgbm_alone(frames, tmp_path):
    curve, booster = loops.lightgbm_alone(ROUNDS, loops.LGB_L2_PARAMS)
    result = param_form(frames, tmp_path, "l2", loops.LGB_L2_PARAMS)
    frame = result.metrics_dataframe
    assert len(frame) == ROUNDS  # one row per round
    assert {"train-l2", "valid-l2"} <= set(frame.columns)
    print(
        f"validation l2 after {ROUNDS} rounds: lightgbm alone {curve[-1]:.6f}, 2 workers {frame['valid-l2'].iloc[-1]:.6f}"
    )
    # Shared bins (trainers.lightgbm.shared_bins): every round equals the single process. With
    # LightGBM's own per-worker bins the same run is 2-7% off.
    np.testing.assert_allclose(frame["valid-l2"], curve, rtol=1e-6)
    model = get_model(result.checkpoint)
    assert model.current_iteration() == ROUNDS
    x = loops.xy(frames[1])[0]
    np.testing.assert_allclose(model.predict(x), booster.predict(x), rtol=1e-6)


@pytest.fixture(scope="module")
def binary_two_workers(frames, tmp_path_factory):
    """The parameter form, binary objective, on 2 workers without failure."""
    return param_form(frames, tmp_path_factory.mktemp("lgb"), "binary", loops.LGB_PARAMS)


def test_two_workers_reach_the_logloss_of_lightgbm_alone_within_one_percent(binary_two_workers):
    curve, _ = loops.lightgbm_alone(ROUNDS)
    frame = binary_two_workers.metrics_dataframe
    assert len(frame) == ROUNDS and {"train-binary_logloss", "valid-binary_logloss"} <= set(frame.columns)
    alone, distributed = curve[-1], frame["valid-binary_logloss"].iloc[-1]
    print(f"validation logloss after {ROUNDS} rounds: lightgbm alone {alone:.6f}, 2 workers {distributed:.6f}")
    # One-sided on purpose: LightGBM's data-parallel learner is not the serial one (children's row
    # counts are estimated from hessian sums, see the module docstring), so the curves part after
    # a few rounds; here the 2-worker model ends 1.7% *better*. What must hold is that distributing
    # costs no more than 1% of quality; exactness of our wiring is the squared-error test above.
    assert distributed <= 1.01 * alone


def test_a_port_taken_before_lightgbm_binds_it_restarts_on_new_ports_for_free(tmp_path):
    marker = tmp_path / "stolen"
    recorder = loops.Recorder()
    result = LightGBMTrainer(
        loops.lightgbm_port_thief_loop,
        train_loop_config={"rounds": 5, "marker": str(marker)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="thief", storage_path=str(tmp_path), callbacks=[recorder]),  # max_failures=0
    ).fit()
    assert marker.exists()
    ((_, failures),) = recorder.restarts
    assert failures[0].world_rank == 0 and "Binding port" in failures[0].message
    assert get_model(result.checkpoint).current_iteration() == 5
    assert len(result.metrics_dataframe) == 5


def test_sigkill_of_a_rank_resumes_boosting_from_the_last_checkpoint(frames, tmp_path, binary_two_workers):
    marker = tmp_path / "kill-marker"
    recorder = loops.Recorder()
    result = param_form(
        frames,
        tmp_path,
        "killed",
        loops.LGB_PARAMS,
        max_failures=1,
        recorder=recorder,
        callbacks=[loops.LightGBMKillOnce(at=12, rank=1, marker=str(marker))],
    )
    assert marker.exists()
    ((rounds_before, failures),) = recorder.restarts
    # Rank 0 may fail too (its peer's socket reset); the killed rank is listed first.
    assert failures[0].world_rank == 1 and failures[0].kind == "died"
    assert 0 < rounds_before <= 12
    assert get_model(result.checkpoint).current_iteration() == ROUNDS  # not 12 + 30, not 30 from scratch
    frame = result.metrics_dataframe
    assert len(frame) == ROUNDS  # every round once
    # Resuming from the checkpoint's model boosts exactly as the run that was not killed.
    np.testing.assert_allclose(
        frame["valid-binary_logloss"], binary_two_workers.metrics_dataframe["valid-binary_logloss"], rtol=1e-6
    )


def test_training_function_form_with_shared_bins_resumes_a_rerun(frames, tmp_path):
    curve, _ = loops.lightgbm_alone(ROUNDS, loops.LGB_L2_PARAMS)

    def fit(rounds):
        return LightGBMTrainer(
            loops.lightgbm_loop,
            train_loop_config={"params": loops.LGB_L2_PARAMS, "rounds": rounds, "frequency": 5},
            datasets=datasets(frames),
            dataset_config=DataConfig(datasets_to_split=["train"]),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="rerun", storage_path=str(tmp_path)),
        ).fit()

    first = fit(20)
    assert first.return_value == {"resumed_from": 0}
    second = fit(ROUNDS)  # the same run, 10 more rounds: resumes from the 20-round model
    assert second.return_value == {"resumed_from": 20}
    assert RayTrainReportCallback.get_model(second.checkpoint).current_iteration() == ROUNDS
    losses = second.metrics_dataframe["loss"]
    assert len(losses) == ROUNDS
    np.testing.assert_allclose(losses, curve, rtol=1e-6)


def test_each_worker_gets_its_own_port_and_the_list_of_all(tmp_path):
    recorder = loops.Recorder()
    LightGBMTrainer(
        loops.network_params_loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="network", storage_path=str(tmp_path), callbacks=[recorder]),
    ).fit()
    (reported,) = recorder.rounds
    machines = reported[0]["machines"].split(",")
    assert reported[1]["machines"] == reported[0]["machines"] and len(machines) == 2
    assert [m["num_machines"] for m in reported] == [2, 2]
    # LightGBM's rank is the position in `machines`: world rank r listens on entry r.
    for rank, params in enumerate(reported):
        assert machines[rank].endswith(f":{params['local_listen_port']}")
    assert reported[0]["local_listen_port"] != reported[1]["local_listen_port"]


def test_local_mode_trains_in_this_process_and_needs_no_network(frames, tmp_path):
    curve, _ = loops.lightgbm_alone(ROUNDS)
    result = param_form(frames, tmp_path, "local", loops.LGB_PARAMS, num_workers=0)
    np.testing.assert_allclose(result.metrics_dataframe["valid-binary_logloss"], curve, rtol=1e-9)
    with pytest.raises(RuntimeError, match="only inside train_loop_per_worker"):
        get_network_params()


def test_report_callback_selects_renames_and_checkpoints_every_frequency_rounds(tmp_path):
    result = LightGBMTrainer(
        loops.lightgbm_callback_loop,
        train_loop_config={"rounds": 10, "callback": {"metrics": {"loss": "valid-binary_logloss"}, "frequency": 3}},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="callback", storage_path=str(tmp_path)),
    ).fit()
    assert list(result.metrics_dataframe.columns) == ["loss"] and len(result.metrics_dataframe) == 10
    assert len(result.best_checkpoints) == 4  # rounds 2, 5, 8 and the last one
    assert get_model(result.checkpoint).current_iteration() == 10

    listed = LightGBMTrainer(
        loops.lightgbm_callback_loop,
        train_loop_config={"rounds": 4, "callback": {"metrics": "train-binary_logloss", "checkpoint_at_end": False}},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="listed", storage_path=str(tmp_path)),
    ).fit()
    assert list(listed.metrics_dataframe.columns) == ["train-binary_logloss"] and listed.checkpoint is None
