"""``python -m trainers.doctor`` against real Ray clusters on this machine, each fault made real:

- a node whose worker processes import another Ray version (a ``sitecustomize`` on its raylet's
  ``PYTHONPATH`` rewrites ``ray.__version__`` as Ray is imported there);
- a node whose raylet, and so its workers, runs in a mount namespace of its own (``unshare -m``,
  root only) where the storage folder is bind-mounted read-only, or hidden under a tmpfs of its own
  (the node writes, but to a disk nobody else sees);
- a head started with token authentication (``RAY_AUTH_MODE=token``), joined without the token;
- a Prefect API address where nothing listens.

One cluster (a head and one node, 1 CPU each) serves the module; a faulty node joins it for its
test and leaves before the next. The doctor runs in this process (joined to that cluster) except
where joining is the point (the token test runs it as ``python -m trainers.doctor``).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from trainers.doctor import CheckResult, DoctorReport, NodeFacts, main

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: What the sitecustomize below makes a node's worker processes report as their Ray version.
FAKE_RAY_VERSION = "0.0.1+fake"

#: Put on a node's PYTHONPATH: rewrites ``ray.__version__`` right after ``ray`` is imported there.
FAKE_VERSION_SITECUSTOMIZE = f"""
import importlib.abc, importlib.util, sys

class _RewriteRayVersion(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "ray":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("ray")
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.__version__ = {FAKE_RAY_VERSION!r}

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _RewriteRayVersion())
"""


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    """Wait for ``condition`` (Ray's node table, a log line) to hold; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def alive_node_ids() -> set[str]:
    import ray

    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    """Run the command line in this process; its exit status and its output's lines."""
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out.splitlines()


def lines_of(output: list[str], name: str, status: str) -> list[str]:
    """The report's lines of check ``name`` with ``status``, each with its fix line when it has one."""
    found = []
    for index, line in enumerate(output):
        if line.split()[:2] == [status, name]:
            has_fix = index + 1 < len(output) and output[index + 1].strip().startswith("fix:")
            found.append(line + ("\n" + output[index + 1] if has_fix else ""))
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # the suite's shared single-node Ray; ray_local restarts it when needed
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address)
        wait_until(lambda: len(alive_node_ids()) == 2, "the two nodes")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@contextlib.contextmanager
def node_leaves_after(before: set[str]) -> Iterator[None]:
    """Around adding a node: afterwards, wait until every node that joined is gone from Ray's table."""
    try:
        yield
    finally:
        wait_until(lambda: alive_node_ids() <= before, "the added node to leave")


