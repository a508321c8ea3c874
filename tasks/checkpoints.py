"""The checkpoints stage: verify what the run kept, apply final retention, publish the best one and
a table of every checkpoint the run committed: kept or dropped, and why."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from storage import CheckpointConfig, RunLayout, RunSnapshot, RunStorage
from storage.retention import flatten, rank_best_first
from storage.snapshot import CheckpointRecord
from tasks.charts import REPORT_COLUMN, is_step_key, round_sig
from tasks.params import Checkpointing, CheckpointSummary, RunSettings, TrainSummary
from tasks.reporting import artifact_key
from tasks.retries import retry_io_errors


@task(
    name="checkpoints",
    task_run_name="checkpoints {summary.run_name}",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_io_errors,
    persist_result=True,
)
def checkpoints(summary: TrainSummary, checkpointing: Checkpointing, run: RunSettings) -> CheckpointSummary:
    """Check that every kept checkpoint is there and committed, drop what retention does not keep
    (and anything a crash left behind), and publish the best checkpoint as a markdown artifact."""
    config = checkpointing.to_config()
    storage = RunStorage(run.storage_root, summary.run_name, checkpoint_config=config)
    kept = storage.verify_and_tidy(owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:checkpoints")
    metrics = {c.path: m for c, m in storage.best_checkpoints}
    best = kept[0] if kept else None
    best_metrics = metrics.get(best.path) if best else None
    attribute = config.checkpoint_score_attribute
    get_run_logger().info("run %r keeps %d checkpoint(s); best: %s", summary.run_name, len(kept), best and best.path)
    create_markdown_artifact(
        markdown=_best_checkpoint_markdown(summary, [c.path for c in kept], best_metrics, attribute),
        key=artifact_key(summary.run_name, "best-checkpoint"),
        description=f"Best checkpoint of training run {summary.run_name!r}",
    )
    create_table_artifact(
        table=checkpoint_rows(storage.snapshot, config),
        key=artifact_key(summary.run_name, "checkpoints"),
        description=f"Checkpoints of training run {summary.run_name!r}; retention keeps {ranking_rule(config)}.",
    )
    return CheckpointSummary(
        run_path=summary.run_path,
        kept=[c.path for c in kept],
        best_path=best.path if best else None,
        best_metrics=best_metrics,
        score_attribute=attribute,
    )


def _best_checkpoint_markdown(summary: TrainSummary, kept: list[str], best_metrics: dict | None, attribute: str | None) -> str:
    if not kept:
        return f"# {summary.run_name}\n\nThe run reported no checkpoint. Run folder: `{summary.run_path}`\n"
    rank = f"by `{attribute}`" if attribute else "the most recent (no checkpoint_score_attribute set)"
    flat = flatten(best_metrics or {})
    score = f"\n\n**{attribute}** = `{flat.get(attribute)}`" if attribute else ""
    rows = "\n".join(f"| {k} | {v} |" for k, v in flat.items())
    others = "\n".join(f"- `{path}`" for path in kept[1:]) or "- (none)"
    return (
        f"# Best checkpoint of {summary.run_name}\n\n`{kept[0]}`\n\nChosen {rank}.{score}\n\n"
        f"| metric | value |\n| --- | --- |\n{rows}\n\n## Also kept\n\n{others}\n\nRun folder: `{summary.run_path}`\n"
    )


def committed_reports(kept: list[CheckpointRecord], *, num_reports: int, num_committed: int) -> dict[int, int | None]:
    """The report (0-based index) each committed checkpoint came with, by checkpoint number.

    The snapshot keeps this for the kept checkpoints only. Checkpoints are numbered in the order of
    their reports, so a dropped one's report is known when the reports between two kept
    checkpoints are as many as the checkpoints between them (every one of them saved one), e.g.
    when the loop checkpoints every report; otherwise it is None.
    """
    found: dict[int, int | None] = {c.seq: c.report for c in kept}
    anchors = [(-1, -1), *sorted(found.items()), (num_committed, num_reports)]
    for (seq_before, report_before), (seq_after, report_after) in zip(anchors, anchors[1:]):
        between = range(seq_before + 1, seq_after)
        exact = len(between) == report_after - report_before - 1
        found.update({seq: report_before + 1 + i if exact else None for i, seq in enumerate(between)})
    return found


def checkpoint_rows(snapshot: RunSnapshot, config: CheckpointConfig) -> list[dict[str, Any]]:
    """One row per checkpoint the run committed, oldest first: its report and step, its score,
    how long its upload took and how big it was (``UPLOAD_COLUMNS``; blank for a dropped one, whose
    record is gone, and for one nothing was uploaded for), whether retention kept it, and why (the
    ``num_to_keep`` best by score, plus the latest)."""
    kept = {c.seq: c for c in snapshot.checkpoints}
    reports = committed_reports(snapshot.checkpoints, num_reports=len(snapshot.reports), num_committed=snapshot.next_seq)
    metrics = {
        seq: kept[seq].metrics if seq in kept else (snapshot.reports[report]["metrics"] if report is not None else None)
        for seq, report in reports.items()
    }
    attribute = config.checkpoint_score_attribute
    # A checkpoint without its score (a dropped one's may have come from its validation, which
    # run.json keeps for the kept ones only) ranks last, as in retention itself.
    ranked = rank_best_first([(seq, m) for seq, m in metrics.items() if m is not None], config)
    place = {seq: i for i, seq in enumerate(ranked, start=1)}
    latest = max(kept, default=None)
    flat = {seq: flatten(m or {}) for seq, m in metrics.items()}
    steps = list(dict.fromkeys(k for values in flat.values() for k in values if is_step_key(k)))
    rows = []
    for seq in sorted(reports):
        report = reports[seq]
        row = {"checkpoint": RunLayout.checkpoint_name(seq), REPORT_COLUMN: None if report is None else report + 1}
        row.update({k: round_sig(flat[seq].get(k)) for k in steps})
        if attribute is not None:
            row[attribute] = round_sig(flat[seq].get(attribute))
        row.update(upload_cells(kept[seq].upload if seq in kept else None))
        row["status"] = "kept" if seq in kept else "dropped"
        row["why"] = retention_reason(seq in kept, place=place.get(seq), latest=seq == latest, config=config)
        rows.append(row)
    return rows


#: Table columns of a checkpoint's upload: the slowest rank's seconds, and the megabytes
#: (10^6 bytes) of all ranks.
UPLOAD_COLUMNS = ("upload s", "upload MB")


def upload_cells(upload: dict[str, Any] | None) -> dict[str, Any]:
    """The ``UPLOAD_COLUMNS`` cells of a checkpoint whose record holds ``upload`` (None: blank)."""
    seconds, megabytes = UPLOAD_COLUMNS
    if not upload:
        return {seconds: None, megabytes: None}
    size = upload.get("bytes")
    return {
        seconds: round_sig(float(upload["seconds"]), 3) if upload.get("seconds") is not None else None,
        megabytes: round_sig(size / 1e6, 4) if size is not None else None,
    }


def retention_reason(kept: bool, *, place: int | None, latest: bool, config: CheckpointConfig) -> str:
    """Why retention kept or dropped a checkpoint ranked ``place`` (1 = best) of all committed.

    Short, so the table stays readable in a 1,400 px window: the score column and the table's
    description say what the checkpoints are ranked by.
    """
    n, scored = config.num_to_keep, config.checkpoint_score_attribute is not None
    if n is None:
        return "kept: num_to_keep is not set, so all are kept"
    if not kept:
        return f"dropped: not among the best {n}" if scored else f"dropped: older than the {n} most recent"
    if place is not None and place <= n:
        among = f"best {place} of {n}" if scored else f"most recent {place} of {n}"
        return among + (", and the latest" if latest and scored else "")
    return "latest: resume needs it"


def ranking_rule(config: CheckpointConfig) -> str:
    """What retention keeps, in words: "the best 2 by valid_loss (min), plus the latest"."""
    if config.num_to_keep is None:
        return "every checkpoint (num_to_keep is not set)"
    if config.checkpoint_score_attribute is None:
        return f"the {config.num_to_keep} most recent (no score_attribute)"
    by = f"{config.checkpoint_score_attribute} ({config.checkpoint_score_order})"
    return f"the best {config.num_to_keep} by {by}, plus the latest (resume needs it)"
