"""Every deployment in prefect.yaml, as an operator runs it: a real `prefect server start` (SQLite,
scheduler on), `prefect deploy --all` with stdin closed, a real `process` worker started from this
checkout, and each deployment run to Completed, the nightly one by the scheduler itself (on a
server backed by PostgreSQL).

Flow runs join this session's Ray through the worker's RAY_ADDRESS, and find the example data under
the worker's HOME (``~/flowtrain_data``), as prefect.yaml's parameters say.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml

from conftest import ROOT
from prefect_server import PREFECT, api_get, api_post, prefect, stop_process_group, wait_until
from run_history import recorded_reports

#: Slow enough to be real work, fast enough for the suite: a run of the example MLP takes ~20 s here.
RUN_TIMEOUT_S = 300
#: How far ahead a schedule must still be when `prefect deploy` returns: the scheduler's loop (5 s in
#: tests/prefect_server.py) plus its own run time.
SCHEDULER_MARGIN_S = 7

pytestmark = pytest.mark.usefixtures("ray_local")


def deployment_names() -> list[str]:
    """``flow-name/deployment-name`` of every deployment in prefect.yaml."""
    config = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    flows = {
        "training_pipeline": "flowtrain-pipeline",
        "xgboost_pipeline": "flowtrain-xgboost",
        "lightgbm_pipeline": "flowtrain-lightgbm",
        "sweep": "flowtrain-sweep",
    }
    return [f"{flows[d['entrypoint'].rpartition(':')[2]]}/{d['name']}" for d in config["deployments"]]


@pytest.fixture(scope="module")
def operator_home(tmp_path_factory):
    """The HOME of the worker: the example data where prefect.yaml looks for it."""
    home = tmp_path_factory.mktemp("operator-home")
    done = subprocess.run(
        [sys.executable, "-m", "tasks.example_data"],
        cwd=ROOT,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (home / "flowtrain_data" / "breast_cancer" / "train.parquet").is_file()
    return home


@pytest.fixture(scope="module")
def deployed(prefect_server):
    """`prefect deploy --all < /dev/null` on the session's server: the environment and its output."""
    env = prefect_server
    prefect(env, "work-pool", "create", "flowtrain", "--type", "process", "--overwrite")
    done = prefect(env, "deploy", "--all")  # stdin is /dev/null: a prompt would fail the command
    return env, done.stdout + done.stderr


@contextlib.contextmanager
def running_worker(env: dict[str, str], operator_home: pathlib.Path, results: pathlib.Path) -> Iterator[dict]:
    """A process worker for the `flowtrain` pool, started from this checkout as the README says, its
    flow runs joining this session's Ray."""
    import ray

    worker_env = dict(
        env,
        HOME=str(operator_home),
        PWD=str(ROOT),
        RAY_ADDRESS=ray.get_runtime_context().gcs_address,
        FLOWTRAIN_STORAGE_PATH=str(results),
        PREFECT_WORKER_QUERY_SECONDS="1",
    )
    token = pathlib.Path.home() / ".ray" / "auth_token"  # Ray's token lives under the real HOME
    if token.is_file():
        worker_env["RAY_AUTH_TOKEN_PATH"] = str(token)
    # A local ray.init() turns token auth on by setting RAY_AUTH_MODE in this process's environment,
    # and a client that joins by address sends the token only in that mode. The server's `env` is a
    # copy taken when it started, before this session's first Ray when a Prefect test came first
    # (as under pytest-xdist), so the mode is taken from the Ray running now.
    if "RAY_AUTH_MODE" in os.environ:
        worker_env["RAY_AUTH_MODE"] = os.environ["RAY_AUTH_MODE"]
    log_path = results / "worker.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", "flowtrain", "--limit", "1"],
            env=worker_env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            yield {"env": env, "results": results, "log": log_path, "process": process}
        finally:
            stop_process_group(process, timeout_s=5)


@pytest.fixture(scope="module")
def worker(deployed, operator_home, tmp_path_factory, _ray_session):
    env, _ = deployed
    with running_worker(env, operator_home, tmp_path_factory.mktemp("results")) as started:
        yield started


def flow_run(env, flow_run_id: str) -> dict:
    return api_get(env, f"/flow_runs/{flow_run_id}")


def wait_for_final_state(worker, flow_run_id: str) -> dict:
    """The flow run once it is final; fails with the worker's output if it is not in time."""

    def final():
        assert worker["process"].poll() is None, worker["log"].read_text()[-5000:]
        run = flow_run(worker["env"], flow_run_id)
        return run if run["state"] and run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

    try:
        return wait_until(final, timeout_s=RUN_TIMEOUT_S, what=f"flow run {flow_run_id} finishing", interval_s=1)
    except AssertionError as error:
        raise AssertionError(f"{error}\nworker output:\n{worker['log'].read_text()[-5000:]}") from None


def run_deployment(worker, name: str, *args: str) -> dict:
    started = prefect(worker["env"], "deployment", "run", name, *args)
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", started.stdout).group(1)
    run = wait_for_final_state(worker, flow_run_id)
    assert run["state"]["type"] == "COMPLETED", f"{name}: {run['state']}\n{worker['log'].read_text()[-5000:]}"
    return run


