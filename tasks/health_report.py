"""The run-health page of a training run, as markdown (pure functions, no Prefect): the goodput
account as a table saying what each part is, whether the run was input-bound, the timeline picture
embedded as a ``data:image/png;base64`` image (the Prefect UI shows such images), the stragglers,
each rank's peak memory and the pre-flight check. Figures as ``storage.figures`` writes them."""

from __future__ import annotations

import base64

from storage.figures import seconds, share
from storage.health import GoodputAccount, RunHealth

#: What each part of the goodput account is, in the words of the health page.
PART_MEANINGS = {
    "starting": "the first attempt's workers and backend starting, until they trained",
    "training": "steps that moved the model forward",
    "waiting for data": "ranks waiting for their next batch (each report's slowest rank)",
    "checkpoints": "ranks blocked uploading checkpoints (SYNC uploads)",
    "restarting": "from a failure until the next attempt trained",
    "rolled back": "training a failure threw away (trained again)",
    "waiting": "the run's end: the workers finishing",
}


def health_markdown(run_name: str, health: RunHealth, timeline_png: bytes | None, *, timeline_path: str = "") -> str:
    """The page for ``run_name``: its latest ``fit()`` call's goodput, the timeline picture
    (``timeline_png``) when there is one, its stragglers, memory and pre-flight check."""
    lines = [f"# Health of {run_name}", ""]
    if health.goodput:
        lines += _goodput(health.goodput[-1], calls=len(health.goodput))
    if timeline_png:
        encoded = base64.b64encode(timeline_png).decode()
        lines += ["## Timeline", "", f"![timeline of {run_name}](data:image/png;base64,{encoded})", ""]
        if timeline_path:
            lines += [f"The picture is in the run folder: `{timeline_path}`.", ""]
    stragglers = [f"- attempt {s.attempt}'s report {s.report_index + 1}: {s.describe()}" for s in health.stragglers]
    lines += ["## Stragglers", "", *(stragglers or ["No rank trained persistently slower than the others."])]
    peaks = [f"| {rank} | {peak.describe() if peak else '-'} |" for rank, peak in enumerate(health.peak_memory)]
    lines += ["", "## Peak memory per rank", ""]
    lines += ["| rank | peak |", "|---:|---|", *peaks] if peaks else ["No rank reported its memory."]
    lines += ["", "## Pre-flight check", ""]
    if health.preflight:
        lines.append(f"The latest: {health.preflight[-1].describe()}.")
    else:
        lines.append(
            "Not run: by default (`FLOWTRAIN_PREFLIGHT=auto`) it checks GPU runs only; "
            "`FLOWTRAIN_PREFLIGHT=on` checks CPU workers too."
        )
    return "\n".join(lines) + "\n"


def _goodput(account: GoodputAccount, *, calls: int) -> list[str]:
    intro = (
        f"**Goodput {share(account.goodput)}**: {seconds(account.training_s)} s of "
        f"{seconds(account.wall_s)} s trained; {account.held()}."
    )
    if calls > 1:
        intro += f" (The latest of {calls} fit() calls on this run.)"
    if account.input_bound:
        intro += (
            f"\n\n**Input-bound**: {account.input_bound_note().removeprefix('input-bound: ')}; a faster input "
            "pipeline (more Ray Data CPUs, a materialized dataset, more loader workers) would train faster."
        )
    rows = ["| part | seconds | share | what it is |", "|---|---:|---:|---|"]
    for name, part_s in account.parts.items():
        fraction = part_s / account.wall_s if account.wall_s > 0 else 0.0
        rows.append(f"| {name} | {seconds(part_s)} | {share(fraction)} | {PART_MEANINGS[name]} |")
    return ["## Where the time went", "", intro, "", *rows, ""]
