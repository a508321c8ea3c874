"""Worker processes killed mid-run: the run resumes exactly where its last checkpoint left it."""

from __future__ import annotations

import pytest

import loops
from trainers import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, UserCallback, WorkerGroupError
from trainers.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("ray_local")

STEPS = 12


class Restarts(UserCallback):
    def __init__(self):
        self.steps, self.restarts = [], []

    def after_report(self, run_context, metrics, checkpoint):
        self.steps.append(metrics[0]["step"])

    def on_restart(self, run_context, failures, resume_from):
        self.restarts.append((len(self.steps), failures))


def fit(tmp_path, name, max_failures, **config):
    recorder = Restarts()
    trainer = TorchTrainer(
        loops.resumable_ddp_loop,
        train_loop_config={"steps": STEPS, **config},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=max_failures),
            callbacks=[recorder],
        ),
    )
    return trainer.fit(), recorder


def test_sigkill_of_a_rank_resumes_from_the_last_checkpoint_with_identical_weights(tmp_path):
    import torch

    baseline, _ = fit(tmp_path, "baseline", 0)
    marker = tmp_path / "kill-marker"
    result, recorder = fit(tmp_path, "killed", 2, kill_at=7, kill_rank=1, marker=str(marker))

    assert marker.exists()
    ((rounds_before, failures),) = recorder.restarts
    assert failures[0].world_rank == 1 and failures[0].kind == "died"
    # The step after the last committed checkpoint is the first one the new group reports.
    assert recorder.steps[:rounds_before] == list(range(rounds_before))
    assert recorder.steps[rounds_before] == rounds_before
    assert rounds_before <= 7
    # Every completed step's metrics appear exactly once in the run's history.
    assert list(result.metrics_dataframe["step"]) == list(range(STEPS))
    for name, value in result.return_value.items():
        torch.testing.assert_close(torch.tensor(value), torch.tensor(baseline.return_value[name]), rtol=0, atol=1e-6)


def test_budget_exhausted_names_rank_node_cause_and_attempts(tmp_path):
    with pytest.raises(WorkerGroupError) as info:
        fit(tmp_path, "exhausted", 1, kill_at=3, kill_rank=0)  # no marker: killed in every attempt
    error = info.value
    message = str(error)
    assert error.attempt == 2 and error.budget_exhausted
    assert "rank 0 on node" in message and "died" in message
    assert "max_failures=1, 1 restart(s) used" in message


def test_a_rank_that_hangs_before_a_collective_is_named_within_the_timeout(tmp_path):
    from trainers.torch import TorchConfig

    with pytest.raises(WorkerGroupError) as info:
        TorchTrainer(
            loops.hang_loop,
            train_loop_config={"sleeper": 1, "sleep_s": 120},
            torch_config=TorchConfig(timeout_s=3),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="hang", storage_path=str(tmp_path)),
        ).fit()
    message = str(info.value)
    assert "rank 0 on node" in message  # the rank whose all-reduce timed out
    # Rank 1 was still in its 120 s sleep when the group was torn down: the collective timeout
    # ended the run, not the sleep.
    assert "rank 1 on node" in message and "had not failed; it was running loops.py" in message
    assert 'time.sleep(config["sleep_s"])' in message


def test_a_rank_that_stops_reporting_is_named_after_the_report_timeout(tmp_path):
    with pytest.raises(WorkerGroupError) as info:
        TorchTrainer(
            loops.stuck_rank_loop,
            train_loop_config={"stuck": 0, "sleep_s": 120},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="stuck", storage_path=str(tmp_path), failure_config=FailureConfig(report_timeout_s=3)
            ),
        ).fit()
    message = str(info.value)
    assert "rank 0 on node" in message and "hung: TimeoutError: rank 0 has not reported step 1" in message
    assert "it is running loops.py" in message and 'time.sleep(config["sleep_s"])' in message