def test_deploy_all_asks_nothing_and_creates_every_deployment(deployed):
    env, output = deployed
    created = {f"{d['flow_name']}/{d['name']}": d for d in _deployments(env)}
    assert sorted(created) == sorted(deployment_names()), output
    # Schedules are what prefect.yaml declares: the nightly cron and nothing else.
    schedules = {name: [s["schedule"] for s in d["schedules"]] for name, d in created.items()}
    assert schedules.pop("flowtrain-pipeline/tabular-mlp-nightly")[0]["cron"] == "0 3 * * *"
    assert all(s == [] for s in schedules.values()), schedules
    # `{{ $PWD }}` was resolved here, at deploy time: the workers run flows in this checkout.
    for d in created.values():
        assert d["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]


def test_deploy_all_on_a_terminal_asks_nothing(deployed):
    """On a terminal `prefect deploy` asks about anything prefect.yaml leaves open (a deployment with
    no `schedules` gets "Would you like to configure schedules?"); every deployment declares it all."""
    import os
    import pty
    import select

    env, _ = deployed
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [PREFECT, "deploy", "--all"],
        env=dict(env, COLUMNS="120"),
        cwd=ROOT,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
    )
    os.close(terminal)
    output = b""
    try:
        # Read until the command ends (EOF on the terminal). Deploying prints all along: 30 s of
        # silence means it is waiting at a prompt.
        while select.select([controller], [], [], 30)[0]:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the command exited and the terminal closed
                break
            if not chunk:
                break
            output += chunk
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace"))
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"prefect deploy --all is waiting for an answer:\n{text[-1500:]}")
        assert process.returncode == 0, text[-3000:]
    finally:
        stop_process_group(process)
        os.close(controller)
    assert "?" not in "".join(line for line in text.splitlines() if "[y/n]" in line or line.startswith("?")), text
    assert text.count("successfully created") + text.count("successfully updated") == len(deployment_names()), text


def _deployments(env) -> list[dict]:
    deployments = api_post(env, "/deployments/filter", {})
    flows = {f["id"]: f["name"] for f in api_post(env, "/flows/filter", {})}
    return [dict(d, flow_name=flows[d["flow_id"]]) for d in deployments]


def test_tabular_mlp_refuses_bad_params_and_runs_with_params_and_job_variables(worker, tmp_path):
    from pipeline_loops import write_classification_parquet

    env = worker["env"]
    # The server checks --param against the flow's parameter models before making a run.
    refused = prefect(
        env,
        "deployment",
        "run",
        "flowtrain-pipeline/tabular-mlp",
        "--param",
        'scaling={"num_workers": -1}',
        check=False,
    )
    assert refused.returncode != 0 and "num_workers" in refused.stdout + refused.stderr

    data = write_classification_parquet(tmp_path / "data")
    storage = tmp_path / "results"
    run_deployment(
        worker,
        "flowtrain-pipeline/tabular-mlp",
        "--param",
        "datasets="
        + json.dumps({"train": {"uri": data, "required_columns": {"label": "int"}}, "valid": {"uri": data}}),
        "--param",
        "train_loop_config=" + json.dumps({"label_column": "label", "epochs": 2}),
        "--param",
        "run=" + json.dumps({"name": "deployed"}),
        "--job-variable",
        "env=" + json.dumps({"FLOWTRAIN_STORAGE_PATH": str(storage)}),
    )
    snapshot = json.loads((storage / "deployed" / "run.json").read_text())
    assert [r["metrics"]["epoch"] for r in recorded_reports(storage / "deployed")] == [0, 1]
    kept = [c["dir_name"] for c in snapshot["checkpoints"]]
    assert kept and all((storage / "deployed" / name / "model.pt").is_file() for name in kept)

    # The worker's terminal shows Prefect's lines, one per report, not Ray Data's progress.
    terminal = worker["log"].read_text()
    assert "report 2 (attempt 1): epoch=1" in terminal
    assert not re.search(r"Running Dataset|\d+%\||\x1b\[A|logging_progress", terminal), terminal[-3000:]


def _run_folder(worker, run: dict):
    """The training run's folder a pipeline flow run wrote (unnamed runs are named after the flow run's id)."""
    folder = worker["results"] / f"pipeline-{run['id'][:8]}"
    assert (folder / "run.json").is_file(), sorted(p.name for p in worker["results"].iterdir())
    return folder, json.loads((folder / "run.json").read_text())


@pytest.mark.parametrize(
    "name, num_reports",
    [
        ("flowtrain-xgboost/xgboost-breast-cancer", 50),
        ("flowtrain-lightgbm/lightgbm-breast-cancer", 50),
    ],
)
def test_pipeline_deployment_runs_as_defined(worker, name, num_reports):
    """Each GBDT deployment, with prefect.yaml's own parameters, trains to the end (the torch
    pipeline's parameters are the nightly deployment's: the schedule test runs them)."""
    run = run_deployment(worker, name)
    folder, snapshot = _run_folder(worker, run)
    assert len(recorded_reports(folder)) == snapshot["num_reports"] == num_reports
    assert len(snapshot["checkpoints"]) >= 1


