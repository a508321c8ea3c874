"""The data position is saved with each checkpoint and a resumed epoch starts there (issue 37.1).

A 2-worker loop trains on a Ray Data shard of numbered rows and on a ``prepare_data_loader``
loader (a ``DistributedSampler``) of numbered items, step by step. What it trained on (the ids,
per epoch) is the loop's own state: checkpointed every few steps and at each epoch's end, and
restored from ``get_checkpoint()``, so the run's final checkpoint holds every id the run trained
on as many times as it trained on it. A worker is SIGKILLed mid-epoch, another fails later and
the driver reruns the run: each epoch still holds every row and item exactly once. With
``DataConfig(checkpoint_data_position=False)`` the same loop shows the replay.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import types

import pytest

from storage.positions import LoaderRecord, RoundPosition, ShardRecord, SkippedRows
from trainers import (
    Checkpoint,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    report,
)
from trainers._internal.session.data_position import ShardPosition, plan_resume, position_hooks_problem
from trainers._internal.workers.run_workers import _resume_plan

#: 10 batches per rank and epoch, a checkpoint after every third and at each epoch's end.
NUM_IDS, BATCH, EVERY, EPOCHS = 160, 8, 3, 2


def _save(state: dict, rank: int, epoch: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
            json.dump(state, f)
        report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(folder))


def _fail_once(config: dict, epoch: int, step: int) -> None:
    for at_epoch, at_step, how, marker in config["failures"]:
        if (epoch, step) == (at_epoch, at_step) and not os.path.exists(marker):
            open(marker, "w").close()
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"planned failure at epoch {epoch}, step {step}")


def resumable_loop(config: dict) -> None:
    from torch.utils.data import DataLoader

    from trainers.torch import prepare_data_loader

    rank = get_context().get_world_rank()
    shard = get_dataset_shard("train")
    loader = prepare_data_loader(DataLoader(list(range(NUM_IDS)), batch_size=BATCH, shuffle=True))
    state: dict = {"epoch": 0, "rows": {}, "items": {}}
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, f"rank{rank}.json")) as f:
            state = json.load(f)
    for epoch in range(state["epoch"], EPOCHS):
        loader.sampler.set_epoch(epoch)
        rows = state["rows"].setdefault(str(epoch), [])
        items = state["items"].setdefault(str(epoch), [])
        # A resumed epoch's steps count from 0 again: the loop need not know where it resumed.
        for step, (batch, item_batch) in enumerate(zip(shard.iter_batches(batch_size=BATCH), loader, strict=True)):
            if rank == 1:
                _fail_once(config, epoch, step)
            rows.extend(int(i) for i in batch["id"])
            items.extend(item_batch.tolist())
            if (step + 1) % EVERY == 0:
                _save(state, rank, epoch)
        state["epoch"] = epoch + 1
        _save(state, rank, epoch)


def trainer(tmp_path, *, keep_position: bool, failures: list, max_failures: int = 1):
    import ray.data

    from trainers.torch import TorchTrainer

    return TorchTrainer(
        resumable_loop,
        train_loop_config={"failures": failures},
        datasets={"train": ray.data.range(NUM_IDS, override_num_blocks=4)},
        dataset_config=DataConfig(
            execution_options=ray.data.ExecutionOptions(preserve_order=True),
            checkpoint_data_position=keep_position,
        ),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="position", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=max_failures)
        ),
    )


def trained_on(result) -> list[dict]:
    """Each rank's state in the run's final checkpoint: the ids it trained on, per epoch."""
    with result.checkpoint.as_directory() as folder:
        return [json.loads(open(os.path.join(folder, f"rank{rank}.json")).read()) for rank in (0, 1)]


def sampler_order(rank: int, epoch: int) -> list[int]:
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(list(range(NUM_IDS)), num_replicas=2, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.usefixtures("ray_local")
def test_a_killed_worker_and_a_driver_rerun_resume_mid_epoch_so_each_rank_trains_on_its_shard_once(tmp_path):
    failures = [
        (0, 7, "kill", str(tmp_path / "killed")),  # after the checkpoint of step 5: 6 batches a rank
        (1, 4, "raise", str(tmp_path / "raised")),  # after the checkpoint of step 2; the budget is spent
    ]
    with pytest.raises(TrainingFailedError, match="planned failure at epoch 1, step 4"):
        trainer(tmp_path, keep_position=True, failures=failures).fit()
    result = trainer(tmp_path, keep_position=True, failures=failures).fit()  # the driver reruns the run

    states = trained_on(result)
    for epoch in ("0", "1"):
        assert sorted(states[0]["rows"][epoch] + states[1]["rows"][epoch]) == list(range(NUM_IDS))
        assert sorted(states[0]["items"][epoch] + states[1]["items"][epoch]) == list(range(NUM_IDS))
    for rank, state in enumerate(states):
        # preserve_order: a rank's shard is the same rows in the same order in every epoch and attempt.
        assert state["rows"]["0"] == state["rows"]["1"] and len(state["rows"]["0"]) == NUM_IDS // 2
        for epoch in (0, 1):
            assert state["items"][str(epoch)] == sampler_order(rank, epoch)
    record = json.loads((tmp_path / "position" / "run.json").read_text())
    assert [(r["attempt"], r["exact"], r["datasets"], r["loaders"]) for r in record["data_resumes"]] == [
        (2, True, {"train": {"epoch": 0, "rows_skipped": 96}}, [{"epoch": 0, "samples_skipped": 96}]),
        (3, True, {"train": {"epoch": 1, "rows_skipped": 48}}, [{"epoch": 1, "samples_skipped": 48}]),
    ]


@pytest.mark.usefixtures("ray_local")
def test_without_the_position_a_restarted_epoch_replays_what_was_trained_on(tmp_path):
    failures = [(0, 7, "kill", str(tmp_path / "killed"))]
    result = trainer(tmp_path, keep_position=False, failures=failures).fit()

    for state in trained_on(result):
        for seen in (state["rows"]["0"], state["items"]["0"]):
            # The 6 batches before the checkpoint, then the whole shard again.
            assert len(seen) == 6 * BATCH + NUM_IDS // 2 and len(set(seen)) == NUM_IDS // 2
    record = json.loads((tmp_path / "position" / "run.json").read_text())
    assert record["data_resumes"] == []
    assert all(c["data_position"] is None for c in record["checkpoints"])


def test_a_resume_that_cannot_be_exact_warns_naming_the_setting_and_records_what_it_skipped():
    import ray.data

    saved = RoundPosition.from_json(
        {
            "world_size": 2,
            "ranks": [{"datasets": {"train": {"epoch": 1, "rows": 40}}, "loaders": [{"epoch": 1, "samples": 40}]}] * 2,
        }
    )
    spec = types.SimpleNamespace(
        datasets={"train": None},
        dataset_config=DataConfig(execution_options=ray.data.ExecutionOptions(preserve_order=False)),
    )
    with pytest.warns(UserWarning, match=r"datasets\['train'\] runs without ExecutionOptions.preserve_order") as seen:
        plan = _resume_plan(spec, 2, saved)  # type: ignore[arg-type]  # what it reads of a RunSpec
    assert "checkpoint_data_position=False" in str(seen[0].message)
    assert plan.starts == list(saved.ranks)  # the same count is skipped
    assert plan.note.exact is False and plan.note.datasets == {"train": SkippedRows(epoch=1, rows_skipped=80)}

    # Three workers now: each skips a third of what the two had handed out.
    plan = plan_resume(saved, world_size=3, ordered={"train": True}, split={"train"})
    assert plan.warning is not None and "the run has 3 worker(s) and had 2" in plan.warning
    third = {"datasets": {"train": {"epoch": 1, "rows": 26}}, "loaders": [{"epoch": 1, "samples": 26}]}
    assert [start.to_json() for start in plan.starts] == [third] * 3
    assert plan.note.exact is False and plan.note.datasets["train"].rows_skipped == 78

    exact = plan_resume(saved, world_size=2, ordered={"train": True}, split={"train"})
    assert exact.warning is None and exact.note.exact is True


def test_a_shard_position_counts_a_pass_as_an_epoch_and_skips_only_in_the_resumed_one():
    position = ShardPosition.resumed(ShardRecord(3, 40))
    assert position.to_record() == ShardRecord(3, 40)  # a checkpoint before the loop iterates again
    assert position.start_pass() == 40
    position.handed_out(8)
    assert position.to_record() == ShardRecord(3, 48)
    position.end_pass()
    assert position.to_record() == ShardRecord(4, 0)  # an epoch's end: the next one is next
    assert position.start_pass() == 0
    position.handed_out(8)
    assert position.start_pass() == 0 and position.to_record() == ShardRecord(5, 0)  # a pass broken off


def test_a_positioned_sampler_starts_only_its_saved_epoch_mid_way():
    from trainers.torch.sampler_position import PositionedSampler

    def sampler(resume):
        return PositionedSampler(list(range(20)), num_replicas=2, rank=0, shuffle=True, seed=0, resume=resume)

    whole = sampler(None)
    whole.set_epoch(2)
    order = list(whole)
    resumed = sampler(LoaderRecord(2, 4))
    resumed.set_epoch(2)
    assert list(resumed) == order[4:] and resumed.position() == LoaderRecord(2, 4)
    assert list(resumed) == order  # the next pass of the same epoch is whole
    later = sampler(LoaderRecord(2, 4))
    later.set_epoch(3)  # the loop resumes at the next epoch: nothing to skip
    assert len(list(later)) == 10


@pytest.mark.usefixtures("ray_local")
def test_when_ray_datas_hooks_miscount_positions_turn_off_with_a_warning_and_the_epoch_replays(tmp_path, monkeypatch):
    import ray

    from trainers._internal import ray_private

    class Uncounted(ray_private._Passes):
        """What a Ray that iterates around flowtrain's hooks leaves: batches handed out, none counted."""

        def __iter__(self):
            return iter(self._items)

    monkeypatch.setattr(ray_private, "_Passes", Uncounted)  # in the driver, where the self-check runs
    position_hooks_problem.cache_clear()
    try:
        assert "was counted [0, 0, 0]" in position_hooks_problem()
        failures = [(0, 7, "kill", str(tmp_path / "killed"))]
        with pytest.warns(UserWarning, match=rf"with Ray {ray.__version__} .* count .* is wrong"):
            result = trainer(tmp_path, keep_position=True, failures=failures).fit()
    finally:
        position_hooks_problem.cache_clear()

    for state in trained_on(result):  # replayed from the epoch's start: never skipped
        for seen in (state["rows"]["0"], state["items"]["0"]):
            assert len(seen) == 6 * BATCH + NUM_IDS // 2 and len(set(seen)) == NUM_IDS // 2
    record = json.loads((tmp_path / "position" / "run.json").read_text())
    assert record["data_resumes"] == [] and all(c["data_position"] is None for c in record["checkpoints"])


