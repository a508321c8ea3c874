"""Seams for testing flowtrain, and programs built on it, under faults (flowtrain's own; Ray Train
has no counterpart). Nothing here does anything until a test installs it, and nothing of it
reaches the workers.

The event road: every worker writes its reports and other events to one connection that the
driver reads (see ``docs/design.md``, "the report path"). To see what a broken or half-open
connection does to a run, install an ``EventTap`` around ``fit()``::

    import socket
    from trainers.testing import Fate, tap_event_road

    class DropRankOneOnce:
        def __init__(self):
            self.fired = False

        def frame_read(self, rank: int, number: int) -> Fate:
            if rank == 1 and not self.fired:
                self.fired = True
                return Fate.CLOSE  # the events rank 1 sent after this one are lost on the socket
            return Fate.READ

        def detached(self, rank: int, sock: socket.socket) -> None:
            sock.close()

    with tap_event_road(DropRankOneOnce(), ack_timeout_s=2.0):
        result = trainer.fit()  # every report still arrives once: rank 1 replays over Ray

The tap runs in the driver's process, on the thread that reads the connections: keep it quick.
``ack_timeout_s`` shortens how long a worker waits for an acknowledgement before it leaves a
connection that is never read (``Fate.DETACH``) for Ray (default 15 s).
"""

from __future__ import annotations

from trainers._internal.event_channel import EventTap, Fate, tap_event_road

__all__ = ["EventTap", "Fate", "tap_event_road"]
