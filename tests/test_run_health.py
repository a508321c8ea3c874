"""A run's health while it trains (issue 48): stragglers named once per episode, and each rank's
peak memory kept in the run's record.

The judge (``StragglerWatch``) is tested on scripted step times; the controller, with scripted
workers, says a straggler everywhere a user looks; and a real 2-worker torch run whose rank 1
sleeps 0.2 s every step (its all-reduce marked as waiting) has rank 1 named within 10 steps,
while the same run without the sleep names nobody. A rank that raises CUDA's out-of-memory error
(faked on CPU), and one the kernel kills at the memory limit of a cgroup the test puts it in, each
fail the run with the rank, the step and the memory.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import ray

from picture_checks import assert_readable
from storage import settings
from storage.health import RunHealth, StragglerRecord, Timeline
from storage.memory_peak import MemoryPeak
from storage.snapshot import RunSnapshot
from trainers import FailureConfig, RunConfig, ScalingConfig, UserCallback, get_context, report
from trainers._internal.events.messages import FinishedEvent, ReportEvent
from trainers._internal.health.rank_health import RankHealth, memory_limit, peak_memory, reset_peaks
from trainers._internal.health.stragglers import StragglerWatch
from trainers._internal.network import interface_carrying
from trainers._internal.run.controller import Controller, ControllerSettings, State
from trainers._internal.run.failure_policy import FailurePolicy
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
    with pytest.raises(ValueError, match="FLOWTRAIN_STRAGGLER_FACTOR='0.9'"):
        StragglerSettings.from_env()
    monkeypatch.setenv("FLOWTRAIN_STRAGGLER_FACTOR", "fast")
    with pytest.raises(ValueError, match="FLOWTRAIN_STRAGGLER_FACTOR='fast'"):
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
    held[::4096] = b"x" * len(held[::4096])  # touch every page: resident
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

    def append(self, name, record):
        getattr(self, name).append(record)

    def record_goodput(self, account, workers_parked=None):
        self.account = account

    latest_checkpoint = latest_data_position = None


class _Workers:
    world_size = 2
    preflight = workers_parked = None

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
    return ReportEvent(rank, index, {"i": index}, False, busy_s=busy_s, memory=memory)


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
    with caplog.at_level("WARNING", logger="trainers._internal.run"):
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
    # Its timeline picture shows both ranks at every round, the slow one and the healthy one alike.
    timeline = Timeline.from_json(
        json.loads((tmp_path / "health" / ".health" / "timeline-attempt0001.json").read_text())
    )
    assert len(timeline.rounds) == 12
    assert_readable(timeline)


# -- out of memory ---------------------------------------------------------------------------------------------


def _runs_out_of_cuda_memory(config):
    import torch

    for step in range(5):
        if get_context().get_world_rank() == 1 and step == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")  # as a GPU raises it
        report({"step": step})


@pytest.mark.usefixtures("ray_local")
def test_a_rank_out_of_cuda_memory_fails_the_run_naming_rank_step_and_memory_and_leaves_a_summary(tmp_path):
    from trainers import TrainingFailedError
    from trainers.torch import TorchTrainer

    trainer = TorchTrainer(
        _runs_out_of_cuda_memory,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="oom", storage_path=str(tmp_path)),
    )
    with pytest.raises(TrainingFailedError) as raised:
        trainer.fit()
    (failure,) = raised.value.failures.values()
    assert (failure.world_rank, failure.reports, failure.out_of_memory) == (1, 3, True)
    message = str(raised.value)
    assert "rank 1 on node" in message and "after 3 report(s) in this attempt" in message
    assert f"out of memory (RSS {failure.memory.describe()[4:]}" in message and failure.memory.rss_bytes > 50 * 2**20
    summary = tmp_path / "oom" / ".health" / "oom-attempt0001-rank0001.txt"
    assert failure.memory_summary.endswith("health/oom-attempt0001-rank0001.txt")
    text = summary.read_text()
    assert "rank 1, attempt 1, after 3 report(s)" in text and "OutOfMemoryError: CUDA out of memory" in text


def _memory_cgroup() -> str | None:
    """A memory cgroup (v1) of this process's own, or None where this machine gives none."""
    try:
        with open("/proc/self/cgroup") as lines:
            path = next(line.split(":", 2)[2].strip() for line in lines if ":memory:" in line)
    except (OSError, StopIteration):
        return None
    parent = f"/sys/fs/cgroup/memory{path}"
    return parent if os.access(parent, os.W_OK) else None


