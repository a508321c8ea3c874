"""CheckpointConfig: how many checkpoints a run keeps, and which ones."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True, kw_only=True)
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

    def __post_init__(self) -> None:
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
