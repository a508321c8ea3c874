"""The timeline picture: one row per rank, time along the bottom, the run's phases in a band on
top. Each committed round is a dot on every rank's row, coloured by how that rank's step compared
with the median rank's (a straggler's row turns orange and red); checkpoints are dashed lines,
failures red crosses, stragglers' episodes orange triangles, and training thrown away by a
failure is hatched in the phase band. Drawn with matplotlib (Agg, no display)."""

from __future__ import annotations

import statistics
from typing import Any

from storage.health import Timeline

PHASE_COLOURS = {"starting": "#999999", "training": "#009E73", "restarting": "#E69F00", "waiting": "#CCCCCC"}
FAILURE_COLOUR, STRAGGLER_COLOUR, CHECKPOINT_COLOUR = "#D55E00", "#E69F00", "#0072B2"


def draw(timeline: Timeline, out: str, *, title: str = "") -> None:
    """Draw ``timeline`` as a PNG at the local path ``out``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = max(timeline.world_size, 1 + max((m.rank for m in timeline.marks), default=-1))
    figure, axes = plt.subplots(figsize=(11, 1.8 + 0.32 * ranks), dpi=100)
    try:
        band = -1.0  # the phase band's row, above rank 0
        for phase, start, end in timeline.phases:
            axes.barh(band, end - start, left=start, height=0.7, color=PHASE_COLOURS.get(phase, "#999999"))
        for start, end in timeline.rolled_back:
            axes.barh(band, end - start, left=start, height=0.7, fill=False, hatch="///", edgecolor=FAILURE_COLOUR)
        _rounds(axes, timeline)
        for mark in timeline.marks:
            if mark.rank < 0:
                continue
            straggler = mark.what == "straggler"
            axes.scatter(
                [mark.t],
                [mark.rank],
                marker="^" if straggler else "X",
                s=90,
                color=STRAGGLER_COLOUR if straggler else FAILURE_COLOUR,
                edgecolors="black",
                linewidths=0.5,
                zorder=4,
            )
            axes.annotate(mark.what, (mark.t, mark.rank), xytext=(5, -11), textcoords="offset points", fontsize=8)
        attempts: dict[int, float] = {}
        for row in timeline.rounds:
            attempts.setdefault(row.attempt, row.t)
        for attempt, first in attempts.items():
            axes.annotate(f"attempt {attempt}", (first, band), xytext=(2, 9), textcoords="offset points", fontsize=8)
        axes.set_yticks([band, *range(ranks)], ["phase", *(f"rank {rank}" for rank in range(ranks))])
        axes.set_ylim(ranks - 0.4, band - 0.7)
        axes.set_xlabel("seconds since the run's controller started")
        axes.set_title(title or f"{timeline.run_name}: timeline", fontsize=10, loc="left")
        legend = [Patch(color=colour, label=phase) for phase, colour in PHASE_COLOURS.items()]
        legend.append(Patch(fill=False, hatch="///", edgecolor=FAILURE_COLOUR, label="rolled back"))
        axes.legend(handles=legend, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=5, fontsize=8, frameon=False)
        axes.grid(axis="x", alpha=0.3)
        figure.tight_layout()
        figure.savefig(out, format="png")
    finally:
        plt.close(figure)


def _rounds(axes: Any, timeline: Timeline) -> None:
    xs: list[float] = []
    ys: list[int] = []
    ratios: list[float] = []
    for row in timeline.rounds:
        measured = [step for step in row.steps if step is not None]
        median = statistics.median_low(measured) if len(measured) > 1 else None
        for rank, step in enumerate(row.steps):
            xs.append(row.t)
            ys.append(rank)
            ratios.append(1.0 if step is None or not median else min(step / median, 3.0))
        if row.checkpoint:
            axes.axvline(row.t, color=CHECKPOINT_COLOUR, linestyle="--", linewidth=0.8, alpha=0.6, zorder=1)
    if xs:
        points = axes.scatter(xs, ys, c=ratios, cmap="YlOrRd", vmin=1.0, vmax=3.0, s=12, zorder=3)
        bar = axes.figure.colorbar(points, ax=axes, pad=0.01, fraction=0.03)
        bar.set_label("step / median rank's", fontsize=8)
