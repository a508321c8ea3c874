"""Node preemption, as the training function sees it: the ``PreemptionInfo`` that
``trainers.get_preemption_info()`` returns (docs/fault-tolerance.md)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PreemptionInfo:
    """A preemption on its way.

    ``deadline_ms`` is when the first of the preempted nodes goes away (UNIX time in
    milliseconds), or None when the drain gave no deadline. ``preempted_node_to_ranks`` maps each
    preempted node's id to the world ranks of this run's workers on it.
    """

    deadline_ms: int | None
    preempted_node_to_ranks: dict[str, list[int]]

    @property
    def preempted_node_ids(self) -> list[str]:
        """The ids of the preempted nodes, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list[int]:
        """The world ranks on the preempted nodes, sorted."""
        return sorted({rank for ranks in self.preempted_node_to_ranks.values() for rank in ranks})
