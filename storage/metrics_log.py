"""The run's metrics history: an append-only log in the run folder (``.metrics/``), read back lazily.

``run.json`` keeps what is bounded (checkpoints, budgets, health); every report's metrics go here,
so neither a commit's work nor the driver's memory grows with the run's length. The segments, their
lines, how a restart cuts the history without rewriting anything, and when the log is written:
docs/design.md, "Storage layout of a run". Metric values are in ``storage.metric_values``' form;
``pandas.read_json(path, lines=True)`` reads one segment, ``Result.metrics_dataframe`` the history.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from storage.codec import Record
from storage.filesystem import is_local, pafs, read_bytes, write_bytes
from storage.layout import RunLayout
from storage.metric_values import decode, encode

#: Reports per segment: bounds what a flush to an object store rewrites (about 1.5 MB).
SEGMENT_REPORTS = 10_000
#: The newest reports' metrics a writer holds (``MetricsLog.tail``): a run no longer than this
#: gets its ``Result.metrics_dataframe`` without reading the log back.
TAIL_REPORTS = 10_000
#: On a filesystem that appends (local disk), lines are written once this many wait, between the
#: run's own flushes: a commit then writes at most this many (about 140 KB), whatever the time since
#: the last flush, and a driver's crash loses fewer of them.
APPEND_LINES = 1_000
_SEGMENT = re.compile(r"^(\d{8})-(\d{4})\.jsonl$")


@dataclasses.dataclass(frozen=True)
class ReportEntry(Record):
    """One recorded report: rank 0's metrics, and which report of which attempt it was."""

    attempt: int
    report_index: int
    metrics: dict[str, Any]


def _line(body: dict[str, Any]) -> bytes:
    return json.dumps(body, allow_nan=True).encode() + b"\n"


class MetricsLog:
    """Appends one run's reports to its log (``layout.metrics_folder``); ``still_owner`` (the
    lease's check) runs before every write."""

    def __init__(
        self, filesystem: pafs.FileSystem, layout: RunLayout, still_owner: Callable[[], None] = lambda: None
    ) -> None:
        self.filesystem = filesystem
        self.folder = layout.metrics_folder
        self.still_owner = still_owner
        #: Reports in the history, the unwritten ones included: the next report's position.
        self.length = 0
        self._appends = is_local(filesystem)
        self._folder_made = False
        #: The segment being written: its path, attempt and number, and the reports in it.
        self._segment: str | None = None
        self._attempt = -1
        self._serial = 0
        self._count = 0
        #: Lines not written yet; on object stores, every line of the current segment.
        self._lines: list[bytes] = []
        self._unwritten = 0
        #: Rank 0's metrics of the history's last reports (at most ``TAIL_REPORTS``), oldest first.
        self.tail: collections.deque[dict[str, Any]] = collections.deque(maxlen=TAIL_REPORTS)

    def cut(self, length: int, attempt: int) -> None:
        """The history keeps its first ``length`` reports (a resume or a restart): lines waiting
        are written, and a segment of ``attempt`` (the attempt that comes next) begins that says
        so (written at the next ``flush``)."""
        for _ in range(min(len(self.tail), max(0, self.length - length))):
            self.tail.pop()
        self.length = length
        self._begin(attempt)

    def append(self, attempt: int, report_index: int, metrics: dict[str, Any]) -> int:
        """Add the next report (written at the next ``flush``); returns its position."""
        if self._segment is None or self._attempt != attempt or self._count >= SEGMENT_REPORTS:
            self._begin(attempt)
        position = self.length
        body = {"report": position, "attempt": attempt, "index": report_index, "metrics": metrics}
        self._lines.append(_line(encode(body)))
        self._unwritten += 1
        self._count += 1
        self.length += 1
        self.tail.append(metrics)
        if self._appends and self._unwritten >= APPEND_LINES:
            with contextlib.suppress(OSError):  # early and optional: the run's next flush writes them, with its retries
                self.flush()
        return position

    def _begin(self, attempt: int) -> None:
        self.flush()
        # Numbered on within an attempt, across cuts too: no two segments of this writer share a name.
        self._serial = self._serial + 1 if self._attempt == attempt else 0
        self._attempt = attempt
        self._segment = f"{self.folder}/{attempt:08d}-{self._serial:04d}.jsonl"
        self._lines = [_line({"from": self.length})]
        self._unwritten = 1
        self._count = 0

    def flush(self) -> None:
        """Write the lines appended since the last flush."""
        if not self._unwritten or self._segment is None:
            return
        self.still_owner()
        if not self._folder_made:
            self.filesystem.create_dir(self.folder, recursive=True)
            self._folder_made = True
        if self._appends:
            with self.filesystem.open_append_stream(self._segment) as out:
                out.write(b"".join(self._lines))
            self._lines = []
        else:
            write_bytes(self.filesystem, self._segment, b"".join(self._lines))
        self._unwritten = 0


