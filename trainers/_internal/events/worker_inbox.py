"""Where the events of one attempt's workers arrive at the controller, by two roads: the event
channel's sockets, and one ``next_events`` long poll per worker, watched by a background thread,
which carries the events of a worker that left its socket and turns a worker's (or its node's)
death into a ``FailedEvent``. A rank heard on neither road for the unreachable bound, whose raylet
takes no connection either (a host cut off, which Ray finds a minute later), fails as
"unreachable". A replayed event is applied only when its number is above the highest applied
from that worker; each new long poll acknowledges what the inbox holds from it.
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
from trainers._internal.events.messages import Event, FailedEvent, FinishedEvent, take_events
from trainers.tuning import HEARTBEAT_S, LONG_POLL_S, UNAVAILABLE_GRACE_S


class WorkerInbox:
    """Events from the workers ``actors`` (indexed by world rank), from the socket and from Ray.

    ``died(rank, error)`` turns a Ray error about a worker into its ``FailedEvent``;
    ``unreachable(ranks, silent_s, others_heard)`` gives those of ``ranks`` (silent for
    ``unreachable_s``; 0: never) whose host no longer answers; ``others_heard``: whether other
    ranks were heard meanwhile (else the driver may be the one cut off).
    """

    def __init__(
        self,
        actors: list[Any],
        died: Callable[[int, BaseException], FailedEvent],
        host: str,
        unreachable: Callable[[list[int], float, bool], list[FailedEvent]] | None = None,
        unreachable_s: float = 0.0,
    ) -> None:
        self._actors = actors
        self._died = died
        self._unreachable = unreachable
        self._unreachable_s = unreachable_s if unreachable is not None else 0.0
        #: When each silent rank's host last answered (asked again at most once a second).
        self._answered_at: dict[int, float] = {}
        self._judged_at = 0.0
        #: When an event of each rank last came by Ray's road.
        self._ray_heard: dict[int, float] = {}
        #: Since when the controller has listened without a gap (a busy controller hears nobody:
        #: a rank's silence counts only while it listens), and when it last stopped.
        self._listening_since = self._left_at = time.monotonic()
        self._listener = EventListener(host, connections=len(actors))
        #: (rank, number, event) from the long polls; number None for a failure found here.
        self._from_ray: queue.SimpleQueue[tuple[int, int | None, Event]] = queue.SimpleQueue()
        #: The highest event number applied from each rank.
        self._applied = [0] * len(actors)
        self._ended: set[int] = set()
        self._stopped = False

    @property
    def address(self) -> ChannelAddress:
        """What the workers connect to."""
        return self._listener.address

    def listen(self) -> None:
        """Start the Ray long polls (after the training functions started)."""
        threading.Thread(target=self._watch, name="flowtrain-worker-watch", daemon=True).start()

    def poll(self, timeout_s: float) -> list[Event]:
        """Events that arrived within ``timeout_s`` (returns as soon as there is one)."""
        start = time.monotonic()
        if start - self._left_at > HEARTBEAT_S:
            self._listening_since = start
        try:
            return self._poll(start + timeout_s)
        finally:
            self._left_at = time.monotonic()

    def _poll(self, deadline: float) -> list[Event]:
        while True:
            polled = self._listener.poll(max(0.0, deadline - time.monotonic()))
            from_ray = take_events(self._from_ray, 0.0)
            for rank, _, _ in from_ray:
                self._ray_heard[rank] = time.monotonic()
            events: list[Event] = []
            for rank, number, event in [*polled, *from_ray]:
                if number is None:
                    events.append(event)
                elif number > self._applied[rank]:  # else a replay of an event already applied
                    self._applied[rank] = number
                    events.append(event)
            events += self._silent_ranks()
            for event in events:
                if isinstance(event, (FinishedEvent, FailedEvent)):
                    self._ended.add(event.world_rank)
            if events or time.monotonic() >= deadline:
                return events

    def _silent_ranks(self) -> list[FailedEvent]:
        """The "unreachable" failures of the ranks silent past the bound, once each."""
        bound, now = self._unreachable_s, time.monotonic()
        # Judged twice a second at most: a poll per report must not walk every rank each time.
        if not bound or now - self._listening_since <= bound or now - self._judged_at < 0.5:
            return []
        self._judged_at = now
        assert self._unreachable is not None  # a bound comes with it
        # A rank off its socket (not connected yet, or fallen back to Ray's road) is heard by Ray's.
        heard = {
            rank: self._listener.heard_at(rank) or self._ray_heard.get(rank, self._listening_since)
            for rank in range(len(self._actors))
            if rank not in self._ended
        }
        silent = [rank for rank, at in heard.items() if now - at > bound]
        suspects = [rank for rank in silent if now - self._answered_at.get(rank, 0.0) >= 1.0]
        if not suspects:
            return []
        lost = self._unreachable(suspects, bound, len(silent) < len(heard))
        for rank in set(suspects) - {event.world_rank for event in lost}:
            self._answered_at[rank] = now
        return lost

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