def _killed_at_its_memory_limit(config):
    import numpy as np

    held = []
    for step in range(10):
        if get_context().get_world_rank() == 1:
            if step == 0:
                # The limit is its RSS + 256 MiB, so at three steps of 64 MiB its RSS is near the
                # limit. Only what it allocates from now on is charged to the cgroup (cgroup v1), so
                # the fourth step allocates more than the whole limit: the kernel kills it there.
                rss = resource_usage_bytes()
                with open(os.path.join(config["cgroup"], "memory.limit_in_bytes"), "w") as limit:
                    limit.write(str(rss + 256 * 2**20))
                with open(os.path.join(config["cgroup"], "cgroup.procs"), "w") as procs:
                    procs.write(str(os.getpid()))
            size = 64 * 2**20 if step < 3 else rss + 512 * 2**20
            held.append(np.ones(size // 8))
        report({"step": step})


def resource_usage_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@pytest.mark.usefixtures("ray_local")
def test_a_rank_killed_at_its_memory_limit_fails_the_run_naming_rank_step_and_memory(tmp_path):
    from trainers import TrainingFailedError
    from trainers.torch import TorchTrainer

    parent = _memory_cgroup()
    if parent is None:
        pytest.skip("this machine gives no writable memory cgroup (cgroup v1) to put a worker in")
    cgroup = os.path.join(parent, f"flowtrain-test-{os.getpid()}")
    os.mkdir(cgroup)
    try:
        trainer = TorchTrainer(
            _killed_at_its_memory_limit,
            train_loop_config={"cgroup": cgroup},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="killed", storage_path=str(tmp_path)),
        )
        with pytest.raises(TrainingFailedError) as raised:
            trainer.fit()
        with open(os.path.join(cgroup, "memory.oom_control")) as control:
            assert "oom_kill 1" in control.read(), str(raised.value)  # the kernel killed it, as the run says
    finally:
        os.rmdir(cgroup)
    (failure,) = raised.value.failures.values()
    assert (failure.world_rank, failure.kind, failure.reports, failure.out_of_memory) == (1, "died", 3, True)
    assert failure.memory.limit_bytes is not None and failure.memory.near_limit
    message = str(raised.value)
    assert "rank 1 on node" in message and "died" in message and "after 3 report(s) in this attempt" in message
    assert "out of memory (RSS" in message and "limit)" in message


def test_the_memory_limit_is_the_tightest_of_the_cgroups_and_rlimit_as():
    import resource
    import subprocess
    import sys

    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, resource.RLIM_INFINITY)); "
        "from trainers._internal.health.rank_health import memory_limit; print(memory_limit())"
    )
    limited = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(limited.stdout) <= 8 * 2**30
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY and memory_limit() is not None:
        assert memory_limit() < 2**60  # a cgroup's limit, never its "no limit" figure


# -- the goodput account ---------------------------------------------------------------------------------------


