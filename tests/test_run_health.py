"""A run's health while it trains (issue 48): stragglers named once per episode, and each rank's
peak memory kept in the run's record.

The judge (``StragglerWatch``) is tested on scripted step times; the controller, with scripted
workers, says a straggler everywhere a user looks; and a real 2-worker torch run whose rank 1
sleeps 0.2 s every step (its all-reduce marked as waiting) has rank 1 named within 10 steps,
while the same run without the sleep names nobody.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from storage.health import MemoryPeak, RunHealth, StragglerRecord
from storage.snapshot import RunSnapshot
from trainers import FailureConfig, RunConfig, ScalingConfig, UserCallback, get_context, report
from trainers._internal.controller import Controller, ControllerSettings, State
from trainers._internal.events import FinishedEvent, ReportEvent
from trainers._internal.failure_policy import FailurePolicy
from trainers._internal.rank_health import RankHealth, StepHealth, peak_memory, reset_peaks
from trainers._internal.stragglers import StragglerWatch
from trainers.health import StragglerSettings, waiting

# -- the judge -------------------------------------------------------------------------------------


def test_a_rank_slower_for_the_set_number_of_steps_is_named_once_per_episode():
    watch = StragglerWatch(StragglerSettings(factor=1.5, steps=3))
    named = [watch.observe([0.1, 0.4, 0.1]) for _ in range(6)]
    assert [len(n) for n in named] == [0, 0, 1, 0, 0, 0]  # the third slow step names it, once
    (straggling,) = named[2]
    assert (straggling.rank, straggling.steps, straggling.ratio) == (1, 3, pytest.approx(4.0))
    assert straggling.step_s == pytest.approx(0.4) and straggling.median_step_s == pytest.approx(0.1)
    for _ in range(3):  # three normal steps end the episode ...
        assert watch.observe([0.1, 0.1, 0.1]) == []
    again = [watch.observe([0.1, 0.1, 0.5]) for _ in range(3)]  # ... and a new one is named again
    assert [[s.rank for s in n] for n in again] == [[], [], [2]]


def test_a_slow_spell_shorter_than_the_setting_names_nobody_and_tiny_steps_are_not_news():
    watch = StragglerWatch(StragglerSettings(factor=1.5, steps=3))
    for _ in range(5):
        assert watch.observe([0.1, 0.4]) == []
        assert watch.observe([0.1, 0.4]) == []
        assert watch.observe([0.1, 0.1]) == []  # the spell breaks before its third step
    tiny = StragglerWatch(StragglerSettings(factor=1.5, steps=2))
    assert all(tiny.observe([0.001, 0.01]) == [] for _ in range(10))  # 10x, but 9 ms: under the gap
    assert all(tiny.observe([None, 5.0]) == [] for _ in range(10))  # one measured rank: nothing to compare
    off = StragglerWatch(StragglerSettings(factor=0))
    assert all(off.observe([0.1, 9.0]) == [] for _ in range(10))


def test_straggler_settings_come_from_the_environment_and_bad_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_STRAGGLER_FACTOR", "2.5")
    monkeypatch.setenv("FLOWTRAIN_STRAGGLER_STEPS", "8")
    assert StragglerSettings.from_env() == StragglerSettings(2.5, 8)
    monkeypatch.setenv("FLOWTRAIN_STRAGGLER_FACTOR", "0.9")
    with pytest.raises(ValueError, match="FLOWTRAIN_STRAGGLER_FACTOR=0.9"):
        StragglerSettings.from_env()
    monkeypatch.setenv("FLOWTRAIN_STRAGGLER_FACTOR", "fast")
    with pytest.raises(ValueError, match="FLOWTRAIN_STRAGGLER_FACTOR/FLOWTRAIN_STRAGGLER_STEPS"):
        StragglerSettings.from_env()


# -- what a rank measures --------------------------------------------------------------------------


def test_a_ranks_step_leaves_out_its_marked_waits_and_the_report_itself():
    health = RankHealth()
    first = health.report_starts()
    assert first.step_s is None and first.busy_s is None and first.memory is not None
    health.report_ends()
    with health.waiting():
        time.sleep(0.05)
    second = health.report_starts()
    time.sleep(0.05)  # inside report(): an upload, not the step
    health.report_ends()
    assert second.waiting_s >= 0.05 and second.step_s >= second.waiting_s
    assert second.busy_s == pytest.approx(second.step_s - second.waiting_s)
    assert second.busy_s < 0.05
    third = health.report_starts()
    assert third.step_s < 0.05 and third.waiting_s == 0.0


def test_the_peak_is_sent_when_it_grows_and_a_reset_starts_it_over():
    health = RankHealth()
    assert health.report_starts().memory is not None
    assert health.report_starts().memory is None  # unchanged: nothing sent
    held = bytearray(64 * 1024 * 1024)
    held[:: 4096] = b"x" * len(held[:: 4096])  # touch every page: resident
    grown = health.report_starts().memory
    assert grown is not None and grown.rss_bytes >= 64 * 1024 * 1024
    del held
    reset_peaks()
    assert peak_memory().rss_bytes < grown.rss_bytes  # a kept process starts its next attempt afresh


def test_peaks_and_stragglers_read_back_from_run_json_as_written():
    snapshot = RunSnapshot(name="r")
    snapshot.peak_memory = [MemoryPeak(100), None, MemoryPeak(300, 10, 20)]
    snapshot.stragglers.append(StragglerRecord(2, 1, "10.0.0.1 (abc)", 7, 5, 1.8, 0.36, 0.2))
    again = RunSnapshot.from_json(snapshot.to_json())
    assert again.peak_memory == snapshot.peak_memory and again.stragglers == snapshot.stragglers
    assert MemoryPeak(100, 5, None).at_least(MemoryPeak(50, None, 7)) == MemoryPeak(100, 5, 7)
    assert "rank 1 on node 10.0.0.1 (abc): 1.8x the median step" in again.stragglers[0].describe()


# -- the controller says it --------------------------------------------------------------------------


class _Store:
    def __init__(self):
        self.stragglers, self.memory = [], []

    def start_attempt(self):
        return 1

    def record_report(self, round_):
        self.memory.append(round_.memory)

    def record_straggler(self, straggler):
        self.stragglers.append(straggler)

    latest_checkpoint = latest_data_position = None


class _Workers:
    world_size = 2

    def __init__(self, events):
        self.events = events

    def launch(self, attempt, checkpoint, data_position=None):
        return None

    def poll(self, timeout_s):
        return self.events.pop(0) if self.events else []

    def where(self, rank):
        return (f"node{rank}abcdefghijklmnop", f"10.0.0.{rank}")

    def finish(self):
        pass

    def shutdown(self):
        pass

    def resize_to(self):
        return None


def _report(rank, index, busy_s, memory=None):
    return ReportEvent(rank, index, {"i": index}, False, step=StepHealth(busy_s, 0.0, memory))


def test_the_controller_names_a_straggler_in_the_record_the_log_and_the_listeners(caplog):
    heard = []

    class Heard(UserCallback):
        def on_straggler(self, run_context, straggler):
            heard.append(straggler)

    rounds = [[_report(0, i, 0.1, MemoryPeak(1000) if i == 0 else None), _report(1, i, 0.5)] for i in range(8)]
    store = _Store()
    controller = Controller(
        _Workers([*rounds, [FinishedEvent(0, None), FinishedEvent(1, None)]]),
        storage=store,
        policy=FailurePolicy(FailureConfig(), elastic=False, is_setup_clash=lambda error: False),
        listeners=[Heard()],
        settings=ControllerSettings(poll_timeout_s=0.0, stragglers=StragglerSettings(1.5, 3)),
    )
    with caplog.at_level("WARNING", logger="trainers._internal.controller"):
        while controller.step() not in (State.FINISHED, State.FAILED):
            pass
    assert controller.state is State.FINISHED
    assert heard == store.stragglers and len(heard) == 1
    assert (heard[0].rank, heard[0].report_index, heard[0].node) == (1, 2, "10.0.0.1 (node1abcdefg)")
    assert "straggler: rank 1 on node 10.0.0.1" in caplog.text
    assert store.memory[0] == (MemoryPeak(1000), None) and store.memory[1:] == [()] * 7  # peaks only as they grow


# -- a real run ----------------------------------------------------------------------------------------------


def _loop(config):
    import torch
    import torch.distributed as dist

    rank = get_context().get_world_rank()
    for step in range(config["steps"]):
        if rank == 1 and config["sleep_s"]:
            time.sleep(config["sleep_s"])  # a slow input pipeline, a throttled device
        with waiting():
            dist.all_reduce(torch.ones(4))  # the fast rank waits here for the slow one
        report({"step": step})


class _Named(UserCallback):
    def __init__(self):
        self.stragglers = []

    def on_straggler(self, run_context, straggler):
        self.stragglers.append(straggler)


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("sleep_s", [0.2, 0.0], ids=["rank-1-sleeps", "no-sleep"])
def test_a_rank_that_sleeps_each_step_is_named_within_ten_steps_and_a_healthy_run_names_nobody(tmp_path, sleep_s):
    from trainers.torch import TorchTrainer

    named = _Named()
    result = TorchTrainer(
        _loop,
        train_loop_config={"steps": 12, "sleep_s": sleep_s},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="health", storage_path=str(tmp_path), callbacks=[named]),
    ).fit()
    assert result.error is None
    record = json.loads((tmp_path / "health" / "run.json").read_text())
    if sleep_s:
        assert [(s.rank, s.attempt) for s in named.stragglers] == [(1, 1)]
        (straggler,) = named.stragglers
        assert straggler.report_index < 10 and straggler.ratio > 1.5 and straggler.step_s >= 0.2
        assert result.health.stragglers == (straggler,) and record["stragglers"] == [straggler.to_json()]
    else:
        assert named.stragglers == [] and result.health.stragglers == () and record["stragglers"] == []
    assert len(result.health.peak_memory) == 2
    assert all(peak is not None and peak.rss_bytes > 50 * 2**20 for peak in result.health.peak_memory)  # torch's own
    assert record["peak_memory"] == [peak.to_json() for peak in result.health.peak_memory]
    assert isinstance(result.health, RunHealth) and os.path.isdir(result.path)
