"""The scale benchmark's summary: medians per (topology, variant, N, implementation), ratios,
the memory slope per extra worker, and the markdown tables and the plot made from them."""

from __future__ import annotations

import math
import statistics
from typing import Any

#: What every number means. Written into the JSON and at the foot of the markdown.
DEFINITIONS = {
    "all_ranks_in_s": "seconds from the fit() call to the moment the last rank entered the train function "
    "(each rank takes time.time() first thing and carries it in its first report's metrics)",
    "first_report_s": "seconds from the fit() call to the first round at the driver side "
    "(time.time() at the top of UserCallback.after_report; with ray.train that runs in its controller actor)",
    "round_ms_p50": "per report round: (after_report time) minus (the latest rank's time.time() taken just "
    "before it called report()); median over the rounds of the run, in ms",
    "round_ms_p90": "the same, 90th percentile over the rounds",
    "report_blocked_ms_p50": "how long a metrics-only report() call blocked the training loop, "
    "median over ranks x rounds, in ms (the ranks' own clocks)",
    "ckpt_blocked_ms_p50": "how long a report() carrying a checkpoint blocked the loop (median over ranks x "
    "checkpoint rounds, ms); the file is written before the call and not counted",
    "ckpt_blocked_ms_max": "the longest of those, ms",
    "ckpt_commit_ms_p50": "per checkpoint round: (after_report time, where the checkpoint argument is the committed "
    "checkpoint) minus (the latest rank's time.time() taken just after its report() returned); median, ms. "
    "What is left of the commit once the slowest rank is free to go on; it can be negative when the driver "
    "side commits before the last rank's report() has returned",
    "ckpt_round_ms_p50": "per checkpoint round: after_report time minus the latest rank's time just before its "
    "report() call (upload included); median, ms",
    "driver_cpu_ms_per_round": "CPU ms per round of the driver side over the reporting phase (first to last round "
    "of the first attempt): flowtrain, the process that calls fit() (its controller runs in it); ray.train, its "
    "TrainController actor process (where after_report runs) plus the process that calls fit()",
    "peak_pss_mb": "peak of the summed PSS (psutil memory_full_info().pss) of the process that calls fit() and "
    "every process under it (GCS, raylets, agents, workers, controller actors), sampled every >=0.2 s over the "
    "whole measurement (Ray start to Ray stop), MiB",
    "procs_at_peak": "how many processes that tree had at the peak sample",
    "fit_s": "seconds from the fit() call to its return",
    "nodes_used": "how many Ray nodes the workers ran on (each rank reports its node id)",
    "per_extra_worker_mb": "least-squares slope of peak_pss_mb against N over the N measured, MiB per worker",
    "recovery_s": "recovery variant: seconds from os.kill(SIGKILL) of one rank (done in after_report right after "
    "round kill_after_step) to the first round of the restarted attempt at the driver side",
    "recovery_all_ranks_in_s": "seconds from the kill to the moment the last rank of the restarted attempt "
    "entered the train function",
    "resumed_at_step": "the step the restarted attempt started at (get_checkpoint()'s step + 1); must be "
    "last_committed_step + 1",
    "last_committed_step": "the step of the last checkpoint committed (after_report with a checkpoint) before the kill",
    "new_processes": "recovery: how many ranks of the first resumed round ran in a process that had not run the first "
    "attempt (1 when only the killed rank is replaced, N when every worker restarts)",
    "recovery_cpu_s": "recovery: CPU seconds of every process of the run (the driver and every Ray process under it) "
    "from the kill to the first resumed round",
    "worker_start_cpu_s": "recovery: median CPU seconds a first-attempt worker process had used when its training "
    "function began (what starting one worker costs with this workload)",
    "structure": "every rank reported every round, steps in order, every checkpoint committed at the expected steps "
    "with every rank's files at full size (callback checkpoints, Result.checkpoint, Result.best_checkpoints)",
}