def test_the_goodput_clock_puts_every_second_in_one_part_and_moves_thrown_away_training_out():
    from trainers._internal.health.goodput import GoodputClock, Phase

    now = [0.0]
    clock = GoodputClock(lambda: now[0], gpus_per_worker=1.0)
    clock.start(workers=4)
    now[0] = 5.0
    clock.switch(Phase.TRAINING, workers=4)  # 5 s starting
    now[0] = 15.0
    clock.waited_for_data(1.0)  # a round whose slowest rank waited 1 s for its batches
    clock.committed(blocked_s=2.0)  # a checkpoint at 15 s that blocked the ranks 2 s
    now[0] = 18.0
    clock.waited_for_data(0.5)  # a round after it: its wait is thrown away with its training
    clock.thrown_away(Phase.RESTARTING)  # a failure 3 s after it: 3 s rolled back
    now[0] = 20.0
    clock.switch(Phase.TRAINING, workers=3)  # 2 s restarting, then 3 workers
    now[0] = 30.0
    clock.waited_for_data(0.75)  # the last rounds need no checkpoint to count
    clock.switch(Phase.WAITING)
    now[0] = 31.0
    account = clock.account()
    assert account.parts == {
        "starting": 5.0,
        "training": 23.0 - 1.75 - 2.0 - 3.0,  # 13 s and 10 s of training, less what was moved out
        "waiting for data": 1.75,
        "checkpoints": 2.0,
        "restarting": 2.0,
        "rolled back": 3.0,
        "waiting": 1.0,
    }
    assert sum(account.parts.values()) == account.wall_s == 31.0
    assert account.worker_hours == pytest.approx((20 * 4 + 11 * 3) / 3600) and account.gpu_hours == account.worker_hours
    assert account.describe().startswith("goodput 52%: 16.25 s of 31 s trained; starting 5 s, waiting for data 1.75 s")
    assert not account.input_bound and "input-bound" not in account.describe()  # 1.75 s of 18 s


#: Steps of the restarted run, the step its rank 1 fails at in the first attempt, and a step's sleep.
STEPS, FAIL_AT, STEP_S = 14, 10, 0.2


def _fails_once(config):
    import tempfile

    from trainers import Checkpoint, get_checkpoint

    rank, attempt = get_context().get_world_rank(), get_context().get_attempt()
    checkpoint = get_checkpoint()
    start = 0
    if checkpoint:
        with open(os.path.join(checkpoint.path, "step")) as saved:
            start = int(saved.read()) + 1
    for step in range(start, STEPS):
        time.sleep(STEP_S)
        if rank == 1 and attempt == 1 and step == FAIL_AT:
            raise RuntimeError("planted failure")
        if step % 4 == 3:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "step"), "w") as saved:
                    saved.write(str(step))
                report({"step": step}, checkpoint=Checkpoint.from_directory(folder))
        else:
            report({"step": step})


@pytest.mark.usefixtures("ray_local")
def test_a_restarted_runs_goodput_parts_add_up_and_its_rolled_back_time_is_the_steps_replayed(tmp_path):
    from trainers import FailureConfig as Failures
    from trainers.torch import TorchTrainer

    result = TorchTrainer(
        _fails_once,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="goodput", storage_path=str(tmp_path), failure_config=Failures(max_failures=1)),
    ).fit()
    (account,) = result.health.goodput
    assert sum(account.parts.values()) == pytest.approx(account.wall_s, rel=0.02)
    assert account.restarting_s > 0 and account.starting_s > 0 and account.training_s > 0
    # The failure threw away steps 8-10 (trained after the checkpoint of step 7): 3 steps of 0.2 s.
    replayed = [r["step"] for r in result.metrics_dataframe.to_dict("records")]
    assert replayed == list(range(STEPS))  # each step once in the record
    thrown_away_s = (FAIL_AT - 7) * STEP_S
    assert 0.5 * thrown_away_s <= account.rolled_back_s <= 2 * thrown_away_s
    assert account.worker_hours > 0 and account.gpu_hours == 0
    record = json.loads((tmp_path / "goodput" / "run.json").read_text())
    assert record["goodput"] == [account.to_json()]


# -- the timeline picture -----------------------------------------------------------------------------------


def _straggles_then_fails_once(config):
    import tempfile

    import torch
    import torch.distributed as dist

    from trainers import Checkpoint, get_checkpoint

    rank, attempt = get_context().get_world_rank(), get_context().get_attempt()
    start = 0
    if checkpoint := get_checkpoint():
        with open(os.path.join(checkpoint.path, "step")) as saved:
            start = int(saved.read()) + 1
    for step in range(start, 12):
        if rank == 1:
            time.sleep(0.15)  # a straggler all along
            if attempt == 1 and step == 9:
                raise RuntimeError("planted failure")
        with waiting():
            dist.all_reduce(torch.ones(2))
        if step % 4 == 3:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "step"), "w") as saved:
                    saved.write(str(step))
                report({"step": step}, checkpoint=Checkpoint.from_directory(folder))
        else:
            report({"step": step})


