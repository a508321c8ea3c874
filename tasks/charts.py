"""Charts and tables of a run's metrics that a person reads at a glance (pure functions, no Prefect).

A chart is an SVG document embedded in markdown as a ``data:image/svg+xml;base64`` image: the
Prefect UI (3.8) shows such images, while its HTML sanitizer breaks an inline ``<svg>``. Each
plotted line carries its values in ``data-*`` attributes, so a test (or a curious user) can read
the exact numbers back from the artifact. Figures are written as ``storage.figures`` says.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from storage.figures import number, rounded
from storage.retention import flatten

#: Metric names that count steps rather than measure anything: shown first, never plotted.
STEP_KEYS = ("step", "global_step", "epoch", "iteration", "training_iteration", "round", "boost_round")
#: The column holding the 1-based report number in the tables this module makes.
REPORT_COLUMN = "report"
#: Okabe-Ito colours: told apart by colour-blind readers too (yellow left out: unreadable on white).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
#: Dash patterns cycled after the colours run out, so series 8 and up still differ from 1-7.
DASHES = ("", "6 4", "2 3")
#: Most charts a metric-chart artifact falls back to when the run reported no loss and no score.
MAX_FALLBACK_CHARTS = 4

WIDTH = 820  # fits the artifact page's content column at a 1,400 px window; narrower ones scale it
PLOT_HEIGHT = 220
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_BOTTOM = 72, 24, 44
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
CHAR_WIDTH = 6.8  # rough width of one 12 px character, for laying out the legend
MAX_DOTS = 200  # more points than this: the line alone, as dots would hide it


# -- numbers and tables -----------------------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it: NaN and inf None, a datetime or a Decimal its text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (int, float, str, list, tuple, dict)):
        return value
    return str(value)


def round_sig(value: Any) -> Any:
    """``value`` rounded as ``storage.figures`` writes figures when a finite float, else ``json_safe(value)``."""
    return rounded(value) if isinstance(value, float) and math.isfinite(value) else json_safe(value)


def as_number(value: Any) -> float | None:
    """``value`` as a float a chart can plot, or None (missing, NaN, infinite, bool or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def is_step_key(key: str) -> bool:
    """Whether ``key`` (flattened, ``outer/inner``) counts progress (epoch, step, ...) rather than measures."""
    return key.rpartition("/")[2].lower() in STEP_KEYS


def is_loss_key(key: str) -> bool:
    """Whether ``key`` names a loss: any metric with "loss" in its name."""
    return "loss" in key.lower()


def is_accuracy_key(key: str) -> bool:
    """Whether ``key`` names an accuracy: "accuracy" in its name, or "acc" as a word of it (``val_acc``)."""
    name = key.lower()
    return "accuracy" in name or "acc" in name.replace("/", "_").replace("-", "_").split("_")


def ordered_columns(keys: Iterable[str], score: str | None = None) -> list[str]:
    """``keys`` with the step-like ones first, then ``score``, then the rest in the order given."""
    unique = list(dict.fromkeys(keys))
    steps = [k for k in unique if is_step_key(k)]
    first = steps + ([score] if score in unique and score not in steps else [])
    return first + [k for k in unique if k not in first]


def table_rows(history: Sequence[dict[str, Any]], score: str | None = None) -> list[dict[str, Any]]:
    """One row per report: ``report`` (1-based), step, score, then every other metric (``outer/inner``
    when nested), to 4 significant digits; every row has every column (None where not reported)."""
    flat = [flatten(metrics) for metrics in history]
    columns = ordered_columns((k for metrics in flat for k in metrics), score)
    return [
        {REPORT_COLUMN: number, **{k: round_sig(metrics.get(k)) for k in columns}}
        for number, metrics in enumerate(flat, start=1)
    ]


# -- what to plot -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of a chart: a value per report (None where nothing was reported)."""

    metric: str
    #: "all" when every rank reported the same values, else the rank's number as text.
    rank: str
    values: tuple[float | None, ...]
    #: What the legend says; by default the metric, and the rank when ranks differ.
    name: str | None = None

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        return self.metric if self.rank == "all" else f"{self.metric} (rank {self.rank})"

    @property
    def num_points(self) -> int:
        return sum(v is not None for v in self.values)


@dataclasses.dataclass(frozen=True)
class Chart:
    """Lines sharing one y axis, over each report's ``x`` value (its epoch, say) or its number."""

    title: str
    series: tuple[Series, ...]
    x_label: str = "report"
    #: Which end is best ("min" or "max"); None: low for losses, high for anything else.
    best: str | None = None
    #: The x value of each report, increasing (``step_axis``); empty: 1, 2, ... (the report numbers).
    x: tuple[float, ...] = ()

    @property
    def num_reports(self) -> int:
        return max((len(s.values) for s in self.series), default=0)

    def x_of(self, report: int) -> float:
        """The x value of the report numbered ``report`` (1-based)."""
        return self.x[report - 1] if self.x else report

    def x_text(self, report: int) -> str:
        """``x_of(report)`` as the axis labels it: whole numbers in full (120000, not 1.2e+05)."""
        value = self.x_of(report)
        return str(int(value)) if float(value).is_integer() else number(value)


def metric_series(history: Sequence[Sequence[dict[str, Any]]], metric: str) -> list[Series]:
    """The lines of ``metric`` over ``history`` (per report, one flattened metrics dict per rank):
    one when every rank reported the same values (a rank missing from a report does not differ),
    else one per rank that reported it."""
    num_ranks = max((len(ranks) for ranks in history), default=0)
    by_rank = [
        [as_number(ranks[rank].get(metric)) if rank < len(ranks) else None for ranks in history]
        for rank in range(num_ranks)
    ]
    same = all(
        values[i] == by_rank[0][i]
        for rank, values in enumerate(by_rank)
        for i, ranks in enumerate(history)
        if rank < len(ranks)
    )
    lines = [("all", by_rank[0])] if same and by_rank else [(str(rank), values) for rank, values in enumerate(by_rank)]
    return [Series(metric, rank, tuple(values)) for rank, values in lines if any(v is not None for v in values)]


def plotted_metrics(keys: Iterable[str], score: str | None = None) -> list[list[str]]:
    """Metrics to draw, a list per chart: the losses, the accuracies, the score metric (when neither);
    without any, a few numeric metrics one each. Step-like metrics are the x axis, never drawn."""
    measured = [k for k in dict.fromkeys(keys) if not is_step_key(k)]
    losses = [k for k in measured if is_loss_key(k)]
    accuracies = [k for k in measured if is_accuracy_key(k) and k not in losses]
    groups = [group for group in (losses, accuracies) if group]
    if score in measured and score not in losses + accuracies:
        groups.append([score])
    return groups or [[k] for k in measured[:MAX_FALLBACK_CHARTS]]


def step_axis(history: Sequence[dict[str, Any]]) -> tuple[str, tuple[float, ...]] | None:
    """The first step-like metric (epoch, step, ...) that every report of ``history`` (rank 0's
    flattened metrics) carries as an increasing number, and its values; None when there is none."""
    for key in filter(is_step_key, history[0] if history else ()):
        numbers = [v for metrics in history if (v := as_number(metrics.get(key))) is not None]
        if len(numbers) == len(history) and all(a < b for a, b in zip(numbers, numbers[1:], strict=False)):
            return key, tuple(numbers)
    return None


def run_charts(
    history: Sequence[Sequence[dict[str, Any]]], score: str | None = None, score_order: str | None = None
) -> list[Chart]:
    """The charts of one run: ``history`` holds, per report, every rank's metrics (nested or flat);
    ``score_order`` ("min"/"max") says which end of the ``score`` metric is best."""
    flat = [[flatten(metrics) for metrics in ranks] for ranks in history]
    numeric = (k for ranks in flat for metrics in ranks for k, v in metrics.items() if as_number(v) is not None)
    axis = step_axis([ranks[0] if ranks else {} for ranks in flat])
    x_label, x = axis if axis is not None else ("report", ())
    charts = []
    for group in plotted_metrics(numeric, score):
        series = tuple(s for metric in group for s in metric_series(flat, metric))
        if not series:
            continue
        if group == [score]:
            best, title = score_order, f"{score} per {x_label} (the score metric)"
        else:
            best, title = None, f"{', '.join(group)} per {x_label}" + (f" (score: {score})" if score in group else "")
        charts.append(Chart(title=title, series=series, best=best, x_label=x_label, x=x))
    return charts


def describe(series: Series, chart: Chart, note: str = "") -> str:
    """A line to read instead of ``chart``: what the figure is (``note``), then the first, last and
    best (``chart.best``; by default low for losses, else high) value of ``series``, each at the x of
    ``chart`` (its epoch, say, or the report number)."""
    points = [(i, v) for i, v in enumerate(series.values, start=1) if v is not None]
    label = f"**{series.label}** ({note})" if note else f"**{series.label}**"
    if not points:
        return f"{label}: not reported"
    lower = chart.best == "min" or (chart.best is None and is_loss_key(series.metric))
    top_at, top = (min if lower else max)(points, key=lambda p: p[1])
    (first_at, first), (last_at, last) = points[0], points[-1]

    def at(report: int) -> str:
        return f"at {chart.x_label} {chart.x_text(report)}"

    return (
        f"{label}: {number(first)} {at(first_at)} → {number(last)} {at(last_at)}; "
        f"best ({'lowest' if lower else 'highest'}) {number(top)} {at(top_at)}"
    )


# -- drawing ------------------------------------------------------------------------------------------


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (1, 2, 2.5 or 5 times a power of ten apart) covering [low, high]."""
    if high <= low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    ticks = []
    tick = math.floor(low / step) * step  # the first: the multiple of step at or below low
    while tick < high + step * 0.5:
        ticks.append(round(tick, 12))
        tick += step
    return ticks if ticks[-1] >= high else ticks + [round(tick, 12)]


def log_ticks(low: float, high: float, most: int = 7) -> list[float]:
    """Powers of ten covering [low, high] (both > 0), at most ``most`` of them, evenly spaced."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    step = max(1, math.ceil((last - first) / (most - 1)))
    last = first + step * math.ceil((last - first) / step)
    return [10.0**power for power in range(first, last + 1, step)]


def wants_log_scale(values: Sequence[float]) -> bool:
    """Whether ``values`` are positive and span a factor >= 1000: a linear axis would flatten the small ones."""
    return bool(values) and min(values) > 0 and max(values) / min(values) >= 1000


def x_ticks(num_reports: int, most: int = 10) -> list[int]:
    """Report numbers to label on the x axis: at most ``most``, always the first and the last."""
    if num_reports <= 0:
        return []
    step = max(1, math.ceil(num_reports / most))
    ticks = list(range(1, num_reports + 1, step))
    if ticks[-1] != num_reports:
        if len(ticks) > 1 and num_reports - ticks[-1] < step / 2:
            ticks.pop()  # too close to the last report for both labels to fit
        ticks.append(num_reports)
    return ticks


def _legend_layout(labels: Sequence[str]) -> tuple[list[tuple[float, float]], float]:
    """Where each legend entry goes (left to right, wrapping), and the height the legend takes."""
    positions, x, y = [], float(MARGIN_LEFT), 0.0
    for label in labels:
        width = 34 + CHAR_WIDTH * len(label) + 18
        if x + width > WIDTH - MARGIN_RIGHT and x > MARGIN_LEFT:
            x, y = float(MARGIN_LEFT), y + 20
        positions.append((x, y))
        x += width
    return positions, y + 20 if labels else 0.0


@dataclasses.dataclass(frozen=True)
class _Frame:
    """Where the plot area of a chart is, and how reports and values map into it."""

    chart: Chart
    top: float
    y_ticks: tuple[float, ...]
    log: bool
    left: float = MARGIN_LEFT
    right: float = WIDTH - MARGIN_RIGHT

    @property
    def bottom(self) -> float:
        return self.top + PLOT_HEIGHT

    def x_at(self, report: int) -> float:
        """Where the report numbered ``report`` (1-based) sits: by its x value, first to last."""
        if self.chart.num_reports <= 1:
            return (self.left + self.right) / 2
        first, last = self.chart.x_of(1), self.chart.x_of(self.chart.num_reports)
        return self.left + (self.chart.x_of(report) - first) * (self.right - self.left) / (last - first)

    def y_at(self, value: float) -> float:
        low, high, y = (math.log10(v) if self.log else v for v in (self.y_ticks[0], self.y_ticks[-1], value))
        return self.bottom - (y - low) * PLOT_HEIGHT / (high - low)


def render_svg(chart: Chart) -> str:
    """``chart`` as a standalone SVG document (white background, so it reads on a dark page too).

    Each line is a ``<path>`` with ``data-metric``, ``data-rank`` and ``data-values`` (JSON, null
    where nothing was reported); a point is a ``<circle>`` with ``data-report``, ``data-x`` (its
    value on the x axis: the epoch, say) and ``data-value``.
    A y axis spanning many orders of magnitude is logarithmic (and says so).
    """
    legend, legend_height = _legend_layout([s.label for s in chart.series])
    values = [v for s in chart.series for v in s.values if v is not None]
    log = wants_log_scale(values)
    ticks = (
        log_ticks(min(values), max(values)) if log else nice_ticks(min(values, default=0.0), max(values, default=1.0))
    )
    frame = _Frame(chart=chart, top=40 + legend_height, y_ticks=tuple(ticks), log=log)
    height = frame.bottom + MARGIN_BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:g}" viewBox="0 0 {WIDTH} {height:g}" '
        f'font-family="{FONT}" font-size="12" data-num-reports="{chart.num_reports}">',
        f"<title>{escape(chart.title)}</title>",
        f'<rect width="{WIDTH}" height="{height:g}" rx="6" fill="#ffffff"/>',
        f'<text x="{frame.left}" y="24" font-size="15" font-weight="bold" fill="#222">{escape(chart.title)}</text>',
        *_axes_svg(frame, height),
    ]
    for index, (series, position) in enumerate(zip(chart.series, legend, strict=True)):
        colour, dash = PALETTE[index % len(PALETTE)], DASHES[index // len(PALETTE) % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(_series_svg(series, colour, dash_attr, frame))
        x, y = position[0], 40 + position[1]
        parts += [
            f'<line x1="{x:.1f}" x2="{x + 26:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}" stroke-width="3"{dash_attr}/>',
            f'<text x="{x + 32:.1f}" y="{y + 4:.1f}" fill="#222">{escape(series.label)}</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts)


def _axes_svg(frame: _Frame, height: float) -> list[str]:
    """Grid lines and labels of the y ticks, labelled x ticks (a few reports), the axis captions."""
    parts = []
    for tick in frame.y_ticks:
        y = frame.y_at(tick)
        parts.append(f'<line x1="{frame.left}" x2="{frame.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        parts.append(f'<text x="{frame.left - 8}" y="{y + 4:.1f}" text-anchor="end" fill="#444">{number(tick)}</text>')
    bottom = frame.bottom
    for report in x_ticks(frame.chart.num_reports):
        x = frame.x_at(report)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 5}" stroke="#888"/>')
        label = frame.chart.x_text(report)
        parts.append(f'<text x="{x:.1f}" y="{bottom + 19}" text-anchor="middle" fill="#444">{label}</text>')
    parts.append(f'<line x1="{frame.left}" x2="{frame.right}" y1="{bottom}" y2="{bottom}" stroke="#888"/>')
    middle = (frame.left + frame.right) / 2
    x_label = escape(frame.chart.x_label)
    parts.append(f'<text x="{middle:.1f}" y="{height - 6:g}" text-anchor="middle" fill="#444">{x_label}</text>')
    if frame.log:
        parts.append(f'<text x="{frame.right}" y="{height - 6:g}" text-anchor="end" fill="#444">log scale</text>')
    return parts


def _series_svg(series: Series, colour: str, dash_attr: str, frame: _Frame) -> str:
    """One series: a path broken where a report has no value, and a dot on every point."""
    commands, dots, pen_down = [], [], False
    for report, value in enumerate(series.values, start=1):
        if value is None:
            pen_down = False
            continue
        x, y = frame.x_at(report), frame.y_at(value)
        commands.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        pen_down = True
        dots.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}" data-report="{report}" '
            f'data-x="{frame.chart.x_of(report)!r}" data-value="{value!r}"/>'
        )
    path = (
        f'<path d="{" ".join(commands)}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr} '
        f"data-metric={quoteattr(series.metric)} data-rank={quoteattr(series.rank)} "
        f"data-values={quoteattr(json.dumps(list(series.values)))}/>"
    )
    if len(dots) > MAX_DOTS:
        dots = []  # a dot per point would hide the line itself
    return "\n".join([f"<g data-series={quoteattr(series.label)}>", path, *dots, "</g>"])


