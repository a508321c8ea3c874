"""S3 on a moto server, and a pyarrow filesystem over it that fails or holds back writes on cue.

``FaultyS3`` is a ``pyarrow.fs.FileSystemHandler``: wrapped in ``pyarrow.fs.PyFileSystem`` it
pickles (the S3 filesystem and a few strings), so it reaches the training workers as
``RunConfig(storage_filesystem=...)``. Each process counts its own failures. What it did is
appended, one line per event, to a log file on local disk that every process of the test
shares (``O_APPEND`` writes of one short line land whole and in order), so a test can read
the order of events across the driver and the workers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

BUCKET = "flowtrain-test"

#: Set in a worker process by its training loop once ``report()`` returned; writes to a gated
#: path wait for it (one per process: each rank's uploads run in its own worker).
REPORT_RETURNED = threading.Event()
#: How long a gated write waits for ``REPORT_RETURNED`` before it gives up and says so in the log.
GATE_TIMEOUT_S = 30.0


@contextlib.contextmanager
def moto_s3() -> Iterator[pafs.S3FileSystem]:
    """A moto S3 server on 127.0.0.1 with the bucket ``BUCKET``, and pyarrow's S3 filesystem on it."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        fs = pafs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
            scheme="http",
            endpoint_override=f"127.0.0.1:{port}",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )
        fs.create_dir(BUCKET)
        yield fs
    finally:
        server.stop()


def log_event(log_path: str, line: str) -> None:
    """Append one line to the shared event log (from any process)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)


def read_events(log_path: str) -> list[str]:
    """The shared event log's lines, in the order they were written."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as f:
        return f.read().splitlines()


class FaultyS3(pafs.FileSystemHandler):
    """Forwards to ``s3``. A write or server-side copy to a path containing one of ``flaky``
    fails the first ``flaky_times`` times (per path, per process); one containing one of
    ``broken`` always fails; one containing one of ``gated`` waits for ``REPORT_RETURNED``.
    Failures raise ``OSError("injected failure: ...")``, which uploads treat as transient (or
    ``PermissionError`` with ``permanent=True``). Every failure, and the end of every gated
    write, is logged to ``log_path``."""

    def __init__(
        self,
        s3: pafs.S3FileSystem,
        log_path: str,
        *,
        flaky: tuple[str, ...] = (),
        flaky_times: int = 2,
        broken: tuple[str, ...] = (),
        gated: tuple[str, ...] = (),
        permanent: bool = False,
    ) -> None:
        self.s3 = s3
        self.log_path = log_path
        self.flaky = tuple(flaky)
        self.flaky_times = flaky_times
        self.broken = tuple(broken)
        self.gated = tuple(gated)
        self.permanent = permanent
        self.failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["failures"] = {}  # every process counts its own
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _maybe_fail(self, op: str, path: str) -> None:
        fail = any(p in path for p in self.broken)
        if not fail and any(p in path for p in self.flaky):
            with self._lock:
                seen = self.failures.get(path, 0)
                fail = seen < self.flaky_times
                if fail:
                    self.failures[path] = seen + 1
        if fail:
            log_event(self.log_path, f"fail {op} {path}")
            if self.permanent:
                raise PermissionError(13, f"injected permission denied: {op}", path)
            raise OSError(f"injected failure: {op} {path}")

    # identity
    def get_type_name(self):
        return "s3"  # shown as s3:// URIs, as the real store would be

    def equals(self, other):
        return isinstance(other, pafs.PyFileSystem) and other.handler is self

    def normalize_path(self, path):
        return self.s3.normalize_path(path)

    # metadata
    def get_file_info(self, paths):
        return self.s3.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.s3.get_file_info(selector)

    # changes
    def create_dir(self, path, recursive):
        self.s3.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.s3.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.s3.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("not in tests")

    def delete_file(self, path):
        self.s3.delete_file(path)

    def move(self, src, dest):
        self.s3.move(src, dest)

    def copy_file(self, src, dest):
        self._maybe_fail("copy", dest)
        self.s3.copy_file(src, dest)

    # streams
    def open_input_stream(self, path):
        return self.s3.open_input_stream(path)

    def open_input_file(self, path):
        return self.s3.open_input_file(path)

    def open_output_stream(self, path, metadata):
        self._maybe_fail("write", path)
        if any(p in path for p in self.gated):
            if not REPORT_RETURNED.wait(GATE_TIMEOUT_S):
                log_event(self.log_path, f"gate timed out {path}")
            return pa.PythonFile(_LoggedWrite(self.s3.open_output_stream(path), self.log_path, path), mode="w")
        return self.s3.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        raise OSError("S3 cannot append")


class _LoggedWrite:
    """A writable file that logs "written <path>" once the object is complete (closed)."""

    def __init__(self, stream, log_path: str, path: str) -> None:
        self._stream = stream
        self._log_path = log_path
        self._path = path
        self.closed = False

    def write(self, data) -> int:
        return self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            self.closed = True
            log_event(self._log_path, f"written {self._path}")


def faulty_s3(s3: pafs.S3FileSystem, log_path: str, **faults) -> tuple[pafs.PyFileSystem, FaultyS3]:
    """A picklable filesystem over ``s3`` with ``faults`` (see ``FaultyS3``), and its handler."""
    handler = FaultyS3(s3, log_path, **faults)
    return pafs.PyFileSystem(handler), handler