@pytest.mark.usefixtures("ray_local")
def test_a_run_with_a_restart_and_a_straggler_draws_its_timeline_from_data_that_holds_them(tmp_path, monkeypatch):
    import matplotlib.image

    from trainers import FailureConfig as Failures
    from trainers.health import draw_timeline
    from trainers.torch import TorchTrainer

    monkeypatch.setenv("FLOWTRAIN_TIMELINE", "auto")  # drawn since the run has a restart and a straggler
    result = TorchTrainer(
        _straggles_then_fails_once,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="timeline", storage_path=str(tmp_path), failure_config=Failures(max_failures=1)),
    ).fit()
    health = tmp_path / "timeline" / ".health"
    picture = matplotlib.image.imread(health / "timeline-attempt0001.png")
    assert picture.shape[1] == 870  # the width Prefect shows it at
    timeline = Timeline.from_json(json.loads((health / "timeline-attempt0001.json").read_text()))
    assert_readable(timeline)
    assert timeline.world_size == 2 and {len(r.steps) for r in timeline.rounds} == {2}
    assert {r.attempt for r in timeline.rounds} == {1, 2}
    assert [p for p, _, _ in timeline.phases] == ["starting", "training", "restarting", "training", "waiting"]
    assert (1, 1, "error") in {(m.attempt, m.rank, m.what) for m in timeline.marks}
    assert {m.rank for m in timeline.marks if m.what == "straggler"} == {1}
    assert timeline.rolled_back and result.health.stragglers
    again = draw_timeline(result)  # redrawn afterwards, from the run folder
    assert again == str(health / "timeline-attempt0001.png")


def test_the_timeline_setting_is_checked_and_a_quiet_run_draws_nothing_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_TIMELINE", "sometimes")
    with pytest.raises(ValueError, match="FLOWTRAIN_TIMELINE='sometimes': must be one of auto, always, never"):
        settings.TIMELINE.read()
    monkeypatch.delenv("FLOWTRAIN_TIMELINE")
    from trainers import DataParallelTrainer

    def quiet(config):
        report({"x": 1})

    DataParallelTrainer(
        quiet,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="quiet", storage_path=str(tmp_path)),
    ).fit()
    assert sorted(os.listdir(tmp_path / "quiet" / ".health")) == ["timeline-attempt0001.json"]  # no picture


def test_the_health_page_shows_the_account_as_a_table_the_stragglers_the_memory_and_the_picture():
    from storage.health import GoodputAccount
    from tasks.health_report import health_markdown

    account = GoodputAccount(20.0, 2.0, 15.0, 1.0, 1.5, 0.25, 0.25, 0.011, 0.0)
    health = RunHealth(
        peak_memory=(MemoryPeak(300 * 2**20), MemoryPeak(2**30, 5 * 2**20, 8 * 2**20)),
        stragglers=(StragglerRecord(1, 1, "10.0.0.1", 7, 5, 1.8, 0.36, 0.2),),
        goodput=(account,),
    )
    page = health_markdown("demo", health, b"\x89PNG...", timeline_path="/runs/demo/health/timeline-attempt0001.png")
    assert "**Goodput 75%**: 15 s of 20 s trained; 0.011 worker-hours." in page and "Input-bound" not in page
    assert "| rolled back | 0.25 | 1% | training a failure threw away (trained again) |" in page
    assert "| training | 15 | 75% | steps that moved the model forward |" in page
    assert "| waiting | 0.25 | 1% | the run's end: the workers finishing |" in page  # what "waiting" means
    assert "![timeline of demo](data:image/png;base64,iVBORy4uLg==)" in page
    # Reports are numbered from 1 wherever a person reads them (the record keeps the index, 7).
    assert "- attempt 1's report 8: rank 1 on node 10.0.0.1: 1.8x the median step (0.36 s against 0.2 s)" in page
    assert "| 0 | RSS 300 MiB |" in page and "| 1 | RSS 1 GiB, CUDA allocated 5 MiB, reserved 8 MiB |" in page
    assert "Not run: by default (`FLOWTRAIN_PREFLIGHT=auto`) it checks GPU runs only" in page
    quiet = health_markdown("quiet", RunHealth(), None)
    assert "No rank trained persistently slower" in quiet and "Timeline" not in quiet
    # A run whose ranks waited for data a fifth of their training time or more says so.
    waited = GoodputAccount(20.0, 2.0, 12.0, 0.0, 0.0, 0.0, 0.0, 0.011, 0.0, data_wait_s=6.0)
    page = health_markdown("slow-input", RunHealth(goodput=(waited,)), None)
    assert "**Input-bound**: the ranks waited for their next batch 33% of their training time" in page
    assert "| waiting for data | 6 | 30% | ranks waiting for their next batch" in page


