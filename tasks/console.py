"""What a task run that reads data or trains puts on the terminal: its own log records, once each.

Inside ``run_output()`` Ray Data draws no progress bars and logs no per-execution notices (datasets
opened inside keep these settings wherever they run, Ray Data's split coordinator included); Ray's
log records, this thread's Python warnings and, with ``run_name``, the run's workers' output (stderr
as warnings; ``trainers.worker_output``) become the task run's log records. These settings hold for
the whole process while any ``run_output()`` is open (a sweep trains several runs at once in threads
of one process); Ray's defaults come back when the last one closes. ``flow_run_ui_lines`` says where
to see a run in Prefect's UI."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from prefect import get_run_logger

from trainers.worker_output import capture_worker_output, is_ray_data_notice, ray_console_handlers

#: Ray Data settings while a task run drives Ray Data (``ray.data.DataContext`` fields).
QUIET_RAY_DATA = {"enable_progress_bars": False, "print_on_execution_start": False}

#: Starts of Ray's log messages that Ray logs as WARNING but that report a default, not a
#: problem: a task run logs them at DEBUG.
RAY_NOTICES = ("Token authentication is enabled for this Ray cluster",)

_run_logger: contextvars.ContextVar[Any] = contextvars.ContextVar("flowtrain_run_logger", default=None)
_lock = threading.Lock()
_open = 0
_ray_data_defaults: dict[str, Any] = {}
_python_showwarning = warnings.showwarning


def _ray_records(record: logging.LogRecord) -> bool:
    """The filter on Ray's console handlers while a ``run_output()`` is open: drops Ray Data's
    notices, and hands the records of a task run's thread to that run's logger."""
    if not _open or not (record.name == "ray" or record.name.startswith("ray.")):
        return True
    message = record.getMessage()
    if record.name.startswith("ray.data") and (record.levelno < logging.WARNING or is_ray_data_notice(message)):
        return False  # Ray Data's log file keeps them
    logger = _run_logger.get()
    if logger is None:
        return True
    level = record.levelno
    if level == logging.WARNING and message.startswith(RAY_NOTICES):
        level = logging.DEBUG
    if record.exc_info:
        message += "\n" + logging.Formatter().formatException(record.exc_info)
    logger.log(level, "%s", message)
    return False


def _showwarning(message, category, filename, lineno, file=None, line=None) -> None:
    logger = _run_logger.get()
    if logger is None or file is not None:
        return _python_showwarning(message, category, filename, lineno, file, line)
    logger.warning("%s: %s (%s:%d)", category.__name__, message, os.path.basename(filename), lineno)


def _worker_lines_to(logger: Any):
    def sink(rank: int, lines: list[str], is_err: bool) -> None:
        # A dataset that reaches the workers whole (not split) runs in each worker's process, and
        # Ray Data there logs its per-execution notices as it does in a split's coordinator.
        lines = [line for line in lines if not is_ray_data_notice(line)]
        if any(line.strip() for line in lines):
            logger.log(logging.WARNING if is_err else logging.INFO, "rank %d: %s", rank, "\n".join(lines))

    return sink


@contextlib.contextmanager
def run_output(run_name: str | None = None) -> Iterator[None]:
    """Inside a task run: Ray Data quiet, Ray's records, warnings and (with ``run_name``) the run's
    workers' lines in this task run's logs. See the module's docstring."""
    global _open, _python_showwarning
    import ray.data

    logger = get_run_logger()
    with _lock:
        if _open == 0:
            context = ray.data.DataContext.get_current()
            _ray_data_defaults.update({key: getattr(context, key) for key in QUIET_RAY_DATA})
            for key, value in QUIET_RAY_DATA.items():
                setattr(context, key, value)
        _open += 1
        if warnings.showwarning is not _showwarning:
            _python_showwarning, warnings.showwarning = warnings.showwarning, _showwarning
        for handler in ray_console_handlers():  # Ray's file handlers keep everything
            if _ray_records not in handler.filters:
                handler.addFilter(_ray_records)
    token = _run_logger.set(logger)
    try:
        with capture_worker_output(run_name, _worker_lines_to(logger)) if run_name else contextlib.nullcontext():
            yield
    finally:
        _run_logger.reset(token)
        with _lock:
            _open -= 1
            if _open == 0:
                context = ray.data.DataContext.get_current()
                for key, value in _ray_data_defaults.items():
                    setattr(context, key, value)


def flow_run_ui_lines(flow_run_id: Any, prefect_cli: str = "prefect") -> list[str]:
    """Lines to print after a run: where to see the flow run ``flow_run_id`` in Prefect's UI. With
    ``PREFECT_API_URL`` set, its page on that server's UI (``PREFECT_UI_URL``); unset (a temporary
    local server), the command serving the same local database (``prefect_cli``: the ``prefect``
    command's path) and the page at its address (``PREFECT_SERVER_API_HOST``/``PORT``)."""
    import prefect.settings

    page = f"runs/flow-run/{flow_run_id}"
    api = prefect.settings.PREFECT_API_URL.value()
    if api:
        ui = prefect.settings.PREFECT_UI_URL.value() or api.removesuffix("/api")
        return [f"  open {ui.rstrip('/')}/{page}"]
    host = prefect.settings.PREFECT_SERVER_API_HOST.value()
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # listens everywhere: browse it here
    port = prefect.settings.PREFECT_SERVER_API_PORT.value()
    return [f"  {prefect_cli} server start", f"  then open http://{host}:{port}/{page}"]
