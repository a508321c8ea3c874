"""Retention as pure logic: which checkpoints are kept, for every ordering."""

from __future__ import annotations

import math

import pytest

from storage import CheckpointConfig
from storage.retention import rank_best_first, score_of, select_kept


def checkpoints(scores, key="loss"):
    return [(seq, {key: score}) for seq, score in enumerate(scores)]


def test_without_limit_everything_is_kept():
    assert select_kept(checkpoints([3, 1, 2]), CheckpointConfig()) == {0, 1, 2}


def test_max_order_keeps_the_highest_plus_latest():
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order="max")
    kept = select_kept(checkpoints([0.5, 0.9, 0.7, 0.1], key="acc"), config)
    assert kept == {1, 2, 3}  # the two best (0.9, 0.7) and the latest (0.1): n+1
    assert rank_best_first(checkpoints([0.5, 0.9, 0.7, 0.1], key="acc"), config) == [1, 2, 0, 3]


def test_min_order_and_latest_already_best_gives_exactly_n():
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    assert select_kept(checkpoints([0.5, 0.4, 0.3, 0.2]), config) == {2, 3}


def test_no_attribute_means_most_recent():
    assert select_kept(checkpoints([9, 8, 7, 6, 5]), CheckpointConfig(num_to_keep=3)) == {2, 3, 4}


def test_nested_attribute_and_nan_ranks_last():
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="val/loss", checkpoint_score_order="min")
    items = [(0, {"val": {"loss": math.nan}}), (1, {"val": {"loss": 2.0}}), (2, {"val": {"loss": math.nan}})]
    assert rank_best_first(items, config) == [1, 2, 0]
    assert select_kept(items, config) == {1, 2}  # best (1) + latest (2), never the NaN one in between


def test_ties_go_to_the_more_recent():
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    assert rank_best_first(checkpoints([1.0, 1.0, 1.0]), config)[0] == 2


def test_never_more_than_n_plus_one_and_best_and_latest_survive():
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    scores = [5, 1, 4, 2, 6, 3, 7, 0.5, 8]
    for end in range(1, len(scores) + 1):
        kept = select_kept(checkpoints(scores[:end]), config)
        assert len(kept) <= 3
        best = min(range(end), key=lambda i: scores[i])
        assert best in kept and end - 1 in kept


def test_missing_attribute_lists_reported_keys():
    with pytest.raises(
        KeyError, match=r"checkpoint_score_attribute='val/acc' was not reported.*\['loss', 'val/loss'\]"
    ):
        score_of({"loss": 1, "val": {"loss": 2}}, "val/acc")


def test_a_checkpoint_without_its_score_ranks_last():
    # Its score was to come from a validation that failed or has not ended: ranked, not an error.
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="val/loss", checkpoint_score_order="min")
    items = [(0, {"val": {"loss": 2.0}}), (1, {"loss": 0.1}), (2, {"val": {"loss": 3.0}}), (3, {})]
    assert rank_best_first(items, config) == [0, 2, 3, 1]
    assert select_kept(items, config) == {0, 3}
