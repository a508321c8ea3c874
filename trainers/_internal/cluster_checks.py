"""What ``python -m trainers.doctor`` checks, as typed records and small functions.

Facts are gathered by one tiny Ray task pinned to each alive node (``probe_node``, then
``read_back``); the judging is plain functions over those facts (``version_checks``,
``resource_checks``, ``storage_checks``), so a test can feed them any facts without Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import pathlib
import platform
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Literal

import ray

from storage.codec import Record
from storage.filesystem import exists, pafs, read_bytes, resolve_filesystem, write_bytes
from trainers._internal.ray_init import AUTH_FIX

Status = Literal["ok", "FAIL", "skip"]

#: The folder under the storage path the storage check writes its files into (and removes).
PROBE_FOLDER = ".doctor"


@dataclasses.dataclass(frozen=True)
class NodeFacts(Record):
    """What one process found about itself: a Ray task pinned to a node, or the driver."""

    #: Ray's node id (hex); ``"driver"`` for the driver's own facts.
    node_id: str
    ip: str
    hostname: str
    ray_version: str
    #: ``platform.python_version()``, e.g. ``"3.11.7"``.
    python_version: str
    #: The installed flowtrain distribution's version; None where it is not installed as one.
    flowtrain_version: str | None
    #: NVIDIA GPUs this process can use (device files in /dev, narrowed by CUDA_VISIBLE_DEVICES);
    #: None where that cannot be told (not Linux).
    visible_gpus: int | None
    #: How ``visible_gpus`` was counted, for the report.
    gpu_source: str
    #: The node's total resources as Ray advertises them (``ray.nodes()``); empty for the driver.
    resources: dict[str, float] = dataclasses.field(default_factory=dict)

    def label(self) -> str:
        """``node 10.0.0.2 (host-b, 3fe22a4f)``, or ``driver 10.0.0.1 (host-a)``."""
        if self.node_id == "driver":
            return f"driver {self.ip} ({self.hostname})"
        return f"node {self.ip} ({self.hostname}, {self.node_id[:8]})"


@dataclasses.dataclass(frozen=True)
class CheckResult(Record):
    """One line of the report: a check, where it looked, what it found, and the fix when it failed."""

    #: ``connect``, ``auth``, ``node``, ``versions``, ``resources``, ``scaling``, ``storage``, ``prefect``.
    name: str
    status: Status
    found: str
    #: What to do about it; empty unless ``status`` is ``"FAIL"``.
    fix: str = ""
    #: The node or process it is about (``NodeFacts.label()``); empty for the cluster as a whole.
    where: str = ""

    def __post_init__(self) -> None:
        if self.status not in ("ok", "FAIL", "skip"):
            raise ValueError(f"status={self.status!r}: must be 'ok', 'FAIL' or 'skip'")

    def lines(self) -> list[str]:
        """The check's line, and its fix on a line of its own when it failed."""
        where = f"{self.where}: " if self.where else ""
        text = [f"{self.status:<4}  {self.name:<9}  {where}{self.found}"]
        if self.fix:
            text.append(f"{'':<4}  {'':<9}  fix: {self.fix}")
        return text


# -- facts -----------------------------------------------------------------------------------


def _flowtrain_version() -> str | None:
    try:
        return importlib.metadata.version("flowtrain")
    except importlib.metadata.PackageNotFoundError:
        return None


def visible_gpus() -> tuple[int | None, str]:
    """NVIDIA GPUs this process can use, and how that was counted: the ``/dev/nvidiaN`` device
    files (what a container was given), narrowed by ``CUDA_VISIBLE_DEVICES`` when it is set. No
    CUDA library is loaded, so this costs microseconds."""
    if not sys.platform.startswith("linux"):
        return None, f"not counted on {sys.platform}"
    devices = [p.name for p in pathlib.Path("/dev").glob("nvidia[0-9]*")]
    chosen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return len(devices), f"{len(devices)} NVIDIA device(s) in /dev"
    listed = [d for d in chosen.split(",") if d.strip()]
    return min(len(listed), len(devices)), f"CUDA_VISIBLE_DEVICES={chosen!r}, {len(devices)} NVIDIA device(s) in /dev"


