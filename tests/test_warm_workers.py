"""A clean run's worker processes serve the next fit() of the same shape (FLOWTRAIN_KEEP_WORKERS_S),
reset as a fresh process would be and holding no resources while they wait; a failed run's workers,
another shape, and a backend that does not say it can be reused get new processes."""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import TEST_NUM_CPUS, live_train_workers, process_alive
from prefect_server import wait_until
from storage import settings
from trainers import DataParallelTrainer, RunConfig, ScalingConfig, WorkerGroupError
from trainers._internal.workers import warm_workers
from trainers.backend import Backend, BackendConfig
from trainers.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.fixture(autouse=True)
def nothing_parked_around_each_test():
    warm_workers.release()
    yield
    warm_workers.release()


def what_a_run_finds(config):
    """Every rank's view of its process as the run found it (rank 0 returns them all); then the run
    leaves an environment variable and another working directory behind."""
    import torch.distributed as dist

    found = {
        "pid": os.getpid(),
        "left_over": os.environ.get("FLOWTRAIN_TEST_LEFT_OVER"),
        "cwd": os.getcwd(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "world": dist.get_world_size(),
        "numpy_random_loaded": "numpy.random" in sys.modules,
    }
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, found)
    os.environ["FLOWTRAIN_TEST_LEFT_OVER"] = "yes"
    os.chdir("/")
    if config.get("fail"):
        raise RuntimeError("planted failure")
    return everyone


def run(tmp_path, name, workers=2, cpus=1, fail=False):
    trainer = TorchTrainer(
        what_a_run_finds,
        train_loop_config={"fail": fail},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": cpus}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path)),
    )
    return trainer.fit().return_value


def pids(found):
    return sorted(row["pid"] for row in found)


def workers_parked(tmp_path, name):
    """What the run's record says became of its workers at each clean end (one line per fit())."""
    return json.loads((tmp_path / name / "run.json").read_text())["workers_parked"]


def test_the_next_run_of_the_same_shape_gets_the_same_processes_reset(tmp_path):
    import ray

    first = run(tmp_path, "first")
    # Parked, the workers hold nothing: the whole cluster is free for other work.
    wait_until(lambda: ray.available_resources().get("CPU") == TEST_NUM_CPUS, timeout_s=30, what="the run's CPUs freed")
    assert len(warm_workers.parked_actor_ids()) == 2
    assert workers_parked(tmp_path, "first") == ["parked 2 of 2"]
    second = run(tmp_path, "second")
    assert pids(second) == pids(first)
    loaded_at_first = {row["pid"]: row["numpy_random_loaded"] for row in first}
    for row in second:  # nothing the first run changed is seen by the second
        assert row["left_over"] is None
        assert row["cwd"] == first[0]["cwd"]
        assert row["world"] == 2
        # Resetting loads nothing the process lacked at its first run (numpy.random reseeded through
        # numpy loaded a dozen modules, 1.5 MB; a process Ray reused from its pool may hold it already).
        assert row["numpy_random_loaded"] == loaded_at_first[row["pid"]]


def draw_after_seeding_or_not(config):
    """Rank 0's draw from numpy's and Python's global generators, seeded first when asked."""
    import random

    import numpy as np

    if config["seed"] is not None:
        np.random.seed(config["seed"])
        random.seed(config["seed"])
    return {"pid": os.getpid(), "numpy": float(np.random.rand()), "python": random.random()}


def test_a_kept_worker_s_generators_are_reseeded_as_a_fresh_process_s_would_be(tmp_path):
    """A loop that seeds numpy's and Python's global generators leaves no seeded stream to the next
    run on the same process: without its own seed, that run draws what a fresh process would."""
    import random

    import numpy as np

    def fit(name, seed):
        trainer = TorchTrainer(
            draw_after_seeding_or_not,
            train_loop_config={"seed": seed},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name=name, storage_path=str(tmp_path)),
        )
        return trainer.fit().return_value

    seeded, unseeded = fit("seeded", 7), fit("unseeded", None)
    assert unseeded["pid"] == seeded["pid"]
    numpy_stream, python_stream = np.random.RandomState(7), random.Random(7)
    assert seeded == {"pid": seeded["pid"], "numpy": numpy_stream.rand(), "python": python_stream.random()}
    assert unseeded["numpy"] != numpy_stream.rand() and unseeded["python"] != python_stream.random()


def test_a_failed_run_s_workers_are_not_kept(tmp_path):
    first = run(tmp_path, "kept")
    with pytest.raises(WorkerGroupError, match="planted failure"):
        run(tmp_path, "fails", fail=True)
    assert warm_workers.parked_actor_ids() == set()
    third = run(tmp_path, "after")
    assert set(pids(third)).isdisjoint(pids(first))
    for pid in pids(first):
        wait_until(lambda pid=pid: not process_alive(pid), timeout_s=30, what=f"kept worker {pid} killed")


