"""The timeline picture (docs/health.md, "The timeline picture", says what it shows): one row per
rank, the phases in a band on top, a tick per committed round coloured by its step against the
median rank's. Drawn 870 px wide (Prefect's artifact page in a 1,400 px window; its newer UI scales
it to about 690 px) with 10 pt text, by matplotlib's object API (no pyplot, no display).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from storage.health import Timeline
from trainers.tuning import STRAGGLER_MIN_GAP_S

WIDTH_IN, DPI, FONT_PT = 8.7, 100, 10
#: Phases by name: what the legend says, and the colour (Okabe-Ito, told apart by colour-blind readers).
PHASES = {
    "starting": ("starting", "#999999"),
    "training": ("training", "#009E73"),
    "restarting": ("restarting", "#E69F00"),
    "waiting": ("waiting (the run's end)", "#CCCCCC"),
}
#: A rank's step against the median rank's: (slower by at most this ratio, legend, colour). A step
#: less than ``STRAGGLER_MIN_GAP_S`` over the median counts as near it, as the straggler judge has it.
#: The marks on the rank rows contrast with the white page at least 3:1 (WCAG's bar for graphics).
STEP_CLASSES = (
    (1.25, "step near the median rank's", "#0072B2"),
    (2.0, "step 1.25-2x the median", "#B86E00"),
    (math.inf, "step over 2x the median", "#C0002A"),
)
UNMEASURED = ("step not measured (an attempt's first)", "#777777")
CHECKPOINT = ("checkpoint committed", "#555555")
ROLLED_BACK = ("rolled back (trained again)", "#C0002A")
STRAGGLER = ("named a straggler", "#AA4499")
FAILURE_COLOUR = "#000000"
#: Each failure kind's own marker (a kind not named here: "X"), so that two kinds never share one.
FAILURE_MARKERS = {"error": "X", "died": "s", "hung": "h", "preempted": "D", "unreachable": "v"}
#: Failures and stragglers sit this far above their rank's row, clear of its ticks.
EVENT_LIFT = 0.3
#: Rank rows labelled at most: past this, every k-th rank is.
MOST_RANK_LABELS = 16


def draw(timeline: Timeline, out: str, *, title: str = "") -> None:
    """Draw ``timeline`` as a PNG at the local path ``out``."""
    figure(timeline, title=title).savefig(out, format="png")


def figure(timeline: Timeline, *, title: str = "") -> Any:
    """The picture of ``timeline`` as a matplotlib ``Figure``. Each artist drawn for the legend has
    that legend entry's label as its gid (what tests read back)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ranks = max(timeline.world_size, 1 + max((m.rank for m in timeline.marks), default=-1), 1)
    legend: dict[str, Any] = {}  # label -> handle, in the order first drawn
    row_in = max(0.14, min(0.3, 6 / ranks))
    figure = Figure(figsize=(WIDTH_IN, 2.6 + row_in * ranks), dpi=DPI, layout="constrained")
    axes = figure.add_subplot()
    band = -1.0  # the phase band's row, above rank 0
    for phase, start, end in timeline.phases:
        label, colour = PHASES.get(phase, (phase, "#999999"))
        axes.barh(band, end - start, left=start, height=0.6, color=colour, gid=label)
        legend.setdefault(label, Patch(color=colour, label=label))
    for start, end in timeline.rolled_back:
        label, colour = ROLLED_BACK
        axes.barh(band, end - start, left=start, height=0.6, fill=False, hatch="///", edgecolor=colour, gid=label)
        legend.setdefault(label, Patch(fill=False, hatch="///", edgecolor=colour, label=label))
    for t in (row.t for row in timeline.rounds if row.checkpoint):
        label, colour = CHECKPOINT
        axes.axvline(t, color=colour, linestyle="--", linewidth=0.9, zorder=1, gid=label)
        legend.setdefault(label, Line2D([], [], color=colour, linestyle="--", label=label))
    tick_pt = min(11.0, 0.7 * row_in * 72)  # three quarters of a row high at most: rows stay apart
    for (label, colour), (xs, ys) in _round_ticks(timeline).items():
        axes.scatter(xs, ys, marker="|", s=tick_pt**2, linewidths=2.2, color=colour, zorder=3, gid=label)
        legend.setdefault(label, Line2D([], [], marker="|", markersize=11, mew=2.2, ls="", color=colour, label=label))
    for mark in (m for m in timeline.marks if m.rank >= 0):
        straggler = mark.what == "straggler"
        label, colour = STRAGGLER if straggler else (f"rank failed: {mark.what}", FAILURE_COLOUR)
        marker = "^" if straggler else FAILURE_MARKERS.get(mark.what, "X")
        y = mark.rank - EVENT_LIFT
        axes.scatter([mark.t], [y], marker=marker, s=90, color=colour, edgecolors="white", zorder=4, gid=label)
        legend.setdefault(label, Line2D([], [], marker=marker, markersize=9, ls="", color=colour, label=label))
    span = max((end for _, _, end in timeline.phases), default=1.0) or 1.0
    _name_attempts(axes, timeline, span)
    labelled = range(0, ranks, math.ceil(ranks / MOST_RANK_LABELS))
    axes.set_yticks([band, *labelled], ["phases", *(f"rank {rank}" for rank in labelled)], fontsize=FONT_PT)
    axes.set_ylim(ranks - 0.4, band - 0.6)
    axes.set_xlim(0, span)
    axes.tick_params(axis="x", labelsize=FONT_PT)
    axes.set_xlabel("seconds since the run's controller started", fontsize=FONT_PT)
    axes.set_title(title or f"{timeline.run_name}: timeline", fontsize=FONT_PT + 1, loc="left")
    axes.grid(axis="x", alpha=0.3)
    columns = 2
    figure.set_figheight(figure.get_figheight() + 0.22 * math.ceil(len(legend) / columns))
    figure.legend(
        handles=list(legend.values()), loc="outside lower left", ncols=columns, fontsize=FONT_PT, frameon=False
    )
    return figure


