"""The run-health page of a training run, as markdown (pure functions, no Prefect): the goodput
account as a table, the stragglers, each rank's peak memory, and the timeline picture embedded as
a ``data:image/png;base64`` image (the Prefect UI shows such images)."""

from __future__ import annotations

import base64

from storage.health import GoodputAccount, RunHealth


def health_markdown(run_name: str, health: RunHealth, timeline_png: bytes | None, *, timeline_path: str = "") -> str:
    """The page for ``run_name``: its latest ``fit()`` call's goodput, its stragglers and memory,
    and the timeline picture (``timeline_png``) when there is one."""
    lines = [f"# Health of {run_name}", ""]
    if health.goodput:
        lines += _goodput(health.goodput[-1], calls=len(health.goodput))
    if timeline_png:
        encoded = base64.b64encode(timeline_png).decode()
        lines += ["## Timeline", "", f"![timeline of {run_name}](data:image/png;base64,{encoded})", ""]
        if timeline_path:
            lines += [f"The picture is in the run folder: `{timeline_path}`.", ""]
    lines += ["## Stragglers", ""]
    if health.stragglers:
        lines += [f"- attempt {s.attempt}, report {s.report_index}: {s.describe()}" for s in health.stragglers]
    else:
        lines.append("No rank trained persistently slower than the others.")
    lines += ["", "## Peak memory per rank", ""]
    if health.peak_memory:
        lines += ["| rank | peak |", "|---:|---|"]
        lines += [f"| {rank} | {peak.describe() if peak else '-'} |" for rank, peak in enumerate(health.peak_memory)]
    else:
        lines.append("No rank reported its memory.")
    return "\n".join(lines) + "\n"


def _goodput(account: GoodputAccount, *, calls: int) -> list[str]:
    held = f"{account.worker_hours:.3g} worker-hours" + (
        f", {account.gpu_hours:.3g} GPU-hours" if account.gpu_hours else ""
    )
    intro = f"**Goodput {account.goodput:.0%}**: {account.training_s:.3g} s of {account.wall_s:.3g} s trained; {held}."
    if calls > 1:
        intro += f" (The latest of {calls} fit() calls on this run.)"
    rows = ["| part | seconds | share |", "|---|---:|---:|"]
    for name, seconds in account.parts.items():
        share = seconds / account.wall_s if account.wall_s > 0 else 0.0
        rows.append(f"| {name} | {seconds:.3g} | {share:.1%} |")
    return ["## Where the time went", "", intro, "", *rows, ""]
