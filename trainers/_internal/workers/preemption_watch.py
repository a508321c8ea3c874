"""Noticing that a node of the run is being preempted, and deciding when the wait for it is over.

A cloud that takes a spot instance back first drains its Ray node with a deadline. The driver
asks Ray which nodes are draining (from the controller's poll); when one holds workers of the
attempt, every worker is told (``get_preemption_info()``) and the controller gets a ``PreemptionNotice``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from trainers._internal.ray_private import draining_nodes
from trainers.preemption import PreemptionInfo
from trainers.tuning import PREEMPTION_DEFAULT_DEADLINE_S, PREEMPTION_POLL_S


@dataclasses.dataclass(frozen=True)
class PreemptionNotice:
    """Nodes holding workers of this attempt are being drained (an event for the controller)."""

    info: PreemptionInfo


def merge(old: PreemptionInfo | None, new: PreemptionInfo) -> PreemptionInfo:
    """One notice covering the nodes of both, with the earlier deadline."""
    if old is None:
        return new
    nodes = {node: set(ranks) for node, ranks in old.preempted_node_to_ranks.items()}
    for node, ranks in new.preempted_node_to_ranks.items():
        nodes.setdefault(node, set()).update(ranks)
    deadlines = [d for d in (old.deadline_ms, new.deadline_ms) if d is not None]
    return PreemptionInfo(min(deadlines, default=None), {node: sorted(ranks) for node, ranks in nodes.items()})


def deadline_passed(info: PreemptionInfo, noticed_at_s: float, grace_s: float, now_s: float) -> bool:
    """Whether the preempted nodes' deadline plus ``grace_s`` has passed (times in UNIX seconds);
    a drain without a deadline gets ``PREEMPTION_DEFAULT_DEADLINE_S`` from when it was noticed."""
    deadline_s = (
        info.deadline_ms / 1000 if info.deadline_ms is not None else noticed_at_s + PREEMPTION_DEFAULT_DEADLINE_S
    )
    return now_s >= deadline_s + grace_s


class DrainWatch:
    """Watches the nodes of one attempt for drains; ``check()`` answers each new one once."""

    def __init__(
        self,
        node_to_ranks: dict[str, list[int]],
        *,
        source: Callable[[], dict[str, int]] = draining_nodes,
        poll_s: float = PREEMPTION_POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_to_ranks = {node: sorted(ranks) for node, ranks in node_to_ranks.items()}
        self.source = source
        self.poll_s = poll_s
        self.clock = clock
        self._last_poll = float("-inf")
        self._seen: dict[str, int] = {}

    def check(self) -> PreemptionInfo | None:
        """The preemption of the nodes drained since the last answer, or None (at most one call
        to Ray per ``poll_s``; a failing call is retried at the next)."""
        now = self.clock()
        if now - self._last_poll < self.poll_s:
            return None
        self._last_poll = now
        try:
            drained = {node: deadline for node, deadline in self.source().items() if node in self.node_to_ranks}
        except Exception:  # noqa: BLE001 - a passing GCS hiccup must not end the run; ask again
            return None
        new = {node: deadline for node, deadline in drained.items() if self._seen.get(node) != deadline}
        self._seen = drained
        if not new:
            return None
        deadlines = [deadline for deadline in new.values() if deadline]  # Ray's 0 means "no deadline"
        return PreemptionInfo(
            deadline_ms=min(deadlines) if deadlines else None,
            preempted_node_to_ranks={node: self.node_to_ranks[node] for node in sorted(new)},
        )