def process_facts(node_id: str) -> NodeFacts:
    """This process's facts; ``node_id`` names the node (``"driver"`` on the driver)."""
    gpus, source = visible_gpus()
    return NodeFacts(
        node_id=node_id,
        ip=ray.util.get_node_ip_address(),
        hostname=socket.gethostname(),
        ray_version=ray.__version__,
        python_version=platform.python_version(),
        flowtrain_version=_flowtrain_version(),
        visible_gpus=gpus,
        gpu_source=source,
    )


@dataclasses.dataclass(frozen=True)
class NodeProbe:
    """What the first task on a node returns: its facts, and the storage file it wrote (or why not)."""

    facts: NodeFacts
    #: The file it wrote under the storage path; empty when none was asked for or writing failed.
    written: str
    #: Why it could not write (the error), or empty.
    write_error: str


def probe_folder(storage_path: str) -> str:
    """The folder (inside the storage path's filesystem) the storage check writes into."""
    _, root = resolve_filesystem(storage_path)
    return f"{root.rstrip('/')}/{PROBE_FOLDER}"


def write_probe(storage_path: str, name: str) -> tuple[str, str]:
    """Write the small file ``<storage>/.doctor/<name>``; return ``(its path, "")`` or ``("", the error)``.
    The storage path is resolved here, in the process that writes, with that process's credentials."""
    try:
        fs, _ = resolve_filesystem(storage_path)
        folder = probe_folder(storage_path)
        path = f"{folder}/{name}"
        fs.create_dir(folder, recursive=True)
        write_bytes(fs, path, name.encode())
        return path, ""
    except Exception as error:  # noqa: BLE001 - any failure is the finding
        return "", f"cannot write {storage_path.rstrip('/')}/{PROBE_FOLDER}/{name}: {type(error).__name__}: {error}"


def read_probes(storage_path: str, paths: Sequence[str]) -> dict[str, str]:
    """Read each file ``write_probe`` wrote; return the error for each one that could not be read
    back with the content it was written with (an empty dict when all were)."""
    errors = {}
    try:
        fs, _ = resolve_filesystem(storage_path)
    except Exception as error:  # noqa: BLE001
        return {path: f"{type(error).__name__}: {error}" for path in paths}
    for path in paths:
        try:
            if read_bytes(fs, path) != path.rsplit("/", 1)[-1].encode():
                errors[path] = "the file holds something else than what was written"
        except Exception as error:  # noqa: BLE001
            errors[path] = f"{type(error).__name__}: {error}"
    return errors


def remove_probes(storage_path: str, paths: Sequence[str]) -> list[str]:
    """Delete the files at ``paths`` that this process sees, and the probe folder when it is left
    empty; return the paths still there (another node's file on storage this process cannot see)."""
    try:
        fs, _ = resolve_filesystem(storage_path)
    except Exception:  # noqa: BLE001
        return list(paths)
    left = []
    for path in paths:
        try:
            fs.delete_file(path)
        except Exception:  # noqa: BLE001
            left.append(path)
    with contextlib.suppress(Exception):  # a folder left behind is harmless
        folder = probe_folder(storage_path)
        if exists(fs, folder) and not fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
            fs.delete_dir(folder)
    return left


@ray.remote(num_cpus=0, max_retries=0)
def probe_node(storage_path: str | None, name: str) -> NodeProbe:
    """Run on one node: its facts, and (with a storage path) the file ``name`` written there."""
    facts = process_facts(ray.get_runtime_context().get_node_id())
    written, error = write_probe(storage_path, name) if storage_path else ("", "")
    return NodeProbe(facts=facts, written=written, write_error=error)


#: Run on one node: ``read_probes`` there.
read_back = ray.remote(num_cpus=0, max_retries=0)(read_probes)
#: Run on one node: ``remove_probes`` there.
clean_up = ray.remote(num_cpus=0, max_retries=0)(remove_probes)


