"""The checkpoints stage: verify what the run kept, apply final retention, publish the best one and
a table of every checkpoint the run committed: kept or dropped, and why."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from storage import CheckpointConfig, RunSnapshot, RunStorage, figures
from storage.lease import new_owner
from storage.retention import decide, describe_rule, flatten
from storage.upload import UploadStats
from tasks.charts import REPORT_COLUMN, is_step_key, round_sig
from tasks.params import Checkpointing, CheckpointSummary, TrainSummary
from tasks.reporting import artifact_key
from tasks.retries import io_task


@io_task(name="checkpoints", task_run_name="checkpoints {summary.run_name}", retries=2)
def checkpoints(summary: TrainSummary, checkpointing: Checkpointing) -> CheckpointSummary:
    """Check that every kept checkpoint is there and committed, drop what retention does not keep
    (and anything a crash left behind), and publish the best checkpoint as a markdown artifact."""
    config = checkpointing.to_config()
    storage = RunStorage.at(summary.run_path, checkpoint_config=config)  # the folder the train stage trained in
    kept = storage.verify_and_tidy(owner=new_owner("checkpoints"))
    best, best_metrics = storage.best_checkpoints[0] if kept else (None, None)
    attribute = config.checkpoint_score_attribute
    get_run_logger().info("run %r keeps %d checkpoint(s); best: %s", summary.run_name, len(kept), best and best.path)
    create_markdown_artifact(
        markdown=best_checkpoint_markdown(summary, [c.path for c in kept], best_metrics, attribute),
        key=artifact_key(summary.run_name, "best-checkpoint"),
        description=f"Best checkpoint of training run {summary.run_name!r}",
    )
    snapshot = storage.snapshot
    unlisted = snapshot.next_seq - len(snapshot.checkpoints) - len(snapshot.dropped)
    create_table_artifact(
        table=checkpoint_rows(snapshot, config),
        key=artifact_key(summary.run_name, "checkpoints"),
        description=(
            f"Checkpoints of training run {summary.run_name!r}; retention keeps {describe_rule(config)}"
            + (f"; the {unlisted} oldest dropped checkpoint(s) are not listed. " if unlisted > 0 else ". ")
            + "Checkpoint folders count from 0, reports from 1; upload: the slowest rank's seconds, all ranks' MB."
        ),
    )
    return CheckpointSummary(
        run_path=summary.run_path,
        kept=[c.path for c in kept],
        best_path=best.path if best else None,
        best_metrics=best_metrics,
        score_attribute=attribute,
    )


def best_checkpoint_markdown(
    summary: TrainSummary, kept: list[str], best_metrics: dict | None, attribute: str | None
) -> str:
    """The best-checkpoint page: its path, why it is the best, its metrics (rounded to 4
    significant digits, as the metrics and checkpoint tables are) and the others kept."""
    if not kept:
        return f"# {summary.run_name}\n\nThe run reported no checkpoint. Run folder: `{summary.run_path}`\n"
    rank = f"by `{attribute}`" if attribute else "the most recent (no checkpoint_score_attribute set)"
    flat = {k: round_sig(v) for k, v in flatten(best_metrics or {}).items()}
    score = f"\n\n**{attribute}** = `{flat.get(attribute)}`" if attribute else ""
    rows = "\n".join(f"| {k} | {v} |" for k, v in flat.items())
    others = "\n".join(f"- `{path}`" for path in kept[1:]) or "- (none)"
    return (
        f"# Best checkpoint of {summary.run_name}\n\n`{kept[0]}`\n\nChosen {rank}.{score}\n\n"
        f"| metric | value |\n| --- | --- |\n{rows}\n\n## Also kept\n\n{others}\n\nRun folder: `{summary.run_path}`\n"
    )


def checkpoint_rows(snapshot: RunSnapshot, config: CheckpointConfig) -> list[dict[str, Any]]:
    """One row per checkpoint the run committed, oldest first: its report (from 1), step and score,
    whether retention kept it and why ("kept: 2nd best": a kept one as it ranks now, a dropped one as
    run.json recorded), and last, so that a narrow window cuts them rather than the reason, its
    upload's ``UPLOAD_COLUMNS`` (blank when nothing was uploaded)."""
    attribute = config.checkpoint_score_attribute
    decided = decide([(c.seq, c.metrics) for c in snapshot.checkpoints], config)
    found = {
        c.seq: (c.dir_name, c.report, flatten(c.metrics), c.upload, "kept", decided[c.seq].why)
        for c in snapshot.checkpoints
    }
    for dropped in snapshot.dropped:
        flat = flatten(dropped.metrics) if dropped.metrics is not None else {}
        if attribute is not None:
            flat[attribute] = dropped.score  # its validation's, when the score came from one
        found[dropped.seq] = (dropped.dir_name, dropped.report, flat, dropped.upload, "dropped", dropped.why)
    steps = list(dict.fromkeys(k for _, _, flat, *_ in found.values() for k in flat if is_step_key(k)))
    rows = []
    for seq in sorted(found):
        dir_name, report, flat, upload, status, why = found[seq]
        row = {"checkpoint": dir_name, REPORT_COLUMN: report + 1, **{k: round_sig(flat.get(k)) for k in steps}}
        if attribute is not None:
            row[attribute] = round_sig(flat.get(attribute))
        # Records written before the reason stopped repeating the status start with it.
        reason = why.removeprefix(f"{status}: ")
        rows.append({**row, "status": f"{status}: {reason}", **upload_cells(upload)})
    return rows


#: Table columns of a checkpoint's upload: the slowest rank's seconds, and the megabytes
#: (10^6 bytes) of all ranks.
UPLOAD_COLUMNS = ("upload s", "upload MB")


def upload_cells(upload: UploadStats | None) -> dict[str, Any]:
    """The ``UPLOAD_COLUMNS`` cells of ``upload`` (None: blank) as ``storage.figures`` writes them: the
    seconds as text ("<0.001", not "0", which reads as not measured), megabytes to 4 significant digits."""
    seconds, megabytes = UPLOAD_COLUMNS
    if upload is None:
        return {seconds: None, megabytes: None}
    return {seconds: figures.seconds(upload.seconds), megabytes: figures.rounded(upload.bytes / 1e6)}