# -- waiting for data ---------------------------------------------------------------------------------------

#: Seconds the slowed input takes per batch (a Ray Data map, a DataLoader's dataset), against a loop
#: that computes nothing: a run that waits for data most of its training time.
SLOW_BATCH_S = 0.25


def _slow_rows(batch):
    time.sleep(SLOW_BATCH_S)  # a slow decode, a far-away object store
    return batch


class _SlowItems:
    """A map-style dataset whose every batch (of 4 items) takes ``SLOW_BATCH_S`` to load."""

    def __len__(self):
        return 32

    def __getitem__(self, index):
        import torch

        time.sleep(SLOW_BATCH_S / 4)
        return torch.tensor([float(index)])


def _reads_its_input(config):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainers import get_dataset_shard
    from trainers.torch import prepare_data_loader

    for epoch in range(2):
        if config["input"] == "ray-data":
            batches = get_dataset_shard("train").iter_batches(batch_size=4)
        else:
            items = _SlowItems() if config["input"] == "slow-loader" else TensorDataset(torch.arange(32.0))
            batches = prepare_data_loader(DataLoader(items, batch_size=4))
        for _ in batches:
            if config["input"] == "fast-loader":
                time.sleep(SLOW_BATCH_S)  # the model's own work: the loop, not its input, sets the pace
        report({"epoch": epoch})


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("input_kind", ["ray-data", "slow-loader", "fast-loader"])
def test_a_run_that_waits_for_its_data_is_named_input_bound_and_a_compute_bound_one_is_not(
    tmp_path, caplog, input_kind
):
    import ray.data

    from trainers.torch import TorchTrainer

    datasets = {"train": ray.data.range(32, override_num_blocks=8).map_batches(_slow_rows, batch_size=4)}
    with caplog.at_level("INFO", logger="trainers._internal.run"):  # the goodput line comes from its health watch
        result = TorchTrainer(
            _reads_its_input,
            train_loop_config={"input": input_kind},
            datasets=datasets if input_kind == "ray-data" else None,
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name="input", storage_path=str(tmp_path)),
        ).fit()
    (account,) = result.health.goodput
    assert sum(account.parts.values()) == pytest.approx(account.wall_s, rel=0.02)
    goodput_line = next(r.getMessage() for r in caplog.records if "goodput" in r.getMessage())
    if input_kind == "fast-loader":
        # 16 batches a rank, each waited for in microseconds; the loop's own 4 s are training.
        assert not account.input_bound and "input-bound" not in goodput_line, goodput_line
        assert account.data_wait_s > 0, account  # measured, and small
    else:
        assert account.input_bound, account
        assert "input-bound: the ranks waited for their next batch" in goodput_line, goodput_line
        assert account.data_wait_s > account.training_s, account


# -- the pre-flight check ---------------------------------------------------------------------------------------

CPU_CGROUPS = "/sys/fs/cgroup/cpu"


