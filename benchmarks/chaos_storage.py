"""The chaos soak's storage: local disk or S3 on a moto server, and a wrapper that strikes them.

``ChaosFS`` is a ``pyarrow.fs.FileSystemHandler`` forwarding to a real filesystem (local or S3).
Wrapped in ``PyFileSystem`` it pickles, so it travels to the workers as the run's
``storage_filesystem`` and strikes wherever a checkpoint file is written: a worker's upload into
``.staging`` ("worker" side) or the driver's commit into ``checkpoint_*`` ("driver" side). It
knows a file by its name (``r{rank}-s{step}.pt``, see ``chaos_loop``), so a fault planned for
(step, rank) strikes that file whichever attempt writes it; markers make it strike once.

On local disk the wrapper is not ``LocalFileSystem``, so storage commits by copying and a
``.committed`` marker, as on object stores; runs without storage faults use the disk as it is
(an atomic rename per commit), so both paths are soaked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from benchmarks import chaos_journal
from benchmarks.chaos_schedule import KINDS

BUCKET = "flowtrain-chaos"
#: What an injected error says, so the soak can tell it in a run's error.
TRANSIENT = "chaos: injected transient failure"
PERMANENT = "chaos: injected permission denied"
_FILE = re.compile(r"/r(\d+)-s(\d{6})\.pt$")
#: Marker of the permanent fault in force (removed by the soak when the run's fit() has ended).
DENIED = "storage.denied"
#: A ``kill-report`` fault armed in this process: its worker dies at its next listing of
#: ``.staging`` (``report()`` checking its upload, after every file is written).
_kill_at_listing: dict | None = None
#: A ``snapshot-transient`` fault armed in this driver by its checkpoint's commit: the next write
#: of run.json (the commit point) fails once.
_fail_snapshot: dict | None = None


@contextlib.contextmanager
def moto_s3() -> Iterator[tuple[pafs.S3FileSystem, str]]:
    """A moto S3 server on 127.0.0.1 with the bucket ``BUCKET``; yields pyarrow's S3
    filesystem on it and its endpoint (``host:port``)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"127.0.0.1:{port}"
        fs = s3_filesystem(endpoint)
        fs.create_dir(BUCKET)
        yield fs, endpoint
    finally:
        server.stop()


