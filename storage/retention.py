"""Which committed checkpoints to keep (pure functions; no I/O)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from typing import Any

from storage.config import CheckpointConfig


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"val": {"loss": 1}}`` -> ``{"val/loss": 1}``, Ray Train's naming of nested metrics."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def score_of(metrics: dict[str, Any], attribute: str) -> Any:
    """The value of ``attribute`` (``"a/b"`` for nested) in ``metrics``; KeyError naming the keys."""
    flat = flatten(metrics)
    if attribute in flat:
        return flat[attribute]
    raise KeyError(
        f"CheckpointConfig.checkpoint_score_attribute={attribute!r} was not reported with this checkpoint; "
        f"reported keys: {sorted(flat)}."
    )


def _rank_key(score: Any, order: str) -> tuple[int, float]:
    """Sort key, best first: NaN, non-numbers and no score at all (None) rank last."""
    if isinstance(score, bool) or not isinstance(score, (int, float)) or math.isnan(score):
        return (1, 0.0)
    return (0, -score if order == "max" else score)


def rank_best_first(checkpoints: Sequence[tuple[int, dict[str, Any]]], config: CheckpointConfig) -> list[int]:
    """Checkpoint sequence numbers ordered best first.

    With a score attribute: by score in ``checkpoint_score_order``, ties to the more recent; NaN,
    a non-number and a checkpoint without the score (its validation failed or has not ended) rank
    last. Without one: the most recent first.
    """
    attribute = config.checkpoint_score_attribute
    if attribute is None:
        return [seq for seq, _ in sorted(checkpoints, key=lambda c: -c[0])]
    order = config.checkpoint_score_order
    keyed = [(_rank_key(flatten(metrics).get(attribute), order), -seq, seq) for seq, metrics in checkpoints]
    return [seq for _, _, seq in sorted(keyed)]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What retention decided for one checkpoint, and why, in a few words a table can show beside
    "kept" or "dropped" (so ``why`` does not say which again)."""

    kept: bool
    why: str


def decide(
    checkpoints: Sequence[tuple[int, dict[str, Any]]], config: CheckpointConfig, *, exempt: Collection[int] = ()
) -> dict[int, Decision]:
    """Keep or drop each checkpoint, with the reason: the ``num_to_keep`` best, plus the latest when
    it is not among them, plus the ``exempt`` ones (waiting for their validation).

    So never more than ``num_to_keep + 1`` besides the exempt, the best and the latest always
    survive, and with ``num_to_keep=None`` everything is kept.
    """
    n, scored = config.num_to_keep, config.checkpoint_score_attribute is not None
    if n is None:
        return {seq: Decision(True, "num_to_keep is not set: all are kept") for seq, _ in checkpoints}
    latest = max((seq for seq, _ in checkpoints), default=None)
    decided = {}
    for place, seq in enumerate(rank_best_first(checkpoints, config), start=1):
        if place <= n:
            among = f"{_ordinal(place)} best" if scored else f"{_ordinal(place)} most recent"
            decided[seq] = Decision(True, among + (", and the latest" if seq == latest and scored else ""))
        elif seq == latest:
            decided[seq] = Decision(True, "the latest (resume needs it)")
        elif seq in exempt:
            decided[seq] = Decision(True, "its validation has not ended")
        else:
            decided[seq] = Decision(False, f"not among the best {n}" if scored else f"older than the {n} most recent")
    return decided


def _ordinal(place: int) -> str:
    """ "the" for the first, then "2nd", "3rd", "4th", ... ("the best", "2nd best")."""
    if place == 1:
        return "the"
    suffix = "th" if 10 <= place % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(place % 10, "th")
    return f"{place}{suffix}"


def select_kept(checkpoints: Sequence[tuple[int, dict[str, Any]]], config: CheckpointConfig) -> set[int]:
    """The sequence numbers ``decide`` keeps."""
    return {seq for seq, decision in decide(checkpoints, config).items() if decision.kept}


def describe_rule(config: CheckpointConfig) -> str:
    """What retention keeps, in words: "the best 2 by valid_loss (min), plus the latest"."""
    if config.num_to_keep is None:
        return "every checkpoint (num_to_keep is not set)"
    if config.checkpoint_score_attribute is None:
        return f"the {config.num_to_keep} most recent (no score_attribute)"
    by = f"{config.checkpoint_score_attribute} ({config.checkpoint_score_order})"
    return f"the best {config.num_to_keep} by {by}, plus the latest (resume needs it)"