def _throttle(cgroup: str) -> int:
    """In a worker: move this process into ``cgroup`` (5% of one CPU); return its pid."""
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
    return os.getpid()


def _slow_rank_one_backend(cgroup: str):
    from trainers.torch import TorchConfig
    from trainers.torch.config import TorchBackend

    class SlowRankOne(TorchBackend):
        """Sets torch.distributed up, then throttles rank 1's CPU: a node that is throttled or shared."""

        def on_start(self, worker_group, backend_config):
            super().on_start(worker_group, backend_config)
            worker_group.execute_single(1, _throttle, cgroup)

    class SlowRankOneConfig(TorchConfig):
        @property
        def backend_cls(self):
            return SlowRankOne

    return SlowRankOneConfig()


def _remove_cgroup(cgroup: str) -> None:
    """Every task of ``cgroup`` back to full speed (the root cgroup), then the cgroup gone. A task
    may start a thread while the others move: move until none is left."""
    while True:
        with open(os.path.join(cgroup, "tasks")) as tasks:
            left = tasks.read().split()
        if not left:
            break
        for task in left:
            try:
                with open(os.path.join(CPU_CGROUPS, "tasks"), "w") as root:
                    root.write(task)
            except OSError:
                pass  # it ended meanwhile
    os.rmdir(cgroup)


def _never_trains(config):
    raise AssertionError("the pre-flight check must stop the run before its first step")


@pytest.mark.usefixtures("ray_local")
def test_the_preflight_check_fails_fit_before_step_0_naming_a_throttled_worker_and_its_figures(tmp_path, monkeypatch):
    from trainers.errors import PreflightError
    from trainers.torch import TorchTrainer

    if not os.access(CPU_CGROUPS, os.W_OK):
        pytest.skip("this machine gives no writable cpu cgroup (cgroup v1) to throttle a worker with")
    cgroup = os.path.join(CPU_CGROUPS, f"flowtrain-test-{os.getpid()}")
    os.mkdir(cgroup)
    try:
        with open(os.path.join(cgroup, "cpu.cfs_quota_us"), "w") as quota:
            quota.write("5000")  # 5 ms of every 100 ms
        monkeypatch.setenv("FLOWTRAIN_PREFLIGHT", "on")  # a CPU run: the check is opt-in
        trainer = TorchTrainer(
            _never_trains,
            torch_config=_slow_rank_one_backend(cgroup),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="preflight", storage_path=str(tmp_path)),
        )
        with pytest.raises(PreflightError) as raised:
            trainer.fit()
    finally:
        _remove_cgroup(cgroup)
    error = raised.value
    assert error.slow_ranks == (1,) and error.record.gflops[1] * 2.5 < error.record.gflops[0]
    message = str(error)
    assert "pre-flight check: 1 of 2 worker(s) compute more than 2.5x slower than the median worker" in message
    assert "  - rank 1 on node " in message and "x below the median" in message
    assert f"rank 0 {error.record.gflops[0]:.3g}, rank 1 {error.record.gflops[1]:.3g} GFLOP/s" in message
    record = json.loads((tmp_path / "preflight" / "run.json").read_text())
    assert record["num_reports"] == 0 and record["checkpoints"] == []  # nothing trained, nothing lost


def _trains_a_little(config):
    report({"step": 0})


