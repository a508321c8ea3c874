"""The files of docs/scaling-out.md ("From your laptop to a cluster"): the KubeRay manifests, the
Prefect deployments and work pool templates under deploy/, and the page that shows them.

No Kubernetes or Docker here: the manifests are checked field by field; the work pool templates
and the deployments go through a real Prefect server (`prefect work-pool create`, `prefect deploy`),
which validates them; the deployments' flow runs with their parameters on the local Ray.
"""

from __future__ import annotations

import html
import importlib
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from prefect_server import PREFECT, api_get, api_post, prefect, wait_until

DEPLOY = ROOT / "deploy"
PAGE = ROOT / "docs" / "scaling-out.md"
TEMPLATES = {
    "docker": DEPLOY / "prefect" / "docker-job-template.json",
    "kubernetes": DEPLOY / "prefect" / "kubernetes-job-template.json",
}
#: The pool each deployment of deploy/prefect/prefect.yaml names, and the type the page creates it with.
POOL_TYPES = {"flowtrain-process": "process", "flowtrain-docker": "docker", "flowtrain-kubernetes": "kubernetes"}
PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
SNIPPET = re.compile(r'^\s*--8<-- "([^"]+)"\s*$', re.MULTILINE)


def load(path):
    return json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())


def deploy_files():
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file())


def raycluster():
    return load(DEPLOY / "kuberay" / "raycluster.yaml")


def rayjob():
    return load(DEPLOY / "kuberay" / "rayjob.yaml")


def deployments():
    return load(DEPLOY / "prefect" / "prefect.yaml")["deployments"]


@pytest.mark.parametrize("path", [p for p in deploy_files() if p.suffix in (".yaml", ".yml", ".json")], ids=str)
def test_every_manifest_loads(path):
    assert isinstance(load(path), dict), path


