"""CheckpointConfig: how many checkpoints a run keeps, and which ones."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

#: The default of Ray's V1 parameters that V2 (and flowtrain) no longer take: this value means
#: "not given", anything else is a leftover that gets a migration message.
DEPRECATED = "DEPRECATED"

#: Where Ray Train explains its V2 changes; every migration message points there.
MIGRATION_GUIDE = "https://github.com/ray-project/ray/issues/49454"


def deprecated(field: str, instead: str) -> DeprecationWarning:
    """The error for a V1 parameter: raised, as Ray raises it, so old code stops where it must change."""
    return DeprecationWarning(
        f"{field} is no longer supported (Ray Train V2 dropped it). {instead} More: {MIGRATION_GUIDE}"
    )


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Which committed checkpoints a run keeps on storage.

    With ``num_to_keep=n`` the run keeps the n best checkpoints by ``checkpoint_score_attribute``
    (the most recent ones when no attribute is set) plus the latest one when it is not among them,
    so at most n+1. Everything else is deleted after the run's state names what is kept.
    """

    #: How many of the best checkpoints to keep; None keeps all.
    num_to_keep: int | None = None
    #: The reported metric that ranks checkpoints; nested metrics as ``"outer/inner"``. None: recency.
    checkpoint_score_attribute: str | None = None
    #: "max" keeps the highest scores, "min" the lowest.
    checkpoint_score_order: Literal["max", "min"] = "max"
    #: Removed in Ray Train V2: call ``report(..., checkpoint=...)`` when you want a checkpoint.
    checkpoint_frequency: Any = DEPRECATED
    #: Removed in Ray Train V2: report a checkpoint after your last step yourself.
    checkpoint_at_end: Any = DEPRECATED

    def __post_init__(self) -> None:
        for field in ("checkpoint_frequency", "checkpoint_at_end"):
            if getattr(self, field) != DEPRECATED:
                raise deprecated(
                    f"CheckpointConfig({field}=...)",
                    "The training function decides when to checkpoint: pass checkpoint= to report() "
                    "at the steps (and at the end) where you want one.",
                )
        n = self.num_to_keep
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"CheckpointConfig.num_to_keep={n!r}: must be None or an integer >= 1.")
        attribute = self.checkpoint_score_attribute
        if attribute is not None and (not isinstance(attribute, str) or not attribute):
            raise ValueError(
                f"CheckpointConfig.checkpoint_score_attribute={attribute!r}: must be None or a metric name."
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                f"CheckpointConfig.checkpoint_score_order={self.checkpoint_score_order!r}: must be 'max' or 'min'."
            )
