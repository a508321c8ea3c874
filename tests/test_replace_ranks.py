"""A failed rank costs only that rank: the survivors keep their processes, the group re-forms
around a replacement, and the run ends exactly as an uninterrupted one (issue 46).

Three workers train a DDP model on a Ray Data shard (rows in a fixed order), checkpointing every
fourth step (model and optimizer from rank 0, the rows each rank trained on from every rank). A
fault is planted on one rank at step 11, after the checkpoint of step 7: a SIGKILL, an exception,
a SIGSTOP (a hang found by ``report_timeout_s``), a SIGKILL in the middle of a checkpoint upload,
and a second death while the group re-forms. Each time the final weights equal an uninterrupted
run's, every step is recorded once, every row of every epoch was trained on exactly once, and
the processes that did not fail served the next attempt, reset as fresh ones.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

import pytest

from trainers import (
    Checkpoint,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    UserCallback,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    report,
)
from trainers.torch import TorchConfig, TorchTrainer
from trainers.torch.config import TorchBackend

pytestmark = pytest.mark.usefixtures("ray_local")

WORKERS, BATCH, BATCHES, EPOCHS, EVERY = 3, 4, 10, 2, 4
ROWS = WORKERS * BATCH * BATCHES  # one epoch
STEPS = EPOCHS * BATCHES
FAULT_STEP = 11  # after the checkpoint of step 7, in the second epoch

#: How many times this module's training function ran in this process: a reused process must
#: import the module afresh, so every attempt's first report says 1.
CALLS = 0


def _features(ids):
    import torch

    x = ids.to(torch.float32).unsqueeze(1)
    features = torch.cat([torch.sin(x * 0.1 * (j + 1)) for j in range(4)], dim=1)
    weights = torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float32)
    target = features @ weights + 0.1 * torch.cos(x)
    return features, target


def _process_started() -> float:
    """When this process started (UNIX time)."""
    import psutil

    return psutil.Process().create_time()


def _upload_then_die(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
    """A ``checkpoint_upload_fn`` whose process dies half way: one file is in the staging folder."""
    import pyarrow.fs

    storage = get_context().get_storage()
    destination = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
    storage.storage_filesystem.create_dir(destination, recursive=True)
    with checkpoint.as_directory() as folder:
        name = sorted(os.listdir(folder))[0]
        pyarrow.fs.copy_files(
            os.path.join(folder, name),
            f"{destination}/{name}",
            source_filesystem=pyarrow.fs.LocalFileSystem(),
            destination_filesystem=storage.storage_filesystem,
        )
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def replace_loop(config: dict) -> dict:
    import torch

    from trainers.torch import prepare_model

    global CALLS
    CALLS += 1
    calls, dtype_at_start = CALLS, str(torch.get_default_dtype())
    torch.set_default_dtype(torch.float64)  # left behind: a reused process must not show it
    rank = get_context().get_world_rank()
    fault_rank, how, marker = config.get("fault") or (-1, "", "")
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1, dtype=torch.float32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state: dict = {"step": 0, "epoch": 0, "rows": {}}
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            saved = torch.load(os.path.join(folder, "model.pt"))
            with open(os.path.join(folder, f"rank{rank}.json")) as f:
                state = json.load(f)
        getattr(model, "module", model).load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    shard = get_dataset_shard("train")
    step = state["step"]
    for epoch in range(state["epoch"], EPOCHS):
        rows = state["rows"].setdefault(str(epoch), [])
        for batch in shard.iter_torch_batches(batch_size=BATCH):
            planted = rank == fault_rank and step == FAULT_STEP and not os.path.exists(marker)
            if planted:
                open(marker, "w").close()
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if how == "raise":
                    raise RuntimeError(f"planted error on rank {rank} at step {step}")
            x, y = _features(batch["id"])
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            if planted and how == "stop":
                # Hung after the collective: the others report on. The stop is the process's, taken by
                # whichever thread the kernel hands it to, so this thread may run on for a few ms (it
                # once reported this step, and the others then waited in the next collective, where no
                # rank lags): it sleeps until the stop lands.
                os.kill(os.getpid(), signal.SIGSTOP)
                time.sleep(3600)
            rows.extend(int(i) for i in batch["id"])
            step += 1
            metrics = {
                "step": step - 1,
                "epoch": epoch,
                "pid": os.getpid(),
                "started": _process_started(),
                "calls": calls,
                "dtype": dtype_at_start,
                "attempt": get_context().get_attempt(),
            }
            if step % EVERY:
                report(metrics)
                continue
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
                    json.dump({"step": step, "epoch": epoch, "rows": state["rows"]}, f)
                if rank == 0:
                    module = getattr(model, "module", model)
                    torch.save(
                        {"model": module.state_dict(), "optimizer": optimizer.state_dict()},
                        os.path.join(folder, "model.pt"),
                    )
                upload = _upload_then_die if planted and how == "upload" else None
                report(metrics, checkpoint=Checkpoint.from_directory(folder), checkpoint_upload_fn=upload)
        state["epoch"] = epoch + 1
    return {name: t.detach().tolist() for name, t in getattr(model, "module", model).state_dict().items()}


class Processes(UserCallback):
    """Every rank's pid, per attempt, and what each attempt's first report saw."""

    def __init__(self):
        self.pids: dict[int, list[int]] = {}
        self.first: dict[int, list[dict]] = {}

    def after_report(self, run_context, metrics, checkpoint):
        self.pids.setdefault(run_context.attempt, [m["pid"] for m in metrics])
        self.first.setdefault(run_context.attempt, metrics)


class _DieWhileReforming(TorchBackend):
    """Kills rank 2's worker as the group is set up for the second time (the re-form)."""

    def __init__(self):
        self.starts = 0

    def on_start(self, worker_group, backend_config):
        self.starts += 1
        if self.starts == 2:
            import ray

            ray.kill(worker_group.workers[2].actor, no_restart=True)
        super().on_start(worker_group, backend_config)