#: The columns of each variant's table: (key, heading, format).
COMMON = [
    ("all_ranks_in_s", "fit->all ranks in (s)", "{:.2f}"),
    ("first_report_s", "fit->first report (s)", "{:.2f}"),
    ("round_ms_p50", "round p50 (ms)", "{:.3g}"),
    ("round_ms_p90", "round p90 (ms)", "{:.3g}"),
    ("report_blocked_ms_p50", "report() blocked p50 (ms)", "{:.3g}"),
    ("driver_cpu_ms_per_round", "driver CPU/round (ms)", "{:.3g}"),
    ("peak_pss_mb", "peak PSS (MiB)", "{:.0f}"),
    ("procs_at_peak", "procs at peak", "{:.0f}"),
    ("fit_s", "fit (s)", "{:.2f}"),
]
CKPT = [
    ("ckpt_blocked_ms_p50", "ckpt report() blocked p50 (ms)", "{:.3g}"),
    ("ckpt_blocked_ms_max", "ckpt report() blocked max (ms)", "{:.3g}"),
    ("ckpt_commit_ms_p50", "ckpt commit p50 (ms)", "{:.3g}"),
    ("ckpt_round_ms_p50", "ckpt round p50 (ms)", "{:.3g}"),
]
COLUMNS = {
    "metrics": COMMON,
    "ckpt": COMMON + CKPT,
    "upload_sync": CKPT + [("fit_s", "fit (s)", "{:.2f}"), ("peak_pss_mb", "peak PSS (MiB)", "{:.0f}")],
    "upload_async": CKPT + [("fit_s", "fit (s)", "{:.2f}"), ("peak_pss_mb", "peak PSS (MiB)", "{:.0f}")],
}
#: The plot's panels: (variant, key, title).
PANELS = [
    ("metrics", "all_ranks_in_s", "fit() -> all ranks in (s)"),
    ("metrics", "first_report_s", "fit() -> first report (s)"),
    ("metrics", "round_ms_p50", "report round p50 (ms)"),
    ("metrics", "driver_cpu_ms_per_round", "driver CPU per round (ms)"),
    ("metrics", "peak_pss_mb", "peak PSS (MiB)"),
    ("metrics", "procs_at_peak", "processes at peak"),
    ("ckpt", "ckpt_commit_ms_p50", "ckpt commit p50 (ms)"),
    ("ckpt", "ckpt_blocked_ms_p50", "ckpt report() blocked p50 (ms)"),
    ("upload_sync", "ckpt_blocked_ms_p50", "{upload_mb:g} MB SYNC report() blocked p50 (ms)"),
    ("upload_async", "ckpt_blocked_ms_p50", "{upload_mb:g} MB ASYNC report() blocked p50 (ms)"),
]
LABELS = {
    "flowtrain": "flowtrain",
    "flowtrain_spare": "flowtrain, spare warm",
    "flowtrain_full": "flowtrain, every worker restarted",
    "ray_train": "ray.train",
}


def summarise(runs: list[dict]) -> dict:
    """``summary[topology][variant][N][impl]``: the median of each number over the repetitions
    that finished, with ``missing`` counting those that did not; ``structure_ok`` is True only
    when every repetition's structure check passed."""
    grouped: dict = {}
    for run in runs:
        spec, result = run["spec"], run["result"]
        key = (spec["topology"], spec["variant"], spec["workers"], spec["impl"])
        grouped.setdefault(key, []).append(result)
    summary: dict = {}
    for (topology, variant, n, impl), results in sorted(grouped.items()):
        done = [r for r in results if not r.get("missing")]
        entry: dict = {"missing": len(results) - len(done), "repeats": len(results)}
        numeric = sorted(
            {k for r in done for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        )
        for k in numeric:
            values = [r[k] for r in done if isinstance(r.get(k), (int, float))]
            if values:
                entry[k] = statistics.median(values)
        if done:
            entry["structure_ok"] = all(r.get("structure", {}).get("ok") for r in done)
            entry["errors"] = [r["error"] for r in done if r.get("error")]
        summary.setdefault(topology, {}).setdefault(variant, {}).setdefault(str(n), {})[impl] = entry
    return summary


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y against x; None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)


def per_extra_worker(summary: dict) -> dict:
    """``[topology][variant][impl]``: MiB of peak PSS per extra worker (slope over N)."""
    out: dict = {}
    for topology, variants in summary.items():
        for variant, by_n in variants.items():
            impls = {impl for entries in by_n.values() for impl in entries}
            for impl in sorted(impls):
                points = [
                    (int(n), entries[impl]["peak_pss_mb"])
                    for n, entries in by_n.items()
                    if "peak_pss_mb" in entries.get(impl, {})
                ]
                value = slope(points)
                if value is not None:
                    out.setdefault(topology, {}).setdefault(variant, {})[impl] = value
    return out


def _fmt(value: Any, form: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "ok" if value else "FAIL"
    if form == "{:.3g}":
        return _readable(value)
    return form.format(value)


def _readable(value: float) -> str:
    """Three significant digits without exponents: 4034, 403, 40.3, 4.03, 0.0403."""
    size = abs(value)
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.2g}"


def _ratio(value: float) -> str:
    if value == 0 or abs(value) >= 0.1:
        return f"{value:.2f}x"
    # two significant digits, written out: 0.00059x rather than 5.9e-04x
    digits = 1 - math.floor(math.log10(abs(value)))
    return f"{value:.{digits}f}x"


