"""End to end as an operator does it: a real `prefect server start` on 127.0.0.1, a process work
pool, `prefect deploy` from this checkout's prefect.yaml, `prefect deployment run --param`, and a
process worker that runs the flow; the run joins this session's Ray through the RAY_ADDRESS job
variable. Every process started here is stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from conftest import ROOT
from pipeline_loops import write_classification_parquet

PREFECT = os.path.join(os.path.dirname(sys.executable), "prefect")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """Stop the process and everything it started (its own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real Prefect server on 127.0.0.1 with its own PREFECT_HOME; yields the CLI environment."""
    home = tmp_path_factory.mktemp("prefect-server-home")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false")
    log = open(home / "server.log", "w")
    server = subprocess.Popen(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (home / "server.log").read_text()
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the Prefect server did not answer within 120 s"
            time.sleep(0.5)
        yield dict(env, PREFECT_API_URL=api)
    finally:
        _stop(server)
        log.close()


def prefect(env, *args, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.usefixtures("ray_local")
def test_deploy_then_run_with_params_on_a_process_worker(prefect_server, tmp_path):
    import ray

    env = prefect_server
    data = write_classification_parquet(tmp_path / "data")
    storage = tmp_path / "results"
    prefect(env, "work-pool", "create", "flowtrain", "--type", "process")
    prefect(env, "--no-prompt", "deploy", "--name", "tabular-mlp")

    # The server checks --param against the flow's parameter models before making a run.
    refused = prefect(env, "deployment", "run", "flowtrain-pipeline/tabular-mlp", "--param", 'scaling={"num_workers": -1}', check=False)
    assert refused.returncode != 0 and "num_workers" in refused.stdout + refused.stderr

    job_env = {"RAY_ADDRESS": ray.get_runtime_context().gcs_address, "FLOWTRAIN_STORAGE_PATH": str(storage)}
    started = prefect(
        env, "deployment", "run", "flowtrain-pipeline/tabular-mlp",
        "--param", "datasets=" + json.dumps({"train": {"uri": data, "required_columns": {"label": "int"}}, "valid": {"uri": data}}),
        "--param", "train_loop_config=" + json.dumps({"label_column": "label", "epochs": 2}),
        "--param", "run=" + json.dumps({"name": "deployed"}),
        "--job-variable", "env=" + json.dumps(job_env),
    )
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", started.stdout).group(1)

    worker_log = tmp_path / "worker.log"
    with open(worker_log, "w") as log:
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", "flowtrain", "--run-once"],
            env=dict(env, PWD=str(ROOT)), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            worker.wait(timeout=400)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _stop(worker)

    flow_run = httpx.get(f"{env['PREFECT_API_URL']}/flow_runs/{flow_run_id}", timeout=10).json()
    assert flow_run["state"]["type"] == "COMPLETED", worker_log.read_text()[-5000:]
    snapshot = json.loads((storage / "deployed" / "run.json").read_text())
    assert [r["metrics"]["epoch"] for r in snapshot["reports"]] == [0, 1]
    kept = [c["dir_name"] for c in snapshot["checkpoints"]]
    assert kept and all((storage / "deployed" / name / "model.pt").is_file() for name in kept)
