"""Where the lines a run's workers print go: the terminal (Ray's default) or a caller's sink.

Ray forwards every line a worker prints to the driver, which prints it under a
``(TrainWorker(run='name', rank=0) pid=...)`` prefix. A caller that shows the run elsewhere (the
Prefect tasks log it into the task run) wraps ``fit()`` in ``capture_worker_output``, and the
lines of that run's workers go to its sink instead::

    with capture_worker_output("my-run", lambda rank, lines, is_err: ...):
        trainer.fit()

Lines are told apart by the worker's label (the name Ray shows them under, set when the worker
learns its run and rank), so runs training at once in one process each get their own; what a
worker prints before it trains still goes to the terminal. Lines Ray delivers up to
``LATE_LINES_S`` after the block ended still go to its sink.

While a run is captured (and as long after), Ray Data's per-execution notices from its split
coordinators ("Dataset ... execution finished in 0.9 seconds", "Progress bars disabled") are not
printed either: no Ray Data setting turns them off, and Ray Data's own log file keeps them.
"""

from __future__ import annotations

import ast
import contextlib
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trainers._internal.ray_private import actor_name_line, wrap_worker_line_printer
from trainers.tuning import LATE_LINES_S

#: Receives what one worker printed: its world rank, the lines (one batch of them, in order)
#: and whether they came from its stderr (warnings, logging, tracebacks) or its stdout.
Sink = Callable[[int, list[str], bool], None]

_LABEL = re.compile(r"TrainWorker\(run=(?P<run>'.*'|\".*\"), rank=(?P<rank>\d+)\)")
_RAY_DATA_NOTICE = re.compile(
    r"\s*(?:\S+\s+)?(?:Dataset \S+ execution finished in |Progress bars disabled\. |Starting execution of Dataset "
    r"|Execution plan of Dataset |\[dataset\]: A new progress UI is available)"
)
#: Name of the actors Ray Data starts for ``streaming_split``.
_SPLIT_COORDINATOR = "SplitCoordinator"

_lock = threading.Lock()
#: The sinks of each captured run name, latest last (two runs of one name at once in one process,
#: in different storage, cannot be told apart: the later capture gets the lines).
_sinks: dict[str, list[Sink]] = {}
#: The sink of each finished capture, for its late lines, and until when.
_finished: dict[str, tuple[Sink, float]] = {}


def worker_label(run_name: str, rank: int) -> str:
    """What the worker of ``rank`` in run ``run_name`` is called in Ray's log stream."""
    return f"TrainWorker(run={run_name!r}, rank={rank})"


def announce(label: str) -> None:
    """In a worker actor: show the lines it prints from now on under ``label`` (Ray names an
    actor's lines by a marker line in its stdout and stderr, once at start; written again, it
    renames the lines that follow)."""
    line = actor_name_line(label)
    for stream in (sys.stdout, sys.stderr):
        stream.write(line)
        stream.flush()


def is_ray_data_notice(line: str) -> bool:
    """Whether ``line`` is one of Ray Data's per-execution notices (not a warning or an error)."""
    return _RAY_DATA_NOTICE.match(line) is not None


def is_captured(run_name: str) -> bool:
    """Whether a caller takes the output of run ``run_name`` right now."""
    return run_name in _sinks


def _sink_for(actor_name: str | None) -> tuple[Sink, int] | None:
    match = _LABEL.fullmatch(actor_name or "")
    if match is None:
        return None
    run_name = ast.literal_eval(match["run"])
    with _lock:
        sinks = _sinks.get(run_name)
        sink, until = (sinks[-1], math.inf) if sinks else _finished.get(run_name, (None, 0.0))
    return (sink, int(match["rank"])) if sink is not None and time.monotonic() < until else None


def _quiet_coordinators() -> bool:
    now = time.monotonic()
    with _lock:
        return bool(_sinks) or any(now < until for _, until in _finished.values())


class _Router:
    """Ray's printer of worker lines, wrapped: lines of captured runs go to their sinks."""

    def __init__(self, print_lines: Callable[[dict], Any]) -> None:
        self.print_lines = print_lines

    def __call__(self, data: dict) -> None:
        found = _sink_for(data.get("actor_name"))
        if found is not None:
            sink, rank = found
            with contextlib.suppress(Exception):  # raising here would end Ray's log thread: print the lines instead
                sink(rank, list(data.get("lines") or []), bool(data.get("is_err")))
                return
        elif data.get("actor_name") == _SPLIT_COORDINATOR and _quiet_coordinators():
            lines = [line for line in data.get("lines") or [] if not is_ray_data_notice(line)]
            if not lines:
                return
            data = {**data, "lines": lines}
        self.print_lines(data)


def install() -> None:
    """Put the router in front of Ray's printer of worker lines (once per ``ray.init``; a no-op
    when Ray does not forward worker lines); it passes every line on until a run is captured."""
    wrap_worker_line_printer(lambda printer: printer if isinstance(printer, _Router) else _Router(printer))


@contextlib.contextmanager
def capture_worker_output(run_name: str, sink: Sink) -> Iterator[None]:
    """Send what the workers of run ``run_name`` print to ``sink`` (called on Ray's log thread)
    instead of the terminal, from now until the block ends, and the lines Ray delivers late."""
    import ray

    with _lock:
        _sinks.setdefault(run_name, []).append(sink)
        _finished.pop(run_name, None)
    try:
        if ray.is_initialized():
            install()  # else ensure_ray() installs it when it connects
        yield
    finally:
        with _lock:
            _sinks[run_name].remove(sink)
            if not _sinks[run_name]:
                del _sinks[run_name]
                now = time.monotonic()
                for name in [name for name, (_, until) in _finished.items() if until <= now]:
                    del _finished[name]
                _finished[run_name] = (sink, now + LATE_LINES_S)