class _DieWhileReformingConfig(TorchConfig):
    @property
    def backend_cls(self):
        return _DieWhileReforming


def fit(tmp_path, name, fault=None, *, torch_config=None, max_failures=2, report_timeout_s=None):
    import ray.data

    callback = Processes()
    trainer = TorchTrainer(
        replace_loop,
        train_loop_config={"fault": fault},
        torch_config=torch_config,
        datasets={"train": ray.data.range(ROWS, override_num_blocks=6)},
        dataset_config=DataConfig(execution_options=ray.data.ExecutionOptions(preserve_order=True)),
        scaling_config=ScalingConfig(num_workers=WORKERS),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=max_failures, report_timeout_s=report_timeout_s),
            callbacks=[callback],
        ),
    )
    return trainer.fit(), callback


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("baseline"), "baseline")[0]


def run_record(result) -> dict:
    with open(os.path.join(result.path, "run.json")) as f:
        return json.load(f)


def assert_exact(result, baseline):
    """The faulted run ends as the uninterrupted one: the same weights, each step once, each row
    of each epoch trained on once (the rows every rank kept in its state)."""
    import torch

    assert list(result.metrics_dataframe["step"]) == list(range(STEPS))
    for name, value in result.return_value.items():
        torch.testing.assert_close(torch.tensor(value), torch.tensor(baseline.return_value[name]), rtol=0, atol=1e-6)
    states = []
    with result.checkpoint.as_directory() as folder:
        for rank in range(WORKERS):
            with open(os.path.join(folder, f"rank{rank}.json")) as f:
                states.append(json.load(f))
    for epoch in map(str, range(EPOCHS)):
        assert sorted(row for state in states for row in state["rows"][epoch]) == list(range(ROWS))


def assert_fresh(callback):
    """Every attempt's training function found its process as a fresh one would be."""
    for attempt, metrics in callback.first.items():
        assert [m["calls"] for m in metrics] == [1] * WORKERS, attempt
        assert [m["dtype"] for m in metrics] == ["torch.float32"] * WORKERS, attempt
        assert [m["attempt"] for m in metrics] == [attempt] * WORKERS  # what get_context() tells the loop


@pytest.mark.parametrize("fault_rank", [1, 0])
def test_a_killed_rank_is_replaced_and_the_others_keep_their_processes(tmp_path, uninterrupted, fault_rank):
    result, callback = fit(tmp_path, "killed", (fault_rank, "kill", str(tmp_path / "marker")))

    assert_exact(result, uninterrupted)
    first, second = callback.pids[1], callback.pids[2]
    for rank in range(WORKERS):
        assert (first[rank] == second[rank]) is (rank != fault_rank), (rank, first, second)
    assert_fresh(callback)
    (restart,) = run_record(result)["restarts"]
    kept = [rank for rank in range(WORKERS) if rank != fault_rank]
    assert restart == {
        "attempt": 1,
        "kept": kept,
        "replaced": {str(fault_rank): "its process died"},
        "full_restart": None,
    }