def s3_filesystem(endpoint: str) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem on the moto server at ``endpoint``."""
    return pafs.S3FileSystem(
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
        scheme="http",
        endpoint_override=endpoint,
        allow_bucket_creation=True,
        allow_bucket_deletion=True,
    )


class ChaosFS(pafs.FileSystemHandler):
    """Forwards to ``inner``; strikes the checkpoint writes ``faults`` name (dicts of
    ``chaos_schedule.Fault``), each once (markers in ``marks``).

    ``plant="lose-file"`` plants a defect for the soak to find: a commit silently skips rank 1's
    file, so a committed checkpoint lacks it.
    """

    def __init__(
        self, inner: pafs.FileSystem, *, type_name: str, marks: str, faults: list[dict], plant: str | None = None
    ) -> None:
        self.inner = inner
        self.type_name = type_name
        self.marks = marks
        self.faults = [f for f in faults if KINDS[f["kind"]].by == "storage"]
        self.plant = plant

    # -- the faults ------------------------------------------------------------------------------

    def _strike(self, op: str, path: str) -> str | None:
        """Run the faults planned for a write of ``path``; return "kill-write:<fault id>" when the
        write must die half way, "lose" when it must silently do nothing."""
        global _fail_snapshot, _kill_at_listing
        if os.path.exists(os.path.join(self.marks, DENIED)):
            raise PermissionError(13, f"{PERMANENT} ({op})", path)
        if _fail_snapshot is not None and path.endswith("/run.json.new"):
            fault, _fail_snapshot = _fail_snapshot, None
            if chaos_journal.fire(self.marks, fault["id"]):
                raise OSError(f"{TRANSIENT} ({op} {path})")
        found = _FILE.search(path)
        if found is None:
            return None
        rank, step = int(found.group(1)), int(found.group(2))
        side = "worker" if "/.staging/" in path else "driver"
        if self.plant == "lose-file" and side == "driver" and rank == 1:
            return "lose"
        for fault in self.faults:
            if (fault["step"], fault["rank"], fault["side"]) != (step, rank, side):
                continue
            kind, fault_id = fault["kind"], fault["id"]
            if kind == "storage-transient":
                for tries in ("fired", "again"):  # fails twice, the upload's retries get it through
                    if chaos_journal.fire(self.marks, fault_id, tries):
                        raise OSError(f"{TRANSIENT} ({op} {path})")
            elif kind == "storage-slow" and chaos_journal.fire(self.marks, fault_id):
                time.sleep(fault["detail"])
            elif kind == "storage-permanent" and chaos_journal.fire(self.marks, fault_id):
                open(os.path.join(self.marks, DENIED), "w").close()
                raise PermissionError(13, f"{PERMANENT} ({op})", path)
            elif kind == "kill-write" and not chaos_journal.fired(self.marks, fault_id):
                return f"kill-write:{fault_id}"
            elif kind == "kill-report" and not chaos_journal.fired(self.marks, fault_id):
                _kill_at_listing = fault
            elif kind == "snapshot-transient" and not chaos_journal.fired(self.marks, fault_id):
                _fail_snapshot = fault
        return None

    def _die_if_armed(self, path: str) -> None:
        global _kill_at_listing
        if _kill_at_listing is not None and "/.staging/" in path + "/":
            fault, _kill_at_listing = _kill_at_listing, None
            if chaos_journal.fire(self.marks, fault["id"]):
                os.kill(os.getpid(), signal.SIGKILL)

    # -- identity --------------------------------------------------------------------------------

    def get_type_name(self) -> str:
        return self.type_name

    def equals(self, other: Any) -> bool:
        return (
            isinstance(other, pafs.PyFileSystem)
            and isinstance(other.handler, ChaosFS)
            and other.handler.__dict__ == self.__dict__
        )

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    # -- metadata --------------------------------------------------------------------------------

    def get_file_info(self, paths):
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector):
        self._die_if_armed(selector.base_dir)
        return self.inner.get_file_info(selector)

    # -- changes ---------------------------------------------------------------------------------

    def create_dir(self, path, recursive):
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("the chaos soak never empties a whole filesystem")

    def delete_file(self, path):
        self.inner.delete_file(path)

    def move(self, src, dest):
        self._strike("move", dest)
        self.inner.move(src, dest)

    def copy_file(self, src, dest):
        if self._strike("copy", dest) == "lose":
            return
        self.inner.copy_file(src, dest)

    # -- streams ---------------------------------------------------------------------------------

    def open_input_stream(self, path):
        return self.inner.open_input_stream(path)

    def open_input_file(self, path):
        return self.inner.open_input_file(path)

    def open_output_stream(self, path, metadata):
        struck = self._strike("write", path)
        stream = self.inner.open_output_stream(path)
        if struck is not None and struck.startswith("kill-write:"):
            return pa.PythonFile(_DieMidWrite(stream, self.marks, int(struck.partition(":")[2])), mode="w")
        return stream

    def open_append_stream(self, path, metadata):
        raise OSError("the chaos soak's storage does not append")


class _DieMidWrite:
    """A file being written whose process is SIGKILLed once half of its first write is in."""

    def __init__(self, stream: Any, marks: str, fault_id: int) -> None:
        self._stream = stream
        self._marks = marks
        self._fault_id = fault_id
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._stream.write(view[: len(view) // 2])
        self._stream.flush()
        if chaos_journal.fire(self._marks, self._fault_id):
            os.kill(os.getpid(), signal.SIGKILL)
        self._stream.write(view[len(view) // 2 :])
        return len(view)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            self.closed = True


def filesystem(
    kind: str, *, wrapped: bool, endpoint: str | None, marks: str, faults: list[dict], plant: str | None
) -> pafs.FileSystem | None:
    """The run's ``storage_filesystem``: None (plain local disk), S3 on ``endpoint``, or either
    behind ``ChaosFS``."""
    inner = s3_filesystem(endpoint) if kind == "s3" else pafs.LocalFileSystem()
    if not wrapped:
        return inner if kind == "s3" else None
    return pafs.PyFileSystem(
        ChaosFS(inner, type_name="s3" if kind == "s3" else "chaos", marks=marks, faults=faults, plant=plant)
    )
