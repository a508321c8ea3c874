"""Node preemption, as the training function sees it: ``get_preemption_info()``.

When a node that holds some of the run's workers is drained with a deadline (what a cloud does
before it takes a spot instance back), every worker can learn it from inside its loop, save a
checkpoint in time, and go on: once the node is gone the run restarts on the nodes left and
resumes from that checkpoint, counting ``FailureConfig.max_preemption_failures``.
"""

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


def get_preemption_info() -> PreemptionInfo | None:
    """The preemption coming to a node of this run, or None while there is none.

    Call it in the training loop, for example once a step, and save a checkpoint when it stops
    being None::

        if trainers.get_preemption_info() is not None and not saved:
            trainers.report(metrics, checkpoint=Checkpoint.from_directory(folder))
            saved = True

    Every worker must call it the same number of times: it waits for all of them (like
    ``trainers.collective.barrier()``) so that they all get the same answer, rank 0's, and
    therefore all take the same branch. Outside ``train_loop_per_worker`` it raises RuntimeError.
    """
    from trainers._internal.session import get_session

    session = get_session("get_preemption_info")
    return session.synchronize(session.preemption_info, "get_preemption_info")
