"""The chaos soak's one adapter to the event road's fault hook (test-only, in
``trainers._internal.event_channel``).

What it expects of the hook, and all it uses: a module-level ``FAULTS`` in that module with
``arm(rank, fault, after_frames)`` (``fault`` "drop" or "half-open": after letting
``after_frames`` more of that rank's event frames through, the controller's listener closes that
rank's connection, or stops reading it without closing it, right after the next frame, which
arrives), ``armed`` (rank -> what is armed), ``fired`` (``(rank, fault)`` in the order they
fired), and ``acks`` (False: the road before acknowledgements, read when a listener starts);
and the module's ``ACK_TIMEOUT_S`` (seconds an event may stay unacknowledged before its worker
gives the connection up). All of it lives in the driver's process, where the listener runs.
"""

from __future__ import annotations

from typing import Any

from benchmarks import chaos_journal

#: The soak's event-road kinds and the hook's name for each.
HOOK_FAULTS = {"event-drop": "drop", "event-half-open": "half-open"}


def hook() -> Any:
    """The event channel's ``FAULTS``, or None when this tree's event channel has no fault hook."""
    from trainers._internal import event_channel

    return getattr(event_channel, "FAULTS", None)


def available() -> bool:
    """Whether the event-road faults and the acknowledgement switch can run on this tree."""
    return hook() is not None


class Road:
    """The event-road faults planned for one run, armed in this driver as its steps commit.

    A fault planned for step s is armed once step s - 1 is committed (at once when the run
    resumes past it), to fire after ``detail`` more frames of its rank; a rank holds one armed
    fault at a time, so a later one waits for the earlier to fire.
    """

    def __init__(
        self, faults: list[dict], marks: str, *, acks: bool = True, ack_timeout_s: float | None = None
    ) -> None:
        self.marks = marks
        self.waiting = [f for f in faults if f["kind"] in HOOK_FAULTS and not chaos_journal.fired(marks, f["id"])]
        self.faults = hook()
        if self.faults is None:
            if self.waiting or not acks:
                raise RuntimeError(
                    "this tree's trainers/_internal/event_channel.py has no FAULTS hook: the event-road faults "
                    "and --acks off need it (see benchmarks/chaos_road.py for what it must offer)"
                )
            return
        self.faults.reset()
        self.faults.acks = acks
        if ack_timeout_s is not None:
            from trainers._internal import event_channel

            event_channel.ACK_TIMEOUT_S = ack_timeout_s
        #: Armed faults per rank, oldest first; the hook's ``fired`` entries seen so far.
        self.armed: dict[int, list[dict]] = {}
        self.seen = 0

    def committed(self, step: int) -> list[dict]:
        """Step ``step`` was committed: arm what is due; return the faults that fired since the last call."""
        if self.faults is None:
            return []
        fired = self.collect()
        for fault in list(self.waiting):
            if fault["step"] - 1 <= step and fault["rank"] not in self.faults.armed:
                self.faults.arm(fault["rank"], HOOK_FAULTS[fault["kind"]], after_frames=int(fault["detail"]))
                self.armed.setdefault(fault["rank"], []).append(fault)
                self.waiting.remove(fault)
        return fired

    def collect(self) -> list[dict]:
        """The planned faults that fired since the last call (their markers are set)."""
        if self.faults is None:
            return []
        fired = []
        for rank, _ in self.faults.fired[self.seen :]:
            fault = self.armed[rank].pop(0)
            chaos_journal.fire(self.marks, fault["id"])
            fired.append(fault)
        self.seen = len(self.faults.fired)
        return fired
