"""A direct line from every worker to the controller for its events, that loses none of them.

Each worker writes numbered, pickled events to one TCP connection opened with the group's token
(``Outbox``); the controller reads them all with ``selectors`` and acknowledges on the same socket
(``EventListener``). A worker keeps each event until acknowledged; a connection that closes, errs
or stays unacknowledged for ``ack_timeout_s`` is given up, and its events go over the Ray long poll
instead, where ``WorkerInbox`` drops replays by number (docs/design.md, "The report path"). Tests
and the chaos soak plant faults through an ``EventTap`` (``tap_event_road``) in the controller.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import hmac
import logging
import pickle
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol, cast

from ray import cloudpickle

from trainers.tuning import ACK_EVERY_S, ACK_TIMEOUT_S, CONNECT_TIMEOUT_S, HEARTBEAT_S

logger = logging.getLogger(__name__)

#: Every frame a worker writes: the payload's length and the event's number, then the pickled
#: event; an empty frame numbered 0 asks for an acknowledgement, numbered 1 is a heartbeat.
_HEADER = struct.Struct("!IQ")
_ASK = _HEADER.pack(0, 0)
_BEAT = _HEADER.pack(0, 1)
#: What the controller writes back: the highest event number it has read on that connection.
_ACK = struct.Struct("!Q")
#: A connection's first bytes: the group's 16-byte token and the rank, checked before anything
#: the peer sends is unpickled (unpickling runs code, so an unproven peer never gets that far).
_HELLO = struct.Struct("!16sI")
#: Bytes read from one connection per readiness: a report round is a few hundred bytes per rank.
_READ_CHUNK = 1 << 20
#: The worker's connection errs within about 15 s when the peer's kernel stops answering: while
#: idle by keepalive probes (from 4 s, 2 s apart), with bytes in flight by ``TCP_USER_TIMEOUT``
#: (ms; it also bounds the keepalive). Linux names; elsewhere the system's own timers apply.
_TCP_OPTIONS = {"TCP_KEEPIDLE": 4, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3, "TCP_USER_TIMEOUT": 10_000}


def _allow_open_files(wanted: int) -> None:
    """Raise the soft limit on open files toward ``wanted`` (within the hard limit): one connection
    per worker passes the common default of 1,024 near a thousand workers."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < ceiling:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    except (ImportError, ValueError, OSError):
        pass  # not allowed here: workers that cannot connect fall back to the Ray long poll


def _shut(sock: socket.socket) -> None:
    """End ``sock``'s connection both ways, waking whatever waits on it; a closed one is no error."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def dumps_event(event: Any) -> bytes:
    """Pickle one event for the wire: the C pickler when that is safe, cloudpickle otherwise.

    The standard pickler is several times faster (the larger half of a metrics-only ``report()``)
    but pickles classes and functions by reference, wrong for the worker's ``__main__`` (the
    driver's is another script) and for modules registered to be pickled by value.
    """
    if not cloudpickle.list_registry_pickle_by_value():
        # On every report: a try costs nothing in Python 3.11 where a context manager is a call.
        try:
            payload = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - a lambda, a local class, ...: cloudpickle says what is wrong
            pass
        else:
            if b"__main__" not in payload:
                return payload
    return cloudpickle.dumps(event)


class Fate(enum.Enum):
    """What a listener does with a connection after a frame, as an ``EventTap`` decides: go on
    reading it; close it now (a dropped connection); or stop reading and answering it without
    closing it, giving the socket to the tap (half-open: the worker's writes succeed until its
    buffers fill)."""

    READ = "read"
    CLOSE = "close"
    DETACH = "detach"


class EventTap(Protocol):
    """Sees each frame a listener reads and decides the connection's fate (tests and the soak)."""

    def frame_read(self, rank: int, number: int) -> Fate:
        """Rank ``rank``'s event ``number`` was just read (and will be delivered)."""

    def detached(self, rank: int, sock: socket.socket) -> None:
        """The tap now owns ``sock`` (after ``Fate.DETACH``): the listener neither reads nor closes it."""


#: What listeners made from now on use: a tap (None: none) and the workers' acknowledgement timeout.
_road: tuple[EventTap | None, float | None] = (None, None)


@contextlib.contextmanager
def tap_event_road(tap: EventTap | None, ack_timeout_s: float | None = None) -> Iterator[None]:
    """Install ``tap`` (and another acknowledgement timeout) for the listeners made until the block ends."""
    global _road
    before, _road = _road, (tap, ack_timeout_s)
    try:
        yield
    finally:
        _road = before


@dataclasses.dataclass(frozen=True)
class ChannelAddress:
    """Where the controller listens, the workers' token, and their acknowledgement timeout."""

    host: str
    port: int
    token: bytes
    ack_timeout_s: float = ACK_TIMEOUT_S


