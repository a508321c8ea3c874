"""A direct line from every worker to the controller for reports and other worker events.

Sending each event as the answer to a Ray actor call costs the driver one ``ray.get`` and one
new ``.remote()`` per rank per report: about 0.1 ms each, so a 64-rank report round cost the
controller ~10 ms of CPU and grew with the square of the world size in latency. Here each worker
opens one TCP connection to the controller when its training function starts and writes
length-prefixed pickled event batches to it; the controller waits on all connections at once
with ``selectors`` (epoll), so a round costs one small read per rank.

The connection is a fast path only. A worker that cannot reach the controller, or whose
connection breaks, falls back to the Ray actor long poll (``TrainWorker.next_events``), which
the worker group keeps open anyway: it is also how a dead worker (or a lost node, which closes
no socket) is noticed.

A connection starts with a hello carrying a per-group random token handed to the workers over
Ray, so a stray process cannot inject events into a run.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import selectors
import socket
import struct
import threading
from typing import Any

from ray import cloudpickle

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
#: A connection's first bytes: the group's 16-byte token and the rank, checked before anything
#: the peer sends is unpickled (unpickling runs code, so an unproven peer never gets that far).
_HELLO = struct.Struct("!16sI")
#: Bytes read from one connection per readiness: a report round is a few hundred bytes per rank.
_READ_CHUNK = 1 << 20
#: How long a worker tries to reach the controller before it falls back to the Ray long poll.
CONNECT_TIMEOUT_S = 5.0


def _frame(obj: Any) -> bytes:
    payload = cloudpickle.dumps(obj)
    return _HEADER.pack(len(payload)) + payload


def _allow_open_files(wanted: int) -> None:
    """Raise this process's soft limit on open files toward ``wanted`` (within the hard limit):
    one connection per worker passes the common default of 1,024 near a thousand workers."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            if ceiling > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    except (ImportError, ValueError, OSError):
        pass  # not allowed here: workers that cannot connect fall back to the Ray long poll


class ChannelAddress:
    """Where the controller listens and the token a worker proves itself with (sent over Ray)."""

    def __init__(self, host: str, port: int, token: bytes) -> None:
        self.host = host
        self.port = port
        self.token = token


class EventSender:
    """One worker's end: ``send`` writes a batch of events; safe from several threads (the
    training loop and the background uploader both emit)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, address: ChannelAddress, rank: int, timeout_s: float = CONNECT_TIMEOUT_S) -> "EventSender":
        """Connect and say hello as ``rank``; raises ``OSError`` when the controller is unreachable."""
        sock = socket.create_connection((address.host, address.port), timeout=timeout_s)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sender = cls(sock)
        sender.send_raw(_HELLO.pack(address.token, rank))
        return sender

    def send_raw(self, data: bytes) -> None:
        with self._lock:
            self._sock.sendall(data)

    def send(self, events: list) -> None:
        """Send ``events`` in one frame; raises ``OSError`` when the connection is gone."""
        self.send_raw(_frame(events))

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.rank: int | None = None


class EventListener:
    """The controller's end: accepts the workers' connections and reads their event batches.

    ``wake()`` may be called from another thread to end a ``poll`` early (the worker group's Ray
    watcher uses it when the long poll delivers something).
    """

    def __init__(self, host: str, connections: int = 0) -> None:
        _allow_open_files(connections + 256)
        self.token = secrets.token_bytes(16)
        self._server = socket.create_server((host, 0), backlog=4096)
        self._server.setblocking(False)
        self.address = ChannelAddress(host, self._server.getsockname()[1], self.token)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        #: Ranks whose connection ended (EOF or error) since the last ``poll``.
        self.closed: list[int] = []

    def wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # already closed, or the buffer is full of wake-ups: poll wakes either way

    def poll(self, timeout_s: float) -> tuple[list[tuple[int, list]], bool]:
        """Wait up to ``timeout_s``; return ``(rank, events)`` batches read, and whether ``wake``
        was called."""
        batches: list[tuple[int, list]] = []
        woken = False
        for key, _ in self._selector.select(timeout_s):
            if key.data is None:
                self._accept()
            elif key.data == "wake":
                woken = True
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
            else:
                self._read(key.data, batches)
        return batches, woken

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, _Connection(sock))

    def _read(self, conn: _Connection, batches: list[tuple[int, list]]) -> None:
        try:
            data = conn.sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            conn.buffer += data
        offset, size = 0, len(conn.buffer)
        if conn.rank is None:
            if size < _HELLO.size:
                if not data:
                    self._drop(conn)
                return
            token, rank = _HELLO.unpack_from(conn.buffer)
            if not hmac.compare_digest(token, self.token):
                logger.warning("refused a connection to the event channel without this run's token")
                self._drop(conn)
                return
            conn.rank, offset = rank, _HELLO.size
        while size - offset >= _HEADER.size:
            (length,) = _HEADER.unpack_from(conn.buffer, offset)
            end = offset + _HEADER.size + length
            if end > size:
                break
            batches.append((conn.rank, cloudpickle.loads(memoryview(conn.buffer)[offset + _HEADER.size : end])))
            offset = end
        del conn.buffer[:offset]
        if not data:
            if conn.rank is not None:
                self.closed.append(conn.rank)
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def close(self) -> None:
        """Close every connection and stop listening. Safe to call twice."""
        if self._selector.get_map() is None:
            return
        for key in list(self._selector.get_map().values()):
            try:
                key.fileobj.close()
            except OSError:
                pass
        self._selector.close()
        self._wake_w.close()
