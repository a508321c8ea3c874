"""trainers.collective on a real local Ray: barrier() and broadcast_from_rank_zero() across 2
workers, their errors, and local mode."""

from __future__ import annotations

import os
import threading
import time

import pytest

from trainers import RunConfig, ScalingConfig, TrainingFailedError, UserCallback, get_context
from trainers.collective import barrier, broadcast_from_rank_zero
from trainers.torch import TorchTrainer


class EveryRanksMetrics(UserCallback):
    def __init__(self):
        self.rounds = []

    def after_report(self, run_context, metrics, checkpoint):
        self.rounds.append(metrics)


def synchronising_loop(config):
    rank = get_context().get_world_rank()
    chosen = broadcast_from_rank_zero(f"chosen by pid {os.getpid()}" if rank == 0 else "ignored")
    marker = os.path.join(config["dir"], "rank-1-was-here")
    if rank == 1:
        time.sleep(1.0)  # rank 0 reaches the barrier first and must wait for this file
        open(marker, "w").close()
    barrier()
    saw_marker = os.path.exists(marker)
    in_order = all(broadcast_from_rank_zero(i if rank == 0 else -1) == i for i in range(20))
    train_report({"chosen": chosen, "saw_marker": saw_marker, "in_order": in_order, "pid": os.getpid()})


def train_report(metrics):
    import trainers

    trainers.report(metrics)


def unpicklable_broadcast_loop():
    broadcast_from_rank_zero(threading.Lock() if get_context().get_world_rank() == 0 else None)


@pytest.mark.usefixtures("ray_local")
def test_every_rank_gets_rank_0s_value_and_no_rank_passes_a_barrier_before_all_reach_it(tmp_path):
    metrics = EveryRanksMetrics()

    TorchTrainer(
        synchronising_loop,
        train_loop_config={"dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="collective", storage_path=str(tmp_path / "runs"), callbacks=[metrics]),
    ).fit()

    [ranks] = metrics.rounds
    rank_0_pid = ranks[0]["pid"]
    assert ranks[1]["pid"] != rank_0_pid
    assert [r["chosen"] for r in ranks] == [f"chosen by pid {rank_0_pid}"] * 2
    assert [r["saw_marker"] for r in ranks] == [True, True]
    assert [r["in_order"] for r in ranks] == [True, True]


@pytest.mark.usefixtures("ray_local")
def test_a_broadcast_that_cannot_pickle_fails_the_run_naming_the_call_and_the_waiting_rank_is_not_stuck(tmp_path):
    with pytest.raises(TrainingFailedError) as failed:
        TorchTrainer(
            unpicklable_broadcast_loop,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="collective-bad", storage_path=str(tmp_path)),
        ).fit()

    assert "broadcast_from_rank_zero(data=lock)" in str(failed.value)
    assert "must pickle" in str(failed.value)


def test_in_local_mode_the_calls_return_at_once(tmp_path):
    def loop():
        barrier()
        train_report({"got": broadcast_from_rank_zero({"run": 7})})

    result = TorchTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="collective-local", storage_path=str(tmp_path)),
    ).fit()

    assert result.metrics["got"] == {"run": 7}


def test_outside_a_training_function_the_calls_say_where_they_work():
    with pytest.raises(RuntimeError, match=r"barrier\(\) works only inside train_loop_per_worker"):
        barrier()
    with pytest.raises(RuntimeError, match=r"broadcast_from_rank_zero\(\) works only inside"):
        broadcast_from_rank_zero(1)
