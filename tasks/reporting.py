"""What Prefect shows of a training run, made in the task's process from what the workers report.

``PrefectReporter`` is a ``UserCallback``: every report becomes a log line and moves one progress
artifact; every checkpoint and restart becomes a Prefect event; worker failures and resizes are
logged. After ``fit()``, ``publish_metrics`` writes a table and charts of every report, and
``publish_run_health`` the run's health page.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, cast

from prefect import get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.events import emit_event

from storage import Checkpoint
from storage.figures import number
from storage.health import StragglerRecord
from tasks.charts import charts_markdown, json_safe, run_charts, table_rows
from tasks.health_report import health_markdown
from tasks.params import Checkpointing
from trainers import TrainRunContext, UserCallback
from trainers.errors import WorkerGroupError

#: Reports whose every rank's metrics the reporter keeps for the chart (the newest).
RANKS_KEPT = 10_000


def artifact_key(run_name: str, what: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) for ``what`` of the run."""
    slug = re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-") or "run"
    return f"{slug}-{what}"


def run_resource(run_name: str, run_path: str) -> dict[str, str]:
    """The Prefect event resource that stands for one training run."""
    return {
        "prefect.resource.id": f"flowtrain.run.{run_name}",
        "prefect.resource.name": run_name,
        "flowtrain.run-path": run_path,
    }


def _emit(event: str, run_context: TrainRunContext, payload: dict[str, Any]) -> None:
    emit_event(event, resource=run_resource(run_context.name, run_context.run_path), payload=payload)