def _round_ticks(timeline: Timeline) -> dict[tuple[str, str], tuple[list[float], list[int]]]:
    """Every rank's tick of every round, by the (label, colour) of its step's class."""
    ticks: dict[tuple[str, str], tuple[list[float], list[int]]] = {}
    for row in timeline.rounds:
        measured = [step for step in row.steps if step is not None]
        median = statistics.median_low(measured) if measured else None
        for rank, step in enumerate(row.steps):
            if step is None or median is None:
                kind = UNMEASURED
            else:
                ratio = step / median if median > 0 and step - median >= STRAGGLER_MIN_GAP_S else 1.0
                kind = next((label, colour) for most, label, colour in STEP_CLASSES if ratio <= most)
            xs, ys = ticks.setdefault(kind, ([], []))
            xs.append(row.t)
            ys.append(rank)
    return ticks


def _name_attempts(axes: Any, timeline: Timeline, span: float) -> None:
    """Each attempt's number above the plot (``span`` seconds wide), at its first round; one that
    would run into the previous label is left out (its restart shows in the phase band)."""
    firsts = {row.attempt: row.t for row in reversed(timeline.rounds)}  # each attempt's first round wins
    # A label's width in seconds: about 0.6 em a character, over the plot's ~0.82 of the figure's width.
    per_char_s = 0.6 * FONT_PT / 72 / (0.82 * WIDTH_IN) * span
    ticks: list[float] = []
    labels: list[str] = []
    for attempt, t in sorted(firsts.items()):
        label = f"attempt {attempt}"
        if ticks and t - ticks[-1] < per_char_s * (len(labels[-1]) + len(label)) / 2 + per_char_s:
            continue
        ticks.append(t)
        labels.append(label)
    axes.secondary_xaxis("top").set_xticks(ticks, labels, fontsize=FONT_PT)
