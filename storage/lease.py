"""One live owner per run, on stores that cannot create a file only if it is absent: each driver
that wants the run writes a claim of its own (``lease.<id>.json`` in the run folder, its heartbeat
rewritten every ``stale_after_s / 6``) and only then lists the folder for another live claim; one
that takes a stale claim over marks it ``lease.<id>.taken`` first. How, on which stores, and
where clocks come in: docs/design.md, "Storage layout of a run".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time

from storage.errors import RunInProgressError
from storage.filesystem import exists, is_local, pafs, read_bytes, write_bytes
from storage.layout import LEASE_PREFIX

#: Tries to read another driver's claim that its owner may be rewriting at that moment.
CLAIM_READS = 3


def new_owner(role: str = "") -> str:
    """A name for one process's claim on a run, new on every call: host, pid and a random part
    (two claims of one process are two owners), then ``role`` when given (``"checkpoints"``)."""
    import uuid

    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return f"{owner}:{role}" if role else owner


class Lease:
    """Take, keep and give back the run's lease (what it promises: docs/design.md).

    ``acquire`` fails with ``RunInProgressError`` while another owner's claim is live: its
    heartbeat younger than ``stale_after_s`` and its process, when on this host, alive.
    """

    def __init__(self, fs: pafs.FileSystem, folder: str, owner: str, *, stale_after_s: float, display: str) -> None:
        self.fs = fs
        self.folder = folder
        self.owner = owner
        self.name = f"{LEASE_PREFIX}{hashlib.sha1(owner.encode()).hexdigest()[:16]}.json"
        self.path = f"{folder}/{self.name}"
        self.stale_after_s = stale_after_s
        self.display = display
        #: The heartbeat (wall clock, as others judge it; a suspended machine's too) of the newest
        #: claim known to have reached the store with no other owner's beside it.
        self._renewed = float("-inf")
        #: Why this owner gave the run up for good (None while it holds it).
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease, or raise ``RunInProgressError`` naming its live holder and when to retry."""
        try:
            claimed = self._claim()
            holder = self._other_live_claim()
            if holder is not None:
                raise self._in_progress(*holder)
        except BaseException:
            _delete(self.fs, self.path)
            raise
        self._renewed = claimed
        self._thread = threading.Thread(target=self._beat, name="flowtrain-lease", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise ``RunInProgressError`` when another driver may own the run by now: this lease was
        taken over, or its heartbeat could not be renewed for ``stale_after_s / 2``."""
        silent_s = time.time() - self._renewed
        if self._lost or silent_s >= self.stale_after_s / 2:
            why = self._lost or (
                f"its heartbeat could not be renewed for {silent_s:.0f} s, so another driver may have taken the run over"
            )
            raise RunInProgressError(
                f"run {self.display}: this driver lost the run's lease ({why}); it writes nothing more. "
                "Check the storage is reachable, then rerun: the run resumes from its last committed checkpoint."
            )

    def release(self) -> None:
        """Stop the heartbeat and delete this owner's claim. Safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        _delete(self.fs, self.path)

    def _claim(self) -> float:
        """Write this owner's claim with a fresh heartbeat and return the heartbeat."""
        heartbeat = time.time()
        body = {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat": heartbeat}
        if is_local(self.fs):  # a file rewritten in place can be read half written: rename a whole one in
            write_bytes(self.fs, f"{self.path}.new", json.dumps(body).encode())
            self.fs.move(f"{self.path}.new", self.path)
        else:  # an object store's write is whole or absent
            write_bytes(self.fs, self.path, json.dumps(body).encode())
        return heartbeat

    def _beat(self) -> None:
        interval_s = wait_s = self.stale_after_s / 6
        while not self._stop.wait(wait_s):
            wait_s = interval_s
            overdue = time.time() - self._renewed >= self.stale_after_s / 2
            with contextlib.suppress(OSError):  # a missed beat is retried; check() stops the run's writes if it lasts
                claimed = self._claim()
                if self._stop.is_set():  # released while this write hung: take back what it wrote
                    _delete(self.fs, self.path)
                    return
                gap_s = time.time() - self._renewed
                # Quiet long enough to be taken over: go on only if nobody did (claim, then list; then,
                # once the claim was stale, the mark a taker leaves first, as it may be done by now).
                if (overdue or gap_s >= self.stale_after_s) and self._other_live_claim() is not None:
                    self._lost = "another driver took the run over"
                elif gap_s >= self.stale_after_s and exists(self.fs, _taken_path(self.path)):
                    self._lost = f"its heartbeat was not renewed for {gap_s:.0f} s, and another driver took the run over meanwhile"
                if self._lost:
                    _delete(self.fs, self.path)
                    return
                self._renewed = claimed
                if time.time() - claimed >= interval_s:  # a slow write landed an old heartbeat: a fresh one now
                    wait_s = 0

    def _other_live_claim(self) -> tuple[dict, float] | None:
        """The freshest live claim other than ours and its age; dead claims are removed on the way."""
        live = []
        for entry in self.fs.get_file_info(pafs.FileSelector(self.folder, allow_not_found=True)):
            if entry.base_name == self.name or entry.type != pafs.FileType.File or not _is_claim(entry.base_name):
                continue
            found = self._read_claim(entry)
            if found is None:
                continue  # given up or released since the listing
            claim, age = found
            if _holder_is_dead(claim):
                _delete(self.fs, entry.path)  # its owner is gone and will never remove it
                continue
            if age >= self.stale_after_s:
                # Its owner may only be stalled: the mark tells it, once it wakes, that it lost the run.
                write_bytes(self.fs, _taken_path(entry.path), json.dumps({"by": self.owner}).encode())
                _delete(self.fs, entry.path)
                continue
            live.append((claim, age))
        return min(live, key=lambda found: found[1], default=None)

    def _read_claim(self, entry: pafs.FileInfo) -> tuple[dict, float] | None:
        """The claim listed as ``entry`` and its age, or None when it is gone.

        A claim read while its owner rewrites it can come back cut short, or fail on an object
        store (its size changed between the two requests a read takes): it is read again. One that
        stays unparseable counts as live until its file is ``stale_after_s`` old.
        """
        for attempt in range(1, CLAIM_READS + 1):
            try:
                claim = json.loads(read_bytes(self.fs, entry.path))
                return claim, time.time() - float(claim["heartbeat"])
            except FileNotFoundError:
                return None
            except OSError:
                if attempt == CLAIM_READS:
                    raise
            except (ValueError, KeyError, TypeError):
                pass
            if attempt < CLAIM_READS:
                time.sleep(0.1 * attempt)
        return {"owner": "unknown", "host": None, "pid": None}, time.time() - entry.mtime.timestamp()

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


def _taken_path(claim_path: str) -> str:
    """What a driver that takes the claim at ``claim_path`` over as stale writes before deleting it."""
    return f"{claim_path.removesuffix('.json')}.taken"


def _is_claim(name: str) -> bool:
    return name.startswith(LEASE_PREFIX) and name.endswith(".json")


def _delete(fs: pafs.FileSystem, path: str) -> None:
    with contextlib.suppress(OSError):
        fs.delete_file(path)  # already gone, or the storage failed: a dead claim is removed by the next reader


def _holder_is_dead(holder: dict) -> bool:
    """True when the claim's owner was a process on this host that no longer exists.

    Such a claim is dead at once instead of after ``stale_after_s``: a driver killed a moment
    ago must not block its own rerun. A holder on another host is never judged here.
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