def brief(metrics: dict[str, Any]) -> str:
    """``loss=0.06249, epoch=3``: names and values on one line, floats as ``storage.figures`` writes them."""
    return ", ".join(f"{k}={number(v)}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def artifact_link(artifact_id: uuid.UUID | str, text: str) -> str:
    """A markdown link to the artifact ``artifact_id`` on Prefect's UI (not its key's page: that
    lists the versions, one more click away from the content)."""
    import prefect.settings

    ui = prefect.settings.PREFECT_UI_URL.value() or ""
    return f"[{text}]({ui.rstrip('/')}/artifacts/artifact/{artifact_id})"


class PrefectReporter(UserCallback):
    """Streams a run's reports into the Prefect task run: logs, a progress artifact and events.

    ``expected_reports`` (e.g. the number of epochs) sets the progress scale; without it the
    progress artifact stays at 0 until the run ends. Create it inside a Prefect task run.
    """

    def __init__(self, run_name: str, *, expected_reports: int | None = None, reports_so_far: int = 0) -> None:
        self.run_name = run_name
        self.expected_reports = expected_reports
        self.num_reports = reports_so_far
        #: Reports up to the latest checkpoint: where a restart resumes counting.
        self._reports_at_checkpoint = reports_so_far
        #: Every rank's metrics by report index (0-based), for the newest ``RANKS_KEPT`` reports this
        #: reporter saw: a long run's driver holds a bounded tail (older reports chart rank 0's).
        self._ranks_by_report: dict[int, list[dict[str, Any]]] = {}
        self.logger = get_run_logger()
        out_of = f" out of {expected_reports}" if expected_reports else ""
        description = f"Reports of training run {run_name!r}{out_of}"
        progress_id = create_progress_artifact(
            self._progress(), key=artifact_key(run_name, "progress"), description=description
        )
        # Called from synchronous code, Prefect's dual sync/async function returns the id itself.
        self.progress_id = cast(uuid.UUID, progress_id)

    def _progress(self) -> float:
        return min(100.0, 100.0 * self.num_reports / self.expected_reports) if self.expected_reports else 0.0

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None
    ) -> None:
        self._ranks_by_report[self.num_reports] = list(metrics)
        self._ranks_by_report.pop(self.num_reports - RANKS_KEPT, None)
        self.num_reports += 1
        shown = {k: json_safe(v) for k, v in metrics[0].items()}
        saved = f"; checkpoint {checkpoint.path}" if checkpoint else ""
        self.logger.info("report %d (attempt %d): %s%s", self.num_reports, run_context.attempt, brief(shown), saved)
        update_progress_artifact(self.progress_id, self._progress())
        if checkpoint is not None:
            self._reports_at_checkpoint = self.num_reports
            payload = {"checkpoint": checkpoint.path, "metrics": shown, "attempt": run_context.attempt}
            _emit("flowtrain.checkpoint.committed", run_context, payload)

    def after_exception(self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]) -> None:
        for rank, error in sorted(worker_exceptions.items()):
            self.logger.error(
                "rank %d failed in attempt %d: %s: %s", rank, run_context.attempt, type(error).__name__, error
            )

    def on_restart(self, run_context: TrainRunContext, failures: list[Any], resume_from: Checkpoint | None) -> None:
        where = resume_from.path if resume_from else "the start"
        self._resume_after(self._reports_at_checkpoint if resume_from else 0)
        causes = "; ".join(f.describe() for f in failures)
        restart = run_context.restarts[-1] if run_context.restarts else None
        how = restart.describe() if restart is not None else "restarting the workers"
        self.logger.warning("attempt %d failed (%s); %s; resuming from %s", run_context.attempt, causes, how, where)
        payload = {
            "attempt": run_context.attempt,
            "failures": causes,
            "resume_from": resume_from.path if resume_from else None,
            "replaced_ranks": sorted(restart.replaced) if restart is not None else None,
            "kept_ranks": list(restart.kept) if restart is not None else None,
            "full_restart": restart.full_restart if restart is not None else None,
        }
        _emit("flowtrain.run.restarted", run_context, payload)

    def on_resize(self, run_context: TrainRunContext, old_size: int, new_size: int) -> None:
        self._resume_after(self._reports_at_checkpoint)
        message = "resizing from %d to %d workers after attempt %d; resuming from the latest checkpoint"
        self.logger.info(message, old_size, new_size, run_context.attempt)

    def on_straggler(self, run_context: TrainRunContext, straggler: StragglerRecord) -> None:
        self.logger.warning("straggler in attempt %d: %s", straggler.attempt, straggler.describe())
        _emit("flowtrain.rank.straggling", run_context, straggler.to_json())

    def _resume_after(self, num_reports: int) -> None:
        """The run goes on from its report ``num_reports``: the later ones are made again."""
        self.num_reports = num_reports
        self._ranks_by_report = {i: m for i, m in self._ranks_by_report.items() if i < num_reports}

    def finish(self) -> None:
        """Mark the progress artifact complete."""
        update_progress_artifact(self.progress_id, 100.0)

    def every_rank(self, history: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """Per report of ``history`` (rank 0's metrics, as stored), every rank's metrics; only rank 0's
        for reports made before this reporter started (a resumed run)."""
        return [self._ranks_by_report.get(i, [metrics]) for i, metrics in enumerate(history)]


def publish_metrics(
    run_name: str,
    history: list[dict[str, Any]],
    *,
    reporter: PrefectReporter,
    checkpointing: Checkpointing,
    notes: dict[str, str] | None = None,
    health_artifact: uuid.UUID | None = None,
) -> None:
    """After ``fit()``: a table artifact of every report (``tasks.charts.table_rows``) and a markdown
    artifact charting the losses, accuracies and score metric per step (``tasks.charts.step_axis``)
    or per report.

    ``history`` is rank 0's metrics per report, as stored; ``reporter`` adds the other ranks' for the
    reports it saw (ranks that differ get a line each); ``checkpointing`` names the score metric;
    ``notes`` says what each figure is (a loop's ``metric_notes``); the chart links to
    ``health_artifact`` (``publish_run_health``'s)."""
    by_rank = reporter.every_rank(history)
    score, order = checkpointing.score_attribute, checkpointing.score_order
    rows = table_rows([ranks[0] for ranks in by_rank], score)
    create_table_artifact(
        table=rows,
        key=artifact_key(run_name, "metrics"),
        description=(
            f"Every report of training run {run_name!r}, in order ({len(rows)} rows; 4 significant digits). "
            "Reports count from 1; a step the loop reports (epoch, step) is the loop's own count."
        ),
    )
    charts = run_charts(by_rank, score, order)
    ranked = f"; checkpoints are ranked by **{score}** ({order})" if score else ""
    along = charts[0] if charts and charts[0].x else None  # a step the loop reports: its own count
    how = f"{along.x_label}, as the loop counts (from {along.x_text(1)})" if along else "report, counted from 1"
    intro = f"{len(history)} reports{ranked}. Charted by {how}."
    if health_artifact is not None:
        health = artifact_link(health_artifact, artifact_key(run_name, "health"))
        intro += f" Where the run's time went, and its timeline picture: {health}."
    create_markdown_artifact(
        markdown=charts_markdown(f"Metrics of {run_name}", charts, intro=intro, notes=notes),
        key=artifact_key(run_name, "metric-chart"),
        description=f"Losses, accuracies and score metric of training run {run_name!r}.",
    )


def publish_run_health(run_name: str, run_path: str) -> uuid.UUID | None:
    """A markdown artifact of the run's health (``tasks.health_report``), a failed run's too, with its
    timeline picture drawn now into the run folder. Returns the artifact's id, or None when the run
    folder could not be read (the run's own outcome is what matters then)."""
    from storage import load_run
    from storage.filesystem import read_bytes, resolve_filesystem
    from trainers.health import draw_timeline

    logger = get_run_logger()
    try:
        run = load_run(run_path)
    except Exception as error:  # noqa: BLE001 - a health page must never hide the run's outcome
        logger.warning("no health page for run %r: its folder could not be read (%s)", run_name, error)
        return None
    picture, where = None, ""
    try:
        where = draw_timeline(run_path) or ""
        if where:
            picture = read_bytes(*resolve_filesystem(where))
    except Exception as error:  # noqa: BLE001 - the page without its picture beats no page
        logger.warning("the run's timeline picture was not drawn: %s", error)
    artifact_id = create_markdown_artifact(
        markdown=health_markdown(run_name, run.health, picture, timeline_path=where),
        key=artifact_key(run_name, "health"),
        description=f"Goodput, timeline, stragglers and memory of training run {run_name!r}.",
    )
    if run.health.goodput:
        logger.info("run %r: %s", run_name, run.health.goodput[-1].describe())
    return cast(uuid.UUID, artifact_id)  # from synchronous code, Prefect's dual function returns the id


def log_failure(error: BaseException) -> None:
    """Log each failed rank's original traceback, so the Prefect run shows what the workers saw."""
    logger = get_run_logger()
    if isinstance(error, WorkerGroupError):
        for failure in error.failures.values():
            logger.error("%s\n%s", failure.describe(), failure.traceback or "(no traceback)")


def without_traceback(error: BaseException) -> BaseException:
    """``error`` to raise out of the task after ``log_failure``: a ``WorkerGroupError`` without the
    rank's traceback (the task run's logs hold it). Prefect repeats a failed task's message in the
    task's and flow's final states and the flow's exception log: a traceback would show four times."""
    message, cut, _ = str(error).partition("\nTraceback of rank ")
    if not isinstance(error, WorkerGroupError) or not cut:
        return error
    return type(error)(  # NCCLHangError stays an NCCLHangError
        f"{message}\n(Each failed rank's traceback is in the train task run's logs.)",
        error.worker_failures,
        error.failures,
        attempt=error.attempt,
        budget_exhausted=error.budget_exhausted,
    )