def segments(filesystem: pafs.FileSystem, layout: RunLayout) -> list[str]:
    """The paths of the run's log segments, in the order they were begun."""
    found = filesystem.get_file_info(pafs.FileSelector(layout.metrics_folder, allow_not_found=True))
    named = [(match.groups(), entry.path) for entry in found if (match := _SEGMENT.match(entry.base_name))]
    return [path for _, path in sorted(named)]


def _lines(filesystem: pafs.FileSystem, path: str) -> Iterator[dict[str, Any]]:
    """Each readable line of a segment (a line cut off by a crash, or damaged, is skipped)."""
    for raw in read_bytes(filesystem, path).splitlines():
        try:
            body = json.loads(raw)
        except ValueError:
            continue
        if isinstance(body, dict):
            yield body


def _start(filesystem: pafs.FileSystem, path: str) -> int | None:
    """Where a segment's reports begin in the history (its first line), or None when unreadable."""
    with filesystem.open_input_stream(path) as stream:
        head = stream.read(256).split(b"\n", 1)[0]
    try:
        start = json.loads(head).get("from")
    except (ValueError, AttributeError):
        return None
    return start if isinstance(start, int) else None


@dataclasses.dataclass(frozen=True)
class KeptRange:
    """The reports of one segment that the history keeps: from position ``start`` up to, not
    including, ``limit`` (where a later segment cut the history, or infinity)."""

    path: str
    start: int
    limit: float


def kept_ranges(filesystem: pafs.FileSystem, layout: RunLayout) -> list[KeptRange]:
    """Where the history's reports are, oldest first: each segment that holds kept reports (a
    later segment's ``from`` cuts what the segments before it hold). Reads the first lines only;
    what they name is never written again, so reading them later gives this history."""
    ranges: list[KeptRange] = []
    cut = math.inf
    for path in reversed(segments(filesystem, layout)):
        start = _start(filesystem, path)
        if start is not None and start < cut:
            ranges.append(KeptRange(path, start, cut))
            cut = start
    return ranges[::-1]


def _entries(filesystem: pafs.FileSystem, kept: KeptRange) -> Iterator[ReportEntry]:
    expected = kept.start
    for body in _lines(filesystem, kept.path):
        if body.get("report") != expected:  # the header, or a line written twice by a retried append
            continue
        if expected >= kept.limit:
            return
        expected += 1
        yield ReportEntry(int(body["attempt"]), int(body["index"]), decode(body["metrics"]))


def read_history(
    filesystem: pafs.FileSystem, layout: RunLayout, ranges: list[KeptRange] | None = None
) -> Iterator[ReportEntry]:
    """The run's history, oldest first, each kept report once (``ranges``: as ``kept_ranges``
    found them earlier; None: now). Reads one segment at a time."""
    for kept in kept_ranges(filesystem, layout) if ranges is None else ranges:
        yield from _entries(filesystem, kept)


def last_report(filesystem: pafs.FileSystem, layout: RunLayout) -> ReportEntry | None:
    """The history's last report (reads the segments' first lines and one segment), or None."""
    for kept in reversed(kept_ranges(filesystem, layout)):
        if last := collections.deque(_entries(filesystem, kept), maxlen=1):
            return last[0]
    return None