class Outbox:
    """One worker's events on their way to the controller, numbered and kept until acknowledged:
    ``put`` sends over the connection while it works, else leaves them for ``take`` (the Ray long
    poll). Safe from several threads (the loop and the uploader emit); frames go out whole, in order.
    """

    def __init__(self) -> None:
        self._send_lock = threading.Lock()  # numbers and frames in one order
        self._changed = threading.Condition(threading.Lock())  # guards _kept
        #: (number, when sent, event) not acknowledged yet, oldest first.
        self._kept: collections.deque[tuple[int, float, Any]] = collections.deque()
        self._number = 0
        self._sock: socket.socket | None = None
        self._ack_timeout_s = ACK_TIMEOUT_S
        self._closed = False
        #: When the connection last carried a frame of this worker's (a heartbeat follows silence).
        self._sent_at = 0.0

    @property
    def connected(self) -> bool:
        """Whether events still go over the connection."""
        return self._sock is not None

    def connect(self, address: ChannelAddress, rank: int, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Connect and say hello as ``rank``; raises ``OSError`` when the controller is unreachable."""
        self._ack_timeout_s = address.ack_timeout_s
        sock = socket.create_connection((address.host, address.port), timeout=timeout_s)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in _TCP_OPTIONS.items():
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        sock.sendall(_HELLO.pack(address.token, rank))
        self._sock = sock
        threading.Thread(target=self._watch, args=(sock,), name="flowtrain-event-acks", daemon=True).start()

    def put(self, event: Any) -> None:
        """Number ``event`` and send it (or leave it for the Ray long poll)."""
        payload = dumps_event(event)
        with self._send_lock:
            self._number += 1
            number, sock = self._number, self._sock
            with self._changed:
                self._kept.append((number, time.monotonic(), event))
                if sock is None:
                    self._changed.notify_all()
            if sock is None:
                return
            try:
                sock.sendall(_HEADER.pack(len(payload), number) + payload)
                self._sent_at = time.monotonic()
            except OSError:
                self._give_up(sock)

    def take(self, timeout_s: float, acked: int) -> list[tuple[int, Any]]:
        """The Ray long poll: forget events up to number ``acked``, then wait up to ``timeout_s``
        until events are left for this road and return them all, numbered ([] when none came)."""
        with self._changed:
            self._forget(acked)
            if not self._changed.wait_for(lambda: self._closed or (self._sock is None and self._kept), timeout_s):
                return []
            return [] if self._closed else [(number, event) for number, _, event in self._kept]

    def close(self) -> None:
        """End this outbox's run: its connection closes and a long poll still waiting returns at
        once (a worker kept for the next run must not hold a poll of the last one)."""
        with self._send_lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            _shut(sock)  # its acknowledgement thread sees the end and lets the socket go
        with self._changed:
            self._closed = True
            self._kept.clear()
            self._changed.notify_all()

    def unacknowledged(self) -> list[tuple[int, Any]]:
        """Every event not acknowledged yet, numbered, whichever road it was sent on."""
        with self._changed:
            return [(number, event) for number, _, event in self._kept]

    def _forget(self, acked: int) -> None:
        kept = self._kept
        while kept and kept[0][0] <= acked:
            kept.popleft()

    def _give_up(self, sock: socket.socket, stalled: bool = False) -> None:
        """Leave the connection for the Ray road (the caller holds ``_send_lock``). Said only when
        it stalled: a connection closes or resets quietly every time an attempt ends."""
        if self._sock is not sock:
            return
        self._sock = None
        _shut(sock)
        if stalled:
            print(
                f"flowtrain: the controller acknowledged nothing on this worker's connection for {self._ack_timeout_s:g} s "
                "(a half-open connection, or a controller busy that long); events go through Ray instead",
                file=sys.stderr,
            )
        with self._changed:
            self._changed.notify_all()

    def _send_quietly(self, sock: socket.socket, frame: bytes) -> bool:
        """Send an empty ``frame`` unless a report is being written (it may be stuck; this thread's
        clock is not): False when the connection failed."""
        if not self._send_lock.acquire(blocking=False):
            return True
        try:
            if self._sock is sock:
                sock.sendall(frame)
                self._sent_at = time.monotonic()
        except OSError:
            return False
        finally:
            self._send_lock.release()
        return True

    def _watch(self, sock: socket.socket) -> None:
        """Read and ask for acknowledgements, beat after ``HEARTBEAT_S`` of silence, give up on failure."""
        ask_after = self._ack_timeout_s / 2
        asked_at = 0.0
        answer = bytearray()
        lost = stalled = False
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ)
            while self._sock is sock and not lost:
                if time.monotonic() - self._sent_at >= HEARTBEAT_S:
                    lost = not self._send_quietly(sock, _BEAT)
                if selector.select(min(ask_after / 4, HEARTBEAT_S)):
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if not data:  # closed or reset
                        lost = True
                        break
                    answer += data
                    whole = len(answer) - len(answer) % _ACK.size
                    if whole:
                        (acked,) = _ACK.unpack_from(answer, whole - _ACK.size)
                        del answer[:whole]
                        with self._changed:
                            self._forget(acked)
                        asked_at = 0.0
                with self._changed:
                    oldest = self._kept[0][1] if self._kept else None
                now = time.monotonic()
                if oldest is None or now - oldest < ask_after:
                    continue
                if now - oldest > self._ack_timeout_s:
                    lost = stalled = True
                elif now - asked_at > ask_after and self._send_quietly(sock, _ASK):
                    asked_at = now
        if lost:
            _shut(sock)  # first: it wakes a put stuck in sendall
            with self._send_lock:
                self._give_up(sock, stalled)
        sock.close()


@dataclasses.dataclass(eq=False)
class _Connection:
    sock: socket.socket
    buffer: bytearray = dataclasses.field(default_factory=bytearray)
    rank: int | None = None
    #: The highest event number read on this connection, and the last one acknowledged (when).
    read: int = 0
    acked: int = 0
    acked_at: float = 0.0


class EventListener:
    """The controller's end: accepts the workers' connections, reads and acknowledges their events.
    ``wake()``, from another thread, ends a ``poll`` early; the ``EventTap`` installed when it is
    made (``tap_event_road``) sees every frame it reads."""

    def __init__(self, host: str, connections: int = 0) -> None:
        _allow_open_files(connections + 256)
        self.token = secrets.token_bytes(16)
        self._server = socket.create_server((host, 0), backlog=4096)
        self._server.setblocking(False)
        self._tap, ack_timeout_s = _road
        ack_timeout_s = ACK_TIMEOUT_S if ack_timeout_s is None else ack_timeout_s
        self.address = ChannelAddress(host, self._server.getsockname()[1], self.token, ack_timeout_s)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        #: When a frame last came from each rank on an open connection (heartbeats included).
        self._heard: dict[int, float] = {}

    def heard_at(self, rank: int) -> float | None:
        """When rank ``rank``'s open connection last carried a frame (None: it has none open)."""
        return self._heard.get(rank)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # already closed, or full of wake-ups: poll wakes either way
            self._wake_w.send(b"\0")

    def poll(self, timeout_s: float) -> list[tuple[int, int, Any]]:
        """Wait up to ``timeout_s`` (or until ``wake``); return the ``(rank, number, event)`` read."""
        events: list[tuple[int, int, Any]] = []
        for key, _ in self._selector.select(timeout_s):
            if key.data is None:
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    while self._wake_r.recv(4096):
                        pass
            else:
                self._read(key.data, events)
        return events

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, _Connection(sock))

    def _read(self, conn: _Connection, events: list[tuple[int, int, Any]]) -> None:
        try:
            data = conn.sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
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
        if data:
            self._heard[conn.rank] = time.monotonic()
        asked = False
        while size - offset >= _HEADER.size:
            length, number = _HEADER.unpack_from(conn.buffer, offset)
            end = offset + _HEADER.size + length
            if end > size:
                break
            if not length:
                asked = asked or number == 0  # else a heartbeat: heard, nothing to answer
            else:
                events.append(
                    (conn.rank, number, cloudpickle.loads(memoryview(conn.buffer)[offset + _HEADER.size : end]))
                )
                conn.read = number
                if self._tap is not None and (fate := self._tap.frame_read(conn.rank, number)) is not Fate.READ:
                    self._unregister(conn)  # what follows this frame is never read, nor answered
                    if fate is Fate.DETACH:
                        self._tap.detached(conn.rank, conn.sock)
                    else:
                        conn.sock.close()
                    return
            offset = end
        del conn.buffer[:offset]
        if not data:
            self._drop(conn)
        elif asked or (conn.read > conn.acked and time.monotonic() - conn.acked_at >= ACK_EVERY_S):
            conn.acked, conn.acked_at = conn.read, time.monotonic()
            try:
                if conn.sock.send(_ACK.pack(conn.read)) != _ACK.size:
                    raise OSError("a partial acknowledgement")
            except OSError:  # the worker does not read: it gives the connection up by itself
                self._drop(conn)

    def _unregister(self, conn: _Connection) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)

    def _drop(self, conn: _Connection) -> None:
        self._unregister(conn)
        conn.sock.close()
        if conn.rank is not None:
            self._heard.pop(conn.rank, None)  # a closed connection is no silence: its worker ended, or uses Ray

    def close(self) -> None:
        """Close every connection and stop listening. Safe to call twice."""
        if self._selector.get_map() is None:
            return
        for key in list(self._selector.get_map().values()):
            with contextlib.suppress(OSError):
                cast(socket.socket, key.fileobj).close()  # the server, the wake pipe's end and the connections
        self._selector.close()
        self._wake_w.close()