def test_a_checkpoints_data_position_reads_back_from_run_json_as_it_was_written():
    from storage.snapshot import CheckpointRecord, RunSnapshot

    written = {
        "world_size": 2,
        "ranks": [{"datasets": {"train": {"epoch": 1, "rows": 40}}, "loaders": [{"epoch": 1, "samples": 8}]}, None],
    }
    snapshot = RunSnapshot(name="r")
    snapshot.checkpoints.append(CheckpointRecord(0, "c0", {}, 0, data_position=RoundPosition.from_json(written)))
    snapshot.checkpoints.append(CheckpointRecord(1, "c1", {}, 1))
    again = RunSnapshot.from_json(snapshot.to_json())
    assert again.checkpoints[0].data_position == snapshot.checkpoints[0].data_position
    assert again.checkpoints[0].data_position.to_json() == written and again.checkpoints[1].data_position is None
    assert again.latest is again.checkpoints[1]


@pytest.mark.usefixtures("ray_local")
def test_the_self_check_finds_the_installed_rays_hooks_count_right():
    position_hooks_problem.cache_clear()
    assert position_hooks_problem() is None


def test_what_a_resume_skipped_reads_back_from_run_json_as_it_was_written():
    from storage.positions import DataResume, SkippedSamples
    from storage.snapshot import RunSnapshot

    snapshot = RunSnapshot(name="r")
    snapshot.data_resumes.append(
        DataResume(False, ("why",), {"train": SkippedRows(1, 80)}, (SkippedSamples(1, 8),), attempt=2, checkpoint="c")
    )
    again = RunSnapshot.from_json(snapshot.to_json())
    assert again.data_resumes == snapshot.data_resumes
    assert again.data_resumes[0].to_json() == {
        "attempt": 2,
        "checkpoint": "c",
        "exact": False,
        "why": ["why"],
        "datasets": {"train": {"epoch": 1, "rows_skipped": 80}},
        "loaders": [{"epoch": 1, "samples_skipped": 8}],
    }


@pytest.mark.usefixtures("ray_local")
def test_a_shard_counter_counts_a_shard_as_a_worker_does_and_a_full_pass_ends_its_epoch():
    import ray.data

    from trainers.testing import ShardCounter

    counter = ShardCounter()
    assert counter.position() is None  # nothing tracked yet: a report would carry no position
    shard = counter.track(ray.data.range(25, override_num_blocks=3).iterator(), "train")
    seen = 0
    for batch in shard.iter_batches(batch_size=10):
        seen += len(batch["id"])
        if seen == 20:
            assert counter.position().datasets["train"] == ShardRecord(epoch=0, rows=20)
    assert seen == 25 and counter.position().datasets["train"] == ShardRecord(epoch=1, rows=0)

    in_hand = list(counter.count([None] * 4, 10, "memory"))
    assert len(in_hand) == 4 and counter.position().datasets["memory"] == ShardRecord(epoch=1, rows=0)