#: Fewer epochs than prefect.yaml's, for the suite's time: the deployment's other parameters as they are.
FEW_EPOCHS = {"label_column": "target", "epochs": 2}


def test_keras_deployment_runs_its_loop_under_tensorflow_trainer(worker):
    """The tabular-keras deployment: a Keras loop named by import path, on 2 TensorFlow workers."""
    run = run_deployment(
        worker, "flowtrain-pipeline/tabular-keras", "--param", "train_loop_config=" + json.dumps(FEW_EPOCHS)
    )
    folder, snapshot = _run_folder(worker, run)
    assert [r["metrics"]["epoch"] for r in recorded_reports(folder)] == list(range(FEW_EPOCHS["epochs"]))
    assert all("val_loss" in c["metrics"] for c in snapshot["checkpoints"]) and snapshot["checkpoints"]


def test_sweep_deployment_runs_as_defined(worker):
    run = run_deployment(
        worker, "flowtrain-sweep/tabular-mlp-sweep", "--param", "train_loop_config=" + json.dumps(FEW_EPOCHS)
    )
    sweep = worker["results"] / "tabular-mlp-sweep"
    trials = [folder for folder in sweep.iterdir() if (folder / "run.json").is_file()]
    assert len(trials) == 4, run
    assert all(len(recorded_reports(trial)) == FEW_EPOCHS["epochs"] for trial in trials)


@pytest.mark.usefixtures("_ray_session")
def test_nightly_deployment_runs_when_its_schedule_fires_on_postgres(operator_home, tmp_path_factory):
    """The scheduler service creates the run and the worker runs it: the nightly deployment, deployed
    again from prefect.yaml with a schedule that fires in a few seconds added to its cron, on a
    Prefect server backed by PostgreSQL as a production server runs. (The scheduler is the same
    code on SQLite, the embedded default, where every other test here runs its flow runs: one
    scheduled run to the end, not two, for the suite's time.)"""
    from postgres_server import running_postgres
    from prefect_server import running_prefect_server

    with (
        running_postgres() as url,
        running_prefect_server(
            tmp_path_factory.mktemp("prefect-postgres-home"), PREFECT_SERVER_DATABASE_CONNECTION_URL=url
        ) as env,
    ):
        prefect(env, "work-pool", "create", "flowtrain", "--type", "process")
        with running_worker(env, operator_home, tmp_path_factory.mktemp("results-postgres")) as started:
            assert_schedule_fires(started)


def assert_schedule_fires(worker) -> None:
    """Deploy the nightly deployment from prefect.yaml with a schedule that fires in a few seconds
    added to its cron, then wait until the scheduler made that run and the worker Completed it."""
    env = worker["env"]
    # The scheduler makes runs only for times still ahead when its loop (5 s here) next looks, so the
    # schedule must still lie that far ahead once `prefect deploy` returns; on a loaded machine the
    # CLI alone can take longer than the lead, so deploy again with a longer lead when it did.
    lead_s = 10
    while True:
        fires_at = (_now() + datetime.timedelta(seconds=lead_s)).replace(microsecond=0)
        prefect(
            env,
            "deploy",
            "--name",
            "tabular-mlp-nightly",
            "--interval",
            "3600",
            "--anchor-date",
            fires_at.isoformat(),
            "--param",
            "train_loop_config=" + json.dumps(FEW_EPOCHS),
        )
        if fires_at - _now() >= datetime.timedelta(seconds=SCHEDULER_MARGIN_S):
            break
        assert lead_s < 160, f"`prefect deploy` kept taking longer than the {lead_s} s lead of the schedule"
        lead_s *= 2
    [found] = [d for d in _deployments(env) if d["name"] == "tabular-mlp-nightly"]
    schedules = [s["schedule"] for s in found["schedules"]]
    assert {s.get("cron") or s.get("interval") for s in schedules} == {"0 3 * * *", 3600.0}, schedules
    deployment = found["name"]

    def scheduled_run():
        runs = api_post(env, "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [found["id"]]}}})
        due = [r for r in runs if r["auto_scheduled"] and _when(r["expected_start_time"]) == fires_at]
        return due[0] if due else None

    try:
        run = wait_until(
            scheduled_run, timeout_s=60, what=f"the scheduler creating a run of {deployment}", interval_s=1
        )
    except AssertionError as error:
        log = (worker_server_log(env) or "")[-3000:]
        raise AssertionError(f"{error}; the server's log ends:\n{log}") from None
    run = wait_for_final_state(worker, run["id"])
    assert run["state"]["type"] == "COMPLETED", run["state"]
    folder, _ = _run_folder(worker, run)
    assert len(recorded_reports(folder)) == FEW_EPOCHS["epochs"]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _when(timestamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).astimezone(datetime.UTC)


def worker_server_log(env) -> str | None:
    """The Prefect server's own output (where the scheduler's errors are)."""
    path = pathlib.Path(env["PREFECT_HOME"]) / "server.log"
    return path.read_text() if path.is_file() else None