@pytest.mark.usefixtures("ray_local")
def test_a_healthy_runs_preflight_check_passes_and_keeps_every_workers_figures(tmp_path, monkeypatch):
    from trainers.torch import TorchTrainer

    monkeypatch.setenv("FLOWTRAIN_PREFLIGHT", "on")
    # Two workers share this machine's two cores with the driver, Ray and whatever else runs: a
    # worker's core can be half anyone else's, which on a real node is a fault (a shared CPU) and
    # here is the test machine. The bar is set above that; the throttled worker above is 20x slower.
    monkeypatch.setenv("FLOWTRAIN_PREFLIGHT_FACTOR", "10")
    result = TorchTrainer(
        _trains_a_little,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="healthy", storage_path=str(tmp_path)),
    ).fit()
    (check,) = result.health.preflight
    assert len(check.gflops) == 2 and all(rate > 0 for rate in check.gflops)
    assert check.bus_gbps is not None and check.bus_gbps > 0 and check.seconds > 0
    assert check.describe().startswith("pre-flight check passed in ")
    # No GLOO_SOCKET_IFNAME was set: each worker's collectives use the interface of its node's address.
    [node] = [n for n in ray.nodes() if n["Alive"]]
    assert check.interfaces == (interface_carrying(node["NodeManagerAddress"]),) * 2
    assert check.describe().endswith(f"collectives over {check.interfaces[0]}")
    monkeypatch.setenv("FLOWTRAIN_PREFLIGHT", "sometimes")
    with pytest.raises(ValueError, match="FLOWTRAIN_PREFLIGHT='sometimes': must be one of auto, on, off"):
        TorchTrainer(_trains_a_little, scaling_config=ScalingConfig(num_workers=2)).fit()


@pytest.mark.usefixtures("ray_local")
def test_the_gpu_checks_cuda_oom_check_passes_on_cpu_workers(tmp_path):
    """``make gpu-check``'s cuda_oom check, on two CPU workers: the error faked, the rest real."""
    from benchmarks.gpu_workloads import Setup, check_cuda_oom

    found = check_cuda_oom(Setup(use_gpu=False, num_gpus=0, workdir=str(tmp_path), seconds=1))
    assert "rank 1 on node" in found["message"] and "after 1 report(s) in this attempt" in found["message"]
    assert found["summary"].endswith("health/oom-attempt0001-rank0001.txt")


def test_the_health_cost_benchmark_measures_both_sides_and_writes_its_json(tmp_path):
    from benchmarks import health_cost

    out = tmp_path / "health-cost.json"
    assert health_cost.main(["--ranks", "8", "--rounds", "50", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["ranks"] == 8 and written["worker_us_per_report"] > 0 and written["driver_us_per_round"] > 0
    assert written["worker_us_per_batch"] > 0  # the shard's count and wait timing, above a plain loop


def test_out_of_memory_is_told_from_errors_and_from_a_death_at_the_limit():
    from trainers._internal.health.memory_failure import is_out_of_memory
    from trainers.errors import RankFailure

    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
    )
    assert is_out_of_memory(
        "worker process (pid 7) on node 10.0.0.2 died: ray.exceptions.OutOfMemoryError: Task was killed due to the "
        "node running low on memory."
    )  # Ray's memory monitor, as a dead worker's message carries it
    assert not is_out_of_memory(RuntimeError("planted failure")) and not is_out_of_memory("SIGKILL")

    near = MemoryPeak(900 * 2**20, limit_bytes=1000 * 2**20)
    far = MemoryPeak(300 * 2**20, limit_bytes=1000 * 2**20)
    assert near.near_limit and not far.near_limit and not MemoryPeak(900 * 2**20).near_limit

    died = RankFailure(
        1, "abcdef0123456789", "10.0.0.2", "died", "WorkerError", "died: SIGKILL", "", reports=4, memory=far
    )
    assert died.describe().endswith(
        "[after 4 report(s) in this attempt; memory at its last report: RSS 300 MiB of a 1000 MiB limit]"
    )
    raised = RankFailure(1, "abcdef0123456789", "10.0.0.2", "error", "ValueError", "bad", "", reports=4, memory=far)
    assert raised.describe() == "rank 1 on node 10.0.0.2 (abcdef012345) error: ValueError: bad"  # its own error says it


def test_the_testing_seams_time_health_as_a_run_does_and_judge_the_same():
    from trainers.testing import RankHealthMeter, RoundHealthJudge

    RankHealthMeter().measure()
    judge = RoundHealthJudge(3)
    named = [judge.judge(round_) for round_ in judge.rounds([[0.1, 0.1, 0.9]] * 6)]
    assert named == [[], [], [], [], [2], []]  # the fifth slow step names it (the default setting), once