def test_another_shape_kills_the_parked_workers_and_starts_its_own(tmp_path):
    two = run(tmp_path, "two")
    one = run(tmp_path, "one-worker-two-cpus", workers=1, cpus=2)
    assert set(pids(one)).isdisjoint(pids(two))
    assert one[0]["omp"] == "2"  # what Ray gives a worker holding 2 CPUs, though a kept one holds none
    for pid in pids(two):
        wait_until(lambda pid=pid: not process_alive(pid), timeout_s=30, what=f"parked worker {pid} killed")


def test_parked_workers_are_killed_after_the_keep_time(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_KEEP_WORKERS_S", "0.5")
    found = run(tmp_path, "brief")
    for pid in pids(found):
        wait_until(lambda pid=pid: not process_alive(pid), timeout_s=30, what=f"parked worker {pid} expiring")
    assert warm_workers.parked_actor_ids() == set()
    assert live_train_workers() == []


def test_a_keep_time_of_zero_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_KEEP_WORKERS_S", "0")
    first = run(tmp_path, "a")
    assert warm_workers.parked_actor_ids() == set()
    assert workers_parked(tmp_path, "a") == ["not parked: FLOWTRAIN_KEEP_WORKERS_S=0"]
    assert set(pids(run(tmp_path, "b"))).isdisjoint(pids(first))


def test_a_keep_time_that_is_not_a_number_names_the_variable(monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_KEEP_WORKERS_S", "soon")
    with pytest.raises(ValueError, match="FLOWTRAIN_KEEP_WORKERS_S='soon'"):
        settings.KEEP_WORKERS_S.read()


class _CustomBackend(Backend["_CustomConfig"]):
    """A backend of a user's own: it does not say its workers can be reused."""


class _CustomConfig(BackendConfig):
    @property
    def backend_cls(self):
        return _CustomBackend


def _pid():
    return os.getpid()


def test_a_backend_that_does_not_say_so_gets_new_processes(tmp_path):
    def fit(name):
        trainer = DataParallelTrainer(
            _pid,
            backend_config=_CustomConfig(),
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(name=name, storage_path=str(tmp_path)),
        )
        return trainer.fit().return_value

    first = fit("custom-1")
    assert warm_workers.parked_actor_ids() == set()
    [line] = workers_parked(tmp_path, "custom-1")
    assert line.startswith("not parked: the _CustomBackend backend has not declared") and "reuses_workers" in line
    assert fit("custom-2") != first


def _loads_a_library_with_process_state():
    import sys
    import types

    # Stands in for `import deepspeed` (seconds to import): what reset() looks for is the name.
    sys.modules.setdefault("deepspeed", types.ModuleType("deepspeed"))
    return os.getpid()


def test_a_process_that_loaded_deepspeed_is_not_kept(tmp_path):
    trainer = TorchTrainer(
        _loads_a_library_with_process_state,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="deepspeed-like", storage_path=str(tmp_path)),
    )
    pid = trainer.fit().return_value
    assert warm_workers.parked_actor_ids() == set()
    assert workers_parked(tmp_path, "deepspeed-like") == [
        "not parked: rank 0: it loaded deepspeed, which keep process-wide distributed state"
    ]
    wait_until(lambda: not process_alive(pid), timeout_s=30, what=f"worker {pid} killed")


#: A user's module, as a notebook user edits it between two fit() calls: a module-level counter,
#: and torch's default dtype changed by the run.
USER_MODULE = """
import os

import torch

from trainers import report

COUNTER = 0
VERSION = {version}


def loop():
    global COUNTER
    COUNTER += 1
    found = {{"version": VERSION, "counter": COUNTER, "dtype": str(torch.get_default_dtype()), "pid": os.getpid()}}
    torch.set_default_dtype(torch.float64)
    report({{"version": VERSION}})
    return found
"""


def test_a_kept_worker_imports_the_edited_module_afresh_and_torch_settings_are_reset(tmp_path, monkeypatch):
    import importlib
    import sys

    source = tmp_path / "user_code"
    source.mkdir()
    (source / "edited_module.py").write_text(USER_MODULE.format(version=1))
    monkeypatch.syspath_prepend(str(source))
    # The workers find the module the way a user's cluster does: on their PYTHONPATH.
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join([str(source), os.environ["PYTHONPATH"]])}}
    importlib.import_module("edited_module")

    def fit(name):
        trainer = TorchTrainer(
            sys.modules["edited_module"].loop,  # as the driver holds it now
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(name=name, storage_path=str(tmp_path), worker_runtime_env=runtime_env),
        )
        return trainer.fit().return_value

    first = fit("before-the-edit")
    (source / "edited_module.py").write_text(USER_MODULE.format(version=22))  # a new size: no stale .pyc
    importlib.reload(sys.modules["edited_module"])
    second = fit("after-the-edit")

    assert second["pid"] == first["pid"]  # the kept process served the second run
    assert first == {**first, "version": 1, "counter": 1, "dtype": "torch.float32"}
    assert second == {**second, "version": 22, "counter": 1, "dtype": "torch.float32"}
