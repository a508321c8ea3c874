"""Which committed checkpoints to keep (pure functions; no I/O)."""

from __future__ import annotations

import math
from typing import Any, Sequence

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


def rank_best_first(
    checkpoints: Sequence[tuple[int, dict[str, Any]]], config: CheckpointConfig
) -> list[int]:
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


def select_kept(checkpoints: Sequence[tuple[int, dict[str, Any]]], config: CheckpointConfig) -> set[int]:
    """The checkpoints to keep: the ``num_to_keep`` best, plus the latest when it is not among them.

    So never more than ``num_to_keep + 1``, the best and the latest always survive, and with
    ``num_to_keep=None`` everything is kept.
    """
    seqs = [seq for seq, _ in checkpoints]
    if config.num_to_keep is None or not seqs:
        return set(seqs)
    kept = set(rank_best_first(checkpoints, config)[: config.num_to_keep])
    kept.add(max(seqs))
    return kept
