"""Shared test setup: quiet telemetry, one local Ray for the session, and leak checks."""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
# Prefect's database, results and settings for this session only (read when prefect is imported).
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="flowtrain-test-prefect-home-")
os.environ.pop("PREFECT_API_URL", None)
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Bytecode written and read, for pytest run by hand as for `make test` (the Makefile says why:
# without it each Ray worker compiles torch from source again).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# Under pytest-xdist each worker keeps its Rays in a folder of its own: Ray finds "the cluster
# started last" (what ray.init() with no address joins, in a subprocess too) in its temp folder,
# and a worker must never join the cluster of a test running beside it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix=f"ray-{os.environ['PYTEST_XDIST_WORKER']}-", dir="/tmp")
# Tests that inject storage failures need the retries, not the production backoff between them.
os.environ.setdefault("FLOWTRAIN_UPLOAD_BACKOFF_S", "0.01")
# Ray workers inherit this, so training functions defined in test modules unpickle there.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), str(TESTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# The slowest modules, printed after the slowest tests (tests/module_durations.py); --quick, the
# edit-loop tier (tests/quick_tier.py); pytester
# runs a suite inside a test (tests/test_module_durations.py).
pytest_plugins = ("module_durations", "quick_tier", "pytester")

#: CPUs the shared test Ray advertises: 2 training workers plus room for Ray Data and the driver.
TEST_NUM_CPUS = 4
# address="local": always a Ray of our own, never a cluster another process left in /tmp/ray.


#: Modules that take longest (minutes: soaks, real Prefect workers, benchmarks, many clusters),
#: longest first. With pytest-xdist (`make test PYTEST_ARGS='$(XDIST)'`, see the Makefile) starting
#: these first keeps a long one from being the last to begin.
LONGEST_FIRST = (
    "test_chaos",
    "test_chaos_hosts",
    "test_deployments",
    "test_scale_bench",
    "test_ray_train_runs",
    "test_tracking",
    "test_sweep_flow",
    "test_console_output",
    "test_tpu_slices",
    "test_lease_race",
    "test_docs_examples",
    "test_pipeline_flow",
    "test_artifacts",
    "test_tune",
    "test_framework_parity",
    "test_node_loss",
    "test_elastic",
    "test_preemption",
    "test_driver_rerun",
    "test_last_round",
    "test_fault_tolerance",
)


#: Tests that share nothing expensive with their module's others and take minutes: under
#: pytest-xdist each may run on a worker of its own, beside the rest of its module.
ON_THEIR_OWN = (
    "test_chaos.py::test_the_short_schedule_breaks_no_invariant",
    "test_chaos.py::test_the_soak_reports_a_planted_defect",
    "test_chaos_hosts.py::test_the_short_host_schedule_breaks_no_invariant_and_leaves_nothing_behind",
    "test_deployments.py::test_nightly_deployment_runs_when_its_schedule_fires_on_postgres",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist names each test's group in its id
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's ``--dist loadgroup``: run the longest modules first (the order inside
    a module is kept) and keep a module's tests on one worker, so its module-scoped Ray, cluster
    or server starts once, except the tests in ``ON_THEIR_OWN``."""
    # pytest-xdist sets its workers' `dist` to "no" (they collect; its controller schedules) and
    # says "loadgroup" in `loadgroup` instead: without the groups named here, in the workers, each
    # test is a group of its own and a module's tests go to both workers, each setting the
    # module's fixtures (a cluster, a benchmark run) up again.
    if not getattr(config.option, "loadgroup", False):
        return  # one process: the modules in their usual order
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(rank)) if item.module else len(rank))
    for item in items:
        own = any(item.nodeid.endswith(name) for name in ON_THEIR_OWN)
        item.add_marker(pytest.mark.xdist_group(item.nodeid if own else item.module.__name__))


@pytest.fixture(scope="session")
def _ray_session():
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=TEST_NUM_CPUS, include_dashboard=False, log_to_driver=True)
        started = True
    yield
    if started and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real Prefect server (SQLite, scheduler on) for the session: the environment for its CLI and workers."""
    from prefect_server import running_prefect_server

    with running_prefect_server(tmp_path_factory.mktemp("prefect-server-home")) as env:
        yield env


@pytest.fixture(scope="session")
def prefect_harness(prefect_server):
    """Flows called in this process report to the session's Prefect server, the one its CLI and
    workers use: one server start (about 22 s of CPU here) serves both kinds of test."""
    import prefect.context
    import prefect.settings
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    url = prefect.settings.PREFECT_API_URL
    with prefect.settings.temporary_settings(updates={url: prefect_server["PREFECT_API_URL"]}):
        # As prefect_test_harness does: code running in a context copied before this fixture (a
        # thread's) must see the server too, not start an ephemeral one of its own.
        with prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
            yield
            # Logs and events still queued go out while the server is up.
            APILogWorker.drain_all(timeout=10)
            EventsWorker.drain_all(timeout=10)


@pytest.fixture
def ray_local(_ray_session):
    """A running local Ray (shared by the session); fails the test if it leaks actors or placement groups."""
    import ray

    if not ray.is_initialized():  # a test module with its own cluster shut the shared one down
        ray.init(address="local", num_cpus=TEST_NUM_CPUS, include_dashboard=False, log_to_driver=True)
    before = set(train_worker_actors())
    yield
    assert_no_leaks(new_since=before)


def train_worker_actors() -> dict[str, dict]:
    """Every worker actor Ray knows of (dead ones too), by actor id."""
    import ray

    return {
        actor_id: actor
        for actor_id, actor in ray._private.state.actors().items()
        if "TrainWorker" in actor.get("ActorClassName", "")
    }


def live_train_workers() -> list[dict]:
    """Worker actors alive and not parked for the next run (``FLOWTRAIN_KEEP_WORKERS_S``)."""
    from trainers._internal.workers.warm_workers import parked_actor_ids

    parked = parked_actor_ids()
    return [a for actor_id, a in train_worker_actors().items() if a.get("State") != "DEAD" and actor_id not in parked]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (exited, not yet reaped by its parent, which for a
    worker is a raylet that may be slow to do it on a loaded machine) holds nothing and runs nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:  # gone meanwhile, or no /proc: os.kill's answer stands
        return os.path.exists(f"/proc/{pid}") or not os.path.isdir("/proc")


def live_placement_groups() -> list[dict]:
    from ray.util import placement_group_table

    return [pg for pg in placement_group_table().values() if pg.get("state") not in ("REMOVED",)]


def assert_no_leaks(timeout_s: float = 10.0, new_since: set[str] | None = None) -> None:
    """Every worker actor, its process, and every placement group of finished runs is gone
    (teardown is asynchronous in Ray, so this waits a little)."""
    from trainers._internal.workers.warm_workers import parked_actor_ids

    deadline = time.monotonic() + timeout_s
    while True:
        actors, groups = live_train_workers(), live_placement_groups()
        pids = []
        if new_since is not None:
            parked = parked_actor_ids()
            started = [
                a
                for actor_id, a in train_worker_actors().items()
                if actor_id not in new_since and actor_id not in parked
            ]
            pids = [a["Pid"] for a in started if a.get("Pid") and process_alive(a["Pid"])]
        if not actors and not groups and not pids:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"leaked after the test: {len(actors)} worker actor(s), {len(groups)} placement group(s), "
                f"worker processes still alive: {pids}"
            )
        time.sleep(0.1)