def svg_image_markdown(svg: str, alt: str) -> str:
    """Markdown showing ``svg`` as an image (a base64 data URI: the form the Prefect UI renders)."""
    data = base64.b64encode(svg.encode()).decode()
    safe_alt = alt.replace("[", "(").replace("]", ")")
    return f"![{safe_alt}](data:image/svg+xml;base64,{data})"


def charts_markdown(
    title: str, charts: Sequence[Chart], *, intro: str = "", notes: Mapping[str, str] | None = None
) -> str:
    """A markdown page: ``title``, ``intro``, then per chart the image and a summary line per
    series, saying what the figure is where ``notes`` (metric name to words) has it."""
    lines = [f"# {title}", "", *([intro, ""] if intro else [])]
    if not charts:
        lines.append("Nothing numeric was reported, so there is nothing to draw.")
    for chart in charts:
        lines += [svg_image_markdown(render_svg(chart), chart.title), ""]
        lines += [f"- {describe(s, chart, (notes or {}).get(s.metric, ''))}" for s in chart.series]
        lines.append("")
    return "\n".join(lines)


def trials_chart(metric: str, trials: Sequence[tuple[str, Sequence[dict[str, Any]]]], *, best: str) -> Chart:
    """One line per trial of a sweep: ``metric`` at each of its reports. ``trials`` are (name,
    history) pairs, best trial first; ``best`` ("min"/"max") says which end of ``metric`` wins."""
    series = tuple(
        Series(metric, "all", tuple(as_number(flatten(m).get(metric)) for m in history), name=name)
        for name, history in trials
    )
    return Chart(title=f"{metric} per report, one line per trial", series=series, best=best)