# -- judging ---------------------------------------------------------------------------------


def python_match_level() -> str:
    """How much of the Python version Ray requires to match: ``patch`` unless
    ``RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL`` says ``minor`` (Ray's own rule when a process joins)."""
    return "minor" if os.environ.get("RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL") == "minor" else "patch"


def version_checks(driver: NodeFacts, nodes: Sequence[NodeFacts]) -> list[CheckResult]:
    """One ``versions`` line per node: Ray, Python (to Ray's match level) and flowtrain against the driver's."""
    level = python_match_level()
    parts = 2 if level == "minor" else 3
    python = driver.python_version
    results = []
    for node in nodes:
        found = f"ray {node.ray_version}, python {node.python_version}"
        if node.flowtrain_version:
            found += f", flowtrain {node.flowtrain_version}"
        wrong, fixes = [], []
        if node.ray_version != driver.ray_version:
            wrong.append(f"ray {node.ray_version} (the driver has {driver.ray_version})")
            fixes.append(f"pip install 'ray[default]=={driver.ray_version}' on that node")
        if node.python_version.split(".")[:parts] != python.split(".")[:parts]:
            wrong.append(f"python {node.python_version} (the driver has {python}; Ray needs the same {level})")
            fixes.append(f"run Ray there on Python {python} (the same image or environment as the driver)")
        if node.flowtrain_version and driver.flowtrain_version and node.flowtrain_version != driver.flowtrain_version:
            wrong.append(f"flowtrain {node.flowtrain_version} (the driver has {driver.flowtrain_version})")
            fixes.append(f"install flowtrain {driver.flowtrain_version} there")
        found = "; ".join(wrong) or found
        fix = "; ".join(fixes) + ", then restart Ray on it (ray stop; ray start --address=...)." if fixes else ""
        results.append(
            CheckResult(name="versions", status="FAIL" if fix else "ok", found=found, fix=fix, where=node.label())
        )
    return results


def resource_checks(nodes: Sequence[NodeFacts]) -> list[CheckResult]:
    """One ``resources`` line per node: what Ray advertises, and whether the GPUs it advertises are
    there for a task to use. Fails only when Ray advertises more GPUs than a task on the node sees:
    a GPU worker placed there would find no device."""
    results = []
    for node in nodes:
        cpus, gpus = node.resources.get("CPU", 0.0), node.resources.get("GPU", 0.0)
        found = f"{cpus:g} CPU, {gpus:g} GPU, {node.resources.get('memory', 0.0) / 2**30:.1f} GiB memory advertised"
        seen = node.visible_gpus
        fix = ""
        if seen is None:
            found += f"; GPUs {node.gpu_source}"
        elif gpus > seen:
            found = f"{found}, but a task there sees {seen} GPU(s) ({node.gpu_source})"
            fix = (
                "install the NVIDIA driver there and give Ray's container the GPUs (docker --gpus all, "
                "Kubernetes' NVIDIA device plugin), or start Ray there with --num-gpus set to the GPUs it has"
            )
        elif seen > gpus:
            found += f"; {seen} GPU(s) present that Ray does not advertise (start Ray with --num-gpus={seen} to train on them)"
        results.append(
            CheckResult(name="resources", status="FAIL" if fix else "ok", found=found, fix=fix, where=node.label())
        )
    return results


STORAGE_FIX_WRITE = (
    "make {path} writable there by the user Ray runs as: mount it read-write at the same path on every node "
    "(and check its owner and permissions), or use an object store URI (s3://, gs://) with credentials on every node"
)
STORAGE_FIX_READ = (
    "{path} is not one storage for all: mount the same shared filesystem (NFS, a cloud file share) at the same "
    "path on every node and on the driver, or use an object store URI (s3://, gs://) with credentials on every node"
)


