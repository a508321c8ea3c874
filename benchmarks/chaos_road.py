"""The chaos soak's faults on the event road, planted through flowtrain's public seam
(``trainers.testing.tap_event_road``): the tap below sees every frame the driver's listener reads,
and when a fault armed for that rank is due it has the connection closed ("drop") or handed over
unread and left open ("half-open", what a network blip leaves behind).

It also plants the defect the event road's acknowledgements exist for, so the soak can show it
finds it (``--plant lost-events``): instead of leaving a faulted connection, the tap keeps reading
it and acknowledges every frame without delivering it, so the worker forgets events the controller
never saw, as the road before acknowledgements did when a connection broke with events in flight.
It writes the event channel's acknowledgement (``trainers/_internal/events/event_channel.py``) on its own.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

from benchmarks import chaos_journal

#: The soak's event-road kinds and the tap's name for each.
HOOK_FAULTS = {"event-drop": "drop", "event-half-open": "half-open"}
#: The planted defect this module owns.
LOST_EVENTS = "lost-events"
#: The controller's acknowledgement (the highest event number it read), as the event channel writes it.
_ACK = struct.Struct("!Q")


def available() -> bool:
    """Whether this tree has the event road's tap (``trainers.testing``)."""
    try:
        import trainers.testing  # noqa: F401
    except ImportError:
        return False
    return True


class ConnectionFaults:
    """An ``EventTap``: faults armed per rank, each firing right after a given number of that
    rank's frames. Also what the tests of the event road plant faults with."""

    KINDS = ("drop", "half-open")

    def __init__(self, *, lose_events: bool = False) -> None:
        #: rank -> [fault, frames to let through first].
        self.armed: dict[int, list] = {}
        #: (rank, fault) of every fault that fired, in order.
        self.fired: list[tuple[int, str]] = []
        self.lose_events = lose_events
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()

    def arm(self, rank: int, fault: str, after_frames: int = 0) -> None:
        """Plant ``fault`` on rank ``rank``'s connection: it fires once the listener has read
        ``after_frames`` more of that rank's events, right after the next one (which arrives)."""
        if fault not in self.KINDS:
            raise ValueError(f"arm(fault={fault!r}): must be one of {self.KINDS}")
        self.armed[rank] = [fault, after_frames]

    def frame_read(self, rank: int, number: int):
        from trainers.testing import Fate

        armed = self.armed.get(rank)
        if armed is None:
            return Fate.READ
        if armed[1] > 0:
            armed[1] -= 1
            return Fate.READ
        del self.armed[rank]
        self.fired.append((rank, armed[0]))
        return Fate.CLOSE if armed[0] == "drop" and not self.lose_events else Fate.DETACH

    def detached(self, rank: int, sock: socket.socket) -> None:
        with self._lock:
            self._held.append(sock)
        if self.lose_events:
            threading.Thread(target=_swallow, args=(sock,), name=f"chaos-lost-events-{rank}", daemon=True).start()

    def close(self) -> None:
        """Close the connections it holds (the half-open ones)."""
        with self._lock:
            held, self._held = self._held, []
        for sock in held:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    @contextlib.contextmanager
    def installed(self, ack_timeout_s: float | None = None) -> Iterator[ConnectionFaults]:
        """Tap the listeners made in this block; close what it holds at the end."""
        from trainers.testing import tap_event_road

        try:
            with tap_event_road(self, ack_timeout_s=ack_timeout_s):
                yield self
        finally:
            self.close()


#: What the planted defect acknowledges: every number, so the worker forgets all it keeps.
_EVERYTHING = _ACK.pack(2**63 - 1)


def _swallow(sock: socket.socket) -> None:
    """The planted defect: claim every event the worker kept (those the listener read but never
    acknowledged too), then read its frames and claim each, delivering none."""
    sock.setblocking(True)  # the listener read it without blocking
    try:
        sock.sendall(_EVERYTHING)
        while sock.recv(1 << 20):  # frames or asks for an acknowledgement: all answered alike
            sock.sendall(_EVERYTHING)
    except OSError:
        pass  # closed by the listener's end (ConnectionFaults.close) or by the worker


class Road:
    """The event-road faults planned for one run, armed in this driver as its steps commit.

    A fault planned for step s is armed once step s - 1 is committed (at once when the run
    resumes past it), to fire after ``detail`` more frames of its rank; a rank holds one armed
    fault at a time, so a later one waits for the earlier to fire.
    """

    def __init__(self, faults: list[dict], marks: str, *, plant: str | None = None) -> None:
        self.marks = marks
        self.waiting = [f for f in faults if f["kind"] in HOOK_FAULTS and not chaos_journal.fired(marks, f["id"])]
        self.faults = ConnectionFaults(lose_events=plant == LOST_EVENTS)
        #: Armed faults per rank, oldest first; the tap's ``fired`` entries seen so far.
        self.armed: dict[int, list[dict]] = {}
        self.seen = 0

    def installed(self, ack_timeout_s: float | None = None) -> contextlib.AbstractContextManager:
        """The tap, installed for the ``fit()`` this block runs."""
        return self.faults.installed(ack_timeout_s)

    def committed(self, step: int) -> list[dict]:
        """Step ``step`` was committed: arm what is due; return the faults that fired since the last call."""
        fired = self.collect()
        for fault in list(self.waiting):
            if fault["step"] - 1 <= step and fault["rank"] not in self.faults.armed:
                self.faults.arm(fault["rank"], HOOK_FAULTS[fault["kind"]], after_frames=int(fault["detail"]))
                self.armed.setdefault(fault["rank"], []).append(fault)
                self.waiting.remove(fault)
        return fired

    def collect(self) -> list[dict]:
        """The planned faults that fired since the last call (their markers are set)."""
        fired = []
        for rank, _ in self.faults.fired[self.seen :]:
            fault = self.armed[rank].pop(0)
            chaos_journal.fire(self.marks, fault["id"])
            fired.append(fault)
        self.seen = len(self.faults.fired)
        return fired