def check_cluster_spec(spec):
    """A RayCluster spec the page relies on: a head with start parameters, worker groups with
    sizes, every Ray container from one image with its resources and the token settings."""
    head = spec["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict) and head["rayStartParams"]["num-cpus"] == "0"
    containers = [head["template"]["spec"]["containers"][0]]
    assert spec["workerGroupSpecs"], "no worker group"
    for group in spec["workerGroupSpecs"]:
        assert group["groupName"] and isinstance(group["rayStartParams"], dict)
        assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group
        containers.append(group["template"]["spec"]["containers"][0])
    assert len({c["image"] for c in containers}) == 1, "head and workers must share the image"
    for container in containers:
        resources = container["resources"]
        assert resources["requests"]["cpu"] and resources["limits"]["memory"], container["name"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "auth_token"
        assert env["FLOWTRAIN_STORAGE_PATH"]["value"].startswith("s3://")  # every pod reaches it
        assert container["envFrom"][0]["secretRef"]["name"]  # the storage credentials
    ports = {p["name"]: p["containerPort"] for p in containers[0]["ports"]}
    assert ports == {"gcs-server": 6379, "dashboard": 8265}
    return containers[0]["image"]


def test_raycluster():
    cluster = raycluster()
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    image = check_cluster_spec(cluster["spec"])
    # The image the Prefect templates and deployments run the driver in.
    for template in TEMPLATES.values():
        assert json.loads(template.read_text())["variables"]["properties"]["image"]["default"] == image
    assert {d["work_pool"]["job_variables"].get("image", image) for d in deployments()} == {image}


def test_rayjob_runs_the_script_on_the_clusters_own_spec():
    job = rayjob()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    # The laptop's command, from the image's checkout (deploy/Dockerfile's WORKDIR).
    assert spec["entrypoint"] == "python /opt/flowtrain/examples/train.py"
    assert "WORKDIR /opt/flowtrain" in (DEPLOY / "Dockerfile").read_text()
    assert (ROOT / "examples" / "train.py").is_file()
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["NUM_WORKERS"] == "2"
    # The same cluster as raycluster.yaml, field for field (the page says so).
    assert spec["rayClusterSpec"] == raycluster()["spec"]
    check_cluster_spec(spec["rayClusterSpec"])
    submitter = {e["name"] for e in spec["submitterPodTemplate"]["spec"]["containers"][0]["env"]}
    assert {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} <= submitter


def test_prefect_deployments_run_the_pipeline_on_each_kind_of_pool():
    from prefect import Flow

    found = deployments()
    assert sorted(d["work_pool"]["name"] for d in found) == sorted(POOL_TYPES)
    for deployment in found:
        path, _, name = deployment["entrypoint"].partition(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert isinstance(getattr(module, name), Flow), deployment["entrypoint"]
        assert (ROOT / path).is_file()
        loop = deployment["parameters"]["train_loop"]
        assert loop == "examples.train:train_func"
        env = deployment["work_pool"]["job_variables"]["env"]
        assert env["RAY_ADDRESS"].endswith(":6379") and env["RAY_AUTH_MODE"] == "token"
        assert env["FLOWTRAIN_STORAGE_PATH"].startswith(("s3://", "/")), env
    # One set of parameters for all three: the same flow, only where it runs differs.
    assert len({json.dumps(d["parameters"], sort_keys=True) for d in found}) == 1


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_job_template_declares_every_placeholder(kind):
    template = json.loads(TEMPLATES[kind].read_text())
    declared = set(template["variables"]["properties"])
    used = set(PLACEHOLDER.findall(json.dumps(template["job_configuration"])))
    assert used and not used - declared, f"undeclared: {sorted(used - declared)}"
    assert {"image", "env", "command"} <= used
    # What the deployments set is what the template declares.
    for deployment in deployments():
        if POOL_TYPES[deployment["work_pool"]["name"]] == kind:
            assert not set(deployment["work_pool"]["job_variables"]) - declared


def test_placeholder_check_catches_an_undeclared_variable():
    template = json.loads(TEMPLATES["docker"].read_text())
    template["job_configuration"]["shm_size"] = "{{ shm_size }}"
    used = set(PLACEHOLDER.findall(json.dumps(template["job_configuration"])))
    assert used - set(template["variables"]["properties"]) == {"shm_size"}


def test_the_page_includes_every_deploy_file_and_copies_none():
    text = PAGE.read_text()
    included = SNIPPET.findall(text)
    assert len(included) == len(set(included))
    assert sorted(included) == sorted([str(p.relative_to(ROOT)) for p in deploy_files()] + ["examples/train.py"]), (
        "every file under deploy/ is shown on the page, by inclusion"
    )
    # No hand-made copy beside the inclusions: a distinctive line of each file appears only there.
    for path in included:
        for line in (ROOT / path).read_text().splitlines():
            if len(line.strip()) > 40 and not line.strip().startswith("#"):
                assert line.strip() not in text, f"{PAGE.name} copies {path}: {line.strip()!r}"


def test_mkdocs_build_strict_shows_the_files_themselves(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "mkdocs"), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_clean_env(), "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "scaling-out" / "index.html").read_text()))
    assert "--8<--" not in page
    for path in SNIPPET.findall(PAGE.read_text()):
        missing = [line for line in (ROOT / path).read_text().splitlines() if line.strip() not in page]
        assert not missing, f"{path} is not on the built page: {missing[:3]}"


def _clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}


@pytest.fixture(scope="module")
def deployed_to_pools(prefect_server):
    """The page's commands on the session's server: three pools, then `prefect deploy --all
    --prefect-file deploy/prefect/prefect.yaml`; the deployments are removed afterwards (other
    modules count the server's deployments)."""
    env = prefect_server
    prefect(env, "work-pool", "create", "flowtrain-process", "--type", "process", "--overwrite")
    for kind, template in TEMPLATES.items():
        prefect(
            env,
            "work-pool",
            "create",
            f"flowtrain-{kind}",
            "--type",
            kind,
            "--base-job-template",
            str(template),
            "--overwrite",
        )
    done = prefect(env, "deploy", "--all", "--prefect-file", "deploy/prefect/prefect.yaml")
    created = [d for d in api_post(env, "/deployments/filter", {}) if d["work_pool_name"] in POOL_TYPES]
    try:
        yield env, created, done.stdout + done.stderr
    finally:
        for deployment in created:
            subprocess.run(
                [PREFECT, "deployment", "delete", "--id", deployment["id"]], env=env, cwd=ROOT, capture_output=True
            )


def test_prefect_accepts_the_templates_and_the_deployments(deployed_to_pools):
    env, created, output = deployed_to_pools
    assert sorted(d["name"] for d in created) == sorted(d["name"] for d in deployments()), output
    for kind, template in TEMPLATES.items():
        pool = api_get(env, f"/work_pools/flowtrain-{kind}")
        assert pool["type"] == kind and pool["base_job_template"] == json.loads(template.read_text())
    for deployment in created:
        assert (
            api_get(env, f"/work_pools/{deployment['work_pool_name']}")["type"]
            == POOL_TYPES[deployment["work_pool_name"]]
        )
        variables = deployment["job_variables"]
        assert variables["env"]["RAY_ADDRESS"].endswith(":6379")
        directory = deployment["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"]
        if deployment["work_pool_name"] == "flowtrain-process":
            # `{{ $PWD }}` resolved at deploy time, in the job variables too: the flow run imports
            # examples.train from this checkout.
            assert directory == variables["env"]["PYTHONPATH"] == str(ROOT)
        else:
            assert directory == "/opt/flowtrain" and variables["image"]


def test_prefect_refuses_what_these_checks_would_let_through(deployed_to_pools, tmp_path):
    """The server's own checks, so that its accepting the files above means something: a template
    with an undeclared placeholder, and a deployment whose job variable has the wrong type."""
    import httpx

    env, created, _ = deployed_to_pools
    template = json.loads(TEMPLATES["docker"].read_text())
    template["job_configuration"]["shm_size"] = "{{ shm_size }}"
    bad = tmp_path / "bad-template.json"
    bad.write_text(json.dumps(template))
    done = prefect(
        env, "work-pool", "create", "flowtrain-bad", "--type", "docker", "--base-job-template", str(bad), check=False
    )
    assert done.returncode != 0 and "shm_size" in done.stdout + done.stderr, done.stdout + done.stderr

    docker = next(d for d in created if d["work_pool_name"] == "flowtrain-docker")
    response = httpx.post(
        f"{env['PREFECT_API_URL']}/deployments/",
        json={
            "name": "wrong-type",
            "flow_id": docker["flow_id"],
            "work_pool_name": "flowtrain-docker",
            "job_variables": {"network_mode": 3, "env": {"RAY_ADDRESS": "head:6379"}},
        },
        timeout=10,
    )
    assert response.status_code in (409, 422) and "network_mode" in response.text, response.text


def test_the_crashed_runs_automation_marks_a_silent_flow_run_crashed(prefect_server, tmp_path):
    """deploy/prefect/crashed-runs.yaml as the page creates it, then a copy that waits 10 s instead
    of 90: a running flow run sends one heartbeat and falls silent, and the server marks it Crashed.
    Both are deleted at the end: other modules' flow runs on this server must not be touched."""
    import datetime
    import uuid

    import httpx

    env = prefect_server
    path = DEPLOY / "prefect" / "crashed-runs.yaml"
    prefect(env, "automation", "create", "--from-file", str(path))
    quick = load(path) | {"name": f"crashed-runs-test-{uuid.uuid4().hex[:8]}"}
    quick["trigger"] = quick["trigger"] | {"within": 10}  # the least Prefect accepts
    quick_path = tmp_path / "quick.yaml"
    quick_path.write_text(yaml.safe_dump(quick))
    prefect(env, "automation", "create", "--from-file", str(quick_path))
    names = {load(path)["name"], quick["name"]}
    automations = {a["name"]: a for a in api_post(env, "/automations/filter", {}) if a["name"] in names}
    try:
        assert automations.keys() == names
        created = automations[load(path)["name"]]
        assert created["trigger"]["posture"] == "Proactive" and created["trigger"]["within"] == 90.0
        [action] = created["actions"]
        assert action["type"] == "change-flow-run-state" and action["state"] == "CRASHED"

        flow = api_post(env, "/flows/", {"name": "crashed-runs-test"})
        run = api_post(env, "/flow_runs/", {"flow_id": flow["id"], "state": {"type": "RUNNING", "name": "Running"}})
        heartbeat = {
            "id": str(uuid.uuid4()),
            "occurred": datetime.datetime.now(datetime.UTC).isoformat(),
            "event": "prefect.flow-run.heartbeat",
            "resource": {"prefect.resource.id": f"prefect.flow-run.{run['id']}"},
        }
        response = httpx.post(f"{env['PREFECT_API_URL']}/events", json=[heartbeat], timeout=10)
        assert response.status_code == 204, response.text
        crashed = wait_until(
            lambda: (state := api_get(env, f"/flow_runs/{run['id']}")["state"])["type"] == "CRASHED" and state,
            timeout_s=120,
            what="the silent flow run marked Crashed",
            interval_s=1,
        )
        assert "No heartbeat" in crashed["message"], crashed
    finally:
        for automation in automations.values():  # a deployment's flow run elsewhere must not be crashed by them
            httpx.delete(f"{env['PREFECT_API_URL']}/automations/{automation['id']}", timeout=10)


@pytest.mark.usefixtures("prefect_harness", "ray_local")
def test_the_deployments_parameters_train_with_the_scripts_function(tmp_path, monkeypatch):
    from flows.pipeline import training_pipeline

    parameters = dict(deployments()[0]["parameters"])
    parameters["train_loop_config"] = dict(parameters["train_loop_config"], epochs=2)
    monkeypatch.setenv("FLOWTRAIN_STORAGE_PATH", str(tmp_path / "results"))  # as the job variables set it
    state = training_pipeline(**parameters, run={"name": "from-the-deployment"}, return_state=True)
    assert state.is_completed(), state
    summary = state.result()
    assert summary["num_reports"] == 2 and summary["metrics"]["epoch"] == 1
    assert summary["run_path"] == str(tmp_path / "results" / "from-the-deployment")
    assert (tmp_path / "results" / "from-the-deployment" / "run.json").is_file()
    assert "examples.train" in sys.modules  # the script's function, imported by name