def _cell(entries: dict, impls: list[str], key: str, form: str) -> str:
    values = [entries.get(impl, {}).get(key) for impl in impls]
    shown = " / ".join(_fmt(v, form) for v in values)
    if len(impls) == 2 and all(isinstance(v, (int, float)) for v in values) and values[1]:
        shown += f" / {_ratio(values[0] / values[1])}"
    elif len(impls) == 2:
        shown += " / -"
    return shown


def markdown(report: dict) -> str:
    """The whole markdown page: header, one table per topology and variant, the upload and
    recovery tables, the memory slope and the definitions."""
    impls = report["options"]["impls"]
    names = " / ".join(LABELS.get(i, i) for i in impls) + (" / ratio flowtrain/ray" if len(impls) == 2 else "")
    machine, versions = report["machine"], report["versions"]
    lines = [
        f"# Scale benchmark, {report['date']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {machine['cores']} cores, {machine['memory_gib']} GiB, load {machine['load_1m']} at start; "
        f"Python {machine['python']}, ray {versions.get('ray')}, torch {versions.get('torch')}. "
        f"Started {report['started']}, took {report['took_s'] / 60:.1f} min. "
        f"Mode: {report['options']['mode']}.",
        "",
        f"Workload: {report['options']['reports']} reports per rank; checkpoint variants report a checkpoint every "
        f"{report['options']['ckpt_every']}th report from every rank ({report['options']['ckpt_mb']} MB per rank; "
        f"upload variants {report['options']['upload_mb']} MB). single: one Ray node with 2 CPUs; multi: "
        f"{report['options']['nodes']} Ray nodes on this machine ({report['options']['node_cpus']} CPU each), "
        "placement SPREAD. Each worker asks for 0.015 CPU. '-' is a run that did not finish within "
        f"{report['options']['fit_timeout_s']:.0f} s (or failed).",
        "",
        f"Cells: {names}.",
    ]
    summary = _ordered(report)
    for topology, variants in summary.items():
        for variant, columns in COLUMNS.items():
            by_n = variants.get(variant)
            if not by_n:
                continue
            cols = list(columns)
            if topology == "multi":
                cols.append(("nodes_used", "nodes used", "{:.0f}"))
            lines += ["", f"## {topology}, {variant}", ""]
            lines.append("| N | " + " | ".join(h for _, h, _ in cols) + " | structure |")
            lines.append("|---" * (len(cols) + 2) + "|")
            for n in sorted(by_n, key=int):
                entries = by_n[n]
                cells = [_cell(entries, impls, k, f) for k, _, f in cols]
                structure = " / ".join(_fmt(entries.get(i, {}).get("structure_ok"), "") for i in impls)
                lines.append(f"| {n} | " + " | ".join(cells) + f" | {structure} |")
    lines += _upload_table(summary, impls)
    lines += _recovery_table(report)
    lines += [
        "",
        "## Peak PSS per extra worker (MiB, least-squares slope over the N measured; needs two N or more)",
        "",
    ]
    lines.append(
        "| topology | variant | "
        + " | ".join(LABELS.get(i, i) for i in impls)
        + (" | ratio |" if len(impls) == 2 else " |")
    )
    lines.append("|---" * (len(impls) + 2 + (len(impls) == 2)) + "|")
    for topology, variants in _ordered(report, report["per_extra_worker_mb"]).items():
        for variant, by_impl in variants.items():
            values = [by_impl.get(i) for i in impls]
            row = f"| {topology} | {variant} | " + " | ".join(_fmt(v, "{:.1f}") for v in values)
            if len(impls) == 2:
                row += f" | {_ratio(values[0] / values[1])}" if None not in values and values[1] else " | -"
            lines.append(row + " |")
    problems = [
        f"- {r['spec']['impl']} {r['spec']['topology']} {r['spec']['variant']} N={r['spec']['workers']}: "
        + (
            "; ".join(r["result"].get("structure", {}).get("problems", [])[:3])
            or r["result"].get("reason")
            or r["result"].get("error", "")
        )
        for r in report["runs"]
        if r["result"].get("missing") or not r["result"].get("structure", {}).get("ok")
    ]
    if problems:
        lines += ["", "## Runs that did not finish or failed a check", ""] + problems
    lines += ["", "## Definitions", ""] + [f"- `{k}`: {v}" for k, v in DEFINITIONS.items()]
    return "\n".join(lines) + "\n"


