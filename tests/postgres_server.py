"""A throwaway PostgreSQL cluster for tests: `initdb` in a temporary folder, `pg_ctl start` on a free
port on 127.0.0.1, removed at the end. Uses the machine's PostgreSQL server binaries
(Debian: `apt-get install postgresql`; `.ci/run` installs them where they are missing)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from prefect_server import free_port


def server_binaries() -> str:
    """The folder holding ``initdb`` and ``pg_ctl``; fails naming the package to install."""
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(folder, "initdb"), os.X_OK) and os.access(os.path.join(folder, "pg_ctl"), os.X_OK):
            return folder
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(initdb))
    raise AssertionError("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql")


def _as_owner(command: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; CI runs as root, so the cluster belongs to the `postgres` user.
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@contextlib.contextmanager
def running_postgres() -> Iterator[str]:
    """Start a PostgreSQL cluster and yield its SQLAlchemy URL for Prefect (asyncpg driver)."""
    bin_dir = server_binaries()
    folder = tempfile.mkdtemp(prefix="flowtrain-test-pg-")
    data = os.path.join(folder, "data")
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    port = free_port()
    run = lambda *args: subprocess.run(_as_owner(list(args)), capture_output=True, text=True, timeout=120)  # noqa: E731
    done = run(f"{bin_dir}/initdb", "-D", data, "--auth=trust", "--username=postgres", "--no-sync", "--encoding=UTF8")
    assert done.returncode == 0, done.stdout + done.stderr
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
    done = run(
        f"{bin_dir}/pg_ctl",
        "-D",
        data,
        "-o",
        options,
        "-l",
        os.path.join(folder, "server.log"),
        "-w",
        "-t",
        "60",
        "start",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)