def storage_checks(
    storage_path: str, written: Mapping[str, tuple[NodeFacts, str, str]], read_errors: Mapping[str, Mapping[str, str]]
) -> list[CheckResult]:
    """One ``storage`` line per process (the driver first): whether it wrote its file, and read back
    every file the others wrote.

    ``written`` maps each process's label to ``(facts, the path it wrote, the write error)``;
    ``read_errors`` maps each label to ``{path: error}`` for the files it could not read.
    """
    writer_of = {path: label for label, (_, path, _) in written.items() if path}
    results = []
    for label, (_facts, path, write_error) in written.items():
        if write_error:
            found, fix = write_error, STORAGE_FIX_WRITE.format(path=storage_path)
        elif unread := read_errors.get(label):
            what = "; ".join(f"{writer_of.get(p, '?')}'s {p}: {e}" for p, e in sorted(unread.items()))
            found = f"wrote {path}, but cannot read what others wrote: {what}"
            fix = STORAGE_FIX_READ.format(path=storage_path)
        else:
            found, fix = f"wrote {path} and read the {len(writer_of) - 1} other file(s)", ""
        results.append(CheckResult(name="storage", status="FAIL" if fix else "ok", found=found, fix=fix, where=label))
    return results


# -- the cluster, its token, and Prefect ------------------------------------------------------


def token_source() -> str:
    """Where a joining process would take the token from (as Ray 2.60 looks), or ``""``."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']}"
    default = pathlib.Path.home() / ".ray" / "auth_token"
    return str(default) if default.is_file() else ""


def auth_failure(address: str, error: BaseException) -> CheckResult:
    """The ``auth`` line for a join ``is_auth_failure`` said was refused for its token."""
    mode = os.environ.get("RAY_AUTH_MODE")
    source = token_source()
    if isinstance(error, ray.exceptions.AuthenticationError):
        found = f"RAY_AUTH_MODE={mode} but no token was found to send ({error.message.split('.')[0]})"
    elif mode != "token":
        found = f"the cluster at {address} wants a token, and none was sent (RAY_AUTH_MODE is {mode!r}, not 'token')"
        if source:
            found += f"; a token is in {source}"
    else:
        found = f"the cluster at {address} refused the token from {source or 'nowhere'}: it is not the head's"
    return CheckResult(name="auth", status="FAIL", found=found, fix=AUTH_FIX)


def auth_ok(address: str) -> CheckResult:
    """The ``auth`` line after joining ``address``."""
    if os.environ.get("RAY_AUTH_MODE") == "token":
        return CheckResult(name="auth", status="ok", found=f"joined with the token from {token_source() or '?'}")
    return CheckResult(name="auth", status="ok", found=f"{address} asked for no token (RAY_AUTH_MODE is not 'token')")


def tcp_problem(address: str, timeout_s: float) -> str:
    """Why nothing answers at ``address`` (``host:port`` or ``ray://host:port``), or ``""`` when it
    answers or is not a host and port (``auto``). Asked before ``ray.init``, which retries an
    address nothing answers at for minutes."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return ""
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        return f"nothing answers at {hostport}: {type(error).__name__}: {error}"
    return ""


PREFECT_FIX = (
    "start a server (prefect server start, or your Prefect Cloud workspace) and set PREFECT_API_URL to its API "
    "(http://<host>:4200/api, ending in /api) here and on every Prefect worker; check firewalls between them"
)


def prefect_check(api_url: str | None, timeout_s: float) -> CheckResult:
    """GET ``<api_url>/health``; skip without a URL."""
    if not api_url:
        return CheckResult(
            name="prefect",
            status="skip",
            found="PREFECT_API_URL is not set: flows would run on a temporary local server (--prefect-api-url to check one)",
        )
    url = api_url.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return CheckResult(name="prefect", status="FAIL", found=f"GET {url}: {reason}", fix=PREFECT_FIX)
    if status != 200:
        return CheckResult(name="prefect", status="FAIL", found=f"GET {url} answered HTTP {status}", fix=PREFECT_FIX)
    return CheckResult(name="prefect", status="ok", found=f"GET {url} answered 200")
