"""Where the events of one attempt's workers arrive at the controller, by either of two roads:
the event channel's sockets (``event_channel``), and one outstanding ``next_events`` long poll per
worker, watched by a background thread, which carries the events of a worker that left its socket
and turns a worker's death (or its node's, which closes no socket) into a ``FailedEvent``. A
replayed event comes twice: the inbox applies one only when its number is above the highest it
applied from that worker, and each new long poll acknowledges what the inbox holds from it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from trainers._internal.events.event_channel import ChannelAddress, EventListener
from trainers._internal.events.messages import Event, FailedEvent, FinishedEvent
from trainers.tuning import LONG_POLL_S, UNAVAILABLE_GRACE_S


class WorkerInbox:
    """Events from the workers ``actors`` (indexed by world rank), from the socket and from Ray.

    ``died(rank, error)`` turns a Ray error about a worker into its ``FailedEvent``.
    """

    def __init__(self, actors: list[Any], died: Callable[[int, BaseException], FailedEvent], host: str) -> None:
        self._actors = actors
        self._died = died
        self._listener = EventListener(host, connections=len(actors))
        #: (rank, number, event) from the long polls; number None for a failure found here.
        self._from_ray: queue.SimpleQueue[tuple[int, int | None, Event]] = queue.SimpleQueue()
        #: The highest event number applied from each rank.
        self._applied = [0] * len(actors)
        self._ended: set[int] = set()
        self._stopped = False
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> ChannelAddress:
        """What the workers connect to."""
        return self._listener.address

    def listen(self) -> None:
        """Start the Ray long polls (after the training functions started)."""
        self._thread = threading.Thread(target=self._watch, name="flowtrain-worker-watch", daemon=True)
        self._thread.start()

    def poll(self, timeout_s: float) -> list[Event]:
        """Events that arrived within ``timeout_s`` (returns as soon as there is one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            polled = self._listener.poll(max(0.0, deadline - time.monotonic()))
            received: list[tuple[int, int | None, Any]] = list(polled)  # and Ray's, numbered None
            while True:
                try:
                    received.append(self._from_ray.get_nowait())
                except queue.Empty:
                    break
            events: list[Event] = []
            applied = self._applied
            for rank, number, event in received:
                if number is None:
                    events.append(event)
                elif number > applied[rank]:  # else a replay of an event already applied
                    applied[rank] = number
                    events.append(event)
            for event in events:
                if isinstance(event, (FinishedEvent, FailedEvent)):
                    self._ended.add(event.world_rank)
            if events or time.monotonic() >= deadline:
                return events

    def offer(self, rank: int, numbered: list[tuple[int, Event]]) -> None:
        """Events of ``rank`` fetched outside both roads (its unacknowledged ones, taken when an
        attempt ends): applied like a long poll's, once each."""
        for number, event in numbered:
            self._from_ray.put((rank, number, event))
        self._listener.wake()

    def close(self) -> None:
        """Stop listening; the watcher thread ends once its current wait returns."""
        self._stopped = True
        self._listener.close()

    # -- the Ray road (runs in the watcher thread) ----------------------------------------------

    def _watch(self) -> None:
        inflight: dict[Any, int] = {}
        unavailable_since: dict[int, float] = {}

        #: The highest event number received from each rank by this road.
        received = [0] * len(self._actors)

        def listen(rank: int) -> None:
            acked = max(received[rank], self._applied[rank])
            inflight[self._actors[rank].next_events.remote(LONG_POLL_S, acked)] = rank

        try:
            for rank in range(len(self._actors)):
                listen(rank)
            while inflight and not self._stopped:
                refs = list(inflight)
                ready, _ = ray.wait(refs, num_returns=1, timeout=LONG_POLL_S)
                if ready:
                    more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                    ready = more or ready
                delivered = False
                for ref in ready:
                    rank = inflight.pop(ref)
                    try:
                        batch = ray.get(ref)
                    except ActorUnavailableError as error:
                        since = unavailable_since.setdefault(rank, time.monotonic())
                        if time.monotonic() - since > UNAVAILABLE_GRACE_S:
                            self._from_ray.put((rank, None, self._died(rank, error)))
                            delivered = True
                        else:
                            time.sleep(0.2)  # not dead: ask again shortly, no restart spent yet
                            listen(rank)
                        continue
                    except (RayActorError, RayTaskError) as error:
                        if rank not in self._ended:
                            self._from_ray.put((rank, None, self._died(rank, error)))
                            delivered = True
                        continue
                    unavailable_since.pop(rank, None)
                    for number, event in batch:
                        self._from_ray.put((rank, number, event))
                        received[rank] = max(received[rank], number)
                    delivered = delivered or bool(batch)
                    ended = any(isinstance(event, (FinishedEvent, FailedEvent)) for _, event in batch)
                    if not ended and rank not in self._ended:
                        listen(rank)
                if delivered and not self._stopped:
                    self._listener.wake()
        except Exception:  # Ray shutting down under a stopped inbox; nothing to tell
            if not self._stopped:
                raise
