"""The checkpoints stage: verify what the run kept, apply final retention, publish the best one."""

from __future__ import annotations

import os
import socket
import uuid

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from storage import RunStorage
from storage.retention import flatten
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