def test_a_rank_that_raises_costs_no_process_at_all(tmp_path, uninterrupted):
    result, callback = fit(tmp_path, "raised", (1, "raise", str(tmp_path / "marker")))

    assert_exact(result, uninterrupted)
    assert callback.pids[1] == callback.pids[2]
    assert_fresh(callback)
    (restart,) = run_record(result)["restarts"]
    assert (restart["kept"], restart["replaced"], restart["full_restart"]) == ([0, 1, 2], {}, None)


def test_a_hung_rank_is_replaced_after_the_report_timeout(tmp_path, uninterrupted):
    result, callback = fit(tmp_path, "stopped", (1, "stop", str(tmp_path / "marker")), report_timeout_s=4)

    assert_exact(result, uninterrupted)
    first, second = callback.pids[1], callback.pids[2]
    assert (first[0], first[2]) == (second[0], second[2]) and first[1] != second[1]
    (restart,) = run_record(result)["restarts"]
    assert (restart["kept"], restart["replaced"]) == ([0, 2], {"1": "its process hung"})


def test_a_rank_killed_during_its_checkpoint_upload_is_replaced(tmp_path, uninterrupted):
    result, callback = fit(tmp_path, "upload", (1, "upload", str(tmp_path / "marker")))

    assert_exact(result, uninterrupted)
    first, second = callback.pids[1], callback.pids[2]
    assert (first[0], first[2]) == (second[0], second[2]) and first[1] != second[1]
    # The half-uploaded checkpoint of step 11 was never committed: the run resumed from step 7's.
    assert [c["dir_name"] for c in run_record(result)["checkpoints"]][-1] != "checkpoint_000002"


def test_a_second_death_while_the_group_re_forms_restarts_every_worker(tmp_path, uninterrupted):
    result, callback = fit(
        tmp_path,
        "reform",
        (1, "kill", str(tmp_path / "marker")),
        torch_config=_DieWhileReformingConfig(),
        max_failures=3,
    )

    assert_exact(result, uninterrupted)
    first, restarts = run_record(result)["restarts"]
    assert (first["kept"], first["replaced"]) == ([0, 2], {"1": "its process died"})
    # The record says what failed: rank 2's death as the group re-formed.
    assert restarts["full_restart"].startswith("a second failure while the group re-formed: "), restarts
    assert "ActorDiedError" in restarts["full_restart"] or "died" in restarts["full_restart"], restarts
    assert set(callback.pids[3]).isdisjoint(callback.pids[1])  # every process new in attempt 3
    assert_fresh(callback)


def test_a_spare_worker_takes_the_failed_rank_s_place(tmp_path, uninterrupted, monkeypatch):
    """With spares started as soon as the group reports (FLOWTRAIN_SPARE_AFTER_S=0), the killed
    rank's replacement is a process that was already running before the fault."""
    monkeypatch.setenv("FLOWTRAIN_SPARE_AFTER_S", "0")
    marker = tmp_path / "marker"
    result, callback = fit(tmp_path, "spare", (1, "kill", str(marker)))

    assert_exact(result, uninterrupted)
    first, second = callback.first[1], callback.first[2]
    assert [m["pid"] for m in first][::2] == [m["pid"] for m in second][::2]
    assert second[1]["pid"] != first[1]["pid"]
    assert second[1]["started"] < marker.stat().st_mtime  # started before rank 1 was killed: a spare
    assert_fresh(callback)


def test_spare_settings_are_checked_before_any_worker_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_SPARE_WORKERS", "one")
    with pytest.raises(ValueError, match="FLOWTRAIN_SPARE_WORKERS='one'"):
        fit(tmp_path, "bad-spares")
    monkeypatch.setenv("FLOWTRAIN_SPARE_WORKERS", "1")
    monkeypatch.setenv("FLOWTRAIN_REPLACE_RANKS", "maybe")
    with pytest.raises(ValueError, match="FLOWTRAIN_REPLACE_RANKS='maybe'"):
        fit(tmp_path, "bad-replace")


def test_the_gpu_check_of_a_re_formed_group_passes_on_cpu_workers(tmp_path):
    """``make gpu-check``'s nccl_reform check, on two CPU workers over gloo: a failure with a
    collective in flight, then the same processes in a re-formed group."""
    from benchmarks.gpu_workloads import Setup, check_nccl_reform

    found = check_nccl_reform(Setup(use_gpu=False, num_gpus=0, workdir=str(tmp_path), seconds=1))
    assert found["backend"] == "gloo" and found["pids_by_attempt"][1] == found["pids_by_attempt"][2]