@pytest.fixture(scope="module")
def health_server() -> Iterator[str]:
    """A minimal HTTP server answering ``GET /api/health`` as Prefect's API does; yields its API URL."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/api/health"
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"true" if ok else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound here and never listened on: a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# -- a healthy cluster -------------------------------------------------------------------------


def test_a_healthy_cluster_passes_every_check(cluster, health_server, tmp_path, capsys):
    code, output = doctor(
        capsys, "--storage-path", str(tmp_path), "--prefect-api-url", health_server, "--num-workers", "2"
    )
    assert code == 0, "\n".join(output)
    checks = [line.split()[1] for line in output[:-1]]
    assert not [line for line in output if line.startswith("FAIL") or "fix:" in line], output
    assert checks.count("versions") == checks.count("resources") == 2, output  # one line per node
    assert checks.count("storage") == 3, output  # the driver and both nodes
    assert {"connect", "auth", "scaling", "prefect"} <= set(checks), output
    assert lines_of(output, "prefect", "ok") and lines_of(output, "scaling", "ok"), output
    assert output[-1] == "every check passed"
    assert not (tmp_path / ".doctor").exists()  # the probe files and their folder are gone


def test_workers_that_cannot_fit_fail_the_scaling_check(cluster, capsys):
    code, output = doctor(capsys, "--num-workers", "3", "--resources-per-worker", '{"CPU": 1}')
    assert code == 1
    [failure] = lines_of(output, "scaling", "FAIL")
    assert "3 workers" in failure and "fix: lower --num-workers" in failure, output


def test_gpus_ray_advertises_but_a_task_cannot_see_fail_and_unadvertised_ones_are_noted():
    from trainers._internal.cluster_checks import resource_checks

    def node(node_id: str, advertised: float, seen: int | None) -> NodeFacts:
        return NodeFacts(
            node_id=node_id * 8,
            ip="10.0.0.2",
            hostname="gpu-host",
            ray_version="2.60.0",
            python_version="3.11.7",
            flowtrain_version=None,
            visible_gpus=seen,
            gpu_source=f"{seen} NVIDIA device(s) in /dev",
            resources={"CPU": 8.0, "GPU": advertised, "memory": 2.0**34},
        )

    missing, spare, same, unknown = resource_checks(
        [node("a", 4, 0), node("b", 0, 2), node("c", 2, 2), node("d", 1, None)]
    )
    assert missing.status == "FAIL" and "4 GPU" in missing.found and "a task there sees 0 GPU(s)" in missing.found
    assert "--num-gpus" in missing.fix and missing.where == "node 10.0.0.2 (gpu-host, aaaaaaaa)"
    assert spare.status == "ok" and "start Ray with --num-gpus=2" in spare.found
    assert same.status == unknown.status == "ok" and "16.0 GiB memory" in same.found


# -- a node with another Ray --------------------------------------------------------------------


def test_a_node_with_another_ray_version_fails_naming_it(cluster, tmp_path, capsys):
    import ray

    (tmp_path / "sitecustomize.py").write_text(FAKE_VERSION_SITECUSTOMIZE)
    before = alive_node_ids()
    with node_leaves_after(before):
        node = cluster.add_node(
            num_cpus=1, env_vars={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}"}
        )
        try:
            wait_until(lambda: len(alive_node_ids() - before) == 1, "the node with another Ray")
            code, output = doctor(capsys)
        finally:
            cluster.remove_node(node)
    assert code == 1
    [failure] = lines_of(output, "versions", "FAIL")
    assert node.node_id[:8] in failure, output
    assert f"ray {FAKE_RAY_VERSION} (the driver has {ray.__version__})" in failure
    assert f"fix: pip install 'ray[default]=={ray.__version__}' on that node" in failure
    assert len(lines_of(output, "versions", "ok")) == 2, output  # the head and the healthy node


# -- storage one node cannot write, or sees on its own -------------------------------------------


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def node_in_own_mounts(address: str, mount: str, log: pathlib.Path) -> Iterator[tuple[str, int]]:
    """A Ray node joined to ``address`` whose raylet and workers run in a mount namespace of their
    own, set up by ``mount`` (a shell command); yields its node id and a process in that namespace."""
    before = alive_node_ids()
    script = f"{mount} && exec {sys.executable} -m ray.scripts.scripts start --address={address} --num-cpus=1 --block"
    with log.open("w") as out, node_leaves_after(before):
        # --block: the node's processes live as long as this one, and end with it (SIGTERM).
        process = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script], stdout=out, stderr=subprocess.STDOUT
        )
        try:
            wait_until(lambda: len(alive_node_ids() - before) == 1 or process.poll() is not None, "the node to join")
            assert process.poll() is None, log.read_text()
            [node_id] = alive_node_ids() - before
            yield node_id, process.pid
        finally:
            process.terminate()
            process.wait(timeout=120)


@pytest.mark.skipif(not _can_unshare(), reason="needs root for a mount namespace (unshare -m)")
def test_storage_a_node_cannot_write_fails_naming_that_node(cluster, tmp_path, capsys):
    storage = tmp_path / "runs"
    storage.mkdir()
    readonly = f"mount --bind {storage} {storage} && mount -o remount,ro,bind {storage}"
    with node_in_own_mounts(cluster.address, readonly, tmp_path / "node.log") as (node_id, _):
        code, output = doctor(capsys, "--storage-path", str(storage))
    assert code == 1
    [failure] = lines_of(output, "storage", "FAIL")
    assert f"{node_id[:8]}): cannot write {storage}/.doctor/" in failure, output
    assert "Read-only file system" in failure
    assert f"fix: make {storage} writable there" in failure
    assert len(lines_of(output, "storage", "ok")) == 3, output  # the driver, the head, the healthy node
    assert not list(storage.iterdir())  # the others' probe files are removed


@pytest.mark.skipif(not _can_unshare(), reason="needs root for a mount namespace (unshare -m)")
def test_storage_a_node_sees_on_its_own_fails_as_not_shared(cluster, tmp_path, capsys):
    storage = tmp_path / "runs"
    storage.mkdir()
    private = f"mount -t tmpfs doctor-test {storage}"
    with node_in_own_mounts(cluster.address, private, tmp_path / "node.log") as (node_id, inside):
        code, output = doctor(capsys, "--storage-path", str(storage))
        # Its own file was removed by a task on it: nobody else could see it.
        probe = subprocess.run(
            ["nsenter", "-t", str(inside), "-m", "ls", "-A", str(storage)],
            capture_output=True,
            text=True,
            check=True,
        )
    assert code == 1
    failures = lines_of(output, "storage", "FAIL")
    assert len(failures) == 4, output  # nobody reads the node's file, the node reads nobody's
    [own] = [line for line in failures if f"{node_id[:8]}): wrote" in line]
    assert "cannot read what others wrote" in own and f"fix: {storage} is not one storage for all" in own
    assert all(f"{node_id[:8]})'s {storage}/.doctor/" in line for line in failures if line != own), output
    assert probe.stdout == "", probe.stdout
    assert not list(storage.iterdir())


@pytest.mark.skipif(not _can_unshare(), reason="needs root for a mount namespace (unshare -m)")
def test_fit_with_a_worker_on_a_node_that_does_not_share_the_storage_fails_naming_it(cluster, tmp_path):
    """What the doctor finds, ``fit()`` finds too, before training: with the storage folder a
    private tmpfs on one of three nodes, a run with a worker on each fails with
    ``StorageNotSharedError`` naming that node alone, and its training function never ran."""
    from storage import StorageNotSharedError
    from trainers import DataParallelTrainer, RunConfig, ScalingConfig

    storage = tmp_path / "runs"
    storage.mkdir()
    trained = tmp_path / "trained"
    private = f"mount -t tmpfs fit-test {storage}"

    def train_loop_per_worker():
        trained.touch()

    with node_in_own_mounts(cluster.address, private, tmp_path / "node.log") as (node_id, _):
        trainer = DataParallelTrainer(
            train_loop_per_worker,
            # One CPU a worker on three nodes of one CPU: a worker on each, the blind node's among them.
            scaling_config=ScalingConfig(num_workers=3, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=str(storage), name="not-shared"),
        )
        with pytest.raises(StorageNotSharedError) as caught:
            trainer.fit()
    message = str(caught.value)
    assert f"the run's folder {storage / 'not-shared'} is not shared with every node" in message, message
    assert f"node {node_id[:8]} (" in message and "does not see it" in message, message
    assert message.count(" on host ") == 1, message  # the two nodes that share it are not named
    assert "storage_path" in message and "python -m trainers.doctor" in message
    assert not trained.exists()  # nothing trained
    assert (storage / "not-shared" / "run.json").is_file()  # the driver's record is kept


# -- Prefect and the JSON form -----------------------------------------------------------------


def test_an_unreachable_prefect_api_fails_with_the_fix(cluster, closed_port, capsys):
    code, output = doctor(capsys, "--prefect-api-url", f"http://127.0.0.1:{closed_port}/api")
    assert code == 1
    [failure] = lines_of(output, "prefect", "FAIL")
    assert f"GET http://127.0.0.1:{closed_port}/api/health" in failure and "refused" in failure, output
    assert "fix: start a server (prefect server start" in failure


def test_json_round_trips_through_the_typed_records(cluster, closed_port, tmp_path, capsys):
    code, output = doctor(
        capsys, "--json", "--storage-path", str(tmp_path), "--prefect-api-url", f"http://127.0.0.1:{closed_port}/api"
    )
    body = json.loads("\n".join(output))
    report = DoctorReport.from_json(body)
    assert report.to_json() == body
    assert code == report.exit_code == 1 and body["failed"] == 1
    assert [check.name for check in report.failed] == ["prefect"]
    assert all(isinstance(check, CheckResult) for check in report.checks)
    assert len(report.nodes) == 2 and all(isinstance(node, NodeFacts) for node in report.nodes)
    assert all(node.resources["CPU"] == 1 for node in report.nodes)
    assert report.driver.node_id == "driver"


def test_a_check_with_a_status_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match="status='bad': must be 'ok', 'FAIL' or 'skip'"):
        CheckResult(name="x", status="bad", found="")  # type: ignore[arg-type]


# -- token authentication (a head of its own, joined from a subprocess) ---------------------------


@pytest.fixture
def token_head(tmp_path) -> Iterator[tuple[str, pathlib.Path]]:
    """``ray start --head`` with token authentication, in a HOME of its own; yields its address
    and its token file. Only the processes it started are stopped (``--block``: they end with it)."""
    home = tmp_path / "head-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(home), RAY_AUTH_MODE="token")
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
    subprocess.run([*ray_cli, "get-auth-token", "--generate"], env=env, check=True, capture_output=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "head.log"
    # Ray's socket paths must stay under 107 bytes: a short session folder, not one under tmp_path.
    with tempfile.TemporaryDirectory(prefix="doctor-", dir="/tmp") as short, log.open("w") as out:
        start = [f"--port={port}", "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={short}", "--block"]
        head = subprocess.Popen([*ray_cli, "start", "--head", *start], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: "block forever" in log.read_text() or head.poll() is not None, "the head to start")
            assert head.poll() is None, log.read_text()
            yield f"127.0.0.1:{port}", home / ".ray" / "auth_token"
        finally:
            head.terminate()
            head.wait(timeout=120)
            _kill_left_behind(short)


def _kill_left_behind(marker: str) -> None:
    """SIGKILL any process still running whose command line names ``marker`` (our temp folder)."""
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker.encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), 9)


def _start(command: list[str], home: pathlib.Path, **env: str) -> subprocess.Popen[str]:
    """``command`` in a process of its own, with no RAY_AUTH_* or RAY_ADDRESS but ``env``'s, and ``home`` as HOME."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    return subprocess.Popen(
        command,
        env={**clean, "HOME": str(home), **env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def test_joining_without_the_token_or_a_head_fails_with_the_fix_and_with_the_token_passes(
    token_head, closed_port, tmp_path
):
    address, token = token_head
    home = tmp_path / "driver-home"  # no ~/.ray/auth_token here
    home.mkdir()
    doctor_cli = [sys.executable, "-m", "trainers.doctor", "--address", address, "--timeout-s", "120"]
    # A refused join spends ~20 s in Ray's retries: the three refused ones wait side by side.
    without = _start(doctor_cli, home)
    no_file = _start(doctor_cli, home, RAY_AUTH_MODE="token")
    nobody = _start([sys.executable, "-m", "trainers.doctor", "--address", f"127.0.0.1:{closed_port}"], home)
    fit_side = _start(
        [sys.executable, "-c", "from trainers.cluster import ensure_ray; ensure_ray()"], home, RAY_ADDRESS=address
    )

    code, out, err = _finish(without)
    assert code == 1, out + err
    [failure] = lines_of(out.splitlines(), "auth", "FAIL")
    assert "wants a token, and none was sent" in failure, out
    assert "fix: copy the head node's ~/.ray/auth_token" in failure and "RAY_AUTH_MODE=token" in failure
    assert lines_of(out.splitlines(), "node", "skip"), out

    code, out, err = _finish(no_file)
    assert code == 1, out + err
    [failure] = lines_of(out.splitlines(), "auth", "FAIL")
    assert "RAY_AUTH_MODE=token but no token was found" in failure, out

    code, out, err = _finish(nobody)
    assert code == 1, out + err
    [failure] = lines_of(out.splitlines(), "connect", "FAIL")
    assert f"nothing answers at 127.0.0.1:{closed_port}" in failure and "fix: start the head there" in failure

    # What fit() joins through says the same fix.
    code, out, err = _finish(fit_side)
    assert code == 1
    assert "ConnectionError" in err and "the cluster wants its authentication token" in err, err
    assert "copy the head node's ~/.ray/auth_token" in err

    code, out, err = _finish(_start(doctor_cli, home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token)))
    assert code == 0, out + err
    [ok] = lines_of(out.splitlines(), "auth", "ok")
    assert f"joined with the token from RAY_AUTH_TOKEN_PATH={token}" in ok
    assert len(lines_of(out.splitlines(), "versions", "ok")) == 1, out
