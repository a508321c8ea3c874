"""A real `prefect server start` on 127.0.0.1 for the tests that need what only a server does:
deployments, the scheduler service, process workers. Every process started here is stopped.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from conftest import ROOT

PREFECT = os.path.join(os.path.dirname(sys.executable), "prefect")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process_group(process: subprocess.Popen, timeout_s: float = 20) -> None:
    """Stop ``process`` and everything it started (it was started in a session of its own)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def wait_until(condition, *, timeout_s: float, what: str, interval_s: float = 0.5):
    """Call ``condition`` until it returns something truthy (returned); fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(interval_s)


def _healthy(api: str) -> bool:
    try:
        return httpx.get(f"{api}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def running_prefect_server(home: pathlib.Path, **settings: str) -> Iterator[dict[str, str]]:
    """Start a Prefect server (API, scheduler and the other services) with its own ``PREFECT_HOME``;
    yield the environment a CLI or worker needs to talk to it. ``settings`` are extra ``PREFECT_*``
    variables for the server (a Postgres connection URL, say)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        # The scheduler's main loop runs once a minute by default; newly deployed deployments are
        # scheduled by its 5-second loop either way, this only shortens the wait for later runs.
        PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="5",
    )
    env.update(settings)
    log_path = home / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        api = f"http://127.0.0.1:{port}/api"
        try:
            deadline = time.monotonic() + 120
            while not _healthy(api):
                assert server.poll() is None, log_path.read_text()[-5000:]
                assert time.monotonic() < deadline, "the Prefect server did not answer within 120 s"
                time.sleep(0.5)
            cli_env = {k: v for k, v in env.items() if not k.startswith("PREFECT_SERVER_")}
            yield dict(cli_env, PREFECT_API_URL=api)
        finally:
            stop_process_group(server, timeout_s=5)  # a throwaway server: no need to wait out a graceful stop


def prefect(
    env: dict[str, str], *args: str, check: bool = True, stdin=subprocess.DEVNULL
) -> subprocess.CompletedProcess:
    """Run the ``prefect`` CLI from the project folder (where ``prefect.yaml`` is) with stdin closed."""
    done = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=stdin)
    if check:
        assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def api_get(env: dict[str, str], path: str) -> dict | list:
    return httpx.get(f"{env['PREFECT_API_URL']}{path}", timeout=10).json()


def api_post(env: dict[str, str], path: str, body: dict) -> dict | list:
    response = httpx.post(f"{env['PREFECT_API_URL']}{path}", json=body, timeout=10)
    assert response.status_code < 300, response.text
    return response.json()
