"""From one machine to a cluster, proven on hosts with their own addresses.

Three network namespaces joined through a bridge (``benchmarks.hosts``) are three hosts, 10.213.0.1-3;
``ray start --head`` runs on the first and ``ray start --address`` on the others, with Ray 2.60's
token authentication, as a user sets up a cluster. The user's script (``cluster_script.py``) is the
one a laptop runs; only where it runs changes. Nothing here sets ``GLOO_SOCKET_IFNAME``: every
host's name resolves to loopback, so without flowtrain finding the interface that carries each
node's address, gloo fails to connect (``connectFullMesh ... remote=[127.0.0.1]``).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

import cluster_script
from benchmarks.hosts import RayHosts, can_make_namespaces
from conftest import process_alive
from prefect_server import wait_until

REPO = pathlib.Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
RAY = str(pathlib.Path(sys.executable).with_name("ray"))
#: Logical CPUs per host: six workers spread two to a host, and the two hosts left after one is
#: lost still hold all six.
CPUS_PER_HOST = 3
#: Ray's own bound on declaring a silent node dead (GCS health checks: every second, dead after
#: five misses), set on the cluster as a user would for faster recovery (docs/scaling-out.md).
HEALTH_CHECK = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "5",
}

#: S3 on the head's address (a moto server), a store every host reaches through the cluster's
#: network: a host cut from the network loses its storage too.
S3_PORT = 9000
BUCKET = "flowtrain"

pytestmark = pytest.mark.skipif(can_make_namespaces() is not None, reason=str(can_make_namespaces()))


def ray_hosts(root: pathlib.Path) -> RayHosts:
    """Three hosts of ``CPUS_PER_HOST`` CPUs, Ray's health checks at ``HEALTH_CHECK``."""
    hosts = RayHosts(root, cpus=[CPUS_PER_HOST] * 3, pythonpath=[str(TESTS)], env=HEALTH_CHECK)
    # Every process, Ray's workers included, reaches S3 on the head (s3_on_head) as a cluster's
    # nodes reach their object store: by the environment.
    hosts.env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{hosts.head.address}:{S3_PORT}",
        AWS_EC2_METADATA_DISABLED="true",
    )
    return hosts


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    cluster = ray_hosts(tmp_path_factory.mktemp("hosts"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def s3_on_head(hosts, tmp_path_factory):
    """A moto S3 server on the head's address with the bucket ``BUCKET``: ``s3://BUCKET``."""
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    server = hosts.start_s3(hosts.head, port=S3_PORT, bucket=BUCKET, log=log)
    try:
        yield f"s3://{BUCKET}"
    finally:
        server.kill()
        server.wait()


def committed_on_head(hosts: RayHosts, run_uri: str) -> dict:
    """``cluster_script.committed`` of a run, read on the head (S3 is reached only from the hosts)."""
    read = "import json, sys, cluster_script; print(json.dumps(cluster_script.committed(sys.argv[1])))"
    done = hosts.net.run(
        hosts.head, [sys.executable, "-c", read, run_uri], env=hosts.env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_script(
    hosts: RayHosts, tmp_path: pathlib.Path, name: str, *extra: str, host=None
) -> tuple[subprocess.Popen, pathlib.Path, pathlib.Path]:
    out, log = tmp_path / f"{name}.json", tmp_path / f"{name}.log"
    driver = hosts.python(
        host or hosts.head, [str(TESTS / "cluster_script.py"), str(tmp_path / "runs"), name, str(out), *extra], log
    )
    return driver, out, log


def finished(driver: subprocess.Popen, out: pathlib.Path, log: pathlib.Path, timeout_s: float = 400) -> dict:
    try:
        driver.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        driver.kill()
        pytest.fail(f"the driver did not finish in {timeout_s} s:\n{log.read_text()[-6000:]}")
    assert driver.returncode == 0 and out.exists(), log.read_text()[-6000:]
    return json.loads(out.read_text())


def shards(run: pathlib.Path) -> dict[str, list[dict]]:
    """Each committed checkpoint's rank files, by checkpoint folder (a run on the shared disk)."""
    return cluster_script.committed(str(run))["shards"]


def flow_runs_in(markers: pathlib.Path) -> dict[str, int]:
    """The flow runs ``cluster_flow`` started with these markers: flow run id -> its process's pid."""
    found = (m.name[len("flow-run-") :].rsplit("-pid-", 1) for m in markers.glob("flow-run-*-pid-*"))
    return {flow_run_id: int(pid) for flow_run_id, pid in found}


#: Each run's wall seconds by name, for the partitioned run's cost beside the plain one (printed).
SECONDS: dict[str, float] = {}


def cut_ranks(written: dict[str, list[dict]], cut) -> set[int]:
    """The ranks that ran on ``cut`` in the first attempt."""
    return {f["rank"] for files in written.values() for f in files if f["node"] == cut.address and f["attempt"] == 1}


def test_six_workers_on_three_hosts_train_with_no_interface_set(hosts, tmp_path):
    summary = finished(*run_script(hosts, tmp_path, "plain"))
    SECONDS["plain"] = summary["seconds"]
    assert summary["error"] is None and summary["gloo_set_by_user"] is None
    assert summary["steps"] == list(range(12)) and summary["worlds"] == [6]
    written = shards(pathlib.Path(summary["path"]))
    assert len(written) == 12
    for files in written.values():
        assert sorted(f["rank"] for f in files) == list(range(6))
        assert sorted({f["node"] for f in files}) == [h.address for h in hosts.net.hosts]  # two ranks a host


def test_the_same_script_submitted_as_a_ray_job_from_another_host(hosts, tmp_path):
    out = tmp_path / "job.json"
    submitted = hosts.net.run(
        hosts.net.hosts[1],
        [
            RAY,
            "job",
            "submit",
            f"--address=http://{hosts.head.address}:8265",
            "--",
            sys.executable,
            str(TESTS / "cluster_script.py"),
            str(tmp_path / "runs"),
            "as-a-job",
            str(out),
        ],
        env=hosts.env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert submitted.returncode == 0 and "succeeded" in submitted.stdout, (
        submitted.stdout[-4000:] + submitted.stderr[-2000:]
    )
    summary = json.loads(out.read_text())
    assert summary["error"] is None and summary["steps"] == list(range(12)) and summary["worlds"] == [6]
    written = shards(pathlib.Path(summary["path"]))
    assert {f["node"] for files in written.values() for f in files} == {h.address for h in hosts.net.hosts}


#: Deploys the flow on the server in PREFECT_API_URL (run on the head host).
DEPLOY = """
import sys
from cluster_flow import train_on_cluster

train_on_cluster.from_source(source=sys.argv[1], entrypoint="cluster_flow.py:train_on_cluster").deploy(
    name="cluster", work_pool_name="cluster-pool", print_next_steps=False
)
"""
#: Runs the deployment with the JSON parameters in argv[1] to its end, as `prefect deployment run`
#: and a wait would (run on the head host).
RUN = """
import json, sys
from prefect.deployments import run_deployment

run = run_deployment("cluster-train/cluster", parameters=json.loads(sys.argv[1]), timeout=400)
print("FINAL", run.state.type.value, run.state.message)
"""


class PrefectOnCluster:
    """A Prefect server on the head's address, a process worker on the second host, and the
    cluster script's flow deployed to the worker's pool."""

    def __init__(self, hosts: RayHosts, home: pathlib.Path) -> None:
        self.hosts, self.home = hosts, home
        api = f"http://{hosts.head.address}:4200/api"
        self.env = {k: v for k, v in hosts.env.items() if not k.startswith("PREFECT_")}
        self.env.update(
            PREFECT_HOME=str(home / "prefect"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_UI_ENABLED="false",
            PREFECT_API_URL=api,
        )
        prefect = str(pathlib.Path(sys.executable).with_name("prefect"))
        head, other = hosts.head, hosts.net.hosts[1]
        with open(home / "server.log", "w") as log:
            self.server = hosts.net.popen(
                head,
                [prefect, "server", "start", "--host", head.address, "--port", "4200"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=home,
            )
        health = [sys.executable, "-c", f"import httpx; httpx.get('{api}/health', timeout=2).raise_for_status()"]
        wait_until(
            lambda: hosts.net.run(head, health, capture_output=True).returncode == 0 or self.server.poll() is not None,
            timeout_s=180,
            what="the Prefect server on the head",
        )
        assert self.server.poll() is None, (home / "server.log").read_text()[-3000:]
        self.prefect = prefect
        self.on_head(prefect, "work-pool", "create", "cluster-pool", "--type", "process")
        self.on_head(sys.executable, "-c", DEPLOY, str(TESTS))
        self.workers = [self.start_worker(other, "worker.log")]
        self.worker = self.workers[0]

    def start_worker(self, host, log_name: str) -> subprocess.Popen:
        """A process worker for the pool on ``host``, its flow runs joining the cluster by RAY_ADDRESS."""
        env = {
            **self.env,
            "RAY_ADDRESS": self.hosts.address,
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            # A heartbeat every 30 s (the least Prefect takes), as deploy/prefect/prefect.yaml's
            # deployments send them: the crashed-runs automation watches for them.
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
        }
        with open(self.home / log_name, "w") as log:
            return self.hosts.net.popen(
                host,
                [self.prefect, "worker", "start", "--pool", "cluster-pool", "--limit", "1"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=TESTS,
            )

    def on_head(self, *argv: str) -> str:
        """Run ``argv`` on the head with the server's address; its output."""
        done = self.hosts.net.run(
            self.hosts.head, list(argv), env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    def flow_run(self, flow_run_id: str) -> dict:
        """The flow run as the server has it."""
        get = "import httpx, os, sys; print(httpx.get(os.environ['PREFECT_API_URL'] + sys.argv[1], timeout=10).text)"
        return json.loads(self.on_head(sys.executable, "-c", get, f"/flow_runs/{flow_run_id}").strip().splitlines()[-1])

    def run(self, tmp_path: pathlib.Path, name: str, **extra: object) -> tuple[subprocess.Popen, pathlib.Path]:
        """Start a flow run of the deployment; returns the waiting process and where the summary goes."""
        out = tmp_path / f"{name}.json"
        parameters = {"storage": str(tmp_path / "runs"), "name": name, "out": str(out), **extra}
        waiting = self.hosts.net.popen(
            self.hosts.head,
            [sys.executable, "-c", RUN, json.dumps(parameters)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return waiting, out

    def summary(self, waiting: subprocess.Popen, out: pathlib.Path) -> dict:
        """The flow run's summary once it completed."""
        output, _ = waiting.communicate(timeout=500)
        assert self.worker.poll() is None and self.server.poll() is None
        assert "FINAL COMPLETED" in output, output[-3000:] + (self.home / "worker.log").read_text()[-4000:]
        return json.loads(out.read_text())

    def stop(self) -> None:
        for process in (*self.workers, self.server):
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def prefect_on_cluster(hosts, tmp_path_factory):
    started = PrefectOnCluster(hosts, tmp_path_factory.mktemp("prefect"))
    try:
        yield started
    finally:
        started.stop()


def test_a_prefect_worker_on_another_host_runs_the_flow_that_trains_on_the_cluster(prefect_on_cluster, tmp_path):
    """The flow run the worker on the second host picks up joins the cluster by the worker's
    RAY_ADDRESS and trains 6 workers on the 3 hosts."""
    summary = prefect_on_cluster.summary(*prefect_on_cluster.run(tmp_path, "by-prefect"))
    SECONDS["by-prefect"] = summary["seconds"]
    assert summary["error"] is None and summary["steps"] == list(range(12)) and summary["worlds"] == [6]
    written = shards(pathlib.Path(summary["path"]))
    hosts = prefect_on_cluster.hosts
    assert {f["node"] for files in written.values() for f in files} == {h.address for h in hosts.net.hosts}


# Last but one: the cut host's raylet is declared dead for good.
def test_a_partitioned_host_costs_its_ranks_and_commits_nothing_after_them(prefect_on_cluster, tmp_path):
    """Through the Prefect worker on the second host, the third host's link is cut at a random
    step, after that step's all-reduce and before its report, its processes alive: its ranks are
    replaced on the hosts left, the flow run finishes with every step once, and the cut host's
    workers, which wrote their checkpoint files and reported into the cut network, have nothing
    committed (nor after the link is back)."""
    import random

    hosts = prefect_on_cluster.hosts
    markers = tmp_path / "markers"
    markers.mkdir()
    hold_at = random.Random().randint(2, 8)
    cut = hosts.net.hosts[2]
    waiting, out = prefect_on_cluster.run(tmp_path, "partitioned", hold_at=hold_at, markers=str(markers))
    try:
        wait_until(
            lambda: (markers / f"step-{hold_at}-attempt-1").exists() or waiting.poll() is not None,
            timeout_s=300,
            what=f"step {hold_at}",
        )
        hosts.net.partition(cut)
        (markers / "go").touch()
        # The link comes back once the run has gone past the cut step in a later attempt: the cut
        # host's workers, alive all along, can then reach the driver with their stale reports.
        wait_until(
            lambda: any(markers.glob(f"step-{hold_at + 1}-attempt-*")) or waiting.poll() is not None,
            timeout_s=300,
            what="the run past the cut step",
        )
    finally:
        hosts.net.heal(cut)
    summary = prefect_on_cluster.summary(waiting, out)
    assert summary["error"] is None
    assert summary["steps"] == list(range(12)), summary["steps"]
    written = shards(pathlib.Path(summary["path"]))
    assert len(written) == 12
    for name, files in written.items():
        assert sorted(f["rank"] for f in files) == list(range(6)), name
        step = files[0]["step"]
        assert {f["step"] for f in files} == {step}
        if step >= hold_at:
            assert cut.address not in {f["node"] for f in files}, (name, files)
            assert min(f["attempt"] for f in files) >= 2, (name, files)
    record = json.loads((pathlib.Path(summary["path"]) / "run.json").read_text())
    [restart] = record["restarts"]
    # Only the cut host's ranks were replaced: the others, blocked in an all-reduce with them, were
    # freed (their connections to the lost host shut) and kept.
    lost = cut_ranks(written, cut)
    assert sorted(restart["replaced"]) == sorted(str(r) for r in lost), restart
    assert restart["full_restart"] is None and sorted(restart["kept"]) == sorted(set(range(6)) - lost), restart
    plain = SECONDS.get("by-prefect")
    extra = f", {summary['seconds'] - plain:+.1f} s against the unfaulted run" if plain else ""
    print(f"host {cut.address} cut at step {hold_at}: {summary['seconds']:.1f} s{extra}; {restart}")


#: The crashed-runs automation's wait for a flow run's next heartbeat, shortened from the page's
#: 90 s: more than the 30 s between heartbeats, or it would mark live runs Crashed.
SILENT_S = 45


# Last: the cut host's raylet is declared dead for good (the third host's already is).
def test_a_flow_run_whose_host_is_cut_off_is_marked_crashed_and_a_rerun_resumes(
    prefect_on_cluster, s3_on_head, tmp_path
):
    """The host of the Prefect worker (the second) is cut off at a random step of a flow run it
    runs, with the run's driver and maybe a rank, all alive: deploy/prefect/crashed-runs.yaml's
    automation marks the silent flow run Crashed, and the deployment run again with the same
    parameters (a worker on the head takes it) resumes from the last checkpoint on S3 once the cut
    driver, unable to renew its lease there, gave the run up: every step committed once, nothing
    from the cut host after the cut step, nor once the link is back, and the cut flow run's late
    report of its own end leaves the new run Completed."""
    import random

    import yaml

    hosts, prefect = prefect_on_cluster.hosts, prefect_on_cluster
    cut = hosts.net.hosts[1]
    automation = yaml.safe_load((REPO / "deploy" / "prefect" / "crashed-runs.yaml").read_text())
    automation["trigger"]["within"] = SILENT_S
    automation_file = tmp_path / "crashed-runs.yaml"
    automation_file.write_text(yaml.safe_dump(automation))
    prefect.on_head(prefect.prefect, "automation", "create", "--from-file", str(automation_file))

    markers = tmp_path / "markers"
    markers.mkdir()
    hold_at = random.Random().randint(2, 8)
    parameters = dict(storage=f"{s3_on_head}/runs", hold_at=hold_at, markers=str(markers), workers=2)
    waiting, out = prefect.run(tmp_path, "driver-cut", **parameters)
    try:
        wait_until(
            lambda: (markers / f"step-{hold_at}-attempt-1").exists() or waiting.poll() is not None,
            timeout_s=300,
            what=f"step {hold_at}",
        )
        [(flow_run_id, cut_driver)] = flow_runs_in(markers).items()
        hosts.net.partition(cut)
        (markers / "go").touch()
        crashed = wait_until(
            lambda: (state := prefect.flow_run(flow_run_id)["state"])["type"] == "CRASHED" and state,
            timeout_s=SILENT_S + 60,
            what="the cut-off flow run marked Crashed",
            interval_s=2,
        )
        assert "No heartbeat" in crashed["message"], crashed
        waiting.communicate(timeout=60)  # run_deployment on the head saw the run end
        prefect.workers.append(prefect.start_worker(hosts.head, "head-worker.log"))
        rerun, out = prefect.run(tmp_path, "driver-cut", **parameters)
        # The link comes back once the rerun has trained past the cut step: the cut driver and its
        # rank, if they still live, can then reach the storage and the server again. Only the
        # rerun's own attempts count: ranks on the cut host beside their driver train on past the
        # cut in attempt 1, and a link healed before the head's worker took the rerun lets the cut
        # host's worker take it, on a host whose raylet Ray has declared dead.
        wait_until(
            lambda: (
                any(p for p in markers.glob(f"step-{hold_at + 1}-attempt-*") if not p.name.endswith("-attempt-1"))
                or rerun.poll() is not None
            ),
            timeout_s=300,
            what="the rerun past the cut step",
        )
    finally:
        hosts.net.heal(cut)
    summary = prefect.summary(rerun, out)
    assert summary["error"] is None and summary["driver_node"] == hosts.head.address, summary
    [rerun_id] = flow_runs_in(markers).keys() - {flow_run_id}
    # The cut driver ends (Ray gives up on a GCS it cannot reach) after reporting its flow run's end
    # once it can: then what is committed, and the new run's state, must hold nothing of it.
    wait_until(lambda: not process_alive(cut_driver), timeout_s=180, what="the cut-off driver's end")
    run = committed_on_head(hosts, summary["uri"])
    steps = sorted(files[0]["step"] for files in run["shards"].values())
    assert steps == list(range(12)), steps
    for name, files in run["shards"].items():
        step = files[0]["step"]
        assert len(files) == 2 and {f["step"] for f in files} == {step}, (name, files)
        if step >= hold_at:
            assert cut.address not in {f["node"] for f in files}, (name, files)
    assert prefect.flow_run(rerun_id)["state"]["type"] == "COMPLETED"
    late = prefect.flow_run(flow_run_id)["state"]
    print(
        f"driver host {cut.address} cut at step {hold_at}: Crashed, rerun on the head; the cut run ends {late['type']}"
    )
