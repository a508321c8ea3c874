"""One live owner per run: lease.json holds the owner and a heartbeat the owner keeps fresh."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pyarrow.fs as pafs

from storage.errors import RunInProgressError
from storage.filesystem import exists, read_bytes, write_bytes


class Lease:
    """Take, keep and give back the run's lease.

    ``acquire`` fails with ``RunInProgressError`` while another owner's heartbeat is younger than
    ``stale_after_s``; an older one is taken over (its owner died), and so is one whose holder was
    a process on this host that no longer exists.
    """

    def __init__(self, fs: pafs.FileSystem, path: str, owner: str, *, stale_after_s: float, display: str) -> None:
        self.fs = fs
        self.path = path
        self.owner = owner
        self.stale_after_s = stale_after_s
        self.display = display
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> dict | None:
        if not exists(self.fs, self.path):
            return None
        try:
            return json.loads(read_bytes(self.fs, self.path))
        except (ValueError, OSError):
            return None  # a torn write by a dying owner: treat as free

    def _write(self) -> None:
        body = {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time()}
        write_bytes(self.fs, self.path, json.dumps(body).encode())

    def acquire(self) -> None:
        """Take the lease, or raise ``RunInProgressError`` naming its live holder and when to retry."""
        current = self._read()
        if current and current.get("owner") != self.owner and not _holder_is_dead(current):
            age = time.time() - float(current.get("heartbeat", 0))
            if age < self.stale_after_s:
                raise self._in_progress(current, age)
        self._write()
        # Two starters at once: whoever wrote last owns it; the other sees that here.
        time.sleep(0.05)
        confirmed = self._read()
        if not confirmed or confirmed.get("owner") != self.owner:
            raise RunInProgressError(f"run in progress: {self.display} was taken by {confirmed and confirmed.get('owner')}.")
        self._thread = threading.Thread(target=self._beat, name="flowtrain-lease", daemon=True)
        self._thread.start()

    def _in_progress(self, holder: dict, age: float) -> RunInProgressError:
        wait_s = max(0.0, self.stale_after_s - age)
        error = RunInProgressError(
            f"run in progress: {self.display} is owned by {holder.get('owner')} "
            f"(host {holder.get('host')}, pid {holder.get('pid')}, heartbeat {age:.0f} s ago). "
            f"If that process is gone, its lease goes stale in {wait_s:.0f} s: retry then and the run resumes "
            "from its last committed checkpoint; or use another RunConfig.name."
        )
        error.holder_host, error.holder_pid, error.retry_after_s = holder.get("host"), holder.get("pid"), wait_s
        return error

    def _beat(self) -> None:
        interval = max(0.5, self.stale_after_s / 4)
        while not self._stop.wait(interval):
            try:
                current = self._read()
                if current and current.get("owner") != self.owner:
                    return  # someone took over a lease we let go stale; never fight for it
                self._write()
            except OSError:
                pass  # a missed beat is retried; staleness needs several

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still ours. Safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        try:
            current = self._read()
            if current and current.get("owner") == self.owner:
                self.fs.delete_file(self.path)
        except OSError:
            pass


def _holder_is_dead(holder: dict) -> bool:
    """True when the lease's holder was a process on this host that no longer exists.

    Such a lease is taken over at once instead of after ``stale_after_s``: a driver killed a
    moment ago must not block its own rerun. A holder on another host is never judged here.
    """
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return False  # this process holds it under another owner name: alive by definition
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, owned by another user
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A killed child its parent has not reaped yet still answers kill(0); on Linux /proc tells."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False
