"""The timeline picture a person reads (issue 62): on timelines shaped like a healthy 2-rank run,
a run with a straggler and a run with a restart, every rank's row has a visible mark for every
round, the legend names every kind of mark drawn, and no text is drawn over the plot, the legend
or other text (``tests/picture_checks.py``). tests/test_run_health.py checks the pictures of real
runs of each kind the same way."""

from __future__ import annotations

import pytest

from picture_checks import assert_readable
from storage.health import Timeline, TimelineMark, TimelineRound


def _rounds(attempt: int, start: float, count: int, steps: tuple[float, ...], every: float = 0.25):
    """``count`` rounds from ``start``, a checkpoint every 4th, the first unmeasured (as a run's are)."""
    return [
        TimelineRound(
            round(start + every * i, 4), attempt, i, i % 4 == 3, tuple(None for _ in steps) if i == 0 else steps
        )
        for i in range(count)
    ]


HEALTHY = Timeline(
    "healthy",
    2,
    (("starting", 0.0, 10.0), ("training", 10.0, 28.0), ("waiting", 28.0, 28.2)),
    (),
    tuple(_rounds(1, 12.0, 8, (0.01, 0.012), every=2.2)),
    (),
)
STRAGGLER = Timeline(
    "straggler",
    2,
    (("starting", 0.0, 2.8), ("training", 2.8, 12.2), ("waiting", 12.2, 12.5)),
    (),
    tuple(_rounds(1, 3.0, 30, (0.1, 0.17)) + _rounds(1, 10.5, 4, (0.1, 0.3))[1:]),
    (TimelineMark(4.8, 1, 1, "straggler"),),
)
RESTART = Timeline(
    "restart",
    2,
    (
        ("starting", 0.0, 1.8),
        ("training", 1.8, 4.4),
        ("restarting", 4.4, 5.3),
        ("training", 5.3, 6.6),
        ("waiting", 6.6, 6.8),
    ),
    ((2.75, 4.4),),
    tuple(_rounds(1, 2.0, 9, (0.05, 0.2)) + _rounds(2, 5.5, 4, (0.05, 0.2))),
    (TimelineMark(3.3, 1, 1, "straggler"), TimelineMark(4.4, 1, 1, "error"), TimelineMark(4.4, 1, 0, "died")),
)


@pytest.mark.parametrize("timeline", [HEALTHY, STRAGGLER, RESTART], ids=lambda t: t.run_name)
def test_every_rank_row_shows_every_round_and_the_legend_names_every_mark(timeline):
    drawn = assert_readable(timeline)
    (legend,) = drawn.legends
    labels = [text.get_text() for text in legend.get_texts()]
    if timeline is HEALTHY:  # nothing slow: the legend does not list what is not there
        assert "step near the median rank's" in labels and not any("median" in x and "x" in x[-8:] for x in labels)
        assert "checkpoint committed" in labels and "step not measured (an attempt's first)" in labels
    if timeline is STRAGGLER:
        assert {"step 1.25-2x the median", "step over 2x the median", "named a straggler"} <= set(labels)
    if timeline is RESTART:
        assert {"rolled back (trained again)", "rank failed: error", "rank failed: died", "restarting"} <= set(labels)
        (top,) = drawn.axes[0].child_axes  # the attempts, named above the plot
        assert [t.get_text() for t in top.get_xticklabels()] == ["attempt 1", "attempt 2"]


def test_attempts_that_start_close_together_are_not_named_over_each_other_and_many_ranks_stay_readable():
    rounds = []
    for attempt in range(1, 5):  # four attempts within a second of a 60-second run
        rounds += _rounds(attempt, 30.0 + 0.3 * attempt, 2, tuple(0.01 for _ in range(64)), every=0.1)
    rounds += _rounds(5, 40.0, 400, tuple(0.01 * (3 if rank == 7 else 1) for rank in range(64)), every=0.05)
    timeline = Timeline(
        "crowded",
        64,
        (("starting", 0.0, 30.0), ("training", 30.0, 60.0), ("waiting", 60.0, 60.1)),
        (),
        tuple(rounds),
        (),
    )
    drawn = assert_readable(timeline)
    (top,) = drawn.axes[0].child_axes
    assert [t.get_text() for t in top.get_xticklabels()] == ["attempt 1", "attempt 5"]  # 2 to 4 would run into 1
    ranks = [t.get_text() for t in drawn.axes[0].get_yticklabels() if t.get_text().startswith("rank")]
    assert ranks[:3] == ["rank 0", "rank 4", "rank 8"] and len(ranks) == 16  # every 4th of 64 labelled


def test_a_step_slower_by_less_than_the_straggler_gap_is_not_drawn_as_slow():
    # 3 ms against 1 ms is three times the median, but no news (the straggler judge says so too).
    timeline = Timeline("tiny", 2, (("training", 0.0, 2.0),), (), tuple(_rounds(1, 0.5, 4, (0.001, 0.003))), ())
    drawn = assert_readable(timeline)
    assert {c.get_gid() for c in drawn.axes[0].collections} == {
        "step near the median rank's",
        "step not measured (an attempt's first)",
    }
