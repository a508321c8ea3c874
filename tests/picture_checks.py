"""What a person must be able to read in a timeline picture, checked on the figure as drawn
(``trainers._internal.health.timeline_picture.figure``), not on its pixels: a visible tick on every rank's
row for every round, a legend entry for every kind of mark drawn, and no text drawn over other
text, over the plot or past the picture's edge. Used by the picture's own tests and by the runs
of tests/test_run_health.py."""

from __future__ import annotations

from typing import Any

from matplotlib.colors import to_rgb

from storage.health import Timeline

#: WCAG's least contrast for graphics against their background (here white).
LEAST_CONTRAST = 3.0
#: A tick shorter than this (7 pt, 10 px; in points squared, as scatter sizes are) or thinner (points)
#: is easy to miss.
LEAST_TICK_SIZE, LEAST_TICK_WIDTH = 49, 2.0
#: Prefect shows an artifact's picture 870 px wide in a 1,400 px window; smaller text is hard to read there.
PICTURE_WIDTH_PX, LEAST_FONT_PT = 870, 10


def contrast_with_white(colour: Any) -> float:
    """WCAG's contrast ratio of ``colour`` against white (1 to 21)."""

    def channel(value: float) -> float:
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    red, green, blue = (channel(v) for v in to_rgb(colour))
    return 1.05 / (0.2126 * red + 0.7152 * green + 0.0722 * blue + 0.05)


def assert_readable(timeline: Timeline) -> Any:
    """Draw ``timeline`` and check it as a person reads it; return the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.lines import Line2D
    from matplotlib.text import Text

    from trainers._internal.health.timeline_picture import figure

    drawn = figure(timeline)
    canvas = FigureCanvasAgg(drawn)  # the canvas a saved PNG is drawn on
    renderer = canvas.get_renderer()
    texts: list[Text] = []  # what is drawn, not every Text the figure holds (ticks past the axis are not)
    draw_text = renderer.draw_text

    def recording(gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False, mtext: Any = None):
        texts.append(mtext)
        return draw_text(gc, x, y, s, prop, angle, ismath, mtext)

    renderer.draw_text = recording  # type: ignore[method-assign]
    canvas.draw()  # lays the picture out as saved
    assert round(drawn.get_figwidth() * drawn.dpi) == PICTURE_WIDTH_PX
    (axes,) = [a for a in drawn.axes if a.get_label() != "<colorbar>" and a.get_yticks().size]
    (legend,) = drawn.legends
    labels = {text.get_text() for text in legend.get_texts()}

    # Every kind of mark drawn has its legend entry, and the legend names nothing that is not drawn.
    marks = [*axes.collections, *axes.lines, *axes.patches]
    kinds = {artist.get_gid() for artist in marks}
    assert None not in kinds, f"a mark without a legend entry: {[a for a in marks if a.get_gid() is None]}"
    assert kinds == labels, f"drawn {sorted(kinds)}, legend {sorted(labels)}"
    # ... and no two entries look alike: each kind of mark is told by its own marker or colour.
    looks: dict[tuple, str] = {}
    for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
        if isinstance(handle, Line2D):
            look: tuple = ("line", handle.get_marker(), to_rgb(handle.get_color()), handle.get_linestyle())
        else:
            look = ("patch", handle.get_fill(), handle.get_hatch(), tuple(handle.get_facecolor()))
        assert look not in looks, f"{text.get_text()!r} looks like {looks[look]!r} in the legend"
        looks[look] = text.get_text()

    # Every rank's row has a visible tick for every round.
    ticks: dict[tuple[float, int], list[Any]] = {}
    for collection in axes.collections:
        for x, y in collection.get_offsets():
            if float(y).is_integer():  # on a rank's row (failures and stragglers sit above it)
                ticks.setdefault((round(float(x), 4), int(y)), []).append(collection)
    for row in timeline.rounds:
        for rank in range(len(row.steps)):
            found = ticks.get((row.t, rank))
            assert found, f"round {row.index} of attempt {row.attempt} has no mark on rank {rank}'s row"
            for collection in found:
                colour, size = collection.get_edgecolor()[0], collection.get_sizes()[0]
                width = collection.get_linewidths()[0]
                assert contrast_with_white(colour) >= LEAST_CONTRAST, (collection.get_gid(), colour)
                assert size >= LEAST_TICK_SIZE and width >= LEAST_TICK_WIDTH, (collection.get_gid(), size, width)

    # Text: large enough, inside the picture, clear of the plot, the legend and other text.
    page, plot, key = drawn.bbox, axes.get_window_extent(renderer), legend.get_window_extent(renderer)
    legend_texts = set(map(id, legend.get_texts()))
    texts = [t for t in texts if t is not None and t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    for text, (words, box) in zip(texts, boxes, strict=True):
        assert text.get_fontsize() >= LEAST_FONT_PT, (words, text.get_fontsize())
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, words
        assert not box.overlaps(plot), f"{words!r} is drawn over the plot"
        if id(text) not in legend_texts:
            assert not box.overlaps(key), f"{words!r} is drawn over the legend"
    for i, (first, one) in enumerate(boxes):
        for second, other in boxes[i + 1 :]:
            assert not one.overlaps(other), f"{first!r} is drawn over {second!r}"
    return drawn