def _ordered(report: dict, table: dict | None = None) -> dict:
    """``table`` (default the summary) with its topologies in the order the command named them."""
    table = report["summary"] if table is None else table
    order = report["options"]["topologies"]
    return {t: table[t] for t in sorted(table, key=lambda t: order.index(t) if t in order else len(order))}


def _upload_table(summary: dict, impls: list[str]) -> list[str]:
    lines: list[str] = []
    for topology, variants in summary.items():
        sync, asyncs = variants.get("upload_sync", {}), variants.get("upload_async", {})
        if not sync and not asyncs:
            continue
        lines += ["", f"## {topology}: report() blocked with a big checkpoint, SYNC vs ASYNC (ms, p50 / max)", ""]
        heads = [f"{LABELS.get(i, i)} {mode}" for i in impls for mode in ("SYNC", "ASYNC")]
        lines.append("| N | " + " | ".join(heads) + " |")
        lines.append("|---" * (len(heads) + 1) + "|")
        for n in sorted(set(sync) | set(asyncs), key=int):
            cells = []
            for impl in impls:
                for table in (sync, asyncs):
                    entry = table.get(n, {}).get(impl, {})
                    cells.append(
                        f"{_fmt(entry.get('ckpt_blocked_ms_p50'), '{:.3g}')} / {_fmt(entry.get('ckpt_blocked_ms_max'), '{:.3g}')}"
                    )
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def _recovery_table(report: dict) -> list[str]:
    runs = [r for r in report["runs"] if r["spec"]["variant"] == "recovery"]
    if not runs:
        return []
    lines = [
        "",
        "## Recovery: one rank SIGKILLed after a round, FailureConfig(max_failures=1)",
        "",
        "| impl | topology | N | kill -> first resumed report (s) | kill -> all ranks back in (s) | new processes "
        "| CPU from kill to first resumed report (s) | one worker's start (CPU s) | last committed step "
        "| resumed at step | structure |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        spec, r = run["spec"], run["result"]
        lines.append(
            f"| {LABELS.get(spec['impl'], spec['impl'])} | {spec['topology']} | {spec['workers']} | "
            f"{_fmt(r.get('recovery_s'), '{:.2f}')} | {_fmt(r.get('recovery_all_ranks_in_s'), '{:.2f}')} | "
            f"{_fmt(r.get('new_processes'), '{}')} | {_fmt(r.get('recovery_cpu_s'), '{:.2f}')} | "
            f"{_fmt(r.get('worker_start_cpu_s'), '{:.2f}')} | "
            f"{_fmt(r.get('last_committed_step'), '{}')} | {_fmt(r.get('resumed_at_step'), '{}')} | "
            f"{'-' if r.get('missing') else _fmt(r.get('structure', {}).get('ok'), '')} |"
        )
    return lines


def _has(summary: dict, variant: str, key: str) -> bool:
    return any(
        key in entry
        for variants in summary.values()
        for entries in variants.get(variant, {}).values()
        for entry in entries.values()
    )


def plot(report: dict, path: str) -> None:
    """A grid of panels, one per measure: x = N (log2), one line per implementation and topology."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = _ordered(report)
    panels = [p for p in PANELS if _has(summary, *p[:2])] or PANELS[:1]
    columns = 3
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    colours = {
        "flowtrain": "tab:blue",
        "flowtrain_spare": "tab:cyan",
        "flowtrain_full": "tab:purple",
        "ray_train": "tab:orange",
    }
    styles = {"single": "-", "multi": "--"}
    all_n = sorted({int(n) for variants in summary.values() for by_n in variants.values() for n in by_n})
    for ax, (variant, key, title) in zip(axes.flat, panels, strict=False):
        values_seen = []
        for topology, variants in summary.items():
            by_n = variants.get(variant, {})
            for impl in report["options"]["impls"]:
                points = sorted((int(n), e[impl][key]) for n, e in by_n.items() if key in e.get(impl, {}))
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                values_seen += ys
                ax.plot(
                    xs,
                    ys,
                    styles.get(topology, ":"),
                    marker="o",
                    color=colours.get(impl),
                    label=f"{LABELS.get(impl, impl)}, {topology}",
                )
        ax.set_title(title.format(upload_mb=report["options"]["upload_mb"]), fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_n, [str(n) for n in all_n])
        ax.minorticks_off()
        ax.set_xlabel("workers (N)")
        positive = [v for v in values_seen if v > 0]
        if positive and len(positive) == len(values_seen) and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if values_seen:
            ax.legend(fontsize=7, handlelength=3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure.suptitle(f"flowtrain vs ray.train at scale, {report['date']} ({report['machine']['cores']} cores)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
